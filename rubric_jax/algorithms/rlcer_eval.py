"""RLCER's RQ4 (rlcer.txt, section 5.5, Figure 7): the policy's own rubrics as in-prompt hints at evaluation time.

For each held-out question (k = samples_per_example):
  1. k answers to the plain prompt                                       the "no hint" accuracy
  2. the rubricator reads (question, the first of those answers) and     rlcer.rubricator_io: the run's
     writes one rubric, parsed and validated                             rubricator_format (the paper's
                                                                         prompt and parser, or the task's)
  3. k answers to the hint prompt: the plain prompt with the rubric      hint_messages
     appended, one line per criterion; a rubric that does not parse
     gives no hint (the plain prompt is asked again), counted
Metrics: "eval/hint_accuracy" and "eval/no_hint_accuracy" (avg@k), "eval/hint_pass@k" and "eval/no_hint_pass@k",
"eval/hint_rubric_format_rate" (questions whose rubric parsed). The hint shows the parsed rubric, never the raw
model text: a line is `<signed points> <label>`, the label being the criterion's name when it has one (the rubric
world's codes: "+3 S1", the lines its rubricator writes) and its text otherwise (the paper's natural-language
criteria).
"""

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from rubric_jax.inference.engine import RolloutEngine, SamplingParams
from rubric_jax.rubrics.schema import Rubric
from rubric_jax.rubrics.steps import response_text

PLAIN_STREAM, RUBRICATOR_STREAM, HINT_STREAM = 0, 1, 2


def hint_lines(rubric: Rubric) -> str:
    """The rubric as hint lines, `<signed points> <label>` (module docstring)."""
    lines = []
    for criterion in rubric.criteria:
        points = int(criterion.weight) if criterion.weight == int(criterion.weight) else criterion.weight
        lines.append(f"{points:+} {criterion.name or criterion.text}")
    return "\n".join(lines)


def hint_messages(messages: Sequence[dict[str, str]], rubric: Rubric) -> list[dict[str, str]]:
    """The chat `messages` with the rubric's hint lines appended to the last message's content."""
    *head, last = messages
    return [*head, {**last, "content": f"{last['content']}\n{hint_lines(rubric)}"}]


def _seeded(params: SamplingParams, seed: int, stream: int) -> SamplingParams:
    return dataclasses.replace(params, seed=int(np.random.SeedSequence((seed, stream)).generate_state(1)[0] >> 1))


def _correct(engine: RolloutEngine, tokenizer: Any, task: Any, prompts, examples, params: SamplingParams):
    samples = engine.generate(prompts, params)
    texts = [response_text(tokenizer, s.output_ids) for s in samples]
    correct = np.array([task.is_correct(t, examples[s.prompt_index]) for s, t in zip(samples, texts)], bool)
    return correct.reshape(len(examples), params.n), texts


def hint_evaluation(
    engine: RolloutEngine,
    tokenizer: Any,
    task: Any,
    examples: Sequence[Any],
    *,
    samples_per_example: int,
    temperature: float,
    max_new_tokens: int,
    rubricator_max_new_tokens: int,
    rubricator: tuple[Callable, Callable],
    seed: int,
) -> dict[str, float]:
    """The module docstring's metrics for `examples`, sampled at `temperature` (0: greedy). `rubricator` is the
    (prompt(example, cot) -> messages, parse(text) -> RubricParse) pair of the RLCER run being evaluated
    (`rlcer.rubricator_io(task, config)`), so that the hints come from the rubric format the policy was trained
    to write."""
    rubricator_prompt, parse_rubric = rubricator
    k = samples_per_example
    answer = SamplingParams(max_new_tokens=max_new_tokens, n=k, temperature=temperature)
    plain = [task.prompt(e) for e in examples]
    plain_correct, texts = _correct(engine, tokenizer, task, plain, examples,
                                    _seeded(answer, seed, PLAIN_STREAM))
    rubricator_params = SamplingParams(max_new_tokens=rubricator_max_new_tokens, n=1, temperature=temperature)
    written = engine.generate([rubricator_prompt(e, texts[i * k]) for i, e in enumerate(examples)],
                              _seeded(rubricator_params, seed, RUBRICATOR_STREAM))
    parses = [parse_rubric(response_text(tokenizer, s.output_ids)) for s in written]
    hinted = [hint_messages(prompt, p.rubric) if p.ok else prompt for prompt, p in zip(plain, parses)]
    hint_correct, _ = _correct(engine, tokenizer, task, hinted, examples, _seeded(answer, seed, HINT_STREAM))
    return {
        "eval/no_hint_accuracy": float(plain_correct.mean()),
        f"eval/no_hint_pass@{k}": float(plain_correct.any(axis=1).mean()),
        "eval/hint_accuracy": float(hint_correct.mean()),
        f"eval/hint_pass@{k}": float(hint_correct.any(axis=1).mean()),
        "eval/hint_rubric_format_rate": float(np.mean([p.ok for p in parses])),
    }
