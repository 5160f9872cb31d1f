"""How a config becomes a run's parts: the task, the rollout engines (embedded or SGLang, the frozen initial policy's,
a saved model's), the judge and the meta-verifier with their chat clients and credentials, the evaluation
benchmarks, the tokenizer and context length of a model. The trainer, every command and experiments/ build their
parts here; nothing else constructs an engine or a judge from a config. A third rollout engine or a new judge kind
is one more branch here (and its config keys in `run_config`)."""

import dataclasses
import os
from typing import Any, Mapping, Optional

from rubric_jax.data.tasks import build_task
from rubric_jax.inference.embedded import EmbeddedEngine
from rubric_jax.inference.engine import RolloutEngine
from rubric_jax.judges import llm
from rubric_jax.judges.base import Judge
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.safetensors_io import load_hf_checkpoint
from rubric_jax.models.tokenizer import load_tokenizer
from rubric_jax.training import policy
from rubric_jax.training.run_config import (EvalConfig, JudgeConfig, MetaVerifierConfig, ModelSpec, RLConfig,
                                             TaskSpec)
from rubric_jax.training.runs import RunStopped


def make_engine(config: RLConfig, model, tokenizer, version: str) -> RolloutEngine:
    """The rollout engine the config names, serving `model`'s weights under the name `version` (an SGLang server
    is sent them)."""
    eos_ids, pad_id = policy.eos_and_pad(tokenizer, model.config.eos_token_id)
    if config.rollout.engine == "sglang":
        from rubric_jax.inference.sglang import SGLangEngine  # noqa: PLC0415  (only on hosts with a server)

        engine = SGLangEngine(config.rollout.sglang_url, tokenizer=tokenizer,
                              chat_template_kwargs=config.model.chat_template_kwargs, eos_token_ids=eos_ids,
                              seed=config.seed, weight_dir=os.path.join(config.output_dir, "weights"))
        engine.update_weights(model, version)
        return engine
    return EmbeddedEngine(model, tokenizer=tokenizer, chat_template_kwargs=config.model.chat_template_kwargs,
                          eos_token_ids=eos_ids, pad_id=pad_id, seed=config.seed,
                          weight_version=version, decode_slots=config.rollout.decode_slots)


def make_frozen_engine(config: RLConfig, initial_model, tokenizer) -> RolloutEngine:
    """`RolloutContext.frozen_engine`: the initial policy `initial_model` as version "initial", in process or on
    the SGLang server at rollout.frozen_sglang_url (sent these weights once, from output_dir/frozen/weights);
    nothing updates it afterwards."""
    rollout = dataclasses.replace(config.rollout, sglang_url=config.rollout.frozen_sglang_url, frozen_sglang_url=None)
    frozen = dataclasses.replace(config, rollout=rollout, output_dir=os.path.join(config.output_dir, "frozen"))
    return make_engine(frozen, initial_model, tokenizer, "initial")


def auth_headers(config: JudgeConfig | MetaVerifierConfig, section: str) -> dict[str, str]:
    """The headers of an LLM section (`llm.request_headers`); RunStopped when its key's variable is unset."""
    try:
        return llm.request_headers(config.api_key_env, config.headers, section)
    except llm.MissingApiKey as error:
        raise RunStopped(str(error)) from None


def section_chat_client(config: JudgeConfig | MetaVerifierConfig, seed: int, section: str) -> llm.ChatClient:
    """The chat client of an LLM section of the config: its server, credentials, model, decoding, request options
    and retry policy."""
    settings = llm.ChatSettings(model=config.model, temperature=config.temperature, max_tokens=config.max_tokens,
                                seed=seed, chat_template_kwargs=config.chat_template_kwargs,
                                extra_body=config.extra_body)
    return llm.chat_client(config.url, settings, seed=seed, headers=auth_headers(config, section),
                           max_in_flight=config.max_in_flight, max_attempts=config.max_attempts,
                           timeout_s=config.timeout_s)


def context_length(model: Any, task: Any) -> tuple[Any, int]:
    """(tokenizer, max_position_embeddings) of the policy `model` (a `ModelSpec`) would build, read without
    building it."""
    if model.path is None:
        return task.tokenizer(), model.init.max_position_embeddings
    return load_tokenizer(model.path), ModelConfig.from_pretrained(model.path).max_position_embeddings


def make_judge(config: JudgeConfig, task: Any, seed: int) -> Judge:
    """The run's judge (`JudgeConfig`): the task's own, or an LLM judge over HTTP in the paper's format."""
    if config.kind == "task":
        return task.judge()
    chat = section_chat_client(config, seed, "judge")
    if config.format == "rating":
        return llm.CriterionLLMJudge(chat, llm.rating_format(), failed_criterion=config.failed_criterion)
    if config.format == "healthbench":
        return llm.CriterionLLMJudge(chat, llm.healthbench_format(), failed_criterion=config.failed_criterion)
    formats = {"grounded": lambda: llm.grounded_format(config.max_grounding_chars), "srar": llm.srar_format,
               "rlcer_verifier": llm.rlcer_verifier_format}
    return llm.RolloutLLMJudge(chat, formats[config.format]())


def make_meta_verifier(config: MetaVerifierConfig, seed: int) -> Optional[llm.LLMMetaVerifier]:
    """`RolloutContext.meta_verifier` (`MetaVerifierConfig`): None for kind task (a recipe then asks the task's
    `meta_verify`), else an LLM meta-verifier over HTTP with its domain's prompt."""
    if config.kind == "task":
        return None
    return llm.LLMMetaVerifier(section_chat_client(config, seed, "meta_verifier"), config.domain)


def make_task(config: TaskSpec) -> Any:
    """The run's task (`rubric_jax.data.tasks`): its name, params and seed."""
    return build_task(config.name, config.params, config.seed)


def run_tokenizer(model: ModelSpec, task: Any) -> Any:
    """The tokenizer a run renders its prompts with: the model directory's, or the task's (a model built from
    `model.init`)."""
    return context_length(model, task)[0]


def benchmark_tasks(config: EvalConfig, seed: int) -> dict[str, tuple[Any, list]]:
    """name -> (task, examples) for each benchmark of the eval section `config`: task "dataset" over its file
    (`EvalBenchmark.task_params`) and its first `num_examples` usable rows (all by default). ValueError naming
    eval.benchmarks.<name> for a file, column or preset that does not read, or a preset without answers."""
    tasks = {}
    for name, benchmark in config.benchmarks.items():
        where = f"eval.benchmarks.{name}"
        try:
            task = build_task("dataset", benchmark.task_params(), seed)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        if not task.has_outcome:
            raise ValueError(f"{where}: preset {benchmark.preset} has no answers to check (answer_kind none): a "
                             "benchmark reports accuracy (evaluate a rubric dataset with rubric-jax eval and a judge)")
        count = benchmark.num_examples or int(task.data_metrics()["data/eval_rows"])
        tasks[name] = (task, task.eval_examples(count))
    return tasks


def saved_model_engine(model_dir: str | os.PathLike, *, seed: int, sglang_url: Optional[str] = None,
                       chat_template_kwargs: Optional[Mapping[str, Any]] = None) -> tuple[RolloutEngine, Any]:
    """(engine, tokenizer) for the policy saved in the Hugging Face directory `model_dir`: sampled in process
    (the embedded sampler, for CPU and small models) or, with `sglang_url`, by an SGLang server already serving
    it (the directory then gives only the tokenizer)."""
    tokenizer = load_tokenizer(model_dir)
    eos_ids, pad_id = policy.eos_and_pad(tokenizer, ModelConfig.from_pretrained(model_dir).eos_token_id)
    if sglang_url is None:
        return EmbeddedEngine(load_hf_checkpoint(model_dir), tokenizer=tokenizer,
                              chat_template_kwargs=chat_template_kwargs, eos_token_ids=eos_ids, pad_id=pad_id,
                              seed=seed), tokenizer
    from rubric_jax.inference.sglang import SGLangEngine  # noqa: PLC0415  (only on hosts with a server)

    return SGLangEngine(sglang_url, tokenizer=tokenizer, chat_template_kwargs=chat_template_kwargs,
                        eos_token_ids=eos_ids, seed=seed), tokenizer
