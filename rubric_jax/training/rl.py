"""The RL loop (`rubric-jax train`): for each step

  1. the next `prompts_per_step` examples of the task's train stream
  2. experience = algorithm.experience(...)          rollouts (engine) -> judges -> rewards -> token advantages
  3. old logprobs recomputed by the learner           (and the frozen reference's, for a KL penalty); the
                                                      engine's logprobs stay in the batch ("rollout_logp_bt")
                                                      and their mismatch with the learner's is logged
  4. `epochs` passes over the batch in a fresh random order, each split into `mini_batches` optimizer updates,
     each accumulated exactly over `micro_batches` (`train_step.make_train_step`)
  5. weight sync to the engine (version "step-<n>"); a recipe's frozen engine (`make_frozen_engine`, the initial
     policy for a role that is not trained) is never synced
  6. metrics (metrics.jsonl, TensorBoard, console) and, every `checkpoint.every_steps` and at the end, an orbax
     checkpoint of params, optimizer state, reference, data position, algorithm state and the step's metrics

Resume: with `checkpoint.resume` a run continues from its output directory's latest committed checkpoint. All
randomness is a function of (seed, step): sampling seeds (`algorithms.base.sample_groups`), the update order,
the task's stream (by position), so a resumed run produces what the uninterrupted one would have; the
checkpoint records the seed and refuses to resume a run with a different one. Step numbers count completed
steps: the metrics line and the checkpoint of step n describe the state after n steps.
"""

import contextlib
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from rubric_jax.algorithms.base import RolloutContext
from rubric_jax.algorithms.registry import algorithm_class
from rubric_jax.inference.embedded import EmbeddedEngine
from rubric_jax.inference.engine import RolloutEngine, SamplingParams
from rubric_jax.inference.http import JsonHttpClient, RetryPolicy
from rubric_jax.judges import llm
from rubric_jax.judges.base import Judge
from rubric_jax.models import sharding, train_step
from rubric_jax.training import policy, runs
from rubric_jax.training.evaluate import evaluate
from rubric_jax.training.metrics import PhaseTimer
from rubric_jax.training.optim import learning_rate_schedule, make_optimizer
from rubric_jax.training.run_config import JudgeConfig, RLConfig, resolve_algorithm
from rubric_jax.yaml_config import save_config

RL_PLOTS = {
    "reward": ("reward/mean", "outcome/accuracy"),
    "eval": ("eval/accuracy", "eval/rubric_score"),
    "loss": ("train/loss", "train/kl"),
    "policy": ("train/entropy", "train/clip_fraction", "mismatch/k3"),
    "response_length": ("response/length_mean",),
    "time": ("time/generation", "time/judging", "time/logprobs", "time/update", "time/sync", "time/checkpoint"),
}


def make_engine(config: RLConfig, model, tokenizer, version: str) -> RolloutEngine:
    """The rollout engine the config names, serving `model`'s weights under the name `version` (an SGLang server
    is sent them)."""
    eos_ids, pad_id = policy.eos_and_pad(tokenizer)
    if config.rollout.engine == "sglang":
        from rubric_jax.inference.sglang import SGLangEngine  # noqa: PLC0415  (only on hosts with a server)

        engine = SGLangEngine(config.rollout.sglang_url, tokenizer=tokenizer, eos_token_ids=eos_ids,
                              seed=config.seed, weight_dir=os.path.join(config.output_dir, "weights"))
        engine.update_weights(model, version)
        return engine
    return EmbeddedEngine(model, tokenizer=tokenizer, eos_token_ids=eos_ids, pad_id=pad_id, seed=config.seed,
                          weight_version=version, max_batch_size=config.rollout.max_batch_size)


def make_frozen_engine(config: RLConfig, initial_model, tokenizer) -> RolloutEngine:
    """`RolloutContext.frozen_engine`: the initial policy `initial_model` as version "initial", in process or on
    the SGLang server at rollout.frozen_sglang_url (sent these weights once, from output_dir/frozen/weights);
    nothing updates it afterwards."""
    rollout = dataclasses.replace(config.rollout, sglang_url=config.rollout.frozen_sglang_url, frozen_sglang_url=None)
    frozen = dataclasses.replace(config, rollout=rollout, output_dir=os.path.join(config.output_dir, "frozen"))
    return make_engine(frozen, initial_model, tokenizer, "initial")


def make_judge(config: JudgeConfig, task: Any, seed: int) -> Judge:
    """The run's judge (`JudgeConfig`): the task's own, or an LLM judge over HTTP in the paper's format."""
    if config.kind == "task":
        return task.judge()
    http = JsonHttpClient(config.url, max_in_flight=config.max_in_flight, seed=seed,
                          retry=RetryPolicy(max_attempts=config.max_attempts, timeout_s=config.timeout_s))
    chat = llm.ChatClient(http, llm.ChatSettings(model=config.model, temperature=config.temperature,
                                                 max_tokens=config.max_tokens, seed=seed))
    if config.format == "rating":
        return llm.CriterionLLMJudge(chat, llm.rating_format())
    formats = {"grounded": lambda: llm.grounded_format(config.max_grounding_chars), "srar": llm.srar_format,
               "rlcer_verifier": llm.rlcer_verifier_format}
    return llm.RolloutLLMJudge(chat, formats[config.format]())


def _mismatch_metrics(batch: dict[str, np.ndarray], old_logp_bt: np.ndarray) -> dict[str, float]:
    """How far the engine's logprobs are from the learner's on the same tokens: the k3 estimate of
    KL(engine || learner) and the largest absolute difference (0 up to numerics for the embedded engine)."""
    mask = batch["response_mask_bt"]
    if not mask.any():
        return {}
    delta = (old_logp_bt - batch["rollout_logp_bt"])[mask].astype(np.float64)
    return {"mismatch/k3": float(np.mean(np.expm1(delta) - delta)), "mismatch/max_abs": float(np.abs(delta).max())}


def _request_metrics(name: str, stats, seen: dict[str, int]) -> dict[str, float]:
    """This step's requests, retries and failed requests of an HTTP client (`ClientStats` counts since its
    creation; `seen` holds the counts already reported, and is updated). {} for a client-less engine or judge."""
    if stats is None:
        return {}
    counts = {"requests": stats.requests, "retries": stats.retries, "request_failures": stats.failures}
    metrics = {f"{name}/{key}": float(value - seen.get(key, 0)) for key, value in counts.items()}
    seen.update(counts)
    return metrics


class _Learner:
    """The jitted steps of one run, compiled per prompt width (the learner's `first_scored`)."""

    def __init__(self, config: RLConfig, algorithm, graphdef, state: policy.LearnerState, optimizer, mesh, rules):
        self.config, self.algorithm, self.graphdef = config, algorithm, graphdef
        self.optimizer, self.mesh, self.rules = optimizer, mesh, rules
        self.abstract_params = jax.eval_shape(lambda p: p, state.params)
        self._compiled: dict[int, tuple[Any, Any]] = {}

    def steps(self, prompt_width: int):
        if prompt_width not in self._compiled:
            common = dict(mesh=self.mesh, abstract_params=self.abstract_params, rules=self.rules,
                          chunk_size=self.config.learner.chunk_size, temperature=self.config.rollout.temperature,
                          first_scored=prompt_width)
            update = train_step.make_train_step(
                self.graphdef, self.optimizer, self.algorithm.loss_fn(), aggregate=self.algorithm.aggregate(),
                micro_batches=self.config.learner.micro_batches, **common)
            self._compiled[prompt_width] = (update, train_step.make_logprobs_fn(self.graphdef, **common))
        return self._compiled[prompt_width]


def pad_rows(batch: dict[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
    """`batch` with rows appended up to a multiple of `multiple`: copies of row 0 (finite inputs for every layer)
    whose response mask is off, so they add nothing to any loss sum or denominator."""
    rows = batch["response_mask_bt"].shape[0]
    extra = -rows % multiple
    if not extra:
        return batch
    padded = {key: np.concatenate([value, np.repeat(value[:1], extra, axis=0)]) for key, value in batch.items()}
    padded["response_mask_bt"][rows:] = False
    return padded


def _update(learner: _Learner, state: policy.LearnerState, batch, prompt_width: int, step: int, seed: int):
    """Step 4 of the module docstring; returns the mean of each train metric over the updates."""
    update, _ = learner.steps(prompt_width)
    config = learner.config.learner
    rows = next(iter(batch.values())).shape[0]
    per_update = rows // config.mini_batches
    collected = []
    for epoch in range(config.epochs):
        order = np.random.default_rng((seed, step, epoch)).permutation(rows)
        for start in range(0, rows, per_update):
            index = order[start:start + per_update]
            mini_batch = {key: value[index] for key, value in batch.items()}
            state.params, state.opt_state, metrics = update(state.params, state.opt_state, mini_batch)
            collected.append(metrics)
    collected = jax.device_get(collected)
    return {f"train/{name}": float(np.mean([m[name] for m in collected])) for name in collected[0]}


def train_rl(config: RLConfig, task: Any, *, judge=None, model=None, tokenizer=None) -> dict[str, float]:
    """Runs (or resumes) the RL run `config` on `task` (a `rubric_jax.data.tasks` task); the judge defaults to
    `config.judge`'s (`make_judge`: the task's own, or an LLM judge over HTTP, closed at the end), the model and tokenizer to `policy.build_policy(config.model)`. Returns the last step's
    metrics. Writes config.yaml, metrics.jsonl, tensorboard/, checkpoints/, plots/ and the final policy as a
    Hugging Face directory model/ under output_dir."""
    algorithm_config, config = resolve_algorithm(config)
    algorithm = algorithm_class(config.algorithm.name)(algorithm_config)
    rollout = config.rollout
    if algorithm.needs_frozen_engine and rollout.engine == "sglang" and rollout.frozen_sglang_url is None:
        raise ValueError(f"{config.algorithm.name} samples a role from the frozen initial policy: set "
                         "rollout.frozen_sglang_url to a second SGLang server")
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(config, out / "config.yaml")

    mesh = policy.make_mesh(config.learner.mesh)
    if model is None:
        model, tokenizer = policy.build_policy(config.model, task, mesh)
    judge_owned = judge is None
    judge = judge if judge is not None else make_judge(config.judge, task, config.seed)
    optimizer = make_optimizer(config.optimizer)
    schedule = learning_rate_schedule(config.optimizer)
    graphdef, state = policy.init_learner_state(model, optimizer, mesh, algorithm.needs_reference)
    rules = sharding.partition_rules(model.config)
    # Taken before the restore: a resumed run's frozen role still samples from the initial policy.
    initial_params = policy.copy_params(state.params) if algorithm.needs_frozen_engine else None

    checkpointer = runs.open_checkpoints(out, config.checkpoint)
    state, meta = runs.restore_latest(checkpointer, state, config.checkpoint, config.seed)
    start, position = (meta["step"], meta["data_position"]) if meta else (0, 0)
    if meta:
        algorithm.load_state_dict(meta["algorithm_state"])

    engine = make_engine(config, nnx.merge(graphdef, policy.copy_params(state.params)), tokenizer, f"step-{start}")
    frozen_engine = (make_frozen_engine(config, nnx.merge(graphdef, initial_params), tokenizer)
                     if initial_params is not None else None)
    initial_params = None  # the embedded frozen engine holds its own reference; a frozen server has them on disk
    _, pad_id = policy.eos_and_pad(tokenizer)
    timer = PhaseTimer()
    context = RolloutContext(
        engine=engine, tokenizer=tokenizer, task=task, judge=judge, pad_id=pad_id, seed=config.seed, timer=timer,
        sampling=SamplingParams(max_new_tokens=rollout.max_new_tokens, n=rollout.group_size,
                                temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k),
        max_prompt_tokens=rollout.max_prompt_tokens, prompt_truncation=rollout.prompt_truncation,
        frozen_engine=frozen_engine)
    learner = _Learner(config, algorithm, graphdef, state, optimizer, mesh, rules)
    dataset = task.train_stream(position)
    eval_examples = task.eval_examples(config.eval.num_examples) if config.eval.every_steps else []
    updates_per_step = config.learner.epochs * config.learner.mini_batches

    writer = runs.open_metrics(out, config.metrics, config.steps, meta)
    metrics: dict[str, float] = {}
    judge_requests_seen: dict[str, int] = {}
    engine_requests_seen: dict[str, int] = {}
    with writer, checkpointer, contextlib.closing(engine), contextlib.ExitStack() as owned:
        if judge_owned:
            owned.callback(judge.close)
        if frozen_engine is not None:
            owned.callback(frozen_engine.close)
        for step in range(start, config.steps):
            timer.reset()
            context.prompt_metrics.clear()
            step_started = time.monotonic()
            experience = algorithm.experience(dataset.next_batch(rollout.prompts_per_step), context, step)
            batch, width = experience.batch, experience.prompt_width
            learner_config = config.learner
            batch = pad_rows(batch, learner_config.mini_batches * learner_config.micro_batches
                             * learner_config.mesh.batch_shards)
            _, logprobs = learner.steps(width)
            with timer.phase("logprobs"):
                old_logp_bt = np.asarray(jax.device_get(logprobs(state.params, batch)))
                batch = {**batch, "old_logp_bt": old_logp_bt}
                if state.reference is not None:
                    batch["ref_logp_bt"] = np.asarray(jax.device_get(logprobs(state.reference, batch)))
            with timer.phase("update"):
                train_metrics = _update(learner, state, batch, width, step, config.seed)
                jax.block_until_ready(state.params)
            with timer.phase("sync"):
                engine.update_weights(nnx.merge(graphdef, policy.copy_params(state.params)), f"step-{step + 1}")
            metrics = {**experience.metrics, **train_metrics, **_mismatch_metrics(batch, old_logp_bt),
                       **{name: float(value) for name, value in context.prompt_metrics.items()},
                       **_request_metrics("judge", judge.http_stats(), judge_requests_seen),
                       **_request_metrics("engine", engine.http_stats(), engine_requests_seen),
                       "train/learning_rate": float(schedule((step + 1) * updates_per_step - 1))}
            if config.eval.every_steps and (step + 1) % config.eval.every_steps == 0:
                with timer.phase("eval"):
                    metrics.update(evaluate(engine, tokenizer, task, judge, eval_examples, config.eval,
                                            max_new_tokens=rollout.max_new_tokens, seed=config.seed))
            if (step + 1) % config.checkpoint.every_steps == 0 or step + 1 == config.steps:
                with timer.phase("checkpoint"):
                    meta = {"step": step + 1, "seed": config.seed, "data_position": dataset.position,
                            "algorithm_state": algorithm.state_dict(), "metrics": {**metrics, **timer.metrics()}}
                    checkpointer.save(step + 1, state.tree(), meta)
            metrics.update(timer.metrics())
            metrics["time/step"] = time.monotonic() - step_started  # wall time: the phases and what lies between
            writer.write(step + 1, metrics)
    runs.save_outputs(out, graphdef, state.params, tokenizer, RL_PLOTS if config.metrics.plots else None)
    return metrics
