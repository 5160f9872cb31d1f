"""`EmbeddedEngine`: an in-process rollout engine, a jitted sampler on the Decoder's KV-cache path (the default on
CPU and in tests; the same interface as the SGLang engine, `engine.RolloutEngine`).

One call is decoded by continuous batching (JetStream's prefill / insert / generate), over a fixed number of
decode slots B (`decode_slots`; by default the call's rows rounded up to a power of two, at most MAX_AUTO_SLOTS):
1. Rows: each prompt repeated `n` times, prompt-major, each with its sample seed; they wait in row order for a
   free slot. Slot b is one row of a KV cache with its own write position (`KVCache.end` [B]): its row's prompt
   in slots [0, P) (left-padded to the call's prompt width P), its response from P on.
2. Shared prefill: a prompt is prefilled once, not n times. When the next waiting row's prompt has no prefill
   yet, the next G distinct prompts (rows of equal prompt ids share one, wherever they are) are prefilled
   together into a cache of exactly P slots, with positions counting each prompt's real tokens
   (cumsum(mask) - 1), so a row's result does not depend on its padding; G is B / (rows per prompt) rounded up
   to a power of two, so that one prefill fills the slots of G whole groups. A prefill stays on the device until
   every row of its prompts is in a slot: a group that finds too few free slots waits, and its other rows are
   inserted later from the saved prefill (at most two prefills are kept).
3. Insert: a free slot takes the next waiting row: its prompt's keys and values are copied into the slot's
   [0, P), the rest of the slot invalidated, its write position set to P, and its first token sampled from the
   prompt's last logits.
4. Generate, in chunks of CHUNK_STEPS steps (one jitted `lax.while_loop` over the slots, the slot state
   donated): each live slot feeds its last token and samples the next. A slot is done after a stop token (the
   engine's EOS ids or the call's `stop_token_ids`) or after its token budget; done slots feed masked padding.
   A chunk ends early once no slot is live. Its attention reads the cache's first slots only, a window covering
   the longest live row to the chunk's end (`attention_window`: multiples of 1/16 of the cache, at least 128
   slots), so a step's HBM traffic follows the cache in use, not its capacity; a model that decodes by the
   ragged kernel (`Decoder.decodes_ragged`, `model.attention: splash`) reads each row's own slots instead, with
   no window. Between chunks the host reads which slots finished, hands their rows' responses on, and refills
   those slots (1-3): a finished row leaves within CHUNK_STEPS steps, instead of keeping its slot until the
   longest row of a static batch is done.
Every row keeps its own random stream (5.), so the samples are those of the static-batch reference
(`StaticEngine`: all rows prefilled and decoded together until the last is done; the tests compare the two):
the same tokens and finish reasons, logprobs equal up to float summation order.

5. Sampling (SGLang's sampler): with penalties (`SamplingParams.penalized`), the raw logits first get the
   presence, frequency and repetition penalties of the tokens the row has generated so far (`penalized_logits`,
   from a per-slot count of every vocabulary token, int32 [B, V], updated after each token: 4 bytes x B x V,
   e.g. 150 MiB for 256 slots of a 152k vocabulary; not allocated at all without penalties); then
   logits / temperature, then top-k (k most likely tokens) and top-p (a token is
   kept while the probability mass of the tokens ranked above it is <= top_p; the most likely token always is);
   temperature 0 is greedy (argmax, no filtering). Ties at the top-k / top-p threshold are all kept (a threshold
   on the value, not a cut in sort order). The token is drawn from the kept tokens' renormalised probabilities
   by the inverse CDF of one uniform per row and step (`inverse_cdf_sample`); each sample's uniforms come from
   its own stream, `fold_in(key(sample seed), step)` with the sample seed `engine.sample_seeds(call seed)[sample
   index in the call]` (the seeds the SGLang engine sends) and `step` the row's own step, so results do not
   depend on batching, padding, slots or refill order.
6. Logprobs: log_softmax(logits / temperature) of the sampled token, before top-k / top-p (temperature 0 counts
   as 1): what `rubric_jax.models.logprobs.sequence_logprobs(..., temperature=...)` recomputes in the learner.
   With penalties they are those of the penalised logits, as SGLang's (which the learner does not recompute).

Stop handling mirrors SGLang (`Req.check_finished`, checked after every token in this order): the length budget
first ("length", even if that last token is a stop token), then stop token ids ("stop", the token included,
`matched_stop` its id), then stop strings ("stop", `matched_stop` the first string of `stop`, in list order,
found in the decoded output). Stop strings are checked on the host once a row has finished: the sample is cut after
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

Compilation: shapes are bucketed, so recompilation is rare: the slots to the next power of two of the rows (at
most `decode_slots`), the prefill's G prompts likewise, prompt width P and max_new_tokens N each to the next power
of two (at least 16; the slots' cache holds P + N positions), the stop-id list to a multiple of 8, the chunk
length a constant, its attention window one of at most 16. Which slots a refill fills is a runtime mask, so an
insert never recompiles. Temperature,
top-p, top-k, the penalties, the stop ids and the seeds are runtime values; the sampling mode (greedy, plain,
filtered) and whether there are penalties are static. `update_weights` swaps the parameters in memory: same
shapes, no recompilation. Calls are serialised by a lock (one generation at a time; a weight update waits for
the running generation), and `agenerate` runs `generate` in a worker thread. `stream_groups` yields each
prompt's group as its last row finishes (the hook for judging a group while later groups sample).
"""

import asyncio
import collections
import contextlib
import dataclasses
import functools
import threading
from typing import TYPE_CHECKING, Any, AsyncIterator, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rubric_jax.inference.engine import Prompt, RolloutEngine, Sample, SamplingParams, prompt_token_ids, sample_seeds
from rubric_jax.models import attention, sharding
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.decoder import Decoder, KVCache, init_cache

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MIN_BUCKET = 16
STOP_IDS_BUCKET = 8
SAMPLING_BLOCK = 128
# Decode steps per jitted call: the host refills finished slots between calls, so a finished row idles at most
# CHUNK_STEPS - 1 steps, against one host round trip per CHUNK_STEPS steps.
CHUNK_STEPS = 16
MAX_AUTO_SLOTS = 256
# A decode chunk attends to the cache's first slots only, in windows that are multiples of 1 / WINDOW_BLOCKS of the
# cache (at least MIN_WINDOW slots): its HBM traffic follows the longest live row, at the price of at most
# WINDOW_BLOCKS compilations of the chunk.
WINDOW_BLOCKS = 16
MIN_WINDOW = 128
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
    """(token_b int32, logprob_b float32) for one decode step; see the module docstring (5. and 6.). `step` is the
    sampling step of every row (a scalar) or of each row (int32 [B])."""
    if mode != GREEDY:
        logits_bv = logits_bv / temperature
    shifted_bv = logits_bv - jnp.max(logits_bv, axis=-1, keepdims=True)
    exp_bv = jnp.exp(shifted_bv)
    if mode == GREEDY:
        # The first index of the maximum, as argmax, in two plain reductions (faster than argmax's on the CPU).
        token_b = jnp.min(jnp.where(shifted_bv == 0, jnp.arange(logits_bv.shape[-1]), logits_bv.shape[-1]), axis=-1)
    else:
        weights_bv = exp_bv if mode == SAMPLE else jnp.where(filter_top_k_top_p(logits_bv, top_k, top_p), exp_bv, 0)
        step_keys_b = jax.vmap(jax.random.fold_in)(keys_b, jnp.broadcast_to(step, keys_b.shape))
        token_b = inverse_cdf_sample(weights_bv, jax.vmap(jax.random.uniform)(step_keys_b))
    # log_softmax of the (tempered, unfiltered) logits at the token.
    logp_b = jnp.take_along_axis(shifted_bv, token_b[:, None], axis=-1)[:, 0] - jnp.log(jnp.sum(exp_bv, axis=-1))
    return token_b.astype(jnp.int32), logp_b


def _prefill(model: Decoder, tokens_bp, mask_bp, max_len: int) -> tuple[KVCache, jax.Array, jax.Array]:
    """(cache of `max_len` slots holding the left-padded prompts in slots [0, P), the last position's logits
    [B, V], prompt lengths [B]); positions count each row's real tokens. The prompts are attended by the
    full-sequence pass (`Decoder.prefill`), and the cache padded with empty slots up to `max_len`."""
    positions_bp = jnp.maximum(jnp.cumsum(mask_bp, axis=-1) - 1, 0).astype(jnp.int32)
    hidden_bpd, cache = model.prefill(tokens_bp, positions_bp, mask_bp)
    empty = max_len - tokens_bp.shape[1]
    if empty:
        pad = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, empty), (0, 0)))  # noqa: E731
        cache = KVCache(k_bnsk=tuple(map(pad, cache.k_bnsk)), v_bnsk=tuple(map(pad, cache.v_bnsk)),
                        valid_bs=jnp.pad(cache.valid_bs, ((0, 0), (0, empty))), end=cache.end)
    return cache, model.logits(hidden_bpd[:, -1]), jnp.sum(mask_bp, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_steps", "mode"))
def static_generate(graphdef, state, tokens_bp, mask_bp, budget_b, seed_b, stop_ids_s, temperature, top_k, top_p,
                    penalties, *, max_steps: int, mode: str, pad_id: int = 0):
    """The static-batch reference of the continuous engine (`StaticEngine`): (output_ids_bn, logprobs_bn,
    length_b) for N = max_steps columns, every row prefilled together and decoded under one `lax.while_loop`
    until the last row is done (done rows feed masked padding).

    budget_b: tokens each row may generate (0 for a padding row: it starts done); seed_b: each row's sample seed
    (uint32); stop_ids_s: stop token ids, padded with -1; penalties: (presence, frequency, repetition), or None for
    a call without penalties (then no token counts are kept)."""
    model = nnx.merge(graphdef, state)
    batch, width = tokens_bp.shape
    cache, logits_bv, prompt_len_b = _prefill(model, tokens_bp, mask_bp, width + max_steps)
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


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["cache", "token_b", "step_b", "live_b", "prompt_len_b", "budget_b", "seed_b",
                                "counts_bv", "output_ids_bn", "logprobs_bn"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class Slots:
    """The device state of B decode slots, carried from one jitted call to the next (and donated to it).

    cache:         the slots' KV cache, one write position per slot (`KVCache.end` [B]): a slot's prompt in
                   slots [0, P) of its row, left-padded, its response tokens from P on.
    token_b:       the token recorded last, fed at the next step; step_b: the tokens recorded so far (the next
                   sampling step, and the length of the response); live_b: the slot holds a row still generating
                   (False: finished, or never filled).
    prompt_len_b, budget_b, seed_b: the slot's row's real prompt tokens, token budget and sample seed.
    counts_bv:     each slot's count of every generated token (int32 [B, V]); None in a call without penalties.
    output_ids_bn, logprobs_bn: the slot's row's response so far, N = max_steps columns.
    """

    cache: KVCache
    token_b: jax.Array
    step_b: jax.Array
    live_b: jax.Array
    prompt_len_b: jax.Array
    budget_b: jax.Array
    seed_b: jax.Array
    counts_bv: Optional[jax.Array]
    output_ids_bn: jax.Array
    logprobs_bn: jax.Array


def _empty_slots(config: ModelConfig, num_slots: int, max_len: int, max_steps: int, dtype, penalized: bool,
                 pad_id: int) -> Slots:
    """B never-filled slots (each array its own buffer, as donation needs)."""
    zeros_b = functools.partial(jnp.zeros, num_slots, jnp.int32)
    return Slots(
        cache=init_cache(config, num_slots, max_len, dtype, per_row_end=True), token_b=zeros_b(), step_b=zeros_b(),
        live_b=jnp.zeros(num_slots, bool), prompt_len_b=zeros_b(), budget_b=zeros_b(),
        seed_b=jnp.zeros(num_slots, jnp.uint32),
        counts_bv=jnp.zeros((num_slots, config.vocab_size), jnp.int32) if penalized else None,
        output_ids_bn=jnp.full((num_slots, max_steps), pad_id, jnp.int32),
        logprobs_bn=jnp.zeros((num_slots, max_steps), jnp.float32),
    )


def slot_shardings(slots: Any, mesh: jax.sharding.Mesh) -> Any:
    """NamedShardings of a tree of slot arrays (`Slots`, or their `jax.eval_shape`) on a decode mesh
    (`sharding.decode_mesh`): rows over the batch axes, a layer's keys and values [B, KV, S, hd] also their heads
    over "tensor" (each axis kept where it divides the dimension)."""
    axis_sizes = dict(mesh.shape)

    def spec(leaf):
        axes = (sharding.BATCH_AXES, "tensor", None, None) if leaf.ndim == 4 else \
            (sharding.BATCH_AXES,) + (None,) * (leaf.ndim - 1)
        return jax.sharding.NamedSharding(mesh, sharding.fit_spec(axes, leaf.shape, axis_sizes))

    return jax.tree.map(spec, slots)


def _params_mesh(state: Any) -> Optional[jax.sharding.Mesh]:
    """The mesh the parameters are laid out on (`policy.rollout_model`'s decode layout), None for parameters on
    one device."""
    leaf_sharding = getattr(jax.tree.leaves(state)[0], "sharding", None)
    if isinstance(leaf_sharding, jax.sharding.NamedSharding) and leaf_sharding.mesh.size > 1:
        return leaf_sharding.mesh
    return None


def _record(slots: Slots, logits_bv, write_b, stop_ids_s, temperature, top_k, top_p, penalties, mode: str) -> Slots:
    """The slots after sampling one token for each slot in `write_b` from its logits (the static reference's
    `record`, at each slot's own step): the token and its logprob written at column step_b, counted, and the
    slot done after a stop token or at its budget. Other slots are unchanged."""
    logits_bv = _penalize(logits_bv, slots.counts_bv, penalties)
    keys_b = jax.vmap(jax.random.key)(slots.seed_b)
    token_b, logp_b = sample_tokens(logits_bv, keys_b, slots.step_b, temperature, top_k, top_p, mode)
    rows_b = jnp.arange(token_b.shape[0])
    # An out-of-range column drops the write of a slot not written.
    column_b = jnp.where(write_b, slots.step_b, slots.output_ids_bn.shape[1])
    stopped_b = jnp.any(token_b[:, None] == stop_ids_s[None, :], axis=-1)
    step_b = slots.step_b + write_b
    return dataclasses.replace(
        slots,
        token_b=jnp.where(write_b, token_b, slots.token_b),
        step_b=step_b,
        live_b=jnp.where(write_b, ~stopped_b & (step_b < slots.budget_b), slots.live_b),
        counts_bv=_count(slots.counts_bv, token_b, write_b),
        output_ids_bn=slots.output_ids_bn.at[rows_b, column_b].set(token_b, mode="drop"),
        logprobs_bn=slots.logprobs_bn.at[rows_b, column_b].set(logp_b, mode="drop"),
    )


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _prefill_prompts(graphdef, state, tokens_gp, mask_gp) -> tuple[KVCache, jax.Array, jax.Array]:
    """The shared prefill: G distinct prompts, once each (`_prefill` with a cache of exactly P slots)."""
    return _prefill(nnx.merge(graphdef, state), tokens_gp, mask_gp, tokens_gp.shape[1])


@functools.partial(jax.jit, static_argnames=("mode",), donate_argnames=("slots",))
def _insert(slots: Slots, prefill_cache: KVCache, logits_gv, prompt_len_g, insert_b, source_b, seed_b, budget_b,
            stop_ids_s, temperature, top_k, top_p, penalties, *, mode: str) -> Slots:
    """The slots with slot b (where insert_b) refilled by a new row of prompt source_b of a shared prefill
    (G prompts of P slots): the prompt's keys and values copied into its slots [0, P), the rest of its row
    invalidated, its write position set to P, its counts and response cleared, and its first token sampled from
    the prompt's last logits (step 0 of its seed's stream). Shapes are the call's, whichever slots are refilled."""
    width = prefill_cache.max_len

    def refill(buffer_bnsk, prefill_gnpk):
        head_bnpk = jnp.where(insert_b[:, None, None, None], prefill_gnpk[source_b], buffer_bnsk[:, :, :width])
        return buffer_bnsk.at[:, :, :width].set(head_bnpk)

    valid_bs = jnp.zeros_like(slots.cache.valid_bs).at[:, :width].set(prefill_cache.valid_bs[source_b])
    cache = KVCache(
        k_bnsk=tuple(map(refill, slots.cache.k_bnsk, prefill_cache.k_bnsk)),
        v_bnsk=tuple(map(refill, slots.cache.v_bnsk, prefill_cache.v_bnsk)),
        valid_bs=jnp.where(insert_b[:, None], valid_bs, slots.cache.valid_bs),
        end=jnp.where(insert_b, width, slots.cache.end),
    )
    counts_bv = slots.counts_bv
    if counts_bv is not None:
        counts_bv = jnp.where(insert_b[:, None], 0, counts_bv)
    slots = dataclasses.replace(
        slots, cache=cache, counts_bv=counts_bv,
        step_b=jnp.where(insert_b, 0, slots.step_b),
        prompt_len_b=jnp.where(insert_b, prompt_len_g[source_b], slots.prompt_len_b),
        budget_b=jnp.where(insert_b, budget_b, slots.budget_b),
        seed_b=jnp.where(insert_b, seed_b, slots.seed_b),
    )
    return _record(slots, logits_gv[source_b], insert_b, stop_ids_s, temperature, top_k, top_p, penalties, mode)


def decode_step(model: Decoder, slots: Slots, stop_ids_s, temperature, top_k, top_p, penalties, *, mode: str,
                attended_slots: Optional[int] = None) -> Slots:
    """One decode step of every live slot: feed its last token, sample the next (`_record`). The attention reads
    the cache's first `attended_slots` slots (the chunk's window, `attention_window`); a finished slot feeds
    masked tokens, which its next refill overwrites."""
    # The token recorded at step - 1 sits at position prompt_len + step - 1, in cache slot P + step - 1.
    positions_b1 = (slots.prompt_len_b + slots.step_b - 1)[:, None]
    hidden_b1d, cache = model(slots.token_b[:, None], positions_b1, slots.live_b[:, None], slots.cache,
                              attended_slots=attended_slots)
    slots = dataclasses.replace(slots, cache=cache)
    logits_bv = model.logits(hidden_b1d[:, 0])
    return _record(slots, logits_bv, slots.live_b, stop_ids_s, temperature, top_k, top_p, penalties, mode)


@functools.partial(jax.jit, static_argnames=("graphdef", "num_steps", "mode", "attended_slots"),
                   donate_argnames=("slots",))
def _decode_chunk(graphdef, state, slots: Slots, stop_ids_s, temperature, top_k, top_p, penalties, *,
                  num_steps: int, mode: str, attended_slots: int) -> Slots:
    """Up to `num_steps` decode steps (`decode_step`), stopping early once no slot is live."""
    model = nnx.merge(graphdef, state)

    def cond(carry):
        step, slots = carry
        return (step < num_steps) & jnp.any(slots.live_b)

    def body(carry):
        step, slots = carry
        return step + 1, decode_step(model, slots, stop_ids_s, temperature, top_k, top_p, penalties, mode=mode,
                                     attended_slots=attended_slots)

    return jax.lax.while_loop(cond, body, (jnp.int32(0), slots))[1]


def call_shapes(num_rows: int, num_prompts: int, decode_slots: Optional[int]) -> tuple[int, int]:
    """(decode slots, prompts per shared prefill) of a call of `num_rows` rows of `num_prompts` distinct prompts
    (module docstring: the rows rounded up to a power of two, at most `decode_slots` or MAX_AUTO_SLOTS; enough
    prompts per prefill to fill the slots with whole groups)."""
    num_slots = min(bucket(num_rows, 1), decode_slots or MAX_AUTO_SLOTS)
    rows_per_prompt = -(-num_rows // num_prompts)
    return num_slots, min(bucket(-(-num_slots // rows_per_prompt), 1), bucket(num_prompts, 1))


def attention_window(needed_slots: int, capacity: int) -> int:
    """The cache slots a chunk attends to: `needed_slots` rounded up to a multiple of WINDOW_BLOCKS's share of
    the cache (at least MIN_WINDOW slots), at most `capacity`; so a chunk compiles for one of at most
    WINDOW_BLOCKS windows, and reads at most one share more than it needs."""
    block = max(MIN_WINDOW, -(-capacity // WINDOW_BLOCKS))
    return min(capacity, -(-needed_slots // block) * block)


class EmbeddedEngine(RolloutEngine):
    """A `RolloutEngine` sampling from a `Decoder` in this process, by continuous batching (module docstring).

    tokenizer:     renders chat-message prompts (`engine.prompt_token_ids`), with `chat_template_kwargs` as the
                   template's variables (e.g. {"enable_thinking": False}); None = token ids only.
    eos_token_ids: the engine's stop tokens, used in every call besides the call's `stop_token_ids`.
    pad_id:        the id written into padding (must be a valid id: see the Decoder's conventions).
    seed:          with `SamplingParams.seed` None, call i uses a seed derived from (seed, i): an engine's
                   sequence of calls is reproducible. A call with a seed is reproducible on its own.
    decode_slots:  the most rows (prompts x n) decoded at once, i.e. the KV cache's rows. A call uses
                   min(decode_slots, its rows rounded up to a power of two) slots; None = its rows rounded up to a
                   power of two, at most MAX_AUTO_SLOTS (256).
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
        decode_slots: Optional[int] = None,
    ):
        self._config = model.config
        vocab = self._config.vocab_size
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        if any(not 0 <= i < vocab for i in self.eos_token_ids):
            raise ValueError(f"eos_token_ids must lie in [0, {vocab}), got {self.eos_token_ids}")
        if not 0 <= pad_id < vocab:
            raise ValueError(f"pad_id must lie in [0, {vocab}), got {pad_id}")
        if decode_slots is not None and decode_slots < 1:
            raise ValueError(f"decode_slots must be None or >= 1, got {decode_slots}")
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.pad_id = pad_id
        self.seed = seed
        self.decode_slots = decode_slots
        self.weight_version = weight_version
        self._serve(model)
        self._num_calls = 0
        self._lock = threading.Lock()

    def _serve(self, model: Decoder) -> None:
        self._graphdef, self._state = nnx.split(model)
        self._mesh = _params_mesh(self._state)
        self._dtype = model.dtype
        # The ragged kernel reads each row's own slots: a window would only add compilations. It is the decode
        # kernel of "splash" attention, whose prefill needs a multiple of its block.
        self._windowed = not model.decodes_ragged()
        self._min_width = MIN_BUCKET if self._windowed else attention.SPLASH_BLOCK

    def _prompt_width(self, rows: Sequence[tuple[list[int], int]]) -> int:
        """The call's prompt bucket: its longest prompt rounded up to a power of two (`bucket`)."""
        return bucket(max(len(ids) for ids, _ in rows), self._min_width)

    def update_weights(self, model: Decoder, version: str) -> None:
        """Serves `model` (same config as the engine's model: ValueError otherwise) from the next call on."""
        if model.config != self._config:
            raise ValueError(
                f"update_weights needs a model with the engine's config {self._config}, got {model.config}"
            )
        with self._lock:
            self._serve(model)
            self.weight_version = version

    async def agenerate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Sample]:
        return await asyncio.to_thread(self.generate, prompts, params)

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Sample]:
        samples = self._generate_rows(self._call_rows(prompts, params), params)
        return [dataclasses.replace(sample, prompt_index=row // params.n) for row, sample in enumerate(samples)]

    async def stream_groups(self, prompts: Sequence[Prompt],
                            params: SamplingParams) -> AsyncIterator[tuple[int, list[Sample]]]:
        """(prompt index, its n samples) for each prompt, as its group finishes (when its last row does), in
        completion order; the samples are `generate`'s. Generation runs in a worker thread, under the engine lock
        until every group is done, even if the iteration stops early."""
        rows = self._call_rows(prompts, params)
        self._check_call(params)
        loop = asyncio.get_running_loop()
        finished: asyncio.Queue = asyncio.Queue()

        def produce():
            try:
                for item in self._finished_samples(rows, params):
                    loop.call_soon_threadsafe(finished.put_nowait, item)
            except BaseException as error:  # handed to the consumer, which raises it
                loop.call_soon_threadsafe(finished.put_nowait, error)
            else:
                loop.call_soon_threadsafe(finished.put_nowait, None)

        producer = asyncio.ensure_future(asyncio.to_thread(produce))
        groups: dict[int, dict[int, Sample]] = {}
        while (item := await finished.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            row, sample = item
            group = groups.setdefault(row // params.n, {})
            group[row] = dataclasses.replace(sample, prompt_index=row // params.n)
            if len(group) == params.n:
                yield row // params.n, [group[r] for r in sorted(group)]
        await producer

    def generate_rows(self, rows: Sequence[tuple[Prompt, int]], params: SamplingParams) -> list[Sample]:
        """One sample per (prompt, sample seed) row, in row order (`prompt_index` the row's index); `params`' n and
        seed are not read. `generate` is this with the seeds `sample_seeds(call seed)`; a server that takes a seed
        per sample (the tests' SGLang stand-in) calls it directly."""
        return self._generate_rows([(self._prompt_ids(r, prompt), seed) for r, (prompt, seed) in enumerate(rows)],
                                   params)

    def _call_rows(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[tuple[list[int], int]]:
        """The (prompt ids, sample seed) rows of a call: each prompt n times, prompt-major."""
        prompt_ids = [self._prompt_ids(i, prompt) for i, prompt in enumerate(prompts)]
        with self._lock:
            seed = params.seed if params.seed is not None else self._call_seed()
        seeds = iter(sample_seeds(seed, len(prompts) * params.n))
        return [(ids, next(seeds)) for ids in prompt_ids for _ in range(params.n)]

    def _check_call(self, params: SamplingParams) -> None:
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need an engine built with a tokenizer")
        vocab = self._config.vocab_size
        if any(not 0 <= i < vocab for i in params.stop_token_ids):
            raise ValueError(f"stop_token_ids must lie in [0, {vocab}), got {params.stop_token_ids}")

    def _generate_rows(self, rows: Sequence[tuple[list[int], int]], params: SamplingParams) -> list[Sample]:
        self._check_call(params)
        return [sample for _, sample in sorted(self._finished_samples(rows, params), key=lambda item: item[0])]

    def _finished_samples(self, rows: Sequence[tuple[list[int], int]], params: SamplingParams):
        """Yields (row index, Sample) as each row finishes, holding the engine lock until the last."""
        with self._lock:
            version = self.weight_version
            for row, output_ids, logprobs in self._decode(rows, params):
                yield row, self._sample(row, rows[row][0], output_ids, logprobs, params, version)

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

    def _budget(self, prompt_ids, params: SamplingParams) -> int:
        return min(params.max_new_tokens, self._config.max_position_embeddings - len(prompt_ids))

    def _sampling_args(self, params: SamplingParams) -> tuple:
        """(stop_ids_s, temperature, top_k, top_p, penalties): the call's runtime sampling values."""
        stop_ids = self.eos_token_ids + params.stop_token_ids
        stop_ids_s = np.full(-(-max(len(stop_ids), 1) // STOP_IDS_BUCKET) * STOP_IDS_BUCKET, -1, np.int32)
        stop_ids_s[:len(stop_ids)] = stop_ids
        return (stop_ids_s, np.float32(params.temperature), np.int32(params.top_k), np.float32(params.top_p),
                _penalties(params))

    def _left_padded(self, prompts: Sequence[Sequence[int]], batch: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens [batch, width], mask [batch, width]): the prompts left-padded, then all-padding rows."""
        tokens_bp = np.full((batch, width), self.pad_id, np.int32)
        mask_bp = np.zeros((batch, width), bool)
        for b, ids in enumerate(prompts):
            tokens_bp[b, width - len(ids):] = ids
            mask_bp[b, width - len(ids):] = True
        return tokens_bp, mask_bp

    def _decode(self, rows: Sequence[tuple[list[int], int]], params: SamplingParams):
        """Yields (row index, output ids, logprobs) of each row as it finishes, the ids ending at the device's stop
        (a stop token or the budget): continuous batching over the call's slots (module docstring)."""
        if not rows:
            return
        unique_prompts: dict[tuple[int, ...], int] = {}
        prompt_of_row = [unique_prompts.setdefault(tuple(ids), len(unique_prompts)) for ids, _ in rows]
        prompts = list(unique_prompts)
        rows_left = collections.Counter(prompt_of_row)  # per prompt, its rows not yet in a slot
        num_slots, prefill_batch = call_shapes(len(rows), len(prompts), self.decode_slots)
        width, max_steps = self._prompt_width(rows), bucket(params.max_new_tokens)
        sampling, mode = self._sampling_args(params), _sampling_mode(params)
        slots = _empty_slots(self._config, num_slots, width + max_steps, max_steps, self._dtype,
                             params.penalized, self.pad_id)
        if self._mesh is not None:
            slots = jax.device_put(slots, slot_shardings(slots, self._mesh))
        prefilled: dict[int, tuple[tuple, int]] = {}  # prompt -> (its shared prefill, its index there)
        waiting = collections.deque(range(len(rows)))
        row_of_slot: list[Optional[int]] = [None] * num_slots
        step_b = np.zeros(num_slots, np.int32)  # each slot's tokens recorded so far, as last read
        while True:
            free = [b for b, row in enumerate(row_of_slot) if row is None]
            inserts: dict[int, tuple] = {}  # id(prefill) -> (prefill, insert_b, source_b, seed_b, budget_b)
            for b in free[:len(waiting)]:
                row = waiting.popleft()
                prompt = prompt_of_row[row]
                if prompt not in prefilled:
                    # Rows are taken in order, so this is the first prompt not prefilled yet.
                    batch = prompts[prompt:prompt + prefill_batch]
                    with self._on_mesh():
                        prefill = _prefill_prompts(self._graphdef, self._state,
                                                   *self._left_padded(batch, prefill_batch, width))
                    prefilled.update((prompt + g, (prefill, g)) for g in range(len(batch)))
                prefill, source = prefilled[prompt]
                rows_left[prompt] -= 1
                if not rows_left[prompt]:
                    del prefilled[prompt]  # a shared prefill is freed once every row of its prompts is in a slot
                insert = inserts.setdefault(id(prefill), (prefill, np.zeros(num_slots, bool),
                                                          np.zeros(num_slots, np.int32),
                                                          np.zeros(num_slots, np.uint32),
                                                          np.zeros(num_slots, np.int32)))
                ids, seed = rows[row]
                insert[1][b], insert[2][b], insert[3][b], insert[4][b] = True, source, seed, self._budget(ids, params)
                row_of_slot[b] = row
                step_b[b] = 1
            for prefill, *refill in inserts.values():
                with self._on_mesh():
                    slots = _insert(slots, *prefill, *refill, *sampling, mode=mode)
            if all(row is None for row in row_of_slot):
                return
            # A slot at step s feeds the token in cache slot P + s - 1; the chunk's last step attends to the slots
            # up to P + s - 2 + CHUNK_STEPS.
            longest = max(step_b[b] for b, row in enumerate(row_of_slot) if row is not None)
            window = attention_window(width + longest + CHUNK_STEPS, width + max_steps) if self._windowed \
                else width + max_steps
            with self._on_mesh():
                slots = _decode_chunk(self._graphdef, self._state, slots, *sampling, num_steps=CHUNK_STEPS,
                                      mode=mode, attended_slots=window)
            live_b, step_b = map(np.array, jax.device_get((slots.live_b, slots.step_b)))
            finished = [b for b, row in enumerate(row_of_slot) if row is not None and not live_b[b]]
            if finished:
                output_ids_bn, logprobs_bn = jax.device_get((slots.output_ids_bn, slots.logprobs_bn))
                for b in finished:
                    yield row_of_slot[b], output_ids_bn[b, :step_b[b]].tolist(), logprobs_bn[b, :step_b[b]].tolist()
                    row_of_slot[b] = None

    def _on_mesh(self):
        """The context a device call runs in: the parameters' mesh, for the decoder's activation constraints."""
        return contextlib.nullcontext() if self._mesh is None else jax.set_mesh(self._mesh)

    def _sample(self, prompt_index: int, prompt_ids, output_ids, logprobs, params: SamplingParams, version: str):
        """The Sample of one row: finish reason by SGLang's order, host-side stop strings (module docstring)."""
        # The device ends a row at its budget or, before it, on a stop token.
        if len(output_ids) >= self._budget(prompt_ids, params):
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


class StaticEngine(EmbeddedEngine):
    """The static-batch reference of `EmbeddedEngine` (tests and the continuous-batching benchmark): every row of
    a call prefilled (each prompt n times) and decoded together in one `static_generate`, until its last row is
    done; `decode_slots` is not read. Its samples are the continuous engine's."""

    def _decode(self, rows: Sequence[tuple[list[int], int]], params: SamplingParams):
        if not rows:
            return
        batch, width = bucket(len(rows), 1), self._prompt_width(rows)
        tokens_bp, mask_bp = self._left_padded([ids for ids, _ in rows], batch, width)
        budget_b, seed_b = np.zeros(batch, np.int32), np.zeros(batch, np.uint32)
        for b, (ids, seed) in enumerate(rows):
            budget_b[b], seed_b[b] = self._budget(ids, params), seed
        output_ids_bn, logprobs_bn, length_b = jax.device_get(static_generate(
            self._graphdef, self._state, tokens_bp, mask_bp, budget_b, seed_b, *self._sampling_args(params),
            max_steps=bucket(params.max_new_tokens), mode=_sampling_mode(params), pad_id=self.pad_id,
        ))
        for b in range(len(rows)):
            yield b, output_ids_bn[b, :length_b[b]].tolist(), logprobs_bn[b, :length_b[b]].tolist()


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
