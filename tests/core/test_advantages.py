import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.core import advantages as adv
from tests.core import reference_advantages as ref
from tests.core.random_batches import random_group_ids, random_rollouts

# One jitted function per estimator and static configuration: shapes are fixed across draws.
grpo = jax.jit(adv.grpo_advantages, static_argnames=("std_ddof", "eps"))
dr_grpo = jax.jit(adv.dr_grpo_advantages)
batch_std = jax.jit(adv.batch_std_advantages, static_argnames=("std_ddof", "eps"))
rloo = jax.jit(adv.rloo_advantages)
loo_std = jax.jit(adv.loo_std_advantages, static_argnames=("std_ddof", "eps"))
reinforce_pp = jax.jit(adv.reinforce_pp_baseline_advantages, static_argnames=("std_ddof", "eps"))
normalize_then_sum = jax.jit(adv.normalize_then_sum_advantages, static_argnames=("std_ddof", "eps"))


# ---------------------------------------------------------------- hand-computed cases


def test_grpo_hand_computed_sample_and_population_std():
    rewards = jnp.array([1.0, 0.0, 0.0, 1.0])
    ids = jnp.zeros(4, jnp.int32)
    # mean 0.5; sample std sqrt(1/3); population std 0.5
    np.testing.assert_allclose(grpo(rewards, ids, std_ddof=1, eps=0.0), [0.866025, -0.866025, -0.866025, 0.866025], rtol=1e-5)
    np.testing.assert_allclose(grpo(rewards, ids, std_ddof=0, eps=0.0), [1.0, -1.0, -1.0, 1.0], rtol=1e-6)


def test_grpo_epsilon_enters_the_denominator():
    rewards = jnp.array([1.0, 0.0])
    # population std 0.5, eps 0.5 -> (0.5) / (1.0)
    np.testing.assert_allclose(grpo(rewards, jnp.array([3, 3]), std_ddof=0, eps=0.5), [0.5, -0.5], rtol=1e-6)


def test_two_groups_are_normalised_separately():
    rewards = jnp.array([1.0, 0.0, 5.0, 7.0])
    ids = jnp.array([10, 10, 20, 20])
    np.testing.assert_allclose(grpo(rewards, ids, std_ddof=0, eps=0.0), [1.0, -1.0, -1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(dr_grpo(rewards, ids), [0.5, -0.5, -1.0, 1.0], rtol=1e-6)


def test_rloo_hand_computed():
    # others of 1.0 are [0, 0] -> 1.0; others of each 0.0 are [1, 0] -> -0.5; equals n/(n-1) (r - mean)
    np.testing.assert_allclose(rloo(jnp.array([1.0, 0.0, 0.0]), jnp.zeros(3, jnp.int32)), [1.0, -0.5, -0.5], rtol=1e-6)


def test_loo_std_hand_computed_rubric_grounded_eqs_4_to_6():
    rewards = jnp.array([1.0, 0.0, 0.0, 1.0])
    # i = 0: others [0, 0, 1], baseline 1/3, sample std sqrt(1/3) -> (2/3) / sqrt(1/3) = 1.1547
    out = loo_std(rewards, jnp.zeros(4, jnp.int32), std_ddof=1, eps=0.0)
    np.testing.assert_allclose(out, [1.154701, -1.154701, -1.154701, 1.154701], rtol=1e-5)


def test_loo_std_divides_only_where_the_others_vary():
    # others of the 1.0 are [0, 0]: std 0 -> plain difference 1.0; others of a 0.0 are [0, 1]
    out = loo_std(jnp.array([1.0, 0.0, 0.0]), jnp.zeros(3, jnp.int32), std_ddof=1, eps=0.0)
    np.testing.assert_allclose(out, [1.0, -0.5 / np.sqrt(0.5), -0.5 / np.sqrt(0.5)], rtol=1e-5)


def test_batch_std_uses_group_mean_and_batch_std():
    rewards = jnp.array([1.0, 0.0, 3.0, 3.0])
    ids = jnp.array([0, 0, 1, 1])
    scale = np.std([1.0, 0.0, 3.0, 3.0], ddof=1)
    np.testing.assert_allclose(batch_std(rewards, ids, std_ddof=1, eps=0.0), [0.5 / scale, -0.5 / scale, 0, 0], rtol=1e-5)


def test_reinforce_pp_whitens_over_tokens_not_rows():
    rewards = jnp.array([1.0, 0.0, 1.0, 0.0])
    ids = jnp.array([0, 0, 1, 1])
    mask = jnp.array([[1, 1, 1], [1, 0, 0], [1, 0, 0], [1, 0, 0]], bool)
    out = reinforce_pp(rewards, ids, mask, std_ddof=0, eps=0.0)
    # centred 0.5 on 3 + 1 tokens, -0.5 on 1 + 1 tokens: token mean 1/6, token std sqrt(2)/3
    tokens = np.array([0.5] * 3 + [-0.5] + [0.5] + [-0.5])
    expected = (tokens - tokens.mean()) / tokens.std()
    np.testing.assert_allclose(np.asarray(out)[np.asarray(mask)], expected, rtol=1e-5)
    assert float(out[1, 1]) == 0.0


def test_normalize_then_sum_ignores_a_component_that_ties_within_groups():
    rewards = jnp.array([[1.0, 5.0], [0.0, 5.0], [1.0, 9.0], [0.0, 9.0]])  # 2nd component constant per group
    ids = jnp.array([0, 0, 1, 1])
    both = normalize_then_sum(rewards, jnp.array([1.0, 1.0]), ids, std_ddof=0, eps=0.0)
    first_only = normalize_then_sum(rewards, jnp.array([1.0, 0.0]), ids, std_ddof=0, eps=0.0)
    np.testing.assert_allclose(both, first_only, rtol=1e-6)
    np.testing.assert_allclose(both, [1.0, -1.0, 1.0, -1.0], rtol=1e-6)


# ---------------------------------------------------------------- vectorised JAX vs the NumPy loop reference


@pytest.mark.parametrize("std_ddof", [0, 1])
@pytest.mark.parametrize("seed", range(40))
def test_estimators_match_the_loop_reference(seed, std_ddof):
    rng = np.random.default_rng(seed)
    batch = random_rollouts(rng)
    r, ids, valid = batch.rewards, batch.group_ids, batch.valid
    tol = dict(rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(grpo(r, ids, valid, std_ddof=std_ddof, eps=1e-6), ref.grpo(r, ids, valid, std_ddof), **tol)
    np.testing.assert_allclose(dr_grpo(r, ids, valid), ref.dr_grpo(r, ids, valid), **tol)
    np.testing.assert_allclose(
        batch_std(r, ids, valid, std_ddof=std_ddof, eps=1e-6), ref.batch_std(r, ids, valid, std_ddof), **tol
    )
    np.testing.assert_allclose(rloo(r, ids, valid), ref.rloo(r, ids, valid), **tol)
    np.testing.assert_allclose(
        loo_std(r, ids, valid, std_ddof=std_ddof, eps=1e-6), ref.loo_std(r, ids, valid, std_ddof), **tol
    )
    np.testing.assert_allclose(
        reinforce_pp(r, ids, batch.response_mask, valid, std_ddof=std_ddof, eps=1e-8),
        ref.reinforce_pp_baseline(r, ids, batch.response_mask, valid, std_ddof),
        **tol,
    )
    rewards_bm = np.stack([r, rng.integers(0, 2, r.shape[0]).astype(np.float32)], axis=1)
    weights = np.array([0.7, 0.3], np.float32)
    np.testing.assert_allclose(
        normalize_then_sum(rewards_bm, weights, ids, valid, std_ddof=std_ddof, eps=1e-6),
        ref.normalize_then_sum(rewards_bm, weights, ids, valid, std_ddof),
        **tol,
    )


def test_bfloat16_rewards_are_promoted_and_match_float32():
    rng = np.random.default_rng(0)
    rewards = rng.integers(0, 5, 16).astype(np.float32) / 4  # exactly representable in bfloat16
    ids = random_group_ids(rng, 16)
    for fn in (adv.grpo_advantages, adv.dr_grpo_advantages, adv.rloo_advantages, adv.loo_std_advantages):
        low = jax.jit(fn)(jnp.asarray(rewards, jnp.bfloat16), ids)
        assert low.dtype == jnp.float32
        np.testing.assert_allclose(low, jax.jit(fn)(rewards, ids), rtol=1e-6)


# ---------------------------------------------------------------- REFERENCE.md section 4: the bugs we owe tests for


def test_reference_item_1_empty_response_reward_lands_on_no_token_and_leaks_into_no_mean():
    rewards = jnp.array([1.0, 0.0, 0.0, 7.0])  # the last rollout is empty: its reward must go nowhere
    ids = jnp.zeros(4, jnp.int32)
    response_mask = jnp.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0]], bool)
    row_valid = response_mask.any(axis=1)
    tokens = adv.broadcast_to_tokens(grpo(rewards, ids, row_valid), response_mask)
    without = adv.broadcast_to_tokens(grpo(rewards[:3], ids[:3]), response_mask[:3])
    np.testing.assert_array_equal(tokens[:3], without)
    np.testing.assert_array_equal(tokens[3], 0.0)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "batch_std", "rloo", "loo_std"])
def test_reference_item_2_masked_sample_is_excluded_from_its_group_mean_and_std(name):
    fn = {"grpo": grpo, "dr_grpo": dr_grpo, "batch_std": batch_std, "rloo": rloo, "loo_std": loo_std}[name]
    rewards = jnp.array([1.0, 0.0, 0.5, 1e6])
    ids = jnp.array([4, 4, 4, 4])
    mask = jnp.array([True, True, True, False])
    masked = fn(rewards, ids, mask)
    np.testing.assert_allclose(masked[:3], fn(rewards[:3], ids[:3]), rtol=1e-6)
    assert float(masked[3]) == 0.0


def test_reference_item_3_near_tied_rewards_equal_the_loop_with_no_hidden_variance_floor():
    base = np.float32(0.5)
    ulp = np.nextafter(base, np.float32(1))
    rewards = np.array([base, ulp, base, ulp], np.float32)
    ids = np.zeros(4, np.int32)
    out = np.asarray(grpo(rewards, ids, std_ddof=1, eps=0.0))
    expected = ref.grpo(rewards, ids, np.ones(4, bool), std_ddof=1, eps=0.0)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    np.testing.assert_allclose(np.abs(out), np.sqrt(3) / 2, rtol=1e-6)  # a real unit-scale signal, not 0


def test_reference_item_4_loo_residue_rewards_0_35_with_seven_of_eight_equal_keep_advantage_bounded():
    rewards = jnp.array([0.35] * 7 + [1.0], jnp.float32)
    ids = jnp.zeros(8, jnp.int32)
    out = np.asarray(loo_std(rewards, ids, std_ddof=1, eps=1e-6))
    # the outlier's others tie exactly: std 0, advantage = 1.0 - 0.35, no division by a residue
    np.testing.assert_allclose(out[7], np.float32(1.0) - np.float32(0.35), rtol=1e-6)
    assert np.all(np.abs(out) <= 2.0)
    np.testing.assert_allclose(out, ref.loo_std(np.asarray(rewards), np.zeros(8), np.ones(8, bool)), rtol=1e-5)


def test_reference_item_6_single_sample_groups_get_zero_advantage():
    rewards = jnp.array([0.9, 0.1, 0.4])
    ids = jnp.array([1, 2, 2])
    for fn in (grpo, dr_grpo, rloo, loo_std):
        assert float(fn(rewards, ids)[0]) == 0.0


@pytest.mark.parametrize("value", [0.35, 0.1, 1.0 / 3.0, -7.25, 1e-7])
def test_reference_item_10_all_equal_group_gives_exactly_zero(value):
    rewards = jnp.full((7,), value, jnp.float32)
    ids = jnp.zeros(7, jnp.int32)
    for fn in (grpo, dr_grpo, rloo, loo_std):
        assert np.all(np.asarray(fn(rewards, ids)) == 0.0)


# ---------------------------------------------------------------- properties


@st.composite
def grouped_rewards(draw):
    size = 12
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    rewards = np.array(draw(st.lists(st.floats(-10, 10, width=32), min_size=size, max_size=size)), np.float32)
    return rewards, random_group_ids(rng, size)


@given(grouped_rewards())
def test_grpo_is_zero_sum_in_every_group(data):
    rewards, ids = data
    out = np.asarray(grpo(rewards, ids, std_ddof=1, eps=1e-6), np.float64)
    for g in np.unique(ids):
        assert abs(out[ids == g].sum()) <= 1e-4 * max(1, ids[ids == g].size)


@given(grouped_rewards())
def test_grpo_population_std_gives_unit_second_moment(data):
    rewards, ids = data
    out = np.asarray(grpo(rewards, ids, std_ddof=0, eps=0.0), np.float64)
    for g in np.unique(ids):
        group = rewards[ids == g]
        if group.size > 1 and np.ptp(group) > 1e-3:
            np.testing.assert_allclose(np.mean(out[ids == g] ** 2), 1.0, rtol=1e-4)


@given(grouped_rewards(), st.integers(0, 2**31 - 1))
def test_estimators_are_permutation_equivariant_and_ignore_id_values(data, seed):
    rewards, ids = data
    rng = np.random.default_rng(seed)
    perm = rng.permutation(rewards.size)
    relabel = {g: int(v) for g, v in zip(np.unique(ids), rng.choice(50_000, np.unique(ids).size, replace=False))}
    new_ids = np.array([relabel[g] for g in ids], np.int32)
    for fn in (grpo, rloo, loo_std):
        np.testing.assert_allclose(fn(rewards[perm], new_ids[perm]), np.asarray(fn(rewards, ids))[perm], rtol=1e-5, atol=1e-6)


@given(grouped_rewards())
def test_rloo_equals_scaled_dr_grpo(data):
    rewards, ids = data
    sizes = np.array([np.sum(ids == g) for g in ids])
    scale = np.where(sizes > 1, sizes / np.maximum(sizes - 1, 1), 0)
    np.testing.assert_allclose(rloo(rewards, ids), scale * np.asarray(dr_grpo(rewards, ids)), rtol=1e-4, atol=1e-4)


def test_estimators_vmap_over_a_leading_axis():
    rewards = jnp.array([[1.0, 0.0, 1.0], [0.2, 0.4, 0.4]])
    ids = jnp.array([0, 0, 1])
    batched = jax.vmap(functools.partial(adv.grpo_advantages, group_ids=ids))(rewards)
    np.testing.assert_allclose(batched[1], adv.grpo_advantages(rewards[1], ids), rtol=1e-6)
