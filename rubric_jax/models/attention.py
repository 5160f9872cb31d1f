"""Which kernel computes the decoder's full-sequence causal attention: the Pallas splash attention kernel on TPU,
cuDNN's fused attention on GPU, XLA's einsums anywhere.

Implementations (`Decoder(attention=...)`, a run's `model.attention`):
- "xla": the decoder's own einsum attention over causal query blocks (`decoder.Attention._attend`); it builds the
  float32 scores [B, KV, G, T_block, S] of each block, so its memory grows with T^2.
- "splash": the Pallas splash attention kernel (`jax.experimental.pallas.ops.tpu.splash_attention`), flash-style
  over [block_q, block_kv] tiles of a causal mask with padding as segment ids: scores never exist in HBM. A Mosaic
  kernel on TPU; on any other platform it runs in Pallas interpret mode (slow: for numerical checks on CPU).
- "cudnn": cuDNN's fused flash attention (`jax.nn.dot_product_attention(implementation="cudnn")`, CUDA GPUs only),
  causal with padding given as sequence lengths: each row's real tokens are moved to its front first
  (`compacted_attention`). cuDNN takes 16-bit operands only: float32 activations (a run's policy) are attended in
  bfloat16 and cast back, which moves logprobs by about bfloat16's precision; head width <= 128 (256 on Hopper) and
  a multiple of 8.
- "auto": "splash" on TPU when the sequence is a multiple of SPLASH_BLOCK; "cudnn" on GPU when the activations are
  already 16-bit (never a silent precision change) and the head width suits it; else "xla".
The platform is the current mesh's (`jax.set_mesh`), else the default backend's, read when the step is traced: a
step compiled ahead of time for a TPU topology on a CPU host (`training.plan`) gets the TPU kernel.

Decoding (a cached one-token step, the embedded sampler) has its own choice (`resolve_decode`): "splash" asks for
the Pallas kernels, and a decode step then runs the ragged decode kernel (`ragged_decode`: each row reads its
own cache blocks; interpret mode off TPU); every other implementation, "auto" included, decodes by XLA's einsums
over the engine's attention window. "auto" keeps XLA's because that path's bytes are measured against the
roofline in the compiled program (1.19x at the README's figures) while the kernel's step time on a chip, where
each grid step's fixed cost counts at decode sizes, has not been measured yet.

Axis letters as in `decoder`: b batch, t query positions, s key positions, h query heads, n key/value heads,
k head width.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

from rubric_jax.models import sharding

IMPLEMENTATIONS = ("auto", "xla", "splash", "cudnn")
# splash's tile along queries and keys; the sequence must be a multiple of it.
SPLASH_BLOCK = 128


def check_implementation(name: str) -> str:
    """`name` if it is one of IMPLEMENTATIONS; ValueError naming them otherwise."""
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention implementation {name!r}; expected one of {IMPLEMENTATIONS}")
    return name


def current_platform() -> str:
    """The platform a traced computation is for: the current mesh's devices', else the default backend."""
    mesh = jax.sharding.get_abstract_mesh()
    return jax.default_backend() if mesh.empty else mesh.abstract_device.platform


def _cudnn_head_width_fits(head_width: int) -> bool:
    # cuDNN's flash attention: a multiple of 8, at most 128 (256 from Hopper on; 128 is safe on every GPU).
    return head_width % 8 == 0 and head_width <= 128


def resolve(name: str, length: int, *, head_width: int, dtype) -> str:
    """The kernel ("xla", "splash" or "cudnn") that implementation `name` uses for a full sequence of `length`
    tokens of heads `head_width` wide, activations of `dtype`, on the current platform (module docstring).
    ValueError when "splash" is asked for a length it cannot tile, or "cudnn" for a head width it cannot take."""
    if name == "auto":
        platform = current_platform()
        if platform == "tpu" and length % SPLASH_BLOCK == 0:
            return "splash"
        if platform in ("gpu", "cuda") and jnp.dtype(dtype).itemsize == 2 and _cudnn_head_width_fits(head_width):
            return "cudnn"
        return "xla"
    if name == "splash" and length % SPLASH_BLOCK:
        raise ValueError(f"splash attention needs a sequence length that is a multiple of {SPLASH_BLOCK}, got {length}")
    if name == "cudnn" and not _cudnn_head_width_fits(head_width):
        raise ValueError(f"cudnn attention needs a head width that is a multiple of 8 and at most 128, "
                         f"got {head_width}")
    return name


def resolve_decode(name: str) -> str:
    """The kernel of a cached one-token step under implementation `name`: "ragged" for "splash", else "xla"
    (module docstring)."""
    return "ragged" if check_implementation(name) == "splash" else "xla"


def _splash_kernel(num_heads: int, length: int, interpret: bool) -> splash.SplashAttentionKernel:
    mask = splash_mask.MultiHeadMask([splash_mask.CausalMask((length, length))] * num_heads)
    block = SPLASH_BLOCK
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                              block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def _splash_local(q_bhtk: jax.Array, k_bnsk: jax.Array, v_bnsk: jax.Array, segment_bt: jax.Array,
                  interpret: bool) -> jax.Array:
    kernel = _splash_kernel(q_bhtk.shape[1], q_bhtk.shape[2], interpret)
    attend = jax.vmap(lambda q, k, v, segment: kernel(q, k, v, segment_ids=splash.SegmentIds(segment, segment)))
    return attend(q_bhtk, k_bnsk, v_bnsk, segment_bt)


def splash_attention(q_bthk: jax.Array, k_bnsk: jax.Array, v_bnsk: jax.Array, valid_bt: jax.Array) -> jax.Array:
    """Causal grouped-query attention softmax(q k / sqrt(k_width), masked) v [B, T, H, k] by the splash kernel.

    q_bthk after RoPE; k_bnsk, v_bnsk [B, KV, T, k] (H a multiple of KV: query head h reads key/value head
    h // (H / KV)); valid_bt [B, T] 1 for real tokens. A real query attends to the real keys at or before it, as
    in the XLA path; a padded query attends to the padded keys at or before it (its output is meaningless either
    way). Under a mesh, the kernel runs per shard (`shard_map`): rows split like the batch, heads over "tensor"
    when it divides the key/value heads.
    """
    q_bhtk = jnp.swapaxes(q_bthk * jnp.asarray(q_bthk.shape[-1] ** -0.5, q_bthk.dtype), 1, 2)
    segment_bt = valid_bt.astype(jnp.int32)
    local = functools.partial(_splash_local, interpret=current_platform() != "tpu")
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        axis_sizes = dict(mesh.shape)
        heads_spec = sharding.fit_spec((sharding.BATCH_AXES, "tensor", None, None), k_bnsk.shape, axis_sizes)
        rows_spec = jax.sharding.PartitionSpec(heads_spec[0], None)
        local = jax.shard_map(local, mesh=mesh, in_specs=(heads_spec, heads_spec, heads_spec, rows_spec),
                              out_specs=heads_spec, check_vma=False)
    return jnp.swapaxes(local(q_bhtk, k_bnsk, v_bnsk, segment_bt), 1, 2)


def _compacted_local(q_bthk: jax.Array, k_bnsk: jax.Array, v_bnsk: jax.Array, valid_bt: jax.Array,
                     implementation: str) -> jax.Array:
    # A stable sort of each row by padding moves its real tokens to the front in their order, so causality among
    # them is unchanged and the padding becomes the sequence lengths the kernel understands.
    order_bt = jnp.argsort(~valid_bt, axis=1, stable=True)
    restore_bt = jnp.argsort(order_bt, axis=1)
    # At least 1: a row of padding only (rows added to fill a batch) attends to one key, never to none.
    lengths_b = jnp.maximum(valid_bt.sum(axis=1), 1).astype(jnp.int32)

    def by_rows(x_btnk, index_bt):
        return jnp.take_along_axis(x_btnk, index_bt[:, :, None, None], axis=1)

    # cuDNN takes 16-bit operands only.
    attended_dtype = jnp.bfloat16 if implementation == "cudnn" and jnp.dtype(q_bthk.dtype).itemsize != 2 \
        else q_bthk.dtype
    q, k, v = (by_rows(x_btnk, order_bt).astype(attended_dtype)
               for x_btnk in (q_bthk, jnp.swapaxes(k_bnsk, 1, 2), jnp.swapaxes(v_bnsk, 1, 2)))
    out_bthk = jax.nn.dot_product_attention(q, k, v, is_causal=True, query_seq_lengths=lengths_b,
                                            key_value_seq_lengths=lengths_b, implementation=implementation)
    return by_rows(out_bthk, restore_bt).astype(q_bthk.dtype)


def compacted_attention(q_bthk: jax.Array, k_bnsk: jax.Array, v_bnsk: jax.Array, valid_bt: jax.Array, *,
                        implementation: str = "cudnn") -> jax.Array:
    """Causal grouped-query attention softmax(q k / sqrt(k_width), masked) v [B, T, H, k] by
    `jax.nn.dot_product_attention(implementation=...)` ("cudnn" on GPU; "xla" runs the same arrangement anywhere,
    for checks on CPU), whose padding masks are sequence lengths (real tokens first).

    Shapes as in `splash_attention`; valid_bt [B, T] 1 for real tokens, anywhere in the row (left, right or gaps).
    Each row's real tokens are gathered to its front in order (a stable argsort), attended with causal and length
    masks, and scattered back, so a real query attends to exactly the real keys at or before it, as in the XLA
    path; a padded query's output is meaningless but finite. For "cudnn", operands are cast to bfloat16 unless
    already 16-bit (cuDNN's requirement), and the output back to q's dtype. Under a mesh the kernel runs per shard
    (`shard_map`), as splash does."""
    local = functools.partial(_compacted_local, implementation=implementation)
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        heads_spec = sharding.fit_spec((sharding.BATCH_AXES, "tensor", None, None), k_bnsk.shape, dict(mesh.shape))
        rows, heads = heads_spec[0], heads_spec[1]
        P = jax.sharding.PartitionSpec
        local = jax.shard_map(local, mesh=mesh, in_specs=(P(rows, None, heads, None), heads_spec, heads_spec,
                                                          P(rows, None)),
                              out_specs=P(rows, None, heads, None), check_vma=False)
    return local(q_bthk, k_bnsk, v_bnsk, valid_bt.astype(bool))
