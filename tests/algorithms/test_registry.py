"""The registry's names in a notebook: a recipe module reloaded with `importlib.reload` re-registers its class
(and its evaluation analysis) under the same name; another class under a taken name is refused."""

import importlib
import sys
import textwrap

import pytest

from rubric_jax.algorithms import registry
from rubric_jax.algorithms.rar import RaR

RECIPE_MODULE = '''
from rubric_jax.algorithms.rar import RaR
from rubric_jax.algorithms.registry import register


def analysis(task, examples, texts, correct_b, verdicts, rubrics):
    return {{"version": {version}.0}}


@register("notebook_recipe", eval_metrics=analysis if {with_metrics} else None)
class NotebookRecipe(RaR):
    version = {version}
'''


@pytest.fixture
def recipe_module(tmp_path, monkeypatch):
    """A function writing version `v` of a recipe module `notebook_recipe_module` in tmp_path; the module and its
    registration are removed afterwards, so the registry's names stay what the other tests see."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(version: int, with_metrics: bool = True):
        (tmp_path / "notebook_recipe_module.py").write_text(
            textwrap.dedent(RECIPE_MODULE.format(version=version, with_metrics=with_metrics)))
        importlib.invalidate_caches()

    yield write
    sys.modules.pop("notebook_recipe_module", None)
    registry._ALGORITHMS.pop("notebook_recipe", None)
    registry._EVAL_METRICS.pop("notebook_recipe", None)


def test_a_reloaded_recipe_module_replaces_its_registration_and_eval_metrics(recipe_module):
    recipe_module(1)
    module = importlib.import_module("notebook_recipe_module")
    first = registry.algorithm_class("notebook_recipe")
    assert first is module.NotebookRecipe and first.version == 1
    assert registry.eval_metrics_fn("notebook_recipe")(None, [], [], None, None, []) == {"version": 1.0}

    recipe_module(2)  # the notebook edits the recipe and reloads it
    reloaded = importlib.reload(module)
    assert registry.algorithm_class("notebook_recipe") is reloaded.NotebookRecipe is not first
    assert registry.algorithm_class("notebook_recipe").version == 2
    assert registry.eval_metrics_fn("notebook_recipe")(None, [], [], None, None, []) == {"version": 2.0}

    recipe_module(3, with_metrics=False)  # an analysis removed from the recipe is gone from the registry too
    importlib.reload(module)
    assert registry.algorithm_class("notebook_recipe").version == 3
    assert registry.eval_metrics_fn("notebook_recipe") is None


def test_another_class_under_a_taken_name_is_refused(recipe_module):
    recipe_module(1)
    importlib.import_module("notebook_recipe_module")
    registered = registry.algorithm_class("notebook_recipe")

    class NotebookRecipe(RaR):  # same name, another module: not a reload
        pass

    with pytest.raises(ValueError, match="already registered"):
        registry.register("notebook_recipe")(NotebookRecipe)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("rar")(type("RaR", (RaR,), {}))  # a built-in recipe's name, from this module
    assert registry.algorithm_class("notebook_recipe") is registered
    assert registry.algorithm_class("rar") is RaR
