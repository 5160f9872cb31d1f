"""The rollout pipeline benchmark (experiments/benchmarks/rollout_pipeline_benchmark.py) runs end to end in its
quick mode and ends on one JSON line with its ratios and their seconds. Nothing here checks how large they are:
on a shared CPU machine timing is the benchmark's to report, not a test's to assert."""

import json
import math
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "experiments", "benchmarks", "rollout_pipeline_benchmark.py")
KEYS = ("continuous_vs_static", "shared_prefill", "pipelined_vs_serial", "judge_tail", "pipelined_step_s", "serial_step_s", "pipelined_judging_s",
        "serial_judging_s")


def test_quick_run_prints_a_table_then_the_ratios_as_json():
    done = subprocess.run([sys.executable, SCRIPT, "--quick"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    assert any(line.startswith("serial ") for line in lines) and any(line.startswith("pipelined ") for line in lines)
    figures = json.loads(lines[-1])
    for key in KEYS:
        assert math.isfinite(figures[key]) and figures[key] > 0, (key, figures)
    assert figures["same_samples"] is True  # continuous batching sampled what the static batch did
    assert 0 < figures["median_length"] <= figures["max_length"] <= 64  # the quick budget
