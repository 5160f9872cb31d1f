import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rubric_jax.core import kl
from tests.core import reference_losses as ref
from tests.core.reference_losses import BF16_GRAD, F32, SEEDS, draw

ESTIMATORS = {
    "k1": kl.kl_k1,
    "k2": kl.kl_k2,
    "k3": kl.kl_k3,
    "k1_k2_grad": kl.kl_k1_k2_grad,
    "k3_k2_grad": kl.kl_k3_k2_grad,
    "abs": kl.kl_abs,
}


def value_and_token_grad(kl_fn):
    """Jitted (logp, ref_logp, mask) -> (kl_bt, d sum(kl_bt) / d logp_bt)."""

    def run(logp_bt, ref_logp_bt, mask_bt):
        total = lambda lp: jnp.sum(kl_fn(lp, ref_logp_bt, mask_bt))
        return kl_fn(logp_bt, ref_logp_bt, mask_bt), jax.grad(total)(logp_bt)

    return jax.jit(run)


JITTED = {name: value_and_token_grad(fn) for name, fn in ESTIMATORS.items()}


# ---------------------------------------------------------------- hand-computed cases


def test_estimators_hand_computed_at_delta_ln2():
    # delta = ref_logp - logp = ln 2: k1 = -ln 2, k2 = ln^2(2) / 2 = 0.2402265, k3 = 2 - ln 2 - 1 = 0.3068528
    logp = jnp.asarray([[-1.0]])
    ref_logp = logp + math.log(2.0)
    mask = jnp.ones((1, 1), bool)
    expected = {"k1": -math.log(2), "k2": 0.5 * math.log(2) ** 2, "k3": 1 - math.log(2)}
    expected.update(k1_k2_grad=expected["k1"], k3_k2_grad=expected["k3"])
    for name, value in expected.items():
        np.testing.assert_allclose(JITTED[name](logp, ref_logp, mask)[0], [[value]], rtol=1e-6)
    # gradients w.r.t. logp: k1 -> 1, k2 -> -delta, k3 -> 1 - e^delta = -1, straight-through -> -delta
    grads = {"k1": 1.0, "k2": -math.log(2), "k3": -1.0, "k1_k2_grad": -math.log(2), "k3_k2_grad": -math.log(2)}
    for name, grad in grads.items():
        np.testing.assert_allclose(JITTED[name](logp, ref_logp, mask)[1], [[grad]], rtol=1e-6)


def test_clamps_on_input_and_output():
    # delta = 25 (input clamp 20), 5 (k2 = 12.5 and k3 = 142 beyond the output clamp 10), -12 (k1 = 12, k3 = 11)
    logp = jnp.zeros((1, 3))
    ref_logp = jnp.asarray([[25.0, 5.0, -12.0]])
    mask = jnp.ones((1, 3), bool)
    values = {name: np.asarray(JITTED[name](logp, ref_logp, mask)[0]) for name in ESTIMATORS}
    np.testing.assert_allclose(values["k1"], [[-10.0, -5.0, 10.0]])
    np.testing.assert_allclose(values["k2"], [[10.0, 10.0, 10.0]])
    np.testing.assert_allclose(values["k3"], [[10.0, 10.0, 10.0]])
    grads = {name: np.asarray(JITTED[name](logp, ref_logp, mask)[1]) for name in ESTIMATORS}
    np.testing.assert_array_equal(grads["k1"], [[0.0, 1.0, 0.0]])  # the output clamp is active at -10 and 10
    np.testing.assert_array_equal(grads["k2"], [[0.0, 0.0, 0.0]])
    # the straight-through gradient path has only the input clamp: -delta for |delta| < 20
    np.testing.assert_allclose(grads["k3_k2_grad"], [[0.0, -5.0, 12.0]])
    np.testing.assert_allclose(grads["k1_k2_grad"], [[0.0, -5.0, 12.0]])


def test_straight_through_value_is_exactly_the_estimator_value():
    x, _ = draw(1, np.float32)
    for value_name, straight_name in (("k1", "k1_k2_grad"), ("k3", "k3_k2_grad")):
        value = JITTED[value_name](x.logp, x.ref_logp, x.mask)[0]
        np.testing.assert_array_equal(JITTED[straight_name](x.logp, x.ref_logp, x.mask)[0], value)


def test_masked_tokens_are_zero_with_zero_gradient():
    logp = jnp.asarray([[jnp.nan, -1.0, -jnp.inf]])
    ref_logp = jnp.asarray([[-1.0, jnp.inf, -2.0]])
    mask = jnp.asarray([[False, False, True]])
    for name in ESTIMATORS:
        value, grad = JITTED[name](logp.at[0, 2].set(-1.0), ref_logp, mask)
        np.testing.assert_array_equal(np.asarray(value)[0, :2], 0.0)
        np.testing.assert_array_equal(np.asarray(grad)[0, :2], 0.0)


# ---------------------------------------------------------------- against the NumPy loop reference


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_estimator_matches_reference(name, dtype):
    for seed in SEEDS:
        x, r = draw(seed, dtype)
        value, grad = JITTED[name](x.logp, x.ref_logp, x.mask)
        if name == "abs":
            expected_value, expected_grad = ref.kl_abs(r.logp, r.ref_logp, r.mask)
        else:
            expected_value, expected_grad = ref.kl(r.logp, r.ref_logp, r.mask, name)
        assert np.asarray(value).dtype == np.float32
        np.testing.assert_allclose(value, expected_value, **F32)
        grad = np.asarray(grad).astype(np.float64)
        assert np.all(np.isfinite(grad))
        np.testing.assert_allclose(grad, expected_grad, **(F32 if dtype == np.float32 else BF16_GRAD))


# ---------------------------------------------------------------- REFERENCE.md section 4, item 10 (KL gradients)

NUM_CLASSES = 6


def toy_categorical(seed: int):
    """Policy logits theta and a reference policy's log-probabilities on a 6-way categorical, close enough
    that no clamp is active (|delta| < 4.4)."""
    key_policy, key_ref = jax.random.split(jax.random.PRNGKey(seed))
    theta = jax.random.normal(key_policy, (NUM_CLASSES,))
    ref_logp = jax.nn.log_softmax(theta + 0.8 * jax.random.normal(key_ref, (NUM_CLASSES,)))
    assert float(jnp.max(jnp.abs(ref_logp - jax.nn.log_softmax(theta)))) < 4.4
    return theta, ref_logp


def reverse_kl(theta, ref_logp):
    """KL(pi_theta || pi_ref), exactly."""
    logp = jax.nn.log_softmax(theta)
    return jnp.sum(jnp.exp(logp) * (logp - ref_logp))


def forward_kl(theta, ref_logp):
    """KL(pi_ref || pi_theta), exactly."""
    return jnp.sum(jnp.exp(ref_logp) * (ref_logp - jax.nn.log_softmax(theta)))


def expected_over_policy(per_token_fn, theta, ref_logp):
    """E_{y ~ pi_theta}[per_token_fn(log pi_theta(y), log pi_ref(y))], by enumerating the support with the
    probabilities held fixed: a sampled token does not move when theta does, only its log-probability does."""
    logp = jax.nn.log_softmax(theta)[None, :]
    probs = jax.lax.stop_gradient(jnp.exp(logp))
    return jnp.sum(probs * per_token_fn(logp, ref_logp[None, :], jnp.ones((1, NUM_CLASSES), bool)))


expected_gradient = jax.jit(jax.grad(expected_over_policy, argnums=1), static_argnums=0)


GRAD_TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", ["k2", "k1_k2_grad", "k3_k2_grad"])
def test_reference_item_10_k2_gradient_estimators_are_unbiased_for_reverse_kl(name, seed):
    """E_pi[grad k2] = E_pi[(log pi - log ref) grad log pi] = grad KL(pi || ref): k2 and every estimator that
    borrows its gradient give the exact gradient in expectation."""
    theta, ref_logp = toy_categorical(seed)
    np.testing.assert_allclose(
        expected_gradient(ESTIMATORS[name], theta, ref_logp), jax.grad(reverse_kl)(theta, ref_logp), **GRAD_TOL
    )


@pytest.mark.parametrize("seed", range(3))
def test_reference_item_10_k1_is_unbiased_only_under_the_score_function_convention(seed):
    """Differentiated through logp, E_pi[grad k1] = E_pi[grad log pi] = 0: no KL gradient at all. As a detached
    per-token reward (KL in the reward), E_pi[sg(k1) grad log pi] = grad KL(pi || ref) exactly."""
    theta, ref_logp = toy_categorical(seed)
    np.testing.assert_allclose(expected_gradient(kl.kl_k1, theta, ref_logp), 0.0, atol=1e-6)

    def score_function(logp, ref_logp, mask):
        return jax.lax.stop_gradient(kl.kl_k1(logp, ref_logp, mask)) * logp

    np.testing.assert_allclose(
        expected_gradient(score_function, theta, ref_logp), jax.grad(reverse_kl)(theta, ref_logp), **GRAD_TOL
    )


@pytest.mark.parametrize("seed", range(3))
def test_reference_item_10_k3_gradient_is_the_forward_kl_gradient(seed):
    """E_pi[grad k3] = -E_pi[(ref / pi) grad log pi] = -sum_y ref(y) grad log pi(y) = grad KL(ref || pi):
    biased for the reverse KL whose value k3 estimates."""
    theta, ref_logp = toy_categorical(seed)
    k3_gradient = expected_gradient(kl.kl_k3, theta, ref_logp)
    np.testing.assert_allclose(k3_gradient, jax.grad(forward_kl)(theta, ref_logp), **GRAD_TOL)
    assert np.max(np.abs(k3_gradient - jax.grad(reverse_kl)(theta, ref_logp))) > 1e-2


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", ["k1", "k3", "k1_k2_grad", "k3_k2_grad"])
def test_reference_item_10_k1_and_k3_values_are_unbiased(name, seed):
    """E_pi[k1] = E_pi[k3] = KL(pi || ref) (k3 because E_pi[ref / pi - 1] = 0); straight-through keeps the value."""
    theta, ref_logp = toy_categorical(seed)
    np.testing.assert_allclose(
        expected_over_policy(ESTIMATORS[name], theta, ref_logp), reverse_kl(theta, ref_logp), rtol=1e-5, atol=1e-7
    )


# ---------------------------------------------------------------- verl's "abs"


def test_abs_hand_computed_values_gradients_and_clamps():
    # delta = ref - logp: ln 2 -> |delta| = 0.6931472, d/dlogp = -sign(delta) = -1; -0.5 -> 0.5, +1;
    # 0 -> 0 with gradient 0 (torch's abs); -12 -> 10 at the output clamp, no gradient; 25 -> 20 -> 10, none
    logp = jnp.zeros((1, 5))
    ref_logp = jnp.asarray([[math.log(2.0), -0.5, 0.0, -12.0, 25.0]])
    value, grad = JITTED["abs"](logp, ref_logp, jnp.ones((1, 5), bool))
    np.testing.assert_allclose(value, [[math.log(2.0), 0.5, 0.0, 10.0, 10.0]], rtol=1e-6)
    np.testing.assert_array_equal(grad, [[-1.0, 1.0, 0.0, 0.0, 0.0]])


def total_variation_times_two(theta, ref_logp):
    """sum_y |pi(y) - ref(y)|, exactly."""
    return jnp.sum(jnp.abs(jnp.exp(jax.nn.log_softmax(theta)) - jnp.exp(ref_logp)))


@pytest.mark.parametrize("seed", range(3))
def test_abs_gradient_is_the_total_variation_gradient_and_its_value_bounds_kl(seed):
    """E_pi[grad |log pi - log ref|] = sum_y pi sign(log pi - log ref) grad log pi = sum_y sign(pi - ref) grad pi
    = grad sum_y |pi - ref|: twice the total variation's gradient, not the KL's. Its value E_pi |log pi / ref|
    is >= |E_pi log pi / ref| = KL(pi || ref)."""
    theta, ref_logp = toy_categorical(seed)
    abs_gradient = expected_gradient(kl.kl_abs, theta, ref_logp)
    np.testing.assert_allclose(abs_gradient, jax.grad(total_variation_times_two)(theta, ref_logp), **GRAD_TOL)
    assert np.max(np.abs(abs_gradient - jax.grad(reverse_kl)(theta, ref_logp))) > 1e-2
    assert expected_over_policy(kl.kl_abs, theta, ref_logp) >= reverse_kl(theta, ref_logp)
