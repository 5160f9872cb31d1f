"""Tasks by name, as the trainer and the recipes use them: `build_task(name, params, seed)`.

A task implements `rubric_jax.algorithms.base.Task` (prompt, question, rubric, reference, is_correct) and what the
trainer needs besides: `solution(example)` (the SFT target), `train_stream(position)` (an endless, resumable
stream with `next_batch(n)` and `position`), `eval_examples(count)` (a fixed held-out set, disjoint from the
train stream), `judge()` (the judge of its rubrics) and `tokenizer()` (for a model built from scratch).
`params` is the task's own config (strict: unknown keys and wrong types name `task.params.<key>`).
"""

import dataclasses
from typing import Any, Callable, Mapping

from rubric_jax.data import arithmetic
from rubric_jax.training.config import config_from_dict


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
    """The synthetic multi-step arithmetic task of `rubric_jax.data.arithmetic`."""

    config: arithmetic.ArithmeticConfig
    seed: int

    def prompt(self, example: arithmetic.Problem) -> list[dict[str, str]]:
        return arithmetic.prompt_messages(example)

    def question(self, example: arithmetic.Problem) -> str:
        return example.question

    def rubric(self, example: arithmetic.Problem):
        return arithmetic.problem_rubric(example)

    def reference(self, example: arithmetic.Problem) -> str:
        return arithmetic.reference_for(example)

    def is_correct(self, response: str, example: arithmetic.Problem) -> bool:
        return arithmetic.is_correct(response, example)

    def solution(self, example: arithmetic.Problem) -> str:
        return arithmetic.solution_text(example)

    def train_stream(self, position: int) -> arithmetic.ArithmeticDataset:
        return arithmetic.ArithmeticDataset(self.config, self.seed, "train", position)

    def eval_examples(self, count: int) -> list[arithmetic.Problem]:
        return arithmetic.eval_set(self.config, self.seed, count)

    def judge(self):
        return arithmetic.arithmetic_judge()

    def tokenizer(self):
        return arithmetic.build_tokenizer()


def _arithmetic(params: Mapping[str, Any], seed: int) -> ArithmeticTask:
    return ArithmeticTask(config_from_dict(arithmetic.ArithmeticConfig, dict(params), "task.params"), seed)


TASKS: dict[str, Callable[[Mapping[str, Any], int], Any]] = {"arithmetic": _arithmetic}


def build_task(name: str, params: Mapping[str, Any], seed: int):
    """The task `name` with its `params`; ValueError naming task.name or task.params.<key>."""
    if name not in TASKS:
        raise ValueError(f"config key task.name: unknown task {name!r}; known: {sorted(TASKS)}")
    return TASKS[name](params, seed)
