"""LLM judges against the chat stand-in: verdict arrays, request shape, failures counted, retries, schema fallback;
EvoRubric's LLM meta-verifier: one call per criterion, verdicts per criterion, failures rejected and counted."""

import asyncio
import json
import logging

import numpy as np
import pytest

from rubric_jax.inference.http import JsonHttpClient, MalformedResponse, RetryPolicy
from rubric_jax.judges.base import ANSWER_CHARS, JudgeRequest
from rubric_jax.judges.llm import (
    CHAT_PATH,
    CLIENT_FIELDS,
    META_VERIFIER_FAILED,
    REQUEST_FAILED,
    TRUNCATED,
    UNLISTED_CATEGORY,
    USAGE_KEYS,
    ChatClient,
    ChatReply,
    ChatSettings,
    CriterionLLMJudge,
    LLMMetaVerifier,
    MetaVerifyRequest,
    RolloutLLMJudge,
    chat_reply,
    grounded_format,
    healthbench_format,
    rating_format,
    rlcer_verifier_format,
    srar_format,
)
from rubric_jax.rubrics.schema import Criterion, ItemKind, Rubric
from tests.inference.standin_server import StandinServer, Truncated, http_error

FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=10.0)

SRAR_RUBRIC = Rubric(
    criteria=(
        Criterion("Sets up the equation", kind=ItemKind.SUGGEST),
        Criterion("Drops a sign", kind=ItemKind.PITFALL),
        Criterion("Final answer is 7", kind=ItemKind.ANSWER),
    ),
    format="srar",
)


def srar_request(response: str) -> JudgeRequest:
    return JudgeRequest(question="Solve x - 3 = 4.", response=response, rubric=SRAR_RUBRIC, num_steps=2)


def srar_answer(entries) -> str:
    return json.dumps([{"id": i + 1, "satisfied": s, "step": k} for i, (s, k) in enumerate(entries)])


def user_text(messages) -> str:
    return "\n".join(m["content"] for m in messages)


@pytest.fixture
def server():
    with StandinServer() as server:
        yield server


@pytest.fixture
def make_judge():
    """make_judge(server, judge class, format, **settings): a judge on its own client, closed after the test."""
    clients = []

    def make(server, judge_cls, fmt, **settings):
        clients.append(JsonHttpClient(server.base_url, retry=FAST_RETRY, max_in_flight=8, seed=0))
        return judge_cls(ChatClient(clients[-1], ChatSettings(model="judge", **settings)), fmt)

    yield make
    for client in clients:
        client.close()


def test_srar_judge_verdicts_and_request_shape(server, make_judge):
    answers = {
        "ALPHA": srar_answer([(True, 1), (False, 2), (True, 0)]),
        "BETA": srar_answer([(False, -1), (True, 2), (False, 9)]),  # step 9, beyond the response, is kept
    }
    server.responder = lambda messages: next(a for key, a in answers.items() if key in user_text(messages))
    judge = make_judge(server, RolloutLLMJudge, srar_format())
    verdicts = judge.judge([srar_request("### Step 1: ALPHA \\boxed{7}"), srar_request("BETA")], max_items=4)

    np.testing.assert_array_equal(verdicts.satisfied_bk, [[1, 0, 1, 0], [0, 1, 0, 0]])
    np.testing.assert_array_equal(verdicts.item_step_bk, [[1, 2, 0, -1], [-1, 2, 9, -1]])
    assert not verdicts.failed_b.any() and judge.failures.failed == 0 and judge.failures.parsed == 2

    body = server.chat_requests[0]
    assert body["model"] == "judge" and body["temperature"] == 0.0
    schema = body["response_format"]["json_schema"]["schema"]
    assert body["response_format"]["type"] == "json_schema" and schema["minItems"] == schema["maxItems"] == 3
    first = next(b for b in server.chat_requests if "ALPHA" in user_text(b["messages"]))
    assert "<final_answer>\n7\n</final_answer>" in user_text(first["messages"])  # the extracted \boxed{} answer


def test_unparsable_output_fails_only_that_rollout_and_is_counted(server, make_judge):
    server.responder = lambda m: "I think it is fine." if "BAD" in user_text(m) else srar_answer([(True, 1)] * 3)
    judge = make_judge(server, RolloutLLMJudge, srar_format())
    verdicts = judge.judge([srar_request("GOOD"), srar_request("BAD"), srar_request("GOOD")], max_items=3)
    assert verdicts.failed_b.tolist() == [False, True, False]
    assert verdicts.reasons[1] == "no_json"
    np.testing.assert_array_equal(verdicts.satisfied_bk[1], 0)
    np.testing.assert_array_equal(verdicts.item_step_bk[1], -1)
    assert judge.failures.by_reason == {"no_json": 1} and judge.failures.parsed == 3


def test_transient_server_errors_are_retried(server, make_judge):
    server.responder = lambda m: srar_answer([(True, 1)] * 3)
    server.inject(http_error(503, CHAT_PATH), http_error(500, CHAT_PATH))
    judge = make_judge(server, RolloutLLMJudge, srar_format())
    verdicts = judge.judge([srar_request("x")], max_items=3)
    assert not verdicts.failed_b.any()
    stats = judge.chat.http.stats
    assert stats.retries == 2 and stats.errors_by_reason == {"http_503": 1, "http_500": 1}


def test_a_request_out_of_retries_fails_the_rollout_not_the_run(server, make_judge):
    server.responder = lambda m: srar_answer([(True, 1)] * 3)
    server.inject(*[http_error(502, CHAT_PATH)] * FAST_RETRY.max_attempts)
    judge = make_judge(server, RolloutLLMJudge, srar_format(), json_schema=False)
    verdicts = judge.judge([srar_request("x")], max_items=3)
    assert verdicts.failed_b.tolist() == [True] and verdicts.reasons == (REQUEST_FAILED,)
    assert "http_502" in verdicts.details[0]
    assert judge.failures.by_reason == {REQUEST_FAILED: 1} and judge.chat.http.stats.failures == 1


def calls_of(judge) -> dict:
    """A judge's or meta-verifier's `call_counts` without its token counts (`USAGE_KEYS`: tested on their own)."""
    return {key: count for key, count in judge.call_counts().items() if key not in USAGE_KEYS}


def _formats(server) -> list:
    return [(b.get("response_format") or {}).get("type") for b in server.chat_requests]


def test_a_4xx_to_a_schema_moves_to_the_next_dialect_once_that_works(server, make_judge):
    server.responder = lambda m: srar_answer([(False, 0)] * 3)
    server.inject(http_error(400, CHAT_PATH))
    judge = make_judge(server, RolloutLLMJudge, srar_format())
    assert not judge.judge([srar_request("x")], max_items=3).failed_b.any()
    assert judge.chat.dialect == "json_object" and judge.chat.dialect_changes == 1
    judge.judge([srar_request("y")], max_items=3)
    assert _formats(server) == ["json_object", "json_object"]  # the 400 was not recorded
    assert judge.format_metrics() == {"response_format": 1.0, "dialect_changes": 1.0}
    assert calls_of(judge) == {"calls": 2, "call_failures": 0, "schema_violations": 0}
    assert "schema" in server.chat_requests[0]["response_format"]


def test_a_4xx_that_is_not_the_schemas_fault_keeps_the_dialect(server, make_judge):
    server.responder = lambda m: srar_answer([(False, 0)] * 3)
    server.inject(*[http_error(400, CHAT_PATH)] * 3)  # every dialect refused: the request itself is bad
    judge = make_judge(server, RolloutLLMJudge, srar_format())
    verdicts = judge.judge([srar_request("x")], max_items=3)
    assert verdicts.reasons == (REQUEST_FAILED,)
    assert judge.chat.dialect == "json_schema" and judge.chat.dialect_changes == 0


def test_a_server_that_answers_500_to_json_schema_gets_json_object_with_the_schema(make_judge):
    """llama-cpp-python's server: HTTP 500 naming the response format to every json_schema request (retried,
    then the next dialect), json_object with a "schema" accepted."""
    with StandinServer(responder=lambda m: srar_answer([(True, 1)] * 3),
                       response_format_errors={"json_schema": 500}) as server:
        judge = make_judge(server, RolloutLLMJudge, srar_format())
        assert not judge.judge([srar_request("x"), srar_request("y")], max_items=3).failed_b.any()
        assert judge.chat.dialect == "json_object" and judge.chat.dialect_changes == 1
        assert _formats(server) == ["json_object", "json_object"]


def test_a_server_that_refuses_every_schema_is_asked_without_one(make_judge):
    with StandinServer(responder=lambda m: srar_answer([(True, 1)] * 3),
                       response_format_errors={"json_schema": 400, "json_object": 400}) as server:
        judge = make_judge(server, RolloutLLMJudge, srar_format())
        assert not judge.judge([srar_request("x")], max_items=3).failed_b.any()
        assert judge.chat.dialect == "none" and judge.format_metrics()["response_format"] == 0.0
        assert _formats(server) == [None]


def test_a_server_that_ignores_the_schema_shows_as_schema_violations(server, make_judge):
    server.responder = lambda m: "The response looks fine to me."  # not the JSON the schema asked for
    judge = make_judge(server, RolloutLLMJudge, srar_format())
    verdicts = judge.judge([srar_request("x"), srar_request("y")], max_items=3)
    assert verdicts.failed_b.all() and judge.chat.dialect == "json_schema"
    assert calls_of(judge) == {"calls": 2, "call_failures": 2, "call_failed/no_json": 2, "schema_violations": 2}
    assert verdicts.answers == ("The response looks fine to me.",) * 2  # the raw answer is kept


def test_rollouts_are_judged_concurrently(server, make_judge):
    server.responder = lambda m: srar_answer([(True, 1)] * 3)
    server.latency_s = 0.2
    judge = make_judge(server, RolloutLLMJudge, srar_format())
    judge.judge([srar_request(f"r{i}") for i in range(8)], max_items=3)
    assert server.max_concurrent == 8


def test_grounded_judge_scores_fractions_and_needs_the_grounding(server, make_judge):
    rubric = Rubric(
        criteria=(Criterion("Names the enzyme", weight=2.0), Criterion("Gives the rate", weight=0.5)),
        format="rubric_grounded",
    )
    server.responder = lambda m: json.dumps({"scores": {"c_1": 1.0, "c_2": 0.5}, "total": 1.5, "max_total": 2.5,
                                             "reasoning": "partly"})
    judge = make_judge(server, RolloutLLMJudge, grounded_format())
    request = JudgeRequest(question="q", response="r", rubric=rubric, reference="The enzyme is lactase.")
    verdicts = judge.judge([request], max_items=2)
    np.testing.assert_allclose(verdicts.satisfied_bk, [[0.5, 1.0]])
    assert "The enzyme is lactase." in user_text(server.chat_requests[0]["messages"])
    with pytest.raises(ValueError, match="grounding"):
        judge.judge([JudgeRequest(question="q", response="r", rubric=rubric)], max_items=2)
    assert len(server.chat_requests) == 1  # the misconfigured batch made no call


def test_rlcer_verifier_judges_every_rubric_in_one_call(server, make_judge):
    rubric = Rubric(criteria=(Criterion("Checks the units", weight=3.0), Criterion("Guesses", weight=-2.0)),
                    format="rlcer")
    server.responder = lambda m: json.dumps({"judgement": [True, False], "final_score": 3})
    judge = make_judge(server, RolloutLLMJudge, rlcer_verifier_format())
    verdicts = judge.judge([JudgeRequest(question="q", response="r", rubric=rubric)] * 3, max_items=2)
    np.testing.assert_array_equal(verdicts.satisfied_bk, [[1, 0]] * 3)
    assert len(server.chat_requests) == 3


RGR_RUBRIC = Rubric(
    criteria=(
        Criterion("States 42", weight=2.0, kind=ItemKind.FACTUAL),
        Criterion("Explains the method", weight=1.0, kind=ItemKind.PROCESS),
        Criterion("Cites the source", weight=1.0, kind=ItemKind.PROCESS),
    ),
    format="rgr",
)


def criterion_responder(answers):
    """A responder answering each criterion of RGR_RUBRIC (found by its text in the prompt) from `answers`."""
    return lambda messages: next(a for text, a in answers.items() if text in user_text(messages))


def test_criterion_judge_one_call_per_criterion(server, make_judge):
    server.responder = criterion_responder({"States 42": '{"rating": 1}', "Explains the method": '{"rating": 0}',
                                            "Cites the source": "```json\n{\"rating\": 1}\n```"})
    judge = make_judge(server, CriterionLLMJudge, rating_format())
    verdicts = judge.judge([JudgeRequest(question="q", response="r", rubric=RGR_RUBRIC)], max_items=4)
    np.testing.assert_array_equal(verdicts.satisfied_bk, [[1, 0, 1, 0]])
    assert not verdicts.failed_b.any() and verdicts.answers == ("",)
    assert len(server.chat_requests) == 3
    assert judge.failures.by_reason == {} and judge.failures.parsed == 3
    assert all(b["response_format"]["json_schema"]["schema"]["required"] == ["rating"] for b in server.chat_requests)


# Per criterion format: its answer meaning "met", and one failed answer of each kind with the call's reason.
CRITERION_FORMATS = {
    "rating": (rating_format, '{"rating": 1}', {
        "garbage": ("I would say the response is quite good.", "no_json"),
        "off_schema": ('{"rating": 7}', "out_of_bounds"),
        "wrong_field": ('{"score": 1}', "schema"),
        "truncated": (Truncated('{"rating": 1, "why": "the resp'), TRUNCATED),
    }),
    "healthbench": (healthbench_format, '```json\n{"explanation": "ok", "criteria_met": true}\n```', {
        "garbage": ("Yes, the criterion is met.", "no_json"),
        "off_schema": ('{"explanation": "ok", "criteria_met": "true"}', "schema"),
        "wrong_field": ('{"explanation": "ok", "met": true}', "schema"),
        "truncated": (Truncated('{"explanation": "The response names'), TRUNCATED),
    }),
}


@pytest.mark.parametrize("name, kind", [(name, kind) for name, (_, _, failed) in CRITERION_FORMATS.items()
                                        for kind in failed])
def test_criterion_judge_a_failed_criterion_call_fails_the_rollout(server, make_judge, name, kind):
    """Mixed: two of three criteria parse, one fails; the rollout fails with that call's reason, a detail naming the
    criterion, and its raw answer; the other rollout of the batch, all parsed, is judged."""
    fmt, met, failed = CRITERION_FORMATS[name]
    answer, reason = failed[kind]

    def responder(messages):
        if "BAD" in user_text(messages) and "Explains the method" in user_text(messages):
            return answer
        return met

    server.responder = responder
    judge = make_judge(server, CriterionLLMJudge, fmt())
    requests = [JudgeRequest(question="q", response=r, rubric=RGR_RUBRIC) for r in ("GOOD", "BAD")]
    verdicts = judge.judge(requests, max_items=3)
    assert verdicts.failed_b.tolist() == [False, True] and verdicts.reasons == ("", reason)
    np.testing.assert_array_equal(verdicts.satisfied_bk, [[1, 1, 1], [0, 0, 0]])
    assert verdicts.details[1].startswith("criteria[1] 'Explains the method': ")
    assert verdicts.answers == ("", str(answer))
    assert judge.failures.parsed == 6 and judge.failures.by_reason == {reason: 1}
    # A cut answer is max_tokens' doing, not a server ignoring the schema.
    assert judge.call_counts()["schema_violations"] == (0 if kind == "truncated" else 1)


def test_criterion_judge_every_call_failing_names_the_first_and_counts_them_all(server, make_judge):
    long_answer = "Let me think about this. " * 40  # 1000 characters, cut to ANSWER_CHARS
    server.responder = lambda messages: long_answer
    judge = make_judge(server, CriterionLLMJudge, healthbench_format())
    verdicts = judge.judge([JudgeRequest(question="q", response="r", rubric=RGR_RUBRIC)] * 2, max_items=3)
    assert verdicts.reasons == ("no_json", "no_json")
    assert verdicts.details[0].startswith("criteria[0] 'States 42': ")
    assert verdicts.details[0].endswith("(3 of 3 criterion calls failed)")
    assert verdicts.answers[0] == long_answer[:ANSWER_CHARS] + " [... cut: 1000 characters in all]"
    assert calls_of(judge) == {"calls": 6, "call_failures": 6, "call_failed/no_json": 6, "schema_violations": 6}


def test_criterion_judge_score_zero_keeps_the_rollout_judged_and_counts_the_call(server, make_judge):
    """RGR-GRPO's "parse failure scores 0" as the explicit opt-in: the criterion scores 0, the rollout stays
    judged, the call is counted; a failed request still fails the rollout."""
    server.responder = criterion_responder({"States 42": '{"rating": 1}', "Explains the method": '{"rating": 7}',
                                            "Cites the source": Truncated('{"rating": 1}')})
    clients = JsonHttpClient(server.base_url, retry=FAST_RETRY, max_in_flight=8, seed=0)
    judge = CriterionLLMJudge(ChatClient(clients, ChatSettings(model="judge")), rating_format(),
                              failed_criterion="score_zero")
    try:
        verdicts = judge.judge([JudgeRequest(question="q", response="r", rubric=RGR_RUBRIC)], max_items=3)
        np.testing.assert_array_equal(verdicts.satisfied_bk, [[1, 0, 0]])
        assert not verdicts.failed_b.any()
        assert calls_of(judge) == {"calls": 3, "call_failures": 2, "call_failed/out_of_bounds": 1,
                                       "call_failed/truncated": 1, "schema_violations": 1}
        def broken(messages):
            if "Cites the source" in user_text(messages):
                raise RuntimeError("the server breaks on this one")  # the stand-in answers 500, every attempt
            return '{"rating": 1}'

        server.responder = broken
        verdicts = judge.judge([JudgeRequest(question="q", response="r", rubric=RGR_RUBRIC)], max_items=3)
        assert verdicts.reasons == (REQUEST_FAILED,) and verdicts.answers == ("",)
        assert verdicts.details[0].startswith("criteria[2] 'Cites the source': http_500")
    finally:
        clients.close()
    with pytest.raises(ValueError, match="failed_criterion"):
        CriterionLLMJudge(judge.chat, rating_format(), failed_criterion="zero")


@pytest.mark.parametrize("fmt, rubric, reference", [
    (srar_format(), SRAR_RUBRIC, None),
    (grounded_format(), Rubric(criteria=(Criterion("Names the enzyme", weight=2.0),), format="rubric_grounded"),
     "The enzyme is lactase."),
    (rlcer_verifier_format(), Rubric(criteria=(Criterion("Checks the units", weight=3.0),), format="rlcer"), None),
])
def test_rollout_judges_keep_the_raw_answer_of_a_failed_or_truncated_call(server, make_judge, fmt, rubric, reference):
    judge = make_judge(server, RolloutLLMJudge, fmt)
    request = JudgeRequest(question="q", response="r", rubric=rubric, reference=reference)
    server.responder = lambda m: "x" * 400
    verdicts = judge.judge([request], max_items=3)
    assert verdicts.reasons == ("no_json",) and verdicts.answers == ("x" * 300 + " [... cut: 400 characters in all]",)
    server.responder = lambda m: Truncated('{"judgement": [tr')
    verdicts = judge.judge([request], max_items=3)
    assert verdicts.reasons == (TRUNCATED,) and verdicts.answers == ('{"judgement": [tr',)
    assert verdicts.details[0].startswith("cut at max_tokens=2048 (")
    assert judge.call_counts()["call_failed/truncated"] == 1


def test_criterion_judge_request_failure_fails_the_rollout(server, make_judge):
    rubric = Rubric(criteria=(Criterion("a", kind=ItemKind.FACTUAL), Criterion("b", kind=ItemKind.PROCESS)),
                    format="rgr")

    def responder(messages):
        if "BROKEN" in user_text(messages) and "<criterion>\nb\n</criterion>" in user_text(messages):
            raise RuntimeError("the server breaks on this one")  # the stand-in answers 500, every attempt
        return '{"rating": 1}'

    server.responder = responder
    judge = make_judge(server, CriterionLLMJudge, rating_format())
    requests = [JudgeRequest(question="q", response=r, rubric=rubric) for r in ("fine", "BROKEN")]
    verdicts = judge.judge(requests, max_items=2)
    assert verdicts.reasons == ("", REQUEST_FAILED) and "http_500" in verdicts.details[1]
    np.testing.assert_array_equal(verdicts.satisfied_bk, [[1, 1], [0, 0]])
    assert judge.failures.by_reason == {REQUEST_FAILED: 1}


@pytest.mark.parametrize(
    "body",
    [None, [], {}, {"choices": []}, {"choices": [{"message": {"content": None}}]}, {"choices": [{"message": "hi"}]}],
)
def test_chat_reply_rejects_malformed_bodies(body):
    with pytest.raises(MalformedResponse):
        chat_reply(body)


def test_settings_validation():
    for bad in (dict(model=""), dict(model="m", temperature=-0.1), dict(model="m", temperature=float("nan")),
                dict(model="m", max_tokens=0)):
        with pytest.raises(ValueError):
            ChatSettings(**bad)
    for field in CLIENT_FIELDS:
        with pytest.raises(ValueError, match=f"^ChatSettings.extra_body.{field}: the client sets"):
            ChatSettings(model="m", extra_body={"top_k": 20, field: 1})
    with pytest.raises(ValueError, match="^ChatSettings.chat_template_kwargs must map template variable names"):
        ChatSettings(model="m", chat_template_kwargs={"enable-thinking": False})
    with pytest.raises(ValueError, match="^ChatSettings.extra_body must map"):
        ChatSettings(model="m", extra_body=[("top_k", 20)])


def test_request_options_go_in_every_request_only_when_set(server, make_judge, make_meta_verifier):
    """A Qwen3 judge asked not to think (RGR-GRPO's), gpt-oss's reasoning effort: in every call of a per-criterion
    judge and of the meta-verifier, beside the client's own fields; a judge without options sends neither."""
    options = dict(chat_template_kwargs={"enable_thinking": False}, extra_body={"reasoning_effort": "low", "top_k": 1})
    server.responder = lambda messages: '{"rating": 1}'
    judge = make_judge(server, CriterionLLMJudge, rating_format(), max_tokens=1024, **options)
    assert not judge.judge([JudgeRequest(question="q", response="r", rubric=RGR_RUBRIC)], max_items=3).failed_b.any()
    assert len(server.chat_requests) == 3
    for body in server.chat_requests:
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert (body["reasoning_effort"], body["top_k"]) == ("low", 1)
        assert (body["model"], body["temperature"], body["max_tokens"]) == ("judge", 0.0, 1024)
        assert body["response_format"]["type"] == "json_schema" and body["messages"][-1]["role"] == "user"
    server.chat_requests.clear()
    server.responder = lambda messages: '{"verdict": "VALID"}'
    verifier = make_meta_verifier(server, **options)
    verifier.verify(meta_requests()[:1])
    assert [b["chat_template_kwargs"] for b in server.chat_requests] == [{"enable_thinking": False}] * 2
    assert all(b["reasoning_effort"] == "low" for b in server.chat_requests)
    server.chat_requests.clear()
    server.responder = lambda messages: srar_answer([(True, 1)] * 3)
    make_judge(server, RolloutLLMJudge, srar_format()).judge([srar_request("x")], max_items=3)
    assert not {"chat_template_kwargs", "reasoning_effort", "top_k"} & set(server.chat_requests[0])


def test_async_judging_from_a_running_loop(server, make_judge):
    server.responder = lambda m: srar_answer([(True, 2)] * 3)
    judge = make_judge(server, RolloutLLMJudge, srar_format())

    async def main():
        return await judge.ajudge([srar_request("a"), srar_request("b")], max_items=3)

    verdicts = asyncio.run(main())
    np.testing.assert_array_equal(verdicts.item_step_bk, [[2, 2, 2]] * 2)


def test_schemas_off_in_settings_are_never_sent(server, make_judge):
    server.responder = lambda m: srar_answer([(True, 1)] * 3)
    judge = make_judge(server, RolloutLLMJudge, srar_format(), json_schema=False)
    assert not judge.judge([srar_request("x")], max_items=3).failed_b.any()
    assert "response_format" not in server.chat_requests[0]


# ---------------------------------------------------------------- EvoRubric's meta-verifier


def target_text(messages) -> str:
    """The criterion under audit: the text of the prompt's fenced target rubric line."""
    fenced = user_text(messages).split("<target_rubric>\n")[1].split("\n</target_rubric>")[0]
    return json.loads(fenced)["criterion"]


META_ANSWERS = {
    "Names the drug's dose": '{"verdict": "VALID"}',
    "Mentions the dose": '{"verdict": "INVALID: Semantic Duplication"}',
    "Uses a markdown table": '```json\n{"verdict": "invalid: style hallucination"}\n```',
    "Is thorough": "The rubric looks fine to me.",  # no JSON: not verified
    "Is clever": '{"verdict": "INVALID: Too Clever"}',  # no listed category: still rejected
}


@pytest.fixture
def make_meta_verifier():
    """make_meta_verifier(server, domain, **settings): a meta-verifier on its own client, closed after the test."""
    verifiers = []

    def make(server, domain="medical", **settings):
        http = JsonHttpClient(server.base_url, retry=FAST_RETRY, max_in_flight=8, seed=0)
        verifiers.append(LLMMetaVerifier(ChatClient(http, ChatSettings(model="meta", **settings)), domain))
        return verifiers[-1]

    yield make
    for verifier in verifiers:
        verifier.close()


def meta_requests():
    existing = (Criterion("States the dose", weight=5.0),)
    return [
        MetaVerifyRequest("How much ibuprofen?", (Criterion("Names the drug's dose", weight=4.0),
                                                  Criterion("Mentions the dose", weight=2.0)), existing),
        MetaVerifyRequest("Is this rash serious?", (), existing),
        MetaVerifyRequest("Is this rash serious?", tuple(Criterion(text, weight=-3.0) for text in
                                                         ("Uses a markdown table", "Is thorough", "Is clever")), ()),
    ]


def test_meta_verifier_one_call_per_criterion_verdicts_and_failures(server, make_meta_verifier):
    """Five criteria in three requests (one empty): five calls, the first answered 503 and retried; VALID, two
    listed categories (one in a code fence, another case), an unlisted one, and an answer with no JSON (rejected
    as META_VERIFIER_FAILED and counted by the parser's reason)."""
    server.responder = lambda messages: META_ANSWERS[target_text(messages)]
    server.inject(http_error(503, CHAT_PATH))
    verifier = make_meta_verifier(server)
    verdicts = verifier.verify(meta_requests())
    assert verdicts == [(None, "Semantic Duplication"), (),
                        ("Style Hallucination", META_VERIFIER_FAILED, UNLISTED_CATEGORY)]
    assert len(server.chat_requests) == 5 and server.faults_served == [(CHAT_PATH, "status")]
    stats = verifier.http_stats()
    assert stats.requests == 5 and stats.retries == 1 and stats.failures == 0
    assert verifier.failures.parsed == 5 and verifier.failures.by_reason == {"no_json": 1}
    assert calls_of(verifier) == {"calls": 5, "call_failures": 1, "call_failed/no_json": 1, "schema_violations": 1}

    body = next(b for b in server.chat_requests if target_text(b["messages"]) == "Mentions the dose")
    assert body["model"] == "meta" and body["temperature"] == 0.0
    system, user = body["messages"]
    assert system["role"] == "system" and system["content"].startswith("You are an elite medical grading rubric")
    assert "<question>\nHow much ibuprofen?\n</question>" in user["content"]
    assert '{"criterion": "States the dose", "points": 5}' in user["content"]  # the existing rubric, fenced
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["verdict"]["enum"][:2] == ["VALID", "INVALID: Factual Conflict"]


def test_meta_verifier_request_out_of_retries_rejects_the_criterion_and_never_raises(server, make_meta_verifier):
    server.responder = lambda messages: '{"verdict": "VALID"}'
    server.inject(*[http_error(502, CHAT_PATH)] * FAST_RETRY.max_attempts)
    verifier = make_meta_verifier(server, domain="writing_science")
    request = MetaVerifyRequest("Write a haiku.", (Criterion("Has three lines", weight=3.0),), ())
    assert verifier.verify([request]) == [(META_VERIFIER_FAILED,)]
    assert verifier.failures.by_reason == {REQUEST_FAILED: 1} and verifier.http_stats().failures == 1
    assert verifier.verify([request]) == [(None,)]  # the server is back: the same criterion is verified
    assert verifier.categories[0] == "Task Constraint Conflict"  # Table 7's categories


def test_meta_verifier_calls_run_concurrently_and_bad_input_raises_before_any_call(server, make_meta_verifier):
    server.responder = lambda messages: '{"verdict": "VALID"}'
    server.latency_s = 0.2
    verifier = make_meta_verifier(server)
    criteria = tuple(Criterion(f"criterion {i}", weight=1.0) for i in range(4))
    assert verifier.verify([MetaVerifyRequest("q", criteria, ())] * 2) == [(None,) * 4] * 2
    assert server.max_concurrent == 8
    with pytest.raises(ValueError, match="MetaVerifyRequest"):
        verifier.verify([("q", criteria, ())])
    with pytest.raises(ValueError, match="domain"):
        LLMMetaVerifier(verifier.chat, "legal")
    assert len(server.chat_requests) == 8


def test_meta_verifier_truncated_answer_rejects_the_criterion_and_is_counted(server, make_meta_verifier):
    server.responder = lambda messages: Truncated('{"verdict": "VALID"}')  # it parses, but max_tokens cut it
    verifier = make_meta_verifier(server)
    request = MetaVerifyRequest("q", (Criterion("Names the dose", weight=3.0),), ())
    assert verifier.verify([request]) == [(META_VERIFIER_FAILED,)]
    assert calls_of(verifier) == {"calls": 1, "call_failures": 1, "call_failed/truncated": 1,
                                      "schema_violations": 0}


def test_failed_answers_are_logged_with_the_answer_collapsed_by_reason(server, make_judge, caplog):
    """Twelve failed calls of one reason: warnings at the 1st and 10th, each naming the reason, the count and the
    raw answer; the others are debug lines."""
    server.responder = lambda m: "no verdict here"
    judge = make_judge(server, RolloutLLMJudge, srar_format())
    with caplog.at_level(logging.DEBUG, logger="rubric_jax.judges.llm"):
        judge.judge([srar_request(str(i)) for i in range(12)], max_items=3)
    records = [r for r in caplog.records if r.name == "rubric_jax.judges.llm"]
    assert len(records) == 12
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert [w.split("(failure ")[1].split(" ")[0] for w in warnings] == ["1", "10"]
    assert all(" answered no_json: " in w and w.endswith("the answer: 'no verdict here'") for w in warnings)


def test_answers_usage_is_summed_and_an_answer_without_one_is_counted_apart(server, make_judge):
    """The stand-in's `usage` (words of the messages and of the answer) summed over the calls; with no usage in the
    answers, the calls count as requests without usage and add no tokens."""
    answer = srar_answer([(True, 1)] * 3)
    server.responder = lambda m: answer
    judge = make_judge(server, RolloutLLMJudge, srar_format())
    judge.judge([srar_request("x = 7"), srar_request("x is 7, since 4 + 3 = 7")], max_items=3)
    prompt = sum(len(m["content"].split()) for body in server.chat_requests for m in body["messages"])
    tokens = {"prompt_tokens": prompt, "completion_tokens": 2 * len(answer.split()), "requests_without_usage": 0}
    assert {key: judge.call_counts()[key] for key in USAGE_KEYS} == tokens
    server.chat_usage = False
    judge.judge([srar_request("7")], max_items=3)
    assert {key: judge.call_counts()[key] for key in USAGE_KEYS} == {**tokens, "requests_without_usage": 1}


@pytest.mark.parametrize("usage", [None, "12", {}, {"prompt_tokens": 3}, {"prompt_tokens": 3, "completion_tokens": -1},
                                   {"prompt_tokens": True, "completion_tokens": 1},
                                   {"prompt_tokens": 3.0, "completion_tokens": 1}])
def test_an_odd_usage_leaves_the_reply_good_and_its_tokens_unknown(usage):
    body = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}], "usage": usage}
    assert chat_reply(body) == ChatReply("ok", "stop", None)
    body["usage"] = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    assert chat_reply(body).usage == (3, 1)
