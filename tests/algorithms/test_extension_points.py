"""What a researcher builds on: a recipe variant that overrides one step (`reward` or `advantage`) of a
response-level recipe and inherits the rest; the values a recipe hands the rollout log for each judged rollout
(`Experience.recipe_values`, `judges.records.with_recipe_values`); and each recipe's own console keys and plot
panels, which must name metrics its experience logs. On scripted engines (each recipe's own test world; RaR, DAPO
and rubric-grounded GRPO on the CPU arithmetic task), so the rewards and groups are known to vary."""

import numpy as np
import pytest

from rubric_jax.algorithms import registry
from rubric_jax.algorithms.base import RolloutContext
from rubric_jax.algorithms.dapo import DAPO, DAPOConfig
from rubric_jax.algorithms.evorubric import EvoRubricConfig
from rubric_jax.algorithms.rar import RaR, RaRConfig
from rubric_jax.algorithms.rgr_grpo import RGRGRPO, RGRGRPOConfig
from rubric_jax.algorithms.rubric_grounded import RubricGrounded, RubricGroundedConfig
from rubric_jax.core import advantages
from rubric_jax.data import arithmetic
from rubric_jax.data.tasks import build_task
from rubric_jax.inference.engine import SamplingParams
from rubric_jax.judges.records import RecordingJudge, with_recipe_values
from rubric_jax.training.metrics import PhaseTimer
from tests.algorithms.test_evorubric import ScriptedEngine, coarse_task, two_problems, wrong_at
from tests.algorithms.test_evorubric import run_step as evo_run_step
from tests.algorithms.test_rgr_grpo import PAPER_OFF
from tests.algorithms.test_rgr_grpo import A as RGR_A
from tests.algorithms.test_rgr_grpo import B as RGR_B
from tests.algorithms.test_rgr_grpo import scripted_context as rgr_context
from tests.algorithms.test_rlcer import REASONER_REWARD, world_step
from tests.algorithms.test_srar import hand_group_experience
from tests.algorithms.test_srar import task as srar_task

PROMPTS, GROUP = 3, 4


def scripted_context(task, judge, examples, *, group=GROUP, max_new_tokens=96) -> RolloutContext:
    """A context whose engine answers each problem with the gold solution, a solution off at its first step, the
    gold solution again and one off at its last step (cycled): groups of mixed rewards and answers."""
    responses = {task.question(e): [arithmetic.solution_text(e), wrong_at(e, 1), arithmetic.solution_text(e),
                                    wrong_at(e, len(e.steps))] for e in examples}
    tokenizer = arithmetic.build_tokenizer()
    return RolloutContext(engine=ScriptedEngine(tokenizer, responses, {}), tokenizer=tokenizer, task=task,
                          judge=judge, pad_id=arithmetic.PAD_ID, seed=0,
                          sampling=SamplingParams(max_new_tokens=max_new_tokens, n=group), timer=PhaseTimer())


@pytest.fixture(scope="module")
def arithmetic_task():
    """(task, examples) of the CPU arithmetic task."""
    task = build_task("arithmetic", {}, 0)
    return task, task.train_stream(0).next_batch(PROMPTS)


def recorded_step(algorithm, arithmetic_task, step=0):
    """One step of `algorithm` with the judge recorded as the trainer records it: (experience, records)."""
    task, examples = arithmetic_task
    recorder = RecordingJudge(task.judge())
    recorder.recording = True
    experience = algorithm.experience(examples, scripted_context(task, recorder, examples), step)
    return experience, recorder.take(step + 1)


def row_advantages(batch) -> np.ndarray:
    """Each row's advantage as the learner sees it: its response tokens' value (0 for a row without any)."""
    mask = batch["response_mask_bt"]
    return np.where(mask.any(axis=1), (batch["advantages_bt"] * mask).sum(axis=1) / np.maximum(mask.sum(1), 1), 0)


def test_rar_gives_every_judged_rollout_its_reward_advantage_and_group(arithmetic_task):
    experience, records = recorded_step(RaR(RaRConfig()), arithmetic_task)
    rows = experience.batch["tokens_bt"].shape[0]
    assert len(records) == len(experience.recipe_values) == rows
    attached = with_recipe_values(records, experience.recipe_values)
    values = [record.values for record in attached]
    assert all(set(v) == {"reward", "advantage", "group"} for v in values)
    np.testing.assert_array_equal([v["group"] for v in values], np.arange(rows) // (rows // PROMPTS))
    np.testing.assert_allclose([v["advantage"] for v in values], row_advantages(experience.batch), atol=1e-6)
    rewards = np.array([v["reward"] for v in values])
    assert experience.metrics["reward/mean"] == pytest.approx(rewards.mean())
    assert len(set(rewards)) > 1 and (np.abs([v["advantage"] for v in values]) > 0.1).any()


class HalfReward(RaR):
    """A variant that changes only the reward: half of RaR's."""

    def reward(self, groups, context):
        reward_b, valid_b = super().reward(groups, context)
        return reward_b / 2, valid_b


class CentredAdvantage(RaR):
    """A variant that changes only the advantage: Dr.GRPO's r - mean_g, no std."""

    def advantage(self, reward_b, group_ids, valid_b, groups):
        return np.asarray(advantages.dr_grpo_advantages(reward_b, group_ids, valid_b))


def test_a_variant_overriding_only_the_reward_or_the_advantage_inherits_the_rest(arithmetic_task):
    plain, _ = recorded_step(RaR(RaRConfig()), arithmetic_task)
    halved, records = recorded_step(HalfReward(RaRConfig()), arithmetic_task)
    centred, _ = recorded_step(CentredAdvantage(RaRConfig()), arithmetic_task)
    for variant in (halved, centred):  # the same rollouts, judgements, packing and metrics keys
        assert set(variant.metrics) == set(plain.metrics)
        for key in ("tokens_bt", "response_mask_bt", "rollout_logp_bt"):
            np.testing.assert_array_equal(variant.batch[key], plain.batch[key])
    assert halved.metrics["reward/mean"] == pytest.approx(plain.metrics["reward/mean"] / 2)
    # GRPO's advantage is invariant to scaling the rewards (up to eps): the variant's reward changed nothing else
    np.testing.assert_allclose(halved.batch["advantages_bt"], plain.batch["advantages_bt"], atol=1e-4)
    reward_b = np.array([v["reward"] for _, v in plain.recipe_values], np.float32)
    group_ids = np.array([v["group"] for _, v in plain.recipe_values], np.int32)
    expected = np.asarray(advantages.dr_grpo_advantages(reward_b, group_ids))
    np.testing.assert_allclose(row_advantages(centred.batch), expected, atol=1e-6)
    halved_values = [r.values for r in with_recipe_values(records, halved.recipe_values)]
    np.testing.assert_allclose([v["reward"] for v in halved_values], reward_b / 2, rtol=1e-6)


# ---------------------------------------------------------------- each recipe's scripted step (its own tests' worlds)


def srar_step(judge=None):
    return hand_group_experience(judge=judge or srar_task().judge())


def rlcer_step(judge=None):
    return world_step(judge=judge)[0]


def evorubric_step(judge=None):
    return evo_run_step(EvoRubricConfig(), two_problems(), judge=judge)[1]


def rgr_step(judge=None):
    context = rgr_context(arithmetic.build_tokenizer(), judge=judge)
    return RGRGRPO(RGRGRPOConfig(**PAPER_OFF)).experience([RGR_A, RGR_B], context, step=0)


def arithmetic_step(algorithm, judge=None):
    task = build_task("arithmetic", {}, 0)
    examples = task.train_stream(0).next_batch(PROMPTS)
    return algorithm.experience(examples, scripted_context(task, judge or task.judge(), examples), 0)


STEPS = {
    "srar": srar_step,
    "rlcer": rlcer_step,
    "evorubric": evorubric_step,
    "rgr_grpo": rgr_step,
    "dapo": lambda judge=None: arithmetic_step(DAPO(DAPOConfig(overlong_buffer=16)), judge),
    "rubric_grounded": lambda judge=None: arithmetic_step(RubricGrounded(RubricGroundedConfig()), judge),
}


@pytest.mark.parametrize("name", sorted(STEPS))
def test_a_recipes_console_keys_and_plot_panels_name_metrics_it_logs(name):
    algorithm_class = registry.algorithm_class(name)
    shown = set(algorithm_class.console_metrics) | {k for keys in algorithm_class.plot_panels.values() for k in keys}
    assert algorithm_class.console_metrics and algorithm_class.plot_panels
    assert all(isinstance(key, str) and key for key in shown)
    missing = shown - set(STEPS[name]().metrics)
    assert not missing, f"{name} shows metrics its step does not log: {sorted(missing)}"


def test_the_recipes_without_headline_metrics_show_only_the_defaults():
    for name in registry.names():
        algorithm_class = registry.algorithm_class(name)
        assert isinstance(algorithm_class.console_metrics, tuple)
        assert all(isinstance(keys, tuple) for keys in algorithm_class.plot_panels.values())
    assert RaR.console_metrics == () and dict(RaR.plot_panels) == {}


def recorded_values(step):
    """(experience, records with the recipe's values attached) of `step` run with a recorded judge."""
    task_judge = {"srar": srar_task, "rlcer": lambda: build_task("arithmetic_rubrics", {}, 0),
                  "evorubric": coarse_task, "rgr_grpo": lambda: build_task("arithmetic_rgr", {}, 0)}
    recorder = RecordingJudge(task_judge[step]().judge())
    recorder.recording = True
    experience = STEPS[step](recorder)
    return experience, with_recipe_values(recorder.take(1), experience.recipe_values)


@pytest.mark.parametrize("step", ["srar", "evorubric"])
def test_every_judged_policy_rollout_of_srar_and_evorubric_gets_its_values(step):
    experience, records = recorded_values(step)
    group_size = 4
    assert len(records) == len(experience.recipe_values) == PROMPTS_OF[step] * group_size
    assert [r.values["group"] for r in records] == [b // group_size for b in range(len(records))]
    reasoner = experience.batch["response_mask_bt"][:len(records)]
    np.testing.assert_allclose([r.values["advantage"] for r in records],
                               row_advantages({k: v[:len(records)] for k, v in experience.batch.items()}), atol=1e-5)
    assert reasoner.any()
    assert experience.metrics["reward/mean"] == pytest.approx(np.mean([r.values["reward"] for r in records]))


PROMPTS_OF = {"srar": 1, "evorubric": 2}


def test_rlcers_verifier_calls_about_one_rollout_share_its_values():
    experience, records = recorded_values("rlcer")
    rows_of = {id(request): values for request, values in experience.recipe_values}
    assert len(rows_of) == len(records) and all(r.values is not None for r in records)
    by_response = {}
    for record in records:  # one call per rubric list the rollout was judged on, every one with the row's values
        by_response.setdefault((record.values["group"], record.request.response), []).append(record.values)
    assert all(len({tuple(sorted(v.items())) for v in values}) == 1 for values in by_response.values())
    np.testing.assert_allclose(sorted({v["reward"] for values in by_response.values() for v in values}),
                               sorted(set(np.round(REASONER_REWARD, 6))), atol=1e-5)


def test_rgr_gives_a_refinement_its_rows_values_and_the_rollout_it_replaced_none():
    experience, records = recorded_values("rgr_grpo")
    off_policy_b = experience.batch["off_policy_b"]
    assert off_policy_b.any()
    valued = [r for r in records if r.values is not None]
    assert len(valued) == len(off_policy_b)  # one per trained row: on-policy rollouts and the refinements
    replaced = [r for r in records if r.values is None]
    assert len(replaced) == off_policy_b.sum()  # the reserved rollouts the refinements replaced
    refinements = records[len(off_policy_b):]  # judged after the step's rollouts
    assert all(r.values is not None for r in refinements)
    np.testing.assert_allclose(sorted(v["advantage"] for _, v in experience.recipe_values),
                               sorted(row_advantages(experience.batch)), atol=1e-6)
