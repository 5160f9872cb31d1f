"""Group-relative advantage estimators over a batch of rollouts [B] (outcome-level) and tokens [B, T].

Shared conventions:
- `group_ids` [B] identify the prompt instance a rollout answers; any integer values, only equality matters
  (two dataset items with equal prompt text are two groups when their ids differ).
- `mask` [B] marks the rollouts that count (None: all). A masked rollout is excluded from every mean and std
  and its advantage is 0, so a rejected or empty sample leaks into nothing (REFERENCE.md section 4, items 1-2).
- `std_ddof`: 1 (default) is the sample std of verl, TRL and the SRaR authors' code; 0 is the population std
  the GRPO and SRaR papers write. `eps` is added to the std in the denominator.
- A group whose valid rewards are all equal gets advantage 0 exactly; a single-sample group gets 0
  (its reward is its own baseline: there is nothing to compare it with).
- Advantages are float32 (or the rewards' wider float type); bfloat16 rewards are promoted first.
"""

from typing import Optional

import chex
import jax
import jax.numpy as jnp

from rubric_jax.core.segments import dense_segment_ids, leave_one_out_stats, rows_mask, segment_stats


def scale_by_std(centred: jax.Array, std: jax.Array, eps: float) -> jax.Array:
    """centred / (std + eps) where std > 0, else 0: a zero std means the values tie, so `centred` is exactly 0
    there and the result is defined for any eps >= 0, including eps = 0."""
    return jnp.where(std > 0, centred / (std + eps), 0)


def _group_stats(rewards: jax.Array, group_ids: jax.Array, valid: jax.Array, std_ddof: int):
    chex.assert_equal_shape([rewards, group_ids])
    ids = dense_segment_ids(group_ids)
    return segment_stats(rewards, ids, valid, num_segments=rewards.shape[0], ddof=std_ddof)


def grpo_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    mask: Optional[jax.Array] = None,
    *,
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> jax.Array:
    """GRPO (Shao et al. 2024; SRaR eq 6 outcome term): A_i = (r_i - mean_g) / (std_g + eps).

    Returns [B]; 0 for masked rows, single-sample groups and zero-variance groups.
    """
    valid = rows_mask(mask, rewards.shape[0])
    stats = _group_stats(rewards, group_ids, valid, std_ddof)
    return jnp.where(valid, scale_by_std(stats.deviation, stats.std, eps), 0)


def dr_grpo_advantages(rewards: jax.Array, group_ids: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): A_i = r_i - mean_g, no std division.

    Returns [B]; 0 for masked rows and single-sample groups.
    """
    valid = rows_mask(mask, rewards.shape[0])
    stats = _group_stats(rewards, group_ids, valid, std_ddof=0)
    return jnp.where(valid, stats.deviation, 0)


def batch_std_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    mask: Optional[jax.Array] = None,
    *,
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> jax.Array:
    """Group baseline, batch scale (Hu et al., REINFORCE++ / "batch-std" GRPO): (r_i - mean_g) / (std_batch + eps).

    std_batch is the std of all valid rewards of the batch. Returns [B]; 0 for masked rows.
    """
    valid = rows_mask(mask, rewards.shape[0])
    group = _group_stats(rewards, group_ids, valid, std_ddof=0)
    batch = segment_stats(rewards, jnp.zeros(rewards.shape, jnp.int32), valid, num_segments=1, ddof=std_ddof)
    return jnp.where(valid, scale_by_std(group.deviation, batch.std, eps), 0)


def rloo_advantages(rewards: jax.Array, group_ids: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    """RLOO (Ahmadian et al. 2024): A_i = r_i - mean of the other n-1 rewards = n/(n-1) (r_i - mean_g).

    Returns [B]; 0 for masked rows and single-sample groups (no other rollout to form a baseline).
    """
    valid = rows_mask(mask, rewards.shape[0])
    others = leave_one_out_stats(rewards, group_ids, valid)
    return jnp.where(valid & (others.count > 0), others.deviation, 0)


def loo_std_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    mask: Optional[jax.Array] = None,
    *,
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> jax.Array:
    """Leave-one-out baseline with leave-one-out std (rubric-grounded RL, eqs 4-6; NeMo-RL).

    b_i = mean of the other n-1 rewards, s_i = std of the other n-1 rewards (sample std by default),
    A_i = (r_i - b_i) / (s_i + eps) where s_i > 0, and A_i = r_i - b_i where s_i = 0 (the others tie).
    The others' statistics come from segmented Welford scans, so s_i is exactly 0 when the others tie
    and |A| stays bounded by max |r_i - b_i| there (REFERENCE.md section 4, item 4).
    Returns [B]; 0 for masked rows and single-sample groups.
    """
    valid = rows_mask(mask, rewards.shape[0])
    others = leave_one_out_stats(rewards, group_ids, valid, ddof=std_ddof)
    centred = others.deviation
    advantage = jnp.where(others.std > 0, centred / (others.std + eps), centred)
    return jnp.where(valid & (others.count > 0), advantage, 0)


def broadcast_to_tokens(advantages_b: jax.Array, response_mask_bt: jax.Array) -> jax.Array:
    """Outcome advantage [B] on every response token [B, T]; 0 on prompt and padding tokens."""
    chex.assert_rank([advantages_b, response_mask_bt], [1, 2])
    chex.assert_equal_shape_prefix([advantages_b, response_mask_bt], 1)
    return jnp.where(response_mask_bt, advantages_b[:, None], 0)


def whiten_tokens(values_bt: jax.Array, response_mask_bt: jax.Array, *, std_ddof: int = 1, eps: float = 1e-8) -> jax.Array:
    """Whitening over all valid tokens of the batch: (x - mean_tok) / (std_tok + eps), 0 off the mask."""
    chex.assert_rank(values_bt, 2)
    chex.assert_equal_shape([values_bt, response_mask_bt])
    flat = values_bt.reshape(-1)
    valid = response_mask_bt.reshape(-1).astype(bool)
    stats = segment_stats(flat, jnp.zeros(flat.shape, jnp.int32), valid, num_segments=1, ddof=std_ddof)
    whitened = scale_by_std(stats.deviation, stats.std, eps)
    return jnp.where(valid, whitened, 0).reshape(values_bt.shape)


def reinforce_pp_baseline_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    response_mask_bt: jax.Array,
    mask: Optional[jax.Array] = None,
    *,
    std_ddof: int = 1,
    eps: float = 1e-8,
) -> jax.Array:
    """REINFORCE++-baseline (Hu et al. 2025): r_i - mean_g on every response token, then whitened over all
    valid tokens of the batch (so longer responses weigh more in the whitening statistics, as in verl).

    Returns [B, T]; 0 on masked rows and off the response mask.
    """
    valid = rows_mask(mask, rewards.shape[0])
    centred = broadcast_to_tokens(dr_grpo_advantages(rewards, group_ids, valid), response_mask_bt)
    token_mask = response_mask_bt.astype(bool) & valid[:, None]
    return whiten_tokens(centred, token_mask, std_ddof=std_ddof, eps=eps)


def normalize_then_sum_advantages(
    rewards_bm: jax.Array,
    weights_m: jax.Array,
    group_ids: jax.Array,
    mask: Optional[jax.Array] = None,
    *,
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> jax.Array:
    """Multi-reward "normalise then sum" (GDPO): z-score each reward component within its group (GRPO),
    take the weighted sum over components, then z-score the sums over the valid rows of the batch.

    A component that ties within a group contributes 0 there, so one constant component cannot drown
    the others' signal as it would after summing first. Returns [B]; 0 for masked rows.
    """
    chex.assert_rank([rewards_bm, weights_m], [2, 1])
    chex.assert_equal_shape_suffix([rewards_bm, weights_m], 1)
    valid = rows_mask(mask, rewards_bm.shape[0])
    per_component = jax.vmap(
        lambda r: grpo_advantages(r, group_ids, valid, std_ddof=std_ddof, eps=eps), in_axes=1, out_axes=1
    )(rewards_bm)
    summed = per_component @ weights_m.astype(per_component.dtype)
    batch = segment_stats(summed, jnp.zeros(summed.shape, jnp.int32), valid, num_segments=1, ddof=std_ddof)
    return jnp.where(valid, scale_by_std(batch.deviation, batch.std, eps), 0)
