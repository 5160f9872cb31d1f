import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.core import advantages as adv
from tests.core import reference_advantages as ref
from tests.core import reference_estimators as ref_est
from tests.core.random_batches import random_group_ids, random_rewards, random_rollouts

# One jitted function per estimator and static configuration: shapes are fixed across draws.
grpo = jax.jit(adv.grpo_advantages, static_argnames=("std_ddof", "eps"))
dr_grpo = jax.jit(adv.dr_grpo_advantages)
batch_std = jax.jit(adv.batch_std_advantages, static_argnames=("std_ddof", "eps"))
rloo = jax.jit(adv.rloo_advantages)
loo_std = jax.jit(adv.loo_std_advantages, static_argnames=("std_ddof", "eps"))
reinforce_pp = jax.jit(adv.reinforce_pp_baseline_advantages, static_argnames=("std_ddof", "eps"))
normalize_then_sum = jax.jit(adv.normalize_then_sum_advantages, static_argnames=("std_ddof", "eps"))
scale_by_group_std = jax.jit(adv.scale_by_group_std, static_argnames=("std_ddof", "eps"))
pass_at_k = jax.jit(adv.pass_at_k_advantages)
opo = jax.jit(adv.opo_advantages)
remax = jax.jit(adv.remax_advantages)
gpg_alpha = jax.jit(adv.gpg_alpha)
gpg = jax.jit(adv.gpg_advantages)


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
    for fn in (adv.grpo_advantages, adv.dr_grpo_advantages, adv.rloo_advantages, adv.loo_std_advantages,
               adv.pass_at_k_advantages, adv.gpg_advantages):
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


# ---------------------------------------------------------------- verl's further estimators: pass@k, OPO, ReMax, GPG


def test_pass_at_k_hand_computed_only_the_best_gets_its_margin_over_the_second():
    rewards = jnp.array([0.2, 0.9, 0.5, 0.1])
    ids = jnp.zeros(4, jnp.int32)
    # best 0.9, second 0.5: row 1 gets 0.4; removing any other row leaves the max 0.9, so 0
    np.testing.assert_allclose(pass_at_k(rewards, ids), [0.0, 0.4, 0.0, 0.0], rtol=1e-6)
    # verl's std scaling: mean 0.425, squared deviations 0.050625 + 0.225625 + 0.005625 + 0.105625 = 0.3875,
    # sample std sqrt(0.3875 / 3) = 0.359398 -> 0.4 / 0.359398 = 1.112976
    scaled = scale_by_group_std(pass_at_k(rewards, ids), rewards, ids, std_ddof=1, eps=0.0)
    np.testing.assert_allclose(scaled, [0.0, 1.112976, 0.0, 0.0], rtol=1e-5)


def test_pass_at_k_ties_for_the_best_single_samples_and_masked_rows():
    # group 5: two rows tie for the best -> removing one leaves the other: all 0
    # group 6: one valid row -> 0; group 7: its best (1.0) is masked, so 0.7 is the best, 0.3 the runner-up
    rewards = jnp.array([0.9, 0.2, 0.9, 0.4, 1.0, 0.7, 0.3])
    ids = jnp.array([5, 5, 5, 6, 7, 7, 7])
    mask = jnp.array([True, True, True, True, False, True, True])
    np.testing.assert_allclose(pass_at_k(rewards, ids, mask), [0, 0, 0, 0, 0, 0.4, 0], atol=1e-7)


def test_opo_hand_computed_length_weighted_baseline():
    rewards = jnp.array([1.0, 0.0, 0.0])
    ids = jnp.zeros(3, jnp.int32)
    # b = (2 * 1 + 6 * 0 + 2 * 0) / 10 = 0.2; sum l A = 2 * 0.8 - 6 * 0.2 - 2 * 0.2 = 0
    np.testing.assert_allclose(opo(rewards, jnp.array([2, 6, 2]), ids), [0.8, -0.2, -0.2], rtol=1e-6)
    # equal lengths: the plain mean 1/3
    np.testing.assert_allclose(opo(rewards, jnp.array([4, 4, 4]), ids), [2 / 3, -1 / 3, -1 / 3], rtol=1e-6)


def test_opo_single_sample_and_weightless_groups_get_zero():
    # group 1: one row (verl: baseline 0, A = 0.7; ours: its own baseline, 0); group 2: only empty responses
    rewards = jnp.array([0.7, 1.0, 0.0, 0.3, 0.9])
    ids = jnp.array([1, 2, 2, 3, 3])
    lengths = jnp.array([5, 0, 0, 0, 4])
    # group 3: b = 0.9 (the empty row has weight 0) -> the empty row's -0.6 lands on no token, the other's 0
    np.testing.assert_allclose(opo(rewards, lengths, ids), [0, 0, 0, -0.6, 0], atol=1e-6)


def test_remax_hand_computed_greedy_reward_baseline():
    rewards = jnp.array([1.0, 0.0, 1.0, 0.0, 0.25])
    greedy = jnp.array([1.0, 1.0, 0.0, 0.0, 1.0])  # per row: the greedy reward of the row's prompt
    mask = jnp.array([True, True, True, True, False])
    np.testing.assert_allclose(remax(rewards, greedy, mask), [0.0, -1.0, 1.0, 0.0, 0.0], rtol=1e-6)


def test_gpg_hand_computed_alpha_corrects_for_zero_gradient_rows():
    # an informative group of 4, a tied group of 4 and a single sample: B = 9, M = 4 + 1 = 5, alpha = 9 / 4
    rewards = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5])
    ids = jnp.array([0, 0, 0, 0, 1, 1, 1, 1, 2])
    assert float(gpg_alpha(rewards, ids)) == pytest.approx(2.25)
    expected = [1.125, -1.125, -1.125, 1.125, 0, 0, 0, 0, 0]  # 2.25 * (r - 0.5)
    np.testing.assert_allclose(gpg(rewards, ids), expected, rtol=1e-6)
    # F_norm = std: sample std of [1, 0, 0, 1] is sqrt(1/3) -> 1.125 / 0.577350 = 1.948557
    scaled = scale_by_group_std(gpg(rewards, ids), rewards, ids, std_ddof=1, eps=0.0)
    np.testing.assert_allclose(scaled[:4], [1.948557, -1.948557, -1.948557, 1.948557], rtol=1e-5)


def test_gpg_alpha_counts_informative_rows_not_non_zero_rewards_as_verl_does():
    # 8 rows, one informative group of 4: the paper's alpha = 8 / 4 = 2. verl's count_nonzero(r) = 1 would give 8.
    rewards = jnp.array([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    ids = jnp.array([0, 0, 0, 0, 1, 1, 1, 1])
    assert float(gpg_alpha(rewards, ids)) == 2.0
    # masked rows count in neither B nor M: masking the tied group leaves alpha = 4 / 4
    assert float(gpg_alpha(rewards, ids, jnp.arange(8) < 4)) == 1.0
    # nothing informative: alpha 1 and every advantage 0
    assert float(gpg_alpha(jnp.ones(8), ids)) == 1.0


@pytest.mark.parametrize("std_ddof", [0, 1])
@pytest.mark.parametrize("seed", range(40))
def test_further_estimators_match_the_loop_reference(seed, std_ddof):
    rng = np.random.default_rng(seed)
    batch = random_rollouts(rng)
    r, ids, valid = batch.rewards, batch.group_ids, batch.valid
    tol = dict(rtol=2e-5, atol=2e-5)
    expected_pass = ref_est.pass_at_k(r, ids, valid)
    np.testing.assert_allclose(pass_at_k(r, ids, valid), expected_pass, **tol)
    np.testing.assert_allclose(
        scale_by_group_std(pass_at_k(r, ids, valid), r, ids, valid, std_ddof=std_ddof, eps=1e-6),
        ref_est.scale_by_group_std(expected_pass, r, ids, valid, std_ddof, 1e-6),
        **tol,
    )
    lengths = batch.response_mask.sum(axis=1)  # includes empty responses
    np.testing.assert_allclose(opo(r, lengths, ids, valid), ref_est.opo(r, lengths, ids, valid), **tol)
    greedy_of_group = dict(zip(np.unique(ids), random_rewards(rng, np.unique(ids).size)))
    greedy = np.array([greedy_of_group[g] for g in ids], np.float32)
    np.testing.assert_allclose(remax(r, greedy, valid), ref_est.remax(r, greedy, valid), **tol)
    np.testing.assert_allclose(gpg_alpha(r, ids, valid), ref_est.gpg_alpha(r, ids, valid), rtol=1e-6)
    np.testing.assert_allclose(gpg(r, ids, valid), ref_est.gpg(r, ids, valid), **tol)


def test_further_estimators_on_near_tied_float32_rewards_keep_the_exact_difference():
    base = np.float32(0.5)
    ulp = np.nextafter(base, np.float32(1))
    rewards = np.array([base, ulp, base, base], np.float32)
    ids = np.zeros(4, np.int32)
    valid = np.ones(4, bool)
    gap = float(ulp) - float(base)
    np.testing.assert_array_equal(pass_at_k(rewards, ids), [0.0, gap, 0.0, 0.0])
    np.testing.assert_allclose(gpg(rewards, ids), ref_est.gpg(rewards, ids, valid), rtol=1e-6)
    lengths = np.array([3, 1, 2, 2])
    np.testing.assert_allclose(opo(rewards, lengths, ids), ref_est.opo(rewards, lengths, ids, valid), rtol=1e-6)
    assert np.abs(np.asarray(opo(rewards, lengths, ids))).max() > 0  # a real signal, not a variance floor


@pytest.mark.parametrize("value", [0.35, 0.1, 1.0 / 3.0, -7.25, 1e-7])
def test_further_estimators_give_exactly_zero_on_a_group_of_equal_rewards(value):
    rewards = jnp.full((7,), value, jnp.float32)
    ids = jnp.zeros(7, jnp.int32)
    assert np.all(np.asarray(pass_at_k(rewards, ids)) == 0.0)
    assert np.all(np.asarray(opo(rewards, jnp.arange(7) * 3 + 1, ids)) == 0.0)
    assert np.all(np.asarray(gpg(rewards, ids)) == 0.0)
    assert np.all(np.asarray(remax(rewards, rewards)) == 0.0)  # equal to the greedy reward


@st.composite
def masked_grouped_rewards(draw):
    rewards, ids = draw(grouped_rewards())
    mask = np.array(draw(st.lists(st.booleans(), min_size=ids.size, max_size=ids.size)))
    lengths = np.array(draw(st.lists(st.integers(0, 40), min_size=ids.size, max_size=ids.size)), np.int32)
    return rewards, ids, mask, lengths


def further_estimators(rewards, ids, mask, lengths):
    """{name: [B] advantages} of the new estimators on one batch (ReMax against a baseline of 0.25)."""
    return {
        "pass_at_k": pass_at_k(rewards, ids, mask),
        "pass_at_k_std": scale_by_group_std(pass_at_k(rewards, ids, mask), rewards, ids, mask, std_ddof=1, eps=1e-6),
        "opo": opo(rewards, lengths, ids, mask),
        "remax": remax(rewards, np.full(rewards.shape, 0.25, np.float32), mask),
        "gpg": gpg(rewards, ids, mask),
    }


@given(masked_grouped_rewards(), st.integers(0, 2**31 - 1))
def test_further_estimators_are_permutation_equivariant_and_ignore_id_values(data, seed):
    rewards, ids, mask, lengths = data
    rng = np.random.default_rng(seed)
    perm = rng.permutation(rewards.size)
    relabel = {g: int(v) for g, v in zip(np.unique(ids), rng.choice(50_000, np.unique(ids).size, replace=False))}
    new_ids = np.array([relabel[g] for g in ids], np.int32)
    before = further_estimators(rewards, ids, mask, lengths)
    after = further_estimators(rewards[perm], new_ids[perm], mask[perm], lengths[perm])
    for name in before:
        np.testing.assert_allclose(after[name], np.asarray(before[name])[perm], rtol=1e-5, atol=1e-6, err_msg=name)


@given(masked_grouped_rewards())
def test_further_estimators_give_masked_rows_zero_and_equal_dropping_them(data):
    rewards, ids, mask, lengths = data
    masked = further_estimators(rewards, ids, mask, lengths)
    kept = np.flatnonzero(mask)
    dropped = further_estimators(rewards[kept], ids[kept], None, lengths[kept]) if kept.size else {}
    for name, values in masked.items():
        values = np.asarray(values)
        assert np.all(values[~mask] == 0.0), name
        if kept.size:
            np.testing.assert_allclose(values[kept], dropped[name], rtol=1e-5, atol=1e-6, err_msg=name)


@given(masked_grouped_rewards())
def test_pass_at_k_credits_at_most_the_unique_best_of_each_group(data):
    rewards, ids, mask, _ = data
    out = np.asarray(pass_at_k(rewards, ids, mask))
    assert np.all(out >= 0)
    for g in np.unique(ids[mask]):
        members = np.flatnonzero((ids == g) & mask)
        credited = members[out[members] > 0]
        assert credited.size <= 1
        if credited.size:
            values = np.sort(rewards[members].astype(np.float64))
            assert rewards[credited[0]] == values[-1] and out[credited[0]] == pytest.approx(values[-1] - values[-2])


@given(masked_grouped_rewards())
def test_opo_is_length_weighted_zero_sum_and_gpg_zero_sum_in_every_group(data):
    rewards, ids, mask, lengths = data
    out_opo = np.asarray(opo(rewards, lengths, ids, mask), np.float64)
    out_gpg = np.asarray(gpg(rewards, ids, mask), np.float64)
    alpha = float(gpg_alpha(rewards, ids, mask))
    assert alpha >= 1.0
    for g in np.unique(ids[mask]):
        members = (ids == g) & mask
        scale = max(1.0, float(np.abs(rewards[members]).max()))
        assert abs(np.sum(lengths[members] * out_opo[members])) <= 1e-5 * scale * max(1, lengths[members].sum())
        assert abs(out_gpg[members].sum()) <= 1e-5 * scale * alpha * members.sum()


@given(masked_grouped_rewards())
def test_opo_with_equal_lengths_is_dr_grpo_and_gpg_is_alpha_times_dr_grpo(data):
    rewards, ids, mask, _ = data
    centred = np.asarray(dr_grpo(rewards, ids, mask))
    np.testing.assert_allclose(opo(rewards, np.full(ids.shape, 7), ids, mask), centred, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gpg(rewards, ids, mask), float(gpg_alpha(rewards, ids, mask)) * centred, rtol=1e-6, atol=1e-6)


def test_further_estimators_vmap_over_a_leading_axis():
    rewards = jnp.array([[1.0, 0.0, 0.4, 0.3], [0.2, 0.4, 0.4, 0.9]])
    ids = jnp.array([0, 0, 0, 1])
    lengths = jnp.array([3, 1, 2, 5])
    for fn in (adv.pass_at_k_advantages, adv.gpg_advantages,
               lambda r, i: adv.opo_advantages(r, lengths, i)):
        batched = jax.jit(jax.vmap(fn, in_axes=(0, None)))(rewards, ids)
        np.testing.assert_allclose(batched[1], fn(rewards[1], ids), rtol=1e-6)
