"""`rubric-jax train` in a multi-process job: the command runs the training in a child process and reports how it
ended in one line (docs/multihost.md, "When a host fails").

Why a child: JAX's distributed runtime ends a process itself, with SIGABRT and a C++ stack trace, when the job
cannot go on (a peer that stops sending heartbeats, a coordinator that goes away, peers that do not join in
time), and it offers Python no hook to do otherwise. So the process a user launched (the parent) runs the same
command again as its child, and:
- the child's file descriptor 2, where the C++ runtime writes, goes to the run's log
  `output_dir/logs/<process>.log` (appended to, one header line per launch), and so does the "absl" logger
  (orbax's), while Python's `sys.stderr` stays on the console: the console shows rubric-jax's lines, the log the
  runtime's;
- the child marks its progress in the log (`mark`: it is joining, it has joined as process k of P), so the parent
  knows what the child knew when it died;
- the parent forwards SIGINT, SIGTERM and SIGHUP to the child (which stops after its step, with a checkpoint) and
  otherwise waits; the child is in its own session, so a signal to the parent's process group reaches it once;
  the child dies with the parent (Linux's parent-death signal), so a parent killed with SIGKILL takes its
  training with it, as a host failure would;
- a child that exits returns its own status (it printed its own line); a child that the runtime or a signal
  killed gets its line from the parent (`diagnose`), read from what the runtime wrote to the log.

Exit statuses of a multi-process `rubric-jax train` (besides 0, 1 for a runtime error and 2 for bad input):
`EXIT_LAUNCH_FAILED` (a peer that never joined, a coordinator port in use, an output_dir not shared),
`EXIT_PEER_FAILED` (a peer died, froze or lost its network mid-run: relaunch every process and it resumes from
the last checkpoint), `EXIT_CONFIG_MISMATCH` (the processes were given different configs or code), and 128 + n
for a stop by signal n after a checkpoint (130 Ctrl-C, 143 SIGTERM), as in one process.

`RUBRIC_JAX_SUPERVISE=0` runs the training in the launched process itself (the runtime's own output on the
console). `rubric_jax.train` (Python) is never supervised: its multi-process failures are the runtime's.
"""

import ctypes
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

EXIT_LAUNCH_FAILED = 69  # sysexits' EX_UNAVAILABLE
EXIT_PEER_FAILED = 75  # EX_TEMPFAIL: the same command resumes the run
EXIT_CONFIG_MISMATCH = 78  # EX_CONFIG

LOG_ENV = "RUBRIC_JAX_SUPERVISED_LOG"  # set in the child: the log its file descriptor 2 goes to
PARENT_ENV = "RUBRIC_JAX_SUPERVISOR_PID"
SUPERVISE_ENV = "RUBRIC_JAX_SUPERVISE"
MARK = "[rubric-jax supervisor]"
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1


def is_child(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is a supervised child (`supervise` started it)."""
    return LOG_ENV in env


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether `rubric-jax train` should run its training in a supervised child: a multi-process job
    (`multi_process_environment`), not already the child, supervision not turned off (RUBRIC_JAX_SUPERVISE=0)."""
    return multi_process_environment(env) and not is_child(env) and env.get(SUPERVISE_ENV) != "0"


def multi_process_environment(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment describes a multi-process JAX job:
    - JAX_COORDINATOR_ADDRESS is set (with JAX_NUM_PROCESSES and JAX_PROCESS_ID);
    - SLURM launched more than one task (SLURM_NTASKS > 1 inside an srun step);
    - Open MPI launched more than one rank (OMPI_COMM_WORLD_SIZE > 1);
    - a TPU slice lists more than one worker (TPU_WORKER_HOSTNAMES / TPU_PROCESS_ADDRESSES);
    - RUBRIC_JAX_DISTRIBUTED=1, for clusters JAX detects only by asking them (a GCE TPU VM's metadata server).
    RUBRIC_JAX_DISTRIBUTED=0 says no whatever else is set."""
    forced = env.get("RUBRIC_JAX_DISTRIBUTED")
    if forced == "0":
        return False
    tpu_workers = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or ""
    return (
        forced == "1"
        or "JAX_COORDINATOR_ADDRESS" in env
        or ("SLURM_STEP_NODELIST" in env and int(env.get("SLURM_NTASKS", "1")) > 1)
        or int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
        or "," in tpu_workers
    )


def process_label(env: Mapping[str, str] = os.environ) -> str:
    """The name of this process's log: `process_<k>` when the launcher says which process this is
    (JAX_PROCESS_ID, SLURM_PROCID, OMPI_COMM_WORLD_RANK, TPU_WORKER_ID), else `<host>-<pid>`."""
    for variable in ("JAX_PROCESS_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "TPU_WORKER_ID"):
        if env.get(variable, "").isdigit():
            return f"process_{int(env[variable])}"
    return f"{socket.gethostname()}-{os.getpid()}"


def mark(event: str, **fields) -> None:
    """Writes `event` and `fields` to the log as a line the parent reads (`diagnose`); nothing outside a
    supervised child. Raw to file descriptor 2, where the runtime writes too, so the order is kept."""
    if is_child():
        os.write(2, f"{MARK} {json.dumps({'event': event, **fields})}\n".encode())


def enter_child() -> None:
    """In a supervised child (`is_child`), first thing: die with the parent, send file descriptor 2 to the log
    and keep Python's `sys.stderr` on the console. Nothing elsewhere."""
    if not is_child():
        return
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(os.environ.get(PARENT_ENV, "0")):
        os._exit(EXIT_PEER_FAILED)  # the parent died before the death signal was set
    console = os.dup(2)
    log = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 2)
    os.close(log)
    sys.stderr = open(console, "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    # orbax and the runtime's Python side log through absl: their errors about a failed peer go with the C++ ones.
    absl = logging.getLogger("absl")
    absl.addHandler(logging.StreamHandler(open(2, "w", buffering=1, closefd=False, encoding="utf-8")))
    absl.propagate = False


def supervise(argv: Sequence[str], output_dir: str, heartbeat_timeout_s: int) -> tuple[int, Optional[str]]:
    """Runs `rubric-jax <argv>` as a supervised child (module docstring): (its exit status, None) when it
    exited (it printed its own line), (status, line) from `diagnose` when the runtime or a signal killed it.
    `output_dir` is the run's (its logs/ and checkpoints/), `heartbeat_timeout_s` the run's
    distributed.heartbeat_timeout_s, named in the line."""
    log_path = Path(output_dir) / "logs" / f"{process_label()}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"=== rubric-jax {' '.join(argv)}: launched {time.strftime('%Y-%m-%d %H:%M:%S')} on "
                  f"{socket.gethostname()}, pid {os.getpid()}\n")
        start = log.tell()
    env = {**os.environ, LOG_ENV: str(log_path), PARENT_ENV: str(os.getpid())}
    child = subprocess.Popen([sys.executable, "-m", "rubric_jax.cli", *argv], env=env, start_new_session=True)
    previous = {number: signal.signal(number, lambda number, frame: child.send_signal(number))
                for number in FORWARDED_SIGNALS}
    try:
        status = child.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if status >= 0:
        return status, None
    with open(log_path, encoding="utf-8", errors="replace") as log:
        log.seek(start)
        written = log.read()
    line, exit_status = diagnose(-status, written, Path(output_dir), heartbeat_timeout_s, log_path)
    return exit_status, line


# The tasks as the runtime lists them: "1", "1, 2", or "/job:jax_worker/replica:0/task:1".
_UNHEALTHY = re.compile(r"tasks are unhealthy \(stopped sending heartbeats\):\s*((?:[\w:/]*\d+[,\s]*)+)")
_COORDINATOR_LOST = re.compile(r"CoordinationService/(Heartbeat|PollForError)")
_JOIN_FAILED = re.compile(r"CoordinationService/(RegisterTask|WaitForAllTasks)|Barrier timed out")


def _marks(written: str) -> dict[str, dict]:
    """The child's marks in `written` (its log since launch), the last of each event."""
    marks = {}
    for line in written.splitlines():
        if line.startswith(MARK):
            try:
                record = json.loads(line[len(MARK):])
                marks[record.pop("event")] = record
            except (ValueError, AttributeError, KeyError):  # a line cut short by the death it reports
                continue
    return marks


def resume_point(output_dir: Path) -> str:
    """Where a relaunch resumes: the newest committed checkpoint in output_dir/checkpoints, or a fresh start."""
    checkpoints = output_dir / "checkpoints"
    steps = sorted(int(path.name) for path in checkpoints.iterdir() if path.name.isdigit()) \
        if checkpoints.is_dir() else []
    if not steps:
        return "no checkpoint was committed, so the same command on every host starts the run over"
    return f"the same command on every host resumes it from the checkpoint of step {steps[-1]} ({checkpoints})"


def diagnose(signal_number: int, written: str, output_dir: Path, heartbeat_timeout_s: int, log_path: Path
             ) -> tuple[str, int]:
    """(one line, exit status) for a child killed by `signal_number`, from `written`, its log since launch: the
    process that stopped sending heartbeats, a coordinator that went away, peers that did not join in time, or
    the signal itself (SIGKILL: the out-of-memory killer, or a kill)."""
    marks = _marks(written)
    joining, joined = marks.get("joining", {}), marks.get("joined")
    log = f"(log: {log_path})"
    if signal_number == signal.SIGABRT and joined is None and joining and _JOIN_FAILED.search(written):
        processes, process = joining.get("processes"), joining.get("process")
        timeout = joining.get("timeout_s")
        if process is None or processes is None:  # the cluster named them to JAX alone (SLURM, a TPU slice)
            what = f"this process could not join the job within {timeout} s: a process is missing or the coordinator"\
                   " cannot be reached"
        elif process == 0 and processes == 2:
            what = f"process 1 of 2 did not join within {timeout} s"
        elif process == 0:
            what = f"not all {processes} processes joined process 0 within {timeout} s"
        elif processes == 2:
            what = (f"process 0 of 2 (the coordinator, {joining.get('coordinator')}) did not answer within "
                    f"{timeout} s")
        else:
            what = (f"process {process} of {processes} could not join the job at {joining.get('coordinator')} "
                    f"within {timeout} s: the coordinator (process 0) or another process is missing")
        return (f"{what}: start the same command on every host, each with its own process id, and check that they "
                f"reach the coordinator's address {log}", EXIT_LAUNCH_FAILED)
    if signal_number == signal.SIGABRT and joined is not None:
        processes = joined["processes"]
        if unhealthy := _UNHEALTHY.search(written):
            named = unhealthy.group(1)
            failed = sorted({int(number) for number in re.findall(r"task:(\d+)", named) or re.findall(r"\d+", named)})
            who = ", ".join(map(str, failed))
            what = (f"process{'es' if len(failed) > 1 else ''} {who} of {processes} stopped answering (no heartbeat "
                    f"for {heartbeat_timeout_s} s: died, froze or lost its network)")
        elif joined["process"] != 0 and _COORDINATOR_LOST.search(written):
            what = f"process 0 of {processes}, the coordinator, stopped answering (died, froze or lost its network)"
        else:
            what = f"the JAX distributed runtime stopped process {joined['process']} of {processes}"
        return f"{what}; {resume_point(output_dir)} {log}", EXIT_PEER_FAILED
    name = signal.Signals(signal_number).name
    cause = " (the out-of-memory killer, or a kill)" if signal_number == signal.SIGKILL else ""
    return (f"the training process was killed by {name}{cause}; {resume_point(output_dir)} {log}",
            128 + signal_number)
