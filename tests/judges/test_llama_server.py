"""The LLM judges against llama.cpp's `llama-server` of a tiny random Qwen3 (tests/judges/llama_cpp.py): a
third-party OpenAI-compatible server that, unlike `transformers serve` (test_real_server.py), enforces the JSON
schema it is sent, so this is where the schema path meets a real grammar.

What each test shows:
- under the schema, in either dialect the client may settle on (`json_schema`, or `json_object` with a `schema`
  as llama-cpp-python's server wants), the random model's every rating parses, where free decoding parses none;
- what a grammar cannot enforce (unique ids, steps within the response, a score's range) reaches the parser,
  which fails the rollout with its reason, counted as a schema violation;
- the probe before a run passes against it (under any model name, as llama-server serves its one model under
  any), a prompt longer than the server's context fails its rollout as a counted 400 in every dialect without
  retries or a dialect change, and a server started with `--api-key` is opened by `judge.api_key_env`.

Each test predicts its verdicts exactly: an oracle client asks the server the judge's own questions first (greedy
decoding answers them the same again) and the format's parser reads the answers.
"""

import collections
import contextlib
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from rubric_jax.inference.http import ClientStats, JsonHttpClient, RetryPolicy
from rubric_jax.judges.base import JudgeRequest
from rubric_jax.judges.llm import (
    REQUEST_FAILED,
    ChatClient,
    ChatSettings,
    CriterionLLMJudge,
    RolloutLLMJudge,
    grounded_format,
    rating_format,
    srar_format,
)
from rubric_jax import cli
from rubric_jax.data import synthesis
from rubric_jax.judges import preflight
from rubric_jax.rubrics import parsing
from rubric_jax.training import assembly, rl, runs
from rubric_jax.training.metrics import read_metrics
from rubric_jax.training.run_config import JudgeConfig, RolloutConfig
from rubric_jax.yaml_config import load_config
from tests.judges import llama_cpp
from tests.judges.test_llm import srar_request
from tests.judges.test_real_server import GROUNDED_RUBRIC, RGR_RUBRIC, ask
from tests.training.test_rl import tiny_rl_config
from tests.training.toy_task import RUBRIC as TOY_RUBRIC, toy_task

llama_server = llama_cpp.llama_server  # the fixture this module uses
llama_gguf = llama_cpp.llama_gguf

MAX_TOKENS = 96
LONG_ANSWER = 400  # room for a whole SRaR or grounded answer, which the grammar pads with blank lines
# One retry at most: the exact stats below would show any retry a test does not expect. A generous timeout: the
# server generates one request at a time, so on a loaded machine a request may wait minutes for the others.
PATIENT = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=300.0)
KEY_ENV = "RUBRIC_JAX_LLAMA_SERVER_TEST_KEY"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def make_chat(llama_server):
    """make_chat(dialect="json_schema", **settings): a ChatClient of the module's server starting in `dialect`
    ("none": no schemas), on an HTTP client of its own (so its stats count only its own requests)."""
    with contextlib.ExitStack() as clients:
        def make(dialect="json_schema", **settings):
            http = clients.enter_context(JsonHttpClient(llama_server.base_url, retry=PATIENT, seed=0))
            settings = {"model": llama_server.model, "max_tokens": MAX_TOKENS, "json_schema": dialect != "none",
                        **settings}
            chat = ChatClient(http, ChatSettings(**settings))
            chat.dialect = dialect
            return chat

        yield make


def rgr_requests() -> list[JudgeRequest]:
    return [JudgeRequest(question="Solve x - 3 = 4.", response=r, rubric=RGR_RUBRIC) for r in ("x = 7", "x = 1")]


@pytest.mark.parametrize("dialect", ["json_schema", "json_object"])
def test_under_the_schema_every_rating_parses_and_without_it_none_does(make_chat, dialect):
    """One call per (rollout, criterion), greedy: under the schema each answer is {"rating": 0 | 1} and the
    criterion scores what it says, with no failure and no violation; the same calls without a schema are free
    text from the random model, none of which parses: every call failed and counted, every rollout failed."""
    fmt, requests = rating_format(), rgr_requests()
    oracle = make_chat(dialect)
    parses = [fmt.parse(ask(oracle, fmt.messages(r, k), fmt.schema())) for r in requests for k in range(2)]
    assert all(p.ok for p in parses)

    judge = CriterionLLMJudge(make_chat(dialect), fmt)
    verdicts = judge.judge(requests, max_items=2)
    assert verdicts.failed_b.tolist() == [False, False]
    np.testing.assert_array_equal(verdicts.satisfied_bk.reshape(-1), [p.values["rating"] for p in parses])
    assert judge.failures.failed == 0 and judge.http_stats() == ClientStats(requests=4, attempts=4)
    assert judge.format_metrics() == {"response_format": {"json_schema": 2.0, "json_object": 1.0}[dialect],
                                      "dialect_changes": 0.0}
    counts = judge.call_counts()
    assert {key: counts.pop(key) for key in ("calls", "call_failures", "schema_violations")} == {
        "calls": 4, "call_failures": 0, "schema_violations": 0}
    assert counts["prompt_tokens"] > 0 and counts["completion_tokens"] > 0 and counts["requests_without_usage"] == 0

    free = CriterionLLMJudge(make_chat("none"), fmt)
    verdicts = free.judge(requests, max_items=2)
    np.testing.assert_array_equal(verdicts.satisfied_bk, 0)
    assert verdicts.failed_b.tolist() == [True, True] and all(verdicts.answers)
    assert free.failures.failed == 4 and free.call_counts()["schema_violations"] == 0  # none was asked for


@pytest.mark.parametrize(
    "fmt, requests, max_items",
    [(srar_format(), [srar_request(r) for r in ("x = 7 \\boxed{7}", "### Step 1: x = 1 \\boxed{1}")], 4),
     (grounded_format(), [JudgeRequest(question="Which enzyme digests lactose?", response=r, rubric=GROUNDED_RUBRIC,
                                       reference="Lactase digests lactose.") for r in ("Lactase.", "Amylase.")], 3)],
    ids=["srar", "grounded"],
)
def test_what_the_grammar_cannot_enforce_fails_in_the_parser_and_counts_as_a_violation(make_chat, fmt, requests,
                                                                                        max_items):
    """The grammar gives the schema's shape but not its meaning: from the random model, SRaR verdicts whose ids
    repeat and whose steps are past any response's (beyond int32), grounded scores far beyond their criterion's
    weight, all complete JSON within LONG_ANSWER tokens. Each rollout is failed with its parser's reason
    (out_of_bounds) and detail, counted, and counted as an answer under a schema that did not parse; one request
    each, and the dialect stays."""
    oracle = make_chat(max_tokens=LONG_ANSWER)
    parses = [fmt.parse(ask(oracle, fmt.messages(r), fmt.schema(r)), r) for r in requests]
    assert [p.reason for p in parses] == ["out_of_bounds"] * len(requests)

    judge = RolloutLLMJudge(make_chat(max_tokens=LONG_ANSWER), fmt)
    verdicts = judge.judge(requests, max_items)
    n = len(requests)
    assert verdicts.failed_b.tolist() == [True] * n
    assert verdicts.reasons == tuple(p.reason for p in parses) and verdicts.details == tuple(p.detail for p in parses)
    assert judge.failures.by_reason == collections.Counter(verdicts.reasons)
    assert judge.http_stats() == ClientStats(requests=n, attempts=n)
    assert judge.format_metrics() == {"response_format": 2.0, "dialect_changes": 0.0}
    assert judge.call_counts()["schema_violations"] == n


def test_a_training_run_judged_under_the_schema_in_rating_format_has_no_failed_call(llama_server, tmp_path):
    """`rubric-jax train`'s loop with this server as its `format: rating` judge (one prompt, two samples, one
    step): every criterion call parses, so judge/failure_rate and judge/call_failure_rate are 0 and the run ends."""
    judge = JudgeConfig(kind="llm", url=llama_server.base_url, model=llama_server.model, format="rating",
                        max_tokens=MAX_TOKENS, max_attempts=2, timeout_s=300.0)
    config = tiny_rl_config(tmp_path, steps=1, judge=judge,
                            rollout=RolloutConfig(prompts_per_step=1, group_size=2, max_new_tokens=8))
    rl.train_rl(config, toy_task())
    (line,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert line["judge/failure_rate"] == line["judge/call_failure_rate"] == 0
    assert line["judge/calls"] == line["judge/requests"] == 2 * len(TOY_RUBRIC.criteria)
    assert line["judge/call_failures"] == line["judge/schema_violations"] == 0


def test_the_preflight_passes_and_the_server_answers_under_any_model_name(make_chat, llama_server, caplog):
    """GET /v1/models lists the server's alias: the preflight of a rating judge passes quietly under it, and under
    another name (llama-server, like SGLang, serves its one model under any) the server answers, so it passes with
    a warning; under the schema the answer parses."""
    fmt, request = rating_format(), rgr_requests()[0]
    with caplog.at_level(logging.WARNING):
        answer = preflight.preflight(make_chat(), "judge", "a rating request", fmt.messages(request, 0), fmt.schema(),
                                     fmt.parse)
        assert caplog.records == [] and answer.ok and preflight.require_parsed(answer) is answer
        other = preflight.preflight(make_chat(model="judge-model"), "judge", "a rating request",
                                    fmt.messages(request, 0), fmt.schema(), fmt.parse)
    [warning] = caplog.records
    assert f"judge.model 'judge-model' is not among the models {llama_server.base_url} serves " \
           f"({llama_server.model}), but the server answered it" in warning.getMessage()
    assert other.ok and other.text == answer.text  # greedy: the name changes nothing


def test_validate_asks_the_judge_and_passes_on_a_server_whose_answers_parse(llama_server, capsys):
    """`rubric-jax validate` on the RaR fixture with this server as a rating judge: its answer, under the schema,
    parses; exit 0, the raw answer shown."""
    status = cli.main(["validate", str(REPO / "configs/rar_dataset_cpu.yaml"),
                       f"task.params.path={REPO / 'tests/fixtures/datasets/rar.jsonl'}",
                       f"judge.url={llama_server.base_url}", f"judge.model={llama_server.model}",
                       f"judge.max_tokens={MAX_TOKENS}", "--rows", "1"])
    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if line.startswith("judge check: ")]
    assert status == 0 and "request (criterion 1 of " in line and ": parsed; raw answer: " in line
    assert parsing.parse_rating(json.loads(line.split("raw answer: ", 1)[1])).ok


def test_a_prompt_longer_than_the_context_fails_its_rollout_as_a_counted_400(make_chat):
    """A response past the server's 4096-token context: llama-server answers 400 in every dialect (the client
    cannot tell a format's fault from the request's, so it asks in each, once: no 4xx is retried), the rollout is
    failed as request_failed naming the status, and the dialect stays json_schema; the short rollout of the same
    batch is judged."""
    fmt = rating_format()
    requests = [JudgeRequest(question="Solve x - 3 = 4.", response=r, rubric=RGR_RUBRIC)
                for r in ("x = 7", "x equals seven, " * 600)]
    judge = CriterionLLMJudge(make_chat(), fmt)
    verdicts = judge.judge(requests, max_items=2)
    assert verdicts.reasons == ("", REQUEST_FAILED) and "http_400" in verdicts.details[1]
    # 2 calls for the short rollout; each of the long one's 2 calls asked in 3 dialects, one request each.
    assert judge.http_stats() == ClientStats(requests=8, attempts=8, failures=6,
                                             errors_by_reason=collections.Counter({"http_400": 6}))
    assert judge.chat.dialect == "json_schema" and judge.chat.dialect_changes == 0


def test_a_server_that_wants_a_key_is_opened_by_the_key_the_config_names(llama_gguf, tmp_path, monkeypatch):
    """`llama-server --api-key`: the key named by judge.api_key_env goes in every request; unset, the launch stops
    naming the variable; a wrong key stops it at the probe (401); the right one is probed and judged with. The
    synthesis generator's generator.api_key_env works the same way: with a wrong key each RaR question's one
    request fails (401) and the source is left for a later run, with the right one every question is answered."""
    binary = llama_cpp.llama_server_binary()
    with llama_cpp.llama_serve(binary, llama_gguf, tmp_path / "server.log", api_key="secret-key") as server:
        config = JudgeConfig(kind="llm", url=server.base_url, model=server.model, format="rating",
                             max_tokens=MAX_TOKENS, max_attempts=2, timeout_s=300.0, api_key_env=KEY_ENV)
        monkeypatch.delenv(KEY_ENV, raising=False)
        with pytest.raises(runs.RunStopped, match=f"judge.api_key_env names {KEY_ENV}, which is not set"):
            assembly.auth_headers(config, "judge")

        monkeypatch.setenv(KEY_ENV, "wrong-key")
        with contextlib.closing(assembly.make_judge(config, None, seed=0)) as judge:
            with pytest.raises(preflight.PreflightFailed, match=r"refused the credentials \(HTTP 401\)"):
                preflight.served_models(judge.chat, "judge")

        monkeypatch.setenv(KEY_ENV, "secret-key")
        with contextlib.closing(assembly.make_judge(config, None, seed=0)) as judge:
            assert preflight.served_models(judge.chat, "judge") == [server.model]
            verdicts = judge.judge(rgr_requests()[:1], max_items=2)
            assert verdicts.failed_b.tolist() == [False] and judge.failures.failed == 0
            assert judge.http_stats() == ClientStats(requests=2, attempts=2)

        def synthesize(key: str) -> dict:
            monkeypatch.setenv(KEY_ENV, key)
            config = load_config(synthesis.SynthesisConfig, REPO / "configs/synthesize_rar.yaml", [
                f"output_dir={tmp_path / key}", f"input.path={REPO / 'tests/fixtures/datasets/rar.jsonl'}",
                f"generator.url={server.base_url}", f"generator.model={server.model}", "generator.max_attempts=1",
                f"generator.max_tokens={MAX_TOKENS}", f"generator.api_key_env={KEY_ENV}", "output_attempts=1"])
            return synthesis.synthesize(config, progress=False)

        refused = synthesize("wrong-key")
        assert refused["this_run"]["request_failed"] == 2 and refused["sources"]["finished"] == 0
        assert refused["stage_calls"] == {}  # a call is counted once answered
        opened = synthesize("secret-key")
        assert opened["this_run"]["request_failed"] == 0 and opened["sources"]["finished"] == 2
        # Answered: the random model's rubric, under the grammar, runs past MAX_TOKENS and is discarded as such.
        assert opened["stage_calls"] == {"rubric": 2} and opened["discards"] == {"rubric/truncated": 2}
