"""`rubric-jax validate`: it passes on a run config over each preset's fixture, renders each role's prompt as the
recipe writes it, and says what the configured score does with the data's penalties."""

import json
from pathlib import Path

import pytest
import yaml

from rubric_jax import cli
from rubric_jax.data import presets
from tests.data.dataset_fixtures import fixture_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("preset", sorted(presets.PRESETS))
def test_validate_passes_on_every_preset(preset, tmp_path, capsys):
    rubric = presets.PRESETS[preset]["columns"].get("rubric") is not None
    config = {"output_dir": str(tmp_path / "run"), "steps": 1,
              "model": {"init": {"max_position_embeddings": 4096}},
              "task": {"name": "dataset", "params": {"preset": preset, "path": str(fixture_path(preset))}},
              "algorithm": {"name": "rar" if rubric else "grpo"},
              "judge": {"kind": "llm", "url": "http://127.0.0.1:1", "model": "judge", "format": "rating"} if rubric
              else {"kind": "task"}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["validate", str(tmp_path / "run.yaml"), "--rows", "1", "--offline"]) == 0
    out = capsys.readouterr().out
    assert "\ndata: " in out and "policy prompt (" in out and "judge prompt ---" in out


@pytest.mark.parametrize("config, roles, text", [
    ("srar_dataset_cpu.yaml", ["policy"], "Begin each step with \"### Step N:\""),  # SRaR's step format, not the task's
    ("rlcer_dataset_cpu.yaml", ["reasoner", "rubricator"], "(the policy's response)"),  # the CoT's place in Figure 9
    ("rgr_grpo_dataset_cpu.yaml", ["policy", "refinement"], "(the policy's response)"),
])
def test_validate_renders_each_role_as_the_recipe_prompts_it(config, roles, text, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the configs name their fixture relative to the repository root
    assert cli.main(["validate", f"configs/{config}", "--rows", "1", "--offline"]) == 0
    out = capsys.readouterr().out
    assert [line.split(" prompts:")[0] for line in out.splitlines() if " prompts: the longest" in line] == roles
    assert all(f": {role} prompt (" in out for role in roles) and text in out


@pytest.mark.parametrize("score, effect", [
    (None, "counted: a met one subtracts its points from the reward (score: positive_points)"),  # rar's default
    ("weighted_fraction", "weighted 0: a met penalty costs nothing"),
])
def test_validate_says_what_the_score_does_with_the_datas_penalties(score, effect, tmp_path, capsys):
    # the HealthBench fixture's two rows (criteria -10 and -9) and a third whose only criterion is a penalty
    rows = fixture_path("healthbench").read_text().splitlines()
    penalty_only = yaml.safe_load(rows[0])
    penalty_only["rubrics"] = [penalty_only["rubrics"][1]]
    data = tmp_path / "healthbench.jsonl"
    data.write_text("\n".join([*rows, json.dumps(penalty_only)]) + "\n")
    params = {"max_items": 8} if score is None else {"max_items": 8, "score": score}
    config = {"output_dir": str(tmp_path / "run"), "steps": 1, "model": {"init": {"max_position_embeddings": 4096}},
              "task": {"name": "dataset", "params": {"preset": "healthbench", "path": str(data)}},
              "algorithm": {"name": "rar", "params": params},
              "judge": {"kind": "llm", "url": "http://127.0.0.1:1", "model": "judge", "format": "healthbench"}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["validate", str(tmp_path / "run.yaml"), "--rows", "1", "--offline"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"rubrics: 3 criteria with a negative weight: {effect}") for line in lines)
    assert "rubrics: 1 rows with no positive weight: a weighted score (positive points, weighted fraction) gives " \
           "them 0 whatever the response" in lines
