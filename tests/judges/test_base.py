"""The judge interface (`rubric_jax.judges.base`): requests, per-rollout verdicts padded to [B, K] with the
failure convention (all unsatisfied, step -1), the validation of Verdicts, and the ABC's async default."""

import asyncio
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.judges.base import (ANSWER_CHARS, Judge, JudgeRequest, RolloutVerdict, Verdicts, check_requests,
                                    kept_answer)
from rubric_jax.rubrics.schema import Criterion, Rubric

RUBRIC = Rubric(criteria=(Criterion(text="states the answer"), Criterion(text="shows a step")))


def test_from_rollouts_pads_and_applies_the_failure_convention():
    verdicts = Verdicts.from_rollouts(
        [
            RolloutVerdict(satisfied=(1, 0, 0.5), item_step=(2, 0, -1)),
            RolloutVerdict(satisfied=(True, False)),  # no attribution
            RolloutVerdict.failure("no_json", "the output held no JSON"),
            RolloutVerdict(),  # an empty rubric
        ],
        max_items=4,
    )
    np.testing.assert_array_equal(
        verdicts.satisfied_bk, [[1, 0, 0.5, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    )
    np.testing.assert_array_equal(
        verdicts.item_step_bk, [[2, 0, -1, -1], [-1, -1, -1, -1], [-1, -1, -1, -1], [-1, -1, -1, -1]]
    )
    np.testing.assert_array_equal(verdicts.failed_b, [False, False, True, False])
    assert verdicts.reasons == ("", "", "no_json", "")
    assert verdicts.details == ("", "", "the output held no JSON", "")
    assert verdicts.satisfied_bk.dtype == np.float32 and verdicts.item_step_bk.dtype == np.int32
    assert verdicts.failed_b.dtype == bool
    assert verdicts.failure_counts() == {"no_json": 1}
    with pytest.raises(ValueError, match="read-only"):
        verdicts.satisfied_bk[0, 0] = 0.0


def test_from_rollouts_of_no_rollout():
    verdicts = Verdicts.from_rollouts([], max_items=3)
    assert verdicts.satisfied_bk.shape == verdicts.item_step_bk.shape == (0, 3)
    assert verdicts.failed_b.shape == (0,) and verdicts.reasons == ()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(satisfied=(1.5,)), r"\[0, 1\]"),
        (dict(satisfied=(-0.1,)), r"\[0, 1\]"),
        (dict(satisfied=(math.nan,)), r"\[0, 1\]"),
        (dict(satisfied=(1, 0), item_step=(1,)), "item_step has 1 entries for 2 items"),
        (dict(satisfied=(1,), item_step=(2**31,)), "fit int32"),
        (dict(satisfied=(1,), reason="no_json"), "carries no scores"),
        (dict(detail="why"), "detail or answer without a failure reason"),
        (dict(answer="maybe?"), "detail or answer without a failure reason"),
        (dict(reason="no_json", answer="x" * 400), "a kept answer is a str of at most"),
        (dict(reason="no_json", answer=None), "must be str"),
    ],
)
def test_rollout_verdict_rejects_programmer_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RolloutVerdict(**kwargs)


def test_kept_answer_cuts_long_answers_and_marks_them():
    assert kept_answer("") == "" and kept_answer("x" * ANSWER_CHARS) == "x" * ANSWER_CHARS
    cut = kept_answer("é" * (ANSWER_CHARS + 1))
    assert cut == "é" * ANSWER_CHARS + f" [... cut: {ANSWER_CHARS + 1} characters in all]"
    assert RolloutVerdict.failure("no_json", "", kept_answer("y" * 10**6)).answer.endswith("1000000 characters in all]")


def test_failed_answers_travel_through_from_rollouts_and_concatenate():
    rows = [RolloutVerdict(satisfied=(1,)), RolloutVerdict.failure("no_json", "none", "maybe?")]
    verdicts = Verdicts.from_rollouts(rows, max_items=2)
    assert verdicts.answers == ("", "maybe?")
    assert Verdicts.concatenate([verdicts, verdicts]).answers == ("", "maybe?") * 2
    assert _verdicts().answers == ("", "")  # absent: none kept


def test_failure_needs_a_reason():
    with pytest.raises(ValueError, match="non-empty reason"):
        RolloutVerdict.failure("")


def test_from_rollouts_rejects_more_items_than_max_items_and_bad_max_items():
    with pytest.raises(ValueError, match=r"verdicts\[1\] has 3 items, more than max_items=2"):
        Verdicts.from_rollouts([RolloutVerdict(satisfied=(1,)), RolloutVerdict(satisfied=(1, 1, 1))], 2)
    for bad in (-1, 2.0, True, None):
        with pytest.raises(ValueError, match="max_items"):
            Verdicts.from_rollouts([], bad)
    with pytest.raises(ValueError, match=r"verdicts\[0\] must be a RolloutVerdict"):
        Verdicts.from_rollouts([(1, 0)], 2)


def _verdicts(**changes):
    fields = dict(
        satisfied_bk=np.zeros((2, 3), np.float32),
        item_step_bk=np.full((2, 3), -1, np.int32),
        failed_b=np.array([False, True]),
        reasons=("", "timeout"),
    )
    return Verdicts(**{**fields, **changes})


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(satisfied_bk=np.zeros((2, 4))), "disagree"),
        (dict(failed_b=np.array([False, True, False])), "disagree"),
        (dict(satisfied_bk=np.zeros(2)), "disagree"),
        (dict(item_step_bk=np.zeros((2, 3), np.float32)), "integers"),
        (dict(item_step_bk=np.array([[2**31, -1, -1], [-1, -1, -1]])), "fit int32"),
        (dict(failed_b=np.array([0, 1])), "bool"),
        (dict(satisfied_bk=np.full((2, 3), 2.0)), r"\[0, 1\]"),
        (dict(satisfied_bk=np.full((2, 3), np.nan)), r"\[0, 1\]"),
        (dict(reasons=("",)), "one entry per rollout"),
        (dict(details=("",)), "one entry per rollout"),
        (dict(answers=("",)), "one entry per rollout"),
        (dict(answers=("maybe?", "")), "answer is kept for a failed rollout only"),
        (dict(answers=("", "x" * 400)), "a kept answer is a str of at most"),
        (dict(reasons=("", "")), "failed exactly when it has a reason"),
        (dict(reasons=("oops", "timeout")), "failed exactly when it has a reason"),
        (dict(satisfied_bk=np.array([[0, 0, 0], [1, 0, 0]])), "every item unsatisfied and step -1"),
        (dict(item_step_bk=np.array([[-1, -1, -1], [0, -1, -1]])), "every item unsatisfied and step -1"),
    ],
)
def test_verdicts_validate_shapes_values_and_the_failure_convention(changes, match):
    _verdicts()  # the unchanged fields are valid
    with pytest.raises(ValueError, match=match):
        _verdicts(**changes)


ROLLOUTS = st.one_of(
    st.builds(RolloutVerdict.failure, st.sampled_from(["no_json", "timeout", "check_raised"])),
    st.integers(0, 5).flatmap(
        lambda n: st.builds(
            RolloutVerdict,
            satisfied=st.lists(st.floats(0, 1), min_size=n, max_size=n).map(tuple),
            item_step=st.none() | st.lists(st.integers(-1, 9), min_size=n, max_size=n).map(tuple),
        )
    ),
)


@given(rollouts=st.lists(ROLLOUTS, max_size=6), extra=st.integers(0, 3))
def test_from_rollouts_rows_are_the_padded_verdicts(rollouts, extra):
    max_items = max([len(r.satisfied) for r in rollouts], default=0) + extra
    verdicts = Verdicts.from_rollouts(rollouts, max_items)
    assert verdicts.satisfied_bk.shape == (len(rollouts), max_items)
    for b, rollout in enumerate(rollouts):
        n = len(rollout.satisfied)
        steps = rollout.item_step if rollout.item_step is not None else (-1,) * n
        np.testing.assert_array_equal(verdicts.satisfied_bk[b], np.float32(list(rollout.satisfied) + [0] * (max_items - n)))
        np.testing.assert_array_equal(verdicts.item_step_bk[b], list(steps) + [-1] * (max_items - n))
        assert verdicts.failed_b[b] == rollout.failed == bool(verdicts.reasons[b])
    assert sum(verdicts.failure_counts().values()) == int(verdicts.failed_b.sum())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(question=None), "question must be a str"),
        (dict(response=b"bytes"), "response must be a str"),
        (dict(reference=3), "reference must be None or a str"),
        (dict(rubric={"criteria": []}), "rubric must be a Rubric"),
        (dict(num_steps=-1), "num_steps"),
        (dict(num_steps=True), "num_steps"),
        (dict(num_steps=2.0), "num_steps"),
    ],
)
def test_judge_request_validation(kwargs, match):
    JudgeRequest(question="q", response="r", rubric=RUBRIC, reference="gold", num_steps=3)
    with pytest.raises(ValueError, match=match):
        JudgeRequest(**{**dict(question="q", response="r", rubric=RUBRIC), **kwargs})


def test_check_requests():
    request = JudgeRequest(question="q", response="r", rubric=RUBRIC)
    check_requests([request, request], max_items=2)
    with pytest.raises(ValueError, match=r"requests\[1\].rubric has 2 criteria, more than max_items=1"):
        check_requests([JudgeRequest(question="q", response="r", rubric=Rubric()), request], max_items=1)
    with pytest.raises(ValueError, match=r"requests\[0\] must be a JudgeRequest"):
        check_requests(["r"], max_items=2)


class _LengthJudge(Judge):
    """Satisfies item k when the response is longer than k characters."""

    def judge(self, requests, max_items):
        check_requests(requests, max_items)
        return Verdicts.from_rollouts(
            [RolloutVerdict(satisfied=tuple(len(r.response) > k for k in range(len(r.rubric.criteria))))
             for r in requests],
            max_items,
        )


def test_ajudge_defaults_to_judge():
    requests = [JudgeRequest(question="q", response=text, rubric=RUBRIC) for text in ("", "a", "abc")]
    judge = _LengthJudge()
    sync, asynchronous = judge.judge(requests, 3), asyncio.run(judge.ajudge(requests, 3))
    np.testing.assert_array_equal(sync.satisfied_bk, [[0, 0, 0], [1, 0, 0], [1, 1, 0]])
    np.testing.assert_array_equal(asynchronous.satisfied_bk, sync.satisfied_bk)
    with pytest.raises(TypeError):
        Judge()  # abstract
