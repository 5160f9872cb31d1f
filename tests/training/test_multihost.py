"""Multi-host learner, with two processes on one CPU machine: `jax.distributed` over loopback (CPU collectives by
gloo, JAX's default), 4 simulated devices per process, one (data 2, fsdp 2, tensor 2) mesh over all 8. Each
process feeds its own rows of every step's batch (`sharding.global_batch`); the logprobs, the train step's
metrics, the metrics log and the saved safetensors equal those of one process with 8 devices. The pair is
SIGKILLed after step 2's checkpoint and a new pair resumes from it (orbax across processes); only process 0
writes the metrics log, the plots and the model. The worker is `tests/training/multihost_worker.py`.

The RL loop (`train_rl`, worker `tests/training/multihost_rl_worker.py`) in two processes: each samples and
judges only its share of every step's prompts ([k::2] of the task's stream), and process 0 alone writes the
config, metrics log, rollout log, plots and model. With dynamic sampling's re-sampling, both processes draw the
same generation batches (each its share), so their streams stay in step, and each trains at most its quota. The workers share a persistent compilation cache, so the
resumed pair does not compile again; every wait has a timeout and every worker is killed at the end."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.metrics import read_metrics
from tests.training.toy_task import toy_task

# Timing-bound (heartbeat and start-up timeouts of several processes): run alone, after the parallel run.
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[2]
STEPS, KILLED_AFTER = 3, 2
TIMEOUT_S = 240
TOL = dict(rtol=1e-5, atol=1e-5)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Launcher:
    """Starts worker processes, each logging to its own file, and kills whichever still runs on `kill_all`."""

    def __init__(self, module: str, cache: Path):
        self.module, self.cache = module, cache
        self.processes: list[subprocess.Popen] = []

    def start(self, out: Path, *args, devices: int, process_id: int = 0, port: int = 0) -> subprocess.Popen:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("JAX_", "XLA_"))}
        env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                   JAX_COMPILATION_CACHE_DIR=str(self.cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
        if port:
            env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                       JAX_PROCESS_ID=str(process_id))
        log = open(out.parent / f"{out.name}.{process_id}.{len(self.processes)}.log", "w")
        process = subprocess.Popen([sys.executable, "-m", self.module, *map(str, args)],
                                   cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        process.log_path = Path(log.name)
        self.processes.append(process)
        return process

    def start_pair(self, out: Path, *args) -> list[subprocess.Popen]:
        port = free_port()
        return [self.start(out, *args, devices=4, process_id=index, port=port) for index in range(2)]

    def kill_all(self):
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)


def finish(processes: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    for process in processes:
        process.wait(timeout=max(deadline - time.monotonic(), 1))
        assert process.returncode == 0, process.log_path.read_text()[-4000:]


def wait_for_files(paths: list[Path], processes: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not all(path.exists() for path in paths):
        for process in processes:
            assert process.poll() is None, process.log_path.read_text()[-4000:]
        assert time.monotonic() < deadline, "the workers did not reach the kill point in time"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(single, multi): the output directories of one process with 8 devices, and of two processes SIGKILLed
    after step KILLED_AFTER and resumed by a new pair."""
    root = tmp_path_factory.mktemp("multihost")
    single, multi = root / "single", root / "multi"
    launcher = Launcher("tests.training.multihost_worker", root / "cache")
    try:
        reference = launcher.start(single, single, STEPS, devices=8)
        killed = launcher.start_pair(multi, multi, STEPS, KILLED_AFTER)
        results = [multi / f"process_{index}.json" for index in range(2)]
        wait_for_files(results, killed)
        for process in killed:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
        for index, path in enumerate(results):
            path.rename(multi / f"killed_{index}.json")
        finish(launcher.start_pair(multi, multi, STEPS))
        finish([reference])
    finally:
        launcher.kill_all()
    return single, multi


def per_step(results: list[dict], key: str) -> dict[int, dict]:
    merged: dict[int, dict] = {}
    for result in results:
        for step, values in result[key].items():
            merged.setdefault(int(step), {}).update(values)
    return merged


def test_each_process_logprobs_and_the_train_step_equal_one_process(runs):
    single, multi = runs
    expected = json.loads((single / "process_0.json").read_text())
    killed = [json.loads((multi / f"killed_{index}.json").read_text()) for index in range(2)]
    resumed = [json.loads((multi / f"process_{index}.json").read_text()) for index in range(2)]
    assert sorted(per_step(killed, "logp")) == list(range(KILLED_AFTER))
    assert sorted(per_step(resumed, "logp")) == list(range(KILLED_AFTER, STEPS))
    for index in range(2):  # each process scored its own rows, [index::2] of every step's batch
        assert all(int(row) % 2 == index for step in killed[index]["logp"].values() for row in step)
    logp = {**per_step(killed, "logp"), **per_step(resumed, "logp")}
    for step, rows in per_step([expected], "logp").items():
        assert sorted(logp[step]) == sorted(rows)
        for row, values in rows.items():
            np.testing.assert_allclose(logp[step][row], values, **TOL, err_msg=f"step {step} row {row}")
    for results in (killed, resumed):  # the step's metrics are global: every process has the same
        assert results[0]["metrics"] == results[1]["metrics"]
    metrics = {**killed[0]["metrics"], **resumed[0]["metrics"]}
    for step, values in expected["metrics"].items():
        for name, value in values.items():
            np.testing.assert_allclose(metrics[step][name], value, **TOL, err_msg=f"step {step} {name}")


def test_only_process_zero_logs_each_step_once_across_the_kill(runs):
    single, multi = runs
    lines = read_metrics(multi / "metrics.jsonl")
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    for line, expected in zip(lines, read_metrics(single / "metrics.jsonl")):
        np.testing.assert_allclose([line[key] for key in sorted(expected)], [expected[key] for key in sorted(expected)],
                                   **TOL)
    assert (multi / "plots" / "train.png").is_file()


def test_the_saved_policy_gathers_every_shard(runs):
    single, multi = runs
    expected = load_file(single / "model" / "model.safetensors")
    saved = load_file(multi / "model" / "model.safetensors")
    assert sorted(saved) == sorted(expected)
    for name, tensor in expected.items():
        np.testing.assert_allclose(saved[name], tensor, **TOL, err_msg=name)
    assert not [path.name for path in multi.iterdir() if path.name.startswith(".model")]  # no staging leftovers


RL_STEPS = 2


def two_process_rl_run(root: Path, changes: dict, *worker_args: str) -> Path:
    """The output directory of a 2-step RL run of a tiny random model on the toy task in two processes (data 2 x
    fsdp 4), its config the rar run's with `changes`; `worker_args` go to tests.training.multihost_rl_worker."""
    out = root / "run"
    config = {
        "output_dir": str(out), "steps": RL_STEPS, "seed": 5,
        "model": {"init": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2,
                           "num_kv_heads": 1, "head_dim": 16, "max_position_embeddings": 96}},
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8},
        "learner": {"mesh": {"data": 2, "fsdp": 4}},
        "algorithm": {"name": "rar"},
        "checkpoint": {"every_steps": 1, "keep": 2},
        "metrics": {"console": False, "tensorboard": False, "plots": False},
        **changes,
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    out.mkdir()
    launcher = Launcher("tests.training.multihost_rl_worker", root / "cache")
    try:
        finish(launcher.start_pair(out, root / "config.yaml", out, *worker_args))
    finally:
        launcher.kill_all()
    return out


@pytest.fixture(scope="module")
def rl_run(tmp_path_factory) -> Path:
    """The output directory of a 2-step RL run (rar on the toy task) in two processes."""
    return two_process_rl_run(tmp_path_factory.mktemp("multihost_rl"), {
        "rollout_log": {"every_steps": 1}, "metrics": {"console": False, "tensorboard": False, "plots": True}})


def test_each_process_samples_and_judges_only_its_share_of_the_prompts(rl_run):
    task, stream = toy_task(), toy_task().train_stream(0)
    steps = [[task.question(example) for example in stream.next_batch(2)] for _ in range(RL_STEPS)]
    for index in range(2):
        calls = [json.loads(line) for line in (rl_run / f"questions_{index}.jsonl").read_text().splitlines()]
        assert calls == [[questions[index]] * 4 for questions in steps]  # one judge call per step, its 4 rollouts


def test_only_process_zero_writes_the_rl_outputs(rl_run):
    assert [line["step"] for line in read_metrics(rl_run / "metrics.jsonl")] == list(range(1, RL_STEPS + 1))
    task, stream = toy_task(), toy_task().train_stream(0)
    for step in range(1, RL_STEPS + 1):
        first = task.question(stream.next_batch(2)[0])
        lines = (rl_run / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert [record["question"] for record in records] == [first] * 4  # process 0's share only
    assert Checkpointer(rl_run / "checkpoints").all_steps() == [1, 2]
    assert (rl_run / "config.yaml").is_file() and (rl_run / "plots" / "reward.png").is_file()
    assert "model.embed_tokens.weight" in load_file(rl_run / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def resample_run(tmp_path_factory) -> Path:
    """The output directory of a 2-step rubric-grounded run re-sampling (at most 4 generation batches a step) in two
    processes, on the toy task whose two-step problems tie (an empty rubric): a process whose share is tied draws
    again, and the other with it."""
    return two_process_rl_run(tmp_path_factory.mktemp("multihost_resample"), {"algorithm": {
        "name": "rubric_grounded", "params": {"dynamic_sampling": "resample", "max_num_gen_batches": 4}}},
        "half_tied")


def test_resampling_processes_draw_the_same_generation_batches_each_its_share(resample_run):
    lines = read_metrics(resample_run / "metrics.jsonl")
    batches = [int(line["dynamic_sampling/gen_batches"]) for line in lines]
    assert sum(batches) > RL_STEPS, "no step drew a second generation batch: the check would be vacuous"
    drawn = toy_task().train_stream(0).next_batch(2 * sum(batches))
    for index in range(2):  # one judge call per generation batch: its share, [index::2] of the batch's 2 prompts
        calls = [json.loads(line) for line in (resample_run / f"questions_{index}.jsonl").read_text().splitlines()]
        assert calls == [[example.question] * 4 for example in drawn[index::2]]
    assert all(line["dynamic_sampling/groups_kept"] <= 1 for line in lines)  # process 0's quota: 1 of 2 prompts
