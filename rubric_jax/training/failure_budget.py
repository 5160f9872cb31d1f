"""Failure budgets during a run: a judge whose answers keep failing (`JudgeConfig.max_failure_rate`,
`max_failing_steps`), or a rollout engine whose samples keep failing (`RolloutConfig`'s), stops the run with one
line, before its failures are trained on."""

import dataclasses

from rubric_jax.training.run_config import JudgeConfig, RolloutConfig
from rubric_jax.training.runs import RunStopped


@dataclasses.dataclass
class FailureBudget:
    """`observe` counts the consecutive steps whose failure rate, the largest of the metrics `rates` present,
    exceeds `max_failure_rate`, and raises RunStopped at the `max_failing_steps`-th, before that step's update,
    naming the reasons met (the metrics under `reason_prefixes`), the config key `setting` and what `failing`
    means for the run."""

    rates: tuple[str, ...]
    reason_prefixes: tuple[str, ...]
    max_failure_rate: float
    max_failing_steps: int
    setting: str
    failing: str
    failing_steps: int = 0

    def observe(self, metrics: dict[str, float], step: int) -> None:
        rates = {key: metrics[key] for key in self.rates if key in metrics}
        name, rate = max(rates.items(), key=lambda item: item[1], default=(None, None))
        limit = self.max_failure_rate
        if rate is None or rate <= limit:
            self.failing_steps = 0
            return
        self.failing_steps += 1
        if self.failing_steps < self.max_failing_steps:
            return
        reasons = sorted({key.split("/")[-1] for key in metrics if key.startswith(self.reason_prefixes)})
        raise RunStopped(f"{name} was above {self.setting} ({limit:g}) on {self.failing_steps} consecutive steps "
                         f"(step {step}: {rate:.0%}" + (f"; {', '.join(reasons)}" if reasons else "") + f"): "
                         f"{self.failing}; stopped before step {step}'s update (the last checkpoint resumes)")


def judge_failure_budget(config: JudgeConfig) -> FailureBudget:
    """The judge's budget: its rate is the larger of "judge/failure_rate" (failed rollouts) and
    "judge/call_failure_rate" (failed calls: with judge.failed_criterion score_zero a failed criterion call leaves
    its rollout judged)."""
    where = f" at {config.url}" if config.kind == "llm" else ""
    return FailureBudget(("judge/failure_rate", "judge/call_failure_rate"), ("judge/failed/", "judge/call_failed/"),
                         config.max_failure_rate, config.max_failing_steps, "judge.max_failure_rate",
                         f"the judge{where} is failing, so the rewards are failures, not judgements")


def rollout_failure_budget(config: RolloutConfig) -> FailureBudget:
    """The rollout engine's budget: its rate is "rollout/failure_rate", the share of the step's samples that failed
    (aborted, a NaN met, a request that failed for good: `Sample.failure`)."""
    where = f" at {config.sglang_url}" if config.engine == "sglang" else ""
    return FailureBudget(("rollout/failure_rate",), ("rollout/failed/",), config.max_failure_rate,
                         config.max_failing_steps, "rollout.max_failure_rate",
                         f"the rollout engine{where} is failing, so the step's groups are mostly failed samples")
