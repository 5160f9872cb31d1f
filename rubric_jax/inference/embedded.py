"""`EmbeddedEngine`: an in-process rollout engine, a jitted sampler on the Decoder's KV-cache path (the default on
CPU and in tests; the same interface as the SGLang engine, `engine.RolloutEngine`).

One call, on the device:
1. Prefill: the rows (each prompt repeated `n` times, prompt-major) are left-padded to a common width and fed
   at once into an empty KV cache; positions count each row's real tokens (cumsum(mask) - 1), so a row's result
   does not depend on its padding.
2. Decode, under one `lax.while_loop`: sample a token for every row from the last logits, record it, then feed
   the recorded tokens (one per row) to get the next logits. A row is done after a stop token (the engine's EOS
   ids or the call's `stop_token_ids`) or after its token budget; done rows feed masked padding. The loop exits
   as soon as every row is done, or after max_new_tokens tokens.
3. Sampling (SGLang's sampler): with penalties (`SamplingParams.penalized`), the raw logits first get the
   presence, frequency and repetition penalties of the tokens the row has generated so far (`penalized_logits`,
   from a per-row count of every vocabulary token, int32 [rows, V], updated after each token: 4 bytes x rows x V,
   e.g. 150 MiB for 256 rows of a 152k vocabulary; not allocated at all without penalties); then
   logits / temperature, then top-k (k most likely tokens) and top-p (a token is
   kept while the probability mass of the tokens ranked above it is <= top_p; the most likely token always is);
   temperature 0 is greedy (argmax, no filtering). Ties at the top-k / top-p threshold are all kept (a threshold
   on the value, not a cut in sort order). The token is drawn from the kept tokens' renormalised probabilities
   by the inverse CDF of one uniform per row and step (`inverse_cdf_sample`); each sample's uniforms come from
   its own stream, `fold_in(key(sample seed), step)` with the sample seed `engine.sample_seeds(call seed)[sample
   index in the call]` (the seeds the SGLang engine sends), so results do not depend on batching, padding or
   `max_batch_size`.
4. Logprobs: log_softmax(logits / temperature) of the sampled token, before top-k / top-p (temperature 0 counts
   as 1): what `rubric_jax.models.logprobs.sequence_logprobs(..., temperature=...)` recomputes in the learner.
   With penalties they are those of the penalised logits, as SGLang's (which the learner does not recompute).

Stop handling mirrors SGLang (`Req.check_finished`, checked after every token in this order): the length budget
first ("length", even if that last token is a stop token), then stop token ids ("stop", the token included,
`matched_stop` its id), then stop strings ("stop", `matched_stop` the first string of `stop`, in list order,
found in the decoded output). Stop strings are checked on the host after generation: the sample is cut after
the first token whose decoded prefix contains a stop string (`tokenizer.decode`, special tokens kept, as
SGLang's tail check; a trailing incomplete character U+FFFD dropped, as SGLang's incremental detokenizer holds
it back). That token is found by bisection over prefix lengths: a decoded prefix is a prefix of every longer
one's decoding (byte-level decoding only completes the trailing character), so once it contains a stop string
every longer one does. The cut keeps that token and its logprob (SGLang's output_ids); `text` is decoded
without special tokens and trimmed before the stop string (SGLang's `trim_matched_stop`), or without the stop
token when the sample stopped on one.

Context length: a prompt of max_position_embeddings tokens or more is a ValueError; a row's budget is
min(max_new_tokens, max_position_embeddings - prompt length), so prompt + response never exceed the model's
positions (SGLang clips max_new_tokens to the context length the same way, and reports "length").

Compilation: shapes are bucketed, so recompilation is rare: rows to the next power of two (at most
`max_batch_size`; more rows run in chunks), prompt width and max_new_tokens each to the next power of two
(at least 16), the stop-id list to a multiple of 8. Temperature, top-p, top-k, the penalties, the stop ids and
the seed are runtime values; the sampling mode (greedy, plain, filtered) and whether there are penalties are
static. `update_weights` swaps the parameters in
memory: same shapes, no recompilation. Calls are serialised by a lock (one generation at a time; a weight update
waits for the running generation), and `agenerate` runs `generate` in a worker thread.
"""

import asyncio
import dataclasses
import functools
import threading
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rubric_jax.inference.engine import Prompt, RolloutEngine, Sample, SamplingParams, prompt_token_ids, sample_seeds
from rubric_jax.models.decoder import Decoder, init_cache

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MIN_BUCKET = 16
STOP_IDS_BUCKET = 8
SAMPLING_BLOCK = 128
GREEDY, SAMPLE, FILTERED = "greedy", "sample", "filtered"
# What a byte-level tokenizer decodes an incomplete UTF-8 sequence to; at the end of a decoded prefix it is the
# start of a character still being generated.
INCOMPLETE_CHARACTER = "\ufffd"


def bucket(size: int, minimum: int = MIN_BUCKET) -> int:
    """The smallest power of two >= max(size, minimum)."""
    return 1 << (max(size, minimum) - 1).bit_length()


def _sampling_mode(params: SamplingParams) -> str:
    if params.temperature == 0:
        return GREEDY
    if params.top_k == -1 and params.top_p == 1:
        return SAMPLE
    return FILTERED


def _penalties(params: SamplingParams) -> Optional[tuple[np.float32, np.float32, np.float32]]:
    """The call's (presence, frequency, repetition) penalties as runtime values; None when all are at their
    defaults, which compiles the sampler without token counts."""
    if not params.penalized:
        return None
    return (np.float32(params.presence_penalty), np.float32(params.frequency_penalty),
            np.float32(params.repetition_penalty))


def filter_top_k_top_p(scaled_logits_bv: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Bool [B, V]: the tokens kept by top-k and top-p (SGLang's rule, module docstring) from temperature-scaled
    logits. `top_k` <= 0 means no limit. The kept set is a prefix of the descending order; it is expressed as a
    threshold on the logit value, so ties at the threshold are all kept."""
    sorted_bv = -jnp.sort(-scaled_logits_bv, axis=-1)
    probs_bv = jax.nn.softmax(sorted_bv, axis=-1)
    mass_above_bv = jnp.cumsum(probs_bv, axis=-1) - probs_bv
    rank_v = jnp.arange(sorted_bv.shape[-1])
    keep_bv = (mass_above_bv <= top_p) & ((top_k <= 0) | (rank_v < top_k))
    num_kept_b = jnp.maximum(jnp.sum(keep_bv, axis=-1), 1)
    threshold_b = jnp.take_along_axis(sorted_bv, (num_kept_b - 1)[:, None], axis=-1)
    return scaled_logits_bv >= threshold_b


def _first_exceeding(cdf_bn: jax.Array, weights_bn: jax.Array, target_b: jax.Array) -> jax.Array:
    """The first index n with cdf[n] > target, whose weight is then positive (cdf[n] > cdf[n - 1]); clamped to the
    last index of positive weight, for a target that rounding put at or past the total."""
    count_b = jnp.sum(cdf_bn <= target_b[:, None], axis=-1)
    last_b = jnp.max(jnp.where(weights_bn > 0, jnp.arange(weights_bn.shape[-1]), 0), axis=-1)
    return jnp.minimum(count_b, last_b)


def inverse_cdf_sample(weights_bv: jax.Array, uniform_b: jax.Array) -> jax.Array:
    """int32 [B]: index v drawn with probability weights[b, v] / sum(weights[b]) (weights >= 0, some positive;
    a weight of 0 is never drawn), by the inverse CDF of one uniform in [0, 1) per row.

    In two levels, so that no cumulative sum runs over the whole vocabulary (slow on the CPU): the block of
    SAMPLING_BLOCK tokens from the cumulative block sums, then the token from the cumulative sums inside that
    block. One uniform per row instead of a Gumbel variate per token makes sampling cost a reduction over V."""
    batch, vocab = weights_bv.shape
    weights_bkw = jnp.pad(weights_bv, ((0, 0), (0, -vocab % SAMPLING_BLOCK))).reshape(batch, -1, SAMPLING_BLOCK)
    block_weights_bk = jnp.sum(weights_bkw, axis=-1)
    cdf_bk = jnp.cumsum(block_weights_bk, axis=-1)
    target_b = uniform_b * cdf_bk[:, -1]
    block_b = _first_exceeding(cdf_bk, block_weights_bk, target_b)
    below_b = jnp.where(block_b > 0, jnp.take_along_axis(cdf_bk, jnp.maximum(block_b - 1, 0)[:, None], -1)[:, 0], 0)
    weights_bw = jnp.take_along_axis(weights_bkw, block_b[:, None, None], axis=1)[:, 0]
    index_b = _first_exceeding(jnp.cumsum(weights_bw, axis=-1), weights_bw, target_b - below_b)
    return (block_b * SAMPLING_BLOCK + index_b).astype(jnp.int32)


def penalized_logits(logits_bv: jax.Array, counts_bv: jax.Array, presence: jax.Array, frequency: jax.Array,
                     repetition: jax.Array) -> jax.Array:
    """float32 [B, V]: the raw logits under SGLang's presence, frequency and repetition penalties, `counts_bv`
    (int32 [B, V]) holding how often row b has generated token v so far (its prompt not counted); the definitions
    and their order are `engine.SamplingParams`'s: z - presence [c > 0] - frequency c, then z / repetition where
    that is > 0 and z * repetition where it is <= 0, for the tokens with c > 0. A token never generated keeps its
    logit."""
    seen_bv = counts_bv > 0
    logits_bv = logits_bv - presence * seen_bv - frequency * counts_bv
    scaled_bv = jnp.where(logits_bv > 0, logits_bv / repetition, logits_bv * repetition)
    return jnp.where(seen_bv, scaled_bv, logits_bv)


def _penalize(logits_bv: jax.Array, counts_bv: Optional[jax.Array], penalties) -> jax.Array:
    """The logits under the penalties of the counted tokens; as they are in a call without penalties (no
    counts)."""
    return logits_bv if counts_bv is None else penalized_logits(logits_bv, counts_bv, *penalties)


def _count(counts_bv: Optional[jax.Array], token_b: jax.Array, live_b: jax.Array) -> Optional[jax.Array]:
    """The counts with each live row's new token added; None (a call without penalties) stays None."""
    if counts_bv is None:
        return None
    return counts_bv.at[jnp.arange(token_b.shape[0]), token_b].add(live_b.astype(jnp.int32))


def sample_tokens(logits_bv, keys_b, step, temperature, top_k, top_p, mode: str) -> tuple[jax.Array, jax.Array]:
    """(token_b int32, logprob_b float32) for one decode step; see the module docstring (3. and 4.)."""
    if mode != GREEDY:
        logits_bv = logits_bv / temperature
    shifted_bv = logits_bv - jnp.max(logits_bv, axis=-1, keepdims=True)
    exp_bv = jnp.exp(shifted_bv)
    if mode == GREEDY:
        # The first index of the maximum, as argmax, in two plain reductions (faster than argmax's on the CPU).
        token_b = jnp.min(jnp.where(shifted_bv == 0, jnp.arange(logits_bv.shape[-1]), logits_bv.shape[-1]), axis=-1)
    else:
        weights_bv = exp_bv if mode == SAMPLE else jnp.where(filter_top_k_top_p(logits_bv, top_k, top_p), exp_bv, 0)
        step_keys_b = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys_b, step)
        token_b = inverse_cdf_sample(weights_bv, jax.vmap(jax.random.uniform)(step_keys_b))
    # log_softmax of the (tempered, unfiltered) logits at the token.
    logp_b = jnp.take_along_axis(shifted_bv, token_b[:, None], axis=-1)[:, 0] - jnp.log(jnp.sum(exp_bv, axis=-1))
    return token_b.astype(jnp.int32), logp_b


@functools.partial(jax.jit, static_argnames=("graphdef", "max_steps", "mode"))
def _generate(graphdef, state, tokens_bp, mask_bp, budget_b, seed_b, stop_ids_s, temperature, top_k, top_p,
              penalties, *, max_steps: int, mode: str, pad_id: int = 0):
    """(output_ids_bn, logprobs_bn, length_b) for N = max_steps columns; see the module docstring (1.-4.).

    budget_b: tokens each row may generate (0 for a padding row: it starts done); seed_b: each row's sample seed
    (uint32); stop_ids_s: stop token ids,
    padded with -1; penalties: (presence, frequency, repetition), or None for a call without penalties (then no
    token counts are kept)."""
    model = nnx.merge(graphdef, state)
    batch, width = tokens_bp.shape
    prompt_len_b = jnp.sum(mask_bp, axis=-1).astype(jnp.int32)
    positions_bp = jnp.maximum(jnp.cumsum(mask_bp, axis=-1) - 1, 0).astype(jnp.int32)
    cache = init_cache(model.config, batch, width + max_steps, model.dtype)
    hidden_bpd, cache = model(tokens_bp, positions_bp, mask_bp, cache)
    logits_bv = model.logits(hidden_bpd[:, -1])
    keys_b = jax.vmap(jax.random.key)(seed_b)

    def record(step, logits_bv, done_b, output_ids_bn, logprobs_bn, counts_bv):
        logits_bv = _penalize(logits_bv, counts_bv, penalties)
        token_b, logp_b = sample_tokens(logits_bv, keys_b, step, temperature, top_k, top_p, mode)
        token_b = jnp.where(done_b, pad_id, token_b)
        output_ids_bn = jax.lax.dynamic_update_slice(output_ids_bn, token_b[:, None], (0, step))
        logprobs_bn = jax.lax.dynamic_update_slice(logprobs_bn, jnp.where(done_b, 0.0, logp_b)[:, None], (0, step))
        counts_bv = _count(counts_bv, token_b, ~done_b)
        stopped_b = jnp.any(token_b[:, None] == stop_ids_s[None, :], axis=-1)
        done_b = done_b | stopped_b | (step + 1 >= budget_b)
        return token_b, done_b, output_ids_bn, logprobs_bn, counts_bv

    output_ids_bn = jnp.full((batch, max_steps), pad_id, jnp.int32)
    logprobs_bn = jnp.zeros((batch, max_steps), jnp.float32)
    counts_bv = None if penalties is None else jnp.zeros(logits_bv.shape, jnp.int32)
    done_b = budget_b <= 0
    length_b = jnp.where(done_b, 0, 1)
    token_b, done_b, output_ids_bn, logprobs_bn, counts_bv = record(
        0, logits_bv, done_b, output_ids_bn, logprobs_bn, counts_bv)

    def cond(carry):
        step, _, _, done_b, _, _, _, _ = carry
        return (step < max_steps) & ~jnp.all(done_b)

    def body(carry):
        step, cache, token_b, done_b, length_b, output_ids_bn, logprobs_bn, counts_bv = carry
        # The token recorded at step - 1 sits at position prompt_len + step - 1; done rows feed masked padding.
        hidden_b1d, cache = model(token_b[:, None], (prompt_len_b + step - 1)[:, None], ~done_b[:, None], cache)
        length_b = length_b + ~done_b
        token_b, done_b, output_ids_bn, logprobs_bn, counts_bv = record(
            step, model.logits(hidden_b1d[:, 0]), done_b, output_ids_bn, logprobs_bn, counts_bv
        )
        return step + 1, cache, token_b, done_b, length_b, output_ids_bn, logprobs_bn, counts_bv

    carry = (jnp.int32(1), cache, token_b, done_b, length_b, output_ids_bn, logprobs_bn, counts_bv)
    _, _, _, _, length_b, output_ids_bn, logprobs_bn, _ = jax.lax.while_loop(cond, body, carry)
    return output_ids_bn, logprobs_bn, length_b


class EmbeddedEngine(RolloutEngine):
    """A `RolloutEngine` sampling from a `Decoder` in this process (module docstring).

    tokenizer:     renders chat-message prompts (`engine.prompt_token_ids`), with `chat_template_kwargs` as the
                   template's variables (e.g. {"enable_thinking": False}); None = token ids only.
    eos_token_ids: the engine's stop tokens, used in every call besides the call's `stop_token_ids`.
    pad_id:        the id written into padding (must be a valid id: see the Decoder's conventions).
    seed:          with `SamplingParams.seed` None, call i uses a seed derived from (seed, i): an engine's
                   sequence of calls is reproducible. A call with a seed is reproducible on its own.
    max_batch_size: the most rows (prompts x n) run at once; None = all rows of a call.
    """

    def __init__(
        self,
        model: Decoder,
        *,
        tokenizer: Optional["PreTrainedTokenizerBase"] = None,
        chat_template_kwargs: Optional[Mapping[str, Any]] = None,
        eos_token_ids: Sequence[int],
        pad_id: int = 0,
        seed: int = 0,
        weight_version: str = "0",
        max_batch_size: Optional[int] = None,
    ):
        self._config = model.config
        vocab = self._config.vocab_size
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        if any(not 0 <= i < vocab for i in self.eos_token_ids):
            raise ValueError(f"eos_token_ids must lie in [0, {vocab}), got {self.eos_token_ids}")
        if not 0 <= pad_id < vocab:
            raise ValueError(f"pad_id must lie in [0, {vocab}), got {pad_id}")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be None or >= 1, got {max_batch_size}")
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.pad_id = pad_id
        self.seed = seed
        self.max_batch_size = max_batch_size
        self.weight_version = weight_version
        self._graphdef, self._state = nnx.split(model)
        self._num_calls = 0
        self._lock = threading.Lock()

    def update_weights(self, model: Decoder, version: str) -> None:
        """Serves `model` (same config as the engine's model: ValueError otherwise) from the next call on."""
        if model.config != self._config:
            raise ValueError(
                f"update_weights needs a model with the engine's config {self._config}, got {model.config}"
            )
        graphdef, state = nnx.split(model)
        with self._lock:
            self._graphdef, self._state = graphdef, state
            self.weight_version = version

    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Sample]:
        return await asyncio.to_thread(self.generate, prompts, params)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Sample]:
        prompt_ids = [self._prompt_ids(i, prompt) for i, prompt in enumerate(prompts)]
        with self._lock:
            seed = params.seed if params.seed is not None else self._call_seed()
        seeds = iter(sample_seeds(seed, len(prompts) * params.n))
        rows = [(ids, next(seeds)) for ids in prompt_ids for _ in range(params.n)]
        samples = self._generate_rows(rows, params)
        return [dataclasses.replace(sample, prompt_index=row // params.n) for row, sample in enumerate(samples)]

    def generate_rows(self, rows: Sequence[tuple[Prompt, int]], params: SamplingParams) -> list[Sample]:
        """One sample per (prompt, sample seed) row, in row order (`prompt_index` the row's index); `params`' n and
        seed are not read. `generate` is this with the seeds `sample_seeds(call seed)`; a server that takes a seed
        per sample (the tests' SGLang stand-in) calls it directly."""
        return self._generate_rows([(self._prompt_ids(r, prompt), seed) for r, (prompt, seed) in enumerate(rows)],
                                   params)

    def _generate_rows(self, rows: Sequence[tuple[list[int], int]], params: SamplingParams) -> list[Sample]:
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need an engine built with a tokenizer")
        vocab = self._config.vocab_size
        if any(not 0 <= i < vocab for i in params.stop_token_ids):
            raise ValueError(f"stop_token_ids must lie in [0, {vocab}), got {params.stop_token_ids}")
        with self._lock:
            chunk = self.max_batch_size or max(len(rows), 1)
            results = []
            for start in range(0, len(rows), chunk):
                results += self._run_rows(rows[start:start + chunk], params)
            version = self.weight_version
        return [self._sample(r, ids, out, logps, params, version)
                for r, ((ids, _), (out, logps)) in enumerate(zip(rows, results))]

    def _prompt_ids(self, index: int, prompt: Prompt) -> list[int]:
        ids = prompt_token_ids(prompt, self.tokenizer, self.chat_template_kwargs)
        vocab, max_positions = self._config.vocab_size, self._config.max_position_embeddings
        if any(not 0 <= i < vocab for i in ids):
            raise ValueError(f"prompt {index} holds token ids outside [0, {vocab})")
        if len(ids) >= max_positions:
            raise ValueError(
                f"prompt {index} has {len(ids)} tokens; the model's max_position_embeddings is {max_positions}, "
                "which leaves no room for a response"
            )
        return ids

    def _call_seed(self) -> int:
        self._num_calls += 1
        return int(np.random.SeedSequence((self.seed, self._num_calls)).generate_state(1)[0])

    def _run_rows(self, rows, params: SamplingParams):
        """Runs one chunk of (prompt ids, sample seed) rows; returns (output ids, logprobs) per row, the ids ending
        at the device's stop (a stop token or the budget)."""
        num_rows = len(rows)
        batch = bucket(num_rows, 1)
        if self.max_batch_size is not None:
            batch = min(batch, self.max_batch_size)
        width = bucket(max(len(ids) for ids, _ in rows))
        tokens_bp = np.full((batch, width), self.pad_id, np.int32)
        mask_bp = np.zeros((batch, width), bool)
        budget_b = np.zeros(batch, np.int32)
        seed_b = np.zeros(batch, np.uint32)
        for b, (ids, seed) in enumerate(rows):
            tokens_bp[b, width - len(ids):] = ids
            mask_bp[b, width - len(ids):] = True
            budget_b[b] = min(params.max_new_tokens, self._config.max_position_embeddings - len(ids))
            seed_b[b] = seed
        stop_ids = self.eos_token_ids + params.stop_token_ids
        stop_ids_s = np.full(-(-max(len(stop_ids), 1) // STOP_IDS_BUCKET) * STOP_IDS_BUCKET, -1, np.int32)
        stop_ids_s[:len(stop_ids)] = stop_ids
        output_ids_bn, logprobs_bn, length_b = _generate(
            self._graphdef, self._state, tokens_bp, mask_bp, budget_b, seed_b, stop_ids_s,
            np.float32(params.temperature), np.int32(params.top_k), np.float32(params.top_p), _penalties(params),
            max_steps=bucket(params.max_new_tokens), mode=_sampling_mode(params), pad_id=self.pad_id,
        )
        output_ids_bn, logprobs_bn, length_b = jax.device_get((output_ids_bn, logprobs_bn, length_b))
        return [(output_ids_bn[b, :length_b[b]].tolist(), logprobs_bn[b, :length_b[b]].tolist())
                for b in range(num_rows)]

    def _sample(self, prompt_index: int, prompt_ids, output_ids, logprobs, params: SamplingParams, version: str):
        """The Sample of one row: finish reason by SGLang's order, host-side stop strings (module docstring)."""
        # The device ends a row at its budget or, before it, on a stop token.
        budget = min(params.max_new_tokens, self._config.max_position_embeddings - len(prompt_ids))
        if len(output_ids) >= budget:
            finish_reason, matched = "length", None
        else:
            finish_reason, matched = "stop", output_ids[-1]
        # The last token's own check comes before stop strings, so only the tokens before it can match one.
        cut = first_stop_string_cut(self.tokenizer, output_ids[:-1], params.stop) if params.stop else None
        if cut is not None:
            length, matched = cut
            output_ids, logprobs, finish_reason = output_ids[:length], logprobs[:length], "stop"
        text = None
        if self.tokenizer is not None:
            text_ids = output_ids[:-1] if isinstance(matched, int) else output_ids
            text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
            if isinstance(matched, str) and matched in text:
                text = text[:text.find(matched)]
        return Sample(prompt_index=prompt_index, output_ids=tuple(output_ids), logprobs=tuple(logprobs),
                      finish_reason=finish_reason, matched_stop=matched, weight_version=version, text=text)


def first_stop_string_cut(tokenizer, output_ids: Sequence[int], stop: Sequence[str]) -> Optional[tuple[int, str]]:
    """(k, s): the smallest k such that tokenizer.decode(output_ids[:k]) contains a stop string, and s the first
    of `stop` (in list order) it contains; None when the whole output contains none. Bisection over k (module
    docstring)."""

    def matched(k: int) -> Optional[str]:
        text = tokenizer.decode(list(output_ids[:k])).rstrip(INCOMPLETE_CHARACTER)
        return next((s for s in stop if s in text), None)

    if not output_ids or matched(len(output_ids)) is None:
        return None
    low, high = 1, len(output_ids)  # matched(high) is not None; find the smallest such k
    while low < high:
        middle = (low + high) // 2
        if matched(middle) is None:
            low = middle + 1
        else:
            high = middle
    return high, matched(high)
