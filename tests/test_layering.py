"""DESIGN.md's import rule over rubric_jax/, read from every module's import statements (function-level ones
included): each layer imports only the layers listed above it in DESIGN.md's "Layers" list; `core`, `yaml_config`
and `strict_json` import nothing from the project, and every layer but `core` may import `strict_json`; `data`
imports neither `algorithms` nor `training` nor the command line; `training` drives recipes through the registry
and imports no recipe module by name. The commands, at the top, import every layer and `arguments` (what they
share), and nothing from each other; nothing below imports them; `cli` imports the commands, `arguments` and the
two errors it reports; the package itself (`rubric_jax.train`) imports `training`."""

import ast
from pathlib import Path

import rubric_jax

PACKAGE = Path(rubric_jax.__file__).parent
# DESIGN.md's list, top to bottom; a layer may import those before it.
ORDER = ["core", "rubrics", "models", "inference", "judges", "data", "algorithms", "training", "commands"]
ALLOWED = {layer: set(ORDER[:i]) for i, layer in enumerate(ORDER)}
ALLOWED["training"].add("yaml_config")
ALLOWED["data"].add("yaml_config")
ALLOWED["commands"].update({"yaml_config", "arguments"})
ALLOWED.update({
    "yaml_config": set(),
    "arguments": {*ORDER[:-1], "yaml_config"},  # what the commands share: below them, above every other layer
    "cli": {"commands", "arguments"},
    "": {"training"},  # rubric_jax/__init__.py: `rubric_jax.train`
})
# The errors the dispatcher reports in their one-line form: all that cli imports from below the commands.
CLI_REPORTS = {"rubric_jax.judges.preflight", "rubric_jax.judges.preflight.PreflightFailed",
               "rubric_jax.training.runs", "rubric_jax.training.runs.RunStopped"}
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
        reported_error = layer == "cli" and name in CLI_REPORTS
        if target and target != layer and target not in ALLOWED[layer] and not reported_error:
            found.append(f"{module} imports {name} ({layer} may import {sorted(ALLOWED[layer])})")
        if layer == target == "commands" and name != module and not name.startswith(module + "."):
            found.append(f"{module} imports {name}: a command imports nothing from another (share it in arguments)")
        parts = name.split(".")
        if layer == "training" and parts[1:2] == ["algorithms"] and parts[2:3] and parts[2] in RECIPES:
            found.append(f"{module} imports the recipe {name} by name (use the registry)")
    return found


def project_modules() -> dict[str, set[str]]:
    return {module_name(path): project_imports(path.read_text(encoding="utf-8")) for path in PACKAGE.rglob("*.py")}


def test_every_module_follows_the_import_rule():
    assert {"srar", "rlcer", "rgr_grpo", "grpo"} <= RECIPES
    modules = project_modules()
    assert {layer_of(m) for m in modules} == set(ALLOWED)  # a new layer must be placed in the rule
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
        "rubric_jax.training.z": "def f():\n    from rubric_jax.commands import eval",
        "rubric_jax.arguments": "from rubric_jax.commands.train import check",
        "rubric_jax.commands.x": "from rubric_jax.commands import train",
        "rubric_jax.commands.y": "from rubric_jax.commands.eval import judge_failure",
        "rubric_jax.cli": "from rubric_jax.training.launch import checked_rl_launch",
    }
    for module, source in cases.items():
        assert violations(module, project_imports(source)), (module, source)
    allowed = {
        "rubric_jax.training.x": "from rubric_jax.algorithms.registry import eval_metrics_fn",
        "rubric_jax.training.y": "from rubric_jax.algorithms.base import RolloutContext",
        "rubric_jax.core.x": "from rubric_jax.core.segments import stats_dtype",
        "rubric_jax.data.x": "from rubric_jax.yaml_config import config_from_dict",
        "rubric_jax.judges.x": "from rubric_jax.strict_json import dumps",
        "rubric_jax.commands.x": "from rubric_jax import arguments\nfrom rubric_jax.training.launch import rl_inputs",
        "rubric_jax.cli": "from rubric_jax import commands\nfrom rubric_jax.training.runs import RunStopped",
        "rubric_jax": "def train():\n    from rubric_jax.training import launch",
    }
    for module, source in allowed.items():
        assert violations(module, project_imports(source)) == [], (module, source)
