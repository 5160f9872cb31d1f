"""Slow, obviously-correct NumPy references for the advantage estimators and SRaR (plain loops, float64).

Each function transcribes its equation with Python loops over rollouts, groups, steps and tokens, so that the
vectorised JAX code can be compared with it on random batches. Conventions match rubric_jax.core (see there).
"""

import numpy as np

SUGGEST, PITFALL, BONUS, ANSWER = 0, 1, 2, 3


def _std(values, ddof):
    values = [float(v) for v in values]
    if len(values) <= ddof:
        return 0.0
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - ddof)) ** 0.5


def group_members(group_ids, valid):
    """{group id: [valid rows of that group]}."""
    groups = {}
    for j in range(len(group_ids)):
        if valid[j]:
            groups.setdefault(int(group_ids[j]), []).append(j)
    return groups


def grpo(rewards, group_ids, valid, std_ddof=1, eps=1e-6):
    rewards = np.asarray(rewards, np.float64)
    groups = group_members(group_ids, valid)
    out = np.zeros(len(rewards))
    for i in range(len(rewards)):
        if not valid[i]:
            continue
        group = [float(rewards[j]) for j in groups[int(group_ids[i])]]
        mean = sum(group) / len(group)
        if all(r == group[0] for r in group):
            continue  # a tie gives exactly 0
        out[i] = (rewards[i] - mean) / (_std(group, std_ddof) + eps)
    return out


def dr_grpo(rewards, group_ids, valid):
    rewards = np.asarray(rewards, np.float64)
    groups = group_members(group_ids, valid)
    out = np.zeros(len(rewards))
    for i in range(len(rewards)):
        if valid[i]:
            group = [float(rewards[j]) for j in groups[int(group_ids[i])]]
            out[i] = rewards[i] - sum(group) / len(group)
    return out


def batch_std(rewards, group_ids, valid, std_ddof=1, eps=1e-6):
    everything = [float(rewards[j]) for j in range(len(rewards)) if valid[j]]
    scale = _std(everything, std_ddof) + eps
    return dr_grpo(rewards, group_ids, valid) / scale


def rloo(rewards, group_ids, valid):
    rewards = np.asarray(rewards, np.float64)
    groups = group_members(group_ids, valid)
    out = np.zeros(len(rewards))
    for i in range(len(rewards)):
        others = [float(rewards[j]) for j in groups.get(int(group_ids[i]), []) if j != i]
        if valid[i] and others:
            out[i] = rewards[i] - sum(others) / len(others)
    return out


def loo_std(rewards, group_ids, valid, std_ddof=1, eps=1e-6):
    rewards = np.asarray(rewards, np.float64)
    groups = group_members(group_ids, valid)
    out = np.zeros(len(rewards))
    for i in range(len(rewards)):
        others = [float(rewards[j]) for j in groups.get(int(group_ids[i]), []) if j != i]
        if not (valid[i] and others):
            continue
        baseline = sum(others) / len(others)
        spread = 0.0 if all(o == others[0] for o in others) else _std(others, std_ddof)
        out[i] = (rewards[i] - baseline) / (spread + eps) if spread > 0 else rewards[i] - baseline
    return out


def reinforce_pp_baseline(rewards, group_ids, response_mask, valid, std_ddof=1, eps=1e-8):
    centred = dr_grpo(rewards, group_ids, valid)
    tokens = []
    for b in range(response_mask.shape[0]):
        for t in range(response_mask.shape[1]):
            if valid[b] and response_mask[b, t]:
                tokens.append(centred[b])
    mean = sum(tokens) / max(len(tokens), 1)
    spread = 0.0 if all(v == tokens[0] for v in tokens) else _std(tokens, std_ddof)
    out = np.zeros(response_mask.shape)
    for b in range(response_mask.shape[0]):
        for t in range(response_mask.shape[1]):
            if valid[b] and response_mask[b, t]:
                out[b, t] = (centred[b] - mean) / (spread + eps)
    return out


def normalize_then_sum(rewards_bm, weights, group_ids, valid, std_ddof=1, eps=1e-6):
    rewards_bm = np.asarray(rewards_bm, np.float64)
    summed = np.zeros(rewards_bm.shape[0])
    for m in range(rewards_bm.shape[1]):
        summed += weights[m] * grpo(rewards_bm[:, m], group_ids, valid, std_ddof, eps)
    kept = [summed[i] for i in range(len(summed)) if valid[i]]
    mean = sum(kept) / len(kept)
    spread = 0.0 if all(v == kept[0] for v in kept) else _std(kept, std_ddof)
    return np.array([(summed[i] - mean) / (spread + eps) if valid[i] else 0.0 for i in range(len(summed))])


def srar_item_deltas(satisfied, item_type, item_mask, budgets=(0.8, -1.0, 1.0)):
    """Eq 3: delta_j per item, and whether the item carries a delta."""
    signed = {SUGGEST: abs(budgets[0]), PITFALL: -abs(budgets[1]), BONUS: abs(budgets[2])}
    num_rows, num_items = satisfied.shape
    delta = np.zeros((num_rows, num_items))
    carries = np.zeros((num_rows, num_items), bool)
    for b in range(num_rows):
        for j in range(num_items):
            kind = int(item_type[b, j])
            if item_mask[b, j] and satisfied[b, j] and kind in signed:
                n_type = sum(1 for q in range(num_items) if item_mask[b, q] and item_type[b, q] == kind)
                delta[b, j] = np.float32(signed[kind]) / np.float32(n_type)
                carries[b, j] = True
    return delta, carries


def srar_step_deltas(satisfied, item_type, item_mask, item_step, budgets=(0.8, -1.0, 1.0), judged=None):
    """Algorithm 1, line 9: per rollout, {step as judged: summed delta}, whatever the step's value. Keys (the
    rollout's step groups): with `judged` None the steps of its delta-bearing items (the authors'
    `compute_rubric_deltas`); with `judged` [B] bool, the paper's eq 4, the step of every existing item of a judged
    rollout, satisfied or not (its value the sum of the deltas there, 0 when none is satisfied)."""
    delta, carries = srar_item_deltas(satisfied, item_type, item_mask, budgets)
    step_deltas = [dict() for _ in range(satisfied.shape[0])]
    for b in range(satisfied.shape[0]):
        for j in range(satisfied.shape[1]):
            member = carries[b, j] if judged is None else bool(item_mask[b, j]) and bool(judged[b])
            if member:
                k = int(item_step[b, j])
                step_deltas[b][k] = step_deltas[b].get(k, 0.0) + delta[b, j]
    return step_deltas


def srar_placed_tokens(k, num_steps, step_ids_t, response_mask_t):
    """The tokens step k's value goes to, as the authors' `compute_srar_advantage` places it: 0 the whole
    response, -1 none, 1..num_steps that step's tokens, anything else the whole response (their fallback)."""
    if k == -1:
        return []
    if 1 <= k <= num_steps:
        return [t for t in range(len(step_ids_t)) if response_mask_t[t] and step_ids_t[t] == k]
    return [t for t in range(len(step_ids_t)) if response_mask_t[t]]


def srar_advantages(base, group_ids, satisfied, item_type, item_mask, item_step, num_steps, step_ids, response_mask,
                    valid, std_ddof=1, eps=1e-6, budgets=(0.8, -1.0, 1.0), judged=None):
    """Algorithm 1 as the authors' `compute_srar_advantage`: GRPO outcome advantage on every response token, plus
    each step's d_bar, normalised over the group's rollouts that have a delta at that step (or, given `judged`,
    the paper's G_k: those with an item attributed to it, `srar_step_deltas`), added on the tokens
    `srar_placed_tokens` names."""
    num_rows, num_tokens = response_mask.shape
    step_deltas = srar_step_deltas(satisfied, item_type, item_mask, item_step, budgets, judged)
    offset = np.zeros((num_rows, num_tokens))
    for members in group_members(group_ids, valid).values():
        steps = sorted({k for b in members for k in step_deltas[b]})
        for k in steps:
            in_step = [b for b in members if k in step_deltas[b]]
            if len(in_step) <= 1:
                continue
            values = [step_deltas[b][k] for b in in_step]
            spread = _std(values, std_ddof)
            for b, d in zip(in_step, values):
                normalised = (d - sum(values) / len(values)) / (spread + eps) if spread > eps else 0.0
                for t in srar_placed_tokens(k, int(num_steps[b]), step_ids[b], response_mask[b]):
                    offset[b, t] += normalised
    outcome = grpo(np.asarray(base, np.float64), group_ids, valid, std_ddof, eps)
    out = np.zeros((num_rows, num_tokens))
    for b in range(num_rows):
        for t in range(num_tokens):
            if valid[b] and response_mask[b, t]:
                out[b, t] = outcome[b] + offset[b, t]
    return out


def srar_merged(base, group_ids, satisfied, item_type, item_mask, item_step, num_steps, step_ids, response_mask,
                valid, std_ddof=1, eps=1e-6, budgets=(0.8, -1.0, 1.0)):
    """Merged RaR-style ablation: one scalar (r_base + sum of deltas), GRPO, on the tokens where the decoupled
    advantage places rubric scores (`srar_placed_tokens`); on every response token when they reach none."""
    num_rows, num_tokens = response_mask.shape
    delta, _ = srar_item_deltas(satisfied, item_type, item_mask, budgets)
    step_deltas = srar_step_deltas(satisfied, item_type, item_mask, item_step, budgets)
    # The scalar is formed in float32, as the estimator's contract says; in float64, sums that tie in exact
    # arithmetic (0.1 + 0.4 vs 0.9 - 0.4) would differ from float32's by an ulp that 1 / (std + eps) amplifies.
    merged = np.zeros(num_rows, np.float32)
    for b in range(num_rows):
        total = np.float32(0.0)
        for j in range(delta.shape[1]):
            total = np.float32(total + np.float32(delta[b, j]))
        merged[b] = np.float32(np.float32(base[b]) + total)
    advantage = grpo(merged, group_ids, valid, std_ddof, eps)
    out = np.zeros((num_rows, num_tokens))
    for b in range(num_rows):
        scored = set()
        for k in step_deltas[b]:
            scored.update(srar_placed_tokens(k, int(num_steps[b]), step_ids[b], response_mask[b]))
        for t in range(num_tokens):
            if valid[b] and response_mask[b, t] and (not scored or t in scored):
                out[b, t] = advantage[b]
    return out
