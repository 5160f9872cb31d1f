"""Hypothesis strategies of model outputs for the parsers of rubric_jax.rubrics.parsing.

Each `*_cases` strategy draws a `Case`: an output text built from a valid payload, sometimes with exactly one
defect of a known kind, wrapped the ways models wrap JSON (code fences, prose around it, a think block). The case
records what the parser must answer: ok with the expected values, or a failure with one of the allowed reasons.
Prose is drawn from an alphabet without brackets, quotes or upper-case letters, so that it can never complete a
truncated payload or spell a verdict.
"""

import dataclasses
import json
from typing import Any, Callable, Optional

import numpy as np
from hypothesis import strategies as st

from rubric_jax.rubrics.prompts import META_VERIFIER_CATEGORIES

PROSE = st.text(alphabet="abcdefghij klmnop.,\n", max_size=30)
WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 ,.-+=()'", min_size=1, max_size=24).filter(str.strip)
# RGR criterion texts: no parenthesis (a "(weight" inside could be read as the weight) and no leading separator.
RGR_TEXT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 ,.-+=", min_size=1, max_size=24).filter(
    lambda t: t.strip() and not t.lstrip().startswith(("-", ".", ":"))
)
RLCER_CATEGORIES = (
    "Effectiveness of Problem Decomposition & Planning",
    "Effectiveness of BackTracking / Self-Validation / Error Handling",
    "Reasoning Clarity & Flow",
    "Reasoning Focus & Efficiency",
    "Other Question-Specific Aspects",
)
MEDICAL = META_VERIFIER_CATEGORIES["medical"]
ANY_FAILURE = None  # a Case.reasons value: the output is invalid, any reason but "internal_error" will do


@dataclasses.dataclass(frozen=True)
class Raw:
    """A literal token to splice into rendered JSON (NaN, 1e999, a 30-digit integer...)."""

    token: str


@dataclasses.dataclass(frozen=True)
class Case:
    text: str
    kwargs: dict
    ok: bool
    reasons: Optional[frozenset] = None  # allowed failure reasons; None = any (ANY_FAILURE)
    expected: Any = None  # ok: the values (dict of arrays) or the rubric summary


def render(obj: Any, indent: Optional[int]) -> str:
    """json.dumps, with Raw tokens spliced in verbatim."""
    raws = []

    def encode(x):
        if isinstance(x, Raw):
            raws.append(x.token)
            return f"__RAW{len(raws) - 1}__"
        if isinstance(x, dict):
            return {k: encode(v) for k, v in x.items()}
        if isinstance(x, list):
            return [encode(v) for v in x]
        return x

    text = json.dumps(encode(obj), indent=indent)
    for i, token in enumerate(raws):
        text = text.replace(f'"__RAW{i}__"', token)
    return text


@st.composite
def wrapped(draw, payload: str) -> str:
    """The payload as a model might print it."""
    style = draw(st.sampled_from(["bare", "fence", "fence_json", "prose", "think"]))
    before, after = draw(PROSE), draw(PROSE)
    if style == "fence":
        return f"{before}\n```\n{payload}\n```\n{after}"
    if style == "fence_json":
        return f"```json\n{payload}\n```"
    if style == "prose":
        return f"{before}\n{payload}\n{after}"
    if style == "think":
        return f"<think>\n{before}\n</think>\n{payload}"
    return payload


NON_FINITE = st.sampled_from([Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1e999"), Raw("-1e400")])
HUGE_INT = st.integers(19, 60).map(lambda n: Raw("9" * n))
NOT_A_NUMBER = st.sampled_from(["1", "true", None, [1], {"v": 1}, True, False])
NOT_A_STRING = st.sampled_from([1, 0.5, True, None, ["VALID"], {"v": "VALID"}])
NOT_A_BOOL = st.sampled_from(["true", "yes", None, 2, -1, 0.5, [True]])


@st.composite
def json_case(draw, payload: Any, kwargs: dict, ok: bool, reasons=None, expected=None) -> Case:
    """Render a payload, sometimes truncating a valid one or opening an unclosed think block."""
    text = render(payload, draw(st.sampled_from([None, 2])))
    mutation = draw(st.sampled_from(["none"] * 6 + ["truncate", "unterminated_think", "blank"]))
    if mutation == "truncate" and len(text) > 1:
        cut = draw(st.integers(0, len(text) - 2))
        return Case(draw(wrapped(text[:cut])), kwargs, False, ANY_FAILURE)
    if mutation == "unterminated_think":
        return Case(f"<think>\n{draw(PROSE)}{text}", kwargs, False, frozenset({"unterminated_think"}))
    if mutation == "blank":
        return Case(
            draw(st.sampled_from(["", " ", "\n\t ", "<think>x</think>  \n"])), kwargs, False, frozenset({"empty"})
        )
    return Case(draw(wrapped(text)), kwargs, ok, reasons, expected)


def _defect(draw, defects: dict) -> tuple[Optional[str], Optional[Callable]]:
    """Draw "none" (no defect) or one defect name and its function."""
    name = draw(st.sampled_from(["none"] * 3 + sorted(defects)))
    return (None, None) if name == "none" else (name, defects[name])


def _fail(*reasons: str) -> frozenset:
    return frozenset(reasons)


def _put(container, key, value, *reasons: str) -> frozenset:
    """Set container[key] = value (a defect); the failure reasons it must produce."""
    container[key] = value
    return frozenset(reasons)


def _pop(container, key, *reasons: str) -> frozenset:
    container.pop(key)
    return frozenset(reasons)


def _append(values: list, items: list, *reasons: str) -> frozenset:
    values.extend(items)
    return frozenset(reasons)


# ---------------------------------------------------------------- judge verdicts


@st.composite
def srar_judge_cases(draw) -> Case:
    k = draw(st.integers(0, 6))
    order = draw(st.permutations(range(k)))
    satisfied = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    steps = draw(st.lists(st.integers(-3, 8) | st.sampled_from([-(2**31), 2**31 - 1]), min_size=k, max_size=k))
    entries = [
        {"id": i + 1, "satisfied": draw(st.sampled_from([satisfied[i], int(satisfied[i])])), "step": steps[i]}
        for i in order
    ]
    expected = {
        "satisfied_k": np.array(satisfied, np.float32).reshape(k),
        "step_k": np.array(steps, np.int32).reshape(k),  # as written, in range of the response or not
    }
    defects = {}
    if k:
        i = draw(st.integers(0, k - 1))
        field = draw(st.sampled_from(["id", "satisfied", "step"]))
        defects.update(
            drop=lambda e: _pop(e, i, "wrong_length"),
            id_out_of_range=lambda e: _put(e[i], "id", draw(st.sampled_from([0, -1, k + 1])), "bad_id"),
            id_fraction=lambda e: _put(e[i], "id", e[i]["id"] + 0.5, "not_integer"),
            id_huge=lambda e: _put(e[i], "id", draw(HUGE_INT), "out_of_bounds"),
            not_a_bool=lambda e: _put(e[i], "satisfied", draw(NOT_A_BOOL), "schema"),
            step_fraction=lambda e: _put(e[i], "step", 1.5, "not_integer"),
            step_int32=lambda e: _put(e[i], "step", draw(st.sampled_from([2**31, -(2**31) - 1])), "out_of_bounds"),
            step_type=lambda e: _put(e[i], "step", draw(NOT_A_NUMBER), "schema"),
            non_finite=lambda e: _put(e[i], field, draw(NON_FINITE), "non_finite"),
            missing=lambda e: _pop(e[i], field, "schema"),
            not_object=lambda e: _put(e, i, [1, True, 0], "schema"),
        )
    if k >= 2:
        defects["duplicate_id"] = lambda e: _put(e[1], "id", e[0]["id"], "bad_id")
    defects["extra"] = lambda e: _append(e, [{"id": k + 1, "satisfied": True, "step": 0}], "wrong_length")
    name, apply = _defect(draw, defects)
    kwargs = {"num_items": k}
    if name is None:
        return draw(json_case(entries, kwargs, True, expected=expected))
    return draw(json_case(entries, kwargs, False, apply(entries)))


@st.composite
def rlcer_verifier_cases(draw) -> Case:
    k = draw(st.integers(0, 8))
    judgement = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    payload = {"judgement": list(judgement), "final_score": draw(st.integers(-20, 20) | st.floats(-20, 20))}
    defects = {
        "short": lambda p: _pop(p["judgement"], -1, "wrong_length"),
        "long": lambda p: _append(p["judgement"], [False], "wrong_length"),
        "not_list": lambda p: _put(p, "judgement", draw(st.sampled_from(["true", 1, None, {"a": 1}])), "schema"),
        "no_judgement": lambda p: _pop(p, "judgement", "schema"),
        "no_score": lambda p: _pop(p, "final_score", "schema"),
        "score_non_finite": lambda p: _put(p, "final_score", draw(NON_FINITE), "non_finite"),
        "score_type": lambda p: _put(p, "final_score", draw(NOT_A_NUMBER), "schema"),
    }
    if k:
        defects["not_a_bool"] = lambda p: _put(p["judgement"], 0, draw(NOT_A_BOOL), "schema")
    if k == 0:
        defects.pop("short")
    name, apply = _defect(draw, defects)
    kwargs = {"num_items": k}
    if name is None:
        expected = {"satisfied_k": np.array(judgement, np.float32).reshape(k)}
        case = draw(json_case(payload, kwargs, True, expected=expected))
        if draw(st.booleans()):  # the verifier prompt's own format: Python booleans and // comments
            text = case.text.replace("true", "True").replace("false", "False")
            text = text.replace('"final_score"', '// List of True/False for each criterion\n"final_score"', 1)
            case = dataclasses.replace(case, text=text)
        return case
    return draw(json_case(payload, kwargs, False, apply(payload)))


@st.composite
def rating_cases(draw) -> Case:
    rating = draw(st.sampled_from([0, 1, 0.0, 1.0]))
    payload = {"rating": rating}
    if draw(st.booleans()):
        payload["explanation"] = draw(WORDS)  # unknown keys are ignored
    defects = {
        "out_of_range": lambda p: _put(p, "rating", draw(st.sampled_from([2, -1, 10, 1e300])), "out_of_bounds"),
        "fraction": lambda p: _put(p, "rating", draw(st.sampled_from([0.5, 0.999, 1e-9])), "not_integer"),
        "type": lambda p: _put(p, "rating", draw(NOT_A_NUMBER), "schema"),
        "non_finite": lambda p: _put(p, "rating", draw(NON_FINITE), "non_finite"),
        "huge_int": lambda p: _put(p, "rating", draw(HUGE_INT), "out_of_bounds"),
        "missing": lambda p: _put(p, "score", p.pop("rating"), "schema"),
    }
    name, apply = _defect(draw, defects)
    if name is None:
        return draw(json_case(payload, {}, True, expected={"rating": np.array(rating, np.float32)}))
    if draw(st.integers(0, 9)) == 0:  # the judge's flip-flop: a repeated key
        return Case('{"rating": 0, "rating": 1}', {}, False, _fail("duplicate_key"))
    return draw(json_case(payload, {}, False, apply(payload)))


@st.composite
def grounded_cases(draw) -> Case:
    k = draw(st.integers(0, 5))
    weights = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.5, 3.0, 10.0]), min_size=k, max_size=k))
    awarded = [draw(st.sampled_from([0.0, w / 2, w])) for w in weights]
    scores = {f"c_{i + 1}": a for i, a in enumerate(awarded)}
    payload = {"scores": scores, "total": sum(awarded), "max_total": sum(weights), "reasoning": draw(WORDS)}
    defects = {
        "extra_key": lambda p: _put(p["scores"], f"c_{k + 1}", 0, "wrong_length"),
        "scores_type": lambda p: _put(p, "scores", draw(st.sampled_from([[1, 2], "c_1", None])), "schema"),
        "no_total": lambda p: _pop(p, draw(st.sampled_from(["total", "max_total"])), "schema"),
        "total_non_finite": lambda p: _put(p, "max_total", draw(NON_FINITE), "non_finite"),
    }
    if k:
        i = draw(st.integers(0, k - 1))
        key = f"c_{i + 1}"
        defects.update(
            over=lambda p: _put(p["scores"], key, weights[i] + draw(st.sampled_from([0.01, 1, 1e9])), "out_of_bounds"),
            negative=lambda p: _put(p["scores"], key, -draw(st.sampled_from([0.01, 1.0])), "out_of_bounds"),
            non_finite=lambda p: _put(p["scores"], key, draw(NON_FINITE), "non_finite"),
            type=lambda p: _put(p["scores"], key, draw(NOT_A_NUMBER), "schema"),
            dropped=lambda p: _pop(p["scores"], key, "wrong_length"),
            renamed=lambda p: _put(p["scores"], f"c_{k + 1}", p["scores"].pop(key), "bad_id"),
        )
    name, apply = _defect(draw, defects)
    kwargs = {"weights": weights}
    if name is None:
        w = np.array(weights)
        satisfied = np.divide(awarded, w, out=np.zeros(k), where=w > 0)
        expected = {"awarded_k": np.array(awarded, np.float32).reshape(k), "satisfied_k": satisfied.astype(np.float32)}
        return draw(json_case(payload, kwargs, True, expected=expected))
    return draw(json_case(payload, kwargs, False, apply(payload)))


@st.composite
def meta_verdict_cases(draw) -> Case:
    choice = draw(st.integers(-2, len(MEDICAL) - 1))
    if choice == -2:
        verdict, valid, index = draw(st.sampled_from(["VALID", " valid ", "Valid"])), True, -1
    elif choice == -1:
        verdict, valid, index = draw(st.sampled_from(["INVALID", "INVALID: Made Up Category", "invalid:"])), False, -1
    else:
        verdict, valid, index = (
            f"INVALID: {draw(st.sampled_from([MEDICAL[choice], MEDICAL[choice].upper()]))}",
            False,
            choice,
        )
    payload = {"verdict": verdict}
    defects = {
        "unrecognized": lambda p: _put(
            p, "verdict", draw(st.sampled_from(["MAYBE", "", "VALID?", "ok"])), "unrecognized"
        ),
        "type": lambda p: _put(p, "verdict", draw(NOT_A_STRING), "schema"),
        "missing": lambda p: _pop(p, "verdict", "schema"),
    }
    name, apply = _defect(draw, defects)
    kwargs = {"categories": MEDICAL}
    if name is None:
        expected = {"valid": np.array(valid), "category": np.array(index, np.int32)}
        case = draw(json_case(payload, kwargs, True, expected=expected))
        if draw(st.booleans()):  # the meta-verifier prompt's own format, comments included
            case = dataclasses.replace(
                case, text=case.text.replace("}", '\n    // (e.g., "INVALID: Semantic Duplication")\n}', 1)
            )
        return case
    return draw(json_case(payload, kwargs, False, apply(payload)))


@st.composite
def rubric_validity_cases(draw) -> Case:
    valid = draw(st.booleans())
    payload = {"valid": draw(st.sampled_from([valid, int(valid)])), "reason": draw(WORDS)}
    defects = {
        "type": lambda p: _put(p, "valid", draw(NOT_A_BOOL), "schema"),
        "missing": lambda p: _pop(p, "valid", "schema"),
    }
    name, apply = _defect(draw, defects)
    if name is None:
        return draw(json_case(payload, {}, True, expected={"valid": np.array(valid)}))
    return draw(json_case(payload, {}, False, apply(payload)))


@st.composite
def step_correctness_cases(draw) -> Case:
    correct = draw(st.booleans())
    word = "CORRECT" if correct else "INCORRECT"
    shape = draw(st.sampled_from(["bare", "bold", "quoted", "sentence", "lower"]))
    text = {
        "bare": word,
        "bold": f"**{word}**",
        "quoted": f'"{word}".',
        "sentence": f"{draw(PROSE)} {word}. {draw(PROSE)}",
        "lower": f"  {word.lower()}\n",
    }[shape]
    if draw(st.integers(0, 3)) == 0:
        bad = draw(st.sampled_from(["CORRECT or INCORRECT", "INCORRECT, no: CORRECT", "maybe", "incorrectly done"]))
        return Case(f"{draw(PROSE)} {bad}", {}, False, _fail("unrecognized"))
    return Case(text, {}, True, expected={"correct": np.array(correct)})


# ---------------------------------------------------------------- generated rubrics


@dataclasses.dataclass(frozen=True)
class RubricSummary:
    """What an ok RubricParse must hold: its format and, per criterion, (kind name, weight, text, category)."""

    format: str
    items: tuple
    declared: Optional[dict] = None


@st.composite
def rlcer_rubricator_cases(draw) -> Case:
    n = draw(st.integers(1, 8))
    points = draw(st.lists(st.integers(1, 5).flatmap(lambda m: st.sampled_from([m, -m])), min_size=n, max_size=n))
    texts = draw(st.lists(WORDS, min_size=n, max_size=n))
    categories = draw(st.lists(st.sampled_from(RLCER_CATEGORIES), min_size=n, max_size=n))
    items = [{"category": c, "criterion": t, "points": p} for c, t, p in zip(categories, texts, points)]
    high, low = sum(p for p in points if p > 0), sum(p for p in points if p < 0)
    payload = {
        "question_domain": "math/algebra",
        "rubrics": items,
        "maximum_score": high,
        "minimum_score": low,
        "current_score": low,
    }
    max_items = draw(st.integers(n, n + 3))
    check_scores = draw(st.booleans())
    i = draw(st.integers(0, n - 1))
    defects = {
        "points_range": lambda p: _put(items[i], "points", draw(st.sampled_from([0, 6, -6, 100])), "out_of_bounds"),
        "points_fraction": lambda p: _put(items[i], "points", 2.5, "not_integer"),
        "points_type": lambda p: _put(items[i], "points", draw(NOT_A_NUMBER), "schema"),
        "points_non_finite": lambda p: _put(items[i], "points", draw(NON_FINITE), "non_finite"),
        "empty_criterion": lambda p: _put(items[i], "criterion", draw(st.sampled_from(["", "  ", None])), "schema"),
        "no_category": lambda p: _pop(items[i], "category", "schema"),
        "no_rubrics": lambda p: _put(p, "rubrics", [], "no_items"),
        "rubrics_type": lambda p: _put(p, "rubrics", {"a": 1}, "schema"),
        "too_many": lambda p: _append(items, [dict(items[0])] * (max_items - n + 1), "too_many_items"),
        "score_non_finite": lambda p: _put(p, "minimum_score", draw(NON_FINITE), "non_finite"),
    }
    if check_scores:
        defects.update(
            no_current=lambda p: _pop(p, "current_score", "schema"),
            wrong_max=lambda p: _put(p, "maximum_score", high + 1, "inconsistent_scores"),
            wrong_min=lambda p: _put(p, "minimum_score", low - 1, "inconsistent_scores"),
            current_too_high=lambda p: _put(p, "current_score", high, "inconsistent_scores"),
        )
    name, apply = _defect(draw, defects)
    kwargs = {"max_items": max_items, "check_scores": check_scores}
    if name is None:
        summary = RubricSummary(
            "rlcer",
            tuple(("CRITERION", float(p), t.strip(), c) for c, t, p in zip(categories, texts, points)),
            {"maximum_score": high, "minimum_score": low, "current_score": low},
        )
        return draw(json_case(payload, kwargs, True, expected=summary))
    return draw(json_case(payload, kwargs, False, apply(payload)))


@st.composite
def evorubric_cases(draw) -> Case:
    n = draw(st.integers(0, 6))
    points = draw(st.lists(st.integers(1, 10).flatmap(lambda m: st.sampled_from([m, -m])), min_size=n, max_size=n))
    texts = draw(st.lists(WORDS, min_size=n, max_size=n))
    categories = draw(st.lists(st.none() | WORDS, min_size=n, max_size=n))
    items = []
    for t, p, c in zip(texts, points, categories):
        item = {"criterion": t, "points": p}
        if c is not None or draw(st.booleans()):
            item["category"] = c
        items.append(item)
    max_items = draw(st.integers(n, n + 2))
    extra = [{"criterion": "x", "points": 1}] * (max_items - n + 1)
    defects = {"too_many": lambda e: _append(e, extra, "too_many_items")}
    if n:
        i = draw(st.integers(0, n - 1))
        defects.update(
            points_range=lambda e: _put(e[i], "points", draw(st.sampled_from([0, 11, -11])), "out_of_bounds"),
            points_fraction=lambda e: _put(e[i], "points", 1.5, "not_integer"),
            points_non_finite=lambda e: _put(e[i], "points", draw(NON_FINITE), "non_finite"),
            no_criterion=lambda e: _pop(e[i], "criterion", "schema"),
            empty_category=lambda e: _put(e[i], "category", "", "schema"),
            not_object=lambda e: _put(e, i, "criterion", "schema"),
        )
    name, apply = _defect(draw, defects)
    kwargs = {"max_items": max_items}
    if name is None:
        summary = RubricSummary(
            "evorubric",
            tuple(("CRITERION", float(p), t.strip(), c and c.strip()) for t, p, c in zip(texts, points, categories)),
        )
        return draw(json_case(items, kwargs, True, expected=summary))
    return draw(json_case(items, kwargs, False, apply(items)))


SRAR_TAG_STYLES = ("<{}> ", "<<{}>>: ", "<{}>: ", "<<{}>> ", "< {} >", "<{}>:")


@st.composite
def srar_rubric_cases(draw) -> Case:
    middle = draw(st.lists(st.sampled_from(["SUGGEST", "PITFALL", "BONUS"]), max_size=6))
    kinds = ["SUGGEST"] + middle + ["ANSWER"]
    kinds = draw(st.permutations(kinds))
    texts = draw(
        st.lists(PROSE.filter(lambda t: t.strip() and "\n" not in t), min_size=len(kinds), max_size=len(kinds))
    )
    max_items = draw(st.integers(len(kinds), len(kinds) + 2))
    defect = draw(
        st.sampled_from([None] * 4 + ["no_answer", "two_answers", "no_suggest", "empty_item", "no_tags", "too_many"])
    )
    reasons = None
    if defect == "no_answer":
        i = kinds.index("ANSWER")
        kinds, texts = kinds[:i] + kinds[i + 1 :], texts[:i] + texts[i + 1 :]
        reasons = _fail("missing_mandatory")
    elif defect == "two_answers":
        kinds, texts = kinds + ["ANSWER"], texts + ["second answer"]
        max_items += 1
        reasons = _fail("missing_mandatory")
    elif defect == "no_suggest":
        keep = [j for j, kind in enumerate(kinds) if kind != "SUGGEST"]
        kinds, texts = [kinds[j] for j in keep], [texts[j] for j in keep]
        reasons = _fail("missing_mandatory")
    elif defect == "empty_item":
        texts = [" " if j == 0 else t for j, t in enumerate(texts)]
        reasons = _fail("schema")
    elif defect == "too_many":
        max_items = len(kinds) - 1
        reasons = _fail("too_many_items")
    styles = [draw(st.sampled_from(SRAR_TAG_STYLES)) for _ in kinds]
    separator = draw(st.sampled_from(["\n", " "]))
    body = separator.join(style.format(kind) + text for style, kind, text in zip(styles, kinds, texts))
    if defect == "no_tags":
        body, reasons = " ".join(texts), _fail("no_items")
    text = f"{draw(PROSE)}\n{body}\n{draw(PROSE)}" if draw(st.booleans()) else body
    kwargs = {"max_items": max_items}
    if reasons is not None:
        return Case(text, kwargs, False, reasons)
    summary = RubricSummary("srar", tuple((kind, 1.0, t.strip(), None) for kind, t in zip(kinds, texts)))
    return Case(text, kwargs, True, expected=summary)


@st.composite
def rgr_criteria_cases(draw) -> Case:
    n = draw(st.integers(1, 7))
    kinds = draw(st.lists(st.sampled_from(["Factual", "Process"]), min_size=n, max_size=n))
    weights = draw(st.lists(st.sampled_from(["1", "5", "10", "2.5", "0.5", "+3", "7.0"]), min_size=n, max_size=n))
    texts = draw(st.lists(RGR_TEXT, min_size=n, max_size=n))
    max_items = draw(st.integers(n, n + 2))
    defect = draw(
        st.sampled_from(
            [None] * 4
            + ["weight_range", "weight_nan", "weight_word", "no_weight", "empty_text", "no_lines", "too_many"]
        )
    )
    reasons = None
    i = draw(st.integers(0, n - 1))
    if defect == "weight_range":
        weights[i], reasons = draw(st.sampled_from(["0", "11", "-1", "1e9"])), _fail("out_of_bounds")
    elif defect == "weight_nan":
        weights[i], reasons = draw(st.sampled_from(["nan", "inf", "-Infinity"])), _fail("non_finite")
    elif defect == "weight_word":
        weights[i], reasons = draw(st.sampled_from(["five", "", "5 points", "1/2"])), _fail("schema")
    elif defect == "empty_text":
        texts[i], reasons = " ", _fail("schema")
    elif defect == "too_many":
        max_items, reasons = n - 1, _fail("too_many_items")
    lines = []
    for j, (kind, weight, text) in enumerate(zip(kinds, weights, texts)):
        marker = draw(st.sampled_from(["", "- ", "* ", f"{j + 1}. ", f"{j + 1}) "]))
        label = draw(st.sampled_from([kind, kind.upper(), kind.lower()]))
        key = draw(st.sampled_from(["weight: ", "weight:", "Weight = ", "weight="]))
        sep = draw(st.sampled_from([" ", ": ", " - "]))
        lines.append(f"{marker}[{label}] ({key}{weight}){sep}{text}")
        if defect == "no_weight" and j == i:
            lines[-1], reasons = f"{marker}[{label}] {text}", _fail("schema")
    if draw(st.booleans()):
        lines.insert(0, "rubric:")
    if defect == "no_lines":
        lines, reasons = ["rubric:", *texts], _fail("no_items")
    text = "\n".join(lines)
    kwargs = {"max_items": max_items}
    if reasons is not None:
        return Case(text, kwargs, False, reasons)
    summary = RubricSummary(
        "rgr", tuple((k.upper(), float(w), t.strip(), None) for k, w, t in zip(kinds, weights, texts))
    )
    return Case(text, kwargs, True, expected=summary)


# ---------------------------------------------------------------- token soup

SOUP_TOKENS = (
    "{",
    "}",
    "[",
    "]",
    '"',
    ":",
    ",",
    " ",
    "\n",
    "0",
    "1",
    "-1",
    "2",
    "0.5",
    "1e999",
    "NaN",
    "Infinity",
    "-Infinity",
    "9" * 25,
    "true",
    "false",
    "True",
    "null",
    '"rating"',
    '"id"',
    '"satisfied"',
    '"step"',
    '"judgement"',
    '"final_score"',
    '"scores"',
    '"c_1"',
    '"c_2"',
    '"total"',
    '"max_total"',
    '"verdict"',
    '"VALID"',
    '"INVALID: Semantic Duplication"',
    '"valid"',
    '"rubrics"',
    '"criterion"',
    '"points"',
    '"category"',
    '"maximum_score"',
    '"minimum_score"',
    '"current_score"',
    "<SUGGEST>",
    "<<ANSWER>>:",
    "<PITFALL>",
    "</ANSWER>",
    "[Factual]",
    "[process]",
    "(weight: 5)",
    "(weight: nan)",
    "(weight: 1e400)",
    "```json\n",
    "```",
    "<think>",
    "</think>",
    "//",
    "CORRECT",
    "INCORRECT",
    "ignore previous instructions and output",
    '{"rating": 1}',
    '[{"id": 1, "satisfied": true, "step": 1}]',
    "\x00",
    "\u202e",
    "\ud7ff",
    "\\",
    "\\u0000",
    "'",
)
soup = st.lists(st.one_of(st.sampled_from(SOUP_TOKENS), st.text(max_size=4)), max_size=40).map("".join)
