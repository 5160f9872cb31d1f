"""PPO with a learned critic: rewards placed on tokens, generalised advantage estimation (GAE) over [B, T], and the
clipped value loss (Schulman et al. 2016, "High-dimensional continuous control using generalized advantage
estimation"; Schulman et al. 2017, PPO; as verl's `compute_gae_advantage_return` and `compute_value_loss` in
verl/trainer/ppo/core_algos.py, which follow TRL's PPO trainer). RLCER (rlcer.txt, section 4.5, Table 3) trains
its two roles with PPO and such a critic.

Shared conventions:
- `response_mask_bt` [B, T] marks the tokens that are actions (bool; other types are cast). Everything else (a
  left-padded prompt region, right padding, gaps inside a response, whole padding rows) is invisible: it neither
  contributes to nor breaks any recursion, and every output is 0 there. Inputs there are replaced by 0 before
  use, so padding values (NaN, inf) reach no output.
- Values are aligned with the tokens they precede, as logprobs are: `values_bt[b, t]` = V(s) for the state s =
  the tokens before t, the state in which token t is chosen (verl's `values[:, -response_length - 1:-1]`).
- The episode ends after a row's last valid token: the value there is 0 (no bootstrap), as in verl.
- Computation runs in float32 (or the inputs' wider float type); bfloat16 inputs are promoted first.
"""

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from rubric_jax.core.segments import as_stats_dtype, stats_dtype


class ValueLossInfo(NamedTuple):
    """Per-token diagnostics of `clipped_value_loss`; False on masked tokens."""

    clipped_bt: jax.Array  # bool: the clipped prediction's error is strictly the larger (verl's vf_clipfrac)


def _check_tokens(*arrays_bt: jax.Array) -> None:
    chex.assert_rank(list(arrays_bt), 2)
    chex.assert_equal_shape(list(arrays_bt))


def last_token_rewards(rewards_b: jax.Array, response_mask_bt: jax.Array) -> jax.Array:
    """A sequence reward r_b on its row's last valid token, 0 elsewhere: the token-level reward of an outcome
    (or rubric) reward under PPO (verl's reward managers write `reward_tensor[i, valid_response_length - 1]`).

    Returns [B, T] float32. A row with no valid token (an empty or rejected response) receives nothing: its
    reward lands on no token, so it cannot leak into another row or into the prompt region (REFERENCE.md section
    4, item 1). With gaps in the mask, "last" is the last True position.
    """
    chex.assert_rank([rewards_b, response_mask_bt], [1, 2])
    chex.assert_equal_shape_prefix([rewards_b, response_mask_bt], 1)
    mask_bt = response_mask_bt.astype(bool)
    length = mask_bt.shape[1]
    last_b = length - 1 - jnp.argmax(mask_bt[:, ::-1], axis=1)
    is_last_bt = (jnp.arange(length)[None, :] == last_b[:, None]) & mask_bt
    return jnp.where(is_last_bt, as_stats_dtype(rewards_b)[:, None], 0)


def gae_advantages(
    token_rewards_bt: jax.Array,
    values_bt: jax.Array,
    response_mask_bt: jax.Array,
    *,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    """GAE (Schulman et al. 2016, eq 16) per token, and the critic's regression targets: (advantages_bt,
    returns_bt), float32 [B, T].

    Over the valid tokens t_1 < ... < t_n of a row (the mask's True positions, in order):
      delta_i = r_{t_i} + gamma V_{t_{i+1}} - V_{t_i},  V_{t_{n+1}} = 0 (the episode ends after t_n)
      A_{t_i} = delta_i + gamma lam A_{t_{i+1}},        A_{t_{n+1}} = 0
      R_{t_i} = A_{t_i} + V_{t_i}
    computed by a reverse scan along T that carries (next value, next advantage) across invalid positions
    unchanged, exactly as verl's loop does. With gamma = lam = 1 (verl's defaults), R is the reward-to-go and A
    the reward-to-go minus the value. Rewards and values off the mask are ignored; advantages and returns are 0
    there (verl leaves the carried advantage on invalid positions and masks it later; the loss never sees
    either). No whitening here: `advantages.whiten_tokens` is the separate step verl applies after GAE.
    """
    _check_tokens(token_rewards_bt, values_bt, response_mask_bt)
    mask_bt = response_mask_bt.astype(bool)
    dtype = jnp.promote_types(stats_dtype(token_rewards_bt), stats_dtype(values_bt))
    rewards_bt = jnp.where(mask_bt, token_rewards_bt.astype(dtype), 0)
    values_bt = jnp.where(mask_bt, values_bt.astype(dtype), 0)

    def backward(carry, xs):
        next_value_b, next_advantage_b = carry
        reward_b, value_b, valid_b = xs
        advantage_b = reward_b + gamma * next_value_b - value_b + gamma * lam * next_advantage_b
        carry = (jnp.where(valid_b, value_b, next_value_b), jnp.where(valid_b, advantage_b, next_advantage_b))
        return carry, jnp.where(valid_b, advantage_b, 0)

    zeros_b = jnp.zeros(mask_bt.shape[:1], dtype)
    _, advantages_tb = jax.lax.scan(backward, (zeros_b, zeros_b), (rewards_bt.T, values_bt.T, mask_bt.T),
                                    reverse=True)
    advantages_bt = advantages_tb.T
    return advantages_bt, jnp.where(mask_bt, advantages_bt + values_bt, 0)


def clipped_value_loss(
    values_bt: jax.Array,
    old_values_bt: jax.Array,
    returns_bt: jax.Array,
    response_mask_bt: jax.Array,
    *,
    clip: float,
) -> tuple[jax.Array, ValueLossInfo]:
    """PPO's clipped value loss per token (verl's `compute_value_loss`, TRL's PPO trainer), to be minimised:

      0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)

    V = `values_bt` (the critic being trained; the gradient flows through it), V_old = `old_values_bt` (the
    critic's values when the returns R were computed), c = `clip` >= 0. Returns (loss_bt, ValueLossInfo), 0 /
    False on masked tokens; aggregate with any `core.aggregation` mode (verl applies its 0.5 after aggregating,
    the same thing). `clipped_bt` is verl's vf_clipfrac: the clipped error is strictly the larger, so the token
    passes no gradient.
    """
    _check_tokens(values_bt, old_values_bt, returns_bt, response_mask_bt)
    if not clip >= 0:
        raise ValueError(f"clip must be >= 0, got {clip!r}")
    mask_bt = response_mask_bt.astype(bool)

    def masked(x_bt):
        return jnp.where(mask_bt, as_stats_dtype(x_bt), 0)

    values_bt, old_values_bt, returns_bt = masked(values_bt), masked(old_values_bt), masked(returns_bt)
    clipped_values_bt = jnp.clip(values_bt, old_values_bt - clip, old_values_bt + clip)
    unclipped_loss_bt = jnp.square(values_bt - returns_bt)
    clipped_loss_bt = jnp.square(clipped_values_bt - returns_bt)
    loss_bt = 0.5 * jnp.maximum(unclipped_loss_bt, clipped_loss_bt)
    return jnp.where(mask_bt, loss_bt, 0), ValueLossInfo(mask_bt & (clipped_loss_bt > unclipped_loss_bt))
