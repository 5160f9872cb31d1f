"""The policy-loss options every recipe shares (`base.PolicyLossConfig` -> `policy_loss_fn`): the defaults are
exactly today's PPO clip; each loss (ppo, dual_clip, gspo), each rollout correction (tis, icepop, seq_mask_tis)
and the KL penalty, alone and composed, match the slow NumPy references of tests/core on random batches (values
and per-token gradients); the correction reweights the policy term only; bad settings are rejected."""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rubric_jax.algorithms.base import PolicyLossConfig, aggregate_fn, micro_batch_key, policy_loss_fn
from rubric_jax.algorithms.grpo import GRPOConfig
from rubric_jax.core import aggregation, losses
from rubric_jax.models import train_step
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import AlgorithmSpec, LearnerConfig
from tests.core import reference_losses as ref
from rubric_jax.yaml_config import load_config
from tests.core.reference_losses import draw
from tests.training.test_rl import tiny_rl_config
from tests.training.toy_task import toy_task

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
    """(loss, gradient, policy-term clip flags or None for a loss without them, the correction's weights) from
    tests/core's references."""
    eps = (config.eps_low, config.eps_high)
    if config.loss == "gspo":
        policy = ref.gspo(r.logp, r.old_logp, r.advantages, r.mask, config.gspo_eps_low, config.gspo_eps_high)
    elif config.loss == "dual_clip":
        policy, _ = ref.dual_clip(r.logp, r.old_logp, r.advantages, r.mask, *eps, config.clip_ratio_c)
    elif config.loss == "gmpo":
        policy = ref.gmpo(r.logp, r.old_logp, r.advantages, r.mask, config.gmpo_eps_low, config.gmpo_eps_high)
    elif config.loss == "sapo":
        policy, _ = ref.sapo(r.logp, r.old_logp, r.advantages, r.mask, config.sapo_tau_pos, config.sapo_tau_neg)
    elif config.loss == "clip_cov":
        priority = np.asarray(jax.random.uniform(micro_batch_key(batch_of(r)), r.mask.shape))
        policy, _ = ref.clip_cov(r.logp, r.old_logp, r.advantages, r.mask, priority, *eps, config.clip_cov_ratio,
                                 config.clip_cov_lb, config.clip_cov_ub)
    elif config.loss == "kl_cov":
        policy, _ = ref.kl_cov(r.logp, r.old_logp, r.advantages, r.mask, config.kl_cov_ratio, config.kl_cov_coef)
    elif config.loss == "cispo":
        policy = ref.cispo(r.logp, r.old_logp, r.advantages, r.mask, config.cispo_eps_low, config.cispo_eps_high)
    elif config.loss == "vespo":
        policy, _ = ref.vespo(r.logp, r.old_logp, r.advantages, r.mask, config.vespo_k_pos, config.vespo_lambda_pos,
                              config.vespo_k_neg, config.vespo_lambda_neg)
    elif config.loss == "gpg":
        policy = ref.policy_gradient(r.logp, r.advantages, r.mask)
    else:
        policy = ref.ppo_clip(r.logp, r.old_logp, r.advantages, r.mask, *eps)
    selected = np.where(r.mask, 1.0, 0.0)
    if config.token_selection == "high_entropy":
        selected = ref.high_entropy_mask(r.entropy, r.mask, config.entropy_top_fraction).astype(np.float64)
    weights = np.where(r.mask, 1.0, 0.0)
    if config.rollout_correction != "none":
        low, high = ((0.0, config.tis_cap) if config.rollout_correction == "tis"
                     else (config.is_low, config.is_high))
        weights = ref.mismatch_weights(r.old_logp, r.rollout_logp, r.mask, config.rollout_correction, low, high)
    kl_value, kl_grad = np.zeros(r.logp.shape), np.zeros(r.logp.shape)
    if config.kl_coef > 0 and config.kl_estimator == "abs":
        kl_value, kl_grad = ref.kl_abs(r.logp, r.ref_logp, r.mask)
    elif config.kl_coef > 0:
        kl_value, kl_grad = ref.kl(r.logp, r.ref_logp, r.mask, config.kl_estimator)
    factor = weights * selected
    loss = policy.loss * factor + config.kl_coef * kl_value
    grad = policy.grad * factor + config.kl_coef * kl_grad
    scale = np.abs(policy.loss * factor) + np.abs(config.kl_coef * kl_value)
    grad_scale = np.abs(policy.grad * factor) + np.abs(config.kl_coef * kl_grad)
    clipped = None if config.loss in ("sapo", "kl_cov", "vespo", "gpg") else policy.clipped
    return loss, grad, clipped, weights, (scale, grad_scale)


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


OPTIONS += [
    PolicyLossConfig(loss="gmpo", aggregation="seq_mean_token_mean"),
    PolicyLossConfig(loss="gmpo", aggregation="seq_mean_token_mean", gmpo_eps_low=0.2, gmpo_eps_high=0.3,
                     rollout_correction="tis", kl_coef=0.1, kl_estimator="k3_k2_grad"),
    PolicyLossConfig(loss="sapo", aggregation="seq_mean_token_mean"),
    PolicyLossConfig(loss="sapo", sapo_tau_pos=2.0, sapo_tau_neg=3.0, rollout_correction="icepop", is_low=0.8,
                     is_high=1.25, kl_coef=0.1, kl_estimator="abs"),
    PolicyLossConfig(loss="clip_cov", eps_high=0.28, clip_cov_ratio=0.1),
    PolicyLossConfig(loss="clip_cov", clip_cov_ratio=0.2, clip_cov_lb=0.5, clip_cov_ub=3.0,
                     rollout_correction="seq_mask_tis", is_low=0.8, is_high=1.25, kl_coef=0.1),
    PolicyLossConfig(loss="kl_cov", kl_cov_ratio=0.1),
    PolicyLossConfig(loss="kl_cov", kl_cov_ratio=0.3, kl_cov_coef=0.5, rollout_correction="tis", kl_coef=0.1),
    PolicyLossConfig(loss="cispo", cispo_eps_high=4.0),
    PolicyLossConfig(loss="cispo", cispo_eps_low=0.2, cispo_eps_high=0.28, kl_coef=0.1, kl_estimator="k2"),
    PolicyLossConfig(loss="vespo"),
    PolicyLossConfig(loss="vespo", vespo_k_pos=1.0, vespo_lambda_pos=0.5, rollout_correction="tis"),
    PolicyLossConfig(loss="gspo", aggregation="seq_mean_token_sum", gspo_eps_low=0.2, gspo_eps_high=0.28),
    PolicyLossConfig(kl_coef=0.1, kl_estimator="abs"),
    PolicyLossConfig(loss="gpg"),
    PolicyLossConfig(loss="gpg", token_selection="high_entropy", rollout_correction="tis", kl_coef=0.1),
    PolicyLossConfig(token_selection="high_entropy"),
    PolicyLossConfig(loss="dual_clip", token_selection="high_entropy", entropy_top_fraction=0.5,
                     rollout_correction="icepop", is_low=0.8, is_high=1.25, kl_coef=0.1),
    PolicyLossConfig(loss="gmpo", aggregation="seq_mean_token_mean", token_selection="high_entropy",
                     entropy_top_fraction=0.0),
    PolicyLossConfig(loss="clip_cov", clip_cov_ratio=0.1, token_selection="high_entropy", entropy_top_fraction=1.0),
]


def option_id(config: PolicyLossConfig) -> str:
    return (f"{config.loss}-{config.rollout_correction}-kl{config.kl_coef}{config.kl_estimator}-"
            f"{config.token_selection}{config.entropy_top_fraction}-{config.aggregation}")


@pytest.mark.parametrize("config", OPTIONS, ids=option_id)
def test_every_option_matches_the_numpy_reference(config):
    for seed in SEEDS:
        x, r = draw(seed, np.float32)
        loss_bt, metrics, grad = run(config, x)
        loss, expected_grad, clipped, weights, (scale, grad_scale) = reference(config, r)
        assert_close(loss_bt, loss, scale)
        assert_close(grad, expected_grad, grad_scale)
        if clipped is None:
            assert "clip_fraction" not in metrics
        else:
            np.testing.assert_array_equal(metrics["clip_fraction"], clipped)
        assert ("dual_clip_fraction" in metrics) == (config.loss == "dual_clip")
        if config.token_selection == "high_entropy":
            expected_selected = ref.high_entropy_mask(r.entropy, r.mask, config.entropy_top_fraction)
            np.testing.assert_array_equal(metrics["entropy_selected"], expected_selected)
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


def test_micro_batch_key_depends_on_the_response_tokens_old_logprobs_only_not_on_their_order():
    x, _ = draw(0, np.float32)
    key = jax.random.key_data(micro_batch_key(batch_of(x)))
    order = np.random.RandomState(0).permutation(x.mask.shape[0])
    shuffled = x._replace(old_logp=x.old_logp[order], mask=x.mask[order])
    np.testing.assert_array_equal(jax.random.key_data(micro_batch_key(batch_of(shuffled))), key)
    padding = x._replace(old_logp=np.where(x.mask, x.old_logp, np.float32(123.0)))  # masked values do not count
    np.testing.assert_array_equal(jax.random.key_data(micro_batch_key(batch_of(padding))), key)
    moved = x._replace(old_logp=np.where(x.mask, x.old_logp + np.float32(0.5), x.old_logp))
    assert not np.array_equal(jax.random.key_data(micro_batch_key(batch_of(moved))), key)


def trl_per_token_loss(x: ref.PolicyBatch, eps_low=0.2, eps_high=0.28, delta=None):
    """TRL GRPOTrainer._compute_loss's token-level clipped loss: coef_1 = r (capped at delta when set),
    -min(coef_1 A, clip(r, 1 - eps_low, 1 + eps_high) A), transcribed in jnp; masked tokens zeroed."""

    def loss(logp_bt):
        ratio = jnp.exp(jnp.clip(jnp.where(x.mask, logp_bt - x.old_logp, 0), -20, 20))
        coef_1 = ratio if delta is None else jnp.minimum(ratio, delta)
        advantages = jnp.where(x.mask, x.advantages, 0)
        per_token = -jnp.minimum(coef_1 * advantages, jnp.clip(ratio, 1 - eps_low, 1 + eps_high) * advantages)
        return jnp.where(x.mask, per_token, 0)

    return loss


def test_trl_delta_is_the_dual_clip_with_c_equal_to_delta():
    config = PolicyLossConfig(loss="dual_clip", eps_high=0.28, clip_ratio_c=3.0)
    for seed in SEEDS:
        x, _ = draw(seed, np.float32)
        loss_bt, _, grad = run(config, x)
        trl = trl_per_token_loss(x, delta=3.0)
        np.testing.assert_allclose(loss_bt, trl(jnp.asarray(x.logp)), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(grad, jax.grad(lambda lp: jnp.sum(trl(lp)))(jnp.asarray(x.logp)), rtol=1e-6,
                                   atol=1e-7)


def test_trl_luspo_is_gspo_with_seq_mean_token_sum():
    """TRL's "luspo": s_b = exp(mean_t log r) with the gradient through the mean, loss_b = -min(s A_b, clip(s) A_b)
    times the sequence's length, averaged over the rows (all valid here): value and gradient equal
    (gspo, seq_mean_token_sum)'s."""
    config = PolicyLossConfig(loss="gspo", aggregation="seq_mean_token_sum", gspo_eps_low=0.2, gspo_eps_high=0.28)
    loss_fn, aggregate = policy_loss_fn(config), aggregate_fn(config)
    for seed in SEEDS:
        x, _ = draw(seed, np.float32)
        logp = np.where(x.mask, x.logp, np.float32(-1.0))  # finite values where a token is made valid below
        old_logp = np.where(x.mask, np.clip(x.old_logp, logp - 5, logp + 5), np.float32(-1.2))
        x = x._replace(logp=logp, old_logp=old_logp, mask=x.mask | (np.arange(7) == 0),  # every row valid, as TRL's
                       advantages=np.repeat(np.where(x.mask[:, :1], x.advantages[:, :1], np.float32(0.5)), 7, axis=1))

        def ours(logp_bt):
            loss_bt, _ = loss_fn(logp_bt, x.entropy, batch_of(x))
            return aggregation.finalize(*aggregate(loss_bt, x.mask))

        def luspo(logp_bt):
            lengths = x.mask.sum(-1)
            log_s = jnp.sum(jnp.where(x.mask, logp_bt - x.old_logp, 0), -1) / lengths
            s, advantages = jnp.exp(log_s), x.advantages[:, 0]
            per_sequence = -jnp.minimum(s * advantages, jnp.clip(s, 0.8, 1.28) * advantages)
            return jnp.mean(per_sequence * lengths)

        logp = jnp.asarray(x.logp)
        assert np.isfinite(ours(logp))
        np.testing.assert_allclose(ours(logp), luspo(logp), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(jax.grad(ours)(logp), jax.grad(luspo)(logp), rtol=1e-5, atol=1e-6)


def test_high_entropy_selection_keeps_the_dropped_tokens_in_the_denominator():
    x, r = draw(1, np.float32)
    config = PolicyLossConfig(token_selection="high_entropy", entropy_top_fraction=0.2)
    loss_bt, metrics, _ = run(config, x)
    plain_bt, _, _ = run(PolicyLossConfig(), x)
    kept = ref.high_entropy_mask(r.entropy, r.mask, 0.2)
    assert 0 < kept.sum() < r.mask.sum()
    np.testing.assert_array_equal(loss_bt, np.where(kept, plain_bt, 0))
    terms = aggregate_fn(config)(jnp.asarray(loss_bt), x.mask)
    np.testing.assert_allclose(aggregation.finalize(*terms), plain_bt[kept].sum() / r.mask.sum(), rtol=1e-6)


@pytest.mark.parametrize("changes, message", [
    ({"loss": "gmpo"}, "loss gmpo needs aggregation seq_mean_token_mean"),
    ({"loss": "gspo", "aggregation": "token_mean"}, "loss gspo needs aggregation seq_mean_token_mean or "
                                                    "seq_mean_token_sum"),
    ({"loss": "cispo"}, "loss cispo needs cispo_eps_high >= 0"),
    ({"sapo_tau_neg": 0.0}, "sapo_tau_neg must be > 0"),
    ({"vespo_lambda_pos": -1.0}, "vespo_lambda_pos must be > 0"),
    ({"vespo_k_neg": -1.0}, "vespo_k_neg must be >= 0"),
    ({"gmpo_eps_low": -0.1}, "gmpo_eps_low must be >= 0"),
    ({"clip_cov_ratio": 0.0}, r"clip_cov_ratio must be in \(0, 1\]"),
    ({"kl_cov_ratio": 1.5}, r"kl_cov_ratio must be in \(0, 1\]"),
    ({"clip_cov_lb": 5.0, "clip_cov_ub": 5.0}, "clip_cov_lb must be < clip_cov_ub"),
    ({"entropy_top_fraction": 1.2}, r"entropy_top_fraction must be in \[0, 1\]"),
    ({"kl_cov_coef": -1.0}, "kl_cov_coef must be >= 0"),
])
def test_bad_settings_of_the_verl_and_trl_losses_are_rejected(changes, message):
    with pytest.raises(ValueError, match=message):
        PolicyLossConfig(**changes)


def test_every_loss_and_selection_is_selectable_from_yaml(tmp_path):
    """A recipe's policy_loss section in a YAML config reaches PolicyLossConfig's fields."""
    path = tmp_path / "grpo.yaml"
    path.write_text("policy_loss:\n  loss: clip_cov\n  clip_cov_ratio: 0.01\n  token_selection: high_entropy\n"
                    "  entropy_top_fraction: 0.3\n  kl_coef: 0.01\n  kl_estimator: abs\n")
    config = load_config(GRPOConfig, path).policy_loss
    assert (config.loss, config.clip_cov_ratio, config.token_selection, config.entropy_top_fraction,
            config.kl_estimator) == ("clip_cov", 0.01, "high_entropy", 0.3, "abs")
    for loss in ("sapo", "kl_cov", "vespo"):
        assert load_config(GRPOConfig, path, [f"policy_loss.loss={loss}"]).policy_loss.loss == loss
    with pytest.raises(ValueError, match="loss gmpo needs aggregation"):
        load_config(GRPOConfig, path, ["policy_loss.loss=gmpo"])


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


@pytest.mark.parametrize("policy_loss", [
    {"loss": "clip_cov", "clip_cov_ratio": 0.2, "clip_cov_lb": 0.0, "token_selection": "high_entropy",
     "kl_coef": 0.01, "kl_estimator": "abs"},
    {"loss": "gmpo", "aggregation": "seq_mean_token_mean", "rollout_correction": "tis"},
    {"loss": "kl_cov", "kl_cov_ratio": 0.1},
], ids=lambda p: p["loss"])
def test_one_rl_step_end_to_end_with_micro_batches(tmp_path, policy_loss):
    """The new losses and the token selection inside the trainer's jitted, accumulated step (two epochs of two
    micro-batches each, so the second epoch is off-policy and every term has a gradient)."""
    config = tiny_rl_config(tmp_path, algorithm=AlgorithmSpec(name="rar", params={"policy_loss": policy_loss}),
                            learner=LearnerConfig(epochs=2, micro_batches=2))
    last = train_rl(config, toy_task())
    assert all(math.isfinite(value) for value in last.values())
    assert last["train/grad_norm"] > 0
    if policy_loss.get("token_selection") == "high_entropy":
        assert 0 < last["train/entropy_selected"] < 1
