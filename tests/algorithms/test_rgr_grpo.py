"""RGR-GRPO: one training step end to end through train_rl; a hand-computed step on scripted rollouts (gated
rewards, exploration assessment, the refinement prompt, the swapped-in off-policy row, Dr.GRPO advantages, the
metrics); the same quantities recomputed in NumPy from the judge's verdicts on a tiny random policy's rollouts;
each ablation switch changing exactly what the paper says; the mixed-policy loss against NumPy; judge failures
and empty rubrics; test-time refinement."""

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_jax.algorithms.base import RolloutContext, prompt_token_ids
from rubric_jax.algorithms.registry import algorithm_class
from rubric_jax.algorithms.rgr_grpo import RGRGRPO, RGRGRPOConfig, refine_at_test_time
from rubric_jax.core import aggregation
from rubric_jax.data import arithmetic
from rubric_jax.data.arithmetic import Step, problem_from_steps, solution_text
from rubric_jax.data.arithmetic_rgr import ArithmeticRGRTask, refinement_messages, rgr_judge, rgr_rubric
from rubric_jax.data.tasks import build_task
from rubric_jax.inference.embedded import EmbeddedEngine
from rubric_jax.inference.engine import RolloutEngine, Sample, SamplingParams
from rubric_jax.judges.base import Judge, JudgeRequest, RolloutVerdict, Verdicts
from rubric_jax.judges.llm import rating_format
from rubric_jax.judges.programmatic import ProgrammaticJudge, RegexCheck
from rubric_jax.models import train_step
from rubric_jax.rubrics.schema import Criterion, ItemKind, Rubric
from rubric_jax.training import policy
from rubric_jax.training.metrics import PhaseTimer, read_metrics
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import AlgorithmSpec, MeshConfig, ModelSpec, RolloutConfig, TaskSpec
from tests.models.test_train_step import one_step, policy_batch
from tests.training.test_rl import TINY, tiny_rl_config

TINY_RGR = dataclasses.replace(TINY, max_position_embeddings=288)  # room for a refinement prompt
PAPER_OFF = dict(length_coef=0.0, entropy_coeff=0.0)

A = problem_from_steps([Step(3, "+", 4, 7), Step(7, "*", 2, 14), Step(14, "-", 5, 9)])
B = problem_from_steps([Step(5, "*", 3, 15), Step(15, "+", 2, 17)])
GOLD_A, GOLD_B = solution_text(A), solution_text(B)
CARRIED_A = "### Step 1: 3 + 4 = 7\n### Step 2: 7 * 2 = 15\n### Step 3: 15 - 5 = 10\n\\boxed{10}"  # 7/15
WRONG_BOX_B = "### Step 1: 5 * 3 = 15\n### Step 2: 15 + 2 = 17\n\\boxed{16}"  # 3.5 / 6.5 = 7/13
PROSE_B = "Sure.\n" + GOLD_B  # every fact: reward 1, but the format fails: not solved
SCRIPT = {A.question: [GOLD_A, CARRIED_A, "junk"], B.question: [WRONG_BOX_B, PROSE_B, "17"]}
REFINED = {CARRIED_A: GOLD_A, GOLD_A: GOLD_A, PROSE_B: GOLD_B}  # attempt -> its refinement


class ScriptedEngine(RolloutEngine):
    """Answers a question's prompt with the texts of `script[question]` and a refinement prompt (a fenced
    attempt) with `refined[attempt]`; every token's logprob is -0.5. Records each call's prompts."""

    weight_version = "scripted"

    def __init__(self, tokenizer, script, refined):
        self.tokenizer, self.script, self.refined, self.calls = tokenizer, script, refined, []

    def generate(self, prompts, params):
        self.calls.append(list(prompts))
        samples = []
        for index, messages in enumerate(prompts):
            content = messages[-1]["content"]
            if "<response>" in content:
                texts = [next(v for k, v in self.refined.items() if f"<response>\n{k}\n</response>" in content)]
            else:
                texts = self.script[content]
            for text in (texts * params.n)[:params.n]:
                ids = tuple(self.tokenizer.encode(text, add_special_tokens=False)) + (arithmetic.EOS_ID,)
                samples.append(Sample(index, ids, (-0.5,) * len(ids), "stop", arithmetic.EOS_ID, "scripted", text))
        return samples

    async def agenerate(self, prompts, params):
        return self.generate(prompts, params)

    def update_weights(self, model, version):
        raise NotImplementedError


@pytest.fixture(scope="module")
def tokenizer():
    return arithmetic.build_tokenizer()


def scripted_context(tokenizer, task=None, judge=None, script=SCRIPT, refined=REFINED) -> RolloutContext:
    task = task or build_task("arithmetic_rgr", {}, 0)
    return RolloutContext(engine=ScriptedEngine(tokenizer, script, refined), tokenizer=tokenizer, task=task,
                          judge=judge or task.judge(), pad_id=arithmetic.PAD_ID, seed=0,
                          sampling=SamplingParams(max_new_tokens=64, n=3), timer=PhaseTimer())


def scripted_step(tokenizer, **config):
    context = scripted_context(tokenizer)
    result = RGRGRPO(RGRGRPOConfig(**{**PAPER_OFF, **config})).experience([A, B], context, step=0)
    return result, context.engine.calls


def row_rewards(result) -> np.ndarray:
    """Each row's advantage back to its value per row (constant on its response tokens)."""
    mask = result.batch["response_mask_bt"]
    return np.array([row[m][0] if m.any() else 0.0 for row, m in zip(result.batch["advantages_bt"], mask)])


def dr_grpo(rewards, group):
    rewards = np.asarray(rewards, np.float64).reshape(-1, group)
    return (rewards - rewards.mean(axis=1, keepdims=True)).reshape(-1)


# ---------------------------------------------------------------- end to end


class FlakyJudge(Judge):
    """The task's judge, except that a response containing `trigger` fails (reason "boom")."""

    def __init__(self, trigger="boom"):
        self.trigger = trigger

    def judge(self, requests, max_items):
        inner = rgr_judge().judge(requests, max_items)
        rows = [RolloutVerdict.failure("boom") if self.trigger in r.response else
                RolloutVerdict(tuple(inner.satisfied_bk[b, :len(r.rubric.criteria)]))
                for b, r in enumerate(requests)]
        return Verdicts.from_rollouts(rows, max_items)


@dataclasses.dataclass(frozen=True)
class EmptyRubricFor(ArithmeticRGRTask):
    """The task, with an empty rubric for one problem."""

    empty: arithmetic.Problem = B

    def rubric(self, example):
        return Rubric(format="rgr") if example == self.empty else super().rubric(example)


def test_one_training_step_end_to_end_with_judge_failures_and_an_empty_rubric(tmp_path):
    """A random policy's step through train_rl, with a judge that fails every response holding a "7" and an
    example whose rubric is empty: the step completes, the failures are counted, every metric is finite."""
    task = EmptyRubricFor(arithmetic.ArithmeticConfig(), 0, build_task("arithmetic_rgr", {}, 0).train_stream(0)
                          .next_batch(1)[0])
    config = tiny_rl_config(tmp_path, model=ModelSpec(init=TINY_RGR), task=TaskSpec(name="arithmetic_rgr"),
                            rollout=RolloutConfig(prompts_per_step=2, group_size=4, max_new_tokens=16),
                            algorithm=AlgorithmSpec(name="rgr_grpo", params={"max_items": 8}))
    last = train_rl(config, task, judge=FlakyJudge(trigger="7"))
    [line] = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert line == {"step": 1, **last}
    assert all(math.isfinite(value) for value in last.values())
    expected = {"reward/mean", "advantage/std", "rgr/rubric_reward/mean", "rgr/solved_group_fraction",
                "rgr/off_policy_fraction", "rgr/refined_better_fraction", "rgr/on_policy_accuracy",
                "train/loss", "train/entropy", "train/off_policy_tokens", "train/shaped_prob", "train/on_policy_ratio",
                "judge/failure_rate", "judge/failed/boom", "outcome/accuracy", "time/generation", "time/judging"}
    expected |= {f"rubric/{c.name}" for c in rgr_rubric(A).criteria}
    assert expected <= last.keys()
    assert last["judge/failure_rate"] > 0
    # The empty rubric's group is solved; the random policy solves nothing else, and that group is refined.
    assert last["rgr/solved_group_fraction"] == 0.5 and last["rgr/off_policy_fraction"] == 0.5
    assert 0 < last["train/off_policy_tokens"] < 1 and last["train/grad_norm"] > 0


# ---------------------------------------------------------------- a hand-computed step


def test_a_hand_computed_step(tokenizer):
    result, calls = scripted_step(tokenizer)
    batch = result.batch
    # A's best on-policy rollout (gold) meets everything: solved, its third rollout stays on-policy. B's best
    # (prose around the gold steps) meets every fact, so its reward is 1, but it fails the format: it is refined
    # on that criterion alone, and the refinement replaces B's third rollout.
    np.testing.assert_array_equal(batch["off_policy_b"], [False] * 5 + [True])
    format_criterion = rgr_rubric(B).criteria[-1]
    assert calls[1] == [refinement_messages(B, PROSE_B, [format_criterion])]
    rewards = [1, 7 / 15, 0, 7 / 13, 1, 1]
    np.testing.assert_allclose(row_rewards(result), dr_grpo(rewards, 3), atol=1e-6)
    # The refined row is trained as a response to B's own prompt.
    width = result.prompt_width
    np.testing.assert_array_equal(batch["tokens_bt"][5, :width], batch["tokens_bt"][3, :width])
    response = tokenizer.encode(GOLD_B, add_special_tokens=False) + [arithmetic.EOS_ID]
    np.testing.assert_array_equal(batch["tokens_bt"][5, width:width + len(response)], response)
    assert batch["response_mask_bt"][5].sum() == len(response)
    np.testing.assert_array_equal(batch["rollout_logp_bt"][5][batch["response_mask_bt"][5]], -0.5)
    metrics = result.metrics
    assert metrics["rgr/solved_group_fraction"] == 0.5 and metrics["rgr/off_policy_fraction"] == 0.5
    assert metrics["rgr/refined_better_fraction"] == 0  # 1 is not better than 1
    assert metrics["rgr/refined_accuracy"] == 1 and metrics["outcome/accuracy"] == 0.5
    assert metrics["rgr/on_policy_accuracy"] == pytest.approx(2 / 5)
    assert metrics["rubric/arithmetic.format"] == pytest.approx(4 / 6)  # all but "junk" and the prose
    assert metrics["reward/mean"] == pytest.approx(np.mean(rewards))


# ---------------------------------------------------------------- NumPy recomputation on a random policy

TOY_CHECKS = {"digit": RegexCheck(r"[0-9]"), "sign": RegexCheck(r"[=+]"), "lower": RegexCheck(r"[a-z]"),
              "upper": RegexCheck(r"[A-Z]")}
TOY_RUBRIC = Rubric(criteria=(
    Criterion("has a digit", 1.0, ItemKind.FACTUAL, "digit"), Criterion("has = or +", 2.0, ItemKind.FACTUAL, "sign"),
    Criterion("has a letter", 1.0, ItemKind.PROCESS, "lower"),
    Criterion("has a capital", 0.5, ItemKind.PROCESS, "upper"),
), format="rgr")


@dataclasses.dataclass(frozen=True)
class ToyRGRTask(ArithmeticRGRTask):
    """Criteria that random text meets often (digits, letters, capitals) or seldom (= or +), so a random policy
    solves some groups and not others, with every criterion counted or the factual ones only."""

    def rubric(self, example):
        return TOY_RUBRIC

    def judge(self):
        return ProgrammaticJudge(TOY_CHECKS)


class RecordingEngine(EmbeddedEngine):
    """Records the prompts of its `generate` calls: the refinements' (the first pass streams its groups)."""

    def generate(self, prompts, params):
        self.calls = getattr(self, "calls", []) + [list(prompts)]
        return super().generate(prompts, params)


def numpy_step(texts, lengths, group, criteria="all", length_coef=0.0, target_length=0.0):
    """The recipe's rewards, assessment and advantages from scratch: verdicts of the toy judge, eq 5, the best of
    the G - 1 first rows, Dr.GRPO."""
    kinds = np.array([c.kind == ItemKind.FACTUAL for c in TOY_RUBRIC.criteria])
    weights = np.array([c.weight for c in TOY_RUBRIC.criteria])
    counted = kinds if criteria == "factual" else np.ones_like(kinds)
    met = np.array([[bool(TOY_CHECKS[c.name].regex.search(t)) for c in TOY_RUBRIC.criteria] for t in texts])
    rubric = np.where((met | ~kinds | ~counted).all(axis=1),
                      1.0, (met * weights * counted).sum(axis=1) / (weights * counted).sum())
    rewards = rubric - length_coef * (np.asarray(lengths) - target_length)
    solved, failed = [], []
    for start in range(0, len(texts), group):
        best = start + int(np.argmax(rubric[start:start + group - 1]))
        solved.append(bool((met[best] | ~counted).all()))
        failed.append((best, [c for c, m, n in zip(TOY_RUBRIC.criteria, met[best], counted) if n and not m]))
    return rewards, dr_grpo(rewards, group), np.array(solved), failed


@pytest.mark.parametrize("criteria", ["all", "factual"])
def test_rewards_assessment_and_advantages_recomputed_in_numpy(criteria):
    task, group, examples = ToyRGRTask(arithmetic.ArithmeticConfig(), 0), 4, arithmetic.problems(5, 6)
    model, tokenizer = policy.build_policy(ModelSpec(init=TINY_RGR), task, policy.make_mesh(MeshConfig()))
    engine = RecordingEngine(nnx.merge(*nnx.split(model)), tokenizer=tokenizer, eos_token_ids=[arithmetic.EOS_ID],
                             pad_id=arithmetic.PAD_ID)
    context = RolloutContext(engine=engine, tokenizer=tokenizer, task=task, judge=task.judge(), pad_id=0, seed=1,
                             sampling=SamplingParams(max_new_tokens=16, n=group), timer=PhaseTimer())
    config = RGRGRPOConfig(criteria=criteria, length_coef=0.01, target_length=8.0)
    result = RGRGRPO(config).experience(examples, context, step=0)
    batch, width = result.batch, result.prompt_width
    texts = [tokenizer.decode(list(t[width:][m[width:]]), skip_special_tokens=True)
             for t, m in zip(batch["tokens_bt"], batch["response_mask_bt"])]
    lengths = batch["response_mask_bt"].sum(axis=1)
    rewards, expected, solved, failed = numpy_step(texts, lengths, group, criteria, 0.01, 8.0)
    assert 0 < solved.sum() < len(examples)  # both branches are exercised
    np.testing.assert_array_equal(batch["off_policy_b"].reshape(-1, group)[:, -1], ~solved)
    assert not batch["off_policy_b"].reshape(-1, group)[:, :-1].any()
    np.testing.assert_allclose(row_rewards(result), expected, atol=1e-5)
    assert result.metrics["reward/mean"] == pytest.approx(rewards.mean(), abs=1e-6)
    # The refinement prompts show each unsolved group's best rollout and exactly its failed criteria.
    refine = [refinement_messages(examples[g], texts[best], crit)
              for g, (best, crit) in enumerate(failed) if not solved[g]]
    # One call per refined group, made as soon as its group was judged, in whichever order they ran.
    assert len(engine.calls) == len(refine) and all([messages] in engine.calls for messages in refine)
    for g in np.flatnonzero(~solved):
        last = g * group + group - 1
        np.testing.assert_array_equal(batch["tokens_bt"][last, :width], batch["tokens_bt"][g * group, :width])


# ---------------------------------------------------------------- ablation switches


def test_without_refinement_every_rollout_is_on_policy_and_nothing_else_changes(tokenizer):
    full, _ = scripted_step(tokenizer)
    plain, calls = scripted_step(tokenizer, refine=False)
    assert len(calls) == 1 and not plain.batch["off_policy_b"].any()
    np.testing.assert_allclose(row_rewards(plain), dr_grpo([1, 7 / 15, 0, 7 / 13, 1, 0], 3), atol=1e-6)
    for key in full.batch:
        if key != "off_policy_b" and key != "advantages_bt":
            np.testing.assert_array_equal(plain.batch[key][:5], full.batch[key][:5], err_msg=key)
    assert plain.metrics["rgr/solved_group_fraction"] == 0.5 and plain.metrics["rgr/off_policy_fraction"] == 0
    assert "rgr/refined_better_fraction" not in plain.metrics


def test_without_exploration_assessment_solved_groups_are_refined_too(tokenizer):
    result, calls = scripted_step(tokenizer, exploration_assessment=False)
    np.testing.assert_array_equal(result.batch["off_policy_b"], [False, False, True] * 2)
    assert calls[1:] == [[refinement_messages(A, GOLD_A, [])],  # one call per refined group
                         [refinement_messages(B, PROSE_B, [rgr_rubric(B).criteria[-1]])]]
    np.testing.assert_allclose(row_rewards(result), dr_grpo([1, 7 / 15, 1, 7 / 13, 1, 1], 3), atol=1e-6)


def test_fact_only_rubrics_count_and_refine_on_factual_criteria_only(tokenizer):
    result, calls = scripted_step(tokenizer, criteria="factual")
    # PROSE_B meets every fact: solved. CARRIED_A meets step 1 of (1 + 1 + 1 + 2); WRONG_BOX_B steps 1-2 of 4.
    assert len(calls) == 1 and not result.batch["off_policy_b"].any()
    np.testing.assert_allclose(row_rewards(result), dr_grpo([1, 1 / 5, 0, 2 / 4, 1, 0], 3), atol=1e-6)
    script = {A.question: [CARRIED_A, "junk", "x"], B.question: SCRIPT[B.question]}
    context = scripted_context(tokenizer, script=script)
    result = RGRGRPO(RGRGRPOConfig(criteria="factual", **PAPER_OFF)).experience([A, B], context, step=0)
    assert context.engine.calls[1] == [refinement_messages(A, CARRIED_A, rgr_rubric(A).criteria[1:4])]


def test_a_perfect_rollout_tied_at_reward_1_solves_its_group(tokenizer):
    # B's on-policy rows: PROSE_B (every fact met: r = 1 through the gate, its format fails) and GOLD_B (every
    # criterion met: r = 1). Eq 7's argmax ties; the group holds a perfect solution, so it is solved and not
    # refined, whichever row comes first. A's group [CARRIED_A, GOLD_A] is solved too: no refinement at all.
    for script_b in ([PROSE_B, GOLD_B, "17"], [GOLD_B, PROSE_B, "17"]):
        context = scripted_context(tokenizer, script={A.question: [CARRIED_A, GOLD_A, "junk"], B.question: script_b})
        result = RGRGRPO(RGRGRPOConfig(**PAPER_OFF)).experience([A, B], context, step=0)
        assert result.metrics["rgr/solved_group_fraction"] == 1.0
        assert len(context.engine.calls) == 1 and not result.batch["off_policy_b"].any()


def test_std_scaling_and_the_length_penalty(tokenizer):
    rewards = np.array([1, 7 / 15, 0, 7 / 13, 1, 1])
    result, _ = scripted_step(tokenizer, scale_by_std=True)
    grouped = rewards.reshape(2, 3)
    expected = (grouped - grouped.mean(1, keepdims=True)) / (grouped.std(1, ddof=1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(row_rewards(result), expected.reshape(-1), atol=1e-5)
    result, _ = scripted_step(tokenizer, length_coef=0.01, target_length=30.0)
    lengths = result.batch["response_mask_bt"].sum(axis=1)
    np.testing.assert_allclose(row_rewards(result), dr_grpo(rewards - 0.01 * (lengths - 30), 3), atol=1e-6)
    assert result.metrics["rgr/rubric_reward/mean"] == pytest.approx(rewards.mean())


@pytest.mark.parametrize("entropy_aggregation", ["token_mean", "as_loss"])
@pytest.mark.parametrize("shaping", [True, False])
def test_the_loss_is_eq_10_with_the_entropy_bonus(shaping, entropy_aggregation):
    rng = np.random.default_rng(0)
    shape = (4, 6)
    logp = -rng.uniform(0.01, 4, shape)
    old = logp + rng.normal(0, 0.3, shape)
    adv = rng.normal(size=shape)
    entropy = rng.uniform(0, 2, shape)
    mask = rng.random(shape) < 0.8
    off = np.array([False, True, False, True])
    weights = rng.uniform(0, 3, shape)  # the train step's token-mean weights, any values here
    batch = {"response_mask_bt": jnp.asarray(mask), "off_policy_b": jnp.asarray(off), "old_logp_bt": jnp.asarray(old),
             "advantages_bt": jnp.asarray(adv), train_step.TOKEN_MEAN_WEIGHTS: jnp.asarray(weights)}
    algorithm = RGRGRPO(RGRGRPOConfig(shaping=shaping, gamma=0.2, entropy_coeff=0.05,
                                      entropy_aggregation=entropy_aggregation))
    loss, metrics = algorithm.loss_fn()(jnp.asarray(logp), jnp.asarray(entropy), batch)
    p = np.exp(logp)
    shaped_rows = off[:, None] & shaping
    bonus = entropy * weights if entropy_aggregation == "token_mean" else entropy
    expected = np.where(shaped_rows, -p / (p + 0.2) * adv, -np.exp(logp - old) * adv) - 0.05 * bonus
    np.testing.assert_allclose(loss, np.where(mask, expected, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(metrics["off_policy_tokens"], mask & off[:, None])
    np.testing.assert_allclose(metrics["shaped_prob"], np.where(mask & shaped_rows, p / (p + 0.2), 0), rtol=1e-5)
    assert algorithm.aggregate()(jnp.asarray(loss), jnp.asarray(mask)).denominator == mask.any(axis=1).sum()
    assert not algorithm.needs_reference


def test_the_entropy_bonus_is_coeff_times_the_token_mean_entropy_by_hand():
    """Section 3's bonus, 0.01, with the paper config's aggregation (seq_mean_token_sum_norm; constant 5 here)
    and a zero policy term (A = 0). Row 0 has 3 tokens of entropy 1, 2, 3, row 1 one token of entropy 4: N = 4
    tokens, token mean 10 / 4 = 2.5, D = 2 sequences x 5 = 10.
    - token_mean (LUFFY's masked_mean): weights D / N = 10 / 4 = 2.5, loss = -0.01 x 2.5 x (1 + 2 + 3 + 4) / 10
      = -0.025 = -0.01 x 2.5, the token-mean entropy;
    - as_loss (the loss's aggregation, verl's agg_loss): loss = -0.01 x (1 + 2 + 3 + 4) / 10 = -0.01, the token mean
      scaled by N / D = 0.4."""
    mask = jnp.asarray([[True, True, True, False], [True, False, False, False]])
    entropy = jnp.asarray([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
    logp = jnp.full((2, 4), -1.0)
    batch = {"response_mask_bt": mask, "off_policy_b": jnp.zeros(2, bool), "old_logp_bt": logp,
             "advantages_bt": jnp.zeros((2, 4))}
    for entropy_aggregation, expected in (("token_mean", -0.01 * 2.5), ("as_loss", -0.01 * 10 / 10)):
        algorithm = RGRGRPO(RGRGRPOConfig(entropy_aggregation=entropy_aggregation,
                                          aggregation="seq_mean_token_sum_norm", norm_constant=5.0))
        weights = aggregation.token_mean_weights(algorithm.aggregate(), mask)
        np.testing.assert_allclose(weights, [[2.5, 2.5, 2.5, 0], [2.5, 0, 0, 0]], rtol=1e-6)
        loss_bt, _ = algorithm.loss_fn()(logp, entropy, {**batch, train_step.TOKEN_MEAN_WEIGHTS: weights})
        np.testing.assert_allclose(aggregation.finalize(*algorithm.aggregate()(loss_bt, mask)), expected, rtol=1e-6)
    assert RGRGRPOConfig().entropy_aggregation == "token_mean"


def test_the_token_mean_entropy_bonus_in_the_train_step_is_micro_batch_invariant():
    """Through the learner's step on a tiny model: the two aggregations share the policy term, so their losses
    differ by the bonuses only: -0.01 H (1 - N / D) with H the batch's token-mean entropy (the step's "entropy"
    metric), N its response tokens and D = valid sequences x 8; and over 4 micro-batches the token-mean bonus
    is the same (the weights come from the whole batch)."""
    def rgr_loss(config):
        inner = RGRGRPO(config).loss_fn()
        return lambda logp, entropy, batch: inner(logp, entropy,
                                                  {**batch, "off_policy_b": jnp.zeros(logp.shape[0], bool)})

    configs = {name: RGRGRPOConfig(entropy_aggregation=name, aggregation="seq_mean_token_sum_norm", norm_constant=8.0)
               for name in ("token_mean", "as_loss")}
    runs = {name: one_step(rgr_loss(config), aggregate=RGRGRPO(config).aggregate())[0]
            for name, config in configs.items()}
    split = one_step(rgr_loss(configs["token_mean"]), aggregate=RGRGRPO(configs["token_mean"]).aggregate(),
                     micro_batches=4)[0]
    mask = policy_batch()["response_mask_bt"]
    tokens, denominator = mask.sum(), mask.any(axis=1).sum() * 8.0
    entropy = runs["token_mean"]["entropy"]
    np.testing.assert_allclose(runs["token_mean"]["loss"] - runs["as_loss"]["loss"],
                               -0.01 * entropy * (1 - tokens / denominator), rtol=1e-4)
    np.testing.assert_allclose(split["loss"], runs["token_mean"]["loss"], rtol=2e-5, atol=2e-6)
    assert tokens != denominator and entropy > 0


def test_the_off_policy_clips_bound_the_refinement_tokens_only():
    # Rows: on-policy r = e^0.5 = 1.6487, A = 1 (no clip whatever the bounds); off-policy, A = 2, p = 0.02 / 0.1 /
    # 1: f(p) = 0.02 / 0.12 = 0.1667, 0.5, 1 / 1.1 = 0.9091, clipped to [0.2, 0.6]: 0.2, 0.5, 0.6.
    logp = np.array([[-0.5] * 3, np.log([0.02, 0.1, 1.0])])
    old = np.array([[-1.0] * 3, [np.nan] * 3])
    batch = {"response_mask_bt": jnp.ones((2, 3), bool), "off_policy_b": jnp.asarray([False, True]),
             "old_logp_bt": jnp.asarray(old), "advantages_bt": jnp.asarray([[1.0] * 3, [2.0] * 3])}
    algorithm = RGRGRPO(RGRGRPOConfig(entropy_coeff=0.0, off_max_clip=0.6, off_min_clip=0.2))
    loss, metrics = algorithm.loss_fn()(jnp.asarray(logp), jnp.zeros((2, 3)), batch)
    r = math.exp(0.5)
    np.testing.assert_allclose(loss, [[-r, -r, -r], [-0.4, -1.0, -1.2]], rtol=1e-5)
    np.testing.assert_allclose(metrics["shaped_prob"], [[0, 0, 0], [0.2, 0.5, 0.6]], rtol=1e-5)
    np.testing.assert_array_equal(metrics["off_clipped_high"], [[False] * 3, [False, False, True]])
    np.testing.assert_array_equal(metrics["off_clipped_low"], [[False] * 3, [True, False, False]])
    _, unclipped = RGRGRPO(RGRGRPOConfig(entropy_coeff=0.0)).loss_fn()(jnp.asarray(logp), jnp.zeros((2, 3)), batch)
    assert "off_clipped_high" not in unclipped and "off_clipped_low" not in unclipped


# ---------------------------------------------------------------- judge failures, empty rubrics


@pytest.mark.parametrize("on_judge_failure", ["zero_reward", "exclude"])
def test_judge_failures_and_empty_rubrics_complete_the_step_and_are_counted(tokenizer, on_judge_failure):
    script = {A.question: ["boom 1", "boom 2", GOLD_A], B.question: [WRONG_BOX_B, PROSE_B, "17"]}
    context = scripted_context(tokenizer, task=EmptyRubricFor(arithmetic.ArithmeticConfig(), 0), judge=FlakyJudge(),
                               script=script)
    result = RGRGRPO(RGRGRPOConfig(on_judge_failure=on_judge_failure)).experience([A, B], context, step=0)
    # A has no judged on-policy rollout (nothing to refine); B's empty rubric is solved: no refinement at all.
    assert len(context.engine.calls) == 1 and not result.batch["off_policy_b"].any()
    assert result.metrics["judge/failure_rate"] == pytest.approx(2 / 6)
    assert result.metrics["judge/failed/boom"] == 2
    assert result.metrics["rgr/solved_group_fraction"] == 0.5
    assert all(math.isfinite(v) for v in result.metrics.values())
    assert np.isfinite(result.batch["advantages_bt"]).all()
    assert result.batch["response_mask_bt"][:2].any() == (on_judge_failure == "zero_reward")
    if on_judge_failure == "exclude":  # the gold row is alone in its group: advantage 0
        np.testing.assert_array_equal(result.batch["advantages_bt"][:3], 0)


# ---------------------------------------------------------------- test-time refinement, config


@pytest.mark.parametrize("criteria", ["all", "factual"])
def test_refinement_at_test_time_reports_accuracy_before_and_after(tokenizer, criteria):
    engine = ScriptedEngine(tokenizer, {A.question: [CARRIED_A], B.question: [PROSE_B]}, REFINED)
    task = build_task("arithmetic_rgr", {}, 0)
    metrics = refine_at_test_time(engine, tokenizer, task, task.judge(), [A, B], max_new_tokens=64, seed=0,
                                  criteria=criteria)
    # A is wrong and refined to gold; B is right, and refined (to gold) only when its format counts.
    refined_b = criteria == "all"
    assert metrics == {"refine/accuracy_before": 0.5, "refine/accuracy_after": 1.0,
                       "refine/refined_fraction": 1.0 if refined_b else 0.5, "refine/judge_failure_rate": 0.0}
    # CARRIED_A keeps the plan, the chain and the format: it is refined on its three failed facts either way.
    assert engine.calls[1][0] == refinement_messages(A, CARRIED_A, rgr_rubric(A).criteria[1:4])


def test_the_question_cap_does_not_cut_refinement_prompts(tokenizer):
    # Table 5's max_prompt_length caps the questions; a refinement prompt (q, o_best, C_failed) is longer and is
    # governed by refinement_max_prompt_tokens alone. In the scripted step B's group is refined (on PROSE_B).
    task = build_task("arithmetic_rgr", {}, 0)
    question = max(len(prompt_token_ids(task.prompt(e), tokenizer)) for e in (A, B))
    capped = dataclasses.replace(scripted_context(tokenizer), max_prompt_tokens=question, prompt_truncation="error")
    result = RGRGRPO(RGRGRPOConfig(**PAPER_OFF)).experience([A, B], capped, step=0)
    assert result.batch["off_policy_b"].sum() == 1 and capped.sampling_metrics["prompt/truncated"] == 0
    assert capped.sampling_metrics["prompt/length_max"] > question  # the refinement prompt, sent whole
    capped = dataclasses.replace(scripted_context(tokenizer), max_prompt_tokens=question, prompt_truncation="error")
    with pytest.raises(ValueError, match="exceeds max_prompt_tokens"):
        RGRGRPO(RGRGRPOConfig(refinement_max_prompt_tokens=question, **PAPER_OFF)).experience([A, B], capped, step=0)
    with pytest.raises(ValueError, match="refinement_max_prompt_tokens"):
        RGRGRPOConfig(refinement_max_prompt_tokens=0)


def test_the_llm_judge_decides_each_criterion_given_the_question_alone():
    """Eq 3: s_k(q, o) = 1 iff o satisfies d_k given q; the reference answer the rubric came from is not shown,
    unless asked for."""
    request = JudgeRequest(A.question, CARRIED_A, rgr_rubric(A), reference="GOLD SOLUTION")
    hidden = rating_format().messages(request, 1)[-1]["content"]
    shown = rating_format(show_reference=True).messages(request, 1)[-1]["content"]
    assert A.question in hidden and CARRIED_A in hidden and rgr_rubric(A).criteria[1].text in hidden
    assert "GOLD SOLUTION" not in hidden and "GOLD SOLUTION" in shown


def test_config_validation_and_registration():
    assert algorithm_class("rgr_grpo") is RGRGRPO
    for bad, match in [(dict(gamma=0.0), "gamma"), (dict(max_items=0), "max_items"),
                       (dict(length_coef=-1.0), "length_coef"), (dict(refine=False, shaping=False), "refine"),
                       (dict(refine=False, exploration_assessment=False), "refine"),
                       (dict(aggregation="seq_mean_token_sum_norm"), "norm_constant"),
                       (dict(off_max_clip=-0.5), "off_max_clip"), (dict(off_min_clip=0.5, off_max_clip=0.4), "exceed"),
                       (dict(shaping=False, off_max_clip=0.5), "shaping"),
                       (dict(refine=False, off_min_clip=0.1), "refine")]:
        with pytest.raises(ValueError, match=match):
            RGRGRPOConfig(**bad)
    context = dataclasses.replace(scripted_context(arithmetic.build_tokenizer()),
                                  sampling=SamplingParams(max_new_tokens=8, n=1))
    with pytest.raises(ValueError, match="n >= 2"):
        RGRGRPO(RGRGRPOConfig()).experience([A], context, step=0)
