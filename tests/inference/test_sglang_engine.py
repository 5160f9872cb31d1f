"""The SGLang engine: the /generate wire format (hand-written bodies in REFERENCE.md section 3's shapes, and
fuzzed ones), round trips through the stand-in server against the embedded engine's own output, faults,
weight sync and stale rollouts, the launcher; and an opt-in run of the same checks against a real SGLang server
(marker `sglang_server`)."""

import asyncio
import copy
import dataclasses
import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from rubric_jax.algorithms.rar import RaR, RaRConfig
from rubric_jax.inference.engine import RolloutEngine, Sample, SamplingParams, sample_seeds, stale_samples
from rubric_jax.inference.http import MalformedResponse, RequestFailed, RetryPolicy
from rubric_jax.inference.sglang import (
    WEIGHT_LOAD_BASE_S,
    SGLangEngine,
    generate_payload,
    launch_sglang_server,
    parse_generate_response,
    parse_model_info,
    parse_weights_update,
    sglang_launch_command,
    weight_load_timeout_s,
)
from rubric_jax.models.safetensors_io import hf_name_table, load_hf_checkpoint
from rubric_jax.models.tokenizer import apply_chat_template, load_tokenizer
from tests.inference import standin_server
from tests.inference.standin_server import (StandinServer, drop_connection, embedded_engine, http_error, malformed,
                                            nan_stop, null_logprob, sample_abort, slow, spanned_versions)
from tests.inference.test_standin_server import call, wait_for
from tests.inference.test_standin_server import generate as raw_generate

embedded_standin_module = standin_server.embedded_standin_module  # the fixtures this module uses
embedded_standin = standin_server.embedded_standin

FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.001, max_backoff_s=0.002, timeout_s=30.0)
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
GREEDY = SamplingParams(max_new_tokens=8, n=2, temperature=0.0)
SGLANG_INSTALLED = importlib.util.find_spec("sglang") is not None


def sglang_sample(output_ids, logprobs, finish_reason, version="v0", text="", completion_tokens=None):
    """One sample object as SGLang 0.5.23 answers it."""
    return {
        "text": text,
        "output_ids": list(output_ids),
        "meta_info": {
            "id": "rid",
            "finish_reason": finish_reason,
            "prompt_tokens": 3,
            "weight_version": version,
            "completion_tokens": len(output_ids) if completion_tokens is None else completion_tokens,
            "cached_tokens": 0,
            "output_token_logprobs": [[lp, i, None] for lp, i in zip(logprobs, output_ids)],
        },
    }


# One prompt's four samples: EOS included on stop, a stop string, a length finish, an abort before any token.
BODY = [
    sglang_sample([11, 12, 2], [-0.5, -1.25, -0.125], {"type": "stop", "matched": 2}, text="ab"),
    sglang_sample([13, 14], [-2.0, -0.0], {"type": "stop", "matched": "###"}, text="c"),
    sglang_sample([15, 16, 17, 18], [-1.0, -1.0, -3.5, -0.75], {"type": "length", "length": 4}),
    {"text": "", "output_ids": [], "meta_info": {"id": "rid", "weight_version": "v0", "completion_tokens": 0,
                                                  "finish_reason": {"type": "abort", "message": "aborted"}}},
]
BODY_PARAMS = SamplingParams(max_new_tokens=4, n=2)


def body_with(index, edit):
    """BODY with `edit(sample)` applied to a deep copy of sample `index`."""
    body = copy.deepcopy(BODY)
    edit(body[index])
    return body


# ------------------------------------------------------------------------------------------- wire format


def test_generate_payload_is_one_prompt_with_a_seed_per_sample():
    params = SamplingParams(max_new_tokens=16, n=3, temperature=0.7, top_p=0.9, top_k=20, stop=("###",),
                            stop_token_ids=(7,), seed=3)
    payload = generate_payload([1, 2], params, [11, 12, 13], extra_stop_token_ids=(2, 7), cache_key="v3")
    one = {"max_new_tokens": 16, "n": 1, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "stop": ["###"],
           "stop_token_ids": [7, 2]}
    assert payload == {
        "input_ids": [[1, 2]] * 3,
        "sampling_params": [{**one, "sampling_seed": 11}, {**one, "sampling_seed": 12}, {**one, "sampling_seed": 13}],
        "return_logprob": True,
        "logprob_start_len": -1,
        "extra_key": "v3",
    }
    plain = generate_payload([1], SamplingParams(max_new_tokens=2), [5])
    assert "extra_key" not in plain and "stop_token_ids" not in plain["sampling_params"][0]
    penalized = generate_payload([1], SamplingParams(max_new_tokens=2, presence_penalty=1.5,
                                                     repetition_penalty=1.1), [5])
    assert penalized["sampling_params"] == [{"max_new_tokens": 2, "n": 1, "temperature": 1.0, "top_p": 1.0,
                                             "top_k": -1, "presence_penalty": 1.5, "repetition_penalty": 1.1,
                                             "sampling_seed": 5}]


def test_sample_seeds_are_distinct_and_a_function_of_the_call_seed():
    seeds = sample_seeds(7, 64)
    assert len(set(seeds)) == 64 and all(0 <= seed < 2**31 for seed in seeds)
    assert sample_seeds(7, 64) == seeds and sample_seeds(7, 3) == seeds[:3] and sample_seeds(8, 3) != seeds[:3]


def test_parse_generate_response_hand_written():
    samples = parse_generate_response(BODY, prompt_index=4, num_samples=4, params=BODY_PARAMS)
    assert samples == [
        Sample(4, (11, 12, 2), (-0.5, -1.25, -0.125), "stop", 2, "v0", "ab"),
        Sample(4, (13, 14), (-2.0, -0.0), "stop", "###", "v0", "c"),
        Sample(4, (15, 16, 17, 18), (-1.0, -1.0, -3.5, -0.75), "length", None, "v0", ""),
        Sample(4, (), (), "abort", None, "v0", "", failure="abort"),
    ]


def test_corrupted_samples_are_read_as_sglang_means_them():
    """A NaN stop is a failed sample; a null logprob is -inf; weight_versions spans give the versions in order."""
    nan_stop = body_with(0, _set(("meta_info", "finish_reason"), {"type": "stop", "matched": "NaN happened"}))
    sample = parse_generate_response(nan_stop, 0, 4, BODY_PARAMS)[0]
    assert (sample.finish_reason, sample.failure, sample.matched_stop) == ("abort", "nan", None)
    null = body_with(1, _set(("meta_info", "output_token_logprobs", 0), [None, 13, None]))
    assert parse_generate_response(null, 0, 4, BODY_PARAMS)[1].logprobs == (-math.inf, -0.0)
    spans = [{"version": "v0", "start": 0, "end": 1}, {"version": "v1", "start": 1, "end": 3}]
    spanned = parse_generate_response(body_with(0, _set(("meta_info", "weight_versions"), spans)), 0, 4, BODY_PARAMS)
    assert spanned[0].weight_versions == ("v0", "v1") and spanned[0].versions == ("v0", "v1")
    assert spanned[1].versions == ("v0",)  # no spans: its weight_version
    assert stale_samples(spanned, "v0") == [0] and stale_samples(spanned, "v1") == [0, 1, 2, 3]


def _set(path, value):
    def edit(sample):
        target = sample
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


def _delete(path):
    def edit(sample):
        target = sample
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return edit


@pytest.mark.parametrize("body, why", [
    ({"text": "a"}, "an object instead of a list"),
    (body_with(0, _set(("meta_info", "weight_versions"), {"version": "v0"})), "spans an object"),
    (body_with(0, _set(("meta_info", "weight_versions"), [{"version": "v0", "start": 0, "end": 9}])), "past the end"),
    (body_with(0, _set(("meta_info", "weight_versions"), [{"version": 0, "start": 0, "end": 1}])), "a numeric version"),
    (BODY[:3], "one sample missing"),
    (BODY + BODY[:2], "too many samples"),
    (body_with(0, _set(("output_ids",), [11, 12, True])), "a bool token id"),
    (body_with(0, _set(("output_ids",), [11, -12, 2])), "a negative token id"),
    (body_with(0, _set(("output_ids",), "11 12 2")), "output_ids a string"),
    (body_with(2, _set(("output_ids",), [15, 16, 17, 18, 19])), "more than max_new_tokens"),
    (body_with(0, _delete(("meta_info",))), "no meta_info"),
    (body_with(0, _delete(("meta_info", "weight_version"))), "no weight_version"),
    (body_with(0, _set(("meta_info", "weight_version"), 3)), "a numeric weight_version"),
    (body_with(0, _set(("meta_info", "completion_tokens"), 2)), "completion_tokens disagrees"),
    (body_with(0, _set(("meta_info", "finish_reason"), "stop")), "finish_reason a string"),
    (body_with(0, _set(("meta_info", "finish_reason"), {"type": "eos"})), "unknown finish type"),
    (body_with(0, _set(("meta_info", "finish_reason"), {"type": "stop", "matched": 12})), "matched not last"),
    (body_with(0, _set(("meta_info", "finish_reason"), {"type": "stop", "matched": [2]})), "matched a list"),
    (body_with(2, _set(("meta_info", "finish_reason"), {"type": "length"})), "length without length"),
    (body_with(0, _delete(("meta_info", "output_token_logprobs"))), "no logprobs"),
    (body_with(0, _set(("meta_info", "output_token_logprobs", 1), [-1.25, 99, None])), "logprob for another id"),
    (body_with(0, _set(("meta_info", "output_token_logprobs", 1), [-1.25])), "entry without id"),
    (body_with(0, _set(("meta_info", "output_token_logprobs", 1), [0.5, 12, None])), "positive logprob"),
    (body_with(0, _set(("meta_info", "output_token_logprobs", 1), [math.nan, 12, None])), "NaN logprob"),
    (body_with(0, _set(("meta_info", "output_token_logprobs", 1), ["-1", 12, None])), "logprob a string"),
    (body_with(0, _set(("meta_info", "output_token_logprobs"), [[-0.5, 11, None]])), "too few logprobs"),
    (body_with(0, _set(("text",), ["ab"])), "text a list"),
])
def test_malformed_generate_bodies_are_rejected(body, why):
    with pytest.raises(MalformedResponse):
        parse_generate_response(body, prompt_index=0, num_samples=4, params=BODY_PARAMS)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 40) | st.integers() | st.floats() | st.text(max_size=4),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)


def _paths(value, prefix=()):
    """Every path into a JSON value (keys and list indices)."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, prefix + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, prefix + (index,))


@settings(max_examples=400)
@given(data=st.data())
def test_fuzzed_generate_bodies_parse_or_raise_malformed(data):
    body = copy.deepcopy(BODY)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(list(_paths(body))))
        replacement = data.draw(JSON)
        if not path:
            body = replacement
            continue
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = replacement
    try:
        samples = parse_generate_response(body, prompt_index=0, num_samples=4, params=BODY_PARAMS)
    except MalformedResponse:
        return
    assert len(samples) == 4
    for sample in samples:
        assert len(sample.output_ids) == len(sample.logprobs) <= BODY_PARAMS.max_new_tokens
        assert all(math.isfinite(lp) or lp == -math.inf for lp in sample.logprobs)
        assert (sample.finish_reason == "abort") == bool(sample.failure)


def test_parse_weights_update_and_model_info():
    assert parse_weights_update({"success": True, "message": "ok", "num_paused_requests": 0}) == "ok"
    assert parse_weights_update({"success": True, "message": "ok"}) == "ok"  # older servers
    with pytest.raises(RuntimeError, match="disk full"):
        parse_weights_update({"success": False, "message": "disk full"})
    for body in ({"success": "yes", "message": "ok"}, {"success": True}, [], None):
        with pytest.raises(MalformedResponse):
            parse_weights_update(body)
    assert parse_model_info({"model_path": "m", "weight_version": "default"}) == "default"
    with pytest.raises(MalformedResponse):
        parse_model_info({"model_path": "m"})


# ------------------------------------------------------------------------------------ through the stand-in


def make_engine(server, tmp_path=None, **kwargs):
    kwargs.setdefault("retry", FAST)
    return SGLangEngine(server.base_url, tokenizer=server.tokenizer, weight_dir=tmp_path, **kwargs)


def unspanned(samples):
    """`samples` without their weight_versions spans (the embedded engine reports none), for comparisons."""
    return [dataclasses.replace(s, weight_versions=()) for s in samples]


def assert_same_samples(remote, local):
    """The server's samples are the embedded engine's: every field equal, logprobs to float tolerance (the server
    samples each prompt in a batch of its own, and XLA's reductions may round differently per batch shape)."""
    def fields(sample):
        return (sample.prompt_index, sample.output_ids, sample.finish_reason, sample.matched_stop,
                sample.weight_version, sample.text, sample.failure)

    assert [fields(s) for s in remote] == [fields(s) for s in local]
    assert all(s.weight_versions in ((), (s.weight_version,)) for s in remote)
    for r, s in zip(remote, local):
        np.testing.assert_allclose(r.logprobs, s.logprobs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("params", [
    GREEDY,
    SamplingParams(max_new_tokens=8, n=2, temperature=1.0, top_k=20, seed=5),
    SamplingParams(max_new_tokens=8, n=1, temperature=0.0, stop=("!",)),
    SamplingParams(max_new_tokens=8, n=2, temperature=0.7, top_p=0.8, presence_penalty=1.5, seed=2),
    SamplingParams(max_new_tokens=8, n=1, temperature=0.0, frequency_penalty=0.5, repetition_penalty=1.3),
])
def test_round_trip_equals_the_embedded_engine(embedded_standin, params):
    """On a server with deterministic inference, every sample is the embedded engine's for the same seed."""
    with make_engine(embedded_standin) as engine:
        assert engine.weight_version == "0"  # read from /model_info
        remote = engine.generate(PROMPTS, params)
    local = embedded_standin.engine.generate(PROMPTS, params)
    assert_same_samples(remote, local)  # ids, logprobs, finish reasons, versions, text
    assert {s.weight_versions for s in remote} == {("0",)}
    assert [s.prompt_index for s in remote] == [p for p in range(len(PROMPTS)) for _ in range(params.n)]
    assert embedded_standin.requests["/generate"] == len(PROMPTS)  # one request per prompt


def test_a_groups_samples_differ_on_a_deterministic_server_and_repeat_with_the_seed(embedded_standin):
    """SGLang with --enable-deterministic-inference gives the n samples of one seed the same tokens (the batched
    request the engine no longer sends); the engine's per-sample seeds give a group distinct samples, and the same
    ones again for the same seed."""
    params = SamplingParams(max_new_tokens=8, n=4, temperature=5.0, seed=3)  # the tiny model is nearly greedy at 1
    status, shared = raw_generate(embedded_standin, [PROMPTS[0]], params.to_sglang())  # n = 4, one seed
    assert status == 200 and len({tuple(s["output_ids"]) for s in shared}) == 1  # the server's behaviour
    with make_engine(embedded_standin) as engine:
        first = engine.generate(PROMPTS, params)
        again = engine.generate(PROMPTS, params)
        other = engine.generate(PROMPTS, dataclasses.replace(params, seed=4))
    for p in range(len(PROMPTS)):
        assert len({s.output_ids for s in first[4 * p:4 * p + 4]}) == 4
    assert first == again and [s.output_ids for s in other] != [s.output_ids for s in first]


def test_a_rar_step_through_a_deterministic_server_has_groups_that_differ():
    """The issue this engine's seeds fix: through a server with deterministic inference, a GRPO-style step (RaR's
    group-normalised rubric rewards) sees distinct responses in every group, so its advantages are not all 0."""
    from tests.algorithms.test_grpo import PROMPTS as NUM_PROMPTS, GROUP, make_context, tiny_policy  # noqa: PLC0415
    from tests.algorithms.test_rubric_grounded import ScriptedJudge  # noqa: PLC0415
    from tests.training.toy_task import toy_task  # noqa: PLC0415

    task = toy_task()
    examples = task.train_stream(0).next_batch(NUM_PROMPTS)
    model, tokenizer = tiny_policy(task)
    context = make_context(task, model, tokenizer, ScriptedJudge())
    with StandinServer(context.engine, tokenizer=tokenizer, deterministic_inference=True) as server, \
            SGLangEngine(server.base_url, tokenizer=tokenizer, retry=FAST,
                         eos_token_ids=context.engine.eos_token_ids) as engine:
        experience = RaR(RaRConfig()).experience(examples, dataclasses.replace(context, engine=engine), step=0)
    tokens_bt = experience.batch["tokens_bt"]
    for start in range(0, len(tokens_bt), GROUP):
        assert len({row.tobytes() for row in tokens_bt[start:start + GROUP]}) > 1  # no group is one response
    assert np.abs(experience.batch["advantages_bt"]).max() > 0
    assert server.requests["/generate"] == NUM_PROMPTS


def test_stop_token_is_included_like_sglang(embedded_standin):
    with make_engine(embedded_standin) as engine:
        free = engine.generate(PROMPTS, GREEDY)
        stop_id = free[0].output_ids[2]
        stopped = engine.generate(PROMPTS, dataclasses.replace(GREEDY, stop_token_ids=(stop_id,)))
    first = free[0].output_ids.index(stop_id)
    assert stopped[0].output_ids == free[0].output_ids[:first + 1]  # the stop token is the last one kept
    assert (stopped[0].finish_reason, stopped[0].matched_stop) == ("stop", stop_id)
    assert stopped[0].logprobs == free[0].logprobs[:first + 1]
    assert_same_samples(stopped, embedded_standin.engine.generate(
        PROMPTS, dataclasses.replace(GREEDY, stop_token_ids=(stop_id,))))


def test_requests_are_bounded_by_max_in_flight(embedded_standin):
    prompts = PROMPTS + [[15, 16], [17, 18, 19]]
    embedded_standin.latency_s = 0.05  # answers overlap
    with make_engine(embedded_standin, max_in_flight=2) as engine:
        remote = engine.generate(prompts, GREEDY)
    assert embedded_standin.requests["/generate"] == len(prompts)
    assert embedded_standin.max_concurrent == 2
    assert [s.prompt_index for s in remote] == [p for p in range(len(prompts)) for _ in range(GREEDY.n)]


def test_chat_prompts_are_rendered_by_the_tokenizer(embedded_standin):
    messages = [{"role": "user", "content": "what is two plus two?"}]
    ids = apply_chat_template(embedded_standin.tokenizer, messages)
    with make_engine(embedded_standin) as engine:
        assert engine.generate([messages], GREEDY) == engine.generate([ids], GREEDY)
    with SGLangEngine(embedded_standin.base_url, retry=FAST) as bare:
        with pytest.raises(ValueError, match="tokenizer"):
            bare.generate([messages], GREEDY)


def test_stream_groups_yields_each_prompts_group_as_its_request_completes(embedded_standin):
    """One prompt's request held 5 s by the server: the other groups arrive while it is still in flight (within 3 s),
    each equal to `generate`'s samples of its prompt; leaving the stream then cancels the held request."""
    expected = embedded_standin.engine.generate(PROMPTS, GREEDY)
    embedded_standin.inject(slow(5.0, "/generate"))

    async def first_groups(engine, count):
        stream = engine.stream_groups(PROMPTS, GREEDY)
        groups = [await stream.__anext__() for _ in range(count)]
        await stream.aclose()
        return groups

    with make_engine(embedded_standin) as engine:
        groups = engine.client.run_sync(asyncio.wait_for(first_groups(engine, len(PROMPTS) - 1), timeout=3.0))
    assert len({index for index, _ in groups}) == len(PROMPTS) - 1
    for index, samples in groups:
        assert_same_samples(samples, expected[index * GREEDY.n:(index + 1) * GREEDY.n])


def test_the_default_stream_yields_agenerates_groups_in_prompt_order(embedded_standin):
    """An engine without its own stream (the base class's) yields `agenerate`'s samples, one group per prompt."""
    engine = embedded_standin.engine

    async def groups():
        return [group async for group in RolloutEngine.stream_groups(engine, PROMPTS, GREEDY)]

    streamed = asyncio.run(groups())
    assert [index for index, _ in streamed] == list(range(len(PROMPTS)))
    assert_same_samples([s for _, samples in streamed for s in samples], engine.generate(PROMPTS, GREEDY))


def test_empty_call_sends_nothing(embedded_standin):
    with make_engine(embedded_standin) as engine:
        assert engine.generate([], GREEDY) == []
    assert embedded_standin.requests["/generate"] == 0


def test_engine_survives_faults_on_generate(embedded_standin):
    expected = embedded_standin.engine.generate(PROMPTS[:2], GREEDY)
    embedded_standin.inject(
        http_error(500, "/generate"),
        malformed(b"[]", "/generate"),  # JSON, but not the promised samples
        drop_connection("/generate"),
    )
    with make_engine(embedded_standin, retry=dataclasses.replace(FAST, max_attempts=4)) as engine:
        assert_same_samples(engine.generate(PROMPTS[:2], GREEDY), expected)
        assert engine.client.stats.errors_by_reason == {"http_500": 1, "malformed": 1, "connection": 1}
        assert engine.client.stats.retries == 3


def test_engine_times_out_a_slow_server_and_retries(embedded_standin):
    expected = embedded_standin.engine.generate(PROMPTS[:1], GREEDY)
    embedded_standin.inject(slow(3.0, "/generate"))
    policy = RetryPolicy(max_attempts=2, initial_backoff_s=0.001, max_backoff_s=0.001, timeout_s=1.0)
    with make_engine(embedded_standin, retry=policy) as engine:
        assert_same_samples(engine.generate(PROMPTS[:1], GREEDY), expected)
        assert engine.client.stats.errors_by_reason == {"timeout": 1}


def test_a_prompt_whose_request_fails_for_good_gets_failed_samples(embedded_standin):
    embedded_standin.inject(*[http_error(503, "/generate")] * 3)
    with make_engine(embedded_standin) as engine:
        samples = engine.generate(PROMPTS[:1], GREEDY)
        assert (engine.client.stats.failures, engine.client.stats.errors_by_reason) == (1, {"http_503": 3})
    assert [(s.prompt_index, s.finish_reason, s.failure, s.output_ids) for s in samples] == [
        (0, "abort", "http_503", ())] * GREEDY.n
    assert embedded_standin.requests["/generate"] == 3


def test_one_over_long_prompt_fails_only_itself(embedded_standin):
    """SGLang answers a prompt past the context length with a 400 for its whole request: one request per prompt
    keeps the other prompts' samples."""
    too_long = [5] * embedded_standin.context_length
    prompts = [PROMPTS[0], too_long, PROMPTS[1]]
    with make_engine(embedded_standin) as engine:
        samples = engine.generate(prompts, GREEDY)
    failed = [s for s in samples if s.failure]
    assert [(s.prompt_index, s.failure) for s in failed] == [(1, "http_400")] * GREEDY.n
    kept = [s for s in samples if not s.failure]
    expected = embedded_standin.engine.generate([PROMPTS[0], PROMPTS[1]], GREEDY)
    assert [s.output_ids for s in kept] == [s.output_ids for s in expected]
    assert [s.prompt_index for s in kept] == [0, 0, 2, 2]


def test_corrupted_samples_from_the_server_are_failed_or_minus_inf(embedded_standin):
    """A NaN stop and an aborted sample come back failed ("nan", "abort"); a null logprob is -inf."""
    with make_engine(embedded_standin) as engine:
        clean = engine.generate(PROMPTS[:1], GREEDY)
        embedded_standin.inject(nan_stop())
        nan = engine.generate(PROMPTS[:1], GREEDY)
        embedded_standin.inject(sample_abort())
        aborted = engine.generate(PROMPTS[:1], GREEDY)
        embedded_standin.inject(null_logprob())
        null = engine.generate(PROMPTS[:1], GREEDY)
    assert (nan[0].finish_reason, nan[0].failure) == ("abort", "nan") and nan[1] == clean[1]
    assert (aborted[0].finish_reason, aborted[0].failure) == ("abort", "abort") and aborted[1] == clean[1]
    assert null[0].logprobs[0] == -math.inf and null[0].logprobs[1:] == clean[0].logprobs[1:]
    assert not null[0].failure


def test_constructor_waits_for_health(embedded_standin):
    embedded_standin.inject(http_error(503, "/health"), http_error(500, "/health"))
    with make_engine(embedded_standin) as engine:
        assert engine.weight_version == "0"
    assert embedded_standin.requests["/health"] == 3
    embedded_standin.inject(*[http_error(503, "/health")] * 1000)
    with pytest.raises(TimeoutError, match="http_503"):
        make_engine(embedded_standin, health_timeout_s=0.3)


def negated_embeddings(model_dir):
    """The tiny model with its (tied) embedding negated: other logits, the same shapes."""
    model = load_hf_checkpoint(model_dir)
    model.embed_tokens.embedding.set_value(-model.embed_tokens.embedding.get_value())
    return model


def served_path(server) -> str:
    """The model path /v1/models names (SGLang's: the last loaded directory)."""
    status, body = call(server, "/v1/models", method="GET")
    assert status == 200
    return body["data"][0]["id"]


def test_weight_sync_pauses_loads_and_continues(embedded_standin, tmp_path):
    new_model = negated_embeddings(embedded_standin.model_path)
    with make_engine(embedded_standin, tmp_path) as engine:
        before = engine.generate(PROMPTS, GREEDY)
        engine.update_weights(new_model, "step-1")
        assert engine.weight_version == embedded_standin.engine.weight_version == "step-1"
        assert (tmp_path / "step-1" / "config.json").is_file()
        assert served_path(embedded_standin) == str((tmp_path / "step-1").resolve())
        after = engine.generate(PROMPTS, GREEDY)
        assert {s.weight_version for s in before} == {"0"} and {s.weight_version for s in after} == {"step-1"}
        assert [s.output_ids for s in after] != [s.output_ids for s in before]
        assert_same_samples(after, embedded_standin.engine.generate(PROMPTS, GREEDY))  # served: the new weights
        engine.update_weights(new_model, "step-2")
        # The directory the server serves stays; the older ones go.
        assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2"]
        assert served_path(embedded_standin) == str((tmp_path / "step-2").resolve())
    assert embedded_standin.pauses == ["retract", "retract"] and embedded_standin.continues == 2
    assert [(u["weight_version"], u["paused"], u["flush_cache"]) for u in embedded_standin.updates] == [
        ("step-1", True, False), ("step-2", True, False)]


def test_a_load_slower_than_its_timeout_is_sent_once_and_confirmed(embedded_standin, tmp_path):
    """The answer to a load does not come within its timeout: the engine never sends it again (that would queue a
    second load) but asks /model_info until the server serves the version."""
    embedded_standin.load_delay_s = 2.5  # past the post's timeout, within the wait for the version (2 s more)
    with make_engine(embedded_standin, tmp_path, weight_load_timeout_s=2.0) as engine:
        engine.update_weights(negated_embeddings(embedded_standin.model_path), "step-1")
        assert engine.weight_version == "step-1"
        assert engine.client.stats.errors_by_reason == {"timeout": 1}
    assert [u["weight_version"] for u in embedded_standin.updates] == ["step-1"]
    assert embedded_standin.continues == 1 and not embedded_standin.paused


def test_a_load_that_is_never_confirmed_fails_and_keeps_its_directory(embedded_standin, tmp_path):
    embedded_standin.load_delay_s = 2.0
    model = negated_embeddings(embedded_standin.model_path)
    with make_engine(embedded_standin, tmp_path, weight_load_timeout_s=0.3) as engine:
        with pytest.raises(RuntimeError, match="did not confirm weight version step-1"):
            engine.update_weights(model, "step-1")
        assert engine.weight_version == "0" and (tmp_path / "step-1" / "config.json").is_file()
        assert not embedded_standin.paused  # generation continued
        wait_for(lambda: embedded_standin.engine.weight_version == "step-1")  # the server's load went on
        embedded_standin.load_delay_s = 0.0
        engine.update_weights(model, "step-2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2"]


def test_weight_sync_of_a_qwen2_model_carries_its_biases_under_hf_names(tiny_qwen2_dir, tmp_path):
    """What SGLang's Qwen2 loader reads (`/update_weights_from_disk`): q/k/v biases as `...{q,k,v}_proj.bias`, no
    o_proj bias, a config.json transformers reads as Qwen2; the stand-in then serves the new biases."""
    new_model = load_hf_checkpoint(tiny_qwen2_dir)
    for layer in new_model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            proj.bias.set_value(-proj.bias.get_value())
    engine = embedded_engine(tiny_qwen2_dir)
    with StandinServer(engine, tokenizer=engine.tokenizer, model_path=str(tiny_qwen2_dir)) as server:
        with make_engine(server, tmp_path) as client:
            before = client.generate(PROMPTS, GREEDY)
            client.update_weights(new_model, "step-1")
            after = client.generate(PROMPTS, GREEDY)
    written = load_hf_checkpoint(tmp_path / "step-1")
    biases = [name for name in hf_name_table(written.config) if name.endswith(".bias")]
    assert biases == [f"model.layers.{i}.self_attn.{p}_proj.bias" for i in range(2) for p in "qkv"]
    np.testing.assert_array_equal(np.asarray(written.layers[1].self_attn.v_proj.bias.get_value()),
                                  np.asarray(new_model.layers[1].self_attn.v_proj.bias.get_value()))
    assert type(transformers.AutoConfig.from_pretrained(tmp_path / "step-1")) is transformers.Qwen2Config
    assert [s.output_ids for s in after] != [s.output_ids for s in before]
    assert_same_samples(after, engine.generate(PROMPTS, GREEDY))  # served by the synced weights


def test_a_sample_sent_after_an_update_it_did_not_use_is_stale(embedded_standin, tmp_path, monkeypatch):
    """A request running while the weights change: the server stamps its answer with the new version (it is the
    version when the output is sent), but its weight_versions name the old one, so it is stale."""
    new_model = negated_embeddings(embedded_standin.model_path)
    computed = threading.Event()
    generate_rows = embedded_standin.engine.generate_rows

    def generate_rows_and_signal(*args, **kwargs):
        samples = generate_rows(*args, **kwargs)
        computed.set()
        return samples

    monkeypatch.setattr(embedded_standin.engine, "generate_rows", generate_rows_and_signal)
    embedded_standin.latency_s = 4.0  # the answer waits after generation: the update lands meanwhile
    with make_engine(embedded_standin, tmp_path) as engine:

        async def update_while_generating():
            rollout = asyncio.ensure_future(engine.agenerate(PROMPTS[:1], GREEDY))
            await asyncio.to_thread(computed.wait, 60)
            await asyncio.sleep(0.2)  # the request is in its latency wait
            embedded_standin.latency_s = 0.0  # for the pause, the load and the continue
            await asyncio.to_thread(engine.update_weights, new_model, "1")
            return await rollout

        samples = asyncio.run(update_while_generating())
        assert engine.weight_version == "1"
        assert [(s.weight_version, s.versions) for s in samples] == [("1", ("0",))] * GREEDY.n
        assert stale_samples(samples, engine.weight_version) == list(range(GREEDY.n))
        fresh = engine.generate(PROMPTS[:1], GREEDY)
        assert stale_samples(fresh, engine.weight_version) == []
    assert [u["paused"] for u in embedded_standin.updates] == [True]  # it did not wait for the request


def test_a_spanned_sample_is_stale(embedded_standin):
    embedded_standin.inject(spanned_versions("old"))
    with make_engine(embedded_standin) as engine:
        samples = engine.generate(PROMPTS[:1], GREEDY)
    assert samples[0].versions == ("old", "0") and samples[0].weight_version == "0"
    assert stale_samples(samples, "0") == [0]


def test_bad_weight_path_is_a_400_not_retried(embedded_standin, tmp_path):
    with make_engine(embedded_standin) as engine:
        payload = {"model_path": str(tmp_path / "missing"), "weight_version": "x", "flush_cache": False}
        with pytest.raises(RequestFailed) as failure:
            engine.client.run_sync(engine.client.post_json("/update_weights_from_disk", payload, parse_weights_update))
        assert (failure.value.reason, failure.value.attempts) == ("http_400", 1)
        assert '"success": false' in failure.value.detail
        assert engine.weight_version == embedded_standin.engine.weight_version == "0"


def test_a_refused_load_deletes_its_directory_and_keeps_the_version(embedded_standin, tmp_path, monkeypatch):
    def refuse(model_path, version):
        raise ValueError("disk full")

    monkeypatch.setattr(embedded_standin, "_load_weights", refuse)
    with make_engine(embedded_standin, tmp_path) as engine:
        with pytest.raises(RuntimeError, match="did not load version step-1.*disk full"):
            engine.update_weights(negated_embeddings(embedded_standin.model_path), "step-1")
        assert engine.weight_version == "0" and not (tmp_path / "step-1").exists()
    assert embedded_standin.continues == 1 and not embedded_standin.paused


def test_update_weights_rejects_bad_arguments(embedded_standin, tmp_path):
    model = load_hf_checkpoint(embedded_standin.model_path)
    with make_engine(embedded_standin) as engine:
        with pytest.raises(ValueError, match="weight_dir"):
            engine.update_weights(model, "1")
    with make_engine(embedded_standin, tmp_path) as engine:
        for version in ("", "..", "a/b", 3):
            with pytest.raises(ValueError, match="version"):
                engine.update_weights(model, version)
    assert embedded_standin.requests["/update_weights_from_disk"] == 0


@pytest.mark.parametrize("kwargs, field", [(dict(pause_mode="sleep"), "pause_mode"),
                                           (dict(weight_load_timeout_s=0), "weight_load_timeout_s"),
                                           (dict(eos_token_ids=(-1,)), "eos_token_ids")])
def test_engine_rejects_bad_arguments(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SGLangEngine("http://127.0.0.1:1", health_timeout_s=None, **kwargs)


def test_weight_load_timeout_grows_with_the_checkpoint():
    assert weight_load_timeout_s(0) == WEIGHT_LOAD_BASE_S
    eight_b_bf16 = 16 * 10**9
    assert weight_load_timeout_s(eight_b_bf16) == pytest.approx(WEIGHT_LOAD_BASE_S + eight_b_bf16 / (100 * 2**20))


def test_the_requests_benchmark_prints_both_shapes_and_their_ratio_as_json():
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, str(root / "experiments" / "benchmarks" / "sglang_requests_benchmark.py"), "--prompts", "4",
         "--group-size", "2", "--latency", "0", "--repeats", "1"], cwd=root, capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.splitlines()[-1])
    assert figures["prompts"] == 4 and figures["batched_s"] > 0 and figures["per_prompt_s"] > 0
    assert figures["throughput_ratio"] == pytest.approx(figures["batched_s"] / figures["per_prompt_s"])


# ----------------------------------------------------------------------------------------------- launcher


def test_launch_command():
    assert sglang_launch_command("/models/qwen", python="python3") == [
        "python3", "-m", "sglang.launch_server", "--model-path", "/models/qwen", "--host", "127.0.0.1",
        "--port", "30000", "--tp-size", "1"]
    command = sglang_launch_command("/m", host="0.0.0.0", port=8000, tp=4, extra_args=("--dtype", "bfloat16"))
    assert command[0] == sys.executable and command[-6:] == ["--port", "8000", "--tp-size", "4", "--dtype", "bfloat16"]
    for kwargs, field in [(dict(port=0), "port"), (dict(port=70000), "port"), (dict(tp=0), "tp"),
                          (dict(host=""), "host"), (dict(extra_args="--dtype bf16"), "extra_args")]:
        with pytest.raises(ValueError, match=field):
            sglang_launch_command("/m", **kwargs)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.skipif(SGLANG_INSTALLED, reason="checks the failure path where sglang is missing")
def test_launcher_reports_a_server_that_exits(tmp_path):
    with pytest.raises(RuntimeError, match="exited with code 1") as failure:
        launch_sglang_server(tmp_path, port=free_port(), health_timeout_s=60, log_path=tmp_path / "server.log")
    assert "sglang" in str(failure.value)  # the log's tail: No module named sglang


# -------------------------------------------------------------------------------------- real SGLang server


@pytest.fixture(scope="module")
def real_server():
    """A real SGLang server: RUBRIC_JAX_SGLANG_URL (already running; RUBRIC_JAX_SGLANG_MODEL_DIR names the model
    it serves, for the weight-sync check), or one launched on RUBRIC_JAX_SGLANG_MODEL_DIR."""
    url, model_dir = os.environ.get("RUBRIC_JAX_SGLANG_URL"), os.environ.get("RUBRIC_JAX_SGLANG_MODEL_DIR")
    if not SGLANG_INSTALLED or not (url or model_dir):
        pytest.skip("needs sglang and RUBRIC_JAX_SGLANG_URL or RUBRIC_JAX_SGLANG_MODEL_DIR")
    if url:
        yield url, model_dir
        return
    with launch_sglang_server(model_dir, port=free_port(), extra_args=("--mem-fraction-static", "0.5")) as server:
        yield server.base_url, model_dir


@pytest.mark.sglang_server
def test_real_server_shapes_and_stops(real_server):
    url, model_dir = real_server
    tokenizer = load_tokenizer(model_dir) if model_dir else None
    eos = () if tokenizer is None else (tokenizer.eos_token_id,)
    with SGLangEngine(url, tokenizer=tokenizer, eos_token_ids=eos) as engine:
        params = SamplingParams(max_new_tokens=32, n=3, temperature=1.0)
        samples = engine.generate(PROMPTS, params)  # every body passed parse_generate_response's checks
        assert [s.prompt_index for s in samples] == [p for p in range(len(PROMPTS)) for _ in range(3)]
        assert all(len({s.output_ids for s in samples[3 * p:3 * p + 3]}) > 1 for p in range(len(PROMPTS)))
        assert {s.weight_version for s in samples} == {engine.weight_version}
        greedy = dataclasses.replace(GREEDY, max_new_tokens=16)
        first = engine.generate(PROMPTS, greedy)
        stop_id = first[0].output_ids[1]
        stopped = engine.generate(PROMPTS[:1], dataclasses.replace(greedy, n=1, stop_token_ids=(stop_id,)))
        assert stopped[0].output_ids[-1] == stop_id and stopped[0].finish_reason == "stop"


@pytest.mark.sglang_server
def test_real_server_weight_sync(real_server, tmp_path):
    url, model_dir = real_server
    if not model_dir:
        pytest.skip("needs RUBRIC_JAX_SGLANG_MODEL_DIR (the served model) to write new weights")
    with SGLangEngine(url, weight_dir=tmp_path) as engine:
        old = engine.weight_version
        engine.update_weights(load_hf_checkpoint(model_dir), "rubric-jax-sync-test")
        assert engine.weight_version == "rubric-jax-sync-test" != old
        samples = engine.generate(PROMPTS[:1], GREEDY)
        assert stale_samples(samples, engine.weight_version) == []
