"""Slow NumPy references for rubric_jax.core.value: plain Python loops in float64 that transcribe verl's
`compute_gae_advantage_return`, `compute_value_loss` and `masked_whiten` (verl/trainer/ppo/core_algos.py,
verl/utils/torch_functional.py) token by token, and random batches that exercise their masks.

verl's GAE loop, per row, t from T - 1 down to 0:
    delta     = r[t] + gamma * nextvalues - v[t]
    lastgaelam_ = delta + gamma * lam * lastgaelam
    nextvalues = v[t] if mask[t] else nextvalues
    lastgaelam = lastgaelam_ if mask[t] else lastgaelam
    advantages[t] = lastgaelam
returns = advantages + values; verl's values are 0 off the mask (its critic multiplies them by the mask). Our
outputs are 0 off the mask, so the reference reports verl's numbers there as they are and the tests compare
on the mask (and check zeros off it separately).
"""

from typing import NamedTuple

import numpy as np


class ValueBatch(NamedTuple):
    rewards: np.ndarray  # [B, T] float32 token rewards, garbage off the mask
    values: np.ndarray  # [B, T] float32 old values, garbage off the mask
    new_values: np.ndarray  # [B, T] float32 the critic being trained
    returns: np.ndarray  # [B, T] float32
    mask: np.ndarray  # [B, T] bool


def verl_gae(rewards, values, mask, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """verl's loop (module docstring), in float64; values off the mask are taken as 0 (verl's critic output)."""
    rewards = np.asarray(rewards, np.float64)
    values = np.where(mask, np.asarray(values, np.float64), 0.0)
    num_rows, length = rewards.shape
    advantages = np.zeros((num_rows, length))
    for b in range(num_rows):
        next_value, last_gae = 0.0, 0.0
        for t in reversed(range(length)):
            reward = rewards[b, t] if mask[b, t] else 0.0  # verl's delta off the mask is discarded anyway
            delta = reward + gamma * next_value - values[b, t]
            gae = delta + gamma * lam * last_gae
            if mask[b, t]:
                next_value, last_gae = values[b, t], gae
            advantages[b, t] = last_gae
    return advantages, advantages + values


def verl_value_loss(new_values, old_values, returns, mask, clip: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-token 0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2) and whether the clipped error is the
    strictly larger, on valid tokens (0 / False elsewhere)."""
    num_rows, length = mask.shape
    loss, clipped = np.zeros((num_rows, length)), np.zeros((num_rows, length), bool)
    for b in range(num_rows):
        for t in range(length):
            if not mask[b, t]:
                continue
            v, v_old, r = float(new_values[b, t]), float(old_values[b, t]), float(returns[b, t])
            v_clipped = max(min(v, v_old + clip), v_old - clip)
            unclipped_error, clipped_error = (v - r) ** 2, (v_clipped - r) ** 2
            loss[b, t] = 0.5 * max(unclipped_error, clipped_error)
            clipped[b, t] = clipped_error > unclipped_error
    return loss, clipped


def verl_whiten(x, mask) -> np.ndarray:
    """verl's masked_whiten: (x - mean) * rsqrt(var + 1e-8), unbiased var over the valid tokens; 0 off the mask
    here (verl leaves the whitened garbage there)."""
    valid = [float(x[b, t]) for b in range(x.shape[0]) for t in range(x.shape[1]) if mask[b, t]]
    mean = sum(valid) / len(valid)
    var = sum((v - mean) ** 2 for v in valid) / (len(valid) - 1)
    return np.where(mask, (np.asarray(x, np.float64) - mean) / np.sqrt(var + 1e-8), 0.0)


def verl_whiten_by_group(x, mask, group_ids) -> np.ndarray:
    """`verl_whiten` applied to each group's rows on its own (RLCER's per-role whitening); a group with fewer than
    two valid tokens has no unbiased variance and gets 0."""
    out = np.zeros(mask.shape)
    for group in set(group_ids):
        rows = np.array([[g == group] for g in group_ids])
        if (mask & rows).sum() >= 2:
            out += verl_whiten(x, mask & rows)
    return out


def last_token(rewards_b, mask) -> np.ndarray:
    """r_b on row b's last valid token, 0 elsewhere (nothing for a row without valid tokens)."""
    out = np.zeros(mask.shape)
    for b in range(mask.shape[0]):
        valid = [t for t in range(mask.shape[1]) if mask[b, t]]
        if valid:
            out[b, valid[-1]] = rewards_b[b]
    return out


def random_value_batch(rng: np.random.RandomState, num_rows: int = 6, num_tokens: int = 9) -> ValueBatch:
    """Rows laid out as the trainer packs them: a left-padded prompt region of random width (masked), a response of
    random length (some empty, one full), gaps inside some responses, padding rows; rewards on the last token
    or on every token; old values of any sign; a new critic near or far from the old one (so the clip is hit
    both ways); NaN / inf / huge garbage off the mask."""
    shape = (num_rows, num_tokens)
    prompt = rng.randint(0, num_tokens // 2, num_rows)
    lengths = np.array([rng.randint(0, num_tokens - p + 1) for p in prompt])
    lengths[rng.randint(num_rows)] = num_tokens - prompt.min()
    prompt[lengths == num_tokens - prompt.min()] = prompt.min()
    columns = np.arange(num_tokens)[None, :]
    mask = (columns >= prompt[:, None]) & (columns < (prompt + lengths)[:, None])
    mask &= ~((rng.rand(*shape) < 0.15) & (rng.rand(num_rows, 1) < 0.3))

    rewards = np.zeros(shape)
    for b in range(num_rows):
        if rng.rand() < 0.5:
            rewards[b] = last_token([rng.normal()], mask[b:b + 1])[0]
        else:
            rewards[b] = rng.normal(0, 0.5, num_tokens)
    values = rng.normal(0, 1.0, shape)
    new_values = values + rng.normal(0, 1.0, shape) * rng.choice([0.05, 1.0], (num_rows, 1))
    returns = values + rng.normal(0, 1.0, shape)

    def garbage(x):
        junk = rng.choice([np.nan, np.inf, -np.inf, 1e30], shape)
        return np.where(mask | (rng.rand(*shape) < 0.5), x, junk).astype(np.float32)

    return ValueBatch(garbage(rewards), garbage(values), garbage(new_values), garbage(returns), mask)
