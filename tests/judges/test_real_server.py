"""The LLM judges over real HTTP against a third-party OpenAI-compatible server, `transformers serve` of a tiny
random Qwen3 (tests/judges/real_server.py), where test_llm.py's stand-in can only echo our own reading of the API.

What this server does to a judge: it answers 422 to a field it does not know, so its 200s say that every field
the client sends is one an OpenAI-compatible server may take; it accepts `response_format` but does not enforce
it; and the random model writes no judgement. So every judged rollout takes the failure path, which must fail
the rollout (one call per rollout, or per criterion) with the failed call's reason ("truncated" when max_tokens
cut the answer, else its parser's), keep the raw answer, count it, and raise nothing; a short training run with
this judge shows a failure rate of 1 and is stopped by the failure budget.
Each test predicts its verdicts exactly: a first client asks the server the judge's own questions (greedy
decoding answers them the same again) and the format's parser reads the answers.

The synthesis pipelines meet the same server once: every answer cut by max_tokens is read from the server's own
finish_reason, retried, then discarded and counted.

Few requests of at most MAX_TOKENS generated tokens keep the module to seconds after the server's start.
"""

import collections
import contextlib
import json
import socket
from pathlib import Path

import numpy as np
import pytest

from rubric_jax.inference.http import ClientStats, JsonHttpClient, RequestFailed, RetryPolicy
from rubric_jax.judges.base import JudgeRequest, kept_answer
from rubric_jax.judges.llm import (
    CHAT_PATH,
    REQUEST_FAILED,
    TRUNCATED,
    ChatClient,
    ChatSettings,
    CriterionLLMJudge,
    RolloutLLMJudge,
    grounded_format,
    rating_format,
    rlcer_verifier_format,
    srar_format,
)
from rubric_jax import cli
from rubric_jax.data import synthesis
from rubric_jax.data.tasks import build_task
from rubric_jax.judges import preflight
from rubric_jax.rubrics import parsing, prompts
from rubric_jax.rubrics import synthesis_schemas as schemas
from rubric_jax.rubrics.schema import Criterion, ItemKind, Rubric
from rubric_jax.training import assembly, launch, rl, runs
from rubric_jax.training.metrics import read_metrics
from rubric_jax.training.run_config import JudgeConfig, RolloutConfig
from rubric_jax.yaml_config import load_config
from tests.judges import real_server
from tests.judges.test_llm import srar_request
from tests.training.test_rl import tiny_rl_config
from tests.training.toy_task import RUBRIC as TOY_RUBRIC, toy_task

transformers_server = real_server.transformers_server  # the fixture this module uses
REPO = Path(__file__).resolve().parents[2]

MAX_TOKENS = 8
# One retry at most: the exact stats below would show any retry a test does not expect. The server generates one
# request at a time, so a request may wait for the others of its batch.
PATIENT = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=60.0)
MESSAGES = [{"role": "user", "content": "Is 7 the solution of x - 3 = 4? Answer in JSON."}]

GROUNDED_RUBRIC = Rubric(criteria=(Criterion("Names the enzyme", weight=2.0), Criterion("Gives the rate", weight=0.5)),
                         format="rubric_grounded")
RLCER_RUBRIC = Rubric(criteria=(Criterion("Checks the units", weight=3.0), Criterion("Guesses", weight=-2.0)),
                      format="rlcer")
RGR_RUBRIC = Rubric(criteria=(Criterion("States that x = 7", kind=ItemKind.FACTUAL),
                              Criterion("Adds 3 to both sides", kind=ItemKind.PROCESS)), format="rgr")


@pytest.fixture
def make_chat(transformers_server):
    """make_chat(retry=PATIENT, **settings): a ChatClient of the module's server, on an HTTP client of its own (so
    its stats count only its own requests), closed after the test."""
    with contextlib.ExitStack() as clients:
        def make(retry=PATIENT, **settings):
            http = clients.enter_context(JsonHttpClient(transformers_server.base_url, retry=retry, seed=0))
            settings = {"model": transformers_server.model, "max_tokens": MAX_TOKENS, **settings}
            return ChatClient(http, ChatSettings(**settings))

        yield make


@pytest.fixture
def refusing_url():
    """The URL of a loopback port bound but not listening: every connection to it is refused, and no other
    process can take the port while the test runs."""
    with socket.socket() as bound:
        bound.bind((real_server.HOST, 0))
        yield f"http://{real_server.HOST}:{bound.getsockname()[1]}"


def ask(chat: ChatClient, messages, schema=None) -> str:
    """chat.complete from sync code."""
    return chat.http.run_sync(chat.complete(messages, schema))


def expected_failure(chat: ChatClient, messages, schema, parse) -> tuple[str, str, str]:
    """The (reason, detail, kept answer) of a judge call that fails on the server's answer to `messages`: "truncated"
    when max_tokens cut it (the detail then opens with "cut at max_tokens"), else its parser's reason and detail."""
    reply = chat.http.run_sync(chat.reply(messages, schema))
    result = parse(reply.text)
    assert not result.ok or reply.truncated  # the random model writes no judgement
    if reply.truncated:
        return TRUNCATED, f"cut at max_tokens={chat.settings.max_tokens}", kept_answer(reply.text)
    return result.reason, result.detail, kept_answer(reply.text)


def test_complete_returns_the_servers_text_and_a_schema_is_taken_but_not_enforced(make_chat, transformers_server):
    """The client reads the text of a real server's body; the schema request is answered 200 (so no fallback and
    schemas stay on) with the very text of the plain one, since the server ignores the schema and decodes
    greedily; and a field the server does not know is a 422, which makes its 200s to our payloads (model,
    messages, temperature, max_tokens, seed, response_format) a check of their fields."""
    chat = make_chat(seed=0)
    plain = ask(chat, MESSAGES)
    assert isinstance(plain, str)
    assert ask(chat, MESSAGES, parsing.rating_schema()) == plain
    assert chat.dialect == "json_schema" and chat.dialect_changes == 0
    assert chat.http.stats == ClientStats(requests=2, attempts=2)

    unknown_field = {"model": transformers_server.model, "messages": MESSAGES, "max_tokens": 1, "rubric_hint": 1}
    with pytest.raises(RequestFailed) as refused:
        chat.http.run_sync(chat.http.post_json(CHAT_PATH, unknown_field))
    assert refused.value.status == 422


@pytest.mark.parametrize(
    "fmt, requests, max_items",
    [
        (srar_format(), [srar_request(r) for r in ("x = 7 \\boxed{7}", "### Step 1: x = 1 \\boxed{1}", "no idea")], 4),
        (grounded_format(), [JudgeRequest(question="Which enzyme digests lactose?", response=r, rubric=GROUNDED_RUBRIC,
                                          reference="Lactase digests lactose.") for r in ("Lactase.", "Amylase.")], 3),
        (rlcer_verifier_format(), [JudgeRequest(question="How far is 3 km in m?", response=r, rubric=RLCER_RUBRIC)
                                   for r in ("3000 m", "30")], 2),
    ],
    ids=["srar", "grounded", "rlcer_verifier"],
)
def test_rollout_judge_fails_and_counts_every_answer_that_does_not_parse(make_chat, fmt, requests, max_items):
    """One call per rollout: every rollout is failed with the reason its call gets from the server's answer (cut by
    max_tokens: "truncated"; else its parser's), its detail and its raw answer, with every item unsatisfied at step
    -1, and counted; one request per rollout, no retry, no failed request, and schemas stay on (ignored, not
    refused)."""
    oracle = make_chat()
    expected = [expected_failure(oracle, fmt.messages(r), fmt.schema(r), lambda text, r=r: fmt.parse(text, r))
                for r in requests]

    judge = RolloutLLMJudge(make_chat(), fmt)
    verdicts = judge.judge(requests, max_items)
    n = len(requests)
    assert verdicts.satisfied_bk.shape == verdicts.item_step_bk.shape == (n, max_items)
    assert verdicts.failed_b.tolist() == [True] * n
    assert verdicts.reasons == tuple(reason for reason, _, _ in expected)
    assert all(detail.startswith(want) for detail, (_, want, _) in zip(verdicts.details, expected))
    assert verdicts.answers == tuple(answer for _, _, answer in expected)
    assert set(verdicts.reasons) <= {TRUNCATED, *parsing.REASONS} - {"internal_error"}
    np.testing.assert_array_equal(verdicts.satisfied_bk, 0)
    np.testing.assert_array_equal(verdicts.item_step_bk, -1)
    assert judge.failures.parsed == judge.failures.failed == n
    assert judge.failures.by_reason == collections.Counter(verdicts.reasons)
    assert judge.http_stats() == ClientStats(requests=n, attempts=n)
    assert judge.chat.dialect == "json_schema" and judge.chat.dialect_changes == 0
    # transformers serve accepts the schema and ignores it: what shows is answers under a schema that do not parse
    # (those max_tokens did not cut).
    assert judge.call_counts()["schema_violations"] == sum(reason != TRUNCATED for reason in verdicts.reasons)


def test_criterion_judge_fails_every_rollout_whose_ratings_do_not_parse_and_counts_each_call(make_chat):
    """One call per (rollout, criterion): a rating that does not parse (or is cut) is a failed call, counted by its
    reason, and fails its rollout with the first failed criterion's reason and raw answer."""
    fmt = rating_format()
    requests = [JudgeRequest(question="Solve x - 3 = 4.", response=r, rubric=RGR_RUBRIC) for r in ("x = 7", "x = 1")]
    oracle = make_chat()
    expected = [expected_failure(oracle, fmt.messages(r, k), fmt.schema(), fmt.parse) for r in requests
                for k in range(2)]

    judge = CriterionLLMJudge(make_chat(), fmt)
    verdicts = judge.judge(requests, max_items=2)
    assert verdicts.failed_b.tolist() == [True, True]
    assert verdicts.reasons == (expected[0][0], expected[2][0])
    assert verdicts.answers == (expected[0][2], expected[2][2])
    assert all(d.startswith("criteria[0] 'States that x = 7': ") and d.endswith("(2 of 2 criterion calls failed)")
               for d in verdicts.details)
    np.testing.assert_array_equal(verdicts.satisfied_bk, np.zeros((2, 2)))
    np.testing.assert_array_equal(verdicts.item_step_bk, -1)
    assert judge.failures.parsed == judge.failures.failed == 4
    assert judge.failures.by_reason == collections.Counter(reason for reason, _, _ in expected)
    assert judge.http_stats() == ClientStats(requests=4, attempts=4)
    assert judge.call_counts()["call_failures"] == 4


def test_a_training_run_judged_by_it_in_rating_format_is_stopped_by_the_failure_budget(transformers_server, tmp_path):
    """`rubric-jax train`'s loop with this server as its `format: rating` judge (one prompt, two samples a step):
    every rollout and call of steps 1 and 2 fails, step 1's metrics show judge/failure_rate and
    judge/call_failure_rate 1, and the budget (2 failing steps) stops the run before step 2's update."""
    judge = JudgeConfig(kind="llm", url=transformers_server.base_url, model=transformers_server.model,
                        format="rating", max_tokens=MAX_TOKENS, max_attempts=1, timeout_s=60.0, max_failing_steps=2)
    config = tiny_rl_config(tmp_path, steps=3, judge=judge,
                            rollout=RolloutConfig(prompts_per_step=1, group_size=2, max_new_tokens=8))
    with pytest.raises(runs.RunStopped, match=r"judge/failure_rate was above judge.max_failure_rate \(0.5\) on 2 "
                                            r"consecutive steps \(step 2: 100%; .*before step 2's update"):
        # The judge handed in, so the launch's preflight (which would refuse it before step 1) is skipped:
        # what is under test is the failure budget during the run.
        with contextlib.closing(assembly.make_judge(config.judge, toy_task(), config.seed)) as judge:
            rl.train_rl(config, toy_task(), judge=judge)
    (line,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert line["judge/failure_rate"] == line["judge/call_failure_rate"] == 1
    assert line["judge/calls"] == line["judge/call_failures"] == 2 * len(TOY_RUBRIC.criteria)


def test_a_model_the_server_does_not_serve_fails_every_rollout_without_retries(make_chat):
    """The server is pinned to its model and answers 400 to any other name: each rollout asks in each
    response-format dialect in turn (a 4xx may be the schema's fault: json_schema, json_object, none), and no 4xx is
    retried; both rollouts are failed as request_failed naming the status, and the dialect stays json_schema
    since the request failed in every one."""
    judge = RolloutLLMJudge(make_chat(model="judge"), srar_format())
    verdicts = judge.judge([srar_request("a"), srar_request("b")], max_items=3)
    assert verdicts.reasons == (REQUEST_FAILED, REQUEST_FAILED)
    assert all("http_400" in detail for detail in verdicts.details)
    assert judge.failures.by_reason == {REQUEST_FAILED: 2}
    assert judge.http_stats() == ClientStats(requests=6, attempts=6, failures=6,
                                             errors_by_reason=collections.Counter({"http_400": 6}))
    assert judge.chat.dialect == "json_schema" and judge.chat.dialect_changes == 0


def test_refused_connections_are_retried_then_counted_not_raised(refusing_url):
    """Nothing listens: every rollout's request is tried max_attempts times (no schema fallback, since no server
    answered) and then fails its rollout as request_failed, counted; the judge returns."""
    retry = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=5.0)
    with JsonHttpClient(refusing_url, retry=retry, seed=0) as http:
        judge = RolloutLLMJudge(ChatClient(http, ChatSettings(model="judge", max_tokens=MAX_TOKENS)), srar_format())
        verdicts = judge.judge([srar_request("a"), srar_request("b")], max_items=3)
    assert verdicts.reasons == (REQUEST_FAILED, REQUEST_FAILED)
    assert all("connection" in detail for detail in verdicts.details)
    assert judge.failures.by_reason == {REQUEST_FAILED: 2}
    assert judge.http_stats() == ClientStats(requests=2, attempts=6, retries=4, failures=2,
                                             errors_by_reason=collections.Counter({"connection": 6}))


def test_answers_later_than_the_timeout_are_retried_then_counted_and_the_server_survives(make_chat):
    """A 10 ms limit per attempt, far below one generation: both attempts time out, the rollout is failed as
    request_failed and the judge returns; the server, left generating answers nobody reads, still answers a
    patient client afterwards."""
    impatient = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=0.01)
    judge = RolloutLLMJudge(make_chat(retry=impatient), srar_format())
    verdicts = judge.judge([srar_request("x = 7")], max_items=3)
    assert verdicts.reasons == (REQUEST_FAILED,) and "timeout" in verdicts.details[0]
    assert judge.failures.by_reason == {REQUEST_FAILED: 1}
    assert judge.http_stats() == ClientStats(requests=1, attempts=2, retries=1, failures=1,
                                             errors_by_reason=collections.Counter({"timeout": 2}))
    assert isinstance(ask(make_chat(), MESSAGES), str)


def test_synthesis_discards_and_counts_what_a_real_server_answers(make_chat, transformers_server, tmp_path):
    """`rubric-jax synthesize`'s RaR pipeline on the RaR fixture against the real server, greedy, MAX_TOKENS a
    answer: the random model writes no rubric, so each question is asked output_attempts = 2 times and discarded,
    and nothing is written. The reason is predicted by asking the server the same prompt first: "truncated" when
    the server says max_tokens cut the answer (its finish_reason "length"), else the schema reader's reason."""
    config = load_config(synthesis.SynthesisConfig, REPO / "configs/synthesize_rar.yaml", [
        f"output_dir={tmp_path}", f"input.path={REPO / 'tests/fixtures/datasets/rar.jsonl'}",
        f"generator.url={transformers_server.base_url}", f"generator.model={transformers_server.model}",
        "generator.temperature=0", f"generator.max_tokens={MAX_TOKENS}", "output_attempts=2",
        "max_concurrent_sources=1"])
    plan = synthesis.plan_synthesis(config)
    chat = make_chat()
    expected = collections.Counter()
    for source in plan.sources:
        record = source.record
        messages = prompts.rar_rubric_generation_prompt(record.question, record.reference)
        reply = chat.http.run_sync(chat.reply(messages, schemas.RaRRubricOutput.model_json_schema()))
        reason = "truncated" if reply.truncated else parsing.parse_structured(reply.text, schemas.RaRRubricOutput).reason
        expected[f"rubric/{reason}"] += 1
    summary = synthesis.run_synthesis(plan, progress=False)
    assert summary["discards"] == dict(expected) and sum(expected.values()) == len(plan.sources) == 2
    assert summary["stage_failures"] == {key: 2 * n for key, n in expected.items()}
    assert summary["stage_calls"] == {"rubric": 4} and sum(summary["records"].values()) == 0


def test_validate_and_train_refuse_a_judge_whose_answers_do_not_parse(transformers_server, make_chat, tmp_path,
                                                                     capsys):
    """`transformers serve` takes the schema and ignores it: the random model's answer to the rating judge's
    first request (predicted by asking the server the same prompt first) is not a rating. `rubric-jax validate`
    shows that raw answer and exits 1; `rubric-jax train` stops before step 1 with it in one line, nothing
    written."""
    rows = REPO / "tests/fixtures/datasets/rar.jsonl"
    args = [str(REPO / "configs/rar_dataset_cpu.yaml"), f"task.params.path={rows}",
            f"judge.url={transformers_server.base_url}", f"judge.model={transformers_server.model}",
            f"judge.max_tokens={MAX_TOKENS}", f"output_dir={tmp_path / 'run'}"]
    task = build_task("dataset", {"preset": "rar", "path": str(rows)}, 0)
    request = launch.preflight_request(task, task.train_stream(0).next_batch(1)[0])
    fmt = rating_format()
    raw = ask(make_chat(max_tokens=MAX_TOKENS), fmt.messages(request, 0), fmt.schema())
    result = fmt.parse(raw)
    assert not result.ok

    assert cli.main(["validate", *args, "--rows", "1"]) == 1
    captured = capsys.readouterr()
    shown = json.dumps(raw[:preflight.RAW_SHOWN_CHARS])
    assert f": does not parse: {result.reason}" in captured.out and f"raw answer: {shown}" in captured.out
    assert captured.err.startswith("rubric-jax validate: judge: its answer to a judge.format rating request")

    assert cli.main(["train", *args]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rubric-jax train: judge: its answer to a judge.format rating")
    assert f"does not parse: {result.reason}" in err and shown in err
    assert not (tmp_path / "run").exists()
