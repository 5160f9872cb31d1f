"""A local stand-in for an SGLang server: the HTTP shapes of REFERENCE.md section 3 on a loopback port, backed by
any `RolloutEngine` (the embedded JAX sampler in tests), with fault injection.

Endpoints (what SGLang 0.5.23 answers, REFERENCE.md section 3):
- GET  /health, /health_generate: 200, empty body.
- GET  /model_info: {model_path, tokenizer_path, is_generation, weight_version}.
- POST /generate: `input_ids` (one prompt or a batch) or `text` (with a tokenizer), `sampling_params` (the keys
  `SamplingParams.to_sglang` writes; any other key is a 400 here, so a misspelt key in the client shows),
  `return_logprob`, `logprob_start_len` (-1 or absent: output logprobs only), `extra_key`, `rid`. Answer: one
  object for one prompt with n = 1, else a flat prompt-major list of {text, output_ids, meta_info: {id,
  finish_reason, prompt_tokens, completion_tokens, cached_tokens, weight_version, output_token_logprobs
  [[logprob, id, null], ...] (with return_logprob)}}.
- POST /update_weights_from_disk {model_path, load_format, weight_version, flush_cache, abort_all_requests}:
  loads the HF directory with `load_hf_checkpoint` into the engine; {success, message, num_paused_requests};
  400 with success false on a bad path, or when asked to flush the cache while /generate requests run (SGLang
  would break its scheduler instead).
- POST /flush_cache: 200, or 400 while /generate requests run.
- POST /v1/chat/completions: OpenAI chat shapes, the content from `responder(messages) -> str` (so judge tests
  choose the verdicts); `response_format` of type text, json_object or json_schema (with a `schema` object) is
  accepted, anything else is a 400; a responder that raises gives a 500; a `Truncated` answer is sent with
  finish_reason "length" (max_tokens cut it), any other with "stop". Every request body is kept in
  `chat_requests`.

Faults (`inject`): a FIFO queue; each request takes the first queued fault whose `path` matches (None matches
every path) before it is served: `http_error` (answer that status), `slow` (wait, then serve: past the client's
timeout), `drop_connection` (close the socket without an answer), `malformed` (200 with a body that is not what
the endpoint promises). `latency_s` delays every POST answer after it is computed (a served /generate is
stamped with the weight version of its generation, then waits). Counters: `requests` and `in_flight` (by
path), `faults_served`, `max_concurrent` (peak of POSTs being served at once), `generations_started` (/generate
requests handed to the engine).

The server runs on its own event loop in a daemon thread, so tests and scripts use it from sync code:
`with StandinServer(engine) as server: ... server.base_url`. The pytest fixtures below start and stop it.
"""

import argparse
import asyncio
import collections
import concurrent.futures
import dataclasses
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


@dataclasses.dataclass(frozen=True)
class Fault:
    """One injected fault (module docstring); build it with `http_error`, `slow`, `drop_connection` or
    `malformed`."""

    kind: str
    path: Optional[str] = None
    status: int = 200
    delay_s: float = 0.0
    body: bytes = b""


def http_error(status: int = 500, path: Optional[str] = None) -> Fault:
    return Fault("status", path, status=status, body=b'{"error": {"message": "injected fault"}}')


def slow(delay_s: float, path: Optional[str] = None) -> Fault:
    return Fault("slow", path, delay_s=delay_s)


def drop_connection(path: Optional[str] = None) -> Fault:
    return Fault("drop", path)


def malformed(body: bytes = b'{"text": "truncated', path: Optional[str] = None) -> Fault:
    return Fault("malformed", path, body=body)


class Truncated(str):
    """A responder's answer that the stand-in sends as cut off by max_tokens (finish_reason "length")."""


def echo_last_message(messages: list[dict[str, Any]]) -> str:
    """A responder answering the last message's content."""
    return messages[-1]["content"]


class _BadRequest(Exception):
    """A request the stand-in rejects with 400."""


def _params_from_sglang(sampling: Any) -> SamplingParams:
    """The SamplingParams of a `sampling_params` dict (the inverse of `SamplingParams.to_sglang`)."""
    if not isinstance(sampling, dict):
        raise _BadRequest(f"sampling_params must be one object, got {sampling!r}")
    unknown = set(sampling) - _SAMPLING_KEYS
    if unknown:
        raise _BadRequest(f"unsupported sampling_params keys {sorted(unknown)}")
    values = dict(sampling)
    seed = values.pop("sampling_seed", None)
    try:
        return SamplingParams(**values, seed=seed)
    except (TypeError, ValueError) as error:
        raise _BadRequest(str(error)) from None


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
    tokenizer:  for `text` prompts, decoding `text` when the engine gives none, and chat token counts.
    responder:  answers /v1/chat/completions (None: 503).
    latency_s:  added to every POST answer (settable while running).
    model_path: reported by /model_info.
    response_format_errors: {response_format type: HTTP status} answered, with a body naming the response format,
                to every chat request of that type (llama-cpp-python's server answers 500 to "json_schema").
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
    ):
        self.response_format_errors = dict(response_format_errors or {})
        self.engine = engine
        self.tokenizer = tokenizer
        self.responder = responder
        self.latency_s = latency_s
        self.model_path = model_path
        self.base_url = ""
        self._faults: collections.deque[Fault] = collections.deque()
        self._faults_lock = threading.Lock()  # tests inject from their thread; the server takes on its own
        self._loop_thread: Optional[LoopThread] = None
        self._runner: Optional[web.AppRunner] = None
        # One worker: generations and weight loads run one at a time, off the server's loop.
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="standin-engine")
        self._active_posts = 0
        self.in_flight: collections.Counter = collections.Counter()  # requests being served, by path
        self._clear_records()

    # ------------------------------------------------------------------------------------------- control

    def reset(self) -> None:
        """Clears queued faults, counters, recorded chat requests and the latency."""
        with self._faults_lock:
            self._faults.clear()
        self.latency_s = 0.0
        self._clear_records()

    def _clear_records(self) -> None:
        self.requests: collections.Counter = collections.Counter()
        self.faults_served: list[tuple[str, str]] = []
        self.chat_requests: list[dict[str, Any]] = []
        self.max_concurrent = 0
        self.generations_started = 0

    def inject(self, *faults: Fault) -> None:
        """Queues `faults`, served in order to the requests they match."""
        with self._faults_lock:
            self._faults.extend(faults)

    @property
    def pending_faults(self) -> int:
        return len(self._faults)

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
            web.post("/generate", self._generate),
            web.post("/update_weights_from_disk", self._update_weights_from_disk),
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
            if fault is not None and fault.kind == "status":
                return web.Response(status=fault.status, body=fault.body, content_type="application/json")
            if fault is not None and fault.kind == "malformed":
                return web.Response(status=200, body=fault.body, content_type="application/json")
            if fault is not None and fault.kind == "drop":
                request.transport.close()
                return web.Response(status=200)  # never written: the transport is closed
            if fault is not None and fault.kind == "slow":
                await asyncio.sleep(fault.delay_s)
            response = await handler(request)
            if is_post and self.latency_s > 0:
                await asyncio.sleep(self.latency_s)
            return response
        finally:
            self.in_flight[request.path] -= 1
            if is_post:
                self._active_posts -= 1

    async def _json_body(self, request: web.Request) -> dict[str, Any]:
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

    async def _model_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "is_generation": True,
            "weight_version": self.engine.weight_version if self.engine is not None else "default",
        })

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

    def _sample_json(self, sample: Sample, params: SamplingParams, prompt_len: int, return_logprob: bool):
        text = sample.text
        if text is None:
            text = self.tokenizer.decode(list(sample.output_ids), skip_special_tokens=True) if self.tokenizer else ""
        meta_info: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "finish_reason": _finish_reason_json(sample, params),
            "prompt_tokens": prompt_len,
            "completion_tokens": len(sample.output_ids),
            "cached_tokens": 0,
            "weight_version": sample.weight_version,
        }
        if return_logprob:
            meta_info["input_token_logprobs"] = []
            meta_info["output_token_logprobs"] = [[lp, i, None] for lp, i in zip(sample.logprobs, sample.output_ids)]
        return {"text": text, "output_ids": list(sample.output_ids), "meta_info": meta_info}

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
            params = _params_from_sglang(body.get("sampling_params") or {"max_new_tokens": 128})
        except _BadRequest as error:
            return _error(400, str(error))
        self.generations_started += 1
        try:
            samples = await self._in_executor(self.engine.generate, prompts, params)
        except ValueError as error:
            return _error(400, str(error))
        out = [self._sample_json(s, params, len(prompts[s.prompt_index]), bool(body.get("return_logprob")))
               for s in samples]
        return web.json_response(out[0] if single and params.n == 1 else out)

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
        if body.get("flush_cache", True) and self.in_flight["/generate"]:
            return _weights_answer(False, "cannot flush the cache while requests run")
        if not isinstance(model_path, str) or not isinstance(version, str):
            return _weights_answer(False, "model_path and weight_version must be strings")
        try:
            await self._in_executor(self._load_weights, model_path, version)
        except (OSError, ValueError) as error:
            return _weights_answer(False, f"Failed to update weights: {error}")
        return _weights_answer(True, "Succeeded to update model weights.")

    async def _flush_cache(self, request: web.Request) -> web.Response:
        if self.in_flight["/generate"]:
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
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if self.tokenizer is not None else 0

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
        return web.json_response({
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
            "metadata": {"weight_version": self.engine.weight_version if self.engine is not None else "default"},
        })


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
    """(server, original model): one stand-in per test module, on an EmbeddedEngine of tiny Qwen3."""
    engine = embedded_engine(tiny_qwen3_dir)
    with StandinServer(engine, tokenizer=engine.tokenizer, responder=echo_last_message,
                       model_path=str(tiny_qwen3_dir)) as server:
        yield server, load_hf_checkpoint(tiny_qwen3_dir)


@pytest.fixture
def embedded_standin(embedded_standin_module):
    """The module's stand-in, reset: no faults, no latency, the original weights as version "0". Its engine is
    `server.engine` (use it directly only while no request is being served)."""
    server, model = embedded_standin_module
    server.reset()
    if server.engine.weight_version != "0":
        server.engine.update_weights(model, "0")
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
