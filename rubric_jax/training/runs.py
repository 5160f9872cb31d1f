"""Starting a run or resuming it from its output directory, and writing its final outputs (shared by the RL loop
and SFT).

A run's checkpoint holds the learner state (`policy.LearnerState`) and a JSON meta with at least "step" (completed
steps), "seed", "data_position" (examples of the task's train stream consumed) and "metrics" (that step's
metrics line). Resuming restores the state onto the current layout, refuses a run of another seed (its random
streams would not continue), and rewrites the checkpointed step's metrics line when the kill came between the
checkpoint and that line.

Multi-process runs (`docs/multihost.md`): every process calls these functions; the checkpoint is written and read
by all of them (orbax: each process its own shards), the metrics log, config and plots by process 0 alone
(`open_metrics` gives the other processes a writer that writes nothing), and the final policy is gathered to and
written by process 0 (`safetensors_io.save_hf_checkpoint`).
"""

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import jax
from flax import nnx

from rubric_jax.training import policy
from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.metrics import DEFAULT_CONSOLE_KEYS, METRICS_FILE, MetricsWriter, plot_metrics, read_metrics
from rubric_jax.training.run_config import CheckpointConfig, MetricsConfig


def open_checkpoints(out: Path, config: CheckpointConfig) -> Checkpointer:
    return Checkpointer(out / "checkpoints", max_to_keep=config.keep, async_save=config.async_save)


def restore_latest(checkpointer: Checkpointer, state: policy.LearnerState, config: CheckpointConfig, seed: int
                   ) -> tuple[policy.LearnerState, Optional[dict]]:
    """(the latest checkpoint's state, its meta) when `config.resume` and there is one, else (`state`, None)."""
    if not config.resume or checkpointer.latest_step() is None:
        return state, None
    tree, meta = checkpointer.restore(None, policy.abstract_learner_state(state))
    if meta["seed"] != seed:
        raise ValueError(f"{checkpointer.directory} holds a run with seed {meta['seed']}, not {seed}: resuming it "
                         "with another seed would not continue it; use another output_dir or checkpoint.resume=false")
    print(f"[rubric-jax] resuming {checkpointer.directory.parent} from step {meta['step']}", flush=True)
    return policy.LearnerState.from_tree(tree), meta


class SilentMetricsWriter:
    """A `MetricsWriter` that writes nothing: a multi-process run's writer on every process but process 0."""

    def write(self, step: int, metrics: Mapping[str, object]) -> None:
        del step, metrics

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
