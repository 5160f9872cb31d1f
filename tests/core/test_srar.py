import functools

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
advantages = jax.jit(srar.srar_advantages, static_argnames=("budgets", "std_ddof", "eps"))
merged = jax.jit(srar.srar_merged_advantages, static_argnames=("budgets", "std_ddof", "eps"))


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
    return base, satisfied, item_type, item_step, np.array([2, 2, 2]), step_ids, response_mask


def test_item_deltas_eq3_hand_computed():
    base, satisfied, item_type, *_ = hand_case()
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
    _, satisfied, item_type, item_step, *_ = hand_case()
    delta, carries = srar.srar_item_deltas(satisfied, item_type, np.ones_like(satisfied))
    steps = srar.srar_step_rewards(delta, carries, item_step)
    # one value per (rollout, step), on the rollout's first delta-bearing item of that step
    np.testing.assert_allclose(steps.value_bk, [[0.4, 0.4, 0, 0, 0], [-0.6, 0, 0, 0, 0], [0, 0.4, 0, 1.0, 0]],
                               rtol=1e-6)
    np.testing.assert_array_equal(steps.holds_bk, [[1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [0, 1, 0, 1, 0]])
    normalised = srar.srar_step_normalize(steps, np.zeros(3, np.int32), std_ddof=0, eps=0.0)
    np.testing.assert_allclose(normalised.value_bk, [[1, 0, 0, 0, 0], [-1, 0, 0, 0, 0], [0] * 5], atol=1e-6)
    sample = srar.srar_step_normalize(steps, np.zeros(3, np.int32), std_ddof=1, eps=0.0)
    np.testing.assert_allclose(sample.value_bk[:2, 0], [1 / np.sqrt(2), -1 / np.sqrt(2)], rtol=1e-6)


def test_decoupled_advantage_eq6_hand_computed():
    base, satisfied, item_type, item_step, num_steps, step_ids, response_mask = hand_case()
    out = advantages(
        base, np.zeros(3, np.int32), satisfied, item_type, np.ones_like(satisfied), item_step, num_steps, step_ids,
        response_mask, std_ddof=0, eps=0.0,
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


def test_token_offsets_eq5_placement_of_each_step():
    # d_bar of steps 0, 1, 2, -1, 5 and -3 of a 2-step response: 0, 5 (beyond it) and -3 reach every token, 1 and 2
    # their own tokens, -1 none: 0.5 + 0.25 + 0.125 = 0.875 everywhere, plus 1.0 on step 1 and -2.0 on step 2
    values = np.array([[0.5, 1.0, -2.0, 8.0, 0.25, 0.125]], np.float32)
    steps = srar.StepValues(values, np.ones((1, 6), bool), np.array([[0, 1, 2, -1, 5, -3]], np.int32))
    step_ids = np.array([[0, 1, 1, 2, 3, 0]], np.int32)  # a token of step 3, which the count says is no step
    mask = np.array([[1, 1, 1, 1, 1, 0]], bool)
    np.testing.assert_allclose(srar.srar_token_offsets(steps, np.array([2]), step_ids, mask),
                               [[0.875, 1.875, 1.875, -1.125, 0.875, 0]])


def offsets_only(satisfied, item_type, item_step, num_steps, step_ids, response_mask):
    """The decoupled advantage with equal base rewards (outcome advantage 0), population std, eps 0, and the loop
    reference's value on the same batch."""
    num_rows = satisfied.shape[0]
    args = (np.ones(num_rows, np.float32), np.zeros(num_rows, np.int32), satisfied, item_type,
            np.ones_like(satisfied), item_step, num_steps, step_ids, response_mask)
    return (advantages(*args, std_ddof=0, eps=0.0),
            ref.srar_advantages(*args, np.ones(num_rows, bool), std_ddof=0, eps=0.0))


def test_case_a_a_step_the_response_lacks_is_normalised_in_its_own_group_and_placed_on_every_token():
    """The authors' code: an item at a step k the response does not have (k > its steps, or k < -1) is normalised
    in G_k with the rollouts that have a delta at k; only its placement falls back to the whole response, where it
    adds to step 0's own d_bar.

    Rubric [SUG, SUG, BON, PIT]: N_SUG = 2 -> 0.4 per SUGGEST, BON +1.0, PIT -1.0.
      rollout 0 (2 steps): SUG@3, PIT@0       -> d[3] = 0.4, d[0] = -1.0
      rollout 1 (3 steps): SUG@3, SUG@3       -> d[3] = 0.8
      rollout 2 (2 steps): SUG@-2, BON@0      -> d[-2] = 0.4, d[0] = 1.0
    Eq 4 (population std, eps 0): G_3 = {0, 1}: [0.4, 0.8] -> [-1, +1]; G_0 = {0, 2}: [-1, 1] -> [-1, +1];
    G_-2 = {2} -> 0. Placement: rollout 0's step 3 is beyond its 2 steps -> every token: -1 (G_3) - 1 (G_0) = -2;
    rollout 1 has step 3 -> +1 on its step-3 tokens; rollout 2: +1 (G_0) everywhere, its step -2 adds 0.
    (Moving out-of-range items to step 0, as this code once did, gives G_0 = {-0.6, 1.0} and G_3 = {1}: 0 on
    rollout 1.)
    """
    item_type = np.array([[SUGGEST, SUGGEST, BONUS, PITFALL]] * 3, np.int32)
    item_step = np.array([[3, 1, 0, 0], [3, 3, 0, 0], [-2, 1, 0, 0]], np.int32)
    satisfied = np.array([[1, 0, 0, 1], [1, 1, 0, 0], [1, 0, 1, 0]], bool)
    step_ids = np.array([[0, 1, 1, 2, 2], [1, 2, 3, 3, 3], [1, 1, 2, 2, 0]], np.int32)
    response_mask = np.array([[1] * 5, [1] * 5, [1] * 4 + [0]], bool)
    out, reference = offsets_only(satisfied, item_type, item_step, np.array([2, 3, 2]), step_ids, response_mask)
    expected = [[-2] * 5, [0, 0, 1, 1, 1], [1, 1, 1, 1, 0]]
    np.testing.assert_allclose(out, expected, atol=1e-6)
    np.testing.assert_allclose(reference, expected, atol=1e-12)


def test_case_b_an_empty_last_step_keeps_its_own_group_and_reaches_no_token():
    """A `### Step 3:` header whose span holds no token: the response has 3 steps (num_steps from the headers),
    so an item at step 3 is in range, normalised in G_3, and placed on step 3's tokens: none.

    Rubric [SUG, SUG]: 0.4 each. Rollout 0 (3 steps, tokens of steps 1 and 2 only): SUG@3 -> d[3] = 0.4;
    rollout 1 (3 steps): SUG@3, SUG@3 -> d[3] = 0.8. G_3 = [0.4, 0.8] -> [-1, +1] (population std, eps 0):
    rollout 0 gets nothing, rollout 1 +1 on its step-3 tokens. (Counting steps from the tokens, as this code once
    did, made rollout 0's item out of range: alone in G_0, and rollout 1 alone in G_3: 0 everywhere.)
    """
    item_type = np.array([[SUGGEST, SUGGEST]] * 2, np.int32)
    item_step = np.array([[3, 1], [3, 3]], np.int32)
    satisfied = np.array([[1, 0], [1, 1]], bool)
    step_ids = np.array([[1, 1, 2, 2], [1, 2, 3, 3]], np.int32)
    out, reference = offsets_only(satisfied, item_type, item_step, np.array([3, 3]), step_ids, np.ones((2, 4), bool))
    expected = [[0, 0, 0, 0], [0, 0, 1, 1]]
    np.testing.assert_allclose(out, expected, atol=1e-6)
    np.testing.assert_allclose(reference, expected, atol=1e-12)


def test_case_c_a_response_without_headers_is_step_1():
    """The authors' `parse_steps`: a response with no header is one step, step 1, spanning it (`step_spans`).

    Rubric [SUG, SUG]: 0.4 each. Rollout 0 (no header: 1 step, every token step 1): SUG@1 -> d[1] = 0.4;
    rollout 1 (2 steps): SUG@1, SUG@1 -> d[1] = 0.8. G_1 = [0.4, 0.8] -> [-1, +1] (population std, eps 0):
    rollout 0 gets -1 on every token, rollout 1 +1 on its step-1 tokens. (Step 0 on every token and no step, as
    this code once had it, put rollout 0's item alone in G_0: 0 everywhere.)
    """
    item_type = np.array([[SUGGEST, SUGGEST]] * 2, np.int32)
    item_step = np.array([[1, 2], [1, 1]], np.int32)
    satisfied = np.array([[1, 0], [1, 1]], bool)
    step_ids = np.array([[1, 1, 1, 1], [1, 1, 2, 2]], np.int32)
    out, reference = offsets_only(satisfied, item_type, item_step, np.array([1, 2]), step_ids, np.ones((2, 4), bool))
    expected = [[-1, -1, -1, -1], [1, 1, 0, 0]]
    np.testing.assert_allclose(out, expected, atol=1e-6)
    np.testing.assert_allclose(reference, expected, atol=1e-12)


def test_step_minus_one_is_normalised_but_reaches_no_token():
    delta = np.array([[0.2, 0.3], [0.5, 0.0]], np.float32)
    carries = np.array([[1, 1], [1, 0]], bool)
    steps = srar.srar_step_rewards(delta, carries, np.array([[-1, -1], [-1, 2]], np.int32))
    np.testing.assert_allclose(steps.value_bk, [[0.5, 0], [0.5, 0]], rtol=1e-6)  # two items of one step: one sum
    normalised = srar.srar_step_normalize(steps, np.zeros(2, np.int32), std_ddof=0, eps=0.0)
    np.testing.assert_array_equal(normalised.value_bk, 0)  # G_-1 ties
    offsets = srar.srar_token_offsets(steps, np.array([2, 2]), np.ones((2, 3), np.int32), np.ones((2, 3), bool))
    np.testing.assert_array_equal(offsets, 0)


def test_judge_failure_removes_the_rollout_from_every_step_group():
    base, satisfied, item_type, item_step, num_steps, step_ids, response_mask = hand_case()
    failed = satisfied.copy()
    failed[0] = False  # the judge failed on rollout 0: every item "not satisfied"
    out = advantages(
        base, np.zeros(3, np.int32), failed, item_type, np.ones_like(failed), item_step, num_steps, step_ids,
        response_mask, std_ddof=0, eps=0.0,
    )
    outcome = grpo_advantages(base, np.zeros(3, np.int32), std_ddof=0, eps=0.0)
    # rollout 1 is now alone in G_1 and rollout 2 alone in G_2: no step offsets remain anywhere
    np.testing.assert_allclose(out, broadcast_to_tokens(outcome, response_mask), rtol=1e-6)


def test_merged_ablation_hand_computed():
    base, satisfied, item_type, item_step, num_steps, step_ids, response_mask = hand_case()
    out = merged(
        base, np.zeros(3, np.int32), satisfied, item_type, np.ones_like(satisfied), item_step, num_steps, step_ids,
        response_mask, std_ddof=0, eps=0.0,
    )
    scalars = np.array([1.0 + 0.8, 0.1 - 0.6, 0.9 + 1.4])
    a = (scalars - scalars.mean()) / scalars.std()
    expected = [
        [0, 0, a[0], a[0], a[0], a[0], a[0], a[0]],  # steps 1 and 2 were scored, the preamble was not
        [a[1]] * 4 + [0, 0, 0, 0],  # only step 1 was scored
        [a[2]] * 8,  # step 0 (whole response) was scored
    ]
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_merged_ablation_when_scores_reach_no_token():
    # rollout 0's only scored step is empty (step 2 of 2 holds no token) and rollout 1's is -1: neither's rubric
    # score reaches a token of it, so both keep their advantage everywhere; rollout 2's step 5 (beyond its 1 step)
    # falls back to the whole response
    satisfied = np.ones((3, 1), bool)
    item_type = np.full((3, 1), SUGGEST, np.int32)
    item_step = np.array([[2], [-1], [5]], np.int32)
    base = np.array([1.0, 0.0, 0.0], np.float32)
    out = merged(base, np.zeros(3, np.int32), satisfied, item_type, satisfied, item_step, np.array([2, 1, 1]),
                 np.ones((3, 3), np.int32), np.ones((3, 3), bool), std_ddof=0, eps=0.0)
    a = np.array([1.0, -0.5, -0.5]) * np.sqrt(2)  # scalars 1.8, 0.8, 0.8: mean 4/3, population std sqrt(2) / 3
    np.testing.assert_allclose(out, np.repeat(a[:, None], 3, axis=1), rtol=1e-5)


# ---------------------------------------------------------------- the paper's step groups (eq 4 as written)


@functools.partial(jax.jit, static_argnames=("std_ddof", "eps"))
def paper_advantages(base, group_ids, satisfied, item_type, item_mask, item_step, num_steps, step_ids,
                     response_mask, valid, judged, std_ddof=1, eps=1e-6):
    """The decoupled advantage with the paper's step groups, composed of the core functions (`srar_advantages`
    with `srar_attributed_items` in place of the delta-bearing items)."""
    token_mask = response_mask & valid[:, None]
    delta, _ = srar.srar_item_deltas(satisfied, item_type, item_mask)
    steps = srar.srar_step_rewards(delta, srar.srar_attributed_items(item_mask, judged), item_step)
    normalised = srar.srar_step_normalize(steps, group_ids, valid, std_ddof=std_ddof, eps=eps)
    outcome = grpo_advantages(base, group_ids, valid, std_ddof=std_ddof, eps=eps)
    return broadcast_to_tokens(outcome, token_mask) + srar.srar_token_offsets(normalised, num_steps, step_ids,
                                                                              token_mask)


def test_attributed_items_are_every_item_of_a_judged_rollout():
    item_mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0]], bool)
    judged = np.array([True, True, False])  # rollout 2's judgement failed
    np.testing.assert_array_equal(srar.srar_attributed_items(item_mask, judged), [[1, 1, 0], [1, 1, 1], [0, 0, 0]])


def test_paper_and_authors_step_groups_differ_by_hand():
    """Eq 4's G_k as written vs the authors' code, population std, eps 0, equal r_base (outcome advantage 0).

    Rubric [SUGGEST, PITFALL]: N_SUG = N_PIT = 1, so a satisfied SUGGEST is +0.8, a satisfied PITFALL -1.0.
      rollout A: SUGGEST@1 satisfied, PITFALL@2 not       -> d_A[1] = 0.8, and (paper) d_A[2] = 0
      rollout B: SUGGEST@1 not,       PITFALL@1 satisfied -> d_B[1] = -1.0
      rollout C: SUGGEST@1 not,       PITFALL@2 not       -> no delta at all, and (paper) d_C[1] = d_C[2] = 0
    Authors (delta-bearing items only): G_1 = {A, B}: [0.8, -1.0], mean -0.1, std 0.9 -> A +1, B -1, C nothing.
    Paper (any item attributed to k): G_1 = {A, B, C}: [0.8, -1.0, 0], mean -1/15, deviations 13/15, -14/15,
    1/15, std sqrt((169 + 196 + 1) / 675) = sqrt(366 / 675) -> A 13/sqrt(122), B -14/sqrt(122), C 1/sqrt(122)
    (13/15 * 15 sqrt(3) / sqrt(366) = 13 / sqrt(122)); G_2 = {A, C}: [0, 0] ties -> 0.
    Steps: 2 per response, tokens [1, 1, 2, 2].
    """
    satisfied = np.array([[1, 0], [0, 1], [0, 0]], bool)
    item_type = np.array([[SUGGEST, PITFALL]] * 3, np.int32)
    item_step = np.array([[1, 2], [1, 1], [1, 2]], np.int32)
    step_ids = np.array([[1, 1, 2, 2]] * 3, np.int32)
    args = (np.ones(3, np.float32), np.zeros(3, np.int32), satisfied, item_type, np.ones_like(satisfied), item_step,
            np.array([2, 2, 2]), step_ids, np.ones((3, 4), bool))
    every = np.ones(3, bool)
    expected_paper = np.array([[13, 13, 0, 0], [-14, -14, 0, 0], [1, 1, 0, 0]]) / np.sqrt(122)
    np.testing.assert_allclose(advantages(*args, std_ddof=0, eps=0.0), [[1, 1, 0, 0], [-1, -1, 0, 0], [0] * 4],
                               atol=1e-6)
    np.testing.assert_allclose(paper_advantages(*args, every, every, std_ddof=0, eps=0.0), expected_paper, rtol=1e-5)
    # the loop reference forms eq 3's deltas in float32, as the core does (0.8 is not a float32 number)
    np.testing.assert_allclose(ref.srar_advantages(*args, every, std_ddof=0, eps=0.0, judged=every), expected_paper,
                               rtol=1e-6)


@pytest.mark.parametrize("std_ddof", [0, 1])
@pytest.mark.parametrize("seed", range(20))
def test_paper_step_groups_match_the_loop_reference(seed, std_ddof):
    rng = np.random.default_rng(100 + seed)
    batch = random_rollouts(rng, max_steps=MAX_STEPS)
    judged = rng.random(batch.rewards.shape[0]) > 0.15
    # a failed judgement: every item unsatisfied at step -1 (judges.base)
    batch = batch._replace(satisfied=batch.satisfied & judged[:, None],
                           item_step=np.where(judged[:, None], batch.item_step, -1).astype(np.int32))
    base = rng.choice(np.array([0.0, 0.1, 0.9, 1.0], np.float32), batch.rewards.shape[0])
    args = (base, *with_step_counts(rng, batch))
    np.testing.assert_allclose(
        paper_advantages(*args, judged, std_ddof=std_ddof, eps=1e-6),
        ref.srar_advantages(*args, std_ddof=std_ddof, judged=judged),
        rtol=1e-5, atol=1e-5,
    )


# ---------------------------------------------------------------- vectorised JAX vs the NumPy loop reference


def with_step_counts(rng, batch):
    """The batch's arguments with num_steps: each response's last step, or one more (an empty last step)."""
    last_step = np.max(np.where(batch.response_mask, batch.step_ids, 0), axis=1)
    num_steps = last_step + rng.integers(0, 2, last_step.shape)
    return (batch.group_ids, batch.satisfied, batch.item_type, batch.item_mask, batch.item_step, num_steps,
            batch.step_ids, batch.response_mask, batch.valid)


@pytest.mark.parametrize("std_ddof", [0, 1])
@pytest.mark.parametrize("seed", range(40))
def test_srar_matches_the_loop_reference(seed, std_ddof):
    rng = np.random.default_rng(seed)
    batch = random_rollouts(rng, max_steps=MAX_STEPS)
    base = rng.choice(np.array([0.0, 0.1, 0.9, 1.0], np.float32), batch.rewards.shape[0])
    args = (base, *with_step_counts(rng, batch))
    np.testing.assert_allclose(
        advantages(*args, std_ddof=std_ddof, eps=1e-6),
        ref.srar_advantages(*args, std_ddof=std_ddof),
        rtol=1e-5, atol=1e-5,
    )
    np.testing.assert_allclose(
        merged(*args, std_ddof=std_ddof, eps=1e-6),
        ref.srar_merged(*args, std_ddof=std_ddof),
        rtol=1e-5, atol=1e-5,
    )


def test_custom_budgets_match_the_reference():
    rng = np.random.default_rng(7)
    batch = random_rollouts(rng, max_steps=MAX_STEPS)
    budgets = TypedBudgets(suggest=0.5, pitfall=-2.0, bonus=0.25)
    args = (batch.rewards, *with_step_counts(rng, batch))
    np.testing.assert_allclose(
        advantages(*args, budgets=budgets, std_ddof=1, eps=1e-6),
        ref.srar_advantages(*args, budgets=(0.5, -2.0, 0.25)),
        rtol=1e-5, atol=1e-5,
    )


def test_bfloat16_base_rewards():
    base, satisfied, item_type, item_step, num_steps, step_ids, response_mask = hand_case()
    args = (np.zeros(3, np.int32), satisfied, item_type, np.ones_like(satisfied), item_step, num_steps, step_ids,
            response_mask)
    low = advantages(jnp.asarray([1.0, 0.125, 0.875], jnp.bfloat16), *args)
    high = advantages(np.array([1.0, 0.125, 0.875], np.float32), *args)
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(low, high, rtol=1e-6)


# ---------------------------------------------------------------- SRaR Appendix 20 properties


@st.composite
def judged_group(draw, num_rows=8, num_items=6):
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    batch = random_rollouts(rng, num_rows=num_rows, num_items=num_items, max_steps=MAX_STEPS)
    satisfied = draw(hnp.arrays(bool, (num_rows, num_items)))
    item_step = draw(hnp.arrays(np.int32, (num_rows, num_items), elements=st.integers(-3, MAX_STEPS + 2)))
    return batch._replace(satisfied=satisfied, item_step=item_step)


RULES = ("authors", "paper")


def judged_rows(num_rows):
    """Every fifth rollout's judgement failed (the others' verdicts stand as drawn)."""
    return np.arange(num_rows) % 5 != 4


def member_items(batch, rule):
    """The items that place their rollout in a step group: the authors' delta-bearing items, or the paper's
    items of judged rollouts (`judged_rows`)."""
    if rule == "authors":
        return srar.srar_item_deltas(batch.satisfied, batch.item_type, batch.item_mask)[1]
    return srar.srar_attributed_items(batch.item_mask, judged_rows(batch.satisfied.shape[0]))


def step_groups(batch, std_ddof, eps, rule="authors"):
    """(raw d, normalised d_bar, and for each (group, step value) the [B, K] mask of its valid holders), with the
    step groups of `rule`."""
    delta, _ = srar.srar_item_deltas(batch.satisfied, batch.item_type, batch.item_mask)
    carries = member_items(batch, rule)
    steps = srar.srar_step_rewards(delta, carries, batch.item_step)
    normalised = srar.srar_step_normalize(steps, batch.group_ids, batch.valid, std_ddof=std_ddof, eps=eps)
    holders = np.asarray(steps.holds_bk) & batch.valid[:, None]
    groups = [(batch.group_ids[:, None] == g) & (batch.item_step == k) & holders
              for g in np.unique(batch.group_ids) for k in np.unique(batch.item_step)]
    # every (rollout, step) has exactly one holder
    for b in range(batch.satisfied.shape[0]):
        held = batch.item_step[b][np.asarray(steps.holds_bk)[b]].tolist()
        assert len(set(held)) == len(held) and set(held) == set(batch.item_step[b][np.asarray(carries)[b]].tolist())
    return np.asarray(steps.value_bk, np.float64), np.asarray(normalised.value_bk, np.float64), holders, groups


@given(judged_group(), st.sampled_from(RULES))
def test_prop_20_2_step_signals_are_zero_sum_in_every_step_group(batch, rule):
    _, normalised, holders, groups = step_groups(batch, std_ddof=1, eps=1e-6, rule=rule)
    for members in groups:
        assert abs(normalised[members].sum()) < 1e-4
    assert np.all(normalised[~holders] == 0)


@given(judged_group(), st.sampled_from(RULES))
def test_prop_20_6_step_signals_have_unit_population_variance(batch, rule):
    raw, normalised, _, groups = step_groups(batch, std_ddof=0, eps=0.0, rule=rule)
    for members in groups:
        if members.sum() >= 2 and np.ptp(raw[members]) > 1e-4:
            np.testing.assert_allclose(np.mean(normalised[members] ** 2), 1.0, rtol=1e-4)


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


@given(judged_group(), st.booleans(), st.sampled_from(RULES))
def test_prop_20_7_empty_rubric_reduces_to_grpo(batch, no_items_at_all, rule):
    # under the paper's groups, items that are all unsatisfied still form groups, of equal d = 0: no offset
    item_mask = np.zeros_like(batch.item_mask) if no_items_at_all else batch.item_mask
    satisfied = batch.satisfied if no_items_at_all else np.zeros_like(batch.satisfied)
    args = with_step_counts(np.random.default_rng(0), batch._replace(satisfied=satisfied, item_mask=item_mask))
    out = (advantages(batch.rewards, *args) if rule == "authors"
           else paper_advantages(batch.rewards, *args, judged_rows(len(batch.rewards))))
    outcome = grpo_advantages(batch.rewards, batch.group_ids, batch.valid)
    np.testing.assert_array_equal(out, broadcast_to_tokens(outcome, batch.response_mask & batch.valid[:, None]))


def test_step_groups_are_per_prompt():
    # the same step in two prompts' rollouts is never normalised together
    steps = srar.StepValues(np.array([[1.0], [0.0], [5.0], [5.0]], np.float32), np.ones((4, 1), bool),
                            np.full((4, 1), 2, np.int32))
    out = srar.srar_step_normalize(steps, np.array([1, 1, 2, 2], np.int32), std_ddof=0, eps=0.0)
    np.testing.assert_allclose(out.value_bk[:, 0], [1, -1, 0, 0], atol=1e-6)


def test_empty_rubric_width():
    # K = 0: no items at all, the advantage is the outcome advantage
    base = np.array([1.0, 0.0], np.float32)
    empty = np.zeros((2, 0))
    out = advantages(base, np.zeros(2, np.int32), empty.astype(bool), empty.astype(np.int32), empty.astype(bool),
                     empty.astype(np.int32), np.array([1, 1]), np.ones((2, 2), np.int32), np.ones((2, 2), bool))
    np.testing.assert_allclose(out, [[1 / np.sqrt(2)] * 2, [-1 / np.sqrt(2)] * 2], rtol=1e-5)


def test_srar_advantages_vmap_over_independent_batches():
    rng = np.random.default_rng(3)
    batches = [random_rollouts(rng, max_steps=MAX_STEPS) for _ in range(3)]
    singles = [(b.rewards, *with_step_counts(rng, b)) for b in batches]
    stacked = [np.stack(column) for column in zip(*singles)]
    vmapped = jax.vmap(srar.srar_advantages)(*stacked)
    for i, args in enumerate(singles):
        np.testing.assert_allclose(vmapped[i], advantages(*args), rtol=1e-6, atol=1e-7)
