"""A task for trainer tests on which even a random policy earns varied rewards: the arithmetic task's prompts,
examples, stream and tokenizer, judged by a rubric of character checks that random text meets some of the time
(so advantages are non-zero and the updates really move the policy)."""

import dataclasses

from rubric_jax.data.arithmetic import ArithmeticConfig, ArithmeticTask
from rubric_jax.judges.programmatic import ProgrammaticJudge, RegexCheck
from rubric_jax.rubrics.schema import Criterion, Rubric

CHECKS = {"has_digit": RegexCheck(r"[0-9]"), "has_space": RegexCheck(r" "), "has_plus": RegexCheck(r"\+"),
          "has_equals": RegexCheck(r"=")}
RUBRIC = Rubric(criteria=tuple(Criterion(text=f"the response {name.replace('_', ' ')}", name=name, weight=w)
                               for name, w in zip(CHECKS, (1.0, 2.0, 1.0, 0.5))))


@dataclasses.dataclass(frozen=True)
class ToyTask(ArithmeticTask):
    def rubric(self, example):
        return RUBRIC

    def judge(self):
        return ProgrammaticJudge(CHECKS)


def toy_task(seed: int = 0) -> ToyTask:
    return ToyTask(ArithmeticConfig(), seed)
