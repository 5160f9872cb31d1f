"""The recipes' shared host-side helpers: summary statistics of a batch, by hand and against NumPy; merging the
rows of batches with different prompt and response widths; the trainer's row padding."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.algorithms.base import concat_batches, summary_stats
from rubric_jax.models.train_step import pack_sequences
from rubric_jax.training.rl import pad_rows


def numpy_stats(name: str, selected: np.ndarray) -> dict:
    return {f"{name}/mean": selected.mean(), f"{name}/std": selected.std(), f"{name}/min": selected.min(),
            f"{name}/max": selected.max()}


def test_summary_stats_by_hand_with_and_without_mask():
    values = jnp.asarray([[1.0, 2.0, 3.0], [4.0, 100.0, 6.0]])
    assert summary_stats("reward", values) == pytest.approx(
        {"reward/mean": 116 / 6, "reward/std": float(np.std([1, 2, 3, 4, 100, 6])), "reward/min": 1.0,
         "reward/max": 100.0}
    )
    mask = [[True, False, True], [False, False, True]]
    stats = summary_stats("reward", values, mask)
    assert stats == pytest.approx({"reward/mean": 10 / 3, "reward/std": math.sqrt(38 / 9), "reward/min": 1.0,
                                   "reward/max": 6.0})
    assert all(type(v) is float for v in stats.values())


def test_summary_stats_of_nothing_is_empty_and_shapes_must_match():
    assert summary_stats("x", [1.0, 2.0], [False, False]) == {}
    assert summary_stats("x", []) == {}
    with pytest.raises(ValueError, match="shape"):
        summary_stats("x", [1.0, 2.0], [True])


@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.booleans()), min_size=1, max_size=40))
def test_summary_stats_matches_numpy(pairs):
    values = np.array([v for v, _ in pairs])
    mask = np.array([m for _, m in pairs])
    assert summary_stats("v", values) == pytest.approx(numpy_stats("v", values), rel=1e-9, abs=1e-9)
    expected = numpy_stats("v", values[mask]) if mask.any() else {}
    assert summary_stats("v", values, mask) == pytest.approx(expected, rel=1e-9, abs=1e-9)


def packed(prompts, responses, prompt_width, response_width, pad_id=0):
    batch = pack_sequences(prompts, responses, pad_id=pad_id, prompt_width=prompt_width,
                           response_width=response_width)
    batch["advantages_bt"] = np.where(batch["response_mask_bt"], 1.0 + np.arange(len(prompts))[:, None], 0.0)
    batch["reward"] = np.arange(len(prompts), dtype=np.float32)
    return batch


def test_concat_batches_equals_packing_every_row_at_the_common_widths():
    short = ([[5, 6]], [[7, 8, 9]])
    long = ([[5, 6, 7, 8, 9], [3]], [[4], [4, 4, 4, 4, 4, 4]])
    merged, width = concat_batches([(packed(*short, 2, 3), 2), (packed(*long, 5, 6), 5)], pad_id=0)
    assert width == 5
    direct = pack_sequences(short[0] + long[0], short[1] + long[1], pad_id=0, prompt_width=5, response_width=6)
    for key, value in direct.items():
        np.testing.assert_array_equal(merged[key], value, err_msg=key)
    # Per-token extras move with their tokens; per-row arrays are concatenated as they are.
    np.testing.assert_array_equal(merged["advantages_bt"][merged["response_mask_bt"]], [1, 1, 1] + [1] + [2] * 6)
    np.testing.assert_array_equal(merged["advantages_bt"][~merged["response_mask_bt"]], 0)
    np.testing.assert_array_equal(merged["reward"], [0, 0, 1])


def test_concat_batches_rejects_mismatched_parts():
    with pytest.raises(ValueError, match="at least one"):
        concat_batches([], pad_id=0)
    a, b = packed([[1]], [[2]], 1, 1), packed([[1]], [[2]], 1, 1)
    del b["reward"]
    with pytest.raises(ValueError, match="different keys"):
        concat_batches([(a, 1), (b, 1)], pad_id=0)
    bad = packed([[1]], [[2]], 1, 1)
    bad["advantages_bt"] = np.zeros((1, 5))
    with pytest.raises(ValueError, match="advantages_bt"):
        concat_batches([(bad, 1)], pad_id=0)


def test_pad_rows_appends_masked_copies_of_row_zero():
    batch = packed([[1], [2, 3], [4]], [[5, 6], [7], [8, 9]], 2, 2)
    padded = pad_rows(batch, 4)
    assert padded["tokens_bt"].shape == (4, 4) and padded["reward"].shape == (4,)
    np.testing.assert_array_equal(padded["tokens_bt"][3], batch["tokens_bt"][0])
    assert not padded["response_mask_bt"][3].any() and padded["response_mask_bt"][:3].sum() == 5
    assert batch["tokens_bt"].shape == (3, 4) and batch["response_mask_bt"].sum() == 5  # the input is untouched
    assert pad_rows(batch, 3) is batch
