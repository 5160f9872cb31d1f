"""The continuous-batching benchmark runs (--quick) and ends with its figures as one JSON line."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_continuous_batching_benchmark_prints_its_figures_as_json():
    result = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "benchmarks" / "continuous_batching_benchmark.py"), "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.splitlines()[-1])
    assert figures["same_samples"] is True
    assert figures["continuous_vs_static"] > 0 and figures["shared_prefill"] > 0
    assert 0 < figures["median_length"] <= figures["max_length"] <= 64
