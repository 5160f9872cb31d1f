"""Flax NNX decoder for the Qwen3, Qwen3-MoE, Qwen2 (Qwen2.5), Llama 3 and Gemma 3 families, numerically matching
transformers' implementations.

Axis letters in array names: b batch, t query positions (the tokens of this call), s key positions (the tokens
attended to: the same T tokens without a cache, the S_max cache slots with one), d model width, h query heads,
n key/value heads, g query heads per key/value head (h = n * g), k head width, f MLP width, v vocabulary.

Conventions:
- The module tree mirrors the Hugging Face parameter names (the table in `rubric_jax/models/__init__.py`);
  kernels are [in, out], the transpose of torch's Linear weight.
- `attention_mask_bt` is 1 for real tokens and 0 for padding, anywhere in the row (left, right, or gaps).
  `positions_bt` are the RoPE positions chosen by the caller (e.g. cumsum(mask) - 1 for left padding); a padded
  token's position is irrelevant. Token ids must lie in [0, vocab_size): padding is written with a real id
  (pad_token_id or 0), since an out-of-range id embeds to NaN.
- Outputs at padded positions are finite but meaningless; padded tokens never influence real ones.
- Numerics follow transformers: RMSNorm statistics in float32 then cast to the activation dtype, attention
  logits and softmax in float32 scaled by head_dim**-0.5, RoPE angles in float32 with the rotate-half layout.
  `dtype` is the activation (compute) dtype, `param_dtype` the storage dtype of the parameters.
- Gemma 3 (`ModelConfig.gemma`): `GemmaRMSNorm` everywhere, `GemmaDecoderLayer`'s four norms, a GeLU-tanh MLP,
  embeddings times sqrt(D) (in the parameters' dtype, as transformers), queries scaled by query_pre_attn_scalar.
  Its local layers attend to the `sliding_window` slots before each query (slot distance, as transformers' cache
  positions: padding on the left never shortens a window) with their own RoPE frequencies (`local_rope_inv_freq`);
  it attends by XLA alone (the Pallas kernels have no window).
"""

import dataclasses
import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rubric_jax.models import attention, moe, ragged_decode
from rubric_jax.models.config import GLOBAL, SLIDING, LinearRopeScaling, ModelConfig

ShardActivations = Callable[[jax.Array, tuple[Optional[str], ...]], jax.Array]
# Logical axes of the residual stream, the names the sharding rules map to mesh axes.
ACTIVATION_AXES = ("batch", "seq", "embed")

# transformers' initializer_range default; random init only matters for models not loaded from a checkpoint.
_INIT = nnx.initializers.normal(stddev=0.02)


def no_sharding(x: jax.Array, logical_axes: tuple[Optional[str], ...]) -> jax.Array:
    """The default activation-sharding hook: leaves the array to the compiler."""
    del logical_axes
    return x


@functools.partial(jax.tree_util.register_dataclass, data_fields=["k_bnsk", "v_bnsk", "valid_bs", "end"],
                   meta_fields=[])
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Keys and values of every token fed so far, in fixed-size per-layer buffers.

    k_bnsk, v_bnsk: one [B, KV, S_max, hd] array per layer, head-major: the layout the attention's batched
                    matmuls read, so a decode step copies no cache. Keys are stored after RoPE (at the positions
                    given when they were fed), so a cached key never needs its position again.
    valid_bs:       [B, S_max] bool, True where a slot holds a real token (False: padding or not yet written).
    end:            int32, the next slot to write: a scalar shared by all rows, or one per row, shape [B]
                    (`init_cache(..., per_row_end=True)`: each row of a continuous-batching engine is its own
                    sequence, refilled at its own time).

    A call with T tokens writes them to slots [end, end + T) of every row (of row b: [end[b], end[b] + T)), so
    slot order is feed order and causality is slot order: the token in slot end + t attends to the valid slots
    <= end + t. Rows of different lengths are expressed by the mask alone (left padding in the prompt, or padded
    steps for finished rows). The caller keeps end + T <= S_max: past that, writes are clamped by
    `dynamic_update_slice` and overwrite the last slots (this cannot raise under jit).
    """

    k_bnsk: tuple[jax.Array, ...]
    v_bnsk: tuple[jax.Array, ...]
    valid_bs: jax.Array
    end: jax.Array

    @property
    def max_len(self) -> int:
        return self.valid_bs.shape[1]


def init_cache(
    config: ModelConfig, batch_size: int, max_len: int, dtype: jax.typing.DTypeLike = jnp.float32, *,
    per_row_end: bool = False,
) -> KVCache:
    """An empty cache of `max_len` slots per row, keys and values stored in `dtype`; `per_row_end` gives each row
    its own write position (`KVCache.end` of shape [B])."""
    shape = (batch_size, config.num_kv_heads, max_len, config.head_dim)
    return KVCache(
        k_bnsk=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
        v_bnsk=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
        valid_bs=jnp.zeros((batch_size, max_len), bool),
        end=jnp.zeros((batch_size,) if per_row_end else (), jnp.int32),
    )


def write_slots(buffer: jax.Array, update: jax.Array, end: jax.Array, axis: int) -> jax.Array:
    """`buffer` with `update` written along its slot axis `axis` from slot `end`: one start for every row (a
    scalar `end`) or one per row (`end` [B], axis 0 the rows)."""
    if end.ndim == 0:
        return jax.lax.dynamic_update_slice_in_dim(buffer, update, end, axis)
    write_row = functools.partial(jax.lax.dynamic_update_slice_in_dim, axis=axis - 1)
    return jax.vmap(write_row)(buffer, update, end)


def write_valid(valid_bs: jax.Array, valid_bt: jax.Array, end: jax.Array) -> jax.Array:
    """`valid_bs` [B, S] with the validity of this call's T tokens written from slot `end` (`write_slots`). With
    one end per row, as an elementwise select over [B, S] rather than a scatter: XLA's TPU scatter copies the
    whole mask once per row (256 MiB a decode step at 256 rows x 4096 slots, against 2 MiB for the select)."""
    if end.ndim == 0:
        return write_slots(valid_bs, valid_bt, end, axis=1)
    offset_bs = jnp.arange(valid_bs.shape[1])[None, :] - end[:, None]
    written_bs = (offset_bs >= 0) & (offset_bs < valid_bt.shape[1])
    fed_bs = jnp.take_along_axis(valid_bt, jnp.clip(offset_bs, 0, valid_bt.shape[1] - 1), axis=1)
    return jnp.where(written_bs, fed_bs, valid_bs)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["valid_bs", "start_b", "end_b"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class DecodeRows:
    """What the ragged decode kernel needs of a one-token cached step in place of a mask: the cache's validity
    after this step's write, and per row the slots [start_b, end_b) that hold its tokens (the first valid slot,
    and this step's slot + 1)."""

    valid_bs: jax.Array
    start_b: jax.Array
    end_b: jax.Array


@dataclasses.dataclass(frozen=True)
class RouterStatistics:
    """A pass's router statistics for the load-balancing loss (`moe.router_statistics`), summed over its
    `layers` mixture-of-experts layers: probs_bte (router probabilities) and assigned_bte (top-k assignments),
    float32 [B, T, E]."""

    probs_bte: jax.Array
    assigned_bte: jax.Array
    layers: int


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """[head_dim / 2] float32 inverse frequencies theta^(-2i / head_dim), with Llama 3 scaling if configured.

    Computed in float32 like transformers, so the angles match its own to the last bit or two.
    """
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if isinstance(scaling, LinearRopeScaling):
        return (inv_freq / np.float32(scaling.factor)).astype(np.float32)
    wavelen = 2 * np.pi / inv_freq
    low_freq_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_freq_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def local_rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """[head_dim / 2] float32 inverse frequencies of Gemma 3's local (sliding-window) layers: rope_local_theta,
    unscaled."""
    dim = config.head_dim
    return 1.0 / (config.rope_local_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))


def rope_cos_sin(positions_bt: jax.Array, inv_freq: np.ndarray, dtype) -> tuple[jax.Array, jax.Array]:
    """cos and sin [B, T, head_dim] of the rotation angles, in the half-split layout of `rotate_half`."""
    angles_btk = positions_bt[..., None].astype(jnp.float32) * jnp.asarray(inv_freq)
    angles_btk = jnp.concatenate([angles_btk, angles_btk], axis=-1)
    return jnp.cos(angles_btk).astype(dtype), jnp.sin(angles_btk).astype(dtype)


def apply_rope(x_bthk: jax.Array, cos_btk: jax.Array, sin_btk: jax.Array) -> jax.Array:
    """Rotates each head of x by its position: x * cos + rotate_half(x) * sin, rotate_half(a, b) = (-b, a)."""
    first, second = jnp.split(x_bthk, 2, axis=-1)
    rotated_bthk = jnp.concatenate([-second, first], axis=-1)
    return x_bthk * cos_btk[:, :, None, :] + rotated_bthk * sin_btk[:, :, None, :]


class RMSNorm(nnx.Module):
    """x / sqrt(mean(x^2) + eps) * scale over the last axis; statistics in float32, the product in `dtype`."""

    def __init__(self, dim: int, *, eps: float, dtype, param_dtype):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.scale[...].astype(self.dtype) * _rms_normalized(x, self.eps).astype(self.dtype)


def _rms_normalized(x: jax.Array, eps: float) -> jax.Array:
    """x / sqrt(mean(x^2) + eps) over the last axis, in float32."""
    x_f32 = x.astype(jnp.float32)
    return x_f32 * jax.lax.rsqrt(jnp.mean(jnp.square(x_f32), axis=-1, keepdims=True) + eps)


class GemmaRMSNorm(nnx.Module):
    """Gemma's RMSNorm (transformers' `Gemma3RMSNorm`): x / sqrt(mean(x^2) + eps) * (1 + scale), all in float32,
    then cast to `dtype`; `scale` starts at zero (the identity)."""

    def __init__(self, dim: int, *, eps: float, dtype, param_dtype):
        self.scale = nnx.Param(jnp.zeros((dim,), param_dtype))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        return (_rms_normalized(x, self.eps) * (1.0 + self.scale[...].astype(jnp.float32))).astype(self.dtype)


def norm_class(config: ModelConfig) -> type:
    return GemmaRMSNorm if config.gemma else RMSNorm


class Linear(nnx.Module):
    """y = x @ kernel (+ bias) over the last axis, kernel [in, out] in param_dtype, computed in `dtype`.

    Leading axes are flattened before the matmul: the weight gradient is then a plain 2-D [in, N] x [N, out]
    product, which XLA's CPU backend runs about 1.4x faster than the same contraction over two axes of a
    [B, T, D] input (measured by experiments/benchmarks/model_benchmark.py).
    """

    def __init__(self, in_features: int, out_features: int, *, use_bias: bool, dtype, param_dtype, rngs: nnx.Rngs,
                 kernel_init: nnx.Initializer = _INIT):
        self.kernel = nnx.Param(kernel_init(rngs.params(), (in_features, out_features), param_dtype))
        self.bias = nnx.Param(jnp.zeros((out_features,), param_dtype)) if use_bias else None
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        y_nf = x.reshape(-1, x.shape[-1]).astype(self.dtype) @ self.kernel[...].astype(self.dtype)
        if self.bias is not None:
            y_nf = y_nf + self.bias[...].astype(self.dtype)
        return y_nf.reshape(*x.shape[:-1], y_nf.shape[-1])


MIN_QUERY_BLOCK = 64
MAX_QUERY_BLOCKS = 8


def causal_query_blocks(length: int) -> list[tuple[int, int]]:
    """[start, stop) query blocks of a causal full-sequence attention: at most MAX_QUERY_BLOCKS blocks of at least
    MIN_QUERY_BLOCK positions (one block below 2 * MIN_QUERY_BLOCK). Fewer, larger blocks keep the matmuls
    efficient; more blocks skip more of the masked triangle ((n - 1) / 2n of the scores for n blocks)."""
    num_blocks = max(1, min(MAX_QUERY_BLOCKS, length // MIN_QUERY_BLOCK))
    bounds = [round(i * length / num_blocks) for i in range(num_blocks + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


class Attention(nnx.Module):
    """Grouped-query self-attention with RoPE; Qwen3 and Gemma 3 add RMSNorm on each query and key head before
    RoPE, and the projections' biases are the config's (`qkv_bias`: Qwen2 always, `o_proj_bias`). The biases are
    added before the norm and RoPE, as in transformers. Scores are scaled by `config.attention_scale`.
    `implementation` (`models.attention`) picks the full-sequence kernel; a cached one-token step (decoding) is
    XLA's over the attended slots, or the ragged Pallas kernel (`ragged_decode`) when the implementation is
    "splash" (`attention.resolve_decode`). A model with sliding-window layers attends by XLA only."""

    def __init__(self, config: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs, implementation: str = "auto"):
        width, head_dim, qkv_bias = config.hidden_size, config.head_dim, config.qkv_bias
        dtypes = dict(dtype=dtype, param_dtype=param_dtype)
        self.q_proj = Linear(width, config.num_heads * head_dim, use_bias=qkv_bias, rngs=rngs, **dtypes)
        self.k_proj = Linear(width, config.num_kv_heads * head_dim, use_bias=qkv_bias, rngs=rngs, **dtypes)
        self.v_proj = Linear(width, config.num_kv_heads * head_dim, use_bias=qkv_bias, rngs=rngs, **dtypes)
        self.o_proj = Linear(config.num_heads * head_dim, width, use_bias=config.o_proj_bias, rngs=rngs, **dtypes)
        if config.qk_norm:
            self.q_norm = norm_class(config)(head_dim, eps=config.rms_norm_eps, **dtypes)
            self.k_norm = norm_class(config)(head_dim, eps=config.rms_norm_eps, **dtypes)
        else:
            self.q_norm = self.k_norm = None
        self.num_kv_heads, self.head_dim, self.dtype = config.num_kv_heads, head_dim, dtype
        self.scale = config.attention_scale
        self.implementation = attention.check_implementation(implementation)
        if config.layer_types:
            if self.implementation not in ("auto", "xla"):
                raise ValueError(f"{config.model_type} attends by XLA only (its sliding-window layers have no Pallas "
                                 f"or cuDNN kernel here), got attention={implementation!r}")
            self.implementation = "xla"

    def __call__(
        self,
        x_btd: jax.Array,
        cos_btk: jax.Array,
        sin_btk: jax.Array,
        mask_bts: jax.Array,
        cache_kv: Optional[tuple[jax.Array, jax.Array]] = None,
        cache_end: Optional[jax.Array] = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """Returns the attention output [B, T, D] and the keys and values: this call's [B, KV, T, hd] without a
        cache, the cache buffers with this call's T entries written at `cache_end` with one. With a cache, the
        queries attend to its first S slots, S = mask_bts.shape[-1] (the decoder's `attended_slots`); or, when
        `mask_bts` is a `DecodeRows` (one token per row), each row to its own slots by the ragged kernel."""
        batch, length, _ = x_btd.shape
        q_bthk = self.q_proj(x_btd).reshape(batch, length, -1, self.head_dim)
        k_btnk = self.k_proj(x_btd).reshape(batch, length, self.num_kv_heads, self.head_dim)
        v_btnk = self.v_proj(x_btd).reshape(batch, length, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q_bthk, k_btnk = self.q_norm(q_bthk), self.k_norm(k_btnk)
        q_bthk, k_btnk = apply_rope(q_bthk, cos_btk, sin_btk), apply_rope(k_btnk, cos_btk, sin_btk)

        k_bnsk, v_bnsk = jnp.swapaxes(k_btnk, 1, 2), jnp.swapaxes(v_btnk, 1, 2)
        if cache_kv is not None:
            k_bnsk = write_slots(cache_kv[0], k_bnsk.astype(cache_kv[0].dtype), cache_end, axis=2)
            v_bnsk = write_slots(cache_kv[1], v_bnsk.astype(cache_kv[1].dtype), cache_end, axis=2)

        # Query head h uses key/value head h // g (transformers' repeat_kv), so h splits as (n, g).
        q_btngk = q_bthk.reshape(batch, length, self.num_kv_heads, -1, self.head_dim)
        if isinstance(mask_bts, DecodeRows):
            # The cache as stored (no cast: a cast would copy it whole); the kernel reads each row's own blocks.
            out_bngk = ragged_decode.ragged_decode_attention(
                q_btngk[:, 0].astype(k_bnsk.dtype), k_bnsk, v_bnsk, mask_bts.valid_bs, mask_bts.start_b,
                mask_bts.end_b)
            out_btngk = out_bngk[:, None].astype(self.dtype)
            return self.o_proj(out_btngk.reshape(batch, length, -1)), (k_bnsk, v_bnsk)
        keys_bnsk, values_bnsk = k_bnsk.astype(self.dtype), v_bnsk.astype(self.dtype)
        if cache_kv is not None:
            # A static slice the attention's fusions read in place: slots past it are never read.
            attended = mask_bts.shape[-1]
            out_btngk = self._attend(q_btngk, keys_bnsk[:, :, :attended], values_bnsk[:, :, :attended], mask_bts)
        elif (kernel := attention.resolve(self.implementation, length, head_width=self.head_dim,
                                          dtype=self.dtype)) != "xla":
            # Without a cache S = T, and the last query's row of the causal mask is every key's validity (the
            # decoder passes that row alone, [B, 1, S]).
            fused = attention.splash_attention if kernel == "splash" else attention.compacted_attention
            out_bthk = fused(q_bthk, keys_bnsk, values_bnsk, mask_bts[:, -1, :])
            out_btngk = out_bthk.reshape(q_btngk.shape)
        else:
            # Causal without a cache: the queries of block [start, stop) attend to keys [0, stop) only, which
            # skips the masked upper blocks of the score matrix (about half of the attention's matmul work).
            out_btngk = jnp.concatenate(
                [
                    self._attend(
                        q_btngk[:, start:stop],
                        keys_bnsk[:, :, :stop],
                        values_bnsk[:, :, :stop],
                        mask_bts[:, start:stop, :stop],
                    )
                    for start, stop in causal_query_blocks(length)
                ],
                axis=1,
            )
        return self.o_proj(out_btngk.reshape(batch, length, -1)), (k_bnsk, v_bnsk)

    def _attend(self, q_btngk: jax.Array, k_bnsk: jax.Array, v_bnsk: jax.Array, mask_bts: jax.Array) -> jax.Array:
        """softmax(q k * scale, masked) v [B, T, KV, G, hd]; scores in float32. Both batched matmuls take
        their operands and give their results head-major ([B, KV, ...]), the layout XLA's CPU matmul kernels
        take without a copy."""
        q_bntgk = jnp.transpose(q_btngk, (0, 2, 1, 3, 4))
        scores_bntgs = jnp.einsum(
            "bntgk,bnsk->bntgs", q_bntgk, k_bnsk, preferred_element_type=jnp.float32
        ) * self.scale
        # `where`, not an additive bias: a row with no valid key (a padded query) gets uniform weights, never NaN.
        scores_bntgs = jnp.where(mask_bts[:, None, :, None, :], scores_bntgs, jnp.finfo(jnp.float32).min)
        probs_bntgs = jax.nn.softmax(scores_bntgs, axis=-1).astype(self.dtype)
        out_bntgk = jnp.einsum("bntgs,bnsk->bntgk", probs_bntgs, v_bnsk)
        return jnp.transpose(out_bntgk, (0, 2, 1, 3, 4))


ACTIVATIONS = {"silu": jax.nn.silu, "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True)}


class MLP(nnx.Module):
    """Gated MLP: down(act(gate(x)) * up(x)), act the config's (`hidden_act`: SiLU, SwiGLU; Gemma's GeLU-tanh)."""

    def __init__(self, config: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        width, hidden = config.hidden_size, config.intermediate_size
        dtypes = dict(dtype=dtype, param_dtype=param_dtype)
        self.gate_proj = Linear(width, hidden, use_bias=False, rngs=rngs, **dtypes)
        self.up_proj = Linear(width, hidden, use_bias=False, rngs=rngs, **dtypes)
        self.down_proj = Linear(hidden, width, use_bias=False, rngs=rngs, **dtypes)
        self.activation = ACTIVATIONS[config.hidden_act]

    def __call__(self, x_btd: jax.Array) -> jax.Array:
        h_btf = self.activation(self.gate_proj(x_btd)) * self.up_proj(x_btd)
        return self.down_proj(h_btf)


class Experts(nnx.Module):
    """The experts' SwiGLU weights, stacked per expert, input dimension first (`models.moe`): gate_edf, up_edf
    [E, D, F] and down_efd [E, F, D]."""

    def __init__(self, config: ModelConfig, *, param_dtype, rngs: nnx.Rngs):
        experts, width, hidden = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_edf = nnx.Param(_INIT(rngs.params(), (experts, width, hidden), param_dtype))
        self.up_edf = nnx.Param(_INIT(rngs.params(), (experts, width, hidden), param_dtype))
        self.down_efd = nnx.Param(_INIT(rngs.params(), (experts, hidden, width), param_dtype))


class SparseMoE(nnx.Module):
    """Qwen3-MoE's mixture-of-experts MLP (transformers' `Qwen3MoeSparseMoeBlock`): a bias-free router `gate` to
    E logits, each token's top-k experts (`moe.route_top_k`, renormalised by `norm_topk_prob`), and their SwiGLU
    outputs summed with the routing weights by grouped matmuls (`moe.experts_swiglu`), in `dtype`. Returns the
    output [B, T, D] and the router logits [B, T, E] (for the load-balancing loss)."""

    def __init__(self, config: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.gate = Linear(config.hidden_size, config.num_experts, use_bias=False, dtype=dtype,
                           param_dtype=param_dtype, rngs=rngs)
        self.experts = Experts(config, param_dtype=param_dtype, rngs=rngs)
        self.top_k, self.normalize, self.dtype = config.num_experts_per_tok, config.norm_topk_prob, dtype

    def __call__(self, x_btd: jax.Array) -> tuple[jax.Array, jax.Array]:
        x_td = x_btd.reshape(-1, x_btd.shape[-1]).astype(self.dtype)
        router_logits_te = self.gate(x_td)
        weights_tk, experts_tk = moe.route_top_k(router_logits_te, self.top_k, normalize=self.normalize)
        cast = lambda param: param[...].astype(self.dtype)  # noqa: E731
        out_td = moe.experts_swiglu(x_td, weights_tk, experts_tk, cast(self.experts.gate_edf),
                                    cast(self.experts.up_edf), cast(self.experts.down_efd))
        return out_td.reshape(x_btd.shape), router_logits_te.reshape(*x_btd.shape[:-1], -1)


class DecoderLayer(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)); the MLP is a mixture of experts in the layers
    `config.sparse_layer` names (qwen3_moe)."""

    def __init__(self, config: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs, attention: str = "auto",
                 sparse: bool = False):
        dtypes = dict(dtype=dtype, param_dtype=param_dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, **dtypes)
        self.self_attn = Attention(config, rngs=rngs, implementation=attention, **dtypes)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, **dtypes)
        self.sparse = sparse
        self.mlp = SparseMoE(config, rngs=rngs, **dtypes) if sparse else MLP(config, rngs=rngs, **dtypes)

    def __call__(self, x_btd, cos_btk, sin_btk, mask_bts, cache_kv=None, cache_end=None):
        """Returns the new residual stream [B, T, D], the attention's keys and values (see `Attention`) and the
        router logits [B, T, E] of a mixture-of-experts layer (None in a dense one)."""
        attn_btd, kv = self.self_attn(self.input_layernorm(x_btd), cos_btk, sin_btk, mask_bts, cache_kv, cache_end)
        x_btd = x_btd + attn_btd
        mlp_input_btd = self.post_attention_layernorm(x_btd)
        mlp_btd, router_logits_bte = self.mlp(mlp_input_btd) if self.sparse else (self.mlp(mlp_input_btd), None)
        return x_btd + mlp_btd, kv, router_logits_bte


class GemmaDecoderLayer(nnx.Module):
    """Gemma 3's block (transformers' `Gemma3DecoderLayer`): x + post_attention_norm(attn(input_norm(x))), then
    x + post_feedforward_norm(mlp(pre_feedforward_norm(x))), every norm a `GemmaRMSNorm`. Returns what
    `DecoderLayer` returns (no router logits)."""

    def __init__(self, config: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs, attention: str = "auto"):
        dtypes = dict(dtype=dtype, param_dtype=param_dtype)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps, **dtypes))
        self.self_attn = Attention(config, rngs=rngs, implementation=attention, **dtypes)
        self.mlp = MLP(config, rngs=rngs, **dtypes)
        self.sparse = False

    def __call__(self, x_btd, cos_btk, sin_btk, mask_bts, cache_kv=None, cache_end=None):
        attn_btd, kv = self.self_attn(self.input_layernorm(x_btd), cos_btk, sin_btk, mask_bts, cache_kv, cache_end)
        x_btd = x_btd + self.post_attention_layernorm(attn_btd)
        return x_btd + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x_btd))), kv, None


def _apply_layer(layer: DecoderLayer, *args):
    return layer(*args)


# Per-layer rematerialisation: the backward pass recomputes a layer's activations from its input instead of
# keeping them, so activation memory is one residual stream per layer.
_apply_layer_remat = nnx.remat(_apply_layer)


class Decoder(nnx.Module):
    """Token embedding, `num_layers` DecoderLayers, final RMSNorm, and an unembedding (tied or `lm_head`).

    `remat=True` rematerialises each layer in the backward pass (for training). `scan_layers=True` runs a pass
    without a cache (training, logprobs) as a `lax.scan` over the layers' stacked parameters instead of one copy
    of the layer per layer in the program: the same arithmetic, compiled once (an 8B model's train step for a TPU
    pod compiles several times faster). Decoding with a cache stays unrolled. `attention` names the kernel of
    full-sequence attention (`models.attention.IMPLEMENTATIONS`; "auto" chooses by platform).
    `shard_activations(x, axes)` is called on the residual stream after the embedding and after every layer with
    ACTIVATION_AXES; the sharding code sets it (to a `with_sharding_constraint` over its mesh rules), the default
    leaves placement to XLA.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        rngs: nnx.Rngs,
        dtype: jax.typing.DTypeLike = jnp.float32,
        param_dtype: jax.typing.DTypeLike = jnp.float32,
        remat: bool = False,
        scan_layers: bool = False,
        attention: str = "auto",
        shard_activations: ShardActivations = no_sharding,
    ):
        dtypes = dict(dtype=dtype, param_dtype=param_dtype)
        self.config = config
        self.dtype = dtype
        self.remat = remat
        self.scan_layers = scan_layers
        self.shard_activations = shard_activations
        self.embed_tokens = nnx.Embed(config.vocab_size, config.hidden_size, embedding_init=_INIT, rngs=rngs, **dtypes)
        if scan_layers and len({config.sparse_layer(i) for i in range(config.num_layers)}) > 1:
            raise ValueError("scan_layers needs layers of one structure; this config mixes dense and "
                             f"mixture-of-experts layers (mlp_only_layers={config.mlp_only_layers}, "
                             f"decoder_sparse_step={config.decoder_sparse_step})")
        if config.gemma:
            layers = [GemmaDecoderLayer(config, rngs=rngs, attention=attention, **dtypes)
                      for _ in range(config.num_layers)]
        else:
            layers = [DecoderLayer(config, rngs=rngs, attention=attention, sparse=config.sparse_layer(i), **dtypes)
                      for i in range(config.num_layers)]
        self.layers = nnx.List(layers)
        self.norm = norm_class(config)(config.hidden_size, eps=config.rms_norm_eps, **dtypes)
        # Gemma's embedding scale, rounded to the parameters' dtype as transformers rounds it.
        self.embed_scale = None if config.embed_scale is None else float(np.asarray(config.embed_scale, param_dtype))
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Linear(config.hidden_size, config.vocab_size, use_bias=False, rngs=rngs, **dtypes)

    def __call__(
        self,
        tokens_bt: jax.Array,
        positions_bt: jax.Array,
        attention_mask_bt: jax.Array,
        cache: Optional[KVCache] = None,
        attended_slots: Optional[int] = None,
    ) -> tuple[jax.Array, Optional[KVCache]]:
        """Final-norm hidden states [B, T, D] in `dtype`, and the updated cache (None without one).

        Without a cache: causal attention over these T tokens. With one: the T tokens are appended to the cache
        (T = prompt length for the prefill, then T = 1 per decode step, or any T) and attend to every valid
        cached slot before them and to each other causally. `attended_slots` (static) limits the attention to the
        cache's first slots: the caller keeps every valid slot and this call's writes below it, and the step then
        reads that part of the cache alone, so a decode step's HBM traffic follows the cache in use, not its
        capacity (the embedded engine's windows). None: all of them. A one-token step by the ragged decode kernel
        (`attention.resolve_decode`) reads each row's own slots instead, and takes no window.
        """
        return self._forward(tokens_bt, positions_bt, attention_mask_bt, cache, attended_slots, keep_kv=False)[:2]

    def forward_with_router_statistics(self, tokens_bt: jax.Array, positions_bt: jax.Array,
                                       attention_mask_bt: jax.Array) -> tuple[jax.Array, RouterStatistics]:
        """The pass without a cache of `__call__` (final-norm hidden states [B, T, D]), and the router statistics
        of its mixture-of-experts layers (the learner's load-balancing loss). ValueError for a dense model."""
        if not any(layer.sparse for layer in self.layers):
            raise ValueError(f"a {self.config.model_type} model has no router: router statistics need a "
                             "mixture of experts (qwen3_moe)")
        hidden_btd, _, router = self._forward(tokens_bt, positions_bt, attention_mask_bt, None, None, keep_kv=False,
                                              router_statistics=True)
        return hidden_btd, router

    def prefill(self, tokens_bt: jax.Array, positions_bt: jax.Array,
                attention_mask_bt: jax.Array) -> tuple[jax.Array, KVCache]:
        """Final-norm hidden states [B, T, D] and the cache these T tokens leave: T slots holding their keys and
        values, end T. The same as `__call__` with an empty T-slot cache, but computed by the pass without one
        (causal attention by the full-sequence kernel: splash on TPU, cuDNN on GPU, XLA's causal query blocks),
        so a long prompt's prefill never builds its [B, T, T] scores at once. Layers run unrolled."""
        return self._forward(tokens_bt, positions_bt, attention_mask_bt, None, None, keep_kv=True)[:2]

    def _forward(self, tokens_bt, positions_bt, attention_mask_bt, cache, attended_slots, *, keep_kv: bool,
                 router_statistics: bool = False):
        """(hidden_btd, cache, RouterStatistics or None); the router's only with `router_statistics`."""
        length = tokens_bt.shape[1]
        valid_bt = attention_mask_bt.astype(bool)
        x_btd = self.embed_tokens(tokens_bt)
        if self.embed_scale is not None:
            x_btd = x_btd * jnp.asarray(self.embed_scale, x_btd.dtype)
        x_btd = self.shard_activations(x_btd, ACTIVATION_AXES)
        cos_btk, sin_btk = rope_cos_sin(positions_bt, rope_inv_freq(self.config), self.dtype)

        if cache is None:
            valid_bs, slot_bt, end = valid_bt, jnp.arange(length)[None, :], None
        else:
            valid_bs = write_valid(cache.valid_bs, valid_bt, cache.end)
            # [1, T] with a shared end, [B, T] with one per row.
            slot_bt, end = jnp.atleast_1d(cache.end)[:, None] + jnp.arange(length), cache.end
        if cache is not None and length == 1 and self.decodes_ragged():
            end_b = jnp.broadcast_to(cache.end + 1, valid_bs.shape[:1])
            mask_bts = DecodeRows(valid_bs=valid_bs, start_b=jnp.argmax(valid_bs, axis=1).astype(jnp.int32),
                                  end_b=end_b)
        elif cache is None and self._fused_attention(length):
            # A fused kernel reads only each key's validity (the last query's row of the causal mask), so the
            # [B, T, T] mask is never built: a loop over scanned layers would keep it as a constant.
            mask_bts = valid_bt[:, None, :]
        else:
            attended_bs = valid_bs if attended_slots is None else valid_bs[:, :attended_slots]
            slot_s = jnp.arange(attended_bs.shape[1])
            mask_bts = attended_bs[:, None, :] & (slot_s[None, None, :] <= slot_bt[:, :, None])
        # Each kind of layer's (cos, sin, mask): Gemma's local layers rotate by their own frequencies and see
        # only the `sliding_window` slots up to their query's (only the XLA path, above, runs for them).
        layer_inputs = {GLOBAL: (cos_btk, sin_btk, mask_bts)}
        if SLIDING in self.config.layer_types:
            local_mask_bts = mask_bts & (slot_bt[:, :, None] - slot_s[None, None, :] < self.config.sliding_window)
            layer_inputs[SLIDING] = (*rope_cos_sin(positions_bt, local_rope_inv_freq(self.config), self.dtype),
                                     local_mask_bts)

        router = self._no_router_statistics(x_btd.shape[:2]) if router_statistics else None
        if cache is None and self.scan_layers and not keep_kv:
            x_btd, router = self._scanned_layers(x_btd, layer_inputs, router)
            return self.norm(x_btd), None, router
        apply_layer = _apply_layer_remat if self.remat else _apply_layer
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            cache_kv = None if cache is None else (cache.k_bnsk[i], cache.v_bnsk[i])
            inputs = layer_inputs[SLIDING if self.config.sliding_layer(i) else GLOBAL]
            x_btd, (k_bnsk, v_bnsk), router_logits_bte = apply_layer(layer, x_btd, *inputs, cache_kv, end)
            x_btd = self.shard_activations(x_btd, ACTIVATION_AXES)
            router = self._add_router_statistics(router, router_logits_bte)
            keys.append(k_bnsk)
            values.append(v_bnsk)
        hidden_btd = self.norm(x_btd)

        if cache is not None:
            cache = KVCache(k_bnsk=tuple(keys), v_bnsk=tuple(values), valid_bs=valid_bs, end=cache.end + length)
        elif keep_kv:
            cache = KVCache(k_bnsk=tuple(keys), v_bnsk=tuple(values), valid_bs=valid_bt, end=jnp.int32(length))
        return hidden_btd, cache, router

    def _no_router_statistics(self, batch_shape: tuple[int, int]) -> RouterStatistics:
        zeros_bte = jnp.zeros((*batch_shape, self.config.num_experts), jnp.float32)
        return RouterStatistics(probs_bte=zeros_bte, assigned_bte=zeros_bte, layers=0)

    def _add_router_statistics(self, router: Optional[RouterStatistics],
                               router_logits_bte: Optional[jax.Array]) -> Optional[RouterStatistics]:
        """`router` plus one layer's statistics (unchanged when not collecting, or for a dense layer)."""
        if router is None or router_logits_bte is None:
            return router
        probs_bte, assigned_bte = moe.router_statistics(router_logits_bte, self.config.num_experts_per_tok)
        return RouterStatistics(probs_bte=router.probs_bte + probs_bte,
                                assigned_bte=router.assigned_bte + assigned_bte, layers=router.layers + 1)

    def _fused_attention(self, length: int) -> bool:
        """Whether the layers attend to a full sequence of `length` tokens with a fused kernel (not "xla")."""
        attend = self.layers[0].self_attn
        return attention.resolve(attend.implementation, length, head_width=attend.head_dim, dtype=self.dtype) != "xla"

    def decodes_ragged(self) -> bool:
        """Whether a cached one-token step attends by the ragged decode kernel (`attention.resolve_decode`), which
        reads each row's own slots and takes no `attended_slots` window."""
        return attention.resolve_decode(self.layers[0].self_attn.implementation) == "ragged"

    def _scanned_layers(self, x_btd, layer_inputs: dict[str, tuple[jax.Array, jax.Array, jax.Array]],
                        router: Optional[RouterStatistics]) -> tuple[jax.Array, Optional[RouterStatistics]]:
        """The residual stream after every layer, as a `lax.scan` over the layers' stacked parameters (the
        class docstring's `scan_layers`); each step rebuilds one layer from its slice of them, and takes its
        kind's (cos, sin, mask) by a per-layer flag (Gemma's local layers). `router`, when collecting,
        accumulates in the loop's carry."""
        graphdef, _ = nnx.split(self.layers[0])
        stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *(nnx.state(layer) for layer in self.layers))
        sliding_l = jnp.array([self.config.sliding_layer(i) for i in range(len(self.layers))])
        sums = None if router is None else (router.probs_bte, router.assigned_bte)

        def step(carry, layer):
            x_btd, sums = carry
            layer_state, sliding = layer
            inputs = layer_inputs[GLOBAL]
            if SLIDING in layer_inputs:
                inputs = jax.tree.map(lambda local, full: jnp.where(sliding, local, full), layer_inputs[SLIDING],
                                      inputs)
            x_btd, _, router_logits_bte = nnx.merge(graphdef, layer_state)(x_btd, *inputs, None, None)
            if sums is not None:
                layer_sums = moe.router_statistics(router_logits_bte, self.config.num_experts_per_tok)
                sums = jax.tree.map(jnp.add, sums, layer_sums)
            return (self.shard_activations(x_btd, ACTIVATION_AXES), sums), None

        x_btd, sums = jax.lax.scan(jax.checkpoint(step) if self.remat else step, (x_btd, sums),
                                   (stacked, sliding_l))[0]
        if router is None:
            return x_btd, None
        return x_btd, RouterStatistics(probs_bte=sums[0], assigned_bte=sums[1], layers=len(self.layers))

    def unembed_kernel(self) -> jax.Array:
        """[D, V] in param_dtype: the embedding's transpose when tied, else lm_head's kernel."""
        if self.lm_head is None:
            return self.embed_tokens.embedding[...].T
        return self.lm_head.kernel[...]

    def logits(self, hidden_btd: jax.Array) -> jax.Array:
        """float32 logits [..., V] of hidden states [..., D] (any leading axes, e.g. a chunk of the sequence)."""
        kernel_dv = self.unembed_kernel().astype(self.dtype)
        return jnp.einsum("...d,dv->...v", hidden_btd.astype(self.dtype), kernel_dv, preferred_element_type=jnp.float32)
