"""Group-relative advantage estimators over a batch of rollouts [B] (outcome-level) and tokens [B, T].

Shared conventions:
- `group_ids` [B] identify the prompt instance a rollout answers; any integer values, only equality matters
  (two dataset items with equal prompt text are two groups when their ids differ).
- `mask` [B] marks the rollouts that count (None: all). A masked rollout is excluded from every mean and std
  and its advantage is 0, so a rejected or empty sample leaks into nothing (REFERENCE.md section 4, items 1-2).
- `std_ddof`: 1 (default) is the sample std of verl, TRL and the SRaR authors' code; 0 is the population std
  the GRPO and SRaR papers write. `eps` is added to the std in the denominator.
- A group whose valid rewards are all equal gets advantage 0 exactly; a single-sample group gets 0
  (its reward is its own baseline: there is nothing to compare it with). ReMax is the exception: its baseline
  is a greedy rollout's reward, not the group's.
- Advantages are float32 (or the rewards' wider float type); bfloat16 rewards are promoted first.
"""

from typing import Optional

import chex
import jax
import jax.numpy as jnp

from rubric_jax.core.segments import (
    as_stats_dtype,
    dense_segment_ids,
    group_stats,
    leave_one_out_stats,
    rows_mask,
    segment_count,
    segment_stats,
    segment_sum,
)


def scale_by_std(centred: jax.Array, std: jax.Array, eps: float) -> jax.Array:
    """centred / (std + eps) where std > 0, else 0: a zero std means the values tie, so `centred` is exactly 0
    there and the result is defined for any eps >= 0, including eps = 0."""
    return jnp.where(std > 0, centred / (std + eps), 0)


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
    stats = group_stats(rewards, group_ids, valid, std_ddof=std_ddof)
    return jnp.where(valid, scale_by_std(stats.deviation, stats.std, eps), 0)


def dr_grpo_advantages(rewards: jax.Array, group_ids: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): A_i = r_i - mean_g, no std division.

    Returns [B]; 0 for masked rows and single-sample groups.
    """
    valid = rows_mask(mask, rewards.shape[0])
    stats = group_stats(rewards, group_ids, valid, std_ddof=0)
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
    group = group_stats(rewards, group_ids, valid, std_ddof=0)
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


def scale_by_group_std(
    advantages_b: jax.Array,
    rewards: jax.Array,
    group_ids: jax.Array,
    mask: Optional[jax.Array] = None,
    *,
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> jax.Array:
    """An advantage divided by its group's reward std: A_i / (std_g r + eps), 0 where the group's valid rewards
    tie (std 0) and on masked rows.

    The std scaling of the estimators that define their advantage without it: verl's `norm_adv_by_std_in_grpo`
    on GRPO pass@k, GPG's F_norm = std{R(o)} (Chu et al. 2025, `gpg_advantages`). Sample std by default, as
    verl (torch.std) and the GPG authors' code; the GPG authors add eps = 1e-4, verl 1e-6.
    """
    valid = rows_mask(mask, rewards.shape[0])
    stats = group_stats(rewards, group_ids, valid, std_ddof=std_ddof)
    return jnp.where(valid, scale_by_std(as_stats_dtype(advantages_b), stats.std, eps), 0)


def pass_at_k_advantages(rewards: jax.Array, group_ids: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    """GRPO pass@k with k = the group size (Tang et al. 2025, "Optimizing language models for inference time
    objectives using RL", arXiv 2503.19595, the leave-one-out estimator of the gradient of max_j r_j; verl's
    `compute_grpo_passk_outcome_advantage` before its std scaling, which `scale_by_group_std` adds):

        A_i = max_j r_j - max_{j != i} r_j      over the valid rows j of i's group.

    So only a group's best rollout gets an advantage, its margin over the second best; every other rollout gets
    0 (removing it leaves the max unchanged).
    - Ties for the best: removing one best leaves another, so every row gets 0. (verl's `topk` credits the
      first tied index with r_max - r_max = 0: the same values.)
    - Single-sample group (one valid row): 0, no other rollout to form a baseline (verl raises ValueError).
    - Masked rows take no part in any max and get 0.
    The margin is one float subtraction of two rewards, so near-tied rewards keep their exact difference.
    Returns [B] in `stats_dtype(rewards)`.
    """
    chex.assert_equal_shape([rewards, group_ids])
    valid = rows_mask(mask, rewards.shape[0])
    x = as_stats_dtype(rewards)
    ids = dense_segment_ids(group_ids)
    num = x.shape[0]
    best = jax.ops.segment_max(jnp.where(valid, x, -jnp.inf), ids, num_segments=num)[ids]
    is_best = valid & (x == best)
    unique_best = segment_count(ids, is_best, num)[ids] == 1
    runner_up = jax.ops.segment_max(jnp.where(valid & ~is_best, x, -jnp.inf), ids, num_segments=num)[ids]
    has_runner_up = jnp.isfinite(runner_up)
    margin = best - jnp.where(has_runner_up, runner_up, best)
    return jnp.where(is_best & unique_best & has_runner_up, margin, 0)


def opo_advantages(
    rewards: jax.Array, lengths: jax.Array, group_ids: jax.Array, mask: Optional[jax.Array] = None
) -> jax.Array:
    """OPO, the optimal reward baseline (Hao et al. 2025, "On-policy RL with optimal reward baseline",
    arXiv 2505.23585; verl's `compute_opo_outcome_advantage`): the length-weighted group mean as the baseline,

        b_g = sum_j l_j r_j / sum_j l_j,   A_i = r_i - b_g      over the valid rows j of i's group,

    where l_j = |o_j| is the response length in tokens, the paper's proxy for ||grad log pi(o_j)||^2 in the
    variance-minimising baseline E[||grad log pi||^2 r] / E[||grad log pi||^2]. The baseline includes the row
    itself (not leave-one-out), so the advantages are length-weighted zero-sum: sum_i l_i A_i = 0.
    - Computed as d_i - sum_j l_j d_j / sum_j l_j with d = r - mean_g from `segment_stats` (the plain mean
      cancels), so a group of equal rewards gets exactly 0 and near-tied rewards lose no precision.
    - Single-sample group: b = r, A = 0 (verl sets b = 0 there, so A = r: an absolute reward where every other
      group gets a relative one; we keep the equation's value).
    - A group whose valid rows all have length 0 has no weight: 0. A length-0 row in a group with longer ones
      gets r - b, which lands on no token.
    - Masked rows are in no baseline and get 0. `lengths` [B] are >= 0 (ints or floats).
    Returns [B] in `stats_dtype(rewards)`.
    """
    chex.assert_equal_shape([rewards, lengths, group_ids])
    valid = rows_mask(mask, rewards.shape[0])
    ids = dense_segment_ids(group_ids)
    num = rewards.shape[0]
    deviation = segment_stats(rewards, ids, valid, num_segments=num, ddof=0).deviation
    weight = lengths.astype(deviation.dtype)
    total = segment_sum(weight, ids, valid, num)[ids]
    weighted = segment_sum(weight * deviation, ids, valid, num)[ids]
    return jnp.where(valid & (total > 0), deviation - weighted / jnp.where(total > 0, total, 1), 0)


def remax_advantages(rewards: jax.Array, baseline_rewards: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    """ReMax (Li et al. 2024, "ReMax: a simple, effective and efficient RL method for aligning LLMs",
    arXiv 2310.10505, Algorithm 1; verl's `compute_remax_outcome_advantage` for outcome rewards):

        A_i = r(x, o_i) - r(x, o_greedy),

    the baseline being the reward of a greedy (temperature 0) response to the same prompt, sampled for the
    baseline only and never trained on. `baseline_rewards` [B] holds, for each row, the greedy reward of the
    row's prompt (the recipe broadcasts one greedy rollout per prompt to its G rows).
    - No group statistics: a single-sample group (ReMax's own setting, one sample per prompt) gets r - b, and
      a group of equal rewards gets 0 only when they equal the greedy reward.
    - Masked rows get 0. One float subtraction, so near-ties keep their exact difference.
    Returns [B] in `stats_dtype(rewards)`.
    """
    chex.assert_equal_shape([rewards, baseline_rewards])
    valid = rows_mask(mask, rewards.shape[0])
    return jnp.where(valid, as_stats_dtype(rewards) - as_stats_dtype(baseline_rewards), 0)


def gpg_alpha(rewards: jax.Array, group_ids: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    """GPG's gradient correction alpha = B / (B - M) (Chu et al. 2025, "GPG: a simple and strong RL baseline for
    model reasoning", arXiv 2504.02546, its "accurate gradient estimation"), a scalar.

    B is the number of valid rows and M the number of them that cannot carry a gradient: the rows of groups
    whose valid rewards tie (all right or all wrong), single-sample groups included. Dividing the batch-mean
    loss by the informative fraction (B - M) / B undoes its dilution by zero-advantage rows. This is the
    authors' code (`inverse_alpha` = share of groups with std > 0; with equal group sizes, the share of rows).
    verl's `compute_gpg_outcome_advantage` counts instead the rows with a non-zero *reward*
    (alpha = B / count_nonzero(r)), which for 0/1 rewards is 1 / accuracy, not the paper's correction; we
    follow the paper. No informative row: alpha = 1 (every advantage is 0 then anyway).
    """
    valid = rows_mask(mask, rewards.shape[0])
    stats = group_stats(rewards, group_ids, valid, std_ddof=0)
    informative = jnp.sum(valid & (stats.std > 0))
    return jnp.where(informative > 0, jnp.sum(valid) / jnp.maximum(informative, 1), 1).astype(stats.std.dtype)


def gpg_advantages(rewards: jax.Array, group_ids: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    """GPG's advantage with F_norm = 1 (Chu et al. 2025, arXiv 2504.02546, the GPG objective's A = alpha (r - mean) / F_norm; verl's
    `compute_gpg_outcome_advantage` with its default f_norm = 1): A_i = alpha (r_i - mean_g r), alpha from
    `gpg_alpha`. F_norm = 1 is the paper's best ablation row and verl's default; F_norm = std{R(o)} (the authors'
    `scale_rewards`) is `scale_by_group_std` of this. GPG's loss is the plain policy gradient -A log pi, which
    PPO's clipped ratio equals in value and gradient at the first update on fresh rollouts.
    - Single-sample group: 0 (verl uses a mean of 0 there, giving alpha r). Zero-variance group: 0.
    - Masked rows are in no mean and no count (neither B nor M) and get 0.
    Returns [B] in `stats_dtype(rewards)`.
    """
    return gpg_alpha(rewards, group_ids, mask) * dr_grpo_advantages(rewards, group_ids, mask)


def broadcast_to_tokens(advantages_b: jax.Array, response_mask_bt: jax.Array) -> jax.Array:
    """Outcome advantage [B] on every response token [B, T]; 0 on prompt and padding tokens."""
    chex.assert_rank([advantages_b, response_mask_bt], [1, 2])
    chex.assert_equal_shape_prefix([advantages_b, response_mask_bt], 1)
    return jnp.where(response_mask_bt, advantages_b[:, None], 0)


def whiten_tokens(values_bt: jax.Array, response_mask_bt: jax.Array, *, std_ddof: int = 1, eps: float = 1e-8) -> jax.Array:
    """Whitening over all valid tokens of the batch: (x - mean_tok) / (std_tok + eps), 0 off the mask."""
    return whiten_tokens_by_group(values_bt, jnp.zeros(values_bt.shape[:1], jnp.int32), response_mask_bt,
                                  std_ddof=std_ddof, eps=eps)


def whiten_tokens_by_group(values_bt: jax.Array, group_ids_b: jax.Array, response_mask_bt: jax.Array, *,
                           std_ddof: int = 1, eps: float = 1e-8) -> jax.Array:
    """Whitening within each group of rows: (x - mean_g) / (std_g + eps), mean and std over the valid tokens of
    the rows whose `group_ids_b` [B] equal (any ints), 0 off the mask.

    RLCER (rlcer.txt, sections 4.1 and 4.5: advantages "computed separately for each role"): the group is the
    row's role, so the reasoner's and the rubricator's GAE advantages are each whitened over their own tokens
    (verl's masked_whiten, per role). One group is `whiten_tokens`. A group with one valid token, or whose tokens
    tie, gets 0; a group without valid tokens has nothing to whiten.
    """
    chex.assert_rank([values_bt, group_ids_b], [2, 1])
    chex.assert_equal_shape([values_bt, response_mask_bt])
    chex.assert_equal_shape_prefix([values_bt, group_ids_b], 1)
    flat = values_bt.reshape(-1)
    valid = response_mask_bt.reshape(-1).astype(bool)
    token_groups = jnp.broadcast_to(dense_segment_ids(group_ids_b)[:, None], values_bt.shape).reshape(-1)
    stats = segment_stats(flat, token_groups, valid, num_segments=values_bt.shape[0], ddof=std_ddof)
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
