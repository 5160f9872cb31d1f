"""`algorithm.imports`: a run config names the modules that define recipes of the user's own, imported when the
config is read and before `algorithm.name` is looked up (`registry.import_recipe_modules`)."""

import sys
import textwrap

import pytest

from rubric_jax.algorithms import rar, registry
from rubric_jax.training.run_config import AlgorithmSpec
from rubric_jax.yaml_config import config_from_dict

RECIPE = """
from rubric_jax.algorithms import rar
from rubric_jax.algorithms.registry import register


@register({name!r})
class Outside(rar.RaR):
    pass
"""


def write_recipe(directory, module: str, name: str):
    path = directory / f"{module}.py"
    path.write_text(textwrap.dedent(RECIPE.format(name=name)))
    return path


def forget(module: str):
    sys.modules.pop(module, None)


def test_a_module_name_from_the_current_directory_registers_its_recipe_when_the_config_is_read(tmp_path,
                                                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)
    package = tmp_path / "my_recipes"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write_recipe(package, "critz", "critz_by_module")
    with pytest.raises(ValueError, match="unknown algorithm 'critz_by_module'"):
        registry.algorithm_class("critz_by_module")
    try:
        spec = config_from_dict(AlgorithmSpec, {"name": "critz_by_module", "imports": ["my_recipes.critz"]})
        cls = registry.algorithm_class("critz_by_module")
        assert issubclass(cls, rar.RaR) and cls.__module__ == "my_recipes.critz"
        assert spec.imports == ("my_recipes.critz",)
        # Read again (a relaunch re-reads the saved config): the module is not executed twice, so no clash.
        config_from_dict(AlgorithmSpec, {"name": "critz_by_module", "imports": ["my_recipes.critz"]})
        assert registry.algorithm_class("critz_by_module") is cls
    finally:
        forget("my_recipes.critz")
        forget("my_recipes")


def test_a_python_file_path_is_imported_once_under_its_stem(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    write_recipe(tmp_path / "recipes", "critz_file_recipe", "critz_by_path")
    try:
        registry.import_recipe_modules(["recipes/critz_file_recipe.py"])
        cls = registry.algorithm_class("critz_by_path")
        assert cls.__module__ == "critz_file_recipe"
        registry.import_recipe_modules(["recipes/critz_file_recipe.py"])
        assert registry.algorithm_class("critz_by_path") is cls
    finally:
        forget("critz_file_recipe")


def test_what_cannot_be_imported_is_a_value_error_naming_the_entry_and_a_recipes_own_error_goes_through(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="algorithm.imports: no module named 'no_such_recipes.critz'"):
        registry.import_recipe_modules(["no_such_recipes.critz"])
    with pytest.raises(ValueError, match="algorithm.imports: missing.py is not a file"):
        registry.import_recipe_modules(["missing.py"])
    (tmp_path / "broken_recipe.py").write_text("import a_module_nobody_has\n")
    with pytest.raises(ModuleNotFoundError, match="a_module_nobody_has"):
        registry.import_recipe_modules(["broken_recipe"])
    assert "broken_recipe" not in sys.modules
    (tmp_path / "json.py").write_text("")
    with pytest.raises(ValueError, match="imported as the module 'json'"):
        registry.import_recipe_modules(["json.py"])
