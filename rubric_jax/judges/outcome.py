"""Outcome verification: the final answer of a response against the ground truth (SRaR's r_acc, RLCER's and
EvoRubric's outcome reward z, RGR-GRPO's answer check).

- `extract_boxed`: the content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced. Only the braced form
  counts: SRaR's format reward looks for `\\boxed{` (REFERENCE.md section 2), and `\\boxed 5` is not extracted.
- `answers_equivalent`: math-verify's parse and verify (sets, intervals, fractions vs decimals, reordered sums,
  equations `x = 3` vs `3`) behind a wall-clock limit; it never raises on any strings.
- `math_answer`: the last box, or else the last "Answer: ..." line (DAPO-Math's form); `final_answer_text`: the
  last box, or else the last non-empty line (an exact-match answer).
- `extract_choice`: a multiple-choice letter, from a box, an "answer is" phrase or the last line.
- `OutcomeVerifier`: a response and a ground truth to a 0 / 1 score and a reason.

Time limits. math-verify's own limits use SIGALRM, which exists only in the main thread (elsewhere it raises
ValueError); no thread can be stopped, nor a signal handled, inside a long C-level computation; and a policy can
write `9^{9^{9^{9}}}`, which sympy works on for minutes. So every equivalence check runs in one persistent child
Python process (started on first use, shared by all threads of this process behind a lock, restarted after a
fork): the child bounds each check with a real-time alarm of `timeout_s` (a BaseException, so that the
`except Exception` handlers of math-verify and sympy do not swallow it), and the parent kills and replaces a
child that has not answered `timeout_s` + 1 s after the request. This module runs as that child's script, so it
imports nothing from rubric_jax, and math-verify only in the child. POSIX only (select on pipes, setitimer).
"""

import atexit
import dataclasses
import json
import logging
import math
import os
import re
import select
import signal
import subprocess
import sys
import threading
from typing import Optional, Sequence

logger = logging.getLogger(__name__)

# Longer answers are judged not equivalent without parsing (a final answer of 1000 characters is not one).
MAX_ANSWER_CHARS = 1000
DEFAULT_TIMEOUT_S = 5.0
# Letters of up to 10 options (MMLU-Pro's A-J); GPQA and MMLU use A-D.
DEFAULT_LETTERS = "ABCDEFGHIJ"
# How an equivalence check ended (`equivalence_status`); only EQUIVALENT scores.
EQUIVALENT, NOT_EQUIVALENT, EMPTY, TOO_LONG, TIMEOUT, ERROR = (
    "equivalent", "not_equivalent", "empty", "too_long", "timeout", "error",
)

ANSWER_LINE = re.compile(r"(?im)^[ \t*]*answer[ \t*]*:[ \t*]*([^\n]+)$")
_BOX_OPENING = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_OR_ESCAPE = re.compile(r"\\.|[{}]", re.DOTALL)
# What may stand between "answer (is)" and its letter: each piece starts with its own character, so a failed
# match backtracks through a run once (adjacent `\s*`s would be quadratic or worse on a run of white space).
_PHRASE_GAP = r"(?:[\s:：*_$(\[{]|\\(?:text|textbf|mathrm|mathbf)\{|\\[(\[])*"
_CHOICE_PHRASE = re.compile(
    r"(?i:\banswer)(?:\s+(?i:is))?" + _PHRASE_GAP + r"(?:(?i:option|choice)" + _PHRASE_GAP + r")?"
    # "A" and "I" before a lower-case word are English words: "answer: I think it is B".
    r"(?![AI][ \t]+[a-z])([A-Z])(?![A-Za-z0-9])"
)
_LETTER_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\b|[\s(){}\[\].:*_$]")
# An option's letter before its text; the colon is left out, as "A:" also opens an answer ("Q: ... A: ...").
_OPTION_MARKER = re.compile(
    r"(?:[\s*_$]|\\(?:text|textbf|mathrm|mathbf)\s*\{)*(?:\(([A-Z])\)|\[([A-Z])\]|([A-Z])[.)])(?![^\s*_$}])"
)
_GRACE_S = 1.0
_STARTUP_TIMEOUT_S = 120.0


def extract_boxed(text: str) -> Optional[str]:
    """The content, stripped, of the last `\\boxed{` or `\\fbox{` (space allowed before the brace) up to its
    matching `}`; None when there is no box or the last one is never closed (a truncated final answer is not
    replaced by an earlier box). Escaped braces `\\{`, `\\}` do not count; a box nested in another is the last."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    opening = None
    for opening in _BOX_OPENING.finditer(text):
        pass
    if opening is None:
        return None
    depth = 1
    for token in _BRACE_OR_ESCAPE.finditer(text, opening.end()):
        if token.group() == "{":
            depth += 1
        elif token.group() == "}":
            depth -= 1
            if depth == 0:
                return text[opening.end() : token.start()].strip()
    return None


def math_answer(response: str) -> Optional[str]:
    """A math response's final answer: its last box, or else its last "Answer: ..." line (the form DAPO-Math's
    own prompt asks for, which verl's math_dapo reads); None when it has neither."""
    boxed = extract_boxed(response)
    if boxed is not None:
        return boxed
    lines = ANSWER_LINE.findall(response)
    return lines[-1].strip() if lines and lines[-1].strip() else None


def final_answer_text(response: str) -> str:
    """The last box's content, or else the last non-empty line (answer_kind exact)."""
    boxed = extract_boxed(response)
    if boxed is not None:
        return boxed
    lines = [line for line in response.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _check_letters(letters: str) -> None:
    if not isinstance(letters, str) or not letters or len(set(letters)) != len(letters):
        raise ValueError(f"letters must be a non-empty str of distinct letters A-Z, got {letters!r}")
    if not all("A" <= c <= "Z" for c in letters):
        raise ValueError(f"letters must be upper-case A-Z, got {letters!r}")


def _lone_letter(text: str, letters: str) -> Optional[str]:
    """`text` without white space, brackets, `.:*_$` and \\text-like wrappers, if that is one of `letters`."""
    rest = _LETTER_WRAPPERS.sub("", text)
    return rest if len(rest) == 1 and rest in letters else None


def _named_letter(text: str, letters: str) -> Optional[str]:
    """The letter of `letters` that `text` (a box's content, a line) names: the whole of it a lone letter
    (`_lone_letter`), or its start an option's letter before the option's text: "(B)", "[B]", "B." or "B)" after
    white space, emphasis, `$` or a \\text-like opening, then white space, a closing `*_$}` or the end ("B.5" and
    "B.Sc." are none)."""
    marker = _OPTION_MARKER.match(text)
    return _lone_letter(text if marker is None else marker.group(), letters)


def _last_line(text: str) -> str:
    """The last non-blank line of `text` ("" when all of it is blank)."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def extract_choice(text: str, letters: str = DEFAULT_LETTERS) -> Optional[str]:
    """A multiple-choice letter (upper case, one of `letters`), from the first of these that gives one:
    1. the last box (`extract_boxed`), if it names a letter (`_named_letter`): `\\boxed{B}`, `\\boxed{(B)}`,
       `\\boxed{\\text{B}}`, or the letter then the option's text: `\\boxed{B. 42 kg}`, `\\boxed{(B) 42 kg}`;
    2. the last "answer X" / "answer is X" / "answer: X" phrase (case-insensitive words; white space, `:`, emphasis,
       `$`, brackets, `\\(`, \\text-like openings and the word "option" or "choice" may come between) whose letter
       is one of `letters`, is not followed by a letter or digit ("answer is Bob" is none; "answer: B. Mitochondria"
       is B) and is not the word "A" or "I" before a lower-case word ("answer: I think" is none);
    3. the last non-blank line, if it names a letter as in 1: "B", "(B)", "**B**", "B. Mitochondria",
       "(B) Mitochondria", "B) Mitochondria", "**B.** Mitochondria" ("A cat sat." and "Vitamin C" are none).
    None otherwise (lower-case letters are never read: "a" is an article). So a later answer replaces an earlier
    one read by the same rule or one further down this list."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    _check_letters(letters)
    boxed = extract_boxed(text)
    boxed_letter = None if boxed is None else _named_letter(boxed, letters)
    if boxed_letter is not None:
        return boxed_letter
    phrased = [m.group(1) for m in _CHOICE_PHRASE.finditer(text) if m.group(1) in letters]
    return phrased[-1] if phrased else _named_letter(_last_line(text), letters)


# ---------------------------------------------------------------- equivalence, in the child process


class _Timeout(BaseException):
    """The alarm of `_status_within`; not an Exception, so no `except Exception` on the way catches it."""


def _status_unguarded(pred: str, gold: str) -> str:
    """math-verify on both answers, each parsed as the content of a box; its own time limits are off."""
    from math_verify import parse, verify

    gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=None)
    pred_parsed = parse("\\boxed{" + pred + "}", parsing_timeout=None)
    return EQUIVALENT if verify(gold_parsed, pred_parsed, timeout_seconds=None) else NOT_EQUIVALENT


def _status_within(pred: str, gold: str, timeout_s: float) -> str:
    """`_status_unguarded` under a real-time alarm of timeout_s (main thread of the child only)."""

    def on_alarm(signum, frame):
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            return _status_unguarded(pred, gold)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Timeout:  # also when the alarm lands between the return and the disarming
        return TIMEOUT
    except Exception as error:  # math-verify should not raise; if it does, no answer is equivalent
        logger.debug("math-verify raised %s", type(error).__name__)
        return ERROR
    finally:
        signal.signal(signal.SIGALRM, previous)


def _serve() -> None:
    """The child's loop: one JSON request {"pred", "gold", "timeout_s"} per stdin line, one {"status"} line per
    reply on stdout (other output goes to stderr); exits when stdin closes. Ignores SIGINT: it lives and dies
    with its parent's pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # timeouts are expected; no echo of the input
    replies = os.fdopen(os.dup(1), "w", encoding="ascii")
    os.dup2(2, 1)  # anything else written to stdout, from Python or C, goes to stderr
    sys.stdout = sys.stderr
    _status_unguarded("0", "1")  # imports math-verify and loads its parser before "ready", outside any time limit

    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            status = _status_within(request["pred"], request["gold"], request["timeout_s"])
        except (Exception, _Timeout):
            status = ERROR
        replies.write(json.dumps({"status": status}) + "\n")
        replies.flush()


class _ChildGrader:
    """The parent's handle on the child process (module docstring): one request at a time, behind a lock."""

    def __init__(self):
        self._forget()

    def _forget(self) -> None:
        """Drop the handle without touching the child: in a forked copy of the parent, whose lock may be held
        by a thread that was not copied and whose child belongs to the original."""
        self._lock = threading.Lock()
        self._process: Optional[subprocess.Popen] = None

    def _reply(self, timeout_s: float) -> Optional[dict]:
        """The child's next reply line, or None when there is none within timeout_s (or it is malformed)."""
        if not select.select([self._process.stdout], [], [], timeout_s)[0]:
            return None
        line = self._process.stdout.readline()
        try:
            reply = json.loads(line)
        except ValueError:
            return None
        return reply if isinstance(reply, dict) else None

    def _start(self) -> bool:
        code = "import runpy, sys; del sys.path[0]; runpy.run_path(sys.argv[1], run_name='__main__')"
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", code, os.path.abspath(__file__)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                encoding="ascii",
                errors="replace",
            )
        except OSError as error:
            logger.error("cannot start the outcome verifier's math-verify process: %s", error)
            return False
        if self._reply(_STARTUP_TIMEOUT_S) != {"ready": True}:
            logger.error("the outcome verifier's math-verify process did not start")
            self._stop()
            return False
        return True

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            for stream in (self._process.stdin, self._process.stdout):
                stream.close()
        self._process = None

    def close(self) -> None:
        with self._lock:
            self._stop()

    def status(self, pred: str, gold: str, timeout_s: float) -> str:
        with self._lock:
            if self._process is not None and self._process.poll() is not None:
                self._stop()  # it died since the last request
            if self._process is None and not self._start():
                return ERROR
            try:
                self._process.stdin.write(json.dumps({"pred": pred, "gold": gold, "timeout_s": timeout_s}) + "\n")
                self._process.stdin.flush()
                reply = self._reply(timeout_s + _GRACE_S)
            except (OSError, ValueError):  # the child died
                reply = None
            if reply is None or reply.get("status") not in (EQUIVALENT, NOT_EQUIVALENT, TIMEOUT, ERROR):
                self._stop()  # hung past its own alarm, or dead: a fresh child next time
                return TIMEOUT if reply is None else ERROR
            return reply["status"]


_GRADER = _ChildGrader()
atexit.register(_GRADER.close)
os.register_at_fork(after_in_child=_GRADER._forget)


def _check_limits(timeout_s: float, max_chars: int) -> None:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
        raise ValueError(f"timeout_s must be a positive finite number, got {timeout_s!r}")
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise ValueError(f"max_chars must be a positive int, got {max_chars!r}")


def equivalence_status(
    pred: str, gold: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_chars: int = MAX_ANSWER_CHARS
) -> str:
    """How comparing a predicted answer with the gold one ends: EQUIVALENT, NOT_EQUIVALENT, EMPTY (either is
    blank), TOO_LONG (either exceeds max_chars), TIMEOUT (past timeout_s) or ERROR (math-verify failed).
    Identical strings (stripped) are equivalent without parsing. Never raises on str answers; ValueError for
    non-str answers or a bad timeout_s / max_chars."""
    if not isinstance(pred, str) or not isinstance(gold, str):
        raise ValueError(f"pred and gold must be str, got {type(pred).__name__}, {type(gold).__name__}")
    _check_limits(timeout_s, max_chars)
    pred, gold = pred.strip(), gold.strip()
    if not pred or not gold:
        return EMPTY
    if len(pred) > max_chars or len(gold) > max_chars:
        return TOO_LONG
    if pred == gold:
        return EQUIVALENT
    return _GRADER.status(pred, gold, float(timeout_s))


def answers_equivalent(
    pred: str, gold: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_chars: int = MAX_ANSWER_CHARS
) -> bool:
    """Whether the predicted answer equals the gold one by math-verify (`equivalence_status` is EQUIVALENT).

    Both are answer strings, not whole responses (`extract_boxed` first); math-verify reads each as the content of
    a `\\boxed{}` and compares gold to prediction (its comparison is not symmetric: `x = 3` as the prediction
    matches the gold 3). Text answers are read as products of symbols by math-verify; compare them otherwise."""
    return equivalence_status(pred, gold, timeout_s=timeout_s, max_chars=max_chars) == EQUIVALENT


# ---------------------------------------------------------------- the verifier


@dataclasses.dataclass(frozen=True)
class OutcomeVerdict:
    """A response's outcome: score 1.0 (correct) or 0.0, the extracted answer (None when none was found) and the
    reason: "correct", "no_answer", or how the comparison failed (`equivalence_status`: "not_equivalent",
    "empty", "too_long", "timeout", "error"; "not_equivalent" for a wrong letter)."""

    score: float
    answer: Optional[str]
    reason: str


@dataclasses.dataclass(frozen=True)
class OutcomeVerifier:
    """Scores responses against ground truths.

    kind "math": the response's last box (`extract_boxed`) against the gold answer by `equivalence_status`; a
    gold that holds a box is reduced to its last box's content (a full reference solution may be given).
    kind "choice": `extract_choice(response, letters)` against the gold letter, itself read by extract_choice
    ("B", "(B)", ...; ValueError when the gold is no letter of `letters`).
    """

    kind: str = "math"
    letters: str = DEFAULT_LETTERS
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_chars: int = MAX_ANSWER_CHARS

    def __post_init__(self):
        if self.kind not in ("math", "choice"):
            raise ValueError(f"kind must be 'math' or 'choice', got {self.kind!r}")
        _check_letters(self.letters)
        _check_limits(self.timeout_s, self.max_chars)

    def verify(self, response: str, gold: str) -> OutcomeVerdict:
        if not isinstance(response, str) or not isinstance(gold, str):
            raise ValueError(f"response and gold must be str, got {type(response).__name__}, {type(gold).__name__}")
        if self.kind == "choice":
            gold_letter = extract_choice(gold, self.letters)
            if gold_letter is None:
                raise ValueError(f"gold {gold[:50]!r} is not one of the letters {self.letters!r}")
            answer = extract_choice(response, self.letters)
            status = None if answer is None else (EQUIVALENT if answer == gold_letter else NOT_EQUIVALENT)
        else:
            answer = extract_boxed(response)
            gold_answer = extract_boxed(gold)
            gold_answer = gold if gold_answer is None else gold_answer
            status = None if answer is None else equivalence_status(
                answer, gold_answer, timeout_s=self.timeout_s, max_chars=self.max_chars
            )
        if status is None:
            return OutcomeVerdict(score=0.0, answer=None, reason="no_answer")
        correct = status == EQUIVALENT
        return OutcomeVerdict(score=float(correct), answer=answer, reason="correct" if correct else status)

    def verify_batch(self, responses: Sequence[str], golds: Sequence[str]) -> list[OutcomeVerdict]:
        if len(responses) != len(golds):
            raise ValueError(f"responses and golds differ in length: {len(responses)} vs {len(golds)}")
        return [self.verify(response, gold) for response, gold in zip(responses, golds)]


if __name__ == "__main__":
    _serve()
