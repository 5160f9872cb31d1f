"""The SRaR recipe (rubric_jax.algorithms.srar): two RL steps end to end with judge failures and empty rubrics in
the second; the token advantages against a hand-computed case and against a slow NumPy loop of eqs 3-6 on
random step-attributed verdicts (embedded engine and scripted rollouts); each ablation changing exactly what the
paper says; the step-format prompt; the analysis metrics (typed scores, looping criteria, step accuracy, FRR)."""

import dataclasses
import math
import re

import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.algorithms import srar as srar_recipe
from rubric_jax.algorithms.base import RolloutContext
from rubric_jax.algorithms.registry import algorithm_class
from rubric_jax.algorithms.srar import (
    SRaR, SRaRConfig, analysis_metrics, has_step_format, looping_metrics, looping_report,
    step_label_metrics)
from rubric_jax.core import srar as core_srar
from rubric_jax.core.rewards import BONUS, PITFALL, SUGGEST
from rubric_jax.data import arithmetic
from rubric_jax.data.arithmetic_srar import ArithmeticSrarTask
from rubric_jax.inference.embedded import EmbeddedEngine
from rubric_jax.inference.engine import RolloutEngine, Sample, SamplingParams
from rubric_jax.judges.base import Judge, RolloutVerdict, Verdicts
from rubric_jax.judges.outcome import EQUIVALENT, equivalence_status, extract_boxed
from rubric_jax.rubrics import prompts
from rubric_jax.rubrics.schema import Criterion, ItemKind, Rubric, rubric_arrays
from rubric_jax.rubrics.steps import response_step_ids
from rubric_jax.training import policy
from rubric_jax.training.metrics import PhaseTimer, read_metrics
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import (
    AlgorithmSpec, CheckpointConfig, MeshConfig, MetricsConfig, ModelInit, ModelSpec, RLConfig, RolloutConfig,
    TaskSpec)

TINY = ModelInit(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                 max_position_embeddings=96)
TOKENIZER = arithmetic.build_tokenizer()
EXAMPLE = arithmetic.problem_from_steps(
    [arithmetic.Step(3, "+", 4, 7), arithmetic.Step(7, "*", 2, 14), arithmetic.Step(14, "-", 5, 9)])
# The hand-computed group (module test below): gold; a slip in step 1 carried through; a plan line, then step 1
# written twice; no steps, the right box, then text after it.
GROUP = (
    ("### Step 1: 3 + 4 = 7\n", "### Step 2: 7 * 2 = 14\n", "### Step 3: 14 - 5 = 9\n\\boxed{9}"),
    ("### Step 1: 3 + 4 = 8\n", "### Step 2: 8 * 2 = 16\n", "### Step 3: 16 - 5 = 11\n\\boxed{11}"),
    ("Plan:\n", "### Step 1: 3 + 4 = 7\n", "### Step 1: 3 + 4 = 7\n", "### Step 2: 7 * 2 = 14\n",
     "### Step 3: 14 - 5 = 9\n\\boxed{9}"),
    ("7 14 9 \\boxed{9} done",),
)


def task() -> ArithmeticSrarTask:
    return ArithmeticSrarTask(arithmetic.ArithmeticConfig(), 0)


class ScriptedEngine(RolloutEngine):
    """Returns the given response texts (one list of G texts per prompt), each ending with EOS, and records the
    prompts it was sent."""

    weight_version = "scripted"

    def __init__(self, responses):
        self.responses, self.prompts = responses, []

    def generate(self, prompts_, params):
        self.prompts.append(list(prompts_))
        samples = []
        for p in range(len(prompts_)):
            assert len(self.responses[p]) == params.n
            for text in self.responses[p]:
                ids = tuple(TOKENIZER.encode(text, add_special_tokens=False)) + (arithmetic.EOS_ID,)
                samples.append(Sample(p, ids, (0.0,) * len(ids), "stop", arithmetic.EOS_ID, self.weight_version))
        return samples

    async def agenerate(self, prompts_, params):
        return self.generate(prompts_, params)

    def update_weights(self, model, version):
        raise NotImplementedError


class RandomJudge(Judge):
    """Random 0 / 1 verdicts attributed to random steps in [-2, num_steps + 2] (out-of-range ones included), a
    failure for about one rollout in six; records what it returned."""

    def __init__(self, seed):
        self.rng, self.verdicts = np.random.default_rng(seed), None

    def judge(self, requests, max_items):
        rows = []
        for request in requests:
            n = len(request.rubric.criteria)
            if self.rng.random() < 1 / 6:
                rows.append(RolloutVerdict.failure("request_failed"))
            else:
                rows.append(RolloutVerdict(satisfied=tuple(self.rng.integers(0, 2, n).astype(float)),
                                           item_step=tuple(self.rng.integers(-2, request.num_steps + 3, n))))
        self.verdicts = Verdicts.from_rollouts(rows, max_items)
        return self.verdicts


class RecordingJudge(Judge):
    """The task's judge, recording the rubrics it was given."""

    def __init__(self, inner):
        self.inner, self.rubrics = inner, []

    def judge(self, requests, max_items):
        self.rubrics.extend(r.rubric for r in requests)
        return self.inner.judge(requests, max_items)


def context(engine, judge, *, n, the_task=None, max_new_tokens=128) -> RolloutContext:
    """Judging serially: `RandomJudge` draws its verdicts in call order and keeps the step's one call; the
    pipelined step equals the serial one (test_pipelined_judging.py)."""
    the_task = the_task or task()
    return RolloutContext(engine=engine, tokenizer=TOKENIZER, task=the_task, judge=judge, pad_id=arithmetic.PAD_ID,
                          seed=0, sampling=SamplingParams(max_new_tokens=max_new_tokens, n=n), timer=PhaseTimer(),
                          pipelined_judging=False)


def hand_group_experience(config=SRaRConfig(), judge=None):
    engine = ScriptedEngine([["".join(parts) for parts in GROUP]])
    return SRaR(config).experience([EXAMPLE], context(engine, judge or task().judge(), n=4), step=0)


def token_spans(parts):
    """Each part's number of tokens; the EOS token belongs to the last part."""
    counts = [len(TOKENIZER.encode(part, add_special_tokens=False)) for part in parts]
    counts[-1] += 1
    return counts


def per_token(result, row):
    """Row `row`'s response advantages, [L]."""
    mask = result.batch["response_mask_bt"][row]
    return result.batch["advantages_bt"][row][mask]


# ---------------------------------------------------------------- the NumPy reference (eqs 3-6, loops)

BUDGETS = {SUGGEST: 0.8, PITFALL: -1.0, BONUS: 1.0}


def grpo_reference(rewards, group_ids, valid, eps=1e-6):
    out = np.zeros(len(rewards))
    for g in set(group_ids.tolist()):
        members = [b for b in range(len(rewards)) if group_ids[b] == g and valid[b]]
        values = np.array([rewards[b] for b in members], np.float64)
        if len(members) <= 1:
            continue
        std = values.std(ddof=1)
        for b in members:
            out[b] = (rewards[b] - values.mean()) / (std + eps) if std > eps else 0.0
    return out


def reference_step_rewards(satisfied, kinds, mask, item_step, judged=None):
    """Per rollout {step: d} (eq 3 and Algorithm 1 line 9, the authors' `compute_rubric_deltas`: every step the
    judge wrote is a key, in range of the response or not). The keys are the rollout's step groups: the steps of
    its delta-bearing items, or, given `judged` (the paper's eq 4), of every item of a judged rollout."""
    rewards = []
    for b in range(satisfied.shape[0]):
        steps = {}
        for k in range(satisfied.shape[1]):
            kind = int(kinds[b, k])
            if judged is not None and mask[b, k] and judged[b]:
                steps.setdefault(int(item_step[b, k]), 0.0)
            if not mask[b, k] or kind not in BUDGETS or not satisfied[b, k]:
                continue
            count = sum(1 for j in range(satisfied.shape[1]) if mask[b, j] and kinds[b, j] == kind)
            delta = math.copysign(abs(BUDGETS[kind]), BUDGETS[kind]) / count
            step = int(item_step[b, k])
            steps[step] = steps.get(step, 0.0) + delta
        rewards.append(steps)
    return rewards


def placed(step, num_steps, token_step):
    """Whether step `step`'s value reaches a token of step `token_step` (the authors' `compute_srar_advantage`):
    -1 none, 1..num_steps that step's tokens, 0 and anything else every token."""
    if step == -1:
        return False
    return token_step == step if 1 <= step <= num_steps else True


def reference_advantages(config, base_b, group_ids, verdicts, rubrics, num_steps, step_ids, response_mask, valid,
                         eps=1e-6):
    items = rubric_arrays(rubrics, config.max_items)
    judged = ~verdicts.failed_b if config.step_groups == "paper" else None
    d = reference_step_rewards(verdicts.satisfied_bk, items.item_kind_bk, items.item_mask_bk, verdicts.item_step_bk,
                               judged)
    num_rows, length = response_mask.shape
    advantages = np.zeros((num_rows, length))
    if config.advantage in ("merged", "rar"):
        totals = []
        for b in range(num_rows):
            total = 0.0
            for k in range(config.max_items):
                kind = int(items.item_kind_bk[b, k])
                if items.item_mask_bk[b, k] and kind in BUDGETS and verdicts.satisfied_bk[b, k]:
                    total += math.copysign(1, BUDGETS[kind]) * abs(BUDGETS[kind]) / int(
                        (items.item_mask_bk[b] & (items.item_kind_bk[b] == kind)).sum())
            totals.append(base_b[b] + total)
        outcome = grpo_reference(np.array(totals), group_ids, valid)
        for b in range(num_rows):
            if config.advantage == "rar":  # the authors' RaR: every response token
                advantages[b] = np.where(response_mask[b] & valid[b], outcome[b], 0.0)
                continue
            scored = [t for t in range(length) if response_mask[b, t]
                      and any(placed(step, num_steps[b], int(step_ids[b, t])) for step in d[b])]
            for t in range(length):
                if response_mask[b, t] and valid[b] and (t in scored or not scored):
                    advantages[b, t] = outcome[b]
        return advantages
    outcome = grpo_reference(base_b, group_ids, valid)
    offsets = [dict() for _ in range(num_rows)]
    for b in range(num_rows):
        if not valid[b]:
            continue
        for step, value in d[b].items():
            if not config.step_normalization:
                offsets[b][step] = value
                continue
            members = [c for c in range(num_rows) if group_ids[c] == group_ids[b] and valid[c] and step in d[c]]
            values = np.array([d[c][step] for c in members], np.float64)
            std = values.std(ddof=1) if len(members) > 1 else 0.0
            offsets[b][step] = (value - values.mean()) / (std + eps) if len(members) > 1 and std > eps else 0.0
    for b in range(num_rows):
        for t in range(length):
            if response_mask[b, t] and valid[b]:
                token_step = int(step_ids[b, t])
                advantages[b, t] = outcome[b] + sum(
                    value for step, value in offsets[b].items() if placed(step, num_steps[b], token_step))
    return advantages


def check_against_reference(config, result, the_context, examples, judge):
    """The recipe's advantages equal the NumPy loop's on the same verdicts, texts and step ids."""
    batch = result.batch
    width = result.prompt_width
    rows = batch["tokens_bt"].shape[0]
    group_size = the_context.sampling.n
    owners = [examples[b // group_size] for b in range(rows)]
    full_mask = batch["attention_mask_bt"] & (np.arange(batch["tokens_bt"].shape[1]) >= width)
    responses = [batch["tokens_bt"][b][full_mask[b]].tolist() for b in range(rows)]
    texts = [TOKENIZER.decode(ids, skip_special_tokens=True) for ids in responses]
    header = re.compile(r"###\s*Step\s*\d+\s*:")
    fmt = np.array([bool(header.search(t)) and "\\boxed{" in t for t in texts])
    correct = np.array([the_context.task.is_correct(t, e) for t, e in zip(texts, owners)])
    base_b = 0.9 * correct + 0.1 * fmt
    step_ids = np.zeros(batch["tokens_bt"].shape, np.int64)
    for b, ids in enumerate(responses):
        step_ids[b, width:width + len(ids)] = response_step_ids(TOKENIZER, ids)
    num_steps = [max(1, len(header.findall(t))) for t in texts]  # the authors' len(parse_steps(text))
    rubrics = [the_context.task.rubric(e) for e in owners]
    valid = ~judge.verdicts.failed_b if config.on_judge_failure == "exclude" else np.ones(rows, bool)
    expected = reference_advantages(config, base_b, np.arange(rows) // group_size, judge.verdicts, rubrics,
                                    num_steps, step_ids, full_mask, valid)
    np.testing.assert_allclose(batch["advantages_bt"], expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(batch["response_mask_bt"], full_mask & valid[:, None])
    return expected


# ---------------------------------------------------------------- end to end


class FlakyJudge(Judge):
    """The task's judge on the first call; from the second on, every third rollout's request fails."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def judge(self, requests, max_items):
        self.calls += 1
        verdicts = self.inner.judge(requests, max_items)
        if self.calls == 1:
            return verdicts
        rows = []
        for b, request in enumerate(requests):
            n = len(request.rubric.criteria)
            rows.append(RolloutVerdict.failure("request_failed") if b % 3 == 0 else RolloutVerdict(
                satisfied=tuple(verdicts.satisfied_bk[b, :n]), item_step=tuple(verdicts.item_step_bk[b, :n])))
        return Verdicts.from_rollouts(rows, max_items)


@dataclasses.dataclass(frozen=True)
class SometimesEmptyRubricTask(ArithmeticSrarTask):
    """Problems with an even answer have an empty rubric."""

    def rubric(self, example):
        return Rubric((), format="srar") if example.answer % 2 == 0 else super().rubric(example)


def test_two_rl_steps_end_to_end_with_judge_failures_and_empty_rubrics_mid_run(tmp_path):
    the_task = SometimesEmptyRubricTask(arithmetic.ArithmeticConfig(), 0)
    config = RLConfig(
        output_dir=str(tmp_path / "run"), steps=2, model=ModelSpec(init=TINY), seed=3,
        task=TaskSpec(name="arithmetic_srar"), algorithm=AlgorithmSpec(name="srar"),
        rollout=RolloutConfig(prompts_per_step=4, group_size=3, max_new_tokens=16, pipelined_judging=False),
        checkpoint=CheckpointConfig(every_steps=2), metrics=MetricsConfig(console=False, plots=False))
    train_rl(config, the_task, judge=FlakyJudge(the_task.judge()))  # counts its calls: serial, one a step
    first, second = read_metrics(tmp_path / "run" / "metrics.jsonl")
    for line in (first, second):
        assert all(math.isfinite(value) for value in line.values()), line
        assert {"reward/mean", "advantage/std", "srar/format_rate", "srar/looping_rate", "srar/frr", "srar/mtr",
                "srar/rate/suggest", "srar/score/pitfall", "srar/rubric_score", "train/loss", "train/grad_norm",
                "train/dual_clip_fraction", "outcome/accuracy", "judge/failure_rate"} <= line.keys()
    assert first["judge/failure_rate"] == 0 and "judge/failed/request_failed" not in first
    assert second["judge/failure_rate"] == pytest.approx(4 / 12)
    assert second["judge/failed/request_failed"] == 4
    assert (tmp_path / "run" / "model").is_dir()


def test_srar_is_registered_and_its_config_validates():
    assert algorithm_class("srar") is SRaR
    assert SRaRConfig().policy_loss.loss == "dual_clip" and SRaRConfig().policy_loss.eps_high == 0.28


@pytest.mark.parametrize("changes, message", [
    (dict(max_items=0), "max_items"),
    (dict(format_weight=1.5), "format_weight"),
    (dict(advantage="merged", step_normalization=False), "step_normalization"),
    (dict(advantage="rar", step_normalization=False), "step_normalization"),
    (dict(std_ddof=2), "std_ddof"),
    (dict(step_groups="paper", advantage="merged"), "step_groups"),
    (dict(step_groups="paper", advantage="rar"), "step_groups"),
    (dict(step_groups="paper", step_normalization=False), "step_groups"),
    (dict(eps=-1.0), "eps"),
])
def test_config_validation_names_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        SRaRConfig(**changes)


# ---------------------------------------------------------------- advantages


def test_the_hand_computed_group():
    """r_base = 0.9 acc + 0.1 fmt = (1, 0.1, 1, 0.9); deltas (eq 3, 3 SUGGEST of 0.8 / 3, 3 PITFALL of -1 / 3,
    1 BONUS of 1): step 0: gold 1 (bonus), slip 1 (bonus), no-steps -1/3 (text after the box); step 1: gold
    4/15, slip -1/3 (the slip), repeat 4/15 - 1/3 (the repeat); steps 2 and 3: gold and repeat 4/15 each."""
    result = hand_group_experience()
    outcome = (np.array([1.0, 0.1, 1.0, 0.9]) - 0.75) / math.sqrt(0.57 / 3)
    step0 = {0: 1 / math.sqrt(3), 1: 1 / math.sqrt(3), 3: -2 / math.sqrt(3)}  # (1, 1, -1/3) normalised
    step1 = {0: 14 / math.sqrt(183), 1: -13 / math.sqrt(183), 2: -1 / math.sqrt(183)}  # (4, -5, -1) / 15
    # steps 2 and 3: two equal values, std 0 -> 0
    expected = {
        0: [outcome[0] + step0[0] + step1[0], outcome[0] + step0[0], outcome[0] + step0[0]],
        1: [outcome[1] + step0[1] + step1[1], outcome[1] + step0[1], outcome[1] + step0[1]],
        2: [outcome[2], outcome[2] + step1[2], outcome[2] + step1[2], outcome[2], outcome[2]],
        3: [outcome[3] + step0[3]],
    }
    for row, values in expected.items():
        np.testing.assert_allclose(per_token(result, row), np.repeat(values, token_spans(GROUP[row])), rtol=1e-5)
    metrics = result.metrics
    assert metrics["reward/mean"] == pytest.approx(0.75)
    assert metrics["srar/format_rate"] == 0.75 and metrics["outcome/accuracy"] == 0.75
    assert metrics["srar/rate/suggest"] == pytest.approx(0.5) and metrics["srar/score/suggest"] == pytest.approx(0.4)
    assert metrics["srar/rate/pitfall"] == pytest.approx(0.25) and metrics["srar/score/pitfall"] == pytest.approx(-0.25)
    assert metrics["srar/rate/bonus"] == 0.5 and metrics["srar/score/bonus"] == 0.5
    assert metrics["srar/rate/answer"] == 0.75
    # step labels: gold TTT, slip FTT (steps 2-3 compute right from the slip), repeat TTTT, no steps.
    assert metrics["srar/step_accuracy"] == pytest.approx(0.9)
    assert metrics["srar/frr"] == 0.5 and metrics["srar/mtr"] == 0.25 and metrics["srar/looping_rate"] == 0.25
    assert metrics["rubric/arithmetic_srar.repeated_step"] == 0.25


def test_the_recipe_composes_the_core_decoupled_advantage():
    result = hand_group_experience()
    engine = ScriptedEngine([["".join(parts) for parts in GROUP]])
    ctx = context(engine, task().judge(), n=4)
    rollouts = srar_recipe.base.sample_groups([task().prompt(EXAMPLE)], ctx, 0)
    verdicts, rubrics = srar_recipe.base.judge_rollouts([EXAMPLE], rollouts, ctx, 16)
    items = rubric_arrays(rubrics, 16)
    base_b = np.array([1.0, 0.1, 1.0, 0.9], np.float32)
    step_ids_bt, num_steps_b = srar_recipe.rollout_steps(rollouts, TOKENIZER)
    np.testing.assert_array_equal(num_steps_b, [3, 3, 4, 1])  # the no-header response is one step
    core = core_srar.srar_advantages(
        base_b, rollouts.group_ids, verdicts.satisfied_bk, items.item_kind_bk, items.item_mask_bk,
        verdicts.item_step_bk, num_steps_b, step_ids_bt, rollouts.batch["response_mask_bt"])
    np.testing.assert_allclose(result.batch["advantages_bt"], np.asarray(core), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("config", [
    SRaRConfig(), SRaRConfig(step_normalization=False), SRaRConfig(advantage="merged"), SRaRConfig(advantage="rar"),
    SRaRConfig(on_judge_failure="exclude"), SRaRConfig(std_ddof=1, max_items=12), SRaRConfig(step_groups="paper"),
    SRaRConfig(step_groups="paper", on_judge_failure="exclude"),
], ids=["decoupled", "no_step_norm", "merged", "rar", "exclude", "k12", "paper_groups", "paper_groups_exclude"])
def test_advantages_match_the_numpy_loop_on_random_step_attributed_verdicts(config):
    rng = np.random.default_rng(7)

    def response():
        lines = [rng.choice(["", "Let me see.\n"])]
        for _ in range(rng.integers(0, 5)):
            lines.append(f"### Step {rng.integers(0, 5)}: {rng.integers(1, 9)} + {rng.integers(1, 9)} = "
                         f"{rng.integers(2, 17)}\n")
        lines.append(rng.choice(["\\boxed{9}", "\\boxed{14}", "no box"]))
        return "".join(lines)

    responses = [[response() for _ in range(4)] for _ in range(3)]
    examples = [EXAMPLE, arithmetic.problem_from_steps([arithmetic.Step(2, "*", 3, 6)]), EXAMPLE]
    judge = RandomJudge(seed=1)
    ctx = context(ScriptedEngine(responses), judge, n=4)
    result = SRaR(config).experience(examples, ctx, step=0)
    expected = check_against_reference(config, result, ctx, examples, judge)
    # Step-specific values exist, except in the RaR baseline: some response's tokens do not all share one advantage.
    mask = result.batch["response_mask_bt"]
    step_specific = any(len(np.unique(np.round(row[m], 5))) > 1 for row, m in zip(expected, mask))
    assert step_specific == (config.advantage != "rar")


def test_advantages_match_the_numpy_loop_on_embedded_engine_rollouts():
    the_task = task()
    model, tokenizer = policy.build_policy(ModelSpec(init=TINY), the_task, policy.make_mesh(MeshConfig()))
    engine = EmbeddedEngine(nnx.merge(*nnx.split(model)), tokenizer=tokenizer, eos_token_ids=[arithmetic.EOS_ID],
                            pad_id=arithmetic.PAD_ID)
    judge = RandomJudge(seed=2)
    ctx = context(engine, judge, n=4, max_new_tokens=24)
    examples = the_task.train_stream(0).next_batch(3)
    result = SRaR(SRaRConfig()).experience(examples, ctx, step=0)
    check_against_reference(SRaRConfig(), result, ctx, examples, judge)
    assert judge.verdicts.failed_b.any() and result.metrics["judge/failed/request_failed"] >= 1


# ---------------------------------------------------------------- ablations


def test_no_step_normalisation_puts_the_raw_step_rewards_on_the_tokens_and_keeps_the_outcome_term():
    full, raw = hand_group_experience(), hand_group_experience(SRaRConfig(step_normalization=False))
    outcome = (np.array([1.0, 0.1, 1.0, 0.9]) - 0.75) / math.sqrt(0.57 / 3)
    d = {0: {0: 1.0, 1: 0.8 / 3, 2: 0.8 / 3, 3: 0.8 / 3}, 1: {0: 1.0, 1: -1 / 3},
         2: {1: 0.8 / 3 - 1 / 3, 2: 0.8 / 3, 3: 0.8 / 3},
         3: {0: -1 / 3}}
    steps_of_parts = {0: [1, 2, 3], 1: [1, 2, 3], 2: [0, 1, 1, 2, 3], 3: [1]}  # no header: one step, step 1
    for row in range(4):
        values = [outcome[row] + d[row].get(0, 0.0) + (d[row].get(step, 0.0) if step else 0.0)
                  for step in steps_of_parts[row]]
        # atol: row 1's step 2-3 value is -1.49 + 1.50, a float32 cancellation
        np.testing.assert_allclose(per_token(raw, row), np.repeat(values, token_spans(GROUP[row])), rtol=1e-5,
                                   atol=1e-6)
    assert not np.allclose(full.batch["advantages_bt"], raw.batch["advantages_bt"])
    assert {k: v for k, v in full.metrics.items() if not k.startswith(("advantage/", "srar/rubric_offset"))} == {
        k: v for k, v in raw.metrics.items() if not k.startswith(("advantage/", "srar/rubric_offset"))}


def test_merged_advantage_normalises_one_scalar_and_places_it_on_the_scored_steps():
    merged = hand_group_experience(SRaRConfig(advantage="merged"))
    scalar = np.array([1.0 + 0.8 + 1.0, 0.1 + 1.0 - 1 / 3, 1.0 + 0.8 - 1 / 3, 0.9 - 1 / 3])
    advantage = (scalar - scalar.mean()) / scalar.std(ddof=1)
    for row in (0, 1, 3):  # step 0 scored (or, for row 3, only step 0): every token
        np.testing.assert_allclose(per_token(merged, row), advantage[row], rtol=1e-5)
    # Row 2 has rubric scores at steps 1-3 only: its plan line (outside every step) gets nothing.
    plan, *rest = token_spans(GROUP[2])
    np.testing.assert_allclose(per_token(merged, 2), [0.0] * plan + [advantage[2]] * sum(rest), rtol=1e-5, atol=1e-7)
    assert "srar/rubric_offset/mean" not in merged.metrics


def test_rar_advantage_is_the_authors_rar_baseline():
    """The authors' `compute_rar_advantage`: the same scalar r_base + sum of the deltas as the merged ablation
    (test above), GRPO-normalised (sample std), on every response token, row 2's plan line included."""
    rar = hand_group_experience(SRaRConfig(advantage="rar"))
    scalar = np.array([1.0 + 0.8 + 1.0, 0.1 + 1.0 - 1 / 3, 1.0 + 0.8 - 1 / 3, 0.9 - 1 / 3])
    advantage = (scalar - scalar.mean()) / scalar.std(ddof=1)
    for row in range(4):
        np.testing.assert_allclose(per_token(rar, row), advantage[row], rtol=1e-5)
    assert "srar/rubric_offset/mean" not in rar.metrics


def test_suggest_only_removes_pitfall_and_bonus_items_before_judging():
    recording = RecordingJudge(task().judge())
    suggest_only = hand_group_experience(SRaRConfig(rubric="suggest_only"), judge=recording)
    assert recording.rubrics and all(
        {c.kind for c in r.criteria} == {ItemKind.SUGGEST, ItemKind.ANSWER} for r in recording.rubrics)
    assert len(recording.rubrics[0].criteria) == 4  # 3 SUGGEST, 1 ANSWER: N_SUG unchanged

    @dataclasses.dataclass(frozen=True)
    class SuggestOnlyTask(ArithmeticSrarTask):
        def rubric(self, example):
            rubric = super().rubric(example)
            return Rubric(tuple(c for c in rubric.criteria if c.kind in (ItemKind.SUGGEST, ItemKind.ANSWER)),
                          format="srar")

    engine = ScriptedEngine([["".join(parts) for parts in GROUP]])
    the_task = SuggestOnlyTask(arithmetic.ArithmeticConfig(), 0)
    same = SRaR(SRaRConfig()).experience([EXAMPLE], context(engine, the_task.judge(), n=4, the_task=the_task), 0)
    np.testing.assert_array_equal(suggest_only.batch["advantages_bt"], same.batch["advantages_bt"])
    assert "srar/rate/pitfall" not in suggest_only.metrics and "rubric/arithmetic.format" not in suggest_only.metrics
    # step 1: gold 4/15, slip nothing, repeat 4/15: (4/15, 4/15) has std 0 -> the slip keeps only A_base
    outcome = (np.array([1.0, 0.1, 1.0, 0.9]) - 0.75) / math.sqrt(0.57 / 3)
    np.testing.assert_allclose(per_token(suggest_only, 1), outcome[1], rtol=1e-5)


def test_step_format_prompt_wraps_the_question():
    engine = ScriptedEngine([["".join(parts) for parts in GROUP]])
    SRaR(SRaRConfig(prompt="step_format")).experience([EXAMPLE], context(engine, task().judge(), n=4), 0)
    assert engine.prompts == [[prompts.step_format_prompt(EXAMPLE.question)]]
    engine = ScriptedEngine([["".join(parts) for parts in GROUP]])
    SRaR(SRaRConfig()).experience([EXAMPLE], context(engine, task().judge(), n=4), 0)
    assert engine.prompts == [[task().prompt(EXAMPLE)]]


def test_dynamic_sampling_drops_groups_of_uniform_accuracy_and_keeps_the_others_unchanged():
    all_right = [arithmetic.solution_text(EXAMPLE)] * 3 + ["\\boxed{9}"]
    responses = [["".join(parts) for parts in GROUP], all_right]

    def run(config):
        engine = ScriptedEngine(responses)
        return SRaR(config).experience([EXAMPLE, EXAMPLE], context(engine, task().judge(), n=4), 0)

    plain, filtered = run(SRaRConfig()), run(SRaRConfig(dynamic_sampling=True))
    assert filtered.metrics["srar/kept_group_fraction"] == 0.5
    assert not filtered.batch["response_mask_bt"][4:].any() and not filtered.batch["advantages_bt"][4:].any()
    np.testing.assert_array_equal(filtered.batch["advantages_bt"][:4], plain.batch["advantages_bt"][:4])
    assert plain.batch["advantages_bt"][4:].any()  # the dropped group had a (rubric) signal
    assert "srar/kept_group_fraction" not in plain.metrics


def test_judge_failures_keep_the_outcome_advantage_or_are_excluded():
    class FailSecond(Judge):
        def judge(self, requests, max_items):
            verdicts = task().judge().judge(requests, max_items)
            rows = [RolloutVerdict.failure("no_json") if b == 1 else RolloutVerdict(
                satisfied=tuple(verdicts.satisfied_bk[b, :len(r.rubric.criteria)]),
                item_step=tuple(verdicts.item_step_bk[b, :len(r.rubric.criteria)])) for b, r in enumerate(requests)]
            return Verdicts.from_rollouts(rows, max_items)

    kept = hand_group_experience(judge=FailSecond())
    outcome = (np.array([1.0, 0.1, 1.0, 0.9]) - 0.75) / math.sqrt(0.57 / 3)
    np.testing.assert_allclose(per_token(kept, 1), outcome[1], rtol=1e-5)  # in no step group
    assert kept.metrics["judge/failure_rate"] == 0.25 and kept.metrics["judge/failed/no_json"] == 1
    excluded = hand_group_experience(SRaRConfig(on_judge_failure="exclude"), judge=FailSecond())
    assert not excluded.batch["response_mask_bt"][1].any() and not excluded.batch["advantages_bt"][1].any()
    remaining = np.array([1.0, 1.0, 0.9])  # the outcome group without the failed rollout; step 0: (1, -1/3)
    assert per_token(excluded, 3)[0] == pytest.approx(
        (0.9 - remaining.mean()) / (remaining.std(ddof=1) + 1e-6) - 1 / math.sqrt(2), rel=1e-5)  # eps: std 0.06
    for result in (kept, excluded):
        assert all(math.isfinite(v) for v in result.metrics.values())


def test_paper_step_groups_take_in_rollouts_without_a_delta_at_the_step():
    """The hand group under eq 4 as written: the task's judge attributes every item to a step, satisfied or not,
    so rollouts join groups the authors' rule keeps them out of and the offsets change; the outcome term does
    not. (Each rule's values: `tests/core/test_srar.py:test_paper_and_authors_step_groups_differ_by_hand`, and
    the NumPy loop on random verdicts above.)"""
    authors, paper = hand_group_experience(), hand_group_experience(SRaRConfig(step_groups="paper"))
    assert not np.allclose(authors.batch["advantages_bt"], paper.batch["advantages_bt"])
    assert paper.metrics["reward/mean"] == authors.metrics["reward/mean"]
    np.testing.assert_array_equal(paper.batch["response_mask_bt"], authors.batch["response_mask_bt"])


# ---------------------------------------------------------------- r_acc: the task's check or the authors' strings


@pytest.mark.parametrize("answer, normalized", [
    (" 1,000 ", "1000"),  # commas and spaces deleted
    ("$\\text{5 cm}$", "5cm"),
    ("\\textbf{B}", "B"),
    ("\\boxed{7}", "7"),
    ("\\frac12", "frac{1}{2}"),  # the rewritten fraction loses its backslash (the authors' replacement string)
    ("\\frac{1}{2}", "\\frac{1}{2}"),  # a braced fraction is left alone
    ("\\text{a{b}c}", "a{bc}"),  # the group ends at the first closing brace
    ("1,2", "12"),
])
def test_boxed_string_normalisation_by_hand(answer, normalized):
    assert srar_recipe.normalize_boxed_string(answer) == normalized


@pytest.mark.parametrize("boxed, gold, strings_equal, math_verify_equal", [
    ("\\frac12", "0.5", False, True),
    ("\\frac12", "\\frac{1}{2}", False, True),  # 'frac{1}{2}' vs '\\frac{1}{2}'
    ("x = 3", "3", False, True),
    ("1,2", "12", True, False),  # the comma goes, so a pair equals a number
    ("1,000", "1000", True, True),
    ("\\text{5 cm}", "5cm", True, False),
])
def test_boxed_string_accuracy_differs_from_math_verify(boxed, gold, strings_equal, math_verify_equal):
    response = f"### Step 1: work\n\\boxed{{{boxed}}}"
    assert srar_recipe.boxed_string_correct(response, gold) is strings_equal
    assert (equivalence_status(extract_boxed(response), gold) == EQUIVALENT) is math_verify_equal


def test_boxed_string_accuracy_needs_a_closed_non_empty_box():
    assert not srar_recipe.boxed_string_correct("the answer is 9", "9")
    assert not srar_recipe.boxed_string_correct("\\boxed{9", "9")
    assert not srar_recipe.boxed_string_correct("\\boxed{ }", " ")
    assert srar_recipe.boxed_string_correct("\\boxed{8} then \\boxed{9}", "9")  # the last box


@dataclasses.dataclass(frozen=True)
class DecimalGoldTask(ArithmeticSrarTask):
    """The arithmetic task with its gold answers written as decimals ("9.0")."""

    def gold_answer(self, example):
        return f"{example.answer}.0"


def test_accuracy_boxed_string_sets_r_acc_from_the_gold_string():
    # GROUP's boxes hold 9, 11, 9, 9 for the gold 9: the task's check (an integer) accepts three
    engine = ScriptedEngine([["".join(parts) for parts in GROUP]])
    config = SRaRConfig(accuracy="boxed_string")
    same = SRaR(config).experience([EXAMPLE], context(engine, task().judge(), n=4), 0)
    assert same.metrics["outcome/accuracy"] == 0.75 and same.metrics["reward/mean"] == pytest.approx(0.75)
    decimal = DecimalGoldTask(arithmetic.ArithmeticConfig(), 0)
    strict = SRaR(config).experience([EXAMPLE], context(engine, decimal.judge(), n=4, the_task=decimal), 0)
    # "9" != "9.0" as strings: r_acc = 0 everywhere, r_base = 0.1 r_fmt = (0.1, 0.1, 0.1, 0)
    assert strict.metrics["outcome/accuracy"] == 0 and strict.metrics["reward/mean"] == pytest.approx(0.075)
    lenient = SRaR(SRaRConfig()).experience([EXAMPLE], context(engine, decimal.judge(), n=4, the_task=decimal), 0)
    assert lenient.metrics["outcome/accuracy"] == 0.75


def test_accuracy_boxed_string_needs_the_tasks_gold_answer():
    @dataclasses.dataclass(frozen=True)
    class NoGold:
        inner: ArithmeticSrarTask

        def __getattr__(self, name):
            if name == "gold_answer":
                raise AttributeError(name)
            return getattr(self.inner, name)

    no_gold = NoGold(task())
    engine = ScriptedEngine([["".join(parts) for parts in GROUP]])
    with pytest.raises(ValueError, match="accuracy boxed_string"):
        SRaR(SRaRConfig(accuracy="boxed_string")).experience(
            [EXAMPLE], context(engine, task().judge(), n=4, the_task=no_gold), 0)


# ---------------------------------------------------------------- analysis metrics


def test_format_reward_needs_a_step_header_and_a_box():
    assert has_step_format("### Step 1: 1 + 1 = 2\n\\boxed{2}")
    assert not has_step_format("1 + 1 = 2\n\\boxed{2}")
    assert not has_step_format("### Step 1: 1 + 1 = 2")
    assert not has_step_format("```\n### Step 1: x\n```\n\\boxed{2}")  # a header in fenced code is no step


def test_looping_criteria():
    clean = "### Step 1: 3 + 4 = 7\n### Step 2: 7 * 2 = 14\n\\boxed{14}"
    assert not looping_report(clean).looping
    restart = looping_report("### Step 1: a\n### Step 2: b\n### Step 1: a again")
    assert restart.step_one_repeated and restart.repeated_headings and restart.looping
    same_title = looping_report("### Step 2: 7 * 2 = 14\n### Step 3: 7 * 2 = 14")
    assert same_title.repeated_headings and not same_title.step_one_repeated
    assert looping_report("Wait. " * 20).self_corrections == 20 and not looping_report("Wait. " * 20).looping
    assert looping_report("Hmm, actually " * 10 + "wait").looping  # 21 phrases
    assert looping_report("waiting, await, Waitress").self_corrections == 0  # whole words only
    paragraphs = "\n\n".join(["p"] * 2 + [f"q{i}" for i in range(8)])  # 1 repeat of 10: exactly 10%
    assert looping_report(paragraphs).duplicate_paragraph_fraction == pytest.approx(0.1)
    assert not looping_report(paragraphs).looping
    assert looping_report(paragraphs + "\n\n  p ").looping  # 2 of 11
    metrics = looping_metrics([clean, "### Step 1: a\n### Step 1: a"])
    assert metrics["looping_rate"] == 0.5 and metrics["loop/step_one_repeated"] == 0.5
    assert looping_metrics([]) == {}


@given(st.text(alphabet=st.sampled_from(list("### Step 12:wait\n ab")), max_size=120))
def test_looping_report_is_defined_on_any_text(text):
    report = looping_report(text)
    assert 0 <= report.duplicate_paragraph_fraction < 1 and report.self_corrections >= 0
    assert report.step_one_repeated <= report.repeated_headings  # (ii) is a case of (iii)


def test_analysis_metrics_without_step_labels_or_typed_items():
    verdicts = Verdicts.from_rollouts([RolloutVerdict(satisfied=(1.0,)), RolloutVerdict.failure("no_json")], 1)
    rubric = Rubric((Criterion("generic", name="c"),))
    metrics = analysis_metrics(object(), [None, None], ["a", "b"], np.array([True, False]), verdicts, [rubric] * 2)
    assert metrics["rubric_score"] == 0.5 and metrics["looping_rate"] == 0
    assert not any(key.startswith(("rate/", "score/")) or key in ("frr", "mtr", "step_accuracy") for key in metrics)


def test_step_label_metrics():
    labels = [[True, True], [False, True], [True], [], [True, False]]
    correct = np.array([True, True, False, True, False])
    metrics = step_label_metrics(labels, correct)
    assert metrics["step_accuracy"] == pytest.approx(5 / 7)
    assert metrics["frr"] == pytest.approx(1 / 5)  # row 0
    assert metrics["mtr"] == pytest.approx(3 / 5)  # rows 1 and 3 (A right, S wrong), row 2 (A wrong, S right)
    assert "step_accuracy" not in step_label_metrics([[], []], np.array([True, False]))
    with pytest.raises(ValueError, match="label lists"):
        step_label_metrics([[True]], np.array([True, False]))


