"""`SGLangEngine`: the rollout engine served by an SGLang server over HTTP, and a launcher for such a server.

What SGLang 0.5.23 does (read in its source: `entrypoints/http_server.py`, `managers/io_struct.py`,
`tokenizer_manager.py`, `sampling/`, `layers/sampler.py`, `schedule_batch.py`; REFERENCE.md section 3), and what
this engine does about it:
- Seeds. `sampling_params.sampling_seed` is ignored unless the server runs with `--enable-deterministic-inference`
  (recommended for RL, with `--rl-on-policy-target`); with it, the `n` samples of one request share the seed and
  positions, so they are all identical. So the engine never sends n > 1: a prompt's request holds the prompt once
  per sample, each copy with n = 1 and its own `sampling_seed` (`engine.sample_seeds` of the call's seed, the seeds
  the embedded engine uses), so a group's samples differ under any server flags, and a deterministic server
  makes the call reproducible from its seed. (The radix cache prefills the shared prompt once either way.)
- Wire format. Request: `input_ids` (the copies), `sampling_params` (a list, one object per copy:
  `SamplingParams.to_sglang` with n = 1), `return_logprob: true` and `logprob_start_len: -1` (logprobs of the
  output tokens only), and `extra_key` set to the engine's weight version, which namespaces the server's prefix
  cache so that a request made after a weight update never reuses KV computed by the old weights. Response: a list
  of one object per copy, `{text, output_ids, meta_info: {id, finish_reason, prompt_tokens, completion_tokens,
  cached_tokens, weight_version, weight_versions, output_token_logprobs: [[logprob, token_id, text_or_null],
  ...]}}`; `finish_reason` is `{"type": "length", "length": N}`, `{"type": "stop", "matched": token_id_or_str}`
  or `{"type": "abort", "message": ...}`; a sample that stopped on a token includes it in output_ids,
  completion_tokens and the logprobs. Every field used is validated (`parse_generate_response`); a body that does
  not match raises `MalformedResponse`, which the client retries like a 5xx.
- Corrupted samples. A NaN or out-of-vocabulary token is replaced by a stop id and reported as a stop on the
  string "NaN happened": read as a failed sample (`Sample.failure` "nan"). An aborted sample is failed too
  ("abort"). A -inf logprob arrives as null: read as -inf (the sample is kept; the learner's mismatch metrics and
  corrections skip non-finite logprobs). Recipes keep failed samples out of the loss (`algorithms.base`).
- Aborts with a status. An abort that carries a 4xx/5xx status (an over-long prompt, a bad parameter) turns the
  whole `/generate` request into an HTTP error, which is why each prompt has its own request: a request that
  fails for good (a 4xx at once, or out of retries) gives its prompt n failed samples with the request's reason
  ("http_400", "timeout", ...) and the other prompts' samples come back; the trainer counts them
  (`rollout/failed/<reason>`) and stops the run when they pass its budget (`RolloutConfig.max_failure_rate`).
- Weight versions. `meta_info.weight_version` is the server's version when the output is sent: a sample that
  spanned an update reads as the newer one. `meta_info.weight_versions: [{version, start, end}]` gives per-token
  spans; the engine keeps their versions (`Sample.weight_versions`), so such a sample is stale
  (`engine.stale_samples`).
- Weight sync (`update_weights`). The policy is written as a Hugging Face checkpoint (`save_hf_checkpoint`) to
  `weight_dir / version`. Unless generation is paused, `/update_weights_from_disk` takes a writer lock and waits
  for every running request to finish on the old weights; so the engine pauses generation first
  (`/pause_generation`, `pause_mode`), loads, and continues (`/continue_generation`), even when the load fails.
  The load is posted once, with a timeout sized to the checkpoint (`weight_load_timeout_s`): a retry would queue
  a second load. When no answer comes, the engine asks `/model_info` until the server serves the new version (or
  the timeout passes again), and it always confirms the served version there before adopting it. The load sends
  `flush_cache: false` and `abort_all_requests: false` (the namespaced cache makes a flush unneeded). After a
  load the server's model path (and `/v1/models` id) is that version's directory, so it is kept until a later
  version has loaded; a directory the server may still be reading (a load that did not answer) is kept too.
  The server must see `weight_dir` at the same path (same host or shared filesystem).

Launching (`sglang_launch_command`, `launch_sglang_server`): `python -m sglang.launch_server` for a model
directory, bound to 127.0.0.1 unless told otherwise (SGLang's endpoints, weight updates included, have no
authentication by default). GPU/TPU hosts only; sglang is an optional extra this package never imports.
"""

import asyncio
import dataclasses
import functools
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Coroutine, Mapping, Optional, Sequence, Union

import numpy as np

from rubric_jax.inference.engine import (FINISH_REASONS, Prompt, RolloutEngine, Sample, SamplingParams, failed_samples,
                                         prompt_token_ids, sample_seeds)
from rubric_jax.inference.http import (ClientStats, JsonHttpClient, MalformedResponse, RequestFailed, RetryPolicy,
                                       decode_json)
from rubric_jax.models.safetensors_io import save_hf_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rubric_jax.models.decoder import Decoder

# A logprob above 0 is impossible; this much is tolerated as rounding.
LOGPROB_TOLERANCE = 1e-3
MAX_TOKEN_ID = 2**31 - 1  # token ids must fit the learner's int32 arrays
# SGLang's `finish_reason.matched` for a sample that met a NaN or an out-of-vocabulary token (its
# `Req.check_finished` replaces the token by a stop id).
NAN_MATCHED = "NaN happened"
PAUSE_MODES = ("retract", "in_place", "abort")
WEIGHT_LOAD_BASE_S = 120.0
WEIGHT_LOAD_BYTES_PER_S = 100 * 2**20
_VERSION_POLL_S = 0.5
_LOG = logging.getLogger(__name__)
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
    prompt_ids: Sequence[int], params: SamplingParams, seeds: Sequence[int], *,
    extra_stop_token_ids: Sequence[int] = (), cache_key: Optional[str] = None,
) -> dict[str, Any]:
    """The body of one prompt's `/generate` request (module docstring): the prompt once per seed, each copy with
    n = 1 and its own `sampling_seed`. `extra_stop_token_ids` are added to the call's `stop_token_ids` (the
    engine's own EOS ids); `cache_key`, when given, is sent as `extra_key`."""
    sampling_params = dataclasses.replace(params, n=1, seed=None).to_sglang()
    stop_token_ids = list(params.stop_token_ids) + [i for i in extra_stop_token_ids if i not in params.stop_token_ids]
    if stop_token_ids:
        sampling_params["stop_token_ids"] = stop_token_ids
    payload = {
        "input_ids": [list(prompt_ids) for _ in seeds],
        "sampling_params": [{**sampling_params, "sampling_seed": int(seed)} for seed in seeds],
        "return_logprob": True,
        "logprob_start_len": -1,
    }
    if cache_key is not None:
        payload["extra_key"] = cache_key
    return payload


def _parse_finish_reason(value: Any, output_ids: list[int], where: str) -> tuple[str, Union[int, str, None], str]:
    """(finish_reason, matched_stop, failure) of a `meta_info.finish_reason` object."""
    _require(isinstance(value, dict) and value.get("type") in FINISH_REASONS,
             f"{where}: finish_reason must be an object with type in {FINISH_REASONS}, got {value!r}")
    kind = value["type"]
    if kind == "length":
        _require(_is_int(value.get("length")), f"{where}: a length finish_reason needs an int length, got {value!r}")
        return kind, None, ""
    if kind == "abort":
        return kind, None, "abort"
    matched = value.get("matched")
    _require(matched is None or _is_int(matched) or isinstance(matched, str),
             f"{where}: finish_reason.matched must be a token id, a string or null, got {matched!r}")
    if matched == NAN_MATCHED:  # a NaN or out-of-vocabulary token, replaced by a stop id: not a sample
        return "abort", None, "nan"
    if _is_int(matched):  # SGLang keeps the stop token: it ends output_ids
        _require(bool(output_ids) and output_ids[-1] == matched,
                 f"{where}: stopped on token {matched} but output_ids do not end with it")
    return kind, matched, ""


def _parse_logprobs(value: Any, output_ids: list[int], where: str) -> tuple[float, ...]:
    """The logprobs of `[[logprob, token_id, text_or_null], ...]`, checked against output_ids; a null logprob
    is -inf (SGLang's JSON encoding of it)."""
    if value is None and not output_ids:  # e.g. a request aborted before its first token
        return ()
    _require(isinstance(value, list) and len(value) == len(output_ids),
             f"{where}: output_token_logprobs must be a list of {len(output_ids)} entries")
    logprobs = []
    for t, (entry, token_id) in enumerate(zip(value, output_ids)):
        _require(isinstance(entry, list) and len(entry) >= 2, f"{where}: logprob entry {t} is not [logprob, id, ...]")
        logprob = -math.inf if entry[0] is None else _as_logprob(entry[0])
        _require(logprob is not None, f"{where}: logprob {t} must be a finite number <= 0 or null, got {entry[0]!r}")
        _require(_is_int(entry[1]) and entry[1] == token_id,
                 f"{where}: logprob entry {t} is for token {entry[1]!r}, output_ids has {token_id}")
        logprobs.append(logprob)
    return tuple(logprobs)


def _parse_weight_versions(value: Any, num_tokens: int, where: str) -> tuple[str, ...]:
    """The versions of `meta_info.weight_versions` spans `[{version, start, end}, ...]` in token order
    (consecutive repeats merged); () when absent (an older server)."""
    if value is None:
        return ()
    _require(isinstance(value, list), f"{where}: weight_versions must be a list of spans, got {value!r}")
    versions: list[str] = []
    for span in value:
        _require(isinstance(span, dict) and isinstance(span.get("version"), str) and _is_int(span.get("start"))
                 and _is_int(span.get("end")) and 0 <= span["start"] <= span["end"] <= num_tokens,
                 f"{where}: a weight_versions span must be {{version, start, end}} within {num_tokens} tokens, "
                 f"got {span!r}")
        if not versions or versions[-1] != span["version"]:
            versions.append(span["version"])
    return tuple(versions)


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
    finish_reason, matched_stop, failure = _parse_finish_reason(meta_info.get("finish_reason"), output_ids, where)
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
        weight_versions=_parse_weight_versions(meta_info.get("weight_versions"), len(output_ids), where),
        failure=failure,
    )


def parse_generate_response(body: Any, prompt_index: int, num_samples: int, params: SamplingParams
                            ) -> list[Sample]:
    """The `num_samples` samples of one prompt's `/generate` answer (a list of sample objects, one per copy of
    the prompt), as samples of prompt `prompt_index`. MalformedResponse otherwise."""
    _require(isinstance(body, list) and len(body) == num_samples,
             f"/generate must answer a list of {num_samples} samples, got "
             + (f"{len(body)}" if isinstance(body, list) else type(body).__name__))
    return [parse_sample(value, prompt_index, params) for value in body]


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


class _NotLoaded(RuntimeError):
    """The server answered that it did not load a version."""


def weight_load_timeout_s(num_bytes: int) -> float:
    """How long a weight load of a `num_bytes` checkpoint may take: WEIGHT_LOAD_BASE_S plus the bytes read at
    WEIGHT_LOAD_BYTES_PER_S (a slow shared filesystem's rate), e.g. 280 s for an 8B model in bfloat16."""
    return WEIGHT_LOAD_BASE_S + num_bytes / WEIGHT_LOAD_BYTES_PER_S


def _directory_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def _check_version_name(version: str) -> None:
    if not isinstance(version, str) or not version or version in (".", "..") or "/" in version or os.sep in version:
        raise ValueError(f"version must be a non-empty string usable as a directory name, got {version!r}")


# ------------------------------------------------------------------------------------------------- engine


class SGLangEngine(RolloutEngine):
    """A `RolloutEngine` over an SGLang server at `base_url` (module docstring).

    tokenizer:             renders chat-message prompts (`engine.prompt_token_ids`) here, with
                           `chat_template_kwargs` as the template's variables; None = token ids only.
    weight_dir:            where `update_weights` writes checkpoints (None: update_weights is a ValueError).
    max_in_flight, retry, headers: the `JsonHttpClient`'s.
    seed:                  the client's jitter, and the call seeds: with `SamplingParams.seed` None, call i is
                           seeded from (seed, i), as the embedded engine's (None counts as 0).
    eos_token_ids:         stop tokens sent with every request besides the call's `stop_token_ids` (the server
                           stops on the model's own EOS ids anyway; these make sure, e.g. for a chat model whose
                           generation_config lacks its end-of-turn id).
    weight_dtype:          dtype of the written checkpoints (e.g. jnp.bfloat16); None = the parameters'.
    health_timeout_s:      the constructor waits this long for GET /health (None: no wait), then reads the served
                           weight version from GET /model_info.
    namespace_cache:       send the weight version as `extra_key` (module docstring).
    pause_mode:            `/pause_generation`'s mode around a weight update: "retract" (requests in flight go
                           back to the queue and resume on the new weights, their KV recomputed), "in_place" (they
                           resume with the KV of the old weights) or "abort" (they end as aborted samples).
    weight_load_timeout_s: how long a weight load may take before the engine asks the server which version it
                           serves; None = sized to the checkpoint (`weight_load_timeout_s`).
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
        weight_dtype: Optional[Any] = None,
        headers: Optional[Mapping[str, str]] = None,
        seed: Optional[int] = None,
        health_timeout_s: Optional[float] = 600.0,
        namespace_cache: bool = True,
        pause_mode: str = "retract",
        weight_load_timeout_s: Optional[float] = None,
    ):
        if any(not _is_int(i) or i < 0 for i in eos_token_ids):
            raise ValueError(f"eos_token_ids must be non-negative token ids, got {eos_token_ids!r}")
        if pause_mode not in PAUSE_MODES:
            raise ValueError(f"pause_mode must be one of {PAUSE_MODES}, got {pause_mode!r}")
        if weight_load_timeout_s is not None and not weight_load_timeout_s > 0:
            raise ValueError(f"weight_load_timeout_s must be None or > 0, got {weight_load_timeout_s!r}")
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.weight_dir = Path(weight_dir) if weight_dir is not None else None
        self.eos_token_ids = tuple(eos_token_ids)
        self.weight_dtype = weight_dtype
        self.namespace_cache = namespace_cache
        self.pause_mode = pause_mode
        self.weight_load_timeout_s = weight_load_timeout_s
        self.seed = 0 if seed is None else seed
        self._num_calls = 0
        self._pauses = True  # False once the server has no /pause_generation (an older release)
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

    def _call_seed(self) -> int:
        self._num_calls += 1
        return int(np.random.SeedSequence((self.seed, self._num_calls)).generate_state(1)[0])

    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Sample]:
        """len(prompts) * params.n samples, prompt-major, from one request per prompt (its n samples, each with its
        own seed: `engine.sample_seeds`), sent concurrently (`stream_groups`, reordered). A request that fails for
        good gives its prompt n failed samples (`Sample.failure` the request's reason, e.g. "http_400") and the
        call goes on."""
        groups = {prompt_index: samples async for prompt_index, samples in self.stream_groups(prompts, params)}
        return [sample for prompt_index in range(len(prompts)) for sample in groups[prompt_index]]

    async def stream_groups(self, prompts: Sequence[Prompt],
                            params: SamplingParams) -> AsyncIterator[tuple[int, list[Sample]]]:
        """(prompt index, its n samples) as each prompt's request completes, in completion order: the requests of
        `agenerate`, all sent at once. Stopping the iteration early cancels the requests still in flight."""
        prompt_ids = [prompt_token_ids(prompt, self.tokenizer, self.chat_template_kwargs) for prompt in prompts]
        seed = params.seed if params.seed is not None else self._call_seed()
        seeds = sample_seeds(seed, len(prompt_ids) * params.n)
        version = self.weight_version
        cache_key = version if self.namespace_cache else None
        tasks = [asyncio.ensure_future(self._prompt_samples(
            p, ids, params, seeds[p * params.n:(p + 1) * params.n], cache_key, version))
            for p, ids in enumerate(prompt_ids)]
        try:
            for finished in asyncio.as_completed(tasks):
                samples = await finished
                yield samples[0].prompt_index, samples
        finally:
            for task in tasks:
                task.cancel()

    async def _prompt_samples(self, prompt_index: int, prompt_ids: list[int], params: SamplingParams,
                              seeds: Sequence[int], cache_key: Optional[str], version: str) -> list[Sample]:
        payload = generate_payload(prompt_ids, params, seeds, extra_stop_token_ids=self.eos_token_ids,
                                   cache_key=cache_key)
        validate = functools.partial(parse_generate_response, prompt_index=prompt_index, num_samples=len(seeds),
                                     params=params)
        try:
            return await self.client.post_json("/generate", payload, validate)
        except RequestFailed as error:
            _LOG.warning("prompt %d failed: %s", prompt_index, error)
            return failed_samples(prompt_index, len(seeds), error.reason, version)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Sample]:
        """`agenerate` run on the client's event loop (see `http.JsonHttpClient.run_sync` for calls from inside
        a running loop)."""
        return self.client.run_sync(self.agenerate(prompts, params))

    def update_weights(self, model: "Decoder", version: str) -> None:
        """Writes `model` to `weight_dir / version` and has the server load it as `version` (module docstring);
        `weight_version` is `version` once the server confirms it serves it. RuntimeError when the server does
        not load it (the engine's version is then unchanged)."""
        if self.weight_dir is None:
            raise ValueError("update_weights needs an engine built with weight_dir")
        _check_version_name(version)
        directory = (self.weight_dir / version).resolve()
        save_hf_checkpoint(model, directory, dtype=self.weight_dtype, overwrite=True)
        timeout_s = self.weight_load_timeout_s or weight_load_timeout_s(_directory_bytes(directory))
        try:
            self.client.run_sync(self._paused(self._load(directory, version, timeout_s)))
        except _NotLoaded:
            if directory not in self._written_versions:
                shutil.rmtree(directory, ignore_errors=True)
            raise
        except BaseException:
            # The server may still be loading it: the directory stays until a later sync has loaded.
            if directory not in self._written_versions:
                self._written_versions.append(directory)
            raise
        self.weight_version = version
        for old in self._written_versions:
            if old != directory:
                shutil.rmtree(old, ignore_errors=True)
        self._written_versions = [directory]

    async def _paused(self, load: Coroutine[Any, Any, None]) -> None:
        """Runs `load` with the server's generation paused (`pause_mode`), so that the load does not wait for
        the requests in flight; generation continues afterwards, whatever happened."""
        if self._pauses:
            try:
                await self.client.post_json("/pause_generation", {"mode": self.pause_mode})
            except RequestFailed as error:
                if error.status != 404:
                    load.close()
                    raise
                self._pauses = False
                _LOG.warning("%s has no /pause_generation (an older SGLang): a weight load waits for the requests "
                             "in flight to finish", self.client.base_url)
        if not self._pauses:
            return await load
        try:
            await load
        finally:
            await self.client.post_json("/continue_generation", {})

    async def _load(self, directory: Path, version: str, timeout_s: float) -> None:
        """POST /update_weights_from_disk once (a second attempt would queue a second load); when its answer does
        not come, asks /model_info until the server serves `version` or `timeout_s` more pass. Then confirms the
        served version."""
        payload = {
            "model_path": str(directory),
            "load_format": "auto",
            "weight_version": version,
            "flush_cache": False,
            "abort_all_requests": False,
        }
        try:
            await self.client.post_json("/update_weights_from_disk", payload, parse_weights_update,
                                        retry=RetryPolicy(max_attempts=1, timeout_s=timeout_s))
        except RequestFailed as error:
            if error.status is not None and 400 <= error.status < 500:
                raise _NotLoaded(f"the server did not load version {version}: {error}") from None
            _LOG.warning("no answer to the load of version %s (%s); asking the server which version it serves",
                         version, error.reason)
            await self._await_version(version, timeout_s)
        served = await self._served_version()
        if served != version:
            raise RuntimeError(f"the server serves version {served!r} after loading {version!r}")

    async def _await_version(self, version: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if await self._served_version() == version:
                    return
            except (RequestFailed, MalformedResponse):
                pass
            await asyncio.sleep(_VERSION_POLL_S)
        raise RuntimeError(f"the server did not confirm weight version {version} within {timeout_s:g} s; its "
                           "checkpoint is kept until a later sync loads")

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
