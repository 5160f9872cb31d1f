"""experiments/srar/compare.py in smoke mode: the cold start, every variant (SRaR, its three ablations, RaR as the
authors ran it and as the RaR paper has it, outcome-only GRPO) trained and evaluated with the same seed, and a
sane table, results.json and plots."""

import json

from experiments.srar.compare import ANALYSIS_KEYS, main
from tests.experiments import run_smoke

VARIANTS = ["srar", "srar_no_step_norm", "srar_merged", "srar_suggest_only", "rar_typed", "rar", "grpo"]


def test_smoke_comparison(tmp_path):
    saved = run_smoke(main, tmp_path, VARIANTS)
    for name in VARIANTS:
        row = saved[name]
        assert set(row) == {"eval/accuracy", "eval/pass@1", *ANALYSIS_KEYS}
        assert all(len(values) == 1 for values in row.values())
        for key in ("eval/accuracy", "eval/pass@1"):
            assert 0 <= row[key][0] <= 1
    # The analysis columns come from the evaluation (training.evaluate's SRaR analysis): when it reports them,
    # every row has each of them in range; step accuracy only where some response has a step.
    if saved["sft"]["eval/srar/looping_rate"][0] is not None:
        for name in ["sft", *VARIANTS]:
            for key in ANALYSIS_KEYS:
                value = saved[name][key][0]
                assert (value is None and key == "eval/srar/step_accuracy") or -1 <= value <= 1, (name, key)
    table = (tmp_path / "table.md").read_text()
    assert all(f"| {name} |" in table for name in ["sft", *VARIANTS])
    assert (tmp_path / "plots" / "outcome_accuracy.png").stat().st_size > 0
    assert (tmp_path / "plots" / "srar_score_suggest.png").stat().st_size > 0
    assert all(line["step"] == 1 for line in map(json.loads, (tmp_path / "srar" / "seed0" / "metrics.jsonl")
                                                 .read_text().splitlines()))
