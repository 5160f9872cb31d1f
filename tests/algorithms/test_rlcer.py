"""RLCER: a step worked by hand on the rubric world (scripted reasoner and rubricator texts, the world's own
verifier); the validity, CoT reward, rubricator reward and both roles' advantages recomputed in NumPy from the
verdicts of an EmbeddedEngine step and on random arrays; each ablation switch changing exactly what the paper
says; judge failures, unparsable and empty rubrics counted, never NaN; one training step end to end through
train_rl."""

import dataclasses
import json
import math
import zlib

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.algorithms.base import RolloutContext
from rubric_jax.algorithms.rlcer import RLCER, RLCERConfig, question_scores, role_advantages, rubricator_io
from rubric_jax.algorithms.rlcer_eval import hint_evaluation, hint_lines
from rubric_jax.data import arithmetic
from rubric_jax.data.rubric_world import rubric_text
from rubric_jax.data.tasks import RubricWorldTask, build_task
from rubric_jax.inference.engine import RolloutEngine, Sample, SamplingParams
from rubric_jax.judges.base import Judge, Verdicts
from rubric_jax.judges.programmatic import ProgrammaticJudge, RegexCheck
from rubric_jax.rubrics import prompts
from rubric_jax.rubrics.parsing import RubricParse
from rubric_jax.rubrics.schema import Criterion, Rubric
from rubric_jax.rubrics.steps import response_text
from rubric_jax.training import policy
from rubric_jax.training.metrics import PhaseTimer, read_metrics
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import AlgorithmSpec, MeshConfig, ModelSpec, RolloutConfig
from tests.algorithms.test_grpo import assert_row_advantages, make_context, numpy_grpo, response_texts
from tests.training.test_rl import TINY, tiny_rl_config

ALPHA, EPS = 0.2, 1e-6
WORLD_CHECKS = build_task("arithmetic_rubrics", {}, 0).judge().checks
WIDE = dataclasses.replace(TINY, max_position_embeddings=256)  # rubricator prompts hold a question and a CoT

# ---------------------------------------------------------------- a step worked by hand on the rubric world

PROBLEM_A = arithmetic.problem_from_steps([arithmetic.Step(3, "+", 4, 7), arithmetic.Step(7, "*", 2, 14)])
PROBLEM_B = arithmetic.problem_from_steps([arithmetic.Step(5, "-", 2, 3), arithmetic.Step(3, "+", 9, 12)])
GOLD_A, GOLD_B = arithmetic.solution_text(PROBLEM_A), arithmetic.solution_text(PROBLEM_B)
REPEATED_A = "### Step 1: 3 + 4 = 7\n### Step 2: 7 * 2 = 14\n### Step 2: 7 * 2 = 14\n\\boxed{14}"
WRONG_A = "### Step 1: 3 + 4 = 8\n### Step 2: 8 * 2 = 16\n\\boxed{16}"
GUESS_A = "\\boxed{15}"
REASONER_TEXTS = {PROBLEM_A.question: [GOLD_A, REPEATED_A, WRONG_A, GUESS_A], PROBLEM_B.question: [GOLD_B] * 4}
# The rubric each CoT's rubricator writes ("nonsense" does not parse).
RUBRICATOR_TEXTS = {GOLD_A: "+3 S1\n-3 WS", REPEATED_A: "+1 BX\n+1 EV", WRONG_A: "nonsense", GUESS_A: "+2 FM\n-3 RP",
                    GOLD_B: "+3 S1"}
# Question A, z = [1, 1, 0, 0] and the world verifier's verdicts v_k on the four CoTs; penalties (WS, RP) are
# validated by the absence of their flaw, u = 1 - v (the default penalty_validity):
#   S1 [1,1,0,0] corr 1 valid | WS [0,0,1,0], u [1,1,0,1] corr 0.58 valid | BX [1,1,1,1] std 0
#   EV [1,1,1,0] corr 0.58 valid | FM [1,0,1,0] corr 0 | RP [0,1,0,0], u [1,0,1,1] corr -0.58 (a flaw that came
#   with a right answer)
# valid points +3, -3, +1: min -3, max 4; r_cot = (x + 3) / 7 with x = 4, 4, -2, 0.
COT_A = np.array([7, 7, 1, 3]) / 7
# Question B: every answer right, z has no variance, so no rubric is valid and r_cot = 0.
REASONER_REWARD = np.concatenate([np.array([1, 1, -1, -1]) + COT_A, [1, 1, 1, 1]])
# Rubricators: K_valid / K + format: S1 WS 2/2 + 1, BX EV 1/2 + 1, unparsable 0, FM RP 0 + 1; B's S1 0 + 1.
RUBRICATOR_REWARD = np.array([2, 1.5, 0, 1, 1, 1, 1, 1])


class ScriptedEngine(RolloutEngine):
    """Answers each chat prompt with `script(content of its last message, n)`, n texts each ending on EOS, and
    records every call's prompts and sampling parameters."""

    weight_version = "scripted"

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.calls = tokenizer, script, []

    def generate(self, prompts, params):
        self.calls.append((list(prompts), params))
        samples = []
        for index, prompt in enumerate(prompts):
            for text in self.script(prompt[-1]["content"], params.n):
                ids = tuple(self.tokenizer.encode(text, add_special_tokens=False)) + (arithmetic.EOS_ID,)
                samples.append(Sample(index, ids, (-0.5,) * len(ids), "stop", arithmetic.EOS_ID, "scripted"))
        return samples

    async def agenerate(self, prompts, params):
        return self.generate(prompts, params)

    def update_weights(self, model, version):
        del model, version


def world_script(rubrics):
    """REASONER_TEXTS for a question; for a rubricator prompt, the rubric `rubrics` gives the CoT it reads."""
    def script(content, n):
        if content in REASONER_TEXTS:
            return REASONER_TEXTS[content][:n]
        return [next(rubric for cot, rubric in rubrics.items() if f"\n{cot}\n" in content)] * n
    return script


def failing_on(marker: str, checks: dict, names=None) -> ProgrammaticJudge:
    """A judge of `checks` in which every check (of `names`; None: all) raises on responses containing `marker`."""
    def failing(check):
        def run(response, request):
            if marker in response:
                raise ValueError("scripted failure")
            return check(response, request)
        return run

    return ProgrammaticJudge({name: failing(check) if names is None or name in names else check
                              for name, check in checks.items()})


class RecordingJudge(Judge):
    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def judge(self, requests, max_items):
        verdicts = self.inner.judge(requests, max_items)
        self.calls.append((list(requests), verdicts))
        return verdicts


def world_step(config=RLCERConfig(estimator="grpo"), *, judge=None, rubrics=RUBRICATOR_TEXTS, tokenizer=None):
    # The tests of this file check advantages by hand, so they run the GRPO estimator (the recipe's ablation);
    # the paper's ppo_critic (token rewards for the trainer's critic) is tested in tests/training/test_critic.py.
    task = build_task("arithmetic_rubrics", {}, 0)
    tokenizer = tokenizer or task.tokenizer()
    engine = ScriptedEngine(tokenizer, world_script(rubrics))
    context = RolloutContext(engine=engine, tokenizer=tokenizer, task=task, judge=judge or task.judge(), pad_id=0,
                             seed=0, sampling=SamplingParams(max_new_tokens=64, n=4), timer=PhaseTimer())
    return RLCER(config).experience([PROBLEM_A, PROBLEM_B], context, step=0), engine


def row_values(batch, prompt_width) -> np.ndarray:
    """Each row's advantage (the value on its first response token; 0 for a row out of the loss)."""
    mask = batch["response_mask_bt"][:, prompt_width]
    return np.where(mask, batch["advantages_bt"][:, prompt_width], 0)


def numpy_batch_normalised(rewards, valid, eps=EPS):
    """(r - mean) / (sample std + eps) over the valid rows; 0 elsewhere and when they tie."""
    out = np.zeros(len(rewards))
    values = np.asarray(rewards, np.float64)[valid]
    if len(values) > 1 and values.std(ddof=1) > 0:
        out[valid] = (values - values.mean()) / (values.std(ddof=1) + eps)
    return out


def test_a_world_step_by_hand():
    result, engine = world_step()
    metrics, batch = result.metrics, result.batch
    # 8 reasoner rows, then 8 rubricator rows, every response starting at the shared prompt width.
    rubrics = [RUBRICATOR_TEXTS[cot] for cot in REASONER_TEXTS[PROBLEM_A.question]] + ["+3 S1"] * 4
    texts = [*REASONER_TEXTS[PROBLEM_A.question], *REASONER_TEXTS[PROBLEM_B.question], *rubrics]
    assert response_texts(batch, result.prompt_width, engine.tokenizer) == texts
    prompt = engine.tokenizer.decode(batch["tokens_bt"][9, :result.prompt_width], skip_special_tokens=True)
    assert prompt.endswith(f"<response>\n{REPEATED_A}\n</response>\nassistant\n")
    reasoner_advantage = numpy_grpo(REASONER_REWARD, 4)
    rubricator_advantage = numpy_batch_normalised(RUBRICATOR_REWARD, np.ones(8, bool))
    assert_row_advantages(batch, np.concatenate([reasoner_advantage, rubricator_advantage]))
    assert metrics["reward/mean"] == pytest.approx(REASONER_REWARD.mean(), abs=1e-6)
    assert metrics["rubricator/reward/mean"] == pytest.approx(RUBRICATOR_REWARD.mean(), abs=1e-6)
    assert metrics["rlcer/cot_reward_mean"] == pytest.approx(COT_A.sum() / 8, abs=1e-6)
    assert metrics["rlcer/rubricator_format_rate"] == 7 / 8 and metrics["rlcer/parse_failed/schema"] == 1
    assert metrics["rlcer/rubric_count_mean"] == pytest.approx(10 / 7)
    assert metrics["rlcer/valid_fraction"] == pytest.approx(1.5 / 7)  # a whole, a half and five zeros
    # corr(u_k, z) over the rubrics whose correlation is defined: A's S1, WS, EV, FM, RP (BX is constant; B's z is).
    assert metrics["rlcer/corr_mean"] == pytest.approx((1 + 1 / 3**0.5 + 1 / 3**0.5 + 0 - 1 / 3**0.5) / 5, abs=1e-6)
    assert metrics["rlcer/no_valid_rubric_fraction"] == 0.5
    assert metrics["rlcer/proposed/S1"] == 5 / 7 and metrics["rlcer/valid/S1"] == 1 / 5
    assert metrics["rlcer/valid/WS"] == 1 and metrics["rlcer/valid/RP"] == 0 and metrics["rlcer/valid/BX"] == 0
    assert metrics["judge/failure_rate"] == 0 and metrics["outcome/accuracy"] == 6 / 8
    # The rubricator sampled one output per CoT, with the reasoner's budget (no rubricator budget configured), in
    # one call per question, made as soon as the question's rollouts were in.
    assert [(p.n, p.max_new_tokens) for _, p in engine.calls] == [(4, 64), (1, 64), (1, 64)]
    assert [len(prompts) for prompts, _ in engine.calls] == [2, 4, 4]
    assert all(math.isfinite(v) for v in metrics.values())


def test_fewer_rubricators_read_the_first_cots_of_each_question():
    result, engine = world_step(RLCERConfig(estimator="grpo", rubricators_per_question=2, rubricator_max_new_tokens=24))
    # A's rubrics come from the gold and repeated CoTs: S1, WS and EV valid (+3, -3, +1), as with all four.
    reasoner = np.concatenate([np.array([1, 1, -1, -1]) + COT_A, [1, 1, 1, 1]])
    rubricator = np.array([2, 1.5, 1, 1])
    assert_row_advantages(result.batch, np.concatenate([numpy_grpo(reasoner, 4),
                                                        numpy_batch_normalised(rubricator, np.ones(4, bool))]))
    assert engine.calls[1][1] == SamplingParams(max_new_tokens=24, n=1, seed=engine.calls[1][1].seed)
    with pytest.raises(ValueError, match="rubricators_per_question"):
        world_step(RLCERConfig(estimator="grpo", rubricators_per_question=5))


def test_alpha_decides_validity():
    # EV and RP (corr 0.58) drop out: only S1 (+3) is valid
    strict, _ = world_step(RLCERConfig(estimator="grpo", alpha=0.6))
    reasoner = np.concatenate([np.array([1, 1, -1, -1]) + np.array([1, 1, 0, 0]), [1, 1, 1, 1]])
    assert strict.metrics["reward/mean"] == pytest.approx(reasoner.mean())
    assert strict.metrics["rlcer/valid_fraction"] == pytest.approx(0.5 / 7)


def test_penalty_rubrics_validated_as_eq_7_is_written():
    written, _ = world_step(RLCERConfig(estimator="grpo", penalty_validity="as_written"))
    # v itself: WS [0,0,1,0] corr -0.58 invalid (the useful "wrong result" penalty), RP [0,1,0,0] corr 0.58 valid
    # (a flaw that came with a right answer). Valid: S1 +3, EV +1, RP -3 (min -3, max 4); x = 4, 1, 1, 0.
    reasoner = np.concatenate([np.array([1, 1, -1, -1]) + np.array([7, 4, 4, 3]) / 7, [1, 1, 1, 1]])
    rubricator = np.array([1.5, 1.5, 0, 1.5, 1, 1, 1, 1])  # S1 WS half; BX EV half; FM RP half
    assert_row_advantages(written.batch, np.concatenate([numpy_grpo(reasoner, 4),
                                                         numpy_batch_normalised(rubricator, np.ones(8, bool))]))
    assert written.metrics["rlcer/corr_mean"] == pytest.approx((1 - 1 / 3**0.5 + 1 / 3**0.5 + 0 + 1 / 3**0.5) / 5,
                                                               abs=1e-6)
    assert written.metrics["rlcer/valid/WS"] == 0 and written.metrics["rlcer/valid/RP"] == 1


# ---------------------------------------------------------------- ablations


def test_rubric_only_drops_the_outcome_term_and_nothing_else():
    full, _ = world_step()
    cot_only, _ = world_step(RLCERConfig(estimator="grpo", reasoner_reward="cot_only"))
    reasoner = np.concatenate([COT_A, [0, 0, 0, 0]])
    expected = np.concatenate([numpy_grpo(reasoner, 4), row_values(full.batch, full.prompt_width)[8:]])
    assert_row_advantages(cot_only.batch, expected)
    assert cot_only.metrics["reward/mean"] == pytest.approx(reasoner.mean())
    for key in ("rubricator/reward/mean", "rlcer/valid_fraction", "rlcer/corr_mean", "rlcer/cot_reward_mean"):
        assert cot_only.metrics[key] == full.metrics[key]


def test_random_rubric_reward_ignores_the_rubrics():
    full, _ = world_step()
    random, _ = world_step(RLCERConfig(estimator="grpo", reasoner_reward="random_cot_only"))
    again, _ = world_step(RLCERConfig(estimator="grpo", reasoner_reward="random_cot_only"))
    assert 0 <= random.metrics["reward/min"] and random.metrics["reward/max"] < 1
    assert random.metrics["reward/mean"] == again.metrics["reward/mean"]  # a function of (seed, step)
    np.testing.assert_array_equal(row_values(random.batch, random.prompt_width)[8:],
                                  row_values(full.batch, full.prompt_width)[8:])
    assert random.metrics["rubricator/reward/mean"] == full.metrics["rubricator/reward/mean"]


def test_without_evolving_rewards_the_rubricator_for_its_format_only():
    full, _ = world_step()
    format_only, _ = world_step(RLCERConfig(estimator="grpo", rubricator_training="format_only"))
    fmt = np.array([1, 1, 0, 1, 1, 1, 1, 1], np.float64)
    expected = np.concatenate([row_values(full.batch, full.prompt_width)[:8],
                               numpy_batch_normalised(fmt, np.ones(8, bool))])
    assert_row_advantages(format_only.batch, expected)
    assert format_only.metrics["rlcer/cot_reward_mean"] == full.metrics["rlcer/cot_reward_mean"]
    assert format_only.metrics["rubricator/reward/mean"] == pytest.approx(7 / 8)


def test_a_frozen_rubricator_leaves_the_update_but_its_rubrics_are_used():
    full, _ = world_step()
    frozen, _ = world_step(RLCERConfig(estimator="grpo", rubricator_training="frozen"))
    assert frozen.batch["tokens_bt"].shape[0] == 8 and frozen.prompt_width < full.prompt_width
    np.testing.assert_allclose(row_values(frozen.batch, frozen.prompt_width),
                               row_values(full.batch, full.prompt_width)[:8], atol=1e-6)
    assert frozen.metrics["rlcer/cot_reward_mean"] == full.metrics["rlcer/cot_reward_mean"]
    assert "rubricator/advantage/mean" not in frozen.metrics
    assert frozen.metrics["rubricator/reward/mean"] == full.metrics["rubricator/reward/mean"]


def test_advantage_estimators_per_role_are_switchable():
    swapped, _ = world_step(RLCERConfig(estimator="grpo", reasoner_advantage="batch", rubricator_advantage="grpo"))
    expected = np.concatenate([numpy_batch_normalised(REASONER_REWARD, np.ones(8, bool)),
                               numpy_grpo(RUBRICATOR_REWARD, 4)])
    assert_row_advantages(swapped.batch, expected)


def test_the_overlong_buffer_penalises_long_reasoner_responses_only():
    full, _ = world_step()
    shaped, engine = world_step(RLCERConfig(estimator="grpo", overlong_buffer=32))
    lengths = np.array([len(engine.tokenizer.encode(t, add_special_tokens=False)) + 1
                        for q in (PROBLEM_A, PROBLEM_B) for t in REASONER_TEXTS[q.question]])
    penalty = np.clip((lengths - (64 - 32)) / 32, 0, None)  # a ramp over the last 32 of 64 tokens
    assert penalty.max() > 0 and penalty.min() == 0
    assert shaped.metrics["reward/mean"] == pytest.approx((REASONER_REWARD - penalty).mean(), abs=1e-6)
    np.testing.assert_array_equal(row_values(shaped.batch, shaped.prompt_width)[8:],
                                  row_values(full.batch, full.prompt_width)[8:])
    with pytest.raises(ValueError, match="overlong_buffer"):
        world_step(RLCERConfig(estimator="grpo", overlong_buffer=64))


# ---------------------------------------------------------------- failures


@pytest.mark.parametrize("policy_name", ["zero_reward", "exclude"])
def test_a_failed_judgement_is_counted_and_its_rollout_takes_no_part_in_validity(policy_name):
    wrong_a_fails = failing_on("16", WORLD_CHECKS)
    result, _ = world_step(RLCERConfig(estimator="grpo", on_judge_failure=policy_name), judge=wrong_a_fails)
    metrics = result.metrics
    # 28 requests (A: 4 rollouts x 3 parsed lists, B: 4 x 4); WRONG_A's three failed.
    assert metrics["judge/failure_rate"] == 3 / 28 and metrics["judge/failed/check_raised"] == 3
    # Without WRONG_A, z = [1, 1, 0] over GOLD, REPEATED, GUESS: S1 [1,1,0] corr 1, WS constant, BX constant,
    # EV [1,1,0] corr 1, FM [1,0,0] corr 0.5, RP u = [1,0,1] corr -0.5: valid S1 +3, EV +1, FM +2 (min 0, max 6).
    cot = np.array([6 / 6, 4 / 6, 0, 0])
    valid = np.array([True, True, policy_name == "zero_reward", True] + [True] * 4)
    reasoner = np.concatenate([np.array([1, 1, -1, -1]) + cot, [1, 1, 1, 1]])
    rubricator = np.array([1.5, 1.5, 0, 1.5, 1, 1, 1, 1])
    expected = np.concatenate([numpy_grpo(reasoner, 4, valid), numpy_batch_normalised(rubricator, np.ones(8, bool))])
    assert_row_advantages(result.batch, expected)
    assert result.batch["response_mask_bt"][2].any() == (policy_name == "zero_reward")
    assert all(math.isfinite(v) for v in metrics.values())


def test_the_verifier_judges_one_rubricator_list_per_request():
    judge = RecordingJudge(build_task("arithmetic_rubrics", {}, 0).judge())
    result, _ = world_step(judge=judge)
    assert len(judge.calls) == 2  # one call per question
    requests = [r for call, _ in judge.calls for r in call]
    # (question, rollout, list) order: A's 4 rollouts x its 3 parsed lists (WRONG_A's rubricator wrote none),
    # then B's 4 rollouts x its 4 lists.
    lists_a = [RUBRICATOR_TEXTS[cot] for cot in (GOLD_A, REPEATED_A, GUESS_A)]
    expected = [(cot, rubric) for cot in REASONER_TEXTS[PROBLEM_A.question] for rubric in lists_a]
    expected += [(GOLD_B, "+3 S1")] * 16
    assert [(r.response, rubric_text(r.rubric.criteria)) for r in requests] == expected
    assert {r.question for r in requests[:12]} == {PROBLEM_A.question}
    # The pooled call (one request per rollout, every list of its question) gives the same step when none fails.
    judge = RecordingJudge(build_task("arithmetic_rubrics", {}, 0).judge())
    pooled, _ = world_step(RLCERConfig(estimator="grpo", verifier_calls="pooled"), judge=judge)
    requests = [r for call, _ in judge.calls for r in call]
    assert [r.response for r in requests] == [*REASONER_TEXTS[PROBLEM_A.question], *REASONER_TEXTS[PROBLEM_B.question]]
    assert rubric_text(requests[0].rubric.criteria) == "\n".join(lists_a)
    np.testing.assert_array_equal(pooled.batch["advantages_bt"], result.batch["advantages_bt"])


@pytest.mark.parametrize("policy_name", ["zero_reward", "exclude"])
def test_a_failed_request_makes_its_list_unknown_for_that_rollout_only(policy_name):
    # The checks of S1 and WS (GOLD_A's rubricator's list) raise on GUESS_A ("15"): that one request fails.
    judge = failing_on("15", WORLD_CHECKS, names={"S1", "WS"})
    result, _ = world_step(RLCERConfig(estimator="grpo", on_judge_failure=policy_name), judge=judge)
    assert result.metrics["judge/failure_rate"] == 1 / 28 and result.metrics["judge/failed/check_raised"] == 1
    # S1 and WS are correlated over GOLD, REPEATED, WRONG (z = [1, 1, 0]): S1 [1,1,0], WS u = [1,1,0], both
    # valid; EV, FM, RP over all four as in the step by hand. Valid S1 +3, WS -3, EV +1, as there; GUESS_A is
    # scored on EV alone (min 0, max 1, unmet): r_cot 0 instead of 3/7. It is judged: no exclusion.
    reasoner = np.concatenate([np.array([1, 1, -1, -1]) + np.array([1, 1, 1 / 7, 0]), [1, 1, 1, 1]])
    assert_row_advantages(result.batch, np.concatenate([
        numpy_grpo(reasoner, 4), numpy_batch_normalised(RUBRICATOR_REWARD, np.ones(8, bool))]))
    # Pooled, the one request of GUESS_A fails: every verdict on it is unknown, a failed judgement. Over GOLD,
    # REPEATED, WRONG: S1 and WS valid, EV [1,1,1] constant: valid S1 +3, WS -3 (min -3, max 3): 1, 1, 0.
    pooled, _ = world_step(RLCERConfig(estimator="grpo", on_judge_failure=policy_name, verifier_calls="pooled"),
                           judge=judge)
    assert pooled.metrics["judge/failure_rate"] == 1 / 8
    reasoner = np.concatenate([np.array([1, 1, -1, -1]) + np.array([1, 1, 0, 0]), [1, 1, 1, 1]])
    valid = np.array([True, True, True, policy_name == "zero_reward"] + [True] * 4)
    rubricator = np.array([2, 1, 0, 1, 1, 1, 1, 1])
    assert_row_advantages(pooled.batch, np.concatenate([numpy_grpo(reasoner, 4, valid),
                                                        numpy_batch_normalised(rubricator, np.ones(8, bool))]))


class ByTextJudge(Judge):
    """The world's verifier for rubrics written in the paper's JSON, whose criterion text is a world code."""

    def __init__(self):
        self.inner = build_task("arithmetic_rubrics", {}, 0).judge()

    def judge(self, requests, max_items):
        named = [dataclasses.replace(r, rubric=dataclasses.replace(r.rubric, criteria=tuple(
            dataclasses.replace(c, name=c.text) for c in r.rubric.criteria))) for r in requests]
        return self.inner.judge(named, max_items)


def paper_rubric(points: dict, **scores) -> str:
    rubrics = [{"category": "Flow", "criterion": code, "points": p} for code, p in points.items()]
    return json.dumps({"question_domain": "math/arithmetic", "rubrics": rubrics, **scores}, separators=(",", ":"))


def test_the_papers_rubricator_format_needs_current_score_below_the_midpoint():
    rubrics = {GOLD_A: paper_rubric({"S1": 3, "WS": -3}, maximum_score=3, minimum_score=-3, current_score=-1),
               # current_score 1 is not below (2 + 0) / 2: format 0 (eq 11, Appendix B), no rubric
               REPEATED_A: paper_rubric({"BX": 1, "EV": 1}, maximum_score=2, minimum_score=0, current_score=1),
               WRONG_A: paper_rubric({"S1": 3}, maximum_score=3, minimum_score=0),  # no current_score
               GUESS_A: paper_rubric({"FM": 2, "RP": -3}, maximum_score=2, minimum_score=-3, current_score=-1),
               GOLD_B: paper_rubric({"S1": 3}, maximum_score=3, minimum_score=0, current_score=0)}
    tokenizer = arithmetic.build_tokenizer()
    tokenizer.add_tokens(["–"])  # Figure 9's "question–answer": one character beyond the world's ASCII
    config = RLCERConfig(estimator="grpo", rubricator_format="paper", rubricator_max_new_tokens=256)
    result, engine = world_step(config, judge=ByTextJudge(), rubrics=rubrics, tokenizer=tokenizer)
    assert engine.calls[1][0][0] == prompts.rubricator_prompt(PROBLEM_A.question, GOLD_A)  # Figure 9
    metrics = result.metrics
    assert metrics["rlcer/parse_failed/inconsistent_scores"] == 1 and metrics["rlcer/parse_failed/schema"] == 1
    assert metrics["rlcer/rubricator_format_rate"] == 6 / 8
    # A's lists: S1 WS (both valid), FM RP (neither): valid S1 +3, WS -3 (min -3, max 3): x = 3, 3, -3, 0.
    reasoner = np.concatenate([np.array([1, 1, -1, -1]) + np.array([1, 1, 0, 0.5]), [1, 1, 1, 1]])
    rubricator = np.array([2, 0, 0, 1, 1, 1, 1, 1])
    assert_row_advantages(result.batch, np.concatenate([numpy_grpo(reasoner, 4),
                                                        numpy_batch_normalised(rubricator, np.ones(8, bool))]))


def test_no_parsable_rubric_in_the_step_leaves_the_outcome_alone():
    garbage = {cot: "???" for cot in RUBRICATOR_TEXTS}
    result, _ = world_step(rubrics=garbage)
    reasoner = np.array([1, 1, -1, -1, 1, 1, 1, 1], np.float64)
    assert_row_advantages(result.batch, np.concatenate([numpy_grpo(reasoner, 4), np.zeros(8)]))
    metrics = result.metrics
    assert metrics["rlcer/rubricator_format_rate"] == 0 and metrics["rlcer/parse_failed/schema"] == 8
    assert metrics["judge/failure_rate"] == 0 and metrics["rlcer/cot_reward_mean"] == 0
    assert "rlcer/valid_fraction" not in metrics and "rlcer/corr_mean" not in metrics
    assert all(math.isfinite(v) for v in metrics.values())


def test_config_validation():
    for field, value in [("alpha", 1.0), ("alpha", -1.5), ("max_items", 0), ("rubricators_per_question", 0),
                         ("rubricator_max_new_tokens", 0), ("overlong_buffer", -1), ("std_ddof", 2), ("eps", -1.0)]:
        with pytest.raises(ValueError, match=field):
            RLCERConfig(**{field: value})


# ---------------------------------------------------------------- rubrics as in-prompt hints (RQ4)


def test_hint_evaluation_asks_again_with_the_parsed_rubric_appended():
    task = build_task("arithmetic_rubrics", {}, 0)
    hinted_a = f"{PROBLEM_A.question}\n+3 S1\n-3 WS"

    def script(content, n):
        if content == hinted_a:
            return [GOLD_A] * n  # the hint helps
        if content in (PROBLEM_A.question, PROBLEM_B.question):
            return [GUESS_A] * n  # wrong for both questions
        return ["+3 S1\n-3 WS" if PROBLEM_A.question in content else "oops"] * n  # B's rubric does not parse

    engine = ScriptedEngine(task.tokenizer(), script)
    metrics = hint_evaluation(engine, task.tokenizer(), task, [PROBLEM_A, PROBLEM_B], samples_per_example=2,
                              temperature=1.0, max_new_tokens=64, rubricator_max_new_tokens=16,
                              rubricator=rubricator_io(task, RLCERConfig(max_items=4)), seed=0)
    assert metrics == {"eval/no_hint_accuracy": 0.0, "eval/no_hint_pass@2": 0.0, "eval/hint_accuracy": 0.5,
                       "eval/hint_pass@2": 0.5, "eval/hint_rubric_format_rate": 0.5}
    (plain, _), (rubricator, params), (hinted, _) = engine.calls
    assert rubricator[0] == task.rubricator_prompt(PROBLEM_A, GUESS_A) and params.max_new_tokens == 16
    assert [m[-1]["content"] for m in hinted] == [hinted_a, PROBLEM_B.question]  # no rubric, no hint
    assert hint_lines(Rubric(criteria=(Criterion(text="avoids detours", weight=2.5),))) == "+2.5 avoids detours"


# ---------------------------------------------------------------- NumPy references


def numpy_question(v_kn, z_n, mask_k, points_k, known_kn, alpha=ALPHA, flaw_absent=True):
    """Eq 7 and eq 6 for one question, by loops: (valid_k, cot_n). known_kn [K, N]: the verdicts that came back."""
    valid = np.zeros(len(mask_k), bool)
    for k in range(len(mask_k)):
        cols = np.flatnonzero(known_kn[k])
        u = 1 - v_kn[k] if flaw_absent and points_k[k] < 0 else v_kn[k]
        u, z = u[cols].astype(np.float64), z_n[cols].astype(np.float64)
        if mask_k[k] and u.std() > 0 and z.std() > 0:
            valid[k] = np.corrcoef(u, z)[0, 1] > alpha
    cot = np.zeros(len(z_n))
    for n in range(len(z_n)):
        judged = [k for k in range(len(mask_k)) if valid[k] and known_kn[k, n]]
        positive = sum(points_k[k] for k in judged if points_k[k] > 0)
        negative = sum(points_k[k] for k in judged if points_k[k] < 0)
        if positive > negative:
            score = sum(points_k[k] * v_kn[k, n] for k in judged)
            cot[n] = (score - negative) / (positive - negative)
    return valid, cot


@given(st.integers(0, 2**31 - 1), st.sampled_from([(3, 6, 5), (8, 6, 8), (4, 3, 4)]), st.booleans())
def test_question_scores_match_numpy(seed, shape, flaw_absent):
    rng = np.random.default_rng(seed)
    num_questions, num_slots, num_rollouts = shape  # (8, _, 8): the CPU config's 8 prompts x 8 rollouts
    v = rng.integers(0, 2, (num_questions, num_slots, num_rollouts)).astype(np.float32)
    z = rng.random((num_questions, num_rollouts)) < 0.5
    # a failed rollout (every verdict unknown) and failed single requests (one rubric's verdict unknown)
    known = (rng.random((num_questions, 1, num_rollouts)) < 0.85) & (rng.random(v.shape) < 0.9)
    mask = rng.random((num_questions, num_slots)) < 0.7
    points = np.where(mask, rng.choice([-5, -3, -1, 1, 2, 4, 5], (num_questions, num_slots)), 0).astype(np.float32)
    v = np.where(mask[..., None] & known, v, 0)
    scores = question_scores(jnp.asarray(v), jnp.asarray(z), jnp.asarray(known), jnp.asarray(mask),
                             jnp.asarray(points), alpha=ALPHA, flaw_absent=flaw_absent)
    for q in range(num_questions):
        if at_the_threshold(v[q], z[q], known[q], points[q] if flaw_absent else np.ones(num_slots)):
            continue  # corr == alpha exactly (e.g. 0.2 with 8 rollouts): float32 and float64 may round apart
        valid, cot = numpy_question(v[q], z[q], mask[q], points[q], known[q], flaw_absent=flaw_absent)
        np.testing.assert_array_equal(np.asarray(scores.valid_pk[q]), valid)
        np.testing.assert_allclose(np.asarray(scores.cot_pn[q]), cot, atol=1e-6)


def at_the_threshold(v_kn, z_n, known_kn, points_k, alpha=ALPHA):
    """Whether some rubric's correlation with z (float64, penalties as 1 - v) is within 1e-6 of alpha."""
    for k in range(len(v_kn)):
        row = (1 - v_kn[k] if points_k[k] < 0 else v_kn[k])[known_kn[k]].astype(np.float64)
        z = z_n[known_kn[k]].astype(np.float64)
        if z.std() > 0 and row.std() > 0 and abs(np.corrcoef(row, z)[0, 1] - alpha) < 1e-6:
            return True
    return False


@given(st.integers(0, 2**31 - 1), st.sampled_from(["grpo", "batch"]), st.sampled_from(["grpo", "batch"]))
def test_role_advantages_match_numpy(seed, reasoner_estimator, rubricator_estimator):
    rng = np.random.default_rng(seed)
    rewards = rng.choice([-1.0, 0.0, 0.5, 1.0, 2.0], 20).astype(np.float32)
    role_ids = np.repeat([0, 1], [12, 8])
    group_ids = np.concatenate([np.repeat(np.arange(3), 4), np.repeat(np.arange(3), [3, 3, 2])])
    valid = rng.random(20) < 0.85
    out = role_advantages(rewards, role_ids, group_ids, valid, (reasoner_estimator, rubricator_estimator),
                          std_ddof=1, eps=EPS)
    for role, estimator in enumerate((reasoner_estimator, rubricator_estimator)):
        rows = role_ids == role
        if estimator == "batch":
            expected = numpy_batch_normalised(rewards[rows], valid[rows])
        else:
            expected = np.zeros(rows.sum())
            for g in np.unique(group_ids[rows]):
                members = group_ids[rows] == g
                expected[members] = numpy_batch_normalised(rewards[rows][members], valid[rows][members])
        np.testing.assert_allclose(out[rows], expected, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- a random tiny policy on an EmbeddedEngine

CHARACTER_CHECKS = {"vowel": RegexCheck(r"[aeiou]"), "digit": RegexCheck(r"[0-9]"), "upper": RegexCheck(r"[A-Z]"),
                    "space": RegexCheck(r" "), "symbol": RegexCheck(r"[#{}()\[\]]"), "quote": RegexCheck(r"['\"`]")}
CODES = sorted(CHARACTER_CHECKS)


@dataclasses.dataclass(frozen=True)
class HashedRubricTask(RubricWorldTask):
    """The rubric world for a random policy: an answer is "correct" when it holds one of four letters (about half
    of a random policy's answers), the rubricator's text maps to a rubric by a hash of its characters (a text
    starting with a punctuation mark does not parse), the verifier checks character classes, and fails on
    responses holding "~"."""

    def is_correct(self, response, example):
        return any(c in response for c in "kqxz")

    def judge(self):
        return failing_on("~", CHARACTER_CHECKS)

    def parse_generated_rubric(self, text, max_items, allow_empty=False):
        stripped = text.strip()
        if not stripped or not stripped[0].isalnum():
            return RubricParse(rubric=None, ok=False, reason="schema", detail="scripted")
        codes = sorted({CODES[zlib.crc32(c.encode()) % len(CODES)] for c in stripped[:max_items]})
        points = [(1 + zlib.crc32(code.encode() + stripped[:1].encode()) % 5) * (-1 if len(stripped) % 3 == 0 else 1)
                  for code in codes]
        return RubricParse(rubric=Rubric(criteria=tuple(Criterion(text=code, name=code, weight=float(p))
                                                        for code, p in zip(codes, points))), ok=True)


class RecordingEngine(RolloutEngine):
    def __init__(self, inner):
        self.inner, self.calls, self.weight_version = inner, [], inner.weight_version

    def generate(self, prompts, params):
        samples = self.inner.generate(prompts, params)
        self.calls.append((list(prompts), samples))
        return samples

    async def agenerate(self, prompts, params):
        return self.generate(prompts, params)

    def update_weights(self, model, version):
        self.inner.update_weights(model, version)


@pytest.fixture(scope="module")
def hashed():
    task = HashedRubricTask(arithmetic.ArithmeticConfig(), 0)
    model, tokenizer = policy.build_policy(ModelSpec(init=WIDE), task, policy.make_mesh(MeshConfig()))
    return task, model, tokenizer


def test_an_embedded_step_matches_numpy_from_the_verdicts(hashed):
    task, model, tokenizer = hashed
    judge = RecordingJudge(task.judge())
    context = make_context(task, model, tokenizer, judge, group=4, seed=1)
    engine = RecordingEngine(context.engine)
    context = dataclasses.replace(context, engine=engine)
    examples = task.train_stream(0).next_batch(3)
    result = RLCER(RLCERConfig(estimator="grpo", max_items=4)).experience(examples, context, step=0)
    (_, reasoner_samples), *rubricator_calls = engine.calls
    assert len(rubricator_calls) == 3  # one per question
    rubricator_samples = [s for _, samples in rubricator_calls for s in samples]
    reasoner_texts = [response_text(tokenizer, s.output_ids) for s in reasoner_samples]
    correct = np.array([task.is_correct(t, None) for t in reasoner_texts])
    parses = [task.parse_generated_rubric(response_text(tokenizer, s.output_ids), 4) for s in rubricator_samples]
    requests = [r for call, _ in judge.calls for r in call]  # a call per question, each as wide as it needs
    width = max(v.satisfied_bk.shape[1] for _, v in judge.calls)
    verdicts = Verdicts.concatenate([v.widened(width) for _, v in judge.calls])
    reasoner, rubricator = np.zeros(12), np.zeros(12)
    request_rows = iter(range(len(requests)))
    any_valid = False
    for q in range(3):
        rubrics = [p.rubric.criteria if p.ok else () for p in parses[4 * q:4 * q + 4]]
        criteria = [c for r in rubrics for c in r]
        v, known = np.zeros((len(criteria), 4)), np.zeros((len(criteria), 4), bool)
        for n in range(4):  # one request per (rollout, parsed list), in that order
            start = 0
            for rubric in rubrics:
                if rubric:
                    i = next(request_rows)
                    assert requests[i].response == reasoner_texts[4 * q + n]
                    assert requests[i].rubric.criteria == rubric
                    v[start:start + len(rubric), n] = verdicts.satisfied_bk[i, :len(rubric)]
                    known[start:start + len(rubric), n] = not verdicts.failed_b[i]
                start += len(rubric)
        points = np.array([c.weight for c in criteria])
        valid, cot = numpy_question(v, correct[4 * q:4 * q + 4], np.ones(len(criteria), bool), points, known)
        any_valid |= valid.any()
        reasoner[4 * q:4 * q + 4] = np.where(correct[4 * q:4 * q + 4], 1, -1) + cot
        start = 0
        for m, rubric in enumerate(rubrics):
            fraction = valid[start:start + len(rubric)].mean() if rubric else 0.0
            rubricator[4 * q + m] = fraction + parses[4 * q + m].ok
            start += len(rubric)
    expected = np.concatenate([numpy_grpo(reasoner, 4), numpy_batch_normalised(rubricator, np.ones(12, bool))])
    assert_row_advantages(result.batch, expected, atol=1e-4)
    # The step exercised what it should: valid rubrics, both outcomes, a failed judgement, an unparsable rubric.
    assert any_valid and 0 < correct.mean() < 1 and verdicts.failed_b.any() and not all(p.ok for p in parses)
    assert np.abs(expected[:12]).max() > 0 and np.abs(expected[12:]).max() > 0
    assert result.metrics["reward/mean"] == pytest.approx(reasoner.mean(), abs=1e-5)


def test_one_training_step_end_to_end(tmp_path, hashed):
    task, _, _ = hashed
    config = tiny_rl_config(tmp_path, model=ModelSpec(init=WIDE), seed=5,
                            rollout=RolloutConfig(prompts_per_step=3, group_size=4, max_new_tokens=16),
                            algorithm=AlgorithmSpec(name="rlcer", params={"max_items": 4, "estimator": "grpo",
                                                                          "rubricator_max_new_tokens": 12}))
    last = train_rl(config, task)
    [line] = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert line == {"step": 1, **last}
    expected = {"reward/mean", "advantage/std", "rubricator/reward/mean", "rubricator/advantage/std",
                "rlcer/corr_mean", "rlcer/valid_fraction", "rlcer/cot_reward_mean", "rlcer/rubricator_format_rate",
                "rlcer/rubric_count_mean", "judge/failure_rate", "outcome/accuracy", "train/loss", "train/grad_norm",
                "mismatch/max_abs"}
    assert expected <= line.keys()
    assert all(math.isfinite(v) for v in line.values())
    assert line["mismatch/max_abs"] < 1e-4 and line["train/grad_norm"] > 0
    # Judge failures and unparsable rubrics happened mid-run, and were counted.
    assert line["judge/failure_rate"] > 0 and line["judge/failed/check_raised"] > 0
    assert line["rlcer/parse_failed/schema"] > 0 and line["rlcer/rubricator_format_rate"] < 1
