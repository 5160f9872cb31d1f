"""Failed judge calls in a training run (`judges.llm`, `training.rl`): a per-criterion judge whose answers do not
parse fails its rollouts, shows a failure rate of 1 on the metrics and the console, keeps its raw answers in the
rollout log and the samples, and is stopped by the failure budget; the counts of calls, failed calls and schema
violations are per step; `judge.failed_criterion: score_zero` (RGR-GRPO's "parse failure scores 0") keeps the
rollouts judged and is stopped by the per-call failure rate."""

import contextlib
import json

import pytest

from rubric_jax.judges.records import read_judged_rollouts
from rubric_jax.training import assembly, experience, rl, runs
from rubric_jax.training.metrics import read_metrics
from rubric_jax.training.run_config import JudgeConfig, MetricsConfig, RolloutLogConfig
from tests.inference.standin_server import StandinServer
from tests.training.test_rl import tiny_rl_config
from tests.training.toy_task import RUBRIC, toy_task

ROLLOUTS = 2 * 4  # tiny_rl_config: 2 prompts a step, 4 samples each
CALLS = ROLLOUTS * len(RUBRIC.criteria)  # format rating: one call per criterion
GARBAGE = "The response is pretty good overall, I'd give it a thumbs up. " * 10  # 620 characters, no JSON


def rating_judge(url: str, **fields) -> JudgeConfig:
    return JudgeConfig(kind="llm", url=url, model="judge", format="rating", max_attempts=1, **fields)


@pytest.fixture
def server():
    with StandinServer() as server:
        yield server


def test_a_judge_that_never_parses_fails_every_rollout_and_the_budget_stops_the_run(tmp_path, server, capsys):
    server.responder = lambda messages: GARBAGE
    config = tiny_rl_config(tmp_path, steps=3, judge=rating_judge(server.base_url, max_failing_steps=2),
                            metrics=MetricsConfig(console=True), rollout_log=RolloutLogConfig(every_steps=1))
    with pytest.raises(runs.RunStopped, match=r"judge/failure_rate was above judge.max_failure_rate \(0.5\) on 2 "
                                            r"consecutive steps \(step 2: 100%; no_json\).*before step 2's update"):
        # The judge handed in, so the launch's preflight (which would refuse it before step 1) is skipped:
        # what is under test is the failure budget during the run.
        with contextlib.closing(assembly.make_judge(config.judge, toy_task(), config.seed)) as judge:
            rl.train_rl(config, toy_task(), judge=judge)
    (line,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert line["judge/failure_rate"] == 1 and line["judge/failed/no_json"] == ROLLOUTS
    assert line["judge/calls"] == line["judge/call_failures"] == line["judge/call_failed/no_json"] == CALLS
    assert line["judge/call_failure_rate"] == 1 and line["judge/schema_violations"] == CALLS
    assert line["judge/requests"] == CALLS
    console = capsys.readouterr().out
    assert "step 1/3 | reward/mean 0 | judge/failure_rate 1 | judge/call_failure_rate 1 |" in console

    # The rollout log and the samples show what the judge wrote, cut to 300 characters and marked.
    kept = GARBAGE[:300] + f" [... cut: {len(GARBAGE)} characters in all]"
    records = read_judged_rollouts(tmp_path / "run" / "rollouts")
    assert len(records) == ROLLOUTS and {r.step for r in records} == {1}  # step 2's file: not written, stopped
    for record in records:
        assert record.verdict.reason == "no_json" and record.verdict.answer == kept
        assert record.verdict.detail.startswith("criteria[0] 'the response has digit': ")
        assert record.verdict.detail.endswith(f"({len(RUBRIC.criteria)} of {len(RUBRIC.criteria)} criterion "
                                              "calls failed)")
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["judge_failure"] == "no_json" and s["judge_answer"] == kept and s["rubric_score"] is None
                           for s in samples)


def test_call_counts_are_per_step(tmp_path, server):
    """One criterion's answers do not parse on both steps: every count of step 2 equals step 1's (none carries
    over), and only that criterion's calls are failed."""
    def responder(messages):
        text = "\n".join(m["content"] for m in messages)
        return '{"rating": 7}' if "has plus" in text else '{"rating": 1}'

    server.responder = responder
    config = tiny_rl_config(tmp_path, steps=2, judge=rating_judge(server.base_url, max_failure_rate=1.0))
    rl.train_rl(config, toy_task())
    lines = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert line["judge/calls"] == line["judge/requests"] == CALLS
        assert line["judge/call_failures"] == line["judge/call_failed/out_of_bounds"] == ROLLOUTS
        assert line["judge/schema_violations"] == ROLLOUTS
        assert line["judge/call_failure_rate"] == pytest.approx(1 / len(RUBRIC.criteria))
        assert line["judge/failure_rate"] == 1  # every rollout has one failed criterion call


def test_score_zero_keeps_rollouts_judged_and_the_per_call_rate_stops_the_run(tmp_path, server):
    server.responder = lambda messages: GARBAGE
    config = tiny_rl_config(tmp_path, steps=2, judge=rating_judge(server.base_url, max_failing_steps=1,
                                                                  failed_criterion="score_zero"))
    with pytest.raises(runs.RunStopped, match=r"judge/call_failure_rate was above judge.max_failure_rate \(0.5\) on 1 "
                                            r"consecutive steps \(step 1: 100%; no_json\)"):
        # The judge handed in, so the launch's preflight (which would refuse it before step 1) is skipped:
        # what is under test is the failure budget during the run.
        with contextlib.closing(assembly.make_judge(config.judge, toy_task(), config.seed)) as judge:
            rl.train_rl(config, toy_task(), judge=judge)
    # stopped before step 1's update, with no history: the refused launch leaves nothing (runs.undo_failed_launch)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_call_metrics_are_the_difference_of_two_counts():
    before = {"calls": 10, "call_failures": 3, "call_failed/no_json": 3, "schema_violations": 3}
    after = {"calls": 18, "call_failures": 5, "call_failed/no_json": 3, "call_failed/truncated": 2,
             "schema_violations": 3}
    assert experience.call_metrics("judge", before, after) == {
        "judge/calls": 8.0, "judge/call_failures": 2.0, "judge/call_failed/truncated": 2.0,
        "judge/schema_violations": 0.0, "judge/call_failure_rate": 0.25}
    assert experience.call_metrics("judge", after, after)["judge/call_failures"] == 0.0
    assert "judge/call_failure_rate" not in experience.call_metrics("judge", after, after)
    assert experience.call_metrics("judge", {}, {}) == {}


@pytest.mark.parametrize("fields, message", [
    ({"failed_criterion": "score_zero"}, "got kind task, format grounded"),
    ({"kind": "llm", "url": "http://127.0.0.1:1", "model": "m", "format": "srar", "failed_criterion": "score_zero"},
     "got kind llm, format srar"),
])
def test_score_zero_is_for_an_llm_judge_of_one_call_per_criterion(fields, message):
    with pytest.raises(ValueError, match=f"judge.failed_criterion score_zero is for kind llm .*{message}"):
        JudgeConfig(**fields)
    judge = assembly.make_judge(JudgeConfig(kind="llm", url="http://127.0.0.1:1", model="m", format="healthbench",
                                      failed_criterion="score_zero"), None, 0)
    judge.close()
    assert judge.failed_criterion == "score_zero"
