"""Judge accounting: what the run's LLM roles over HTTP (its judge, "judge"; EvoRubric's meta-verifier,
"meta_verifier") used in each step and in an evaluation, beside their request counts (`experience.request_metrics`).

Per step, under the role's name, of the step's experience (what `experience.sample_experience` sampled and judged);
none of them for a role without an HTTP client (a task's programmatic judge):
- "<role>/prompt_tokens", "<role>/completion_tokens": the sums of its answers' `usage` counts (`judges.llm`, handed
  on by `call_counts` and made per step by `experience.call_metrics`); "<role>/requests_without_usage": its answers
  without one, whose tokens are in neither sum.
- "<role>/latency_p50_s", "<role>/latency_p95_s": the percentiles (NumPy's linear interpolation) of the step's
  successful requests' latencies, each its successful attempt's seconds on the wire (`inference.http`, timing: a
  retry is a request of its own); absent without a successful request.
- "<role>/wait_after_sampling_s": the wall time from the end of the step's last sampling (its last "generation"
  phase, `metrics.PhaseTimer.ended_at`) to the end of its last request of the role, failed ones included; 0 when
  that request ended before it; absent when the step sampled nothing or sent the role nothing. While a step samples
  and then judges it is about the judging time ("time/judging"); once a group is judged while later groups sample,
  it is the judging that sampling did not hide.
- with the role's `price_per_million_tokens` (`run_config.TokenPrice`): "<role>/cost", USD, (prompt_tokens x
  prompt + completion_tokens x completion) / 1e6, and "<role>/cost_total", the sum of the run's "<role>/cost" so far
  (`RunCosts`), continued from the checkpoint's metrics line when a run resumes (a price first set on a relaunch
  counts from there).

An evaluation (`evaluate.evaluate`) reports its judge's under "eval/judge/" (`evaluation_metrics`): "requests" and
"request_failures" of its own, the tokens, the requests without usage, the latencies and, priced, "cost" (an
evaluation's cost is not in the run's "judge/cost_total").
"""

import contextlib
import dataclasses
from typing import Any, Iterator, Mapping, Optional

import numpy as np

from rubric_jax.inference.http import RequestTimes
from rubric_jax.judges.llm import USAGE_KEYS
from rubric_jax.training.run_config import TokenPrice


@dataclasses.dataclass(frozen=True)
class Metered:
    """A stretch of an LLM role's work (`metered`): the role, its call counts and request counts when the stretch
    began, and the times of the requests that ended in it (filled while it runs)."""

    role: Any
    counts: Mapping[str, int]
    requests: int
    request_failures: int
    times: RequestTimes


@contextlib.contextmanager
def metered(role: Any) -> Iterator[Optional[Metered]]:
    """The stretch of `role`'s work (a judge or meta-verifier) inside the block; None for a role without an HTTP
    client (or no role)."""
    stats = role.http_stats() if role is not None else None
    if stats is None:
        yield None
        return
    with stats.timing() as times:
        yield Metered(role, role.call_counts(), stats.requests, stats.failures, times)


def latency_metrics(name: str, times: RequestTimes) -> dict[str, float]:
    """"<name>/latency_p50_s" and "<name>/latency_p95_s" of the successful requests in `times`; {} without any."""
    if not times.latencies_s:
        return {}
    p50, p95 = np.percentile(times.latencies_s, [50, 95])
    return {f"{name}/latency_p50_s": float(p50), f"{name}/latency_p95_s": float(p95)}


def wait_metrics(name: str, times: RequestTimes, sampling_ended_at: Optional[float]) -> dict[str, float]:
    """"<name>/wait_after_sampling_s" (module docstring) of a step whose sampling ended at `sampling_ended_at`
    (`time.monotonic()`, None: it sampled nothing); {} when either end is unknown."""
    if times.last_ended_at is None or sampling_ended_at is None:
        return {}
    return {f"{name}/wait_after_sampling_s": max(0.0, times.last_ended_at - sampling_ended_at)}


def token_cost(price: TokenPrice, prompt_tokens: float, completion_tokens: float) -> float:
    """USD of the tokens at `price` (per million)."""
    return (prompt_tokens * price.prompt + completion_tokens * price.completion) / 1e6


def cost_metrics(name: str, metrics: Mapping[str, float], price: Optional[TokenPrice]) -> dict[str, float]:
    """"<name>/cost" of the tokens `metrics` counts under `name`; {} without a price or without those counts."""
    prompt, completion = metrics.get(f"{name}/prompt_tokens"), metrics.get(f"{name}/completion_tokens")
    if price is None or prompt is None or completion is None:
        return {}
    return {f"{name}/cost": token_cost(price, prompt, completion)}


def evaluation_metrics(name: str, stretch: Optional[Metered], price: Optional[TokenPrice]) -> dict[str, float]:
    """What the role of `stretch` used in it, under `name` (module docstring: an evaluation's); {} for None."""
    if stretch is None:
        return {}
    counts, stats = stretch.role.call_counts(), stretch.role.http_stats()
    metrics = {f"{name}/requests": float(stats.requests - stretch.requests),
               f"{name}/request_failures": float(stats.failures - stretch.request_failures),
               **{f"{name}/{key}": float(counts[key] - stretch.counts[key]) for key in USAGE_KEYS}}
    return {**metrics, **latency_metrics(name, stretch.times), **cost_metrics(name, metrics, price)}


class RunCosts:
    """Each priced role's "<role>/cost" and "<role>/cost_total" per step (module docstring). `prices`: role name
    -> its price (None: not priced); `resumed`: the metrics line of the checkpoint a run resumes from ({} fresh)."""

    def __init__(self, prices: Mapping[str, Optional[TokenPrice]], resumed: Mapping[str, Any]):
        self.prices = {name: price for name, price in prices.items() if price is not None}
        self.totals = {name: float(resumed.get(f"{name}/cost_total") or 0.0) for name in self.prices}

    def step(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """The costs of the step whose metrics are `metrics`, each added to its run total."""
        costs = {}
        for name, price in self.prices.items():
            cost = cost_metrics(name, metrics, price)
            if cost:
                self.totals[name] += cost[f"{name}/cost"]
                costs.update(cost)
                costs[f"{name}/cost_total"] = self.totals[name]
        return costs
