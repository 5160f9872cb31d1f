"""The programmatic judge: registered predicates and regexes by criterion name, scores padded to [B, K], a
failing check failing only its rollout, and rubric text never executed."""

import asyncio
import builtins
import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.judges.base import JudgeRequest
from rubric_jax.judges.programmatic import (
    Attributed,
    ProgrammaticJudge,
    RegexCheck,
    register_check,
    registered_check,
    step_at,
)
from rubric_jax.rubrics.schema import Criterion, Rubric


@register_check("test_programmatic.mentions_question")
def _mentions_question(response, request):
    return request.question.lower() in response.lower()


@register_check("test_programmatic.length_fraction")
def _length_fraction(response, request):
    return min(len(response) / 10, 1.0)


@register_check("test_programmatic.raises")
def _raises(response, request):
    raise RuntimeError("predicate bug")


def _rubric(*names, text="criterion"):
    return Rubric(criteria=tuple(Criterion(text=text, name=name) for name in names))


def _request(response, rubric, question="sum"):
    return JudgeRequest(question=question, response=response, rubric=rubric, reference="42")


CHECKS = {
    "mentions": "test_programmatic.mentions_question",
    "length": "test_programmatic.length_fraction",
    "boxed": RegexCheck(r"\\boxed\{"),
    "no_apology": RegexCheck(r"\bsorry\b", flags=re.IGNORECASE, must_match=False),
    "uses_reference": lambda response, request: request.reference in response,
    "raises": "test_programmatic.raises",
}


def test_scores_by_criterion_name_padded_to_max_items():
    rubric = _rubric("mentions", "length", "boxed", "no_apology", "uses_reference")
    requests = [
        _request("The SUM is \\boxed{42}", rubric),
        _request("Sorry, no.", rubric),
        _request("", _rubric("boxed")),
    ]
    verdicts = ProgrammaticJudge(CHECKS).judge(requests, max_items=6)
    np.testing.assert_array_equal(
        verdicts.satisfied_bk,
        [[1, 1, 1, 1, 1, 0], [0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]],
    )
    np.testing.assert_array_equal(verdicts.item_step_bk, np.full((3, 6), -1))  # no step attribution
    assert not verdicts.failed_b.any() and verdicts.reasons == ("", "", "")


def test_a_partial_score_is_kept():
    verdicts = ProgrammaticJudge(CHECKS).judge([_request("abcd", _rubric("length"))], max_items=1)
    assert verdicts.satisfied_bk.tolist() == [[np.float32(0.4)]]


def test_a_raising_check_fails_its_rollout_only():
    requests = [_request("sum", _rubric("mentions", "raises")), _request("sum", _rubric("mentions"))]
    verdicts = ProgrammaticJudge(CHECKS).judge(requests, max_items=2)
    np.testing.assert_array_equal(verdicts.failed_b, [True, False])
    np.testing.assert_array_equal(verdicts.satisfied_bk, [[0, 0], [1, 0]])
    np.testing.assert_array_equal(verdicts.item_step_bk, [[-1, -1], [-1, -1]])
    assert verdicts.reasons == ("check_raised", "")
    assert verdicts.details[0] == "raises: RuntimeError: predicate bug"
    assert verdicts.failure_counts() == {"check_raised": 1}


@pytest.mark.parametrize("value", [math.nan, math.inf, 1.5, -0.25, "yes", None, [1], 1 + 0j])
def test_a_check_returning_a_non_score_fails_its_rollout(value):
    judge = ProgrammaticJudge({"bad": lambda response, request: value, "ok": RegexCheck("x")})
    verdicts = judge.judge([_request("x", _rubric("ok", "bad")), _request("x", _rubric("ok"))], max_items=2)
    assert verdicts.reasons == ("check_bad_value", "")
    assert verdicts.details[0].startswith("bad: ValueError: returned")
    np.testing.assert_array_equal(verdicts.satisfied_bk, [[0, 0], [1, 0]])


@pytest.mark.parametrize("value, score", [(True, 1), (np.bool_(False), 0), (1, 1), (0, 0), (np.float32(0.25), 0.25)])
def test_bool_and_number_results(value, score):
    verdicts = ProgrammaticJudge({"c": lambda response, request: value}).judge([_request("", _rubric("c"))], 1)
    assert verdicts.satisfied_bk[0, 0] == np.float32(score) and not verdicts.failed_b[0]


def test_an_unregistered_check_name_is_a_construction_error():
    with pytest.raises(ValueError, match="no check registered as 'nope'"):
        ProgrammaticJudge({"a": "nope"})
    with pytest.raises(ValueError, match=r"checks\['a'\] must be"):
        ProgrammaticJudge({"a": 3})


def test_a_criterion_without_a_check_is_a_programmer_error():
    judge = ProgrammaticJudge(CHECKS)
    with pytest.raises(ValueError, match=r"requests\[1\].rubric.criteria\[1\].name: no check for 'unknown'"):
        judge.judge([_request("", _rubric("boxed")), _request("", _rubric("boxed", "unknown"))], max_items=2)
    with pytest.raises(ValueError, match=r"criteria\[0\].name: no check for None"):
        judge.judge([_request("", Rubric(criteria=(Criterion(text="unnamed"),)))], max_items=2)
    with pytest.raises(ValueError, match="more than max_items=1"):
        judge.judge([_request("", _rubric("boxed", "length"))], max_items=1)


def test_registry():
    assert registered_check("test_programmatic.mentions_question") is _mentions_question
    with pytest.raises(ValueError, match="already registered"):
        register_check("test_programmatic.raises")(lambda response, request: True)
    with pytest.raises(ValueError, match="non-empty str"):
        register_check("")
    with pytest.raises(ValueError, match="must be callable"):
        register_check("test_programmatic.not_callable")(3)
    with pytest.raises(ValueError, match="registered: .*test_programmatic.raises"):
        registered_check("test_programmatic.missing")


def test_regex_check():
    request = _request("", _rubric("boxed"))
    assert RegexCheck("ab+c")("xxabbbc", request) and not RegexCheck("ab+c")("ac", request)
    assert RegexCheck("ABC", flags=re.IGNORECASE)("abc", request)
    assert RegexCheck("abc", must_match=False)("xyz", request) and not RegexCheck("abc", must_match=False)("abc", request)
    assert RegexCheck("a") == RegexCheck("a") and RegexCheck("a") != RegexCheck("a", must_match=False)
    with pytest.raises(ValueError, match="pattern: invalid regular expression"):
        RegexCheck("(unclosed")


def test_rubric_text_is_never_executed(monkeypatch):
    """Criterion texts written as code are only data: eval / exec / compile are never called while judging."""

    def forbidden(*args, **kwargs):
        raise AssertionError("rubric text was executed")

    for name in ("eval", "exec", "compile", "__import__"):
        monkeypatch.setattr(builtins, name, forbidden)
    text = "__import__('os').system('echo pwned'); raise SystemExit"
    rubric = Rubric(criteria=(Criterion(text=text, name="boxed"), Criterion(text="{0.__class__}", name="mentions")))
    verdicts = ProgrammaticJudge(CHECKS).judge([_request("sum \\boxed{1}", rubric)], max_items=2)
    monkeypatch.undo()
    assert verdicts.satisfied_bk.tolist() == [[1, 1]] and not verdicts.failed_b.any()


def test_ajudge_equals_judge():
    requests = [_request("the sum", _rubric("mentions", "raises")), _request("\\boxed{2}", _rubric("boxed"))]
    judge = ProgrammaticJudge(CHECKS)
    sync, asynchronous = judge.judge(requests, 2), asyncio.run(judge.ajudge(requests, 2))
    np.testing.assert_array_equal(sync.satisfied_bk, asynchronous.satisfied_bk)
    assert sync.reasons == asynchronous.reasons == ("check_raised", "")


@given(responses=st.lists(st.text(max_size=30), max_size=5), names=st.lists(st.sampled_from(sorted(CHECKS)), max_size=4))
def test_any_response_gives_valid_verdicts(responses, names):
    requests = [_request(response, _rubric(*names)) for response in responses]
    verdicts = ProgrammaticJudge(CHECKS).judge(requests, max_items=4)
    assert verdicts.satisfied_bk.shape == (len(responses), 4)
    assert ((verdicts.satisfied_bk >= 0) & (verdicts.satisfied_bk <= 1)).all()
    np.testing.assert_array_equal(verdicts.failed_b, ["raises" in names] * len(responses))


STEPPED = "Intro.\n### Step 1: add 2 and 3 to get 5.\n### Step 2: double it: 10.\nSo \\boxed{10}"


def test_attributed_checks_give_item_steps():
    checks = {
        "adds": RegexCheck(r"get 5", attribute_step=True),
        "doubles": RegexCheck(r"double", attribute_step=True),
        "intro": RegexCheck(r"Intro", attribute_step=True),  # before the first header: outside every step
        "missing": RegexCheck(r"triple", attribute_step=True),
        "boxed": RegexCheck(r"\\boxed\{"),  # not attributed
        "whole": lambda response, request: Attributed(0.5, 0),
    }
    rubric = _rubric(*checks)
    verdicts = ProgrammaticJudge(checks).judge([_request(STEPPED, rubric)], max_items=7)
    np.testing.assert_array_equal(verdicts.satisfied_bk, [[1, 1, 1, 0, 1, 0.5, 0]])
    np.testing.assert_array_equal(verdicts.item_step_bk, [[1, 2, 0, -1, -1, 0, -1]])


def test_step_at_matches_split_steps():
    assert [step_at(STEPPED, STEPPED.index(s)) for s in ("Intro", "### Step 1", "get 5", "### Step 2", "boxed")] == [
        0, 1, 1, 2, 2]
    fenced = "```\n### Step 1: not a header in code\n```\n### Step 3: real"
    assert step_at(fenced, fenced.index("not a header")) == 0 and step_at(fenced, fenced.index("real")) == 3


@pytest.mark.parametrize("step", [-2, 1.0, True, "1", None])
def test_a_bad_attributed_step_fails_its_rollout(step):
    checks = {"bad": lambda response, request: Attributed(True, step)}
    verdicts = ProgrammaticJudge(checks).judge([_request("x", _rubric("bad"))], max_items=1)
    assert verdicts.reasons == ("check_bad_value",) and "attributed step" in verdicts.details[0]


def test_attribute_step_needs_must_match():
    with pytest.raises(ValueError, match="attribute_step"):
        RegexCheck("a", must_match=False, attribute_step=True)
