"""`SGLangEngine`: the rollout engine served by an SGLang server over HTTP, and a launcher for such a server.

The wire format is SGLang's native `/generate` (observed on sglang 0.5.23; REFERENCE.md section 3):
- Request: `input_ids` as a batch (a list of token-id lists), `sampling_params` (`SamplingParams.to_sglang`,
  with `n`), `return_logprob: true` and `logprob_start_len: -1` (logprobs of the output tokens only), and
  `extra_key` set to the engine's weight version, which namespaces the server's prefix cache so that a request
  made after a weight update never reuses KV computed by the old weights (the cache is not flushed: see below).
- Response: a flat list of len(batch) * n samples, prompt-major, each `{text, output_ids, meta_info: {id,
  finish_reason, prompt_tokens, completion_tokens, cached_tokens, weight_version, output_token_logprobs:
  [[logprob, token_id, text_or_null], ...]}}`; `finish_reason` is `{"type": "length", "length": N}`,
  `{"type": "stop", "matched": token_id_or_str}` or `{"type": "abort", "message": ...}`; a sample that stopped
  on a token (EOS or a stop token id) includes it in output_ids, completion_tokens and the logprobs.
Every field used is validated (`parse_generate_response`); a body that does not match raises
`MalformedResponse`, which the client retries like a 5xx. Aborted samples are returned as such (finish_reason
"abort"), for the algorithm to drop.

A call is split into requests of at most `max_prompts_per_request` prompts (x n samples each), at most
`max_in_flight` of them on the wire at once (the client's bound), retried by the client's `RetryPolicy`.

Weight sync (`update_weights`): the policy is written as a Hugging Face checkpoint (`save_hf_checkpoint`) to
`weight_dir / version`, then POST `/update_weights_from_disk` with `weight_version=version`, `flush_cache=False`
and `abort_all_requests=False`: flushing the cache while requests run breaks SGLang's scheduler, and requests in
flight finish on whichever weights the server holds. Each sample carries the server's `meta_info.weight_version`,
so rollouts that come back from an old version are detectable (`engine.stale_samples(samples,
engine.weight_version)`). The server must see `weight_dir` at the same path (same host or shared filesystem).
Once the server has loaded a version, the directories of the versions this engine wrote before are deleted.

Launching (`sglang_launch_command`, `launch_sglang_server`): `python -m sglang.launch_server` for a model
directory, bound to 127.0.0.1 unless told otherwise (SGLang's endpoints, weight updates included, have no
authentication by default). GPU/TPU hosts only; sglang is an optional extra this package never imports.
"""

import asyncio
import dataclasses
import functools
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union

from rubric_jax.inference.engine import FINISH_REASONS, Prompt, RolloutEngine, Sample, SamplingParams, prompt_token_ids
from rubric_jax.inference.http import ClientStats, JsonHttpClient, MalformedResponse, RetryPolicy, decode_json
from rubric_jax.models.safetensors_io import save_hf_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rubric_jax.models.decoder import Decoder

# A logprob above 0 is impossible; this much is tolerated as rounding.
LOGPROB_TOLERANCE = 1e-3
MAX_TOKEN_ID = 2**31 - 1  # token ids must fit the learner's int32 arrays
DEFAULT_MAX_PROMPTS_PER_REQUEST = 4
_LOG_TAIL_CHARS = 4000


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_token_id(value: Any) -> bool:
    return _is_int(value) and 0 <= value <= MAX_TOKEN_ID


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise MalformedResponse(message)


def _as_logprob(value: Any) -> Optional[float]:
    """`value` as a float when it is a finite number <= LOGPROB_TOLERANCE, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range
        return None
    return number if math.isfinite(number) and number <= LOGPROB_TOLERANCE else None


# --------------------------------------------------------------------------------------------- wire format


def generate_payload(
    prompt_ids: Sequence[Sequence[int]], params: SamplingParams, *, extra_stop_token_ids: Sequence[int] = (),
    cache_key: Optional[str] = None,
) -> dict[str, Any]:
    """The body of one batched `/generate` request (module docstring). `extra_stop_token_ids` are added to the
    call's `stop_token_ids` (the engine's own EOS ids); `cache_key`, when given, is sent as `extra_key`."""
    sampling_params = params.to_sglang()
    stop_token_ids = list(params.stop_token_ids) + [i for i in extra_stop_token_ids if i not in params.stop_token_ids]
    if stop_token_ids:
        sampling_params["stop_token_ids"] = stop_token_ids
    payload = {
        "input_ids": [list(ids) for ids in prompt_ids],
        "sampling_params": sampling_params,
        "return_logprob": True,
        "logprob_start_len": -1,
    }
    if cache_key is not None:
        payload["extra_key"] = cache_key
    return payload


def _parse_finish_reason(value: Any, output_ids: list[int], where: str) -> tuple[str, Union[int, str, None]]:
    """(finish_reason, matched_stop) of a `meta_info.finish_reason` object."""
    _require(isinstance(value, dict) and value.get("type") in FINISH_REASONS,
             f"{where}: finish_reason must be an object with type in {FINISH_REASONS}, got {value!r}")
    kind = value["type"]
    if kind == "length":
        _require(_is_int(value.get("length")), f"{where}: a length finish_reason needs an int length, got {value!r}")
        return kind, None
    if kind == "abort":
        return kind, None
    matched = value.get("matched")
    _require(matched is None or _is_int(matched) or isinstance(matched, str),
             f"{where}: finish_reason.matched must be a token id, a string or null, got {matched!r}")
    if _is_int(matched):  # SGLang keeps the stop token: it ends output_ids
        _require(bool(output_ids) and output_ids[-1] == matched,
                 f"{where}: stopped on token {matched} but output_ids do not end with it")
    return kind, matched


def _parse_logprobs(value: Any, output_ids: list[int], where: str) -> tuple[float, ...]:
    """The logprobs of `[[logprob, token_id, text_or_null], ...]`, checked against output_ids."""
    if value is None and not output_ids:  # e.g. a request aborted before its first token
        return ()
    _require(isinstance(value, list) and len(value) == len(output_ids),
             f"{where}: output_token_logprobs must be a list of {len(output_ids)} entries")
    logprobs = []
    for t, (entry, token_id) in enumerate(zip(value, output_ids)):
        _require(isinstance(entry, list) and len(entry) >= 2, f"{where}: logprob entry {t} is not [logprob, id, ...]")
        logprob = _as_logprob(entry[0])
        _require(logprob is not None, f"{where}: logprob {t} must be a finite number <= 0, got {entry[0]!r}")
        _require(_is_int(entry[1]) and entry[1] == token_id,
                 f"{where}: logprob entry {t} is for token {entry[1]!r}, output_ids has {token_id}")
        logprobs.append(logprob)
    return tuple(logprobs)


def parse_sample(value: Any, prompt_index: int, params: SamplingParams) -> Sample:
    """One `/generate` sample object as a `Sample`; MalformedResponse naming the field when it does not match
    the module docstring's shape."""
    where = f"sample of prompt {prompt_index}"
    _require(isinstance(value, dict), f"{where}: not an object")
    output_ids = value.get("output_ids")
    _require(isinstance(output_ids, list) and all(_is_token_id(i) for i in output_ids),
             f"{where}: output_ids must be a list of token ids in [0, 2**31)")
    _require(len(output_ids) <= params.max_new_tokens,
             f"{where}: {len(output_ids)} output ids, more than max_new_tokens={params.max_new_tokens}")
    meta_info = value.get("meta_info")
    _require(isinstance(meta_info, dict), f"{where}: meta_info must be an object")
    finish_reason, matched_stop = _parse_finish_reason(meta_info.get("finish_reason"), output_ids, where)
    _require(meta_info.get("completion_tokens") == len(output_ids) and _is_int(meta_info.get("completion_tokens")),
             f"{where}: completion_tokens {meta_info.get('completion_tokens')!r} != {len(output_ids)} output ids")
    weight_version = meta_info.get("weight_version")
    _require(isinstance(weight_version, str), f"{where}: weight_version must be a string, got {weight_version!r}")
    text = value.get("text")
    _require(text is None or isinstance(text, str), f"{where}: text must be a string")
    return Sample(
        prompt_index=prompt_index,
        output_ids=tuple(output_ids),
        logprobs=_parse_logprobs(meta_info.get("output_token_logprobs"), output_ids, where),
        finish_reason=finish_reason,
        matched_stop=matched_stop,
        weight_version=weight_version,
        text=text,
    )


def parse_generate_response(body: Any, num_prompts: int, params: SamplingParams, first_prompt_index: int = 0
                            ) -> list[Sample]:
    """The samples of a batched `/generate` answer for `num_prompts` prompts: a flat prompt-major list of
    num_prompts * params.n sample objects, numbered from `first_prompt_index`. MalformedResponse otherwise."""
    expected = num_prompts * params.n
    _require(isinstance(body, list) and len(body) == expected,
             f"/generate must answer a list of {expected} samples, got "
             + (f"{len(body)}" if isinstance(body, list) else type(body).__name__))
    return [parse_sample(value, first_prompt_index + i // params.n, params) for i, value in enumerate(body)]


def parse_weights_update(body: Any) -> str:
    """The message of a successful `/update_weights_from_disk` answer `{success, message, num_paused_requests}`
    (num_paused_requests is absent on older servers). RuntimeError when it reports no success."""
    _require(isinstance(body, dict) and isinstance(body.get("success"), bool) and isinstance(body.get("message"), str),
             f"/update_weights_from_disk must answer {{success: bool, message: str}}, got {body!r}")
    if not body["success"]:
        raise RuntimeError(f"the server did not update its weights: {body['message']}")
    return body["message"]


def parse_model_info(body: Any) -> str:
    """The weight version of a `/model_info` answer."""
    _require(isinstance(body, dict) and isinstance(body.get("weight_version"), str),
             f"/model_info must answer an object with a weight_version string, got {body!r}")
    return body["weight_version"]


def _check_version_name(version: str) -> None:
    if not isinstance(version, str) or not version or version in (".", "..") or "/" in version or os.sep in version:
        raise ValueError(f"version must be a non-empty string usable as a directory name, got {version!r}")


# ------------------------------------------------------------------------------------------------- engine


class SGLangEngine(RolloutEngine):
    """A `RolloutEngine` over an SGLang server at `base_url` (module docstring).

    tokenizer:               renders chat-message prompts (`engine.prompt_token_ids`) here, with
                             `chat_template_kwargs` as the template's variables; None = token ids only.
    weight_dir:              where `update_weights` writes checkpoints (None: update_weights is a ValueError).
    max_in_flight, retry, headers, seed: the `JsonHttpClient`'s (seed: its jitter).
    eos_token_ids:           stop tokens sent with every request besides the call's `stop_token_ids` (the
                             server stops on the model's own EOS ids anyway; these make sure, e.g. for a chat
                             model whose generation_config lacks its end-of-turn id).
    max_prompts_per_request: prompts per `/generate` request (each with n samples).
    weight_dtype:            dtype of the written checkpoints (e.g. jnp.bfloat16); None = the parameters'.
    health_timeout_s:        the constructor waits this long for GET /health (None: no wait), then reads the
                             served weight version from GET /model_info.
    namespace_cache:         send the weight version as `extra_key` (module docstring).
    """

    def __init__(
        self,
        base_url: str,
        *,
        tokenizer: Optional["PreTrainedTokenizerBase"] = None,
        chat_template_kwargs: Optional[Mapping[str, Any]] = None,
        weight_dir: Optional[Union[str, os.PathLike]] = None,
        max_in_flight: int = 64,
        retry: RetryPolicy = RetryPolicy(),
        eos_token_ids: Sequence[int] = (),
        max_prompts_per_request: int = DEFAULT_MAX_PROMPTS_PER_REQUEST,
        weight_dtype: Optional[Any] = None,
        headers: Optional[Mapping[str, str]] = None,
        seed: Optional[int] = None,
        health_timeout_s: Optional[float] = 600.0,
        namespace_cache: bool = True,
    ):
        if not _is_int(max_prompts_per_request) or max_prompts_per_request < 1:
            raise ValueError(f"max_prompts_per_request must be an int >= 1, got {max_prompts_per_request!r}")
        if any(not _is_int(i) or i < 0 for i in eos_token_ids):
            raise ValueError(f"eos_token_ids must be non-negative token ids, got {eos_token_ids!r}")
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.weight_dir = Path(weight_dir) if weight_dir is not None else None
        self.eos_token_ids = tuple(eos_token_ids)
        self.max_prompts_per_request = max_prompts_per_request
        self.weight_dtype = weight_dtype
        self.namespace_cache = namespace_cache
        self.client = JsonHttpClient(base_url, max_in_flight=max_in_flight, retry=retry, headers=headers, seed=seed)
        self._written_versions: list[Path] = []
        try:
            if health_timeout_s is not None:
                self.client.run_sync(self.client.wait_healthy("/health", health_timeout_s))
            self.weight_version = self.client.run_sync(self._served_version())
        except BaseException:
            self.client.close()
            raise

    async def _served_version(self) -> str:
        status, body = await self.client.get("/model_info")
        _require(status == 200, f"/model_info answered {status}")
        return parse_model_info(decode_json(body))

    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Sample]:
        """len(prompts) * params.n samples, prompt-major, from requests of at most `max_prompts_per_request`
        prompts sent concurrently. RequestFailed when a request fails for good (the others are cancelled)."""
        prompt_ids = [prompt_token_ids(prompt, self.tokenizer, self.chat_template_kwargs) for prompt in prompts]
        cache_key = self.weight_version if self.namespace_cache else None
        step = self.max_prompts_per_request
        tasks = []
        for start in range(0, len(prompt_ids), step):
            chunk = prompt_ids[start:start + step]
            payload = generate_payload(chunk, params, extra_stop_token_ids=self.eos_token_ids, cache_key=cache_key)
            validate = functools.partial(parse_generate_response, num_prompts=len(chunk), params=params,
                                         first_prompt_index=start)
            tasks.append(asyncio.ensure_future(self.client.post_json("/generate", payload, validate)))
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
        return [sample for samples in results for sample in samples]

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Sample]:
        """`agenerate` run on the client's event loop (see `http.JsonHttpClient.run_sync` for calls from inside
        a running loop)."""
        return self.client.run_sync(self.agenerate(prompts, params))

    def update_weights(self, model: "Decoder", version: str) -> None:
        """Writes `model` to `weight_dir / version` and has the server load it as `version` (module docstring);
        `weight_version` is `version` once the server confirms. RequestFailed / RuntimeError when the server
        does not load it (the engine's version is then unchanged)."""
        if self.weight_dir is None:
            raise ValueError("update_weights needs an engine built with weight_dir")
        _check_version_name(version)
        directory = (self.weight_dir / version).resolve()
        save_hf_checkpoint(model, directory, dtype=self.weight_dtype, overwrite=True)
        payload = {
            "model_path": str(directory),
            "load_format": "auto",
            "weight_version": version,
            "flush_cache": False,
            "abort_all_requests": False,
        }
        try:
            self.client.run_sync(self.client.post_json("/update_weights_from_disk", payload, parse_weights_update))
        except BaseException:
            if directory not in self._written_versions:
                shutil.rmtree(directory, ignore_errors=True)
            raise
        self.weight_version = version
        for old in self._written_versions:
            if old != directory:
                shutil.rmtree(old, ignore_errors=True)
        self._written_versions = [directory]

    def close(self) -> None:
        """Closes the HTTP client (the server keeps running)."""
        self.client.close()

    def http_stats(self) -> ClientStats:
        return self.client.stats

    def __enter__(self) -> "SGLangEngine":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------- launching


def sglang_launch_command(
    model_dir: Union[str, os.PathLike],
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
    tp: int = 1,
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """The argv of `python -m sglang.launch_server` serving `model_dir` on host:port with tensor parallelism
    `tp`; `extra_args` are appended verbatim (e.g. ["--mem-fraction-static", "0.8"])."""
    if not _is_int(port) or not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port!r}")
    if not _is_int(tp) or tp < 1:
        raise ValueError(f"tp must be an int >= 1, got {tp!r}")
    if not host:
        raise ValueError("host must be non-empty")
    if isinstance(extra_args, str):
        raise ValueError("extra_args must be a sequence of arguments, not one string")
    return [python, "-m", "sglang.launch_server", "--model-path", str(model_dir), "--host", host,
            "--port", str(port), "--tp-size", str(tp), *extra_args]


@dataclasses.dataclass
class SGLangServer:
    """A launched server process: `base_url`, its `process` and the file its output goes to. `close` (or
    leaving a `with` block) terminates it."""

    process: subprocess.Popen
    base_url: str
    log_path: Path

    def log_tail(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-_LOG_TAIL_CHARS:]

    def close(self, timeout_s: float = 30.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> "SGLangServer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def launch_sglang_server(
    model_dir: Union[str, os.PathLike],
    *,
    health_timeout_s: float = 1800.0,
    log_path: Optional[Union[str, os.PathLike]] = None,
    env: Optional[Mapping[str, str]] = None,
    **launch_args: Any,
) -> SGLangServer:
    """Starts `sglang_launch_command(model_dir, **launch_args)` (host, port, tp, extra_args, python) with its
    output in `log_path` (default: a temporary file) and environment `env` added to this one's; returns once
    GET /health answers 200. RuntimeError with the log's tail when the process exits first; TimeoutError after
    `health_timeout_s`. The process is terminated on any failure."""
    command = sglang_launch_command(model_dir, **launch_args)
    host, port = command[command.index("--host") + 1], command[command.index("--port") + 1]
    if log_path is None:
        handle, name = tempfile.mkstemp(prefix="sglang_server_", suffix=".log")
        os.close(handle)
        log_path = name
    log_path = Path(log_path)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   env=None if env is None else {**os.environ, **env})
    server = SGLangServer(process, f"http://{host}:{port}", log_path)
    try:
        _wait_until_serving(server, command, health_timeout_s)
    except BaseException:
        server.close()
        raise
    return server


def _wait_until_serving(server: SGLangServer, command: Sequence[str], timeout_s: float) -> None:
    """Polls GET /health in slices of at most 1 s, checking between them that the process still runs."""
    deadline = time.monotonic() + timeout_s
    with JsonHttpClient(server.base_url, retry=RetryPolicy(timeout_s=5.0)) as client:
        while True:
            if server.process.poll() is not None:
                raise RuntimeError(f"the SGLang server exited with code {server.process.returncode} before it was "
                                   f"healthy: {' '.join(command)}\n{server.log_tail()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"the SGLang server was not healthy after {timeout_s} s; log: {server.log_path}")
            try:
                client.run_sync(client.wait_healthy("/health", min(remaining, 1.0)))
                return
            except TimeoutError:
                continue
