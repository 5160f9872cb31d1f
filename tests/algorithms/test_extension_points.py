"""What a researcher builds on: a recipe variant that overrides one step (`reward` or `advantage`) of a
response-level recipe and inherits the rest; the values a recipe hands the rollout log for each judged rollout
(`Experience.recipe_values`, `judges.records.with_recipe_values`); and each recipe's own console keys and plot
panels, which must name metrics its experience logs. On the CPU arithmetic task with a tiny random policy, as the
recipe tests build their contexts."""

import numpy as np
import pytest

from rubric_jax.algorithms.base import RolloutContext
from rubric_jax.algorithms.rar import RaR, RaRConfig
from rubric_jax.core import advantages
from rubric_jax.data import arithmetic
from rubric_jax.data.tasks import build_task
from rubric_jax.inference.engine import SamplingParams
from rubric_jax.judges.records import RecordingJudge, with_recipe_values
from rubric_jax.training.metrics import PhaseTimer
from tests.algorithms.test_evorubric import ScriptedEngine, wrong_at

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
