"""EvoRubric's rubric memory pool (evorubric.txt, section 3.4.1): the verified criteria of past steps, per question,
which the rubric generator reads as C_hist (eq 2) and the reasoner is scored with as S_pool (eq 4).

Imports only the rubric schema and the standard library (DESIGN.md: rubrics/ holds the memory pool;
`rubric_jax.algorithms.evorubric` drives it).
"""

import collections
from typing import Any, Mapping, Sequence

from rubric_jax.rubrics.schema import Criterion, Rubric


def pooled(held: Sequence[Criterion], kept: Sequence[Criterion], max_size: int) -> tuple[Criterion, ...]:
    """A question's pool after archiving `kept` into `held`: the kept criteria whose text is new appended (the
    first of each text), then the oldest dropped beyond `max_size` (FIFO)."""
    seen = set()
    merged = tuple(c for c in (*held, *kept) if not (c.text in seen or seen.add(c.text)))
    return merged[-max_size:]


class MemoryPool:
    """EvoRubric's rubric memory pool (evorubric.txt, section 3.4.1): per question, keyed by its text, the
    criteria archived from the verified generator proposals, in archive order.

    A criterion is archived once per question: a text already in the question's pool is not added again (the
    first proposal of it stays, with its points). Bounds and eviction (the paper states none): at most
    `max_per_question` criteria per question, the oldest evicted first (FIFO: the newest criteria track the
    current policy), and at most `max_questions` questions, the least recently used evicted first (a question is
    used when a step archives to it). `state_dict` lists the questions from least to most recently used, so the
    order, and with it every later eviction, survives a checkpoint.
    """

    def __init__(self, max_per_question: int, max_questions: int):
        self.max_per_question, self.max_questions = max_per_question, max_questions
        self._pool: collections.OrderedDict[str, tuple[Criterion, ...]] = collections.OrderedDict()

    def criteria(self, question: str) -> tuple[Criterion, ...]:
        return self._pool.get(question, ())

    def archive(self, question: str, criteria: Sequence[Criterion]) -> list[Criterion]:
        """Adds the criteria whose text the question's pool lacks (marking the question used, even when none is
        new), evicts past the bounds, and returns the criteria added."""
        held = self._pool.pop(question, ())
        updated = pooled(held, criteria, self.max_per_question)
        if updated:
            self._pool[question] = updated
        while len(self._pool) > self.max_questions:
            self._pool.popitem(last=False)
        texts = {c.text for c in held}
        return [c for c in updated if c.text not in texts]

    @property
    def num_questions(self) -> int:
        return len(self._pool)

    def __len__(self) -> int:
        return sum(len(criteria) for criteria in self._pool.values())

    def state_dict(self) -> dict[str, Any]:
        return {"pool": [{"question": question, "criteria": Rubric(criteria).to_dict()["criteria"]}
                         for question, criteria in self._pool.items()]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replaces the pool by `state` (`state_dict`'s form; {} is an empty pool). ValueError naming the entry
        for a malformed state or one beyond this pool's bounds; the pool is unchanged then."""
        if not isinstance(state, Mapping) or set(state) - {"pool"}:
            raise ValueError(f"memory pool state must be a mapping with the key 'pool', got {state!r:.200}")
        entries = state.get("pool", [])
        if not isinstance(entries, (list, tuple)):
            raise ValueError(f"pool must be a list, got {type(entries).__name__}")
        if len(entries) > self.max_questions:
            raise ValueError(f"pool holds {len(entries)} questions, more than pool_max_questions="
                             f"{self.max_questions}")
        pool = collections.OrderedDict()
        for i, entry in enumerate(entries):
            where = f"pool[{i}]"
            if not isinstance(entry, Mapping) or set(entry) != {"question", "criteria"}:
                raise ValueError(f"{where} must be a mapping with the keys 'question' and 'criteria'")
            question = entry["question"]
            if not isinstance(question, str) or not question:
                raise ValueError(f"{where}.question must be a non-empty string")
            if question in pool:
                raise ValueError(f"{where}.question is repeated: {question[:80]!r}")
            try:
                criteria = Rubric.from_dict({"criteria": entry["criteria"]}).criteria
            except ValueError as error:
                raise ValueError(f"{where}.{error}") from None
            if not 1 <= len(criteria) <= self.max_per_question:
                raise ValueError(f"{where} holds {len(criteria)} criteria; a question holds 1 to "
                                 f"pool_max_per_question={self.max_per_question}")
            if len({c.text for c in criteria}) != len(criteria):
                raise ValueError(f"{where} repeats a criterion text")
            pool[question] = criteria
        self._pool = pool
