"""Judge accounting in a training run (`training.accounting`): per step, the judge's tokens from its answers'
usage, the answers without usage, its latencies, the wait after sampling and, priced, its cost and the run's
total, carried across a resume; shown on the console; absent for a run without an LLM judge."""

import numpy as np
import pytest

from rubric_jax.inference.http import RequestTimes
from rubric_jax.training import rl
from rubric_jax.training.accounting import RunCosts, latency_metrics, wait_metrics
from rubric_jax.training.metrics import read_metrics
from rubric_jax.training.run_config import JudgeConfig, MetricsConfig, TokenPrice
from tests.inference.standin_server import StandinServer
from tests.training.test_judge_failures import CALLS
from tests.training.test_rl import tiny_rl_config
from tests.training.toy_task import toy_task

PRICE = TokenPrice(prompt=0.15, completion=0.6)  # USD per million tokens
ANSWER = '{"rating": 1}'  # two words: the stand-in's usage counts words without a tokenizer
LATENCY_S = 0.2


def step_prompt_tokens(server: StandinServer, step: int) -> int:
    """The words of the messages of step `step`'s calls (1-based), after the launch's preflight request."""
    bodies = server.chat_requests[1 + (step - 1) * CALLS:1 + step * CALLS]
    assert len(bodies) == CALLS
    return sum(len(m["content"].split()) for body in bodies for m in body["messages"])


def test_tokens_cost_and_latency_per_step_and_the_total_across_a_resume(tmp_path, capsys):
    # Each answer held 0.2 s, so the judging phase is long beside what lies between it and the sampling.
    with StandinServer(responder=lambda messages: ANSWER, latency_s=LATENCY_S) as server:
        judge = JudgeConfig(kind="llm", url=server.base_url, model="judge", format="rating",
                            price_per_million_tokens=PRICE)
        config = tiny_rl_config(tmp_path, judge=judge, metrics=MetricsConfig(console=True))
        rl.train_rl(config, toy_task())
        prompt = step_prompt_tokens(server, 1)
        # Resumed for a second step whose answers carry no usage: counted apart, no tokens, no cost.
        server.chat_usage = False
        rl.train_rl(tiny_rl_config(tmp_path, steps=2, judge=judge, metrics=MetricsConfig(console=True)), toy_task())
    first, resumed = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert first["judge/prompt_tokens"] == prompt and first["judge/completion_tokens"] == 2 * CALLS
    assert first["judge/requests_without_usage"] == 0 and first["judge/requests"] == CALLS
    cost = (prompt * 0.15 + 2 * CALLS * 0.6) / 1e6
    assert first["judge/cost"] == pytest.approx(cost) and first["judge/cost_total"] == pytest.approx(cost)
    assert LATENCY_S <= first["judge/latency_p50_s"] <= first["judge/latency_p95_s"]
    for line in (first, resumed):
        # Serial today: the wait after sampling is the judging phase, give or take what lies between them.
        assert line["judge/wait_after_sampling_s"] >= LATENCY_S  # the answers came at least that long after
        assert line["judge/wait_after_sampling_s"] == pytest.approx(line["time/judging"], rel=0.1, abs=0.02)
    assert resumed["step"] == 2 and resumed["judge/requests_without_usage"] == CALLS == resumed["judge/requests"]
    assert resumed["judge/prompt_tokens"] == resumed["judge/completion_tokens"] == resumed["judge/cost"] == 0
    assert resumed["judge/cost_total"] == pytest.approx(cost)  # continued from step 1's checkpoint
    console = capsys.readouterr().out.splitlines()
    step_1 = next(line for line in console if line.startswith("step 1/1 |"))
    assert f"| judge/prompt_tokens {prompt:.4g} | judge/completion_tokens {2 * CALLS} | " in step_1
    assert "| judge/latency_p95_s " in step_1 and "| judge/cost " in step_1


def test_a_run_without_an_llm_judge_has_no_judge_accounting(tmp_path, capsys):
    rl.train_rl(tiny_rl_config(tmp_path, metrics=MetricsConfig(console=True)), toy_task())
    (line,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert not [key for key in line if key.startswith("judge/") and key.split("/")[1] in (
        "prompt_tokens", "completion_tokens", "requests_without_usage", "latency_p50_s", "latency_p95_s",
        "wait_after_sampling_s", "cost", "cost_total")]
    assert "judge/prompt_tokens" not in capsys.readouterr().out


def test_latency_percentiles_are_numpys_and_the_wait_is_never_negative():
    latencies = list(np.random.default_rng(0).exponential(0.3, size=37))
    times = RequestTimes(latencies, last_ended_at=100.0)
    assert latency_metrics("judge", times) == {"judge/latency_p50_s": pytest.approx(np.percentile(latencies, 50)),
                                               "judge/latency_p95_s": pytest.approx(np.percentile(latencies, 95))}
    assert latency_metrics("judge", RequestTimes()) == {}
    assert wait_metrics("judge", times, 98.5) == {"judge/wait_after_sampling_s": 1.5}
    assert wait_metrics("judge", times, 101.0) == {"judge/wait_after_sampling_s": 0.0}
    assert wait_metrics("judge", times, None) == wait_metrics("judge", RequestTimes(), 1.0) == {}


def test_run_costs_go_on_from_the_resumed_total_and_only_for_priced_roles():
    costs = RunCosts({"judge": PRICE, "meta_verifier": None}, {"judge/cost_total": 2.5})
    step = {"judge/prompt_tokens": 1000.0, "judge/completion_tokens": 500.0,
            "meta_verifier/prompt_tokens": 7.0, "meta_verifier/completion_tokens": 7.0}
    cost = (1000 * 0.15 + 500 * 0.6) / 1e6
    assert costs.step(step) == {"judge/cost": pytest.approx(cost), "judge/cost_total": pytest.approx(2.5 + cost)}
    assert costs.step({}) == {}  # a step without the judge's tokens costs nothing and shows none
    assert RunCosts({"judge": PRICE}, {}).totals == {"judge": 0.0}
