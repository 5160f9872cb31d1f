"""`transformers serve`, Hugging Face's OpenAI-compatible server, on a loopback port with a tiny local checkpoint:
a third-party /v1/chat/completions for the judge tests. The stand-in of tests/inference/standin_server.py only
checks our client against our own reading of the API; this server was written by others. `serve` starts any such
server and waits for its health (tests/judges/llama_cpp.py's `llama-server` too).

What `transformers serve MODEL` does as of transformers 5.6 (transformers/cli/serve.py and cli/serving/, read in
5.6.0 and 5.24.0, run with 5.24.0):
- It loads MODEL (here a local directory) before it listens, so GET /health answers 200 only once the model is
  ready, and pins itself to it: a request's "model" must be MODEL exactly as given on the command line (or
  absent); any other name is a 400.
- It answers 422 to a body field that OpenAI's chat-completion parameters do not know, and ignores, with a
  warning, the known ones it does not implement (`response_format`, `n`, `logprobs`, ...): a JSON schema is
  accepted but not enforced.
- `max_tokens` caps the answer, temperature 0 is greedy, and requests are generated one at a time on one thread.

The server runs with HF_HUB_OFFLINE=1 (nothing is downloaded) and HF_HUB_DISABLE_UPDATE_CHECK=1 (its CLI would
otherwise ask PyPI for a newer transformers), in a session of its own so that stopping it stops its children.
"""

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

import pytest

HOST = "127.0.0.1"
_LOG_TAIL_CHARS = 4000
_POLL_S = 0.1
_PROBE_TIMEOUT_S = 2.0
_STOP_TIMEOUT_S = 10.0
# The probes go straight to the loopback port, whatever proxy the environment names.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclasses.dataclass(frozen=True)
class RealServer:
    """A running server: `base_url`, the `model` name every request must carry, and the file its output goes to."""

    base_url: str
    model: str
    log_path: Path

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-_LOG_TAIL_CHARS:]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _healthy(base_url: str) -> bool:
    try:
        with _DIRECT.open(base_url + "/health", timeout=_PROBE_TIMEOUT_S) as response:
            return response.status == 200
    except OSError:  # refused or reset while it starts, a probe timeout, or an HTTP error status (URLError)
        return False


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, then, once the server has exited or after _STOP_TIMEOUT_S, SIGKILL
    to whatever is left of the group."""
    with contextlib.suppress(ProcessLookupError):  # the whole group has exited
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(_STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@contextlib.contextmanager
def serve(command: list[str], model: str, base_url: str, log_path: Path, startup_timeout_s: float,
          env: Optional[dict] = None) -> Iterator[RealServer]:
    """Runs `command` (a server listening at `base_url`), its output to `log_path`, and yields the RealServer once
    GET /health answers 200; the server is stopped on leaving, however the block ends. RuntimeError with the
    log's tail if the server exits first or is not healthy within `startup_timeout_s`."""
    server = RealServer(base_url, model, log_path)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not _healthy(server.base_url):
            if process.poll() is not None:
                raise RuntimeError(f"`{' '.join(command)}` exited with code {process.returncode} before it answered "
                                   f"GET /health; its output ends:\n{server.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"`{' '.join(command)}` did not answer GET /health within {startup_timeout_s} s; "
                                   f"its output ends:\n{server.log_tail()}")
            time.sleep(_POLL_S)
        yield server
    finally:
        _stop(process)


def transformers_serve(checkpoint_dir: os.PathLike, log_path: Path, startup_timeout_s: float = 120.0
                       ) -> contextlib.AbstractContextManager[RealServer]:
    """`serve`s `checkpoint_dir` with `transformers serve` on a free loopback port."""
    model, port = str(checkpoint_dir), free_port()
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", model, "--host", HOST,
               "--port", str(port), "--device", "cpu"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1"}
    return serve(command, model, f"http://{HOST}:{port}", log_path, startup_timeout_s, env)


@pytest.fixture(scope="module")
def transformers_server(tiny_qwen3_dir, tmp_path_factory) -> Iterator[RealServer]:
    """`transformers serve` of tiny Qwen3, one per test module."""
    log_path = tmp_path_factory.mktemp("transformers_serve") / "server.log"
    with transformers_serve(tiny_qwen3_dir, log_path) as server:
        yield server
