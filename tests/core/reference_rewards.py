"""Slow, obviously-correct NumPy references for rubric_jax.core.rewards and rubric_jax.core.rubric_validity.

Each function transcribes its paper's equation with plain Python loops over rollouts, items, groups and
batches, in float64, with the degenerate cases decided the way the JAX docstrings state. Inputs are per-row
arrays: weights / points / masks must already be [B, K] (no [K] broadcasting here).
"""

import math

from tests.core.reference_advantages import group_members


def _f(x):
    return float(x)


# ---------------------------------------------------------------- rewards.py


def weighted_fraction(satisfied, weights, item_mask):
    out = []
    for b in range(len(satisfied)):
        num = den = 0.0
        for k in range(len(satisfied[b])):
            if item_mask[b][k]:
                w = max(_f(weights[b][k]), 0.0)
                num += w * _f(satisfied[b][k])
                den += w
        out.append(num / den if den > 0 else 0.0)
    return out


def positive_points_score(satisfied, points, item_mask):
    out = []
    for b in range(len(satisfied)):
        earned = positive = 0.0
        for k in range(len(satisfied[b])):
            if item_mask[b][k]:
                earned += _f(points[b][k]) * _f(satisfied[b][k])
                positive += max(_f(points[b][k]), 0.0)
        out.append(earned / positive if positive > 0 else 0.0)
    return out


def min_max_score(satisfied, points, item_mask):
    out = []
    for b in range(len(satisfied)):
        x = lowest = highest = 0.0
        for k in range(len(satisfied[b])):
            if item_mask[b][k]:
                p = _f(points[b][k])
                x += p * _f(satisfied[b][k])
                lowest += min(p, 0.0)
                highest += max(p, 0.0)
        out.append((x - lowest) / (highest - lowest) if highest > lowest else 0.0)
    return out


def rgr_factual_gated_reward(satisfied, weights, factual, item_mask):
    fraction = weighted_fraction(satisfied, weights, item_mask)
    out = []
    for b in range(len(satisfied)):
        facts = [k for k in range(len(satisfied[b])) if item_mask[b][k] and factual[b][k]]
        gate = len(facts) > 0 and all(_f(satisfied[b][k]) >= 1 for k in facts)
        out.append(1.0 if gate else fraction[b])
    return out


def dapo_overlong_shaping(rewards, lengths, max_length, buffer_length, factor=1.0):
    out = []
    for r, length in zip(rewards, lengths):
        length = _f(length)
        if length > max_length:
            penalty = factor
        elif length > max_length - buffer_length:
            penalty = factor * (length - (max_length - buffer_length)) / buffer_length
        else:
            penalty = 0.0
        out.append(_f(r) - penalty)
    return out


# ---------------------------------------------------------------- rubric_validity.py


def pearson(x, y, mask):
    """(value, defined) over the columns where mask holds."""
    xs = [_f(x[n]) for n in range(len(x)) if mask[n]]
    ys = [_f(y[n]) for n in range(len(y)) if mask[n]]
    if len(xs) < 2 or all(v == xs[0] for v in xs) or all(v == ys[0] for v in ys):
        return 0.0, False
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((a - mx) * (b - my) for a, b in zip(xs, ys))
    sxx = sum((a - mx) ** 2 for a in xs)
    syy = sum((b - my) ** 2 for b in ys)
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy))), True


def _rubric_rollouts(rollout_mask, k):
    """Rubric k's rollout mask: rollout_mask is [N] (every rubric alike) or [K][N] (per verdict)."""
    row = rollout_mask[k]
    return row if hasattr(row, "__len__") else rollout_mask


def rlcer_rubric_validity(v_kn, z_n, rubric_mask, rollout_mask, alpha=0.2):
    out = []
    for k in range(len(v_kn)):
        value, defined = pearson(v_kn[k], z_n, _rubric_rollouts(rollout_mask, k))
        out.append(bool(rubric_mask[k]) and defined and value > alpha)
    return out


def rlcer_sign_aware_validity(v_kn, z_n, points_k, rubric_mask, rollout_mask, alpha=0.2):
    """Eq 7 with a penalty rubric (points < 0) judged by the absence of its flaw: corr(1 - v_k, z) > alpha."""
    out = []
    for k in range(len(v_kn)):
        u = [1.0 - _f(v) if _f(points_k[k]) < 0 else _f(v) for v in v_kn[k]]
        value, defined = pearson(u, z_n, _rubric_rollouts(rollout_mask, k))
        out.append(bool(rubric_mask[k]) and defined and value > alpha)
    return out


def rlcer_cot_reward(v_kn, points_k, valid_k, known_kn):
    """Eq 6 for each rollout n over the valid rubrics whose verdict on n is known (known_kn [K][N])."""
    out = []
    for n in range(len(v_kn[0])):
        x = lowest = highest = 0.0
        for k in range(len(v_kn)):
            if valid_k[k] and known_kn[k][n]:
                x += _f(points_k[k]) * _f(v_kn[k][n])
                lowest += min(_f(points_k[k]), 0.0)
                highest += max(_f(points_k[k]), 0.0)
        out.append((x - lowest) / (highest - lowest) if highest > lowest else 0.0)
    return out


def rlcer_valid_fraction(valid, rubric_mask):
    proposed = [k for k in range(len(valid)) if rubric_mask[k]]
    return sum(1 for k in proposed if valid[k]) / len(proposed) if proposed else 0.0


def rlcer_reasoner_reward(correct_n, v_kn, points_k, valid_k):
    """Eq 9 = eq 8 + eq 6, for each of the N rollouts."""
    out = []
    for n in range(len(correct_n)):
        x = lowest = highest = 0.0
        for k in range(len(v_kn)):
            if valid_k[k]:
                x += _f(points_k[k]) * _f(v_kn[k][n])
                lowest += min(_f(points_k[k]), 0.0)
                highest += max(_f(points_k[k]), 0.0)
        cot = (x - lowest) / (highest - lowest) if highest > lowest else 0.0
        out.append((1.0 if correct_n[n] else -1.0) + cot)
    return out


def evorubric_generator_rewards(scores_mkn, proposed, verified, response_mask, num_penalty, length_penalty):
    """Section 3.3.2 steps 3-4 and eq 3, batch by batch. Returns (kept [M][K], rho [M], reward [M])."""
    num_batches, num_items, num_responses = len(scores_mkn), len(scores_mkn[0]), len(scores_mkn[0][0])
    kept, vectors = [], []
    for m in range(num_batches):
        kept.append([])
        for k in range(num_items):
            column = [_f(scores_mkn[m][k][n]) for n in range(num_responses) if response_mask[n]]
            varies = len(column) > 1 and any(s != column[0] for s in column)
            kept[m].append(bool(proposed[m][k] and verified[m][k]) and varies)
        rules = [k for k in range(num_items) if kept[m][k]]
        vectors.append(
            [sum(_f(scores_mkn[m][k][n]) for k in rules) / len(rules) for n in range(num_responses)] if rules else None
        )
    rho, reward = [], []
    for m in range(num_batches):
        peers = [j for j in range(num_batches) if j != m and vectors[j] is not None]
        value = 0.0
        if vectors[m] is not None and peers:
            peer = [sum(vectors[j][n] for j in peers) / len(peers) for n in range(num_responses)]
            value = pearson(vectors[m], peer, response_mask)[0]
        rho.append(value)
        n_proposed = sum(1 for k in range(num_items) if proposed[m][k])
        n_verified = sum(1 for k in range(num_items) if proposed[m][k] and verified[m][k])
        n_kept = sum(kept[m])
        scaled = value * n_kept / n_proposed if n_proposed else 0.0
        meta = (n_verified - (n_proposed - n_verified)) / n_proposed if n_proposed else 0.0
        disc = n_kept / n_verified if n_verified else 0.0
        reward.append(scaled + meta + disc - _f(num_penalty[m]) - _f(length_penalty[m]))
    return kept, rho, reward


def evorubric_reasoner_rewards(satisfied_base, points_base, base_mask, satisfied_pool, points_pool, pool_mask,
                               length_penalty, normalisation):
    """Eq 4 row by row: "separate", S_base + S_pool with each source's own positive points as its denominator;
    "joint", every met criterion's points of both sources over the positive points of both. Minus p_len."""
    out = []
    for b in range(len(length_penalty)):
        earned, positive = [0.0, 0.0], [0.0, 0.0]
        for source, (satisfied, points, mask) in enumerate(((satisfied_base, points_base, base_mask),
                                                           (satisfied_pool, points_pool, pool_mask))):
            for k in range(len(satisfied[b])):
                if mask[b][k]:
                    earned[source] += _f(points[b][k]) * _f(satisfied[b][k])
                    positive[source] += max(_f(points[b][k]), 0.0)
        if normalisation == "joint":
            total = sum(positive)
            score = sum(earned) / total if total > 0 else 0.0
        else:
            score = sum(e / p if p > 0 else 0.0 for e, p in zip(earned, positive))
        out.append(score - _f(length_penalty[b]))
    return out


def dapo_group_filter(values, group_ids, valid, min_std=0.0):
    groups = group_members(group_ids, valid)
    keep = []
    for i in range(len(values)):
        if not valid[i]:
            keep.append(False)
            continue
        members = [_f(values[j]) for j in groups[int(group_ids[i])]]
        mean = sum(members) / len(members)
        spread = sum((v - mean) ** 2 for v in members) / len(members)
        std = 0.0 if all(v == members[0] for v in members) else math.sqrt(spread)
        keep.append(std > min_std)
    return keep


def rgr_exploration_assessment(rewards, satisfied, item_mask, group_ids, valid):
    """Eqs 7-8 per row: (best_index, is_best, solved, failed items)."""
    groups = group_members(group_ids, valid)
    out = []
    for i in range(len(rewards)):
        rows = groups.get(int(group_ids[i]), [])
        if not rows:
            out.append((-1, False, False, [False] * len(satisfied[i])))
            continue
        best = rows[0]
        for j in rows[1:]:  # rows ascend, and only a strictly larger reward displaces: ties keep the lowest row
            if _f(rewards[j]) > _f(rewards[best]):
                best = j
        failed = [bool(item_mask[best][k]) and _f(satisfied[best][k]) < 1 for k in range(len(satisfied[best]))]
        out.append((best, i == best, not any(failed), failed))
    return out
