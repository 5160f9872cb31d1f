import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rubric_jax.core import aggregation as agg
from rubric_jax.core import losses
from tests.core import reference_losses as ref
from tests.core.reference_losses import BF16_GRAD, F32, SEEDS, draw


def with_token_grad(loss_fn):
    """Jitted (logp_bt, *rest) -> (loss_bt, info, d sum(loss_bt) / d logp_bt): the per-token derivative, since
    each token's loss depends on its own logp only (GSPO's through the stop-gradient construction)."""

    def run(logp_bt, *rest):
        def total(lp):
            loss_bt, info = loss_fn(lp, *rest)
            return jnp.sum(loss_bt), (loss_bt, info)

        (_, (loss_bt, info)), grad = jax.value_and_grad(total, has_aux=True)(logp_bt)
        return loss_bt, info, grad

    return jax.jit(run)


ppo = with_token_grad(functools.partial(losses.ppo_clip_loss, eps_low=0.2, eps_high=0.28))
dual_clip = with_token_grad(functools.partial(losses.dual_clip_ppo_loss, eps_low=0.2, eps_high=0.28, clip_ratio_c=3.0))
gspo = with_token_grad(functools.partial(losses.gspo_loss, eps_low=0.2, eps_high=0.28))
cispo = with_token_grad(functools.partial(losses.cispo_loss, eps_low=0.2, eps_high=0.28))
no_clip = with_token_grad(losses.no_clip_pg_loss)
mixed = with_token_grad(functools.partial(losses.rgr_mixed_policy_loss, gamma=0.1))
tis = jax.jit(losses.tis_weights, static_argnames="cap")
icepop = jax.jit(losses.icepop_weights, static_argnames=("low", "high"))
seq_mask_tis = jax.jit(losses.seq_mask_tis_weights, static_argnames=("low", "high"))
entropy_bonus = jax.jit(losses.subtract_entropy_bonus, static_argnames="coeff")
shaping = jax.jit(losses.off_policy_shaping, static_argnames="gamma")
log_ratio = jax.jit(losses.clamped_log_ratio, static_argnames="clamp")
gspo_ratio = jax.jit(losses.gspo_sequence_ratio)


def assert_values(actual, expected):
    actual = np.asarray(actual)
    assert actual.dtype == np.float32
    assert np.all(np.isfinite(actual))
    np.testing.assert_allclose(actual, expected, **F32)


def assert_grads(actual, expected, dtype):
    actual = np.asarray(actual).astype(np.float64)
    assert np.all(np.isfinite(actual))
    np.testing.assert_allclose(actual, expected, **(F32 if dtype == np.float32 else BF16_GRAD))


def assert_matches(out, expected: ref.RefLoss, dtype):
    loss_bt, info, grad = out
    assert_values(loss_bt, expected.loss)
    assert_values(info.ratio_bt, expected.ratio)
    np.testing.assert_array_equal(info.clipped_bt, expected.clipped)
    assert_grads(grad, expected.grad, dtype)


# ---------------------------------------------------------------- hand-computed cases


def tokens(*values):
    return jnp.asarray([values], jnp.float32)


ALL = jnp.ones((1, 2), bool)


def test_ppo_clip_hand_computed_clip_higher():
    # r = 1.5: A = +1 -> -min(1.5, 1.28) = -1.28 (clipped); A = -1 -> -min(-1.5, -1.28) = 1.5 (not clipped)
    logp, old = tokens(math.log(1.5), math.log(1.5)), tokens(0.0, 0.0)
    loss, info, _ = ppo(logp, old, tokens(1.0, -1.0), ALL)
    np.testing.assert_allclose(loss, [[-1.28, 1.5]], rtol=1e-6)
    np.testing.assert_array_equal(info.clipped_bt, [[True, False]])
    # r = 0.5: A = +1 -> -min(0.5, 0.8) = -0.5; A = -1 -> -min(-0.5, -0.8) = 0.8 (clipped at 1 - eps_low)
    loss, info, grad = ppo(tokens(math.log(0.5), math.log(0.5)), old, tokens(1.0, -1.0), ALL)
    np.testing.assert_allclose(loss, [[-0.5, 0.8]], rtol=1e-6)
    np.testing.assert_array_equal(info.clipped_bt, [[False, True]])
    np.testing.assert_allclose(grad, [[-0.5, 0.0]], rtol=1e-6)  # d(-r A)/dlogp = -r A; clipped: 0


def test_ppo_clip_hand_computed_symmetric():
    loss, _ = losses.ppo_clip_loss(tokens(math.log(1.5), math.log(1.5)), tokens(0.0, 0.0), tokens(1.0, -1.0), ALL)
    np.testing.assert_allclose(loss, [[-1.2, 1.5]], rtol=1e-6)


def test_dual_clip_hand_computed():
    # A = -2, c = 3, eps 0.2: r = 4 -> ppo 8, capped at -A c = 6; r = 2 -> 4; r = 0.5 -> -min(-1, -1.6) = 1.6
    logp = jnp.log(jnp.asarray([[4.0, 2.0, 0.5, 4.0]]))
    advantages = jnp.asarray([[-2.0, -2.0, -2.0, 2.0]])
    mask = jnp.ones((1, 4), bool)
    loss_fn = functools.partial(losses.dual_clip_ppo_loss, clip_ratio_c=3.0)
    loss, info = loss_fn(logp, jnp.zeros((1, 4)), advantages, mask)
    np.testing.assert_allclose(loss, [[6.0, 4.0, 1.6, -2.4]], rtol=1e-6)  # A > 0 untouched: -min(8, 2.4)
    np.testing.assert_array_equal(info.dual_clipped_bt, [[True, False, False, False]])
    grad = jax.jit(jax.grad(lambda lp: jnp.sum(loss_fn(lp, jnp.zeros((1, 4)), advantages, mask)[0])))(logp)
    np.testing.assert_allclose(grad, [[0.0, 4.0, 0.0, 0.0]], rtol=1e-6)


@pytest.mark.parametrize("c", [1.0, 0.5, -3.0])
def test_dual_clip_rejects_c_not_above_one(c):
    with pytest.raises(ValueError, match="clip_ratio_c > 1"):
        losses.dual_clip_ppo_loss(tokens(0.0, 0.0), tokens(0.0, 0.0), tokens(1.0, 1.0), ALL, clip_ratio_c=c)


def test_gspo_hand_computed():
    # per-token log r 0.1 and 0.3 -> s = exp(0.2) = 1.2214 for both tokens
    logp, old, advantages = tokens(0.1, 0.3), tokens(0.0, 0.0), tokens(1.0, 1.0)
    loss, info = losses.gspo_loss(logp, old, advantages, ALL)  # paper's clip range (3e-4, 4e-4)
    np.testing.assert_allclose(loss, [[-1.0004, -1.0004]], rtol=1e-6)
    assert bool(info.clipped_bt.all())
    loss, info = losses.gspo_loss(logp, old, advantages, ALL, eps_low=0.2, eps_high=0.28)
    np.testing.assert_allclose(loss, [[-math.exp(0.2)] * 2], rtol=1e-6)
    assert not bool(info.clipped_bt.any())


def test_cispo_hand_computed_value_and_stop_gradient():
    # r = 1.5, A = 2, logp = -0.5, eps_high 0.28: weight 1.28 -> loss = -1.28 * 2 * -0.5 = 1.28
    # r = 1.1 inside the band: weight 1.1 -> loss = -1.1 * 2 * -0.5 = 1.1
    logp = tokens(-0.5, -0.5)
    old = logp - jnp.log(tokens(1.5, 1.1))
    loss, info, grad = cispo(logp, old, tokens(2.0, 2.0), ALL)  # eps_low 0.2, eps_high 0.28
    np.testing.assert_allclose(loss, [[1.28, 1.1]], rtol=1e-6)
    np.testing.assert_array_equal(info.clipped_bt, [[True, False]])
    # the weight is detached: the gradient is -w A, clipped tokens included, not d(-r A logp)/dlogp
    np.testing.assert_allclose(grad, [[-2.56, -2.2]], rtol=1e-6)


def test_cispo_default_has_no_lower_bound():
    logp = tokens(-1.0, -1.0)
    loss, info = losses.cispo_loss(logp, logp - jnp.log(tokens(0.1, 0.5)), tokens(1.0, 1.0), ALL, eps_high=0.28)
    np.testing.assert_allclose(loss, [[0.1, 0.5]], rtol=1e-5)
    assert not bool(info.clipped_bt.any())


def test_no_clip_hand_computed():
    loss, info, grad = no_clip(tokens(math.log(1.5), math.log(30.0)), tokens(0.0, 0.0), tokens(-1.0, 1.0), ALL)
    np.testing.assert_allclose(loss, [[1.5, -30.0]], rtol=1e-6)  # no clip at any ratio
    np.testing.assert_allclose(grad, [[1.5, -30.0]], rtol=1e-6)
    assert not bool(info.clipped_bt.any())


def test_off_policy_shaping_hand_computed_value_and_gradient():
    # p = 0.1, gamma = 0.1: f = 0.5, df/dlogp = p * gamma / (p + gamma)^2 = 0.01 / 0.04 = 0.25
    logp = tokens(math.log(0.1), 0.0)
    np.testing.assert_allclose(shaping(logp, gamma=0.1), [[0.5, 1 / 1.1]], rtol=1e-6)
    grad = jax.jit(jax.grad(lambda lp: jnp.sum(losses.off_policy_shaping(lp))))(logp)
    np.testing.assert_allclose(grad, [[0.25, 0.1 / 1.21]], rtol=1e-6)


def test_off_policy_shaping_equals_p_over_p_plus_gamma():
    logp = jnp.linspace(-60.0, 0.0, 7)[None, :]
    for gamma in (0.1, 0.5, 0.9):
        p = np.exp(np.asarray(logp, np.float64))
        # float32 rounds logp - log(gamma) ~ -58 at ~4e-6 absolute, i.e. relative in f
        np.testing.assert_allclose(losses.off_policy_shaping(logp, gamma=gamma), p / (p + gamma), rtol=1e-5)


@pytest.mark.parametrize("gamma", [0.0, -0.1])
def test_off_policy_shaping_rejects_non_positive_gamma(gamma):
    with pytest.raises(ValueError, match="gamma > 0"):
        losses.off_policy_shaping(tokens(0.0, 0.0), gamma=gamma)


def test_shaped_off_policy_loss_is_jitted_and_masks():
    loss_fn = jax.jit(losses.shaped_off_policy_loss, static_argnames="gamma")
    loss, off = loss_fn(tokens(math.log(0.1), jnp.nan), tokens(2.0, 5.0), jnp.asarray([[True, False]]), gamma=0.1)
    np.testing.assert_allclose(loss, [[-1.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(off.weight_bt, [[0.5, 0.0]], rtol=1e-6)
    assert not bool(off.clipped_high_bt.any() | off.clipped_low_bt.any())


def test_rgr_mixed_policy_hand_computed():
    # row 0 on-policy: r = 1.2, A = 1 -> -1.2 (no clip). Row 1 off-policy: p = 0.1, A = 2 -> -f(p) A = -1.0;
    # its old_logp is not the behaviour policy's and must not matter, not even as NaN.
    logp = jnp.asarray([[math.log(1.2) - 1.0, -1.0], [math.log(0.1), math.log(0.1)]])
    old = jnp.asarray([[-1.0, -1.0], [jnp.nan, jnp.nan]])
    advantages = jnp.asarray([[1.0, 1.0], [2.0, 2.0]])
    mask = jnp.asarray([[True, False], [True, True]])
    loss, info, grad = mixed(logp, old, advantages, mask, jnp.asarray([False, True]))
    np.testing.assert_allclose(loss, [[-1.2, 0.0], [-1.0, -1.0]], rtol=1e-6)
    np.testing.assert_allclose(info.ratio_bt, [[1.2, 0.0], [0.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(info.shaped_prob_bt, [[0.0, 0.0], [0.5, 0.5]], rtol=1e-6)
    np.testing.assert_allclose(grad, [[-1.2, 0.0], [-0.5, -0.5]], rtol=1e-6)  # -A f'(p) = -2 * 0.25


def test_mismatch_weights_hand_computed():
    old = jnp.zeros((1, 5))
    rollout = -jnp.log(jnp.asarray([[0.25, 0.6, 1.5, 4.9, 8.0]]))  # w = old / rollout probabilities
    mask = jnp.ones((1, 5), bool)
    np.testing.assert_allclose(tis(old, rollout, mask, cap=2.0), [[0.25, 0.6, 1.5, 2.0, 2.0]], rtol=1e-6)
    np.testing.assert_allclose(icepop(old, rollout, mask, low=0.5, high=5.0), [[0, 0.6, 1.5, 4.9, 0]], rtol=1e-6)
    # row 0: w = [4, 0.25, non-finite] -> geometric mean over the finite tokens 1 -> kept, raw weights, NaN -> 0
    # row 1: w = [8, 8, 8] -> geometric mean 8 > 5 -> the whole row is masked
    old = jnp.zeros((2, 3))
    rollout = jnp.asarray([[-math.log(4.0), -math.log(0.25), -jnp.inf], [-math.log(8.0)] * 3])
    weights = seq_mask_tis(old, rollout, jnp.ones((2, 3), bool), low=0.5, high=5.0)
    np.testing.assert_allclose(weights, [[4.0, 0.25, 0.0], [0.0, 0.0, 0.0]], rtol=1e-6)


def test_mismatch_weights_are_detached_and_zero_where_non_finite():
    old, rollout = tokens(-1.0, -1.0), tokens(-1.2, -jnp.inf)
    for weights_fn in (tis, icepop, seq_mask_tis):
        np.testing.assert_allclose(weights_fn(old, rollout, ALL)[0, 1], 0.0)
        grads = jax.grad(lambda o, r: jnp.sum(weights_fn(o, r, ALL)), argnums=(0, 1))(old, tokens(-1.2, -1.3))
        for grad in grads:
            np.testing.assert_array_equal(grad, 0.0)


def test_subtract_entropy_bonus_hand_computed():
    out = entropy_bonus(tokens(1.0, 1.0), tokens(2.0, jnp.nan), jnp.asarray([[True, False]]), coeff=0.01)
    np.testing.assert_allclose(out, [[0.98, 0.0]], rtol=1e-6)


def test_clamped_log_ratio_clamps_masks_and_stops_gradient_outside():
    logp, old = tokens(30.0, 0.5), tokens(0.0, 0.0)
    np.testing.assert_allclose(log_ratio(logp, old, ALL, clamp=20.0), [[20.0, 0.5]])
    masked = log_ratio(tokens(jnp.nan, 1.0), old, jnp.asarray([[False, True]]), clamp=20.0)
    np.testing.assert_array_equal(masked, [[0.0, 1.0]])
    grad = jax.grad(lambda lp: jnp.sum(losses.clamped_log_ratio(lp, old, ALL)))(logp)
    np.testing.assert_array_equal(grad, [[0.0, 1.0]])


# ---------------------------------------------------------------- against the NumPy loop reference

DTYPES = pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16], ids=["f32", "bf16"])


@DTYPES
def test_ppo_clip_matches_reference(dtype):
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        out = ppo(x.logp, x.old_logp, x.advantages, x.mask)
        assert_matches(out, ref.ppo_clip(r.logp, r.old_logp, r.advantages, r.mask, 0.2, 0.28), dtype)


@DTYPES
def test_dual_clip_matches_reference(dtype):
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        loss, info, grad = dual_clip(x.logp, x.old_logp, x.advantages, x.mask)
        expected, dual = ref.dual_clip(r.logp, r.old_logp, r.advantages, r.mask, 0.2, 0.28, 3.0)
        assert_matches((loss, info, grad), expected, dtype)
        np.testing.assert_array_equal(info.dual_clipped_bt, dual)


@DTYPES
def test_gspo_matches_reference(dtype):
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        out = gspo(x.logp, x.old_logp, x.advantages, x.mask)
        assert_matches(out, ref.gspo(r.logp, r.old_logp, r.advantages, r.mask, 0.2, 0.28), dtype)


@DTYPES
def test_cispo_matches_reference(dtype):
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        out = cispo(x.logp, x.old_logp, x.advantages, x.mask)
        assert_matches(out, ref.cispo(r.logp, r.old_logp, r.advantages, r.mask, 0.2, 0.28), dtype)


@DTYPES
def test_no_clip_matches_reference(dtype):
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        out = no_clip(x.logp, x.old_logp, x.advantages, x.mask)
        assert_matches(out, ref.no_clip(r.logp, r.old_logp, r.advantages, r.mask), dtype)


@DTYPES
def test_rgr_mixed_policy_matches_reference(dtype):
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        # off-policy rows carry no behaviour-policy log-probabilities: NaN there must not leak
        old = np.where(x.off_policy[:, None], np.nan, x.old_logp).astype(dtype)
        loss, info, grad = mixed(x.logp, old, x.advantages, x.mask, x.off_policy)
        expected, shaped = ref.mixed_policy(r.logp, r.old_logp, r.advantages, r.mask, r.off_policy, 0.1)
        assert_values(loss, expected.loss)
        assert_values(info.ratio_bt, expected.ratio)
        assert_values(info.shaped_prob_bt, shaped)
        assert_grads(grad, expected.grad, dtype)


@DTYPES
def test_mismatch_weights_match_reference(dtype):
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        for mode, weights_fn, low, high in [
            ("tis", functools.partial(tis, cap=2.0), 0.0, 2.0),
            ("icepop", functools.partial(icepop, low=0.5, high=5.0), 0.5, 5.0),
            ("seq_mask_tis", functools.partial(seq_mask_tis, low=0.8, high=1.25), 0.8, 1.25),
        ]:
            expected = ref.mismatch_weights(r.old_logp, r.rollout_logp, r.mask, mode, low, high)
            assert_values(weights_fn(x.old_logp, x.rollout_logp, x.mask), expected)


@DTYPES
def test_entropy_bonus_matches_reference(dtype):
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        out = entropy_bonus(x.advantages, x.entropy, x.mask, coeff=0.01)
        assert_values(out, ref.entropy_bonus(r.advantages, r.entropy, r.mask, 0.01))


# ---------------------------------------------------------------- properties


@given(
    log_ratio_bt=arrays(np.float32, (2, 3), elements=st.floats(-25, 25, width=32)),
    advantages_bt=arrays(np.float32, (2, 3), elements=st.floats(-5, 5, width=32)),
)
def test_clipped_losses_are_pessimistic_bounds(log_ratio_bt, advantages_bt):
    """PPO's objective is a lower bound of the unclipped one (loss >= -r A); the dual clip caps the loss of
    negative-advantage tokens at -A c and leaves the others alone."""
    logp, old = jnp.zeros((2, 3)), -jnp.asarray(log_ratio_bt)
    mask = jnp.ones((2, 3), bool)
    unclipped, _, _ = no_clip(logp, old, advantages_bt, mask)
    clipped, _, _ = ppo(logp, old, advantages_bt, mask)
    dual, _, _ = dual_clip(logp, old, advantages_bt, mask)
    assert np.all(np.asarray(clipped) >= np.asarray(unclipped))
    assert np.all(np.asarray(dual) <= np.asarray(clipped))
    negative = advantages_bt < 0
    assert np.all(np.asarray(dual)[negative] <= -3.0 * advantages_bt[negative] * (1 + 1e-6))
    np.testing.assert_array_equal(np.asarray(dual)[~negative], np.asarray(clipped)[~negative])


# ---------------------------------------------------------------- REFERENCE.md section 4, item 9 (GSPO)


def test_reference_item_9_gspo_ratio_is_exp_of_mean_log_ratio_and_clamped():
    x, r = draw(0, np.float32)
    ratio = np.asarray(gspo_ratio(x.logp, x.old_logp, x.mask))
    for b in range(r.mask.shape[0]):
        valid = r.mask[b]
        if valid.any():
            log_r = np.clip(r.logp[b, valid] - r.old_logp[b, valid], -20, 20)
            np.testing.assert_allclose(ratio[b, valid], np.exp(np.clip(log_r.mean(), -10, 10)), rtol=2e-5)
        np.testing.assert_array_equal(ratio[b, ~valid], 0.0)
    # clamps: a mean log ratio of 15 saturates at e^10; a token at -1000 is first clamped to -20
    logp = jnp.asarray([[15.0, 15.0], [-1000.0, 0.0]])
    ratio = gspo_ratio(logp, jnp.zeros((2, 2)), jnp.ones((2, 2), bool))
    np.testing.assert_allclose(ratio, [[math.exp(10)] * 2, [math.exp(-10)] * 2], rtol=1e-6)


def test_reference_item_9_gspo_finite_gradients_at_extreme_ratios():
    # rows: token clamp (+-1000), sequence clamp (mean 15), just inside the sequence clamp (+-9.5)
    log_ratio_bt = jnp.asarray([[1000.0, 1000.0], [-1000.0, -1000.0], [15.0, 15.0], [9.5, 9.5], [-9.5, -9.5]])
    advantages = jnp.asarray([[-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0], [-1.0, -1.0], [1.0, 1.0]])
    mask = jnp.ones((5, 2), bool)

    def objective(logp):  # old_logp fixed at the values that give these ratios at logp = 0
        loss_bt, _ = losses.gspo_loss(logp, -log_ratio_bt, advantages, mask)
        return agg.finalize(*agg.seq_mean_token_mean(loss_bt, mask))

    value, grad = jax.jit(jax.value_and_grad(objective))(jnp.zeros((5, 2)))
    grad = np.asarray(grad)
    assert np.isfinite(float(value)) and np.all(np.isfinite(grad))
    np.testing.assert_array_equal(grad[:3], 0.0)  # saturated clamps pass no gradient
    # +-9.5: the unclipped branch -A s is the loss; per token d/dlogp = -A s / (|y| N) with |y| = 2, N = 5
    np.testing.assert_allclose(grad[3], [math.exp(9.5) / 10] * 2, rtol=1e-5)
    np.testing.assert_allclose(grad[4], [-math.exp(-9.5) / 10] * 2, rtol=1e-5)


def test_reference_item_9_gspo_has_no_length_weighting():
    # two sequences, lengths 2 and 6, the same per-token log ratio 0.3 and advantage: same ratio, and under
    # seq-mean-token-mean each sequence's total gradient is the same (each sequence weighs 1/N).
    mask = jnp.asarray([[True] * 2 + [False] * 4, [True] * 6])
    logp, old = jnp.full((2, 6), -1.0), jnp.full((2, 6), -1.3)
    advantages = jnp.full((2, 6), 0.7)
    ratio = gspo_ratio(logp, old, mask)
    np.testing.assert_allclose(ratio[0, :2], ratio[1, 0], rtol=1e-6)

    def objective(lp):
        loss_bt, _ = losses.gspo_loss(lp, old, advantages, mask, eps_low=0.5, eps_high=0.5)
        return agg.finalize(*agg.seq_mean_token_mean(loss_bt, mask))

    grad = np.asarray(jax.jit(jax.grad(objective))(logp))
    expected_per_sequence = -0.7 * math.exp(0.3) / 2  # -A s / N
    np.testing.assert_allclose(grad.sum(axis=1), [expected_per_sequence] * 2, rtol=1e-5)
    np.testing.assert_allclose(grad[0, :2], expected_per_sequence / 2, rtol=1e-5)
    np.testing.assert_allclose(grad[1], expected_per_sequence / 6, rtol=1e-5)


def test_gspo_token_gradient_equals_the_sequence_ratio_gradient():
    """Aggregated with seq-mean-token-mean, the GSPO-token loss has the value and gradient of GSPO's sequence
    objective mean_b -min(s_b A_b, clip(s_b) A_b) with s_b = exp(mean_t(logp - old_logp)) differentiated
    directly (no stop-gradient construction)."""
    x, _ = draw(3, np.float32)
    mask = x.mask
    old = jnp.where(mask, x.logp - jax.random.normal(jax.random.PRNGKey(0), x.logp.shape) * 0.2, 0)
    logp = jnp.where(mask, x.logp, 0)
    advantages_b = jnp.asarray([1.0, -1.0, 0.5, -2.0, 0.0, 1.5])
    advantages_bt = jnp.broadcast_to(advantages_b[:, None], mask.shape)
    eps_low, eps_high = 0.1, 0.15

    def token_form(lp):
        loss_bt, _ = losses.gspo_loss(lp, old, advantages_bt, mask, eps_low=eps_low, eps_high=eps_high)
        return agg.finalize(*agg.seq_mean_token_mean(loss_bt, mask))

    def sequence_form(lp):
        count = jnp.sum(mask, axis=1)
        s = jnp.exp(jnp.sum(jnp.where(mask, lp - old, 0), axis=1) / jnp.maximum(count, 1))
        objective = jnp.minimum(s * advantages_b, jnp.clip(s, 1 - eps_low, 1 + eps_high) * advantages_b)
        valid = count > 0
        return -jnp.sum(jnp.where(valid, objective, 0)) / jnp.sum(valid)

    token_value, token_grad = jax.jit(jax.value_and_grad(token_form))(logp)
    sequence_value, sequence_grad = jax.jit(jax.value_and_grad(sequence_form))(logp)
    np.testing.assert_allclose(token_value, sequence_value, rtol=1e-5)
    np.testing.assert_allclose(token_grad, sequence_grad, rtol=1e-5, atol=1e-7)


def test_entropy_bonus_equals_subtracting_the_aggregated_entropy():
    x, _ = draw(2, np.float32)
    with_bonus = entropy_bonus(x.advantages, x.entropy, x.mask, coeff=0.01)
    for aggregate in (agg.token_mean, agg.seq_mean_token_mean, agg.seq_mean_token_sum):
        mean = lambda values: agg.finalize(*aggregate(values, x.mask))
        np.testing.assert_allclose(mean(with_bonus), mean(x.advantages) - 0.01 * mean(x.entropy), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- LUFFY's off-policy clips


def test_clip_off_policy_weight_hand_computed_value_flags_and_gradient():
    # LUFFY clamps w at max 0.5, then at min 0.2: [0.05, 0.2, 0.3, 0.5, 0.8] -> [0.2, 0.2, 0.3, 0.5, 0.5];
    # torch.clamp passes the gradient on [0.2, 0.5] bounds included; its counts `w == bound` flag both ends.
    weight = jnp.asarray([[0.05, 0.2, 0.3, 0.5, 0.8]])
    mask = jnp.ones((1, 5), bool)
    clip = functools.partial(losses.clip_off_policy_weight, max_clip=0.5, min_clip=0.2)
    out = jax.jit(clip)(weight, mask)
    np.testing.assert_allclose(out.weight_bt, [[0.2, 0.2, 0.3, 0.5, 0.5]], rtol=1e-6)
    np.testing.assert_array_equal(out.clipped_high_bt, [[False, False, False, True, True]])
    np.testing.assert_array_equal(out.clipped_low_bt, [[True, True, False, False, False]])
    grad = jax.jit(jax.grad(lambda w: jnp.sum(clip(w, mask).weight_bt)))(weight)
    np.testing.assert_array_equal(grad, [[0.0, 1.0, 1.0, 1.0, 0.0]])


def test_clip_off_policy_weight_clips_p_without_shaping_and_masks():
    # LUFFY's "no_reshape": w = p itself. p = [0.9, 0.3, NaN (masked)], max_clip 0.6 only -> [0.6, 0.3, 0].
    logp = jnp.log(jnp.asarray([[0.9, 0.3, jnp.nan]]))
    mask = jnp.asarray([[True, True, False]])
    out = losses.clip_off_policy_weight(jnp.exp(jnp.where(mask, logp, 0)), mask, max_clip=0.6)
    np.testing.assert_allclose(out.weight_bt, [[0.6, 0.3, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(out.clipped_high_bt, [[True, False, False]])
    assert not bool(out.clipped_low_bt.any())


def test_clip_off_policy_weight_without_bounds_is_the_identity():
    weight = jnp.asarray([[0.01, 0.7]])
    out = losses.clip_off_policy_weight(weight, jnp.ones((1, 2), bool))
    np.testing.assert_array_equal(out.weight_bt, weight)
    assert not bool(out.clipped_high_bt.any() | out.clipped_low_bt.any())


def test_clip_off_policy_weight_rejects_min_above_max():
    with pytest.raises(ValueError, match="must not exceed"):
        losses.clip_off_policy_weight(tokens(0.5, 0.5), ALL, max_clip=0.3, min_clip=0.4)


def test_rgr_mixed_policy_with_off_policy_clips_hand_computed():
    # row 0 on-policy r = 1.2, A = 1: -1.2, never clipped by the off-policy clips. Row 1 off-policy, A = 2:
    # p = 0.1 -> f = 0.5 inside [0.1, 0.6]: -1.0, gradient -A f'(p) = -2 * 0.25 = -0.5;
    # p = 1 -> f = 1 / 1.1 = 0.909 above 0.6: clipped to 0.6, loss -1.2, no gradient.
    logp = jnp.asarray([[math.log(1.2) - 1.0, -1.0], [math.log(0.1), 0.0]])
    old = jnp.asarray([[-1.0, -1.0], [jnp.nan, jnp.nan]])
    advantages = jnp.asarray([[1.0, 1.0], [2.0, 2.0]])
    mask = jnp.asarray([[True, False], [True, True]])
    clipped = with_token_grad(functools.partial(losses.rgr_mixed_policy_loss, gamma=0.1, off_max_clip=0.6,
                                                off_min_clip=0.1))
    loss, info, grad = clipped(logp, old, advantages, mask, jnp.asarray([False, True]))
    np.testing.assert_allclose(loss, [[-1.2, 0.0], [-1.0, -1.2]], rtol=1e-6)
    np.testing.assert_allclose(info.shaped_prob_bt, [[0.0, 0.0], [0.5, 0.6]], rtol=1e-6)
    np.testing.assert_array_equal(info.off_clipped_high_bt, [[False, False], [False, True]])
    assert not bool(info.off_clipped_low_bt.any())
    np.testing.assert_allclose(grad, [[-1.2, 0.0], [-0.5, 0.0]], rtol=1e-6)


@DTYPES
@pytest.mark.parametrize("max_clip, min_clip", [(0.6, 0.2), (0.6, None), (None, 0.2)])
def test_rgr_mixed_policy_with_off_policy_clips_matches_reference(dtype, max_clip, min_clip):
    clipped = with_token_grad(functools.partial(losses.rgr_mixed_policy_loss, gamma=0.1, off_max_clip=max_clip,
                                                off_min_clip=min_clip))
    bitten = 0
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        old = np.where(x.off_policy[:, None], np.nan, x.old_logp).astype(dtype)
        loss, info, grad = clipped(x.logp, old, x.advantages, x.mask, x.off_policy)
        expected, weight, high, low = ref.mixed_policy_off_clips(r.logp, r.old_logp, r.advantages, r.mask,
                                                                 r.off_policy, 0.1, max_clip, min_clip)
        assert_values(loss, expected.loss)
        assert_values(info.ratio_bt, expected.ratio)
        assert_values(info.shaped_prob_bt, weight)
        np.testing.assert_array_equal(info.off_clipped_high_bt, high)
        np.testing.assert_array_equal(info.off_clipped_low_bt, low)
        assert_grads(grad, expected.grad, dtype)
        bitten += int(high.sum() + low.sum())
    assert bitten > 10  # the random batches do reach the clips


@given(
    weight_bt=arrays(np.float32, (2, 4), elements=st.floats(0, 1, width=32)),
    mask_bt=arrays(np.bool_, (2, 4)),
    bounds=st.tuples(st.floats(0, 1, width=32), st.floats(0, 1, width=32)).map(sorted),
)
def test_clip_off_policy_weight_properties(weight_bt, mask_bt, bounds):
    """Clipped weights lie in [min_clip, max_clip] on valid tokens and are 0 elsewhere; a weight inside the band
    is unchanged and passes its gradient; a flagged token sits on its bound; clipping twice changes nothing."""
    min_clip, max_clip = bounds
    clip = functools.partial(losses.clip_off_policy_weight, max_clip=max_clip, min_clip=min_clip)
    out = clip(weight_bt, mask_bt)
    w = np.asarray(out.weight_bt)
    assert np.all(w[~mask_bt] == 0)
    assert np.all((w[mask_bt] >= min_clip) & (w[mask_bt] <= max_clip))
    inside = mask_bt & (weight_bt >= min_clip) & (weight_bt <= max_clip)
    np.testing.assert_array_equal(w[inside], weight_bt[inside])
    np.testing.assert_array_equal(w[np.asarray(out.clipped_high_bt)], np.float32(max_clip))
    np.testing.assert_array_equal(w[np.asarray(out.clipped_low_bt)], np.float32(min_clip))
    np.testing.assert_array_equal(np.asarray(clip(out.weight_bt, mask_bt).weight_bt), w)
    grad = np.asarray(jax.grad(lambda x: jnp.sum(clip(x, mask_bt).weight_bt))(jnp.asarray(weight_bt)))
    np.testing.assert_array_equal(grad, inside.astype(np.float32))


@given(
    logp_bt=arrays(np.float32, (2, 3), elements=st.floats(-30, 0, width=32)),
    advantages_bt=arrays(np.float32, (2, 3), elements=st.floats(-5, 5, width=32)),
    max_clip=st.floats(0.0625, 1, width=32),
)
def test_off_policy_max_clip_bounds_the_shaped_loss(logp_bt, advantages_bt, max_clip):
    """A max clip on f(p) bounds each off-policy token's loss by max_clip |A| and moves it toward 0 compared
    with the unclipped term (LUFFY's clip only shrinks |w A|)."""
    mask = jnp.ones((2, 3), bool)
    unclipped, _ = losses.shaped_off_policy_loss(logp_bt, advantages_bt, mask, gamma=0.1)
    clipped, _ = losses.shaped_off_policy_loss(logp_bt, advantages_bt, mask, gamma=0.1, max_clip=float(max_clip))
    clipped, unclipped = np.asarray(clipped), np.asarray(unclipped)
    assert np.all(np.abs(clipped) <= max_clip * np.abs(advantages_bt) * (1 + 1e-6))
    assert np.all(np.abs(clipped) <= np.abs(unclipped) * (1 + 1e-6))
    assert np.all(np.sign(clipped) * np.sign(unclipped) >= 0)
