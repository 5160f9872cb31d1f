"""rubric_jax.core.value against hand-computed cases, against verl's loops transcribed in NumPy
(tests/core/reference_value.py) on random batches with left-padded prompt regions, gaps, empty and padding rows,
and hypothesis properties of GAE and the clipped value loss."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rubric_jax.core import aggregation, value
from rubric_jax.core.advantages import whiten_tokens, whiten_tokens_by_group
from tests.core import reference_value as ref

F32 = dict(rtol=2e-5, atol=2e-6)
SEEDS = range(25)

gae = jax.jit(value.gae_advantages, static_argnames=("gamma", "lam"))
value_loss = jax.jit(value.clipped_value_loss, static_argnames="clip")
last_token = jax.jit(value.last_token_rewards)


def value_loss_and_grad(values_bt, old_values_bt, returns_bt, mask_bt, clip):
    """(loss_bt, info, d sum(loss_bt) / d values_bt): each token's loss depends on its own value only."""

    def total(v):
        loss_bt, info = value.clipped_value_loss(v, old_values_bt, returns_bt, mask_bt, clip=clip)
        return jnp.sum(loss_bt), (loss_bt, info)

    (_, (loss_bt, info)), grad_bt = jax.value_and_grad(total, has_aux=True)(values_bt)
    return loss_bt, info, grad_bt


# ---------------------------------------------------------------- hand-computed cases


def test_gae_by_hand_with_a_prompt_region_a_gap_right_padding_and_an_empty_row():
    mask = np.array([[0, 0, 1, 1, 1], [0, 1, 0, 1, 0], [0, 0, 0, 0, 0]], bool)
    rewards = np.array([[5.0, 5.0, 0.0, 0.0, 1.0], [9.0, 0.0, 7.0, 2.0, 9.0], [1.0, 1.0, 1.0, 1.0, 1.0]], np.float32)
    values = np.array([[8.0, 8.0, 0.5, 0.2, -0.1], [9.0, 1.0, 9.0, 0.5, 9.0], [3.0, 3.0, 3.0, 3.0, 3.0]], np.float32)
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # Row 0, tokens 2..4 (gamma lam = 0.72):
    #   t=4: delta = 1 + 0.9 * 0 - (-0.1) = 1.1,          A = 1.1
    #   t=3: delta = 0 + 0.9 * (-0.1) - 0.2 = -0.29,      A = -0.29 + 0.72 * 1.1 = 0.502
    #   t=2: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32,         A = -0.32 + 0.72 * 0.502 = 0.04144
    # Row 1, tokens 1 and 3 (the gap at 2 and its reward 7 and value 9 are skipped):
    #   t=3: delta = 2 - 0.5 = 1.5,                       A = 1.5
    #   t=1: delta = 0 + 0.9 * 0.5 - 1.0 = -0.55,         A = -0.55 + 0.72 * 1.5 = 0.53
    np.testing.assert_allclose(advantages, [[0, 0, 0.04144, 0.502, 1.1], [0, 0.53, 0, 1.5, 0], [0] * 5], **F32)
    np.testing.assert_allclose(returns, [[0, 0, 0.54144, 0.702, 1.0], [0, 1.53, 0, 2.0, 0], [0] * 5], **F32)


def test_value_loss_by_hand():
    # c = 0.2; each token: V, V_old, R -> clip(V) in [V_old - c, V_old + c], 0.5 * max((V - R)^2, (clip(V) - R)^2)
    #   1.0, 0.5, 1.0:  clip 0.7, max(0, 0.09) = 0.09 (the clipped error)     -> 0.045, clipped
    #   0.6, 0.5, 2.0:  clip 0.6, equal errors 1.96                           -> 0.98, not clipped
    #   0.0, 0.5, -1.0: clip 0.3, max(1, 1.69) = 1.69                         -> 0.845, clipped
    #   0.0, 0.5, 1.0:  clip 0.3, max(1, 0.49) = 1                            -> 0.5, not clipped
    #   masked token (NaN everywhere)                                         -> 0
    values = np.array([[1.0, 0.6, 0.0, 0.0, np.nan]], np.float32)
    old = np.array([[0.5, 0.5, 0.5, 0.5, np.nan]], np.float32)
    returns = np.array([[1.0, 2.0, -1.0, 1.0, np.nan]], np.float32)
    mask = np.array([[1, 1, 1, 1, 0]], bool)
    loss, info, grad = value_loss_and_grad(values, old, returns, mask, 0.2)
    np.testing.assert_allclose(loss, [[0.045, 0.98, 0.845, 0.5, 0.0]], **F32)
    np.testing.assert_array_equal(info.clipped_bt, [[True, False, True, False, False]])
    # The clipped branch passes no gradient; otherwise d/dV 0.5 (V - R)^2 = V - R.
    np.testing.assert_allclose(grad, [[0.0, -1.4, 0.0, -1.0, 0.0]], **F32)
    terms = aggregation.token_mean(loss, mask)
    np.testing.assert_allclose(aggregation.finalize(*terms), (0.045 + 0.98 + 0.845 + 0.5) / 4, **F32)


def test_last_token_rewards_by_hand():
    mask = np.array([[0, 1, 1, 0], [0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]], bool)
    np.testing.assert_array_equal(
        last_token(np.array([2.0, 3.0, 4.0, 5.0], np.float32), mask),
        [[0, 0, 2, 0], [0, 0, 0, 0], [0, 0, 4, 0], [0, 0, 0, 5]])


# ---------------------------------------------------------------- verl's loops on random batches


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 1.0)])
def test_gae_equals_verls_loop(seed, gamma, lam):
    batch = ref.random_value_batch(np.random.RandomState(seed))
    advantages, returns = gae(batch.rewards, batch.values, batch.mask, gamma=gamma, lam=lam)
    expected_advantages, expected_returns = ref.verl_gae(batch.rewards, batch.values, batch.mask, gamma, lam)
    for actual, expected in ((advantages, expected_advantages), (returns, expected_returns)):
        actual = np.asarray(actual)
        assert actual.dtype == np.float32 and np.all(np.isfinite(actual))
        np.testing.assert_allclose(actual[batch.mask], expected[batch.mask], **F32)
        assert np.all(actual[~batch.mask] == 0)


@pytest.mark.parametrize("seed", SEEDS)
def test_whitened_gae_equals_verls_masked_whiten(seed):
    batch = ref.random_value_batch(np.random.RandomState(seed))
    if batch.mask.sum() < 2:
        pytest.skip("verl's unbiased variance needs two valid tokens")
    advantages, _ = gae(batch.rewards, batch.values, batch.mask, gamma=1.0, lam=0.95)
    expected = ref.verl_whiten(ref.verl_gae(batch.rewards, batch.values, batch.mask, 1.0, 0.95)[0], batch.mask)
    # verl divides by sqrt(var + 1e-8), whiten_tokens by std + 1e-8: equal to ~1e-8 relative unless var ~ 0.
    np.testing.assert_allclose(whiten_tokens(advantages, batch.mask), expected, rtol=1e-4, atol=1e-5)


def test_whitening_by_role_by_hand():
    """RLCER's roles (rlcer.txt, sections 4.1 and 4.5: advantages "computed separately for each role"), with role
    ids 7 (reasoner rows 0-1) and 3 (rubricator row 2).
    Per role: reasoner tokens 1, 3, 5: mean 3, sample std sqrt((4 + 0 + 4) / 2) = 2 -> -1, 0, 1; rubricator tokens
    10, 20, 30: mean 20, std sqrt((100 + 0 + 100) / 2) = 10 -> -1, 0, 1.
    Jointly: the six tokens have mean 69 / 6 = 11.5 and sample variance (10.5^2 + 8.5^2 + 6.5^2 + 1.5^2 + 8.5^2
    + 18.5^2) / 5 = 641.5 / 5, so every reasoner token is negative: the rubricator's scale sets the reasoner's."""
    values = np.array([[1.0, 3.0, 99.0], [5.0, -7.0, 99.0], [10.0, 20.0, 30.0]], np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], bool)
    by_role = whiten_tokens_by_group(values, np.array([7, 7, 3], np.int32), mask)
    np.testing.assert_allclose(by_role, [[-1, 0, 0], [1, 0, 0], [-1, 0, 1]], atol=1e-6)
    std = np.sqrt(641.5 / 5)
    joint = np.array([[1 - 11.5, 3 - 11.5, 0], [5 - 11.5, 0, 0], [10 - 11.5, 20 - 11.5, 30 - 11.5]]) / std
    np.testing.assert_allclose(whiten_tokens(values, mask), joint, rtol=1e-6)
    np.testing.assert_allclose(whiten_tokens_by_group(values, np.zeros(3, np.int32), mask), joint, rtol=1e-6)
    # A role with one valid token has no sample std: 0, and the other role is whitened as before.
    one = mask.copy()
    one[0] = [1, 0, 0]
    one[1] = False
    np.testing.assert_allclose(whiten_tokens_by_group(values, np.array([7, 7, 3], np.int32), one)[:2], 0)


@pytest.mark.parametrize("seed", SEEDS)
def test_whitening_by_role_equals_verls_masked_whiten_per_role(seed):
    rng = np.random.RandomState(seed)
    batch = ref.random_value_batch(rng)
    roles = rng.randint(0, 3, batch.mask.shape[0]).astype(np.int32)
    advantages, _ = gae(batch.rewards, batch.values, batch.mask, gamma=1.0, lam=0.95)
    expected = ref.verl_whiten_by_group(ref.verl_gae(batch.rewards, batch.values, batch.mask, 1.0, 0.95)[0],
                                        batch.mask, roles)
    # verl divides by sqrt(var + 1e-8), the whitening by std + 1e-8 (test_whitened_gae_equals_verls_masked_whiten).
    np.testing.assert_allclose(whiten_tokens_by_group(advantages, roles, batch.mask), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("clip", [0.0, 0.2, 0.5, 1e6])
def test_value_loss_equals_verls(seed, clip):
    batch = ref.random_value_batch(np.random.RandomState(seed))
    loss, info, grad = jax.jit(value_loss_and_grad, static_argnums=4)(
        batch.new_values, batch.values, batch.returns, batch.mask, clip)
    expected_loss, expected_clipped = ref.verl_value_loss(batch.new_values, batch.values, batch.returns,
                                                          batch.mask, clip)
    np.testing.assert_allclose(loss, expected_loss, **F32)
    np.testing.assert_array_equal(info.clipped_bt, expected_clipped)
    new_values, returns = (np.where(batch.mask, x, 0).astype(np.float64) for x in (batch.new_values, batch.returns))
    expected_grad = np.where(expected_clipped, 0.0, new_values - returns)
    np.testing.assert_allclose(grad, expected_grad, **F32)
    for mode in (aggregation.token_mean, aggregation.seq_mean_token_mean):
        terms = mode(loss, batch.mask)
        assert np.isfinite(terms.loss_sum) and np.isfinite(terms.denominator)


@pytest.mark.parametrize("seed", SEEDS)
def test_last_token_rewards_equal_the_loop(seed):
    batch = ref.random_value_batch(np.random.RandomState(seed))
    rewards_b = np.random.RandomState(seed).normal(size=batch.mask.shape[0]).astype(np.float32)
    np.testing.assert_allclose(last_token(rewards_b, batch.mask), ref.last_token(rewards_b, batch.mask), **F32)


def test_bfloat16_inputs_are_promoted_and_vmap_over_runs_works():
    batch = ref.random_value_batch(np.random.RandomState(0))
    rewards = np.where(batch.mask, batch.rewards, 0)
    values = np.where(batch.mask, batch.values, 0)
    advantages, _ = gae(jnp.asarray(rewards, jnp.bfloat16), jnp.asarray(values, jnp.bfloat16), batch.mask,
                        gamma=0.99, lam=0.95)
    assert advantages.dtype == jnp.float32
    rounded = [np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64) for x in (rewards, values)]
    np.testing.assert_allclose(advantages, ref.verl_gae(*rounded, batch.mask, 0.99, 0.95)[0] * batch.mask, **F32)
    runs = jax.vmap(functools.partial(value.gae_advantages, gamma=0.99, lam=0.95))(
        np.stack([rewards, -rewards]), np.stack([values, -values]), np.stack([batch.mask, batch.mask]))
    np.testing.assert_allclose(runs[0][1], -runs[0][0], **F32)


# ---------------------------------------------------------------- properties

B, T = 3, 7
floats = st.floats(-10, 10, width=32)
token_arrays = arrays(np.float32, (B, T), elements=floats)
masks = arrays(np.bool_, (B, T))
gammas = st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0])
lams = st.sampled_from([0.0, 0.5, 0.95, 1.0])


def suffix_sums(x, mask, gamma):
    """sum_{j >= i} gamma^(j - i) x_{t_j} over each row's valid tokens t_1 < t_2 < ..., 0 off the mask."""
    out = np.zeros(x.shape)
    for b in range(x.shape[0]):
        running = 0.0
        for t in reversed(range(x.shape[1])):
            if mask[b, t]:
                running = float(x[b, t]) + gamma * running
                out[b, t] = running
    return out


@given(token_arrays, token_arrays, masks)
def test_gamma_and_lambda_one_give_returns_equal_to_the_reward_to_go(rewards, values, mask):
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    reward_to_go = suffix_sums(rewards, mask, 1.0)
    np.testing.assert_allclose(returns, reward_to_go, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(advantages, np.where(mask, reward_to_go - values, 0), rtol=1e-5, atol=1e-4)


@given(token_arrays, masks, gammas, lams)
def test_perfect_values_give_zero_advantage(rewards, mask, gamma, lam):
    # V_t = the discounted return from t: every TD error is 0, so every advantage is, whatever lambda.
    perfect = suffix_sums(rewards, mask, gamma).astype(np.float32)
    advantages, returns = gae(rewards, perfect, mask, gamma=gamma, lam=lam)
    np.testing.assert_allclose(advantages, 0, atol=1e-4)
    np.testing.assert_allclose(returns, perfect, rtol=1e-5, atol=1e-4)
    zero_advantages, _ = gae(np.zeros_like(rewards), np.zeros_like(rewards), mask, gamma=gamma, lam=lam)
    assert np.all(np.asarray(zero_advantages) == 0)


@given(token_arrays, token_arrays, masks, gammas, lams, st.integers(0, T), st.integers(1, 3), floats)
def test_masked_columns_anywhere_change_nothing(rewards, values, mask, gamma, lam, at, width, junk):
    # Masked columns inserted anywhere (a wider left-padded prompt, a gap, right padding), holding any values:
    # the valid tokens' outputs are unchanged and the new columns are 0.
    advantages, returns = gae(rewards, values, mask, gamma=gamma, lam=lam)

    def widen(x, fill):
        return np.insert(x, [at] * width, fill, axis=1)

    wide_advantages, wide_returns = gae(widen(rewards, junk), widen(values, np.nan), widen(mask, False),
                                        gamma=gamma, lam=lam)
    kept = np.ones(T + width, bool)
    kept[at:at + width] = False
    for wide, narrow in ((wide_advantages, advantages), (wide_returns, returns)):
        wide = np.asarray(wide)
        np.testing.assert_array_equal(wide[:, kept], narrow)
        assert np.all(wide[:, ~kept] == 0)


@given(token_arrays, token_arrays, masks, gammas)
def test_lambda_zero_gives_the_one_step_td_error(rewards, values, mask, gamma):
    advantages, _ = gae(rewards, values, mask, gamma=gamma, lam=0.0)
    expected = np.zeros((B, T))
    for b in range(B):
        valid = np.flatnonzero(mask[b])
        for i, t in enumerate(valid):
            next_value = float(values[b, valid[i + 1]]) if i + 1 < len(valid) else 0.0
            expected[b, t] = float(rewards[b, t]) + gamma * next_value - float(values[b, t])
    np.testing.assert_allclose(advantages, expected, rtol=1e-5, atol=1e-4)


@given(token_arrays, token_arrays, token_arrays, masks, st.sampled_from([0.0, 0.1, 0.5, 2.0]))
def test_the_value_loss_bounds_the_plain_squared_error_and_clips_only_beyond_the_range(
        values, old_values, returns, mask, clip):
    loss, info = value_loss(values, old_values, returns, mask, clip=clip)
    plain = np.where(mask, 0.5 * (values.astype(np.float64) - returns) ** 2, 0)
    assert np.all(np.asarray(loss) >= plain * (1 - 1e-6) - 1e-6)
    beyond = np.abs(values.astype(np.float64) - old_values) > clip
    assert not np.any(np.asarray(info.clipped_bt) & ~(beyond & mask))
    unclipped_loss, unclipped_info = value_loss(values, old_values, returns, mask, clip=1e9)
    np.testing.assert_allclose(unclipped_loss, plain, rtol=1e-5, atol=1e-5)
    assert not np.any(unclipped_info.clipped_bt)


def test_a_negative_clip_is_an_error():
    zeros = np.zeros((1, 2), np.float32)
    with pytest.raises(ValueError, match="clip"):
        value.clipped_value_loss(zeros, zeros, zeros, zeros.astype(bool), clip=-0.1)
