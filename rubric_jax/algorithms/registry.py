"""Recipes by name: `register(name)` on an `Algorithm` subclass; `algorithm_class(name)` for a config's
`algorithm.name` (the trainer validates `algorithm.params` into the class's `config_class`).

A recipe may also contribute an analysis of held-out responses, `register(name, eval_metrics=fn)`, which
`training.evaluate` adds under "eval/<name>/" for the recipes it is asked for (the run's algorithm, the task's
`eval_recipes`); `eval_metrics_fn(name)` returns it. So the trainer knows no recipe by name.
"""

from typing import Any, Callable, Optional, Sequence

import numpy as np

from rubric_jax.algorithms.base import Algorithm
from rubric_jax.judges.base import Verdicts
from rubric_jax.rubrics.schema import Rubric

EvalMetricsFn = Callable[[Any, Sequence[Any], Sequence[str], np.ndarray, Verdicts, Sequence[Rubric]],
                         dict[str, float]]
"""fn(task, examples, texts, correct_b, verdicts, rubrics) -> metrics: an analysis of B responses `texts` to
`examples` (one example per response), `correct_b` [B] their answers' correctness, `verdicts` the judge's against
`rubrics`; keys without a prefix."""

_ALGORITHMS: dict[str, type[Algorithm]] = {}
_EVAL_METRICS: dict[str, EvalMetricsFn] = {}


def register(name: str, *, eval_metrics: Optional[EvalMetricsFn] = None):
    """Class decorator registering an Algorithm subclass under `name` (ValueError if taken), with the recipe's
    evaluation analysis `eval_metrics` if it has one (module docstring)."""

    def decorate(cls: type[Algorithm]) -> type[Algorithm]:
        if name in _ALGORITHMS:
            raise ValueError(f"an algorithm named {name!r} is already registered")
        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            raise ValueError(f"algorithm {name!r} must be an Algorithm subclass, got {cls!r}")
        _ALGORITHMS[name] = cls
        if eval_metrics is not None:
            _EVAL_METRICS[name] = eval_metrics
        return cls

    return decorate


def names() -> list[str]:
    return sorted(_ALGORITHMS)


def algorithm_class(name: str) -> type[Algorithm]:
    if name not in _ALGORITHMS:
        raise ValueError(f"config key algorithm.name: unknown algorithm {name!r}; registered: {names()}")
    return _ALGORITHMS[name]


def eval_metrics_fn(name: str) -> Optional[EvalMetricsFn]:
    """The evaluation analysis recipe `name` registered, None if it has none; ValueError for an unknown recipe."""
    if name not in _ALGORITHMS:
        raise ValueError(f"unknown recipe {name!r} for evaluation metrics; registered: {names()}")
    return _EVAL_METRICS.get(name)
