r"""RGR-GRPO's arithmetic world: the arithmetic task of `rubric_jax.data.arithmetic` with factual and process
criteria, a short refinement prompt for the character tokenizer, and an SFT stream that teaches a policy to
refine. Tasks "arithmetic_rgr" (RL) and "arithmetic_rgr_sft" (its cold start) of `rubric_jax.data.tasks`.

RGR-GRPO (rgr_grpo.txt, section 2.2) judges a response against factual criteria (intermediate and final results)
and process criteria (essential steps, valid logic), and (section 2.3) has the policy refine its group's best
response given the criteria that response failed. Here:

- Rubric (`rgr_rubric`, format "rgr"; `rgr_judge` checks it against the gold solution in `request.reference`):
  FACTUAL  `arithmetic.step{k}`, text "### Step k: x op y = z" (weight STEP_WEIGHT): the gold line of step k, the
           check of `rubric_jax.data.arithmetic` (so an error propagates to every later step).
  FACTUAL  `arithmetic.answer`, text "\boxed{n}" (ANSWER_WEIGHT): the last box holds the answer.
  PROCESS  `arithmetic_rgr.plan` (PLAN_WEIGHT): one step per operation of the question, in order, whatever the
           arithmetic: the response's step headers are exactly 1..n, each step line is an equation, step 1 starts
           from the question's first number, and step k applies the question's k-th operator and operand.
  PROCESS  `arithmetic_rgr.carry` (CARRY_WEIGHT): the chain is consistent, right or wrong: step lines 1..n are
           equations, step k >= 2 starts from the result step k - 1 states, and the last box holds the result the
           last step states.
  PROCESS  `arithmetic.format` (FORMAT_WEIGHT): the exact layout, as in `rubric_jax.data.arithmetic`.
  Factual criteria state the gold values they check, as the paper's reference-grounded rubrics state the
  sub-answers ("computes the velocity as 12 m/s"): a failed factual criterion shown to the refining policy tells
  it the right value: the guidance a refinement can use to beat its attempt. Their texts are the very lines
  they require, the form a small policy copies most easily. Process criteria say what to do, not the values.
  Step lines are read as in `arithmetic` (the first `### Step k:` header of each k, the equation on its line).
- Refinement prompt (`refinement_messages`), one user message, kept short for max_position_embeddings:
      {question}
      <response>
      {attempt}
      </response>
      Fix:
      {the failed criteria's texts, one a line}
  ("Fix: nothing" when no criterion failed), eq 9's triplet (q, o_best, C_failed).
  The attempt is model text: only the tokenizer's characters other than "<" are kept (no solution has one), so
  that it encodes, and can neither spell a special token (re-encoded, a "<|im_end|>" written out in characters
  would become a real turn boundary) nor a fence tag; it is cut to its first ATTEMPT_TOKENS tokens and fenced
  (`rubric_jax.rubrics.prompts.fence`). For problems of at most 3 steps (ArithmeticConfig's default max_steps,
  any operands) the prompt has at most REFINEMENT_PROMPT_TOKENS tokens under the chat template, so a policy whose
  max_position_embeddings is at least that plus max_new_tokens can always answer it.
- SFT stream (`RefinementMixStream`): item i is problem i of the arithmetic train stream; with probability
  `refine_fraction` (a draw of `np.random.default_rng([seed, REFINE_TAG, i])`) it becomes a `RefinementExample`:
  an attempt made by corrupting the gold solution (`corrupt_solution`, with a kind of mistake drawn uniformly
  from CORRUPTIONS), the criteria the judge finds the attempt fails (`failed_criteria`), and the gold solution as
  the target. A pure function of the index, so resuming is exact.

Regime. The refinement only helps where the policy cannot compute what the criteria tell it. With one-digit
operands (ArithmeticConfig's default) a 2-layer cold start computes nearly every line itself and learns to
ignore the criteria: its refinements were correct no more often than a second fresh sample (held-out, temperature
1: 0.707 -> 0.848 after refining the responses that missed a criterion, 0.891 with a second sample instead).
With two-digit operands (max_operand 99, configs/sft_arithmetic_rgr.yaml and rgr_grpo_cpu.yaml) it must copy the
sub-answers: on RL-time groups at temperature 1, 2-3% of its own rollouts were correct, 57-70% of its refinements.
"""

import dataclasses
import functools
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from rubric_jax.data import arithmetic
from rubric_jax.judges.base import JudgeRequest
from rubric_jax.judges.programmatic import ProgrammaticJudge, register_check
from rubric_jax.rubrics.prompts import fence
from rubric_jax.rubrics.schema import Criterion, ItemKind, Rubric
from rubric_jax.rubrics.steps import split_steps
from rubric_jax.yaml_config import config_from_dict

STEP_WEIGHT, ANSWER_WEIGHT, FORMAT_WEIGHT = arithmetic.STEP_WEIGHT, arithmetic.ANSWER_WEIGHT, arithmetic.FORMAT_WEIGHT
PLAN_WEIGHT, CARRY_WEIGHT = 1.0, 1.0
PLAN_CHECK, CARRY_CHECK = "arithmetic_rgr.plan", "arithmetic_rgr.carry"
PLAN_TEXT, CARRY_TEXT, FORMAT_TEXT = "Follow the question", "Reuse each result", "Exact layout"
ATTEMPT_TOKENS = 64
REFINEMENT_PROMPT_TOKENS = 256  # bound for problems of at most 3 steps (module docstring), tested
REFINE_TAG = 2  # the SFT stream's draws, apart from the arithmetic stream's split tags 0 and 1
CORRUPTIONS = ("result", "operand", "carry", "box", "layout", "character", "truncate")
_NOISE_CHARACTERS = "0123456789+-*= "
_MAX_DRAWS = 20
_SHOWN_CHARACTERS = frozenset(arithmetic.CHARACTERS) - {"<"}

Equation = arithmetic.Equation


# ---------------------------------------------------------------- rubric and checks


def rgr_rubric(problem: arithmetic.Problem) -> Rubric:
    """The problem's factual then process criteria (module docstring)."""
    factual = tuple(
        Criterion(text=f"### Step {k}: {s.left} {s.op} {s.right} = {s.result}", weight=STEP_WEIGHT,
                  kind=ItemKind.FACTUAL, name=arithmetic.step_check_name(k))
        for k, s in enumerate(problem.steps, 1)
    ) + (Criterion(text=f"\\boxed{{{problem.answer}}}", weight=ANSWER_WEIGHT, kind=ItemKind.FACTUAL,
                   name=arithmetic.ANSWER_CHECK),)
    process = (
        Criterion(text=PLAN_TEXT, weight=PLAN_WEIGHT, kind=ItemKind.PROCESS, name=PLAN_CHECK),
        Criterion(text=CARRY_TEXT, weight=CARRY_WEIGHT, kind=ItemKind.PROCESS, name=CARRY_CHECK),
        Criterion(text=FORMAT_TEXT, weight=FORMAT_WEIGHT, kind=ItemKind.PROCESS, name=arithmetic.FORMAT_CHECK),
    )
    return Rubric(criteria=factual + process, format="rgr")


def _stated_equations(response: str, num_steps: int) -> Optional[list[Equation]]:
    """The equations on the response's first `### Step k:` line of each k = 1..num_steps; None when a header is
    missing or its line is not an equation."""
    first_spans = {}
    for span in split_steps(response):
        first_spans.setdefault(span.number, span)
    equations = []
    for k in range(1, num_steps + 1):
        span = first_spans.get(k)
        if span is None:
            return None
        equation = arithmetic.step_equation(response, span)
        if equation is None:
            return None
        equations.append(equation)
    return equations


@register_check(PLAN_CHECK)
def _check_plan(response: str, request: JudgeRequest) -> bool:
    gold, _ = arithmetic.gold_solution(request)
    stated = _stated_equations(response, len(gold))
    if stated is None or [span.number for span in split_steps(response)] != list(range(1, len(gold) + 1)):
        return False
    return stated[0][0] == gold[0][0] and all(s[1:3] == g[1:3] for s, g in zip(stated, gold))


@register_check(CARRY_CHECK)
def _check_carry(response: str, request: JudgeRequest) -> bool:
    gold, _ = arithmetic.gold_solution(request)
    stated = _stated_equations(response, len(gold))
    if stated is None:
        return False
    chained = all(stated[k][0] == stated[k - 1][3] for k in range(1, len(stated)))
    return chained and arithmetic.boxed_int(response) == stated[-1][3]


def rgr_judge() -> ProgrammaticJudge:
    """A judge with every check `rgr_rubric` names, by criterion name."""
    names = [arithmetic.step_check_name(k) for k in range(1, arithmetic.MAX_STEPS + 1)]
    names += [arithmetic.ANSWER_CHECK, arithmetic.FORMAT_CHECK, PLAN_CHECK, CARRY_CHECK]
    return ProgrammaticJudge({name: name for name in names})


def failed_criteria(problem: arithmetic.Problem, attempt: str) -> tuple[Criterion, ...]:
    """The criteria of `rgr_rubric(problem)` that `attempt` does not fully meet, in rubric order (a judge failure
    fails them all)."""
    rubric = rgr_rubric(problem)
    request = JudgeRequest(problem.question, attempt, rubric, arithmetic.reference_for(problem))
    [satisfied] = rgr_judge().judge([request], len(rubric.criteria)).satisfied_bk
    return tuple(c for c, s in zip(rubric.criteria, satisfied) if s < 1)


# ---------------------------------------------------------------- refinement prompt


@functools.lru_cache(maxsize=1)
def _tokenizer():
    return arithmetic.build_tokenizer()


def _shown_attempt(attempt: str) -> str:
    """The attempt as the prompt shows it (module docstring): its characters of _SHOWN_CHARACTERS, cut to
    ATTEMPT_TOKENS tokens, fenced."""
    tokenizer = _tokenizer()
    kept = "".join(ch for ch in attempt if ch in _SHOWN_CHARACTERS)
    ids = tokenizer.encode(kept, add_special_tokens=False)[:ATTEMPT_TOKENS]
    return fence(tokenizer.decode(ids, clean_up_tokenization_spaces=False), "response")


def refinement_messages(
    problem: arithmetic.Problem, attempt: str, failed: Sequence[Criterion]
) -> list[dict[str, str]]:
    """The refinement prompt (module docstring) for `attempt` and its failed criteria."""
    if not isinstance(attempt, str):
        raise ValueError(f"attempt must be a str, got {type(attempt).__name__}")
    if not all(isinstance(c, Criterion) for c in failed):
        raise ValueError(f"failed must be a sequence of Criterion, got {failed!r}")
    fixes = "\n".join(c.text for c in failed) if failed else "nothing"
    separator = "\n" if failed else " "
    return [{"role": "user", "content": f"{problem.question}\n{_shown_attempt(attempt)}\nFix:{separator}{fixes}"}]


# ---------------------------------------------------------------- SFT: corrupted attempts -> gold


def _render(equations: Sequence[Equation], box: int) -> str:
    lines = [f"### Step {k}: {x} {op} {y} = {z}" for k, (x, op, y, z) in enumerate(equations, 1)]
    return "\n".join(lines + [f"\\boxed{{{box}}}"])


def _shifted(rng: np.random.Generator, value: int) -> int:
    """value moved by 1..3 either way, kept non-negative."""
    delta = int(rng.integers(1, 4)) * (1 if rng.random() < 0.5 else -1)
    return value + delta if value + delta >= 0 else value - delta


def _chain_mistake(problem: arithmetic.Problem, kind: str, rng: np.random.Generator) -> list[list]:
    """The gold equations with a "result", "operand" or "carry" mistake at a drawn step, every later step
    recomputed with right arithmetic from the (wrong) result before it."""
    equations = [[s.left, s.op, s.right, s.result] for s in problem.steps]
    if kind == "carry" and len(equations) > 1:
        k = int(rng.integers(1, len(equations)))
    else:
        k = int(rng.integers(len(equations)))
    if kind == "result":
        equations[k][3] = _shifted(rng, equations[k][3])
    elif kind == "operand":
        equations[k][2] = int(rng.choice([y for y in range(1, 10) if y != equations[k][2]]))
    else:
        equations[k][0] = _shifted(rng, equations[k][0])
    for j in range(k if kind != "result" else k + 1, len(equations)):
        if j > k:
            equations[j][0] = equations[j - 1][3]
        x, op, y, _ = equations[j]
        equations[j][3] = arithmetic.APPLY[op](x, y)
    return equations


def corrupt_solution(problem: arithmetic.Problem, kind: str, rng: np.random.Generator) -> str:
    """The gold solution with one mistake of `kind` (CORRUPTIONS), the mistakes a sampling policy makes, at a step
    drawn from `rng`: "result" a wrong result, carried on with right arithmetic; "operand" a wrong operand (then
    carried on); "carry" a later step that does not start from the previous result (step 1's left operand in a
    one-step problem); "box" a wrong box; "layout" a line dropped or repeated, or a line added; "character" one
    character replaced (possibly by itself: the only kind that may leave every criterion met); "truncate" a cut
    before the last character. Chain mistakes are redrawn (up to _MAX_DRAWS times) until every result lies in
    [0, MAX_RESULT], as the policy's own results do."""
    if kind not in CORRUPTIONS:
        raise ValueError(f"kind must be one of {CORRUPTIONS}, got {kind!r}")
    equations = [[s.left, s.op, s.right, s.result] for s in problem.steps]
    box = problem.answer
    if kind in ("result", "operand", "carry"):
        for _ in range(_MAX_DRAWS):
            equations = _chain_mistake(problem, kind, rng)
            if all(0 <= e[3] <= arithmetic.MAX_RESULT for e in equations):
                break
        box = equations[-1][3]
    elif kind == "box":
        box = _shifted(rng, box)
    text = _render([tuple(e) for e in equations], box)
    if kind == "layout":
        lines = text.split("\n")
        i = int(rng.integers(len(lines)))
        edits = (lines[:i] + lines[i + 1:], lines[:i + 1] + lines[i:], lines + ["ok"])  # drop, repeat, extra
        text = "\n".join(edits[int(rng.integers(len(edits)))])
    elif kind == "character":
        i = int(rng.integers(len(text)))
        text = text[:i] + _NOISE_CHARACTERS[int(rng.integers(len(_NOISE_CHARACTERS)))] + text[i + 1:]
    elif kind == "truncate":
        text = text[:int(rng.integers(1, len(text)))]
    return text


@dataclasses.dataclass(frozen=True)
class RefinementExample:
    """An SFT example of refinement: the problem, an attempt at it, and the criteria the attempt fails; its
    prompt is `refinement_messages`, its target the gold solution."""

    problem: arithmetic.Problem
    attempt: str
    failed: tuple[Criterion, ...]


SFTExample = Union[arithmetic.Problem, RefinementExample]


@dataclasses.dataclass(frozen=True)
class RefinementMixConfig:
    """The SFT task's params: the problems, and the fraction of examples that are refinements (in [0, 1])."""

    problems: arithmetic.ArithmeticConfig = arithmetic.ArithmeticConfig()
    refine_fraction: float = 0.5

    def __post_init__(self):
        if not 0 <= self.refine_fraction <= 1:
            raise ValueError(f"refine_fraction must be in [0, 1], got {self.refine_fraction!r}")


class RefinementMixStream:
    """The SFT stream (module docstring), resumable like `arithmetic.ArithmeticDataset`: `position` counts the
    examples consumed, and item i depends on (config, seed, i) only."""

    def __init__(self, config: RefinementMixConfig, seed: int, position: int = 0):
        self.config, self.seed = config, seed
        self._problems = arithmetic.ArithmeticDataset(config.problems, seed, "train", position)

    @property
    def position(self) -> int:
        return self._problems.position

    def next_batch(self, n: int) -> list[SFTExample]:
        start = self.position
        return [self._example(i, problem) for i, problem in enumerate(self._problems.next_batch(n), start)]

    def _example(self, index: int, problem: arithmetic.Problem) -> SFTExample:
        rng = np.random.default_rng([self.seed, REFINE_TAG, index])
        if rng.random() >= self.config.refine_fraction:
            return problem
        attempt = corrupt_solution(problem, CORRUPTIONS[int(rng.integers(len(CORRUPTIONS)))], rng)
        return RefinementExample(problem, attempt, failed_criteria(problem, attempt))


# ---------------------------------------------------------------- tasks


@dataclasses.dataclass(frozen=True)
class ArithmeticRGRTask(arithmetic.ArithmeticTask):
    """Task "arithmetic_rgr": the arithmetic problems (prompts, stream, held-out set, tokenizer of
    `rubric_jax.data.arithmetic`) with `rgr_rubric`, `rgr_judge` and a `refinement_prompt`, which
    `rubric_jax.algorithms.rgr_grpo` uses in place of its generic self-refinement prompt."""

    def rubric(self, example: arithmetic.Problem) -> Rubric:
        return rgr_rubric(example)

    def judge(self) -> ProgrammaticJudge:
        return rgr_judge()

    def refinement_prompt(
        self, example: arithmetic.Problem, attempt: str, failed: Sequence[Criterion]
    ) -> list[dict[str, str]]:
        return refinement_messages(example, attempt, failed)


@dataclasses.dataclass(frozen=True)
class ArithmeticRGRSFTTask(ArithmeticRGRTask):
    """Task "arithmetic_rgr_sft": the cold start of "arithmetic_rgr"; its train stream mixes problems with
    refinement examples (`RefinementMixStream`), each answered by the gold solution."""

    refine_fraction: float = 0.5

    def prompt(self, example: SFTExample) -> list[dict[str, str]]:
        if isinstance(example, RefinementExample):
            return refinement_messages(example.problem, example.attempt, example.failed)
        return super().prompt(example)

    def solution(self, example: SFTExample) -> str:
        problem = example.problem if isinstance(example, RefinementExample) else example
        return super().solution(problem)

    def train_stream(self, position: int) -> RefinementMixStream:
        return RefinementMixStream(RefinementMixConfig(self.config, self.refine_fraction), self.seed, position)


def build_sft_task(params: Mapping[str, Any], seed: int) -> ArithmeticRGRSFTTask:
    """Task "arithmetic_rgr_sft"; `params` are RefinementMixConfig's fields."""
    config = config_from_dict(RefinementMixConfig, dict(params), "task.params")
    return ArithmeticRGRSFTTask(config.problems, seed, config.refine_fraction)
