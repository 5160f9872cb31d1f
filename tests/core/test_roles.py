import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.core import roles
from rubric_jax.core.advantages import grpo_advantages
from tests.core import reference_advantages as ref
from tests.core.random_batches import random_group_ids

REASONER, RUBRICATOR = 0, 1


def test_role_batch_advantages_hand_computed():
    rewards = jnp.array([1.0, 0.0, 2.0, 4.0, 9.0])
    role_ids = jnp.array([REASONER, REASONER, RUBRICATOR, RUBRICATOR, 5])  # role 5 is not one of the 2 roles
    out = roles.role_batch_advantages(rewards, role_ids, num_roles=2, std_ddof=0, eps=0.0)
    np.testing.assert_allclose(out[:4], [1.0, -1.0, -1.0, 1.0], rtol=1e-6)


def test_rlcer_two_roles_one_batch():
    """Reasoner: GRPO over question groups. Rubricator: batch-normalised over its own rollouts (RLCER eq 13)."""
    rewards = jnp.array([1.0, 0.0, 1.0, 1.0, 0.5, 0.7, 0.9, 0.1])
    role_ids = jnp.array([0, 0, 0, 0, 1, 1, 1, 1])
    question = jnp.array([7, 7, 8, 8, 7, 7, 8, 8])
    reasoner = grpo_advantages(rewards, question, roles.role_mask(role_ids, REASONER), std_ddof=0, eps=0.0)
    rubricator = roles.role_batch_advantages(
        rewards, role_ids, roles.role_mask(role_ids, RUBRICATOR), num_roles=2, std_ddof=0, eps=0.0
    )
    out = roles.select_by_role(role_ids, jnp.stack([reasoner, rubricator]))
    rub = np.array([0.5, 0.7, 0.9, 0.1])
    np.testing.assert_allclose(out[:4], [1, -1, 0, 0], atol=1e-6)
    np.testing.assert_allclose(out[4:], (rub - rub.mean()) / rub.std(), rtol=1e-5)


def test_select_by_role_token_level_and_unknown_roles():
    per_role = jnp.stack([jnp.full((3, 2), 1.0), jnp.full((3, 2), jnp.nan)])
    out = roles.select_by_role(jnp.array([0, 2, -1]), per_role)
    np.testing.assert_array_equal(out, [[1, 1], [0, 0], [0, 0]])  # another role's NaN never leaks


@given(st.integers(0, 2**31 - 1))
def test_role_advantages_equal_per_role_computation_on_each_role_alone(seed):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=12).astype(np.float32)
    role_ids = rng.integers(0, 2, 12).astype(np.int32)
    groups = random_group_ids(rng, 12)
    per_role = [grpo_advantages(rewards, groups, roles.role_mask(role_ids, r)) for r in (0, 1)]
    out = np.asarray(jax.jit(roles.select_by_role)(role_ids, jnp.stack(per_role)))
    for r in (0, 1):
        rows = role_ids == r
        if rows.any():
            alone = ref.grpo(rewards[rows], groups[rows], np.ones(rows.sum(), bool))
            np.testing.assert_allclose(out[rows], alone, rtol=1e-5, atol=1e-5)
