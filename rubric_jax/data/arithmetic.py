"""Synthetic multi-step arithmetic, the CPU quickstart's task: problems, gold solutions, a character tokenizer,
per-problem rubrics with programmatic checks, and a resumable train / held-out stream.

Conventions:
- A problem is a chain of steps: step 1 computes `a op b`, step k computes `(result of step k-1) op c_k`, with
  operands drawn from 1..max_operand and operators from the config. Every result lies in [0, MAX_RESULT]: each
  step is drawn uniformly among the (operator, operand) pairs that keep its result there (step 1: among the
  (a, op, b) triples), and a chain that reaches a value no pair continues (only with one operator: 0 under "-",
  99 under "+") is redrawn from step 1 with the same generator. A config under which no chain of max_steps steps
  exists is rejected.
- Text: the question parenthesises the chain, `Compute ((3 + 4) * 2) - 5.`; the solution is one line per step,
  `### Step k: x op y = z` (the headers of `rubric_jax.rubrics.steps`), then `\\boxed{answer}`, joined by "\\n"
  with no trailing newline. The prompt is the question alone, as one user message.
- Splits: a question is held out ("eval") iff the first 8 bytes of its SHA-256, as an integer, are 0 modulo
  EVAL_BUCKETS; the rule ignores seeds and configs, so every train stream is disjoint from every eval stream.
  Problem i of a (config, seed, split) stream is the first problem of that split drawn from
  `np.random.default_rng([seed, split tag, i])`: a pure function of the index, which makes resuming exact.
- Tokenizer: one token per printable ASCII character and "\\n", the non-special tokens "### Step " and
  "\\boxed{", and the special tokens <|endoftext|> (pad, 0), <|im_start|> (1), <|im_end|> (eos, 2). Tokens decode
  to their text with nothing between them. There is no unknown token: encoding any other character raises.
- Rubric: one criterion per step (`arithmetic.step{k}`, weight STEP_WEIGHT), the answer (`arithmetic.answer`,
  ANSWER_WEIGHT) and the format (`arithmetic.format`, FORMAT_WEIGHT), judged by the checks registered here against
  `request.reference`, the problem's gold solution (`reference_for`). Model text is parsed with regexes, never
  evaluated.
  - Step k is satisfied iff the first `### Step k:` header of the response (`split_steps`: mid-line headers
    count, fenced code does not) is followed, on its line, by `x op y = z` (spaces and tabs anywhere) with the
    gold step's x, op, y and z. The gold x is the gold previous result, so an error propagates: after a wrong
    step every later step fails, even with right arithmetic. Attributed to step k when the header exists, else
    -1; a later repeat of the header is ignored, so listing candidates earns nothing.
  - The answer is satisfied iff the last box holds the gold answer (an integer, surrounding spaces allowed), and
    the format iff the stripped response is exactly the gold number of step lines, numbered 1, 2, ... in order,
    then one box line holding an integer. Both are attributed to the whole response (step 0): the answer depends
    on every step, and the format is a property of the whole text.
"""

import dataclasses
import functools
import hashlib
import operator
import re
from typing import Literal, Optional, Sequence

import numpy as np
import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from rubric_jax.judges.base import JudgeRequest
from rubric_jax.judges.outcome import extract_boxed
from rubric_jax.judges.programmatic import Attributed, ProgrammaticJudge, register_check
from rubric_jax.rubrics.schema import Criterion, Rubric
from rubric_jax.rubrics.steps import StepSpan, split_steps

OPERATORS = ("+", "-", "*")
MAX_RESULT = 99
MAX_STEPS = 6  # step checks are registered for steps 1..MAX_STEPS
EVAL_BUCKETS = 10  # one question in EVAL_BUCKETS is held out
STEP_WEIGHT, ANSWER_WEIGHT, FORMAT_WEIGHT = 1.0, 2.0, 0.5
ANSWER_CHECK, FORMAT_CHECK = "arithmetic.answer", "arithmetic.format"

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD_ID, IM_START_ID, EOS_ID = 0, 1, 2
CHARACTERS = ("\n",) + tuple(chr(code) for code in range(0x20, 0x7F))
WORD_TOKENS = ("### Step ", "\\boxed{")
VOCAB_SIZE = len(SPECIAL_TOKENS) + len(CHARACTERS) + len(WORD_TOKENS)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

Split = Literal["train", "eval"]
_SPLIT_TAGS = {"train": 0, "eval": 1}
# A split whose problems are this rare under a config is treated as empty (eval problems take ~10 draws).
_MAX_DRAWS = 1000
Equation = tuple[int, str, int, int]  # (x, op, y, z): the line "x op y = z"
APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul}

# Numbers are ASCII digits, at most 9 of them: int() of a model's 5000-digit string would raise.
_NUMBER = r"([0-9]{1,9})"
EQUATION = re.compile(rf"[ \t]*{_NUMBER}[ \t]*([-+*])[ \t]*{_NUMBER}[ \t]*=[ \t]*{_NUMBER}[ \t]*")
_STEP_LINE = re.compile(rf"### Step {_NUMBER}:{EQUATION.pattern}")
_BOX_LINE = re.compile(rf"\\boxed\{{[ \t]*{_NUMBER}[ \t]*\}}[ \t]*")
_BOXED_NUMBER = re.compile(_NUMBER)


def _check_int(value, field: str, low: int, high: Optional[int] = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{field} must be an int {bounds}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ArithmeticConfig:
    """Problem shape: min_steps..max_steps steps (at most MAX_STEPS), operands 1..max_operand (at most
    MAX_RESULT), `operators` a non-empty tuple of distinct OPERATORS (a list is accepted and stored as a tuple).
    ValueError naming the field, also when no chain of max_steps steps keeps its results in [0, MAX_RESULT]."""

    min_steps: int = 2
    max_steps: int = 3
    max_operand: int = 9
    operators: tuple[str, ...] = OPERATORS

    def __post_init__(self):
        _check_int(self.min_steps, "min_steps", 1, MAX_STEPS)
        _check_int(self.max_steps, "max_steps", self.min_steps, MAX_STEPS)
        _check_int(self.max_operand, "max_operand", 1, MAX_RESULT)
        if isinstance(self.operators, str) or not isinstance(self.operators, Sequence):
            raise ValueError(f"operators must be a sequence of {OPERATORS}, got {self.operators!r}")
        operators = tuple(self.operators)
        if not operators or len(set(operators)) != len(operators) or not set(operators) <= set(OPERATORS):
            raise ValueError(f"operators must be distinct members of {OPERATORS}, got {operators!r}")
        object.__setattr__(self, "operators", operators)
        if not _chain_exists(self):
            raise ValueError(
                f"max_steps: no chain of {self.max_steps} steps with operands 1..{self.max_operand} and operators "
                f"{operators} keeps every result in [0, {MAX_RESULT}]"
            )


@dataclasses.dataclass(frozen=True)
class Step:
    """One step, `left op right = result`; ValueError unless the arithmetic holds."""

    left: int
    op: str
    right: int
    result: int

    def __post_init__(self):
        if self.op not in OPERATORS:
            raise ValueError(f"op must be one of {OPERATORS}, got {self.op!r}")
        for field in ("left", "right", "result"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{field} must be an int, got {value!r}")
        if APPLY[self.op](self.left, self.right) != self.result:
            raise ValueError(f"result: {self.left} {self.op} {self.right} is not {self.result}")


@dataclasses.dataclass(frozen=True)
class Problem:
    """A chain of steps (module docstring), its question text and its answer, the last result. ValueError unless
    the steps chain (each step's left is the previous result) and the question and answer are theirs; build one
    with `problem_from_steps`."""

    question: str
    steps: tuple[Step, ...]
    answer: int

    def __post_init__(self):
        steps = tuple(self.steps)
        if not steps or not all(isinstance(step, Step) for step in steps):
            raise ValueError(f"steps must be a non-empty sequence of Step, got {self.steps!r}")
        for k in range(1, len(steps)):
            if steps[k].left != steps[k - 1].result:
                raise ValueError(f"steps[{k}].left must be the previous result {steps[k - 1].result}")
        object.__setattr__(self, "steps", steps)
        if self.question != question_text(steps):
            raise ValueError(f"question must be {question_text(steps)!r}, got {self.question!r}")
        if self.answer != steps[-1].result:
            raise ValueError(f"answer must be the last result {steps[-1].result}, got {self.answer!r}")


def question_text(steps: Sequence[Step]) -> str:
    """`Compute ((a op b) op c) op d.`: each earlier step in parentheses, so the order is unambiguous."""
    expression = f"{steps[0].left} {steps[0].op} {steps[0].right}"
    for step in steps[1:]:
        expression = f"({expression}) {step.op} {step.right}"
    return f"Compute {expression}."


def problem_from_steps(steps: Sequence[Step]) -> Problem:
    """The problem of a chain of steps (ValueError if they do not chain)."""
    steps = tuple(steps)
    if not steps:
        raise ValueError("steps must be non-empty")
    return Problem(question=question_text(steps), steps=steps, answer=steps[-1].result)


def solution_text(problem: Problem) -> str:
    """The gold solution: `### Step k: x op y = z` per step, then `\\boxed{answer}`, joined by newlines."""
    lines = [f"### Step {k}: {s.left} {s.op} {s.right} = {s.result}" for k, s in enumerate(problem.steps, 1)]
    return "\n".join(lines + [f"\\boxed{{{problem.answer}}}"])


@functools.lru_cache(maxsize=4096)
def _steps_from(config: ArithmeticConfig, lefts: tuple[int, ...]) -> tuple[Step, ...]:
    """Every step with a left in `lefts`, an operator and operand of the config, and a result in [0, MAX_RESULT]."""
    candidates = []
    for left in lefts:
        for op in config.operators:
            for right in range(1, config.max_operand + 1):
                result = APPLY[op](left, right)
                if 0 <= result <= MAX_RESULT:
                    candidates.append(Step(left, op, right, result))
    return tuple(candidates)


def _first_lefts(config: ArithmeticConfig) -> tuple[int, ...]:
    return tuple(range(1, config.max_operand + 1))


def _chain_exists(config: ArithmeticConfig) -> bool:
    """Whether some chain of max_steps steps keeps every result in bounds (the values reachable step by step)."""
    lefts = _first_lefts(config)
    for _ in range(config.max_steps):
        lefts = tuple(sorted({step.result for step in _steps_from(config, lefts)}))
        if not lefts:
            return False
    return True


def _sample_chain(rng: np.random.Generator, config: ArithmeticConfig, num_steps: int) -> Optional[tuple[Step, ...]]:
    """A chain of num_steps steps, each uniform among its bounded candidates; None at a dead end."""
    steps, lefts = [], _first_lefts(config)
    for _ in range(num_steps):
        candidates = _steps_from(config, lefts)
        if not candidates:
            return None
        steps.append(candidates[int(rng.integers(len(candidates)))])
        lefts = (steps[-1].result,)
    return tuple(steps)


def sample_problem(rng: np.random.Generator, config: ArithmeticConfig = ArithmeticConfig()) -> Problem:
    """A problem of min_steps..max_steps steps (uniform), its steps drawn as the module docstring says."""
    num_steps = int(rng.integers(config.min_steps, config.max_steps + 1))
    while True:  # the config admits a chain of max_steps steps, so a redraw succeeds eventually
        steps = _sample_chain(rng, config, num_steps)
        if steps is not None:
            return problem_from_steps(steps)


def problems(seed: int, count: int, config: ArithmeticConfig = ArithmeticConfig()) -> list[Problem]:
    """`count` problems drawn from `np.random.default_rng(seed)`, both splits mixed: train on an
    `ArithmeticDataset(..., "train")`, which holds no eval problem."""
    _check_int(seed, "seed", 0)
    _check_int(count, "count", 0)
    rng = np.random.default_rng(seed)
    return [sample_problem(rng, config) for _ in range(count)]


def split_of(problem: Problem) -> Split:
    """"eval" iff the question's SHA-256 falls in the held-out bucket (module docstring), else "train"."""
    digest = hashlib.sha256(problem.question.encode("utf-8")).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % EVAL_BUCKETS == 0 else "train"


def _problem_at(config: ArithmeticConfig, seed: int, split: Split, index: int) -> Problem:
    rng = np.random.default_rng([seed, _SPLIT_TAGS[split], index])
    for _ in range(_MAX_DRAWS):
        problem = sample_problem(rng, config)
        if split_of(problem) == split:
            return problem
    raise ValueError(f"config: no {split!r} problem in {_MAX_DRAWS} draws; {config} allows too few questions")


class ArithmeticDataset:
    """The infinite stream of one split's problems for (config, seed), resumable: `position` counts the problems
    consumed, and `ArithmeticDataset(config, seed, split, position=k)` continues exactly as the original did after
    k problems (problem i depends on (config, seed, split, i) only; module docstring). Problems may repeat."""

    def __init__(self, config: ArithmeticConfig, seed: int, split: Split, position: int = 0):
        if not isinstance(config, ArithmeticConfig):
            raise ValueError(f"config must be an ArithmeticConfig, got {type(config).__name__}")
        _check_int(seed, "seed", 0)
        if split not in _SPLIT_TAGS:
            raise ValueError(f"split must be one of {sorted(_SPLIT_TAGS)}, got {split!r}")
        _check_int(position, "position", 0)
        self.config, self.seed, self.split = config, seed, split
        self._position = position

    @property
    def position(self) -> int:
        return self._position

    def next_batch(self, n: int) -> list[Problem]:
        """The next n problems of the stream."""
        _check_int(n, "n", 0)
        start = self._position
        batch = [_problem_at(self.config, self.seed, self.split, i) for i in range(start, start + n)]
        self._position = start + n
        return batch

    def __iter__(self) -> "ArithmeticDataset":
        return self

    def __next__(self) -> Problem:
        return self.next_batch(1)[0]


def eval_set(config: ArithmeticConfig, seed: int, count: int) -> list[Problem]:
    """The held-out set: the first `count` problems of the eval stream (a question may repeat when the config
    allows few)."""
    return ArithmeticDataset(config, seed, "eval").next_batch(count)


def prompt_messages(problem: Problem) -> list[dict[str, str]]:
    """The chat messages of a problem: the question as one user message."""
    return [{"role": "user", "content": problem.question}]


def build_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """The task's character tokenizer (module docstring), VOCAB_SIZE tokens, with a ChatML chat template."""
    tokens = SPECIAL_TOKENS + CHARACTERS + WORD_TOKENS
    tokenizer = Tokenizer(models.WordLevel({token: i for i, token in enumerate(tokens)}, unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character
    tokenizer.decoder = decoders.Fuse()  # concatenate: the default decoder would join tokens with spaces
    # Added tokens are matched before pre-tokenization, so the word tokens are whole wherever they occur.
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in WORD_TOKENS])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=SPECIAL_TOKENS[PAD_ID],
        eos_token=SPECIAL_TOKENS[EOS_ID],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def step_check_name(k: int) -> str:
    """The name of the criterion, and of its registered check, of step k."""
    return f"arithmetic.step{k}"


def reference_for(problem: Problem) -> str:
    """The `JudgeRequest.reference` the checks read: the gold solution."""
    return solution_text(problem)


def problem_rubric(problem: Problem) -> Rubric:
    """Criteria (module docstring): one per step, then the answer, then the format ("generic" format)."""
    n = len(problem.steps)
    if n > MAX_STEPS:
        raise ValueError(f"problem has {n} steps; checks exist for at most MAX_STEPS={MAX_STEPS}")
    steps = tuple(
        Criterion(
            text=f"Step {k} computes {s.left} {s.op} {s.right} = {s.result}",
            weight=STEP_WEIGHT,
            name=step_check_name(k),
        )
        for k, s in enumerate(problem.steps, 1)
    )
    answer = Criterion(text=f"The boxed final answer is {problem.answer}", weight=ANSWER_WEIGHT, name=ANSWER_CHECK)
    layout = Criterion(
        text=f"The response is exactly {n} lines '### Step k: x op y = z', k = 1..{n} in order, then one line "
        "'\\boxed{answer}'",
        weight=FORMAT_WEIGHT,
        name=FORMAT_CHECK,
    )
    return Rubric(criteria=steps + (answer, layout), format="generic")


def _parse_solution(text: str) -> Optional[tuple[tuple[Equation, ...], int]]:
    """The equations (x, op, y, z) and boxed answer of `text` if it is, stripped, exactly step lines numbered
    1, 2, ... then one box line; None otherwise."""
    *step_lines, last = text.strip().split("\n")
    box = _BOX_LINE.fullmatch(last)
    equations = []
    for k, line in enumerate(step_lines, 1):
        match = _STEP_LINE.fullmatch(line)
        if match is None or int(match.group(1)) != k:
            return None
        equations.append(parse_equation(match.groups()[1:]))
    return None if box is None else (tuple(equations), int(box.group(1)))


def parse_equation(groups: Sequence[str]) -> Equation:
    x, op, y, z = groups
    return int(x), op, int(y), int(z)


def step_equation(response: str, span: StepSpan) -> Optional[Equation]:
    """(x, op, y, z) when the step's first line (after its `### Step k:` header) is an equation, else None."""
    match = EQUATION.fullmatch(response[span.start : span.end].split("\n", 1)[0])
    return None if match is None else parse_equation(match.groups())


def gold_solution(request: JudgeRequest) -> tuple[tuple[Equation, ...], int]:
    """The equations and answer of the request's reference; ValueError (the rollout fails) if it has none."""
    parsed = None if request.reference is None else _parse_solution(request.reference)
    if parsed is None:
        raise ValueError(f"reference must be a gold solution (reference_for), got {request.reference!r}")
    return parsed


def boxed_int(response: str) -> Optional[int]:
    """The integer in the response's last box (`extract_boxed`), None if it holds anything else."""
    boxed = extract_boxed(response)
    match = None if boxed is None else _BOXED_NUMBER.fullmatch(boxed)
    return None if match is None else int(match.group(1))


def _check_step(k: int, response: str, request: JudgeRequest) -> Attributed:
    equations, _ = gold_solution(request)
    if k > len(equations):
        raise ValueError(f"the reference has {len(equations)} steps, no step {k}")
    span = next((span for span in split_steps(response) if span.number == k), None)
    if span is None:
        return Attributed(False, -1)
    return Attributed(step_equation(response, span) == equations[k - 1], k)


@register_check(ANSWER_CHECK)
def _check_answer(response: str, request: JudgeRequest) -> Attributed:
    _, answer = gold_solution(request)
    return Attributed(boxed_int(response) == answer, 0)


@register_check(FORMAT_CHECK)
def _check_format(response: str, request: JudgeRequest) -> Attributed:
    equations, _ = gold_solution(request)
    parsed = _parse_solution(response)
    return Attributed(parsed is not None and len(parsed[0]) == len(equations), 0)


for _k in range(1, MAX_STEPS + 1):
    register_check(step_check_name(_k))(functools.partial(_check_step, _k))
del _k


def arithmetic_judge() -> ProgrammaticJudge:
    """A judge with every arithmetic check, by criterion name."""
    names = [step_check_name(k) for k in range(1, MAX_STEPS + 1)] + [ANSWER_CHECK, FORMAT_CHECK]
    return ProgrammaticJudge({name: name for name in names})


def is_correct(response: str, problem: Problem) -> bool:
    """Whether the response's last box holds the problem's answer (held-out accuracy)."""
    return boxed_int(response) == problem.answer


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
    """Task "arithmetic" (`rubric_jax.data.tasks`): these problems, graded by `problem_rubric` and
    `arithmetic_judge`; the SRaR, RGR-GRPO and rubric-world tasks subclass it."""

    config: ArithmeticConfig
    seed: int

    def prompt(self, example: Problem) -> list[dict[str, str]]:
        return prompt_messages(example)

    def question(self, example: Problem) -> str:
        return example.question

    def rubric(self, example: Problem):
        return problem_rubric(example)

    def reference(self, example: Problem) -> str:
        return reference_for(example)

    def is_correct(self, response: str, example: Problem) -> bool:
        return is_correct(response, example)

    def gold_answer(self, example: Problem) -> str:
        """The answer as a decimal integer string."""
        return str(example.answer)

    def solution(self, example: Problem) -> str:
        return solution_text(example)

    def train_stream(self, position: int) -> ArithmeticDataset:
        return ArithmeticDataset(self.config, self.seed, "train", position)

    def eval_examples(self, count: int) -> list[Problem]:
        return eval_set(self.config, self.seed, count)

    def judge(self):
        return arithmetic_judge()

    def tokenizer(self):
        return build_tokenizer()
