"""Outcome verification: \\boxed{} extraction, multiple-choice letters, math-verify equivalence behind a
wall-clock limit in a child process (hung or dead children replaced), and the 0 / 1 verifier."""

import concurrent.futures
import os
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubric_jax.judges import outcome
from rubric_jax.judges.outcome import EMPTY, EQUIVALENT, ERROR, NOT_EQUIVALENT, TIMEOUT, TOO_LONG, OutcomeVerdict
from rubric_jax.judges.outcome import OutcomeVerifier, answers_equivalent, equivalence_status
from rubric_jax.judges.outcome import extract_boxed, extract_choice

# ------------------------------------------------------------------ extract_boxed


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{x^{2^{3}} + {y}}", "x^{2^{3}} + {y}"),
        ("first \\boxed{1} then \\boxed{2} and last \\boxed{3}", "3"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not count
        ("\\boxed{a \\} b}", "a \\} b"),
        ("\\boxed{1 \\\\}", "1 \\\\"),  # a LaTeX line break, then the closing brace
        ("\\fbox{7}", "7"),
        ("\\boxed {  5 }", "5"),
        ("\\boxed{1} and \\fbox{2}", "2"),
        ("\\boxed{}", ""),
        ("\\boxed{outer \\boxed{inner} rest}", "inner"),  # the last opening is the nested one
        ("$\\boxed{\\text{(B)}}$", "\\text{(B)}"),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "no box here",
        "\\boxed 5",  # the brace-less form is not read
        "\\boxedanswer{5}",
        "\\boxed{1} then a truncated \\boxed{2",  # the last box is unclosed: no answer, not the earlier one
        "\\boxed{\\frac{1}{2}",
        "\\boxed{1\\}",  # the only closing brace is escaped
        "\\boxed",
        "",
    ],
)
def test_extract_boxed_none(text):
    assert extract_boxed(text) is None


def test_extract_boxed_on_huge_adversarial_inputs():
    assert extract_boxed("\\boxed{" + "{" * 1_000_000) is None
    assert extract_boxed("\\boxed{" * 200_000) is None
    assert extract_boxed("\\boxed{" + "{}" * 500_000 + "}") == "{}" * 500_000
    assert extract_boxed("\\boxed{1}" * 100_000) == "1"
    assert extract_boxed("\\\\" * 500_000 + "\\boxed{2}") == "2"


BALANCED = st.recursive(
    st.text(alphabet=st.characters(blacklist_characters="{}\\", blacklist_categories=("Cs",)), max_size=8)
    | st.sampled_from(["\\frac", "\\{", "\\}", "\\\\", "\\sqrt", "x^2"]),
    lambda inner: st.lists(inner, max_size=4).map("".join) | inner.map(lambda s: "{" + s + "}"),
    max_leaves=12,
)
NO_BOX = st.text(alphabet=st.characters(blacklist_characters="\\", blacklist_categories=("Cs",)), max_size=20)


@given(before=st.text(max_size=30), content=BALANCED, after=NO_BOX)
def test_extract_boxed_reads_any_balanced_content(before, content, after):
    assert extract_boxed(before + "\\boxed{" + content + "}" + after) == content.strip()


@settings(max_examples=1000)
@given(text=st.lists(st.sampled_from([*"{}\\ab 1", "\\boxed{", "\\fbox{", "\\{", "\\}"]), max_size=40).map("".join))
def test_extract_boxed_never_raises_and_returns_a_piece_of_the_text(text):
    boxed = extract_boxed(text)
    assert boxed is None or boxed in text


# ------------------------------------------------------------------ extract_choice


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is (B).", "B"),
        ("so the answer is C", "C"),
        ("Answer: D", "D"),
        ("**Answer:** A", "A"),
        ("The final answer is option E", "E"),
        ("ANSWER IS [F]", "F"),
        ("I think the answer is A. No wait, the answer is (C).", "C"),
        ("$\\boxed{B}$", "B"),
        ("\\boxed{(D)} even though the answer is A", "D"),  # the box comes first
        ("\\boxed{\\text{C}}", "C"),
        ("\\boxed{42}. The answer is (A)", "A"),  # a box without a letter gives way
        ("B", "B"),
        (" (C) ", "C"),
        ("D.", "D"),
        ("**A**", "A"),
        ("the answer is Bob", None),  # not a lone letter
        ("the answer is b", None),  # lower case is never read
        ("answer is (K)", None),  # not one of the letters
        ("a", None),
        ("I like B and C", None),
        ("", None),
    ],
)
def test_extract_choice(text, expected):
    assert extract_choice(text) == expected


def test_extract_choice_with_fewer_letters():
    assert extract_choice("The answer is E.", letters="ABCD") is None
    assert extract_choice("The answer is E. No, the answer is B.", letters="ABCD") == "B"
    assert extract_choice("answer: E", letters="ABCD") is None


@pytest.mark.parametrize("letters", ["", "abc", "AAB", "A1", 3])
def test_extract_choice_rejects_bad_letters(letters):
    with pytest.raises(ValueError, match="letters"):
        extract_choice("B", letters=letters)


@settings(max_examples=1000)
@given(text=st.text(max_size=200) | st.lists(st.sampled_from(["answer", " is ", ":", "(", ")", "B", "b", "**", "\\boxed{",
                                                             "}", "\\text{", "option", "K", " "]), max_size=12).map("".join))
def test_extract_choice_never_raises(text):
    assert extract_choice(text) in (None, *"ABCDEFGHIJ")


def test_extract_choice_and_boxed_reject_non_strings():
    with pytest.raises(ValueError, match="text must be a str"):
        extract_choice(None)
    with pytest.raises(ValueError, match="text must be a str"):
        extract_boxed(b"\\boxed{1}")


# ------------------------------------------------------------------ answers_equivalent


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("1/2", "0.5"),
        ("\\frac{1}{2}", "0.5"),
        ("0.5", "\\frac12"),
        ("\\dfrac{1}{2}", "1/2"),
        ("2x+1", "1+2x"),
        ("[1,2)", "[1, 2)"),
        ("\\{1,2\\}", "\\{2,1\\}"),
        ("x = 3", "3"),
        ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}"),
        ("(-\\infty, 3]", "x \\le 3"),
        ("1,000", "1000"),
        ("10\\%", "0.1"),
        ("  42 ", "42"),
    ],
)
def test_equivalent_answers(pred, gold):
    assert answers_equivalent(pred, gold)
    assert equivalence_status(pred, gold) == EQUIVALENT


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("1/2", "0.51"),
        ("(1,2]", "[1,2)"),
        ("(1,2)", "[1,2]"),
        ("\\{1,2\\}", "\\{1,3\\}"),
        ("2x+1", "2x-1"),
        ("3", "4"),
        ("x = 4", "3"),
        ("\\sqrt{2}", "1.41"),
    ],
)
def test_non_equivalent_answers(pred, gold):
    assert not answers_equivalent(pred, gold)
    assert equivalence_status(pred, gold) == NOT_EQUIVALENT


def test_blank_and_overlong_answers_are_not_equivalent_without_parsing():
    assert equivalence_status("", "1") == EMPTY and equivalence_status("1", " \n") == EMPTY
    assert equivalence_status("1" * 1001, "1") == TOO_LONG
    assert equivalence_status("9" * 10_000_000, "9" * 10_000_000) == TOO_LONG
    assert equivalence_status("1" * 20, "1" * 20, max_chars=10) == TOO_LONG


@pytest.mark.parametrize("pred", ["9^{9^{9^{9}}}", "(10^{100})!"])
def test_pathological_answers_time_out(pred):
    assert answers_equivalent("1/2", "0.5")
    child = outcome._GRADER._process
    assert equivalence_status(pred, "1", timeout_s=0.5) == TIMEOUT
    assert answers_equivalent("1/2", "0.5")
    assert outcome._GRADER._process is child  # the child's own alarm stopped it: no kill, no restart


def test_equivalence_off_the_main_thread():
    """math-verify's own signal timeouts raise in threads; the child process makes threads safe."""
    pairs = [("1/2", "0.5"), ("3", "4"), ("9^{9^{9^{9}}}", "1"), ("2x+1", "1+2x")] * 2
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda pair: equivalence_status(*pair, timeout_s=0.5), pairs))
    assert statuses == [EQUIVALENT, NOT_EQUIVALENT, TIMEOUT, EQUIVALENT] * 2


def test_a_hung_child_is_killed_and_replaced():
    grader = outcome._ChildGrader()
    try:
        assert grader.status("1/2", "0.5", 2.0) == EQUIVALENT
        first = grader._process
        os.kill(first.pid, signal.SIGSTOP)  # hangs where no alarm reaches it
        assert grader.status("1/2", "0.5", 0.2) == TIMEOUT
        assert first.poll() is not None  # killed
        assert grader.status("1/2", "0.5", 2.0) == EQUIVALENT
        second = grader._process
        assert second.pid != first.pid
        os.kill(second.pid, signal.SIGKILL)  # dies between requests
        second.wait()
        assert grader.status("2x+1", "1+2x", 2.0) == EQUIVALENT
        assert grader._process.pid != second.pid
    finally:
        grader.close()
    assert grader._process is None


@settings(max_examples=100)
@given(
    pred=st.text(max_size=30) | st.lists(st.sampled_from(["\\frac{", "}", "{", "^", "1", "x", "\\sqrt", "\\infty",
                                                          "(", "]", ",", "=", "\\", "\\boxed{", "$", "%", "\\{"]),
                                         max_size=12).map("".join),
    gold=st.sampled_from(["1/2", "x", "[0, 1)", "\\{1\\}", "\\frac{\\pi}{2}"]),
)
def test_answers_equivalent_never_raises(pred, gold):
    status = equivalence_status(pred, gold, timeout_s=2.0)
    assert status in (EQUIVALENT, NOT_EQUIVALENT, EMPTY, TIMEOUT, ERROR)
    assert answers_equivalent(pred, gold, timeout_s=2.0) == (status == EQUIVALENT)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(pred=None), "pred and gold must be str"),
        (dict(gold=1), "pred and gold must be str"),
        (dict(timeout_s=0), "timeout_s"),
        (dict(timeout_s=float("inf")), "timeout_s"),
        (dict(timeout_s="5"), "timeout_s"),
        (dict(max_chars=0), "max_chars"),
    ],
)
def test_equivalence_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        equivalence_status(**{**dict(pred="1", gold="1"), **kwargs})


# ------------------------------------------------------------------ OutcomeVerifier


@pytest.mark.parametrize(
    "response, gold, expected",
    [
        ("### Step 1: halve. So \\boxed{0.5}", "\\frac{1}{2}", OutcomeVerdict(1.0, "0.5", "correct")),
        ("\\boxed{0.5}", "Solution: ... hence \\boxed{\\frac12}.", OutcomeVerdict(1.0, "0.5", "correct")),
        ("\\boxed{3}", "4", OutcomeVerdict(0.0, "3", "not_equivalent")),
        ("the answer is 0.5", "0.5", OutcomeVerdict(0.0, None, "no_answer")),
        ("\\boxed{0.5", "0.5", OutcomeVerdict(0.0, None, "no_answer")),
        ("\\boxed{}", "0.5", OutcomeVerdict(0.0, "", "empty")),
        ("\\boxed{" + "1" * 2000 + "}", "1", OutcomeVerdict(0.0, "1" * 2000, "too_long")),
    ],
)
def test_math_verifier(response, gold, expected):
    assert OutcomeVerifier().verify(response, gold) == expected


def test_math_verifier_time_limit():
    verdict = OutcomeVerifier(timeout_s=0.5).verify("\\boxed{9^{9^{9^{9}}}}", "1")
    assert verdict == OutcomeVerdict(0.0, "9^{9^{9^{9}}}", "timeout")


@pytest.mark.parametrize(
    "response, gold, expected",
    [
        ("The answer is (B).", "B", OutcomeVerdict(1.0, "B", "correct")),
        ("\\boxed{C}", "(C)", OutcomeVerdict(1.0, "C", "correct")),
        ("The answer is (B).", "C", OutcomeVerdict(0.0, "B", "not_equivalent")),
        ("I cannot tell.", "A", OutcomeVerdict(0.0, None, "no_answer")),
    ],
)
def test_choice_verifier(response, gold, expected):
    assert OutcomeVerifier(kind="choice", letters="ABCD").verify(response, gold) == expected


def test_verify_batch():
    verdicts = OutcomeVerifier().verify_batch(["\\boxed{1/2}", "\\boxed{2}", "none"], ["0.5", "3", "1"])
    assert [v.score for v in verdicts] == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="differ in length"):
        OutcomeVerifier().verify_batch(["a"], [])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(kind="regex"), "kind"),
        (dict(letters="abc"), "letters"),
        (dict(timeout_s=-1), "timeout_s"),
        (dict(max_chars=True), "max_chars"),
    ],
)
def test_verifier_rejects_bad_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OutcomeVerifier(**kwargs)


def test_choice_verifier_rejects_a_gold_that_is_no_letter():
    with pytest.raises(ValueError, match="is not one of the letters"):
        OutcomeVerifier(kind="choice", letters="ABCD").verify("B", "42")
    with pytest.raises(ValueError, match="must be str"):
        OutcomeVerifier().verify(None, "1")


@settings(max_examples=100)
@given(response=st.text(max_size=60).map(lambda s: s.replace("\\", "\\boxed{")), kind=st.sampled_from(["math", "choice"]))
def test_verifier_never_raises_on_responses(response, kind):
    verdict = OutcomeVerifier(kind=kind, timeout_s=2.0).verify(response, "B" if kind == "choice" else "1/2")
    assert verdict.score in (0.0, 1.0)
    assert (verdict.score == 1.0) == (verdict.reason == "correct")
