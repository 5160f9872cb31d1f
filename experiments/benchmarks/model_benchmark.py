"""Speed of the learner's train step against transformers/PyTorch, and memory of the chunked logprob function.

1. Throughput: one policy-gradient train step of a ~51M-parameter Qwen3-architecture model (random weights;
   vocab 32000, hidden 512, MLP 1536, 11 layers, 8 query / 4 KV heads of 64, tied embeddings; 51.0M
   parameters), batch 4 x 256 tokens (prompt 64, response 192), float32, on the CPU:
     JAX:     `train_step.make_train_step` (chunked logprobs + entropy -> PPO clip (0.2 / 0.28) -> token mean
              -> grads -> AdamW), jitted, on a 1-device mesh, no rematerialisation of the layers; timed twice:
              as configured by default (logits for every position, like the PyTorch step), and with
              `first_scored` = the prompt length (the unembedding runs on the response region only, as the
              trainer runs it; the loss is the same, since prompt tokens are not scored);
     PyTorch: transformers' Qwen3ForCausalLM with the same weights (loaded by `safetensors_io` from the same
              checkpoint), the same math: logits -> log_softmax -> gather (shifted targets), detached entropy,
              the same PPO clip and token mean, backward, grad norm, torch.optim.AdamW.
   Both see the same thread count. Rounds are interleaved (advantage_benchmark's `interleaved_times`) and the
   ratio printed is the median of the per-round time ratios, as tokens/s JAX / tokens/s PyTorch (target >= 1).
   The first step's losses are printed side by side to show the math is the same.
2. Memory: `token_logprobs_and_entropy` for B = 1, T = 8192, D = 1024, V = 151936 (Qwen3's vocabulary), hidden
   and kernel given as inputs, in float32 and in bfloat16; compiled only, never run. Its temporary bytes
   (`memory_analysis().temp_size_in_bytes`) for the forward and for value_and_grad w.r.t. hidden and kernel,
   against the float32 logits buffer T * V * 4 bytes (4.98 GB) that a full-logits implementation allocates
   (target <= 25%). Inputs and outputs (the kernel and its gradient) are not temporaries and are not counted.

    python experiments/benchmarks/model_benchmark.py            # both parts
    python experiments/benchmarks/model_benchmark.py --small    # a quick throughput run (2 layers)
"""

import argparse
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import transformers

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from advantage_benchmark import interleaved_times  # noqa: E402

from rubric_jax.core import losses  # noqa: E402
from rubric_jax.models import logprobs, sharding, train_step  # noqa: E402
from rubric_jax.models.safetensors_io import load_hf_checkpoint  # noqa: E402

EPS_LOW, EPS_HIGH, LR = 0.2, 0.28, 1e-6
QWEN3_50M = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=11,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    tie_word_embeddings=True,
    max_position_embeddings=4096,
)


def make_batch(rng: np.random.Generator, batch: int, length: int, prompt: int, vocab: int) -> dict[str, np.ndarray]:
    positions_bt = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length))
    return dict(
        tokens_bt=rng.integers(0, vocab, (batch, length)).astype(np.int32),
        positions_bt=np.ascontiguousarray(positions_bt),
        attention_mask_bt=np.ones((batch, length), bool),
        response_mask_bt=positions_bt >= prompt,
        old_logp_bt=rng.normal(-10.4, 0.05, (batch, length)).astype(np.float32),  # ~ log(1/32000) + noise
        advantages_bt=rng.normal(size=(batch, length)).astype(np.float32),
    )


def torch_step_fn(model, optimizer, batch):
    """One PyTorch train step doing the JAX step's math (see the module docstring)."""
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}
    tokens, mask = t["tokens_bt"].long(), t["response_mask_bt"][:, 1:]
    old_logp, advantages = t["old_logp_bt"][:, 1:], t["advantages_bt"][:, 1:]

    def step():
        optimizer.zero_grad(set_to_none=True)
        logits = model(input_ids=tokens, attention_mask=t["attention_mask_bt"].long()).logits[:, :-1].float()
        log_probs = torch.log_softmax(logits, dim=-1)
        logp = log_probs.gather(-1, tokens[:, 1:, None])[..., 0]
        with torch.no_grad():
            entropy = -(log_probs.exp() * log_probs).sum(-1)
        ratio = torch.exp(torch.clamp(torch.where(mask, logp - old_logp, 0), -20, 20))
        adv = torch.where(mask, advantages, 0)
        unclipped, clipped = -adv * ratio, -adv * torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH)
        count = mask.sum()
        loss = torch.where(mask, torch.maximum(unclipped, clipped), 0).sum() / count
        loss.backward()
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        optimizer.step()
        with torch.no_grad():
            clip_fraction = (mask & (clipped > unclipped)).sum() / count
            return loss.item(), grad_norm.item(), (entropy * mask).sum().item() / count.item(), clip_fraction.item()

    return step


def throughput(args) -> None:
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)  # XLA's CPU client runs one intra-op thread per core
    config = transformers.Qwen3Config(**{**QWEN3_50M, "num_hidden_layers": args.layers})
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    torch_model = transformers.Qwen3ForCausalLM(config).float()
    num_params = sum(p.numel() for p in torch_model.parameters())
    with tempfile.TemporaryDirectory() as directory:
        torch_model.save_pretrained(directory)
        model = load_hf_checkpoint(directory, shard_activations=sharding.shard_activations)
    print(f"Qwen3-architecture model, {num_params / 1e6:.1f}M parameters ({args.layers} layers), float32; "
          f"batch {args.batch} x {args.length} tokens; {threads} threads (jax {jax.__version__}, "
          f"torch {torch.__version__}, transformers {transformers.__version__})")

    batch = make_batch(np.random.default_rng(0), args.batch, args.length, args.prompt, config.vocab_size)
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    rules = sharding.partition_rules(model.config)
    optimizer = optax.adamw(LR)
    loss_fn = train_step.ratio_loss(losses.ppo_clip_loss, eps_low=EPS_LOW, eps_high=EPS_HIGH)
    device_batch = jax.device_put(batch, sharding.batch_sharding(mesh))

    def jax_step_fn(**options):
        graphdef, params, opt_state = train_step.init_train_state(model, optimizer, mesh, rules)
        params = jax.tree.map(jnp.copy, params)  # each step donates its own buffers, not the model's
        step = train_step.make_train_step(graphdef, optimizer, loss_fn, mesh=mesh, abstract_params=params,
                                          rules=rules, **options)
        state = [params, opt_state]

        def jax_step():
            state[0], state[1], metrics = step(state[0], state[1], device_batch)
            return metrics

        return jax_step

    configurations = {
        "default (every position scored)": {},
        f"first_scored={args.prompt} (no logits for the prompt region, whose tokens are not scored)":
            dict(first_scored=args.prompt),
    }
    jax_steps = {label: jax_step_fn(**options) for label, options in configurations.items()}
    torch_step = torch_step_fn(torch_model, torch.optim.AdamW(torch_model.parameters(), lr=LR, foreach=True), batch)
    all_metrics = [jax.device_get(step()) for step in jax_steps.values()]
    jax_metrics = all_metrics[0]
    assert all(abs(float(m["loss"]) - float(jax_metrics["loss"])) < 1e-5 for m in all_metrics), all_metrics
    torch_loss, torch_grad_norm, torch_entropy, torch_clip = torch_step()
    jax_loss, jax_grad_norm, jax_entropy, jax_clip = (
        float(jax_metrics[k]) for k in ("loss", "grad_norm", "entropy", "clip_fraction")
    )
    print(f"  first step (jax / torch): loss {jax_loss:+.6f} / {torch_loss:+.6f}; grad norm {jax_grad_norm:.5f} / "
          f"{torch_grad_norm:.5f}; entropy {jax_entropy:.5f} / {torch_entropy:.5f}; "
          f"clip fraction {jax_clip:.4f} / {torch_clip:.4f}")

    tokens = args.batch * args.length
    for label, jax_step in jax_steps.items():
        jax_s, torch_s, time_ratio = interleaved_times(jax_step, torch_step, args.repeats)
        print(f"  jax, {label}")
        print(f"    jax (jit), best  {jax_s * 1e3:9.1f} ms   {tokens / jax_s:9.0f} tokens/s")
        print(f"    pytorch, best    {torch_s * 1e3:9.1f} ms   {tokens / torch_s:9.0f} tokens/s")
        print(f"    throughput jax / pytorch: {1 / time_ratio:.2f}x   (target >= 1.0; median of interleaved rounds)")


def memory(args) -> None:
    length, width, vocab = args.mem_length, 1024, 151936
    full_logits = length * vocab * 4
    print(f"\nchunked logprobs + entropy, B=1 T={length} D={width} V={vocab}, chunk_size={args.chunk_size}; "
          f"full float32 logits: {full_logits / 1e9:.2f} GB (compiled only, not run)")
    targets = jax.ShapeDtypeStruct((1, length), jnp.int32)
    mask = jax.ShapeDtypeStruct((1, length), bool)

    def forward(hidden, kernel, targets, mask):
        return logprobs.token_logprobs_and_entropy(hidden, kernel, targets, mask, chunk_size=args.chunk_size)

    def forward_backward(hidden, kernel, targets, mask):
        def objective(hidden, kernel):
            logp_bt, entropy_bt = forward(hidden, kernel, targets, mask)
            return jnp.sum(logp_bt) + 0.01 * jnp.sum(entropy_bt)

        return jax.value_and_grad(objective, argnums=(0, 1))(hidden, kernel)

    for dtype in (jnp.float32, jnp.bfloat16):
        hidden = jax.ShapeDtypeStruct((1, length, width), dtype)
        kernel = jax.ShapeDtypeStruct((width, vocab), dtype)
        for name, fn in (("forward", forward), ("value_and_grad", forward_backward)):
            analysis = jax.jit(fn).lower(hidden, kernel, targets, mask).compile().memory_analysis()
            temp = analysis.temp_size_in_bytes
            print(f"  {jnp.dtype(dtype).name:8s} hidden+kernel, {name:14s} temp {temp / 1e6:8.1f} MB = "
                  f"{temp / full_logits:6.1%} of the full logits   (target <= 25%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--layers", type=int, default=QWEN3_50M["num_hidden_layers"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--mem-length", type=int, default=8192)
    parser.add_argument("--chunk-size", type=int, default=logprobs.DEFAULT_CHUNK_SIZE)
    parser.add_argument("--small", action="store_true", help="2 layers, 3 rounds")
    args = parser.parse_args()
    if args.small:
        args.layers, args.repeats = 2, 3
    throughput(args)
    memory(args)


if __name__ == "__main__":
    main()
