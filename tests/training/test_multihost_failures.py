"""Multi-host failures through `rubric-jax train` as a user launches it: two processes on loopback
(JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID), one CPU device each, the learner's mesh (fsdp 2)
over both. Each case asserts the exit status of every process, the one line each prints on its console (stderr),
and a bound on the time from the failure to the end:

- a config that differs on one host: both stop before any compute with the differing key and both values (78);
- an output_dir that is not shared (each process its own): both stop at launch (69);
- a peer that never starts: process 0 says process 1 did not join, process 1 alone says the coordinator did not
  answer (69), each within the initialization timeout;
- a coordinator port already taken: process 0 says so at once, process 1 that the coordinator did not answer (69);
- mid-run (after the first checkpoint): kill -9 of process 1's `rubric-jax train` (its training dies with it),
  kill -9 of process 0's training process (the coordinator), SIGSTOP of process 1's training process (a frozen
  host): the survivor names the failed process and the checkpoint the run resumes from (75) within the heartbeat
  timeout and a margin, with the runtime's C++ abort kept in its log, not on the console; process 1 starts 5 s late
  in the first, and is waited for;
- SIGTERM to one process: both stop after the same step with a checkpoint (143), and a relaunch of both resumes
  and finishes (0), process 0 writing the final model.

The exact resume after a kill is `test_multihost.py`'s. Every wait has a timeout and every process is killed at the
end; the processes share a persistent compilation cache."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

# Timing-bound (heartbeat and start-up timeouts of several processes): run alone, after the parallel run.
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT_S = 5
INIT_S = 30  # a peer that starts late is waited for this long
MISSING_INIT_S = 8  # the cases where a peer never joins
# The time from a failure to every survivor's end beyond the runtime's own timeout: the supervisor's report, and
# a loaded 2-core machine.
MARGIN_S = 25
START_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    """A tiny RaR run on the arithmetic task, long enough never to finish in a test, checkpointed every 2 steps."""
    path = tmp_path_factory.mktemp("config") / "run.yaml"
    path.write_text(yaml.safe_dump({
        "output_dir": "unset", "steps": 400, "seed": 0,
        "model": {"init": {"model_type": "qwen3", "hidden_size": 32, "intermediate_size": 64, "num_layers": 1,
                           "num_heads": 2, "num_kv_heads": 1, "head_dim": 16, "max_position_embeddings": 96}},
        "task": {"name": "arithmetic", "seed": 0, "params": {"min_steps": 1, "max_steps": 2, "max_operand": 9}},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8, "temperature": 1.0},
        "learner": {"mesh": {"fsdp": 2}},
        "algorithm": {"name": "rar"},
        "checkpoint": {"every_steps": 2, "keep": 2},
        "metrics": {"tensorboard": False, "console": True, "plots": False},
        "distributed": {"heartbeat_timeout_s": HEARTBEAT_S, "initialization_timeout_s": INIT_S,
                        "shared_dir_timeout_s": 3},
    }))
    return path


class Job:
    """`rubric-jax train` processes of one two-process job on loopback, each with its console (stdout, stderr)
    in files; `stop` kills whatever still runs, training processes first."""

    def __init__(self, root: Path, config: Path, cache: Path, port: int = 0):
        self.root, self.config, self.cache = root, config, cache
        self.port = port or free_port()
        self.processes: dict[int, subprocess.Popen] = {}
        root.mkdir(parents=True, exist_ok=True)

    def start(self, process_id: int, *overrides: str, output_dir: str = "out") -> subprocess.Popen:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("JAX_", "XLA_", "RUBRIC_JAX"))}
        env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{self.port}",
                   JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(process_id), JAX_COMPILATION_CACHE_DIR=str(self.cache),
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
        with open(self.root / f"console_{process_id}.out", "w") as out, \
                open(self.root / f"console_{process_id}.err", "w") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", "rubric_jax.cli", "train", str(self.config),
                 f"output_dir={self.root / output_dir}", *overrides], cwd=ROOT, env=env, stdout=out, stderr=err)
        self.processes[process_id] = process
        return process

    def console(self, process_id: int) -> list[str]:
        """The lines process `process_id` printed on stderr."""
        return (self.root / f"console_{process_id}.err").read_text().splitlines()

    def training_process(self, process_id: int) -> int:
        """The pid of the supervised child that trains for process `process_id`'s `rubric-jax train`."""
        pid = self.processes[process_id].pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        assert len(children) == 1, children
        return int(children[0])

    def start_and_checkpoint(self) -> float:
        """Starts both processes and returns the time once the run has committed a checkpoint."""
        self.start(0)
        self.start(1)
        self.wait_for_checkpoint()
        return time.monotonic()

    def wait_for_checkpoint(self) -> None:
        checkpoints = self.root / "out" / "checkpoints"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (checkpoints.is_dir() and any(path.name.isdigit() for path in checkpoints.iterdir())):
            for process_id, process in self.processes.items():
                assert process.poll() is None, (process_id, self.console(process_id))
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.2)

    def wait(self, process_id: int, timeout_s: float) -> int:
        return self.processes[process_id].wait(timeout=timeout_s)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                for child in Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split():
                    os.kill(int(child), signal.SIGKILL)
                process.kill()
            process.wait(timeout=30)


@pytest.fixture
def job_factory(tmp_path, config):
    jobs = []

    def make(name: str, port: int = 0) -> Job:
        jobs.append(Job(tmp_path / name, config, tmp_path.parent / "compilation_cache", port))
        return jobs[-1]

    yield make
    for job in jobs:
        job.stop()


def finished_within(job: Job, process_ids, timeout_s: float, since: float) -> dict[int, int]:
    """{process id: exit status} of `process_ids`, each asserted to end within `timeout_s` of `since`."""
    statuses = {}
    for process_id in process_ids:
        statuses[process_id] = job.wait(process_id, max(since + timeout_s - time.monotonic(), 1))
    assert time.monotonic() - since <= timeout_s
    return statuses


def resume_step(line: str, job: Job) -> int:
    """The checkpoint step a line names, asserted to be committed in the job's output_dir."""
    step = int(re.search(r"resumes it from the checkpoint of step (\d+)", line).group(1))
    assert (job.root / "out" / "checkpoints" / str(step)).is_dir()
    return step


def test_a_host_given_another_config_stops_every_host_naming_the_key(job_factory):
    job = job_factory("mismatch")
    started = time.monotonic()
    job.start(0)
    job.start(1, "optimizer.learning_rate=5e-3")
    statuses = finished_within(job, (0, 1), START_TIMEOUT_S, started)
    assert statuses == {0: 78, 1: 78}
    expected = ("rubric-jax train: the 2 processes were not given the same run: optimizer.learning_rate: 1e-06 "
                "(process 0), 0.005 (process 1); start every host with the same config file, overrides and "
                "rubric_jax version")
    assert job.console(0) == job.console(1) == [expected]
    assert not (job.root / "out" / "checkpoints").exists()


def test_an_output_dir_not_shared_stops_every_host_at_launch(job_factory):
    job = job_factory("unshared")
    started = time.monotonic()
    job.start(0)
    job.start(1, output_dir="elsewhere")
    assert finished_within(job, (0, 1), START_TIMEOUT_S, started) == {0: 69, 1: 69}
    for process_id, directory in ((0, "out"), (1, "elsewhere")):
        assert job.console(process_id) == [
            f"rubric-jax train: output_dir {job.root / directory} is not one directory for every host: process 1 did "
            "not see the token process 0 wrote there within 3 s; put output_dir on a filesystem every host mounts "
            "(NFS, Filestore, a gcsfuse bucket)"]
    # Each directory holds only the launch's logs: the refused launch wrote nothing else.
    assert sorted(path.name for path in (job.root / "out").iterdir()) == ["logs"]


def test_a_peer_that_never_starts_is_reported_missing_and_a_taken_port_at_once(job_factory):
    """Three launches at once: process 0 alone, process 1 alone (another job), and a pair whose coordinator's
    port a listener holds."""
    alone_0, alone_1, taken = job_factory("alone_0"), job_factory("alone_1"), job_factory("taken")
    timeout = f"distributed.initialization_timeout_s={MISSING_INIT_S}"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken.port))
        holder.listen()
        started = time.monotonic()
        alone_0.start(0, timeout)
        alone_1.start(1, timeout)
        taken.start(0, timeout)
        taken.start(1, timeout)
        # Startup (two imports and checks per process on a shared machine), then the timeout.
        bound = START_TIMEOUT_S + MISSING_INIT_S
        assert finished_within(alone_0, (0,), bound, started) == {0: 69}
        assert finished_within(alone_1, (1,), bound, started) == {1: 69}
        assert finished_within(taken, (0, 1), bound, started) == {0: 69, 1: 69}
    assert alone_0.console(0) == [
        f"rubric-jax train: process 1 of 2 did not join within {MISSING_INIT_S} s: start the same command on every "
        "host, each with its own process id, and check that they reach the coordinator's address (log: "
        f"{alone_0.root / 'out' / 'logs' / 'process_0.log'})"]
    for job in (alone_1, taken):
        assert job.console(1) == [
            f"rubric-jax train: process 0 of 2 (the coordinator, 127.0.0.1:{job.port}) did not answer within "
            f"{MISSING_INIT_S} s: start the same command on every host, each with its own process id, and check "
            f"that they reach the coordinator's address (log: {job.root / 'out' / 'logs' / 'process_1.log'})"]
    [line] = taken.console(0)
    assert line.startswith(f"rubric-jax train: the coordinator's port {taken.port} (JAX_COORDINATOR_ADDRESS=127.0.0.1:"
                           f"{taken.port}) is in use on this host")
    # The runtime's abort is in the log, not on the console.
    assert "Terminating process" in (alone_0.root / "out" / "logs" / "process_0.log").read_text()


def test_kill_9_of_a_late_peer_is_one_line_on_the_survivor(job_factory):
    job = job_factory("kill_1")
    job.start(0)
    time.sleep(5)  # a late peer is waited for (distributed.initialization_timeout_s)
    job.start(1)
    job.wait_for_checkpoint()
    killed = time.monotonic()
    job.processes[1].send_signal(signal.SIGKILL)  # the user's `rubric-jax train`: its training dies with it
    assert finished_within(job, (0,), HEARTBEAT_S + MARGIN_S, killed) == {0: 75}
    [line] = job.console(0)
    assert line.startswith(f"rubric-jax train: process 1 of 2 stopped answering (no heartbeat for {HEARTBEAT_S} s: "
                           "died, froze or lost its network); the same command on every host resumes it from the "
                           "checkpoint of step ")
    resume_step(line, job)
    log = (job.root / "out" / "logs" / "process_0.log").read_text()
    assert "stopped sending heartbeats" in log and "Terminating process" in log
    assert "Terminating process" not in "\n".join(job.console(0))


def test_kill_9_of_the_coordinator_is_one_line_on_each_host(job_factory):
    job = job_factory("kill_0")
    killed = job.start_and_checkpoint()
    os.kill(job.training_process(0), signal.SIGKILL)  # what the out-of-memory killer does
    assert finished_within(job, (0, 1), MARGIN_S, killed) == {0: 137, 1: 75}
    [line_0], [line_1] = job.console(0), job.console(1)
    assert line_0.startswith("rubric-jax train: the training process was killed by SIGKILL (the out-of-memory "
                             "killer, or a kill); the same command on every host resumes it from the checkpoint")
    assert line_1.startswith("rubric-jax train: process 0 of 2, the coordinator, stopped answering (died, froze or "
                             "lost its network); the same command on every host resumes it from the checkpoint of "
                             "step ")
    resume_step(line_1, job)


def test_a_frozen_host_is_one_line_on_the_other_within_the_heartbeat_timeout(job_factory):
    job = job_factory("frozen_1")
    frozen = job.start_and_checkpoint()
    os.kill(job.training_process(1), signal.SIGSTOP)  # a host that lost its network: alive, silent
    assert finished_within(job, (0,), HEARTBEAT_S + MARGIN_S, frozen) == {0: 75}
    [line] = job.console(0)
    assert line.startswith(f"rubric-jax train: process 1 of 2 stopped answering (no heartbeat for {HEARTBEAT_S} s")
    resume_step(line, job)


def test_sigterm_to_one_host_stops_both_after_the_same_step_with_a_checkpoint(job_factory):
    job = job_factory("sigterm_1")
    signalled = job.start_and_checkpoint()
    job.processes[1].send_signal(signal.SIGTERM)  # forwarded to its training process
    assert finished_within(job, (0, 1), MARGIN_S, signalled) == {0: 143, 1: 143}
    stopped = [re.fullmatch(r"rubric-jax train: stopped by SIGTERM after step (\d+) of 400, checkpointed in (.+): "
                            r"the same command resumes it", job.console(process_id)[-1])
               for process_id in (0, 1)]
    assert all(stopped) and stopped[0].groups() == stopped[1].groups()
    assert job.console(1)[:-1] == ["[rubric-jax] SIGTERM: stopping after this step, with a checkpoint (send it again "
                                   "to stop at once)"]
    step = int(stopped[0].group(1))
    assert (job.root / "out" / "checkpoints" / str(step)).is_dir()
    relaunched = time.monotonic()
    for process_id in (0, 1):
        job.start(process_id, f"steps={step + 2}")
    assert finished_within(job, (0, 1), START_TIMEOUT_S, relaunched) == {0: 0, 1: 0}
    assert job.console(0) == job.console(1) == []
    metrics = [json.loads(line) for line in (job.root / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in metrics] == list(range(1, step + 3))
    assert (job.root / "out" / "model" / "config.json").is_file()
