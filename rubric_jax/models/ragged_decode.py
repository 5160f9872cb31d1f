"""Ragged decode attention: one query token per row against a KV cache, reading only the cache blocks that hold
the row's tokens (a Pallas TPU kernel; Pallas interpret mode elsewhere, for checks on CPU).

A decoding row b attends to the valid slots in [start_b, end_b) of its cache (the embedded engine's slots: a
left-padded prompt, then the response). The XLA path (`decoder.Attention._attend`) reads the slots of a static
window shared by all rows; this kernel reads, per row, the blocks of BLOCK_SLOTS slots that overlap its own
range, so a decode step's HBM traffic is each row's own length rounded up to a block, whatever the mix of lengths.

Grid (rows, cache blocks). A block's index map clamps the block index into the row's range, so the grid steps
outside it ask for the block already in VMEM and the pipeline skips their copy; their compute is skipped by
`pl.when`. Each grid step holds every key/value head of its row's block (one program per row and block, not per
head: fewer grid steps, whose fixed cost is the kernel's overhead at decode sizes). Scores and the online
softmax (flash attention's running max and sum) are float32; probabilities are cast to the values' dtype for
their matmul, which accumulates in float32; the output is normalised once at the end.

Costs, by construction (not yet measured on a chip): a row reads its range rounded out to whole blocks, about one
block more than its tokens on average (a left-padded prompt starts anywhere in a block); the grid has rows x
S / block steps per layer, each with Pallas' fixed per-step cost (about 0.35 us on TPU), whether or not it copies.
At a Qwen3-8B shard's decode shape (128 rows, 2 key/value heads, 4096 slots, blocks of 512) that is about 1024
steps per layer, 13 ms of overhead per step against 5 ms to read the weights and the cache in use at v5p's
bandwidth; XLA's window reads less when the rows' lengths are alike. So the kernel is an opt-in
(`attention.resolve_decode`): it wins where rows' lengths differ widely, and more rows per grid step (a group
sharing a block range) is the way to cut its overhead.

Conventions: softmax scale 1 / sqrt(head width); a slot counts when valid_bs holds and start_b <= s < end_b; a
row with no such slot (a padded or finished row) gets zeros (the XLA path gives the mean of its values; either is
discarded by the engine). Axis letters as in `decoder`: b rows, n key/value heads, g query heads per key/value
head, s slots, k head width.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from rubric_jax.models import attention, sharding

BLOCK_SLOTS = 512


def block_slots(num_slots: int) -> int:
    """The kernel's block along the cache: the largest common divisor of the cache's slots and BLOCK_SLOTS (a
    power of two), so blocks tile the cache; the engine's caches (a prompt bucket plus a budget bucket, each a
    power of two of at least 16) get BLOCK_SLOTS or a power of two below it."""
    return math.gcd(num_slots, BLOCK_SLOTS)


def _kernel(start_ref, end_ref, q_ref, k_ref, v_ref, valid_ref, out_ref, max_ref, sum_ref, acc_ref, *, block: int):
    row, step = pl.program_id(0), pl.program_id(1)
    start, end = start_ref[row], end_ref[row]
    scale = q_ref.shape[-1] ** -0.5

    @pl.when(step == 0)
    def _init():
        max_ref[...] = jnp.full(max_ref.shape, -jnp.inf, jnp.float32)
        sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when((step * block < end) & ((step + 1) * block > start))
    def _attend_block():
        slot_1s = step * block + jax.lax.broadcasted_iota(jnp.int32, (1, block), 1)
        attended_1s = (slot_1s >= start) & (slot_1s < end) & (valid_ref[...] != 0)
        for head in range(q_ref.shape[0]):  # static: the shard's key/value heads
            scores_gs = jax.lax.dot_general(q_ref[head], k_ref[head], (((1,), (1,)), ((), ())),
                                            preferred_element_type=jnp.float32) * scale
            scores_gs = jnp.where(attended_1s, scores_gs, -jnp.inf)
            max_g1 = max_ref[head]
            new_max_g1 = jnp.maximum(max_g1, jnp.max(scores_gs, axis=1, keepdims=True))
            # -inf while no slot has counted yet: shift by 0 instead, so exp never sees inf - inf.
            shift_g1 = jnp.where(new_max_g1 == -jnp.inf, 0.0, new_max_g1)
            probs_gs = jnp.where(attended_1s, jnp.exp(scores_gs - shift_g1), 0.0)
            rescale_g1 = jnp.exp(max_g1 - shift_g1)
            sum_ref[head] = sum_ref[head] * rescale_g1 + jnp.sum(probs_gs, axis=1, keepdims=True)
            acc_ref[head] = acc_ref[head] * rescale_g1 + jax.lax.dot_general(
                probs_gs.astype(v_ref.dtype), v_ref[head], (((1,), (0,)), ((), ())),
                preferred_element_type=jnp.float32)
            max_ref[head] = new_max_g1

    @pl.when(step == pl.num_programs(1) - 1)
    def _normalise():
        total_ng1 = sum_ref[...]
        out_ref[...] = jnp.where(total_ng1 > 0, acc_ref[...] / jnp.where(total_ng1 > 0, total_ng1, 1.0),
                                 0.0).astype(out_ref.dtype)


def _ragged_local(q_bngk, k_bnsk, v_bnsk, valid_bs, start_b, end_b, *, interpret: bool) -> jax.Array:
    rows, heads, group, width = q_bngk.shape
    block = block_slots(k_bnsk.shape[2])

    def cache_block(b, i, start_ref, end_ref):
        first = start_ref[b] // block
        last = jnp.maximum(first, (end_ref[b] - 1) // block)
        return b, 0, jnp.clip(i, first, last), 0

    def valid_block(b, i, start_ref, end_ref):
        return b, 0, cache_block(b, i, start_ref, end_ref)[2]

    def per_row(b, i, *_):
        return b, 0, 0, 0

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(rows, k_bnsk.shape[2] // block),
        in_specs=[
            pl.BlockSpec((None, heads, group, width), per_row),
            pl.BlockSpec((None, heads, block, width), cache_block),
            pl.BlockSpec((None, heads, block, width), cache_block),
            pl.BlockSpec((None, 1, block), valid_block),
        ],
        out_specs=pl.BlockSpec((None, heads, group, width), per_row),
        scratch_shapes=[pltpu.VMEM((heads, group, 1), jnp.float32), pltpu.VMEM((heads, group, 1), jnp.float32),
                        pltpu.VMEM((heads, group, width), jnp.float32)],
    )
    return pl.pallas_call(
        functools.partial(_kernel, block=block),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q_bngk.shape, q_bngk.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=interpret,
    )(start_b, end_b, q_bngk, k_bnsk, v_bnsk, valid_bs.astype(jnp.int32)[:, None, :])


def ragged_decode_attention(q_bngk: jax.Array, k_bnsk: jax.Array, v_bnsk: jax.Array, valid_bs: jax.Array,
                            start_b: jax.Array, end_b: jax.Array) -> jax.Array:
    """softmax(q k / sqrt(k_width), masked) v [B, KV, G, k] of one query per row over its cache slots (module
    docstring), by the ragged Pallas kernel: a Mosaic kernel on TPU, interpret mode on any other platform.

    q_bngk: the step's queries after RoPE, query head n * G + g in [n, g]; k_bnsk, v_bnsk: the cache [B, KV, S, k]
    (in blocks of `block_slots(S)`); valid_bs [B, S]; start_b, end_b int32 [B]: the slots row b may
    attend lie in [start_b, end_b). Under a mesh the kernel runs per shard (`shard_map`): rows split like the
    batch, heads over "tensor" where it divides the key/value heads.
    """
    local = functools.partial(_ragged_local, interpret=attention.current_platform() != "tpu")
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        heads_spec = sharding.fit_spec((sharding.BATCH_AXES, "tensor", None, None), k_bnsk.shape, dict(mesh.shape))
        P = jax.sharding.PartitionSpec
        rows = P(heads_spec[0])
        local = jax.shard_map(local, mesh=mesh, in_specs=(heads_spec, heads_spec, heads_spec, P(heads_spec[0], None),
                                                          rows, rows),
                              out_specs=heads_spec, check_vma=False)
    return local(q_bngk, k_bnsk, v_bnsk, valid_bs, start_b.astype(jnp.int32), end_b.astype(jnp.int32))
