"""Failed samples (an SGLang abort, a NaN met, a prompt whose request failed: `Sample.failure`) in the recipes:
kept out of the loss, never sent to the judge, their groups handled as a judge failure is (`on_judge_failure`),
counted in the step's metrics; and the rollout failure budget that stops a run whose engine keeps failing."""

import dataclasses

import numpy as np
import pytest

from rubric_jax.algorithms import base
from rubric_jax.algorithms.grpo import GRPO, GRPOConfig
from rubric_jax.algorithms.rar import RaR, RaRConfig
from rubric_jax.inference.engine import RolloutEngine, Sample
from rubric_jax.judges.records import RecordingJudge
from rubric_jax.training.failure_budget import rollout_failure_budget
from rubric_jax.training.run_config import RolloutConfig
from rubric_jax.training.runs import RunStopped
from tests.algorithms.test_grpo import GROUP, PROMPTS, assert_row_advantages, make_context, numpy_grpo, tiny_policy
from tests.algorithms.test_rubric_grounded import ScriptedJudge
from tests.training.toy_task import toy_task

FAILED = {1: "abort", 4: "nan", 5: "http_400", 6: "http_400", 7: "http_400"}  # row 4..7: one whole group


class FailingRows(RolloutEngine):
    """`engine`'s samples with the rows of `failed` (index in the call: reason) turned into failed samples, cut
    to their first token as an aborted SGLang sample is."""

    def __init__(self, engine: RolloutEngine, failed: dict[int, str]):
        self.engine, self.failed = engine, failed

    @property
    def weight_version(self) -> str:
        return self.engine.weight_version

    def generate(self, prompts, params):
        samples = self.engine.generate(prompts, params)
        return [dataclasses.replace(s, output_ids=s.output_ids[:1], logprobs=s.logprobs[:1], finish_reason="abort",
                                    matched_stop=None, failure=self.failed[b]) if b in self.failed else s
                for b, s in enumerate(samples)]

    async def agenerate(self, prompts, params):
        return self.generate(prompts, params)

    def update_weights(self, model, version):
        raise NotImplementedError


@pytest.fixture(scope="module")
def setup():
    task = toy_task()
    examples = task.train_stream(0).next_batch(PROMPTS)
    model, tokenizer = tiny_policy(task)
    judge = ScriptedJudge()
    context = make_context(task, model, tokenizer, judge)
    context = dataclasses.replace(context, engine=FailingRows(context.engine, FAILED))
    return task, context, examples, judge


def failed_b() -> np.ndarray:
    return np.isin(np.arange(PROMPTS * GROUP), list(FAILED))


@pytest.mark.parametrize("on_judge_failure", ["zero_reward", "exclude"])
def test_rar_keeps_failed_samples_from_the_judge_and_the_loss(setup, on_judge_failure):
    task, context, examples, judge = setup
    context = dataclasses.replace(context, sampling_metrics={})
    experience = RaR(RaRConfig(on_judge_failure=on_judge_failure)).experience(examples, context, step=0)
    failed = failed_b()
    requests, verdicts = judge.calls[-1]
    assert len(requests) == (~failed).sum()  # the failed samples were never sent
    assert not experience.batch["response_mask_bt"][failed].any()  # out of the loss
    assert experience.batch["response_mask_bt"][~failed].any(axis=1).all()
    reward_b = np.array([values["reward"] for _, values in experience.recipe_values], np.float32)  # every row's
    assert (reward_b[failed] == 0).all()  # a failed verdict's reward
    valid = ~failed if on_judge_failure == "exclude" else np.ones(len(failed), bool)
    expected = numpy_grpo(reward_b, GROUP, valid)
    expected[failed] = 0.0
    assert_row_advantages(experience.batch, expected)
    metrics = experience.metrics
    assert metrics["judge/failure_rate"] == 0.0 and not any(k.startswith("judge/failed/") for k in metrics)
    assert {k: v for k, v in context.sampling_metrics.items() if k.startswith("rollout/failed/")} == {
        "rollout/failed/abort": 1, "rollout/failed/nan": 1, "rollout/failed/http_400": 3}


def test_grpo_takes_failed_samples_out_of_their_groups(setup):
    task, context, examples, _ = setup
    experience = GRPO(GRPOConfig()).experience(examples, context, step=0)
    failed = failed_b()
    rollouts = base.sample_groups([task.prompt(e) for e in examples], context, 0)
    correct = base.outcome_correctness(examples, rollouts, task).astype(np.float32)
    expected = numpy_grpo(correct, GROUP, ~failed)
    assert_row_advantages(experience.batch, expected)
    assert not experience.batch["response_mask_bt"][failed].any()


def test_record_samples_counts_failures_null_logprobs_and_stale_samples():
    def sample(failure="", versions=(), logprobs=(-1.0, -2.0)):
        return Sample(0, (3, 4)[:len(logprobs)], logprobs, "abort" if failure else "stop", None, "v1",
                      weight_versions=versions, failure=failure)

    recorded = {}
    base.record_samples(recorded, [sample(), sample("abort", logprobs=(-np.inf,)), sample(logprobs=(-np.inf, -1.0)),
                                   sample(versions=("v0", "v1")), sample("http_500", logprobs=())], "v1")
    assert recorded == {"rollout/samples": 5, "rollout/failed/abort": 1, "rollout/failed/http_500": 1,
                        "rollout/null_logprobs": 1, "rollout/stale": 1}
    assert base.failure_rate(recorded) == pytest.approx(2 / 5)
    assert base.failure_rate({}) is None


def test_the_rollout_failure_budget_stops_a_run_after_consecutive_failing_steps():
    budget = rollout_failure_budget(RolloutConfig(engine="sglang", sglang_url="http://h:1", max_failing_steps=2))
    failing = {"rollout/failure_rate": 0.75, "rollout/failed/http_400": 6.0}
    budget.observe(failing, 1)
    budget.observe({"rollout/failure_rate": 0.1}, 2)  # a good step resets the count
    budget.observe(failing, 3)
    with pytest.raises(RunStopped, match=r"rollout/failure_rate was above rollout.max_failure_rate \(0.5\) on 2 "
                                         r"consecutive steps \(step 4: 75%; http_400\).*http://h:1"):
        budget.observe(failing, 4)
    off = rollout_failure_budget(RolloutConfig(max_failure_rate=1.0))
    for step in range(5):
        off.observe({"rollout/failure_rate": 1.0}, step)


def test_the_rollout_log_keeps_failed_samples_with_their_reason(setup):
    task, context, examples, judge = setup
    recorder = RecordingJudge(judge)
    recorder.recording = True
    context = dataclasses.replace(context, judge=recorder, sampling_metrics={})
    RaR(RaRConfig()).experience(examples, context, step=0)
    records = recorder.take(1)
    assert len(records) == PROMPTS * GROUP
    failed = [r for r in records if r.verdict.reason == base.FAILED_SAMPLE]
    assert len(failed) == len(FAILED) and all(r.verdict.failed for r in failed)
