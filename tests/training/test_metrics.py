"""The metrics module: the JSONL log read back exactly, null for non-finite values, the console line under a fake
clock, resuming without duplicate or torn lines, TensorBoard records parsed from the event files, PNG plots,
phase timing, and summary statistics against NumPy."""

import io
import json
import math
import struct
import types
from pathlib import Path

import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from rubric_jax.training import metrics
from rubric_jax.training.metrics import MetricsWriter, PhaseTimer, plot_metrics, read_metrics


@pytest.fixture
def clock(monkeypatch):
    """A fake `time` for the module: `clock.now` is what monotonic and perf_counter return."""
    fake = types.SimpleNamespace(now=0.0, time_ns=metrics.time.time_ns)
    fake.monotonic = fake.perf_counter = lambda: fake.now
    monkeypatch.setattr(metrics, "time", fake)
    return fake


def strict_lines(path: Path) -> list[dict]:
    """The file's lines parsed as strict JSON: NaN or Infinity literals fail."""

    def reject(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return [json.loads(line, parse_constant=reject) for line in path.read_text().splitlines()]


def tensorboard_events(directory: Path) -> list[list[event_pb2.Event]]:
    """The events of each event file under `directory`, files in name order (TensorBoard's reading order)."""
    files = []
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data, events, offset = path.read_bytes(), [], 0
        while offset < len(data):
            # A TFRecord: 8-byte length, 4-byte length crc, the payload, 4-byte payload crc.
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            events.append(event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length]))
            offset += 12 + length + 4
        files.append(events)
    return files


def scalars(events: list[event_pb2.Event]) -> list[tuple[str, int, float]]:
    return [(value.tag, event.step, value.simple_value) for event in events for value in event.summary.value]


def test_jsonl_round_trip_of_python_numpy_and_jax_scalars(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False, console=False) as writer:
        writer.write(1, {"reward/mean": 0.25, "count": 3, "np/f32": np.float32(1.5), "jax/bf16": jnp.bfloat16(-2)})
        writer.write(np.int64(2), {"jax/f32": jnp.asarray(0.125), "jax/i32": jnp.asarray(7), "flag": np.bool_(True)})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records == [
        {"step": 1, "reward/mean": 0.25, "count": 3, "np/f32": 1.5, "jax/bf16": -2.0},
        {"step": 2, "jax/f32": 0.125, "jax/i32": 7, "flag": 1},
    ]
    assert [type(v) for v in records[1].values()] == [int, float, int, int]
    assert records == strict_lines(tmp_path / "metrics.jsonl")


def test_non_finite_values_are_null_in_the_log_and_absent_from_tensorboard(tmp_path):
    with MetricsWriter(tmp_path, console=False) as writer:
        writer.write(1, {"a": float("nan"), "b": np.float32("inf"), "c": -math.inf, "d": 2.0})
    assert strict_lines(tmp_path / "metrics.jsonl") == [{"step": 1, "a": None, "b": None, "c": None, "d": 2.0}]
    [events] = tensorboard_events(tmp_path / "tensorboard")
    assert scalars(events) == [("d", 1, 2.0)]


def test_rejected_metrics(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False, console=False) as writer:
        with pytest.raises(TypeError, match="'vector'"):
            writer.write(1, {"vector": np.ones(3)})
        with pytest.raises(TypeError, match="'name'"):
            writer.write(1, {"name": "loss"})
        with pytest.raises(ValueError, match="step"):
            writer.write(1, {"step": 1})
        with pytest.raises(TypeError):
            writer.write(1.0, {"x": 1.0})
    assert read_metrics(tmp_path / "metrics.jsonl") == []


def test_console_line_with_total_steps_shows_progress_rate_and_eta(tmp_path, clock):
    stream = io.StringIO()
    clock.now = 100.0
    writer = MetricsWriter(tmp_path, tensorboard=False, total_steps=60, stream=stream, console_keys=("b", "a"))
    clock.now = 102.0
    writer.write(1, {"a": 0.123456, "b": -1234567.0, "hidden": 5.0})
    clock.now = 104.0
    writer.write(2, {"a": float("nan")})
    clock.now = 550.0
    writer.write(3, {})
    writer.close()
    assert stream.getvalue().splitlines() == [
        "step 1/60 | b -1.235e+06 | a 0.1235 | 2 s/step | eta 1m58s",
        "step 2/60 | a nan | 2 s/step | eta 1m56s",
        "step 3/60 | 150 s/step | eta 2h22m",
    ]


def test_console_line_without_total_steps_has_no_eta(tmp_path, clock):
    stream = io.StringIO()
    writer = MetricsWriter(tmp_path, tensorboard=False, stream=stream)
    clock.now = 0.5
    writer.write(7, {"reward/mean": 0.5, "train/loss": -0.012})
    writer.close()
    assert stream.getvalue() == "step 7 | reward/mean 0.5 | train/loss -0.012 | 0.5 s/step\n"


def test_default_console_line_shows_eval_metrics_on_the_steps_that_evaluated(tmp_path, clock):
    stream = io.StringIO()
    writer = MetricsWriter(tmp_path, tensorboard=False, stream=stream)
    clock.now = 1.0
    writer.write(1, {"reward/mean": 0.5, "eval/rubric_score": 0.25, "eval/accuracy": 0.75, "eval/pass@4": 1.0})
    clock.now = 2.0
    writer.write(2, {"reward/mean": 0.5})
    writer.close()
    assert stream.getvalue().splitlines() == [
        "step 1 | reward/mean 0.5 | eval/rubric_score 0.25 | eval/accuracy 0.75 | 1 s/step",
        "step 2 | reward/mean 0.5 | 1 s/step",
    ]


def test_console_off_writes_nothing(tmp_path):
    stream = io.StringIO()
    with MetricsWriter(tmp_path, tensorboard=False, console=False, stream=stream) as writer:
        writer.write(1, {"reward/mean": 1.0})
    assert stream.getvalue() == ""


def test_resume_drops_later_steps_and_a_torn_line_so_each_step_is_logged_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(tmp_path, console=False) as writer:
        for step in range(1, 6):
            writer.write(step, {"x": float(step)})
    with open(path, "a") as file:
        file.write('{"step": 6, "x": 6.')  # a SIGKILL mid-line
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4, 5]

    with MetricsWriter(tmp_path, console=False, resume_step=3) as writer:
        assert [r["step"] for r in strict_lines(path)] == [1, 2, 3]
        for step in range(4, 7):
            writer.write(step, {"x": 10.0 * step})
    assert strict_lines(path) == [{"step": s, "x": float(s)} for s in (1, 2, 3)] + [
        {"step": s, "x": 10.0 * s} for s in (4, 5, 6)
    ]
    assert not list(tmp_path.glob("*.tmp"))

    first, resumed = tensorboard_events(tmp_path / "tensorboard")
    assert scalars(first) == [("x", s, float(s)) for s in range(1, 6)]
    # TensorBoard hides every earlier event at step >= 4 when it reads this START marker.
    [start] = [e for e in resumed if e.HasField("session_log")]
    assert start.session_log.status == event_pb2.SessionLog.START and start.step == 4
    assert scalars(resumed) == [("x", s, 10.0 * s) for s in (4, 5, 6)]


def test_appending_without_resume_keeps_steps_but_drops_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n[1, 2]\n{"step": "3"}\n{"step": 3, "x"')
    with MetricsWriter(tmp_path, tensorboard=False, console=False) as writer:
        writer.write(3, {"x": 3.0})
    assert strict_lines(path) == [{"step": s, "x": float(s)} for s in (1, 2, 3)]


def test_close_is_idempotent(tmp_path):
    writer = MetricsWriter(tmp_path, console=False)
    writer.write(1, {"x": 1.0})
    writer.close()
    writer.close()
    with pytest.raises(ValueError):
        writer.write(2, {"x": 2.0})


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_metrics_one_png_per_panel_with_data(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False, console=False) as writer:
        for step in range(1, 11):
            writer.write(step, {"reward/mean": step / 10, "reward/std": 0.1, "train/loss": -step, "bad": math.nan})
    backend = matplotlib.get_backend()
    panels = {
        "reward": ["reward/mean", "reward/std", "absent"],
        "train/loss (policy)": ["train/loss"],
        "empty": ["absent"],
        "all null": ["bad"],
    }
    written = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "plots", panels)
    assert written == [tmp_path / "plots" / "reward.png", tmp_path / "plots" / "train_loss_policy.png"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["reward.png", "train_loss_policy.png"]
    for path in written:
        assert png_size(path) == (700, 400)
        assert path.stat().st_size > 10_000  # axes, lines, labels and legend drawn, not a blank canvas
    assert matplotlib.get_backend() == backend


def test_plot_metrics_rejects_panels_that_share_a_file_name(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "x": 1.0}\n')
    with pytest.raises(ValueError, match="clashing"):
        plot_metrics(tmp_path / "metrics.jsonl", tmp_path, {"a/b": ["x"], "a b": ["x"]})
    assert not list(tmp_path.glob("*.png"))


def test_phase_timer_accumulates_repeated_phases_and_resets(clock):
    timer = PhaseTimer()
    for name, seconds in [("generation", 2.0), ("judging", 1.25), ("generation", 0.5)]:
        with timer.phase(name):
            clock.now += seconds
    clock.now += 100.0  # time outside any phase is not counted
    with pytest.raises(KeyError), timer.phase("update"):
        clock.now += 0.25
        raise KeyError("a failing phase still counts its time")
    assert timer.metrics() == {"time/generation": 2.5, "time/judging": 1.25, "time/update": 0.25, "time/step": 4.0}
    timer.reset()
    assert timer.metrics() == {"time/step": 0.0}


def test_phase_timer_rejects_nested_phases_and_stays_usable(clock):
    timer = PhaseTimer()
    with pytest.raises(RuntimeError, match="'inner'.*'outer'"), timer.phase("outer"):
        clock.now += 1.0
        with timer.phase("inner"):
            pass
    with timer.phase("inner"):
        clock.now += 2.0
    assert timer.metrics() == {"time/outer": 1.0, "time/inner": 2.0, "time/step": 3.0}
