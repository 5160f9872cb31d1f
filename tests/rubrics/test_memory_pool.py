"""EvoRubric's rubric memory pool: archiving new texts only, FIFO eviction per question and LRU over questions
(by hand and as invariants of any archive sequence), and its checkpoint state (round trip in order, validation
that leaves the pool unchanged)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubric_jax.rubrics.memory_pool import MemoryPool, pooled
from rubric_jax.rubrics.schema import Criterion

CODES = ("S1", "S2", "S3", "WS", "MU", "EV", "RP")


def criterion(code: str, points: int = 1) -> Criterion:
    """A criterion named `code`; its text depends on the code only, so equal codes are one criterion text."""
    return Criterion(text=f"the response shows {code}", name=code, weight=float(points))


def test_pool_archives_new_texts_evicts_fifo_per_question_and_lru_over_questions():
    pool = MemoryPool(max_per_question=3, max_questions=2)
    assert pool.archive("q1", [criterion("S1"), criterion("S1", 2), criterion("WS", -3)]) == [
        criterion("S1"), criterion("WS", -3)]
    assert pool.archive("q1", [criterion("S1", 5), criterion("S2"), criterion("EV")]) == [criterion("S2"),
                                                                                         criterion("EV")]
    assert [c.name for c in pool.criteria("q1")] == ["WS", "S2", "EV"]  # S1, the oldest, evicted
    pool.archive("q2", [criterion("MU")])
    pool.archive("q1", [])  # q1 used again: q2 is now the least recently used
    pool.archive("q3", [criterion("RP")])
    assert pool.criteria("q2") == () and pool.num_questions == 2 and len(pool) == 4
    assert [entry["question"] for entry in pool.state_dict()["pool"]] == ["q1", "q3"]
    assert pool.archive("q4", []) == [] and "q4" not in {e["question"] for e in pool.state_dict()["pool"]}
    assert pooled([criterion("S1")], [criterion("S2"), criterion("S1", 3)], 5) == (criterion("S1"), criterion("S2"))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.lists(st.sampled_from(CODES),
                                                              max_size=5)), max_size=25),
       st.integers(1, 4), st.integers(1, 3))
def test_pool_invariants_under_any_archive_sequence(archives, max_per_question, max_questions):
    pool = MemoryPool(max_per_question, max_questions)
    for question, codes in archives:
        held = pool.criteria(question)
        added = pool.archive(question, [criterion(code) for code in codes])
        now = pool.criteria(question)
        assert [c for c in now if c not in held] == [c for c in added if c in now] and len(added) <= len(codes)
        assert {c.text for c in added}.isdisjoint(c.text for c in held)
        if now:  # the question just used is the most recently used
            assert pool.state_dict()["pool"][-1]["question"] == question
        for entry in pool.state_dict()["pool"]:
            texts = [c["text"] for c in entry["criteria"]]
            assert 1 <= len(texts) <= max_per_question and len(set(texts)) == len(texts)
        assert pool.num_questions <= max_questions
        restored = MemoryPool(max_per_question, max_questions)
        restored.load_state_dict(pool.state_dict())
        assert restored.state_dict() == pool.state_dict()


def test_pool_state_round_trips_in_order():
    pool = MemoryPool(4, 10)
    pool.archive("b", [criterion("S1", 3), criterion("WS", -3)])
    pool.archive("a", [Criterion(text="Mentions the storage temperature", weight=7.0)])
    restored = MemoryPool(4, 10)
    restored.load_state_dict(pool.state_dict())
    assert restored.state_dict() == pool.state_dict() and restored.criteria("b") == pool.criteria("b")
    restored.load_state_dict({})
    assert len(restored) == 0


GOOD = {"question": "q", "criteria": [{"text": "step 1 is right", "weight": 3.0}]}


@pytest.mark.parametrize("state, message", [
    ([], "mapping with the key 'pool'"),
    ({"pool": [], "extra": 1}, "mapping with the key 'pool'"),
    ({"pool": {"q": []}}, "pool must be a list"),
    ({"pool": [GOOD, GOOD]}, r"pool\[1\]\.question is repeated"),
    ({"pool": [{"question": "q"}]}, r"pool\[0\] must be a mapping with the keys"),
    ({"pool": [{**GOOD, "question": ""}]}, r"pool\[0\]\.question must be a non-empty string"),
    ({"pool": [{**GOOD, "criteria": []}]}, r"pool\[0\] holds 0 criteria"),
    ({"pool": [{**GOOD, "criteria": [{"text": "x", "weight": 1.0}] * 2}]}, "repeats a criterion text"),
    ({"pool": [{**GOOD, "criteria": [{"text": f"c{i}"} for i in range(5)]}]}, r"holds 5 criteria"),
    ({"pool": [{**GOOD, "criteria": [{"weight": 1.0}]}]}, r"pool\[0\]\.criteria\[0\]: missing key 'text'"),
    ({"pool": [{**GOOD, "question": f"q{i}"} for i in range(3)]}, "more than pool_max_questions=2"),
])
def test_pool_state_is_validated(state, message):
    pool = MemoryPool(max_per_question=4, max_questions=2)
    pool.archive("kept", [criterion("S1")])
    with pytest.raises(ValueError, match=message):
        pool.load_state_dict(state)
    assert [c.name for c in pool.criteria("kept")] == ["S1"]  # unchanged
