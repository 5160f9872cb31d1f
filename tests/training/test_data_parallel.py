"""`data_parallel` in one process: the share is the whole step, and alignment pads rows only (up to the agreed
count and multiple), leaving the columns and the prompt width as they are. Its multi-process behaviour is tested
by `test_multihost.py`."""

import numpy as np

from rubric_jax.models.train_step import pack_sequences
from rubric_jax.training import data_parallel


def packed() -> dict[str, np.ndarray]:
    batch = pack_sequences([[1], [2, 3], [4]], [[5, 6], [7], [8, 9]], pad_id=0, prompt_width=2, response_width=2)
    return {**batch, "advantages_bt": np.ones((3, 4), np.float32), "reward": np.arange(3.0)}


def test_one_process_takes_the_whole_step():
    assert data_parallel.process_share(["a", "b", "c"]) == ["a", "b", "c"]


def test_pad_rows_reaches_at_least_the_given_rows_in_whole_multiples():
    batch = packed()
    assert data_parallel.pad_rows(batch, 2, rows=5)["tokens_bt"].shape == (6, 4)
    assert data_parallel.pad_rows(batch, 2, rows=1)["tokens_bt"].shape == (4, 4)
    assert data_parallel.pad_rows(batch, 1, rows=3) is batch


def test_aligning_one_process_batch_pads_rows_only():
    batch = packed()
    aligned, width = data_parallel.align_batch(batch, 2, pad_id=0, rows_multiple=4)
    assert width == 2 and sorted(aligned) == sorted(batch)
    expected = data_parallel.pad_rows(batch, 4)
    for key, value in expected.items():
        np.testing.assert_array_equal(aligned[key], value, err_msg=key)
