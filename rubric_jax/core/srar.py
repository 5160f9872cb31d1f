"""SRaR: step-wise rubric rewards with a decoupled advantage (srar.txt, section 3.3, eqs 2-6, Algorithm 1).

Arrays for one batch of B rollouts answering prompts with K rubric items each:
- `satisfied_bk` [B, K] judge verdicts s_j (bool), `item_type_bk` [B, K] (SUGGEST / PITFALL / BONUS / ANSWER from
  `rubric_jax.core.rewards`), `item_mask_bk` [B, K] (the items that exist), `item_step_bk` [B, K] k_j, the step
  the judge attributed item j to: k >= 1 a `### Step k:` step, 0 the whole response, -1 no step.
- `step_ids_bt` [B, T] the step of each token: k >= 1 inside step k's span, 0 outside any step (the prompt,
  text before the first header, padding). `response_mask_bt` [B, T] marks the response tokens.
- `max_steps` S, static: steps are 1..S; step slots 0..S.

Conventions, following the authors' code (REFERENCE.md section 2):
- Only satisfied SUGGEST / PITFALL / BONUS items carry a delta (eq 3). ANSWER items and unsatisfied items carry
  none and do not make a rollout a member of a step group; a judge failure (every item "not satisfied") takes
  the rollout out of every step group.
- N_type counts every existing item of the type in the rollout's rubric, whatever its step (eq 3).
- An item attributed to step -1 keeps its share of its type's budget but reaches no step group and no token.
- An item attributed to a step the response does not have (k > the response's last step, k > S or k < -1) is
  treated as step 0.
- Step 0's normalised delta goes to every response token; step k's to the tokens of step k (eq 5), so a token
  of step k receives d_bar[0] + d_bar[k] and a token outside any step receives d_bar[0].
- Step normalisation (eq 4) is over the rollouts of the same prompt that have a delta-bearing item at that step
  (G_k). |G_k| <= 1 or std_k <= eps gives 0. `std_ddof` 1 (default, the authors' code) or 0 (the paper's eq 9).
"""

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from rubric_jax.core.advantages import broadcast_to_tokens, grpo_advantages
from rubric_jax.core.rewards import BONUS, PITFALL, SUGGEST, TypedBudgets
from rubric_jax.core.segments import dense_segment_ids, pair_segment_ids, rows_mask, segment_stats


class StepRewards(NamedTuple):
    """Per-step raw rubric reward d[b, k] (Algorithm 1, line 9) and whether rollout b is in G_k, [B, S + 1]."""

    reward_bs: jax.Array
    present_bs: jax.Array


def srar_item_deltas(
    satisfied_bk: jax.Array,
    item_type_bk: jax.Array,
    item_mask_bk: jax.Array,
    budgets: TypedBudgets = TypedBudgets(),
) -> tuple[jax.Array, jax.Array]:
    """Typed per-item deltas with budgets (SRaR eq 3).

    delta_j = +R_SUG / N_SUG, -|R_PIT| / N_PIT, +R_BON / N_BON for a satisfied item of that type, else 0, where
    N_type counts the rollout's existing items of that type. Returns (delta_bk float32, carries_delta_bk bool):
    the second marks satisfied, existing SUGGEST / PITFALL / BONUS items (the items that place a rollout in G_k).
    """
    chex.assert_rank([satisfied_bk, item_type_bk, item_mask_bk], 2)
    chex.assert_equal_shape([satisfied_bk, item_type_bk, item_mask_bk])
    exists = item_mask_bk.astype(bool)
    per_type = {
        SUGGEST: abs(budgets.suggest),
        PITFALL: -abs(budgets.pitfall),
        BONUS: abs(budgets.bonus),
    }
    delta = jnp.zeros(satisfied_bk.shape, jnp.float32)
    for item_type, budget in per_type.items():
        of_type = exists & (item_type_bk == item_type)
        count = of_type.sum(axis=1, keepdims=True)
        delta = jnp.where(of_type, budget / jnp.maximum(count, 1), delta)
    carries_delta = exists & satisfied_bk.astype(bool) & jnp.isin(item_type_bk, jnp.array(list(per_type)))
    return jnp.where(carries_delta, delta, 0.0), carries_delta


def srar_rubric_total(
    satisfied_bk: jax.Array,
    item_type_bk: jax.Array,
    item_mask_bk: jax.Array,
    budgets: TypedBudgets = TypedBudgets(),
) -> jax.Array:
    """Response-level rubric reward Delta_i = sum of the rollout's eq 3 deltas, [B] (Proposition 20.5 bounds it
    in [-|R_PIT|, |R_SUG| + |R_BON|]; the merged RaR-style ablation adds it to r_base). Empty rubric -> 0."""
    return srar_item_deltas(satisfied_bk, item_type_bk, item_mask_bk, budgets)[0].sum(axis=1)


def response_step_counts(step_ids_bt: jax.Array, response_mask_bt: jax.Array) -> jax.Array:
    """The last step each response has, [B] (0 for a response without step headers)."""
    chex.assert_equal_shape([step_ids_bt, response_mask_bt])
    return jnp.max(jnp.where(response_mask_bt, step_ids_bt, 0), axis=1)


def srar_step_rewards(
    delta_bk: jax.Array,
    carries_delta_bk: jax.Array,
    item_step_bk: jax.Array,
    num_steps_b: jax.Array,
    *,
    max_steps: int,
) -> StepRewards:
    """Per-step raw rubric reward d[b, k] = sum of the deltas attributed to step k (Algorithm 1, line 9).

    `num_steps_b` [B] is each response's last step (`response_step_counts`); items attributed to a step outside
    [-1, num_steps_b] or above `max_steps` count as step 0; items at step -1 are dropped here. Returns
    StepRewards with [B, max_steps + 1] arrays, slot 0 the whole response.
    """
    chex.assert_equal_shape([delta_bk, carries_delta_bk, item_step_bk])
    chex.assert_rank(num_steps_b, 1)
    in_range = (item_step_bk >= -1) & (item_step_bk <= jnp.minimum(num_steps_b, max_steps)[:, None])
    slot = jnp.where(in_range, item_step_bk, 0)
    reaches_step = carries_delta_bk.astype(bool) & (slot >= 0)
    one_hot_bks = jax.nn.one_hot(slot, max_steps + 1, dtype=jnp.float32) * reaches_step[..., None]
    reward = jnp.einsum("bk,bks->bs", delta_bk.astype(jnp.float32), one_hot_bks)
    present = jnp.einsum("bks->bs", one_hot_bks) > 0
    return StepRewards(reward_bs=jnp.where(present, reward, 0.0), present_bs=present)


def srar_step_normalize(
    step_rewards: StepRewards,
    group_ids: jax.Array,
    mask: Optional[jax.Array] = None,
    *,
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> jax.Array:
    """Cross-rollout step normalisation (SRaR eq 4): d_bar[b, k] = (d[b, k] - mu_k) / (sigma_k + eps).

    mu_k and sigma_k are over G_k, the valid rollouts of b's group that are present at step k. 0 where b is not
    in G_k, where |G_k| <= 1 and where sigma_k <= eps. Returns [B, S + 1] float32.
    """
    reward_bs, present_bs = step_rewards
    num_rows, num_slots = reward_bs.shape
    valid = rows_mask(mask, num_rows)
    dense_groups = dense_segment_ids(group_ids)
    slots = jnp.broadcast_to(jnp.arange(num_slots), (num_rows, num_slots))
    pair_ids = pair_segment_ids(jnp.broadcast_to(dense_groups[:, None], slots.shape), slots, num_slots)
    members = present_bs & valid[:, None]
    stats = segment_stats(
        reward_bs.reshape(-1), pair_ids.reshape(-1), members.reshape(-1), num_rows * num_slots, ddof=std_ddof
    )
    count, std, deviation = (x.reshape(num_rows, num_slots) for x in (stats.count, stats.std, stats.deviation))
    informative = members & (count > 1) & (std > eps)
    return jnp.where(informative, deviation / (std + eps), 0.0)


def srar_token_offsets(step_offsets_bs: jax.Array, step_ids_bt: jax.Array, response_mask_bt: jax.Array) -> jax.Array:
    """Per-step token assignment (SRaR eq 5): each response token gets d_bar[0] + d_bar[its step], [B, T].

    Tokens outside any step get d_bar[0]; tokens whose step exceeds max_steps get d_bar[0] only; 0 off the mask.
    """
    chex.assert_rank([step_offsets_bs, step_ids_bt], 2)
    chex.assert_equal_shape([step_ids_bt, response_mask_bt])
    max_steps = step_offsets_bs.shape[1] - 1
    # One gather per token from a per-row table: slot 0 holds d_bar[0], slot k holds d_bar[0] + d_bar[k].
    table_bs = step_offsets_bs + jnp.where(jnp.arange(max_steps + 1) >= 1, step_offsets_bs[:, :1], 0.0)
    in_step = (step_ids_bt >= 1) & (step_ids_bt <= max_steps)
    offsets = jnp.take_along_axis(table_bs, jnp.where(in_step, step_ids_bt, 0), axis=1)
    return jnp.where(response_mask_bt, offsets, 0.0)


def srar_advantages(
    base_rewards: jax.Array,
    group_ids: jax.Array,
    satisfied_bk: jax.Array,
    item_type_bk: jax.Array,
    item_mask_bk: jax.Array,
    item_step_bk: jax.Array,
    step_ids_bt: jax.Array,
    response_mask_bt: jax.Array,
    mask: Optional[jax.Array] = None,
    *,
    max_steps: int,
    budgets: TypedBudgets = TypedBudgets(),
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> jax.Array:
    """The decoupled SRaR advantage (eq 6, Algorithm 1): GRPO advantage of r_base on every response token plus
    the step-normalised rubric offset of the token's step. Returns [B, T] float32, 0 for masked rollouts.

    `base_rewards` [B] is r_base = (1 - lambda) r_acc + lambda r_fmt (`rubric_jax.core.rewards`).
    """
    valid = rows_mask(mask, base_rewards.shape[0])
    outcome = grpo_advantages(base_rewards, group_ids, valid, std_ddof=std_ddof, eps=eps)
    delta_bk, carries_delta_bk = srar_item_deltas(satisfied_bk, item_type_bk, item_mask_bk, budgets)
    step_rewards = srar_step_rewards(
        delta_bk, carries_delta_bk, item_step_bk, response_step_counts(step_ids_bt, response_mask_bt),
        max_steps=max_steps,
    )
    step_offsets = srar_step_normalize(step_rewards, group_ids, valid, std_ddof=std_ddof, eps=eps)
    token_mask = response_mask_bt.astype(bool) & valid[:, None]
    # The outcome advantage reaches every response token, as step 0's offset does: add it to slot 0.
    return srar_token_offsets(step_offsets.at[:, 0].add(outcome), step_ids_bt, token_mask)


def srar_merged_advantages(
    base_rewards: jax.Array,
    group_ids: jax.Array,
    satisfied_bk: jax.Array,
    item_type_bk: jax.Array,
    item_mask_bk: jax.Array,
    item_step_bk: jax.Array,
    step_ids_bt: jax.Array,
    response_mask_bt: jax.Array,
    mask: Optional[jax.Array] = None,
    *,
    max_steps: int,
    budgets: TypedBudgets = TypedBudgets(),
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> jax.Array:
    """SRaR's "merged RaR-style" ablation (srar.txt, Appendix 18, decoupled-advantage ablation).

    One scalar reward r_base + sum of the rollout's item deltas is GRPO-normalised in its group and allocated to
    the tokens of the steps that received rubric scores (all response tokens when step 0 did). A rollout with no
    delta-bearing item keeps its advantage on every response token, so an outcome-only rollout is not silenced.
    Returns [B, T] float32, 0 for masked rollouts.
    """
    valid = rows_mask(mask, base_rewards.shape[0])
    delta_bk, carries_delta_bk = srar_item_deltas(satisfied_bk, item_type_bk, item_mask_bk, budgets)
    merged = base_rewards.astype(jnp.float32) + delta_bk.sum(axis=1)  # r_base + srar_rubric_total
    advantage = grpo_advantages(merged, group_ids, valid, std_ddof=std_ddof, eps=eps)
    present_bs = srar_step_rewards(
        delta_bk, carries_delta_bk, item_step_bk, response_step_counts(step_ids_bt, response_mask_bt),
        max_steps=max_steps,
    ).present_bs
    scored_bt = srar_token_offsets(present_bs.astype(jnp.float32), step_ids_bt, response_mask_bt) > 0
    unscored_b = ~present_bs.any(axis=1)
    receives_bt = response_mask_bt.astype(bool) & (scored_bt | unscored_b[:, None]) & valid[:, None]
    return broadcast_to_tokens(advantage, receives_bt)
