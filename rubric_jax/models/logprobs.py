"""Per-token log-probabilities and entropies of a decoder's tokens, in float32, never materialising [B, T, V].

Conventions:
- `hidden_btd` are the decoder's final-norm hidden states [B, T, D] and `unembed_kernel_dv` its unembedding
  [D, V] (`Decoder.unembed_kernel()`), so logits = hidden @ kernel. Either may be bfloat16 or float32: the
  matmul runs in the hidden states' (compute) dtype and accumulates in float32 (`preferred_element_type`),
  and everything after it (max, logsumexp, softmax sums) runs in float32. Returned arrays are float32 [B, T].
- Chunked along the sequence: one step of a `lax.map` computes the logits of `chunk_size` positions of
  every row, [B, chunk_size, V] (on a mesh, per device: its rows and its vocabulary shard). Chunks run
  along T, not over the flattened B * T tokens, so the batch axis keeps its data sharding and every device
  works on every chunk; T is padded up to a multiple of chunk_size, the padding's results are dropped.
- The backward recomputes each chunk's logits too (the chunk has a custom VJP whose residuals are its inputs
  and two floats per token, logsumexp and E_p[logit]), so the gradient w.r.t. hidden and kernel never holds
  [B, T, V] either. Deriving the logits' cotangent by hand, in one elementwise pass, rather than by autodiff
  through a `jax.checkpoint`ed chunk keeps two [B, chunk_size, V] buffers alive in the backward instead of
  five, and is ~30% faster on the CPU. The kernel's gradient is summed over chunks in the kernel's dtype:
  pass the float32 parameter, not a bfloat16 copy, for a float32 sum.
- `mask_bt` marks the tokens to score: elsewhere logp and entropy are 0 and the hidden state gets no gradient;
  the masked positions' hidden states and targets are replaced before use, so padding values (NaN,
  out-of-range ids such as -1) are harmless.
- `temperature` (a static Python float) divides the logits, as the rollout engine did when sampling (verl's
  logits / temperature), so that the learner's logprobs are those of the sampling distribution.
"""

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from rubric_jax.models.sharding import shard_activations

DEFAULT_CHUNK_SIZE = 256


def _chunk_logits(hidden_bcd: jax.Array, kernel_dv: jax.Array, temperature: float) -> jax.Array:
    """float32 logits / temperature [B, C, V]; the matmul runs in the hidden states' (compute) dtype."""
    logits_bcv = jnp.einsum(
        "bcd,dv->bcv", hidden_bcd, kernel_dv.astype(hidden_bcd.dtype), preferred_element_type=jnp.float32
    )
    return shard_activations(logits_bcv / temperature, ("batch", "seq", "vocab"))


def _one_hot_mask(targets_bc: jax.Array, vocab_size: int) -> jax.Array:
    # The target's logit is read by a masked reduction over V, not a gather: with V sharded over "tensor" that
    # is a local partial sum plus an all-reduce, where a gather would all-gather the logits.
    return jnp.arange(vocab_size, dtype=targets_bc.dtype) == targets_bc[..., None]


def _chunk_forward(hidden_bcd, kernel_dv, targets_bc, temperature):
    """(logp, entropy) [B, C] of one chunk, and the statistics its backward needs: logsumexp and E_p[logit]."""
    logits_bcv = _chunk_logits(hidden_bcd, kernel_dv, temperature)
    max_bc = jnp.max(logits_bcv, axis=-1)
    # Shifted by the max: exp stays finite, and E_p[logit] is formed from small numbers (no cancellation).
    shifted_bcv = logits_bcv - max_bc[..., None]
    exp_bcv = jnp.exp(shifted_bcv)
    sum_exp_bc = jnp.sum(exp_bcv, axis=-1)
    shifted_mean_bc = jnp.sum(exp_bcv * shifted_bcv, axis=-1) / sum_exp_bc
    shifted_target_bc = jnp.sum(jnp.where(_one_hot_mask(targets_bc, logits_bcv.shape[-1]), shifted_bcv, 0), axis=-1)
    log_sum_exp_bc = jnp.log(sum_exp_bc)
    stats = (log_sum_exp_bc + max_bc, shifted_mean_bc + max_bc)
    return (shifted_target_bc - log_sum_exp_bc, log_sum_exp_bc - shifted_mean_bc), stats


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _chunk_logprobs_and_entropy(hidden_bcd, kernel_dv, targets_bc, temperature):
    return _chunk_forward(hidden_bcd, kernel_dv, targets_bc, temperature)[0]


def _chunk_fwd(hidden_bcd, kernel_dv, targets_bc, temperature):
    outputs, stats = _chunk_forward(hidden_bcd, kernel_dv, targets_bc, temperature)
    # Residuals are the inputs and two floats per token, not the logits: the backward recomputes them.
    return outputs, (hidden_bcd, kernel_dv, targets_bc, stats)


def _chunk_bwd(temperature, residuals, cotangents):
    """With z = logits / temperature, p = softmax(z): d logp / dz = onehot - p, d H / dz = -p (z - E_p[z]); so
    dz = g_logp onehot - p (g_logp + g_H (z - E_p[z])), formed in one elementwise pass over recomputed logits."""
    hidden_bcd, kernel_dv, targets_bc, (log_sum_exp_bc, mean_bc) = residuals
    g_logp_bc, g_entropy_bc = cotangents
    logits_bcv = _chunk_logits(hidden_bcd, kernel_dv, temperature)
    probs_bcv = jnp.exp(logits_bcv - log_sum_exp_bc[..., None])
    weight_bcv = g_logp_bc[..., None] + g_entropy_bc[..., None] * (logits_bcv - mean_bc[..., None])
    one_hot_bcv = _one_hot_mask(targets_bc, logits_bcv.shape[-1])
    d_logits_bcv = (jnp.where(one_hot_bcv, g_logp_bc[..., None], 0) - probs_bcv * weight_bcv) / temperature
    # Both products in the compute dtype with float32 accumulation, as autodiff of the forward matmul would do.
    d_logits_bcv = d_logits_bcv.astype(hidden_bcd.dtype)
    kernel_dv_compute = kernel_dv.astype(hidden_bcd.dtype)
    d_hidden_bcd = jnp.einsum("bcv,dv->bcd", d_logits_bcv, kernel_dv_compute, preferred_element_type=jnp.float32)
    d_kernel_dv = jnp.einsum("bcd,bcv->dv", hidden_bcd, d_logits_bcv, preferred_element_type=jnp.float32)
    return d_hidden_bcd.astype(hidden_bcd.dtype), d_kernel_dv.astype(kernel_dv.dtype), None


_chunk_logprobs_and_entropy.defvjp(_chunk_fwd, _chunk_bwd)


def token_logprobs_and_entropy(
    hidden_btd: jax.Array,
    unembed_kernel_dv: jax.Array,
    targets_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """log p(targets_bt[b, t] | hidden_btd[b, t]) and the entropy of that distribution, float32 [B, T] each.

    Row b, position t is scored from hidden_btd[b, t] (no shift here; `sequence_logprobs` does the
    next-token alignment). `chunk_size` (static) is the number of positions per chunk: each step holds
    [B, chunk_size, V] float32 logits. 0 (and no gradient) where `mask_bt` is False. See the module docstring.
    """
    batch, length, _ = hidden_btd.shape
    chunk_size = min(chunk_size, length)
    num_chunks = -(-length // chunk_size)
    pad = num_chunks * chunk_size - length
    mask_bt = mask_bt.astype(bool)
    # Masked positions score token 0 from a zero hidden state: padding values reach no value or gradient.
    hidden_btd = jnp.where(mask_bt[..., None], hidden_btd, 0)
    targets_bt = jnp.where(mask_bt, targets_bt, 0)

    def chunked(x_bt):  # [B, T, ...] -> [num_chunks, B, chunk_size, ...], padded with zeros
        x_bt = jnp.pad(x_bt, [(0, 0), (0, pad)] + [(0, 0)] * (x_bt.ndim - 2))
        return jnp.moveaxis(x_bt.reshape(batch, num_chunks, chunk_size, *x_bt.shape[2:]), 1, 0)

    def body(xs):
        hidden_bcd, targets_bc = xs
        return _chunk_logprobs_and_entropy(hidden_bcd, unembed_kernel_dv, targets_bc, temperature)

    logp_nbc, entropy_nbc = jax.lax.map(body, (chunked(hidden_btd), chunked(targets_bt)))

    def unchunked(x_nbc):
        x_bt = jnp.moveaxis(x_nbc, 0, 1).reshape(batch, num_chunks * chunk_size)[:, :length]
        return jnp.where(mask_bt, x_bt, 0)

    return unchunked(logp_nbc), unchunked(entropy_nbc)


def sequence_logprobs(
    model: nnx.Module,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    attention_mask_bt: jax.Array,
    response_mask_bt: jax.Array,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
    first_scored: int = 1,
) -> tuple[jax.Array, jax.Array]:
    """Runs the decoder and scores each token given the tokens before it: (logp_bt, entropy_bt), float32 [B, T].

    Alignment: the outputs are aligned with the *target* tokens, i.e. logp_bt[b, t] = log p(tokens_bt[b, t] |
    tokens_bt[b, :t]), computed from the hidden state at position t - 1, and entropy_bt[b, t] is the entropy
    of that same next-token distribution. So `response_mask_bt` (True on response tokens) applies directly,
    as the rollout engine's per-token logprobs do. Position 0 has no preceding token: its outputs are 0
    whatever the mask says (a response always follows a prompt, so it is never a response token).
    Outputs are 0 wherever `response_mask_bt` is False.

    `first_scored` (static, 1 <= first_scored <= T): positions before it are not scored at all (outputs 0, no
    logits computed). With prompts left-padded to a common width P and responses after them, first_scored = P
    computes the unembedding for the response region only, the same results on every response token.
    """
    hidden_btd, _ = model(tokens_bt, positions_bt, attention_mask_bt)
    return hidden_logprobs(model, hidden_btd, tokens_bt, response_mask_bt, chunk_size=chunk_size,
                           temperature=temperature, first_scored=first_scored)


def hidden_logprobs(
    model: nnx.Module,
    hidden_btd: jax.Array,
    tokens_bt: jax.Array,
    response_mask_bt: jax.Array,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
    first_scored: int = 1,
) -> tuple[jax.Array, jax.Array]:
    """`sequence_logprobs` from the decoder's final-norm hidden states of the same tokens, for a caller that runs
    the decoder itself (the learner's pass that also collects router statistics)."""
    length = tokens_bt.shape[1]
    if not 1 <= first_scored <= length:
        raise ValueError(f"first_scored must be in [1, T = {length}], got {first_scored}")
    # Score position t's hidden state against token t + 1 (predictor-aligned), then shift the results right by
    # one: slicing the targets instead of the hidden states avoids copying [B, T - 1, D] (first_scored = 1).
    next_mask_bt = jnp.pad(response_mask_bt[:, first_scored:].astype(bool), ((0, 0), (0, 1)))
    next_tokens_bt = jnp.pad(tokens_bt[:, first_scored:], ((0, 0), (0, 1)))
    logp_bt, entropy_bt = token_logprobs_and_entropy(
        hidden_btd[:, first_scored - 1:],
        model.unembed_kernel(),
        next_tokens_bt,
        next_mask_bt,
        chunk_size=chunk_size,
        temperature=temperature,
    )

    def to_targets(x_bt):
        return jnp.pad(x_bt[:, :-1], ((0, 0), (first_scored, 0)))

    return to_targets(logp_bt), to_targets(entropy_bt)
