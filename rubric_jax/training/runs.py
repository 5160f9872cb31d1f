"""Starting a run or resuming it from its output directory, and writing its final outputs (shared by the RL loop
and SFT).

A run's checkpoint holds the learner state (`policy.LearnerState`) and a JSON meta with at least "step" (completed
steps), "seed", "data_position" (examples of the task's train stream consumed) and "metrics" (that step's
metrics line). Resuming restores the state onto the current layout, refuses a run of another seed (its random
streams would not continue), and rewrites the checkpointed step's metrics line when the kill came between the
checkpoint and that line.

Relaunching (`check_relaunch`): a directory with history (checkpoints or metrics) resumes only under the config
it was started with, apart from RELAUNCH_SAFE_KEYS, and never with checkpoint.resume false; a checkpoint newer
than the newest that restores is set aside (`restore_latest`); SIGINT and SIGTERM stop a run at the end of a step
(`StopRequests`, `RunInterrupted`). A launch that fails before its first step completes leaves the directory as it
found it (`undo_failed_launch`); one whose output directory cannot be written is refused before anything is built
(`check_writable_directory`).

Multi-process runs (`docs/multihost.md`): every process calls these functions; the checkpoint is written and read
by all of them (orbax: each process its own shards), the metrics log, config and plots by process 0 alone
(`open_metrics` gives the other processes a writer that writes nothing), and the final policy is gathered to and
written by process 0 (`safetensors_io.save_hf_checkpoint`).
"""

import contextlib
import logging
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import jax
import yaml
from flax import nnx

from rubric_jax.training import data_parallel, policy
from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.metrics import DEFAULT_CONSOLE_KEYS, METRICS_FILE, MetricsWriter, plot_metrics, read_metrics
from rubric_jax.training.run_config import CheckpointConfig, MetricsConfig
from rubric_jax.yaml_config import config_from_dict, config_to_dict

_LOG = logging.getLogger(__name__)


class RunStopped(RuntimeError):
    """A run that must not start or cannot go on, with a one-line reason: a relaunch that would rewrite another
    run's history (`check_relaunch`), a judge server that does not answer or refuses the credentials, judge
    failures beyond the failure budget (`training.rl`). The CLI prints the reason and exits `exit_code`.
    `every_process`: in a multi-process job, every process raises it at the same point, so they exit together
    (otherwise the process leaves the job at exit, `multihost.failures_leave_the_job`)."""

    exit_code = 1
    every_process = False


class RunInterrupted(RunStopped):
    """SIGINT or SIGTERM stopped the run at a safe point, after checkpointing (`StopRequests`); the exit code is
    the shell's for that signal (128 + its number). Every process stops after the same step."""

    every_process = True

    def __init__(self, message: str, signal_number: int):
        super().__init__(message)
        self.exit_code = 128 + signal_number


class StopRequests:
    """While active (a `with` block), SIGINT and SIGTERM ask the run to stop at its next safe point, the end of a
    step, instead of killing it mid-write: `requested` is then the signal's number. The first signal restores the
    previous handlers, so a second one acts as it always does (Ctrl-C twice interrupts at once). Signal handlers
    can only be set from the main thread: elsewhere (a run in a worker thread) it does nothing."""

    def __init__(self):
        self.requested: Optional[int] = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():
            self._previous = {number: signal.signal(number, self._handle) for number in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, number: int, frame: Any) -> None:
        del frame
        self.requested = number
        self._restore()
        print(f"[rubric-jax] {signal.Signals(number).name}: stopping after this step, with a checkpoint (send it "
              "again to stop at once)", file=sys.stderr, flush=True)

    def _restore(self) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous = {}

    def __exit__(self, *exc_info) -> None:
        self._restore()

    def stops_after(self, step: int, total_steps: int) -> bool:
        """Whether the run stops after its step `step` (0-based, of `total_steps`) for a signal that any process
        got (so that all stop at the same step; every process must call). The last step ends the run anyway."""
        return data_parallel.any_process(self.requested is not None) and step + 1 < total_steps

    def interruption(self, step: int, total_steps: int, checkpoints: Path) -> RunInterrupted:
        """The RunInterrupted to raise once step `step` is checkpointed in `checkpoints`."""
        number = self.requested or signal.SIGTERM  # None here: another process got the signal
        return RunInterrupted(f"stopped by {signal.Signals(number).name} after step {step + 1} of {total_steps}, "
                              f"checkpointed in {checkpoints}: the same command resumes it", number)


# What a relaunch may change and still resume the run: how long it goes on, how often it evaluates, checkpoints
# and logs, how its servers are reached and retried, whether judging overlaps sampling, and what its judges'
# tokens cost; never what or how it learns. A key matches itself and the keys below it ("metrics" matches "metrics.console").
RELAUNCH_SAFE_KEYS = (
    "output_dir", "steps", "eval.every_steps", "checkpoint.every_steps", "checkpoint.keep", "checkpoint.async_save",
    "metrics", "rollout_log.every_steps", "rollout_log.samples_per_step", "eval.log_samples",
    "rollout.sglang_url", "rollout.frozen_sglang_url", "rollout.pipelined_judging", "rollout.decode_slots",
    "rollout.tensor_parallel",
    *(f"{section}.{key}" for section in ("judge", "meta_verifier")
      for key in ("url", "max_in_flight", "max_attempts", "timeout_s", "api_key_env", "headers",
                  "price_per_million_tokens")),
    "judge.max_failure_rate", "judge.max_failing_steps", "rollout.max_failure_rate", "rollout.max_failing_steps",
    "distributed",
)


def flat_keys(data: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as {"section.key": value}; an empty mapping is a value of its own."""
    if isinstance(data, Mapping) and data:
        return {key: value for name, item in data.items()
                for key, value in flat_keys(item, f"{prefix}{name}.").items()}
    return {prefix[:-1]: data}


def _safe_to_change(key: str) -> bool:
    return any(key == safe or key.startswith(safe + ".") for safe in RELAUNCH_SAFE_KEYS)


def check_writable_directory(path: str, what: str = "output directory") -> None:
    """Writes and deletes a scratch file in the directory `path`, or, when it does not exist yet, in its nearest
    existing ancestor (where the run will create it); ValueError naming `what` if that is not a directory or the
    write fails. Trying is the only reliable check (permissions say nothing to root or on a read-only file
    system), and it creates nothing, so a launch refused later leaves no trace."""
    existing = next(p for p in (Path(path), *Path(path).parents) if p.exists())  # "." or "/" at the latest
    if not existing.is_dir():
        raise ValueError(f"cannot write the {what} {path}: {existing} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise ValueError(f"cannot write the {what} {path}: {error.strerror or error}") from None


def has_history(out: Path) -> bool:
    """Whether `out` holds a run's history: a checkpoint or a line of metrics (a completed step)."""
    checkpoints = out / "checkpoints"
    return (checkpoints.is_dir() and any(checkpoints.iterdir())) or (
        (out / METRICS_FILE).is_file() and (out / METRICS_FILE).stat().st_size > 0)


@contextlib.contextmanager
def undo_failed_launch(out: Path) -> Iterator[None]:
    """Around a launch into `out`: when it fails (any exception) before the run has history (`has_history`), the
    files and directories it created in `out` (config.yaml, an empty metrics.jsonl, tensorboard/, checkpoints/,
    a first step's rollout logs), and `out` itself if it created it, are removed on process 0, so that a refused
    launch leaves the directory as it found it. Nothing is removed from a directory that held history when the
    launch began, nor anything that was there before it, nor once a step has completed."""
    if jax.process_index() != 0 or has_history(out):
        yield
        return
    before = set(out.iterdir()) if out.is_dir() else None
    try:
        yield
    except BaseException:
        if out.is_dir() and not has_history(out):
            for path in set(out.iterdir()) - (before or set()):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            if before is None and not any(out.iterdir()):
                out.rmdir()
        raise


def check_relaunch(out: Path, config: Any, resolve: Callable[[Any], Any] = lambda config: config) -> None:
    """Refuses (RunStopped) a launch that would rewrite the history of the run in `out` (its checkpoints or
    metrics log): with `checkpoint.resume`, when the config saved there differs from `config` (both resolved) in
    a key outside RELAUNCH_SAFE_KEYS, naming the keys; without it, when `out` holds checkpoints at all (a fresh
    run would mix its steps with theirs). A directory without history (nothing run yet) takes any config.

    The saved config is read again as `config`'s class and passed through `resolve` (the RL trainer's
    `resolve_algorithm`), so a value an older version wrote in a form since renamed (`dynamic_sampling: true`,
    now "mask") compares equal to its new form and relaunching with the saved config.yaml always resumes. Keys
    the saved file lacks take today's defaults; they are logged as a warning, since a default may have changed.
    A saved config that no longer loads is refused, with the loader's reason."""
    if not has_history(out):
        return
    if not config.checkpoint.resume:
        raise RunStopped(f"output_dir {out} holds a run and checkpoint.resume is false: a fresh run there would mix "
                         "its steps with that run's; choose another output_dir (or delete that one)")
    saved_path = out / "config.yaml"
    if not saved_path.is_file():
        return
    written = yaml.safe_load(saved_path.read_text(encoding="utf-8")) or {}
    try:
        saved = flat_keys(config_to_dict(resolve(config_from_dict(type(config), written))))
    except ValueError as error:
        raise RunStopped(f"output_dir {out} holds a run whose config.yaml no longer loads ({error}): resuming it "
                         "needs the version that started it, or choose another output_dir") from error
    if defaulted := sorted(saved.keys() - flat_keys(written).keys()):
        _LOG.warning("resuming %s: its config.yaml predates %s, which take today's defaults", out,
                     ", ".join(f"{key}={saved[key]!r}" for key in defaulted))
    current = flat_keys(config_to_dict(config))
    missing = object()
    # The shallowest keys first: "algorithm.name" says more than the twenty parameters that differ with it.
    differing = sorted((key for key in saved.keys() | current.keys()
                        if saved.get(key, missing) != current.get(key, missing) and not _safe_to_change(key)),
                       key=lambda key: (key.count("."), key))
    if differing:
        shown = "; ".join(f"{key}: {saved.get(key, '(absent)')!r} -> {current.get(key, '(absent)')!r}"
                          for key in differing[:6])
        more = f" and {len(differing) - 6} more" if len(differing) > 6 else ""
        raise RunStopped(f"output_dir {out} holds a run with another config ({shown}{more}): resuming would "
                         "continue it under settings it did not start with; relaunch with its config.yaml (only "
                         "steps, evaluation, checkpoint and logging frequencies and server addresses may change) "
                         "or choose another output_dir")


def open_checkpoints(out: Path, config: CheckpointConfig) -> Checkpointer:
    return Checkpointer(out / "checkpoints", max_to_keep=config.keep, async_save=config.async_save)


def _set_aside(checkpointer: Checkpointer, step: int) -> Path:
    """Renames a checkpoint that does not restore to `<step>.unrestorable` (kept for inspection, no longer a
    committed step, so the resumed run can write that step again); process 0 renames, every process waits."""
    source = Path(str(checkpointer.directory)) / str(step)
    target = source.with_name(f"{step}.unrestorable")
    if jax.process_index() == 0:
        suffix = 1
        while target.exists():
            suffix += 1
            target = source.with_name(f"{step}.unrestorable.{suffix}")
        source.rename(target)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils  # noqa: PLC0415

        multihost_utils.sync_global_devices(f"rubric_jax set aside checkpoint {step}")
    return target


def restore_latest(checkpointer: Checkpointer, state: policy.LearnerState, config: CheckpointConfig, seed: int
                   ) -> tuple[policy.LearnerState, Optional[dict]]:
    """(the newest checkpoint's state that restores, its meta) when `config.resume` and there is one, else
    (`state`, None). A checkpoint newer than the one that restores (a corrupted file, a write cut short by a full
    disk) is set aside as `<step>.unrestorable` with a one-line warning; RunStopped, renaming nothing, when none
    restores."""
    if not config.resume or checkpointer.latest_step() is None:
        return state, None
    abstract = policy.abstract_learner_state(state)
    failures: list[tuple[int, str]] = []
    for step in reversed(checkpointer.all_steps()):
        try:
            tree, meta = checkpointer.restore(step, abstract)
            break
        except Exception as error:  # orbax raises many kinds for a damaged checkpoint; each means "not this one"
            failures.append((step, f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"))
    else:
        # Nothing restores: more likely a state that changed shape than every file damaged; nothing is renamed.
        step, problem = failures[0]
        raise RunStopped(f"no checkpoint in {checkpointer.directory} restores (step {step}: {problem})")
    for failed_step, problem in failures:  # newer than the one restored: damaged
        target = _set_aside(checkpointer, failed_step)
        _LOG.warning("checkpoint step %d of %s does not restore (%s): set aside as %s; resuming from step %d",
                     failed_step, checkpointer.directory, problem, target.name, meta["step"])
    if failures:
        checkpointer.reload()
    if meta["seed"] != seed:
        raise ValueError(f"{checkpointer.directory} holds a run with seed {meta['seed']}, not {seed}: resuming it "
                         "with another seed would not continue it; use another output_dir or checkpoint.resume=false")
    print(f"[rubric-jax] resuming {checkpointer.directory.parent} from step {meta['step']}", flush=True)
    return policy.LearnerState.from_tree(tree), meta


class SilentMetricsWriter:
    """A `MetricsWriter` that writes nothing: a multi-process run's writer on every process but process 0."""

    def write(self, step: int, metrics: Mapping[str, object]) -> None:
        del step, metrics

    def write_samples(self, step: int, samples: Sequence[Mapping[str, object]], phase: str = "train") -> None:
        del step, samples, phase

    def __enter__(self) -> "SilentMetricsWriter":
        return self

    def __exit__(self, *exc_info) -> None:
        pass


def open_metrics(out: Path, config: MetricsConfig, total_steps: int, meta: Optional[dict],
                 console_keys: Sequence[str] = DEFAULT_CONSOLE_KEYS) -> MetricsWriter | SilentMetricsWriter:
    """The run's metrics writer, its log cut back to the resumed step (module docstring); on a process other
    than 0, a `SilentMetricsWriter`."""
    if jax.process_index() != 0:
        return SilentMetricsWriter()
    start = meta["step"] if meta else None
    writer = MetricsWriter(out, tensorboard=config.tensorboard, console=config.console, total_steps=total_steps,
                           resume_step=start, console_keys=console_keys)
    if meta and not any(line["step"] == start for line in read_metrics(writer.path)):
        writer.write(start, meta["metrics"])
    return writer


def save_outputs(out: Path, graphdef: nnx.GraphDef, params: nnx.State, tokenizer: Any,
                 plot_panels: Optional[Mapping[str, Sequence[str]]]) -> None:
    """The final policy as the Hugging Face directory out/model and, with `plot_panels`, the PNG curves of the
    metrics log in out/plots (on process 0; every process must call it, the save is collective)."""
    policy.save_policy(graphdef, params, tokenizer, out / "model")
    if plot_panels and jax.process_index() == 0:
        plot_metrics(out / METRICS_FILE, out / "plots", plot_panels)
