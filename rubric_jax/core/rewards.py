"""Reward math: rubric aggregation, outcome rewards, and shaping of per-rollout rewards [B].

Arrays for a batch of B rollouts judged against rubrics of up to K items:
- `satisfied_bk` [B, K] verdicts: bool, or float in [0, 1] for partial credit where a paper allows it. An item is
  *met* when its verdict is 1 (full credit); that is what "all criteria satisfied" tests.
- `item_mask_bk` [B, K] marks the items that exist; a masked item contributes to no numerator and no denominator.
- `weights_bk` (non-negative) or `points_bk` (signed): [B, K], or [K] for one rubric shared by every rollout
  (RLCER's rubrics, one question's rubric); so may `item_mask_bk`.
- SRaR's item types SUGGEST, PITFALL, BONUS, ANSWER and budgets are defined here; their math is in `srar.py`.
- lengths [B] are response lengths in tokens.

Every function computes in float32 (bool, int and bfloat16 inputs are promoted; float64 stays float64), works
under jit and vmap, and returns a defined value on every degenerate input (empty rubric, no positive points,
zero attainable range), stated in its docstring. Shaping functions map rewards [B] to rewards [B] so they chain.
"""

import dataclasses
from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from rubric_jax.core.segments import as_stats_dtype, rows_mask

# SRaR item types (srar.txt, section 3.3): standard reasoning, known errors, exceptional insights, final answer.
SUGGEST, PITFALL, BONUS, ANSWER = 0, 1, 2, 3


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class TypedBudgets:
    """SRaR's per-type reward budgets R_SUG, R_PIT, R_BON (srar.txt, eq 3 and section 4: 0.8, -1.0, 1.0).

    Frozen and hashable, and registered as a static pytree node: it may be passed to a jitted function as a
    static argument or as an ordinary argument (it has no array leaves). The signs are fixed by eq 3, whatever
    the signs written here: SUGGEST and BONUS add |R|, PITFALL subtracts |R_PIT|.
    """

    suggest: float = 0.8
    pitfall: float = -1.0
    bonus: float = 1.0


class RubricItems(NamedTuple):
    """A batch's rubric items as one [B, K] layout: `satisfied` the verdicts as floats (`stats_dtype`), `values`
    each item's weight or points in the same dtype, `exists` the items that exist (bool)."""

    satisfied: jax.Array
    values: jax.Array
    exists: jax.Array


def broadcast_rubric_items(satisfied_bk: jax.Array, values_bk: jax.Array, item_mask_bk: jax.Array) -> RubricItems:
    """The verdicts [B, K] (bool or float) as floats, and the per-item values (weights or points) and item mask,
    each [K] (one rubric shared by every rollout) or [B, K], broadcast to the verdicts' [B, K]: the common layout
    every rubric aggregation here starts from (module docstring), and a new one's starting point."""
    chex.assert_rank(satisfied_bk, 2)
    chex.assert_rank([values_bk, item_mask_bk], [{1, 2}, {1, 2}])
    satisfied = as_stats_dtype(satisfied_bk)
    values = jnp.broadcast_to(as_stats_dtype(values_bk), satisfied.shape).astype(satisfied.dtype)
    exists = jnp.broadcast_to(jnp.asarray(item_mask_bk).astype(bool), satisfied.shape)
    return RubricItems(satisfied, values, exists)


def _ratio_or_zero(numerator: jax.Array, denominator: jax.Array) -> jax.Array:
    """numerator / denominator where denominator > 0, else 0 (the degenerate rubric gives no reward)."""
    return jnp.where(denominator > 0, numerator / jnp.where(denominator > 0, denominator, 1), 0)


# ---------------------------------------------------------------- rubric aggregation


def weighted_fraction(satisfied_bk: jax.Array, weights_bk: jax.Array, item_mask_bk: jax.Array) -> jax.Array:
    """Weighted fraction of the rubric met: sum_k w_k s_k / sum_k w_k over existing items, [B].

    Rubric-grounded RL (rubric_grounded_rl.txt, section 3.1, eqs 1-2: awarded weight / total weight) and RGR-GRPO
    (rgr_grpo.txt, eq 4). Weights must be non-negative, as in both papers (the rubric-grounded pipeline discards
    rubrics with a negative weight); a negative weight is treated as 0, so the result stays in [0, 1] for verdicts
    in [0, 1]. Partial credit s in [0, 1] gives the rubric-grounded "awarded weight" a_k = w_k s_k.
    Degenerate: no existing item, or total weight 0 -> 0.
    """
    satisfied, weights, exists = broadcast_rubric_items(satisfied_bk, weights_bk, item_mask_bk)
    weights = jnp.where(exists, jnp.maximum(weights, 0), 0)
    return _ratio_or_zero(jnp.sum(weights * satisfied, axis=1), jnp.sum(weights, axis=1))


def typed_item_credit(satisfied_bk: jax.Array, item_kind_bk: jax.Array, failed_b: jax.Array) -> jax.Array:
    """Per-item credit [B, K] of a typed (SRaR-style) rubric scored at the response level: a PITFALL item is
    "satisfied" when the response falls into it, so it earns credit when avoided (1 - s); every other item earns
    s. A failed judgement (`failed_b`) earns nothing: 0 everywhere, so an avoided-pitfall credit is never paid
    for a verdict that does not exist. For untyped rubrics (no PITFALL) the credit is s on judged rows.
    Feed it to `weighted_fraction` for RaR's reward of a typed rubric."""
    chex.assert_rank([satisfied_bk, item_kind_bk, failed_b], [2, 2, 1])
    satisfied = as_stats_dtype(satisfied_bk)
    credit = jnp.where(jnp.asarray(item_kind_bk) == PITFALL, 1 - satisfied, satisfied)
    return jnp.where(jnp.asarray(failed_b).astype(bool)[:, None], 0, credit)


def positive_points_score(satisfied_bk: jax.Array, points_bk: jax.Array, item_mask_bk: jax.Array) -> jax.Array:
    """Points of the met items, negatives included, over the sum of positive points, [B].

    HealthBench's grader; EvoRubric (evorubric.txt, section 3 "Rubric-based Reward Formulation":
    r_i = sum_k s_ik / K_pos, K_pos = sum_k max(w_k, 0), with s_ik = w_k when criterion k is met).
    Partial credit s in [0, 1] awards s * w_k. The score is at most 1 and can be negative (a met penalty item);
    it is not clipped here (use `clip_rewards`). Degenerate: no positive points (no existing item, or only
    penalty items) -> 0: the normalisation is undefined and 0 is the score of a rubric that rewards nothing.
    """
    satisfied, points, exists = broadcast_rubric_items(satisfied_bk, points_bk, item_mask_bk)
    points = jnp.where(exists, points, 0)
    return _ratio_or_zero(jnp.sum(points * satisfied, axis=1), jnp.sum(jnp.maximum(points, 0), axis=1))


def min_max_score(satisfied_bk: jax.Array, points_bk: jax.Array, item_mask_bk: jax.Array) -> jax.Array:
    """Min-max normalised rubric score (RLCER, rlcer.txt, eq 6): (x - min) / (max - min), [B].

    x = sum_k s_k p_k over existing items; min = sum of their negative points (every penalty met, nothing else),
    max = sum of their positive points. For RLCER pass the valid rubrics as `item_mask_bk`.
    Computed as sum_k c_k / sum_k |p_k| with c_k = s_k p_k for p_k > 0 and (1 - s_k) |p_k| for p_k < 0, which
    equals (x - min) / (max - min) and keeps every term in [0, |p_k|], so the result is in [0, 1] for verdicts in
    [0, 1] without rounding past either end. Degenerate: max == min (no existing item, or all points 0) -> 0.
    """
    satisfied, points, exists = broadcast_rubric_items(satisfied_bk, points_bk, item_mask_bk)
    points = jnp.where(exists, points, 0)
    credit = jnp.where(points > 0, satisfied * points, (1 - satisfied) * -points)
    return _ratio_or_zero(jnp.sum(credit, axis=1), jnp.sum(jnp.abs(points), axis=1))


def rgr_factual_gated_reward(
    satisfied_bk: jax.Array, weights_bk: jax.Array, factual_bk: jax.Array, item_mask_bk: jax.Array
) -> jax.Array:
    """RGR-GRPO's gated rubric reward (rgr_grpo.txt, eq 5), [B].

    r = 1 when every existing factual criterion is met (full credit), otherwise the weighted fraction over *all*
    existing criteria, factual and process (eq 4, `weighted_fraction`). `factual_bk` [B, K] or [K] bool marks the
    factual criteria; the others are process criteria.
    Degenerate: a rubric with no factual criterion never takes the gate (reward = weighted fraction). Read
    literally, eq 5's condition 0 = |C_fact| would hold vacuously and give every such response 1, silencing its
    process criteria; the gate exists to accept correct answers reached by another path, which needs a factual
    check to pass. Empty rubric -> 0.
    """
    satisfied, _, exists = broadcast_rubric_items(satisfied_bk, weights_bk, item_mask_bk)
    factual = jnp.broadcast_to(jnp.asarray(factual_bk).astype(bool), satisfied.shape) & exists
    all_factual_met = jnp.all(~factual | (satisfied >= 1), axis=1) & jnp.any(factual, axis=1)
    return jnp.where(all_factual_met, 1, weighted_fraction(satisfied, weights_bk, item_mask_bk))


# ---------------------------------------------------------------- outcome rewards


def rlcer_outcome_reward(correct_b: jax.Array) -> jax.Array:
    """RLCER's outcome reward (rlcer.txt, eq 8, following DAPO): +1 if the answer is correct, else -1, [B].

    `correct_b` is bool (or 0/1); anything non-zero counts as correct.
    """
    chex.assert_rank(correct_b, 1)
    return jnp.where(jnp.asarray(correct_b).astype(bool), 1.0, -1.0).astype(jnp.float32)


def srar_base_reward(accuracy_b: jax.Array, format_b: jax.Array, *, format_weight: float = 0.1) -> jax.Array:
    """SRaR's base reward (srar.txt, eq 6 and Algorithm 1, line 6): (1 - lambda) r_acc + lambda r_fmt, [B].

    r_acc, r_fmt in {0, 1} (bool or float); lambda = 0.1 in the paper. fmt = step headers and a \\boxed{} answer.
    """
    chex.assert_rank([accuracy_b, format_b], 1)
    chex.assert_equal_shape([accuracy_b, format_b])
    accuracy, fmt = as_stats_dtype(accuracy_b), as_stats_dtype(format_b)
    return (1 - format_weight) * accuracy + format_weight * fmt


# ---------------------------------------------------------------- shaping (rewards [B] -> rewards [B])


def dapo_overlong_shaping(
    rewards_b: jax.Array, lengths_b: jax.Array, *, max_length: int, buffer_length: int, factor: float = 1.0
) -> jax.Array:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq 13; verl's overlong buffer): r + R_length(L), [B].

    R_length = 0 for L <= L_max - buf, -factor * (L - (L_max - buf)) / buf inside the buffer (reaching -factor at
    L = L_max), and -factor beyond L_max (DAPO's eq 13 value; verl never sees L > L_max, and agrees below it).
    buffer_length <= 0 is a hard cutoff: -factor beyond L_max, 0 up to it.
    """
    chex.assert_rank([rewards_b, lengths_b], 1)
    chex.assert_equal_shape([rewards_b, lengths_b])
    rewards = as_stats_dtype(rewards_b)
    lengths = jnp.asarray(lengths_b).astype(rewards.dtype)
    excess = lengths - (max_length - buffer_length)
    ramp = excess / jnp.where(buffer_length > 0, buffer_length, 1)
    penalty = jnp.where(lengths > max_length, factor, jnp.where(excess > 0, factor * ramp, 0))
    return rewards - penalty


def rgr_length_shaping(
    rewards_b: jax.Array, lengths_b: jax.Array, *, target_length: float = 2000.0, coef: float = 1e-4
) -> jax.Array:
    """RGR-GRPO's length penalty (rgr_grpo.txt, section 3: r_i - lambda (L_i - L*), lambda 1e-4, L* = 2k), [B].

    Two-sided exactly as written: a response shorter than L* gains lambda (L* - L). Inside a GRPO group the
    constant lambda L* cancels, so only the -lambda L slope reaches the advantages.
    """
    chex.assert_rank([rewards_b, lengths_b], 1)
    chex.assert_equal_shape([rewards_b, lengths_b])
    rewards = as_stats_dtype(rewards_b)
    return rewards - coef * (jnp.asarray(lengths_b).astype(rewards.dtype) - target_length)


def excess_penalty(amounts: jax.Array, *, budget: float, coef: float) -> jax.Array:
    """A one-sided linear penalty coef * max(x - budget, 0) (>= 0, to subtract), same shape as `amounts`.

    EvoRubric's regularisers (evorubric.txt, eqs 3-4: p_num on the number of proposed criteria, p_len on the
    generated text length) are named but not given a form; this is the form rubric_jax uses for both.
    """
    amounts = as_stats_dtype(amounts)
    return coef * jnp.maximum(amounts - budget, 0)


def truncation_scaling(rewards_b: jax.Array, stopped_b: jax.Array, *, factor: float) -> jax.Array:
    """Truncation penalty (rubric_grounded_rl.txt, Appendix C): the reward times `factor` when the response did
    not stop (no stop token: finish reason "length"), unchanged otherwise, [B]."""
    chex.assert_rank([rewards_b, stopped_b], 1)
    chex.assert_equal_shape([rewards_b, stopped_b])
    rewards = as_stats_dtype(rewards_b)
    return jnp.where(jnp.asarray(stopped_b).astype(bool), rewards, factor * rewards)


def truncation_mask(stopped_b: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    """The mask-out variant of the truncation penalty: [B] bool, True for rollouts that stopped (and are in
    `mask`). Pass it as the estimators' `mask` so a truncated rollout leaks into no group statistic."""
    chex.assert_rank(stopped_b, 1)
    return jnp.asarray(stopped_b).astype(bool) & rows_mask(mask, stopped_b.shape[0])


def clip_rewards(rewards_b: jax.Array, *, low: float = 0.0, high: float = 1.0) -> jax.Array:
    """Rewards clipped to [low, high] (rubric_grounded_rl.txt, section 3.1: parsed rewards are clipped to [0, 1])."""
    return jnp.clip(as_stats_dtype(rewards_b), low, high)
