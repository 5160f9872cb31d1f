"""`data_parallel` in one process: the share is the whole step, and alignment pads rows only (up to the agreed
count and multiple), leaving the columns and the prompt width as they are; the step stream draws whole batches;
re-sampling with overlap is refused only with several processes. Its multi-process behaviour is tested by
`test_multihost.py` (the re-sampling agreement by `tests/algorithms/test_dynamic_sampling.py`)."""

import numpy as np
import pytest

from rubric_jax.models.train_step import pack_sequences
from rubric_jax.training import data_parallel
from tests.training.toy_task import toy_task


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


def test_one_process_step_stream_draws_whole_batches_and_its_quota_is_the_step():
    stream = data_parallel.StepStream(toy_task().train_stream(0), prompts_per_step=4)
    expected = toy_task().train_stream(0).next_batch(7)
    assert stream.next_share(4) == expected[:4] and stream.next_share(3) == expected[4:]
    assert stream.dataset.position == 7 and stream.quota == 4 and stream.fewest(3) == 3


class Resampling:
    resamples = True


def test_resampling_with_overlap_is_refused_in_a_multi_process_run_only(monkeypatch):
    data_parallel.check_overlap(Resampling(), overlap=True)  # one process: nothing to agree on
    monkeypatch.setattr(data_parallel.jax, "process_count", lambda: 2)
    data_parallel.check_overlap(Resampling(), overlap=False)
    with pytest.raises(ValueError, match="dynamic_sampling resample with rollout.overlap"):
        data_parallel.check_overlap(Resampling(), overlap=True)
