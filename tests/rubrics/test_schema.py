import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubric_jax.core import rewards
from rubric_jax.rubrics.schema import (
    FORMATS,
    PAD_KIND,
    Criterion,
    ItemKind,
    Rubric,
    rubric_arrays,
)

# ---------------------------------------------------------------- the papers' rubrics, by hand


def test_item_kinds_equal_the_core_srar_constants():
    assert (ItemKind.SUGGEST, ItemKind.PITFALL, ItemKind.BONUS, ItemKind.ANSWER) == (
        rewards.SUGGEST,
        rewards.PITFALL,
        rewards.BONUS,
        rewards.ANSWER,
    )
    assert len({int(k) for k in ItemKind}) == len(ItemKind) == 7


def test_rlcer_figure_11_rubric_and_its_arrays():
    # rlcer.txt Appendix C Figure 11: points 3, 3, 3, -4, -2 with categories
    points = [3, 3, 3, -4, -2]
    rubric = Rubric(
        criteria=tuple(
            Criterion(text=f"criterion {i}", weight=p, category="Reasoning Clarity & Flow")
            for i, p in enumerate(points)
        ),
        points_range=(-5, 5),
        format="rlcer",
    )
    arrays = rubric_arrays([rubric, Rubric()], max_items=6)
    np.testing.assert_array_equal(arrays.item_mask_bk, [[1, 1, 1, 1, 1, 0], [0] * 6])
    np.testing.assert_array_equal(arrays.item_weight_bk, [points + [0], [0] * 6])
    np.testing.assert_array_equal(arrays.item_kind_bk, [[4] * 5 + [PAD_KIND], [PAD_KIND] * 6])
    assert arrays.item_mask_bk.dtype == bool
    assert arrays.item_kind_bk.dtype == np.int32 and arrays.item_weight_bk.dtype == np.float32


def test_srar_appendix_14_rubric_kinds_go_to_the_core_types():
    kinds = [ItemKind.SUGGEST] * 3 + [ItemKind.PITFALL, ItemKind.BONUS, ItemKind.ANSWER]
    rubric = Rubric(criteria=tuple(Criterion(text="item", kind=k) for k in kinds), format="srar")
    arrays = rubric_arrays([rubric], max_items=8)
    np.testing.assert_array_equal(arrays.item_kind_bk[0, :6], [0, 0, 0, 1, 2, 3])
    np.testing.assert_array_equal(arrays.item_weight_bk[0], [1] * 6 + [0, 0])


def test_rubric_grounded_criterion_keeps_all_definition_1_fields():
    c = Criterion(
        text="States the mechanism",
        weight=2.5,
        name="Mechanism",
        required_elements=["oxidation", "catalyst"],
        keywords=("redox",),
        scoring_guide="full credit if both elements",
        verification_method="check the passage",
    )
    rubric = Rubric(criteria=(c,), format="rubric_grounded")
    assert rubric.criteria[0].required_elements == ("oxidation", "catalyst")  # lists are stored as tuples
    assert Rubric.from_dict(json.loads(json.dumps(rubric.to_dict()))) == rubric


def test_rgr_factual_and_process_criteria_and_an_empty_evorubric_rubric():
    rubric = Rubric(
        criteria=(
            Criterion(text="Final answer 42 J", weight=5, kind=ItemKind.FACTUAL),
            Criterion(text="Uses energy conservation", weight=2, kind=ItemKind.PROCESS),
        ),
        format="rgr",
    )
    assert [c.kind for c in rubric.criteria] == [ItemKind.FACTUAL, ItemKind.PROCESS]
    assert Rubric(criteria=(), format="evorubric", points_range=(-10, 10)).criteria == ()


def test_weights_are_stored_as_floats_and_kinds_as_item_kinds():
    c = Criterion(text="x", weight=np.int64(3), kind=5)
    assert type(c.weight) is float and c.weight == 3.0
    assert c.kind is ItemKind.FACTUAL


# ---------------------------------------------------------------- validation: one error per kind of bad rubric


def _rubric(format_="generic", points_range=None, **criterion):
    fields = {"text": "a criterion", **criterion}
    return Rubric(
        criteria=(Criterion(text="fine", kind=fields.get("kind", ItemKind.CRITERION)), Criterion(**fields)),
        points_range=points_range,
        format=format_,
    )


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Rubric(format="paper"), r"format must be one of"),
        (lambda: _rubric("srar", kind=ItemKind.SUGGEST, weight=0), r"criteria\[1\]\.weight: format 'srar'"),
        (lambda: _rubric("rlcer", weight=0), r"criteria\[1\]\.weight: format 'rlcer' requires integer points"),
        (lambda: _rubric("rlcer", weight=6), r"criteria\[1\]\.weight"),
        (lambda: _rubric("rlcer", weight=2.5), r"criteria\[1\]\.weight"),
        (lambda: _rubric("evorubric", weight=11), r"criteria\[1\]\.weight: format 'evorubric'"),
        (lambda: _rubric("evorubric", weight=0), r"criteria\[1\]\.weight"),
        (
            lambda: _rubric("rgr", kind=ItemKind.FACTUAL, weight=0),
            r"criteria\[1\]\.weight: format 'rgr' requires a positive",
        ),
        (lambda: _rubric("rubric_grounded", weight=-1), r"criteria\[1\]\.weight: format 'rubric_grounded'"),
        (lambda: _rubric("srar", kind=ItemKind.CRITERION), r"criteria\[0\]\.kind: format 'srar' allows"),
        (lambda: _rubric("generic", points_range=(-5, 5), weight=7), r"criteria\[1\]\.weight: 7.0 is outside"),
        (lambda: _rubric(points_range=(5, -5)), r"points_range must have low <= high"),
        (lambda: _rubric(points_range=(0, 1, 2)), r"points_range must be None or \(low, high\)"),
        (lambda: _rubric(points_range=(0, math.nan)), r"points_range\[1\] must be finite"),
        (lambda: _rubric(points_range="0-5"), r"points_range must be None"),
        (lambda: Rubric(criteria=("not a criterion",)), r"criteria\[0\] must be a Criterion"),
        (lambda: Rubric(criteria="abc"), r"criteria must be a sequence"),
        (lambda: Criterion(text="  "), r"text must be a non-empty string"),
        (lambda: Criterion(text=3), r"text must be a non-empty string"),
        (lambda: Criterion(text="x", weight=math.inf), r"weight must be finite"),
        (lambda: Criterion(text="x", weight=math.nan), r"weight must be finite"),
        (lambda: Criterion(text="x", weight=True), r"weight must be a number"),
        (lambda: Criterion(text="x", weight="3"), r"weight must be a number"),
        (lambda: Criterion(text="x", kind=9), r"kind must be an ItemKind"),
        (lambda: Criterion(text="x", name=""), r"name must be a non-empty string"),
        (lambda: Criterion(text="x", category=5), r"category must be a non-empty string"),
        (lambda: Criterion(text="x", required_elements="abc"), r"required_elements must be a sequence of strings"),
        (lambda: Criterion(text="x", keywords=["ok", ""]), r"keywords\[1\] must be a non-empty string"),
        (lambda: Criterion(text="x", tags="axis:accuracy"), r"tags must be a sequence of strings"),
        (lambda: Criterion(text="x", scoring_guide=[]), r"scoring_guide must be a non-empty string"),
    ],
)
def test_invalid_rubrics_raise_a_value_error_naming_the_field(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    "data, message",
    [
        ([], r"rubric must be a mapping"),
        ({"criteria": [], "version": 2}, r"rubric: unknown keys \['version'\]"),
        ({"format": "srar"}, r"missing key 'criteria'"),
        ({"criteria": "x"}, r"'criteria' must be a list"),
        ({"criteria": [{"text": "a"}, "b"]}, r"criteria\[1\] must be a mapping"),
        ({"criteria": [{"text": "a"}, {"text": "b", "points": 3}]}, r"criteria\[1\]: unknown keys \['points'\]"),
        ({"criteria": [{"weight": 1}]}, r"criteria\[0\]: missing key 'text'"),
        ({"criteria": [{"text": "a", "kind": "HINT"}]}, r"criteria\[0\]\.kind must be one of"),
        ({"criteria": [{"text": "a", "kind": 0}]}, r"criteria\[0\]\.kind must be one of"),
        ({"criteria": [{"text": "a"}, {"text": "b", "weight": "x"}]}, r"criteria\[1\]\.weight must be a number"),
        ({"format": "rlcer", "criteria": [{"text": "a", "weight": 9}]}, r"criteria\[0\]\.weight: format 'rlcer'"),
    ],
)
def test_from_dict_is_strict_and_names_the_index_and_key(data, message):
    with pytest.raises(ValueError, match=message):
        Rubric.from_dict(data)


def test_from_dict_fills_omitted_optional_fields_with_defaults():
    rubric = Rubric.from_dict({"criteria": [{"text": "a"}]})
    assert rubric == Rubric(criteria=(Criterion(text="a"),))


# ---------------------------------------------------------------- round trips, hypothesis

_words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12).filter(str.strip)
_optional_words = st.none() | _words


@st.composite
def valid_rubrics(draw):
    format_ = draw(st.sampled_from(sorted(FORMATS)))
    spec = FORMATS[format_]
    kinds = sorted(spec.kinds)
    if spec.integral:
        magnitude = st.integers(1, int(spec.high))
        weight = st.builds(lambda m, s: float(m * s), magnitude, st.sampled_from([1, -1]))
    elif spec.low >= 0:
        weight = st.floats(0, 1e6, exclude_min=spec.low_open)
    else:
        weight = st.floats(-1e6, 1e6)
    criteria = draw(
        st.lists(
            st.builds(
                Criterion,
                text=_words,
                weight=weight,
                kind=st.sampled_from(kinds),
                name=_optional_words,
                category=_optional_words,
                required_elements=st.lists(_words, max_size=3).map(tuple),
                keywords=st.lists(_words, max_size=3).map(tuple),
                tags=st.lists(_words, max_size=2).map(tuple),
                scoring_guide=_optional_words,
                verification_method=_optional_words,
            ),
            max_size=6,
        )
    )
    points_range = (spec.low, spec.high) if spec.integral else None
    return Rubric(criteria=tuple(criteria), points_range=points_range, format=format_)


@settings(max_examples=200)
@given(valid_rubrics())
def test_to_dict_from_dict_round_trip_through_json(rubric):
    data = rubric.to_dict()
    assert Rubric.from_dict(data) == rubric
    assert Rubric.from_dict(json.loads(json.dumps(data))) == rubric


@settings(max_examples=100)
@given(st.lists(valid_rubrics(), max_size=5), st.integers(0, 3))
def test_rubric_arrays_pad_each_rubric_to_max_items(rubrics, extra):
    max_items = max([len(r.criteria) for r in rubrics] + [0]) + extra
    arrays = rubric_arrays(rubrics, max_items)
    assert (
        arrays.item_mask_bk.shape
        == arrays.item_kind_bk.shape
        == arrays.item_weight_bk.shape
        == (len(rubrics), max_items)
    )
    for b, rubric in enumerate(rubrics):
        n = len(rubric.criteria)
        assert arrays.item_mask_bk[b].tolist() == [True] * n + [False] * (max_items - n)
        assert arrays.item_kind_bk[b].tolist() == [int(c.kind) for c in rubric.criteria] + [PAD_KIND] * (max_items - n)
        np.testing.assert_array_equal(
            arrays.item_weight_bk[b], np.array([c.weight for c in rubric.criteria] + [0] * (max_items - n), np.float32)
        )


def test_rubric_arrays_rejects_rubrics_longer_than_max_items_and_bad_arguments():
    long = Rubric(criteria=(Criterion(text="a"), Criterion(text="b")))
    with pytest.raises(ValueError, match=r"rubrics\[1\] has 2 criteria, more than max_items=1"):
        rubric_arrays([Rubric(), long], max_items=1)
    with pytest.raises(ValueError, match="max_items must be a non-negative integer"):
        rubric_arrays([long], max_items=-1)
    with pytest.raises(ValueError, match=r"rubrics\[0\] must be a Rubric"):
        rubric_arrays([{"criteria": []}], max_items=1)
