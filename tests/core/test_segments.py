import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.core import segments
from tests.core.random_batches import random_group_ids, random_rewards

NUM_ROWS = 14
segment_stats = jax.jit(segments.segment_stats, static_argnames=("num_segments", "ddof"))
loo_stats = jax.jit(segments.leave_one_out_stats, static_argnames=("ddof",))


def loop_stats(values, ids, mask, ddof, leave_out):
    """Per row: count, mean and std of the valid rows sharing its id (excluding itself when leave_out)."""
    out = []
    for i in range(len(values)):
        members = [float(values[j]) for j in range(len(values)) if ids[j] == ids[i] and mask[j] and not (leave_out and j == i)]
        mean = sum(members) / len(members) if members else 0.0
        std = (sum((m - mean) ** 2 for m in members) / (len(members) - ddof)) ** 0.5 if len(members) > ddof else 0.0
        out.append((len(members), mean, std))
    return [np.array(column) for column in zip(*out)]


def test_dense_segment_ids_keep_equality_only():
    ids = jnp.array([907, 3, 907, -5, 3, 12])
    dense = np.asarray(jax.jit(segments.dense_segment_ids)(ids))
    assert dense.min() >= 0 and dense.max() < ids.shape[0]
    for i in range(6):
        for j in range(6):
            assert (dense[i] == dense[j]) == (ids[i] == ids[j])


@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("seed", range(25))
def test_segment_and_leave_one_out_stats_match_loops(seed, ddof):
    rng = np.random.default_rng(seed)
    values = random_rewards(rng, NUM_ROWS)
    ids = random_group_ids(rng, NUM_ROWS)
    mask = rng.random(NUM_ROWS) < 0.8
    dense = segments.dense_segment_ids(jnp.asarray(ids))
    for stats, leave_out in ((segment_stats(values, dense, mask, num_segments=NUM_ROWS, ddof=ddof), False),
                             (loo_stats(values, ids, mask, ddof=ddof), True)):
        count, mean, std = loop_stats(values, ids, mask, ddof, leave_out)
        np.testing.assert_array_equal(stats.count, count)
        has = count > 0
        np.testing.assert_allclose(np.asarray(stats.mean)[has], mean[has], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(stats.std, std, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(np.asarray(stats.deviation)[has], (values.astype(np.float64) - mean)[has], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("batch, rows", [(8, 8), (4, 4), (2, 2), (3, 8), (8, 3)])
def test_stats_vmapped_under_jit_match_loops_when_the_batch_equals_the_rows(batch, rows):
    """jit(vmap(...)) over questions, one segment per question: XLA's CPU backend (jax 0.10.2) returned count 1
    for an int32 count when batch == rows (RLCER's 8 questions x 8 rollouts) until segment_count summed floats."""
    rng = np.random.default_rng(batch * 100 + rows)
    values = rng.integers(0, 2, (batch, rows)).astype(np.float32)
    mask = rng.random((batch, rows)) < 0.8
    ids = jnp.zeros(rows, jnp.int32)
    stats = jax.jit(jax.vmap(lambda v, m: segments.segment_stats(v, ids, m, num_segments=1, ddof=0)))(values, mask)
    for q in range(batch):
        count, mean, std = loop_stats(values[q], np.zeros(rows, int), mask[q], 0, False)
        np.testing.assert_array_equal(stats.count[q], count)
        np.testing.assert_allclose(stats.std[q], std, rtol=1e-6, atol=1e-7)
        if count[0]:
            np.testing.assert_allclose(stats.mean[q], mean, rtol=1e-6)


@given(st.lists(st.floats(-1e3, 1e3, width=32), min_size=2, max_size=NUM_ROWS), st.integers(0, 2**31 - 1))
def test_ties_give_exactly_zero_spread(pool, seed):
    """Whatever the values, a segment (or a row's other members) that ties has std and deviation exactly 0."""
    rng = np.random.default_rng(seed)
    ids = random_group_ids(rng, NUM_ROWS)
    values = np.empty(NUM_ROWS, np.float32)
    for g in np.unique(ids):
        values[ids == g] = pool[int(rng.integers(len(pool)))]
    outlier = int(rng.integers(NUM_ROWS))
    values[outlier] = pool[-1]
    mask = np.ones(NUM_ROWS, bool)
    stats = segment_stats(values, segments.dense_segment_ids(jnp.asarray(ids)), mask, num_segments=NUM_ROWS, ddof=1)
    others = loo_stats(values, ids, mask, ddof=1)
    for i in range(NUM_ROWS):
        group = values[ids == ids[i]]
        if np.all(group == group[0]):
            assert stats.std[i] == 0 and stats.deviation[i] == 0
        rest = values[(ids == ids[i]) & (np.arange(NUM_ROWS) != i)]
        if rest.size and np.all(rest == rest[0]):
            assert others.std[i] == 0
            np.testing.assert_allclose(others.deviation[i], np.float64(values[i]) - rest[0], rtol=1e-6, atol=1e-30)


def test_stats_are_float32_for_bfloat16_values():
    values = jnp.array([0.5, 0.25, 1.0, 1.0], jnp.bfloat16)
    ids = jnp.array([0, 0, 1, 1])
    stats = segment_stats(values, ids, jnp.ones(4, bool), num_segments=4, ddof=0)
    assert stats.mean.dtype == jnp.float32 and stats.std.dtype == jnp.float32
    np.testing.assert_allclose(stats.std, [0.125, 0.125, 0, 0])


def test_empty_segments_and_fully_masked_batches_are_defined():
    values = jnp.array([1.0, 2.0, 3.0])
    none = jnp.zeros(3, bool)
    stats = segment_stats(values, jnp.array([0, 0, 1]), none, num_segments=3)
    np.testing.assert_array_equal(stats.count, 0)
    np.testing.assert_array_equal(stats.std, 0)
    others = loo_stats(values, jnp.array([0, 0, 1]), none)
    np.testing.assert_array_equal(others.count, 0)
    np.testing.assert_array_equal(others.std, 0)
    assert np.all(np.isfinite(stats.mean)) and np.all(np.isfinite(others.mean))


def test_group_stats_by_hand():
    # groups 7 (rows 0, 2, 4; row 4 masked) and -1 (rows 1, 3): sample std of {1, 3} and of {10, 10}
    values = jnp.array([1.0, 10.0, 3.0, 10.0, 100.0])
    stats = segments.group_stats(values, jnp.array([7, -1, 7, -1, 7]), jnp.array([1, 1, 1, 1, 0], bool), std_ddof=1)
    np.testing.assert_array_equal(stats.count, [2, 2, 2, 2, 2])
    np.testing.assert_allclose(stats.mean, [2.0, 10.0, 2.0, 10.0, 2.0])
    np.testing.assert_allclose(stats.std, [np.sqrt(2.0), 0.0, np.sqrt(2.0), 0.0, np.sqrt(2.0)], rtol=1e-6)
    np.testing.assert_allclose(stats.deviation, [-1.0, 0.0, 1.0, 0.0, 98.0])
    # no mask: every row counts; population std
    whole = segments.group_stats(values, jnp.array([0, 1, 0, 1, 0]), std_ddof=0)
    np.testing.assert_allclose(whole.mean[0], 104 / 3, rtol=1e-6)
    np.testing.assert_allclose(whole.std[0], np.std([1.0, 3.0, 100.0]), rtol=1e-6)


@given(st.lists(st.tuples(st.sampled_from([0.0, 0.25, 1.0, -3.5]), st.integers(-2, 2), st.booleans()),
                min_size=1, max_size=12), st.sampled_from([0, 1]))
def test_group_stats_is_segment_stats_over_dense_group_ids(rows, ddof):
    values, ids, valid = (np.array(column) for column in zip(*rows))
    got = segments.group_stats(values.astype(np.float32), ids.astype(np.int32), valid, std_ddof=ddof)
    dense = segments.dense_segment_ids(jnp.asarray(ids, jnp.int32))
    want = segments.segment_stats(values.astype(np.float32), dense, valid, num_segments=len(rows), ddof=ddof)
    for field, got_field, want_field in zip(want._fields, got, want):
        np.testing.assert_array_equal(got_field, want_field, err_msg=field)
    count, mean, std = loop_stats(values, ids, valid, ddof, leave_out=False)
    np.testing.assert_array_equal(got.count, count)
    np.testing.assert_allclose(got.std, std, rtol=1e-5, atol=1e-6)
