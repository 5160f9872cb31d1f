"""What a launch refuses before anything is written (`training.rl.train_rl`, `rubric-jax train` and `validate`): a
rubric wider than the recipe's max_items, a frozen role without its server, a dataset row whose prompt the model
cannot sample (`prompt_refusal`), and an LLM role whose server does not answer or whose answer does not parse
(`check_llm_roles`: one real request each, its answer read by the role's own parser, `judges.preflight`).

Before any model is built, `checked_rl_launch` checks what a user gives an RL run and builds its task and
evaluation benchmarks: the one path of `rubric-jax train` and `rubric_jax.train` (`rl_inputs`, its first half, is
`rubric-jax validate`'s). Every problem there is a ValueError (or an OSError of a file) naming what to fix.
"""

import dataclasses
import os
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

from rubric_jax.inference.http import ClientStats
from rubric_jax.judges import llm, preflight
from rubric_jax.judges.base import Judge, JudgeRequest
from rubric_jax.models.safetensors_io import check_model_directory
from rubric_jax.rubrics import parsing, prompts
from rubric_jax.rubrics.schema import Criterion, Rubric
from rubric_jax.rubrics.steps import split_steps
from rubric_jax.training.assembly import benchmark_tasks, context_length, make_task
from rubric_jax.training.run_config import RLConfig, resolve_algorithm
from rubric_jax.training.runs import RunStopped, check_writable_directory
from rubric_jax.yaml_config import apply_overrides, config_from_dict, config_to_dict, load_config


# The response a launch's preflight request shows the judge when the example has no reference answer to show.
STAND_IN_RESPONSE = "I am not sure; I would need more information to answer."
# The policy's response in the prompts whose lengths a launch checks and which `rubric-jax validate` renders.
PLACEHOLDER_RESPONSE = "(the policy's response)"
# The criterion a preflight judges when the first example's rubric is empty (a recipe that generates its rubrics).
STAND_IN_CRITERION = Criterion("The response answers the question that was asked.")


def preflight_request(task: Any, example: Any) -> JudgeRequest:
    """The judge request of `example` as a run builds it (`algorithms.base.judge_rollouts`), with a stand-in
    response: the example's reference answer (`reference`, else the task's reference) when it has one, else
    STAND_IN_RESPONSE; an empty rubric is given STAND_IN_CRITERION."""
    reference = task.reference(example)
    response = getattr(example, "reference", None) or reference or STAND_IN_RESPONSE
    rubric = task.rubric(example)
    return JudgeRequest(question=task.question(example), response=response,
                        rubric=rubric if rubric.criteria else Rubric((STAND_IN_CRITERION,)), reference=reference,
                        num_steps=len(split_steps(response)), conversation=tuple(task.prompt(example)))


def _example_name(example: Any) -> str:
    """Where a dataset example comes from ("<file> row <n> (id <id>)"); "the first example" for other tasks."""
    if not hasattr(example, "source"):
        return "the first example"
    return f"{example.source} row {example.row}" + (f" (id {example.id})" if getattr(example, "id", None) else "")


def llm_preflights(judge: Optional[Judge], meta_verifier: Optional[llm.LLMMetaVerifier], task: Any,
                   judge_format: str) -> list[preflight.PreflightAnswer]:
    """One preflight answer (`judges.preflight`) per LLM role, from the task's first training example: an LLM
    judge's (one request in its format `judge_format` for `preflight_request`; a per-criterion judge's for the
    first criterion) and the meta-verifier's (the first criterion against the rest of the rubric). A judge that
    is not an LLM judge is skipped. PreflightFailed when a server does not answer or refuses the model name."""
    if not isinstance(judge, (llm.RolloutLLMJudge, llm.CriterionLLMJudge)) and meta_verifier is None:
        return []
    example = task.train_stream(0).next_batch(1)[0]
    request, where = preflight_request(task, example), _example_name(example)
    answers = []
    if isinstance(judge, llm.RolloutLLMJudge):
        fmt = judge.fmt
        answers.append(preflight.preflight(
            judge.chat, "judge", f"a judge.format {judge_format} request ({where})", fmt.messages(request),
            fmt.schema(request), lambda text: fmt.parse(text, request)))
    elif isinstance(judge, llm.CriterionLLMJudge):
        fmt = judge.fmt
        answers.append(preflight.preflight(
            judge.chat, "judge", f"a judge.format {judge_format} request (criterion 1 of {where})",
            fmt.messages(request, 0), fmt.schema(), fmt.parse))
    if meta_verifier is not None:
        target, *existing = request.rubric.criteria
        answers.append(preflight.preflight(
            meta_verifier.chat, "meta_verifier", f"a meta-verifier request (criterion 1 of {where})",
            prompts.meta_verifier_prompt(request.question, target, existing, domain=meta_verifier.domain),
            meta_verifier.schema, lambda text: parsing.parse_meta_verdict(text, categories=meta_verifier.categories)))
    return answers


def check_llm_roles(judge: Optional[Judge], meta_verifier: Optional[llm.LLMMetaVerifier], task: Any,
                    judge_format: str) -> None:
    """A launch's preflight (`llm_preflights`): RunStopped with one line (the raw answer and the parser's reason)
    unless every LLM role's server answers and its answer parses. The preflight requests are not the run's: the
    clients' request counts start again after them (the response-format dialect found is kept)."""
    try:
        for answer in llm_preflights(judge, meta_verifier, task, judge_format):
            preflight.require_parsed(answer)
    except preflight.PreflightFailed as error:
        raise RunStopped(str(error)) from None
    for client in (judge, meta_verifier):
        if isinstance(client, (llm.RolloutLLMJudge, llm.CriterionLLMJudge, llm.LLMMetaVerifier)):
            client.chat.http.stats = ClientStats()


def prompt_lengths(algorithm: Any, task: Any, tokenizer: Any, chat_template_kwargs: Mapping[str, Any]
                   ) -> Iterator[tuple[str, int, Any]]:
    """(role, tokens, example) for each role's prompt (the recipe's `role_prompts`, PLACEHOLDER_RESPONSE for the
    policy's response) of every training row of a dataset task, in the stream's order; nothing for a task
    without a finite row count (`data_metrics`)."""
    from rubric_jax.models.tokenizer import apply_chat_template  # noqa: PLC0415

    if not hasattr(task, "data_metrics"):
        return
    rows = int(task.data_metrics()["data/train_rows"])
    stream = task.train_stream(0)
    for start in range(0, rows, 256):
        for example in stream.next_batch(min(256, rows - start)):
            for role, messages in algorithm.role_prompts(task, example, PLACEHOLDER_RESPONSE).items():
                yield role, len(apply_chat_template(tokenizer, messages, template_kwargs=chat_template_kwargs)), example


def prompt_refusal(algorithm: Any, task: Any, config: RLConfig, model: Any = None, tokenizer: Any = None
                   ) -> Optional[str]:
    """Why the run cannot sample some dataset row's prompt, naming the row (its file, row number and id), or
    None: a prompt over `rollout.max_prompt_tokens` under prompt_truncation "error", or one (after the cap's
    cut) of the model's max_position_embeddings tokens or more, which leaves no room for a response (the embedded
    sampler refuses it; a server cuts the response to nothing). A role whose prompt shows the policy's response
    is measured with PLACEHOLDER_RESPONSE, so a longer response can still overflow at run time. The policy is
    `config.model`'s (`context_length`), or `model` with `tokenizer` when given."""
    if model is None:
        tokenizer, max_positions = context_length(config.model, task)
    else:
        max_positions = model.config.max_position_embeddings
    rollout = config.rollout
    cap, mode = rollout.max_prompt_tokens, rollout.prompt_truncation
    for role, length, example in prompt_lengths(algorithm, task, tokenizer, config.model.chat_template_kwargs):
        where = _example_name(example)
        if cap is not None and length > cap and mode == "error":
            return (f"{where}: its {role} prompt has {length} tokens, more than rollout.max_prompt_tokens ({cap}), "
                    "and rollout.prompt_truncation is error: shorten or drop the row, or choose another truncation")
        if min(length, cap or length) >= max_positions:
            return (f"{where}: its {role} prompt has {length} tokens, and the model's max_position_embeddings is "
                    f"{max_positions}, which leaves no room for a response: shorten or drop the row, or set "
                    "rollout.max_prompt_tokens to cut long prompts")
    return None


def check_rubric_width(algorithm_config: Any, task: Any) -> None:
    """ValueError when the task's longest rubric (`longest_rubric`, a dataset task's) has more items than the
    recipe's `max_items`, found before any compute rather than at the step that meets that rubric."""
    max_items, longest = getattr(algorithm_config, "max_items", None), getattr(task, "longest_rubric", None)
    if max_items is not None and longest is not None and longest > max_items:
        raise ValueError(f"the task's longest rubric has {longest} items, more than algorithm.params.max_items "
                         f"({max_items}): raise max_items")


def check_frozen_engine(algorithm: Any, config: RLConfig) -> None:
    """ValueError when the recipe samples a role from the frozen initial policy and the SGLang rollout has no
    server for it (`rollout.frozen_sglang_url`)."""
    rollout = config.rollout
    if algorithm.needs_frozen_engine and rollout.engine == "sglang" and rollout.frozen_sglang_url is None:
        raise ValueError(f"{config.algorithm.name} samples a role from the frozen initial policy: set "
                         "rollout.frozen_sglang_url to a second SGLang server")


@dataclasses.dataclass(frozen=True)
class RLInputs:
    """An RL run's checked config and what is built from it before any model: its task and its evaluation
    benchmarks (name -> (task, examples), `assembly.benchmark_tasks`; empty for a run that does not evaluate)."""

    config: RLConfig
    task: Any
    benchmarks: dict


def rl_config(config: Union[str, os.PathLike, RLConfig, Mapping[str, Any]], overrides: Sequence[str] = ()
              ) -> RLConfig:
    """The RLConfig `config` gives (a YAML file's path, an RLConfig, or its plain data as YAML reads it) with the
    `key.sub=value` `overrides` applied; ValueError naming the key of a bad one (`yaml_config`)."""
    if isinstance(config, (str, os.PathLike)):
        return load_config(RLConfig, config, overrides)
    data = config_to_dict(config) if isinstance(config, RLConfig) else config
    return config_from_dict(RLConfig, apply_overrides(data, overrides))


def rl_inputs(config: Union[str, os.PathLike, RLConfig, Mapping[str, Any]], overrides: Sequence[str] = ()
              ) -> RLInputs:
    """`rl_config`'s config with its algorithm resolved (its params read by the recipe's own config) and its
    model directory checked (`model.path`: config.json, weights, tokenizer), then its task and benchmarks built
    (their files read and checked): everything `rubric-jax validate` checks before it reports."""
    config = rl_config(config, overrides)
    resolve_algorithm(config)
    if config.model.path is not None:
        check_model_directory(config.model.path, "model.path")
    task = make_task(config.task)
    benchmarks = benchmark_tasks(config.eval, config.seed) if config.eval.every_steps else {}
    return RLInputs(config, task, benchmarks)


def checked_rl_launch(config: Union[str, os.PathLike, RLConfig, Mapping[str, Any]], overrides: Sequence[str] = ()
                      ) -> RLInputs:
    """`rl_inputs`, then the output directory checked writable and the task's rubrics against the recipe's
    max_items: every check of `rubric-jax train` and `rubric_jax.train` before `training.rl.train_rl` runs."""
    inputs = rl_inputs(config, overrides)
    check_writable_directory(inputs.config.output_dir, "output_dir")
    check_rubric_width(resolve_algorithm(inputs.config)[0], inputs.task)
    return inputs
