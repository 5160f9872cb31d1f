"""Judge agreement (`rubric_jax.judges.agreement`): every statistic against a table computed by hand in the
comments (kappa = (p_o - p_e) / (1 - p_e), p_e = P(first 1) P(second 1) + P(first 0) P(second 0)), the defined
results of degenerate inputs (without warnings), the criteria permutation and response padding round trips, the
human-labels reader's errors, and `measure_agreement` with scripted in-process judges."""

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.judges import agreement
from rubric_jax.judges.base import Judge, JudgeRequest, RolloutVerdict, Verdicts
from rubric_jax.judges.records import JudgedRollout
from rubric_jax.rubrics.schema import Criterion, ItemKind, Rubric

# Two named criteria, weights 3 and 1 (rubric score = (3 s_accuracy + s_clarity) / 4).
RUBRIC = Rubric((Criterion("Is accurate.", 3.0, name="accuracy"), Criterion("Is clear.", 1.0, name="clarity")))


def verdict(*scores, steps=None) -> RolloutVerdict:
    return RolloutVerdict(satisfied=scores, item_step=steps)


# ---------------------------------------------------------------- statistics


def test_binarize_cuts_at_one_half():
    np.testing.assert_array_equal(agreement.binarize([0.0, 0.49, 0.5, 0.75, 1.0]), [0, 0, 1, 1, 1])


def test_kappa_of_a_hand_computed_table():
    # rows: first rater, columns: second rater
    #              second 0  second 1
    #   first 0        3         2
    #   first 1        1         4          N = 10
    # p_o = (3 + 4) / 10 = 0.7; P(first 1) = 5/10, P(second 1) = 6/10
    # p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5; kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4
    first = [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    second = [0, 0, 0, 1, 1, 0, 1, 1, 1, 1]
    result = agreement.binary_agreement(first, second)
    assert result.pairs == 10 and result.confusion == ((3, 2), (1, 4))
    assert result.agreement == pytest.approx(0.7) and result.kappa == pytest.approx(0.4)


def test_kappa_of_systematic_disagreement_is_minus_one():
    # p_o = 0; P(first 1) = P(second 1) = 1/2, p_e = 1/2; kappa = (0 - 1/2) / (1/2) = -1
    result = agreement.binary_agreement([1, 0, 1, 0], [0, 1, 0, 1])
    assert result.agreement == 0.0 and result.kappa == pytest.approx(-1.0)
    assert result.confusion == ((0, 2), (2, 0))


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("first, second, agreed, kappa", [
    ([1, 1, 1], [1, 1, 1], 1.0, math.nan),  # both constant on one label: p_e = 1, 0 / 0: undefined
    ([0, 0], [0, 0], 1.0, math.nan),
    ([1, 1], [0, 0], 0.0, 0.0),  # constant on different labels: p_o = 0, p_e = 1 * 0 + 0 * 1 = 0 -> 0
    ([1, 1, 1, 1], [1, 1, 0, 0], 0.5, 0.0),  # one constant: p_e = 1 * 1/2 + 0 * 1/2 = 1/2 = p_o -> 0
    ([], [], math.nan, math.nan),  # nothing to compare
])
def test_degenerate_kappa_is_defined(first, second, agreed, kappa):
    result = agreement.binary_agreement(first, second)
    assert result.pairs == len(first)
    for got, expected in ((result.agreement, agreed), (result.kappa, kappa)):
        assert math.isnan(got) if math.isnan(expected) else got == pytest.approx(expected)


def test_binary_agreement_rejects_bad_labels():
    with pytest.raises(ValueError, match="0 or 1"):
        agreement.binary_agreement([0, 2], [0, 1])
    with pytest.raises(ValueError, match="one length"):
        agreement.binary_agreement([0, 1], [0])


def test_correlations_of_hand_computed_scores():
    # x = [1, 2, 3], y = [1, 3, 2]: deviations [-1, 0, 1] and [-1, 1, 0]; r = 1 / sqrt(2 * 2) = 0.5, and the
    # ranks equal the values, so rho = 0.5 too
    result = agreement.score_correlation([1.0, 2.0, 3.0], [1.0, 3.0, 2.0])
    assert (result.n, result.note) == (3, "")
    assert result.pearson == pytest.approx(0.5) and result.spearman == pytest.approx(0.5)
    # x = [0, 0.1, 1], y = [0, 0.2, 0.3] (x 10: [0, 1, 10], [0, 2, 3]; means 11/3, 5/3): deviations * 3
    # [-11, -8, 19] and [-5, 1, 4]; r = 123 / sqrt(546 * 42); monotone, so rho = 1
    result = agreement.score_correlation([0.0, 0.1, 1.0], [0.0, 0.2, 0.3])
    assert result.pearson == pytest.approx(123 / math.sqrt(546 * 42)) and result.spearman == pytest.approx(1.0)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("first, second, note", [
    ([0.5], [0.5], "fewer than 2 responses (1)"),
    ([], [], "fewer than 2 responses (0)"),
    ([0.5, 0.5, 0.5], [0.0, 0.5, 1.0], "the first rater's scores are constant"),
    ([0.5, 0.5], [1.0, 1.0], "the first and second rater's scores are constant"),
])
def test_degenerate_correlations_are_nan_with_a_note(first, second, note):
    result = agreement.score_correlation(first, second)
    assert math.isnan(result.pearson) and math.isnan(result.spearman) and result.note == note


def test_unanimous_fraction():
    # columns: (1, 1, 1) yes, (0, 1, 0) no, (1, 1, 1) yes -> 2/3
    assert agreement.unanimous_fraction([[1, 0, 1], [1, 1, 1], [1, 0, 1]]) == pytest.approx(2 / 3)
    assert math.isnan(agreement.unanimous_fraction(np.zeros((2, 0))))


def test_rubric_scores_weigh_the_criteria_and_leave_out_what_is_not_rated():
    srar = Rubric((Criterion("Sets up.", kind=ItemKind.SUGGEST), Criterion("Divides by 0.", kind=ItemKind.PITFALL)),
                  format="srar")
    signed = Rubric((Criterion("Helps.", 2.0), Criterion("Harms.", -2.0)))
    rubrics = [RUBRIC, RUBRIC, srar, srar, signed, Rubric(), RUBRIC, RUBRIC]
    ratings = [verdict(1, 0), verdict(0.5, 1), verdict(1, 1), verdict(1, 0), verdict(1, 1), verdict(),
               RolloutVerdict.failure("no_json"), None]
    # (3*1 + 0)/4; (3*0.5 + 1)/4; a met pitfall earns nothing: (1 + 0)/2; avoided: (1 + 1)/2; a negative weight
    # counts 0: 2/2; an empty rubric 0; failed and missing NaN
    expected = [0.75, 0.625, 0.5, 1.0, 1.0, 0.0, math.nan, math.nan]
    np.testing.assert_allclose(agreement.rubric_scores(rubrics, ratings), expected, rtol=1e-6)


def test_compare_ratings_by_hand():
    first = [verdict(1, 1), verdict(1, 0), verdict(0, 0), RolloutVerdict.failure("no_json"), verdict(1, 1)]
    second = [verdict(1, 0), verdict(1, 0), verdict(0, 1), verdict(1, 1), None]
    report = agreement.compare_ratings([RUBRIC] * 5, first, second)
    # items 0-2 compared (item 3: first failed; item 4: second has no rating)
    assert report["items_compared"] == 3
    assert report["excluded"] == {"first": {"missing": 0, "failed": 1, "failed_by_reason": {"no_json": 1}},
                                  "second": {"missing": 1, "failed": 0, "failed_by_reason": {}}}
    # item-major pairs: first [1, 1, 1, 0, 0, 0], second [1, 0, 1, 0, 0, 1]; equal at 0, 2, 3, 4: p_o = 4/6;
    # P(first 1) = P(second 1) = 1/2, p_e = 1/2; kappa = (2/3 - 1/2) / (1/2) = 1/3
    overall = report["overall"]
    assert overall["pairs"] == 6 and overall["confusion"] == ((2, 1), (1, 2))
    assert overall["agreement"] == pytest.approx(4 / 6) and overall["kappa"] == pytest.approx(1 / 3)
    # accuracy: [1, 1, 0] both: kappa 1. clarity: first [1, 0, 0], second [0, 0, 1]: p_o = 1/3, both P(1) = 1/3,
    # p_e = 1/9 + 4/9 = 5/9, kappa = (1/3 - 5/9) / (4/9) = -1/2
    assert list(report["criteria"]) == ["accuracy", "clarity"]
    assert report["criteria"]["accuracy"]["agreement"] == 1.0 and report["criteria"]["accuracy"]["kappa"] == 1.0
    assert report["criteria"]["clarity"]["agreement"] == pytest.approx(1 / 3)
    assert report["criteria"]["clarity"]["kappa"] == pytest.approx(-0.5)
    # scores (3 s_a + s_c)/4: first [1, 0.75, 0], second [0.75, 0.75, 0.25]; deviations * 12 [5, 2, -7] and
    # [2, 2, -4]: r = 42 / sqrt(78 * 24); ranks [3, 2, 1] and [2.5, 2.5, 1]: rho = 1.5 / sqrt(2 * 1.5);
    # second - first = [-0.25, 0, 0.25]: mean 0, mean |.| 1/6
    scores = report["scores"]
    assert scores["n"] == 3 and scores["pearson"] == pytest.approx(42 / math.sqrt(78 * 24), rel=1e-6)
    assert scores["spearman"] == pytest.approx(1.5 / math.sqrt(3))
    assert scores["mean_difference"] == pytest.approx(0, abs=1e-7)
    assert scores["mean_abs_difference"] == pytest.approx(1 / 6)


def test_self_consistency_by_hand():
    runs = [
        [verdict(1, 0), verdict(1, 1), verdict(1, 1)],
        [verdict(1, 0), verdict(0, 1), RolloutVerdict.failure("request_failed")],  # item 2 is excluded
        [verdict(1, 1), verdict(1, 1), verdict(0, 0)],
    ]
    rubric = Rubric((Criterion("a"), Criterion("b")))  # weights 1: score = mean of the two
    result = agreement.self_consistency([rubric] * 3, runs)
    # labels [1, 0, 1, 1], [1, 0, 0, 1], [1, 1, 1, 1]: unanimous at columns 0 and 3 -> 1/2
    # runs 1-2: p_o 3/4, P(1) 3/4 and 1/2, p_e = 3/8 + 1/8 = 1/2, kappa 1/2
    # runs 1-3: p_o 3/4, p_e = 3/4 * 1 + 1/4 * 0 = 3/4, kappa 0; runs 2-3: p_o 1/2, p_e 1/2, kappa 0
    assert (result["repeats"], result["items_compared"], result["items_excluded"], result["pairs"]) == (3, 2, 1, 4)
    assert result["unanimous_fraction"] == 0.5
    assert result["mean_pairwise_agreement"] == pytest.approx((3 / 4 + 3 / 4 + 1 / 2) / 3)
    assert result["mean_pairwise_kappa"] == pytest.approx((1 / 2 + 0 + 0) / 3) and result["undefined_kappa_runs"] == 0
    # scores: item 0 [0.5, 0.5, 1], item 1 [1, 0.5, 1]: each population std sqrt((1/36 + 1/36 + 4/36) / 3)
    assert result["mean_score_std"] == pytest.approx(math.sqrt(1 / 18), rel=1e-6)
    assert result["first_pair"]["confusion"] == ((1, 0), (1, 2))


@pytest.mark.filterwarnings("error")
def test_self_consistency_of_a_constant_judge_has_undefined_kappa():
    runs = [[verdict(1, 1)] * 2] * 3
    result = agreement.self_consistency([RUBRIC] * 2, runs)
    assert result["unanimous_fraction"] == 1.0 and result["mean_pairwise_agreement"] == 1.0
    assert math.isnan(result["mean_pairwise_kappa"]) and result["undefined_kappa_runs"] == 3
    assert result["mean_score_std"] == 0.0
    nothing = agreement.self_consistency([RUBRIC], [[RolloutVerdict.failure("x")], [verdict(1, 1)]])
    assert nothing["items_compared"] == 0 and nothing["pairs"] == 0
    assert all(math.isnan(nothing[key]) for key in ("unanimous_fraction", "mean_pairwise_agreement",
                                                    "mean_pairwise_kappa", "mean_score_std"))
    with pytest.raises(ValueError, match="at least 2 runs"):
        agreement.self_consistency([RUBRIC], [[verdict(1, 1)]])


# ---------------------------------------------------------------- perturbations

THREE = Rubric((Criterion("a", 1.0, name="a"), Criterion("b", 2.0, name="b"), Criterion("c", 3.0, name="c")))
REQUEST = JudgeRequest("q?", "an answer", THREE, reference="ref", num_steps=2)


def test_permute_then_unpermute_restores_the_order():
    permuted = agreement.permute_criteria(REQUEST, [2, 0, 1])
    assert [c.name for c in permuted.rubric.criteria] == ["c", "a", "b"]
    assert (permuted.question, permuted.response, permuted.reference, permuted.num_steps) == ("q?", "an answer",
                                                                                              "ref", 2)
    # the inverse order [1, 2, 0] puts them back
    assert agreement.permute_criteria(permuted, [1, 2, 0]) == REQUEST
    # a verdict on the permuted request (c: 1, a: 0, b: 0.5, with steps) in the original order: a 0, b 0.5, c 1
    assert agreement.unpermute_verdict(verdict(1, 0, 0.5, steps=(3, 1, 2)), [2, 0, 1]) == verdict(0, 0.5, 1,
                                                                                                steps=(1, 2, 3))
    failure = RolloutVerdict.failure("no_json", "no JSON")
    assert agreement.unpermute_verdict(failure, [2, 0, 1]) is failure


def test_a_bad_order_is_refused():
    for order in ([0, 1], [0, 0, 1], [0, 1, 3]):
        with pytest.raises(ValueError, match="permutation of range"):
            agreement.permute_criteria(REQUEST, order)


@given(st.integers(1, 8).flatmap(lambda k: st.tuples(
    st.permutations(range(k)), st.lists(st.floats(0, 1), min_size=k, max_size=k))))
def test_unpermuting_recovers_the_verdicts_for_any_order(case):
    """A judge that scores each criterion by its text, whatever the position it is shown in: the verdict on the
    permuted request, un-permuted, is the verdict on the original one."""
    order, scores = case
    rubric = Rubric(tuple(Criterion(f"criterion {k}") for k in range(len(order))))
    by_text = {c.text: s for c, s in zip(rubric.criteria, scores)}
    request = JudgeRequest("q", "r", rubric)
    permuted = agreement.permute_criteria(request, order)
    seen = verdict(*(by_text[c.text] for c in permuted.rubric.criteria), steps=tuple(order))
    assert agreement.unpermute_verdict(seen, order) == verdict(*scores, steps=tuple(range(len(order))))


def test_criteria_orders_are_seeded_and_never_the_identity():
    assert agreement.criteria_order(0, 0, 0).tolist() == [] and agreement.criteria_order(1, 0, 0).tolist() == [0]
    for index in range(20):
        assert agreement.criteria_order(2, 0, index).tolist() == [1, 0]  # the only other order of 2
        order = agreement.criteria_order(4, 7, index)
        assert sorted(order.tolist()) == [0, 1, 2, 3] and order.tolist() != [0, 1, 2, 3]
        assert order.tolist() == agreement.criteria_order(4, 7, index).tolist()
    assert len({tuple(agreement.criteria_order(4, 7, i)) for i in range(20)}) > 1  # per item, not one order


def test_padding_appends_whole_filler_sentences():
    sentence = agreement.PAD_SENTENCE
    assert len(sentence) == 30
    assert agreement.padding(0) == "" and agreement.padding(1) == sentence and agreement.padding(30) == sentence
    assert agreement.padding(31) == f"{sentence} {sentence}"  # 30 < 31 <= 61
    padded = agreement.pad_response(REQUEST, 31)
    assert padded.response == f"an answer\n\n{sentence} {sentence}"
    assert padded.rubric == THREE and padded.num_steps == 2 and padded.question == "q?"
    with pytest.raises(ValueError, match="pad_chars"):
        agreement.padding(-1)


@given(st.integers(1, 500))
def test_padding_is_the_fewest_sentences_of_at_least_n_characters(n):
    assert len(agreement.padding(n)) >= n > len(agreement.padding(n)) - (len(agreement.PAD_SENTENCE) + 1)


# ---------------------------------------------------------------- human labels

ITEMS = [JudgedRollout(id=f"item-{i}", request=JudgeRequest("q", f"response {i}", RUBRIC)) for i in range(3)]


def test_human_labels_are_read_onto_the_items(tmp_path):
    path = tmp_path / "labels.jsonl"
    path.write_text('{"id": "item-2", "satisfied": [0, 1]}\n\n{"id": "item-0", "satisfied": [1, 1]}\n')
    assert agreement.read_human_labels(path, ITEMS) == [verdict(1, 1), None, verdict(0, 1)]


@pytest.mark.parametrize("line, message", [
    ('{"id": "item-9", "satisfied": [1, 0]}', "no item has the id 'item-9'"),
    ('{"id": "item-0", "satisfied": [1]}', "item 'item-0' has 2 criteria, the label gives 1"),
    ('{"id": "item-0", "satisfied": [1, 2]}', '"satisfied" must be a list of 0 and 1, got [1, 2]'),
    ('{"id": "item-0", "satisfied": [1, 0.5]}', '"satisfied" must be a list of 0 and 1'),
    ('{"id": "item-0", "satisfied": [true, false]}', '"satisfied" must be a list of 0 and 1'),
    ('{"id": "item-0", "satisfied": "10"}', '"satisfied" must be a list of 0 and 1'),
    ('{"id": "item-0"}', 'exactly the keys "id" and "satisfied"'),
    ('{"id": "item-0", "satisfied": [1, 0], "note": "x"}', 'exactly the keys "id" and "satisfied"'),
    ('[1, 0]', 'expected an object'),
    ('{"id": 0, "satisfied": [1, 0]}', "no item has the id 0"),
    ('{"id": "item-0", "satisfied": [1, 0]', "Expecting"),
    ('{"id": "item-1", "satisfied": [1, 0]}', "item 'item-1' is labelled twice"),
])
def test_a_bad_label_line_is_named(tmp_path, line, message):
    path = tmp_path / "labels.jsonl"
    path.write_text('{"id": "item-1", "satisfied": [0, 0]}\n' + line + "\n")
    with pytest.raises(ValueError) as error:
        agreement.read_human_labels(path, ITEMS)
    assert str(error.value).startswith(f"{path}:2: ") and message in str(error.value)


# ---------------------------------------------------------------- measuring with judges


class ScriptedJudge(Judge):
    """Satisfies a criterion when its text's last word is in the response; `primacy`: the first criterion shown
    is always satisfied; `max_length`: a longer response satisfies nothing; fails on responses containing
    "FAIL". Counts its calls and closes."""

    def __init__(self, primacy=False, max_length=None):
        self.primacy, self.max_length = primacy, max_length
        self.calls, self.closed = 0, False

    def judge(self, requests, max_items):
        self.calls += 1
        rows = []
        for r in requests:
            if "FAIL" in r.response:
                rows.append(RolloutVerdict.failure("no_json"))
                continue
            long = self.max_length is not None and len(r.response) > self.max_length
            rows.append(verdict(*(float(not long and ((self.primacy and k == 0) or c.text.split()[-1] in r.response))
                                  for k, c in enumerate(r.rubric.criteria))))
        return Verdicts.from_rollouts(rows, max_items)

    def close(self):
        self.closed = True


FRUIT = Rubric((Criterion("mentions apples", name="apples"), Criterion("mentions pears", name="pears")))
FRUIT_ITEMS = [JudgedRollout(id=str(i), request=JudgeRequest("Name fruit.", text, FRUIT))
               for i, text in enumerate(["apples and pears", "apples", "pears", "none", "FAIL"])]


def test_measure_agreement_compares_and_probes_the_first_judge():
    judges = []

    def biased(seed):
        judges.append(ScriptedJudge(primacy=True, max_length=40))
        return judges[-1]

    a = agreement.Rater("biased", judge_at=biased)
    b = agreement.Rater("honest", ratings=[verdict(1, 1), verdict(1, 0), verdict(0, 1), verdict(0, 0), None])
    lines = []
    report = agreement.measure_agreement(FRUIT_ITEMS, a, b, agreement.Probes(permute=True, pad_chars=40),
                                         log=lines.append)
    assert len(judges) == 3 and all(j.closed and j.calls == 1 for j in judges)
    assert lines == ["judging 5 items: A, biased", "judging 5 items: criteria permuted",
                     "judging 5 items: responses padded by 40 chars"]
    assert report["rater_a"] == "biased" and report["rater_b"] == "honest" and report["probed"] == "biased"
    # A (apples shown first, always satisfied): [1, 1, 1, 0, 1, 1, 1, 0]; B [1, 1, 1, 0, 0, 1, 0, 0]: p_o 6/8;
    # P(A 1) 6/8, P(B 1) 4/8, p_e = 3/8 + 1/8 = 1/2; kappa = (3/4 - 1/2) / (1/2) = 1/2
    a_vs_b = report["a_vs_b"]
    assert a_vs_b["items_compared"] == 4 and a_vs_b["excluded"]["first"]["failed_by_reason"] == {"no_json": 1}
    assert a_vs_b["overall"]["agreement"] == 0.75 and a_vs_b["overall"]["kappa"] == pytest.approx(0.5)
    # permuted (pears first, always satisfied), item-major in the original order: [1, 1, 1, 1, 0, 1, 0, 1];
    # against [1, 1, 1, 0, 1, 1, 1, 0]: p_o 4/8, both P(1) 6/8, p_e = 9/16 + 1/16 = 5/8; kappa = -1/8 / 3/8
    position = report["position"]
    assert position["overall"]["agreement"] == 0.5 and position["overall"]["kappa"] == pytest.approx(-1 / 3)
    # scores [1, 0.5, 1, 0.5] -> [1, 1, 0.5, 0.5]: mean change 0, mean |change| 1/4
    assert position["scores"]["mean_difference"] == 0 and position["scores"]["mean_abs_difference"] == 0.25
    # padded past 40 characters: nothing satisfied; scores [1, 0.5, 1, 0.5] -> 0: mean shift -3/4
    length = report["length"]
    assert length["pad_chars"] == 40 and length["overall"]["confusion"] == ((2, 0), (6, 0))
    assert length["scores"]["mean_difference"] == -0.75 and "second rater's scores are constant" in \
        length["scores"]["note"]


def test_the_probed_judge_is_b_when_a_is_saved_and_repeats_use_new_seeds():
    seeds = []

    def honest(seed):
        seeds.append(seed)
        return ScriptedJudge()

    saved = agreement.Rater("saved", ratings=[verdict(1, 1)] * 5)
    report = agreement.measure_agreement(FRUIT_ITEMS, saved, agreement.Rater("honest", judge_at=honest),
                                         agreement.Probes(repeats=3, seed=5))
    assert seeds == [5, 6, 7] and report["probed"] == "honest"
    assert report["self_consistency"]["unanimous_fraction"] == 1.0 and report["self_consistency"]["items_compared"] == 4


def test_a_plan_that_measures_nothing_is_refused():
    saved = agreement.Rater("saved", ratings=[None] * 5)
    with pytest.raises(ValueError, match="nothing to measure"):
        agreement.check_plan(agreement.Rater("judge", judge_at=lambda seed: ScriptedJudge()), None, agreement.Probes())
    with pytest.raises(ValueError, match="they need a judge"):
        agreement.check_plan(saved, saved, agreement.Probes(permute=True))
    with pytest.raises(ValueError, match="exactly one of"):
        agreement.Rater("both", ratings=[], judge_at=lambda seed: ScriptedJudge())
    with pytest.raises(ValueError, match="repeats must be an int >= 1"):
        agreement.Probes(repeats=0)


def test_report_files_say_undefined_and_null(tmp_path):
    ratings = [verdict(1, 1), verdict(1, 1), RolloutVerdict.failure("no_json"), None, None]
    report = agreement.measure_agreement(FRUIT_ITEMS, agreement.Rater("A", ratings=ratings),
                                         agreement.Rater("B", ratings=[verdict(1, 1)] * 5))
    markdown, plot, numbers = agreement.write_report(report, tmp_path / "report.md")
    assert (plot.name, numbers.name) == ("report.png", "report.json") and plot.read_bytes()[:4] == b"\x89PNG"
    data = json.loads(numbers.read_text())
    assert data["a_vs_b"]["overall"] == {"pairs": 4, "agreement": 1.0, "kappa": None, "confusion": [[0, 0], [0, 4]]}
    text = markdown.read_text()
    assert "| all criteria | 4 | 100.0% | undefined | 4 | 0 | 0 | 0 |" in text
    assert "Items compared: 2 of 5. Excluded: A failed on 1 (no_json 1), has no rating for 2" in text
    assert "(fewer than 2 responses" not in text and "constant" in text and "![confusion tables](report.png)" in text
