"""The arithmetic task with an SRaR rubric (srar.txt, section 3.2, Appendix 14): typed SUGGEST / PITFALL / BONUS /
ANSWER items checked programmatically against the gold solution and attributed to the step they judge, so that
SRaR's step-wise rewards really operate on CPU, and programmatic step labels for its step-level analysis
(section 4.3.1).

The rubric of a problem with n steps (format "srar", weight 1 each: SRaR uses typed budgets, not weights), in
this order:
- SUGGEST, one per gold step k (the paper's "key reasoning step from the standard solution path"): step k
  computes the gold `x op y = z` (`arithmetic.step{k}`: the first `### Step k:` line; the gold x is the gold
  previous result, so an error propagates). Attributed to step k, or -1 when the response has no step k.
- PITFALL (the paper's "common errors to avoid"; satisfied means the response fell into it), the three
  failures a small policy of this task actually shows:
  - `arithmetic_srar.arithmetic_slip`: a step line states a false equation, `x op y = z` with x op y != z.
    Attributed to the first such step (in written order).
  - `arithmetic_srar.repeated_step`: a step header number is written twice (a restarted or looping chain).
    Attributed to that number (the first repeat in written order); its tokens are the tokens of every span
    numbered so (`rubrics.steps`).
  - `arithmetic_srar.text_after_answer`: something other than white space follows the last box (the policy
    did not stop). Attributed to the step holding the first such character, 0 outside every step.
  An unsatisfied PITFALL is attributed to -1 (it carries no delta either way).
- BONUS (the paper's "especially clever, efficient, or elegant reasoning"): `arithmetic.format`, the response
  is exactly the gold number of step lines and the box line, no wasted line. Whole response (0).
- ANSWER: `arithmetic.answer`, the last box holds the gold answer. Whole response (0).

Step labels (`step_labels`), the programmatic counterpart of the paper's step-level judge (Appendix 7.5: "Previous
Steps (assumed correct for this evaluation)"): each step span of the response, in written order, is correct
iff its number k is a gold step (1..n), its first line is an equation `x op y = z` that is true, its operator
and operand are those of gold step k, and x is the problem's first operand for k = 1, else the result the
previous span wrote (the gold left operand of step k when the previous span wrote no equation: it is assumed
correct). So a step that computes correctly from an earlier wrong result is correct, as the paper's judge
would find it, and a repeated step is judged like any other (its looping is a PITFALL, not an error).

Model text is matched with the regular expressions of `rubric_jax.data.arithmetic`, never evaluated.
"""

import dataclasses
import re

from rubric_jax.data import arithmetic
from rubric_jax.data.arithmetic import APPLY, ArithmeticTask, step_equation
from rubric_jax.judges.base import JudgeRequest
from rubric_jax.judges.programmatic import Attributed, ProgrammaticJudge, register_check, step_at
from rubric_jax.rubrics.schema import Criterion, ItemKind, Rubric
from rubric_jax.rubrics.steps import split_steps

SLIP_CHECK = "arithmetic_srar.arithmetic_slip"
REPEAT_CHECK = "arithmetic_srar.repeated_step"
TRAILING_CHECK = "arithmetic_srar.text_after_answer"
# A closed box without nested braces (the task's answers are integers); a box that is not closed has no "after".
_CLOSED_BOX = re.compile(r"\\boxed\{[^{}]*\}")


@register_check(SLIP_CHECK)
def _check_arithmetic_slip(response: str, request: JudgeRequest) -> Attributed:
    for span in split_steps(response):
        equation = step_equation(response, span)
        if equation is not None and APPLY[equation[1]](equation[0], equation[2]) != equation[3]:
            return Attributed(True, span.number)
    return Attributed(False, -1)


@register_check(REPEAT_CHECK)
def _check_repeated_step(response: str, request: JudgeRequest) -> Attributed:
    seen = set()
    for span in split_steps(response):
        if span.number in seen:
            return Attributed(True, span.number)
        seen.add(span.number)
    return Attributed(False, -1)


@register_check(TRAILING_CHECK)
def _check_text_after_answer(response: str, request: JudgeRequest) -> Attributed:
    box = _CLOSED_BOX.match(response, response.rfind("\\boxed{")) if "\\boxed{" in response else None
    if box is None:
        return Attributed(False, -1)
    trailing = re.search(r"\S", response[box.end() :])
    if trailing is None:
        return Attributed(False, -1)
    return Attributed(True, step_at(response, box.end() + trailing.start()))


PITFALLS = (
    (SLIP_CHECK, "A step states a false equation (an arithmetic slip)"),
    (REPEAT_CHECK, "A step header number is written twice (the chain restarts or loops)"),
    (TRAILING_CHECK, "Text follows the boxed answer (the response does not stop)"),
)


def srar_rubric(problem: arithmetic.Problem) -> Rubric:
    """The typed rubric of `problem` (module docstring): n SUGGEST, 3 PITFALL, 1 BONUS, 1 ANSWER items."""
    n = len(problem.steps)
    if n > arithmetic.MAX_STEPS:
        raise ValueError(f"problem has {n} steps; checks exist for at most MAX_STEPS={arithmetic.MAX_STEPS}")
    suggest = tuple(
        Criterion(text=f"Step {k} computes {s.left} {s.op} {s.right} = {s.result}", kind=ItemKind.SUGGEST,
                  name=arithmetic.step_check_name(k))
        for k, s in enumerate(problem.steps, 1)
    )
    pitfalls = tuple(Criterion(text=text, kind=ItemKind.PITFALL, name=name) for name, text in PITFALLS)
    bonus = Criterion(
        text=f"No wasted line: exactly {n} step lines, then the box line", kind=ItemKind.BONUS,
        name=arithmetic.FORMAT_CHECK)
    answer = Criterion(
        text=f"The boxed final answer is {problem.answer}", kind=ItemKind.ANSWER, name=arithmetic.ANSWER_CHECK)
    return Rubric(criteria=suggest + pitfalls + (bonus, answer), format="srar")


def srar_judge() -> ProgrammaticJudge:
    """A judge with every check of the typed rubric, by criterion name."""
    names = [arithmetic.step_check_name(k) for k in range(1, arithmetic.MAX_STEPS + 1)]
    names += [name for name, _ in PITFALLS] + [arithmetic.FORMAT_CHECK, arithmetic.ANSWER_CHECK]
    return ProgrammaticJudge({name: name for name in names})


def step_labels(response: str, problem: arithmetic.Problem) -> list[bool]:
    """Whether each step span of `response` (written order) is correct given the previous ones (module
    docstring); [] for a response without step headers."""
    gold = problem.steps
    labels, previous = [], None  # previous: the equation the previous span wrote, or None
    for span in split_steps(response):
        equation = step_equation(response, span)
        correct = False
        if equation is not None and 1 <= span.number <= len(gold):
            x, op, y, z = equation
            step = gold[span.number - 1]
            expected_x = previous[3] if previous is not None and span.number > 1 else step.left
            correct = (x, op, y) == (expected_x, step.op, step.right) and APPLY[op](x, y) == z
        labels.append(correct)
        previous = equation
    return labels


@dataclasses.dataclass(frozen=True)
class ArithmeticSrarTask(ArithmeticTask):
    """The arithmetic task judged by its typed SRaR rubric, with step labels (module docstring)."""

    eval_recipes = ("srar",)  # every evaluation on this task reports SRaR's analysis (training.evaluate)

    def rubric(self, example: arithmetic.Problem) -> Rubric:
        return srar_rubric(example)

    def judge(self) -> ProgrammaticJudge:
        return srar_judge()

    def step_labels(self, response: str, example: arithmetic.Problem) -> list[bool]:
        return step_labels(response, example)

