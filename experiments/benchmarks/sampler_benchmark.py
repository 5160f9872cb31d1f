"""Tokens/s of the embedded JAX sampler against transformers' `generate` (PyTorch, CPU) on the same model.

Setup, in one process on the CPU, for each of two random Qwen3-architecture checkpoints written by transformers'
`save_pretrained` to a temporary directory (float32, tied embeddings; PyTorch runs that checkpoint, JAX loads the
same files with `load_hf_checkpoint`):
  tiny:  the test fixtures' shapes (tests/tiny_checkpoints.py): vocab 320, hidden 64, MLP 128, 2 layers,
         4 query / 2 KV heads of 16; ~0.1M parameters. The issue's "same tiny model": per-step framework
         overhead dominates, which is what an embedded sampler for CPU runs and tests is for.
  small: vocab 32000, hidden 256, MLP 1024, 4 layers, 4 query / 2 KV heads of 64; ~12M parameters. Here both
         sides are bound by the matmuls (two thirds of it the 32000-way unembedding), so the ratio shrinks.
- Work: the same 32 random prompts of 32 tokens, 128 new tokens each, in one batched call per round:
    JAX:     `EmbeddedEngine.generate(prompts, SamplingParams(max_new_tokens=128, ...))` end to end (host-side
             padding, the jitted prefill + decode loop, and building the `Sample`s with their logprobs);
    PyTorch: `model.generate(input_ids, attention_mask, max_new_tokens=128, min_new_tokens=128, ...)` under
             `torch.inference_mode()`, KV cache on (transformers' default), without logprobs.
  The engine has no EOS ids and `min_new_tokens` suppresses EOS in transformers, so both generate exactly
  32 x 128 tokens every round (checked). Two modes: greedy, and plain sampling at temperature 1 (transformers
  with top_k=0, top_p=1: no filtering, like the engine's "sample" mode).
- Timing: a warm-up call each (JAX's includes compilation, reported separately and excluded), then rounds
  alternating PyTorch and JAX (advantage_benchmark's `interleaved_times`), so both see the same machine load;
  the ratio printed is the median over rounds of PyTorch time / JAX time = JAX tokens/s / PyTorch tokens/s
  (target >= 3 on the tiny model). torch uses as many threads as the process has cores, as XLA's CPU client.
- Sanity: in greedy mode the fraction of sequences on which the two agree token for token is printed (float32
  summation order can flip a near-tie late in a sequence; almost all should agree).

    python experiments/benchmarks/sampler_benchmark.py                 # both models, 5 rounds
    python experiments/benchmarks/sampler_benchmark.py --model tiny    # one model
    python experiments/benchmarks/sampler_benchmark.py --small         # 8 x 32 tokens, 3 rounds
"""

import argparse
import os
import sys
import tempfile
import time

import jax
import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from advantage_benchmark import interleaved_times  # noqa: E402

from rubric_jax.inference.embedded import EmbeddedEngine  # noqa: E402
from rubric_jax.inference.engine import SamplingParams  # noqa: E402
from rubric_jax.models.safetensors_io import load_hf_checkpoint  # noqa: E402

SPECIAL_IDS = dict(pad_token_id=0, eos_token_id=1, tie_word_embeddings=True, max_position_embeddings=4096)
MODELS = dict(
    tiny=dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, **SPECIAL_IDS),
    small=dict(vocab_size=32000, hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=64, **SPECIAL_IDS),
)


def torch_generate_fn(model, prompts_bp: np.ndarray, max_new_tokens: int, sample: bool):
    input_ids = torch.from_numpy(prompts_bp).long()
    attention_mask = torch.ones_like(input_ids)
    kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if sample else dict(do_sample=False)

    def generate():
        with torch.inference_mode():
            output = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                                    min_new_tokens=max_new_tokens, pad_token_id=0, **kwargs)
        return output[:, prompts_bp.shape[1]:].numpy()

    return generate


def jax_generate_fn(engine: EmbeddedEngine, prompts_bp: np.ndarray, max_new_tokens: int, sample: bool):
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0 if sample else 0.0)
    prompts = prompts_bp.tolist()

    def generate():
        return np.array([s.output_ids for s in engine.generate(prompts, params)])

    return generate


def benchmark(name: str, args) -> None:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(**MODELS[name])
    torch_model = transformers.Qwen3ForCausalLM(config).float().eval()
    num_params = sum(p.numel() for p in torch_model.parameters())
    with tempfile.TemporaryDirectory() as directory:
        torch_model.save_pretrained(directory)
        engine = EmbeddedEngine(load_hf_checkpoint(directory), eos_token_ids=())
    prompts_bp = np.random.default_rng(0).integers(2, config.vocab_size, (args.batch, args.prompt)).astype(np.int32)
    tokens = args.batch * args.new_tokens
    print(f"\n{name}: Qwen3-architecture model, {num_params / 1e6:.2f}M parameters, float32, vocab "
          f"{config.vocab_size}; {args.batch} prompts x {args.prompt} tokens, {args.new_tokens} new tokens each "
          f"({tokens} per call)")
    for mode, sample in (("greedy", False), ("sampling, temperature 1", True)):
        jax_fn = jax_generate_fn(engine, prompts_bp, args.new_tokens, sample)
        torch_fn = torch_generate_fn(torch_model, prompts_bp, args.new_tokens, sample)
        start = time.perf_counter()
        jax_ids = jax_fn()
        first_call_s = time.perf_counter() - start
        torch_ids = torch_fn()
        assert jax_ids.shape == torch_ids.shape == (args.batch, args.new_tokens), (jax_ids.shape, torch_ids.shape)
        torch_s, jax_s, speedup = interleaved_times(torch_fn, jax_fn, args.repeats)
        print(f"  {mode}")
        print(f"    jax first call (compiles) {first_call_s:8.2f} s   (excluded from the timings)")
        print(f"    jax embedded, best        {jax_s:8.3f} s   {tokens / jax_s:9.0f} tokens/s")
        print(f"    transformers generate     {torch_s:8.3f} s   {tokens / torch_s:9.0f} tokens/s")
        if not sample:
            print(f"    greedy sequences identical in both: {np.mean(np.all(jax_ids == torch_ids, axis=1)):.0%}")
        print(f"    tokens/s jax / transformers: {speedup:.2f}x   (median of interleaved rounds; target >= 3 on tiny)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), action="append", help="default: all")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="8 x 32 tokens, 3 rounds")
    args = parser.parse_args()
    if args.small:
        args.batch, args.new_tokens, args.repeats = 8, 32, 3
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    transformers.utils.logging.disable_progress_bar()
    print(f"{threads} threads (jax {jax.__version__}, torch {torch.__version__}, "
          f"transformers {transformers.__version__})")
    for name in args.model or MODELS:
        benchmark(name, args)


if __name__ == "__main__":
    main()
