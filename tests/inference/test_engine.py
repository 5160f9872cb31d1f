"""The engine interface's data model: SamplingParams validation and its SGLang form, Sample invariants, prompt
rendering, stale-sample detection, and the learner's fixed-shape RolloutBatch."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.inference.engine import RolloutBatch, Sample, SamplingParams, prompt_token_ids, stale_samples
from rubric_jax.models.tokenizer import apply_chat_template, load_tokenizer


def sample(ids=(4, 5), prompt_index=0, finish_reason="stop", version="0") -> Sample:
    logprobs = tuple(-0.5 * (i + 1) for i in range(len(ids)))
    return Sample(prompt_index=prompt_index, output_ids=tuple(ids), logprobs=logprobs, finish_reason=finish_reason,
                  matched_stop=None, weight_version=version)


# ---------------------------------------------------------------- SamplingParams


def test_sampling_params_defaults_and_normalisation():
    params = SamplingParams(max_new_tokens=8, stop=["###", "\n\n"], stop_token_ids=[np.int64(7), 9])
    assert (params.n, params.temperature, params.top_p, params.top_k, params.seed) == (1, 1.0, 1.0, -1, None)
    assert params.stop == ("###", "\n\n")
    assert params.stop_token_ids == (7, 9) and all(type(i) is int for i in params.stop_token_ids)
    hash(params)  # frozen and hashable once lists became tuples


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=2.0), "max_new_tokens"),
        (dict(max_new_tokens=True), "max_new_tokens"),
        (dict(n=0), "n"),
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature="1"), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=-2), "top_k"),
        (dict(top_k=1.0), "top_k"),
        (dict(stop="###"), "stop"),
        (dict(stop=("",)), "stop"),
        (dict(stop=(3,)), "stop"),
        (dict(stop_token_ids=(-1,)), "stop_token_ids"),
        (dict(stop_token_ids=("2",)), "stop_token_ids"),
        (dict(stop_token_ids=(True,)), "stop_token_ids"),
        (dict(seed=1.5), "seed"),
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(presence_penalty=float("nan")), "presence_penalty"),
        (dict(frequency_penalty=-2.01), "frequency_penalty"),
        (dict(frequency_penalty=True), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(repetition_penalty=2.5), "repetition_penalty"),
        (dict(repetition_penalty="1.2"), "repetition_penalty"),
    ],
)
def test_sampling_params_reject_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field} "):
        SamplingParams(**{"max_new_tokens": 4, **kwargs})


def test_to_sglang():
    assert SamplingParams(max_new_tokens=16).to_sglang() == dict(
        max_new_tokens=16, n=1, temperature=1.0, top_p=1.0, top_k=-1)
    full = SamplingParams(max_new_tokens=3, n=4, temperature=0, top_p=0.9, top_k=20, stop=("a",),
                          stop_token_ids=(2,), seed=7)
    assert full.to_sglang() == dict(max_new_tokens=3, n=4, temperature=0.0, top_p=0.9, top_k=20, stop=["a"],
                                    stop_token_ids=[2], sampling_seed=7)
    # Penalties go only when they differ from SGLang's defaults; the range ends are SGLang's and accepted.
    edges = SamplingParams(max_new_tokens=1, presence_penalty=-2, frequency_penalty=2.0, repetition_penalty=2)
    assert edges.penalized and edges.to_sglang() == dict(
        max_new_tokens=1, n=1, temperature=1.0, top_p=1.0, top_k=-1, presence_penalty=-2.0,
        frequency_penalty=2.0, repetition_penalty=2.0)
    assert not SamplingParams(max_new_tokens=1, presence_penalty=0, repetition_penalty=1).penalized


# ---------------------------------------------------------------- Sample, prompts, staleness


def test_sample_invariants():
    with pytest.raises(ValueError, match="equal lengths"):
        Sample(prompt_index=0, output_ids=(1, 2), logprobs=(-1.0,), finish_reason="stop", matched_stop=2,
               weight_version="0")
    with pytest.raises(ValueError, match="finish_reason"):
        sample(finish_reason="eos")
    for reason in ("stop", "length", "abort"):
        assert sample(finish_reason=reason).finish_reason == reason


def test_prompt_token_ids(tiny_qwen3_dir):
    tokenizer = load_tokenizer(tiny_qwen3_dir)
    assert prompt_token_ids([3, np.int32(4)], None) == [3, 4]
    assert prompt_token_ids(np.array([5, 6]), None) == [5, 6]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "two plus two?"}]
    assert prompt_token_ids(messages, tokenizer) == apply_chat_template(tokenizer, messages)
    no_thinking = {"enable_thinking": False}
    rendered = prompt_token_ids(messages, tokenizer, no_thinking)
    assert rendered == apply_chat_template(tokenizer, messages, template_kwargs=no_thinking)
    assert rendered != prompt_token_ids(messages, tokenizer)
    with pytest.raises(ValueError, match="tokenizer"):
        prompt_token_ids(messages, None)
    for bad in ("text", [], [3, {"role": "user", "content": "x"}], [1.0], [True]):
        with pytest.raises(ValueError, match="prompt"):
            prompt_token_ids(bad, tokenizer)


def test_stale_samples():
    samples = [sample(version="v1"), sample(version="v2"), sample(version="v1"), sample(version="v3")]
    assert stale_samples(samples, "v1") == [1, 3]
    assert stale_samples(samples, "v9") == [0, 1, 2, 3]
    assert stale_samples([], "v1") == []


# ---------------------------------------------------------------- RolloutBatch


def test_rollout_batch_by_hand():
    samples = [sample((7, 8, 9), 0, "stop"), sample((), 0, "abort"), sample((3,), 1, "length")]
    batch = RolloutBatch.from_samples(samples, pad_id=0, max_len=4)
    np.testing.assert_array_equal(batch.output_ids_bt, [[7, 8, 9, 0], [0, 0, 0, 0], [3, 0, 0, 0]])
    np.testing.assert_array_equal(batch.response_mask_bt, [[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]])
    np.testing.assert_allclose(batch.logprobs_bt, [[-0.5, -1.0, -1.5, 0], [0, 0, 0, 0], [-0.5, 0, 0, 0]])
    np.testing.assert_array_equal(batch.finished_by_stop_b, [True, False, False])
    np.testing.assert_array_equal(batch.prompt_index_b, [0, 0, 1])
    assert (batch.output_ids_bt.dtype, batch.logprobs_bt.dtype, batch.response_mask_bt.dtype) == (
        np.int32, np.float32, bool)
    with pytest.raises(ValueError, match="sample 0 has 3 output tokens, more than max_len=2"):
        RolloutBatch.from_samples(samples, pad_id=0, max_len=2)


def test_rollout_batch_of_no_samples_has_fixed_shapes():
    batch = RolloutBatch.from_samples([], pad_id=0, max_len=5)
    assert batch.output_ids_bt.shape == batch.logprobs_bt.shape == batch.response_mask_bt.shape == (0, 5)
    assert batch.finished_by_stop_b.shape == batch.prompt_index_b.shape == (0,)
    assert batch.finished_by_stop_b.dtype == bool and batch.prompt_index_b.dtype == np.int32


@given(st.lists(st.tuples(st.lists(st.integers(0, 1000), max_size=6), st.integers(0, 9),
                          st.sampled_from(["stop", "length", "abort"])), max_size=6),
       st.integers(0, 3), st.integers(6, 9))
def test_rollout_batch_round_trips(rows, pad_id, max_len):
    samples = [sample(ids, p, reason) for ids, p, reason in rows]
    batch = RolloutBatch.from_samples(samples, pad_id=pad_id, max_len=max_len)
    assert batch.output_ids_bt.shape == (len(samples), max_len)
    for b, s in enumerate(samples):
        mask = batch.response_mask_bt[b]
        assert mask.sum() == len(s.output_ids) and mask[:len(s.output_ids)].all()
        assert tuple(batch.output_ids_bt[b][mask]) == s.output_ids
        np.testing.assert_array_equal(batch.logprobs_bt[b][mask], np.float32(s.logprobs))
        assert (batch.output_ids_bt[b][~mask] == pad_id).all() and (batch.logprobs_bt[b][~mask] == 0).all()
        assert batch.finished_by_stop_b[b] == (s.finish_reason == "stop")
        assert batch.prompt_index_b[b] == s.prompt_index
