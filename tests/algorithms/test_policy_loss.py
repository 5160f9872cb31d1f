"""The policy-loss options every recipe shares (`base.PolicyLossConfig` -> `policy_loss_fn`): the defaults are
exactly today's PPO clip; each loss (ppo, dual_clip, gspo), each rollout correction (tis, icepop, seq_mask_tis)
and the KL penalty, alone and composed, match the slow NumPy references of tests/core on random batches (values
and per-token gradients); the correction reweights the policy term only; bad settings are rejected."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rubric_jax.algorithms.base import PolicyLossConfig, aggregate_fn, policy_loss_fn
from rubric_jax.core import aggregation, losses
from rubric_jax.models import train_step
from tests.core import reference_losses as ref
from tests.core.reference_losses import draw

SEEDS = range(8)


def batch_of(x: ref.PolicyBatch) -> dict:
    return {"old_logp_bt": x.old_logp, "rollout_logp_bt": x.rollout_logp, "ref_logp_bt": x.ref_logp,
            "advantages_bt": x.advantages, "response_mask_bt": x.mask}


def value_and_token_grad(loss_fn):
    """`loss_fn` as jitted (logp_bt, entropy_bt, batch) -> ((sum, (loss_bt, metrics)), d sum / d logp_bt): the
    per-token derivative, since each token's loss depends on its own logp only (GSPO's through its
    stop-gradient construction)."""

    def total(logp_bt, entropy_bt, batch):
        loss_bt, metrics = loss_fn(logp_bt, entropy_bt, batch)
        return jnp.sum(loss_bt), (loss_bt, metrics)

    return jax.jit(jax.value_and_grad(total, has_aux=True))


@functools.lru_cache(maxsize=None)
def compiled(config: PolicyLossConfig):
    return value_and_token_grad(policy_loss_fn(config))


def run(config, x: ref.PolicyBatch):
    """(loss_bt, token metrics, d sum(loss_bt) / d logp_bt) on `x` of the loss of `config`, a PolicyLossConfig
    or a jitted `value_and_token_grad`."""
    step = compiled(config) if isinstance(config, PolicyLossConfig) else config
    (_, (loss_bt, metrics)), grad = step(x.logp, x.entropy, batch_of(x))
    return np.asarray(loss_bt), jax.device_get(metrics), np.asarray(grad)


def reference(config: PolicyLossConfig, r: ref.PolicyBatch):
    """(loss, gradient, policy-term clip flags, the correction's weights) from tests/core's references."""
    eps = (config.eps_low, config.eps_high)
    if config.loss == "gspo":
        policy = ref.gspo(r.logp, r.old_logp, r.advantages, r.mask, config.gspo_eps_low, config.gspo_eps_high)
    elif config.loss == "dual_clip":
        policy, _ = ref.dual_clip(r.logp, r.old_logp, r.advantages, r.mask, *eps, config.clip_ratio_c)
    else:
        policy = ref.ppo_clip(r.logp, r.old_logp, r.advantages, r.mask, *eps)
    weights = np.where(r.mask, 1.0, 0.0)
    if config.rollout_correction != "none":
        low, high = ((0.0, config.tis_cap) if config.rollout_correction == "tis"
                     else (config.is_low, config.is_high))
        weights = ref.mismatch_weights(r.old_logp, r.rollout_logp, r.mask, config.rollout_correction, low, high)
    kl_value, kl_grad = np.zeros(r.logp.shape), np.zeros(r.logp.shape)
    if config.kl_coef > 0:
        kl_value, kl_grad = ref.kl(r.logp, r.ref_logp, r.mask, config.kl_estimator)
    loss = policy.loss * weights + config.kl_coef * kl_value
    grad = policy.grad * weights + config.kl_coef * kl_grad
    scale = np.abs(policy.loss * weights) + np.abs(config.kl_coef * kl_value)
    grad_scale = np.abs(policy.grad * weights) + np.abs(config.kl_coef * kl_grad)
    return loss, grad, policy.clipped, weights, (scale, grad_scale)


def assert_close(actual, expected, scale):
    """float32 against float64: relative to the size of each term, since a sum of two terms may cancel."""
    assert np.all(np.isfinite(actual))
    np.testing.assert_array_less(np.abs(actual - expected), 2e-5 * scale + 1e-6)


def test_defaults_are_todays_ppo_clip_exactly():
    config = PolicyLossConfig()
    assert (config.loss, config.eps_low, config.eps_high, config.rollout_correction, config.kl_coef,
            config.aggregation) == ("ppo", 0.2, 0.2, "none", 0.0, "token_mean")
    assert aggregate_fn(config) is aggregation.token_mean
    before = value_and_token_grad(train_step.ratio_loss(losses.ppo_clip_loss, eps_low=0.2, eps_high=0.2))
    for seed in SEEDS:
        x, _ = draw(seed, np.float32)
        loss_bt, metrics, grad = run(config, x)
        expected_loss, expected_metrics, expected_grad = run(before, x)
        np.testing.assert_array_equal(loss_bt, expected_loss)
        np.testing.assert_array_equal(grad, expected_grad)
        assert set(metrics) == {"clip_fraction"}
        np.testing.assert_array_equal(metrics["clip_fraction"], expected_metrics["clip_fraction"])


OPTIONS = [
    PolicyLossConfig(loss=loss, eps_high=0.28, rollout_correction=correction, kl_coef=kl_coef,
                     aggregation="seq_mean_token_mean" if loss == "gspo" else "token_mean",
                     gspo_eps_low=0.2 if loss == "gspo" else 3e-4, gspo_eps_high=0.28 if loss == "gspo" else 4e-4,
                     is_low=0.8, is_high=1.25)
    for loss, correction, kl_coef in itertools.product(
        ("ppo", "dual_clip", "gspo"), ("none", "tis", "icepop", "seq_mask_tis"), (0.0, 0.1))
]


@pytest.mark.parametrize("config", OPTIONS, ids=lambda c: f"{c.loss}-{c.rollout_correction}-kl{c.kl_coef}")
def test_every_option_matches_the_numpy_reference(config):
    for seed in SEEDS:
        x, r = draw(seed, np.float32)
        loss_bt, metrics, grad = run(config, x)
        loss, expected_grad, clipped, weights, (scale, grad_scale) = reference(config, r)
        assert_close(loss_bt, loss, scale)
        assert_close(grad, expected_grad, grad_scale)
        np.testing.assert_array_equal(metrics["clip_fraction"], clipped)
        assert ("dual_clip_fraction" in metrics) == (config.loss == "dual_clip")
        assert ("kl" in metrics) == (config.kl_coef > 0)
        if config.rollout_correction == "none":
            assert "is_weight" not in metrics
        else:
            np.testing.assert_allclose(metrics["is_weight"], weights, rtol=2e-5, atol=1e-6)
            np.testing.assert_array_equal(metrics["is_zeroed"], weights == 0)


def test_the_correction_reweights_the_policy_term_and_not_the_kl_term():
    x, r = draw(0, np.float32)
    # every engine logprob far from the learner's: ICEPOP zeroes every token, so only the KL term is left
    x = x._replace(rollout_logp=(x.old_logp - 3.0).astype(np.float32))
    config = PolicyLossConfig(rollout_correction="icepop", kl_coef=0.1)
    loss_bt, metrics, _ = run(config, x)
    kl_value, _ = ref.kl(r.logp, r.ref_logp, r.mask, "k3")
    np.testing.assert_allclose(loss_bt, 0.1 * kl_value, rtol=2e-5, atol=1e-7)
    assert metrics["is_zeroed"][r.mask].all()


finite_logp = arrays(np.float32, (3, 5), elements=st.floats(-8, 0, width=32))


@settings(max_examples=25, deadline=None)
@given(finite_logp, finite_logp, arrays(np.float32, (3, 5), elements=st.floats(-3, 3, width=32)),
       arrays(bool, (3, 5)), st.sampled_from(["ppo", "dual_clip", "gspo"]))
def test_every_correction_is_the_identity_when_the_engine_agrees_with_the_learner(logp, old_logp, adv, mask, loss):
    """w = pi_old / pi_rollout = 1 on every token: TIS, ICEPOP and seq-mask-TIS all leave the loss unchanged."""
    x = ref.PolicyBatch(logp, old_logp, old_logp, old_logp, adv, np.zeros_like(logp), mask, np.zeros(3, bool))
    aggregation_mode = "seq_mean_token_mean" if loss == "gspo" else "token_mean"
    plain, _, plain_grad = run(PolicyLossConfig(loss=loss, aggregation=aggregation_mode), x)
    for correction in ("tis", "icepop", "seq_mask_tis"):
        corrected, metrics, grad = run(
            PolicyLossConfig(loss=loss, aggregation=aggregation_mode, rollout_correction=correction), x)
        np.testing.assert_array_equal(corrected, plain)
        np.testing.assert_array_equal(grad, plain_grad)
        np.testing.assert_array_equal(metrics["is_weight"], mask.astype(np.float32))


def test_each_norm_aggregation_is_selected_with_its_constant():
    # 2 rows, one fully masked; valid token losses 1 and 2: Dr.GRPO's mode counts the one valid row (3 / 4),
    # verl's both rows (3 / 8)
    loss_bt, mask_bt = jnp.asarray([[1.0, 2.0], [5.0, 5.0]]), jnp.asarray([[True, True], [False, False]])
    for name, expected in (("seq_mean_token_sum_norm", 3 / 4), ("token_sum_norm", 3 / 8)):
        aggregate = aggregate_fn(PolicyLossConfig(aggregation=name, norm_constant=4.0))
        np.testing.assert_allclose(aggregation.finalize(*aggregate(loss_bt, mask_bt)), expected, rtol=1e-6)


@pytest.mark.parametrize("changes, message", [
    ({"clip_ratio_c": 1.0}, "clip_ratio_c must be > 1"),
    ({"loss": "gspo"}, "loss gspo needs aggregation seq_mean_token_mean"),
    ({"tis_cap": 0.0}, "tis_cap must be > 0"),
    ({"is_low": 2.0, "is_high": 1.0}, "is_high must be >= is_low"),
    ({"is_low": -0.1}, "is_low must be >= 0"),
    ({"gspo_eps_high": -1e-4}, "gspo_eps_high must be >= 0"),
    ({"eps_low": -0.2}, "eps_low must be >= 0"),
    ({"aggregation": "seq_mean_token_sum_norm"}, "norm_constant is required"),
    ({"aggregation": "token_sum_norm"}, "norm_constant is required"),
    ({"norm_constant": 8.0}, "norm_constant is required"),
])
def test_bad_settings_are_rejected(changes, message):
    with pytest.raises(ValueError, match=message):
        PolicyLossConfig(**changes)
