"""Continuous batching in the embedded engine against its static-batch reference, on a long-tailed workload.

Setup, in one process on the CPU: a random Qwen3-architecture `Decoder` (untied embeddings, vocab 128, hidden 64,
MLP 128, 2 layers, 4 query / 2 KV heads of 16; float32). At initialisation its next-token distribution is close
to uniform, so with temperature 1 and token 1 as EOS a response ends at each step with probability ~1 / vocab:
a geometric length law (median ~ ln 2 x vocab ~ 90 tokens, about 1/6 of the 512-token budget, a few rows
reaching the budget). Both sides get the same rows: 32 random prompts of 16 tokens x 8 samples = 256 rows, each
with its sample seed (`engine.sample_seeds`), so they produce the same samples (checked).

- continuous_vs_static: completed response tokens per second, `EmbeddedEngine(decode_slots=64).generate_rows`
  over the 256 rows / `StaticEngine` (the static reference) over the same rows in batches of 64, the same KV-cache
  rows on both sides (each static batch decodes until its longest row is done). Goal >= 2. Also printed: the
  static reference with all 256 rows in one batch (the old engine's default, 4x the cache), for information.
- shared_prefill: the time to prefill 32 prompts x 8 samples of 256 tokens as 256 rows (each prompt repeated 8
  times, as the static engine does) / as 32 prompts once each (the continuous engine's shared prefill), with the
  engine's prefill function. Goal >= 4.

Timing: each side runs once untimed first (it compiles: the same shapes), then `--repeats` interleaved rounds
(advantage_benchmark's `interleaved_times`); the ratios are medians over rounds. The last line printed is one
JSON object of the figures.

    python experiments/benchmarks/continuous_batching_benchmark.py            # the workload above
    python experiments/benchmarks/continuous_batching_benchmark.py --quick    # 32 rows, 64-token budget
The rollout pipeline benchmark (rollout_pipeline_benchmark.py) runs this one first and prints its figures with
its own.
"""

import argparse
import json
import os
import sys
import time

import jax
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from advantage_benchmark import interleaved_times  # noqa: E402

from rubric_jax.inference import embedded  # noqa: E402
from rubric_jax.inference.embedded import EmbeddedEngine, StaticEngine  # noqa: E402
from rubric_jax.inference.engine import SamplingParams, sample_seeds  # noqa: E402
from rubric_jax.models.config import ModelConfig  # noqa: E402
from rubric_jax.models.decoder import Decoder  # noqa: E402

EOS_ID = 1
CONFIG = ModelConfig(model_type="qwen3", vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=4096,
                     tie_word_embeddings=False)


def continuous_vs_static(model: Decoder, args) -> dict:
    rng = np.random.default_rng(0)
    prompts = rng.integers(2, CONFIG.vocab_size, (args.prompts, args.prompt_tokens)).tolist()
    seeds = sample_seeds(0, args.prompts * args.samples)
    rows = [(prompt, seed) for prompt, seed_block in zip(prompts, np.split(np.array(seeds), args.prompts))
            for seed in seed_block.tolist()]
    params = SamplingParams(max_new_tokens=args.budget, temperature=1.0)
    continuous = EmbeddedEngine(model, eos_token_ids=(EOS_ID,), decode_slots=args.slots)
    static = StaticEngine(model, eos_token_ids=(EOS_ID,))

    def run_continuous():
        return continuous.generate_rows(rows, params)

    def run_static(batch=args.slots):
        return [s for start in range(0, len(rows), batch) for s in static.generate_rows(rows[start:start + batch],
                                                                                        params)]

    samples = run_continuous()
    same = [(s.output_ids, s.finish_reason) for s in samples] == [(s.output_ids, s.finish_reason)
                                                                   for s in run_static()]
    lengths = np.array([len(s.output_ids) for s in samples])
    tokens = int(lengths.sum())
    static_s, continuous_s, ratio = interleaved_times(run_static, run_continuous, args.repeats)
    print(f"{len(rows)} rows ({args.prompts} prompts x {args.samples}), prompts of {args.prompt_tokens} tokens, "
          f"budget {args.budget}, EOS id {EOS_ID} of vocab {CONFIG.vocab_size}, {args.slots} decode slots")
    print(f"response lengths: median {np.median(lengths):.0f}, mean {lengths.mean():.0f}, max {lengths.max()}, "
          f"{np.mean(lengths >= args.budget):.1%} at the budget; {tokens} tokens in all")
    print(f"same samples (tokens, finish reasons) in both: {same}")
    print(f"  {'engine':48s} {'time s':>8s} {'tokens/s':>10s}")
    print(f"  {f'static reference, batches of {args.slots}':48s} {static_s:8.2f} {tokens / static_s:10.0f}")
    print(f"  {f'continuous, {args.slots} slots':48s} {continuous_s:8.2f} {tokens / continuous_s:10.0f}")
    figures = dict(continuous_vs_static=ratio, same_samples=same, median_length=float(np.median(lengths)),
                   max_length=int(lengths.max()))
    if not args.quick:
        full_s = min(time_once(lambda: run_static(len(rows))) for _ in range(2))  # the first compiles
        print(f"  {f'static reference, all {len(rows)} rows at once':48s} {full_s:8.2f} {tokens / full_s:10.0f}")
        figures["continuous_vs_static_full_batch"] = full_s / continuous_s
    print(f"continuous_vs_static (tokens/s, median of {args.repeats} rounds): {ratio:.2f}x   (goal >= 2)")
    return figures


def time_once(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def shared_prefill(model: Decoder, args) -> dict:
    rng = np.random.default_rng(1)
    tokens_gp = rng.integers(2, CONFIG.vocab_size, (args.prompts, args.prefill_tokens)).astype(np.int32)
    mask_gp = np.ones(tokens_gp.shape, bool)
    graphdef, state = nnx.split(model)

    def prefill(tokens, mask):
        return lambda: embedded._prefill_prompts(graphdef, state, tokens, mask)

    per_sample = prefill(np.repeat(tokens_gp, args.samples, axis=0), np.repeat(mask_gp, args.samples, axis=0))
    per_sample_s, shared_s, ratio = interleaved_times(per_sample, prefill(tokens_gp, mask_gp), max(args.repeats, 3))
    print(f"\nprefill of {args.prompts} prompts x {args.samples} samples, {args.prefill_tokens} tokens each")
    print(f"  per sample ({args.prompts * args.samples} rows) {per_sample_s * 1e3:8.1f} ms")
    print(f"  shared ({args.prompts} prompts once)  {shared_s * 1e3:8.1f} ms")
    print(f"shared_prefill (per-sample time / shared time, median): {ratio:.2f}x   (goal >= 4)")
    return dict(shared_prefill=ratio)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--budget", type=int, default=512)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--prefill-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="4 prompts x 8, budget 64, 8 slots, prefill of 32")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.budget, args.slots, args.prefill_tokens, args.repeats = 4, 64, 8, 32, 1
    return args


def engine_figures(args: argparse.Namespace) -> dict:
    """continuous_vs_static and shared_prefill (with what they come from) of the workload `args` sets."""
    print(f"{len(os.sched_getaffinity(0))} CPU threads, jax {jax.__version__}")
    model = Decoder(CONFIG, rngs=nnx.Rngs(0))
    return {**continuous_vs_static(model, args), **shared_prefill(model, args)}


if __name__ == "__main__":
    print(json.dumps(engine_figures(parse_args())))
