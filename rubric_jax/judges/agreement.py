"""Can the judge be trusted? Agreement between two raters of the same rubric items, and one judge's stability
(`rubric-jax judge-agreement`; docs/judge_agreement.md). The rubric-grounded paper names cross-judge
reliability as missing (rubric_grounded_rl.txt, section 7).

Items are `records.JudgedRollout`s (question, response, rubric; a run's saved rollouts included). A rater gives
each item an Optional[RolloutVerdict]: None when it has no rating (no saved verdict, no human label), a failed
verdict when the judge failed. Both are left out of every statistic and counted (`exclusion_counts`). Raters
(`Rater`): an LLM judge, run over the items here; the verdicts a run saved; human labels (`read_human_labels`).

Statistics, all over the items both raters rated (two lists of verdicts "first" and "second"):
- (item, criterion) verdicts: each score binarised at 0.5 (`binarize`: satisfied iff score >= 0.5; binary judges
  give 0 / 1 already, the grounded judge's partial credit is cut there), then percent agreement, Cohen's kappa
  (`sklearn.metrics.cohen_kappa_score`) and the confusion table (`sklearn.metrics.confusion_matrix`, rows the
  first rater's label 0 / 1, columns the second's) per criterion and over every pair (`binary_agreement`).
  Criteria are grouped across items by `criterion_key` (the criterion's name, else its position "item<k>": the
  training metrics' "rubric/<name>" grouping).
- per response: the rubric score (`rubric_scores`: `core.rewards.weighted_fraction` of
  `core.rewards.typed_item_credit`, `rubric-jax eval`'s "eval/rubric_score"; unbinarised scores), its Pearson and
  Spearman correlations (`scipy.stats.pearsonr`, `spearmanr`: `score_correlation`) and the mean difference
  second - first, signed and absolute.
- self-consistency of one judge over R repeats (`self_consistency`): mean pairwise agreement and kappa, the
  fraction of (item, criterion) verdicts unanimous over the repeats, and the mean over items of the population
  std of the rubric score over the repeats.
- position sensitivity: the items re-judged with their criteria in a seeded random order (`criteria_order`,
  `permute_criteria`), verdicts mapped back (`unpermute_verdict`) and compared with the unpermuted ones.
- length sensitivity: the items re-judged with content-free filler appended to each response (`pad_response`),
  compared with the unpadded verdicts.

Degenerate cases, defined: no pair -> agreement and kappa NaN; kappa is NaN ("undefined") when both raters give
every pair one and the same label (its chance agreement is 1, so (p_o - p_e) / (1 - p_e) is 0 / 0); a correlation
is NaN with a note for fewer than 2 responses or a rater whose scores are constant; means of nothing are NaN. NaN
is written as null in the JSON report and "undefined" in the markdown. A comparison with no (item, criterion)
pair (every item failed or unrated on a side, or the items compared have no criteria) compared nothing: the
report lists it under "incomparable" (`incomparable`), and `rubric-jax judge-agreement` exits 1.
"""

import collections
import dataclasses
import itertools
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import jax.numpy as jnp
import numpy as np
from scipy import stats
from sklearn import metrics

from rubric_jax import strict_json
from rubric_jax.core import rewards
from rubric_jax.judges.base import Judge, JudgeRequest, RolloutVerdict, Verdicts
from rubric_jax.judges.records import JudgedRollout, jsonl_files, verdict_rows
from rubric_jax.rubrics.schema import Criterion, Rubric, rubric_arrays

THRESHOLD = 0.5  # a score >= THRESHOLD is "satisfied" for agreement and kappa
# The filler of the length probe: natural English that states nothing about the question or the response.
PAD_SENTENCE = "Nothing further is added here."

Ratings = Sequence[Optional[RolloutVerdict]]


# ---------------------------------------------------------------- statistics over arrays


def binarize(scores: Any) -> np.ndarray:
    """Scores in [0, 1] as labels int64 1 (satisfied: score >= 0.5) or 0, same shape."""
    return (np.asarray(scores, np.float64) >= THRESHOLD).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class BinaryAgreement:
    """Two raters' binary labels on the same `pairs`: the fraction with equal labels (`agreement`), Cohen's kappa
    and the confusion table `confusion[i][j]`, the number of pairs the first rater labels i and the second j."""

    pairs: int
    agreement: float
    kappa: float
    confusion: tuple[tuple[int, int], tuple[int, int]]


def binary_agreement(labels_first: Any, labels_second: Any) -> BinaryAgreement:
    """Percent agreement, Cohen's kappa (sklearn) and the 2 x 2 confusion table of two label arrays [P] of 0 / 1.

    Degenerate: P = 0 -> agreement and kappa NaN; both raters constant on the same label -> kappa NaN (sklearn
    divides 0 by 0 there; it is not called). ValueError for arrays of different shapes or labels other than 0 / 1.
    """
    first, second = np.asarray(labels_first), np.asarray(labels_second)
    if first.shape != second.shape or first.ndim != 1:
        raise ValueError(f"labels must be two 1-D arrays of one length, got shapes {first.shape}, {second.shape}")
    if not np.isin(first, (0, 1)).all() or not np.isin(second, (0, 1)).all():
        raise ValueError("labels must be 0 or 1")
    if not first.size:
        return BinaryAgreement(0, math.nan, math.nan, ((0, 0), (0, 0)))
    table = tuple(tuple(int(n) for n in row) for row in metrics.confusion_matrix(first, second, labels=[0, 1]))
    one_label = len(np.unique(np.concatenate([first, second]))) == 1
    kappa = math.nan if one_label else float(metrics.cohen_kappa_score(first, second, labels=[0, 1]))
    return BinaryAgreement(int(first.size), float(np.mean(first == second)), kappa, table)


@dataclasses.dataclass(frozen=True)
class Correlation:
    """Pearson's r and Spearman's rho of `n` paired scores; NaN with a `note` saying why when undefined."""

    n: int
    pearson: float
    spearman: float
    note: str = ""


def score_correlation(scores_first: Any, scores_second: Any) -> Correlation:
    """Pearson and Spearman correlations (scipy) of two score arrays [N]. Degenerate: N < 2, or either array
    constant (no variance to correlate) -> both NaN, with a note."""
    first, second = np.asarray(scores_first, np.float64), np.asarray(scores_second, np.float64)
    if first.shape != second.shape or first.ndim != 1:
        raise ValueError(f"scores must be two 1-D arrays of one length, got shapes {first.shape}, {second.shape}")
    n = int(first.size)
    constant = [name for name, x in (("first", first), ("second", second)) if n >= 2 and np.ptp(x) == 0]
    if n < 2 or constant:
        note = f"fewer than 2 responses ({n})" if n < 2 else f"the {' and '.join(constant)} rater's scores are constant"
        return Correlation(n, math.nan, math.nan, note)
    return Correlation(n, float(stats.pearsonr(first, second).statistic),
                       float(stats.spearmanr(first, second).statistic))


def unanimous_fraction(labels_rp: Any) -> float:
    """The fraction of the P columns of labels [R, P] on which all R repeats give one label; NaN when P = 0."""
    labels = np.asarray(labels_rp)
    if labels.ndim != 2:
        raise ValueError(f"labels must be [R, P], got shape {labels.shape}")
    return float(np.mean((labels == labels[:1]).all(axis=0))) if labels.shape[1] else math.nan


def _mean(values: Any) -> float:
    """The mean of `values`, NaN for none (numpy would warn)."""
    values = np.asarray(values, np.float64)
    return float(values.mean()) if values.size else math.nan


# ---------------------------------------------------------------- rubric verdicts to arrays


def usable(verdict: Optional[RolloutVerdict]) -> bool:
    """Whether a rating enters the statistics: it exists and did not fail."""
    return verdict is not None and not verdict.failed


def criterion_key(criterion: Criterion, k: int) -> str:
    """The name that groups criterion k of a rubric across items: its name, else "item<k>"."""
    return criterion.name or f"item{k}"


def rubric_scores(rubrics: Sequence[Rubric], ratings: Ratings) -> np.ndarray:
    """Each item's rubric score, float64 [N]: `rewards.weighted_fraction` of `rewards.typed_item_credit` (the
    weighted fraction of the rubric met, a PITFALL item counting when avoided, negative weights counting 0:
    `rubric-jax eval`'s rubric score), NaN for an item without a usable rating. An empty rubric scores 0."""
    ok = np.array([usable(v) for v in ratings], bool).reshape(-1)
    width = max((len(r.criteria) for r in rubrics), default=0)
    satisfied = Verdicts.from_rollouts([v if usable(v) else RolloutVerdict() for v in ratings], width).satisfied_bk
    items = rubric_arrays(rubrics, width)
    credit = rewards.typed_item_credit(jnp.asarray(satisfied), jnp.asarray(items.item_kind_bk), jnp.asarray(~ok))
    score = rewards.weighted_fraction(credit, jnp.asarray(items.item_weight_bk), jnp.asarray(items.item_mask_bk))
    return np.where(ok, np.asarray(score, np.float64), np.nan)


def item_labels(rubrics: Sequence[Rubric], ratings: Ratings, rows: Sequence[int]) -> tuple[list[str], np.ndarray]:
    """The (item, criterion) pairs of the items `rows`, item-major: each pair's `criterion_key` and its binarised
    verdict [P]. Every row must have a usable rating."""
    keys = [criterion_key(c, k) for b in rows for k, c in enumerate(rubrics[b].criteria)]
    labels = binarize([s for b in rows for s in ratings[b].satisfied])
    return keys, labels


def exclusion_counts(ratings: Ratings) -> dict[str, Any]:
    """How many items a rater left out: "missing" (no rating), "failed" (a failed verdict) and the failures by
    reason."""
    reasons = collections.Counter(v.reason for v in ratings if v is not None and v.failed)
    return {"missing": sum(v is None for v in ratings), "failed": sum(reasons.values()),
            "failed_by_reason": dict(sorted(reasons.items()))}


def compare_ratings(rubrics: Sequence[Rubric], first: Ratings, second: Ratings) -> dict[str, Any]:
    """Two raters' agreement on the items both rated usably (module docstring): "items_compared", "excluded"
    (`exclusion_counts` of each), "overall" and per-criterion "criteria" (`binary_agreement` as dicts, criteria
    in order of first appearance), "scores" (`score_correlation` as a dict, with "mean_difference" and
    "mean_abs_difference" of the rubric scores, second - first)."""
    if not len(rubrics) == len(first) == len(second):
        raise ValueError(f"{len(rubrics)} rubrics, {len(first)} and {len(second)} ratings")
    rows = [b for b in range(len(rubrics)) if usable(first[b]) and usable(second[b])]
    keys, labels_first = item_labels(rubrics, first, rows)
    _, labels_second = item_labels(rubrics, second, rows)
    key_array = np.array(keys, object)
    criteria = {key: dataclasses.asdict(binary_agreement(labels_first[key_array == key],
                                                         labels_second[key_array == key]))
                for key in dict.fromkeys(keys)}
    scores_first, scores_second = rubric_scores(rubrics, first)[rows], rubric_scores(rubrics, second)[rows]
    difference = scores_second - scores_first
    return {
        "items_compared": len(rows),
        "excluded": {"first": exclusion_counts(first), "second": exclusion_counts(second)},
        "overall": dataclasses.asdict(binary_agreement(labels_first, labels_second)),
        "criteria": criteria,
        "scores": {**dataclasses.asdict(score_correlation(scores_first, scores_second)),
                   "mean_difference": _mean(difference), "mean_abs_difference": _mean(np.abs(difference))},
    }


def self_consistency(rubrics: Sequence[Rubric], runs: Sequence[Ratings]) -> dict[str, Any]:
    """One judge's R >= 2 runs over the same items, on the items every run rated usably: "repeats",
    "items_compared", "items_excluded" (an item some run failed on or did not rate), "pairs" ((item, criterion)
    pairs per run), "unanimous_fraction", "mean_pairwise_agreement", "mean_pairwise_kappa" (the mean of the
    defined kappas of the R (R - 1) / 2 pairs of runs; NaN if none is defined), "undefined_kappa_runs" (pairs of
    runs whose kappa is undefined), "mean_score_std" (the population std of an item's rubric score over the
    runs, averaged over items) and "first_pair" (`binary_agreement` of runs 1 and 2, for the plot)."""
    if len(runs) < 2:
        raise ValueError(f"self-consistency needs at least 2 runs, got {len(runs)}")
    rows = [b for b in range(len(rubrics)) if all(usable(run[b]) for run in runs)]
    labels = np.stack([item_labels(rubrics, run, rows)[1] for run in runs])
    pairwise = [binary_agreement(labels[r], labels[s]) for r, s in itertools.combinations(range(len(runs)), 2)]
    kappas = [p.kappa for p in pairwise if not math.isnan(p.kappa)]
    scores = np.stack([rubric_scores(rubrics, run)[rows] for run in runs])
    return {
        "repeats": len(runs),
        "items_compared": len(rows),
        "items_excluded": len(rubrics) - len(rows),
        "pairs": int(labels.shape[1]),
        "unanimous_fraction": unanimous_fraction(labels),
        "mean_pairwise_agreement": _mean([p.agreement for p in pairwise]),
        "mean_pairwise_kappa": _mean(kappas),
        "undefined_kappa_runs": len(pairwise) - len(kappas),
        "mean_score_std": _mean(scores.std(axis=0)),
        "first_pair": dataclasses.asdict(pairwise[0]),
    }


# ---------------------------------------------------------------- perturbations


def criteria_order(num_criteria: int, seed: int, index: int) -> np.ndarray:
    """A seeded random order of item `index`'s criteria: order[j] is the original index of the criterion shown
    j-th, from `np.random.default_rng((seed, index))`, redrawn while it is the identity when there are 2 or more
    criteria (so each such item is shown in a new order; with 2 criteria, swapped). `seed` >= 0."""
    rng = np.random.default_rng((seed, index))
    order = rng.permutation(num_criteria)
    while num_criteria >= 2 and (order == np.arange(num_criteria)).all():
        order = rng.permutation(num_criteria)
    return order


def _check_order(order: Any, num_criteria: int) -> np.ndarray:
    order = np.asarray(order)
    if order.shape != (num_criteria,) or sorted(order.tolist()) != list(range(num_criteria)):
        raise ValueError(f"order must be a permutation of range({num_criteria}), got {order.tolist()}")
    return order


def permute_criteria(request: JudgeRequest, order: Any) -> JudgeRequest:
    """`request` with its rubric's criteria in `order` (order[j]: the original index of the criterion shown
    j-th); ValueError unless `order` is a permutation of the criteria's indices."""
    criteria = request.rubric.criteria
    order = _check_order(order, len(criteria))
    rubric = dataclasses.replace(request.rubric, criteria=tuple(criteria[i] for i in order))
    return dataclasses.replace(request, rubric=rubric)


def unpermute_verdict(verdict: RolloutVerdict, order: Any) -> RolloutVerdict:
    """A verdict on `permute_criteria(request, order)` in the original criteria order: original item order[j]
    gets the permuted item j's score and step. A failure is returned as it is."""
    if verdict.failed:
        return verdict
    inverse = np.argsort(_check_order(order, len(verdict.satisfied)))
    steps = None if verdict.item_step is None else tuple(verdict.item_step[j] for j in inverse)
    return RolloutVerdict(satisfied=tuple(verdict.satisfied[j] for j in inverse), item_step=steps)


def permuted_requests(requests: Sequence[JudgeRequest], seed: int) -> tuple[list[JudgeRequest], list[np.ndarray]]:
    """Every request with its criteria in `criteria_order(K, seed, b)`, and those orders (for
    `unpermute_verdict`)."""
    orders = [criteria_order(len(r.rubric.criteria), seed, b) for b, r in enumerate(requests)]
    return [permute_criteria(r, o) for r, o in zip(requests, orders)], orders


def padding(pad_chars: int) -> str:
    """The length probe's filler: PAD_SENTENCE repeated, space-separated, the fewest whole sentences that make at
    least `pad_chars` characters ("" for 0)."""
    if isinstance(pad_chars, bool) or not isinstance(pad_chars, int) or pad_chars < 0:
        raise ValueError(f"pad_chars must be an int >= 0, got {pad_chars!r}")
    # n sentences and the n - 1 spaces between them: n (len + 1) - 1 characters
    return " ".join([PAD_SENTENCE] * math.ceil((pad_chars + 1) / (len(PAD_SENTENCE) + 1))) if pad_chars else ""


def pad_response(request: JudgeRequest, pad_chars: int) -> JudgeRequest:
    """`request` with `padding(pad_chars)` appended to its response after a blank line ("\\n\\n"); the criteria,
    their order and the number of steps are unchanged (the filler has no `### Step` header or answer)."""
    return dataclasses.replace(request, response=f"{request.response}\n\n{padding(pad_chars)}")


# ---------------------------------------------------------------- raters and running judges


def judge_requests(judge: Judge, requests: Sequence[JudgeRequest]) -> list[RolloutVerdict]:
    """`judge`'s verdict on each request, cut to its rubric (`records.verdict_rows`)."""
    max_items = max((len(r.rubric.criteria) for r in requests), default=0)
    return verdict_rows(judge.judge(list(requests), max_items), requests)


@dataclasses.dataclass(frozen=True)
class Rater:
    """One rater of the items: a `name` for the report and either its `ratings` (saved verdicts, human labels:
    one Optional[RolloutVerdict] per item) or `judge_at`, seed -> a new Judge sampling with that seed (an LLM
    judge), which `measure_agreement` runs over the items and closes."""

    name: str
    ratings: Optional[Ratings] = None
    judge_at: Optional[Callable[[int], Judge]] = None

    def __post_init__(self):
        if (self.ratings is None) == (self.judge_at is None):
            raise ValueError(f"rater {self.name!r} needs exactly one of ratings and judge_at")


@dataclasses.dataclass(frozen=True)
class Probes:
    """What to measure of one judge's stability (module docstring): `repeats` runs (1: no self-consistency),
    re-judging with the criteria permuted (`permute`) and with `pad_chars` characters of filler (0: no length
    probe). `seed`: the judges' sampling seed (repeat r samples with seed + r) and the permutations'."""

    repeats: int = 1
    permute: bool = False
    pad_chars: int = 0
    seed: int = 0

    def __post_init__(self):
        for name, low in (("repeats", 1), ("pad_chars", 0), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")

    @property
    def requested(self) -> bool:
        return self.repeats > 1 or self.permute or self.pad_chars > 0


def probed_rater(a: Rater, b: Optional[Rater]) -> Optional[Rater]:
    """The judge whose stability is probed: A when it is a judge, else B when it is one, else None."""
    return next((r for r in (a, b) if r is not None and r.judge_at is not None), None)


def check_plan(a: Rater, b: Optional[Rater], probes: Probes) -> None:
    """ValueError unless the plan measures something it can: B or a probe, and a judge to probe."""
    if b is None and not probes.requested:
        raise ValueError("nothing to measure: give a second rater (a judge or human labels) or a probe "
                         "(repeats, permuted criteria, padded responses)")
    if probes.requested and probed_rater(a, b) is None:
        raise ValueError("repeats, permuted criteria and padded responses re-judge the items: they need a judge, "
                         "not saved verdicts or labels")


def _run(rater: Rater, seed: int, requests: Sequence[JudgeRequest], log: Callable[[str], None],
         what: str) -> list[RolloutVerdict]:
    log(f"judging {len(requests)} items: {what}")
    judge = rater.judge_at(seed)
    try:
        return judge_requests(judge, requests)
    finally:
        judge.close()


def measure_agreement(items: Sequence[JudgedRollout], a: Rater, b: Optional[Rater], probes: Probes = Probes(),
                      log: Callable[[str], None] = lambda message: None) -> dict[str, Any]:
    """The report's numbers (module docstring): "items", the raters' names, "a_vs_b" (`compare_ratings`, with B),
    and, for the probed judge (`probed_rater`), "self_consistency", "position" and "length" (`compare_ratings` of
    its unperturbed and its perturbed verdicts, with "pad_chars"), as `probes` asks, and "incomparable"
    (`incomparable`: the comparisons that compared nothing). Judges run with `probes.seed`; `log` hears a line
    before each pass over the items."""
    check_plan(a, b, probes)
    requests = [item.request for item in items]
    rubrics = [r.rubric for r in requests]
    ratings = {}
    for label, rater in (("A", a), ("B", b)):
        if rater is not None:
            ratings[label] = rater.ratings if rater.ratings is not None else _run(
                rater, probes.seed, requests, log, f"{label}, {rater.name}")
    report: dict[str, Any] = {"items": len(items), "threshold": THRESHOLD, "rater_a": a.name,
                              "rater_b": None if b is None else b.name}
    if b is not None:
        report["a_vs_b"] = compare_ratings(rubrics, ratings["A"], ratings["B"])
    probed = probed_rater(a, b) if probes.requested else None
    if probed is not None:
        report.update(_probe_sections(probed, ratings["A" if probed is a else "B"], requests, probes, log))
    report["incomparable"] = incomparable(report)
    return report


def _probe_sections(probed: Rater, first: Ratings, requests: Sequence[JudgeRequest], probes: Probes,
                    log: Callable[[str], None]) -> dict[str, Any]:
    """`measure_agreement`'s sections of the probed judge, whose unperturbed verdicts are `first`."""
    rubrics = [r.rubric for r in requests]
    report: dict[str, Any] = {"probed": probed.name}
    if probes.repeats > 1:
        runs = [first] + [_run(probed, probes.seed + r, requests, log, f"repeat {r + 1} of {probes.repeats}")
                          for r in range(1, probes.repeats)]
        report["self_consistency"] = self_consistency(rubrics, runs)
    if probes.permute:
        permuted, orders = permuted_requests(requests, probes.seed)
        verdicts = _run(probed, probes.seed, permuted, log, "criteria permuted")
        report["position"] = compare_ratings(rubrics, first, [unpermute_verdict(v, o)
                                                              for v, o in zip(verdicts, orders)])
    if probes.pad_chars:
        padded = [pad_response(r, probes.pad_chars) for r in requests]
        report["length"] = {"pad_chars": probes.pad_chars, **compare_ratings(
            rubrics, first, _run(probed, probes.seed, padded, log, f"responses padded by {probes.pad_chars} chars"))}
    return report


# ---------------------------------------------------------------- human labels


def read_human_labels(path: str | os.PathLike, items: Sequence[JudgedRollout]) -> list[Optional[RolloutVerdict]]:
    """Human labels of `items` from a JSONL file, one `{"id": <item id>, "satisfied": [0 or 1 per criterion]}`
    a line (blank lines skipped), as ratings aligned with `items` (None: the item has no label). Strict:
    ValueError naming the file and line for a line that is not such an object, an id no item has or one labelled
    twice, or a list that is not one 0 / 1 (int) per criterion of the item's rubric."""
    criteria = {item.id: len(item.request.rubric.criteria) for item in items}
    labels: dict[str, RolloutVerdict] = {}
    for file in jsonl_files(path):
        with open(file, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        item_id, satisfied = _label_line(json.loads(line), criteria, labels)
                    except ValueError as error:  # json's decode errors included
                        raise ValueError(f"{file}:{number}: {error}") from None
                    labels[item_id] = RolloutVerdict(satisfied=satisfied)
    return [labels.get(item.id) for item in items]


def _label_line(data: Any, criteria: Mapping[str, int], seen: Mapping[str, Any]) -> tuple[str, tuple[int, ...]]:
    if not isinstance(data, dict) or set(data) != {"id", "satisfied"}:
        raise ValueError(f'expected an object with exactly the keys "id" and "satisfied", got {json.dumps(data)}')
    item_id, satisfied = data["id"], data["satisfied"]
    if not isinstance(item_id, str) or item_id not in criteria:
        raise ValueError(f"no item has the id {item_id!r}")
    if item_id in seen:
        raise ValueError(f"item {item_id!r} is labelled twice")
    if not isinstance(satisfied, list) or not all(type(s) is int and s in (0, 1) for s in satisfied):
        raise ValueError(f'"satisfied" must be a list of 0 and 1, got {json.dumps(satisfied)}')
    if len(satisfied) != criteria[item_id]:
        raise ValueError(f"item {item_id!r} has {criteria[item_id]} criteria, the label gives {len(satisfied)}")
    return item_id, tuple(satisfied)


# ---------------------------------------------------------------- the report

# Each section with a confusion table: its title, the names of its first and second rater, and the table's key.
_SECTIONS = {
    "a_vs_b": ("A vs B", "A", "B", "overall"),
    "self_consistency": ("Self-consistency", "repeat 1", "repeat 2", "first_pair"),
    "position": ("Position: criteria permuted", "original order", "permuted", "overall"),
    "length": ("Length: responses padded", "original", "padded", "overall"),
}


def _number(value: float, percent: bool = False) -> str:
    if math.isnan(value):
        return "undefined"
    return f"{100 * value:.1f}%" if percent else f"{value:.3f}"


def _agreement_row(name: str, agreement: Mapping[str, Any]) -> str:
    (n00, n01), (n10, n11) = agreement["confusion"]
    cells = [name.replace("|", "\\|"), agreement["pairs"], _number(agreement["agreement"], percent=True),
             _number(agreement["kappa"]), n11, n10, n01, n00]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _exclusions(name: str, counts: Mapping[str, Any]) -> str:
    reasons = ", ".join(f"{reason} {n}" for reason, n in counts["failed_by_reason"].items())
    return f"{name} failed on {counts['failed']}" + (f" ({reasons})" if reasons else "") + \
        f", has no rating for {counts['missing']}"


def incomparable(report: Mapping[str, Any]) -> list[str]:
    """A reason for each comparison of `report` (`measure_agreement`'s sections) that has no (item, criterion)
    pair: no item both raters (every run) rated usably, with each side's failures by reason, or items compared
    whose rubrics have no criteria. Empty when every comparison compared something."""
    reasons = []
    for key, (title, first, second, _) in _SECTIONS.items():
        section = report.get(key)
        if section is None or section["items_compared"] and _pairs(key, section):
            continue
        if section["items_compared"]:
            reasons.append(f"{title}: the {section['items_compared']} items compared have no criteria")
        elif key == "self_consistency":
            reasons.append(f"{title}: no item was rated by every run ({section['items_excluded']} failed or unrated)")
        else:
            excluded = section["excluded"]
            reasons.append(f"{title}: no item was rated by both ({_exclusions(first, excluded['first'])}; "
                           f"{_exclusions(second, excluded['second'])})")
    return reasons


def _pairs(key: str, section: Mapping[str, Any]) -> int:
    return section["pairs"] if key == "self_consistency" else section["overall"]["pairs"]


def _comparison_lines(section: Mapping[str, Any], first: str, second: str, items: int) -> list[str]:
    excluded = section["excluded"]
    scores = section["scores"]
    correlation = (f"Pearson r = {_number(scores['pearson'])}, Spearman rho = {_number(scores['spearman'])} over "
                   f"{scores['n']} responses" + (f" ({scores['note']})" if scores["note"] else ""))
    lines = [f"Items compared: {section['items_compared']} of {items}. Excluded: "
             f"{_exclusions(first, excluded['first'])}; {_exclusions(second, excluded['second'])}.", "",
             f"| criterion | pairs | agreement | Cohen's kappa | both 1 | {first} 1, {second} 0 | "
             f"{first} 0, {second} 1 | both 0 |", "|---|---|---|---|---|---|---|---|",
             _agreement_row("all criteria", section["overall"])]
    lines += [_agreement_row(key, agreement) for key, agreement in section["criteria"].items()]
    return lines + ["", f"Rubric score per response: {correlation}; mean {second} - {first} "
                        f"{_number(scores['mean_difference'])}, mean |{second} - {first}| "
                        f"{_number(scores['mean_abs_difference'])}."]


def markdown_report(report: Mapping[str, Any], plot_name: Optional[str] = None) -> str:
    """The report (`measure_agreement`'s dict) as markdown: a table per comparison, the plot `plot_name` linked."""
    lines = ["# Judge agreement", "", f"Items: {report['items']}. A: {report['rater_a']}."
             + (f" B: {report['rater_b']}." if report["rater_b"] else "")
             + (f" Probed judge: {report['probed']}." if "probed" in report else ""), "",
             f"Verdicts are binarised at {report['threshold']} (satisfied iff score >= {report['threshold']}) for "
             "agreement and Cohen's kappa; kappa is undefined when both raters give every pair the same label. "
             "The rubric score is the weighted fraction of the rubric met (rubric-jax eval's rubric score). Failed "
             "and missing ratings are excluded and counted."]
    if report.get("incomparable"):
        lines += ["", "**Nothing compared** in " + "; ".join(report["incomparable"]) + "."]
    for key, (title, first, second, _) in _SECTIONS.items():
        if key not in report:
            continue
        section = report[key]
        lines += ["", f"## {title}", ""]
        if key == "self_consistency":
            lines += [f"{section['repeats']} runs over {section['items_compared']} items ({section['pairs']} "
                      f"(item, criterion) pairs each; {section['items_excluded']} items excluded: a run failed or "
                      "did not rate them).", "",
                      "| statistic | value |", "|---|---|",
                      f"| unanimous (item, criterion) verdicts | {_number(section['unanimous_fraction'], True)} |",
                      f"| mean pairwise agreement | {_number(section['mean_pairwise_agreement'], True)} |",
                      f"| mean pairwise Cohen's kappa | {_number(section['mean_pairwise_kappa'])} |",
                      f"| pairs of runs with undefined kappa | {section['undefined_kappa_runs']} |",
                      f"| mean std of the rubric score over runs | {_number(section['mean_score_std'])} |"]
            continue
        if key == "length":
            lines += [f"Each response padded with at least {section['pad_chars']} characters of filler "
                      f"(\"{PAD_SENTENCE}\" repeated, after a blank line).", ""]
        lines += _comparison_lines(section, first, second, report["items"])
    if plot_name:
        lines += ["", f"![confusion tables]({plot_name})"]
    return "\n".join(lines) + "\n"


def plot_confusions(report: Mapping[str, Any], path: str | os.PathLike) -> None:
    """A PNG of the confusion tables of every section of the report (all criteria pooled), side by side."""
    # Imported here, and no pyplot (as training.metrics): the Agg canvas, whatever backend a notebook uses.
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    panels = [(title, first, second, report[key][table]["confusion"])
              for key, (title, first, second, table) in _SECTIONS.items() if key in report]
    figure = Figure(figsize=(3.5 * max(len(panels), 1), 3.8), layout="constrained")
    for i, (title, first, second, confusion) in enumerate(panels):
        axes = figure.add_subplot(1, len(panels), i + 1)
        table = np.asarray(confusion)
        axes.imshow(table, cmap="Blues", vmin=0, vmax=max(int(table.max()), 1))
        for (row, column), count in np.ndenumerate(table):
            axes.text(column, row, str(count), ha="center", va="center",
                      color="white" if count > table.max() / 2 else "black")
        axes.set(title=title, xlabel=second, ylabel=first, xticks=[0, 1], yticks=[0, 1],
                 xticklabels=["0", "1"], yticklabels=["0", "1"])
    FigureCanvasAgg(figure)  # attaches the Agg canvas that savefig renders with
    figure.savefig(path, format="png", bbox_inches="tight", pad_inches=0.1)


def write_report(report: Mapping[str, Any], output: str | os.PathLike) -> tuple[Path, Path, Path]:
    """Writes the markdown report at `output`, and beside it (same name) the plot (.png) and the numbers
    (.json, NaN as null); returns the three paths."""
    markdown, plot, numbers = Path(output), Path(output).with_suffix(".png"), Path(output).with_suffix(".json")
    plot_confusions(report, plot)
    numbers.write_text(strict_json.dumps(report, indent=2) + "\n", encoding="utf-8")
    markdown.write_text(markdown_report(report, plot.name), encoding="utf-8")
    return markdown, plot, numbers
