"""The SGLang stand-in itself, over raw HTTP: that it behaves as its module docstring says SGLang 0.5.23 does
(seeds, batched sampling params, context length, weight_versions, updates waiting for running generations,
pause and continue, /v1/models) and that each fault builder shapes its answer as documented."""

import concurrent.futures
import json
import shutil
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Optional

import pytest

from rubric_jax.inference.engine import SamplingParams
from rubric_jax.models.tokenizer import load_tokenizer
from tests.inference import standin_server
from tests.inference.standin_server import (
    ScriptedPolicy,
    StandinServer,
    nan_stop,
    null_logprob,
    sample_abort,
    spanned_versions,
    status_abort,
)
from tests.tiny_checkpoints import IM_END_ID

embedded_standin_module = standin_server.embedded_standin_module  # the fixtures this module uses
embedded_standin = standin_server.embedded_standin

PROMPT, OTHER_PROMPT = [5, 6, 7], [8, 9]
SAMPLED = {"max_new_tokens": 12, "temperature": 5.0}  # hot enough for the tiny model's samples to differ
GREEDY = {"max_new_tokens": 8, "temperature": 0.0}
WAIT_S = 60.0  # the longest any request here may take


def call(server: StandinServer, path: str, body: Optional[dict[str, Any]] = None, method: str = "POST"
         ) -> tuple[int, Any]:
    """(HTTP status, decoded JSON body) of one request; a POST without `body` sends an empty body."""
    data = None if method == "GET" else json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(server.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def generate(server: StandinServer, input_ids, sampling_params, **extra) -> tuple[int, Any]:
    return call(server, "/generate", {"input_ids": input_ids, "sampling_params": sampling_params,
                                      "return_logprob": True, **extra})


def wait_for(condition, timeout_s: float = WAIT_S) -> None:
    """Polls `condition` until it holds; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def update_body(model_path, version: str) -> dict[str, Any]:
    return {"model_path": str(model_path), "weight_version": version, "flush_cache": True}


def logprobs(sample: dict[str, Any]) -> list[float]:
    return [entry[0] for entry in sample["meta_info"]["output_token_logprobs"]]


@pytest.fixture
def pool():
    """Threads to keep requests in flight while a test sends others."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as executor:
        yield executor


# ------------------------------------------------------------------------------------------------ seeds


def test_seeds_are_ignored_without_deterministic_inference(embedded_standin, monkeypatch):
    monkeypatch.setattr(embedded_standin, "deterministic_inference", False)
    first = generate(embedded_standin, [PROMPT], dict(SAMPLED, n=3, sampling_seed=1))[1]
    again = generate(embedded_standin, [PROMPT], dict(SAMPLED, n=3, sampling_seed=1))[1]
    assert [s["output_ids"] for s in first] != [s["output_ids"] for s in again]  # the same seed, new samples
    assert len({tuple(s["output_ids"]) for s in first}) == 3  # each sample its own fresh seed
    embedded_standin.reset()  # re-seeds the stand-in's own seeds: the run repeats whatever seed is sent
    other_seed = generate(embedded_standin, [PROMPT], dict(SAMPLED, n=3, sampling_seed=2))[1]
    assert [s["output_ids"] for s in other_seed] == [s["output_ids"] for s in first]


def test_deterministic_inference_honours_an_entrys_seed_for_all_its_samples(embedded_standin):
    status, samples = generate(embedded_standin, [PROMPT], dict(SAMPLED, n=3, sampling_seed=7))
    assert status == 200 and len(samples) == 3
    assert samples[1] == dict(samples[0], meta_info=dict(samples[0]["meta_info"], id=samples[1]["meta_info"]["id"]))
    assert samples[2]["output_ids"] == samples[0]["output_ids"]
    local = embedded_standin.engine.generate_rows([(PROMPT, 7)] * 3, SamplingParams(**SAMPLED))[0]  # the same rows
    assert (tuple(samples[0]["output_ids"]), tuple(logprobs(samples[0]))) == (local.output_ids, local.logprobs)
    unseeded = generate(embedded_standin, PROMPT, SAMPLED)[1]
    assert tuple(unseeded["output_ids"]) == embedded_standin.engine.generate_rows(
        [(PROMPT, 42)], SamplingParams(**SAMPLED))[0].output_ids  # SGLang's default seed


def test_entries_with_different_seeds_in_one_batch_differ(embedded_standin):
    status, samples = generate(embedded_standin, [PROMPT, PROMPT],
                               [dict(SAMPLED, sampling_seed=1), dict(SAMPLED, sampling_seed=2)])
    assert status == 200 and samples[0]["output_ids"] != samples[1]["output_ids"]


def test_list_sampling_params_run_as_one_engine_call_per_shared_params(embedded_standin, monkeypatch):
    engine = embedded_standin.engine
    calls = []
    generate_rows = engine.generate_rows
    monkeypatch.setattr(engine, "generate_rows", lambda rows, params: calls.append(len(rows)) or generate_rows(
        rows, params))
    seeds = [11, 12, 13]
    status, samples = generate(embedded_standin, [PROMPT, PROMPT, OTHER_PROMPT],
                               [dict(SAMPLED, n=1, sampling_seed=s) for s in seeds])
    assert status == 200 and calls == [3]
    local = generate_rows([(PROMPT, 11), (PROMPT, 12), (OTHER_PROMPT, 13)], SamplingParams(**SAMPLED))
    assert [tuple(s["output_ids"]) for s in samples] == [s.output_ids for s in local]
    assert [s["meta_info"]["prompt_tokens"] for s in samples] == [3, 3, 2]

    calls.clear()  # params differing beyond the seed: one call each, the answer still prompt-major
    mixed = [dict(SAMPLED, n=2, sampling_seed=1), dict(GREEDY, n=1), dict(SAMPLED, n=1, sampling_seed=3)]
    samples = generate(embedded_standin, [PROMPT, OTHER_PROMPT, PROMPT], mixed)[1]
    assert calls == [3, 1]
    assert [s["meta_info"]["prompt_tokens"] for s in samples] == [3, 3, 2, 3]
    sampled = generate_rows([(PROMPT, 1), (PROMPT, 1), (PROMPT, 3)], SamplingParams(**SAMPLED))
    greedy = generate_rows([(OTHER_PROMPT, 42)], SamplingParams(**GREEDY))
    assert [tuple(s["output_ids"]) for s in samples] == [sampled[0].output_ids, sampled[1].output_ids,
                                                         greedy[0].output_ids, sampled[2].output_ids]

    assert generate(embedded_standin, [PROMPT, OTHER_PROMPT], [SAMPLED])[0] == 400  # one object per prompt


def test_a_single_prompt_with_one_sample_is_answered_as_one_object(embedded_standin):
    assert isinstance(generate(embedded_standin, PROMPT, dict(GREEDY, n=1))[1], dict)
    assert len(generate(embedded_standin, PROMPT, dict(GREEDY, n=2))[1]) == 2
    assert len(generate(embedded_standin, [PROMPT], dict(GREEDY, n=1))[1]) == 1  # a batch of one


def test_scripted_policy_gets_a_repeated_prompt_as_one_prompt_with_n_samples(tiny_qwen3_dir):
    tokenizer = load_tokenizer(tiny_qwen3_dir)
    policy = ScriptedPolicy(tokenizer, lambda prompt, j: f"sample {j}", IM_END_ID)
    with StandinServer(policy, tokenizer=tokenizer) as server:
        prompt = tokenizer.encode("question", add_special_tokens=False)
        status, samples = generate(server, [prompt, prompt], [dict(max_new_tokens=32, sampling_seed=1),
                                                              dict(max_new_tokens=32, sampling_seed=2)])
    assert status == 200 and [s["text"] for s in samples] == ["sample 0", "sample 1"]
    assert policy.prompts == ["question"]


# ------------------------------------------------------------------------------------ context, versions


def test_an_over_long_prompt_fails_the_whole_batch(embedded_standin, monkeypatch):
    status, body = generate(embedded_standin, [PROMPT, [5] * 512], GREEDY)
    assert status == 400
    assert body == {"error": {"message": "The input (512 tokens) is longer than the model's context length "
                                         "(512 tokens)."}}
    monkeypatch.setattr(embedded_standin, "context_length", 8)
    assert generate(embedded_standin, [[5] * 8], GREEDY)[0] == 400
    assert generate(embedded_standin, [[5] * 7], GREEDY)[0] == 200
    assert embedded_standin.generations_started == 1


def test_every_sample_carries_its_weight_versions(embedded_standin):
    samples = generate(embedded_standin, [PROMPT, OTHER_PROMPT], dict(GREEDY, n=2))[1]
    for sample in samples:
        assert sample["meta_info"]["weight_version"] == "0"
        assert sample["meta_info"]["weight_versions"] == [{"version": "0", "start": 0,
                                                           "end": len(sample["output_ids"])}]


# ----------------------------------------------------------------------------------- updates and pauses


def test_an_update_waits_for_running_generations_and_new_ones_wait_behind_it(embedded_standin, pool):
    embedded_standin.latency_s = 1.0  # each /generate stays running for a second after generating
    embedded_standin.load_delay_s = 0.5
    running = pool.submit(generate, embedded_standin, [PROMPT], GREEDY)
    wait_for(lambda: embedded_standin.generations_started == 1)
    update = pool.submit(call, embedded_standin, "/update_weights_from_disk",
                         update_body(embedded_standin.model_path, "1"))
    wait_for(lambda: embedded_standin.updates)
    behind = pool.submit(generate, embedded_standin, [PROMPT], GREEDY)
    status, answer = update.result(WAIT_S)
    assert (status, answer["success"]) == (200, True)  # flush_cache is no reason to refuse: it waited
    assert running.done()  # answered before the update loaded
    assert embedded_standin.updates == [dict(update_body(embedded_standin.model_path, "1"),
                                             waited_for_generation=True, paused=False)]
    assert running.result()[1][0]["meta_info"]["weight_version"] == "0"
    after = behind.result(WAIT_S)[1][0]["meta_info"]
    assert after["weight_version"] == "1" and after["weight_versions"][0]["version"] == "1"


def test_an_update_on_an_idle_server_does_not_wait(embedded_standin):
    assert call(embedded_standin, "/update_weights_from_disk", update_body(embedded_standin.model_path, "1"))[0] == 200
    assert embedded_standin.updates[0]["waited_for_generation"] is False
    assert embedded_standin.engine.weight_version == "1"


def test_pause_holds_new_generations_until_continue(embedded_standin, pool):
    assert call(embedded_standin, "/pause_generation") == (200, {"success": True})  # no body: mode "abort"
    held = pool.submit(generate, embedded_standin, [PROMPT], GREEDY)
    time.sleep(0.3)
    assert not held.done() and embedded_standin.generations_started == 0
    assert call(embedded_standin, "/continue_generation", {}) == (200, {"success": True})
    assert held.result(WAIT_S)[0] == 200
    assert (embedded_standin.pauses, embedded_standin.continues) == (["abort"], 1)
    assert call(embedded_standin, "/pause_generation", {"mode": "drain"})[0] == 400
    assert embedded_standin.pauses == ["abort"] and not embedded_standin.paused


def test_an_update_while_paused_loads_at_once(embedded_standin, pool, monkeypatch):
    engine, computed = embedded_standin.engine, threading.Event()
    generate_rows = engine.generate_rows
    monkeypatch.setattr(engine, "generate_rows", lambda rows, params: (generate_rows(rows, params), computed.set())[0])
    embedded_standin.latency_s = 3.0
    running = pool.submit(generate, embedded_standin, [PROMPT], GREEDY)
    computed.wait(WAIT_S)
    time.sleep(0.2)  # the running request now waits out its latency
    embedded_standin.latency_s = 0.0  # the requests below are answered at once
    assert call(embedded_standin, "/pause_generation", {"mode": "in_place"})[0] == 200
    held = pool.submit(generate, embedded_standin, [OTHER_PROMPT], GREEDY)
    assert call(embedded_standin, "/update_weights_from_disk",
                update_body(embedded_standin.model_path, "1"))[0] == 200
    assert not running.done()  # loaded while it still ran
    assert embedded_standin.updates[0] | {"model_path": None} == {
        "model_path": None, "weight_version": "1", "flush_cache": True, "waited_for_generation": False,
        "paused": True}
    assert not held.done() and embedded_standin.generations_started == 1  # still paused
    meta_info = running.result(WAIT_S)[1][0]["meta_info"]
    # Generated before the load, answered after it.
    assert (meta_info["weight_version"], meta_info["weight_versions"][0]["version"]) == ("1", "0")
    call(embedded_standin, "/continue_generation")
    assert held.result(WAIT_S)[1][0]["meta_info"]["weight_version"] == "1"


def test_v1_models_and_model_info_follow_the_loaded_path(embedded_standin, tmp_path):
    original = embedded_standin.model_path
    status, listing = call(embedded_standin, "/v1/models", method="GET")
    assert status == 200 and listing["object"] == "list"
    (entry,) = listing["data"]
    assert entry | {"created": 0} == {"id": original, "object": "model", "created": 0, "owned_by": "sglang",
                                      "root": original, "max_model_len": 512}
    assert isinstance(entry["created"], int)
    copy = shutil.copytree(original, tmp_path / "step-1")
    assert call(embedded_standin, "/update_weights_from_disk", update_body(copy, "1"))[0] == 200
    assert call(embedded_standin, "/update_weights_from_disk", update_body(tmp_path / "missing", "2"))[0] == 400
    entry = call(embedded_standin, "/v1/models", method="GET")[1]["data"][0]
    assert (entry["id"], entry["root"]) == (str(copy), str(copy))
    info = call(embedded_standin, "/model_info", method="GET")[1]
    assert (info["model_path"], info["tokenizer_path"], info["weight_version"]) == (str(copy), original, "1")


# ----------------------------------------------------------------------------------------------- faults


@pytest.fixture
def clean_pair(embedded_standin):
    """The fault-free greedy answer (two samples of PROMPT) the fault tests compare with."""
    samples = generate(embedded_standin, [PROMPT], dict(GREEDY, n=2))[1]
    assert all(len(s["output_ids"]) >= 2 for s in samples)
    return samples


def strip_ids(samples):
    """The samples without their random request ids."""
    return [dict(s, meta_info={k: v for k, v in s["meta_info"].items() if k != "id"}) for s in samples]


def faulted(server, fault):
    server.inject(fault)
    status, samples = generate(server, [PROMPT], dict(GREEDY, n=2))
    assert status == 200 and server.faults_served == [("/generate", fault.kind)] and server.pending_faults == 0
    return samples


def test_nan_stop_cuts_the_first_sample_and_ends_it_on_eos(embedded_standin, clean_pair):
    samples = faulted(embedded_standin, nan_stop())
    clean = clean_pair[0]
    kept = max(1, len(clean["output_ids"]) // 2)
    first = samples[0]
    assert first["output_ids"] == clean["output_ids"][:kept - 1] + [IM_END_ID]
    assert first["meta_info"]["finish_reason"] == {"type": "stop", "matched": "NaN happened"}
    assert first["meta_info"]["output_token_logprobs"] == [
        [lp, i, None] for lp, i in zip(logprobs(clean)[:kept], first["output_ids"])]
    assert first["meta_info"]["completion_tokens"] == kept
    assert first["meta_info"]["weight_versions"] == [{"version": "0", "start": 0, "end": kept}]
    assert strip_ids(samples[1:]) == strip_ids(clean_pair[1:])  # only the first sample


def test_null_logprob_sends_the_first_logprob_as_null(embedded_standin, clean_pair):
    first = faulted(embedded_standin, null_logprob())[0]
    assert logprobs(first) == [None] + logprobs(clean_pair[0])[1:]
    assert first["output_ids"] == clean_pair[0]["output_ids"]


def test_sample_abort_cuts_the_first_sample_with_its_message(embedded_standin, clean_pair):
    first = faulted(embedded_standin, sample_abort("evicted"))[0]
    kept = len(clean_pair[0]["output_ids"]) // 2
    assert first["meta_info"]["finish_reason"] == {"type": "abort", "message": "evicted"}
    assert first["output_ids"] == clean_pair[0]["output_ids"][:kept]
    assert logprobs(first) == logprobs(clean_pair[0])[:kept] and first["meta_info"]["completion_tokens"] == kept


def test_spanned_versions_splits_the_first_samples_versions(embedded_standin, clean_pair):
    samples = faulted(embedded_standin, spanned_versions("old"))
    length = len(samples[0]["output_ids"])
    assert samples[0]["meta_info"]["weight_versions"] == [{"version": "old", "start": 0, "end": length // 2},
                                                          {"version": "0", "start": length // 2, "end": length}]
    assert samples[0]["meta_info"]["weight_version"] == "0"
    assert samples[1]["meta_info"]["weight_versions"] == [{"version": "0", "start": 0,
                                                           "end": len(samples[1]["output_ids"])}]


def test_status_abort_fails_the_whole_request_with_its_status(embedded_standin):
    embedded_standin.inject(status_abort(503, "out of memory"))
    assert generate(embedded_standin, [PROMPT, OTHER_PROMPT], GREEDY) == (503, {"error": {"message": "out of memory"}})
    assert embedded_standin.faults_served == [("/generate", "status_abort")]
    assert generate(embedded_standin, [PROMPT], GREEDY)[0] == 200  # one request only
