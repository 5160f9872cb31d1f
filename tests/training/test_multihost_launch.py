"""The launch side of a multi-process run, in one process: which environments describe a multi-process job and get
a supervised child (`supervisor.multi_process_environment`, `wanted`), the child's log name (`process_label`),
`multihost.initialize` passing the run's timeouts to `jax.distributed.initialize` (monkeypatched), the
coordinator port check, the config fingerprint and the line naming what differs between processes, the checks
that do nothing in one process, the exit statuses of `multihost.failure`, the resume point, the supervisor's
one-line diagnosis of a child killed by a signal (from the JAX runtime's own messages and the child's marks), and
`supervisor.mark`."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from rubric_jax.training import multihost, runs, supervisor
from rubric_jax.training.run_config import DistributedConfig, RLConfig
from rubric_jax.yaml_config import load_config

ROOT = Path(__file__).resolve().parents[2]
RAR_CONFIG = ROOT / "configs" / "rar_arithmetic.yaml"
# multi_process_environment's docstring names these; a test of one process must not inherit them from a launcher.
LAUNCH_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "SLURM_STEP_NODELIST",
                    "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES",
                    "RUBRIC_JAX_DISTRIBUTED", supervisor.LOG_ENV)

UNHEALTHY = ("E1128 12:29:34.478465    9511 coordination_service.cc:1549] Use error polling to propagate the following "
             "error to all tasks: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):\n1\n"
             "The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. "
             "preemption, eviction) to debug further.\n")
TERMINATING = ("F1128 12:29:34.008209    9545 client.h:80] Terminating process because the JAX distributed service "
               "detected fatal errors. ... absl::Status: ")
HEARTBEAT_LOST = (TERMINATING + "DEADLINE_EXCEEDED: Deadline Exceeded\n\nRPC: /xla.coordination.CoordinationService/"
                  "Heartbeat\n*** Check failure stack trace: ***\n")
POLL_LOST = (TERMINATING + "UNAVAILABLE: Socket closed\n\nRPC: /xla.coordination.CoordinationService/PollForError\n"
             "*** Check failure stack trace: ***\n")
REGISTER_FAILED = (TERMINATING + "DEADLINE_EXCEEDED: Deadline Exceeded\n\nRPC: /xla.coordination.CoordinationService/"
                   "RegisterTask\n")


def mark_line(event: str, **fields) -> str:
    return f"{supervisor.MARK} {json.dumps({'event': event, **fields})}\n"


def joined(process: int, processes: int) -> str:
    return mark_line("joined", process=process, processes=processes)


def joining(process: int, processes: int) -> str:
    return mark_line("joining", process=process, processes=processes, coordinator="127.0.0.1:1234", timeout_s=20)


def diagnose(signal_number: int, written: str, out: Path) -> tuple[str, int]:
    return supervisor.diagnose(signal_number, written, out, 5, out / "logs" / "process_0.log")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rar_config(*overrides: str) -> RLConfig:
    return load_config(RLConfig, RAR_CONFIG, overrides)


@pytest.fixture
def one_process(monkeypatch):
    for variable in LAUNCH_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture
def recorded_initialize(monkeypatch, one_process):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(multihost, "_heartbeat_timeout_s", multihost._heartbeat_timeout_s)
    return calls


# --- multi_process_environment, wanted, process_label


def test_an_empty_environment_is_one_process():
    assert supervisor.multi_process_environment({}) is False


def test_a_single_host_tpu_vm_is_one_process():
    assert supervisor.multi_process_environment({"TPU_WORKER_HOSTNAMES": "localhost"}) is False


def test_a_tpu_slice_of_two_workers_is_multi_process():
    assert supervisor.multi_process_environment({"TPU_WORKER_HOSTNAMES": "a,b"}) is True


def test_tpu_process_addresses_listing_two_workers_are_multi_process():
    assert supervisor.multi_process_environment({"TPU_PROCESS_ADDRESSES": "a:8476,b:8476"}) is True


def test_a_coordinator_address_is_multi_process_unless_distributed_is_turned_off():
    assert supervisor.multi_process_environment({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}) is True
    assert supervisor.multi_process_environment(
        {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "RUBRIC_JAX_DISTRIBUTED": "0"}) is False


def test_rubric_jax_distributed_1_forces_multi_process():
    assert supervisor.multi_process_environment({"RUBRIC_JAX_DISTRIBUTED": "1"}) is True


def test_a_slurm_step_is_multi_process_only_with_more_than_one_task():
    assert supervisor.multi_process_environment({"SLURM_STEP_NODELIST": "node1", "SLURM_NTASKS": "1"}) is False
    assert supervisor.multi_process_environment({"SLURM_STEP_NODELIST": "node[1-2]", "SLURM_NTASKS": "2"}) is True


def test_slurm_ntasks_outside_a_step_is_one_process():
    assert supervisor.multi_process_environment({"SLURM_NTASKS": "8"}) is False


def test_open_mpi_is_multi_process_only_with_more_than_one_rank():
    assert supervisor.multi_process_environment({"OMPI_COMM_WORLD_SIZE": "1"}) is False
    assert supervisor.multi_process_environment({"OMPI_COMM_WORLD_SIZE": "4"}) is True


def test_a_multi_process_launch_wants_a_supervised_child():
    assert supervisor.wanted({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}) is True


def test_the_supervised_child_does_not_supervise_again():
    assert supervisor.wanted({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", supervisor.LOG_ENV: "/tmp/p.log"}) is False


def test_rubric_jax_supervise_0_turns_supervision_off():
    assert supervisor.wanted({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", supervisor.SUPERVISE_ENV: "0"}) is False


def test_one_process_is_not_supervised():
    assert supervisor.wanted({}) is False


@pytest.mark.parametrize("variable", ["JAX_PROCESS_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "TPU_WORKER_ID"])
def test_a_launcher_given_process_id_names_the_log(variable):
    assert supervisor.process_label({variable: "3"}) == "process_3"


def test_jax_process_id_wins_over_the_other_launchers_ids():
    assert supervisor.process_label({"SLURM_PROCID": "5", "JAX_PROCESS_ID": "2"}) == "process_2"


def test_without_a_process_id_the_log_is_named_by_host_and_pid():
    assert supervisor.process_label({}) == f"{socket.gethostname()}-{os.getpid()}"


# --- initialize


def test_initialize_in_one_process_joins_nothing(recorded_initialize):
    assert multihost.initialize(DistributedConfig()) is False
    assert recorded_initialize == []


def test_initialize_passes_the_process_ids_and_the_runs_timeouts_to_jax(recorded_initialize, monkeypatch):
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", f"10.0.0.1:{free_port()}")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    settings = DistributedConfig(initialization_timeout_s=17, heartbeat_timeout_s=23, shutdown_timeout_s=31)
    assert multihost.initialize(settings) is True
    assert recorded_initialize == [{"num_processes": 4, "process_id": 1, "initialization_timeout": 17,
                                    "heartbeat_timeout_seconds": 23, "shutdown_timeout_seconds": 31}]
    assert multihost._heartbeat_timeout_s == 23


def test_initialize_as_process_0_refuses_a_coordinator_port_in_use(recorded_initialize, monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", f"127.0.0.1:{port}")
        monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
        monkeypatch.setenv("JAX_PROCESS_ID", "0")
        with pytest.raises(multihost.LaunchFailed):
            multihost.initialize(DistributedConfig())
    assert recorded_initialize == []


# --- check_port_free


def test_a_free_coordinator_port_passes():
    multihost.check_port_free(f"127.0.0.1:{free_port()}")


def test_a_coordinator_port_being_listened_on_fails_the_launch():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(multihost.LaunchFailed) as raised:
            multihost.check_port_free(f"127.0.0.1:{port}")
    assert str(port) in str(raised.value)
    assert "in use" in str(raised.value)


def test_a_failed_launch_exits_69():
    assert multihost.LaunchFailed.exit_code == supervisor.EXIT_LAUNCH_FAILED == 69


# --- fingerprint_differences


def test_identical_fingerprints_have_no_differences():
    fingerprint = {"code: jax": "0.4.30", "steps": "3", "optimizer.learning_rate": "0.001"}
    assert multihost.fingerprint_differences([fingerprint, dict(fingerprint)]) is None


def test_a_differing_key_names_each_processes_value():
    first = {"steps": "3", "optimizer.learning_rate": "0.001"}
    second = {"steps": "3", "optimizer.learning_rate": "0.005"}
    assert (multihost.fingerprint_differences([first, second], shown=3)
            == "optimizer.learning_rate: 0.001 (process 0), 0.005 (process 1)")


def test_processes_that_agree_are_named_together():
    values = ["0.001", "0.005", "0.001"]
    text = multihost.fingerprint_differences([{"optimizer.learning_rate": value} for value in values], shown=3)
    assert text == "optimizer.learning_rate: 0.001 (processes 0, 2), 0.005 (process 1)"


def test_a_key_absent_on_one_process_shows_absent():
    text = multihost.fingerprint_differences([{"steps": "3", "seed": "0"}, {"steps": "3"}], shown=3)
    assert text == "seed: 0 (process 0), (absent) (process 1)"


def test_code_keys_come_first_then_shallower_config_keys():
    first = {"optimizer.learning_rate": "0.001", "steps": "3", "code: jax": "0.4.30"}
    second = {"optimizer.learning_rate": "0.005", "steps": "4", "code: jax": "0.4.31"}
    text = multihost.fingerprint_differences([first, second], shown=3)
    assert text.index("code: jax") < text.index("steps") < text.index("optimizer.learning_rate")


def test_more_differing_keys_than_shown_are_counted():
    first = {f"key{index}": "a" for index in range(5)}
    second = {f"key{index}": "b" for index in range(5)}
    text = multihost.fingerprint_differences([first, second], shown=3)
    assert text.endswith("; key2: a (process 0), b (process 1) (and 2 more)")
    assert text.count(" (process 0)") == 3


# --- config_fingerprint, and the checks that do nothing in one process


def test_the_config_fingerprint_leaves_out_output_dir():
    fingerprint = multihost.config_fingerprint(rar_config())
    assert "output_dir" not in fingerprint
    assert fingerprint["steps"] == "120"


def test_configs_differing_only_in_output_dir_have_the_same_fingerprint():
    assert (multihost.config_fingerprint(rar_config("output_dir=/mnt/a/run"))
            == multihost.config_fingerprint(rar_config("output_dir=/mnt/b/run")))


def test_each_host_may_name_its_own_servers():
    first = rar_config("judge.kind=llm", "judge.url=http://node0:8000/v1", "judge.model=grader")
    second = rar_config("judge.kind=llm", "judge.url=http://node1:8000/v1", "judge.model=grader")
    assert multihost.config_fingerprint(first) == multihost.config_fingerprint(second)
    assert set(multihost.PER_HOST_KEYS) >= {"rollout.sglang_url", "rollout.frozen_sglang_url", "meta_verifier.url"}


def test_configs_differing_in_learning_rate_are_told_apart_by_that_key():
    fingerprints = [multihost.config_fingerprint(rar_config(f"optimizer.learning_rate={rate}"))
                    for rate in ("0.001", "0.005")]
    assert multihost.fingerprint_differences(fingerprints) == (
        "optimizer.learning_rate: 0.001 (process 0), 0.005 (process 1)")


def test_the_config_fingerprint_holds_the_code():
    fingerprint = multihost.config_fingerprint(rar_config())
    assert {"code: rubric_jax source", "code: jax", "code: jaxlib"} <= set(fingerprint)
    assert fingerprint["code: jax"] == jax.__version__


def test_check_same_config_does_nothing_in_one_process():
    assert jax.process_count() == 1
    assert multihost.check_same_config(rar_config()) is None


def test_check_shared_directory_creates_nothing_in_one_process(tmp_path):
    assert multihost.check_shared_directory(tmp_path / "x", 1.0) is None
    assert not (tmp_path / "x").exists()


# --- failure, RunStopped, RunInterrupted


@pytest.mark.parametrize("status, kind, every_process", [(69, multihost.LaunchFailed, True),
                                                         (78, multihost.ConfigMismatch, True),
                                                         (75, multihost.PeerFailed, False)])
def test_failure_returns_the_class_of_its_exit_status(status, kind, every_process):
    stopped = multihost.failure("the line", status)
    assert type(stopped) is kind
    assert stopped.exit_code == status
    assert stopped.every_process is every_process
    assert str(stopped) == "the line"


def test_failure_with_another_status_is_a_plain_run_stopped_carrying_it():
    stopped = multihost.failure("killed", 137)
    assert type(stopped) is runs.RunStopped
    assert stopped.exit_code == 137
    assert runs.RunStopped.exit_code == 1


def test_a_run_stopped_stops_its_process_alone_and_an_interrupt_every_process():
    assert runs.RunStopped.every_process is False
    interrupted = runs.RunInterrupted("stopped after step 3", signal.SIGTERM)
    assert interrupted.every_process is True
    assert interrupted.exit_code == 143


# --- resume_point


def test_without_checkpoints_the_relaunch_starts_the_run_over(tmp_path):
    assert "starts the run over" in supervisor.resume_point(tmp_path)


def test_the_relaunch_resumes_from_the_newest_committed_checkpoint(tmp_path):
    for name in ("2", "4", "6.orbax-checkpoint-tmp", "3.unrestorable"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    point = supervisor.resume_point(tmp_path)
    assert "step 4 " in point
    assert "starts the run over" not in point


# --- diagnose


def test_a_peer_without_heartbeats_is_named_with_the_timeout_and_where_the_run_resumes(tmp_path):
    line, status = diagnose(signal.SIGABRT, joined(0, 2) + UNHEALTHY, tmp_path)
    assert status == supervisor.EXIT_PEER_FAILED == 75
    assert "process 1 of 2 stopped answering" in line
    assert "no heartbeat for 5 s" in line
    assert supervisor.resume_point(tmp_path) in line
    assert str(tmp_path / "logs" / "process_0.log") in line


@pytest.mark.parametrize("text", [HEARTBEAT_LOST, POLL_LOST], ids=["heartbeat", "poll_for_error"])
def test_a_lost_coordinator_is_named_by_the_other_process(tmp_path, text):
    line, status = diagnose(signal.SIGABRT, joined(1, 2) + text, tmp_path)
    assert status == 75
    assert "process 0 of 2, the coordinator, stopped answering" in line


@pytest.mark.parametrize("process, processes, words", [
    (0, 2, "process 1 of 2 did not join within 20 s"),
    (1, 2, "process 0 of 2 (the coordinator, 127.0.0.1:1234) did not answer within 20 s"),
    (0, 4, "not all 4 processes joined process 0 within 20 s"),
    (2, 4, "process 2 of 4 could not join the job at 127.0.0.1:1234 within 20 s"),
])
def test_a_process_that_could_not_join_names_who_is_missing_as_far_as_it_knows(tmp_path, process, processes, words):
    line, status = diagnose(signal.SIGABRT, joining(process, processes) + REGISTER_FAILED, tmp_path)
    assert status == supervisor.EXIT_LAUNCH_FAILED == 69
    assert line.startswith(words)


def test_a_cluster_detected_process_that_could_not_join_says_so_without_ids(tmp_path):
    auto_detected = mark_line("joining", process=None, processes=None, coordinator=None, timeout_s=600)
    line, status = diagnose(signal.SIGABRT, auto_detected + REGISTER_FAILED, tmp_path)
    assert status == 69
    assert line.startswith("this process could not join the job within 600 s: a process is missing or the "
                           "coordinator cannot be reached")
    assert "None" not in line


def test_peers_listed_as_task_names_are_each_named(tmp_path):
    listed = ("E1128 coordination_service.cc:1549] UNAVAILABLE: The following tasks are unhealthy (stopped sending "
              "heartbeats):\n/job:jax_worker/replica:0/task:1\n/job:jax_worker/replica:0/task:3\nThe tasks have "
              "crashed.\n")
    line, status = diagnose(signal.SIGABRT, joined(0, 4) + listed, tmp_path)
    assert status == 75
    assert "processes 1, 3 of 4 stopped answering" in line


def test_a_mark_cut_short_is_skipped(tmp_path):
    cut = f"{supervisor.MARK} {{\"event\": \"joined\", \"proc\n"
    line, status = diagnose(signal.SIGABRT, joining(0, 2) + cut + REGISTER_FAILED, tmp_path)
    assert status == 69
    assert "process 1 of 2 did not join within 20 s" in line


def test_sigkill_is_reported_as_a_kill_whatever_was_written(tmp_path):
    line, status = diagnose(signal.SIGKILL, joined(0, 2) + UNHEALTHY, tmp_path)
    assert status == 137
    assert "killed by SIGKILL" in line


def test_sigsegv_is_reported_by_its_name(tmp_path):
    line, status = diagnose(signal.SIGSEGV, joined(0, 2), tmp_path)
    assert status == 139
    assert "SIGSEGV" in line


def test_an_unrecognised_abort_after_joining_blames_the_runtime(tmp_path):
    line, status = diagnose(signal.SIGABRT, joined(0, 2) + "F1128 something else went wrong\n", tmp_path)
    assert status == 75
    assert "the JAX distributed runtime stopped process 0 of 2" in line


def test_the_last_mark_of_each_event_wins(tmp_path):
    line, status = diagnose(signal.SIGABRT, joining(0, 2) + "launched again\n" + joining(1, 2) + REGISTER_FAILED,
                            tmp_path)
    assert status == 69
    assert "process 0 of 2 (the coordinator, 127.0.0.1:1234) did not answer" in line


def test_a_mark_quoted_inside_a_runtime_line_is_not_a_mark(tmp_path):
    quoted = "I1128 runtime echoed: " + joined(0, 2)
    line, status = diagnose(signal.SIGABRT, quoted + UNHEALTHY, tmp_path)
    assert status == 134
    assert "killed by SIGABRT" in line


# --- mark


def test_mark_writes_nothing_outside_a_supervised_child(one_process, capfd):
    supervisor.mark("joined", process=0, processes=2)
    assert capfd.readouterr().err == ""


def test_mark_writes_one_line_of_json_in_a_supervised_child(monkeypatch, capfd, tmp_path):
    monkeypatch.setenv(supervisor.LOG_ENV, str(tmp_path / "process_0.log"))
    supervisor.mark("joining", process=1, processes=2, coordinator="10.0.0.1:1234", timeout_s=20)
    written = capfd.readouterr().err
    assert written.count("\n") == 1
    assert written.startswith(supervisor.MARK + " ")
    assert json.loads(written[len(supervisor.MARK):]) == {"event": "joining", "process": 1, "processes": 2,
                                                         "coordinator": "10.0.0.1:1234", "timeout_s": 20}


# --- failures of a multi-process job's collectives


@pytest.fixture
def two_processes(monkeypatch):
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(jax, "process_count", lambda: 2)


def test_a_collective_whose_peer_closed_the_connection_is_a_collective_failure(two_processes):
    gloo = ValueError("UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:547] Connection "
                      "closed by peer [127.0.0.1]:28851")
    assert multihost.is_collective_failure(gloo)


def test_a_timeout_caused_by_a_barrier_of_a_dead_peer_is_a_collective_failure(two_processes):
    """orbax raises TimeoutError from the coordination service's barrier error."""
    try:
        try:
            raise RuntimeError("INTERNAL: Barrier failed because: task is set to ERROR: UNAVAILABLE: Task 1 heartbeat "
                               "timeout. [type.googleapis.com/tensorflow.CoordinationServiceError='']")
        except RuntimeError as barrier:
            raise TimeoutError("Timed out while waiting for async_write_complete barrier.") from barrier
    except TimeoutError as error:
        assert multihost.is_collective_failure(error)


def test_an_error_of_the_process_itself_is_not_a_collective_failure(two_processes):
    assert not multihost.is_collective_failure(KeyError("rubric"))


def test_nothing_is_a_collective_failure_in_one_process():
    assert not multihost.is_collective_failure(ValueError("Gloo AllGather failed: Connection closed by peer"))


def test_checking_a_launch_leaves_the_accelerators_to_the_supervised_child(tmp_path):
    """The supervisor checks the launch before starting its child: were a JAX backend initialised then, the parent
    would hold the host's TPU chips and its child could not get them."""
    config = tmp_path / "run.yaml"
    config.write_text(f"output_dir: {tmp_path / 'out'}\nsteps: 2\nmodel: {{init: {{max_position_embeddings: 96}}}}\n"
                      "rollout: {prompts_per_step: 2, group_size: 2, max_new_tokens: 8}\n")
    script = ("import sys\nfrom jax._src import xla_bridge\nfrom rubric_jax.training.launch import checked_rl_launch\n"
              f"checked_rl_launch({str(config)!r}, [])\nsys.exit(3 if xla_bridge.backends_are_initialized() else 0)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture
def leaving(monkeypatch):
    """The status this process would leave the job with at exit, reset for each test."""
    monkeypatch.setattr(multihost, "_leave_status", None)
    return lambda: multihost._leave_status


@pytest.mark.parametrize("error, status", [(KeyError("rubric"), 1), (KeyboardInterrupt(), 130),
                                           (runs.RunStopped("judge failures over budget"), 1)])
def test_an_error_of_one_process_makes_it_leave_the_job_with_its_status(two_processes, leaving, error, status):
    with pytest.raises(type(error)):
        with multihost.failures_leave_the_job():
            raise error
    assert leaving() == status


def test_a_stop_of_every_process_exits_together(two_processes, leaving):
    with pytest.raises(multihost.ConfigMismatch):
        with multihost.failures_leave_the_job():
            raise multihost.ConfigMismatch("steps differ")
    assert leaving() is None


def test_a_collective_failure_becomes_the_peer_failure_reported(two_processes, leaving, monkeypatch):
    verdict = multihost.PeerFailed("no process was reported dead")
    monkeypatch.setattr(multihost, "await_peer_verdict", lambda error: verdict)
    with pytest.raises(multihost.PeerFailed) as raised:
        with multihost.failures_leave_the_job():
            raise ValueError("Gloo AllGather failed: Connection closed by peer")
    assert raised.value is verdict
    assert leaving() == supervisor.EXIT_PEER_FAILED


def test_one_process_never_leaves_early(leaving):
    with pytest.raises(KeyError):
        with multihost.failures_leave_the_job():
            raise KeyError("rubric")
    assert leaving() is None
