import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rubric_jax.core import rubric_validity as rv
from rubric_jax.core.rewards import excess_penalty, positive_points_score, weighted_fraction
from tests.core import reference_rewards as ref
from tests.core.random_batches import random_group_ids, random_rewards, random_rollouts

K, N = 6, 8  # RLCER: rubrics x rollouts
M, J, R = 4, 3, 6  # EvoRubric: generators x criteria per generator x responses
B = 12

masked_pearson = jax.jit(rv.masked_pearson)
validity = jax.jit(rv.rlcer_rubric_validity)  # alpha may be traced
sign_aware_validity = jax.jit(rv.rlcer_sign_aware_validity)
valid_fraction = jax.jit(rv.rlcer_valid_fraction)
rubricator_reward = jax.jit(rv.rlcer_rubricator_reward)
cot_reward = jax.jit(rv.rlcer_cot_reward)
reasoner_reward = jax.jit(rv.rlcer_reasoner_reward)
prune = jax.jit(rv.zero_variance_prune)
batch_scores = jax.jit(rv.evorubric_batch_scores)
peer_consensus = jax.jit(rv.evorubric_peer_consensus)
scaled_consensus = jax.jit(rv.evorubric_scaled_consensus)
meta_reward = jax.jit(rv.evorubric_meta_reward)
disc_reward = jax.jit(rv.evorubric_discriminative_reward)
generator_reward = jax.jit(rv.evorubric_generator_reward)
evo_reasoner_reward = jax.jit(rv.evorubric_reasoner_reward)
evo_joint_reasoner_reward = jax.jit(rv.evorubric_joint_reasoner_reward)
group_filter = jax.jit(rv.dapo_group_filter, static_argnames="min_std")
exploration = jax.jit(rv.rgr_exploration_assessment)


def evorubric_pipeline(scores, proposed, verified, response_mask, num_penalty, length_penalty):
    """Section 3.3.2 steps 3-4 and eq 3, composed as an algorithm would."""
    kept = prune(scores, proposed & verified, response_mask)
    rho = peer_consensus(*batch_scores(scores, kept), response_mask)
    return kept, rho, generator_reward(rho, proposed, verified, kept, num_penalty, length_penalty)


# ---------------------------------------------------------------- RLCER, hand-computed


def rlcer_case():
    """One question, N = 4 rollouts with correctness z = [1, 1, 0, 0] and five proposed rubrics:
    k0 v = [1,1,0,0] (3 points):  corr 1                       -> valid
    k1 v = [1,0,1,0] (2 points):  corr 0                       -> invalid
    k2 v = [1,1,1,1] (1 point):   std 0                        -> invalid (condition ii)
    k3 v = [0,0,1,1] (-2 points): corr -1                      -> invalid
    k4 v = [1,0,0,0] (-1 point):  corr 0.5 / sqrt(0.75) = 0.58 -> valid
    """
    v = np.array([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 1, 1], [1, 0, 0, 0]], bool)
    z = np.array([1, 1, 0, 0], bool)
    points = np.array([3.0, 2.0, 1.0, -2.0, -1.0], np.float32)
    return v, z, points


def test_rlcer_validity_eq7_hand_computed():
    v, z, _ = rlcer_case()
    corr = masked_pearson(v, z)
    np.testing.assert_allclose(corr.value, [1, 0, 0, -1, 0.5 / np.sqrt(0.75)], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(corr.defined, [1, 1, 0, 1, 1])
    np.testing.assert_array_equal(validity(v, z, np.ones(5, bool)), [1, 0, 0, 0, 1])
    np.testing.assert_array_equal(validity(v, z, np.array([1, 1, 1, 1, 0], bool)), [1, 0, 0, 0, 0])


def test_rlcer_validity_respects_the_rollout_mask():
    # k1 without rollout 2: v = [1, 0, 0], z = [1, 1, 0] -> corr (1/3) / (2/3) = 0.5 > 0.2
    v, z, _ = rlcer_case()
    out = validity(v, z, np.ones(5, bool), np.array([1, 1, 0, 1], bool))
    assert bool(out[1])


def test_rlcer_sign_aware_validity_keeps_penalties_whose_flaw_comes_with_wrong_answers():
    # Penalties read by the absence of their flaw (u = 1 - v):
    # k3 (-2) flaw on the wrong rollouts: u = [1,1,0,0], corr 1 -> valid (as written: corr -1, invalid)
    # k4 (-1) flaw on a right rollout:    u = [0,1,1,1], corr -0.58 -> invalid (as written: 0.58, valid)
    # reward rubrics k0, k1, k2 as in eq 7 as written.
    v, z, points = rlcer_case()
    np.testing.assert_array_equal(sign_aware_validity(v, z, points, np.ones(5, bool)), [1, 0, 0, 1, 0])
    np.testing.assert_array_equal(rv.rlcer_merit_indicator(v, points)[3:], [[1, 1, 0, 0], [0, 1, 1, 1]])
    # CoT reward over the valid k0 (+3) and k3 (-2): min -2, max 3; x = 3, 3, -2, -2 -> 1, 1, 0, 0.
    valid = sign_aware_validity(v, z, points, np.ones(5, bool))
    np.testing.assert_allclose(cot_reward(v, points, valid), [1, 1, 0, 0], atol=1e-7)


def test_rlcer_unknown_verdicts_leave_validity_and_the_cot_reward_of_that_rubric_and_rollout():
    # k1's verdict on rollout 2 unknown (its verifier call failed): k1 correlated over rollouts 0, 1, 3:
    # v = [1, 0, 0], z = [1, 1, 0] -> corr 0.5 > 0.2, valid; the other rubrics over all four rollouts.
    v, z, points = rlcer_case()
    known = np.ones((5, 4), bool)
    known[1, 2] = False
    valid = validity(v, z, np.ones(5, bool), known)
    np.testing.assert_array_equal(valid, [1, 1, 0, 0, 1])
    # valid k0 (+3), k1 (+2), k4 (-1): rollouts 0, 1, 3 over all three (min -1, max 5): x = 4, 3, 0 -> 5/6,
    # 4/6, 1/6; rollout 2 over k0 and k4 only (min -1, max 3): x = 0 -> 1/4.
    np.testing.assert_allclose(cot_reward(v, points, valid, known), [5 / 6, 4 / 6, 1 / 4, 1 / 6], rtol=1e-6)
    # every verdict of rollout 2 unknown: no valid rubric judged it, no CoT signal
    known[:, 2] = False
    assert float(cot_reward(v, points, valid, known)[2]) == 0


def test_rlcer_zero_variance_z_validates_no_rubric():
    v, _, _ = rlcer_case()
    for z in (np.ones(4, bool), np.zeros(4, bool)):
        assert not np.any(validity(v, z, np.ones(5, bool), alpha=-1.0))
        assert not np.any(masked_pearson(v, z).defined)


def test_rlcer_cot_eq6_and_reasoner_eq9_hand_computed():
    # valid: k0 (+3), k4 (-1): min -1, max 3. Rollout 0 meets both: x = 2 -> 3/4; rollout 1 only k0 -> 1;
    # rollouts 2 and 3 neither: x = 0 -> 1/4. Reasoner = +-1 (eq 8) + CoT.
    v, z, points = rlcer_case()
    valid = validity(v, z, np.ones(5, bool))
    np.testing.assert_allclose(cot_reward(v, points, valid), [0.75, 1.0, 0.25, 0.25], rtol=1e-6)
    np.testing.assert_allclose(reasoner_reward(z, v, points, valid), [1.75, 2.0, -0.75, -0.75], rtol=1e-6)
    # no valid rubric: no CoT signal, the outcome alone
    np.testing.assert_allclose(reasoner_reward(z, v, points, np.zeros(5, bool)), [1, 1, -1, -1])


def test_rlcer_rubricator_reward_eqs_10_to_12_hand_computed():
    # rubricator 0 proposed k0, k1, k2 (one valid); rubricator 1 proposed k3, k4 (one valid); rubricator 2 nothing
    valid_rk = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 0]], bool)
    proposed_rk = np.array([[1, 1, 1], [1, 1, 0], [0, 0, 0]], bool)
    np.testing.assert_allclose(valid_fraction(valid_rk, proposed_rk), [1 / 3, 1 / 2, 0], rtol=1e-6)
    out = rubricator_reward(valid_rk, proposed_rk, np.array([True, False, True]))
    np.testing.assert_allclose(out, [1 + 1 / 3, 1 / 2, 1], rtol=1e-6)


def test_rlcer_functions_vmap_over_questions():
    rng = np.random.default_rng(3)
    v = rng.random((5, K, N)) < 0.5
    z = rng.random((5, N)) < 0.5
    points = rng.integers(-3, 4, (5, K)).astype(np.float32)
    mask = np.ones((5, K), bool)
    batched = jax.vmap(lambda v_, z_, p_, m_: reasoner_reward(z_, v_, p_, validity(v_, z_, m_)))(v, z, points, mask)
    for q in range(5):
        np.testing.assert_array_equal(batched[q], reasoner_reward(z[q], v[q], points[q], validity(v[q], z[q], mask[q])))


@pytest.mark.parametrize("questions, rollouts", [(8, 8), (5, 5), (3, 8)])
def test_pearson_vmapped_under_jit_matches_numpy_when_questions_equal_rollouts(questions, rollouts):
    """The shape of RLCER's default step (8 questions x 8 rollouts), where an XLA miscompile of the segment
    count once made every correlation ~0.1 (see segments.segment_count)."""
    rng = np.random.default_rng(questions)
    z = rng.random((questions, rollouts)) < 0.6
    v = np.stack([z, ~z, rng.random(z.shape) < 0.5], axis=1).astype(np.float32)
    corr = jax.jit(jax.vmap(rv.masked_pearson))(v, z, np.ones_like(z))
    for q in range(questions):
        for k in range(3):
            if z[q].std() > 0 and v[q, k].std() > 0:
                np.testing.assert_allclose(corr.value[q, k], np.corrcoef(v[q, k], z[q])[0, 1], atol=1e-6)
            else:
                assert not corr.defined[q, k] and corr.value[q, k] == 0


# ---------------------------------------------------------------- EvoRubric, hand-computed


def evorubric_case():
    """M = 3 generators, 2 criterion slots, N = 4 responses; scores s(o_n, r) = points when met.
    gen 0: a = [2,2,0,0]; b = [-1,-1,-1,-1] (zero variance: pruned)          -> v0 = [2,2,0,0]
    gen 1: c = [1,1,1,0]; d rejected by the meta-verifier                     -> v1 = [1,1,1,0]
    gen 2: e = [0,0,3,3]; slot 2 not proposed                                 -> v2 = [0,0,3,3]
    """
    scores = np.array([
        [[2, 2, 0, 0], [-1, -1, -1, -1]],
        [[1, 1, 1, 0], [0, 1, 0, 1]],
        [[0, 0, 3, 3], [0, 0, 0, 0]],
    ], np.float32)
    proposed = np.array([[1, 1], [1, 1], [1, 0]], bool)
    verified = np.array([[1, 1], [1, 0], [1, 1]], bool)
    return scores, proposed, verified


def test_evorubric_pruning_and_batch_vectors_hand_computed():
    scores, proposed, verified = evorubric_case()
    kept = prune(scores, proposed & verified)
    np.testing.assert_array_equal(kept, [[1, 0], [1, 0], [1, 0]])
    vectors, has = batch_scores(scores, kept)
    np.testing.assert_allclose(vectors, [[2, 2, 0, 0], [1, 1, 1, 0], [0, 0, 3, 3]])
    np.testing.assert_array_equal(has, [1, 1, 1])


def test_evorubric_loo_consensus_and_eq3_hand_computed():
    """Peer means: v_not0 = [.5,.5,2,1.5], v_not1 = [1,1,1.5,1.5], v_not2 = [1.5,1.5,.5,0].
    rho_0 = -2.5 / sqrt(4 * 1.6875); rho_1 = -0.25 / sqrt(0.75 * 0.25); rho_2 = -3.75 / sqrt(9 * 1.6875).
    Eq 3 with rho_tilde = rho * kept/proposed, r_meta = (verified - rejected)/proposed, r_disc = kept/verified:
    gen 0: rho_0/2 + 1 + 1/2; gen 1: rho_1/2 + 0 + 1; gen 2: rho_2 + 1 + 1."""
    scores, proposed, verified = evorubric_case()
    rho_expected = [-2.5 / np.sqrt(4 * 1.6875), -0.25 / np.sqrt(0.75 * 0.25), -3.75 / np.sqrt(9 * 1.6875)]
    num_penalty = excess_penalty(proposed.sum(axis=1), budget=1, coef=0.1)  # [0.1, 0.1, 0]
    length_penalty = np.array([0.0, 0.2, 0.0], np.float32)
    kept, rho, reward = evorubric_pipeline(scores, proposed, verified, np.ones(4, bool), num_penalty, length_penalty)
    np.testing.assert_allclose(rho, rho_expected, rtol=1e-6)
    np.testing.assert_allclose(scaled_consensus(rho, kept, proposed), np.array(rho_expected) * [0.5, 0.5, 1], rtol=1e-6)
    np.testing.assert_allclose(meta_reward(verified, proposed), [1, 0, 1])
    np.testing.assert_allclose(disc_reward(kept, verified & proposed), [0.5, 1, 1])
    expected = [rho_expected[0] / 2 + 1.5 - 0.1, rho_expected[1] / 2 + 1 - 0.1 - 0.2, rho_expected[2] + 2]
    np.testing.assert_allclose(reward, expected, rtol=1e-6)


def test_evorubric_degenerate_batches():
    scores, proposed, verified = evorubric_case()
    # gen 2 proposes nothing: no vector, rho 0, reward 0; the others are each other's only peer
    proposed = proposed.copy()
    proposed[2] = False
    kept, rho, reward = evorubric_pipeline(scores, proposed, verified, np.ones(4, bool), np.zeros(3), np.zeros(3))
    np.testing.assert_allclose(rho[:2], [1 / np.sqrt(4 * 0.75)] * 2, rtol=1e-6)  # corr(v0, v1)
    assert rho[2] == 0 and reward[2] == 0
    # a single generator has no peer; with it alone every rho is 0
    proposed[1] = False
    _, rho, _ = evorubric_pipeline(scores, proposed, verified, np.ones(4, bool), np.zeros(3), np.zeros(3))
    np.testing.assert_array_equal(rho, [0, 0, 0])


def test_evorubric_reasoner_eq4_hand_computed():
    # base rubric: +4, +2, -3; pool: +1, -1. Row 0: (4 - 3)/6 + 1/1 - 0.1; row 1: 2/6 + (-1)/1; row 2: empty pool
    satisfied_base = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0]], bool)
    satisfied_pool = np.array([[1, 0], [0, 1], [1, 1]], bool)
    pool_mask = np.array([[1, 1], [1, 1], [0, 0]], bool)
    out = evo_reasoner_reward(satisfied_base, np.array([4.0, 2.0, -3.0]), np.ones(3, bool), satisfied_pool,
                              np.array([1.0, -1.0]), pool_mask, np.array([0.1, 0.0, 0.0]))
    np.testing.assert_allclose(out, [1 / 6 + 1 - 0.1, 2 / 6 - 1, 1.0], rtol=1e-6)
    # One denominator (positive points 6 + 1 = 7): row 0 (4 - 3 + 1) / 7 - 0.1; row 1 (2 - 1) / 7; row 2 has no
    # pool, so its denominator is the base rubric's 6: (4 + 2) / 6.
    joint = evo_joint_reasoner_reward(satisfied_base, np.array([4.0, 2.0, -3.0]), np.ones(3, bool), satisfied_pool,
                                      np.array([1.0, -1.0]), pool_mask, np.array([0.1, 0.0, 0.0]))
    np.testing.assert_allclose(joint, [2 / 7 - 0.1, 1 / 7, 1.0], rtol=1e-6)


def test_evorubric_eq4_a_one_criterion_pool_weighs_its_points_under_joint_normalisation():
    """Base rubric: ten criteria of +1; pool: one criterion of +2. Row 0 meets five base criteria and the pool's;
    row 1 meets all ten base criteria and not the pool's. Separate (eq 4 with each source over its own positive
    points): row 0 5/10 + 2/2 = 1.5 beats row 1's 10/10 + 0/2 = 1, the +2 criterion outweighing five +1 ones.
    Joint (one denominator, 10 + 2): row 0 (5 + 2)/12 = 7/12, row 1 10/12."""
    satisfied_base = np.array([[1] * 5 + [0] * 5, [1] * 10], np.float32)
    args = (satisfied_base, np.ones(10, np.float32), np.ones(10, bool), np.array([[1.0], [0.0]]), np.array([2.0]),
            np.ones(1, bool), np.zeros(2))
    np.testing.assert_allclose(evo_reasoner_reward(*args), [1.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(evo_joint_reasoner_reward(*args), [7 / 12, 10 / 12], rtol=1e-6)


def test_evorubric_eq4_a_penalty_only_pool_subtracts_only_under_joint_normalisation():
    """Base rubric: +3, +1; pool: one penalty -2. Both rows meet the +3 criterion; row 0 also commits the pool's
    flaw. Separate: the pool has no positive points, so S_pool = 0 for both (E1): 3/4 = 0.75 either way. Joint:
    row 0 (3 - 2)/4 = 0.25, row 1 3/4."""
    args = (np.array([[1, 0], [1, 0]], bool), np.array([3.0, 1.0]), np.ones(2, bool), np.array([[1], [0]], bool),
            np.array([-2.0]), np.ones(1, bool), np.zeros(2))
    np.testing.assert_allclose(evo_reasoner_reward(*args), [0.75, 0.75], rtol=1e-6)
    np.testing.assert_allclose(evo_joint_reasoner_reward(*args), [0.25, 0.75], rtol=1e-6)
    # Nothing positive anywhere: the joint score is 0 (a checklist that rewards nothing), minus p_len.
    nothing = (args[0], np.array([-1.0, -3.0]), *args[2:6], np.array([0.5, 0.0]))
    np.testing.assert_allclose(evo_joint_reasoner_reward(*nothing), [-0.5, 0.0])


# ---------------------------------------------------------------- DAPO and RGR-GRPO, hand-computed


def test_dapo_filter_hand_computed():
    values = np.array([1, 1, 0, 1, 1, 0.5, 0.5, 0.0, 1, 0, 1, 0], np.float32)
    groups = np.array([7, 7, 3, 3, 9, 4, 4, 4, 5, 5, 8, 8], np.int32)
    mask = np.array([1, 1, 1, 1, 1, 1, 1, 0, 1, 0, 1, 1], bool)
    # group 7 ties, 3 varies, 9 is a single sample, 4 ties once its masked row is left out, 5 has one valid row
    np.testing.assert_array_equal(group_filter(values, groups, mask), [0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(group_filter(values, groups, mask, min_std=0.5), [0] * 12)  # stds are 0.5


def test_rgr_exploration_assessment_eqs_7_8_hand_computed():
    rewards_b = np.array([0.5, 0.9, 0.9, 1.0, 0.2, 0.7, 0.3], np.float32)
    satisfied = np.array([[1, 1], [1, 0], [1, 1], [1, 1], [0, 0], [1, 1], [0, 0]], bool)
    item_mask = np.array([[1, 1]] * 6 + [[0, 0]], bool)
    groups = np.array([3, 3, 3, 4, 4, 5, 6], np.int32)
    mask = np.array([1, 1, 1, 1, 1, 0, 1], bool)
    out = exploration(rewards_b, satisfied, item_mask, groups, mask)
    # group 3: rows 1 and 2 tie, the lowest row wins and fails its second criterion; group 4: row 3 meets all;
    # group 5: no valid row; group 6: empty rubric, solved vacuously
    np.testing.assert_array_equal(out.best_index, [1, 1, 1, 3, 3, -1, 6])
    np.testing.assert_array_equal(out.is_best, [0, 1, 0, 1, 0, 0, 1])
    np.testing.assert_array_equal(out.solved, [0, 0, 0, 1, 1, 0, 1])
    np.testing.assert_array_equal(out.failed_bk, [[0, 1]] * 3 + [[0, 0]] * 4)


# ---------------------------------------------------------------- vectorised JAX vs the NumPy loop reference


def random_rlcer(rng):
    v = rng.random((K, N)) < rng.uniform(0.2, 0.8)
    v[rng.random(K) < 0.2] = rng.random() < 0.5  # constant rubrics
    z = rng.random(N) < 0.5
    if rng.random() < 0.2:
        z[:] = rng.random() < 0.5  # zero-variance correctness
    points = rng.integers(-5, 6, K).astype(np.float32)
    return v, z, points, rng.random(K) < 0.85, rng.random(N) < 0.85


@pytest.mark.parametrize("seed", range(30))
def test_rlcer_matches_the_loop_reference(seed):
    rng = np.random.default_rng(seed)
    v, z, points, rubric_mask, rollout_mask = random_rlcer(rng)
    got = np.asarray(validity(v, z, rubric_mask, rollout_mask, alpha=0.2))
    expected = ref.rlcer_rubric_validity(v, z, rubric_mask, rollout_mask, alpha=0.2)
    for k in range(K):
        value, _ = ref.pearson(v[k], z, rollout_mask)
        if abs(value - 0.2) > 1e-5:  # a correlation at the threshold may round either way in float32
            assert got[k] == expected[k]
        np.testing.assert_allclose(masked_pearson(v, z, rollout_mask).value[k], value, atol=1e-6)
    np.testing.assert_allclose(reasoner_reward(z, v, points, got), ref.rlcer_reasoner_reward(z, v, points, got),
                               rtol=1e-5, atol=1e-6)
    # per-verdict masks (failed verifier calls) and the sign-aware reading of penalty rubrics
    known = (rng.random((K, N)) < 0.8) & rollout_mask
    signed = np.asarray(sign_aware_validity(v, z, points, rubric_mask, known, alpha=0.2))
    expected = ref.rlcer_sign_aware_validity(v, z, points, rubric_mask, known, alpha=0.2)
    for k in range(K):
        u = ~v[k] if points[k] < 0 else v[k]
        if abs(ref.pearson(u, z, known[k])[0] - 0.2) > 1e-5:
            assert signed[k] == expected[k]
    np.testing.assert_allclose(cot_reward(v, points, signed, known), ref.rlcer_cot_reward(v, points, signed, known),
                               rtol=1e-5, atol=1e-6)
    proposed_rk = rng.random((3, K)) < 0.7
    valid_rk = rng.random((3, K)) < 0.5
    np.testing.assert_allclose(valid_fraction(valid_rk, proposed_rk),
                               [ref.rlcer_valid_fraction(valid_rk[r], proposed_rk[r]) for r in range(3)], rtol=1e-6)


def random_evorubric(rng):
    points = rng.integers(-3, 4, (M, J, 1)).astype(np.float32)
    scores = points * (rng.random((M, J, R)) < 0.5)
    scores[rng.random((M, J)) < 0.2] = points[0, 0, 0]  # constant criteria
    proposed = rng.random((M, J)) < 0.8
    verified = rng.random((M, J)) < 0.8
    response_mask = rng.random(R) < 0.9
    return scores, proposed, verified, response_mask, rng.random(M) * 0.2, rng.random(M) * 0.2


@pytest.mark.parametrize("seed", range(30))
def test_evorubric_matches_the_loop_reference(seed):
    rng = np.random.default_rng(seed)
    scores, proposed, verified, response_mask, num_penalty, length_penalty = random_evorubric(rng)
    kept, rho, reward = evorubric_pipeline(scores, proposed, verified, response_mask, num_penalty, length_penalty)
    ref_kept, ref_rho, ref_reward = ref.evorubric_generator_rewards(
        scores, proposed, verified, response_mask, num_penalty, length_penalty)
    np.testing.assert_array_equal(kept, ref_kept)
    np.testing.assert_allclose(rho, ref_rho, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(reward, ref_reward, rtol=1e-5, atol=1e-5)


def random_reasoner_sources(rng, rows=B, base_items=5, pool_items=4):
    """Eq 4's two sources: partial-credit verdicts, integer points in [-4, 4] per row, ragged masks (a row's pool
    may be empty), and length penalties."""
    def source(items):
        return (rng.random((rows, items)) * (rng.random((rows, items)) < 0.7),
                rng.integers(-4, 5, (rows, items)).astype(np.float32), rng.random((rows, items)) < 0.75)
    return (*source(base_items), *source(pool_items), (rng.random(rows) * 0.3).astype(np.float32))


@pytest.mark.parametrize("seed", range(20))
def test_evorubric_reasoner_rewards_match_the_loop_reference(seed):
    sources = random_reasoner_sources(np.random.default_rng(seed))
    for function, normalisation in ((evo_reasoner_reward, "separate"), (evo_joint_reasoner_reward, "joint")):
        np.testing.assert_allclose(function(*sources), ref.evorubric_reasoner_rewards(*sources, normalisation),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(30))
def test_group_decisions_match_the_loop_reference(seed):
    rng = np.random.default_rng(seed)
    batch = random_rollouts(rng, num_rows=B)
    np.testing.assert_array_equal(group_filter(batch.rewards, batch.group_ids, batch.valid),
                                  ref.dapo_group_filter(batch.rewards, batch.group_ids, batch.valid))
    out = exploration(batch.rewards, batch.satisfied, batch.item_mask, batch.group_ids, batch.valid)
    expected = ref.rgr_exploration_assessment(batch.rewards, batch.satisfied, batch.item_mask, batch.group_ids,
                                              batch.valid)
    np.testing.assert_array_equal(out.best_index, [e[0] for e in expected])
    np.testing.assert_array_equal(out.is_best, [e[1] for e in expected])
    np.testing.assert_array_equal(out.solved, [e[2] for e in expected])
    np.testing.assert_array_equal(out.failed_bk, [e[3] for e in expected])


# ---------------------------------------------------------------- properties


@given(hnp.arrays(np.float32, (K, N), elements=st.floats(-1e4, 1e4, width=32)),
       hnp.arrays(np.float32, (N,), elements=st.floats(-1e4, 1e4, width=32)),
       hnp.arrays(bool, (N,)))
def test_pearson_is_in_minus_one_one_and_symmetric(x, y, mask):
    corr = masked_pearson(x, y, mask)
    value = np.asarray(corr.value)
    assert np.all((value >= -1) & (value <= 1))
    assert np.all(value[~np.asarray(corr.defined)] == 0)
    swapped = masked_pearson(np.broadcast_to(y, x.shape), x, mask)
    np.testing.assert_allclose(swapped.value, value, atol=1e-5)


@given(hnp.arrays(bool, (K, N)), hnp.arrays(bool, (N,)), hnp.arrays(np.int8, (K,), elements=st.sampled_from(
    [-5, -2, -1, 1, 3, 5])), hnp.arrays(bool, (K,)), hnp.arrays(bool, (K, N)), st.floats(-1, 1))
def test_rlcer_sign_aware_validity_invariants(v, z, points, rubric_mask, known, alpha):
    points = points.astype(np.float32)
    valid = np.asarray(sign_aware_validity(v, z, points, rubric_mask, known, alpha=alpha))
    # A penalty for a flaw is the same rubric as a reward for its absence.
    np.testing.assert_array_equal(sign_aware_validity(~v, z, -points, rubric_mask, known, alpha=alpha), valid)
    # Reward rubrics are validated as eq 7 is written.
    as_written = np.asarray(validity(v, z, rubric_mask, known, alpha=alpha))
    np.testing.assert_array_equal(valid[points > 0], as_written[points > 0])
    # A mask per verdict that repeats one rollout mask is that rollout mask.
    np.testing.assert_array_equal(validity(v, z, rubric_mask, np.broadcast_to(known[0], (K, N)), alpha=alpha),
                                  validity(v, z, rubric_mask, known[0], alpha=alpha))
    cot = np.asarray(cot_reward(v, points, valid, known))
    assert np.all((cot >= 0) & (cot <= 1))


@given(hnp.arrays(bool, (K, N)), hnp.arrays(bool, (N,)), hnp.arrays(bool, (K,)), hnp.arrays(bool, (N,)),
       st.floats(-1, 1))
def test_rlcer_validity_implies_variation_of_v_and_z(v, z, rubric_mask, rollout_mask, alpha):
    valid = np.asarray(validity(v, z, rubric_mask, rollout_mask, alpha=alpha))
    for k in np.flatnonzero(valid):
        assert rubric_mask[k]
        assert np.std(v[k][rollout_mask].astype(float)) > 0 and np.std(z[rollout_mask].astype(float)) > 0
    cot = np.asarray(cot_reward(v, np.arange(-3, 3, dtype=np.float32), valid))
    assert np.all((cot >= 0) & (cot <= 1))


@given(hnp.arrays(np.float32, (M, J, R), elements=st.sampled_from([-2.0, 0.0, 0.5, 1.0, 3.0])),
       hnp.arrays(bool, (M, J)), hnp.arrays(bool, (R,)), st.permutations(range(M)), st.permutations(range(R)))
def test_evorubric_consensus_is_bounded_and_permutation_equivariant(scores, mask, response_mask, perm_m, perm_r):
    kept = np.asarray(prune(scores, mask, response_mask))
    for m, k in zip(*np.nonzero(kept)):
        assert np.std(scores[m, k][response_mask]) > 0
    rho = np.asarray(peer_consensus(*batch_scores(scores, kept), response_mask))
    assert np.all((rho >= -1) & (rho <= 1))
    perm_m, perm_r = np.array(perm_m), np.array(perm_r)
    shuffled = scores[perm_m][:, :, perm_r]
    rho_shuffled = peer_consensus(*batch_scores(shuffled, kept[perm_m]), response_mask[perm_r])
    np.testing.assert_allclose(rho_shuffled, rho[perm_m], atol=1e-5)


@given(st.integers(0, 2**31 - 1))
def test_evorubric_reasoner_reward_bounds(seed):
    """Verdicts in [0, 1]: the joint score is at most 1, at least -(penalty points) / (positive points), 0 without
    positive points, and, when both sources have positive points, the K_pos-weighted mean of S_base and S_pool,
    so between them; the separate sum is at most 2."""
    sources = random_reasoner_sources(np.random.default_rng(seed))
    satisfied_base, points_base, base_mask, satisfied_pool, points_pool, pool_mask, length_penalty = sources
    joint = np.asarray(evo_joint_reasoner_reward(*sources)) + length_penalty
    separate = np.asarray(evo_reasoner_reward(*sources)) + length_penalty
    s_base = np.asarray(positive_points_score(satisfied_base, points_base, base_mask))
    s_pool = np.asarray(positive_points_score(satisfied_pool, points_pool, pool_mask))
    positive_base = np.where(base_mask, np.maximum(points_base, 0), 0).sum(axis=1)
    positive_pool = np.where(pool_mask, np.maximum(points_pool, 0), 0).sum(axis=1)
    negative = np.where(base_mask, np.minimum(points_base, 0), 0).sum(axis=1) + np.where(
        pool_mask, np.minimum(points_pool, 0), 0).sum(axis=1)
    tol = 1e-5
    assert np.all(joint <= 1 + tol) and np.all(separate <= 2 + tol)
    has_points = positive_base + positive_pool > 0
    assert np.all(joint[has_points] >= negative[has_points] / (positive_base + positive_pool)[has_points] - tol)
    assert np.all(joint[~has_points] == 0)
    both = (positive_base > 0) & (positive_pool > 0)
    assert np.all(joint[both] >= np.minimum(s_base, s_pool)[both] - tol)
    assert np.all(joint[both] <= np.maximum(s_base, s_pool)[both] + tol)
    weighted = (positive_base * s_base + positive_pool * s_pool) / np.where(both, positive_base + positive_pool, 1)
    np.testing.assert_allclose(joint[both], weighted[both], rtol=1e-5, atol=1e-6)


@st.composite
def group_batches(draw):
    """Values (tied, near-tied or continuous), ragged groups with arbitrary ids, a row mask, a row permutation."""
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    values = draw(st.one_of(
        hnp.arrays(np.float32, (B,), elements=st.sampled_from([0.0, 0.35, 1.0])), st.just(random_rewards(rng, B))
    ))
    return values, random_group_ids(rng, B), draw(hnp.arrays(bool, (B,))), np.array(draw(st.permutations(range(B))))


@given(group_batches())
def test_reference_item_5_zero_variance_filtering_is_decided_per_group(batch):
    values, group_ids, mask, _ = batch
    keep = np.asarray(group_filter(values, group_ids, mask))
    assert not np.any(keep[~mask])
    for g in np.unique(group_ids):
        members = (group_ids == g) & mask
        decisions = set(keep[members].tolist())
        assert len(decisions) <= 1  # every valid member of a group shares the group's decision
        if members.any():
            assert decisions == {bool(np.unique(values[members]).size > 1)}


@given(group_batches())
def test_group_decisions_are_permutation_invariant(batch):
    values, group_ids, mask, perm = batch
    keep = np.asarray(group_filter(values, group_ids, mask))
    np.testing.assert_array_equal(group_filter(values[perm], group_ids[perm], mask[perm]), keep[perm])
    # with rewards = weighted fraction (positive weights), "solved" does not depend on which tied best row wins
    satisfied = np.random.default_rng(int(perm[0])).random((B, K)) < 0.7
    weights = np.arange(1, K + 1, dtype=np.float32)
    rewards_b = np.asarray(weighted_fraction(satisfied, weights, np.ones(K, bool)))
    every_item = np.ones((B, K), bool)
    solved = exploration(rewards_b, satisfied, every_item, group_ids, mask).solved
    solved_perm = exploration(rewards_b[perm], satisfied[perm], every_item, group_ids[perm], mask[perm]).solved
    np.testing.assert_array_equal(solved_perm, np.asarray(solved)[perm])


# ---------------------------------------------------------------- bfloat16


def test_bfloat16_inputs_are_promoted_to_float32():
    v, z, points = rlcer_case()
    low = lambda x: jnp.asarray(x, jnp.bfloat16)
    corr = masked_pearson(low(v), low(z))
    assert corr.value.dtype == jnp.float32
    np.testing.assert_array_equal(corr.value, masked_pearson(v, z).value)
    valid = validity(low(v), low(z), np.ones(5, bool))
    np.testing.assert_array_equal(valid, validity(v, z, np.ones(5, bool)))
    np.testing.assert_array_equal(reasoner_reward(z, low(v), low(points), valid), reasoner_reward(z, v, points, valid))
    scores, proposed, verified = evorubric_case()
    zeros = np.zeros(3, np.float32)
    low_out = evorubric_pipeline(low(scores), proposed, verified, np.ones(4, bool), zeros, zeros)
    high_out = evorubric_pipeline(scores, proposed, verified, np.ones(4, bool), zeros, zeros)
    assert low_out[2].dtype == jnp.float32
    np.testing.assert_allclose(low_out[2], high_out[2], rtol=1e-6)
    rewards_b = np.array([0.5, 0.25, 1.0, 0.0], np.float32)
    np.testing.assert_array_equal(group_filter(low(rewards_b), np.array([1, 1, 2, 2])),
                                  group_filter(rewards_b, np.array([1, 1, 2, 2])))
    best = exploration(low(rewards_b), np.ones((4, 2), bool), np.ones((4, 2), bool), np.array([1, 1, 2, 2]))
    np.testing.assert_array_equal(best.best_index, [0, 0, 2, 2])
