"""rollout.overlap: step n + 1's experience is sampled in a background thread, from the weights before update n,
while the learner makes update n; the run is reproducible and a run interrupted after a checkpoint resumes, from
the experience it had sampled ahead, to exactly what the uninterrupted run produced."""

import asyncio
import contextvars
import subprocess
import sys
import threading
from pathlib import Path

import jax
import numpy as np
import pytest

from rubric_jax.algorithms.base import Experience
from rubric_jax.inference.embedded import EmbeddedEngine
from rubric_jax.training import learner as learner_module, rl, run_files
from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.metrics import read_metrics
from rubric_jax.training.run_config import AlgorithmSpec, RolloutConfig, RolloutLogConfig
from tests.algorithms.test_dynamic_sampling import HalfSolvedTask
from tests.judges.test_records import RECORDS
from tests.training.test_rl import tiny_rl_config
from tests.training.toy_task import toy_task

ROOT = Path(__file__).resolve().parents[2]
OVERLAP = RolloutConfig(prompts_per_step=2, group_size=4, max_new_tokens=16, overlap=True)


def test_the_next_batch_is_sampled_from_the_weights_one_update_old_while_the_learner_updates(tmp_path,
                                                                                               monkeypatch):
    generations, in_update = [], threading.Event()
    stream, update, sample = EmbeddedEngine.stream_groups, learner_module.update_policy, rl._Run.sample
    # Whether the experience being sampled is sampled ahead, in the run's "rollouts" thread: a context variable,
    # because the engine generates in a worker thread of its own (its stream of groups), which copies the context;
    # the step's groups come from the engine's stream (`EmbeddedEngine.stream_groups`).
    sampling_ahead = contextvars.ContextVar("sampling_ahead", default=False)

    def flagged_sample(self, *args):
        token = sampling_ahead.set(threading.current_thread().name.startswith("rollouts"))
        try:
            return sample(self, *args)
        finally:
            sampling_ahead.reset(token)

    async def recording_stream(self, prompts, params):
        background = sampling_ahead.get()
        # A background generation goes on only once the learner is inside an update (set below): they overlap.
        waited = background and await asyncio.to_thread(in_update.wait, 120)
        generations.append((self.weight_version, background, waited))
        async for group in stream(self, prompts, params):
            yield group

    def flagged_update(*args):
        in_update.set()
        try:
            return update(*args)
        finally:
            in_update.clear()

    monkeypatch.setattr(EmbeddedEngine, "stream_groups", recording_stream)
    monkeypatch.setattr(learner_module, "update_policy", flagged_update)
    monkeypatch.setattr(rl._Run, "sample", flagged_sample)
    rl.train_rl(tiny_rl_config(tmp_path, steps=3, rollout=OVERLAP), toy_task())

    # Step 1's batch from the initial weights, then each next one in the background during the update before it.
    assert generations == [("step-0", False, False), ("step-0", True, True), ("step-1", True, True)]
    lines = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [line["rollout/policy_lag"] for line in lines] == [0, 1, 1]
    assert [line["rollout/weight_step"] for line in lines] == [0, 0, 1]
    assert ["time/rollout_wait" in line for line in lines] == [True, True, False]  # nothing sampled after step 3


def test_without_overlap_every_batch_is_on_policy(tmp_path):
    rl.train_rl(tiny_rl_config(tmp_path, steps=2), toy_task())
    lines = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [(line["rollout/policy_lag"], line["rollout/weight_step"]) for line in lines] == [(0, 0), (0, 1)]
    assert not any("time/rollout_wait" in line for line in lines)
    assert not (tmp_path / "run" / run_files.PENDING_DIR).exists()


class Interrupted(Exception):
    pass


def comparable(line: dict) -> dict:
    return {name: value for name, value in line.items() if not name.startswith("time/")}


# rar, and DAPO re-sampling on a task where about half the prompts are solved: its steps draw further generation
# batches (from the overlap thread too), which the checkpoint's data position and the pending experience must hold.
RESUMED = {"rar": (toy_task, AlgorithmSpec()),
           "dapo_resample": (lambda: HalfSolvedTask(toy_task().config, 0), AlgorithmSpec(name="dapo", params={
               "overlong_buffer": 4, "dynamic_sampling": "resample", "max_num_gen_batches": 3}))}


@pytest.mark.parametrize("recipe", sorted(RESUMED))
def test_an_interrupted_overlapped_run_resumes_to_what_the_uninterrupted_run_produced(tmp_path, monkeypatch, recipe):
    make_task, algorithm = RESUMED[recipe]

    def config(name):
        return tiny_rl_config(tmp_path / name, steps=4, rollout=OVERLAP, rollout_log=RolloutLogConfig(every_steps=1),
                              algorithm=algorithm)

    rl.train_rl(config("whole"), make_task())

    update = learner_module.update_policy

    def interrupted_at_step_3(learner, state, batch, width, step, seed):
        if step == 2:  # after checkpoint 2, with step 4's batch being sampled
            raise Interrupted
        return update(learner, state, batch, width, step, seed)

    monkeypatch.setattr(learner_module, "update_policy", interrupted_at_step_3)
    with pytest.raises(Interrupted):
        rl.train_rl(config("resumed"), make_task())
    resumed = tmp_path / "resumed" / "run"
    assert run_files.pending_path(resumed, 2).exists()  # step 3's batch, sampled during step 2
    monkeypatch.setattr(learner_module, "update_policy", update)
    rl.train_rl(config("resumed"), make_task())

    whole = tmp_path / "whole" / "run"
    assert ([comparable(line) for line in read_metrics(resumed / "metrics.jsonl")]
            == [comparable(line) for line in read_metrics(whole / "metrics.jsonl")])
    for step in range(1, 5):
        assert (run_files.rollout_log_path(resumed, step).read_text() == run_files.rollout_log_path(whole, step).read_text())
    states = [Checkpointer(run / "checkpoints").restore(4, None) for run in (whole, resumed)]
    for a, b in zip(jax.tree.leaves(states[0][0]["params"]), jax.tree.leaves(states[1][0]["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    drawn = sum(2 * line.get("dynamic_sampling/gen_batches", 1) for line in read_metrics(whole / "metrics.jsonl"))
    assert states[0][1]["data_position"] == states[1][1]["data_position"] == drawn
    assert (drawn > 8) == (recipe == "dapo_resample")  # the re-sampling run drew again in some step


def test_the_overlap_benchmark_prints_each_configurations_step_time_against_the_plain_loop():
    result = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "benchmarks" / "overlap_benchmark.py"), "--steps", "1",
         "--warmup", "1", "--latency", "0.05", "--hidden", "32", "--layers", "1", "--prompts", "2",
         "--group-size", "2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = {line[:22].strip(): line.split() for line in result.stdout.splitlines()
            if line.startswith(("plain", "detached", "overlap"))}
    assert sorted(rows) == ["detached old logprobs", "overlap", "overlap + detached", "plain"]
    assert float(rows["plain"][-1]) == 1.0 and all(float(row[-1]) > 0 for row in rows.values())


@pytest.mark.parametrize("records", [RECORDS, None])
def test_a_pending_experience_survives_its_file_exactly(tmp_path, records):
    """save_pending / resume_pending: the batch's arrays (dtypes and shapes), the prompt width, both metric maps and
    the judged rollouts (failed verdicts with the judge's answer included) come back as they went in."""
    rng = np.random.default_rng(0)
    batch = {"tokens_bt": rng.integers(0, 50, (4, 7)).astype(np.int32), "response_mask_bt": rng.random((4, 7)) > 0.5,
             "advantages_bt": rng.standard_normal((4, 7)).astype(np.float32)}
    sampled = rl.SampledExperience(Experience(batch, 3, {"reward/mean": 0.25, "judge/failure_rate": 0.0}),
                                   {"reward/mean": 0.25, "rollout/policy_lag": 1.0}, records, records is not None)
    rl.save_pending(tmp_path, 2, sampled, oldest_kept=2)
    resumed = rl.resume_pending(tmp_path, 2)
    assert resumed.experience.batch.keys() == batch.keys()
    for key, value in batch.items():
        assert resumed.experience.batch[key].dtype == value.dtype
        np.testing.assert_array_equal(resumed.experience.batch[key], value)
    assert (resumed.experience.prompt_width, resumed.experience.metrics) == (3, sampled.experience.metrics)
    assert (resumed.metrics, resumed.records, resumed.logs_rollouts) == (sampled.metrics, records, sampled.logs_rollouts)


def test_a_pending_file_holding_a_pickle_is_refused_not_run(tmp_path):
    """A pending file is read without unpickling: an object array in it (which np.load would unpickle) is an
    error, so a run directory is never a way to run code."""
    path = run_files.pending_path(tmp_path, 1)
    path.parent.mkdir(parents=True)
    with open(path, "wb") as file:
        np.savez(file, meta=np.array([{"prompt_width": 1}], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle"):
        rl.resume_pending(tmp_path, 1)
