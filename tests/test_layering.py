"""DESIGN.md's import rule over rubric_jax/, read from every module's import statements (function-level ones
included): each layer imports only the layers listed above it in DESIGN.md's "Layers" list; `core`, `yaml_config`
and `strict_json` import nothing from the project, and every layer but `core` may import `strict_json`; `data`
imports neither `algorithms` nor `training` nor the command line; `training` drives recipes through the registry
and imports no recipe module by name."""

import ast
from pathlib import Path

import rubric_jax

PACKAGE = Path(rubric_jax.__file__).parent
# DESIGN.md's list, top to bottom; a layer may import those before it.
ORDER = ["core", "rubrics", "models", "inference", "judges", "data", "algorithms", "training"]
ALLOWED = {layer: set(ORDER[:i]) for i, layer in enumerate(ORDER)}
ALLOWED["training"].add("yaml_config")
ALLOWED["data"].add("yaml_config")
ALLOWED.update({
    "yaml_config": set(),
    "quickstart": {*ORDER, "data", "yaml_config"},
    "benchmark": {*ORDER, "data", "yaml_config", "quickstart"},
    "cli": {*ORDER, "data", "yaml_config", "quickstart", "benchmark"},
})
# strict_json (stdlib only) lies below every layer but core: every writer of JSON may import it.
for layer, allowed in ALLOWED.items():
    if layer != "core":
        allowed.add("strict_json")
ALLOWED["strict_json"] = set()
# The recipe modules, which training must not import: everything in algorithms/ but the shared helpers and the
# registry.
RECIPES = {path.stem for path in (PACKAGE / "algorithms").glob("*.py")} - {"__init__", "base", "registry"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(source: str) -> set[str]:
    """Every rubric_jax module or name an import statement of `source` names (`from a import b` names a and a.b)."""
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module)
            imported.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in imported if name.split(".")[0] == "rubric_jax"}


def layer_of(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def violations(module: str, imported: set[str]) -> list[str]:
    layer, found = layer_of(module), []
    for name in sorted(imported):
        target = layer_of(name)
        if target and target != layer and target not in ALLOWED[layer]:
            found.append(f"{module} imports {name} ({layer} may import {sorted(ALLOWED[layer])})")
        parts = name.split(".")
        if layer == "training" and parts[1:2] == ["algorithms"] and parts[2:3] and parts[2] in RECIPES:
            found.append(f"{module} imports the recipe {name} by name (use the registry)")
    return found


def project_modules() -> dict[str, set[str]]:
    return {module_name(path): project_imports(path.read_text(encoding="utf-8")) for path in PACKAGE.rglob("*.py")}


def test_every_module_follows_the_import_rule():
    assert {"srar", "rlcer", "rgr_grpo", "grpo"} <= RECIPES
    modules = project_modules()
    assert {layer_of(m) for m in modules} - {""} == set(ALLOWED)  # a new layer must be placed in the rule
    assert "rubric_jax.algorithms.registry" in modules["rubric_jax.training.evaluate"]  # the reader sees imports
    assert [v for module, imported in sorted(modules.items()) for v in violations(module, imported)] == []


def test_the_rule_catches_each_kind_of_violation():
    cases = {
        "rubric_jax.core.x": "import rubric_jax.rubrics.schema",
        "rubric_jax.core.y": "from rubric_jax.strict_json import dumps",
        "rubric_jax.yaml_config": "from rubric_jax.core import segments",
        "rubric_jax.strict_json": "from rubric_jax import yaml_config",
        "rubric_jax.data.x": "def f():\n    from rubric_jax.training.run_config import RLConfig",
        "rubric_jax.data.y": "from rubric_jax.algorithms import base",
        "rubric_jax.training.x": "from rubric_jax.algorithms.srar import analysis_metrics",
        "rubric_jax.training.y": "from rubric_jax.algorithms import srar",
        "rubric_jax.models.x": "from rubric_jax import cli",
    }
    for module, source in cases.items():
        assert violations(module, project_imports(source)), (module, source)
    allowed = {
        "rubric_jax.training.x": "from rubric_jax.algorithms.registry import eval_metrics_fn",
        "rubric_jax.training.y": "from rubric_jax.algorithms.base import RolloutContext",
        "rubric_jax.core.x": "from rubric_jax.core.segments import stats_dtype",
        "rubric_jax.data.x": "from rubric_jax.yaml_config import config_from_dict",
        "rubric_jax.judges.x": "from rubric_jax.strict_json import dumps",
    }
    for module, source in allowed.items():
        assert violations(module, project_imports(source)) == [], (module, source)
