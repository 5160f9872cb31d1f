"""Step time of the RL loop with rollouts overlapped with training (`rollout.overlap`) and with the old-logprobs
pass skipped (`learner.old_logprobs: detached`), each against the plain loop, measured in the same process.

Setup: a small random Qwen3 (`--hidden`, `--layers`) learning the arithmetic task with RaR and the task's
programmatic judge; generation is the SGLang client talking to the stand-in server (`tests/inference/
standin_server.py`) whose scripted policy answers every /generate after a fixed `--latency` seconds, as a
generation server of that speed would; weight syncs go through the client's real path (HF weights written to
disk, /update_weights_from_disk). Each configuration runs `--warmup` steps (which compile), `--steps` measured
steps, and a last one (which has no next batch to sample ahead, and checkpoints), excluded; its step time is
the mean "time/step" of the measured steps. Overlap hides the generation behind the update (and
the update behind the generation), so its step approaches max(generation, update) + sync instead of their sum;
a ratio below 1 is faster than the plain loop.

    python experiments/benchmarks/overlap_benchmark.py                      # 2 warm-up + 6 measured steps
    python experiments/benchmarks/overlap_benchmark.py --latency 1.0 --steps 4
"""

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from rubric_jax.data.tasks import build_task  # noqa: E402
from rubric_jax.training import policy  # noqa: E402
from rubric_jax.training.metrics import read_metrics  # noqa: E402
from rubric_jax.training.rl import train_rl  # noqa: E402
from rubric_jax.training.run_config import (  # noqa: E402
    CheckpointConfig, LearnerConfig, MetricsConfig, ModelInit, ModelSpec, RLConfig, RolloutConfig)
from tests.inference.standin_server import ScriptedPolicy, StandinServer  # noqa: E402

CONFIGURATIONS = {  # name: (rollout.overlap, learner.old_logprobs)
    "plain": (False, "recompute"),
    "detached old logprobs": (False, "detached"),
    "overlap": (True, "recompute"),
    "overlap + detached": (True, "detached"),
}


PHASES = ("step", "generation", "logprobs", "update", "rollout_wait", "sync")


def scripted_reply(prompt: str, sample: int) -> str:
    """A short answer whose correctness varies across a group, so advantages are not all 0."""
    del prompt
    return f"### Step 1: add.\nThe answer is \\boxed{{{sample}}}."


def mean_step_times(args, server_url: str, task, scratch: str) -> dict[str, dict[str, float]]:
    """{configuration: {phase: mean seconds per measured step}} for "step" and each of PHASES."""
    model = ModelSpec(init=ModelInit(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                                     num_layers=args.layers, num_heads=4, num_kv_heads=2,
                                     head_dim=args.hidden // 4, max_position_embeddings=512))
    total = args.warmup + args.steps + 1
    times = {}
    for name, (overlap, old_logprobs) in CONFIGURATIONS.items():
        config = RLConfig(
            output_dir=os.path.join(scratch, name.replace(" ", "_")), steps=total, seed=0,
            model=model,
            rollout=RolloutConfig(engine="sglang", sglang_url=server_url, prompts_per_step=args.prompts,
                                  group_size=args.group_size, max_new_tokens=32, overlap=overlap),
            learner=LearnerConfig(old_logprobs=old_logprobs),
            checkpoint=CheckpointConfig(every_steps=total, async_save=False),
            metrics=MetricsConfig(console=False, tensorboard=False, plots=False))
        train_rl(config, task)
        lines = read_metrics(os.path.join(config.output_dir, "metrics.jsonl"))[args.warmup:-1]
        times[name] = {phase: float(np.mean([line.get(f"time/{phase}", 0.0) for line in lines]))
                       for phase in PHASES}
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="measured steps per configuration")
    parser.add_argument("--warmup", type=int, default=2, help="steps excluded (compilation)")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds every /generate answer takes")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()

    task = build_task("arithmetic", {}, 0)
    tokenizer = task.tokenizer()
    eos_ids, _ = policy.eos_and_pad(tokenizer)
    script = ScriptedPolicy(tokenizer, scripted_reply, eos_ids[0])
    with StandinServer(script, tokenizer=tokenizer, latency_s=args.latency) as server, \
            tempfile.TemporaryDirectory() as scratch:
        times = mean_step_times(args, server.base_url, task, scratch)

    baseline = times["plain"]["step"]
    print(f"\nRL step, {args.prompts} prompts x {args.group_size} samples, generation latency {args.latency} s, "
          f"a {args.layers}-layer model of width {args.hidden}; mean of {args.steps} steps after {args.warmup} "
          "warm-up steps (seconds)")
    print(f"{'configuration':<22}" + "".join(f"{phase:>13}" for phase in PHASES) + f"{'step / plain':>14}")
    for name, phases in times.items():
        print(f"{name:<22}" + "".join(f"{phases[phase]:13.3f}" for phase in PHASES)
              + f"{phases['step'] / baseline:14.3f}")
    print("(generation runs in the background with overlap: rollout_wait is the part of it the step waited for)")


if __name__ == "__main__":
    main()
