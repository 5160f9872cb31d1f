"""The decode bytes benchmark (experiments/benchmarks/decode_bytes_benchmark.py) runs end to end in its quick mode
(a tiny model compiled for v5e:2x2) and ends on one JSON line: the half-full step reads at least the weights and
the cache in use, and less than the step attending to the whole cache."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("libtpu")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "experiments", "benchmarks", "decode_bytes_benchmark.py")


def test_quick_run_reports_the_bytes_a_decode_step_reads():
    done = subprocess.run([sys.executable, SCRIPT, "--quick"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["read_ratio"] >= 1  # nothing reads less than it must
    assert figures["windowed_vs_whole"] < 1
    assert figures["mesh"] == {"data": 2, "fsdp": 1, "expert": 1, "tensor": 2}
    assert figures["attended_slots"] < figures["cache_slots"] == 512 + 512
