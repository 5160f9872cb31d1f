"""Which kernel computes the decoder's full-sequence causal attention, and the Pallas splash attention kernel.

Implementations (`Decoder(attention=...)`, a run's `model.attention`):
- "xla": the decoder's own einsum attention over causal query blocks (`decoder.Attention._attend`); it builds the
  float32 scores [B, KV, G, T_block, S] of each block, so its memory grows with T^2.
- "splash": the Pallas splash attention kernel (`jax.experimental.pallas.ops.tpu.splash_attention`), flash-style
  over [block_q, block_kv] tiles of a causal mask with padding as segment ids: scores never exist in HBM. A Mosaic
  kernel on TPU; on any other platform it runs in Pallas interpret mode (slow: for numerical checks on CPU).
- "auto": "splash" on TPU when the sequence is a multiple of SPLASH_BLOCK, else "xla".
The platform is the current mesh's (`jax.set_mesh`), else the default backend's, read when the step is traced: a
step compiled ahead of time for a TPU topology on a CPU host (`training.plan`) gets the TPU kernel. The KV-cache
decoding path (the embedded sampler) is always XLA's.

Axis letters as in `decoder`: b batch, t query positions, s key positions, h query heads, n key/value heads,
k head width.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

from rubric_jax.models import sharding

IMPLEMENTATIONS = ("auto", "xla", "splash")
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


def resolve(name: str, length: int) -> str:
    """The kernel ("xla" or "splash") that implementation `name` uses for a full sequence of `length` tokens on
    the current platform (module docstring). ValueError when "splash" is asked for a length it cannot tile."""
    if name == "auto":
        return "splash" if current_platform() == "tpu" and length % SPLASH_BLOCK == 0 else "xla"
    if name == "splash" and length % SPLASH_BLOCK:
        raise ValueError(f"splash attention needs a sequence length that is a multiple of {SPLASH_BLOCK}, got {length}")
    return name


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
