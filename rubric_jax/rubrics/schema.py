"""The rubric data model of the five papers, its validation, its dict form and its fixed-shape array form.

A `Rubric` is a tuple of `Criterion` items plus the name of the paper format it follows. The formats, what each
allows and where it comes from:

- "generic": any item kind, any finite weight. Hand-written rubrics, programmatic criteria, tests.
- "rubric_grounded" (rubric_grounded_rl.txt, Definition 1 and Appendix E): CRITERION items with a non-negative
  weight, a description (`text`), required elements, expected keywords, a verification method, and (Appendix E's
  data schema) a name and a scoring guide.
- "srar" (srar.txt, section 3.2, Appendix 7.2 and 14): SUGGEST / PITFALL / BONUS / ANSWER items. SRaR's reward
  uses the item types and the per-type budgets (core.rewards.TypedBudgets), not per-item weights: weights must be
  positive and are 1 by convention.
- "rlcer" (rlcer.txt, Appendix B Figure 9): CRITERION items with a category and integer points "from 1 to 5 for
  reward criteria, and ... from -5 to -1 for penalty criteria".
- "evorubric" (evorubric.txt, Appendix C Table 5): CRITERION items with integer points "positive for good
  traits, negative for bad traits, from -10 to 10" (0 is neither, so it is rejected); a category is optional
  (the bracketed labels of Appendix E Table 9).
- "rgr" (rgr_grpo.txt, section 2.2): FACTUAL / PROCESS criteria c_k = (d_k, w_k) with a positive "adaptive
  weight reflecting its relative importance".

`Criterion.weight` holds the points of the signed formats (RLCER, EvoRubric) and the weight of the others.
Invalid rubrics are programmer errors: construction raises ValueError naming the criterion index and field,
e.g. "criteria[2].weight: ...". Model output never reaches these constructors unchecked: the parsers of
`rubric_jax.rubrics.parsing` validate first and report failures without raising.
"""

import dataclasses
import enum
import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from rubric_jax.core import rewards as core_rewards


class ItemKind(enum.IntEnum):
    """Kind of a rubric item. SUGGEST..ANSWER equal `rubric_jax.core.rewards`' SRaR type constants."""

    SUGGEST = core_rewards.SUGGEST
    PITFALL = core_rewards.PITFALL
    BONUS = core_rewards.BONUS
    ANSWER = core_rewards.ANSWER
    CRITERION = 4  # generic weighted criterion (rubric-grounded, RLCER, EvoRubric)
    FACTUAL = 5  # RGR-GRPO factual criterion
    PROCESS = 6  # RGR-GRPO process criterion


# Padding of `RubricArrays.item_kind_bk`: equal to no kind, so `kind == SUGGEST`-style tests never match padding.
PAD_KIND = -1


@dataclasses.dataclass(frozen=True)
class _FormatSpec:
    """What a rubric format allows: item kinds, weight bounds, integral / nonzero weights."""

    kinds: frozenset
    low: float
    high: float
    low_open: bool = False  # weight > low rather than >= low
    integral: bool = False
    nonzero: bool = False
    rule: str = ""  # the rule in words, for error messages


_ALL_KINDS = frozenset(ItemKind)
_CRITERION = frozenset({ItemKind.CRITERION})

FORMATS: Mapping[str, _FormatSpec] = {
    "generic": _FormatSpec(_ALL_KINDS, -math.inf, math.inf, rule="any finite weight"),
    "rubric_grounded": _FormatSpec(_CRITERION, 0.0, math.inf, rule="a non-negative weight"),
    "srar": _FormatSpec(
        frozenset({ItemKind.SUGGEST, ItemKind.PITFALL, ItemKind.BONUS, ItemKind.ANSWER}),
        0.0,
        math.inf,
        low_open=True,
        rule="a positive weight (1 by convention; SRaR uses typed budgets)",
    ),
    "rlcer": _FormatSpec(
        _CRITERION, -5.0, 5.0, integral=True, nonzero=True, rule="integer points in [-5, -1] or [1, 5]"
    ),
    "evorubric": _FormatSpec(
        _CRITERION, -10.0, 10.0, integral=True, nonzero=True, rule="nonzero integer points in [-10, 10]"
    ),
    "rgr": _FormatSpec(
        frozenset({ItemKind.FACTUAL, ItemKind.PROCESS}), 0.0, math.inf, low_open=True, rule="a positive weight"
    ),
}

# The points range each paper states for its generated rubrics; parsers put it on the rubrics they build.
RLCER_POINTS_RANGE = (-5.0, 5.0)
EVORUBRIC_POINTS_RANGE = (-10.0, 10.0)


def _check_text(value: Any, field: str, *, optional: bool = False) -> Optional[str]:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field} must be a non-empty string, got {value!r}")
    return value


def _check_strings(value: Any, field: str) -> tuple:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"{field} must be a sequence of strings, got {value!r}")
    return tuple(_check_text(item, f"{field}[{i}]") for i, item in enumerate(value))


def _check_number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{field} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{field} must be finite, got {value}")
    return value


def _check_kind(value: Any, field: str) -> ItemKind:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) not in set(ItemKind):
        raise ValueError(f"{field} must be an ItemKind, got {value!r}")
    return ItemKind(int(value))


@dataclasses.dataclass(frozen=True)
class Criterion:
    """One rubric item.

    text: what the item checks (rubric-grounded "description", RLCER/EvoRubric "criterion", RGR d_k, SRaR item).
    weight: the item's weight or signed points (see the module docstring for each format's rule).
    kind: the item's ItemKind. name / category: optional labels (rubric-grounded name; RLCER category).
    required_elements, keywords, scoring_guide, verification_method: the rubric-grounded fields (Definition 1;
    scoring_guide from Appendix D/E) shown to its judge; empty / None elsewhere.
    tags: labels of the item for per-tag metrics (HealthBench's "axis:accuracy"); never shown to a judge.
    Format-independent checks run here (ValueError naming the field); lists are stored as tuples.
    """

    text: str
    weight: float = 1.0
    kind: ItemKind = ItemKind.CRITERION
    name: Optional[str] = None
    category: Optional[str] = None
    required_elements: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    scoring_guide: Optional[str] = None
    verification_method: Optional[str] = None
    tags: tuple[str, ...] = ()

    def __post_init__(self):
        _check_text(self.text, "text")
        for field in ("name", "category", "scoring_guide", "verification_method"):
            _check_text(getattr(self, field), field, optional=True)
        object.__setattr__(self, "weight", _check_number(self.weight, "weight"))
        object.__setattr__(self, "kind", _check_kind(self.kind, "kind"))
        object.__setattr__(self, "required_elements", _check_strings(self.required_elements, "required_elements"))
        object.__setattr__(self, "keywords", _check_strings(self.keywords, "keywords"))
        object.__setattr__(self, "tags", _check_strings(self.tags, "tags"))


_CRITERION_FIELDS = tuple(f.name for f in dataclasses.fields(Criterion))
_RUBRIC_KEYS = ("format", "points_range", "criteria")


def _reject_unknown_keys(data: Mapping, allowed: tuple, where: str) -> None:
    unknown = sorted(set(data) - set(allowed), key=str)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; allowed {list(allowed)}")


def _check_format_rules(index: int, criterion: Criterion, spec: _FormatSpec, format_: str) -> None:
    where = f"criteria[{index}]"
    if criterion.kind not in spec.kinds:
        allowed = ", ".join(sorted(k.name for k in spec.kinds))
        raise ValueError(f"{where}.kind: format {format_!r} allows {allowed}, got {criterion.kind.name}")
    w = criterion.weight
    below = w <= spec.low if spec.low_open else w < spec.low
    if below or w > spec.high or (spec.integral and w != int(w)) or (spec.nonzero and w == 0):
        raise ValueError(f"{where}.weight: format {format_!r} requires {spec.rule}, got {w}")


@dataclasses.dataclass(frozen=True)
class Rubric:
    """A rubric: its criteria, the points range its format declares (or None), and the format's name.

    Validation (ValueError naming the criterion index and field): `format` is one of FORMATS; every criterion is
    a Criterion whose kind and weight follow the format's rule; `points_range` is None or (low, high) finite with
    low <= high, and every weight lies in it. An empty rubric is valid (EvoRubric's generator may answer "[]").
    """

    criteria: tuple[Criterion, ...] = ()
    points_range: Optional[tuple[float, float]] = None
    format: str = "generic"

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {sorted(FORMATS)}, got {self.format!r}")
        if isinstance(self.criteria, (str, bytes)) or not isinstance(self.criteria, Sequence):
            raise ValueError(f"criteria must be a sequence of Criterion, got {type(self.criteria).__name__}")
        criteria = tuple(self.criteria)
        object.__setattr__(self, "criteria", criteria)
        if self.points_range is not None:
            if isinstance(self.points_range, (str, bytes)) or not isinstance(self.points_range, Sequence):
                raise ValueError(f"points_range must be None or (low, high), got {self.points_range!r}")
            if len(self.points_range) != 2:
                raise ValueError(f"points_range must be None or (low, high), got {self.points_range!r}")
            low, high = (_check_number(v, f"points_range[{i}]") for i, v in enumerate(self.points_range))
            if low > high:
                raise ValueError(f"points_range must have low <= high, got ({low}, {high})")
            object.__setattr__(self, "points_range", (low, high))
        spec = FORMATS[self.format]
        for index, criterion in enumerate(criteria):
            if not isinstance(criterion, Criterion):
                raise ValueError(f"criteria[{index}] must be a Criterion, got {type(criterion).__name__}")
            _check_format_rules(index, criterion, spec, self.format)
            if self.points_range is not None and not self.points_range[0] <= criterion.weight <= self.points_range[1]:
                raise ValueError(
                    f"criteria[{index}].weight: {criterion.weight} is outside points_range {self.points_range}"
                )

    def to_dict(self) -> dict:
        """A JSON-serialisable dict with every field (kinds by name), so that from_dict(to_dict(r)) == r."""
        criteria = []
        for c in self.criteria:
            item = {field: getattr(c, field) for field in _CRITERION_FIELDS}
            item["kind"] = c.kind.name
            item["required_elements"] = list(c.required_elements)
            item["keywords"] = list(c.keywords)
            item["tags"] = list(c.tags)
            criteria.append(item)
        points_range = None if self.points_range is None else list(self.points_range)
        return {"format": self.format, "points_range": points_range, "criteria": criteria}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Rubric":
        """The inverse of to_dict. Strict: unknown keys are rejected, `criteria` and each `text` are required,
        kinds are given by name; omitted optional fields take their defaults. ValueError names the index and key."""
        if not isinstance(data, Mapping):
            raise ValueError(f"rubric must be a mapping, got {type(data).__name__}")
        _reject_unknown_keys(data, _RUBRIC_KEYS, "rubric")
        if "criteria" not in data:
            raise ValueError("rubric: missing key 'criteria'")
        items = data["criteria"]
        if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
            raise ValueError(f"rubric: 'criteria' must be a list, got {type(items).__name__}")
        criteria = []
        for index, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise ValueError(f"criteria[{index}] must be a mapping, got {type(item).__name__}")
            _reject_unknown_keys(item, _CRITERION_FIELDS, f"criteria[{index}]")
            if "text" not in item:
                raise ValueError(f"criteria[{index}]: missing key 'text'")
            fields = dict(item)
            if "kind" in fields:
                kind = fields["kind"]
                if not isinstance(kind, str) or kind not in ItemKind.__members__:
                    raise ValueError(
                        f"criteria[{index}].kind must be one of {list(ItemKind.__members__)}, got {kind!r}"
                    )
                fields["kind"] = ItemKind[kind]
            try:
                criteria.append(Criterion(**fields))
            except ValueError as error:
                raise ValueError(f"criteria[{index}].{error}") from None
        return cls(
            criteria=tuple(criteria), points_range=data.get("points_range"), format=data.get("format", "generic")
        )


@dataclasses.dataclass(frozen=True)
class RubricArrays:
    """A batch of rubrics as padded numpy arrays [B, K] for the core (DESIGN.md: item_mask, item_type, points).

    item_mask_bk bool: the item exists. item_kind_bk int32: its ItemKind, PAD_KIND (-1) on padding.
    item_weight_bk float32: its weight or points, 0 on padding.
    """

    item_mask_bk: np.ndarray
    item_kind_bk: np.ndarray
    item_weight_bk: np.ndarray


def rubric_arrays(rubrics: Sequence[Rubric], max_items: int) -> RubricArrays:
    """Pad B rubrics to K = max_items items. ValueError if a rubric has more than max_items criteria."""
    if isinstance(max_items, bool) or not isinstance(max_items, (int, np.integer)) or max_items < 0:
        raise ValueError(f"max_items must be a non-negative integer, got {max_items!r}")
    shape = (len(rubrics), int(max_items))
    mask = np.zeros(shape, bool)
    kind = np.full(shape, PAD_KIND, np.int32)
    weight = np.zeros(shape, np.float32)
    for b, rubric in enumerate(rubrics):
        if not isinstance(rubric, Rubric):
            raise ValueError(f"rubrics[{b}] must be a Rubric, got {type(rubric).__name__}")
        n = len(rubric.criteria)
        if n > max_items:
            raise ValueError(f"rubrics[{b}] has {n} criteria, more than max_items={max_items}")
        mask[b, :n] = True
        kind[b, :n] = [int(c.kind) for c in rubric.criteria]
        weight[b, :n] = [c.weight for c in rubric.criteria]
    return RubricArrays(item_mask_bk=mask, item_kind_bk=kind, item_weight_bk=weight)
