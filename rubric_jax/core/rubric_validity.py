"""Which rubrics, rollouts and groups carry signal: rubric validity and evolution rewards (RLCER, EvoRubric),
DAPO's zero-variance group filter, RGR-GRPO's exploration assessment.

Arrays (vmap over questions is the caller's job; every function here handles one question or one batch):
- RLCER, one question: K proposed rubrics (those of all N rubricator rollouts, flattened) judged on N reasoner
  rollouts: satisfaction `v_kn` [K, N], answer correctness `z_n` [N], rubric points `points_k` [K],
  `rubric_mask_k` (the rubric exists), `rollout_mask_n` (the rollout counts; None: all), or per verdict
  `known_kn` [K, N] (the verifier's verdict of rubric k on rollout n is known: its call did not fail).
- EvoRubric, one question: M generator rollouts, each proposing up to K criteria, graded on N reasoner responses:
  score matrix `scores_mkn` [M, K, N] with s(o_n, r) = the criterion's points when met, 0 otherwise (partial
  credit scales the points); `proposed_mk` (the criterion was generated), `verified_mk` (it passed the
  meta-verifier), `response_mask_n`.
- Batch-level (DAPO, RGR-GRPO): rewards [B], group_ids [B] (any ints, only equality matters), mask [B].

Correlations and standard deviations use deviations from `segments.segment_stats`, shifted by a member of each
row, so a constant row has deviation and std exactly 0 however its values round: "zero variance" is decided
exactly, never by a tolerance. All computation is float32 (bool, int and bfloat16 inputs are promoted).
"""

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from rubric_jax.core.rewards import min_max_score, positive_points_score, rlcer_outcome_reward
from rubric_jax.core.segments import (as_stats_dtype, dense_segment_ids, group_stats, leave_one_out_stats, rows_mask,
                                      segment_stats)


def _row_deviations(x_rn: jax.Array, mask_n: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per row of x [..., N]: deviations from the row's mean over the valid columns (0 on masked columns) and
    their sum of squares [...]. Exact for ties: a constant row gives exactly 0 for both."""
    x = as_stats_dtype(x_rn)
    lead, num = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, num)
    num_rows = flat.shape[0]
    row_ids = jnp.broadcast_to(jnp.arange(num_rows)[:, None], flat.shape).reshape(-1)
    valid = jnp.broadcast_to(mask_n, flat.shape)
    stats = segment_stats(flat.reshape(-1), row_ids, valid.reshape(-1), num_segments=num_rows, ddof=0)
    deviation = jnp.where(valid, stats.deviation.reshape(flat.shape), 0)
    return deviation.reshape(x.shape), jnp.sum(deviation * deviation, axis=-1).reshape(lead)


class Correlation(NamedTuple):
    """Pearson correlation per row, and whether it is defined (both rows vary over the valid columns)."""

    value: jax.Array
    defined: jax.Array


def masked_pearson(x_kn: jax.Array, y_kn: jax.Array, mask_n: Optional[jax.Array] = None) -> Correlation:
    """Pearson correlation of each row of x with the matching row of y over the valid columns.

    x [..., N]; y [..., N] or [N] (one vector correlated with every row of x, RLCER's z); mask [N] (the same
    columns for every row) or x's shape (columns per row: each row's pair is correlated over its own columns).
    Population and sample conventions give the same coefficient. value is in [-1, 1] (clipped against rounding
    past Cauchy-Schwarz).
    Degenerate: a row that is constant over the valid columns (including fewer than 2 valid columns) has no
    correlation: defined False, value 0.
    """
    chex.assert_rank(y_kn, {1, x_kn.ndim})
    chex.assert_equal_shape_suffix([x_kn, y_kn], 1)
    if mask_n is not None and jnp.ndim(mask_n) > 1:
        chex.assert_equal_shape([x_kn, mask_n])
        valid, y_kn = jnp.asarray(mask_n).astype(bool), jnp.broadcast_to(y_kn, x_kn.shape)
    else:
        valid = rows_mask(mask_n, x_kn.shape[-1])
    dx, sxx = _row_deviations(x_kn, valid)
    dy, syy = _row_deviations(y_kn, valid)
    defined = (sxx > 0) & (syy > 0)
    scale = jnp.where(defined, jnp.sqrt(sxx) * jnp.sqrt(syy), 1)
    value = jnp.clip(jnp.sum(dx * dy, axis=-1) / scale, -1, 1)
    return Correlation(value=jnp.where(defined, value, 0), defined=defined)


# ---------------------------------------------------------------- RLCER


def rlcer_rubric_validity(
    v_kn: jax.Array,
    z_n: jax.Array,
    rubric_mask_k: jax.Array,
    rollout_mask_n: Optional[jax.Array] = None,
    *,
    alpha: float = 0.2,
) -> jax.Array:
    """RLCER rubric validity (rlcer.txt, section 4.3, eq 7): valid iff corr(v_k, z) > alpha and std(v_k) > 0, [K].

    Pearson correlation over the valid rollouts: `rollout_mask_n` [N], or [K, N] per verdict (rubric k is
    correlated over the rollouts whose verdict of k is known); alpha = 0.2 in the paper. As eq 7 is written, the
    correlation is of the satisfaction indicator whatever the sign of the rubric's points, so a penalty rubric
    (negative points) is valid when its flaw co-occurs with correct answers; `rlcer_sign_aware_validity` reads
    penalty rubrics by the absence of their flaw.
    Degenerate: when z has zero variance (every valid rollout right, or every one wrong) the correlation is
    undefined and *no* rubric is valid, for any alpha: nothing separates right from wrong answers to validate a
    rubric against. A rubric with std(v_k) = 0 is invalid (condition ii). Masked rubrics are invalid.
    """
    chex.assert_rank([v_kn, z_n, rubric_mask_k], [2, 1, 1])
    chex.assert_equal_shape_prefix([v_kn, rubric_mask_k], 1)
    corr = masked_pearson(v_kn, z_n, rollout_mask_n)
    return jnp.asarray(rubric_mask_k).astype(bool) & corr.defined & (corr.value > alpha)


def rlcer_merit_indicator(v_kn: jax.Array, points_k: jax.Array) -> jax.Array:
    """Whether rubric k speaks for CoT n, [K, N] float32: a reward rubric met, or a penalty rubric's flaw absent,
    u_kn = 1 - v_kn if s_k < 0 else v_kn (the verifier's v = 1 means "flaw present" for a penalty, rlcer.txt
    Figure 10; points 0, which the parsers reject, read as written). Its Pearson correlation with z equals that
    of sign(s_k) * v_k."""
    chex.assert_rank([v_kn, points_k], [2, 1])
    chex.assert_equal_shape_prefix([v_kn, points_k], 1)
    v = as_stats_dtype(v_kn)
    return jnp.where(jnp.asarray(points_k)[:, None] < 0, 1 - v, v)


def rlcer_sign_aware_validity(
    v_kn: jax.Array,
    z_n: jax.Array,
    points_k: jax.Array,
    rubric_mask_k: jax.Array,
    rollout_mask_n: Optional[jax.Array] = None,
    *,
    alpha: float = 0.2,
) -> jax.Array:
    """RLCER rubric validity (rlcer.txt, eq 7) with penalty rubrics read by the absence of their flaw, [K]:
    `rlcer_rubric_validity` of `rlcer_merit_indicator`, i.e. corr(sign(s_k) v_k, z) > alpha and std(v_k) > 0.

    Why: eq 7 asks that "satisfying the rubric aligns with producing correct answers" and eq 6 adds s_k v_k to
    the CoT's score; for a penalty (s_k < 0, v_k = 1 when the flaw is present) the rubric pushes the score in the
    right direction exactly when its flaw comes with *wrong* answers, so that is when it is informative. Read as
    written (`rlcer_rubric_validity` of v_k), every useful penalty is invalid and every valid one rewards
    flawed-but-right CoTs. Reward rubrics are unchanged; conventions and degenerate cases as
    `rlcer_rubric_validity` (std(u_k) = std(v_k)).
    """
    return rlcer_rubric_validity(rlcer_merit_indicator(v_kn, points_k), z_n, rubric_mask_k, rollout_mask_n,
                                 alpha=alpha)


def rlcer_valid_fraction(valid_k: jax.Array, rubric_mask_k: jax.Array) -> jax.Array:
    """RLCER's evolving reward (rlcer.txt, eq 10): K_valid / K over the last axis (one rubricator's rubrics;
    [R, K] gives one fraction per rubricator). Degenerate: a rubricator that proposed no rubric gets 0."""
    chex.assert_equal_shape([valid_k, rubric_mask_k])
    exists = jnp.asarray(rubric_mask_k).astype(bool)
    num_valid = jnp.sum(exists & jnp.asarray(valid_k).astype(bool), axis=-1)
    num = jnp.sum(exists, axis=-1)
    return jnp.where(num > 0, num_valid / jnp.maximum(num, 1), 0).astype(jnp.float32)


def rlcer_rubricator_reward(valid_k: jax.Array, rubric_mask_k: jax.Array, format_ok: jax.Array) -> jax.Array:
    """RLCER's rubricator reward (rlcer.txt, eqs 10-12): K_valid / K + (1 if the output parsed, else 0).

    Shapes as `rlcer_valid_fraction`; `format_ok` has the shape of its output (eq 11's format check). In [0, 2].
    """
    fraction = rlcer_valid_fraction(valid_k, rubric_mask_k)
    chex.assert_equal_shape([fraction, format_ok])
    return fraction + jnp.asarray(format_ok).astype(bool)


def rlcer_cot_reward(
    v_kn: jax.Array, points_k: jax.Array, valid_k: jax.Array, known_kn: Optional[jax.Array] = None
) -> jax.Array:
    """RLCER's CoT reward (rlcer.txt, eq 6): min-max normalised points of the valid rubrics each CoT meets, [N].

    Min and max attainable scores are over the valid rubrics (sum of their negative / positive points), shared
    by the question's N rollouts. `known_kn` [K, N] (None: all known): a rubric whose verdict on rollout n is
    unknown (its verifier call failed) takes no part in n's score nor in n's min and max, so n is normalised over
    the valid rubrics it was judged on. Degenerate: no valid (known) rubric, or valid rubrics whose points are all
    0 -> 0 for that rollout (no CoT signal; the reasoner reward is then the outcome alone).
    """
    chex.assert_rank([v_kn, points_k, valid_k], [2, 1, 1])
    chex.assert_equal_shape_prefix([v_kn, points_k, valid_k], 1)
    if known_kn is None:
        return min_max_score(v_kn.T, points_k, valid_k)
    chex.assert_equal_shape([v_kn, known_kn])
    return min_max_score(v_kn.T, points_k, jnp.asarray(valid_k).astype(bool) & jnp.asarray(known_kn).T.astype(bool))


def rlcer_reasoner_reward(correct_n: jax.Array, v_kn: jax.Array, points_k: jax.Array, valid_k: jax.Array) -> jax.Array:
    """RLCER's reasoner reward (rlcer.txt, eq 9): r_outcome (eq 8, +-1) + r_cot (eq 6), [N]; in [-1, 2]."""
    return rlcer_outcome_reward(correct_n) + rlcer_cot_reward(v_kn, points_k, valid_k)


# ---------------------------------------------------------------- EvoRubric


def zero_variance_prune(
    scores_kn: jax.Array, rubric_mask_k: jax.Array, response_mask_n: Optional[jax.Array] = None
) -> jax.Array:
    """EvoRubric's variance filtering (evorubric.txt, section 3.3.2, step 3): keep criterion r iff it exists
    (`rubric_mask_k`, e.g. proposed and meta-verified) and std(s_r) > 0 over the valid responses.

    scores [..., N] with mask [...] (e.g. [M, K, N] and [M, K]); returns the keep mask [...]. A criterion that
    scores every response alike (or sees fewer than 2 valid responses) is pruned.
    """
    chex.assert_equal_shape_prefix([scores_kn, rubric_mask_k], rubric_mask_k.ndim)
    chex.assert_rank(scores_kn, rubric_mask_k.ndim + 1)
    _, sum_sq = _row_deviations(scores_kn, rows_mask(response_mask_n, scores_kn.shape[-1]))
    return jnp.asarray(rubric_mask_k).astype(bool) & (sum_sq > 0)


class BatchScores(NamedTuple):
    """EvoRubric batch score vectors v_m [M, N] and whether the batch kept any criterion [M]."""

    vectors_mn: jax.Array
    has_criteria_m: jax.Array


def evorubric_batch_scores(scores_mkn: jax.Array, kept_mk: jax.Array) -> BatchScores:
    """EvoRubric's batch score vector (evorubric.txt, section 3.3.2, step 4): v_m = mean of s_r over r in R_hat_m.

    `kept_mk` is R_hat_m (`zero_variance_prune`). Degenerate: an empty R_hat_m has no mean: v_m = 0 and
    has_criteria_m False; `evorubric_peer_consensus` leaves such batches out.
    """
    chex.assert_rank([scores_mkn, kept_mk], [3, 2])
    chex.assert_equal_shape_prefix([scores_mkn, kept_mk], 2)
    scores = as_stats_dtype(scores_mkn)
    kept = jnp.asarray(kept_mk).astype(bool)
    count = jnp.sum(kept, axis=1)
    total = jnp.sum(jnp.where(kept[..., None], scores, 0), axis=1)
    return BatchScores(vectors_mn=total / jnp.maximum(count, 1)[:, None], has_criteria_m=count > 0)


def evorubric_peer_consensus(
    vectors_mn: jax.Array, has_criteria_m: jax.Array, response_mask_n: Optional[jax.Array] = None
) -> jax.Array:
    """EvoRubric's leave-one-out peer consensus (evorubric.txt, section 3.3.2, step 4): rho_m = corr(v_m, v_not_m),
    with v_not_m the mean of the other batches' vectors, Pearson over the valid responses, [M].

    The peers are the other batches that kept a criterion (an empty batch has no vector to average). The peer
    mean comes from `segments.leave_one_out_stats` (no sum-minus-self cancellation). Degenerate, rho_m = 0
    (no evidence of agreement or disagreement): batch m kept no criterion, it has no peer (M = 1 or every other
    batch empty), or v_m or v_not_m is constant over the valid responses.
    """
    chex.assert_rank([vectors_mn, has_criteria_m], [2, 1])
    chex.assert_equal_shape_prefix([vectors_mn, has_criteria_m], 1)
    num_batches, num_responses = vectors_mn.shape
    has = jnp.asarray(has_criteria_m).astype(bool)
    # One leave-one-out segment per response: the M batches' scores of that response.
    values_nm = jnp.asarray(vectors_mn).T
    response_ids = jnp.broadcast_to(jnp.arange(num_responses)[:, None], values_nm.shape)
    others = leave_one_out_stats(
        values_nm.reshape(-1), response_ids.reshape(-1), jnp.broadcast_to(has, values_nm.shape).reshape(-1), ddof=0
    )
    peer_mn = others.mean.reshape(num_responses, num_batches).T
    has_peers = others.count.reshape(num_responses, num_batches)[0] > 0
    corr = masked_pearson(vectors_mn, peer_mn, response_mask_n)
    return jnp.where(has & has_peers, corr.value, 0)


def _share(part_mk: jax.Array, whole_mk: jax.Array) -> jax.Array:
    """|part| / |whole| per batch (part within whole), 0 for an empty whole, [M]."""
    whole = jnp.asarray(whole_mk).astype(bool)
    num = jnp.sum(whole, axis=1)
    return jnp.where(num > 0, jnp.sum(whole & jnp.asarray(part_mk).astype(bool), axis=1) / jnp.maximum(num, 1), 0)


def evorubric_scaled_consensus(rho_m: jax.Array, kept_mk: jax.Array, proposed_mk: jax.Array) -> jax.Array:
    """rho_tilde_m of eq 3 (evorubric.txt, section 3.4.1): rho_m times the proportion of batch m's proposed criteria
    that survived verification (|R_hat_m| / |R_m|, meta-verifier and variance filter). Empty proposal -> 0."""
    chex.assert_equal_shape([kept_mk, proposed_mk])
    return (rho_m * _share(kept_mk, proposed_mk)).astype(jnp.float32)


def evorubric_meta_reward(verified_mk: jax.Array, proposed_mk: jax.Array) -> jax.Array:
    """r_meta of eq 3: the meta-verifier's discrete bonus/penalty, +1 per proposed criterion judged VALID and -1
    per INVALID one, averaged over the proposal, in [-1, 1]. The paper gives no form; this one is scale-free in the
    number of criteria (p_num handles the count). Empty proposal (the generator's "embrace the empty list") -> 0."""
    chex.assert_equal_shape([verified_mk, proposed_mk])
    return (2 * _share(verified_mk, proposed_mk) - jnp.any(proposed_mk, axis=1)).astype(jnp.float32)


def evorubric_discriminative_reward(kept_mk: jax.Array, verified_mk: jax.Array) -> jax.Array:
    """r_disc of eq 3: the share of meta-verified criteria that split the responses (std > 0), in [0, 1]; the paper
    names it without a form. No verified criterion -> 0."""
    chex.assert_equal_shape([kept_mk, verified_mk])
    return _share(kept_mk, verified_mk).astype(jnp.float32)


def evorubric_generator_reward(
    rho_m: jax.Array,
    proposed_mk: jax.Array,
    verified_mk: jax.Array,
    kept_mk: jax.Array,
    num_penalty_m: jax.Array,
    length_penalty_m: jax.Array,
) -> jax.Array:
    """EvoRubric's rubric-generator reward (evorubric.txt, eq 3): rho_tilde + r_meta + r_disc - p_num - p_len, [M].

    rho_m from `evorubric_peer_consensus`; masks [M, K]: proposed (R_m), verified (passed the meta-verifier;
    R_tilde_m is verified & proposed), kept (R_hat_m, `zero_variance_prune` of R_tilde_m); penalties [M] >= 0,
    e.g. `rewards.excess_penalty` of the criteria count and of the generated text length. An empty proposal
    scores 0 - penalties.
    """
    chex.assert_rank([rho_m, num_penalty_m, length_penalty_m], 1)
    chex.assert_equal_shape([rho_m, num_penalty_m, length_penalty_m])
    verified = jnp.asarray(verified_mk).astype(bool) & jnp.asarray(proposed_mk).astype(bool)
    quality = (
        evorubric_scaled_consensus(rho_m, kept_mk, proposed_mk)
        + evorubric_meta_reward(verified, proposed_mk)
        + evorubric_discriminative_reward(kept_mk, verified)
    )
    return quality - num_penalty_m - length_penalty_m


def evorubric_reasoner_reward(
    satisfied_base_bk: jax.Array,
    points_base_bk: jax.Array,
    base_mask_bk: jax.Array,
    satisfied_pool_bj: jax.Array,
    points_pool_bj: jax.Array,
    pool_mask_bj: jax.Array,
    length_penalty_b: jax.Array,
) -> jax.Array:
    """EvoRubric's reasoner reward (evorubric.txt, eq 4), each source normalised on its own: S_base + S_pool - p_len,
    [B].

    S_base and S_pool are each the positive-points-normalised score (`rewards.positive_points_score`, the
    paper's section 3 normalisation) against the native rubric [.., K] and the memory pool [.., J] respectively;
    an empty (or penalty-only) source contributes 0. `length_penalty_b` >= 0 is subtracted. The sum lies in
    (-inf, 2] - p_len. One reading of eq 4; `evorubric_joint_reasoner_reward` is the other.
    """
    base = positive_points_score(satisfied_base_bk, points_base_bk, base_mask_bk)
    pool = positive_points_score(satisfied_pool_bj, points_pool_bj, pool_mask_bj)
    chex.assert_equal_shape([base, length_penalty_b])
    return base + pool - length_penalty_b


def evorubric_joint_reasoner_reward(
    satisfied_base_bk: jax.Array,
    points_base_bk: jax.Array,
    base_mask_bk: jax.Array,
    satisfied_pool_bj: jax.Array,
    points_pool_bj: jax.Array,
    pool_mask_bj: jax.Array,
    length_penalty_b: jax.Array,
) -> jax.Array:
    """EvoRubric's reasoner reward (evorubric.txt, eq 4) under one denominator: (x_base + x_pool) / (K_pos_base +
    K_pos_pool) - p_len, [B].

    x is a source's points of the met criteria, penalties included, K_pos its positive points: section 3's
    r = sum_k s_k / K_pos over the base rubric [.., K] and the memory pool [.., J] taken as one checklist (3.3.2
    step 2: "the denominator is strictly defined as the sum of maximum positive rubric points"). Each criterion
    weighs its points whichever source holds it, and a met penalty of a penalty-only pool still subtracts. When
    both sources have positive points the score is the K_pos-weighted mean of S_base and S_pool, so it lies
    between them and is at most 1. Degenerate: no positive points in either source -> 0 (the score of a
    checklist that rewards nothing). `length_penalty_b` >= 0 is subtracted.
    """
    chex.assert_rank([satisfied_base_bk, satisfied_pool_bj], 2)

    def joined(base, pool):  # per-item arrays may be [K] or [B, K], as `positive_points_score` takes them
        return jnp.concatenate([jnp.broadcast_to(as_stats_dtype(base), satisfied_base_bk.shape),
                                jnp.broadcast_to(as_stats_dtype(pool), satisfied_pool_bj.shape)], axis=1)

    score = positive_points_score(joined(satisfied_base_bk, satisfied_pool_bj), joined(points_base_bk, points_pool_bj),
                                  joined(base_mask_bk, pool_mask_bj) > 0)
    chex.assert_equal_shape([score, length_penalty_b])
    return score - length_penalty_b


# ---------------------------------------------------------------- DAPO and RGR-GRPO, over a batch of groups


def dapo_group_filter(
    values_b: jax.Array, group_ids: jax.Array, mask: Optional[jax.Array] = None, *, min_std: float = 0.0
) -> jax.Array:
    """DAPO dynamic-sampling filter (Yu et al. 2025, eq 11; rubric_grounded_rl.txt, Appendix C): keep [B] bool.

    A group is kept iff the population std of its valid rows' values exceeds `min_std` (0: any variation);
    the decision is per group (REFERENCE.md section 4, item 5) and every valid row of a group gets its group's
    decision. Masked rows take no part in the decision and are never kept. A group with one valid row has no
    variance and is dropped. `values_b` is whichever signal the recipe filters on (accuracy, reward).
    """
    chex.assert_rank(values_b, 1)
    valid = rows_mask(mask, values_b.shape[0])
    chex.assert_equal_shape([values_b, group_ids])
    stats = group_stats(values_b, group_ids, valid, std_ddof=0)
    return valid & (stats.std > min_std)


class ExplorationAssessment(NamedTuple):
    """RGR-GRPO exploration assessment, per row, about the row's group:
    best_index [B] int32: batch row of the group's best rollout (-1 when the group has no valid row);
    is_best [B] bool: this row is that rollout;
    solved [B] bool: the best rollout meets every criterion (no off-policy refinement needed);
    failed_bk [B, K] bool: C_failed of the group's best rollout (eq 8), the criteria to refine on."""

    best_index: jax.Array
    is_best: jax.Array
    solved: jax.Array
    failed_bk: jax.Array


def rgr_exploration_assessment(
    rewards_b: jax.Array,
    satisfied_bk: jax.Array,
    item_mask_bk: jax.Array,
    group_ids: jax.Array,
    mask: Optional[jax.Array] = None,
) -> ExplorationAssessment:
    """RGR-GRPO's exploration assessment (rgr_grpo.txt, section 2.3, step 1, eqs 7-8).

    o_best = argmax of the reward over the group's valid rollouts (pass the G - 1 on-policy rollouts as `mask`);
    ties go to the lowest batch row. The group is solved iff o_best meets (full credit) every existing criterion
    of its rubric; an empty rubric is solved (eq 7's condition holds vacuously and there is nothing to refine on).
    Degenerate: a group with no valid row has best_index -1, no best row, solved False and no failed criteria.
    """
    chex.assert_rank(rewards_b, 1)
    valid = rows_mask(mask, rewards_b.shape[0])
    chex.assert_rank([satisfied_bk, item_mask_bk], 2)
    chex.assert_equal_shape([satisfied_bk, item_mask_bk])
    chex.assert_equal_shape([rewards_b, group_ids])
    num_rows = rewards_b.shape[0]
    rewards = as_stats_dtype(rewards_b)
    ids = dense_segment_ids(group_ids)
    best_reward = jax.ops.segment_max(jnp.where(valid, rewards, -jnp.inf), ids, num_segments=num_rows)[ids]
    rows = jnp.arange(num_rows)
    candidate = valid & (rewards == best_reward)
    best = jax.ops.segment_min(jnp.where(candidate, rows, num_rows), ids, num_segments=num_rows)[ids]
    has_best = best < num_rows
    best_index = jnp.where(has_best, best, -1).astype(jnp.int32)
    failed = jnp.asarray(item_mask_bk).astype(bool) & ~(satisfied_bk.astype(jnp.float32) >= 1)
    best_failed = jnp.where(has_best[:, None], failed[jnp.clip(best, 0, num_rows - 1)], False)
    return ExplorationAssessment(
        best_index=best_index,
        is_best=rows == best_index,
        solved=has_best & ~jnp.any(best_failed, axis=1),
        failed_bk=best_failed,
    )
