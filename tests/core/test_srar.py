import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rubric_jax.core import srar
from rubric_jax.core.advantages import broadcast_to_tokens, grpo_advantages
from rubric_jax.core.rewards import ANSWER, BONUS, PITFALL, SUGGEST, TypedBudgets
from tests.core import reference_advantages as ref
from tests.core.random_batches import random_rollouts

MAX_STEPS = 4
advantages = jax.jit(srar.srar_advantages, static_argnames=("max_steps", "budgets", "std_ddof", "eps"))
merged = jax.jit(srar.srar_merged_advantages, static_argnames=("max_steps", "budgets", "std_ddof", "eps"))


def test_item_type_constants_match_the_reference():
    assert (SUGGEST, PITFALL, BONUS, ANSWER) == (ref.SUGGEST, ref.PITFALL, ref.BONUS, ref.ANSWER)


# ---------------------------------------------------------------- a case computed by hand from eqs 3-6


def hand_case():
    """One prompt, three rollouts, rubric: SUG@1, SUG@2, PIT@1, BON@0, ANSWER@2.

    Eq 3 deltas: N_SUG = 2 -> 0.4 each, PIT -1.0, BON 1.0, ANSWER none.
      rollout 0 satisfies SUG@1, SUG@2       -> d1 = 0.4,  d2 = 0.4
      rollout 1 satisfies SUG@1, PIT@1       -> d1 = -0.6
      rollout 2 satisfies SUG@2, BON@0, ANS  -> d2 = 0.4,  d0 = 1.0
    Eq 4 (population std, eps 0): G_1 = {0, 1}: [0.4, -0.6] -> [+1, -1]; G_2 = {0, 2} ties -> 0; G_0 = {2} -> 0.
    r_base = 0.9 acc + 0.1 fmt: [1.0, 0.1, 0.9], mean 2/3.
    """
    item_type = np.array([[SUGGEST, SUGGEST, PITFALL, BONUS, ANSWER]] * 3, np.int32)
    item_step = np.array([[1, 2, 1, 0, 2]] * 3, np.int32)
    satisfied = np.array([[1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [0, 1, 0, 1, 1]], bool)
    step_ids = np.array([[0, 0, 1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 2, 2, 0, 0], [1, 1, 1, 2, 2, 2, 2, 2]], np.int32)
    response_mask = np.array([[1] * 8, [1] * 6 + [0] * 2, [1] * 8], bool)
    base = np.array([1.0, 0.1, 0.9], np.float32)
    return base, satisfied, item_type, item_step, step_ids, response_mask


def test_item_deltas_eq3_hand_computed():
    base, satisfied, item_type, _, _, _ = hand_case()
    delta, carries = srar.srar_item_deltas(satisfied, item_type, np.ones_like(satisfied))
    np.testing.assert_allclose(
        delta, [[0.4, 0.4, 0, 0, 0], [0.4, 0, -1.0, 0, 0], [0, 0.4, 0, 1.0, 0]], rtol=1e-6
    )
    np.testing.assert_array_equal(carries, [[1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [0, 1, 0, 1, 0]])


def test_rubric_total_hand_computed():
    item_type = np.array([[SUGGEST, SUGGEST, PITFALL, BONUS, ANSWER]] * 3, np.int32)
    satisfied = np.array([[1, 1, 0, 0, 1], [1, 0, 1, 0, 0], [0, 0, 0, 0, 1]], bool)
    total = jax.jit(srar.srar_rubric_total)(satisfied, item_type, np.ones_like(satisfied))
    np.testing.assert_allclose(total, [0.8, 0.4 - 1.0, 0.0], rtol=1e-6)
    # budgets are static pytrees: passed as an ordinary argument under jit, and eq 3 fixes the signs (-|R_PIT|)
    budgets = TypedBudgets(0.5, 2.0, 1.0)
    assert jax.tree_util.tree_leaves(budgets) == []
    custom = jax.jit(srar.srar_rubric_total)(satisfied, item_type, np.ones_like(satisfied), budgets)
    np.testing.assert_allclose(custom, [0.5, 0.25 - 2.0, 0.0], rtol=1e-6)


def test_step_rewards_and_normalisation_eq4_hand_computed():
    _, satisfied, item_type, item_step, step_ids, response_mask = hand_case()
    delta, carries = srar.srar_item_deltas(satisfied, item_type, np.ones_like(satisfied))
    steps = srar.srar_step_rewards(
        delta, carries, item_step, srar.response_step_counts(step_ids, response_mask), max_steps=MAX_STEPS
    )
    np.testing.assert_allclose(steps.reward_bs[:, :3], [[0, 0.4, 0.4], [0, -0.6, 0], [1.0, 0, 0.4]], rtol=1e-6)
    np.testing.assert_array_equal(steps.present_bs[:, :3], [[0, 1, 1], [0, 1, 0], [1, 0, 1]])
    normalised = srar.srar_step_normalize(steps, np.zeros(3, np.int32), std_ddof=0, eps=0.0)
    np.testing.assert_allclose(normalised[:, :3], [[0, 1, 0], [0, -1, 0], [0, 0, 0]], atol=1e-6)
    sample = srar.srar_step_normalize(steps, np.zeros(3, np.int32), std_ddof=1, eps=0.0)
    np.testing.assert_allclose(sample[:2, 1], [1 / np.sqrt(2), -1 / np.sqrt(2)], rtol=1e-6)


def test_decoupled_advantage_eq6_hand_computed():
    base, satisfied, item_type, item_step, step_ids, response_mask = hand_case()
    out = advantages(
        base, np.zeros(3, np.int32), satisfied, item_type, np.ones_like(satisfied), item_step, step_ids,
        response_mask, max_steps=MAX_STEPS, std_ddof=0, eps=0.0,
    )
    mean = (1.0 + 0.1 + 0.9) / 3
    std = np.sqrt(((1.0 - mean) ** 2 + (0.1 - mean) ** 2 + (0.9 - mean) ** 2) / 3)
    a0, a1, a2 = ((r - mean) / std for r in (1.0, 0.1, 0.9))
    expected = [
        [a0, a0, a0 + 1, a0 + 1, a0 + 1, a0, a0, a0],  # preamble, step 1 (+1), step 2 (tie -> 0)
        [a1 - 1, a1 - 1, a1 - 1, a1 - 1, a1, a1, 0, 0],  # step 1 (-1), step 2 (not in G_2), padding
        [a2] * 8,  # its step-0 bonus is alone in G_0 and its step-2 item ties
    ]
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_token_offsets_eq5_step_zero_reaches_every_response_token():
    offsets = np.array([[0.5, 1.0, -2.0]], np.float32)  # d_bar for steps 0, 1, 2
    step_ids = np.array([[0, 1, 1, 2, 3, 0]], np.int32)  # step 3 is beyond max_steps = 2
    mask = np.array([[1, 1, 1, 1, 1, 0]], bool)
    np.testing.assert_allclose(srar.srar_token_offsets(offsets, step_ids, mask), [[0.5, 1.5, 1.5, -1.5, 0.5, 0]])


def test_out_of_range_and_no_step_items():
    # a 2-step response; items at step 5 (beyond it) and -2 count as step 0; the item at -1 reaches nothing
    delta = np.array([[0.2, 0.3, 0.5, 0.7]], np.float32)
    carries = np.ones((1, 4), bool)
    item_step = np.array([[5, -2, -1, 2]], np.int32)
    steps = srar.srar_step_rewards(delta, carries, item_step, np.array([2]), max_steps=MAX_STEPS)
    np.testing.assert_allclose(steps.reward_bs, [[0.5, 0, 0.7, 0, 0]], rtol=1e-6)
    np.testing.assert_array_equal(steps.present_bs, [[1, 0, 1, 0, 0]])


def test_judge_failure_removes_the_rollout_from_every_step_group():
    base, satisfied, item_type, item_step, step_ids, response_mask = hand_case()
    failed = satisfied.copy()
    failed[0] = False  # the judge failed on rollout 0: every item "not satisfied"
    out = advantages(
        base, np.zeros(3, np.int32), failed, item_type, np.ones_like(failed), item_step, step_ids, response_mask,
        max_steps=MAX_STEPS, std_ddof=0, eps=0.0,
    )
    outcome = grpo_advantages(base, np.zeros(3, np.int32), std_ddof=0, eps=0.0)
    # rollout 1 is now alone in G_1 and rollout 2 alone in G_2: no step offsets remain anywhere
    np.testing.assert_allclose(out, broadcast_to_tokens(outcome, response_mask), rtol=1e-6)


def test_merged_ablation_hand_computed():
    base, satisfied, item_type, item_step, step_ids, response_mask = hand_case()
    out = merged(
        base, np.zeros(3, np.int32), satisfied, item_type, np.ones_like(satisfied), item_step, step_ids,
        response_mask, max_steps=MAX_STEPS, std_ddof=0, eps=0.0,
    )
    scalars = np.array([1.0 + 0.8, 0.1 - 0.6, 0.9 + 1.4])
    a = (scalars - scalars.mean()) / scalars.std()
    expected = [
        [0, 0, a[0], a[0], a[0], a[0], a[0], a[0]],  # steps 1 and 2 were scored, the preamble was not
        [a[1]] * 4 + [0, 0, 0, 0],  # only step 1 was scored
        [a[2]] * 8,  # step 0 (whole response) was scored
    ]
    np.testing.assert_allclose(out, expected, rtol=1e-5)


# ---------------------------------------------------------------- vectorised JAX vs the NumPy loop reference


@pytest.mark.parametrize("std_ddof", [0, 1])
@pytest.mark.parametrize("seed", range(40))
def test_srar_matches_the_loop_reference(seed, std_ddof):
    rng = np.random.default_rng(seed)
    batch = random_rollouts(rng, max_steps=MAX_STEPS)
    base = rng.choice(np.array([0.0, 0.1, 0.9, 1.0], np.float32), batch.rewards.shape[0])
    args = (base, batch.group_ids, batch.satisfied, batch.item_type, batch.item_mask, batch.item_step,
            batch.step_ids, batch.response_mask, batch.valid)
    np.testing.assert_allclose(
        advantages(*args, max_steps=MAX_STEPS, std_ddof=std_ddof, eps=1e-6),
        ref.srar_advantages(*args, max_steps=MAX_STEPS, std_ddof=std_ddof),
        rtol=1e-5, atol=1e-5,
    )
    np.testing.assert_allclose(
        merged(*args, max_steps=MAX_STEPS, std_ddof=std_ddof, eps=1e-6),
        ref.srar_merged(*args, max_steps=MAX_STEPS, std_ddof=std_ddof),
        rtol=1e-5, atol=1e-5,
    )


def test_custom_budgets_match_the_reference():
    rng = np.random.default_rng(7)
    batch = random_rollouts(rng, max_steps=MAX_STEPS)
    budgets = TypedBudgets(suggest=0.5, pitfall=-2.0, bonus=0.25)
    args = (batch.rewards, batch.group_ids, batch.satisfied, batch.item_type, batch.item_mask, batch.item_step,
            batch.step_ids, batch.response_mask, batch.valid)
    np.testing.assert_allclose(
        advantages(*args, max_steps=MAX_STEPS, budgets=budgets, std_ddof=1, eps=1e-6),
        ref.srar_advantages(*args, max_steps=MAX_STEPS, budgets=(0.5, -2.0, 0.25)),
        rtol=1e-5, atol=1e-5,
    )


def test_bfloat16_base_rewards():
    base, satisfied, item_type, item_step, step_ids, response_mask = hand_case()
    args = (np.zeros(3, np.int32), satisfied, item_type, np.ones_like(satisfied), item_step, step_ids, response_mask)
    low = advantages(jnp.asarray([1.0, 0.125, 0.875], jnp.bfloat16), *args, max_steps=MAX_STEPS)
    high = advantages(np.array([1.0, 0.125, 0.875], np.float32), *args, max_steps=MAX_STEPS)
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(low, high, rtol=1e-6)


# ---------------------------------------------------------------- SRaR Appendix 20 properties


@st.composite
def judged_group(draw, num_rows=8, num_items=6):
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    batch = random_rollouts(rng, num_rows=num_rows, num_items=num_items, max_steps=MAX_STEPS)
    satisfied = draw(hnp.arrays(bool, (num_rows, num_items)))
    item_step = draw(hnp.arrays(np.int32, (num_rows, num_items), elements=st.integers(-1, MAX_STEPS)))
    return batch._replace(satisfied=satisfied, item_step=item_step)


def normalised_steps(batch, std_ddof, eps):
    delta, carries = srar.srar_item_deltas(batch.satisfied, batch.item_type, batch.item_mask)
    counts = srar.response_step_counts(batch.step_ids, batch.response_mask)
    steps = srar.srar_step_rewards(delta, carries, batch.item_step, counts, max_steps=MAX_STEPS)
    normalised = srar.srar_step_normalize(steps, batch.group_ids, batch.valid, std_ddof=std_ddof, eps=eps)
    members = np.asarray(steps.present_bs) & batch.valid[:, None]
    return np.asarray(steps.reward_bs, np.float64), members, np.asarray(normalised, np.float64)


@given(judged_group())
def test_prop_20_2_step_signals_are_zero_sum_in_every_step_group(batch):
    _, members, normalised = normalised_steps(batch, std_ddof=1, eps=1e-6)
    for g in np.unique(batch.group_ids):
        rows = batch.group_ids == g
        for k in range(MAX_STEPS + 1):
            assert abs(normalised[rows & members[:, k], k].sum()) < 1e-4
            assert np.all(normalised[rows & ~members[:, k], k] == 0)


@given(judged_group())
def test_prop_20_6_step_signals_have_unit_population_variance(batch):
    raw, members, normalised = normalised_steps(batch, std_ddof=0, eps=0.0)
    for g in np.unique(batch.group_ids):
        rows = batch.group_ids == g
        for k in range(MAX_STEPS + 1):
            in_group = rows & members[:, k]
            if in_group.sum() >= 2 and np.ptp(raw[in_group, k]) > 1e-4:
                np.testing.assert_allclose(np.mean(normalised[in_group, k] ** 2), 1.0, rtol=1e-4)


@given(judged_group(), st.floats(0.05, 3), st.floats(-3, -0.05), st.floats(0.05, 3))
def test_prop_20_5_total_raw_rubric_reward_is_bounded_by_the_budgets(batch, r_sug, r_pit, r_bon):
    budgets = TypedBudgets(suggest=r_sug, pitfall=r_pit, bonus=r_bon)
    total = np.asarray(srar.srar_rubric_total(batch.satisfied, batch.item_type, batch.item_mask, budgets), np.float64)
    assert np.all(total >= r_pit - 1e-5) and np.all(total <= r_sug + r_bon + 1e-5)


@given(judged_group())
def test_cor_20_3_outcome_component_is_zero_sum_at_every_token(batch):
    base = np.where(batch.satisfied[:, 0], 1.0, 0.1).astype(np.float32)
    outcome = np.asarray(grpo_advantages(base, batch.group_ids, batch.valid), np.float64)
    for g in np.unique(batch.group_ids):
        assert abs(outcome[batch.group_ids == g].sum()) < 1e-4


@given(judged_group(), st.booleans())
def test_prop_20_7_empty_rubric_reduces_to_grpo(batch, no_items_at_all):
    item_mask = np.zeros_like(batch.item_mask) if no_items_at_all else batch.item_mask
    satisfied = batch.satisfied if no_items_at_all else np.zeros_like(batch.satisfied)
    out = advantages(
        batch.rewards, batch.group_ids, satisfied, batch.item_type, item_mask, batch.item_step, batch.step_ids,
        batch.response_mask, batch.valid, max_steps=MAX_STEPS,
    )
    outcome = grpo_advantages(batch.rewards, batch.group_ids, batch.valid)
    np.testing.assert_array_equal(out, broadcast_to_tokens(outcome, batch.response_mask & batch.valid[:, None]))


def test_step_groups_are_per_prompt():
    # the same step in two prompts' rollouts is never normalised together
    reward_bs = np.array([[0, 1.0], [0, 0.0], [0, 5.0], [0, 5.0]], np.float32)
    present = np.array([[0, 1], [0, 1], [0, 1], [0, 1]], bool)
    group_ids = np.array([1, 1, 2, 2], np.int32)
    out = srar.srar_step_normalize(srar.StepRewards(reward_bs, present), group_ids, std_ddof=0, eps=0.0)
    np.testing.assert_allclose(out[:, 1], [1, -1, 0, 0], atol=1e-6)


def test_srar_advantages_vmap_over_independent_batches():
    rng = np.random.default_rng(3)
    batches = [random_rollouts(rng, max_steps=MAX_STEPS) for _ in range(3)]
    fields = ("rewards", "group_ids", "satisfied", "item_type", "item_mask", "item_step", "step_ids",
              "response_mask", "valid")
    stacked = [np.stack([getattr(b, f) for b in batches]) for f in fields]
    vmapped = jax.vmap(lambda *a: srar.srar_advantages(*a, max_steps=MAX_STEPS))(*stacked)
    for i, batch in enumerate(batches):
        single = advantages(*(getattr(batch, f) for f in fields), max_steps=MAX_STEPS)
        np.testing.assert_allclose(vmapped[i], single, rtol=1e-6, atol=1e-7)
