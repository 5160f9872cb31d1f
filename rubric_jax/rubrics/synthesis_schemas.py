"""The output schemas of the rubric synthesis pipelines, as pydantic models: what each stage's generator must
answer (validated by `parsing.parse_structured`, and sent as the JSON schema of the response format), and the
records the pipelines write, in the layouts the dataset task's presets read.

- Rubric-grounded (rubric_grounded_rl.txt, section 3.4 and Appendix E): `DocumentAnalysis` (stage 1),
  `SynthesisOutput` (stage 2: questions, passages, criteria with Definition 1's five components plus Appendix E's
  name and scoring guide), `EnrichmentOutput` (stage 3), and the record `GroundedExample`, Appendix E's schema
  field for field (preset "rubric_grounded").
- RGR-GRPO (rgr_grpo.txt, section 2.2): `RGRRubricOutput`, factual / process criteria with integer weights 1-10,
  and the record `RGRExample` (preset "rgr").
- Rubrics as Rewards: `RaRRubricOutput`, items whose description opens with its category and whose weight lies
  in the category's range (`RAR_WEIGHTS`), and the record `RaRExample` (preset "rar").

Every model forbids unknown keys and blank strings, and every number is finite: a generator's output either
matches its schema exactly or fails with the field named. Counts that a config sets (criteria per rubric, total
weight) are the pipelines' quality checks, not schema rules.
"""

from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
Weight = Annotated[float, Field(ge=0, allow_inf_nan=False)]

# RaR's categories: the description's opening words and the (low, high) integer weights of each.
RAR_WEIGHTS = {"Essential": (5, 5), "Important": (3, 4), "Optional": (1, 2), "Pitfall": (-2, -1)}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- rubric-grounded (section 3.4, Appendix E)


class DocumentAnalysis(_Strict):
    """Stage 1: Appendix E's `document_analysis`."""

    genre: Text
    contribution: Text
    concepts: list[Text] = Field(min_length=1)
    depth: Text
    reasoning_mode: Text


class SynthesizedCriterion(_Strict):
    """A stage-2 criterion: Definition 1's weight, description, required elements, expected keywords and
    verification method, with Appendix E's name and scoring guide."""

    name: Text
    description: Text
    weight: Weight
    required_elements: list[Text] = Field(min_length=1)
    expected_keywords: list[Text]
    verification_method: Text
    scoring_guide: Text


class SynthesizedItem(_Strict):
    question: Text
    passage: Text
    question_rationale: Text
    criteria: list[SynthesizedCriterion] = Field(min_length=1)


class SynthesisOutput(_Strict):
    """Stage 2: the (question, grounding passage, rubric) tuples of one document."""

    items: list[SynthesizedItem] = Field(min_length=1)


class CriterionEnrichment(_Strict):
    """Stage 3 for one criterion, by its id ("c_1", ...)."""

    id: Text
    expected_keywords: list[Text]
    expected_concepts: list[Text]
    verification_method: Text


class EnrichmentOutput(_Strict):
    criteria: list[CriterionEnrichment] = Field(min_length=1)


class GroundedCriterion(_Strict):
    """A criterion of Appendix E's record."""

    id: Text
    weight: Weight
    name: Text
    description: Text
    required_elements: list[Text]
    scoring_guide: Text
    verification_method: Text
    expected_keywords: list[Text]
    expected_concepts: list[Text]


class GroundedExample(_Strict):
    """Appendix E's record: one question with its grounding passage and rubric, the question's rationale, the
    document's analysis and the document's content hash."""

    question: Text
    passage: Text
    criteria: list[GroundedCriterion] = Field(min_length=1)
    question_rationale: Text
    document_analysis: DocumentAnalysis
    doc_hash: Text


# ---------------------------------------------------------------- RGR-GRPO (section 2.2)


class RGRCriterion(_Strict):
    """c_k = (d_k, w_k) with its type: factual or process."""

    type: Literal["factual", "process"]
    weight: int = Field(ge=1, le=10)
    description: Text


class RGRRubricOutput(_Strict):
    criteria: list[RGRCriterion] = Field(min_length=1)


class RGRExample(_Strict):
    """The record of preset "rgr": the question, its gold answer (a letter for multiple choice, with `options` in
    the order the letter counts), the reference answer that passed the correctness filter, and the rubric."""

    question: Text
    answer: Optional[Text]
    options: Optional[list[Text]] = None
    reference_answer: Text
    rubric: list[RGRCriterion] = Field(min_length=1)
    source_hash: Text


# ---------------------------------------------------------------- Rubrics as Rewards


class RaRItem(_Strict):
    """One RaR checklist item: a title, a description opening with "<Category> Criteria:", and an integer weight
    in the category's range (`RAR_WEIGHTS`)."""

    title: Text
    description: Text
    weight: int

    @model_validator(mode="after")
    def _category_weight(self) -> "RaRItem":
        category = next((c for c in RAR_WEIGHTS if self.description.startswith(f"{c} Criteria:")), None)
        if category is None:
            raise ValueError(f"description must open with one of {[f'{c} Criteria:' for c in RAR_WEIGHTS]}")
        low, high = RAR_WEIGHTS[category]
        if not low <= self.weight <= high:
            raise ValueError(f"a {category} item weighs {low}..{high}, got {self.weight}")
        return self

    @property
    def category(self) -> str:
        return self.description.split(" Criteria:", 1)[0]


class RaRRubricOutput(_Strict):
    rubric: list[RaRItem] = Field(min_length=1)


class RaRExample(_Strict):
    """The record of preset "rar" (ScaleAI/RaR-Medicine's columns question, reference_answer, rubric)."""

    question: Text
    reference_answer: Text
    rubric: list[RaRItem] = Field(min_length=1)
    source_hash: Text
