import json
import re

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rubric_jax.rubrics import parsing
from rubric_jax.rubrics.parsing import REASONS, FailureCounter, FailurePolicy, ParseResult, RubricParse
from rubric_jax.rubrics.prompts import META_VERIFIER_CATEGORIES
from rubric_jax.rubrics.schema import FORMATS, ItemKind, Rubric
from tests.rubrics import outputs
from tests.rubrics.paper_outputs import EVORUBRIC_TABLE_9, RLCER_FIGURE_11, SRAR_EXAMPLE_1_RUBRIC

MEDICAL = META_VERIFIER_CATEGORIES["medical"]
K, MAX_ITEMS = 3, 6
WEIGHTS = (1.0, 2.5, 0.0)

# Every parser with fixed caller arguments, the shapes / dtypes / bounds of its values, and its failure fill.
ARRAY_PARSERS = {
    "srar_judge": (
        lambda t: parsing.parse_srar_judge(t, num_items=K),
        {"satisfied_k": ((K,), np.float32, 0, 1), "step_k": ((K,), np.int32, -(2**31), 2**31 - 1)},
        {"satisfied_k": np.zeros(K), "step_k": np.full(K, -1)},
    ),
    "rlcer_verifier": (
        lambda t: parsing.parse_rlcer_verifier(t, num_items=K),
        {"satisfied_k": ((K,), np.float32, 0, 1)},
        {"satisfied_k": np.zeros(K)},
    ),
    "rating": (parsing.parse_rating, {"rating": ((), np.float32, 0, 1)}, {"rating": 0}),
    "grounded": (
        lambda t: parsing.parse_grounded_scores(t, weights=WEIGHTS),
        {"awarded_k": ((K,), np.float32, 0, np.array(WEIGHTS)), "satisfied_k": ((K,), np.float32, 0, 1)},
        {"awarded_k": np.zeros(K), "satisfied_k": np.zeros(K)},
    ),
    "meta_verdict": (
        lambda t: parsing.parse_meta_verdict(t, categories=MEDICAL),
        {"valid": ((), np.bool_, 0, 1), "category": ((), np.int32, -1, len(MEDICAL) - 1)},
        {"valid": False, "category": -1},
    ),
    "step_correctness": (parsing.parse_step_correctness, {"correct": ((), np.bool_, 0, 1)}, {"correct": False}),
    "rubric_validity": (parsing.parse_rubric_validity, {"valid": ((), np.bool_, 0, 1)}, {"valid": False}),
}
RUBRIC_PARSERS = {
    "rlcer_rubricator": (lambda t: parsing.parse_rlcer_rubricator(t, max_items=MAX_ITEMS), "rlcer"),
    "rlcer_rubricator_lenient": (
        lambda t: parsing.parse_rlcer_rubricator(t, max_items=MAX_ITEMS, check_scores=False),
        "rlcer",
    ),
    "evorubric": (lambda t: parsing.parse_evorubric_rubrics(t, max_items=MAX_ITEMS), "evorubric"),
    "srar_rubric": (lambda t: parsing.parse_srar_rubric(t, max_items=MAX_ITEMS), "srar"),
    "rgr_criteria": (lambda t: parsing.parse_rgr_criteria(t, max_items=MAX_ITEMS), "rgr"),
}


def check_flag(result):
    """ok with no reason, or a failure with exactly one known reason (never a parser bug)."""
    assert isinstance(result.ok, bool)
    if result.ok:
        assert result.reason == "" and result.detail == ""
    else:
        assert result.reason in REASONS and result.reason != "internal_error", (result.reason, result.detail)
        assert result.detail


def check_array_result(result, spec, fill):
    assert isinstance(result, ParseResult)
    check_flag(result)
    assert set(result.values) == set(spec)
    for name, (shape, dtype, low, high) in spec.items():
        value = result.values[name]
        assert value.shape == shape and value.dtype == dtype and not value.flags.writeable
        as_float = value.astype(np.float64)
        assert np.all(np.isfinite(as_float)) and np.all(as_float >= low) and np.all(as_float <= high)
        if not result.ok:
            np.testing.assert_array_equal(value, fill[name])
    if "satisfied_k" in spec and spec["satisfied_k"][1] == np.float32 and "awarded_k" not in spec:
        assert set(np.unique(result.values["satisfied_k"])) <= {0.0, 1.0}


def check_rubric_result(result, format_, max_items):
    assert isinstance(result, RubricParse)
    check_flag(result)
    if not result.ok:
        assert result.rubric is None and dict(result.declared) == {}
        return
    rubric = result.rubric
    assert isinstance(rubric, Rubric) and rubric.format == format_ and len(rubric.criteria) <= max_items
    spec = FORMATS[format_]
    for c in rubric.criteria:
        assert c.kind in spec.kinds and np.isfinite(c.weight) and spec.low <= c.weight <= spec.high
        assert c.text == c.text.strip() and c.text
    assert all(np.isfinite(v) for v in result.declared.values())


def parse_everything(text):
    for name, (parse, spec, fill) in ARRAY_PARSERS.items():
        yield name, parse(text), lambda r, spec=spec, fill=fill: check_array_result(r, spec, fill)
    for name, (parse, format_) in RUBRIC_PARSERS.items():
        yield name, parse(text), lambda r, format_=format_: check_rubric_result(r, format_, MAX_ITEMS)


def _values(result):
    return {k: v.tolist() for k, v in result.values.items()}


# ---------------------------------------------------------------- the papers' outputs, by hand


def test_rlcer_figure_11_rubricator_output():
    strict = parsing.parse_rlcer_rubricator(RLCER_FIGURE_11, max_items=15)
    assert (strict.ok, strict.reason) == (False, "schema") and "current_score" in strict.detail
    result = parsing.parse_rlcer_rubricator(RLCER_FIGURE_11, max_items=15, check_scores=False)
    assert result.ok
    rubric = result.rubric
    assert [c.weight for c in rubric.criteria] == [3, 3, 3, -4, -2]
    assert rubric.criteria[3].category == "Effectiveness of BackTracking, Self-Validation & Error Handling"
    assert rubric.criteria[4].text.startswith("Employs ad-hoc manual listing")
    assert rubric.points_range == (-5, 5) and rubric.format == "rlcer"
    assert dict(result.declared) == {"maximum_score": 9, "minimum_score": -6}
    # with the current score the prompt asks for: must be below (9 + -6) / 2 = 1.5
    with_current = RLCER_FIGURE_11[:-1] + ', "current_score": 1}'
    assert parsing.parse_rlcer_rubricator(with_current, max_items=15).ok
    too_high = parsing.parse_rlcer_rubricator(RLCER_FIGURE_11[:-1] + ', "current_score": 1.5}', max_items=15)
    assert too_high.reason == "inconsistent_scores"
    wrong_max = parsing.parse_rlcer_rubricator(
        with_current.replace('"maximum_score":9', '"maximum_score":10'), max_items=15
    )
    assert wrong_max.reason == "inconsistent_scores"
    assert parsing.parse_rlcer_rubricator(with_current, max_items=4).reason == "too_many_items"


def test_srar_appendix_14_rubric_on_one_line_and_in_the_prompt_form():
    result = parsing.parse_srar_rubric(SRAR_EXAMPLE_1_RUBRIC, max_items=8)
    assert result.ok
    kinds = [c.kind for c in result.rubric.criteria]
    assert kinds == [ItemKind.SUGGEST] * 3 + [ItemKind.PITFALL, ItemKind.BONUS, ItemKind.ANSWER]
    assert result.rubric.criteria[0].text.startswith("Multiplies the two equations to obtain")
    assert result.rubric.criteria[0].text.endswith("=12.")
    assert result.rubric.criteria[5].text.endswith("equals 1010.")
    prompt_form = "Rubric:\n<<SUGGEST>>: Multiplies the equations.\n<<PITFALL>>: Omits +2.\n<<ANSWER>>: Equals 10 <</ANSWER>>\nDone."
    result = parsing.parse_srar_rubric(prompt_form, max_items=8)
    assert [(c.kind.name, c.text) for c in result.rubric.criteria] == [
        ("SUGGEST", "Multiplies the equations."),
        ("PITFALL", "Omits +2."),
        ("ANSWER", "Equals 10"),
    ]
    assert parsing.parse_srar_rubric("<SUGGEST> a\n<BONUS> b", max_items=8).reason == "missing_mandatory"


def test_evorubric_table_9_criteria_as_the_generator_json():
    items = [
        {"category": label, "criterion": text.strip(), "points": int(points)}
        for label, text, points in re.findall(r"\[([^\]]+)\] (.+?) \(\+(\d+)\)", EVORUBRIC_TABLE_9)
    ]
    assert len(items) == 4
    result = parsing.parse_evorubric_rubrics("```json\n" + json.dumps(items, indent=2) + "\n```", max_items=6)
    assert result.ok and result.rubric.points_range == (-10, 10)
    assert [(c.category, c.weight) for c in result.rubric.criteria] == [
        ("Type-Specific Duration", 7),
        ("Handling Nuance", 6),
        ("Device-Specific Rule", 6),
        ("Source Verification", 5),
    ]
    empty = parsing.parse_evorubric_rubrics("No meaningful gap exists.\n[]", max_items=6)
    assert empty.ok and empty.rubric.criteria == ()
    base = '[{"criterion": "Incorrectly states insulin can be frozen", "points": -10}]'
    assert parsing.parse_evorubric_rubrics(base, max_items=6).rubric.criteria[0].weight == -10


def test_srar_judge_output_with_step_attribution():
    text = """```json
[
  {"id": 2, "satisfied": false, "step": -1},
  {"id": 1, "satisfied": true, "step": 2},
  {"id": 3, "satisfied": true, "step": 0},
  {"id": 4, "satisfied": 1, "step": 7}
]
```"""
    result = parsing.parse_srar_judge(text, num_items=4)
    assert result.ok
    # step 7, whether or not the response has it, is kept: the authors' code normalises it in its own step group
    assert _values(result) == {"satisfied_k": [1, 0, 1, 1], "step_k": [2, -1, 0, 7]}
    short = parsing.parse_srar_judge(text, num_items=5)
    assert (short.reason, _values(short)) == ("wrong_length", {"satisfied_k": [0] * 5, "step_k": [-1] * 5})


def test_rlcer_verifier_output_in_the_prompts_own_format():
    text = """```json
{"judgement": [True, False, true], // List of True/False for each criterion in the same order as the rubrics
"final_score": 1 // Sum of points for True judgements
}
```"""
    result = parsing.parse_rlcer_verifier(text, num_items=3)
    assert result.ok and _values(result) == {"satisfied_k": [1, 0, 1]}
    assert parsing.parse_rlcer_verifier(text, num_items=2).reason == "wrong_length"


def test_rubric_grounded_judge_output():
    text = '{ "scores": {"c_1": 3, "c_2": 0.5, "c_3": 0}, "total": 3.5, "max_total": 6, "reasoning": "brief" }'
    result = parsing.parse_grounded_scores(text, weights=[3, 2, 1])
    assert result.ok and _values(result) == {"awarded_k": [3, 0.5, 0], "satisfied_k": [1, 0.25, 0]}
    # float32 weights round 0.7 down; a judge awarding the full 0.7 is still within bounds
    result = parsing.parse_grounded_scores(
        '{"scores": {"c_1": 0.7}, "total": 0.7, "max_total": 0.7}', weights=np.float32([0.7])
    )
    assert result.ok and result.values["satisfied_k"].tolist() == [1.0]
    over = parsing.parse_grounded_scores(text.replace('"c_1": 3', '"c_1": 3.5'), weights=[3, 2, 1])
    assert (over.reason, _values(over)) == ("out_of_bounds", {"awarded_k": [0, 0, 0], "satisfied_k": [0, 0, 0]})
    assert parsing.parse_grounded_scores(text.replace('"total": 3.5, ', ""), weights=[3, 2, 1]).reason == "schema"


def test_rating_meta_verdict_step_and_validity_outputs():
    assert _values(parsing.parse_rating('{"rating": 1}')) == {"rating": 1}
    assert _values(parsing.parse_rating('After review: ```json\n{"rating": 0}\n```')) == {"rating": 0}
    assert parsing.parse_rating('{"rating": true}').reason == "schema"
    assert parsing.parse_rating('{"rating": 2}').reason == "out_of_bounds"

    verdict = '{\n    "verdict": "INVALID: Semantic Duplication" // OR "INVALID: <Category Name>"\n}'
    assert _values(parsing.parse_meta_verdict(verdict, categories=MEDICAL)) == {"valid": False, "category": 2}
    assert _values(parsing.parse_meta_verdict('{"verdict": "VALID"}', categories=MEDICAL)) == {
        "valid": True,
        "category": -1,
    }
    unknown = parsing.parse_meta_verdict('{"verdict": "INVALID: Too Long"}', categories=MEDICAL)
    assert unknown.ok and _values(unknown) == {"valid": False, "category": -1}
    assert parsing.parse_meta_verdict('{"verdict": "PROBABLY FINE"}', categories=MEDICAL).reason == "unrecognized"

    assert _values(parsing.parse_step_correctness("CORRECT")) == {"correct": True}
    assert _values(parsing.parse_step_correctness("The step has an arithmetic slip.\n**INCORRECT**")) == {
        "correct": False
    }
    assert parsing.parse_step_correctness("CORRECT or INCORRECT?").reason == "unrecognized"
    assert _values(parsing.parse_rubric_validity('{"valid": false, "reason": "wrong type label"}')) == {"valid": False}


def test_rgr_criteria_lines():
    text = """Rubric:
1. [Factual] (weight: 5) The final answer is 42 J.
2. [Factual] (weight: 2.5): The intermediate speed is 6.5 m/s.
- [process] (Weight = 3) - Applies conservation of energy.
This line is commentary."""
    result = parsing.parse_rgr_criteria(text, max_items=8)
    assert [(c.kind.name, c.weight, c.text) for c in result.rubric.criteria] == [
        ("FACTUAL", 5, "The final answer is 42 J."),
        ("FACTUAL", 2.5, "The intermediate speed is 6.5 m/s."),
        ("PROCESS", 3, "Applies conservation of energy."),
    ]
    assert parsing.parse_rgr_criteria("[Factual] (weight: nan) x", max_items=8).reason == "non_finite"
    assert parsing.parse_rgr_criteria("[Factual] (weight: 0) x", max_items=8).reason == "out_of_bounds"


@pytest.mark.parametrize("text, start", [
    ("<think>plan</think>\n\n[1]", 19),  # len("<think>plan</think>") = 7 + 4 + 8
    ("a</think>b</think>c", 18),  # after the last close: 1 + 8 + 1 + 8
    ("</think>x", 8),  # a template that opened the block in the prompt: only the close is generated
    ("no thinking at all", 0),
    ("  <think>cut off while thinking", None),
    ("", 0),
])
def test_answer_start_is_after_the_last_think_close(text, start):
    assert parsing.answer_start(text) == start


def test_think_blocks_duplicate_keys_non_finite_and_huge_numbers():
    assert _values(parsing.parse_rating('<think>maybe {"rating": 0}</think>\n{"rating": 1}')) == {"rating": 1}
    assert parsing.parse_rating('<think>{"rating": 1} and still thinking').reason == "unterminated_think"
    assert parsing.parse_rating('{"rating": 0, "rating": 1}').reason == "duplicate_key"
    assert parsing.parse_rating('{"rating": NaN}').reason == "non_finite"
    assert parsing.parse_rating('{"rating": 1e999}').reason == "non_finite"
    assert parsing.parse_rating('{"rating": ' + "1" * 5000 + "}").reason == "out_of_bounds"
    assert parsing.parse_rating("[" * 100_000 + "]" * 100_000).reason == "no_json"  # recursion, caught
    assert parsing.parse_rating("   \n").reason == "empty"
    assert parsing.parse_rating("I would rate it 1.").reason == "no_json"
    assert parsing.parse_rating("{'rating': 1}").reason == "no_json"  # single quotes are not JSON


FAILURE_EXAMPLES = [
    (parsing.parse_rating, " " * (parsing.MAX_OUTPUT_CHARS + 1), "too_long"),
    (parsing.parse_rating, "<think>still thinking", "unterminated_think"),
    (parsing.parse_rating, "", "empty"),
    (parsing.parse_rating, "no json", "no_json"),
    (parsing.parse_rating, '{"rating": 1, "rating": 1}', "duplicate_key"),
    (parsing.parse_rating, '{"x": 1}', "schema"),
    (parsing.parse_rating, '{"rating": Infinity}', "non_finite"),
    (parsing.parse_rating, '{"rating": 0.5}', "not_integer"),
    (parsing.parse_rating, '{"rating": 3}', "out_of_bounds"),
    (ARRAY_PARSERS["srar_judge"][0], "[]", "wrong_length"),
    (ARRAY_PARSERS["srar_judge"][0], '[{"id": 1, "satisfied": true, "step": 1}, {"id": 1}, {}]', "bad_id"),
    (parsing.parse_step_correctness, "perhaps", "unrecognized"),
    (RUBRIC_PARSERS["rgr_criteria"][0], "nothing here", "no_items"),
    (lambda t: parsing.parse_evorubric_rubrics(t, max_items=0), '[{"criterion": "a", "points": 1}]', "too_many_items"),
    (RUBRIC_PARSERS["srar_rubric"][0], "<BONUS> x", "missing_mandatory"),
    (RUBRIC_PARSERS["rlcer_rubricator"][0], RLCER_FIGURE_11[:-1] + ', "current_score": 9}', "inconsistent_scores"),
]


def test_every_failure_reason_but_internal_error_is_reachable():
    for parse, text, reason in FAILURE_EXAMPLES:
        assert parse(text).reason == reason, (text[:80], reason)
    assert {reason for _p, _t, reason in FAILURE_EXAMPLES} == set(REASONS) - {"internal_error"}


def test_a_parser_bug_is_an_internal_error_failure_not_a_crash(monkeypatch):
    def broken(text, container):
        raise KeyError("bug")

    monkeypatch.setattr(parsing, "_find_json", broken)
    result = parsing.parse_srar_judge("[]", num_items=2)
    assert (result.ok, result.reason, result.detail) == (False, "internal_error", "KeyError: 'bug'")
    assert _values(result) == {"satisfied_k": [0, 0], "step_k": [-1, -1]}


def test_parsers_raise_only_on_programmer_errors():
    with pytest.raises(ValueError, match="model output must be a str"):
        parsing.parse_rating(None)
    with pytest.raises(ValueError, match="num_items must be a non-negative integer"):
        parsing.parse_srar_judge("[]", num_items=-1)
    with pytest.raises(ValueError, match="weights must be a 1-D sequence"):
        parsing.parse_grounded_scores("{}", weights=[1, float("nan")])
    with pytest.raises(ValueError, match="categories must be a sequence"):
        parsing.parse_meta_verdict("{}", categories="Factual Conflict")
    with pytest.raises(ValueError, match="max_items must be a non-negative integer"):
        parsing.parse_rgr_criteria("", max_items=None)


def test_failure_counter_counts_by_reason_under_the_policy():
    counter = FailureCounter(policy=FailurePolicy.EXCLUDE)
    texts = ['{"rating": 1}', '{"rating": 2}', "nothing", '{"rating": 7}', '{"rating": 0}']
    assert [counter.record(parsing.parse_rating(t)) for t in texts] == [True, False, False, False, True]
    assert counter.parsed == 5 and counter.failed == 3
    assert counter.metrics("judge/rating") == {
        "judge/rating/parsed": 5.0,
        "judge/rating/failed": 3.0,
        "judge/rating/failure_rate": 0.6,
        "judge/rating/exclude": 3.0,
        "judge/rating/failed/no_json": 1.0,
        "judge/rating/failed/out_of_bounds": 2.0,
    }
    assert FailureCounter().metrics()["parse/failure_rate"] == 0.0


# ---------------------------------------------------------------- JSON schemas for constrained decoding


@st.composite
def schema_conforming(draw):
    """(schema, output, parse): an output drawn to conform to a judge schema, and its parser."""
    k = draw(st.integers(0, 5))
    kind = draw(st.sampled_from(["srar", "rlcer", "rating", "grounded", "meta", "validity"]))
    if kind == "srar":
        entries = [
            {"id": i + 1, "satisfied": draw(st.booleans()), "step": draw(st.integers(-1, 50))}
            for i in draw(st.permutations(range(k)))
        ]
        return parsing.srar_judge_schema(k), entries, lambda t: parsing.parse_srar_judge(t, num_items=k)
    if kind == "rlcer":
        output = {
            "judgement": draw(st.lists(st.booleans(), min_size=k, max_size=k)),
            "final_score": draw(st.floats(-50, 50)),
        }
        return parsing.rlcer_verifier_schema(k), output, lambda t: parsing.parse_rlcer_verifier(t, num_items=k)
    if kind == "rating":
        return parsing.rating_schema(), {"rating": draw(st.sampled_from([0, 1]))}, parsing.parse_rating
    if kind == "grounded":
        weights = draw(st.lists(st.floats(0, 10), min_size=k, max_size=k))
        scores = {f"c_{i + 1}": draw(st.floats(0, w)) for i, w in enumerate(weights)}
        output = {"scores": scores, "total": sum(scores.values()), "max_total": sum(weights), "reasoning": "ok"}
        return (
            parsing.grounded_scores_schema(weights),
            output,
            lambda t: parsing.parse_grounded_scores(t, weights=weights),
        )
    if kind == "meta":
        verdict = draw(st.sampled_from(["VALID"] + [f"INVALID: {c}" for c in MEDICAL]))
        return (
            parsing.meta_verdict_schema(MEDICAL),
            {"verdict": verdict},
            lambda t: parsing.parse_meta_verdict(t, categories=MEDICAL),
        )
    output = {"valid": draw(st.booleans()), "reason": "brief"}
    return parsing.rubric_validity_schema(), output, parsing.parse_rubric_validity


@settings(max_examples=300)
@given(schema_conforming())
def test_outputs_conforming_to_the_judge_schemas_always_parse(case):
    schema, output, parse = case
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(output, schema)
    assert parse(json.dumps(output)).ok


def test_judge_schemas_reject_what_the_parsers_reject():
    assert not jsonschema.Draft202012Validator(parsing.rating_schema()).is_valid({"rating": 2})
    assert not jsonschema.Draft202012Validator(parsing.srar_judge_schema(2)).is_valid(
        [{"id": 1, "satisfied": True, "step": 0}]
    )
    grounded = jsonschema.Draft202012Validator(parsing.grounded_scores_schema([1.0]))
    assert not grounded.is_valid({"scores": {"c_1": 1.5}, "total": 1.5, "max_total": 1, "reasoning": ""})
    assert not jsonschema.Draft202012Validator(parsing.meta_verdict_schema(MEDICAL)).is_valid(
        {"verdict": "INVALID: Foo"}
    )


# ---------------------------------------------------------------- fuzzing: every parser, adversarial outputs


@settings(max_examples=2000, suppress_health_check=[HealthCheck.too_slow])
@given(outputs.soup)
def test_no_parser_raises_and_every_value_is_in_bounds_on_arbitrary_text(text):
    counter, failed = FailureCounter(), 0
    for _name, result, check in parse_everything(text):
        check(result)
        counter.record(result)
        failed += not result.ok
    assert counter.failed == failed and counter.parsed == len(ARRAY_PARSERS) + len(RUBRIC_PARSERS)


@settings(max_examples=300)
@given(st.text(max_size=200))
def test_no_parser_raises_on_unicode_text(text):
    for _name, result, check in parse_everything(text):
        check(result)


CASES = {
    "srar_judge": (outputs.srar_judge_cases(), parsing.parse_srar_judge, "srar_judge"),
    "rlcer_verifier": (outputs.rlcer_verifier_cases(), parsing.parse_rlcer_verifier, "rlcer_verifier"),
    "rating": (outputs.rating_cases(), parsing.parse_rating, "rating"),
    "grounded": (outputs.grounded_cases(), parsing.parse_grounded_scores, "grounded"),
    "meta_verdict": (outputs.meta_verdict_cases(), parsing.parse_meta_verdict, "meta_verdict"),
    "rubric_validity": (outputs.rubric_validity_cases(), parsing.parse_rubric_validity, "rubric_validity"),
    "step_correctness": (outputs.step_correctness_cases(), parsing.parse_step_correctness, "step_correctness"),
    "rlcer_rubricator": (outputs.rlcer_rubricator_cases(), parsing.parse_rlcer_rubricator, "rlcer"),
    "evorubric": (outputs.evorubric_cases(), parsing.parse_evorubric_rubrics, "evorubric"),
    "srar_rubric": (outputs.srar_rubric_cases(), parsing.parse_srar_rubric, "srar"),
    "rgr_criteria": (outputs.rgr_criteria_cases(), parsing.parse_rgr_criteria, "rgr"),
}


def _check_case(case, parse, kind):
    result = parse(case.text, **case.kwargs)
    if kind in FORMATS:
        check_rubric_result(result, kind, case.kwargs["max_items"])
    else:
        _, spec, fill = ARRAY_PARSERS[kind]
        if kind in ("srar_judge", "rlcer_verifier", "grounded"):  # shapes follow the case's own arguments
            k = len(case.kwargs["weights"]) if kind == "grounded" else case.kwargs["num_items"]
            high = {"awarded_k": np.array(case.kwargs.get("weights", []))}
            spec = {name: ((k,), dtype, low, high.get(name, hi)) for name, (_s, dtype, low, hi) in spec.items()}
            fill = {name: np.full(k, -1 if name == "step_k" else 0) for name in spec}
        check_array_result(result, spec, fill)
    # the failure flag is set, with a reason, exactly when the output is invalid
    assert result.ok == case.ok, (case.text, result.reason, result.detail)
    if not case.ok and case.reasons is not None:
        assert result.reason in case.reasons, (case.text, result.reason, result.detail)
    if case.ok:
        if isinstance(case.expected, outputs.RubricSummary):
            summary = tuple((c.kind.name, c.weight, c.text, c.category) for c in result.rubric.criteria)
            assert result.rubric.format == case.expected.format and summary == case.expected.items
            assert dict(result.declared) == (case.expected.declared or {})
        else:
            for name, value in case.expected.items():
                np.testing.assert_array_equal(result.values[name], value)
                assert result.values[name].dtype == value.dtype


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_valid_outputs_parse_exactly_and_each_defect_fails_with_its_reason(name, data):
    strategy, parse, kind = CASES[name]
    _check_case(data.draw(strategy), parse, kind)
