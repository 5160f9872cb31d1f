"""Parsers of every model output of the papers' prompts, into fixed-shape arrays or a Rubric, with a failure flag.

A parser never raises on a str (a non-str argument, or a bad caller argument such as num_items < 0, is a
programmer error: ValueError). Its result says `ok`; when not ok, `reason` is one of REASONS, `detail` says more,
and the values are the parser's documented failure fill. Every number read is checked: finite, and within the
bounds the parser's docstring states; a violation is a failure, never silently clipped or remapped.

What the JSON parsers accept, in order:
- text after the last "</think>" (reasoning models); a "<think>" opening the output without its closing tag is
  the failure "unterminated_think";
- the contents of ``` code fences, tried first, then the whole text;
- in each, the first position (of at most 32) where a JSON value of the expected container type (object or
  array) decodes; prose before and after it is ignored;
- `//` line comments outside strings (the papers' own format examples contain them) and Python's `True` /
  `False` outside strings (RLCER's verifier prompt says "Output True") are read as JSON;
- not accepted: single-quoted strings, trailing commas, NaN / Infinity or numbers overflowing float64 (failure
  "non_finite"), integer literals of more than 18 digits ("out_of_bounds"), duplicate keys in an object
  ("duplicate_key"); these fail the parse where they are met while decoding. Unknown keys are ignored.
Outputs longer than MAX_OUTPUT_CHARS are the failure "too_long".

Failure policy: a failed parse is counted by reason in a FailureCounter; what the rollout's reward becomes is the
FailurePolicy the algorithm applies (zero reward, or excluded from its group and the loss).
"""

import collections
import dataclasses
import enum
import json
import math
import re
import types
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from rubric_jax.rubrics.schema import (
    EVORUBRIC_POINTS_RANGE,
    RLCER_POINTS_RANGE,
    Criterion,
    ItemKind,
    Rubric,
)

MAX_OUTPUT_CHARS = 1_000_000
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"  # a reasoning model's thinking block (Qwen3, DeepSeek-R1)
_MAX_JSON_STARTS = 32
_MAX_INT_DIGITS = 18  # longer integer literals are out of every bound here, and of float64's exact range
_INT32_MAX = 2**31 - 1
_WEIGHT_RTOL = 1e-6

# Failure reasons. Every failed result carries exactly one of them.
REASONS = (
    "too_long",  # the output exceeds MAX_OUTPUT_CHARS
    "unterminated_think",  # a <think> block never closed: no answer after it
    "empty",  # nothing but white space (after the think block)
    "no_json",  # no decodable JSON value of the expected type
    "duplicate_key",  # a JSON object repeats a key
    "schema",  # a field is missing or of the wrong type, or a line is malformed
    "non_finite",  # NaN or an infinity where a number is read
    "not_integer",  # a number that must be an integer is not
    "out_of_bounds",  # a number outside the parser's documented bounds
    "wrong_length",  # a list or mapping of per-item values has the wrong number of entries
    "bad_id",  # an item id is out of range, repeated, or not the expected key
    "unrecognized",  # a verdict that is none of the allowed values
    "no_items",  # a rubric output with no item
    "too_many_items",  # a rubric output with more items than max_items
    "missing_mandatory",  # SRaR's mandatory SUGGEST / ANSWER items are missing
    "inconsistent_scores",  # RLCER's declared maximum / minimum / current scores disagree with the rubric
    "internal_error",  # a bug in a parser (tests assert it never happens)
)


class FailurePolicy(enum.Enum):
    """What a rollout whose judge or rubric output failed to parse gets (applied by the algorithm).

    ZERO_REWARD: it stays in its group with reward 0 (rubric-grounded paper section 5.4: "Invalid outputs are
    assigned conservative zero reward"; RGR-GRPO: a parse failure scores 0; SRaR: every item "not satisfied").
    EXCLUDE: it is masked out of its group's statistics and of the loss (REFERENCE.md section 4, item 2).
    """

    ZERO_REWARD = "zero_reward"
    EXCLUDE = "exclude"


def _frozen_arrays(values: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    for array in values.values():
        array.setflags(write=False)
    return types.MappingProxyType(dict(values))


@dataclasses.dataclass(frozen=True)
class ParseResult:
    """Values parsed from one model output, in read-only numpy arrays of the shapes the caller fixed.

    ok: the output parsed and every value passed its checks. reason: "" when ok, else one of REASONS;
    detail: a human-readable explanation ("" when ok). When not ok the values are the parser's failure fill.
    """

    values: Mapping[str, np.ndarray]
    ok: bool
    reason: str = ""
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class RubricParse:
    """A rubric parsed from a generator's output: `rubric` (None when not ok), ok / reason / detail as
    ParseResult, and `declared`: scores the output declares about itself (RLCER's maximum_score, minimum_score,
    current_score, when present and finite), else empty."""

    rubric: Optional[Rubric]
    ok: bool
    reason: str = ""
    detail: str = ""
    declared: Mapping[str, float] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))


@dataclasses.dataclass
class FailureCounter:
    """Parse outcomes counted by failure reason, under the failure policy the run applies. Mutable, for metrics."""

    policy: FailurePolicy = FailurePolicy.ZERO_REWARD
    parsed: int = 0
    by_reason: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def record(self, result: Union[ParseResult, RubricParse]) -> bool:
        """Count one result; returns result.ok."""
        if result.ok:
            self.parsed += 1
        else:
            self.record_failure(result.reason)
        return result.ok

    def record_failure(self, reason: str) -> None:
        """Count one output that failed for `reason` before any parser saw it (e.g. its request failed)."""
        self.parsed += 1
        self.by_reason[reason] += 1

    @property
    def failed(self) -> int:
        return sum(self.by_reason.values())

    def metrics(self, prefix: str = "parse") -> dict[str, float]:
        """{prefix}/parsed, /failed, /failure_rate, /<policy> (the rollouts the policy applied to), /failed/<reason>."""
        out = {
            f"{prefix}/parsed": float(self.parsed),
            f"{prefix}/failed": float(self.failed),
            f"{prefix}/failure_rate": self.failed / self.parsed if self.parsed else 0.0,
            f"{prefix}/{self.policy.value}": float(self.failed),
        }
        out.update({f"{prefix}/failed/{reason}": float(n) for reason, n in sorted(self.by_reason.items())})
        return out


# ---------------------------------------------------------------- shared machinery


class _Invalid(Exception):
    """Raised inside a parser body: the output is invalid for `reason` (one of REASONS)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(reason, detail)
        self.reason, self.detail = reason, detail


def _guard(body: Callable[[str], Any], text: str, fail: Callable[[str, str], Any]) -> Any:
    """Run a parser body on the answer part of `text`; any invalidity (or bug) becomes fail(reason, detail)."""
    if not isinstance(text, str):
        raise ValueError(f"model output must be a str, got {type(text).__name__}")
    try:
        return body(_answer_text(text))
    except _Invalid as invalid:
        return fail(invalid.reason, invalid.detail)
    except Exception as error:  # noqa: BLE001 -- a parser bug must not stop a training run; it is counted
        return fail("internal_error", f"{type(error).__name__}: {error}"[:300])


def answer_start(text: str) -> Optional[int]:
    """Where a reasoning model's answer starts in `text`: after the last "</think>"; 0 when there is none (the
    whole text is the answer); None when a "<think>" opens the text and never closes (it has no answer: cut off
    while thinking). The reading every parser here applies before it looks for its JSON."""
    close = text.rfind(THINK_CLOSE)
    if close >= 0:
        return close + len(THINK_CLOSE)
    return None if text.lstrip().startswith(THINK_OPEN) else 0


def thinking_stripped(text: str) -> str:
    """A reasoning model's answer: `text` from `answer_start`, leading white space dropped; "" for an output cut
    off while thinking (it has no answer)."""
    start = answer_start(text)
    return "" if start is None else text[start:].lstrip()


def _answer_text(text: str) -> str:
    if len(text) > MAX_OUTPUT_CHARS:
        raise _Invalid("too_long", f"{len(text)} characters > {MAX_OUTPUT_CHARS}")
    start = answer_start(text)
    if start is None:
        raise _Invalid("unterminated_think", "the output opens <think> and never closes it")
    text = text[start:]
    if not text.strip():
        raise _Invalid("empty", "the output is blank")
    return text


_CODE_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.S)
_JSONISH = re.compile(r'("(?:[^"\\\n]|\\.)*")|(//[^\n]*)|\b(True|False)\b')


def _jsonish_to_json(text: str) -> str:
    """Drop `//` comments and lower-case Python booleans, outside JSON strings."""

    def replace(match: re.Match) -> str:
        if match.group(1) is not None:
            return match.group(1)
        if match.group(2) is not None:
            return ""
        return match.group(3).lower()

    return _JSONISH.sub(replace, text)


def _reject_constant(name: str):
    raise _Invalid("non_finite", f"JSON constant {name}")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _Invalid("non_finite", f"number {literal[:40]} overflows to {value}")
    return value


def _bounded_int(literal: str) -> int:
    digits = len(literal.lstrip("-"))
    if digits > _MAX_INT_DIGITS:
        raise _Invalid("out_of_bounds", f"integer literal of {digits} digits")
    return int(literal)


def _unique_pairs(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        duplicated = next(k for k in keys if keys.count(k) > 1)
        raise _Invalid("duplicate_key", f"key {duplicated[:40]!r} repeated")
    return dict(pairs)


_DECODER = json.JSONDecoder(
    object_pairs_hook=_unique_pairs,
    parse_float=_finite_float,
    parse_int=_bounded_int,
    parse_constant=_reject_constant,
)


def _find_json(text: str, container: type) -> Any:
    """The first JSON value of type `container` (dict or list) in the text (module docstring's rules)."""
    opener = "{" if container is dict else "["
    candidates = [m.group(1) for m in _CODE_FENCE.finditer(text)] + [text]
    for candidate in candidates:
        source = _jsonish_to_json(candidate)
        start = source.find(opener)
        for _ in range(_MAX_JSON_STARTS):
            if start < 0:
                break
            try:
                value, _end = _DECODER.raw_decode(source, start)
            except (ValueError, RecursionError):
                value = None
            if isinstance(value, container):
                return value
            start = source.find(opener, start + 1)
    raise _Invalid("no_json", f"no JSON {container.__name__} found")


def _field(obj: dict, key: str, where: str) -> Any:
    if key not in obj:
        raise _Invalid("schema", f"{where}: missing key {key!r}")
    return obj[key]


def _sized_field(obj: dict, key: str, container: type, length: int) -> Any:
    """obj[key], which must be a `container` (list or dict) of `length` entries, one per rubric item."""
    value = _field(obj, key, "output")
    if not isinstance(value, container):
        raise _Invalid("schema", f"output.{key}: expected a {'list' if container is list else 'JSON object'}")
    if len(value) != length:
        raise _Invalid("wrong_length", f"output.{key} has {len(value)} entries for {length} items")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Invalid("schema", f"{where}: expected a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise _Invalid("non_finite", f"{where}: {value}")
    return float(value)


def _integer(value: Any, where: str) -> int:
    number = _number(value, where)
    if number != int(number):
        raise _Invalid("not_integer", f"{where}: expected an integer, got {number}")
    return int(value) if isinstance(value, int) else int(number)


def _boolean(value: Any, where: str) -> bool:
    """A JSON boolean, or the number 0 or 1."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    raise _Invalid("schema", f"{where}: expected a boolean, got {str(value)[:40]!r}")


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Invalid("schema", f"{where}: expected a non-empty string")
    return value.strip()


def _check_count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _check_weights(weights: Sequence[float]) -> np.ndarray:
    w = np.asarray(weights, np.float64)
    if w.ndim != 1 or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"weights must be a 1-D sequence of finite non-negative numbers, got {weights!r}")
    return w


def _check_categories(categories: Sequence[str]) -> tuple:
    if isinstance(categories, str) or not all(isinstance(c, str) for c in categories):
        raise ValueError(f"categories must be a sequence of category names, got {categories!r}")
    return tuple(categories)


def _array_parser(fill: Mapping[str, Callable[[], np.ndarray]]):
    """(ok(values), fail(reason, detail)) builders of ParseResult, with `fill` giving the failure values."""

    def ok(values: Mapping[str, np.ndarray]) -> ParseResult:
        return ParseResult(values=_frozen_arrays(values), ok=True)

    def fail(reason: str, detail: str) -> ParseResult:
        return ParseResult(
            values=_frozen_arrays({k: make() for k, make in fill.items()}), ok=False, reason=reason, detail=detail
        )

    return ok, fail


def _rubric_fail(reason: str, detail: str) -> RubricParse:
    return RubricParse(rubric=None, ok=False, reason=reason, detail=detail)


def _build_rubric(criteria: list, max_items: int, *, points_range=None, format_: str) -> Rubric:
    """The parsed rubric. Parsers check every rule the schema enforces first, so a ValueError here is a parser
    bug, reported as "internal_error"."""
    if len(criteria) > max_items:
        raise _Invalid("too_many_items", f"{len(criteria)} items > max_items={max_items}")
    return Rubric(criteria=tuple(criteria), points_range=points_range, format=format_)


# ---------------------------------------------------------------- judge verdicts


def parse_srar_judge(text: str, *, num_items: int) -> ParseResult:
    """SRaR's step-attributed judge output (srar.txt, Appendix 7.4): a JSON array of
    {"id": int, "satisfied": bool, "step": int}, one entry per rubric item.

    Values: `satisfied_k` float32 [num_items] in {0, 1}; `step_k` int32 [num_items], the step as the judge wrote
    it (k >= 1 a `### Step k:`, 0 the whole solution, -1 none), also a step the response does not have: the
    authors' code keeps it (its own step group, placed on the whole response; `core.srar`).
    Checks: exactly num_items entries; ids are the 1-based item numbers of `prompts.srar_item_rows`, each once;
    satisfied a boolean (or 0 / 1); step an integer within int32 ("out_of_bounds" otherwise).
    Failure fill: every item unsatisfied, step -1 (SRaR's convention for a failed judge call).
    """
    k = _check_count(num_items, "num_items")
    ok, fail = _array_parser(
        {"satisfied_k": lambda: np.zeros(k, np.float32), "step_k": lambda: np.full(k, -1, np.int32)}
    )

    def body(answer: str) -> ParseResult:
        entries = _find_json(answer, list)
        if len(entries) != k:
            raise _Invalid("wrong_length", f"{len(entries)} entries for {k} items")
        satisfied, step = np.zeros(k, np.float32), np.full(k, -1, np.int32)
        seen = set()
        for i, entry in enumerate(entries):
            where = f"entry {i}"
            if not isinstance(entry, dict):
                raise _Invalid("schema", f"{where}: expected an object")
            item_id = _integer(_field(entry, "id", where), f"{where}.id")
            if not 1 <= item_id <= k or item_id in seen:
                raise _Invalid("bad_id", f"{where}: id {item_id} (ids are 1..{k}, each once)")
            seen.add(item_id)
            satisfied[item_id - 1] = _boolean(_field(entry, "satisfied", where), f"{where}.satisfied")
            s = _integer(_field(entry, "step", where), f"{where}.step")
            if not -_INT32_MAX - 1 <= s <= _INT32_MAX:
                raise _Invalid("out_of_bounds", f"{where}.step: {s} outside int32")
            step[item_id - 1] = s
        return ok({"satisfied_k": satisfied, "step_k": step})

    return _guard(body, text, fail)


def parse_rlcer_verifier(text: str, *, num_items: int) -> ParseResult:
    """RLCER's verifier output (rlcer.txt, Appendix B, Figure 10): {"judgement": [bool, ...], "final_score": n}.

    Values: `satisfied_k` float32 [num_items] in {0, 1}, in the rubric's order. Checks: "judgement" has exactly
    num_items booleans (or 0 / 1); "final_score" is present and a finite number. The verifier's own sum is not
    used (eq 6 recomputes the CoT reward from the judgements and points), so it is not compared with it.
    Failure fill: every criterion unsatisfied.
    """
    k = _check_count(num_items, "num_items")
    ok, fail = _array_parser({"satisfied_k": lambda: np.zeros(k, np.float32)})

    def body(answer: str) -> ParseResult:
        obj = _find_json(answer, dict)
        judgement = _sized_field(obj, "judgement", list, k)
        _number(_field(obj, "final_score", "output"), "output.final_score")
        satisfied = np.array([_boolean(v, f"judgement[{i}]") for i, v in enumerate(judgement)], np.float32)
        return ok({"satisfied_k": satisfied.reshape(k)})

    return _guard(body, text, fail)


def parse_rating(text: str) -> ParseResult:
    """RGR-GRPO's per-criterion judge output {"rating": 0|1} (REFERENCE.md section 2).

    Values: `rating` float32 scalar in {0, 1}. Checks: "rating" is the number 0 or 1 (0.0 / 1.0 accepted;
    booleans, strings and other numbers are failures). Failure fill: 0 (the paper's "parse failure scores 0").
    """
    ok, fail = _array_parser({"rating": lambda: np.zeros((), np.float32)})

    def body(answer: str) -> ParseResult:
        rating = _field(_find_json(answer, dict), "rating", "output")
        value = _integer(rating, "output.rating")
        if value not in (0, 1):
            raise _Invalid("out_of_bounds", f"output.rating: {value} is not 0 or 1")
        return ok({"rating": np.array(value, np.float32)})

    return _guard(body, text, fail)


def parse_healthbench_grade(text: str) -> ParseResult:
    """HealthBench's grader output (openai/simple-evals, healthbench_eval.py): a JSON object, possibly in a
    ```json fence, whose "criteria_met" is a JSON boolean ("explanation" optional).

    Values: `rating` float32 scalar, 1 when met. Checks: "criteria_met" is true or false; like simple-evals, a
    string "true" or a number does not count (simple-evals asks again; here the call is a counted failure, and
    the judge's retries are the transport's). Failure fill: 0."""
    ok, fail = _array_parser({"rating": lambda: np.zeros((), np.float32)})

    def body(answer: str) -> ParseResult:
        met = _field(_find_json(answer, dict), "criteria_met", "output")
        if not isinstance(met, bool):
            raise _Invalid("schema", f"output.criteria_met: expected true or false, got {str(met)[:40]!r}")
        return ok({"rating": np.array(float(met), np.float32)})

    return _guard(body, text, fail)


def parse_grounded_scores(text: str, *, weights: Sequence[float]) -> ParseResult:
    """The rubric-grounded judge output (rubric_grounded_rl.txt, Appendix D):
    {"scores": {"c_1": s_1, ...}, "total": <sum>, "max_total": <W>, "reasoning": "<brief>"}.

    `weights` [K] are the criteria's weights w_k (finite, >= 0; ValueError otherwise). Values: `awarded_k`
    float32 [K], the weight awarded s_k in [0, w_k] (eq 1); `satisfied_k` float32 [K] = s_k / w_k in [0, 1]
    (0 where w_k = 0). Checks: "scores" has exactly the keys c_1..c_K, each a finite number in [0, w_k];
    "total" and "max_total" are present and finite ("schema-conforming", section 5.4) but not compared with the
    scores, from which the reward is recomputed; "reasoning" is not read. A score above w_k by at most a relative
    1e-6 (float32 weights round 0.7 down to 0.69999999) is read as w_k. Failure fill: zeros (section 5.4's
    conservative zero reward).
    """
    w = _check_weights(weights)
    k = w.shape[0]
    ok, fail = _array_parser(
        {"awarded_k": lambda: np.zeros(k, np.float32), "satisfied_k": lambda: np.zeros(k, np.float32)}
    )
    ceiling = w * (1 + _WEIGHT_RTOL)

    def body(answer: str) -> ParseResult:
        obj = _find_json(answer, dict)
        scores = _sized_field(obj, "scores", dict, k)
        for key in ("total", "max_total"):
            _number(_field(obj, key, "output"), f"output.{key}")
        awarded = np.zeros(k, np.float64)
        for i in range(k):
            key = f"c_{i + 1}"
            if key not in scores:
                raise _Invalid("bad_id", f"output.scores: missing {key!r} (keys are c_1..c_{k})")
            s = _number(scores[key], f"scores.{key}")
            if not 0 <= s <= ceiling[i]:
                raise _Invalid("out_of_bounds", f"scores.{key}: {s} outside [0, {w[i]}]")
            awarded[i] = min(s, w[i])
        satisfied = np.divide(awarded, w, out=np.zeros(k), where=w > 0)
        return ok({"awarded_k": awarded.astype(np.float32), "satisfied_k": satisfied.astype(np.float32)})

    return _guard(body, text, fail)


def parse_meta_verdict(text: str, *, categories: Sequence[str]) -> ParseResult:
    """EvoRubric's meta-verifier output (evorubric.txt, Appendix C Tables 6-7): {"verdict": "VALID"} or
    {"verdict": "INVALID: <Category Name>"}.

    `categories`: the prompt's error categories (prompts.META_VERIFIER_CATEGORIES[domain]). Values: `valid` bool
    scalar; `category` int32 scalar, the index of the named category (case-insensitive match), -1 when VALID or
    when an INVALID verdict names no known category (still invalid). Checks: "verdict" is a string that is
    "VALID" or starts with "INVALID" (any case, surrounding space ignored). Failure fill: not valid, -1 (a rubric
    the meta-verifier did not clear is not used).
    """
    names = [c.casefold() for c in _check_categories(categories)]
    ok, fail = _array_parser({"valid": lambda: np.zeros((), bool), "category": lambda: np.full((), -1, np.int32)})

    def body(answer: str) -> ParseResult:
        verdict = _field(_find_json(answer, dict), "verdict", "output")
        if not isinstance(verdict, str):
            raise _Invalid("schema", "output.verdict: expected a string")
        words = verdict.strip()
        if words.upper() == "VALID":
            return ok({"valid": np.array(True), "category": np.array(-1, np.int32)})
        if not words.upper().startswith("INVALID"):
            raise _Invalid("unrecognized", f"verdict {words[:60]!r}")
        named = words[len("INVALID") :].strip().lstrip(":").strip().casefold()
        index = names.index(named) if named in names else -1
        return ok({"valid": np.array(False), "category": np.array(index, np.int32)})

    return _guard(body, text, fail)


_VERDICT_WORD = re.compile(r"\b(CORRECT|INCORRECT)\b")


def parse_step_correctness(text: str) -> ParseResult:
    """SRaR's step-level judge output (srar.txt, Appendix 7.5): "CORRECT" or "INCORRECT".

    Values: `correct` bool scalar. Accepted: the whole answer is one of the two words (any case, with quotes,
    asterisks or a final period around it), or the answer contains upper-case CORRECT / INCORRECT as whole
    words and all of them are the same word. Failure ("unrecognized" when neither or both appear): not correct.
    """
    ok, fail = _array_parser({"correct": lambda: np.zeros((), bool)})

    def body(answer: str) -> ParseResult:
        bare = answer.strip().strip("*\"'`“”.").strip().upper()
        if bare in ("CORRECT", "INCORRECT"):
            return ok({"correct": np.array(bare == "CORRECT")})
        words = set(_VERDICT_WORD.findall(answer))
        if len(words) != 1:
            raise _Invalid("unrecognized", "expected exactly one of CORRECT / INCORRECT")
        return ok({"correct": np.array(words == {"CORRECT"})})

    return _guard(body, text, fail)


def parse_rubric_validity(text: str) -> ParseResult:
    """SRaR's rubric validity judge output (srar.txt, Appendix 11): {"valid": bool, "reason": "..."}.

    Values: `valid` bool scalar. Checks: "valid" is a boolean (or 0 / 1); "reason" is not read. Failure fill:
    not valid."""
    ok, fail = _array_parser({"valid": lambda: np.zeros((), bool)})

    def body(answer: str) -> ParseResult:
        valid = _boolean(_field(_find_json(answer, dict), "valid", "output"), "output.valid")
        return ok({"valid": np.array(valid)})

    return _guard(body, text, fail)


# ---------------------------------------------------------------- generated rubrics


def _points_criterion(item: Any, where: str, max_points: int, *, category_required: bool) -> Criterion:
    """A generated {"category", "criterion", "points"} object (RLCER, EvoRubric): a CRITERION with nonzero
    integer points in [-max_points, max_points]; the category required, or optional (null = none)."""
    if not isinstance(item, dict):
        raise _Invalid("schema", f"{where}: expected an object")
    points = _integer(_field(item, "points", where), f"{where}.points")
    if not 1 <= abs(points) <= max_points:
        raise _Invalid(
            "out_of_bounds", f"{where}.points: {points} not a nonzero integer in [-{max_points}, {max_points}]"
        )
    if category_required or item.get("category") is not None:
        category = _text(_field(item, "category", where), f"{where}.category")
    else:
        category = None
    criterion = _text(_field(item, "criterion", where), f"{where}.criterion")
    return Criterion(text=criterion, weight=points, kind=ItemKind.CRITERION, category=category)


_RLCER_SCORE_KEYS = ("maximum_score", "minimum_score", "current_score")


def parse_rlcer_rubricator(text: str, *, max_items: int, check_scores: bool = True) -> RubricParse:
    """RLCER's rubricator output (rlcer.txt, Appendix B, Figure 9; a real one in Appendix C, Figure 11):
    {"question_domain": ..., "rubrics": [{"category", "criterion", "points"}, ...], "maximum_score",
    "minimum_score", "current_score"}.

    Rubric: format "rlcer", points_range (-5, 5), one CRITERION a rubric, with its category. Checks: "rubrics"
    is a list of 1..max_items objects with a non-empty "category" and "criterion" and integer "points" in
    [-5, -1] or [1, 5]; the three scores, when present, are finite numbers (they go to `declared`).
    check_scores (the format the prompt demands, and that the paper's format reward reinforces): the three
    scores are present, maximum_score = the sum of the positive points, minimum_score = the sum of the negative
    points, and minimum_score <= current_score < (maximum_score + minimum_score) / 2; else "schema" (missing)
    or "inconsistent_scores". Figure 11's output omits current_score: it parses with check_scores=False only.
    """
    limit = _check_count(max_items, "max_items")

    def body(answer: str) -> RubricParse:
        obj = _find_json(answer, dict)
        items = _field(obj, "rubrics", "output")
        if not isinstance(items, list):
            raise _Invalid("schema", "output.rubrics: expected a list")
        if not items:
            raise _Invalid("no_items", "output.rubrics is empty")
        declared = {key: _number(obj[key], f"output.{key}") for key in _RLCER_SCORE_KEYS if key in obj}
        criteria = [_points_criterion(item, f"rubrics[{i}]", 5, category_required=True) for i, item in enumerate(items)]
        rubric = _build_rubric(criteria, limit, points_range=RLCER_POINTS_RANGE, format_="rlcer")
        if check_scores:
            _check_rlcer_scores(declared, rubric)
        return RubricParse(rubric=rubric, ok=True, declared=types.MappingProxyType(declared))

    return _guard(body, text, _rubric_fail)


def _check_rlcer_scores(declared: Mapping[str, float], rubric: Rubric) -> None:
    missing = [key for key in _RLCER_SCORE_KEYS if key not in declared]
    if missing:
        raise _Invalid("schema", f"output: missing {missing}")
    positive = sum(c.weight for c in rubric.criteria if c.weight > 0)
    negative = sum(c.weight for c in rubric.criteria if c.weight < 0)
    high, low, current = (declared[key] for key in _RLCER_SCORE_KEYS)
    if high != positive or low != negative:
        raise _Invalid(
            "inconsistent_scores", f"maximum/minimum {high}/{low} but the points sum to {positive}/{negative}"
        )
    if not low <= current < (high + low) / 2:
        raise _Invalid("inconsistent_scores", f"current_score {current} not in [{low}, {(high + low) / 2})")


def parse_evorubric_rubrics(text: str, *, max_items: int) -> RubricParse:
    """EvoRubric's rubric generator output (evorubric.txt, Appendix C Table 5): a JSON list of
    {"criterion": str, "points": int in [-10, 10]}, possibly empty ("If no meaningful gap exists, output []").

    Rubric: format "evorubric", points_range (-10, 10), CRITERION items; an optional "category" string (Table
    9's labels) is kept (null or absent: none). Checks: a list of at most max_items objects; non-empty criterion;
    points a nonzero integer in [-10, 10] (0 is neither a good nor a bad trait). An empty list is ok (an empty
    rubric).
    """
    limit = _check_count(max_items, "max_items")

    def body(answer: str) -> RubricParse:
        items = _find_json(answer, list)
        criteria = [_points_criterion(item, f"item {i}", 10, category_required=False) for i, item in enumerate(items)]
        rubric = _build_rubric(criteria, limit, points_range=EVORUBRIC_POINTS_RANGE, format_="evorubric")
        return RubricParse(rubric=rubric, ok=True)

    return _guard(body, text, _rubric_fail)


_SRAR_TAG = re.compile(r"<{1,2}\s*(/\s*)?(SUGGEST|PITFALL|BONUS|ANSWER)\s*>{1,2}[ \t]*:?", re.I)


def parse_srar_rubric(text: str, *, max_items: int) -> RubricParse:
    """SRaR's distilled rubric (srar.txt, Appendix 7.2; examples in Appendix 14): tagged items
    "<SUGGEST> text", "<PITFALL> ...", "<BONUS> ...", "<ANSWER> ...".

    Accepted tag forms: <TAG> or <<TAG>> (the paper's extraction shows both), any case, an optional ":", items one a
    line or several on one line (Appendix 14). An item's text runs from its tag to the next tag or the end of
    the line; closing tags (</TAG>, <</TAG>>) end it; text outside items is ignored. Rubric: format "srar",
    weight 1 per item, kinds from the tags. Checks: 1..max_items items, none empty; at least one SUGGEST and
    exactly one ANSWER (the prompt's mandatory items; "missing_mandatory").
    """
    limit = _check_count(max_items, "max_items")

    def body(answer: str) -> RubricParse:
        tags = list(_SRAR_TAG.finditer(answer))
        criteria = []
        for i, tag in enumerate(tags):
            if tag.group(1):
                continue
            end = tags[i + 1].start() if i + 1 < len(tags) else len(answer)
            item = answer[tag.end() : end].split("\n", 1)[0]
            kind = ItemKind[tag.group(2).upper()]
            criteria.append(Criterion(text=_text(item, f"item {len(criteria)} ({kind.name})"), kind=kind))
        if not criteria:
            raise _Invalid("no_items", "no <SUGGEST>/<PITFALL>/<BONUS>/<ANSWER> item")
        kinds = [c.kind for c in criteria]
        if ItemKind.SUGGEST not in kinds or kinds.count(ItemKind.ANSWER) != 1:
            raise _Invalid(
                "missing_mandatory", f"{kinds.count(ItemKind.SUGGEST)} SUGGEST, {kinds.count(ItemKind.ANSWER)} ANSWER"
            )
        return RubricParse(rubric=_build_rubric(criteria, limit, format_="srar"), ok=True)

    return _guard(body, text, _rubric_fail)


_RGR_LINE = re.compile(r"^\s*(?:[-*•]\s*|\d+[.)]\s*)?\[\s*(factual|process)\s*\]", re.I)
_RGR_WEIGHT = re.compile(r"\s*\(\s*weight\s*[:=]([^)]*)\)\s*[:.\-–—]?(.*)$", re.I | re.S)
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_RGR_MAX_WEIGHT = 10.0


def parse_rgr_criteria(text: str, *, max_items: int) -> RubricParse:
    """RGR-GRPO criteria lines, the output format of `prompts.rgr_rubric_generation_prompt`:
    "[Factual] (weight: w) text" / "[Process] (weight: w) text", one criterion a line.

    Accepted: a list marker ("-", "*", "•", "1.", "1)") before the bracket, any case for Factual / Process,
    "weight:" or "weight=", a ":" or dash after the parenthesis. Lines that do not start with [Factual] or
    [Process] are ignored (headings, prose). Rubric: format "rgr", FACTUAL / PROCESS criteria. Checks: a
    criterion line has a weight that is a decimal number in (0, 10] ("nan" / "inf": "non_finite"; other text:
    "schema") and a non-empty text; 1..max_items criteria.
    """
    limit = _check_count(max_items, "max_items")

    def body(answer: str) -> RubricParse:
        criteria = []
        for n, line in enumerate(answer.splitlines()):
            head = _RGR_LINE.match(line)
            if head is None:
                continue
            where = f"line {n + 1}"
            rest = _RGR_WEIGHT.match(line[head.end() :])
            if rest is None:
                raise _Invalid("schema", f"{where}: expected '(weight: w)' after the criterion type")
            weight = _rgr_weight(rest.group(1), where)
            kind = ItemKind.FACTUAL if head.group(1).lower() == "factual" else ItemKind.PROCESS
            criteria.append(Criterion(text=_text(rest.group(2), f"{where} text"), weight=weight, kind=kind))
        if not criteria:
            raise _Invalid("no_items", "no [Factual] / [Process] line")
        return RubricParse(rubric=_build_rubric(criteria, limit, format_="rgr"), ok=True)

    return _guard(body, text, _rubric_fail)


def _rgr_weight(token: str, where: str) -> float:
    token = token.strip()
    if _DECIMAL.fullmatch(token) is None:
        if token.lstrip("+-").lower() in ("nan", "inf", "infinity"):
            raise _Invalid("non_finite", f"{where}: weight {token!r}")
        raise _Invalid("schema", f"{where}: weight {token[:40]!r} is not a number")
    weight = float(token)
    if not math.isfinite(weight):
        raise _Invalid("non_finite", f"{where}: weight {token[:40]} overflows")
    if not 0 < weight <= _RGR_MAX_WEIGHT:
        raise _Invalid("out_of_bounds", f"{where}: weight {weight} not in (0, {_RGR_MAX_WEIGHT:g}]")
    return weight


# ---------------------------------------------------------------- structured outputs (pydantic models)


@dataclasses.dataclass(frozen=True)
class StructuredParse:
    """A pydantic model instance read from one model output: `value` (None when not ok), ok / reason / detail as
    ParseResult."""

    value: Optional[Any]
    ok: bool
    reason: str = ""
    detail: str = ""


def _pydantic_detail(error: Any) -> str:
    """The first errors of a pydantic ValidationError, one line: "criteria.2.weight: Input should be ..."."""
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in error.errors()[:3]]
    more = error.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def parse_structured(text: str, model: type) -> StructuredParse:
    """The first JSON object of `text` (module docstring's rules) validated by the pydantic model class `model`.
    The model's own constraints are the schema: a violation is the failure "schema" naming the field; the JSON
    reading's failures keep their reasons ("no_json", "duplicate_key", "non_finite", ...)."""
    import pydantic  # noqa: PLC0415  (only the synthesis pipelines read structured outputs)

    def body(answer: str) -> StructuredParse:
        try:
            return StructuredParse(value=model.model_validate(_find_json(answer, dict)), ok=True)
        except pydantic.ValidationError as error:
            raise _Invalid("schema", _pydantic_detail(error)) from None

    return _guard(body, text, lambda reason, detail: StructuredParse(None, False, reason, detail))


# ---------------------------------------------------------------- JSON schemas of the judge outputs
# For servers with JSON-schema-constrained decoding (SGLang's `response_format` of type json_schema). A
# conforming output always parses; the parsers stay the check, since not every server enforces the schema.


def srar_judge_schema(num_items: int) -> dict:
    """Schema of `parse_srar_judge`'s input: exactly num_items {"id" 1..K, "satisfied", "step" >= -1} objects."""
    k = _check_count(num_items, "num_items")
    item = {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": max(k, 1)},
            "satisfied": {"type": "boolean"},
            "step": {"type": "integer", "minimum": -1},
        },
        "required": ["id", "satisfied", "step"],
        "additionalProperties": False,
    }
    return {"type": "array", "items": item, "minItems": k, "maxItems": k}


def rlcer_verifier_schema(num_items: int) -> dict:
    """Schema of `parse_rlcer_verifier`'s input: num_items booleans and a final score."""
    k = _check_count(num_items, "num_items")
    return {
        "type": "object",
        "properties": {
            "judgement": {"type": "array", "items": {"type": "boolean"}, "minItems": k, "maxItems": k},
            "final_score": {"type": "number"},
        },
        "required": ["judgement", "final_score"],
        "additionalProperties": False,
    }


def rating_schema() -> dict:
    """Schema of `parse_rating`'s input: {"rating": 0 | 1}."""
    return {
        "type": "object",
        "properties": {"rating": {"type": "integer", "enum": [0, 1]}},
        "required": ["rating"],
        "additionalProperties": False,
    }


def healthbench_grade_schema() -> dict:
    """Schema of `parse_healthbench_grade`'s input: {"explanation": str, "criteria_met": bool}."""
    return {
        "type": "object",
        "properties": {"explanation": {"type": "string"}, "criteria_met": {"type": "boolean"}},
        "required": ["explanation", "criteria_met"],
        "additionalProperties": False,
    }


def grounded_scores_schema(weights: Sequence[float]) -> dict:
    """Schema of `parse_grounded_scores`'s input: a score in [0, w_k] for each of c_1..c_K, total, max_total."""
    w = _check_weights(weights)
    scores = {f"c_{i + 1}": {"type": "number", "minimum": 0, "maximum": float(w[i])} for i in range(len(w))}
    return {
        "type": "object",
        "properties": {
            "scores": {"type": "object", "properties": scores, "required": list(scores), "additionalProperties": False},
            "total": {"type": "number"},
            "max_total": {"type": "number"},
            "reasoning": {"type": "string"},
        },
        "required": ["scores", "total", "max_total", "reasoning"],
        "additionalProperties": False,
    }


def meta_verdict_schema(categories: Sequence[str]) -> dict:
    """Schema of `parse_meta_verdict`'s input: "VALID" or "INVALID: <one of the categories>"."""
    verdicts = ["VALID"] + [f"INVALID: {c}" for c in _check_categories(categories)]
    return {
        "type": "object",
        "properties": {"verdict": {"type": "string", "enum": verdicts}},
        "required": ["verdict"],
        "additionalProperties": False,
    }


def rubric_validity_schema() -> dict:
    """Schema of `parse_rubric_validity`'s input: {"valid": bool, "reason": str}."""
    return {
        "type": "object",
        "properties": {"valid": {"type": "boolean"}, "reason": {"type": "string"}},
        "required": ["valid", "reason"],
        "additionalProperties": False,
    }
