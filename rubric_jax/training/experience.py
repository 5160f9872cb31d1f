"""Step 2 of the RL loop (`training.rl`): one step's experience sampled and judged by the recipe, timed apart from
the learner (so it may run in a background thread, `RolloutConfig.overlap`), with the calls and HTTP requests its
judge, meta-verifier and engine made, and what its judge and meta-verifier used (`training.accounting`), as the
step's metrics."""

import contextlib
import dataclasses
from typing import Optional

from rubric_jax.algorithms.base import Experience, RolloutContext, failure_rate
from rubric_jax.judges.records import JudgedRollout, RecordingJudge, with_recipe_values
from rubric_jax.training.accounting import latency_metrics, metered, wait_metrics
from rubric_jax.training.metrics import PhaseTimer


@dataclasses.dataclass(frozen=True)
class SampledExperience:
    """One step's experience as the learner takes it (`sample_experience`): the recipe's output, the entries it
    adds to the step's metrics line (the recipe's metrics, the prompt metrics, "time/generation" and
    "time/judging", "rollout/weight_step": the updates of the weights it was sampled from, "rollout/policy_lag":
    the step's updates before it minus those, the samples' counts (`algorithms.base.record_samples`) and
    "rollout/failure_rate" (the failed samples' share), the judge's and the meta-verifier's calls and tokens of the
    step as `call_metrics`, their latencies and wait after sampling (`training.accounting`)), and its judged
    rollouts to log (None when the step logs none), each with the recipe's reward, advantage and group of the
    rollout it judged (`JudgedRollout.values`, from `Experience.recipe_values`)."""

    experience: Experience
    metrics: dict[str, float]
    records: Optional[list[JudgedRollout]]
    logs_rollouts: bool = False  # whether `records` go to the step's rollout file (else only its samples)


def sample_experience(algorithm, examples: list, context: RolloutContext, recorder: RecordingJudge, step: int,
                      weight_step: int, logs_rollouts: bool, keeps_samples: bool = False) -> SampledExperience:
    """Step `step`'s experience of `examples` from the engine's weights after `weight_step` updates (step 2 of
    the module docstring), with `recorder` (the context's judge) keeping the judged rollouts when
    `logs_rollouts` (the step's rollout file) or `keeps_samples` (its first few, `samples_of`). It times itself
    and records its prompt metrics apart from the learner, so it may run in a background thread while the learner
    updates (`RolloutConfig.overlap`)."""
    timer = PhaseTimer()
    context = dataclasses.replace(context, timer=timer, sampling_metrics={})
    keeps = logs_rollouts or keeps_samples
    callers = {"judge": recorder, "meta_verifier": context.meta_verifier}
    calls_before = {name: caller.call_counts() for name, caller in callers.items() if caller is not None}
    recorder.recording = keeps
    with contextlib.ExitStack() as stack:
        stretches = {name: stack.enter_context(metered(caller)) for name, caller in callers.items()}
        try:
            experience = algorithm.experience(examples, context, step)
        finally:
            recorder.recording = False
    times = {name: seconds for name, seconds in timer.metrics().items() if name != "time/step"}
    metrics = {**experience.metrics, **{name: float(value) for name, value in context.sampling_metrics.items()},
               **times, "rollout/weight_step": float(weight_step), "rollout/policy_lag": float(step - weight_step)}
    rate = failure_rate(metrics)
    if rate is not None:
        metrics["rollout/failure_rate"] = rate
    for name, before in calls_before.items():
        metrics.update(call_metrics(name, before, callers[name].call_counts()))
    for name, stretch in stretches.items():
        if stretch is not None:
            metrics.update({**latency_metrics(name, stretch.times),
                            **wait_metrics(name, stretch.times, timer.ended_at("generation"))})
    # Attached now, while the recorded requests are the live objects the recipe sent (matched by identity).
    records = with_recipe_values(recorder.take(step + 1), experience.recipe_values) if keeps else None
    return SampledExperience(experience, metrics, records, logs_rollouts)


def call_metrics(name: str, before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """The calls an LLM judge or meta-verifier made between two of its `call_counts` (`judges.llm.call_counts`),
    as one step's metrics under `name`: "<name>/calls", "<name>/call_failures", "<name>/call_failed/<reason>"
    (the reasons met in the step), "<name>/schema_violations", the tokens "<name>/prompt_tokens",
    "<name>/completion_tokens", "<name>/requests_without_usage" (`training.accounting`) and
    "<name>/call_failure_rate" (the step's failed calls over its calls; absent without calls). {} for a judge
    without a chat server."""
    step = {key: count - before.get(key, 0) for key, count in after.items()}
    metrics = {f"{name}/{key}": float(count) for key, count in step.items()
               if count or not key.startswith("call_failed/")}
    if step.get("calls"):
        metrics[f"{name}/call_failure_rate"] = step["call_failures"] / step["calls"]
    return metrics


def request_metrics(name: str, stats, seen: dict[str, int]) -> dict[str, float]:
    """This step's requests, retries and failed requests of an HTTP client (`ClientStats` counts since its
    creation; `seen` holds the counts already reported, and is updated). {} for a client-less engine or judge."""
    if stats is None:
        return {}
    counts = {"requests": stats.requests, "retries": stats.retries, "request_failures": stats.failures}
    metrics = {f"{name}/{key}": float(value - seen.get(key, 0)) for key, value in counts.items()}
    seen.update(counts)
    return metrics

