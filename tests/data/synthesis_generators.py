"""Scripted generators for the synthesis tests: stand-in server responders that answer each stage's prompt
(`rubrics.prompts`' synthesis prompts, told apart by their opening words) from what the prompt's fences show,
with faults injected by content so that the expected counts follow from the fixtures:

`DocumentGenerator` (pipeline grounded) answers every stage validly, except (`FAULTS`, keyed by a word of the
document):
- "Lithium": stage 1's first answer is cut by max_tokens (Truncated), the second is valid: one retry.
- "molten-salt": stage 2's first answer is prose, not JSON, the second valid: one retry.
- "Perovskite": stage 2 always answers a criterion without its weight (a schema violation): 3 attempts, then the
  document is discarded as "synthesis/schema".
- "Arsenic": the enrichment of its second question always skips a criterion id: that question is discarded as
  "quality/enrichment_ids", the first kept.
Each document gets two questions of five criteria (weights 1..5); a question's passage is the document's first
sentence, verbatim.

`QuestionGenerator` (pipelines rgr and rar) answers reference prompts with a boxed answer, correct for every
question but those whose text contains a word of `wrong_for` (so the correctness filter discards them), and rubric
prompts with valid JSON."""

import collections
import json
import threading

from tests.inference.standin_server import Truncated, fenced

FAULTS = ("Lithium", "molten-salt", "Perovskite", "Arsenic")


class _Counting:
    """Counts the calls of each (stage, key), so a responder can fail the first attempts only."""

    def __init__(self):
        self.calls = collections.Counter()
        self._lock = threading.Lock()

    def count(self, stage: str, key: str) -> int:
        with self._lock:
            self.calls[stage, key] += 1
            return self.calls[stage, key]


def _stage(content: str) -> str:
    for opening, stage in (("You prepare scientific", "analysis"), ("You write exam questions", "synthesis"),
                           ("You refine grading criteria", "enrichment"), ("Write a reference solution", "reference"),
                           ("You are an expert examiner", "rgr_rubric"), ("You write grading rubrics", "rar_rubric")):
        if content.startswith(opening):
            return stage
    raise AssertionError(f"not a synthesis prompt: {content[:80]!r}")


def _fault(text: str) -> str:
    return next((word for word in FAULTS if word.lower() in text.lower()), "")


def first_sentence(document: str) -> str:
    return document.split(". ")[0] + "."


class DocumentGenerator(_Counting):
    """The grounded pipeline's generator (module docstring)."""

    def __call__(self, messages) -> str:
        content = messages[-1]["content"]
        stage = _stage(content)
        if stage == "enrichment":
            return self._enrichment(content)
        document = fenced(content, "document")
        fault, attempt = _fault(document), self.count(stage, document[:40])
        if stage == "analysis":
            answer = json.dumps({"genre": "technical report", "contribution": document.split(".")[0],
                                 "concepts": [w for w in document.split()[:3]], "depth": "graduate",
                                 "reasoning_mode": "causal"})
            return Truncated(answer[: len(answer) // 2]) if fault == "Lithium" and attempt == 1 else answer
        if fault == "molten-salt" and attempt == 1:
            return "Here are some questions about the document, as you asked."
        items = [self._item(document, n, weightless=fault == "Perovskite") for n in range(2)]
        return json.dumps({"items": items})

    @staticmethod
    def _item(document: str, n: int, weightless: bool) -> dict:
        criteria = []
        for k in range(5):
            criterion = {"name": f"Point {k + 1}", "description": f"States point {k + 1} of question {n + 1}.",
                         "weight": k + 1, "required_elements": [f"element {k + 1}"], "expected_keywords": ["key"],
                         "verification_method": "Compare with the passage.", "scoring_guide": "Full or none."}
            if weightless and k == 0:
                del criterion["weight"]
            criteria.append(criterion)
        return {"question": f"Question {n + 1}: why does it happen? ({document.split()[0]})",
                "passage": first_sentence(document), "question_rationale": "Tests the mechanism.",
                "criteria": criteria}

    def _enrichment(self, content: str) -> str:
        rows = [json.loads(line) for line in fenced(content, "criteria").splitlines()]
        question = fenced(content, "question")
        passage = fenced(content, "passage")
        if _fault(passage) == "Arsenic" and question.startswith("Question 2"):
            rows = rows[1:]
        return json.dumps({"criteria": [{"id": row["id"], "expected_keywords": ["key", "term"],
                                         "expected_concepts": ["concept"], "verification_method": "Look for it."}
                                        for row in rows]})


class QuestionGenerator(_Counting):
    """The rgr and rar pipelines' generator (module docstring): `answers` maps a question's text to its boxed
    answer."""

    def __init__(self, answers: dict[str, str], wrong_for: tuple[str, ...] = ()):
        super().__init__()
        self.answers, self.wrong_for = answers, wrong_for

    def __call__(self, messages) -> str:
        content = messages[-1]["content"]
        stage = _stage(content)
        question = fenced(content, "question")
        self.count(stage, question[:40])
        if stage == "reference":
            answer = next(a for q, a in self.answers.items() if q in question)
            if any(word in question for word in self.wrong_for):
                answer = "wrong"
            return f"Reasoning step by step, verified.\nThe answer is \\boxed{{{answer}}}."
        if stage == "rgr_rubric":
            return json.dumps({"criteria": [
                {"type": "factual", "weight": 8, "description": "The final answer is correct."},
                {"type": "process", "weight": 5, "description": "Sets up the problem correctly."},
                {"type": "process", "weight": 2, "description": "Checks the result."}]})
        categories = [("Essential", 5), ("Essential", 5), ("Important", 4), ("Important", 3), ("Optional", 2),
                      ("Optional", 1), ("Pitfall", -1)]
        return json.dumps({"rubric": [{"title": f"Item {k + 1}", "description": f"{c} Criteria: checks item {k + 1}.",
                                       "weight": w} for k, (c, w) in enumerate(categories)]})
