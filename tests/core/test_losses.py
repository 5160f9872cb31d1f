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


# ---------------------------------------------------------------- SAPO, Clip-Cov, KL-Cov, GMPO, VESPO, entropy mask

KEY = jax.random.PRNGKey(7)
sapo = with_token_grad(functools.partial(losses.sapo_loss, tau_pos=1.0, tau_neg=1.05))
gmpo = with_token_grad(functools.partial(losses.gmpo_loss, eps_low=0.4, eps_high=0.4))
vespo = with_token_grad(losses.vespo_loss)
clip_cov = with_token_grad(functools.partial(losses.clip_cov_loss, eps_low=0.2, eps_high=0.28, clip_cov_ratio=0.1))
kl_cov = with_token_grad(functools.partial(losses.kl_cov_loss, kl_cov_ratio=0.1, kl_coef=1.0))
entropy_mask = jax.jit(losses.high_entropy_mask, static_argnames="top_fraction")


def test_sapo_hand_computed_gate_value_and_gradient():
    # r = 1, A = 1, tau_pos = 1: f = 4 sigmoid(0) = 2 -> loss -2; d/dlogp = -A * 4 r s (1 - s) = -1 (PPO's -r A)
    # r = 1, A = -1, tau_neg = 1.05: f = 4 / 1.05 * 0.5 = 1.9047619 -> loss 1.9047619; gradient 1
    # r = 2, A = 1: s = sigmoid(1) = 0.7310586, f = 2.9242344, gradient -8 s (1 - s) = -1.5728954
    logp = tokens(0.0, 0.0, math.log(2.0))
    loss, info, grad = sapo(logp, tokens(0.0, 0.0, 0.0), tokens(1.0, -1.0, 1.0), jnp.ones((1, 3), bool))
    np.testing.assert_allclose(loss, [[-2.0, 1.9047619, -2.9242344]], rtol=1e-6)
    np.testing.assert_allclose(info.gate_bt, [[2.0, 1.9047619, 2.9242344]], rtol=1e-6)
    np.testing.assert_allclose(grad, [[-1.0, 1.0, -1.5728954]], rtol=1e-6)


@pytest.mark.parametrize("taus", [(0.0, 1.0), (1.0, -1.0)])
def test_sapo_rejects_non_positive_temperatures(taus):
    with pytest.raises(ValueError, match="temperatures > 0"):
        losses.sapo_loss(tokens(0.0), tokens(0.0), tokens(1.0), jnp.ones((1, 1), bool), tau_pos=taus[0],
                         tau_neg=taus[1])


# logp - mean(logp) = [1.5, 1, -1.5, -1] (mean -2), A - mean(A) = [2, -2, -2, 2] (mean 1): covariance terms
# [3, -2, 3, -2]. Tokens 0 and 2 lie in Clip-Cov's band (1, 5) and tie for KL-Cov's top covariance.
COV_LOGP = tokens(-0.5, -1.0, -3.5, -3.0)
COV_ADVANTAGES = tokens(3.0, -1.0, -1.0, 3.0)
FOUR = jnp.ones((1, 4), bool)


def test_token_covariance_hand_computed_and_masked():
    np.testing.assert_allclose(losses.token_covariance(COV_LOGP, COV_ADVANTAGES, FOUR), [[3.0, -2.0, 3.0, -2.0]])
    # token 3 masked (NaN there): means over [-0.5, -1, -3.5] = -5/3 and [3, -1, -1] = 1/3
    mask = jnp.asarray([[True, True, True, False]])
    cov = losses.token_covariance(COV_LOGP.at[0, 3].set(jnp.nan), COV_ADVANTAGES, mask)
    expected = [(8 / 3) * (7 / 6), (-4 / 3) * (2 / 3), (-4 / 3) * (-11 / 6), 0.0]
    np.testing.assert_allclose(cov, [expected], rtol=1e-6)
    np.testing.assert_array_equal(losses.token_covariance(COV_LOGP, COV_ADVANTAGES, ~FOUR), 0.0)


def test_clip_cov_hand_computed():
    # on-policy (r = 1): PPO's loss is -A = [-3, 1, 1, -3]; clip_cov_ratio 0.25 of 4 valid tokens -> 1 token is
    # detached, the candidate (token 0 or 2) of higher priority uniform(key)
    loss_fn = functools.partial(losses.clip_cov_loss, eps_low=0.2, eps_high=0.2, clip_cov_ratio=0.25)
    priority = np.asarray(jax.random.uniform(KEY, (1, 4)))[0]
    chosen = 0 if priority[0] > priority[2] else 2
    loss, info = loss_fn(COV_LOGP, COV_LOGP, COV_ADVANTAGES, FOUR, KEY)
    expected = np.array([[-3.0, 1.0, 1.0, -3.0]])
    expected[0, chosen] = 0.0
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    np.testing.assert_array_equal(info.cov_detached_bt[0], np.arange(4) == chosen)
    # ratio 0.5 -> 2 tokens: both candidates, whatever the key; a band (3.5, 5) has no candidate
    loss, info = loss_fn(COV_LOGP, COV_LOGP, COV_ADVANTAGES, FOUR, KEY, clip_cov_ratio=0.5)
    np.testing.assert_allclose(loss, [[0.0, 1.0, 0.0, -3.0]], rtol=1e-6)
    loss, info = loss_fn(COV_LOGP, COV_LOGP, COV_ADVANTAGES, FOUR, KEY, clip_cov_lb=3.5)
    np.testing.assert_allclose(loss, [[-3.0, 1.0, 1.0, -3.0]], rtol=1e-6)
    assert not bool(info.clipped_bt.any())
    # token 0 at r = 1.5 with A = 3 is PPO-clipped (loss -3 * 1.2), so it is no candidate: token 2 is detached
    old = COV_LOGP.at[0, 0].add(-math.log(1.5))
    loss, info, grad = with_token_grad(functools.partial(loss_fn, eps_high=0.2))(COV_LOGP, old, COV_ADVANTAGES,
                                                                                  FOUR, KEY)
    np.testing.assert_allclose(loss, [[-3.6, 1.0, 0.0, -3.0]], rtol=1e-6)
    np.testing.assert_array_equal(info.clipped_bt, [[True, False, True, False]])
    np.testing.assert_array_equal(info.cov_detached_bt, [[False, False, True, False]])
    np.testing.assert_allclose(grad, [[0.0, 1.0, 0.0, -3.0]], rtol=1e-6)


def test_kl_cov_hand_computed():
    # log r = [0.1, 0, 0, -0.2]; ratio 0.25 of 4 tokens -> 1 penalised: tokens 0 and 2 tie at covariance 3 and
    # the lower position wins. loss = -A r (+ |log r| on token 0): [-3 e^0.1 + 0.1, 1, 1, -3 e^-0.2]
    old = COV_LOGP - tokens(0.1, 0.0, 0.0, -0.2)
    loss, info, grad = kl_cov(COV_LOGP, old, COV_ADVANTAGES, FOUR)  # ratio 0.1 -> max(floor(0.4), 1) = 1
    np.testing.assert_allclose(loss, [[-3 * math.exp(0.1) + 0.1, 1.0, 1.0, -3 * math.exp(-0.2)]], rtol=1e-6)
    np.testing.assert_array_equal(info.penalised_bt, [[True, False, False, False]])
    # d/dlogp = -A r + coef sign(log r): [-3 e^0.1 + 1, 1, 1, -3 e^-0.2]
    np.testing.assert_allclose(grad, [[-3 * math.exp(0.1) + 1, 1.0, 1.0, -3 * math.exp(-0.2)]], rtol=1e-6)
    # ratio 0.5 -> tokens 0 and 2; token 2 is on-policy (log r = 0): no penalty and, as in torch, no gradient
    loss, info = losses.kl_cov_loss(COV_LOGP, old, COV_ADVANTAGES, FOUR, kl_cov_ratio=0.5)
    np.testing.assert_array_equal(info.penalised_bt, [[True, False, True, False]])
    np.testing.assert_allclose(loss[0, 2], 1.0, rtol=1e-6)


def test_gmpo_hand_computed():
    # row 0, A = 1: log r [0.5, -0.5, 0.1] -> [0.4 (clipped above), -0.5 (not clipped below), 0.1], mean 0:
    #   s = 1, loss -1 on every token, token gradient -A s on unclipped tokens: [0, -1, -1]
    # row 1, A = -1: -> [0.5 (not clipped above), -0.4 (clipped below), 0.1], mean 0.2 / 3: s = e^(1/15)
    log_ratio = jnp.asarray([[0.5, -0.5, 0.1], [0.5, -0.5, 0.1]])
    advantages = jnp.asarray([[1.0] * 3, [-1.0] * 3])
    s = math.exp(1 / 15)
    loss, info, grad = gmpo(log_ratio - 1.0, jnp.full((2, 3), -1.0), advantages, jnp.ones((2, 3), bool))
    np.testing.assert_allclose(loss, [[-1.0] * 3, [s] * 3], rtol=1e-6)
    np.testing.assert_allclose(info.ratio_bt, [[1.0] * 3, [s] * 3], rtol=1e-6)
    np.testing.assert_array_equal(info.clipped_bt, [[True, False, False], [False, True, False]])
    np.testing.assert_allclose(grad, [[0.0, -1.0, -1.0], [s, 0.0, s]], rtol=1e-6)
    # seq-mean-token-mean gives GMPO's objective: the mean over sequences of -A s
    terms = agg.seq_mean_token_mean(loss, jnp.ones((2, 3), bool))
    np.testing.assert_allclose(agg.finalize(*terms), (-1.0 + s) / 2, rtol=1e-6)


def test_vespo_hand_computed():
    # on-policy, w = 1: phi = e^(lambda + k * 0 - lambda) = 1, so the loss is REINFORCE's -A logp, gradient -A
    logp = tokens(-1.0, -2.0)
    loss, info, grad = vespo(logp, logp, tokens(1.0, 1.0), ALL)
    np.testing.assert_allclose(loss, [[1.0, 2.0]], rtol=1e-6)
    np.testing.assert_allclose(grad, [[-1.0, -1.0]], rtol=1e-6)
    # log r = [0.1, 0.2]: w = e^0.3 (the sum, not the mean); A = 1 -> (k, lambda) = (2, 3):
    # phi = e^(3 + 0.6 - 3 e^0.3) = e^-0.4495764 = 0.6378764; A = -1 -> (3, 2): phi = e^(2 + 0.9 - 2 e^0.3)
    old = logp - tokens(0.1, 0.2)
    loss, info, grad = vespo(logp, old, tokens(1.0, -1.0), ALL)
    phi_pos, phi_neg = math.exp(3.6 - 3 * math.exp(0.3)), math.exp(2.9 - 2 * math.exp(0.3))
    np.testing.assert_allclose(info.weight_bt, [[phi_pos, phi_neg]], rtol=1e-6)
    np.testing.assert_allclose(info.ratio_bt, [[math.exp(0.3)] * 2], rtol=1e-6)
    np.testing.assert_allclose(loss, [[phi_pos, -2 * phi_neg]], rtol=1e-6)  # -phi A logp
    np.testing.assert_allclose(grad, [[-phi_pos, phi_neg]], rtol=1e-6)


def test_high_entropy_mask_hand_computed():
    # 5 valid tokens, sorted entropies 3, 2, 2, 1, 0.5; the masked token's 9 is ignored.
    # top 0.5: k = 1 + floor(0.5 * 4) = 3 -> threshold 2 -> tokens 1, 3, 4
    # top 0.2: k = 1 + floor(0.8) = 1 -> threshold 3 -> token 3
    # top 0.25: k = 1 + floor(1.0) = 2 -> threshold 2: the tie keeps 3 tokens (TRL: quantile(0.75) = 2, >= 2)
    entropy = tokens(0.5, 2.0, 1.0, 3.0, 2.0, 9.0)
    mask = jnp.asarray([[True] * 5 + [False]])
    expected = {0.5: [0, 1, 0, 1, 1, 0], 0.2: [0, 0, 0, 1, 0, 0], 0.25: [0, 1, 0, 1, 1, 0],
                1.0: [1, 1, 1, 1, 1, 0], 0.0: [0, 0, 0, 1, 0, 0]}
    for fraction, kept in expected.items():
        np.testing.assert_array_equal(entropy_mask(entropy, mask, top_fraction=fraction), [np.array(kept, bool)])
    assert not bool(entropy_mask(entropy, jnp.zeros_like(mask), top_fraction=0.2).any())


@pytest.mark.parametrize("fraction", [-0.1, 1.5])
def test_high_entropy_mask_rejects_fractions_outside_0_1(fraction):
    with pytest.raises(ValueError, match="top_fraction"):
        losses.high_entropy_mask(tokens(1.0), jnp.ones((1, 1), bool), top_fraction=fraction)


def test_cov_losses_reject_bad_settings():
    args = (COV_LOGP, COV_LOGP, COV_ADVANTAGES, FOUR)
    with pytest.raises(ValueError, match="clip_cov_ratio"):
        losses.clip_cov_loss(*args, KEY, clip_cov_ratio=0.0)
    with pytest.raises(ValueError, match="clip_cov_lb must be < clip_cov_ub"):
        losses.clip_cov_loss(*args, KEY, clip_cov_lb=5.0, clip_cov_ub=1.0)
    with pytest.raises(ValueError, match="kl_cov_ratio"):
        losses.kl_cov_loss(*args, kl_cov_ratio=0.0)
    with pytest.raises(ValueError, match="VESPO needs"):
        losses.vespo_loss(*args, lambda_pos=0.0)


@DTYPES
def test_sapo_matches_reference(dtype):
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        loss, info, grad = sapo(x.logp, x.old_logp, x.advantages, x.mask)
        expected, gates = ref.sapo(r.logp, r.old_logp, r.advantages, r.mask, 1.0, 1.05)
        assert_values(loss, expected.loss)
        assert_values(info.ratio_bt, expected.ratio)
        assert_values(info.gate_bt, gates)
        assert_grads(grad, expected.grad, dtype)


@DTYPES
def test_clip_cov_matches_reference(dtype):
    detached = 0
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        key = jax.random.PRNGKey(seed)
        loss, info, grad = clip_cov(x.logp, x.old_logp, x.advantages, x.mask, key)
        priority = np.asarray(jax.random.uniform(key, x.mask.shape))
        expected, expected_detached = ref.clip_cov(r.logp, r.old_logp, r.advantages, r.mask, priority, 0.2, 0.28,
                                                   0.1, 1.0, 5.0)
        assert_matches((loss, info, grad), expected, dtype)
        np.testing.assert_array_equal(info.cov_detached_bt, expected_detached)
        detached += int(expected_detached.sum())
    assert detached > 10  # the random batches do have candidates in the band


@DTYPES
def test_kl_cov_matches_reference(dtype):
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        loss, info, grad = kl_cov(x.logp, x.old_logp, x.advantages, x.mask)
        expected, penalised = ref.kl_cov(r.logp, r.old_logp, r.advantages, r.mask, 0.1, 1.0)
        np.testing.assert_array_equal(info.penalised_bt, penalised)
        assert_values(loss, expected.loss)
        assert_values(info.ratio_bt, expected.ratio)
        assert_grads(grad, expected.grad, dtype)


@DTYPES
def test_gmpo_matches_reference(dtype):
    clipped = 0
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        expected = ref.gmpo(r.logp, r.old_logp, r.advantages, r.mask, 0.4, 0.4)
        assert_matches(gmpo(x.logp, x.old_logp, x.advantages, x.mask), expected, dtype)
        clipped += int(expected.clipped.sum())
    assert clipped > 10


@DTYPES
def test_vespo_matches_reference(dtype):
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        loss, info, grad = vespo(x.logp, x.old_logp, x.advantages, x.mask)
        expected, phi = ref.vespo(r.logp, r.old_logp, r.advantages, r.mask, 2.0, 3.0, 3.0, 2.0)
        assert_values(loss, expected.loss)
        assert_values(info.ratio_bt, expected.ratio)
        assert_values(info.weight_bt, phi)
        assert_grads(grad, expected.grad, dtype)


@DTYPES
@pytest.mark.parametrize("fraction", [0.0, 0.2, 0.5, 1.0])
def test_high_entropy_mask_matches_trl_quantile_rule(dtype, fraction):
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        expected = ref.high_entropy_mask(r.entropy, r.mask, fraction)
        np.testing.assert_array_equal(entropy_mask(x.entropy, x.mask, top_fraction=fraction), expected)


# ---------------------------------------------------------------- properties of the new losses

NEW_LOSSES = {
    "sapo": sapo,
    "gmpo": gmpo,
    "vespo": vespo,
    "kl_cov": kl_cov,
    "clip_cov": lambda *args: clip_cov(*args, KEY),
}


@pytest.mark.parametrize("name", list(NEW_LOSSES))
def test_new_losses_masked_tokens_give_zero_and_all_masked_batch_is_finite(name):
    x, _ = draw(3, np.float32)
    loss, info, grad = NEW_LOSSES[name](x.logp, x.old_logp, x.advantages, x.mask)
    for values in (loss, grad, *info):
        values = np.asarray(values)
        assert np.all(np.isfinite(values.astype(np.float32)))
        assert not np.any(values[~x.mask])
    loss, info, grad = NEW_LOSSES[name](x.logp, x.old_logp, x.advantages, np.zeros_like(x.mask))
    for values in (loss, grad, *info):
        np.testing.assert_array_equal(np.asarray(values), 0)


small_log_ratio = arrays(np.float32, (2, 4), elements=st.floats(-3, 3, width=32))
advantages_24 = arrays(np.float32, (2, 4), elements=st.floats(-3, 3, width=32))


@given(small_log_ratio, advantages_24, st.floats(0.25, 4, width=32), st.floats(0.25, 4, width=32))
def test_sapo_gate_is_bounded_and_its_gradient_is_ppo_on_policy(log_ratio_bt, advantages_bt, tau_pos, tau_neg):
    """0 <= f(r) <= 4 / tau; the gradient weight g = (d loss / d logp) / -A lies in [0, min(r, 4 r e^(-tau |r - 1|))]
    (sigmoid' <= min(1/4, e^-|x|)); at r = 1 the gradient is the unclipped surrogate's."""
    mask = jnp.ones((2, 4), bool)
    loss_fn = with_token_grad(functools.partial(losses.sapo_loss, tau_pos=float(tau_pos), tau_neg=float(tau_neg)))
    logp, old = jnp.zeros((2, 4)), -jnp.asarray(log_ratio_bt)
    _, info, grad = loss_fn(logp, old, advantages_bt, mask)
    tau = np.where(advantages_bt > 0, tau_pos, tau_neg).astype(np.float64)
    gate, ratio = np.asarray(info.gate_bt, np.float64), np.exp(log_ratio_bt.astype(np.float64))
    assert np.all((gate >= 0) & (gate <= 4 / tau * (1 + 1e-6)))
    nonzero = advantages_bt != 0
    weight = np.asarray(grad, np.float64)[nonzero] / -advantages_bt[nonzero]
    bound = np.minimum(ratio, 4 * ratio * np.exp(-tau * np.abs(ratio - 1)))[nonzero]
    assert np.all((weight >= -1e-6) & (weight <= bound * (1 + 1e-5) + 1e-6))
    _, _, on_policy_grad = loss_fn(logp, logp, advantages_bt, mask)
    _, _, surrogate_grad = no_clip(logp, logp, advantages_bt, mask)
    np.testing.assert_allclose(on_policy_grad, surrogate_grad, rtol=1e-6, atol=1e-7)


def gmpo_sequence_objective(logp_bt, old_logp_bt, advantages_bt, eps_low=0.4, eps_high=0.4):
    """GMPO eq 4 written per sequence (full rows), as the paper states it: mean_b -A_b exp(mean_t l_t)."""
    log_ratio = logp_bt - old_logp_bt
    sign = jnp.sign(advantages_bt)
    clipped = sign * jnp.minimum(sign * log_ratio, sign * jnp.clip(log_ratio, -eps_low, eps_high))
    return jnp.mean(-jnp.mean(advantages_bt, axis=-1) * jnp.exp(jnp.mean(clipped, axis=-1)))


@given(small_log_ratio, advantages_24)
def test_gmpo_token_form_aggregates_to_the_sequence_objective_and_its_gradient(log_ratio_bt, advantages_bt):
    mask = jnp.ones((2, 4), bool)
    old = jnp.full((2, 4), -2.0)
    logp = old + jnp.asarray(log_ratio_bt)

    def aggregated(lp):
        return agg.finalize(*agg.seq_mean_token_mean(losses.gmpo_loss(lp, old, advantages_bt, mask)[0], mask))

    value, grad = jax.value_and_grad(aggregated)(logp)
    expected_value, expected_grad = jax.value_and_grad(gmpo_sequence_objective)(logp, old, advantages_bt)
    np.testing.assert_allclose(value, expected_value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-6)


@given(
    entropy_bt=arrays(np.float32, (3, 4), elements=st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5]) | st.floats(0, 5,
                                                                                                            width=32)),
    mask_bt=arrays(np.bool_, (3, 4)),
    fraction=st.just(0.0) | st.floats(1e-6, 1),
    permutation_seed=st.integers(0, 2**16),
)
def test_high_entropy_mask_properties(entropy_bt, mask_bt, fraction, permutation_seed):
    """Kept tokens are valid, at least k = 1 + floor(fraction (n - 1)) of them (exactly k without ties at the
    threshold), every kept entropy >= every dropped valid one, and the choice does not depend on token order."""
    kept = np.asarray(losses.high_entropy_mask(entropy_bt, mask_bt, top_fraction=fraction))
    n = int(mask_bt.sum())
    assert not np.any(kept & ~mask_bt)
    if n == 0:
        assert not kept.any()
        return
    k = 1 + int(np.floor(np.float32(n - 1) / np.float32(1 / fraction))) if fraction else 1
    assert kept.sum() >= k
    dropped = mask_bt & ~kept
    if dropped.any():
        assert entropy_bt[kept].min() > entropy_bt[dropped].max()
    if len(np.unique(entropy_bt[mask_bt])) == n:
        assert kept.sum() == k
    order = np.random.RandomState(permutation_seed).permutation(entropy_bt.size)
    shuffled = losses.high_entropy_mask(entropy_bt.ravel()[order].reshape(3, 4), mask_bt.ravel()[order].reshape(3, 4),
                                        top_fraction=fraction)
    np.testing.assert_array_equal(np.asarray(shuffled).ravel(), kept.ravel()[order])


@given(small_log_ratio, advantages_24, arrays(np.bool_, (2, 4)), st.sampled_from([0.1, 0.25, 0.5, 1.0]))
def test_kl_cov_penalises_the_top_covariance_tokens_and_only_adds_to_the_surrogate(log_ratio_bt, advantages_bt,
                                                                                  mask_bt, ratio):
    old = jnp.full((2, 4), -2.0) - jnp.arange(8.0).reshape(2, 4) / 4
    logp = old + jnp.asarray(log_ratio_bt)
    loss, info = losses.kl_cov_loss(logp, old, advantages_bt, mask_bt, kl_cov_ratio=ratio)
    surrogate, _ = losses.no_clip_pg_loss(logp, old, advantages_bt, mask_bt)
    penalised = np.asarray(info.penalised_bt)
    n = int(mask_bt.sum())
    assert penalised.sum() == (max(int(np.floor(n * ratio + 1e-9)), 1) if n else 0)
    assert not np.any(penalised & ~mask_bt)
    cov = np.asarray(losses.token_covariance(logp, advantages_bt, mask_bt))
    if penalised.any() and (mask_bt & ~penalised).any():
        assert cov[penalised].min() >= cov[mask_bt & ~penalised].max()
    loss, surrogate = np.asarray(loss), np.asarray(surrogate)
    np.testing.assert_array_equal(loss[~penalised], surrogate[~penalised])
    assert np.all(loss[penalised] >= surrogate[penalised] - 1e-6)


def test_clip_cov_detaches_a_uniformly_random_subset_of_the_candidates():
    """Over 400 keys each of the two candidates (tokens 0 and 2) is detached about half the time, never another
    token: the choice is uniform, as verl's randperm, and a function of the key only."""
    counts = np.zeros(4)
    loss_fn = jax.jit(jax.vmap(lambda key: losses.clip_cov_loss(COV_LOGP, COV_LOGP, COV_ADVANTAGES, FOUR, key,
                                                                 clip_cov_ratio=0.25)[1].cov_detached_bt[0]))
    detached = np.asarray(loss_fn(jax.random.split(KEY, 400)))
    counts = detached.sum(axis=0)
    assert np.all(detached.sum(axis=1) == 1)
    assert counts[1] == counts[3] == 0
    assert 160 <= counts[0] <= 240  # Binomial(400, 1/2): mean 200, std 10
    np.testing.assert_array_equal(loss_fn(jax.random.split(KEY, 400)), detached)


policy_gradient = jax.jit(jax.value_and_grad(lambda lp, a, m: jnp.sum(losses.policy_gradient_loss(lp, a, m))))


def test_policy_gradient_hand_computed():
    # loss -A logp: A = 2, logp = -0.5 -> 1; A = -1, logp = -3 -> -3; gradient -A; the masked NaN gives 0
    logp, advantages = tokens(-0.5, -3.0, jnp.nan), tokens(2.0, -1.0, 5.0)
    mask = jnp.asarray([[True, True, False]])
    np.testing.assert_allclose(losses.policy_gradient_loss(logp, advantages, mask), [[1.0, -3.0, 0.0]])
    np.testing.assert_array_equal(policy_gradient(logp, advantages, mask)[1], [[-2.0, 1.0, 0.0]])


@DTYPES
def test_policy_gradient_matches_reference_and_is_ppo_on_policy(dtype):
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        expected = ref.policy_gradient(r.logp, r.advantages, r.mask)
        assert_values(losses.policy_gradient_loss(x.logp, x.advantages, x.mask), expected.loss)
        grad = policy_gradient(x.logp, x.advantages, x.mask)[1]
        assert_grads(grad, expected.grad, dtype)
        assert_grads(ppo(x.logp, x.logp, x.advantages, x.mask)[2], expected.grad, dtype)
