import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rubric_jax.core import rewards
from tests.core import reference_rewards as ref

B, K = 12, 6
weighted_fraction = jax.jit(rewards.weighted_fraction)
positive_points_score = jax.jit(rewards.positive_points_score)
min_max_score = jax.jit(rewards.min_max_score)
rgr_factual_gated_reward = jax.jit(rewards.rgr_factual_gated_reward)
rlcer_outcome_reward = jax.jit(rewards.rlcer_outcome_reward)
srar_base_reward = jax.jit(rewards.srar_base_reward, static_argnames="format_weight")
dapo_overlong_shaping = jax.jit(
    rewards.dapo_overlong_shaping, static_argnames=("max_length", "buffer_length", "factor")
)
rgr_length_shaping = jax.jit(rewards.rgr_length_shaping, static_argnames=("target_length", "coef"))
excess_penalty = jax.jit(rewards.excess_penalty, static_argnames=("budget", "coef"))
truncation_scaling = jax.jit(rewards.truncation_scaling, static_argnames="factor")
truncation_mask = jax.jit(rewards.truncation_mask)
clip_rewards = jax.jit(rewards.clip_rewards, static_argnames=("low", "high"))


# ---------------------------------------------------------------- hand-computed cases from the papers' formulas


def test_weighted_fraction_rubric_grounded_eq2_and_rgr_eq4_hand_computed():
    # weights 3, 1, 2 (item 3 does not exist); awarded weight = w * s with partial credit 0.5 on item 1
    satisfied = np.array([[1.0, 0.5, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]], np.float32)
    weights = np.array([3.0, 1.0, 2.0, 5.0], np.float32)
    mask = np.array([1, 1, 1, 0], bool)
    np.testing.assert_allclose(weighted_fraction(satisfied, weights, mask), [3.5 / 6, 1.0], rtol=1e-6)


def test_broadcast_rubric_items_shares_a_k_rubric_across_the_batch_and_keeps_a_b_k_one():
    satisfied = np.array([[True, False, True], [False, False, True]])
    items = rewards.broadcast_rubric_items(satisfied, np.array([2, -1, 3]), np.array([1, 1, 0]))
    assert items.satisfied.dtype == jnp.float32 and items.values.dtype == jnp.float32 and items.exists.dtype == bool
    np.testing.assert_array_equal(items.satisfied, satisfied.astype(np.float32))
    np.testing.assert_array_equal(items.values, [[2, -1, 3], [2, -1, 3]])
    np.testing.assert_array_equal(items.exists, [[True, True, False], [True, True, False]])
    per_row = rewards.broadcast_rubric_items(np.ones((2, 3), np.float64), np.arange(6.0).reshape(2, 3),
                                             np.eye(2, 3, dtype=bool))
    assert per_row.values.dtype == per_row.satisfied.dtype  # the verdicts' float type, here float64 or float32
    np.testing.assert_array_equal(per_row.values, np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(per_row.exists, np.eye(2, 3, dtype=bool))


def test_typed_item_credit_credits_avoided_pitfalls_and_nothing_on_failure():
    satisfied = np.array([[1, 0, 1, 0], [1, 1, 0, 0], [0.25, 0.25, 1, 1]], np.float32)
    kinds = np.array([[rewards.SUGGEST, rewards.PITFALL, rewards.PITFALL, rewards.ANSWER],
                      [rewards.SUGGEST, rewards.PITFALL, rewards.BONUS, -1],
                      [rewards.PITFALL, 4, rewards.BONUS, 5]])
    credit = rewards.typed_item_credit(satisfied, kinds, np.array([False, True, False]))
    np.testing.assert_array_equal(credit, [[1, 1, 0, 0], [0, 0, 0, 0], [0.75, 0.25, 1, 1]])
    # Untyped rubrics (generic kinds only): the credit is the verdict itself.
    untyped = rewards.typed_item_credit(satisfied, np.full_like(kinds, 4), np.zeros(3, bool))
    np.testing.assert_array_equal(untyped, satisfied)


def test_weighted_fraction_degenerate_and_negative_weights():
    satisfied = np.array([[1, 1], [1, 0], [0, 1]], bool)
    weights = np.array([[1.0, 2.0], [0.0, 0.0], [-4.0, 1.0]], np.float32)
    mask = np.array([[0, 0], [1, 1], [1, 1]], bool)
    # empty rubric -> 0; zero total weight -> 0; a negative weight counts as 0
    np.testing.assert_allclose(weighted_fraction(satisfied, weights, mask), [0.0, 0.0, 1.0])


def test_positive_points_healthbench_evorubric_hand_computed():
    # points +5, +3, -4, +2 (masked): met = {5, -4} / positive 8 = 1/8; met = {-4} -> -0.5; all -> 4/8
    points = np.array([5.0, 3.0, -4.0, 2.0], np.float32)
    mask = np.array([1, 1, 1, 0], bool)
    satisfied = np.array([[1, 0, 1, 1], [0, 0, 1, 0], [1, 1, 1, 1]], bool)
    np.testing.assert_allclose(positive_points_score(satisfied, points, mask), [1 / 8, -0.5, 0.5], rtol=1e-6)


def test_positive_points_healthbench_penalty_cases_hand_computed():
    # criteria +5, +3, -5 (HealthBench-style: the penalty as large as the main criterion); positive points 8.
    points = np.array([5.0, 3.0, -5.0], np.float32)
    mask = np.ones(3, bool)
    satisfied = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 1], [0, 0, 1], [0, 1, 0]], bool)
    # all good, no penalty: 8/8; all good and the penalty: 3/8; +5 and the penalty: 0; only the penalty: -5/8
    np.testing.assert_allclose(positive_points_score(satisfied, points, mask), [1.0, 3 / 8, 0.0, -5 / 8, 3 / 8],
                               rtol=1e-6)
    # the weighted fraction pays a met penalty nothing: 1, 1, 5/8, 0, 3/8
    np.testing.assert_allclose(weighted_fraction(satisfied, points, mask), [1.0, 1.0, 5 / 8, 0.0, 3 / 8], rtol=1e-6)


def test_positive_points_without_positive_points_is_zero():
    satisfied = np.array([[1, 1], [1, 0]], bool)
    points = np.array([[-2.0, -1.0], [3.0, 1.0]], np.float32)
    mask = np.array([[1, 1], [0, 0]], bool)  # penalty-only rubric; empty rubric
    np.testing.assert_array_equal(positive_points_score(satisfied, points, mask), [0.0, 0.0])


def test_min_max_rlcer_eq6_hand_computed():
    # points 3, 2, -4: min attainable -4, max 5; met {3, -4}: x = -1 -> (-1 + 4) / 9
    points = np.array([3.0, 2.0, -4.0], np.float32)
    satisfied = np.array([[1, 0, 1], [1, 1, 0], [0, 0, 1]], bool)
    np.testing.assert_allclose(min_max_score(satisfied, points, np.ones(3, bool)), [3 / 9, 1.0, 0.0], rtol=1e-6)


def test_min_max_degenerate_range_is_zero():
    satisfied = np.array([[1, 1], [1, 0]], bool)
    points = np.array([[0.0, 0.0], [3.0, -1.0]], np.float32)
    mask = np.array([[1, 1], [0, 0]], bool)  # max == min == 0; no valid rubric
    np.testing.assert_array_equal(min_max_score(satisfied, points, mask), [0.0, 0.0])


def test_rgr_factual_gate_eq5_hand_computed():
    # items: F(w 2), F(w 1), P(w 3), P(w 4)
    weights = np.array([2.0, 1.0, 3.0, 4.0], np.float32)
    factual = np.array([1, 1, 0, 0], bool)
    satisfied = np.array([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 1, 1], [1, 0.5, 1, 1]], np.float32)
    out = rgr_factual_gated_reward(satisfied, weights, factual, np.ones(4, bool))
    # row 0: every factual met -> 1 despite failed process criteria; rows 1-3: eq 4 over all criteria
    np.testing.assert_allclose(out, [1.0, 5 / 10, 7 / 10, 9.5 / 10], rtol=1e-6)


def test_rgr_factual_gate_without_factual_criteria_uses_the_weighted_fraction():
    weights = np.array([1.0, 3.0], np.float32)
    satisfied = np.array([[0, 1], [0, 0]], bool)
    out = rgr_factual_gated_reward(satisfied, weights, np.zeros(2, bool), np.ones(2, bool))
    np.testing.assert_allclose(out, [0.75, 0.0])
    # an existing factual criterion that is masked out does not gate either
    masked = rgr_factual_gated_reward(satisfied, weights, np.array([1, 0], bool), np.array([0, 1], bool))
    np.testing.assert_allclose(masked, [1.0, 0.0])


def test_outcome_rewards_rlcer_eq8_and_srar_base():
    np.testing.assert_array_equal(rlcer_outcome_reward(np.array([True, False, True])), [1.0, -1.0, 1.0])
    base = srar_base_reward(np.array([1, 1, 0, 0], bool), np.array([1, 0, 1, 0], bool))
    np.testing.assert_allclose(base, [1.0, 0.9, 0.1, 0.0], rtol=1e-6)
    np.testing.assert_allclose(srar_base_reward(np.ones(1), np.zeros(1), format_weight=0.5), [0.5])


def test_dapo_overlong_hand_computed():
    lengths = np.array([0, 80, 90, 95, 100, 150], np.int32)
    out = dapo_overlong_shaping(np.ones(6, np.float32), lengths, max_length=100, buffer_length=20, factor=0.5)
    np.testing.assert_allclose(out, [1.0, 1.0, 0.75, 0.625, 0.5, 0.5], rtol=1e-6)
    hard = dapo_overlong_shaping(np.ones(6, np.float32), lengths, max_length=100, buffer_length=0, factor=1.0)
    np.testing.assert_allclose(hard, [1, 1, 1, 1, 1, 0])


def test_rgr_length_penalty_hand_computed():
    out = rgr_length_shaping(np.ones(3, np.float32), np.array([3000, 2000, 1000]))
    np.testing.assert_allclose(out, [0.9, 1.0, 1.1], rtol=1e-6)  # lambda 1e-4, L* = 2000, two-sided as written


def test_excess_penalty_truncation_and_clip():
    np.testing.assert_allclose(excess_penalty(np.array([3, 6, 9]), budget=6, coef=0.1), [0, 0, 0.3], rtol=1e-6)
    stopped = np.array([True, False, True])
    np.testing.assert_allclose(truncation_scaling(np.array([1.0, 1.0, -0.5]), stopped, factor=0.25), [1, 0.25, -0.5])
    np.testing.assert_array_equal(truncation_mask(stopped, np.array([True, True, False])), [True, False, False])
    np.testing.assert_array_equal(truncation_mask(stopped), stopped)
    np.testing.assert_allclose(clip_rewards(np.array([-0.5, 0.3, 1.7])), [0, 0.3, 1.0], rtol=1e-6)
    np.testing.assert_allclose(clip_rewards(np.array([-3.0, 3.0]), low=-1.0, high=2.0), [-1, 2])


# ---------------------------------------------------------------- vectorised JAX vs the NumPy loop reference


def random_rubrics(rng):
    """[B, K] verdicts (binary or partial), weights >= 0 with zeros, signed points (some rows penalty-only or all
    zero), ragged item masks with empty rubrics, factual flags."""
    satisfied = rng.random((B, K)) < 0.5
    if rng.random() < 0.5:
        satisfied = rng.choice(np.array([0.0, 0.25, 0.5, 1.0], np.float32), (B, K))
    weights = rng.choice(np.array([0.0, 0.5, 1.0, 2.0, 3.0], np.float32), (B, K))
    points = rng.integers(-5, 6, (B, K)).astype(np.float32)
    penalty_only = rng.random(B) < 0.15
    points[penalty_only] = -np.abs(points[penalty_only])
    points[rng.random(B) < 0.1] = 0.0
    item_mask = (rng.random((B, K)) < 0.75) & (rng.random(B) >= 0.15)[:, None]
    factual = rng.random((B, K)) < 0.4
    return satisfied, weights, points, item_mask, factual


@pytest.mark.parametrize("seed", range(30))
def test_rubric_aggregations_match_the_loop_reference(seed):
    rng = np.random.default_rng(seed)
    satisfied, weights, points, item_mask, factual = random_rubrics(rng)
    kw = dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weighted_fraction(satisfied, weights, item_mask),
                               ref.weighted_fraction(satisfied, weights, item_mask), **kw)
    np.testing.assert_allclose(positive_points_score(satisfied, points, item_mask),
                               ref.positive_points_score(satisfied, points, item_mask), **kw)
    np.testing.assert_allclose(min_max_score(satisfied, points, item_mask),
                               ref.min_max_score(satisfied, points, item_mask), **kw)
    np.testing.assert_allclose(rgr_factual_gated_reward(satisfied, weights, factual, item_mask),
                               ref.rgr_factual_gated_reward(satisfied, weights, factual, item_mask), **kw)


@pytest.mark.parametrize("seed", range(10))
def test_shared_rubric_broadcasts_like_per_row_rubrics(seed):
    rng = np.random.default_rng(seed)
    satisfied, weights, points, item_mask, factual = random_rubrics(rng)
    shared = (weights[0], points[0], item_mask[0], factual[0])
    tiled = tuple(np.broadcast_to(x, (B, K)) for x in shared)
    np.testing.assert_array_equal(weighted_fraction(satisfied, shared[0], shared[2]),
                                  weighted_fraction(satisfied, tiled[0], tiled[2]))
    np.testing.assert_array_equal(min_max_score(satisfied, shared[1], shared[2]),
                                  min_max_score(satisfied, tiled[1], tiled[2]))
    np.testing.assert_array_equal(rgr_factual_gated_reward(satisfied, shared[0], shared[3], shared[2]),
                                  rgr_factual_gated_reward(satisfied, tiled[0], tiled[3], tiled[2]))


@pytest.mark.parametrize("seed", range(10))
def test_dapo_overlong_matches_the_loop_reference(seed):
    rng = np.random.default_rng(seed)
    rewards_b = rng.normal(size=B).astype(np.float32)
    lengths = rng.integers(0, 140, B).astype(np.int32)
    np.testing.assert_allclose(
        dapo_overlong_shaping(rewards_b, lengths, max_length=100, buffer_length=30, factor=1.0),
        ref.dapo_overlong_shaping(rewards_b, lengths, 100, 30, 1.0), rtol=1e-5, atol=1e-6,
    )


# ---------------------------------------------------------------- properties

verdicts = hnp.arrays(np.float32, (B, K), elements=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
binary_verdicts = hnp.arrays(bool, (B, K))
masks = hnp.arrays(bool, (B, K))
nonneg_weights = hnp.arrays(np.float32, (B, K), elements=st.floats(0, 100, width=32))
signed_points = hnp.arrays(np.float32, (B, K), elements=st.floats(-100, 100, width=32))


@given(verdicts, nonneg_weights, masks)
def test_weighted_fraction_is_in_unit_interval(satisfied, weights, mask):
    out = np.asarray(weighted_fraction(satisfied, weights, mask))
    assert np.all((out >= 0) & (out <= 1))


@given(verdicts, signed_points, masks)
def test_min_max_is_in_unit_interval_and_positive_points_at_most_one(satisfied, points, mask):
    out = np.asarray(min_max_score(satisfied, points, mask))
    assert np.all((out >= 0) & (out <= 1))
    assert np.all(np.asarray(positive_points_score(satisfied, points, mask)) <= 1 + 1e-6)


@given(verdicts, nonneg_weights, masks)
def test_positive_points_equals_the_weighted_fraction_on_non_negative_rubrics(satisfied, weights, mask):
    """RaR's default score (positive points) changes nothing on a rubric without penalties: bit for bit."""
    np.testing.assert_array_equal(positive_points_score(satisfied, weights, mask),
                                  weighted_fraction(satisfied, weights, mask))


@given(verdicts, signed_points, masks)
def test_positive_points_is_the_weighted_fraction_less_the_met_penalties(satisfied, points, mask):
    """Both share the denominator (the positive points): the signed score subtracts each met penalty's share."""
    signed = np.asarray(positive_points_score(satisfied, points, mask), np.float64)
    fraction = np.asarray(weighted_fraction(satisfied, points, mask), np.float64)
    positive = np.where(mask, np.maximum(points, 0), 0).astype(np.float64).sum(axis=1)
    penalties = np.where(mask, np.minimum(points, 0) * satisfied, 0).astype(np.float64).sum(axis=1)
    expected = fraction + np.where(positive > 0, penalties / np.where(positive > 0, positive, 1), 0)
    np.testing.assert_allclose(signed, expected, rtol=1e-5, atol=1e-5)
    assert np.all(signed <= fraction + 1e-6) and np.all(signed <= 1 + 1e-6)


@given(verdicts, nonneg_weights, masks, masks)
def test_rgr_gated_reward_is_in_unit_interval_and_at_least_the_fraction(satisfied, weights, factual, mask):
    gated = np.asarray(rgr_factual_gated_reward(satisfied, weights, factual, mask))
    assert np.all((gated >= 0) & (gated <= 1))
    assert np.all(gated >= np.asarray(weighted_fraction(satisfied, weights, mask)))


@given(hnp.arrays(np.int32, (B,), elements=st.integers(0, 300)), st.integers(0, 60), st.floats(0, 2))
def test_dapo_overlong_is_a_bounded_non_increasing_penalty(lengths, buffer_length, factor):
    shaped = np.asarray(rewards.dapo_overlong_shaping(
        np.zeros(B, np.float32), np.sort(lengths), max_length=200, buffer_length=buffer_length, factor=factor))
    assert np.all(shaped <= 0) and np.all(shaped >= -factor - 1e-6)
    assert np.all(np.diff(shaped) <= 1e-6)


# ---------------------------------------------------------------- bfloat16


def test_bfloat16_inputs_are_promoted_to_float32():
    rng = np.random.default_rng(0)
    satisfied, weights, points, item_mask, factual = random_rubrics(rng)
    low = lambda x: jnp.asarray(x, jnp.bfloat16)  # every value used here is exact in bfloat16
    for fn, values in ((weighted_fraction, weights), (positive_points_score, points), (min_max_score, points)):
        out = fn(low(satisfied), low(values), item_mask)
        assert out.dtype == jnp.float32
        np.testing.assert_allclose(out, fn(satisfied, values, item_mask), rtol=1e-6)
    out = rgr_factual_gated_reward(low(satisfied), low(weights), factual, item_mask)
    assert out.dtype == jnp.float32
    shaped = dapo_overlong_shaping(low(np.ones(B)), np.arange(B) * 10, max_length=100, buffer_length=30, factor=1.0)
    assert shaped.dtype == jnp.float32
    assert srar_base_reward(low(np.ones(B)), low(np.zeros(B))).dtype == jnp.float32
    assert truncation_scaling(low(np.ones(B)), np.ones(B, bool), factor=0.5).dtype == jnp.float32
