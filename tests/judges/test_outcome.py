"""Outcome verification: \\boxed{} extraction, multiple-choice letters, math-verify equivalence behind a
wall-clock limit in a child process (hung or dead children replaced), and the 0 / 1 verifier."""

import concurrent.futures
import os
import re
import signal
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubric_jax.judges import outcome
from rubric_jax.judges.outcome import EMPTY, EQUIVALENT, ERROR, NOT_EQUIVALENT, TIMEOUT, TOO_LONG, OutcomeVerdict
from rubric_jax.judges.outcome import OutcomeVerifier, answers_equivalent, equivalence_status
from rubric_jax.judges.outcome import extract_boxed, extract_choice, final_answer_text, math_answer

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
        # rule 2: an "answer is" / "answer:" phrase
        ("The answer is (B).", "B"),
        ("so the answer is C", "C"),
        ("The answer is C", "C"),
        ("Answer: (C)", "C"),
        ("Answer: D", "D"),
        ("**Answer:** A", "A"),
        ("Final Answer: C", "C"),
        ("the correct answer is **(C)**", "C"),
        ("The final answer is option E", "E"),
        ("ANSWER IS [F]", "F"),
        ("Answer: C. Mitochondria", "C"),
        ("The answer is: **C. Mitochondria**", "C"),
        ("**Answer:**\n\nC", "C"),
        ("The answer is $C$", "C"),
        ("The answer is \\(\\text{C}\\)", "C"),
        ("Answer：C", "C"),
        ("Answer: I", "I"),  # a letter at the end is one, even "I"
        ("answer: (A) because it is smaller", "A"),  # a bracketed "A" is no article
        ("I think the answer is A. No wait, the answer is (C).", "C"),
        # rule 1: the last box
        ("$\\boxed{B}$", "B"),
        ("\\boxed{C}", "C"),
        ("\\boxed{(C)}", "C"),
        ("\\boxed{\\text{C}}", "C"),
        ("\\boxed{C. 42 kg}", "C"),
        ("\\boxed{(C) 42 kg}", "C"),
        ("\\boxed{C) 42 kg}", "C"),
        ("\\boxed{\\text{C. 42 kg}}", "C"),
        ("\\boxed{\\textbf{(C)} 42\\text{ kg}}", "C"),
        ("\\boxed{(D)} even though the answer is A", "D"),  # the box comes first
        ("Answer: A\n\\boxed{B. 42 kg}", "B"),
        ("\\boxed{A} at first; finally \\boxed{C}", "C"),
        ("\\boxed{42}. The answer is (A)", "A"),  # a box without a letter gives way
        # rule 3: the last line
        ("B", "B"),
        (" (C) ", "C"),
        ("D.", "D"),
        ("**A**", "A"),
        ("__A__", "A"),
        ("I", "I"),
        ("C. Mitochondria", "C"),
        ("(C) Mitochondria", "C"),
        ("C) Mitochondria", "C"),
        ("[C] Mitochondria", "C"),
        ("**C.** Mitochondria", "C"),
        ("**(C)** Mitochondria", "C"),
        ("**C. Mitochondria**", "C"),
        ("A is wrong: it makes no ATP. B neither.\n\n**C.** Mitochondria\n", "C"),
        ("Options: A, B, C.\r\nC) Mitochondria", "C"),
        ("The answer is A.\n\nC. Mitochondria", "A"),  # a phrase comes before the last line
        # none
        ("the answer is Bob", None),  # not a lone letter
        ("Answer is Bob", None),
        ("answer: I think it is the second", None),  # the word "I"
        ("The answer is A cat", None),
        ("the answer is b", None),  # lower case is never read
        ("answer is (K)", None),  # not one of the letters
        ("\\boxed{K}", None),
        ("K. Mitochondria", None),
        ("a", None),
        ("i", None),
        ("I think", None),
        ("A cat sat.", None),
        ("The patient lacks one vitamin.\nVitamin C deficiency", None),
        ("I like B and C", None),
        ("C. Mitochondria\nThat settles it.", None),  # only the last line is read
        ("Q: which organelle?\nA: the mitochondria", None),  # "A:" opens an answer, not an option
        ("C.5 kg", None),
        ("(C)Mitochondria", None),
        ("B.Sc. in biology", None),
        ("\\boxed{C 42 kg}", None),  # a letter then text needs its mark
        ("\\boxed{x = 3}", None),
        ("", None),
        (" \n\t", None),
    ],
)
def test_extract_choice(text, expected):
    assert extract_choice(text) == expected


def test_extract_choice_with_fewer_letters():
    assert extract_choice("The answer is E.", letters="ABCD") is None
    assert extract_choice("The answer is E. No, the answer is B.", letters="ABCD") == "B"
    assert extract_choice("answer: E", letters="ABCD") is None
    assert extract_choice("\\boxed{E. 42 kg}\nAnswer: B", letters="ABCD") == "B"
    assert extract_choice("E. Mitochondria", letters="ABCD") is None


@pytest.mark.parametrize("letters", ["", "abc", "AAB", "A1", 3])
def test_extract_choice_rejects_bad_letters(letters):
    with pytest.raises(ValueError, match="letters"):
        extract_choice("B", letters=letters)


def test_extract_choice_on_huge_adversarial_inputs():
    assert extract_choice("answer" + " " * 200_000 + "x") is None
    assert extract_choice("answer" + " " * 100_000 + "option" + " " * 100_000) is None
    assert extract_choice("answer is\t" * 20_000 + "A") == "A"
    assert extract_choice("answer:" + "*" * 200_000) is None
    assert extract_choice("answer" + "\\text{" * 30_000) is None
    assert extract_choice("(" * 200_000) is None
    assert extract_choice("**" * 100_000 + "x") is None
    assert extract_choice(" " * 200_000 + "x") is None
    assert extract_choice("\\text {" * 30_000 + "x") is None
    assert extract_choice("A." * 100_000) is None
    assert extract_choice("\\boxed{" + " " * 200_000 + "x}") is None
    assert extract_choice("_" * 200_000 + "C") == "C"


# The options' letters, any of A-Z in any order; distinct, so that an earlier answer (letters[0]) and a later one
# (letters[1]) differ.
LETTER_LISTS = st.lists(st.sampled_from(string.ascii_uppercase), min_size=2, max_size=10, unique=True)
_ANSWER_WORD_OR_BOX = re.compile(r"(?i)answer|\\")
# Text with no "answer" and no backslash, so no phrase and no box; a line of it may name a letter (rule 3).
PROSE = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40).filter(
    lambda s: not _ANSWER_WORD_OR_BOX.search(s)
)
# One line of an option's text: no line break (str.splitlines' separators are in Cc, Zl, Zp), brace, backslash
# or "answer".
OPTION_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters="{}"), max_size=20
).filter(lambda s: not _ANSWER_WORD_OR_BOX.search(s))
# By rule: the last line (0), a phrase (1), a box (2); <L> is the letter, <O> the option's text.
ANSWER_TEMPLATES = {
    0: ["<L>", "(<L>)", "**<L>**", "<L>. <O>", "(<L>) <O>", "<L>) <O>", "[<L>] <O>", "**<L>.** <O>", "**(<L>)** <O>"],
    1: ["Answer: (<L>)", "The answer is <L>", "the correct answer is **(<L>)**", "Final Answer: <L>",
        "Answer: <L>. <O>", "**Answer:** <L>", "The answer is $<L>$", "answer is option (<L>) <O>"],
    2: ["\\boxed{<L>}", "\\boxed{(<L>)}", "$\\boxed{\\text{<L>}}$", "\\boxed{<L>. <O>}", "\\boxed{(<L>) <O>}",
        "\\boxed{\\text{<L>) <O>}}"],
}
RANKED_TEMPLATES = [(rank, template) for rank, templates in ANSWER_TEMPLATES.items() for template in templates]


def _answer(template: str, letter: str, option: str) -> str:
    return template.replace("<L>", letter).replace("<O>", option)


@given(letters=LETTER_LISTS, template=st.sampled_from(ANSWER_TEMPLATES[1] + ANSWER_TEMPLATES[2]), option=OPTION_TEXT,
       before=PROSE, after=PROSE)
def test_extract_choice_reads_a_box_or_phrase_amid_prose(letters, template, option, before, after):
    text = before + "\n" + _answer(template, letters[0], option) + "\n" + after
    assert extract_choice(text, "".join(letters)) == letters[0]


@given(letters=LETTER_LISTS, template=st.sampled_from(ANSWER_TEMPLATES[0]), option=OPTION_TEXT, before=PROSE)
def test_extract_choice_reads_a_last_line_after_prose(letters, template, option, before):
    text = before + "\n" + _answer(template, letters[0], option) + "\n"
    assert extract_choice(text, "".join(letters)) == letters[0]


@given(
    letters=LETTER_LISTS,
    earlier_later=st.sampled_from(RANKED_TEMPLATES).flatmap(
        lambda later: st.tuples(st.sampled_from([t for t in RANKED_TEMPLATES if t[0] <= later[0]]), st.just(later))
    ),
    options=st.tuples(OPTION_TEXT, OPTION_TEXT),
    prose=st.tuples(PROSE, PROSE),
)
def test_a_later_answer_overrides_an_earlier_one_of_no_higher_rule(letters, earlier_later, options, prose):
    (_, earlier), (_, later) = earlier_later
    earlier_answer, later_answer = _answer(earlier, letters[0], options[0]), _answer(later, letters[1], options[1])
    text = "\n".join([prose[0], earlier_answer, prose[1], later_answer])
    assert extract_choice(text, "".join(letters)) == letters[1]


CHOICE_PIECES = ["answer", " is ", ":", "(", ")", "B", "b", "**", "\\boxed{", "}", "\\text{", "option", "K", " ", ".", "\n",
                 "A", "I", " kg", "$", "[", "]", "_", "\\fbox{", "\\textbf{", "\t", "a", "Final "]


@settings(max_examples=1000)
@given(text=st.text(max_size=200) | st.lists(st.sampled_from(CHOICE_PIECES), max_size=16).map("".join), letters=LETTER_LISTS)
def test_extract_choice_never_raises(text, letters):
    assert extract_choice(text, "".join(letters)) in (None, *letters)
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
        ("Let me think.\n\n**C.** Mitochondria", "C", OutcomeVerdict(1.0, "C", "correct")),
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


# ------------------------------------------------------------------ math_answer, final_answer_text


@pytest.mark.parametrize("response, answer", [
    ("so \\boxed{12}", "12"),
    ("Answer: 12", "12"),
    ("step...\nAnswer: 7\nthen\n**Answer:** 12", "12"),  # the last line wins; markdown emphasis allowed
    ("Answer: 7\n\\boxed{12}", "12"),  # a box first
    ("The answer: is unclear", None),  # mid-line: not an answer line
    ("Answer:   \n", None),
    ("no answer at all", None),
])
def test_math_answer_reads_the_last_box_or_answer_line(response, answer):
    assert math_answer(response) == answer


@given(st.text(alphabet=st.sampled_from("Answer: \n\\boxed{}*x1"), max_size=60) | st.text(max_size=100))
def test_math_answer_and_final_answer_never_raise_and_return_part_of_the_response(response):
    answer = math_answer(response)
    assert answer is None or (answer and answer in response)
    final = final_answer_text(response)
    assert isinstance(final, str) and final in response
