"""experiments/rgr_grpo/compare.py in smoke mode: the cold start, every variant (the recipe, Rubric-GRPO, three
ablations, outcome-only GRPO) trained and evaluated, test-time refinement of every final policy, and a sane
table, results.json and plots."""

import math

from experiments.rgr_grpo.compare import REFINE_KEYS, main
from tests.experiments import run_smoke

VARIANTS = ["rgr_grpo", "rubric_grpo", "rgr_grpo_no_ea", "rgr_grpo_no_shaping", "rgr_grpo_fact_only", "grpo"]
RGR_KEYS = ("rgr/off_policy_fraction", "rgr/refined_better_fraction", "rgr/solved_group_fraction")


def test_smoke_comparison(tmp_path):
    saved = run_smoke(main, tmp_path, VARIANTS)
    for name in VARIANTS:
        row = saved[name]
        assert set(row) == {"eval/accuracy", "eval/pass@1", "eval/rubric_score", *RGR_KEYS, "train/entropy",
                            *REFINE_KEYS}
        finite = {key for key, values in row.items() if values[0] is not None and math.isfinite(values[0])}
        # Outcome-only GRPO logs no rgr/ metrics; Rubric-GRPO refines nothing, so no refinement beats its attempt.
        absent = {"grpo": set(RGR_KEYS), "rubric_grpo": {"rgr/refined_better_fraction"}}.get(name, set())
        assert finite == set(row) - absent, name
        assert all(0 <= row[key][0] <= 1 for key in finite - {"train/entropy"})
        assert row["train/entropy"][0] > 0
    assert saved["rubric_grpo"]["rgr/off_policy_fraction"] == [0.0]
    assert saved["rgr_grpo_no_ea"]["rgr/off_policy_fraction"] == [1.0]  # every group refined
    assert set(saved["sft"]) == {"eval/accuracy", "eval/pass@1", "eval/rubric_score", *REFINE_KEYS}
    table = (tmp_path / "table.md").read_text()
    assert all(f"| {name} |" in table for name in ["sft", *VARIANTS])
    assert all(f" {key} |" in table for key in REFINE_KEYS)
    for key in ("rgr_off_policy_fraction", "train_entropy", "reward_mean"):
        assert (tmp_path / "plots" / f"{key}.png").stat().st_size > 0
