"""Masked statistics over integer segment ids: the building block of every group-relative estimator.

A segment is a set of rows sharing an id: the rollouts of one prompt instance (a GRPO group), or the
rollouts of one prompt that have an item at step k (an SRaR step group, ids from `pair_segment_ids`).
Groups of any size live in one fixed-shape batch; nothing loops over the batch in Python.

Conventions shared by every function here:
- `segment_ids` are integers in [0, num_segments). Arbitrary ids (prompt hashes, dataset indices) are
  mapped there by `dense_segment_ids`, which the estimators call for you.
- `mask` marks the rows that count. A masked row contributes to no statistic; its own outputs are
  the statistics of its segment's valid rows (callers zero it where it matters).
- `ddof` selects the standard deviation: 0 for the population std (the SRaR paper's equations), 1 for
  the sample std (verl, TRL, and the SRaR authors' code). A segment with count <= ddof has std 0.
- Statistics are computed in float32 (or the input's wider float type) and are exact for ties:
  every value is first shifted by a member of its segment, so a segment of equal values has deviations
  and std exactly 0, and near-tied values lose no precision to the shift (Sterbenz).
"""

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp


class SegmentStats(NamedTuple):
    """Per-row statistics of the row's segment (shapes of the rows): valid count, mean, std, and the row's
    deviation from the mean, value - mean, computed in shifted coordinates so that it is not rounded through
    the mean (near-tied values one ulp apart keep their exact difference)."""

    count: jax.Array
    mean: jax.Array
    std: jax.Array
    deviation: jax.Array


def stats_dtype(x: jax.Array) -> jnp.dtype:
    """float32, or the input's float type when it is wider: statistics never run in bfloat16."""
    return jnp.promote_types(x.dtype, jnp.float32)


def as_stats_dtype(x: jax.Array) -> jax.Array:
    """x as an array of `stats_dtype(x)`: bool, int and bfloat16 inputs are promoted to float32."""
    x = jnp.asarray(x)
    return x.astype(stats_dtype(x))


def rows_mask(mask: Optional[jax.Array], num_rows: int) -> jax.Array:
    """[num_rows] bool: `mask`, or every row when it is None (the estimators' optional `mask` argument)."""
    if mask is None:
        return jnp.ones((num_rows,), bool)
    chex.assert_shape(mask, (num_rows,))
    return jnp.asarray(mask).astype(bool)


def dense_segment_ids(ids: jax.Array) -> jax.Array:
    """Maps arbitrary integer ids [N] to dense ids in [0, N), equal ids to equal dense ids.

    Two rows belong to the same segment iff their ids are equal, whatever the ids' values (two dataset
    items with equal prompt text but different ids are two groups). Jit-able: uses a sized unique.
    """
    chex.assert_rank(ids, 1)
    chex.assert_type(ids, int)
    _, inverse = jnp.unique(ids, return_inverse=True, size=ids.shape[0], fill_value=jnp.iinfo(ids.dtype).max)
    return inverse.reshape(ids.shape).astype(jnp.int32)


def pair_segment_ids(outer_ids: jax.Array, inner_ids: jax.Array, num_inner: int) -> jax.Array:
    """Segment id of the pair (outer, inner) = outer * num_inner + inner, for inner in [0, num_inner).

    Used for (group, step) and (role, group) segments. `outer_ids` must already be dense.
    """
    chex.assert_type([outer_ids, inner_ids], [int, int])
    return outer_ids.astype(jnp.int32) * num_inner + inner_ids.astype(jnp.int32)


def segment_count(segment_ids: jax.Array, mask: jax.Array, num_segments: int) -> jax.Array:
    """Number of valid rows in each segment, shape [num_segments], int32.

    Counted in float32 (exact below 2**24 rows): XLA's CPU backend (jax 0.10.2) miscompiles an int32
    segment_sum into one segment under jit(vmap(...)) when the batch size equals the row count, e.g. RLCER's
    8 questions x 8 rollouts, and returns 1 for every count (tests/core/test_segments.py)."""
    chex.assert_equal_shape([segment_ids, mask])
    count = jax.ops.segment_sum(mask.astype(jnp.float32), segment_ids, num_segments=num_segments)
    return count.astype(jnp.int32)


def segment_sum(values: jax.Array, segment_ids: jax.Array, mask: jax.Array, num_segments: int) -> jax.Array:
    """Sum of the valid rows' values in each segment, shape [num_segments] (0 for an empty segment)."""
    chex.assert_equal_shape([values, segment_ids, mask])
    return jax.ops.segment_sum(jnp.where(mask, values, 0), segment_ids, num_segments=num_segments)


def _segment_centre(values: jax.Array, segment_ids: jax.Array, mask: jax.Array, num_segments: int) -> jax.Array:
    """A member of each segment (its smallest valid value; 0 when empty), broadcast back to the rows."""
    smallest = jax.ops.segment_min(jnp.where(mask, values, jnp.inf), segment_ids, num_segments=num_segments)
    return jnp.where(jnp.isfinite(smallest), smallest, 0)[segment_ids]


def _std_from_squares(sum_sq: jax.Array, count: jax.Array, ddof: int) -> jax.Array:
    dof = count - ddof
    return jnp.where(dof > 0, jnp.sqrt(jnp.maximum(sum_sq, 0) / jnp.maximum(dof, 1)), 0)


def segment_stats(
    values: jax.Array, segment_ids: jax.Array, mask: jax.Array, num_segments: int, *, ddof: int = 1
) -> SegmentStats:
    """Count, mean and std of each row's segment over the valid rows, broadcast back to the rows.

    Two-pass and shifted by a segment member, so a segment whose valid values are all equal has std 0
    exactly and its rows equal its mean exactly. An empty segment has count 0, mean 0 and std 0.

    Args:
      values: [N] floats. segment_ids: [N] ints in [0, num_segments). mask: [N] bools.
      num_segments: static bound on the segment ids. ddof: 0 population std, 1 sample std.
    Returns:
      SegmentStats of [N] arrays (count int32, mean and std in `stats_dtype(values)`).
    """
    chex.assert_rank(values, 1)
    chex.assert_equal_shape([values, segment_ids, mask])
    x = as_stats_dtype(values)
    centre = _segment_centre(x, segment_ids, mask, num_segments)
    shifted = x - centre
    count = segment_count(segment_ids, mask, num_segments)
    shifted_mean = (segment_sum(shifted, segment_ids, mask, num_segments) / jnp.maximum(count, 1))[segment_ids]
    deviation = shifted - shifted_mean
    sum_sq = segment_sum(deviation * deviation, segment_ids, mask, num_segments)
    std = _std_from_squares(sum_sq, count, ddof)
    return SegmentStats(
        count=count[segment_ids], mean=centre + shifted_mean, std=std[segment_ids], deviation=deviation
    )


def group_stats(
    values: jax.Array, group_ids: jax.Array, valid: Optional[jax.Array] = None, *, std_ddof: int
) -> SegmentStats:
    """The statistics of each row's group over the group's valid rows, broadcast back to the rows: what every
    group-relative estimator (GRPO's mean and std, Dr.GRPO's deviation, a per-criterion normalisation) builds on.

    Fields, each [N]: `count`, the group's valid rows (int32); `mean`, their mean; `std`, their std with
    `std_ddof` (0 population, 1 sample; 0 when count <= std_ddof); `deviation`, the row's value minus the mean,
    exact for ties (`segment_stats`: a group of equal values has deviation and std exactly 0). An invalid row gets
    its group's statistics and its own deviation (callers zero it where it matters). A group with no valid row
    has count 0, mean 0 and std 0.

    Args:
      values: [N] floats. group_ids: [N] ints, any values (only equality matters, `dense_segment_ids`).
      valid: [N] bools, the rows that count (None: all). std_ddof: 0 or 1, keyword-only so that every caller
        says which std it means.
    """
    chex.assert_equal_shape([values, group_ids])
    valid = rows_mask(valid, values.shape[0])
    return segment_stats(values, dense_segment_ids(group_ids), valid, num_segments=values.shape[0], ddof=std_ddof)


class _Moments(NamedTuple):
    """Count, mean and sum of squared deviations (Welford's M2) of a set of values."""

    count: jax.Array
    mean: jax.Array
    m2: jax.Array


def _merge_moments(a: _Moments, b: _Moments) -> _Moments:
    """Chan et al.'s parallel combination: exact when either side is empty or both means are equal."""
    count = a.count + b.count
    delta = b.mean - a.mean
    safe_count = jnp.maximum(count, 1)
    mean = jnp.where(a.count == 0, b.mean, jnp.where(b.count == 0, a.mean, a.mean + delta * (b.count / safe_count)))
    m2 = a.m2 + b.m2 + jnp.where((a.count > 0) & (b.count > 0), delta * delta * (a.count * b.count / safe_count), 0)
    return _Moments(count, mean, m2)


def _segmented_merge(a, b):
    """Associative operator of a segmented scan: a run restarts wherever a segment starts."""
    a_starts, a_moments = a
    b_starts, b_moments = b
    merged = _merge_moments(a_moments, b_moments)
    moments = jax.tree.map(lambda kept, m: jnp.where(b_starts, kept, m), b_moments, merged)
    return a_starts | b_starts, moments


def leave_one_out_stats(
    values: jax.Array, segment_ids: jax.Array, mask: jax.Array, *, ddof: int = 1
) -> SegmentStats:
    """Count, mean and std of the *other* valid rows of each row's segment (leave-one-out).

    Rows are sorted by segment; each row's statistics merge the moments of the rows before it and after
    it in its segment (segmented Welford scans, Chan's combination). No sum of the whole segment is subtracted,
    so there is no cancellation: when the other rows are all equal their std is exactly 0 (REFERENCE.md
    section 4, item 4: rewards like 0.35 with 7 of 8 equal keep |A| bounded).
    Values are shifted by a member of their segment first, as in `segment_stats`, and `deviation` is the row's
    value minus the others' mean. A masked row gets the statistics of all valid rows of its segment. No other
    valid row: count 0, mean (and the shift) of nothing, std 0; callers treat count 0 themselves. Fewer than ddof + 1 others: std 0.

    Args:
      values: [N] floats. segment_ids: [N] ints (any values; only equality matters). mask: [N] bools.
      ddof: 0 population std, 1 sample std of the others.
    Returns:
      SegmentStats of [N] arrays (count int32, mean and std in `stats_dtype(values)`).
    """
    chex.assert_rank(values, 1)
    chex.assert_equal_shape([values, segment_ids, mask])
    dense_ids = dense_segment_ids(segment_ids)
    x = as_stats_dtype(values)
    centre = _segment_centre(x, dense_ids, mask, num_segments=x.shape[0])
    shifted = x - centre
    order = jnp.argsort(dense_ids, stable=True)
    sorted_ids = dense_ids[order]
    sorted_mask = mask[order]
    boundary = sorted_ids[1:] != sorted_ids[:-1]
    starts = jnp.concatenate([jnp.ones((1,), bool), boundary])
    ends = jnp.concatenate([boundary, jnp.ones((1,), bool)])
    own = _Moments(
        count=sorted_mask.astype(jnp.int32),
        mean=jnp.where(sorted_mask, shifted[order], 0),
        m2=jnp.zeros_like(x),
    )
    empty = jax.tree.map(jnp.zeros_like, own)

    _, prefix = jax.lax.associative_scan(_segmented_merge, (starts, own))
    _, suffix = jax.lax.associative_scan(_segmented_merge, (ends, own), reverse=True)

    def neighbour(moments: _Moments, by: int, edge: jax.Array) -> _Moments:
        # The moments of the neighbour (before: by=1, after: by=-1) unless this row is its segment's edge.
        rolled = jax.tree.map(lambda m: jnp.roll(m, by), moments)
        return jax.tree.map(lambda r, e: jnp.where(edge, e, r), rolled, empty)

    others = _merge_moments(neighbour(prefix, 1, starts), neighbour(suffix, -1, ends))
    inverse = jnp.argsort(order)
    count = others.count[inverse]
    shifted_mean = others.mean[inverse]
    return SegmentStats(
        count=count,
        mean=centre + shifted_mean,
        std=_std_from_squares(others.m2[inverse], count, ddof),
        deviation=shifted - shifted_mean,
    )
