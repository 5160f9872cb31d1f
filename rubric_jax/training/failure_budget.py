"""The judge's failure budget during a run (`JudgeConfig.max_failure_rate`, `max_failing_steps`): a judge whose
answers keep failing stops the run with one line, before its failures are trained on as rewards."""

from rubric_jax.training.run_config import JudgeConfig
from rubric_jax.training.runs import RunStopped


class JudgeFailureBudget:
    """The judge's failure budget (`JudgeConfig`): `observe` counts the consecutive steps whose failure rate, the
    larger of "judge/failure_rate" (failed rollouts) and "judge/call_failure_rate" (failed calls: with
    judge.failed_criterion score_zero a failed criterion call leaves its rollout judged), exceeds
    `max_failure_rate`, and raises RunStopped at the `max_failing_steps`-th, before that step's update."""

    RATES = ("judge/failure_rate", "judge/call_failure_rate")

    def __init__(self, config: JudgeConfig):
        self.config = config
        self.failing_steps = 0

    def observe(self, metrics: dict[str, float], step: int) -> None:
        rates = {key: metrics[key] for key in self.RATES if key in metrics}
        name, rate = max(rates.items(), key=lambda item: item[1], default=(None, None))
        limit = self.config.max_failure_rate
        if rate is None or rate <= limit:
            self.failing_steps = 0
            return
        self.failing_steps += 1
        if self.failing_steps < self.config.max_failing_steps:
            return
        reasons = sorted({key.split("/")[-1] for key in metrics
                          if key.startswith(("judge/failed/", "judge/call_failed/"))})
        where = f" at {self.config.url}" if self.config.kind == "llm" else ""
        raise RunStopped(f"{name} was above judge.max_failure_rate ({limit:g}) on "
                         f"{self.failing_steps} consecutive steps (step {step}: {rate:.0%}"
                         + (f"; {', '.join(reasons)}" if reasons else "") + f"): the judge{where} is failing, so "
                         f"the rewards are failures, not judgements; stopped before step {step}'s update (the "
                         "last checkpoint resumes)")

