"""The continuous-batching EmbeddedEngine against its static-batch reference (`embedded.StaticEngine`): for a
given seed, the same tokens and finish reasons, and logprobs to float tolerance, with more rows than slots, n > 1,
prompts of different lengths, budgets clipped to the context, stop ids and strings, and each sampling mode that
refills slots (greedy decoding, through the same code, is checked against references in test_embedded.py).

Every test here uses one model (test_embedded's flat Qwen3 fixture with a context of CONTEXT positions, so that
the 20-token prompt's budget is clipped to 10) and the same shape buckets, so that the file compiles little. A
stop-id set of every STOP_EVERY-th token ends rows after a few tokens (a geometric length law): slots finish at
different steps and are refilled.
"""

import asyncio
import dataclasses
import functools

import numpy as np
import pytest
from flax import nnx

from rubric_jax.inference import embedded
from rubric_jax.inference.embedded import EmbeddedEngine, StaticEngine
from rubric_jax.inference.engine import SamplingParams
from rubric_jax.models import ragged_decode
from rubric_jax.models.decoder import Decoder
from rubric_jax.models.tokenizer import load_tokenizer
from tests.inference.test_embedded import LOGP_TOL, PENALTIES, PROMPTS, _flat_model

CONTEXT = 30
STOP_EVERY = 6
MANY_STOPS = tuple(range(2, 320, STOP_EVERY))
MIXED_PROMPTS = [*PROMPTS, list(range(3, 23))]  # 3, 9, 6 and 20 tokens
N = 3
SLOTS = 2
SAMPLED = SamplingParams(max_new_tokens=16, n=N, temperature=1.0, seed=7, stop_token_ids=MANY_STOPS)


@functools.cache
def _short_model(directory: str) -> Decoder:
    flat = _flat_model(directory)
    short = Decoder(dataclasses.replace(flat.config, max_position_embeddings=CONTEXT), rngs=nnx.Rngs(0))
    nnx.update(short, nnx.state(flat))
    return short


@pytest.fixture
def model(tiny_qwen3_dir) -> Decoder:
    return _short_model(str(tiny_qwen3_dir))


def engines(model, **kwargs) -> tuple[EmbeddedEngine, StaticEngine]:
    return EmbeddedEngine(model, decode_slots=SLOTS, **kwargs), StaticEngine(model, **kwargs)


def assert_same_samples(continuous, static):
    assert [(s.prompt_index, s.output_ids, s.finish_reason, s.matched_stop, s.text) for s in continuous] == [
        (s.prompt_index, s.output_ids, s.finish_reason, s.matched_stop, s.text) for s in static]
    for got, expected in zip(continuous, static):
        np.testing.assert_allclose(got.logprobs, expected.logprobs, **LOGP_TOL)


@pytest.mark.parametrize("params", [
    SAMPLED,
    dataclasses.replace(SAMPLED, temperature=0.8, top_k=30, top_p=0.9, **PENALTIES),
])
def test_continuous_samples_equal_the_static_reference(model, params):
    continuous, static = (engine.generate(MIXED_PROMPTS, params) for engine in engines(model, eos_token_ids=()))
    assert_same_samples(continuous, static)
    assert len({len(s.output_ids) for s in continuous}) > 2  # slots finish at different steps
    assert {s.finish_reason for s in continuous} == {"stop", "length"}
    assert [len(s.output_ids) for s in continuous[-N:]] <= [CONTEXT - 20] * N  # the clipped budget


def test_stop_strings_and_eos_ids_equal_the_static_reference(model, tiny_qwen3_dir):
    tokenizer = load_tokenizer(tiny_qwen3_dir)
    continuous_engine, static_engine = engines(model, tokenizer=tokenizer, eos_token_ids=MANY_STOPS)
    params = dataclasses.replace(SAMPLED, stop_token_ids=())
    # A stop string: two characters from the middle of the longest sample's text.
    text = max((s.text for s in static_engine.generate(MIXED_PROMPTS, params)), key=len)
    params = dataclasses.replace(params, stop=(text[len(text) // 2:][:2],))
    continuous = continuous_engine.generate(MIXED_PROMPTS, params)
    assert_same_samples(continuous, static_engine.generate(MIXED_PROMPTS, params))
    assert {int, str} <= {type(s.matched_stop) for s in continuous}


def test_each_distinct_prompt_is_prefilled_once(model, monkeypatch):
    """Shared prefill: 4 prompts x 3 samples in 2 slots prefill 4 prompts, not 12 rows; `generate_rows` shares the
    prefill of equal prompts wherever they are in the rows."""
    prefilled = []
    prefill = embedded._prefill_prompts

    def counting(graphdef, state, tokens_gp, mask_gp):
        prefilled.extend(tuple(row[mask]) for row, mask in zip(np.asarray(tokens_gp), np.asarray(mask_gp))
                         if mask.any())
        return prefill(graphdef, state, tokens_gp, mask_gp)

    monkeypatch.setattr(embedded, "_prefill_prompts", counting)
    continuous_engine, static_engine = engines(model, eos_token_ids=())
    continuous_engine.generate(MIXED_PROMPTS, SAMPLED)
    assert prefilled == [tuple(p) for p in MIXED_PROMPTS]
    prefilled.clear()
    rows = [(MIXED_PROMPTS[i % 4], 100 + i) for i in range(N * 4)]  # each prompt's rows 4 apart
    samples = continuous_engine.generate_rows(rows, SAMPLED)
    assert prefilled == [tuple(p) for p in MIXED_PROMPTS]
    assert_same_samples(samples, static_engine.generate_rows(rows, SAMPLED))


def test_stream_groups_yields_each_group_as_generate_samples_it(model):
    engine = EmbeddedEngine(model, eos_token_ids=(), decode_slots=SLOTS)

    async def stream():
        return [item async for item in engine.stream_groups(MIXED_PROMPTS, SAMPLED)]

    groups = asyncio.run(stream())
    expected = engine.generate(MIXED_PROMPTS, SAMPLED)
    assert sorted(index for index, _ in groups) == [0, 1, 2, 3]
    for index, samples in groups:
        assert samples == expected[N * index:N * (index + 1)]


def test_stream_groups_raises_the_calls_errors(model):
    async def stream():
        return [item async for item in EmbeddedEngine(model, eos_token_ids=()).stream_groups(
            [[5]], SamplingParams(max_new_tokens=4, stop_token_ids=(320,)))]

    with pytest.raises(ValueError, match="stop_token_ids"):
        asyncio.run(stream())


@pytest.fixture
def windows(monkeypatch) -> list[int]:
    """The attention window of every decode chunk run while the test runs."""
    attended = []
    chunk = embedded._decode_chunk

    def recording(*args, attended_slots, **kwargs):
        attended.append(attended_slots)
        return chunk(*args, attended_slots=attended_slots, **kwargs)

    monkeypatch.setattr(embedded, "_decode_chunk", recording)
    return attended


def test_chunks_attend_to_windows_of_the_cache_in_use(tiny_qwen3_dir, monkeypatch, windows):
    """With windows of 16 slots (MIN_WINDOW lowered from its 128), rows of up to 64 tokens are decoded in chunks
    that attend to growing windows of the cache, not the whole of it, and the samples are the static reference's,
    which attends to every slot."""
    monkeypatch.setattr(embedded, "MIN_WINDOW", 16)
    model = _flat_model(str(tiny_qwen3_dir))
    params = dataclasses.replace(SAMPLED, max_new_tokens=64, n=2, stop_token_ids=MANY_STOPS[::4])
    continuous = EmbeddedEngine(model, decode_slots=SLOTS, eos_token_ids=()).generate(MIXED_PROMPTS, params)
    assert_same_samples(continuous, StaticEngine(model, eos_token_ids=()).generate(MIXED_PROMPTS, params))
    capacity = 32 + 64  # the 20-token prompt's width bucket and the budget's
    assert max(len(s.output_ids) for s in continuous) > 32
    assert min(windows) == 64 and max(windows) == capacity and len(set(windows)) == 3


def test_the_ragged_decode_kernel_samples_as_the_xla_path(tiny_qwen3_dir, monkeypatch, windows):
    """A model that decodes by the ragged Pallas kernel (`attention="splash"`, interpret mode here) in the
    continuous engine, blocks of 16 slots: prompts of 3 to 111 tokens, all in a 128-wide bucket (splash's
    prefill needs a multiple of its block), start mid-block; the samples are the static XLA reference's, and
    chunks take no window."""
    monkeypatch.setattr(ragged_decode, "BLOCK_SLOTS", 16)
    xla = _flat_model(str(tiny_qwen3_dir))
    splash = Decoder(xla.config, rngs=nnx.Rngs(0), attention="splash")
    nnx.update(splash, nnx.state(xla))
    prompts = [*MIXED_PROMPTS, list(range(50, 161))]
    params = dataclasses.replace(SAMPLED, max_new_tokens=16, n=2)
    continuous = EmbeddedEngine(splash, decode_slots=SLOTS, eos_token_ids=()).generate(prompts, params)
    assert_same_samples(continuous, StaticEngine(xla, eos_token_ids=()).generate(prompts, params))
    assert len({len(s.output_ids) for s in continuous}) > 1
    assert set(windows) == {128 + 16}  # the whole cache: the kernel bounds each row's reads itself


def test_a_window_is_a_multiple_of_its_block_and_never_past_the_cache():
    assert embedded.attention_window(49, 96) == 96  # a block of MIN_WINDOW = 128, cut at the capacity
    assert embedded.attention_window(130, 4096) == 256
    assert embedded.attention_window(2064, 4096) == 2304  # blocks of 4096 / 16
    assert embedded.attention_window(4096, 4096) == 4096
    assert embedded.attention_window(1, 8192) == 512
