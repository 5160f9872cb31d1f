"""Recipes by name: `register(name)` on an `Algorithm` subclass; `algorithm_class(name)` for a config's
`algorithm.name` (the trainer validates `algorithm.params` into the class's `config_class`).

A recipe may also contribute an analysis of held-out responses, `register(name, eval_metrics=fn)`, which
`training.evaluate` adds under "eval/<name>/" for the recipes it is asked for (the run's algorithm, the task's
`eval_recipes`); `eval_metrics_fn(name)` returns it. So the trainer knows no recipe by name.

A recipe defined outside the package registers itself when its module is imported: a run config names that
module in `algorithm.imports` (`import_recipe_modules`), a notebook or script imports it itself.
"""

import importlib
import importlib.util
import os
import sys
from pathlib import Path
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


def _same_definition(a: type, b: type) -> bool:
    """Whether `a` and `b` are one class statement run twice: the same module and qualified name (a module
    re-executed by `importlib.reload`, as a notebook does after editing its recipe)."""
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def register(name: str, *, eval_metrics: Optional[EvalMetricsFn] = None):
    """Class decorator registering an Algorithm subclass under `name`, with the recipe's evaluation analysis
    `eval_metrics` if it has one (module docstring). A name that is taken is a ValueError, unless the class
    registered under it is this class's own earlier definition (`_same_definition`: its module reloaded): the
    reloaded class and its `eval_metrics` then replace the registration."""

    def decorate(cls: type[Algorithm]) -> type[Algorithm]:
        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            raise ValueError(f"algorithm {name!r} must be an Algorithm subclass, got {cls!r}")
        if name in _ALGORITHMS and not _same_definition(_ALGORITHMS[name], cls):
            raise ValueError(f"an algorithm named {name!r} is already registered "
                             f"({_ALGORITHMS[name].__module__}.{_ALGORITHMS[name].__qualname__})")
        _ALGORITHMS[name] = cls
        _EVAL_METRICS.pop(name, None)
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


def import_recipe_modules(modules: Sequence[str]) -> None:
    """Imports the modules that define a run's own recipes (`algorithm.imports` of a run config), so that their
    `register` calls run before `algorithm.name` is looked up. An entry ending in ".py" is a Python file, its path
    relative to the current directory; any other entry is a module name (`my_pkg.my_recipe`), found as
    `python -m` finds one: from the current directory, then the installed packages. A module already imported
    is not imported again, so reading a config twice (a relaunch re-reads the saved one) registers nothing twice;
    to pick up edits in a notebook, `importlib.reload` the module (`register` then replaces its recipes).
    ValueError naming the entry when it cannot be found; an error the module's own code raises goes through with
    its traceback."""
    for entry in modules:
        if entry.endswith(".py"):
            _import_file(Path(entry))
            continue
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            importlib.import_module(entry)
        except ModuleNotFoundError as error:
            if error.name is None or not (entry == error.name or entry.startswith(error.name + ".")):
                raise  # the module was found, and a module it imports is missing: its own traceback says which
            raise ValueError(f"config key algorithm.imports: no module named {entry!r} (from "
                             f"{os.getcwd()} or the installed packages)") from None


def _import_file(path: Path) -> None:
    """Imports the Python file `path` as a module named after the file (`recipes/critz.py`: `critz`), unless
    that module was already imported from that file."""
    if not path.is_file():
        raise ValueError(f"config key algorithm.imports: {path} is not a file (a path is read from {os.getcwd()})")
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path.resolve():
        return
    if loaded is not None:
        raise ValueError(f"config key algorithm.imports: {path} would be imported as the module {name!r}, which is "
                         f"already {getattr(loaded, '__file__', None) or 'a built-in module'}: rename the file")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
