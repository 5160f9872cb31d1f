"""The rollout-engine interface every sampler implements (SGLang over HTTP, the embedded JAX sampler), and the
fixed-shape batch the learner reads.

Conventions (those of SGLang's native `/generate`, REFERENCE.md section 3, so both engines agree):
- A call with P prompts and `n` samples per prompt returns P * n `Sample`s, prompt-major:
  [p0 s0, p0 s1, ..., p1 s0, ...]; `Sample.prompt_index` is the prompt's index in the call.
- `output_ids` are the response tokens only. When generation stops on a token (an EOS id of the engine or one of
  `stop_token_ids`) that token IS included, in `output_ids` and `logprobs` alike; `finish_reason` is "stop" and
  `matched_stop` the token id. Stopping on a stop string gives "stop" with the string as `matched_stop`; the
  tokens up to and including the one that completed the string are kept (the string is trimmed from `text`
  only). Reaching `max_new_tokens` gives "length" and `matched_stop` None. "abort": a failed sample
  (`Sample.failure` says why: aborted, a NaN met, its request failed), which no recipe trains on.
- `logprobs[i]` is log pi(output_ids[i]) under the sampling policy, log_softmax(logits / temperature), before any
  top-k / top-p filtering (temperature 0 counts as 1), which is what the learner recomputes with
  `rubric_jax.models.logprobs.sequence_logprobs(..., temperature=temperature)`.
- `weight_version` names the weights the engine served when the sample was sent, and `weight_versions` the
  versions that produced its tokens when the engine knows them, so rollouts of a stale policy are detectable
  (`stale_samples`).
- Each sample has its own seed (`sample_seeds`), so the samples of one prompt differ whatever the engine does
  with a shared seed, and a call is reproducible from its seed.
- `stream_groups` gives the same samples a group at a time (a prompt's n samples), as each group finishes, in any
  order of prompts: the SGLang engine as each prompt's request completes, the embedded engine as a group's last
  decode slot finishes.
"""

import abc
import dataclasses
import math
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping, Optional, Sequence, Union

import numpy as np

from rubric_jax.models.tokenizer import apply_chat_template

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rubric_jax.inference.http import ClientStats
    from rubric_jax.models.decoder import Decoder

FINISH_REASONS = ("stop", "length", "abort")

Prompt = Union[Sequence[int], Sequence[Mapping[str, str]]]  # token ids, or chat messages [{"role", "content"}]


def _as_tuple(value: Any, name: str, item_type: type) -> tuple:
    """`value` (any non-string sequence of `item_type`; numpy integers count as int) as a tuple; ValueError
    naming `name` otherwise."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise ValueError(f"{name} must be a sequence of {item_type.__name__}, got {value!r}")
    accepted = (int, np.integer) if item_type is int else item_type
    items = tuple(value)
    for item in items:
        if not isinstance(item, accepted) or isinstance(item, bool):
            raise ValueError(f"{name} must hold only {item_type.__name__} values, got {item!r}")
    return tuple(item_type(item) for item in items)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters of one call, named and defaulted as SGLang's `sampling_params`.

    max_new_tokens: the most response tokens per sample (>= 1).
    n:              samples per prompt (>= 1).
    temperature:    >= 0; 0 is greedy decoding (argmax).
    top_p:          in (0, 1]: keep the smallest set of most likely tokens whose probability mass reaches top_p
                    (a token is kept while the mass of the tokens ranked above it is <= top_p).
    top_k:          -1 (no limit, SGLang's convention) or >= 1: keep the k most likely tokens.
    stop:           stop strings (non-empty); lists are accepted and stored as tuples.
    stop_token_ids: stop tokens in addition to the engine's EOS ids.
    seed:           None, or an int making the call reproducible (SGLang's `sampling_seed`).
    presence_penalty, frequency_penalty (in [-2, 2], default 0) and repetition_penalty (in (0, 2], default 1; 1 is
                    none): penalties on the tokens the sample has generated so far, its prompt not counted
                    (SGLang's `penaltylib`, which accumulates output tokens only, and OpenAI's definition of the
                    first two). With c[v] the count of token v in the sample's output, on the raw logits z:
                    z[v] -= presence_penalty * [c[v] > 0] + frequency_penalty * c[v], then, for every v with
                    c[v] > 0, z[v] = z[v] / repetition_penalty if z[v] > 0 else z[v] * repetition_penalty (CTRL's
                    rule, as SGLang's `apply_scaling_penalties`); then temperature, top-k and top-p as usual. The
                    additive penalties come before the multiplicative one, the order of SGLang's
                    `apply_logits_bias` (linear, then scaling penalties); vLLM applies repetition first, which
                    differs only when both kinds are set. Unlike vLLM and Hugging Face, the repetition penalty does
                    not count prompt tokens. Logprobs are then those of the penalised distribution (what SGLang
                    returns): the learner, which knows no penalties, recomputes other logprobs, so penalties are
                    for evaluation, not for the rollouts a policy trains on. Some SGLang releases accept and
                    validate repetition_penalty but register no penalizer for it, so it has no effect there
                    (sgl-project/sglang#28179); the embedded engine always applies it.
    """

    max_new_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self):
        for name in ("max_new_tokens", "n"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not _is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, (int, np.integer)) or isinstance(self.top_k, bool) or not (
            self.top_k == -1 or self.top_k >= 1
        ):
            raise ValueError(f"top_k must be -1 (no limit) or an int >= 1, got {self.top_k!r}")
        stop = _as_tuple(self.stop, "stop", str)
        if any(not s for s in stop):
            raise ValueError(f"stop strings must be non-empty, got {stop!r}")
        stop_token_ids = _as_tuple(self.stop_token_ids, "stop_token_ids", int)
        if any(i < 0 for i in stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative token ids, got {stop_token_ids!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"seed must be None or an int, got {self.seed!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2] (0: none), got {value!r}")
        if not _is_real(self.repetition_penalty) or not 0 < self.repetition_penalty <= 2:
            raise ValueError(f"repetition_penalty must be in (0, 2] (1: none), got {self.repetition_penalty!r}")
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", stop_token_ids)

    @property
    def penalized(self) -> bool:
        """Whether any penalty differs from its default (none)."""
        return (self.presence_penalty, self.frequency_penalty, self.repetition_penalty) != (0, 0, 1)

    def to_sglang(self) -> dict[str, Any]:
        """The `sampling_params` dict of SGLang's `/generate` (n included; `seed` as `sampling_seed`; empty
        stop lists, a None seed and penalties at their defaults left out, which SGLang reads as the same
        defaults)."""
        params: dict[str, Any] = dict(
            max_new_tokens=int(self.max_new_tokens),
            n=int(self.n),
            temperature=float(self.temperature),
            top_p=float(self.top_p),
            top_k=int(self.top_k),
        )
        if self.stop:
            params["stop"] = list(self.stop)
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        if self.seed is not None:
            params["sampling_seed"] = int(self.seed)
        for name, default in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)):
            if getattr(self, name) != default:
                params[name] = float(getattr(self, name))
        return params


@dataclasses.dataclass(frozen=True)
class Sample:
    """One completion (see the module docstring for the conventions).

    prompt_index:    index into the prompts of the call.
    output_ids:      response token ids; the stop token is included when the sample stopped on a token.
    logprobs:        one float per output id: log pi(token) under the sampling policy (-inf where a server sent
                     none: SGLang encodes -inf as null).
    finish_reason:   "stop" | "length" | "abort" (a failed sample: `failure` says why).
    matched_stop:    the stop token id (int) or stop string (str) that ended it, else None.
    weight_version:  the weights the engine served when the sample was sent.
    text:            the decoded response with a matched stop string and what follows trimmed, or None.
    weight_versions: the versions whose weights produced its tokens, in token order, when the engine reports them
                     (SGLang's per-token spans); () = all of `weight_version`.
    failure:         "" for a sample to train on, else why it failed: "abort" (the server aborted it), "nan" (the
                     server met a NaN or out-of-vocabulary token), or the reason its request failed for good
                     ("http_<status>", "timeout", "connection", "malformed"). A failed sample's finish_reason is
                     "abort", and a sample with finish_reason "abort" has a failure ("abort" when none is given).
    """

    prompt_index: int
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    matched_stop: Union[int, str, None]
    weight_version: str
    text: Optional[str] = None
    weight_versions: tuple[str, ...] = ()
    failure: str = ""

    def __post_init__(self):
        if len(self.output_ids) != len(self.logprobs):
            raise ValueError(
                f"Sample output_ids and logprobs must have equal lengths, got {len(self.output_ids)} and "
                f"{len(self.logprobs)}"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Sample finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        if self.failure and self.finish_reason != "abort":
            raise ValueError(f"a failed sample ({self.failure}) has finish_reason abort, got {self.finish_reason!r}")
        if self.finish_reason == "abort" and not self.failure:
            object.__setattr__(self, "failure", "abort")

    @property
    def versions(self) -> tuple[str, ...]:
        """The weight versions that produced the sample's tokens (`weight_versions`, else `weight_version`)."""
        return self.weight_versions or (self.weight_version,)


def failed_samples(prompt_index: int, count: int, failure: str, weight_version: str) -> list[Sample]:
    """`count` empty failed samples of prompt `prompt_index` (a request that failed for good)."""
    return [Sample(prompt_index=prompt_index, output_ids=(), logprobs=(), finish_reason="abort", matched_stop=None,
                   weight_version=weight_version, text="", failure=failure) for _ in range(count)]


def prompt_token_ids(prompt: Prompt, tokenizer: Optional["PreTrainedTokenizerBase"],
                     chat_template_kwargs: Optional[Mapping[str, Any]] = None) -> list[int]:
    """The token ids of one prompt: token ids as given, or chat messages rendered by the tokenizer's chat
    template, with `chat_template_kwargs` as the template's variables, and the assistant header appended
    (`apply_chat_template`). ValueError for a str (ambiguous: pass ids or messages), an empty prompt, a mix of
    ids and messages, or chat messages without a tokenizer."""
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, (Sequence, np.ndarray)) or len(prompt) == 0:
        raise ValueError(f"a prompt must be a non-empty sequence of token ids or of chat messages, got {prompt!r}")
    if all(isinstance(m, Mapping) for m in prompt):
        if tokenizer is None:
            raise ValueError("chat-message prompts need an engine built with a tokenizer")
        return apply_chat_template(tokenizer, prompt, template_kwargs=chat_template_kwargs)
    if all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in prompt):
        return [int(i) for i in prompt]
    raise ValueError(f"a prompt must be all token ids or all chat messages, got {prompt!r}")


class RolloutEngine(abc.ABC):
    """Generates samples for prompts and takes new policy weights.

    `weight_version` is the version of the weights the engine serves now. Results are prompt-major (module
    docstring). An implementation provides both the sync and the async call; one may run the other.
    """

    weight_version: str

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Sample]:
        """len(prompts) * params.n samples, prompt-major."""

    @abc.abstractmethod
    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Sample]:
        """The same as `generate`, awaitable."""

    async def stream_groups(self, prompts: Sequence[Prompt],
                            params: SamplingParams) -> AsyncIterator[tuple[int, list[Sample]]]:
        """(prompt index, its n samples) for each prompt, as its group finishes, in any order of prompts: a
        consumer can work on a group (judge it) while later ones are still sampling. The samples are `agenerate`'s.
        This default yields every group, in prompt order, once `agenerate` returns; an engine that finishes groups
        apart overrides it."""
        samples = await self.agenerate(prompts, params)
        for prompt_index in range(len(prompts)):
            yield prompt_index, samples[prompt_index * params.n:(prompt_index + 1) * params.n]

    @abc.abstractmethod
    def update_weights(self, model: "Decoder", version: str) -> None:
        """Serves `model`'s weights from now on, under the name `version`."""

    def close(self) -> None:
        """Releases the engine's resources (none by default)."""

    def http_stats(self) -> Optional["ClientStats"]:
        """The request counters (retries, failures) of the engine's HTTP client; None for in-process engines."""
        return None


def sample_seeds(seed: int, count: int) -> list[int]:
    """The seeds of a call's `count` samples (prompt-major), seeded by the call's `seed`: sample i's is drawn from
    `SeedSequence((seed, i))`, 31 bits. Both engines seed each sample with its own (the embedded engine's row
    keys, the SGLang engine's per-sample `sampling_seed`), so the n samples of one prompt differ on any server
    and a sample depends on the call's seed and its index alone."""
    return [int(np.random.SeedSequence((seed, i)).generate_state(1)[0] >> 1) for i in range(count)]


def stale_samples(samples: Sequence[Sample], current_version: str) -> list[int]:
    """Indices of the samples any of whose tokens a weight version other than `current_version` produced
    (`Sample.versions`: a sample that spanned a weight update is stale)."""
    return [i for i, sample in enumerate(samples) if any(v != current_version for v in sample.versions)]


@dataclasses.dataclass(frozen=True)
class RolloutBatch:
    """Samples as fixed-shape numpy arrays for the learner, one row per sample in the samples' order.

    output_ids_bt:      int32 [B, T] response ids, left-aligned, `pad_id` after each response's end.
    logprobs_bt:        float32 [B, T] rollout logprobs of those tokens, 0 on padding.
    response_mask_bt:   bool [B, T], True on response tokens.
    finished_by_stop_b: bool [B], finish_reason == "stop" (False for "length" = truncated, and "abort").
    prompt_index_b:     int32 [B], the samples' prompt indices (the group ids of one call).
    """

    output_ids_bt: np.ndarray
    logprobs_bt: np.ndarray
    response_mask_bt: np.ndarray
    finished_by_stop_b: np.ndarray
    prompt_index_b: np.ndarray

    @classmethod
    def from_samples(cls, samples: Sequence[Sample], pad_id: int, max_len: int) -> "RolloutBatch":
        """Pads every response to `max_len` tokens; ValueError when a response is longer (nothing is silently
        truncated: pass the call's max_new_tokens or more)."""
        if max_len < 0:
            raise ValueError(f"max_len must be >= 0, got {max_len}")
        batch = len(samples)
        output_ids_bt = np.full((batch, max_len), pad_id, np.int32)
        logprobs_bt = np.zeros((batch, max_len), np.float32)
        response_mask_bt = np.zeros((batch, max_len), bool)
        for b, sample in enumerate(samples):
            length = len(sample.output_ids)
            if length > max_len:
                raise ValueError(f"sample {b} has {length} output tokens, more than max_len={max_len}")
            output_ids_bt[b, :length] = sample.output_ids
            logprobs_bt[b, :length] = sample.logprobs
            response_mask_bt[b, :length] = True
        return cls(
            output_ids_bt=output_ids_bt,
            logprobs_bt=logprobs_bt,
            response_mask_bt=response_mask_bt,
            finished_by_stop_b=np.array([s.finish_reason == "stop" for s in samples], bool),
            prompt_index_b=np.array([s.prompt_index for s in samples], np.int32),
        )
