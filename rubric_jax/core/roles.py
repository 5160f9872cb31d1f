"""Role-specific advantages for one policy playing several roles (RLCER eq 13, section 4.5; EvoRubric).

One batch holds the rollouts of every role (e.g. reasoner = 0, rubricator = 1), each with its own reward.
Advantages are computed per role on that role's rollouts only, with the estimator that fits the role, and then
merged back into one [B] array so that one update covers both roles (RLCER eq 13 sums the two clipped terms).
Composition, not flags: run any estimator of `rubric_jax.core.advantages` once per role with `role_mask`,
then `select_by_role`.

Which estimator for which role:
- Reasoner rollouts share their context (the question): GRPO over question groups.
- RLCER's rubricator rollouts each see a different context (the question and one reasoner CoT), so no two of
  them answer the same prompt and the GRPO group of identical contexts does not exist (RLCER, after eq 13).
  Two sensible estimators are provided: `grpo_advantages` with group_ids = the question (the rubricators of one
  question compete; their contexts differ only in the CoT they read), and `role_batch_advantages`, which
  normalises each role's rewards over all of that role's rollouts in the batch (REINFORCE++-style). The RLCER
  recipe defaults to the batch estimator, the form that makes no same-context assumption at all.
- EvoRubric's generator rollouts do share their context (the question), so GRPO per question fits both roles.
"""

from typing import Optional

import chex
import jax
import jax.numpy as jnp

from rubric_jax.core.advantages import scale_by_std
from rubric_jax.core.segments import rows_mask, segment_stats


def role_mask(role_ids: jax.Array, role: int, mask: Optional[jax.Array] = None) -> jax.Array:
    """[B] bool: the valid rollouts played in `role`."""
    chex.assert_rank(role_ids, 1)
    selected = role_ids == role
    return selected & rows_mask(mask, role_ids.shape[0])


def role_batch_advantages(
    rewards: jax.Array,
    role_ids: jax.Array,
    mask: Optional[jax.Array] = None,
    *,
    num_roles: int,
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> jax.Array:
    """Per-role batch normalisation: (r_i - mean_role) / (std_role + eps) over the valid rollouts of i's role.

    For roles whose rollouts have no shared context (RLCER's rubricator). Returns [B]; 0 for masked rows and
    for a role whose rewards all tie.
    """
    chex.assert_rank(rewards, 1)
    chex.assert_equal_shape([rewards, role_ids])
    valid = rows_mask(mask, rewards.shape[0])
    stats = segment_stats(rewards, role_ids.astype(jnp.int32), valid, num_segments=num_roles, ddof=std_ddof)
    return jnp.where(valid, scale_by_std(stats.deviation, stats.std, eps), 0)


def select_by_role(role_ids: jax.Array, advantages_by_role: jax.Array) -> jax.Array:
    """Merges per-role advantages into one batch: out[b] = advantages_by_role[role_ids[b], b].

    `advantages_by_role` is [R, B] (or [R, B, T] for token-level advantages), row r computed with
    `role_mask(role_ids, r)`. Rows whose role id is outside [0, R) get 0.
    """
    chex.assert_rank(role_ids, 1)
    num_roles = advantages_by_role.shape[0]
    chex.assert_axis_dimension(advantages_by_role, 1, role_ids.shape[0])
    known = (role_ids >= 0) & (role_ids < num_roles)
    picked = advantages_by_role[jnp.clip(role_ids, 0, num_roles - 1), jnp.arange(role_ids.shape[0])]
    return jnp.where(known.reshape(known.shape + (1,) * (picked.ndim - 1)), picked, 0)
