"""experiments/rubric_grounded/compare.py in smoke mode: the cold start, every variant (the recipe, its two
ablations, RaR and outcome-only GRPO) trained and evaluated, and a sane table, results.json and plots."""

import math

from experiments.rubric_grounded.compare import main
from tests.experiments import run_smoke

VARIANTS = ["rubric_grounded", "rubric_grounded_group_mean", "rubric_grounded_no_std", "rar", "grpo"]


def test_smoke_comparison(tmp_path):
    saved = run_smoke(main, tmp_path, VARIANTS)
    for name in VARIANTS:
        row = saved[name]
        assert set(row) == {"eval/accuracy", "eval/pass@1", "eval/rubric_score", "reward/mean", "outcome/accuracy"}
        assert all(len(values) == 1 and values[0] is not None and math.isfinite(values[0]) for values in row.values())
        assert all(0 <= row[key][0] <= 1 for key in row)
    assert 0 <= saved["sft"]["eval/rubric_score"][0] <= 1
    table = (tmp_path / "table.md").read_text()
    assert all(f"| {name} |" in table for name in ["sft", *VARIANTS])
    for key in ("reward_mean", "train_entropy"):
        assert (tmp_path / "plots" / f"{key}.png").stat().st_size > 0
