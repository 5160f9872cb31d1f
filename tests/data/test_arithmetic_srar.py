"""The arithmetic task's SRaR rubric: typed items in the paper's order, each check's verdict and step on gold,
wrong, looping and adversarial responses, step labels with the step-level judge's semantics (previous steps
assumed correct), and the task by name."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.data import arithmetic
from rubric_jax.data.arithmetic_srar import (
    REPEAT_CHECK, SLIP_CHECK, TRAILING_CHECK, ArithmeticSrarTask, srar_judge, srar_rubric, step_labels)
from rubric_jax.data.tasks import build_task
from rubric_jax.judges.base import JudgeRequest
from rubric_jax.rubrics.schema import ItemKind

EXAMPLE = arithmetic.problem_from_steps(
    [arithmetic.Step(3, "+", 4, 7), arithmetic.Step(7, "*", 2, 14), arithmetic.Step(14, "-", 5, 9)])
GOLD = arithmetic.solution_text(EXAMPLE)
NAMES = ["arithmetic.step1", "arithmetic.step2", "arithmetic.step3", SLIP_CHECK, REPEAT_CHECK, TRAILING_CHECK,
         arithmetic.FORMAT_CHECK, arithmetic.ANSWER_CHECK]


def judged(response: str):
    """{criterion name: (satisfied, step)} of `response` to EXAMPLE."""
    rubric = srar_rubric(EXAMPLE)
    verdicts = srar_judge().judge(
        [JudgeRequest(EXAMPLE.question, response, rubric, arithmetic.reference_for(EXAMPLE))], len(rubric.criteria))
    assert not verdicts.failed_b[0], verdicts.details
    return {c.name: (bool(verdicts.satisfied_bk[0, k]), int(verdicts.item_step_bk[0, k]))
            for k, c in enumerate(rubric.criteria)}


def test_rubric_items_are_typed_in_order():
    rubric = srar_rubric(EXAMPLE)
    assert rubric.format == "srar" and [c.name for c in rubric.criteria] == NAMES
    assert [c.kind for c in rubric.criteria] == [ItemKind.SUGGEST] * 3 + [ItemKind.PITFALL] * 3 + [
        ItemKind.BONUS, ItemKind.ANSWER]
    assert rubric.criteria[1].text == "Step 2 computes 7 * 2 = 14" and all(c.weight == 1 for c in rubric.criteria)


def test_gold_meets_every_suggest_bonus_and_answer_item_and_no_pitfall():
    assert judged(GOLD) == {
        "arithmetic.step1": (True, 1), "arithmetic.step2": (True, 2), "arithmetic.step3": (True, 3),
        SLIP_CHECK: (False, -1), REPEAT_CHECK: (False, -1), TRAILING_CHECK: (False, -1),
        arithmetic.FORMAT_CHECK: (True, 0), arithmetic.ANSWER_CHECK: (True, 0)}


def test_a_slip_is_a_pitfall_of_its_step_and_fails_the_later_suggest_items():
    verdict = judged("### Step 1: 3 + 4 = 7\n### Step 2: 7 * 2 = 15\n### Step 3: 15 - 5 = 10\n\\boxed{10}")
    assert verdict[SLIP_CHECK] == (True, 2)
    assert verdict["arithmetic.step1"] == (True, 1) and verdict["arithmetic.step3"] == (False, 3)
    assert verdict[arithmetic.FORMAT_CHECK] == (True, 0) and verdict[arithmetic.ANSWER_CHECK] == (False, 0)


def test_a_repeated_header_is_a_pitfall_of_that_step():
    verdict = judged("### Step 1: 3 + 4 = 7\n### Step 2: 7 * 2 = 14\n### Step 2: 7 * 2 = 14\n"
                     "### Step 3: 14 - 5 = 9\n\\boxed{9}")
    assert verdict[REPEAT_CHECK] == (True, 2) and verdict[arithmetic.FORMAT_CHECK] == (False, 0)
    assert verdict["arithmetic.step3"] == (True, 3) and verdict[SLIP_CHECK] == (False, -1)


def test_text_after_the_box_is_a_pitfall_of_the_step_holding_it():
    assert judged(GOLD + "\n### Step 4: 9 + 1 = 10")[TRAILING_CHECK] == (True, 4)
    assert judged(GOLD + " x")[TRAILING_CHECK] == (True, 3)
    assert judged("\\boxed{9} and then")[TRAILING_CHECK] == (True, 0)
    assert judged(GOLD + " \n\t")[TRAILING_CHECK] == (False, -1)
    assert judged("\\boxed{9")[TRAILING_CHECK] == (False, -1)  # never closed: no "after"
    assert judged("\\boxed{1} \\boxed{9}")[TRAILING_CHECK] == (False, -1)  # the last box ends the text


@given(st.text(alphabet=st.sampled_from(list("#Step 0123456789:+-*=\n\\boxed{}")), max_size=80))
def test_checks_never_fail_a_rollout_on_model_text(response):
    judged(response)


def test_step_labels_judge_each_step_given_the_previous_ones():
    assert step_labels(GOLD, EXAMPLE) == [True, True, True]
    # A slip, then steps that compute right from it: the paper's judge finds them correct.
    assert step_labels("### Step 1: 3 + 4 = 8\n### Step 2: 8 * 2 = 16\n### Step 3: 16 - 5 = 11", EXAMPLE) == [
        False, True, True]
    # The wrong operation, the wrong left operand, an extra step, a step 0, an unparsable step (assumed right).
    assert step_labels("### Step 1: 3 * 4 = 12\n### Step 2: 7 * 2 = 14", EXAMPLE) == [False, False]
    assert step_labels("### Step 1: 3 + 4 = 7\n### Step 2: 7 * 2 = 14\n### Step 3: 14 - 5 = 9\n"
                       "### Step 4: 9 + 0 = 9\n### Step 0: 3 + 4 = 7", EXAMPLE) == [True, True, True, False, False]
    assert step_labels("### Step 1: add them\n### Step 2: 7 * 2 = 14", EXAMPLE) == [False, True]
    # A repeated step is judged like any other.
    assert step_labels("### Step 1: 3 + 4 = 7\n### Step 1: 3 + 4 = 7\n### Step 2: 7 * 2 = 14", EXAMPLE) == [
        True, True, True]
    assert step_labels("\\boxed{9}", EXAMPLE) == []


@given(st.integers(0, 2**32 - 1))
def test_gold_solutions_have_all_steps_correct(seed):
    problem = arithmetic.sample_problem(np.random.default_rng(seed), arithmetic.ArithmeticConfig(max_steps=6))
    solution = arithmetic.solution_text(problem)
    assert step_labels(solution, problem) == [True] * len(problem.steps)
    rubric = srar_rubric(problem)
    verdicts = srar_judge().judge([JudgeRequest(problem.question, solution, rubric, arithmetic.reference_for(problem))],
                                  len(rubric.criteria))
    kinds = np.array([c.kind for c in rubric.criteria])
    assert (verdicts.satisfied_bk[0][kinds != ItemKind.PITFALL] == 1).all()
    assert (verdicts.satisfied_bk[0][kinds == ItemKind.PITFALL] == 0).all()


def test_the_task_by_name():
    task = build_task("arithmetic_srar", {"max_steps": 4}, 5)
    assert isinstance(task, ArithmeticSrarTask) and task.config.max_steps == 4 and task.seed == 5
    example = task.train_stream(0).next_batch(1)[0]
    assert task.rubric(example) == srar_rubric(example) and task.prompt(example) == arithmetic.prompt_messages(example)
    assert task.step_labels(task.solution(example), example) == [True] * len(example.steps)
