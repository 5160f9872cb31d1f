"""Launching a multi-process run (docs/multihost.md), and the checks that make its failures loud rather than
silent.

`initialize(config.distributed)` joins the job when the environment describes one
(`supervisor.multi_process_environment`): `jax.distributed.initialize` with the run's timeouts, after checking
that process 0 can take the coordinator's port. Then, before any compute, every process of the job:
- `check_same_config`: fingerprints its resolved config (every key but where the host finds the run directory and
  its servers, `PER_HOST_KEYS`) and its code (a digest of
  rubric_jax's source, jax's and jaxlib's versions), and the processes exchange the fingerprints in one
  all-gather; any difference stops every process (ConfigMismatch) with the same line, naming the first differing
  keys and which process had which value. Without it a host given another learning rate trains silently wrong,
  and one given another step count crashes the job in a collective.
- `check_shared_directory`: process 0 writes a random token into output_dir and the others read it back within
  `distributed.shared_dir_timeout_s`; otherwise every process stops (LaunchFailed): a run directory that is not
  shared would hang the first checkpoint. output_dir itself may differ between hosts (the share mounted at
  another path), which this check, not the fingerprint, judges.

A process that fails alone (a runtime error on one host) leaves the job at exit (`failures_leave_the_job`),
skipping JAX's shutdown barrier, where it would wait for peers that wait for it in a collective; a collective that
fails because a peer went away (`is_collective_failure`) waits for the runtime's verdict on which peer it was
(`await_peer_verdict`), which `rubric-jax train`'s supervisor reports (`training.supervisor`).
"""

import atexit
import contextlib
import hashlib
import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import jax
import jaxlib
import numpy as np
from jax.experimental import multihost_utils

import rubric_jax
from rubric_jax.training import supervisor
from rubric_jax.training.run_config import DistributedConfig
from rubric_jax.training.runs import RunStopped, flat_keys
from rubric_jax.yaml_config import config_to_dict

TOKEN_FILE = ".launch_token"
# Where a host finds things, which may be spelled differently on each: the run directory (the share mounted at
# another path; `check_shared_directory` judges it) and the servers (each host its own SGLang server or judge).
PER_HOST_KEYS = ("output_dir", "rollout.sglang_url", "rollout.frozen_sglang_url", "judge.url", "meta_verifier.url")
# How much longer than the heartbeat timeout a process waits for the runtime to name a failed peer.
VERDICT_GRACE_S = 30
COORDINATOR_LINGER_S = 2
# What a collective's transport says when its peer is gone (gloo on CPU, NCCL on GPU, gRPC), and the coordination
# service when a barrier's peer is (orbax's commit barrier).
_COLLECTIVE_FAILURES = ("Gloo", "NCCL", "Connection closed by peer", "Connection reset by peer", "Broken pipe",
                        "Socket closed", "CoordinationServiceError", "heartbeat timeout")


class LaunchFailed(RunStopped):
    """A multi-process launch that cannot start: a coordinator port in use, an output_dir not shared."""

    exit_code = supervisor.EXIT_LAUNCH_FAILED
    every_process = True


class ConfigMismatch(RunStopped):
    """The processes of a job were given different configs or run different code."""

    exit_code = supervisor.EXIT_CONFIG_MISMATCH
    every_process = True


class PeerFailed(RunStopped):
    """A peer of a multi-process run failed mid-run: the same command on every host resumes the run."""

    exit_code = supervisor.EXIT_PEER_FAILED


def failure(message: str, exit_status: int) -> RunStopped:
    """The RunStopped carrying `exit_status` (one of the module's classes, else RunStopped with it)."""
    for kind in (LaunchFailed, ConfigMismatch, PeerFailed):
        if kind.exit_code == exit_status:
            return kind(message)
    stopped = RunStopped(message)
    stopped.exit_code = exit_status
    return stopped


def initialize(settings: DistributedConfig) -> bool:
    """Joins the multi-process job the environment describes (`supervisor.multi_process_environment`) with the
    timeouts of `settings`; returns whether JAX is now multi-process. Call it first, before any JAX computation;
    calling it again is harmless. With JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID those are
    passed on; otherwise JAX detects the cluster (SLURM, Open MPI, a TPU slice). Process 0, when it knows it is
    process 0, first checks that the coordinator's port is free (LaunchFailed), where JAX would crash."""
    if jax.distributed.is_initialized():
        return True
    env = os.environ
    if not supervisor.multi_process_environment(env):
        return False
    explicit = {arg: int(env[var]) for arg, var in (("num_processes", "JAX_NUM_PROCESSES"),
                                                    ("process_id", "JAX_PROCESS_ID")) if var in env}
    coordinator = env.get("JAX_COORDINATOR_ADDRESS")
    if explicit.get("process_id") == 0 and coordinator:
        check_port_free(coordinator)
    supervisor.mark("joining", process=explicit.get("process_id"), processes=explicit.get("num_processes"),
                    coordinator=coordinator, timeout_s=settings.initialization_timeout_s)
    jax.distributed.initialize(**explicit, initialization_timeout=settings.initialization_timeout_s,
                               heartbeat_timeout_seconds=settings.heartbeat_timeout_s,
                               shutdown_timeout_seconds=settings.shutdown_timeout_s)
    global _heartbeat_timeout_s
    _heartbeat_timeout_s = settings.heartbeat_timeout_s
    atexit.register(_leave_after_failure)
    supervisor.mark("joined", process=jax.process_index(), processes=jax.process_count())
    return True


_heartbeat_timeout_s = DistributedConfig().heartbeat_timeout_s  # the joined job's, for `await_peer_verdict`


def check_port_free(address: str) -> None:
    """LaunchFailed when the port of the coordinator's `address` (host:port) is being listened on here: JAX's
    coordinator binds it on every interface, and fails in C++ when it cannot."""
    port = int(address.rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR: a port a finished run left in TIME_WAIT is free; only a listener refuses the bind.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as error:
            raise LaunchFailed(f"the coordinator's port {port} (JAX_COORDINATOR_ADDRESS={address}) is in use on this "
                               f"host ({error.strerror}): another run or a leftover process holds it; stop it or "
                               "give every process another port") from None


def code_fingerprint() -> dict[str, str]:
    """What code this process runs: a digest of rubric_jax's source files, jax's and jaxlib's versions."""
    package = Path(rubric_jax.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return {"code: rubric_jax source": digest.hexdigest()[:12], "code: jax": jax.__version__,
            "code: jaxlib": jaxlib.__version__}


def config_fingerprint(config: Any) -> dict[str, str]:
    """The keys a job's processes must agree on: the code (`code_fingerprint`), then every resolved config key
    but PER_HOST_KEYS, each value as canonical JSON."""
    keys = {key: json.dumps(value, sort_keys=True, default=str)
            for key, value in flat_keys(config_to_dict(config)).items() if key not in PER_HOST_KEYS}
    return {**code_fingerprint(), **keys}


def _allgather_bytes(data: bytes) -> list[bytes]:
    """Every process's `data`, in process order (two all-gathers: the lengths, then the padded bytes)."""
    lengths = multihost_utils.process_allgather(np.asarray([len(data)], np.int32)).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[:len(data)] = np.frombuffer(data, np.uint8)
    rows = multihost_utils.process_allgather(padded).reshape(len(lengths), -1)
    return [rows[index, :length].tobytes() for index, length in enumerate(lengths)]


def fingerprint_differences(fingerprints: list[dict[str, str]], shown: int = 3) -> Optional[str]:
    """None when every process's fingerprint is the same; else what differs: the code first, then the shallowest
    config keys, up to `shown` of them, each with the processes that had each value."""
    missing = "(absent)"
    keys = sorted({key for fingerprint in fingerprints for key in fingerprint},
                  key=lambda key: (not key.startswith("code: "), key.count("."), key))
    differing = [key for key in keys if len({fingerprint.get(key, missing) for fingerprint in fingerprints}) > 1]
    if not differing:
        return None
    parts = []
    for key in differing[:shown]:
        holders: dict[str, list[int]] = {}
        for process, fingerprint in enumerate(fingerprints):
            holders.setdefault(fingerprint.get(key, missing), []).append(process)
        values = ", ".join(f"{value} (process{'es' if len(processes) > 1 else ''} {', '.join(map(str, processes))})"
                           for value, processes in holders.items())
        parts.append(f"{key}: {values}")
    more = f" (and {len(differing) - shown} more)" if len(differing) > shown else ""
    return "; ".join(parts) + more


def check_same_config(config: Any) -> None:
    """ConfigMismatch, raised on every process alike, when the job's processes differ in their config or code
    (`config_fingerprint`); nothing in one process. Every process must call it."""
    if jax.process_count() == 1:
        return
    mine = json.dumps(config_fingerprint(config), sort_keys=True).encode()
    differences = fingerprint_differences([json.loads(data) for data in _allgather_bytes(mine)])
    if differences is not None:
        raise ConfigMismatch(f"the {jax.process_count()} processes were not given the same run: {differences}; "
                             "start every host with the same config file, overrides and rubric_jax version")


def _sees_token(path: Path, token: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if path.read_text(encoding="utf-8") == token:
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def check_shared_directory(out: Path, timeout_s: float) -> None:
    """LaunchFailed, raised on every process alike, unless every process sees the same directory `out`: process
    0 writes a random token into it (creating it), the others read it back within `timeout_s` seconds. Nothing
    in one process. Every process must call it."""
    if jax.process_count() == 1:
        return
    first = jax.process_index() == 0
    token = multihost_utils.broadcast_one_to_all(np.frombuffer(secrets.token_bytes(16), np.uint8)).tobytes().hex()
    path = out / TOKEN_FILE
    if first:
        try:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(token, encoding="utf-8")
            seen = True
        except OSError as error:
            print(f"[rubric-jax] process 0 cannot write output_dir {out}: {error}", file=sys.stderr, flush=True)
            seen = False
    else:
        seen = _sees_token(path, token, timeout_s)
    seen_by = multihost_utils.process_allgather(np.asarray([seen], np.int32)).reshape(-1)
    if first:
        path.unlink(missing_ok=True)
    blind = [process for process, saw in enumerate(seen_by) if not saw]
    if not blind:
        return
    if blind == [0]:
        raise LaunchFailed(f"process 0 cannot write output_dir {out}")
    raise LaunchFailed(f"output_dir {out} is not one directory for every host: process"
                       f"{'es' if len(blind) > 1 else ''} {', '.join(map(str, blind))} did not see the token "
                       f"process 0 wrote there within {timeout_s:g} s; put output_dir on a filesystem every host "
                       "mounts (NFS, Filestore, a gcsfuse bucket)")


def is_collective_failure(error: BaseException) -> bool:
    """Whether `error`, in a multi-process job, is a collective whose peer went away: its transport's words in
    `error` or in the errors that caused it (orbax raises a TimeoutError from the barrier's error)."""
    if not (jax.distributed.is_initialized() and jax.process_count() > 1):
        return False
    while error is not None:
        if any(words in str(error) for words in _COLLECTIVE_FAILURES):
            return True
        error = error.__cause__ or error.__context__
    return False


def await_peer_verdict(error: BaseException) -> PeerFailed:
    """After a collective failed because a peer went away (`is_collective_failure`): the JAX runtime names the
    process once it has missed its heartbeats, and ends this one (SIGABRT), which the supervisor reports. Waits
    for that, up to the heartbeat timeout and VERDICT_GRACE_S, then returns the PeerFailed to report instead."""
    timeout_s = _heartbeat_timeout_s + VERDICT_GRACE_S
    print(f"[rubric-jax] a collective failed ({error}); waiting up to {timeout_s} s for the runtime to name the "
          "process that failed", file=sys.__stderr__ if supervisor.is_child() else sys.stderr, flush=True)
    time.sleep(timeout_s)
    return PeerFailed(f"a collective with the other processes failed and no process was reported dead within "
                      f"{timeout_s} s: {error}")


_leave_status: Optional[int] = None  # set by `failures_leave_the_job`: this process's exit status


@contextlib.contextmanager
def failures_leave_the_job() -> Iterator[None]:
    """Around a multi-process run: an error that stops this process alone makes it leave the job at exit with the
    status the CLI reports (`_leave_at_exit`), rather than waiting in JAX's shutdown barrier for peers that wait for
    it in a collective. A collective whose peer went away (`is_collective_failure`) first waits for the runtime's
    verdict on which peer (`await_peer_verdict`) and becomes PeerFailed. A stop raised by every process at once
    (`RunStopped.every_process`) exits normally, together. Nothing in one process."""
    try:
        yield
    except RunStopped as stop:
        if not stop.every_process:
            _leave_at_exit(stop.exit_code)
        raise
    except KeyboardInterrupt:
        _leave_at_exit(130)
        raise
    except Exception as error:
        if is_collective_failure(error):
            stopped = await_peer_verdict(error)
            _leave_at_exit(stopped.exit_code)
            raise stopped from error
        _leave_at_exit(1)
        raise


def _leave_at_exit(status: int) -> None:
    global _leave_status
    if jax.distributed.is_initialized() and jax.process_count() > 1:
        _leave_status = status


def _leave_after_failure() -> None:
    """At exit, after a failure of this process's own (`failures_leave_the_job`), before JAX's shutdown (atexit runs
    the latest registered first): ends the process with its status at once."""
    if _leave_status is None:
        return
    if jax.process_index() == 0:
        # The coordinator's exit ends every peer's runtime at once: a peer stopping for the same reason gets to
        # say so first.
        time.sleep(COORDINATOR_LINGER_S)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_leave_status)
