"""SRaR: step-wise rubric rewards with a decoupled advantage (srar.txt, section 3.3, eqs 2-6, Algorithm 1).

Arrays for one batch of B rollouts answering prompts with K rubric items each:
- `satisfied_bk` [B, K] judge verdicts s_j (bool), `item_type_bk` [B, K] (SUGGEST / PITFALL / BONUS / ANSWER from
  `rubric_jax.core.rewards`), `item_mask_bk` [B, K] (the items that exist), `item_step_bk` [B, K] k_j, the step
  the judge attributed item j to, any int32: k >= 1 the step headed `### Step k:`, 0 the whole response, -1 none.
- `num_steps_b` [B] the number of steps each response has, counted from its parsed headers (the authors'
  `len(parse_steps(response))`, `rubrics.steps.step_spans`): a header whose span holds no token still counts,
  and a response without a header is one step, step 1.
- `step_ids_bt` [B, T] the step of each token: k >= 1 inside step k's span, 0 outside any step (the prompt,
  text before the first header, padding). `response_mask_bt` [B, T] marks the response tokens.

Conventions, transcribing the authors' code (github akarinmoe/SRaR, `recipe/SRaR/reward_manager.py:
compute_rubric_deltas` and `srar_advantage.py:compute_srar_advantage`; REFERENCE.md section 2):
- Only satisfied SUGGEST / PITFALL / BONUS items carry a delta (eq 3); ANSWER items and unsatisfied items carry
  none. N_type counts every existing item of the type in the rollout's rubric, whatever its step.
- Step groups, two readings. The authors' (`srar_item_deltas`'s second output, the default of the recipe): only a
  delta-bearing item makes its rollout a member of its step's group, so a judge failure (every item "not
  satisfied") takes the rollout out of every step group. The paper's (eq 4, Algorithm 1 line 12, Proposition
  20.2; `srar_attributed_items`): G_k holds the rollouts whose judge output has at least one item attributed to
  k, satisfied or not, of any type; such a rollout's d[k] is the sum of its deltas at k, 0 when none is
  satisfied. `srar_step_rewards` takes either as its member items.
- d[b, k] sums the deltas of rollout b's items attributed to k, for every k the judge wrote (line 9), and is
  normalised over G_k (eq 4), whatever k is: -1, 0, a step the response has, or one it does not have
  (k > num_steps_b, or k < -1).
- Token placement of d_bar[b, k] (eq 5): k = 0 every response token; 1 <= k <= num_steps_b the tokens of step k
  (none for an empty step); k = -1 no token; any other k every response token (the authors' fallback). The
  placements add up: a token of step k receives d_bar[k] + d_bar[0] + the d_bar of every fallback step.
- |G_k| <= 1 or std_k <= eps gives 0. `std_ddof` 1 (default, the authors' `torch.std`) or 0 (the paper's eq 9).
- Steps are not capped: a step value is a key, so the arrays keep the items' shape [B, K] (one value per
  (rollout, step), held by the first delta-bearing item attributed to that step).
"""

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from rubric_jax.core.advantages import broadcast_to_tokens, grpo_advantages
from rubric_jax.core.rewards import BONUS, PITFALL, SUGGEST, TypedBudgets
from rubric_jax.core.segments import dense_segment_ids, rows_mask, segment_stats


class StepValues(NamedTuple):
    """One value per (rollout b, attributed step k), [B, K] arrays shaped like the items: `value_bk` on the
    first member item of b attributed to k (`holds_bk`; `srar_step_rewards`), 0 on every other item
    (`srar_token_offsets` relies on it); `step_bk` the items' steps. `holds_bk` row b, step k: rollout b is in
    G_k."""

    value_bk: jax.Array
    holds_bk: jax.Array
    step_bk: jax.Array


def srar_item_deltas(
    satisfied_bk: jax.Array,
    item_type_bk: jax.Array,
    item_mask_bk: jax.Array,
    budgets: TypedBudgets = TypedBudgets(),
) -> tuple[jax.Array, jax.Array]:
    """Typed per-item deltas with budgets (SRaR eq 3).

    delta_j = +R_SUG / N_SUG, -|R_PIT| / N_PIT, +R_BON / N_BON for a satisfied item of that type, else 0, where
    N_type counts the rollout's existing items of that type. Returns (delta_bk float32, carries_delta_bk bool):
    the second marks satisfied, existing SUGGEST / PITFALL / BONUS items (the items that place a rollout in G_k
    under the authors' rule).
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


def srar_attributed_items(item_mask_bk: jax.Array, judged_b: jax.Array) -> jax.Array:
    """The paper's step-group members (SRaR eq 4, Algorithm 1 line 12, Proposition 20.2): G_k is "the set of
    rollouts whose judge evaluation contains at least one rubric item attributed to step k", so every existing
    item of a judged rollout places it in its step's group, satisfied or not, of any type (ANSWER and untyped
    items included). [B, K] bool, for `srar_step_rewards`.

    A failed judgement (`judged_b` False) has no evaluation: its items (all "not satisfied", at step -1, by
    `judges.base`'s convention) place it in no group, as under the authors' rule (`srar_item_deltas`).
    """
    chex.assert_rank([item_mask_bk, judged_b], [2, 1])
    chex.assert_equal_shape_prefix([item_mask_bk, judged_b], 1)
    return item_mask_bk.astype(bool) & judged_b.astype(bool)[:, None]


def srar_step_rewards(delta_bk: jax.Array, member_items_bk: jax.Array, item_step_bk: jax.Array) -> StepValues:
    """Per-step raw rubric reward d[b, k] = sum of rollout b's deltas attributed to step k (Algorithm 1, line 9;
    the authors' `step_deltas[step] += delta`), for every step value k of a member item, as StepValues.

    `member_items_bk` [B, K] bool marks the items that place their rollout in their step's group G_k: the
    delta-bearing items (`srar_item_deltas`'s second output, the authors' rule) or every item of a judged
    rollout (`srar_attributed_items`, the paper's). `delta_bk` must be 0 off the delta-bearing items (as
    `srar_item_deltas` returns it), so a member step without one holds d = 0.
    """
    chex.assert_rank([delta_bk, member_items_bk, item_step_bk], 2)
    chex.assert_equal_shape([delta_bk, member_items_bk, item_step_bk])
    members = member_items_bk.astype(bool)
    same_step_bij = (item_step_bk[:, :, None] == item_step_bk[:, None, :]) & members[:, None, :]
    reward_bk = jnp.einsum("bij,bj->bi", same_step_bij.astype(jnp.float32), delta_bk.astype(jnp.float32))
    num_items = item_step_bk.shape[1]
    earlier_ij = jnp.arange(num_items)[None, :] < jnp.arange(num_items)[:, None]
    holds_bk = members & ~jnp.any(same_step_bij & earlier_ij, axis=2)
    return StepValues(value_bk=jnp.where(holds_bk, reward_bk, 0.0), holds_bk=holds_bk, step_bk=item_step_bk)


def _group_step_segments(group_ids: jax.Array, step_bk: jax.Array) -> jax.Array:
    """Dense segment ids [B * K] of the pairs (group of row b, step value), equal pairs to equal ids."""
    num_rows, num_items = step_bk.shape
    groups_bk = jnp.broadcast_to(dense_segment_ids(group_ids)[:, None], step_bk.shape)
    pairs = jnp.stack([groups_bk.reshape(-1), step_bk.reshape(-1).astype(jnp.int32)], axis=1)
    _, inverse = jnp.unique(
        pairs, axis=0, return_inverse=True, size=num_rows * num_items, fill_value=jnp.iinfo(jnp.int32).max)
    return inverse.reshape(-1).astype(jnp.int32)


def srar_step_normalize(
    step_rewards: StepValues,
    group_ids: jax.Array,
    mask: Optional[jax.Array] = None,
    *,
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> StepValues:
    """Cross-rollout step normalisation (SRaR eq 4): d_bar[b, k] = (d[b, k] - mu_k) / (sigma_k + eps).

    mu_k and sigma_k are over G_k, the valid rollouts of b's group that hold a value at step k (any step value,
    out-of-range ones included). 0 where |G_k| <= 1 and where sigma_k <= eps; holders of masked rows get 0.
    """
    reward_bk, holds_bk, step_bk = step_rewards
    num_rows, num_items = reward_bk.shape
    members_bk = holds_bk & rows_mask(mask, num_rows)[:, None]
    stats = segment_stats(
        reward_bk.reshape(-1), _group_step_segments(group_ids, step_bk), members_bk.reshape(-1),
        num_rows * num_items, ddof=std_ddof,
    )
    count, std, deviation = (x.reshape(num_rows, num_items) for x in (stats.count, stats.std, stats.deviation))
    informative = members_bk & (count > 1) & (std > eps)
    return step_rewards._replace(value_bk=jnp.where(informative, deviation / (std + eps), 0.0))


def srar_token_offsets(
    step_values: StepValues, num_steps_b: jax.Array, step_ids_bt: jax.Array, response_mask_bt: jax.Array
) -> jax.Array:
    """Per-step token placement (SRaR eq 5; the authors' `compute_srar_advantage`), [B, T] float32: each response
    token receives the values of the steps placed on it (module docstring): its own step k when
    1 <= k <= num_steps_b, step 0, and every step outside [-1, num_steps_b]. 0 off the mask."""
    value_bk, holds_bk, step_bk = step_values
    chex.assert_equal_shape([value_bk, holds_bk, step_bk])
    chex.assert_equal_shape([step_ids_bt, response_mask_bt])
    chex.assert_rank(num_steps_b, 1)
    num_steps_b1 = num_steps_b[:, None]
    whole_response = (step_bk == 0) | (step_bk < -1) | (step_bk > num_steps_b1)
    whole_b = jnp.sum(jnp.where(holds_bk & whole_response, value_bk, 0.0), axis=1)
    # A token of step k in [1, num_steps_b] receives the value of the holder of k (other items hold 0). The test
    # of the range is on the token's side and K is static: the comparisons fuse into one pass over the tokens
    # with three operations per item, without a [B, T, K] array.
    own_bt = jnp.zeros(step_ids_bt.shape, jnp.float32)
    for j in range(step_bk.shape[1]):
        own_bt = own_bt + jnp.where(step_ids_bt == step_bk[:, j:j + 1], value_bk[:, j:j + 1], 0.0)
    in_response_bt = (step_ids_bt >= 1) & (step_ids_bt <= num_steps_b1)
    return jnp.where(response_mask_bt, whole_b[:, None] + jnp.where(in_response_bt, own_bt, 0.0), 0.0)


def srar_advantages(
    base_rewards: jax.Array,
    group_ids: jax.Array,
    satisfied_bk: jax.Array,
    item_type_bk: jax.Array,
    item_mask_bk: jax.Array,
    item_step_bk: jax.Array,
    num_steps_b: jax.Array,
    step_ids_bt: jax.Array,
    response_mask_bt: jax.Array,
    mask: Optional[jax.Array] = None,
    *,
    budgets: TypedBudgets = TypedBudgets(),
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> jax.Array:
    """The decoupled SRaR advantage (eq 6, Algorithm 1): GRPO advantage of r_base on every response token plus
    the step-normalised rubric offsets placed on the token. Returns [B, T] float32, 0 for masked rollouts.

    `base_rewards` [B] is r_base = (1 - lambda) r_acc + lambda r_fmt (`rubric_jax.core.rewards`). Step groups by
    the authors' rule (module docstring); the paper's is `srar_step_rewards` on `srar_attributed_items`.
    """
    valid = rows_mask(mask, base_rewards.shape[0])
    token_mask = response_mask_bt.astype(bool) & valid[:, None]
    outcome = grpo_advantages(base_rewards, group_ids, valid, std_ddof=std_ddof, eps=eps)
    delta_bk, carries_delta_bk = srar_item_deltas(satisfied_bk, item_type_bk, item_mask_bk, budgets)
    step_rewards = srar_step_rewards(delta_bk, carries_delta_bk, item_step_bk)
    step_offsets = srar_step_normalize(step_rewards, group_ids, valid, std_ddof=std_ddof, eps=eps)
    offsets_bt = srar_token_offsets(step_offsets, num_steps_b, step_ids_bt, token_mask)
    return broadcast_to_tokens(outcome, token_mask) + offsets_bt


def srar_merged_advantages(
    base_rewards: jax.Array,
    group_ids: jax.Array,
    satisfied_bk: jax.Array,
    item_type_bk: jax.Array,
    item_mask_bk: jax.Array,
    item_step_bk: jax.Array,
    num_steps_b: jax.Array,
    step_ids_bt: jax.Array,
    response_mask_bt: jax.Array,
    mask: Optional[jax.Array] = None,
    *,
    budgets: TypedBudgets = TypedBudgets(),
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> jax.Array:
    """SRaR's "merged RaR-style" ablation (srar.txt, Appendix 18, decoupled-advantage ablation).

    One scalar reward r_base + sum of the rollout's item deltas is GRPO-normalised in its group and allocated to
    the tokens that the decoupled advantage places rubric scores on (`srar_token_offsets`: the tokens of the
    scored steps, every response token when step 0 or a fallback step was scored). A rollout whose scores reach
    none of its tokens (no delta-bearing item, or only items at step -1 or at empty steps) keeps its advantage on
    every response token, so an outcome-only rollout is not silenced.
    Returns [B, T] float32, 0 for masked rollouts.
    """
    valid = rows_mask(mask, base_rewards.shape[0])
    delta_bk, carries_delta_bk = srar_item_deltas(satisfied_bk, item_type_bk, item_mask_bk, budgets)
    merged = base_rewards.astype(jnp.float32) + delta_bk.sum(axis=1)  # r_base + srar_rubric_total
    advantage = grpo_advantages(merged, group_ids, valid, std_ddof=std_ddof, eps=eps)
    scored = srar_step_rewards(delta_bk, carries_delta_bk, item_step_bk)
    scored = scored._replace(value_bk=scored.holds_bk.astype(jnp.float32))
    scored_bt = srar_token_offsets(scored, num_steps_b, step_ids_bt, response_mask_bt) > 0
    unscored_b = ~scored_bt.any(axis=1)
    receives_bt = response_mask_bt.astype(bool) & (scored_bt | unscored_b[:, None]) & valid[:, None]
    return broadcast_to_tokens(advantage, receives_bt)
