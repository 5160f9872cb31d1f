"""experiments/evorubric/compare.py in smoke mode: the cold start, every variant (EvoRubric, RaR on the static
coarse rubric, the five ablations of Table 2) trained and evaluated, and a sane table, results.json and plots."""

import math

from experiments.evorubric.compare import ABLATIONS, EVORUBRIC_KEYS, main
from tests.experiments import run_smoke

VARIANTS = ["evorubric", "rar", *ABLATIONS]
EVAL_KEYS = {"eval/accuracy", "eval/pass@1", "eval/rubric_score"}


def test_smoke_comparison(tmp_path):
    saved = run_smoke(main, tmp_path, VARIANTS)
    assert set(saved["sft"]) == EVAL_KEYS
    for name in VARIANTS:
        row = saved[name]
        assert set(row) == {*EVAL_KEYS, *EVORUBRIC_KEYS, "outcome/accuracy"}
        for key in (*EVAL_KEYS, "outcome/accuracy"):
            assert row[key][0] is not None and 0 <= row[key][0] <= 1, (name, key)
        if name == "rar":  # no generator: no evorubric/ metric
            assert all(row[key] == [None] for key in EVORUBRIC_KEYS)
        else:
            # A barely trained policy's proposals rarely parse: the consensus and the fractions may have no value
            # yet; the pool size and the format rate always do.
            for key in ("evorubric/pool_size", "evorubric/generator_format_rate"):
                assert row[key][0] is not None and math.isfinite(row[key][0]) and row[key][0] >= 0, (name, key)
    assert saved["evorubric_wo_memory_pool"]["evorubric/pool_size"] == [0]  # nothing archived
    table = (tmp_path / "table.md").read_text()
    assert all(f"| {name} |" in table for name in ["sft", *VARIANTS])
    for key in ("outcome_accuracy", "reward_mean", "evorubric_pool_size", "generator_reward_mean"):
        assert (tmp_path / "plots" / f"{key}.png").stat().st_size > 0
