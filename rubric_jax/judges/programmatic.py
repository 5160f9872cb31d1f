"""Programmatic judge: rubric criteria checked by registered Python predicates or regular expressions.

For verifiable criteria (the rubric-grounded paper's "verification method", formats, final answers) and for
tests. A check is `fn(response: str, request: JudgeRequest) -> bool | float | Attributed`: True / False, a score
in [0, 1], or either of them attributed to a step (`Attributed(satisfied, step)`, for SRaR's step-wise rewards:
k >= 1 a `### Step k:` step, 0 the whole response, -1 none). Items whose check attributes no step get -1.
`RegexCheck(..., attribute_step=True)` attributes a match to the step it lies in (0 outside every step).
`ProgrammaticJudge` maps a criterion's `name` to its check; the rubric's text is never executed or evaluated, only
names are looked up. Regexes are written by the programmer (`RegexCheck`), never taken from a rubric; Python's
`re` has no time limit, so avoid nested quantifiers on model output.

Failures (module docstring of `rubric_jax.judges.base`): a check that raises, or returns anything but a bool or a
finite number in [0, 1] (alone or attributed to an int step >= -1), fails its rollout (reasons "check_raised" /
"check_bad_value", the check and the error in the detail), which gets every item unsatisfied; the other rollouts
are judged as usual. A criterion without a
name, or whose name has no check, is a programmer error: ValueError before anything is judged.
"""

import dataclasses
import math
import numbers
import re
from typing import Callable, Mapping, Sequence, Union

import numpy as np

from rubric_jax.judges.base import Judge, JudgeRequest, RolloutVerdict, Verdicts, check_requests
from rubric_jax.rubrics.steps import split_steps


@dataclasses.dataclass(frozen=True)
class Attributed:
    """A check's result attributed to a step: `satisfied` (a bool or a score in [0, 1]) and `step` (k >= 1 a
    `### Step k:` step, 0 the whole response, -1 no step; validated by the judge like the score)."""

    satisfied: Union[bool, float]
    step: int


CheckFn = Callable[[str, JudgeRequest], Union[bool, float, Attributed]]

_CHECKS: dict[str, CheckFn] = {}
_MAX_DETAIL_CHARS = 300


def register_check(name: str) -> Callable[[CheckFn], CheckFn]:
    """Decorator registering `fn(response, request) -> bool | float` under `name` (ValueError if taken)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a check name must be a non-empty str, got {name!r}")

    def register(fn: CheckFn) -> CheckFn:
        if name in _CHECKS:
            raise ValueError(f"a check named {name!r} is already registered")
        if not callable(fn):
            raise ValueError(f"check {name!r} must be callable, got {type(fn).__name__}")
        _CHECKS[name] = fn
        return fn

    return register


def registered_check(name: str) -> CheckFn:
    """The check registered under `name`; ValueError naming the registered ones if there is none."""
    if name not in _CHECKS:
        raise ValueError(f"no check registered as {name!r}; registered: {sorted(_CHECKS)}")
    return _CHECKS[name]


def step_at(text: str, position: int) -> int:
    """The number of the `### Step N:` step (`rubrics.steps.split_steps`) whose span holds character `position`,
    0 when it lies in no step."""
    for span in split_steps(text):
        if span.header_start <= position < span.end:
            return span.number
    return 0


@dataclasses.dataclass(frozen=True)
class RegexCheck:
    """A check that a regular expression does (`must_match`) or does not occur in the response (`re.search`).

    attribute_step (with must_match): the result is `Attributed(matched, step)`, the step holding the first
    match's start (`step_at`), or -1 without a match.
    """

    pattern: str
    flags: int = 0
    must_match: bool = True
    attribute_step: bool = False
    regex: re.Pattern = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        try:
            object.__setattr__(self, "regex", re.compile(self.pattern, self.flags))
        except (re.error, TypeError) as error:
            raise ValueError(f"pattern: invalid regular expression {self.pattern!r}: {error}") from None
        if self.attribute_step and not self.must_match:
            raise ValueError("attribute_step: a step is attributed to a match, so it needs must_match=True")

    def __call__(self, response: str, request: JudgeRequest) -> Union[bool, Attributed]:
        match = self.regex.search(response)
        if self.attribute_step:
            return Attributed(match is not None, -1 if match is None else step_at(response, match.start()))
        return (match is not None) == self.must_match


CriterionCheck = Union[str, CheckFn, RegexCheck]  # a registered name, a predicate, or a regex


def _resolve(criterion_name: str, check: CriterionCheck) -> CheckFn:
    if isinstance(check, str):
        return registered_check(check)
    if not callable(check):
        raise ValueError(f"checks[{criterion_name!r}] must be a registered name, a callable or a RegexCheck")
    return check


def _score_and_step(value) -> tuple[float, int]:
    """A check's result as (score in [0, 1], step >= -1); ValueError for anything else."""
    if isinstance(value, Attributed):
        step = value.step
        if isinstance(step, (bool, np.bool_)) or not isinstance(step, numbers.Integral) or step < -1:
            raise ValueError(f"attributed step {step!r}, not an int >= -1")
        return _score(value.satisfied), int(step)
    return _score(value), -1


def _score(value) -> float:
    """A check's result as a score in [0, 1]; ValueError for anything else."""
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if isinstance(value, numbers.Real) and math.isfinite(value) and 0.0 <= value <= 1.0:
        return float(value)
    raise ValueError(f"returned {value!r}, not a bool or a finite score in [0, 1]")


def _detail(check_name: str, error: BaseException) -> str:
    return f"{check_name}: {type(error).__name__}: {error}"[:_MAX_DETAIL_CHARS]


class ProgrammaticJudge(Judge):
    """Judges each criterion with the check named by the criterion's `name`.

    `checks` maps criterion names to a registered check's name, a callable `fn(response, request)`, or a
    RegexCheck; a name that is not registered raises ValueError here. Items get the step their check attributes
    (`Attributed`), else -1.
    """

    def __init__(self, checks: Mapping[str, CriterionCheck]):
        self.checks: dict[str, CheckFn] = {name: _resolve(name, check) for name, check in checks.items()}

    def _check_names(self, requests: Sequence[JudgeRequest]) -> None:
        for b, request in enumerate(requests):
            for k, criterion in enumerate(request.rubric.criteria):
                if criterion.name not in self.checks:
                    raise ValueError(
                        f"requests[{b}].rubric.criteria[{k}].name: no check for {criterion.name!r}; "
                        f"checks: {sorted(self.checks)}"
                    )

    def _judge_one(self, request: JudgeRequest) -> RolloutVerdict:
        scores, steps = [], []
        for criterion in request.rubric.criteria:
            try:
                value = self.checks[criterion.name](request.response, request)
            except Exception as error:  # a failing check fails this rollout only
                return RolloutVerdict.failure("check_raised", _detail(criterion.name, error))
            try:
                score, step = _score_and_step(value)
            except ValueError as error:
                return RolloutVerdict.failure("check_bad_value", _detail(criterion.name, error))
            scores.append(score)
            steps.append(step)
        return RolloutVerdict(satisfied=tuple(scores), item_step=tuple(steps))

    def judge(self, requests: Sequence[JudgeRequest], max_items: int) -> Verdicts:
        """Verdicts [B, max_items]; ValueError for bad requests or criteria without a check (module docstring)."""
        check_requests(requests, max_items)
        self._check_names(requests)
        return Verdicts.from_rollouts([self._judge_one(request) for request in requests], max_items)
