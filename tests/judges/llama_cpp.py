"""llama.cpp's own OpenAI-compatible server, `llama-server`, on a loopback port with a tiny local checkpoint: the
third-party server of tests/judges/test_llama_server.py, which enforces JSON schemas (real_server.py's
`transformers serve` ignores them).

How it gets here, with nothing but the package index and a C++ toolchain:
- llama.cpp's source is the one vendored by the llama-cpp-python source distribution (LLAMA_CPP_PYTHON, fetched
  with `pip download`); `llama-server` alone is built with CMake (about 8 minutes on 2 cores), CPU only, linked
  statically, without the web UI, HTTPS or network downloads. The binary goes to a cache beside the repository
  (CACHE, ignored by git), put there atomically (built in a scratch directory, renamed when complete) under a file
  lock, so a killed or concurrent build never leaves a half-built binary to a later run. CI starts from a clean
  checkout and builds it: when a session collects a test that needs the server, tests/conftest.py starts the build
  in the background (`start_building`, at low priority), so it overlaps the tests that run before.
- The checkpoint is converted to GGUF by the same source's `convert_hf_to_gguf.py` (gguf_convert.py, in a
  process of its own), float32. Its converter identifies a BPE pre-tokenizer by hashing what it does to a test
  text and knows only published tokenizers, so the tiny byte-level BPE is declared `gpt-2` (the same byte-level
  pre-tokenizer); its context is raised to 4096 so that whole judge prompts fit (`-c 4096`).

What `llama-server` does, read off build 0c1e570 (vendored by llama-cpp-python 0.3.36):
- `response_format` `json_schema` and `json_object` with a `schema` are both compiled to a grammar that constrains
  decoding: the answer always has the schema's shape. What a grammar cannot express is not enforced: number
  ranges, unique ids; a schema it cannot compile is a 400 ("Unable to generate parser ...").
- A request whose prompt exceeds the context is a 400 (`exceed_context_size_error`), whatever its format.
- It serves one model under any requested name; GET /v1/models lists its `--alias` (else the path given). With
  `--api-key` every /v1 route wants `Authorization: Bearer <key>` (401 otherwise); GET /health stays open.
"""

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import Iterator, Optional

import pytest

from tests.judges import real_server

LLAMA_CPP_PYTHON = "0.3.36"
REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / f"llama-cpp-python-{LLAMA_CPP_PYTHON}"
CONTEXT = 4096
_CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_APP=OFF", "-DBUILD_SHARED_LIBS=OFF",
)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


_RUNNING: set[subprocess.Popen] = set()


@atexit.register
def _stop_running() -> None:
    """A background build still running when the session ends (its tests deselected or never reached) is
    stopped with its children, not left to the machine."""
    for process in list(_RUNNING):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def _run(command: list, log: Path, what: str) -> None:
    with open(log, "ab") as out:
        process = subprocess.Popen(["nice", "-n", "10", *map(str, command)], stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        _RUNNING.add(process)
        try:
            code = process.wait()
        finally:
            _RUNNING.discard(process)
    if code != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{what} failed with code {code}; {log} ends:\n{tail}")


def llama_cpp_source() -> Path:
    """llama.cpp's source tree from the llama-cpp-python sdist, downloaded and unpacked into CACHE once."""
    source = CACHE / "llama.cpp"
    with _locked(CACHE / "source.lock"):
        if not source.is_dir():
            scratch = CACHE / "download"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(parents=True)
            _run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                  "--dest", scratch, f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], CACHE / "download.log",
                 "downloading the llama-cpp-python sdist")
            [sdist] = scratch.glob("*.tar.gz")
            with tarfile.open(sdist) as archive:
                archive.extractall(scratch, filter="data")
            os.replace(scratch / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp", source)
            shutil.rmtree(scratch)
    return source


BINARY = CACHE / "bin" / "llama-server"
_background: dict[str, object] = {}


def _missing_tools() -> list[str]:
    return [tool for tool in ("cmake", "c++", "nice") if shutil.which(tool) is None]


def start_building() -> None:
    """Starts `llama_server_binary`'s build in a background thread, once, unless the binary exists or the tools
    are missing; `llama_server_binary` then waits for it."""
    if "thread" in _background or BINARY.is_file() or _missing_tools():
        return

    def build() -> None:
        try:
            _build()
        except BaseException as error:  # handed to the test that waits for the binary
            _background["error"] = error

    _background["thread"] = threading.Thread(target=build, name="llama-server build", daemon=True)
    _background["thread"].start()


def llama_server_binary() -> Path:
    """`llama-server`, built into CACHE once (module docstring), or the background build's; skips the test when
    CMake or a C++ compiler is missing."""
    if "thread" in _background:
        _background["thread"].join()
        if "error" in _background:
            raise RuntimeError("the background build of llama-server failed") from _background["error"]
    if BINARY.is_file():
        return BINARY
    missing = _missing_tools()
    if missing:
        pytest.skip(f"building llama-server needs {' and '.join(missing)}")
    return _build()


def _build() -> Path:
    """Builds BINARY (module docstring) unless another build made it while this one waited for the lock."""
    source = llama_cpp_source()
    with _locked(CACHE / "build.lock"):
        if not BINARY.is_file():
            scratch = CACHE / "build"
            shutil.rmtree(scratch, ignore_errors=True)
            log = CACHE / "build.log"
            log.unlink(missing_ok=True)
            _run(["cmake", "-S", source, "-B", scratch, *_CMAKE_OPTIONS], log, "configuring llama.cpp")
            _run(["cmake", "--build", scratch, "--target", "llama-server", "--parallel", str(os.cpu_count() or 1)],
                 log, "building llama-server")
            BINARY.parent.mkdir(exist_ok=True)
            os.replace(scratch / "bin" / "llama-server", BINARY)  # static: it needs nothing else of the build
            shutil.rmtree(scratch)
    return BINARY


def convert_to_gguf(checkpoint_dir: Path, out: Path) -> Path:
    """A float32 GGUF of the Hugging Face checkpoint at `checkpoint_dir` with a CONTEXT-token context (module
    docstring), written to `out`."""
    copy = out.parent / f"{out.stem}-hf"
    shutil.copytree(checkpoint_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "max_position_embeddings": CONTEXT}))
    _run([sys.executable, Path(__file__).with_name("gguf_convert.py"), llama_cpp_source(), copy, out],
         out.with_suffix(".log"), "converting to GGUF")
    return out


def llama_serve(binary: Path, gguf: Path, log_path: Path, api_key: Optional[str] = None,
                startup_timeout_s: float = 60.0) -> contextlib.AbstractContextManager[real_server.RealServer]:
    """`real_server.serve`s `gguf` with `llama-server` on a free loopback port, one slot of CONTEXT tokens, under
    the name of the file without its suffix (`--alias`, the RealServer's model); every /v1 request then needs
    `api_key` when one is given. No prompt cache: a prompt asked again is computed afresh, in the same shapes, so
    greedy decoding answers it the same (a cached prefix changes the matmuls' shapes, hence their rounding, which
    can flip a near-tie of the random model)."""
    port = real_server.free_port()
    command = [str(binary), "-m", str(gguf), "--alias", gguf.stem, "--host", real_server.HOST, "--port", str(port),
               "-np", "1", "-c", str(CONTEXT), "--seed", "0", "--no-cache-prompt", "--cache-ram", "0",
               *(["--api-key", api_key] if api_key else [])]
    return real_server.serve(command, gguf.stem, f"http://{real_server.HOST}:{port}", log_path, startup_timeout_s)


@pytest.fixture(scope="session")
def llama_gguf(tiny_qwen3_dir, tmp_path_factory) -> Path:
    """Tiny Qwen3 as GGUF."""
    return convert_to_gguf(Path(tiny_qwen3_dir), tmp_path_factory.mktemp("gguf") / "tiny-qwen3.gguf")


@pytest.fixture(scope="module")
def llama_server(llama_gguf, tmp_path_factory) -> Iterator[real_server.RealServer]:
    """`llama-server` of tiny Qwen3, one per test module."""
    binary = llama_server_binary()
    with llama_serve(binary, llama_gguf, tmp_path_factory.mktemp("llama_server") / "server.log") as server:
        yield server
