"""Time per RL step by phase for the quickstart configuration: generation, judging, logprobs, update, sync,
checkpoint, each as seconds and as a fraction of the step (the ratio against the step time measured in the same
process), and the slowest phase named.

Setup: the quickstart's model, task and RL settings (`QuickstartConfig()`: 16 prompts x 8 samples of up to 64
tokens, RaR with the programmatic judge, 2 mini-batches per step, the embedded engine), starting from the
quickstart's SFT model (`--sft-model`, default runs/quickstart/sft/model; trained here with the quickstart's
SFT stage when absent), with a checkpoint after every step so that its cost is measured too (the quickstart
checkpoints every 20 steps). The first `--warmup` steps (which compile) are excluded; the table is the mean
over the remaining steps of each phase's `time/<phase>` metric, as the trainer records it.

    python experiments/benchmarks/rl_phase_benchmark.py               # 3 warm-up + 10 measured steps
    python experiments/benchmarks/rl_phase_benchmark.py --steps 5     # fewer measured steps
"""

import argparse
import dataclasses
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from rubric_jax.training.assembly import make_task  # noqa: E402
from rubric_jax.training.metrics import read_metrics  # noqa: E402
from rubric_jax.training.rl import train_rl  # noqa: E402
from rubric_jax.training.run_config import (  # noqa: E402
    CheckpointConfig, MetricsConfig, ModelSpec, QuickstartConfig)
from rubric_jax.training.sft import train_sft  # noqa: E402

PHASES = ("generation", "judging", "logprobs", "update", "sync", "checkpoint")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft-model", default="runs/quickstart/sft/model")
    parser.add_argument("--steps", type=int, default=10, help="measured steps")
    parser.add_argument("--warmup", type=int, default=3, help="steps excluded (compilation)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        quickstart = QuickstartConfig(output_dir=scratch, metrics=MetricsConfig(console=False, plots=False,
                                                                                tensorboard=False))
        task = make_task(quickstart.task)
        sft_model = args.sft_model
        if not os.path.isdir(sft_model):
            print(f"no SFT model at {sft_model}: training one with the quickstart's SFT stage", flush=True)
            train_sft(quickstart.sft_config(), task)
            sft_model = os.path.join(scratch, "sft", "model")
        config = dataclasses.replace(
            quickstart.rl_config(), steps=args.warmup + args.steps, model=ModelSpec(path=sft_model),
            checkpoint=CheckpointConfig(every_steps=1, keep=2))
        train_rl(config, task)
        lines = read_metrics(os.path.join(config.output_dir, "metrics.jsonl"))[args.warmup:]

    step = np.mean([line["time/step"] for line in lines])
    means = {phase: np.mean([line.get(f"time/{phase}", 0.0) for line in lines]) for phase in PHASES}
    rollout = quickstart.rl.rollout
    print(f"\nRL step of the quickstart configuration ({rollout.prompts_per_step} prompts x {rollout.group_size} "
          f"samples, up to {rollout.max_new_tokens} tokens; mean of {len(lines)} steps after {args.warmup} "
          f"warm-up steps; a checkpoint every step)")
    print(f"{'phase':<12} {'seconds':>8} {'fraction of step':>17}")
    for phase, seconds in sorted(means.items(), key=lambda item: -item[1]):
        print(f"{phase:<12} {seconds:8.3f} {seconds / step:17.1%}")
    print(f"{'step':<12} {step:8.3f} {sum(means.values()) / step:17.1%}  (phases' sum / step)")
    print(f"slowest phase: {max(means, key=means.get)}")


if __name__ == "__main__":
    main()
