"""Random fixed-shape batches of rollouts for comparing the JAX core with the NumPy references.

Shapes stay fixed across draws (one compilation per test); the content varies: ragged groups with arbitrary
ids, single-sample groups, masked rows, tied and near-tied rewards, empty responses, empty rubrics, items
at steps -1 and 0 and beyond the response's last step, tokens before the first step header.
"""

from typing import NamedTuple

import numpy as np


class RolloutBatch(NamedTuple):
    rewards: np.ndarray  # [B] float32
    group_ids: np.ndarray  # [B] int32, arbitrary values
    valid: np.ndarray  # [B] bool
    response_mask: np.ndarray  # [B, T] bool
    step_ids: np.ndarray  # [B, T] int32
    satisfied: np.ndarray  # [B, K] bool
    item_type: np.ndarray  # [B, K] int32
    item_mask: np.ndarray  # [B, K] bool
    item_step: np.ndarray  # [B, K] int32


def random_group_ids(rng: np.random.Generator, num_rows: int) -> np.ndarray:
    """Ragged groups (sizes 1..6, shuffled) with arbitrary, non-contiguous id values."""
    sizes = []
    while sum(sizes) < num_rows:
        sizes.append(int(rng.integers(1, 7)))
    labels = np.repeat(np.arange(len(sizes)), sizes)[:num_rows]
    id_values = rng.choice(10_000, size=len(sizes), replace=False)
    return id_values[rng.permutation(labels)].astype(np.int32)


def random_rewards(rng: np.random.Generator, num_rows: int) -> np.ndarray:
    """Binary, tied, near-tied (one ulp apart) or continuous rewards."""
    kind = rng.integers(4)
    if kind == 0:
        return rng.integers(0, 2, num_rows).astype(np.float32)
    if kind == 1:
        return rng.choice(np.array([0.35, 0.35, 0.35, 1.0], np.float32), num_rows)
    if kind == 2:
        base = np.float32(0.5)
        return np.where(rng.random(num_rows) < 0.5, base, np.nextafter(base, np.float32(1))).astype(np.float32)
    return rng.normal(size=num_rows).astype(np.float32)


def random_rollouts(
    rng: np.random.Generator, num_rows: int = 12, num_tokens: int = 24, num_items: int = 6, max_steps: int = 4
) -> RolloutBatch:
    valid = rng.random(num_rows) < 0.85
    lengths = rng.integers(0, num_tokens + 1, num_rows)  # 0 = an empty response
    response_mask = np.arange(num_tokens)[None, :] < lengths[:, None]
    step_ids = np.zeros((num_rows, num_tokens), np.int32)
    for b in range(num_rows):
        num_steps = int(rng.integers(0, max_steps + 2))  # items are drawn from [-2, max_steps + 2]
        if num_steps and lengths[b]:
            starts = np.sort(rng.choice(np.arange(lengths[b]), size=min(num_steps, lengths[b]), replace=False))
            for k, start in enumerate(starts, start=1):
                step_ids[b, start:lengths[b]] = k
    empty_rubric = rng.random(num_rows) < 0.15
    item_mask = (rng.random((num_rows, num_items)) < 0.8) & ~empty_rubric[:, None]
    return RolloutBatch(
        rewards=random_rewards(rng, num_rows),
        group_ids=random_group_ids(rng, num_rows),
        valid=valid,
        response_mask=response_mask,
        step_ids=step_ids,
        satisfied=rng.random((num_rows, num_items)) < 0.5,
        item_type=rng.integers(0, 4, (num_rows, num_items)).astype(np.int32),
        item_mask=item_mask,
        item_step=rng.integers(-2, max_steps + 3, (num_rows, num_items)).astype(np.int32),
    )
