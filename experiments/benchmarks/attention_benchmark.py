"""The fused attention kernels against XLA's einsum attention, measured in the same process: the learner's
logprobs pass and its gradient (a masked mean of the logprobs, through a remat decoder) at long sequences, for each
kernel the backend offers ("cudnn" on a GPU, "splash" on a TPU; on a CPU only "xla", so the script has nothing to
compare there).

For each sequence length and activation dtype it prints, per kernel: the compiled gradient's temporary bytes
(`memory_analysis()`), the median wall time of the gradient and of the logprobs pass over `--repeats` calls, each
as a ratio against "xla", and the largest difference of the logprobs from "xla"'s on response tokens (float32
activations with "cudnn" are attended in bfloat16, `models.attention`). The batch has left padding (row 0), right
padding (row 1) and a gap in the prompt (row 2 if there is one).

    python experiments/benchmarks/attention_benchmark.py                         # T = 2048 and 8192
    python experiments/benchmarks/attention_benchmark.py --lengths 4096 --rows 4 --dtypes bfloat16
"""

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from rubric_jax.models.config import ModelConfig  # noqa: E402
from rubric_jax.models.decoder import Decoder  # noqa: E402
from rubric_jax.models.logprobs import sequence_logprobs  # noqa: E402
from rubric_jax.models.train_step import POLICY_INPUTS  # noqa: E402

FUSED_KERNEL = {"gpu": "cudnn", "tpu": "splash"}


def model_config(args) -> ModelConfig:
    """Qwen3's attention shapes (head width 128, grouped-query heads), few layers and a small vocabulary."""
    return ModelConfig(model_type="qwen3", vocab_size=args.vocab, hidden_size=args.hidden,
                       intermediate_size=3 * args.hidden, num_layers=args.layers, num_heads=args.hidden // 128,
                       num_kv_heads=max(1, args.hidden // 256), head_dim=128, max_position_embeddings=args.max_length)


def batch(rows: int, length: int, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    valid_bt = np.ones((rows, length), bool)
    valid_bt[0, : length // 16] = False
    if rows > 1:
        valid_bt[1, length - length // 8:] = False
    if rows > 2:  # in the prompt: a response token after a gap would be scored from a padded query's output
        valid_bt[2, length // 8: length // 8 + 64] = False
    response_bt = valid_bt & (np.arange(length) >= length // 4)
    return {"tokens_bt": rng.integers(0, vocab, (rows, length)).astype(np.int32),
            "positions_bt": np.maximum(np.cumsum(valid_bt, axis=1) - 1, 0).astype(np.int32),
            "attention_mask_bt": valid_bt, "response_mask_bt": response_bt}


def functions(config: ModelConfig, kernel: str, dtype):
    model = Decoder(config, rngs=nnx.Rngs(0), dtype=dtype, attention=kernel, remat=True)
    graphdef, params = nnx.split(model)

    def logprobs(params, inputs):
        return sequence_logprobs(nnx.merge(graphdef, params), *(inputs[key] for key in POLICY_INPUTS))[0]

    def loss(params, inputs):
        mask_bt = inputs["response_mask_bt"]
        return jnp.sum(jnp.where(mask_bt, logprobs(params, inputs), 0)) / jnp.sum(mask_bt)

    return params, jax.jit(logprobs), jax.jit(jax.grad(loss))


def median_seconds(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    args.max_length = max(args.lengths)
    platform = jax.default_backend()
    print(f"jax {jax.__version__} on {platform}: {jax.devices()[0].device_kind}")
    if platform not in FUSED_KERNEL:
        print("no fused attention kernel on this backend: nothing to compare")
        return
    config = model_config(args)
    print(f"model: {config.num_layers} layers, hidden {config.hidden_size}, {config.num_heads} heads / "
          f"{config.num_kv_heads} kv heads of 128, vocab {config.vocab_size}; {args.rows} rows, remat")
    print("T      dtype     kernel  grad temp GiB (x xla)   grad ms (x xla)   logprobs ms (x xla)   max |dlogp|")
    for length in args.lengths:
        inputs = batch(args.rows, length, config.vocab_size)
        for dtype_name in args.dtypes:
            results = {}
            for kernel in ("xla", FUSED_KERNEL[platform]):
                params, logprobs, grad = functions(config, kernel, jnp.dtype(dtype_name))
                temp = grad.lower(params, inputs).compile().memory_analysis().temp_size_in_bytes
                results[kernel] = (temp, median_seconds(grad, params, inputs, repeats=args.repeats),
                                   median_seconds(logprobs, params, inputs, repeats=args.repeats),
                                   np.asarray(logprobs(params, inputs)))
                del params
            base = results["xla"]
            for kernel, (temp, grad_s, logp_s, logp) in results.items():
                difference = np.abs(logp - base[3])[inputs["response_mask_bt"]].max()
                print(f"{length:<6} {dtype_name:<9} {kernel:<7} {temp / 2**30:8.2f} ({temp / base[0]:.2f})"
                      f"          {grad_s * 1e3:8.1f} ({grad_s / base[1]:.2f})  {logp_s * 1e3:8.1f} "
                      f"({logp_s / base[2]:.2f})        {difference:.2e}", flush=True)


if __name__ == "__main__":
    main()
