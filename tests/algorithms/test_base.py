"""The recipes' shared host-side helpers: summary statistics of a batch, by hand and against NumPy."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.algorithms.base import summary_stats


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
