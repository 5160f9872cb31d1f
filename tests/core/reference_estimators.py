"""Slow, obviously-correct NumPy references for the estimators verl has beyond GRPO/RLOO: GRPO pass@k, OPO,
ReMax and GPG (plain loops, float64), each transcribing its equation as written in the docstring of its
rubric_jax.core.advantages function, so that the vectorised JAX code can be compared with it on random batches.
"""

import statistics

import numpy as np

from tests.core.reference_advantages import group_members


def _group_std(values, std_ddof):
    if len(values) <= std_ddof:
        return 0.0
    return statistics.stdev(values) if std_ddof == 1 else statistics.pstdev(values)


def scale_by_group_std(advantages, rewards, group_ids, valid, std_ddof=1, eps=1e-6):
    """A_i / (std of the valid rewards of i's group + eps); 0 where they all tie and on invalid rows."""
    groups = group_members(group_ids, valid)
    out = np.zeros(len(rewards))
    for i in range(len(rewards)):
        if not valid[i]:
            continue
        group = [float(rewards[j]) for j in groups[int(group_ids[i])]]
        if any(r != group[0] for r in group):
            out[i] = advantages[i] / (_group_std(group, std_ddof) + eps)
    return out


def pass_at_k(rewards, group_ids, valid):
    """A_i = max_j r_j - max_{j != i} r_j over the valid rows of i's group; 0 with no other valid row."""
    groups = group_members(group_ids, valid)
    out = np.zeros(len(rewards))
    for i in range(len(rewards)):
        if not valid[i]:
            continue
        members = groups[int(group_ids[i])]
        others = [float(rewards[j]) for j in members if j != i]
        if others:
            out[i] = max(float(rewards[j]) for j in members) - max(others)
    return out


def opo(rewards, lengths, group_ids, valid):
    """A_i = r_i - sum_j l_j r_j / sum_j l_j over the valid rows of i's group; 0 where the lengths sum to 0."""
    groups = group_members(group_ids, valid)
    out = np.zeros(len(rewards))
    for i in range(len(rewards)):
        if not valid[i]:
            continue
        members = groups[int(group_ids[i])]
        total = sum(float(lengths[j]) for j in members)
        if total > 0:
            baseline = sum(float(lengths[j]) * float(rewards[j]) for j in members) / total
            out[i] = float(rewards[i]) - baseline
    return out


def remax(rewards, baseline_rewards, valid):
    """A_i = r_i - r_greedy of i's prompt; 0 on invalid rows."""
    return np.array([float(rewards[i]) - float(baseline_rewards[i]) if valid[i] else 0.0 for i in range(len(rewards))])


def gpg_alpha(rewards, group_ids, valid):
    """B / (B - M): valid rows over valid rows of groups whose valid rewards do not all tie; 1 when none."""
    groups = group_members(group_ids, valid)
    batch = sum(1 for i in range(len(rewards)) if valid[i])
    informative = 0
    for members in groups.values():
        values = [float(rewards[j]) for j in members]
        if any(v != values[0] for v in values):
            informative += len(members)
    return batch / informative if informative else 1.0


def gpg(rewards, group_ids, valid):
    """A_i = alpha (r_i - mean of the valid rewards of i's group); 0 on invalid rows."""
    groups = group_members(group_ids, valid)
    alpha = gpg_alpha(rewards, group_ids, valid)
    out = np.zeros(len(rewards))
    for i in range(len(rewards)):
        if valid[i]:
            group = [float(rewards[j]) for j in groups[int(group_ids[i])]]
            out[i] = alpha * (float(rewards[i]) - sum(group) / len(group))
    return out
