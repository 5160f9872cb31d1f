"""The trainer's metrics: a JSONL log, TensorBoard scalars and a console progress line per step, plots of the
log, and wall time per phase of a step.

Conventions:
- A metric is a flat key such as "reward/mean", "train/loss" or "time/generation" and a scalar value: a Python,
  NumPy or 0-d JAX number (a bool is written as 0 / 1). Anything else is a TypeError naming the key.
- `metrics.jsonl` holds one JSON object per step, {"step": step, **metrics}, flushed as it is written so a killed
  run keeps every finished line. NaN and +-inf are written as null, keeping every line valid JSON for any reader;
  TensorBoard gets finite values only. Lines that are not a JSON object with an int "step" (the torn last line of
  a SIGKILL) are skipped by every reader and dropped when a writer opens the file.
- `step` counts finished steps: the console's ETA is (total_steps - step) times the mean wall time per `write`
  since the writer was created.
- Resuming from a checkpoint taken at step k (`resume_step=k`) drops the logged steps > k, in the JSONL file
  (rewritten atomically) and in TensorBoard (`purge_step`), so the resumed run logs each step exactly once.
"""

import json
import math
import operator
import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence, TextIO, Union

import numpy as np

from rubric_jax import strict_json

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
# A key a step lacks is not shown: the judge's tokens and p95 latency only for an LLM judge (`training.accounting`),
# its cost only when priced; the eval/* keys on the steps where an evaluation ran, eval/accuracy only for tasks with
# outcome answers, eval/points_score only for rubrics with signed points.
DEFAULT_CONSOLE_KEYS = ("reward/mean", "judge/failure_rate", "judge/call_failure_rate", "judge/prompt_tokens",
                        "judge/completion_tokens", "judge/latency_p95_s", "judge/cost", "train/loss",
                        "train/grad_norm", "train/entropy", "eval/rubric_score", "eval/points_score", "eval/accuracy")


def _scalar(key: str, value) -> Union[int, float]:
    array = np.asarray(value)
    if array.ndim == 0 and array.dtype.kind in "biu":
        return int(array)
    # "float" in the name also admits ml_dtypes' bfloat16 and float8, which NumPy files under kind "V".
    if array.ndim == 0 and (array.dtype.kind == "f" or "float" in array.dtype.name):
        return float(array)
    raise TypeError(f"metric {key!r} must be a real scalar, got {value!r}")


def _parse(line: str) -> Optional[dict]:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or type(record.get("step")) is not int:
        return None
    return record


def read_metrics(path: Union[str, os.PathLike]) -> list[dict]:
    """The JSONL records in file order, skipping lines that are not records (module docstring)."""
    with open(path, encoding="utf-8") as file:
        return [record for record in map(_parse, file) if record is not None]


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _drop_stale_lines(path: Path, resume_step: Optional[int]):
    """Rewrites a JSONL log of {"step": ...} lines without torn lines and, when resuming, without steps >
    resume_step."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = []
    for line in lines:
        record = _parse(line)
        if record is not None and (resume_step is None or record["step"] <= resume_step):
            kept.append(line if line.endswith("\n") else line + "\n")
    if kept != lines:
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text("".join(kept), encoding="utf-8")
        os.replace(temporary, path)


class MetricsWriter:
    """Writes each step's metrics to `directory/metrics.jsonl`, TensorBoard and the console (module docstring).

    A context manager; `close()` is idempotent.
    """

    def __init__(
        self,
        directory: Union[str, os.PathLike],
        *,
        tensorboard: bool = True,
        console: bool = True,
        total_steps: Optional[int] = None,
        resume_step: Optional[int] = None,
        console_keys: Sequence[str] = DEFAULT_CONSOLE_KEYS,
        stream: Optional[TextIO] = None,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / METRICS_FILE
        self.samples_path = self.directory / SAMPLES_FILE
        for path in (self.path, self.samples_path):
            if path.exists():
                _drop_stale_lines(path, resume_step)
        self._file = open(self.path, "a", encoding="utf-8")
        self._samples_file: Optional[TextIO] = None
        self._tensorboard = None
        if tensorboard:
            # Imported here: it takes a second, and readers and plotters of the log never need it.
            import tensorboardX

            # Event file names carry whole seconds and are opened "wb": the suffix keeps a writer opened within
            # the same second as an earlier one (a quick resume) from overwriting its file.
            self._tensorboard = tensorboardX.SummaryWriter(
                str(self.directory / "tensorboard"),
                purge_step=None if resume_step is None else resume_step + 1,
                filename_suffix=f".{time.time_ns()}",
            )
        # sys.stdout when the writer opens, not when this module was imported (a redirected stdout is honoured).
        self._stream = (sys.stdout if stream is None else stream) if console else None
        self._total_steps = total_steps
        self._console_keys = tuple(console_keys)
        self._start = time.monotonic()
        self._writes = 0

    def write_samples(self, step: int, samples: Sequence[Mapping[str, object]], phase: str = "train"):
        """Logs a step's sample rollouts (JSON objects) of `phase` ("train": the step's rollouts, "eval": its
        evaluation's) to `directory/samples.jsonl`, one a line with the step and the phase, and as one markdown
        text to TensorBoard ("samples/<phase>")."""
        if not samples:
            return
        if self._samples_file is None:
            self._samples_file = open(self.samples_path, "a", encoding="utf-8")
        for sample in samples:
            self._samples_file.write(strict_json.dumps({"step": operator.index(step), "phase": phase, **sample},
                                                       ensure_ascii=False) + "\n")
        self._samples_file.flush()
        if self._tensorboard is not None:
            text = "\n\n---\n\n".join("```\n" + strict_json.dumps(sample, ensure_ascii=False, indent=1) + "\n```"
                                       for sample in samples)
            self._tensorboard.add_text(f"samples/{phase}", text, step)
            self._tensorboard.flush()

    def write(self, step: int, metrics: Mapping[str, object]):
        """Logs one step's metrics everywhere this writer logs to."""
        if "step" in metrics:
            raise ValueError("'step' is the record's step, not a metric key")
        step = operator.index(step)  # an int, NumPy's included; JSON cannot write np.int64
        values = {key: _scalar(key, value) for key, value in metrics.items()}
        self._file.write(strict_json.dumps({"step": step, **values}) + "\n")
        self._file.flush()
        self._writes += 1
        if self._tensorboard is not None:
            for key, value in values.items():
                if math.isfinite(value):
                    self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()
        if self._stream is not None:
            self._stream.write(self._console_line(step, values) + "\n")
            self._stream.flush()

    def _console_line(self, step: int, values: Mapping[str, Union[int, float]]) -> str:
        seconds_per_step = (time.monotonic() - self._start) / self._writes
        parts = [f"step {step}" if self._total_steps is None else f"step {step}/{self._total_steps}"]
        parts += [f"{key} {values[key]:.4g}" for key in self._console_keys if key in values]
        parts.append(f"{seconds_per_step:.3g} s/step")
        if self._total_steps is not None:
            parts.append(f"eta {_duration(max(self._total_steps - step, 0) * seconds_per_step)}")
        return " | ".join(parts)

    def close(self):
        if not self._file.closed:
            self._file.close()
        if self._samples_file is not None and not self._samples_file.closed:
            self._samples_file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc_info):
        self.close()


def _filename(panel: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", panel).strip("._") or "panel"


def plot_metrics(
    metrics_path: Union[str, os.PathLike], directory: Union[str, os.PathLike], panels: Mapping[str, Sequence[str]]
) -> list[Path]:
    """One PNG per panel, `directory/<panel>.png` (name sanitized), plotting its keys against step.

    Keys with no finite value are left out, and a panel with none of its keys left makes no file; a null (a
    non-finite value) breaks its line. Returns the files written.
    """
    # Imported here, and no pyplot: the trainer never plots, and a notebook's backend and figures stay untouched.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = [_filename(panel) for panel in panels]
    if len(set(names)) != len(names):
        raise ValueError(f"panel names {list(panels)} give clashing file names {names}")
    records = sorted(read_metrics(metrics_path), key=lambda record: record["step"])
    directory = Path(directory)
    written = []
    for (panel, keys), name in zip(panels.items(), names):
        series = {}
        for key in keys:
            points = [(r["step"], np.nan if r[key] is None else r[key]) for r in records if key in r]
            if any(math.isfinite(value) for _, value in points):
                series[key] = points
        if not series:
            continue
        figure = Figure(figsize=(7, 4), layout="constrained")
        axes = figure.add_subplot()
        for key, points in series.items():
            steps, values = zip(*points)
            axes.plot(steps, values, marker="." if len(points) < 50 else None, label=key)
        axes.set(title=panel, xlabel="step", ylabel=next(iter(series)) if len(series) == 1 else "value")
        axes.grid(True, alpha=0.3)
        axes.legend()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.png"
        FigureCanvasAgg(figure).print_png(path)
        written.append(path)
    return written


class PhaseTimer:
    """Wall time per named phase of a step: `with timer.phase("generation"): ...`, summed over repeats, and when
    each phase last ended (`ended_at`).

    JAX dispatches asynchronously: a phase measures device work only if it blocks on its results before it ends.
    """

    def __init__(self):
        self._seconds: dict[str, float] = {}
        self._ended_at: dict[str, float] = {}
        self._active: Optional[str] = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self._active is not None:
            raise RuntimeError(f"phase {name!r} started inside phase {self._active!r}; phases do not nest")
        self._active = name
        start = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - start
            self._ended_at[name] = time.monotonic()  # the clock of the HTTP client's request ends
            self._active = None

    def ended_at(self, name: str) -> Optional[float]:
        """`time.monotonic()` when the last phase `name` ended since the last `reset`; None if none did."""
        return self._ended_at.get(name)

    def metrics(self) -> dict[str, float]:
        """{"time/<phase>": seconds, ..., "time/step": their sum} since the last `reset`."""
        return {**{f"time/{name}": s for name, s in self._seconds.items()}, "time/step": sum(self._seconds.values())}

    def reset(self):
        self._seconds.clear()
        self._ended_at.clear()
