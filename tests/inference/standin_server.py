"""A local stand-in for an SGLang 0.5.23 server: the HTTP shapes of REFERENCE.md section 3 on a loopback port,
backed by any `RolloutEngine` (the embedded JAX sampler in tests), behaving as the real server does (below), with
the rare corruptions of real answers as injectable faults. The SGLang engine's tests are read against this text.

Endpoints (what SGLang 0.5.23 answers, REFERENCE.md section 3):
- GET  /health, /health_generate: 200, empty body.
- GET  /model_info: {model_path, tokenizer_path, is_generation, weight_version}; `model_path` is the served path
  (the constructor's `model_path`, then that of the last successful /update_weights_from_disk), `tokenizer_path`
  stays the constructor's.
- GET  /v1/models: {"object": "list", "data": [{id, object "model", created, owned_by "sglang", root,
  max_model_len}]}, `id` and `root` the served path, `max_model_len` the context length (null: none).
- POST /generate: `input_ids` (one prompt or a batch) or `text` (with a tokenizer), `sampling_params` (one object
  for every prompt, or a list with one object per prompt of the batch; the keys `SamplingParams.to_sglang` writes,
  any other key is a 400 here, so a misspelt key in the client shows; `max_new_tokens` defaults to 128),
  `return_logprob`, `logprob_start_len` (-1 or absent: output logprobs only), `extra_key`, `rid`. Answer: one
  object for one prompt (not a batch) with n = 1, else a flat prompt-major list (each prompt's n samples in turn)
  of {text, output_ids, meta_info: {id, finish_reason, prompt_tokens, completion_tokens, cached_tokens,
  weight_version (the server's version when the answer is sent), weight_versions ([{version, start, end}]: the
  version that generated output tokens [start, end), one span [0, len(output_ids)) here), output_token_logprobs
  [[logprob, id, null], ...] (with return_logprob)}}.
  - Seeds: `sampling_seed` is ignored unless the server runs with `--enable-deterministic-inference`
    (`deterministic_inference`). Without it every sample gets a fresh seed from the stand-in's own
    `random.Random(seed)` (re-seeded by `reset`), whatever the request says. With it an entry's (one prompt's)
    seed is honoured and its n samples share it, so they are identical; an entry without `sampling_seed` uses 42.
    On an `EmbeddedEngine` a sample drawn with seed s equals `generate_rows([(prompt, s)], params)[0]`: one
    `generate_rows` call runs every entry whose sampling params are equal apart from the seed (and n). Any other
    engine gets one `generate([prompt], params)` call per run of consecutive entries with the same prompt and
    equal params apart from the seed (n the run's total, the seed the run's first sample's), so a client that
    sends a prompt n times with n = 1 reaches it as one prompt with n samples.
  - Context length: a prompt of `context_length` tokens or more (default: the engine's model's
    max_position_embeddings) fails the whole request with 400 {"error": {"message": "The input (N tokens) is longer
    than the model's context length (M tokens)."}} (SGLang turns such a status-carrying abort into an HTTP error
    for the whole batched request).
  - Gates: a request waits (without starting) while generation is paused or a weight update waits or loads; it is
    running from then until its answer is sent, `latency_s` included.
- POST /update_weights_from_disk {model_path, load_format, weight_version, flush_cache, abort_all_requests}: a
  writer lock. Unpaused, it waits until every running /generate has been answered (new ones wait behind it), then
  loads; paused, it loads at once. The load sleeps `load_delay_s` (a slow load), then reads the HF directory with
  `load_hf_checkpoint` into the engine, and runs to its end even when the client stops waiting. Answer {success,
  message, num_paused_requests}; 400 with success false on a bad path. SGLang keeps the old version name when
  `weight_version` is absent. Each request (with string fields) is kept in `updates`: its body plus
  `waited_for_generation` (it found /generate requests running) and `paused`.
- POST /pause_generation {"mode": "abort" | "retract" | "in_place"} (default "abort", another mode is a 400):
  200 {"success": true}; new /generate requests wait until POST /continue_generation (body {} or none): 200
  {"success": true}. The modes are kept in `pauses`, the continues counted in `continues`. NOT MODELLED: a running
  request cannot be paused mid-decode here (SGLang aborts it, retracts it to the queue or holds it in place, by
  mode): it finishes and is answered, and an update while paused cannot split a sample between versions (inject
  `spanned_versions` for that).
- POST /flush_cache: 200, or 400 while /generate requests run (SGLang flushes only an idle server).
- POST /v1/chat/completions: OpenAI chat shapes, the content from `responder(messages) -> str` (so judge tests
  choose the verdicts); `response_format` of type text, json_object or json_schema (with a `schema` object) is
  accepted, anything else is a 400; a responder that raises gives a 500; a `Truncated` answer is sent with
  finish_reason "length" (max_tokens cut it), any other with "stop". Every request body is kept in
  `chat_requests`. The answer carries OpenAI's `usage` object (prompt_tokens: the messages' contents' tokens,
  completion_tokens: the answers', total_tokens; counted by the tokenizer, else as whitespace-separated words),
  unless `chat_usage` is False (a server that sends none).

Faults (`inject`): a FIFO queue; each request takes the first queued fault whose `path` matches (None matches
every path) before it is served, and `faults_served` records (path, kind). Served instead of the answer:
`http_error` (answer that status), `status_abort` (a status with SGLang's {"error": {"message"}} body: an abort
carrying a status), `slow` (wait, then serve: past the client's timeout), `drop_connection` (close the socket
without an answer), `malformed` (200 with a body that is not what the endpoint promises). Applied by /generate to
the first sample of its answer (default path "/generate"; a request refused with 400 uses one up): `nan_stop`
(SGLang's report of a NaN or out-of-vocabulary token: the output cut to half its length, at least 1 token, the
last kept token replaced by the engine's first EOS id, finish_reason {"type": "stop", "matched": "NaN
happened"}), `null_logprob` (the first output logprob sent as null, SGLang's -inf), `sample_abort` (finish_reason
{"type": "abort", "message"}, the output cut to half), `spanned_versions` (weight_versions [{old, 0, k},
{current, k, n}] with k = n // 2: a sample that spanned a weight update). A cut sample's logprobs,
completion_tokens, text and weight_versions follow the cut. `latency_s` delays every POST answer after it is
computed. Counters: `requests` and `in_flight` (by path), `max_concurrent` (peak of POSTs being served at once),
`generations_started` (/generate requests handed to the engine).

The server runs on its own event loop in a daemon thread, so tests and scripts use it from sync code:
`with StandinServer(engine) as server: ... server.base_url`. The pytest fixtures below start and stop it.
"""

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import random
import sys
import threading
import time
import uuid
from typing import Any, Callable, Optional, Sequence

import pytest
from aiohttp import web

from rubric_jax.inference.embedded import EmbeddedEngine
from rubric_jax.inference.engine import RolloutEngine, Sample, SamplingParams
from rubric_jax.inference.http import LoopThread
from rubric_jax.models.safetensors_io import load_hf_checkpoint
from rubric_jax.models.tokenizer import load_tokenizer
from tests.tiny_checkpoints import IM_END_ID, PAD_ID

Responder = Callable[[list[dict[str, Any]]], str]

_SAMPLING_KEYS = {"max_new_tokens", "n", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "sampling_seed",
                  "presence_penalty", "frequency_penalty", "repetition_penalty"}
_GENERATE_KEYS = {"input_ids", "text", "sampling_params", "return_logprob", "logprob_start_len", "extra_key", "rid",
                  "stream", "return_text_in_logprobs"}
_RESPONSE_FORMATS = {"text", "json_object", "json_schema"}
_PAUSE_MODES = ("abort", "retract", "in_place")
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's, when sampling_params leave it out
DETERMINISTIC_DEFAULT_SEED = 42  # SGLang's sampling_seed under --enable-deterministic-inference when none is sent
NAN_MATCHED = "NaN happened"  # the finish_reason "matched" SGLang reports for a NaN or out-of-vocabulary token
# Faults the /generate handler applies to its answer's first sample (the middleware serves every other kind).
_SAMPLE_FAULTS = {"nan_stop", "null_logprob", "sample_abort", "spanned_versions"}


@dataclasses.dataclass(frozen=True)
class Fault:
    """One injected fault (module docstring); build it with `http_error`, `status_abort`, `slow`,
    `drop_connection`, `malformed`, `nan_stop`, `null_logprob`, `sample_abort` or `spanned_versions`."""

    kind: str
    path: Optional[str] = None
    status: int = 200
    delay_s: float = 0.0
    body: bytes = b""
    message: str = ""
    old_version: str = ""


_FAULT_KEY = web.RequestKey("standin_sample_fault", Fault)  # where the middleware hands a sample fault to /generate


def http_error(status: int = 500, path: Optional[str] = None) -> Fault:
    """The request answers `status` with an "injected fault" error body."""
    return Fault("status", path, status=status, body=b'{"error": {"message": "injected fault"}}')


def status_abort(status: int = 400, message: str = "Aborted by the server.", path: Optional[str] = "/generate"
                 ) -> Fault:
    """The whole request answers `status` with {"error": {"message": message}}: how SGLang reports an abort that
    carries a status (e.g. an over-long prompt) for a whole batched request."""
    return Fault("status_abort", path, status=status, body=json.dumps({"error": {"message": message}}).encode())


def slow(delay_s: float, path: Optional[str] = None) -> Fault:
    """The request is served after `delay_s` (before its handler runs)."""
    return Fault("slow", path, delay_s=delay_s)


def drop_connection(path: Optional[str] = None) -> Fault:
    """The socket is closed without an answer."""
    return Fault("drop", path)


def malformed(body: bytes = b'{"text": "truncated', path: Optional[str] = None) -> Fault:
    """The request answers 200 with `body`, which is not what the endpoint promises."""
    return Fault("malformed", path, body=body)


def nan_stop(path: Optional[str] = "/generate") -> Fault:
    """The answer's first sample as SGLang reports a NaN or out-of-vocabulary token: cut to half its length (at
    least 1 token), its last token the engine's first EOS id, finish_reason {"type": "stop", "matched": "NaN
    happened"}."""
    return Fault("nan_stop", path)


def null_logprob(path: Optional[str] = "/generate") -> Fault:
    """The answer's first sample's first output logprob is sent as null (SGLang's JSON for -inf)."""
    return Fault("null_logprob", path)


def sample_abort(message: str = "Aborted", path: Optional[str] = "/generate") -> Fault:
    """The answer's first sample is aborted half-way: cut to half its length, finish_reason {"type": "abort",
    "message": message}."""
    return Fault("sample_abort", path, message=message)


def spanned_versions(old_version: str, path: Optional[str] = "/generate") -> Fault:
    """The answer's first sample spanned a weight update: its first n // 2 tokens by `old_version`, the rest by the
    current one (weight_versions), weight_version the current one."""
    return Fault("spanned_versions", path, old_version=old_version)


class Truncated(str):
    """A responder's answer that the stand-in sends as cut off by max_tokens (finish_reason "length")."""


def echo_last_message(messages: list[dict[str, Any]]) -> str:
    """A responder answering the last message's content."""
    return messages[-1]["content"]


class _BadRequest(Exception):
    """A request the stand-in rejects with 400."""


def _params_from_sglang(sampling: Any) -> SamplingParams:
    """The SamplingParams of one `sampling_params` object (the inverse of `SamplingParams.to_sglang`)."""
    if not isinstance(sampling, dict):
        raise _BadRequest(f"each sampling_params must be an object, got {sampling!r}")
    unknown = set(sampling) - _SAMPLING_KEYS
    if unknown:
        raise _BadRequest(f"unsupported sampling_params keys {sorted(unknown)}")
    values = dict(sampling)
    values.setdefault("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    seed = values.pop("sampling_seed", None)
    try:
        return SamplingParams(**values, seed=seed)
    except (TypeError, ValueError) as error:
        raise _BadRequest(str(error)) from None


def _entry_params(sampling: Any, num_prompts: int) -> list[SamplingParams]:
    """Each prompt's SamplingParams: `sampling_params` is one object for every prompt or a list of one per
    prompt."""
    if sampling is None:
        sampling = {}
    if not isinstance(sampling, list):
        return [_params_from_sglang(sampling)] * num_prompts
    if len(sampling) != num_prompts:
        raise _BadRequest(f"sampling_params holds {len(sampling)} objects for {num_prompts} prompts")
    return [_params_from_sglang(s) for s in sampling]


def _shared_params(params: SamplingParams) -> SamplingParams:
    """`params` without what varies between the entries of one engine call (n and the seed)."""
    return dataclasses.replace(params, n=1, seed=None)


def _finish_reason_json(sample: Sample, params: SamplingParams) -> dict[str, Any]:
    if sample.finish_reason == "stop":
        return {"type": "stop", "matched": sample.matched_stop}
    if sample.finish_reason == "length":
        return {"type": "length", "length": params.max_new_tokens}
    return {"type": "abort", "message": "aborted"}


class ScriptedPolicy(RolloutEngine):
    """A policy for the stand-in's /generate that answers from a script: `reply(prompt_text, j)` is sample j's
    text for a prompt (its token ids, as the trainer's SGLang client sends them, decoded with `tokenizer`); each
    text ends on `eos_id`, every token with logprob -1. The decoded prompts are kept (`prompts`); weight updates
    are recorded (`updates`), not applied."""

    def __init__(self, tokenizer, reply: Callable[[str, int], str], eos_id: int):
        self.tokenizer, self.reply, self.eos_id = tokenizer, reply, eos_id
        self.weight_version, self.updates, self.prompts = "served", [], []

    def generate(self, prompts, params):
        samples = []
        for i, ids in enumerate(prompts):
            text = self.tokenizer.decode(ids)
            self.prompts.append(text)
            for j in range(params.n):
                out = self.tokenizer.encode(self.reply(text, j), add_special_tokens=False) + [self.eos_id]
                assert len(out) <= params.max_new_tokens
                samples.append(Sample(prompt_index=i, output_ids=tuple(out), logprobs=(-1.0,) * len(out),
                                      finish_reason="stop", matched_stop=self.eos_id,
                                      weight_version=self.weight_version))
        return samples

    async def agenerate(self, prompts, params):
        return self.generate(prompts, params)

    def update_weights(self, model, version):
        self.updates.append(version)
        self.weight_version = version


def fenced(text: str, tag: str) -> str:
    """The content of the first `<tag>` fence of a prompt (`rubrics.prompts.fence`), for responders."""
    return text.split(f"<{tag}>\n")[1].split(f"\n</{tag}>")[0]


class StandinServer:
    """The stand-in (module docstring) on 127.0.0.1, a free port; `base_url` once started.

    engine:     serves /generate and /update_weights_from_disk (None: those answer 503).
    tokenizer:  for `text` prompts, decoding `text` when the engine gives none, and chat token counts (without one,
                a chat answer's usage counts whitespace-separated words).
    responder:  answers /v1/chat/completions (None: 503).
    latency_s:  added to every POST answer (settable while running).
    model_path: the served path at first (/model_info, /v1/models), and /model_info's tokenizer_path.
    response_format_errors: {response_format type: HTTP status} answered, with a body naming the response format,
                to every chat request of that type (llama-cpp-python's server answers 500 to "json_schema").
    deterministic_inference: SGLang's --enable-deterministic-inference: honour each entry's `sampling_seed`
                (module docstring, Seeds).
    seed:       seeds the stand-in's own sample seeds without deterministic_inference.
    context_length: the longest prompt is one token shorter; None: the engine's model's max_position_embeddings
                (an engine with a `_config`), else no limit.

    Settable while running: `latency_s`, `load_delay_s` (seconds each weight load sleeps), `chat_usage` (whether
    chat answers carry a `usage` object; True at first). `served_model_path` is the path /model_info and
    /v1/models report.
    """

    def __init__(
        self,
        engine: Optional[RolloutEngine] = None,
        *,
        tokenizer: Any = None,
        responder: Optional[Responder] = None,
        latency_s: float = 0.0,
        model_path: str = "standin",
        response_format_errors: Optional[dict[str, int]] = None,
        deterministic_inference: bool = False,
        seed: int = 0,
        context_length: Optional[int] = None,
    ):
        self.response_format_errors = dict(response_format_errors or {})
        self.engine = engine
        self.tokenizer = tokenizer
        self.responder = responder
        self.latency_s = latency_s
        self.load_delay_s = 0.0
        self.chat_usage = True
        self.model_path = model_path
        self.served_model_path = model_path
        self.deterministic_inference = deterministic_inference
        self.seed = seed
        self._rng = random.Random(seed)
        model_config = getattr(engine, "_config", None)
        if context_length is None and model_config is not None:
            context_length = model_config.max_position_embeddings
        self.context_length = context_length
        self.base_url = ""
        self._faults: collections.deque[Fault] = collections.deque()
        self._faults_lock = threading.Lock()  # tests inject from their thread; the server takes on its own
        self._loop_thread: Optional[LoopThread] = None
        self._runner: Optional[web.AppRunner] = None
        # One worker: generations and weight loads run one at a time, off the server's loop.
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="standin-engine")
        self._active_posts = 0
        self.in_flight: collections.Counter = collections.Counter()  # requests being served, by path
        # The gates of /generate and weight updates, touched on the server's loop only: `_changed` is set (and
        # replaced) whenever one of them changes, waking the requests waiting on them.
        self._paused = False
        self._running_generations = 0
        self._pending_loads = 0
        self._changed = asyncio.Event()
        self._clear_records()

    # ------------------------------------------------------------------------------------------- control

    def reset(self) -> None:
        """Clears queued faults, counters and records, the latency and load delay, a pause, and re-seeds the
        stand-in's sample seeds."""
        with self._faults_lock:
            self._faults.clear()
        self.latency_s = 0.0
        self.load_delay_s = 0.0
        self._rng = random.Random(self.seed)
        if self._loop_thread is not None:
            self._loop_thread.submit(self._acontinue()).result()
        self._clear_records()

    def _clear_records(self) -> None:
        self.requests: collections.Counter = collections.Counter()
        self.faults_served: list[tuple[str, str]] = []
        self.chat_requests: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []
        self.pauses: list[str] = []
        self.continues = 0
        self.max_concurrent = 0
        self.generations_started = 0

    def inject(self, *faults: Fault) -> None:
        """Queues `faults`, served in order to the requests they match."""
        with self._faults_lock:
            self._faults.extend(faults)

    @property
    def pending_faults(self) -> int:
        return len(self._faults)

    @property
    def paused(self) -> bool:
        """Whether generation is paused (/pause_generation without a /continue_generation since)."""
        return self._paused

    def start(self) -> "StandinServer":
        self._loop_thread = LoopThread("standin-server")
        self._loop_thread.submit(self._astart()).result()
        return self

    def stop(self) -> None:
        if self._loop_thread is None:
            return
        self._loop_thread.submit(self._runner.cleanup()).result()
        self._loop_thread.stop()
        self._loop_thread = None
        self._executor.shutdown(wait=True)

    def __enter__(self) -> "StandinServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    async def _astart(self) -> None:
        app = web.Application(middlewares=[self._middleware], client_max_size=256 * 2**20)
        app.add_routes([
            web.get("/health", self._health),
            web.get("/health_generate", self._health),
            web.get("/model_info", self._model_info),
            web.get("/v1/models", self._models),
            web.post("/generate", self._generate),
            web.post("/update_weights_from_disk", self._update_weights_from_disk),
            web.post("/pause_generation", self._pause_generation),
            web.post("/continue_generation", self._continue_generation),
            web.post("/flush_cache", self._flush_cache),
            web.post("/v1/chat/completions", self._chat_completions),
        ])
        # handler_cancellation: a handler whose client went away (a timed-out attempt) is cancelled, so a
        # slow fault does not hold shutdown.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}"

    # ------------------------------------------------------------------------------------------- gates

    def _gates_changed(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()

    @contextlib.asynccontextmanager
    async def _generation_slot(self):
        """Holds a running /generate: entered once generation is not paused and no weight update waits or
        loads."""
        await self._wait_until(lambda: not self._paused and self._pending_loads == 0)
        self._running_generations += 1
        try:
            yield
        finally:
            self._running_generations -= 1
            self._gates_changed()

    @contextlib.asynccontextmanager
    async def _weight_load_slot(self, paused: bool):
        """Holds a weight load: new /generate requests wait from now; unless `paused`, entered once no /generate
        runs."""
        self._pending_loads += 1
        try:
            if not paused:
                await self._wait_until(lambda: self._running_generations == 0)
            yield
        finally:
            self._pending_loads -= 1
            self._gates_changed()

    async def _acontinue(self) -> None:
        self._paused = False
        self._gates_changed()

    # ------------------------------------------------------------------------------------------- serving

    def _take_fault(self, path: str) -> Optional[Fault]:
        with self._faults_lock:
            fault = next((f for f in self._faults if f.path is None or f.path == path), None)
            if fault is not None:
                self._faults.remove(fault)
                self.faults_served.append((path, fault.kind))
        return fault

    @web.middleware
    async def _middleware(self, request: web.Request, handler) -> web.StreamResponse:
        self.requests[request.path] += 1
        self.in_flight[request.path] += 1
        is_post = request.method == "POST"
        if is_post:
            self._active_posts += 1
            self.max_concurrent = max(self.max_concurrent, self._active_posts)
        try:
            fault = self._take_fault(request.path)
            if fault is not None and fault.kind in ("status", "status_abort"):
                return web.Response(status=fault.status, body=fault.body, content_type="application/json")
            if fault is not None and fault.kind == "malformed":
                return web.Response(status=200, body=fault.body, content_type="application/json")
            if fault is not None and fault.kind == "drop":
                request.transport.close()
                return web.Response(status=200)  # never written: the transport is closed
            if fault is not None and fault.kind == "slow":
                await asyncio.sleep(fault.delay_s)
            if fault is not None and fault.kind in _SAMPLE_FAULTS:
                request[_FAULT_KEY] = fault
            response = await handler(request)
            # /generate waits out its latency itself, as a running request (so updates wait for it).
            if is_post and request.path != "/generate" and self.latency_s > 0:
                await asyncio.sleep(self.latency_s)
            return response
        finally:
            self.in_flight[request.path] -= 1
            if is_post:
                self._active_posts -= 1

    async def _json_body(self, request: web.Request, *, optional: bool = False) -> dict[str, Any]:
        """The request's JSON object; {} for an empty body when `optional`."""
        if optional and not await request.read():
            return {}
        try:
            body = await request.json()
        except ValueError as error:
            raise _BadRequest(f"body is not JSON: {error}") from None
        if not isinstance(body, dict):
            raise _BadRequest("body must be a JSON object")
        return body

    async def _in_executor(self, fn: Callable, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    def _weight_version(self) -> str:
        return self.engine.weight_version if self.engine is not None else "default"

    async def _model_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.served_model_path,
            "tokenizer_path": self.model_path,
            "is_generation": True,
            "weight_version": self._weight_version(),
        })

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.served_model_path,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.served_model_path,
            "max_model_len": self.context_length,
        }]})

    def _prompts(self, body: dict[str, Any]) -> tuple[list[list[int]], bool]:
        """The prompts' token ids, and whether the request was a single prompt (not a batch)."""
        if ("input_ids" in body) == ("text" in body):
            raise _BadRequest("Either text or input_ids should be provided.")
        if "text" in body:
            if self.tokenizer is None:
                raise _BadRequest("text prompts need the stand-in's tokenizer")
            texts = [body["text"]] if isinstance(body["text"], str) else body["text"]
            return [self.tokenizer.encode(t, add_special_tokens=False) for t in texts], isinstance(body["text"], str)
        input_ids = body["input_ids"]
        if isinstance(input_ids, list) and input_ids and all(isinstance(i, int) for i in input_ids):
            return [input_ids], True
        if (isinstance(input_ids, list) and input_ids and all(isinstance(p, list) for p in input_ids)
                and all(isinstance(i, int) for p in input_ids for i in p)):
            return input_ids, False
        raise _BadRequest("input_ids must be a list of token ids or a list of such lists")

    def _sample_seeds(self, entries: Sequence[tuple[list[int], SamplingParams]]) -> list[list[int]]:
        """Each entry's n sample seeds (module docstring, Seeds); drawn on the server's loop."""
        if self.deterministic_inference:
            return [[DETERMINISTIC_DEFAULT_SEED if params.seed is None else params.seed] * params.n
                    for _, params in entries]
        return [[self._rng.randrange(2**31) for _ in range(params.n)] for _, params in entries]

    def _generate_entries(self, entries: Sequence[tuple[list[int], SamplingParams]], seeds: list[list[int]]
                          ) -> list[list[Sample]]:
        """Each entry's samples, one per seed (module docstring, Seeds); runs in the executor."""
        if isinstance(self.engine, EmbeddedEngine):
            return self._generate_rows_by_params(entries, seeds)
        return self._generate_prompt_runs(entries, seeds)

    def _generate_rows_by_params(self, entries, seeds) -> list[list[Sample]]:
        """One `generate_rows` call per group of entries whose params are equal apart from n and the seed."""
        groups: dict[SamplingParams, list[int]] = {}
        for e, (_, params) in enumerate(entries):
            groups.setdefault(_shared_params(params), []).append(e)
        samples_by_entry: list[list[Sample]] = [[] for _ in entries]
        for shared, members in groups.items():
            rows = [(entries[e][0], seed) for e in members for seed in seeds[e]]
            samples = iter(self.engine.generate_rows(rows, shared))
            for e in members:
                samples_by_entry[e] = [next(samples) for _ in seeds[e]]
        return samples_by_entry

    def _generate_prompt_runs(self, entries, seeds) -> list[list[Sample]]:
        """One `generate` call per run of consecutive entries with the same prompt and params equal apart from n
        and the seed: n the run's total, the seed its first sample's."""
        samples_by_entry: list[list[Sample]] = []
        start = 0
        while start < len(entries):
            prompt, params = entries[start]
            end = start + 1
            while (end < len(entries) and entries[end][0] == prompt
                   and _shared_params(entries[end][1]) == _shared_params(params)):
                end += 1
            total = sum(len(seeds[e]) for e in range(start, end))
            samples = iter(self.engine.generate([prompt], dataclasses.replace(params, n=total, seed=seeds[start][0])))
            samples_by_entry += [[next(samples) for _ in seeds[e]] for e in range(start, end)]
            start = end
        return samples_by_entry

    def _decode(self, output_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(output_ids), skip_special_tokens=True) if self.tokenizer else ""

    def _sample_json(self, sample: Sample, params: SamplingParams, prompt_len: int, return_logprob: bool,
                     version: str) -> dict[str, Any]:
        """One sample object; `version` is the server's weight version as the answer is sent."""
        meta_info: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "finish_reason": _finish_reason_json(sample, params),
            "prompt_tokens": prompt_len,
            "completion_tokens": len(sample.output_ids),
            "cached_tokens": 0,
            "weight_version": version,
            "weight_versions": [{"version": sample.weight_version, "start": 0, "end": len(sample.output_ids)}],
        }
        if return_logprob:
            meta_info["input_token_logprobs"] = []
            meta_info["output_token_logprobs"] = [[lp, i, None] for lp, i in zip(sample.logprobs, sample.output_ids)]
        text = self._decode(sample.output_ids) if sample.text is None else sample.text
        return {"text": text, "output_ids": list(sample.output_ids), "meta_info": meta_info}

    def _cut_sample(self, answer: dict[str, Any], length: int) -> None:
        """Keeps the first `length` output tokens of a sample object; its logprobs, completion_tokens, text and
        weight_versions follow."""
        meta_info = answer["meta_info"]
        answer["output_ids"] = answer["output_ids"][:length]
        meta_info["completion_tokens"] = len(answer["output_ids"])
        if "output_token_logprobs" in meta_info:
            meta_info["output_token_logprobs"] = meta_info["output_token_logprobs"][:length]
        meta_info["weight_versions"] = [dict(meta_info["weight_versions"][0], end=len(answer["output_ids"]))]
        answer["text"] = self._decode(answer["output_ids"])

    def _apply_sample_fault(self, fault: Fault, answer: dict[str, Any]) -> None:
        """Applies a fault of _SAMPLE_FAULTS to one sample object (module docstring, Faults)."""
        meta_info = answer["meta_info"]
        num_tokens = len(answer["output_ids"])
        if fault.kind == "nan_stop":
            self._cut_sample(answer, max(1, num_tokens // 2))
            eos_ids = getattr(self.engine, "eos_token_ids", ())
            eos_id = eos_ids[0] if eos_ids else 0
            if answer["output_ids"]:
                answer["output_ids"][-1] = eos_id
                if meta_info.get("output_token_logprobs"):
                    meta_info["output_token_logprobs"][-1][1] = eos_id
            meta_info["finish_reason"] = {"type": "stop", "matched": NAN_MATCHED}
        elif fault.kind == "null_logprob":
            if meta_info.get("output_token_logprobs"):
                meta_info["output_token_logprobs"][0][0] = None
        elif fault.kind == "sample_abort":
            self._cut_sample(answer, num_tokens // 2)
            meta_info["finish_reason"] = {"type": "abort", "message": fault.message}
        elif fault.kind == "spanned_versions":
            k = num_tokens // 2
            meta_info["weight_versions"] = [{"version": fault.old_version, "start": 0, "end": k},
                                            {"version": meta_info["weight_version"], "start": k, "end": num_tokens}]

    async def _generate(self, request: web.Request) -> web.Response:
        if self.engine is None:
            return _error(503, "the stand-in has no engine")
        try:
            body = await self._json_body(request)
            unknown = set(body) - _GENERATE_KEYS
            if unknown:
                raise _BadRequest(f"unsupported /generate keys {sorted(unknown)}")
            if body.get("stream"):
                raise _BadRequest("the stand-in does not stream")
            if body.get("logprob_start_len", -1) not in (-1, None):
                raise _BadRequest("the stand-in returns output logprobs only (logprob_start_len -1)")
            prompts, single = self._prompts(body)
            entries = list(zip(prompts, _entry_params(body.get("sampling_params"), len(prompts))))
        except _BadRequest as error:
            return _error(400, str(error))
        longest = max(len(prompt) for prompt in prompts)
        if self.context_length is not None and longest >= self.context_length:
            return _error(400, f"The input ({longest} tokens) is longer than the model's context length "
                               f"({self.context_length} tokens).")
        seeds = self._sample_seeds(entries)
        async with self._generation_slot():
            self.generations_started += 1
            try:
                samples_by_entry = await self._in_executor(self._generate_entries, entries, seeds)
            except ValueError as error:
                return _error(400, str(error))
            if self.latency_s > 0:
                await asyncio.sleep(self.latency_s)
            version = self._weight_version()
        return_logprob = bool(body.get("return_logprob"))
        out = [self._sample_json(sample, params, len(prompt), return_logprob, version)
               for (prompt, params), samples in zip(entries, samples_by_entry) for sample in samples]
        fault = request.get(_FAULT_KEY)
        if fault is not None and out:
            self._apply_sample_fault(fault, out[0])
        return web.json_response(out[0] if single and entries[0][1].n == 1 else out)

    def _load_weights(self, model_path: str, version: str) -> None:
        self.engine.update_weights(load_hf_checkpoint(model_path), version)

    async def _update_weights_from_disk(self, request: web.Request) -> web.Response:
        if self.engine is None:
            return _error(503, "the stand-in has no engine")
        try:
            body = await self._json_body(request)
        except _BadRequest as error:
            return _error(400, str(error))
        model_path = body.get("model_path")
        version = body.get("weight_version") or self.engine.weight_version  # SGLang keeps the old name when absent
        if not isinstance(model_path, str) or not isinstance(version, str):
            return _weights_answer(False, "model_path and weight_version must be strings")
        paused = self._paused
        self.updates.append(dict(body, waited_for_generation=not paused and self._running_generations > 0,
                                 paused=paused))
        # A client that stops waiting does not stop the load (SGLang's scheduler finishes it): shielded.
        failure = await asyncio.shield(asyncio.ensure_future(self._load(model_path, version, paused)))
        if failure is not None:
            return _weights_answer(False, f"Failed to update weights: {failure}")
        return _weights_answer(True, "Succeeded to update model weights.")

    async def _load(self, model_path: str, version: str, paused: bool) -> Optional[str]:
        """Loads `model_path` as `version` under the weight-load gate; the error's text when it fails."""
        async with self._weight_load_slot(paused):
            if self.load_delay_s > 0:
                await asyncio.sleep(self.load_delay_s)
            try:
                await self._in_executor(self._load_weights, model_path, version)
            except (OSError, ValueError) as error:
                return str(error)
            self.served_model_path = model_path
        return None

    async def _pause_generation(self, request: web.Request) -> web.Response:
        try:
            mode = (await self._json_body(request, optional=True)).get("mode", "abort")
        except _BadRequest as error:
            return _error(400, str(error))
        if mode not in _PAUSE_MODES:
            return _error(400, f"mode must be one of {list(_PAUSE_MODES)}, got {mode!r}")
        self.pauses.append(mode)
        self._paused = True
        self._gates_changed()
        return web.json_response({"success": True})

    async def _continue_generation(self, request: web.Request) -> web.Response:
        self.continues += 1
        await self._acontinue()
        return web.json_response({"success": True})

    async def _flush_cache(self, request: web.Request) -> web.Response:
        if self._running_generations:
            return web.Response(status=400, text="Cache not flushed: requests are running.\n")
        return web.Response(status=200, text="Cache flushed.\n")

    def _check_chat_body(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise _BadRequest("messages must be a non-empty list of {role, content} objects")
        response_format = body.get("response_format")
        if response_format is not None:
            kind = response_format.get("type") if isinstance(response_format, dict) else None
            if kind not in _RESPONSE_FORMATS:
                raise _BadRequest(f"response_format type must be one of {sorted(_RESPONSE_FORMATS)}")
            schema = response_format.get("json_schema")
            if kind == "json_schema" and not (isinstance(schema, dict) and isinstance(schema.get("schema"), dict)):
                raise _BadRequest("response_format json_schema needs a json_schema object with a schema")
        n = body.get("n", 1)
        if not isinstance(n, int) or n < 1:
            raise _BadRequest("n must be an int >= 1")
        return messages

    def _count_tokens(self, text: str) -> int:
        if self.tokenizer is None:
            return len(text.split())
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    async def _chat_completions(self, request: web.Request) -> web.Response:
        if self.responder is None:
            return _error(503, "the stand-in has no chat responder")
        try:
            body = await self._json_body(request)
            messages = self._check_chat_body(body)
        except _BadRequest as error:
            return _error(400, str(error))
        kind = (body.get("response_format") or {}).get("type")
        if kind in self.response_format_errors:
            return _error(self.response_format_errors[kind], f"response_format type {kind} is not supported")
        self.chat_requests.append(body)
        try:
            contents = [self.responder(messages) for _ in range(body.get("n", 1))]
        except Exception as error:  # a responder may fail on purpose: the server's 500
            return _error(500, f"responder failed: {error}")
        prompt_tokens = sum(self._count_tokens(m["content"]) for m in messages)
        completion_tokens = sum(self._count_tokens(c) for c in contents)
        answer = {
            "id": uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model_path),
            "choices": [
                {"index": i, "message": {"role": "assistant", "content": content, "reasoning_content": None,
                                         "tool_calls": None},
                 "logprobs": None, "finish_reason": "length" if isinstance(content, Truncated) else "stop",
                 "matched_stop": None if isinstance(content, Truncated) else IM_END_ID}
                for i, content in enumerate(contents)
            ],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
            "metadata": {"weight_version": self._weight_version()},
        }
        if not self.chat_usage:
            del answer["usage"]
        return web.json_response(answer)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def _weights_answer(success: bool, message: str) -> web.Response:
    return web.json_response({"success": success, "message": message, "num_paused_requests": 0},
                             status=200 if success else 400)


def embedded_engine(model_dir, **kwargs) -> EmbeddedEngine:
    """An EmbeddedEngine on the tiny checkpoint in `model_dir` (weight version "0"), with its tokenizer."""
    return EmbeddedEngine(load_hf_checkpoint(model_dir), tokenizer=load_tokenizer(model_dir),
                          eos_token_ids=(IM_END_ID,), pad_id=PAD_ID, **kwargs)


@pytest.fixture
def chat_standin():
    """A stand-in with no engine, answering chat completions by `echo_last_message` (set `responder`)."""
    with StandinServer(responder=echo_last_message) as server:
        yield server


@pytest.fixture(scope="module")
def embedded_standin_module(tiny_qwen3_dir):
    """(server, original model): one stand-in per test module, on an EmbeddedEngine of tiny Qwen3, with
    deterministic inference (the recommended RL setting: a run's samples follow from its seeds)."""
    engine = embedded_engine(tiny_qwen3_dir)
    with StandinServer(engine, tokenizer=engine.tokenizer, responder=echo_last_message,
                       model_path=str(tiny_qwen3_dir), deterministic_inference=True) as server:
        yield server, load_hf_checkpoint(tiny_qwen3_dir)


@pytest.fixture
def embedded_standin(embedded_standin_module):
    """The module's stand-in, reset: no faults, no latency, not paused, the original weights as version "0" served
    from the original path. Its engine is `server.engine` (use it directly only while no request is being
    served)."""
    server, model = embedded_standin_module
    server.reset()
    if server.engine.weight_version != "0":
        server.engine.update_weights(model, "0")
    server.served_model_path = server.model_path
    return server


def serve_chat(argv: Optional[Sequence[str]] = None) -> None:
    """Serves a chat-only stand-in answering every chat completion with `--reply` after `--latency-s`; prints
    its base URL on one line and serves until stdin closes (so it ends with the process that started it)."""
    parser = argparse.ArgumentParser(description=serve_chat.__doc__)
    parser.add_argument("--latency-s", type=float, default=0.0)
    parser.add_argument("--reply", default="")
    args = parser.parse_args(argv)
    with StandinServer(responder=lambda messages: args.reply, latency_s=args.latency_s) as server:
        print(server.base_url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    serve_chat()
