"""Speed of the functional core against a plain-loop NumPy reference and against the memory-bound floor.

In one process, on the same data:
  1. SRaR step-wise advantage (eqs 3-6) for B rollouts x T tokens, K rubric items, up to S steps per response.
  2. GRPO advantage + PPO clipped loss over [B, T] (token-mean).
each timed as: the jitted JAX function, the NumPy loop reference of tests/core (the same code the tests
compare against), and an elementwise pass over one [B, T] float32 array (one read, one write: the floor).
Prints the ratios; targets: >= 100x faster than the loop reference, <= 3x the floor. Machines here are
noisy, so only ratios measured in the same process are reported.

    python experiments/benchmarks/advantage_benchmark.py            # B=2048, T=8192, K=16, S=32
    python experiments/benchmarks/advantage_benchmark.py --small    # a quick run
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from rubric_jax.core import advantages, aggregation, losses, srar  # noqa: E402
from tests.core import reference_advantages, reference_losses  # noqa: E402


def interleaved_times(fn, floor_fn, repeats: int) -> tuple[float, float, float]:
    """Times `fn` and `floor_fn` alternately, `repeats` rounds after a warm-up (which also compiles), so both
    see the same machine load. Returns (best fn time, best floor time, median of the per-round ratios)."""
    jax.block_until_ready(fn())
    jax.block_until_ready(floor_fn())
    fn_times, floor_times = [], []
    for _ in range(repeats):
        for f, times in ((fn, fn_times), (floor_fn, floor_times)):
            start = time.perf_counter()
            jax.block_until_ready(f())
            times.append(time.perf_counter() - start)
    ratios = sorted(a / b for a, b in zip(fn_times, floor_times))
    return min(fn_times), min(floor_times), ratios[len(ratios) // 2]


def once(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def make_batch(rng: np.random.Generator, num_rows: int, num_tokens: int, num_items: int, max_steps: int, group_size: int):
    group_ids = np.repeat(np.arange(num_rows // group_size), group_size).astype(np.int32)
    lengths = rng.integers(num_tokens // 4, num_tokens + 1, num_rows)
    positions = np.arange(num_tokens)[None, :]
    response_mask = positions < lengths[:, None]
    num_steps = rng.integers(1, max_steps + 1, num_rows)
    # steps of equal length, after a short preamble of 8 tokens
    step_len = np.maximum((lengths - 8) // num_steps, 1)
    step_ids = np.where(positions >= 8, np.minimum((positions - 8) // step_len[:, None] + 1, num_steps[:, None]), 0)
    step_ids = np.where(response_mask, step_ids, 0).astype(np.int32)
    return dict(
        base=rng.choice(np.array([0.0, 0.1, 0.9, 1.0], np.float32), num_rows),
        group_ids=group_ids,
        satisfied=rng.random((num_rows, num_items)) < 0.5,
        item_type=rng.integers(0, 4, (num_rows, num_items)).astype(np.int32),
        item_mask=np.ones((num_rows, num_items), bool),
        item_step=rng.integers(-1, max_steps + 1, (num_rows, num_items)).astype(np.int32),
        num_steps=num_steps.astype(np.int32),
        step_ids=step_ids,
        response_mask=response_mask,
        valid=np.ones(num_rows, bool),
    )


def report(name: str, jax_s: float, loop_s: float, floor_s: float, floor_ratio: float) -> None:
    print(f"{name}")
    print(f"  jax (jit), best  {jax_s * 1e3:10.2f} ms")
    print(f"  numpy loop ref   {loop_s * 1e3:10.2f} ms")
    print(f"  [B,T] f32 pass   {floor_s * 1e3:10.2f} ms")
    print(f"  speed-up vs loop reference: {loop_s / jax_s:10.1f}x   (target >= 100x)")
    print(f"  time / memory-bound floor:  {floor_ratio:10.2f}x   (target <= 3x; median of interleaved rounds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--max-steps", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--small", action="store_true", help="B=256, T=1024 for a quick check")
    args = parser.parse_args()
    if args.small:
        args.rows, args.tokens = 256, 1024

    rng = np.random.default_rng(0)
    batch = make_batch(rng, args.rows, args.tokens, args.items, args.max_steps, args.group_size)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; B={args.rows} T={args.tokens} "
          f"K={args.items} S={args.max_steps} group size {args.group_size}\n")

    device = {k: jnp.asarray(v) for k, v in batch.items()}
    floor_input = jnp.asarray(rng.normal(size=(args.rows, args.tokens)).astype(np.float32))
    negate = jax.jit(lambda x: -x)

    def floor():
        return negate(floor_input)

    # 1. SRaR step-wise advantage
    srar_jit = jax.jit(srar.srar_advantages)
    order = ("base", "group_ids", "satisfied", "item_type", "item_mask", "item_step", "num_steps", "step_ids",
             "response_mask", "valid")
    jax_srar, floor_srar, ratio_srar = interleaved_times(
        lambda: srar_jit(*(device[k] for k in order)), floor, args.repeats
    )
    loop_srar = once(lambda: reference_advantages.srar_advantages(*(batch[k] for k in order)))
    report("SRaR step-wise advantage (decoupled, eqs 3-6)", jax_srar, loop_srar, floor_srar, ratio_srar)

    # 2. GRPO advantage + PPO clipped loss, token-mean
    rewards = batch["base"]
    logp = rng.normal(-1.0, 0.3, (args.rows, args.tokens)).astype(np.float32)
    old_logp = (logp + rng.normal(0, 0.05, logp.shape)).astype(np.float32)

    def grpo_clipped_loss(rewards, group_ids, logp, old_logp, response_mask):
        adv_bt = advantages.broadcast_to_tokens(advantages.grpo_advantages(rewards, group_ids), response_mask)
        per_token, _ = losses.ppo_clip_loss(logp, old_logp, adv_bt, response_mask, eps_low=0.2, eps_high=0.28)
        return aggregation.finalize(*aggregation.token_mean(per_token, response_mask))

    def grpo_clipped_loss_loop(rewards, group_ids, logp, old_logp, response_mask):
        adv_b = reference_advantages.grpo(rewards, group_ids, np.ones(rewards.shape[0], bool))
        adv_bt = np.where(response_mask, adv_b[:, None], 0.0)
        per_token = reference_losses.ppo_clip(logp, old_logp, adv_bt, response_mask, eps_low=0.2, eps_high=0.28).loss
        loss_sum, denominator = reference_losses.aggregate(per_token, response_mask, "token-mean")
        return loss_sum / denominator

    loss_args = (rewards, batch["group_ids"], logp, old_logp, batch["response_mask"])
    loss_jit = jax.jit(grpo_clipped_loss)
    device_loss_args = [jnp.asarray(a) for a in loss_args]
    jax_loss, floor_loss, ratio_loss = interleaved_times(lambda: loss_jit(*device_loss_args), floor, args.repeats)
    loop_loss = once(grpo_clipped_loss_loop, *loss_args)
    print()
    report("GRPO advantage + PPO clipped loss (asymmetric 0.2/0.28, token-mean)", jax_loss, loop_loss, floor_loss, ratio_loss)


if __name__ == "__main__":
    main()
