"""Per-token estimators of KL(pi_theta || pi_ref) from sampled tokens (Schulman 2020, "Approximating KL
divergence"), as GRPO's KL penalty uses them; [B, T], 0 on masked tokens.

Conventions:
- delta = log(pi_ref / pi_theta) = clip(ref_logp - logp, -input_clamp, input_clamp), input clamp 20; the
  estimate is then clipped to [-output_clamp, output_clamp], output clamp 10 (verl). An active clamp passes
  no gradient. Computation is float32; masked tokens never reach exp (see `losses.clamped_log_ratio`).
- Tokens are sampled from pi_theta (on-policy), the sample is fixed, and the gradient flows through logp.

What each estimator's gradient estimates, in expectation over y ~ pi_theta (proved by enumerating a
categorical's support in tests/core/test_kl.py):
- k1 = -delta: E[grad k1] = E[grad log pi] = 0. Its value is unbiased for KL, its pathwise gradient is
  not; used as a detached per-token reward (KL in the reward, score-function convention), E[sg(k1) grad log pi]
  = grad KL(pi || ref) exactly.
- k2 = delta^2 / 2: E[grad k2] = E[-delta grad log pi] = grad KL(pi || ref). Unbiased (while no clamp is active);
  its value is a biased estimate of KL.
- k3 = e^delta - delta - 1 ("low_var_kl"): unbiased, low-variance value, but E[grad k3] =
  -E_pi[(pi_ref / pi) grad log pi] = grad KL(pi_ref || pi), the gradient of the *forward* KL.
- abs = |delta| (verl "abs"): E[grad abs] = E_pi[sign(log pi - log ref) grad log pi] = sum_y sign(pi - ref) grad pi
  = grad sum_y |pi(y) - ref(y)|, twice the gradient of the total variation distance, not of any KL; its value
  E_pi |log(pi / ref)| >= KL(pi || ref) (Jensen). The gradient at delta = 0 is 0.
- kX_k2_grad (verl's "k1+", "k3+"): value of kX, gradient of k2 (straight-through), so both the logged value
  and the gradient are unbiased. The gradient path is k2 of the input-clamped delta without the output
  clamp, so it stays unbiased up to |delta| = 20.
"""

import jax
import jax.numpy as jnp

from rubric_jax.core.losses import abs_zero_subgradient, clamped_log_ratio


def _delta(logp_bt: jax.Array, ref_logp_bt: jax.Array, mask_bt: jax.Array, input_clamp: float) -> jax.Array:
    return clamped_log_ratio(ref_logp_bt, logp_bt, mask_bt, clamp=input_clamp)


def _finish(kl_bt: jax.Array, mask_bt: jax.Array, output_clamp: float) -> jax.Array:
    return jnp.where(mask_bt, jnp.clip(kl_bt, -output_clamp, output_clamp), 0)


def kl_k1(
    logp_bt: jax.Array,
    ref_logp_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    input_clamp: float = 20.0,
    output_clamp: float = 10.0,
) -> jax.Array:
    """k1 = -delta = log pi - log pi_ref (Schulman 2020; verl "kl"). Conventions in the module docstring."""
    mask_bt = mask_bt.astype(bool)
    return _finish(-_delta(logp_bt, ref_logp_bt, mask_bt, input_clamp), mask_bt, output_clamp)


def kl_k2(
    logp_bt: jax.Array,
    ref_logp_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    input_clamp: float = 20.0,
    output_clamp: float = 10.0,
) -> jax.Array:
    """k2 = delta^2 / 2 (Schulman 2020; verl "mse"). Conventions in the module docstring."""
    mask_bt = mask_bt.astype(bool)
    return _finish(0.5 * jnp.square(_delta(logp_bt, ref_logp_bt, mask_bt, input_clamp)), mask_bt, output_clamp)


def kl_k3(
    logp_bt: jax.Array,
    ref_logp_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    input_clamp: float = 20.0,
    output_clamp: float = 10.0,
) -> jax.Array:
    """k3 = e^delta - delta - 1 (Schulman 2020; GRPO eq 4; verl "low_var_kl"). Conventions in the module
    docstring: its gradient estimates the forward KL's, use `kl_k3_k2_grad` for an unbiased one."""
    mask_bt = mask_bt.astype(bool)
    delta_bt = _delta(logp_bt, ref_logp_bt, mask_bt, input_clamp)
    return _finish(jnp.expm1(delta_bt) - delta_bt, mask_bt, output_clamp)


def kl_abs(
    logp_bt: jax.Array,
    ref_logp_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    input_clamp: float = 20.0,
    output_clamp: float = 10.0,
) -> jax.Array:
    """abs = |delta| = |log pi - log pi_ref| (verl "abs"). Conventions in the module docstring: it penalises
    distance from the reference, but neither its value nor its gradient estimates the KL's."""
    mask_bt = mask_bt.astype(bool)
    return _finish(abs_zero_subgradient(_delta(logp_bt, ref_logp_bt, mask_bt, input_clamp)), mask_bt, output_clamp)


def _with_k2_gradient(
    value_bt: jax.Array, logp_bt: jax.Array, ref_logp_bt: jax.Array, mask_bt: jax.Array, input_clamp: float
) -> jax.Array:
    k2_bt = 0.5 * jnp.square(_delta(logp_bt, ref_logp_bt, mask_bt, input_clamp))
    # (k2 - sg(k2)) is exactly 0, so the value is exactly value_bt (no rounding through k2).
    return jnp.where(mask_bt, (k2_bt - jax.lax.stop_gradient(k2_bt)) + jax.lax.stop_gradient(value_bt), 0)


def kl_k1_k2_grad(
    logp_bt: jax.Array,
    ref_logp_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    input_clamp: float = 20.0,
    output_clamp: float = 10.0,
) -> jax.Array:
    """Straight-through k1 (verl "k1+"): value of `kl_k1`, gradient of k2 = delta^2 / 2, i.e. -delta per
    unit of grad(logp). Conventions in the module docstring."""
    mask_bt = mask_bt.astype(bool)
    value_bt = kl_k1(logp_bt, ref_logp_bt, mask_bt, input_clamp=input_clamp, output_clamp=output_clamp)
    return _with_k2_gradient(value_bt, logp_bt, ref_logp_bt, mask_bt, input_clamp)


def kl_k3_k2_grad(
    logp_bt: jax.Array,
    ref_logp_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    input_clamp: float = 20.0,
    output_clamp: float = 10.0,
) -> jax.Array:
    """Straight-through k3 (verl "k3+" / "low_var_kl+"): value of `kl_k3`, gradient of k2 = delta^2 / 2.
    Conventions in the module docstring."""
    mask_bt = mask_bt.astype(bool)
    value_bt = kl_k3(logp_bt, ref_logp_bt, mask_bt, input_clamp=input_clamp, output_clamp=output_clamp)
    return _with_k2_gradient(value_bt, logp_bt, ref_logp_bt, mask_bt, input_clamp)
