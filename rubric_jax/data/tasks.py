"""Tasks by name, as the trainer and the recipes use them: `build_task(name, params, seed)`.

A task implements `rubric_jax.algorithms.base.Task` (prompt, question, rubric, reference, is_correct) and what the
trainer needs besides: `solution(example)` (the SFT target), `train_stream(position)` (an endless, resumable
stream with `next_batch(n)` and `position`), `eval_examples(count)` (a fixed held-out set, disjoint from the
train stream), `judge()` (the judge of its rubrics) and `tokenizer()` (for a model built from scratch). A task
over real data also has `data_metrics()` (rows in use, rows skipped by reason: logged with every step) and
`longest_rubric` (checked against the recipe's max_items before a run starts): task "dataset"
(`rubric_jax.data.dataset`, its presets in `rubric_jax.data.presets`).
`params` is the task's own config (strict: unknown keys and wrong types name `task.params.<key>`).
"""

import dataclasses
from typing import Any, Callable, Literal, Mapping, Optional, Sequence

from rubric_jax.data import arithmetic, arithmetic_rgr, arithmetic_srar, dataset, presets, rubric_world
from rubric_jax.yaml_config import config_from_dict, merged


@dataclasses.dataclass(frozen=True)
class RubricWorldConfig:
    """The arithmetic problems (`problems`), the base rubric the reasoner is graded on ("full": the arithmetic rubric,
    "coarse": its answer and format criteria only, `rubric_world.coarse_rubric`) and the cold start's mix."""

    problems: arithmetic.ArithmeticConfig = arithmetic.ArithmeticConfig()
    base_rubric: Literal["full", "coarse"] = "full"
    sft: rubric_world.WorldSFTConfig = rubric_world.WorldSFTConfig()


@dataclasses.dataclass(frozen=True)
class RubricWorldTask(arithmetic.ArithmeticTask):
    """The arithmetic task for the two-role recipes (`rubric_jax.data.rubric_world`): the policy also writes
    rubrics (RLCER's rubricator, EvoRubric's generator), which `parse_generated_rubric` reads and the task's judge
    checks; `meta_verify` stands in for EvoRubric's meta-verifier."""

    world: RubricWorldConfig = RubricWorldConfig()

    def rubric(self, example: arithmetic.Problem):
        if self.world.base_rubric == "coarse":
            return rubric_world.coarse_rubric(example)
        return arithmetic.problem_rubric(example)

    def judge(self):
        return rubric_world.world_judge()

    def rubricator_prompt(self, example: arithmetic.Problem, response: str) -> list[dict[str, str]]:
        return rubric_world.rubricator_messages(example.question, response)

    def generator_prompt(self, example: arithmetic.Problem, responses: Sequence[str], existing) -> list[dict[str, str]]:
        return rubric_world.generator_messages(example.question, responses, existing)

    def parse_generated_rubric(self, text: str, max_items: int, allow_empty: bool = False):
        return rubric_world.parse_world_rubric(text, max_items=max_items, allow_empty=allow_empty)

    def meta_verify(self, example: arithmetic.Problem, criteria, existing) -> list[Optional[str]]:
        del example
        return rubric_world.meta_verify(criteria, existing)


@dataclasses.dataclass(frozen=True)
class RubricWorldSFTTask(RubricWorldTask):
    """The two-role cold start: a stream of reasoner, rubricator and generator examples (`WorldSFTStream`)."""

    def prompt(self, example):
        if isinstance(example, rubric_world.SFTExample):
            return list(example.messages)
        return super().prompt(example)

    def solution(self, example):
        if isinstance(example, rubric_world.SFTExample):
            return example.target
        return super().solution(example)

    def train_stream(self, position: int) -> rubric_world.WorldSFTStream:
        return rubric_world.WorldSFTStream(self.config, self.world.sft, self.seed, position)


def _rubric_world(task_class):
    def build(params: Mapping[str, Any], seed: int):
        world = config_from_dict(RubricWorldConfig, dict(params), "task.params")
        return task_class(world.problems, seed, world)
    return build


def _arithmetic(task_class):
    def build(params: Mapping[str, Any], seed: int):
        return task_class(config_from_dict(arithmetic.ArithmeticConfig, dict(params), "task.params"), seed)
    return build


def _dataset(params: Mapping[str, Any], seed: int) -> dataset.DatasetTask:
    """Task "dataset": `params` over its preset's (`presets.PRESETS`), read as a `DatasetConfig`."""
    preset = params.get("preset")
    if preset is not None:
        if preset not in presets.PRESETS:
            raise ValueError(f"config key task.params.preset: unknown preset {preset!r}; known: "
                             f"{sorted(presets.PRESETS)}")
        params = merged(presets.PRESETS[preset], params)
    return dataset.DatasetTask(config_from_dict(dataset.DatasetConfig, dict(params), "task.params"), seed)


TASKS: dict[str, Callable[[Mapping[str, Any], int], Any]] = {
    "dataset": _dataset,
    "arithmetic": _arithmetic(arithmetic.ArithmeticTask),
    "arithmetic_srar": _arithmetic(arithmetic_srar.ArithmeticSrarTask),
    "arithmetic_rubrics": _rubric_world(RubricWorldTask),
    "arithmetic_rubrics_sft": _rubric_world(RubricWorldSFTTask),
    "arithmetic_rgr": _arithmetic(arithmetic_rgr.ArithmeticRGRTask),
    "arithmetic_rgr_sft": arithmetic_rgr.build_sft_task,
}


def build_task(name: str, params: Mapping[str, Any], seed: int):
    """The task `name` with its `params`; ValueError naming task.name or task.params.<key>."""
    if name not in TASKS:
        raise ValueError(f"config key task.name: unknown task {name!r}; known: {sorted(TASKS)}")
    return TASKS[name](params, seed)
