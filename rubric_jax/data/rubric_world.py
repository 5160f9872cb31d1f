"""A world of checkable rubrics for the two-role recipes on CPU: RLCER's rubricator and EvoRubric's rubric
generator write rubrics that a programmatic verifier can grade, so that validity, correlation, pruning, consensus
and the evolving rewards move for real with a tiny policy.

The policy writes a rubric as lines `<sign><points> <code>`, e.g. "+3 S1\\n-3 WS", each code naming a criterion of
VOCABULARY (or the single line "none", an empty rubric: EvoRubric's "no meaningful gap"). The vocabulary mixes
criteria that separate right from wrong solutions (a step is right, no step has a wrong result) with criteria
that do not (the question uses multiplication: constant within a question; the answer is even: unrelated to
correctness; a box is present: almost always met) and with flawed ones that a meta-verifier should reject (a
superficial formatting check, an unmeasurable judgement whose "verdict" is a hash of the text, i.e. noise). A
tiny policy learns the format in an SFT cold start that writes random subsets of the vocabulary, and RL then has
real work: find the subsets whose criteria are valid.

Conventions:
- A parsed criterion is `Criterion(text=<the code's description>, name=<code>, weight=<signed points>)`; the
  judge of `world_judge` checks it by its code against the gold solution in `request.reference`, like the
  arithmetic task's own rubric (whose criteria it also checks). A code about a step the problem does not have is
  never met (a rubric for another problem), never an error.
- Points are integers in [-5, -1] or [1, 5]; a rubric has at most `max_items` criteria, each code at most once.
- Prompts are one user message; the model's text in them is fenced (`rubrics.prompts.fence`), and everything a
  policy writes is parsed by `parse_world_rubric`, which validates every line.
- SFT cold start (`WorldSFTStream`): example i of the stream is a pure function of (seed, i), so it resumes
  exactly by position; it mixes the reasoner's solutions with rubricator and generator examples in the
  proportions of `WorldSFTConfig`.
"""

import dataclasses
import functools
import hashlib
import re
from typing import Callable, Optional, Sequence

import numpy as np

from rubric_jax.data import arithmetic
from rubric_jax.judges.base import JudgeRequest
from rubric_jax.judges.outcome import extract_boxed
from rubric_jax.judges.programmatic import Attributed, ProgrammaticJudge, RegexCheck, registered_check
from rubric_jax.rubrics.parsing import RubricParse
from rubric_jax.rubrics.prompts import fence
from rubric_jax.rubrics.schema import Criterion, Rubric
from rubric_jax.rubrics.steps import split_steps

MAX_POINTS = 5
EMPTY_RUBRIC = "none"


@dataclasses.dataclass(frozen=True)
class CheckableCriterion:
    """A criterion the policy can name: its `code`, what it says, the points the cold start writes for it, the
    judge's check, the check it duplicates in the arithmetic rubric (if any), and the meta-verifier's category
    when the criterion is flawed (EvoRubric's meta-verifier categories; None: valid)."""

    code: str
    text: str
    points: int
    check: Callable
    duplicates: Optional[str] = None
    flaw: Optional[str] = None


_STEP_EQUATION = re.compile(r"### Step [0-9]{1,9}:[ \t]*([0-9]{1,9})[ \t]*([-+*])[ \t]*([0-9]{1,9})[ \t]*=[ \t]*([0-9]{1,9})")


def _step_right(k: int, response: str, request: JudgeRequest) -> Attributed:
    if k > len(split_steps(request.reference)):
        return Attributed(False, -1)
    return registered_check(arithmetic.step_check_name(k))(response, request)


def _wrong_result(response: str, request: JudgeRequest) -> bool:
    """Some `### Step k:` line states an equation whose arithmetic is wrong (whatever the problem)."""
    del request
    return any(arithmetic.APPLY[op](int(x), int(y)) != int(z) for x, op, y, z in _STEP_EQUATION.findall(response))


def _header_repeated(response: str, request: JudgeRequest) -> bool:
    del request
    numbers = [span.number for span in split_steps(response)]
    return len(numbers) != len(set(numbers))


def _answer_even(response: str, request: JudgeRequest) -> bool:
    del request
    boxed = extract_boxed(response)
    return boxed is not None and boxed.strip().isdigit() and int(boxed) % 2 == 0


def _at_most_four_lines(response: str, request: JudgeRequest) -> bool:
    del request
    return len(response.strip().split("\n")) <= 4


def _elegant(response: str, request: JudgeRequest) -> bool:
    """An unmeasurable judgement: the "verdict" is a hash of the text, noise that no rubric should rely on."""
    del request
    return hashlib.sha256(response.encode()).digest()[0] % 2 == 0


VOCABULARY: tuple[CheckableCriterion, ...] = (
    *(
        CheckableCriterion(f"S{k}", f"step {k} is computed correctly", 3, functools.partial(_step_right, k),
                           duplicates=arithmetic.step_check_name(k))
        for k in (1, 2, 3)
    ),
    CheckableCriterion("AN", "the boxed final answer is correct", 5, registered_check(arithmetic.ANSWER_CHECK),
                       duplicates=arithmetic.ANSWER_CHECK),
    CheckableCriterion("FM", "the solution follows the step format exactly", 2,
                       registered_check(arithmetic.FORMAT_CHECK), duplicates=arithmetic.FORMAT_CHECK),
    CheckableCriterion("WS", "a step states a wrong result", -3, _wrong_result),
    CheckableCriterion("RP", "a step header is repeated", -3, _header_repeated),
    CheckableCriterion("MU", "the solution uses multiplication", 1, RegexCheck(r"\*")),
    CheckableCriterion("EV", "the final answer is even", 1, _answer_even),
    CheckableCriterion("SH", "the solution has at most four lines", 1, _at_most_four_lines),
    CheckableCriterion("BX", "the answer is put in a box", 1, RegexCheck(r"\\boxed\{"),
                       flaw="Superficial Formatting"),
    CheckableCriterion("NI", "the reasoning is elegant", 2, _elegant, flaw="Unmeasurable Subjectivity"),
)
BY_CODE = {c.code: c for c in VOCABULARY}
_LINE = re.compile(r"([+-])([0-9]+) ([A-Z0-9]{2})")


def world_criterion(code: str, points: int) -> Criterion:
    """The criterion the rubric line `<points> <code>` stands for."""
    return Criterion(text=BY_CODE[code].text, name=code, weight=float(points))


def rubric_text(criteria: Sequence[Criterion]) -> str:
    """The lines a policy writes for `criteria` (inverse of `parse_world_rubric`); "none" for no criterion."""
    if not criteria:
        return EMPTY_RUBRIC
    return "\n".join(f"{int(c.weight):+d} {c.name}" for c in criteria)


def parse_world_rubric(text: str, *, max_items: int, allow_empty: bool = False) -> RubricParse:
    """A rubric written by the policy (module docstring), validated line by line.

    Failures (RubricParse.ok False, with a reason of `rubrics.parsing.REASONS`): "empty" (nothing written),
    "no_items" ("none" when `allow_empty` is False), "schema" (a line that is not `<sign><points> <code>`),
    "unrecognized" (a code outside VOCABULARY), "out_of_bounds" (points 0 or beyond MAX_POINTS), "bad_id" (a
    code written twice), "too_many_items" (more than max_items lines).
    """
    if max_items < 1:
        raise ValueError(f"max_items must be >= 1, got {max_items}")
    lines = [line.strip() for line in text.strip().split("\n")]
    if lines == [""]:
        return RubricParse(rubric=None, ok=False, reason="empty", detail="no rubric written")
    if lines == [EMPTY_RUBRIC]:
        if allow_empty:
            return RubricParse(rubric=Rubric(criteria=()), ok=True)
        return RubricParse(rubric=None, ok=False, reason="no_items", detail="an empty rubric")
    if len(lines) > max_items:
        return RubricParse(rubric=None, ok=False, reason="too_many_items", detail=f"{len(lines)} > {max_items}")
    criteria, seen = [], set()
    for i, line in enumerate(lines):
        match = _LINE.fullmatch(line)
        failure = None
        if match is None:
            failure = ("schema", f"line {i} is not '<sign><points> <code>': {line[:40]!r}")
        elif match.group(3) not in BY_CODE:
            failure = ("unrecognized", f"line {i}: unknown code {match.group(3)!r}")
        elif not 1 <= int(match.group(2)) <= MAX_POINTS:
            failure = ("out_of_bounds", f"line {i}: points must be 1..{MAX_POINTS}")
        elif match.group(3) in seen:
            failure = ("bad_id", f"line {i}: code {match.group(3)} repeated")
        if failure:
            return RubricParse(rubric=None, ok=False, reason=failure[0], detail=failure[1])
        sign, points, code = match.groups()
        seen.add(code)
        criteria.append(world_criterion(code, int(points) * (1 if sign == "+" else -1)))
    return RubricParse(rubric=Rubric(criteria=tuple(criteria)), ok=True)


def meta_verify(criteria: Sequence[Criterion], existing: Sequence[Criterion]) -> list[Optional[str]]:
    """A programmatic stand-in for EvoRubric's meta-verifier (evorubric.txt, section 3.3.2 step 1, Appendix C
    Tables 6-7): per proposed criterion, None when VALID, else the INVALID category: its intrinsic flaw
    (superficial formatting, unmeasurable subjectivity) or "Semantic Duplication" of an `existing` criterion (the
    base rubric or the memory pool, compared by what they check: "S1" duplicates "arithmetic.step1")."""
    checked = {_checks_what(c.name) for c in existing}
    verdicts = []
    for criterion in criteria:
        entry = BY_CODE[criterion.name]
        if entry.flaw is not None:
            verdicts.append(entry.flaw)
        elif _checks_what(criterion.name) in checked:
            verdicts.append("Semantic Duplication")
        else:
            verdicts.append(None)
    return verdicts


def _checks_what(name: Optional[str]) -> Optional[str]:
    entry = BY_CODE.get(name)
    return entry.duplicates or entry.code if entry is not None else name


def world_judge() -> ProgrammaticJudge:
    """The verifier / grader: checks the arithmetic rubric's criteria and every code of VOCABULARY."""
    checks = dict(arithmetic.arithmetic_judge().checks)
    checks.update({c.code: c.check for c in VOCABULARY})
    return ProgrammaticJudge(checks)


def coarse_rubric(problem: arithmetic.Problem) -> Rubric:
    """An "expert" rubric that misses the step dimension: the boxed answer and the format only (EvoRubric's base
    rubric in this world, so that the generator has real dimensions to discover)."""
    return Rubric(criteria=tuple(c for c in arithmetic.problem_rubric(problem).criteria
                                 if c.name in (arithmetic.ANSWER_CHECK, arithmetic.FORMAT_CHECK)))


# ---------------------------------------------------------------- the roles' prompts


def rubricator_messages(question: str, response: str) -> list[dict[str, str]]:
    """RLCER's rubricator prompt in this world: the question and one reasoner CoT (fenced)."""
    return [{"role": "user", "content": f"Rubric for: {question}\n{fence(response, 'response')}"}]


def generator_messages(question: str, responses: Sequence[str], existing: Sequence[Criterion]) -> list[dict[str, str]]:
    """EvoRubric's generator prompt in this world: the question, reasoner responses (fenced) and the existing
    criteria (base rubric and memory pool) by code, to propose new criteria that separate the responses."""
    codes = " ".join(sorted({c.name for c in existing if c.name in BY_CODE})) or EMPTY_RUBRIC
    shown = "\n".join(fence(text, f"response_{i + 1}") for i, text in enumerate(responses))
    return [{"role": "user", "content": f"New rubrics for: {question}\n{shown}\nHave: {codes}"}]


# ---------------------------------------------------------------- the SFT cold start


@dataclasses.dataclass(frozen=True)
class WorldSFTConfig:
    """The cold start's mix: the fraction of rubricator and of generator examples (the rest are the reasoner's
    gold solutions), how many responses a generator prompt shows, the fraction of shown responses that carry a
    wrong step, and the largest rubric written."""

    rubricator_fraction: float = 0.25
    generator_fraction: float = 0.25
    responses_shown: int = 2
    corrupt_fraction: float = 0.5
    max_items: int = 4

    def __post_init__(self):
        for name in ("rubricator_fraction", "generator_fraction", "corrupt_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.rubricator_fraction + self.generator_fraction > 1:
            raise ValueError("rubricator_fraction + generator_fraction must be <= 1")
        if self.responses_shown < 1 or self.max_items < 1:
            raise ValueError("responses_shown and max_items must be >= 1")


@dataclasses.dataclass(frozen=True)
class SFTExample:
    """One cold-start example: the chat messages and the assistant's target text."""

    messages: tuple
    target: str


def corrupted_solution(problem: arithmetic.Problem, rng: np.random.Generator) -> str:
    """The gold solution with one step's result off by 1..9 (and every later step computed from it, floored at
    0 so that every number stays one the step regexes read), a realistic wrong CoT for the cold start."""
    k = int(rng.integers(len(problem.steps)))
    error = int(rng.integers(1, 10)) * (1 if rng.random() < 0.5 else -1)
    lines, value = [], None
    for i, step in enumerate(problem.steps):
        left = step.left if value is None else value
        value = arithmetic.APPLY[step.op](left, step.right)
        if i == k:
            value = value + error if value + error >= 0 else value - error  # stays a non-negative number
        value = max(value, 0)
        lines.append(f"### Step {i + 1}: {left} {step.op} {step.right} = {value}")
    return "\n".join(lines + [f"\\boxed{{{value}}}"])


def _random_rubric(rng: np.random.Generator, codes: Sequence[str], max_items: int) -> list[Criterion]:
    count = int(rng.integers(1, min(max_items, len(codes)) + 1))
    chosen = rng.choice(len(codes), size=count, replace=False)
    return [world_criterion(codes[i], BY_CODE[codes[i]].points) for i in chosen]


def sft_example(problem: arithmetic.Problem, rng: np.random.Generator, config: WorldSFTConfig) -> SFTExample:
    """A reasoner, rubricator or generator example for `problem`, drawn by `rng` (module docstring)."""
    def response() -> str:
        corrupt = rng.random() < config.corrupt_fraction
        return corrupted_solution(problem, rng) if corrupt else arithmetic.solution_text(problem)

    role = rng.random()
    all_codes = [c.code for c in VOCABULARY]
    if role < config.rubricator_fraction:
        messages = rubricator_messages(problem.question, response())
        return SFTExample(tuple(messages), rubric_text(_random_rubric(rng, all_codes, config.max_items)))
    if role < config.rubricator_fraction + config.generator_fraction:
        existing = _random_rubric(rng, all_codes, 2) if rng.random() < 0.5 else []
        fresh = [code for code in all_codes if code not in {c.name for c in existing}]
        proposal = _random_rubric(rng, fresh, config.max_items) if rng.random() < 0.9 else []
        responses = [response() for _ in range(config.responses_shown)]
        return SFTExample(tuple(generator_messages(problem.question, responses, existing)), rubric_text(proposal))
    return SFTExample(tuple(arithmetic.prompt_messages(problem)), arithmetic.solution_text(problem))


class WorldSFTStream:
    """The cold start's resumable stream (module docstring): `next_batch(n)` and `position`, as the arithmetic
    stream; example i is drawn from `np.random.default_rng([seed, 2, i])` on the i-th train problem."""

    def __init__(self, arithmetic_config: arithmetic.ArithmeticConfig, config: WorldSFTConfig, seed: int,
                 position: int = 0):
        self.problems = arithmetic.ArithmeticDataset(arithmetic_config, seed, "train", position)
        self.config, self.seed = config, seed

    @property
    def position(self) -> int:
        return self.problems.position

    def next_batch(self, n: int) -> list[SFTExample]:
        start = self.problems.position
        return [sft_example(problem, np.random.default_rng([self.seed, 2, start + i]), self.config)
                for i, problem in enumerate(self.problems.next_batch(n))]
