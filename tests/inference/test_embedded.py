"""EmbeddedEngine against references: the full forward without a cache (greedy = argmax decoding), the learner's
`sequence_logprobs` (rollout logprobs), an exact filtered softmax (sampling distribution), and SGLang's stop and
ordering conventions.

The fixture models have unit-scale weights, whose next-token distributions are nearly one-hot; the "flat"
models below scale the final norm by FLAT_SCALE so that sampling has real choices (top probabilities ~0.1-0.4).
Most calls share shape buckets (up to 4 rows, prompts of <= 16 tokens, max_new_tokens <= 16) so that the file
compiles the sampler only a few times.
"""

import asyncio
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
import torch
import transformers
from flax import nnx

from rubric_jax.inference import embedded
from rubric_jax.inference.embedded import EmbeddedEngine, first_stop_string_cut
from rubric_jax.inference.engine import SamplingParams
from rubric_jax.models.decoder import Decoder
from rubric_jax.models.logprobs import sequence_logprobs
from rubric_jax.models.safetensors_io import load_hf_checkpoint
from rubric_jax.models.tokenizer import apply_chat_template, load_tokenizer
from tests.tiny_checkpoints import IM_END_ID

FLAT_SCALE = 0.15
# float32: the cache path and the full forward differ only in summation order (tests/models: ~1e-5).
LOGP_TOL = dict(atol=2e-4, rtol=1e-4)
PROMPTS = ([5, 6, 7], [40, 41, 42, 43, 44, 45, 46, 47, 48], [100, 12, 250, 31, 7, 77])
NUM_NEW = 12


@functools.cache
def _flat_model(directory: str) -> Decoder:
    model = load_hf_checkpoint(directory)
    model.norm.scale[...] = flattened(model.norm.scale[...], model.config.gemma)
    return model


def flattened(scale, gemma: bool):
    """A final norm's scale with its output times FLAT_SCALE (Gemma's norm multiplies by 1 + scale)."""
    return (1 + scale) * FLAT_SCALE - 1 if gemma else scale * FLAT_SCALE


@pytest.fixture
def qwen3(tiny_qwen3_dir) -> Decoder:
    return _flat_model(str(tiny_qwen3_dir))


@pytest.fixture
def llama(tiny_llama_dir) -> Decoder:
    """Untied embeddings: greedy outputs that do not just repeat a token (the stop tests need distinct ones)."""
    return _flat_model(str(tiny_llama_dir))


@pytest.fixture
def tokenizer(tiny_qwen3_dir):
    return load_tokenizer(tiny_qwen3_dir)


def greedy(max_new_tokens=NUM_NEW, **kwargs) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, **kwargs)


REFERENCE_WIDTH = 32  # references run on sequences right-padded to this width: one compilation per model


@functools.partial(jax.jit, static_argnums=(0, 4))
def _reference(graphdef, state, tokens_bt, mask_bt, temperature):
    """(full-forward logits [B, T, V], learner logprobs [B, T]) without a cache; right padding is masked."""
    model = nnx.merge(graphdef, state)
    positions_bt = jnp.broadcast_to(jnp.arange(tokens_bt.shape[1]), tokens_bt.shape)
    hidden_btd, _ = model(tokens_bt, positions_bt, mask_bt)
    logp_bt, _ = sequence_logprobs(model, tokens_bt, positions_bt, mask_bt, mask_bt, temperature=temperature)
    return model.logits(hidden_btd), logp_bt


def reference(model: Decoder, ids, temperature: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Float32 logits [T, V] of one unpadded sequence without a cache, and `sequence_logprobs` [T] of its tokens
    (the learner's computation; entry t scores ids[t] given ids[:t])."""
    tokens = np.zeros((1, REFERENCE_WIDTH), np.int32)
    tokens[0, :len(ids)] = ids
    graphdef, state = nnx.split(model)
    logits, logp = _reference(graphdef, state, tokens, np.arange(REFERENCE_WIDTH)[None] < len(ids), temperature)
    return np.asarray(logits[0, :len(ids)]), np.asarray(logp[0, :len(ids)])


def model_logprobs(model: Decoder, prompt, output_ids, temperature: float) -> np.ndarray:
    """`sequence_logprobs` of the response tokens of prompt + response."""
    return reference(model, list(prompt) + list(output_ids), temperature)[1][len(prompt):]


# ---------------------------------------------------------------- greedy and logprobs against references


@pytest.mark.parametrize("fixture", ["tiny_qwen3_dir", "tiny_qwen2_dir", "tiny_llama_dir", "tiny_qwen3_moe_dir",
                                     "tiny_gemma3_dir"])
def test_greedy_equals_argmax_decoding_of_the_full_forward(request, fixture):
    model = _flat_model(str(request.getfixturevalue(fixture)))
    samples = EmbeddedEngine(model, eos_token_ids=()).generate(PROMPTS, greedy())
    for prompt, sample in zip(PROMPTS, samples):
        ids = list(prompt)
        expected_logp = []
        for _ in range(NUM_NEW):
            logits_v = reference(model, ids)[0][-1]
            ids.append(int(np.argmax(logits_v)))
            expected_logp.append(jax.nn.log_softmax(logits_v)[ids[-1]])
        assert list(sample.output_ids) == ids[len(prompt):]
        np.testing.assert_allclose(sample.logprobs, expected_logp, **LOGP_TOL)
        assert (sample.finish_reason, sample.matched_stop, sample.weight_version) == ("length", None, "0")


@pytest.mark.parametrize("fixture", ["tiny_qwen3_dir", "tiny_qwen2_dir", "tiny_qwen2_untied_dir", "tiny_llama_dir",
                                     "tiny_qwen3_moe_dir", "tiny_gemma3_dir"])
def test_greedy_equals_transformers_generate(request, fixture):
    """The KV-cache decode path of each family (Qwen2's q/k/v biases, Gemma 3's sliding windows, shorter than the
    longer prompts, included) against transformers' own greedy `generate` on the same (flattened) weights, one
    prompt at a time; both stop at the end-of-turn token."""
    directory = str(request.getfixturevalue(fixture))
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    with torch.no_grad():
        hf.model.norm.weight.copy_(flattened(hf.model.norm.weight, hf.config.model_type == "gemma3_text"))
    samples = EmbeddedEngine(_flat_model(directory), eos_token_ids=(IM_END_ID,)).generate(PROMPTS, greedy())
    for prompt, sample in zip(PROMPTS, samples):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=NUM_NEW, do_sample=False, eos_token_id=IM_END_ID,
                              pad_token_id=IM_END_ID, return_dict_in_generate=True, output_logits=True)
        expected_ids = out.sequences[0, len(prompt):].tolist()
        assert list(sample.output_ids) == expected_ids
        expected_logp = [torch.log_softmax(logits[0], -1)[token].item() for logits, token in zip(out.logits,
                                                                                                  expected_ids)]
        np.testing.assert_allclose(sample.logprobs, expected_logp, **LOGP_TOL)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_the_learners_logprobs(qwen3, temperature):
    params = SamplingParams(max_new_tokens=NUM_NEW, n=2, temperature=temperature, seed=3)
    samples = EmbeddedEngine(qwen3, eos_token_ids=()).generate(PROMPTS[:2], params)
    assert [s.prompt_index for s in samples] == [0, 0, 1, 1]
    assert samples[0].output_ids != samples[1].output_ids  # the two samples of a prompt differ
    for sample in samples:
        expected = model_logprobs(qwen3, PROMPTS[sample.prompt_index], sample.output_ids, temperature)
        np.testing.assert_allclose(sample.logprobs, expected, **LOGP_TOL)


@pytest.mark.parametrize("filtering", [dict(top_k=1), dict(top_p=1e-6), dict(top_k=1, top_p=0.5)])
def test_top_k_one_and_tiny_top_p_equal_greedy(qwen3, filtering):
    engine = EmbeddedEngine(qwen3, eos_token_ids=())
    expected = engine.generate(PROMPTS, greedy())
    samples = engine.generate(PROMPTS, SamplingParams(max_new_tokens=NUM_NEW, temperature=1.0, seed=0, **filtering))
    for sample, reference in zip(samples, expected):
        assert sample.output_ids == reference.output_ids
        # Both are log_softmax(logits / 1): the logprobs are those before filtering.
        np.testing.assert_allclose(sample.logprobs, reference.logprobs, atol=1e-6)


def exact_filtered_distribution(logits_v: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """SGLang's top-k / top-p rule written directly in float64: sort, drop ranks >= k and tokens whose
    preceding mass exceeds top_p, renormalise."""
    scaled = logits_v.astype(np.float64) / temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    preceding = np.cumsum(probs[order]) - probs[order]
    kept = order[(np.arange(len(order)) < top_k) & (preceding <= top_p)]
    filtered = np.zeros_like(probs)
    filtered[kept] = probs[kept]
    return filtered / filtered.sum()


def chi_square_statistic(counts_v: np.ndarray, expected_v: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic and its degrees of freedom over the tokens of expected count >= 5, the others
    pooled into one bin (the chi-square approximation needs expected counts of about 5 or more)."""
    large = expected_v >= 5
    observed = np.append(counts_v[large], counts_v[~large].sum())
    expected = np.append(expected_v[large], expected_v[~large].sum())
    keep = expected > 0
    return float(np.sum((observed[keep] - expected[keep]) ** 2 / expected[keep])), int(keep.sum()) - 1


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.8, 8, 0.38), (1.0, -1, 1.0), (1.3, 40, 1.0)])
def test_sampling_distribution_matches_the_filtered_softmax(qwen3, temperature, top_k, top_p):
    """4096 first tokens of one prompt against the exact distribution. The seed is fixed, so the outcome is
    deterministic; the bound is the chi-square 0.999 quantile, which a correct sampler passes with probability
    0.999 over seeds, while a wrong temperature, a wrong top-k / top-p boundary (one token too many or too few)
    or a biased draw shifts probabilities by >= 0.01 and gives a statistic in the hundreds."""
    prompt, num = PROMPTS[0], 4096
    logits_v = reference(qwen3, prompt)[0][-1]
    expected_v = exact_filtered_distribution(logits_v, temperature, top_k if top_k > 0 else len(logits_v), top_p)
    assert np.sum(expected_v > 0) > 3  # a real choice
    params = SamplingParams(max_new_tokens=1, n=num, temperature=temperature, top_k=top_k, top_p=top_p, seed=11)
    samples = EmbeddedEngine(qwen3, eos_token_ids=()).generate([prompt], params)
    tokens = np.array([s.output_ids[0] for s in samples])
    counts_v = np.bincount(tokens, minlength=len(expected_v))
    assert counts_v[expected_v == 0].sum() == 0
    statistic, dof = chi_square_statistic(counts_v, num * expected_v)
    assert statistic < scipy.stats.chi2.ppf(0.999, df=dof)
    # Logprobs are those of the unfiltered tempered softmax.
    logp_v = jax.nn.log_softmax(logits_v / temperature)
    np.testing.assert_allclose([s.logprobs[0] for s in samples], logp_v[tokens], **LOGP_TOL)


def test_sampling_distribution_setups_bind():
    """The filtered case above keeps fewer tokens than top_k (top-p binds); the top-k-only case keeps top_k."""
    logits_v = np.log(np.array([0.3, 0.2, 0.1, 0.1, 0.05] + [0.25 / 100] * 100))
    assert np.sum(exact_filtered_distribution(logits_v, 1.0, 8, 0.5) > 0) == 3
    assert np.sum(exact_filtered_distribution(logits_v, 1.0, 40, 1.0) > 0) == 40


def test_inverse_cdf_sample_by_hand():
    weights = np.zeros((6, 300), np.float32)
    weights[:, [5, 130, 299]] = [1.0, 2.0, 1.0]  # three blocks of 128, the last one partial
    uniform = np.array([0.0, 0.2499, 0.25, 0.7499, 0.75, 1 - 2**-24], np.float32)
    sample = jax.jit(embedded.inverse_cdf_sample)
    np.testing.assert_array_equal(sample(jnp.asarray(weights), jnp.asarray(uniform)),
                                  [5, 5, 130, 130, 299, 299])
    one_token = np.zeros((2, 10), np.float32)
    one_token[:, 7] = 1e-30
    np.testing.assert_array_equal(sample(jnp.asarray(one_token), jnp.asarray([0.0, 0.9999])),
                                  [7, 7])


# ---------------------------------------------------------------- presence, frequency and repetition penalties


def numpy_penalized(logits_v: np.ndarray, counts_v: np.ndarray, presence: float, frequency: float,
                    repetition: float) -> np.ndarray:
    """SGLang's penalties token by token in float64 (`SamplingParams`): the additive ones, then CTRL's scaling,
    for the tokens generated at least once."""
    out = logits_v.astype(np.float64).copy()
    for v, count in enumerate(counts_v):
        if count > 0:
            z = out[v] - presence - frequency * count
            out[v] = z / repetition if z > 0 else z * repetition
    return out


def test_penalized_logits_by_hand():
    """A 4-token vocabulary, counts (2, 1, 0, 1), presence 0.5, frequency 0.25, repetition 1.5, temperature 0.5.
    The penalties come before the temperature, and turn the most likely token (0) into the second."""
    logits = np.array([[2.0, -1.0, 1.0, 0.0], [2.0, -1.0, 1.0, 0.0]], np.float32)
    counts = np.array([[2, 1, 0, 1], [0, 0, 0, 0]], np.int32)
    penalized = np.asarray(embedded.penalized_logits(jnp.asarray(logits), jnp.asarray(counts), 0.5, 0.25, 1.5))
    expected = [
        (2.0 - 0.5 - 0.25 * 2) / 1.5,   # seen twice, still positive: divided by the repetition penalty (= 2/3)
        (-1.0 - 0.5 - 0.25 * 1) * 1.5,  # negative: multiplied (= -2.625)
        1.0,                            # never generated: unchanged
        (0.0 - 0.5 - 0.25 * 1) * 1.5,   # 0 made negative by the additive penalties, then multiplied (= -1.125)
    ]
    np.testing.assert_allclose(penalized[0], expected, rtol=1e-6)
    np.testing.assert_array_equal(penalized[1], logits[1])  # a row that has generated nothing
    # The distribution sampled at temperature 0.5: exp(z / 0.5) normalised.
    weights = np.exp(np.array([2 / 3, -2.625, 1.0, -1.125]) / 0.5)
    expected_probs = weights / weights.sum()  # = (0.3283, 0.0005, 0.6396, 0.0317)
    np.testing.assert_allclose(jax.nn.softmax(penalized[0] / 0.5), expected_probs, rtol=1e-5)
    assert np.argmax(logits[0]) == 0 and np.argmax(penalized[0]) == 2


@pytest.mark.parametrize("seed", range(3))
def test_penalized_logits_equal_a_numpy_loop(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, (4, 50)).astype(np.float32)
    counts = rng.integers(0, 4, (4, 50)) * (rng.random((4, 50)) < 0.4)
    presence, frequency = rng.uniform(-2, 2, 2)
    repetition = rng.uniform(0.5, 2)
    got = np.asarray(embedded.penalized_logits(jnp.asarray(logits), jnp.asarray(counts, jnp.int32),
                                               np.float32(presence), np.float32(frequency), np.float32(repetition)))
    expected = np.stack([numpy_penalized(z, c, presence, frequency, repetition) for z, c in zip(logits, counts)])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


PENALTIES = dict(presence_penalty=0.4, frequency_penalty=0.3, repetition_penalty=1.4)


def penalized_reference(model: Decoder, prompt, output_ids, temperature: float, penalties: dict):
    """Per response token: (the penalised logits given the tokens before it, without a cache, from counts of the
    response's earlier tokens) and log_softmax(those / temperature) at the token."""
    logits_tv = reference(model, list(prompt) + list(output_ids))[0][len(prompt) - 1:-1]
    counts_v = np.zeros(logits_tv.shape[1], np.int64)
    rows, logps = [], []
    for logits_v, token in zip(logits_tv, output_ids):
        z = numpy_penalized(logits_v, counts_v, penalties["presence_penalty"], penalties["frequency_penalty"],
                            penalties["repetition_penalty"])
        rows.append(z)
        logps.append(jax.nn.log_softmax(z / temperature)[token])
        counts_v[token] += 1
    return np.array(rows), np.array(logps)


def test_greedy_with_penalties_equals_step_by_step_penalised_argmax(qwen3):
    samples = EmbeddedEngine(qwen3, eos_token_ids=()).generate(PROMPTS, greedy(**PENALTIES))
    for prompt, sample in zip(PROMPTS, samples):
        logits_tv, logps = penalized_reference(qwen3, prompt, sample.output_ids, 1.0, PENALTIES)
        assert list(sample.output_ids) == [int(np.argmax(z)) for z in logits_tv]
        np.testing.assert_allclose(sample.logprobs, logps, **LOGP_TOL)
    assert samples != EmbeddedEngine(qwen3, eos_token_ids=()).generate(PROMPTS, greedy())  # the penalties bite


def test_sampled_logprobs_with_penalties_are_the_penalised_softmax(qwen3):
    """Rollout logprobs under penalties are SGLang's: of the penalised, tempered distribution, not the learner's."""
    params = SamplingParams(max_new_tokens=NUM_NEW, n=2, temperature=0.7, top_p=0.8, seed=4, **PENALTIES)
    for sample in EmbeddedEngine(qwen3, eos_token_ids=()).generate(PROMPTS[:2], params):
        prompt = PROMPTS[sample.prompt_index]
        np.testing.assert_allclose(sample.logprobs, penalized_reference(qwen3, prompt, sample.output_ids, 0.7,
                                                                        PENALTIES)[1], **LOGP_TOL)


def test_a_large_presence_penalty_under_greedy_never_repeats_a_token(tiny_qwen3_dir):
    """A presence penalty larger than the spread of every step's logits puts each generated token below every
    token not yet generated. The fixture's logits spread over more than 2 (the tied model repeats the last token
    by a margin of ~4), so the final norm is scaled down further to bring the spread under SGLang's largest
    penalty, 2."""
    model = load_hf_checkpoint(tiny_qwen3_dir)
    model.norm.scale[...] = model.norm.scale[...] * FLAT_SCALE / 8
    engine = EmbeddedEngine(model, eos_token_ids=())
    plain = engine.generate(PROMPTS, greedy(max_new_tokens=16))
    assert all(len(set(s.output_ids)) < len(s.output_ids) for s in plain)  # greedy decoding repeats itself
    for prompt, sample in zip(PROMPTS, engine.generate(PROMPTS, greedy(max_new_tokens=16, presence_penalty=2.0))):
        logits_tv = reference(model, list(prompt) + list(sample.output_ids))[0][len(prompt) - 1:]
        assert np.max(logits_tv.max(-1) - logits_tv.min(-1)) < 2.0  # "large": above the spread
        assert len(set(sample.output_ids)) == len(sample.output_ids) == 16


def test_token_counts_are_allocated_only_with_penalties(qwen3):
    """The decode step traced without penalties holds no int32 [slots, V] array; with them, it does."""
    graphdef, state = nnx.split(qwen3)
    rows, vocab = 4, qwen3.config.vocab_size

    def traced(penalties):
        slots = embedded._empty_slots(qwen3.config, rows, 32, 16, qwen3.dtype, penalties is not None, 0)
        decode = functools.partial(embedded._decode_chunk, graphdef, num_steps=16, mode=embedded.SAMPLE,
                                   attended_slots=32)
        return str(jax.make_jaxpr(decode)(state, slots, np.full(8, -1, np.int32), np.float32(1.0), np.int32(-1),
                                          np.float32(1.0), penalties))

    counts = f"i32[{rows},{vocab}]"
    assert counts not in traced(None)
    assert counts in traced((np.float32(1.5), np.float32(0.0), np.float32(1.0)))


# ---------------------------------------------------------------- stop handling (SGLang's conventions)


def first_new_token(ids, start: int = 3) -> int:
    """The first index k >= start such that ids[k] does not occur in ids[:k]."""
    return next(k for k in range(start, len(ids)) if ids[k] not in ids[:k])


def test_stop_token_is_included_and_reported(llama):
    reference = EmbeddedEngine(llama, eos_token_ids=()).generate(PROMPTS, greedy())
    ids = list(reference[1].output_ids)
    k = first_new_token(ids)
    for engine, params in [
        (EmbeddedEngine(llama, eos_token_ids=()), greedy(stop_token_ids=(ids[k],))),
        (EmbeddedEngine(llama, eos_token_ids=(IM_END_ID, ids[k])), greedy()),  # the engine's EOS ids
    ]:
        sample = engine.generate(PROMPTS, params)[1]
        assert list(sample.output_ids) == ids[:k + 1]
        assert sample.logprobs == reference[1].logprobs[:k + 1]
        assert (sample.finish_reason, sample.matched_stop) == ("stop", ids[k])


def test_stop_token_as_the_last_allowed_token_reports_length(llama):
    """SGLang checks the length budget before stop tokens."""
    ids = list(EmbeddedEngine(llama, eos_token_ids=()).generate(PROMPTS, greedy())[1].output_ids)
    k = first_new_token(ids)
    sample = EmbeddedEngine(llama, eos_token_ids=()).generate(
        PROMPTS, greedy(max_new_tokens=k + 1, stop_token_ids=(ids[k],)))[1]
    assert list(sample.output_ids) == ids[:k + 1]
    assert (sample.finish_reason, sample.matched_stop) == ("length", None)


def decoded_prefix(tokenizer, ids) -> str:
    return tokenizer.decode(list(ids)).rstrip("\ufffd")


def reference_stop_cut(tokenizer, ids, stop):
    """The first k (a linear scan) whose decoded prefix contains a stop string, and the first such string."""
    for k in range(1, len(ids) + 1):
        text = decoded_prefix(tokenizer, ids[:k])
        for s in stop:
            if s in text:
                return k, s
    return None


def test_stop_strings_cut_after_the_completing_token(llama, tokenizer):
    engine = EmbeddedEngine(llama, tokenizer=tokenizer, eos_token_ids=())
    reference = engine.generate(PROMPTS, greedy())
    for i, ref in enumerate(reference):
        ids = list(ref.output_ids)
        # Two characters spanning a token boundary past the middle, after an absent string (list order decides).
        text = tokenizer.decode(ids)
        boundaries = [len(decoded_prefix(tokenizer, ids[:j])) for j in range(NUM_NEW // 2, NUM_NEW - 1)]
        middle = next(b for b in boundaries if 0 < b < len(text) and "\ufffd" not in text[b - 1:b + 1])
        stop = ("absent\x00string", text[middle - 1:middle + 1])
        expected_len, expected_stop = reference_stop_cut(tokenizer, ids[:-1], stop)
        assert expected_stop == stop[1] and 1 < expected_len < NUM_NEW
        sample = engine.generate(PROMPTS, greedy(stop=stop))[i]
        assert list(sample.output_ids) == ids[:expected_len]
        assert sample.logprobs == ref.logprobs[:expected_len]
        assert (sample.finish_reason, sample.matched_stop) == ("stop", stop[1])
        decoded = tokenizer.decode(ids[:expected_len], skip_special_tokens=True)
        assert sample.text == decoded[:decoded.find(stop[1])]


def test_stop_string_completed_by_the_last_allowed_token_reports_length(llama, tokenizer):
    engine = EmbeddedEngine(llama, tokenizer=tokenizer, eos_token_ids=())
    ids = list(engine.generate(PROMPTS, greedy())[1].output_ids)
    # A budget m whose last token's text is new to the output.
    m = next(m for m in range(2, NUM_NEW) if tokenizer.decode(ids[m - 1:m]).isprintable()
             and tokenizer.decode(ids[m - 1:m]) not in tokenizer.decode(ids[:m - 1]))
    last_text = tokenizer.decode(ids[m - 1:m])
    sample = engine.generate(PROMPTS, greedy(max_new_tokens=m, stop=(last_text,)))[1]
    assert list(sample.output_ids) == ids[:m]
    assert (sample.finish_reason, sample.matched_stop) == ("length", None)
    longer = engine.generate(PROMPTS, greedy(max_new_tokens=m + 1, stop=(last_text,)))[1]
    assert list(longer.output_ids) == ids[:m]
    assert (longer.finish_reason, longer.matched_stop) == ("stop", last_text)


@pytest.mark.parametrize("seed", range(20))
def test_first_stop_string_cut_equals_a_linear_scan(tokenizer, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, 320, rng.integers(1, 30)).tolist()
    text = tokenizer.decode(ids)
    start = rng.integers(0, max(len(text), 1))
    stop = ("qq", text[start:start + rng.integers(1, 4)] or "x")
    assert first_stop_string_cut(tokenizer, ids, stop) == reference_stop_cut(tokenizer, ids, stop)


def test_eos_stop_text_excludes_the_stop_token(llama, tokenizer):
    ids = list(EmbeddedEngine(llama, eos_token_ids=()).generate(PROMPTS, greedy())[2].output_ids)
    k = first_new_token(ids)
    sample = EmbeddedEngine(llama, tokenizer=tokenizer, eos_token_ids=(ids[k],)).generate(PROMPTS, greedy())[2]
    assert len(sample.output_ids) == k + 1
    assert sample.text == tokenizer.decode(ids[:k], skip_special_tokens=True)


# ---------------------------------------------------------------- batching, ordering, determinism


def test_n_samples_are_prompt_major(qwen3):
    engine = EmbeddedEngine(qwen3, eos_token_ids=())
    singles = engine.generate(PROMPTS[:2], greedy())
    samples = engine.generate(PROMPTS[:2], greedy(n=2))
    assert [s.prompt_index for s in samples] == [0, 0, 1, 1]
    assert [s.output_ids for s in samples] == [singles[0].output_ids] * 2 + [singles[1].output_ids] * 2


def test_mixed_prompt_lengths_equal_each_prompt_alone(qwen3):
    prompts = [PROMPTS[0], list(range(3, 23)), PROMPTS[1]]  # 3, 20 and 9 tokens: left padding to 32
    engine = EmbeddedEngine(qwen3, eos_token_ids=())
    batched = engine.generate(prompts, greedy())
    for prompt, sample in zip(prompts, batched):
        alone = engine.generate([prompt], greedy())[0]
        assert sample.output_ids == alone.output_ids
        np.testing.assert_allclose(sample.logprobs, alone.logprobs, **LOGP_TOL)


def test_sampling_is_deterministic_and_independent_of_batching(qwen3):
    params = SamplingParams(max_new_tokens=NUM_NEW, n=2, temperature=1.0, seed=5)
    whole = EmbeddedEngine(qwen3, eos_token_ids=()).generate(PROMPTS[:2], params)
    chunked = EmbeddedEngine(qwen3, eos_token_ids=(), decode_slots=2).generate(PROMPTS[:2], params)
    assert [s.output_ids for s in chunked] == [s.output_ids for s in whole]
    np.testing.assert_allclose([s.logprobs for s in chunked], [s.logprobs for s in whole], **LOGP_TOL)
    unseeded = dataclasses.replace(params, seed=None)
    engine, replay = EmbeddedEngine(qwen3, eos_token_ids=(), seed=1), EmbeddedEngine(qwen3, eos_token_ids=(), seed=1)
    first, second = engine.generate(PROMPTS[:2], unseeded), engine.generate(PROMPTS[:2], unseeded)
    assert first != second  # a new seed per call
    assert replay.generate(PROMPTS[:2], unseeded) == first  # the same sequence of calls per engine seed


def test_agenerate_equals_generate(qwen3):
    engine = EmbeddedEngine(qwen3, eos_token_ids=())
    assert asyncio.run(engine.agenerate(PROMPTS, greedy())) == engine.generate(PROMPTS, greedy())


# ---------------------------------------------------------------- weights, prompts, errors


def test_update_weights_changes_outputs_without_recompiling(qwen3, tiny_qwen3_dir, tiny_qwen3_untied_dir):
    engine = EmbeddedEngine(qwen3, eos_token_ids=())
    before = engine.generate(PROMPTS, greedy())
    jitted = (embedded._prefill_prompts, embedded._insert, embedded._decode_chunk)
    compiled = [f._cache_size() for f in jitted]
    graphdef, state = nnx.split(load_hf_checkpoint(tiny_qwen3_dir))
    perturbed = nnx.merge(graphdef, jax.tree.map(lambda x: x * 0.5, state))
    engine.update_weights(perturbed, "v1")
    after = engine.generate(PROMPTS, greedy())
    assert [f._cache_size() for f in jitted] == compiled
    assert engine.weight_version == "v1"
    assert {s.weight_version for s in after} == {"v1"} and {s.weight_version for s in before} == {"0"}
    assert [s.output_ids for s in after] != [s.output_ids for s in before]
    assert after == EmbeddedEngine(perturbed, eos_token_ids=(), weight_version="v1").generate(PROMPTS, greedy())
    with pytest.raises(ValueError, match="config"):
        engine.update_weights(load_hf_checkpoint(tiny_qwen3_untied_dir), "v2")


def test_chat_prompts_are_rendered_with_the_template(qwen3, tokenizer):
    messages = [{"role": "user", "content": "two?"}]
    engine = EmbeddedEngine(qwen3, tokenizer=tokenizer, eos_token_ids=())
    ids = apply_chat_template(tokenizer, messages)
    assert engine.generate([messages], greedy()) == engine.generate([ids], greedy())
    with pytest.raises(ValueError, match="tokenizer"):
        EmbeddedEngine(qwen3, eos_token_ids=()).generate([messages], greedy())


def test_budget_is_clipped_to_the_context_length(qwen3):
    config = dataclasses.replace(qwen3.config, max_position_embeddings=24)
    short = Decoder(config, rngs=nnx.Rngs(0))
    nnx.update(short, nnx.state(qwen3))
    engine = EmbeddedEngine(short, eos_token_ids=())
    prompt = list(range(3, 23))  # 20 tokens: room for 4
    sample = engine.generate([prompt], greedy())[0]
    reference = EmbeddedEngine(qwen3, eos_token_ids=()).generate([prompt], greedy(max_new_tokens=4))[0]
    assert sample.output_ids == reference.output_ids
    assert (sample.finish_reason, sample.matched_stop) == ("length", None)
    with pytest.raises(ValueError, match="prompt 1 has 24 tokens.*max_position_embeddings is 24"):
        engine.generate([prompt, list(range(3, 27))], greedy())


@pytest.mark.parametrize(
    "kwargs, prompts, params, match",
    [
        (dict(), [[5, 320]], greedy(), r"prompt 0 holds token ids outside \[0, 320\)"),
        (dict(), [[5, -1]], greedy(), "outside"),
        (dict(), [[5]], greedy(stop=("a",)), "stop strings need .* tokenizer"),
        (dict(), [[5]], greedy(stop_token_ids=(320,)), "stop_token_ids"),
        (dict(), ["hello"], greedy(), "non-empty sequence"),
        (dict(), [[]], greedy(), "non-empty sequence"),
    ],
)
def test_bad_calls_raise(qwen3, kwargs, prompts, params, match):
    with pytest.raises(ValueError, match=match):
        EmbeddedEngine(qwen3, eos_token_ids=(), **kwargs).generate(prompts, params)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(eos_token_ids=(320,)), "eos_token_ids"),
        (dict(eos_token_ids=(), pad_id=-1), "pad_id"),
        (dict(eos_token_ids=(), decode_slots=0), "decode_slots"),
    ],
)
def test_bad_engines_raise(qwen3, kwargs, match):
    with pytest.raises(ValueError, match=match):
        EmbeddedEngine(qwen3, **kwargs)


def test_bucket():
    assert [embedded.bucket(n) for n in (1, 16, 17, 33)] == [16, 16, 32, 64]
    assert [embedded.bucket(n, 1) for n in (1, 2, 3, 5)] == [1, 2, 4, 8]
