"""The ragged decode kernel (`models.ragged_decode`, Pallas interpret mode on CPU) against a NumPy transcription of
masked softmax attention, written as loops; its invariants (rows never see slots outside their range, outputs are
convex combinations of the attended values); its sharded form on the 8-device CPU mesh; and its Mosaic
compilation for a TPU chip.

BLOCK_SLOTS is lowered to 16 in most tests, so that a cache of a few blocks exercises the clamped block indices
(rows starting mid-block, ending on a boundary, spanning one block or all).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubric_jax.models import attention, ragged_decode
from rubric_jax.models.ragged_decode import ragged_decode_attention

BLOCK = 16
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(ragged_decode, "BLOCK_SLOTS", BLOCK)


def reference(q_bngk, k_bnsk, v_bnsk, valid_bs, start_b, end_b) -> np.ndarray:
    """Per row and query head: softmax over the slots s in [start, end) with valid[s] of q.k / sqrt(width),
    applied to the values; zeros for a row with no such slot."""
    rows, heads, group, width = q_bngk.shape
    out = np.zeros((rows, heads, group, width))
    for b in range(rows):
        slots = [s for s in range(start_b[b], end_b[b]) if valid_bs[b, s]]
        for n in range(heads):
            for g in range(group):
                if not slots:
                    continue
                scores = [float(np.dot(q_bngk[b, n, g], k_bnsk[b, n, s])) / np.sqrt(width) for s in slots]
                weights = np.exp(np.array(scores) - max(scores))
                weights /= weights.sum()
                out[b, n, g] = sum(w * v_bnsk[b, n, s].astype(np.float64) for w, s in zip(weights, slots))
    return out


def random_case(seed: int, rows=5, heads=2, group=3, width=8, slots=4 * BLOCK, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=shape).astype(dtype) for shape in
               [(rows, heads, group, width), (rows, heads, slots, width), (rows, heads, slots, width)])
    valid_bs = rng.random((rows, slots)) > 0.25
    return q, k, v, valid_bs


def attend(q, k, v, valid_bs, start_b, end_b) -> np.ndarray:
    # Jitted: an interpreted kernel run eagerly dispatches every grid step's operations one by one.
    return np.asarray(jax.jit(ragged_decode_attention)(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(valid_bs),
                                              jnp.asarray(start_b, jnp.int32), jnp.asarray(end_b, jnp.int32)))


def test_matches_the_loop_reference_on_ranges_across_blocks():
    q, k, v, valid_bs = random_case(0)
    # mid-block to mid-block, one whole block, the whole cache, one slot, an empty range, boundary to boundary.
    start_b, end_b = np.array([5, 16, 0, 37, 20]), np.array([41, 32, 64, 38, 20])
    valid_bs[3, 37] = True
    out = attend(q, k, v, valid_bs, start_b, end_b)
    np.testing.assert_allclose(out, reference(q, k, v, valid_bs, start_b, end_b), **TOL)
    np.testing.assert_array_equal(out[4], 0.0)  # no slot to attend: zeros, never NaN


def test_bfloat16_cache_stays_within_bfloat16_rounding_of_the_reference():
    """bfloat16 operands: the probabilities are rounded to bfloat16 before their matmul with the values (as the
    XLA path does), so the output moves by about bfloat16's relative precision (2^-8) of the values' scale."""
    q, k, v, valid_bs = random_case(1, dtype=jnp.bfloat16)
    start_b, end_b = np.array([0, 3, 17, 30, 48]), np.array([64, 19, 50, 31, 60])
    valid_bs[3, 30] = True
    f32 = [np.asarray(x, np.float32) for x in (q, k, v)]
    np.testing.assert_allclose(attend(q, k, v, valid_bs, start_b, end_b).astype(np.float32),
                               reference(*f32, valid_bs, start_b, end_b), atol=2e-2, rtol=2e-2)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), data=st.data())
def test_rows_never_see_slots_outside_their_range_and_stay_in_the_values_hull(seed, data):
    """Keys and values outside a row's range (or invalid) may hold any finite garbage (a cache's stale rows): the
    output is unchanged, and each output coordinate lies between the least and greatest attended value."""
    q, k, v, valid_bs = random_case(seed, rows=3)
    slots = k.shape[2]
    start_b = np.array([data.draw(st.integers(0, slots - 1)) for _ in range(3)])
    end_b = np.array([data.draw(st.integers(start + 1, slots)) for start in start_b])
    valid_bs[np.arange(3), start_b] = True
    out = attend(q, k, v, valid_bs, start_b, end_b)
    in_range_bs = valid_bs & (np.arange(slots) >= start_b[:, None]) & (np.arange(slots) < end_b[:, None])
    garbage = np.random.default_rng(seed + 1).normal(scale=1e3, size=k.shape).astype(k.dtype)
    poisoned_k, poisoned_v = (np.where(in_range_bs[:, None, :, None], x, garbage) for x in (k, v))
    np.testing.assert_array_equal(attend(q, poisoned_k, poisoned_v, valid_bs, start_b, end_b), out)
    for b in range(3):
        attended_nsk = v[b][:, in_range_bs[b]]
        assert np.all(out[b] >= attended_nsk.min(axis=1)[:, None] - 1e-5)
        assert np.all(out[b] <= attended_nsk.max(axis=1)[:, None] + 1e-5)


def test_sharded_over_rows_and_heads_equals_one_device():
    """On the 8-device CPU mesh (data 2 x tensor 4, the decode layout): rows split over data, key/value heads over
    tensor, each shard's kernel sees its own rows' ranges."""
    q, k, v, valid_bs = random_case(2, rows=4, heads=4, group=2)
    start_b, end_b = np.array([1, 20, 33, 0]), np.array([60, 21, 64, 15])
    valid_bs[np.arange(4), start_b] = True
    mesh = jax.make_mesh((2, 4), ("data", "tensor"))
    P = jax.sharding.PartitionSpec
    heads, rows = jax.sharding.NamedSharding(mesh, P("data", "tensor")), jax.sharding.NamedSharding(mesh, P("data"))
    placed = jax.device_put((q, k, v, valid_bs, start_b.astype(np.int32), end_b.astype(np.int32)),
                            (heads, heads, heads, rows, rows, rows))
    with jax.set_mesh(mesh):
        sharded = jax.jit(ragged_decode_attention)(*placed)
    assert sharded.sharding.spec[:2] == ("data", "tensor")
    np.testing.assert_allclose(sharded, attend(q, k, v, valid_bs, start_b, end_b), **TOL)


def test_compiles_as_a_mosaic_kernel_for_a_tpu_chip(monkeypatch):
    """The kernel at a Qwen3-8B shard's decode shape (2 key/value heads of 4 queries, 128 wide, bfloat16, 4096
    slots in blocks of BLOCK_SLOTS) lowers through Mosaic for a v5e chip: a real TPU kernel, not interpret mode."""
    from rubric_jax.training.plan import topology_devices  # noqa: PLC0415  (loads libtpu)

    monkeypatch.setattr(ragged_decode, "BLOCK_SLOTS", 512)
    _, devices = topology_devices("v5e:2x2")
    mesh = jax.sharding.Mesh(np.array(devices[:1]), ("data",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    rows, slots = 64, 4096
    shapes = [((rows, 2, 4, 128), jnp.bfloat16), ((rows, 2, slots, 128), jnp.bfloat16),
              ((rows, 2, slots, 128), jnp.bfloat16), ((rows, slots), bool), ((rows,), jnp.int32), ((rows,), jnp.int32)]
    args = [jax.ShapeDtypeStruct(shape, dtype, sharding=replicated) for shape, dtype in shapes]
    with jax.set_mesh(mesh):
        hlo = jax.jit(ragged_decode_attention).lower(*args).compile().as_text()
    assert 'custom_call_target="tpu_custom_call"' in hlo


def test_only_splash_decodes_by_the_kernel():
    assert [attention.resolve_decode(name) for name in attention.IMPLEMENTATIONS] == ["xla", "xla", "ragged", "xla"]
