"""The RL loop (`rubric-jax train`): for each step

  1. the next `prompts_per_step` examples of the task's train stream
  2. experience = algorithm.experience(...)          rollouts (engine) -> judges -> rewards -> token advantages;
                                                      a recipe that re-samples (dynamic_sampling resample) draws
                                                      its further generation batches from the same stream
                                                      (`RolloutContext.stream`, `algorithms.base.dynamic_groups`)
  3. old logprobs recomputed by the learner           (and the frozen reference's, for a KL penalty); the
                                                      engine's logprobs stay in the batch ("rollout_logp_bt")
                                                      and their mismatch with the learner's is logged; with
                                                      learner.old_logprobs detached, the update's own logprobs
                                                      instead (`train_step.with_detached_old_logprobs`)
  4. `epochs` passes over the batch in a fresh random order, each split into `mini_batches` optimizer updates,
     each accumulated exactly over `micro_batches` (`train_step.make_train_step`)
  PPO with a critic (a recipe whose `uses_critic`; the run's `critic` config): the recipe hands token rewards;
     before step 4 the critic's values of the batch give GAE advantages and returns (`critic_advantages`), and
     in step 4 every mini-batch also updates the critic on the clipped value loss (`models.value`) with its own
     optimizer. The critic is never synced anywhere; it is checkpointed with the policy.
  5. weight sync to the engine (version "step-<n>"); a recipe's frozen engine (`make_frozen_engine`, the initial
     policy for a role that is not trained) is never synced
  6. every `rollout_log.every_steps`, the step's judged rollouts (every request the recipe sent the judge in step
     2, with its verdict; not the evaluation's) in rollouts/step_<n>.jsonl (`judges.records`, `RolloutLogConfig`);
     every step its first `rollout_log.samples_per_step` judged rollouts, and every evaluation its first
     `eval.log_samples`, as samples to read (samples.jsonl and TensorBoard text, phase "train" or "eval");
     metrics (metrics.jsonl, TensorBoard, console) and, every `checkpoint.every_steps` and at the end, an orbax
     checkpoint of params, optimizer state, reference, data position, algorithm state and the step's metrics

Resume: with `checkpoint.resume` a run continues from its output directory's latest committed checkpoint. All
randomness is a function of (seed, step): sampling seeds (`algorithms.base.sample_groups`; a re-sampled generation
batch's of its number too), the update order, the task's stream (by position, which counts every example a step
drew, re-sampled ones included), so a resumed run produces what the uninterrupted one would have; the
checkpoint records the seed and refuses to resume a run with a different one. Step numbers count completed
steps: the metrics line and the checkpoint of step n describe the state after n steps, and rollouts/step_<n>.jsonl
what was judged during step n (sampled by the policy after n - 1 steps). A rollout file is written before its
step's checkpoint, and resuming from step k deletes those of steps after k (as the metrics log drops their lines),
so the steps a resumed run re-runs write theirs again and every file describes the run's one history.

Overlap (`RolloutConfig.overlap`): step n + 1's experience (step 2, judging included, on the stream's next
examples) is sampled in a background thread from the weights of n updates while the learner runs steps 3 and 4
of step n; the sync (step 5) waits for it ("time/rollout_wait": what the update did not hide), so the engine
and the judges are only ever used by one thread at a time. The first step's batch (and that of a resumed run
whose checkpoint has none sampled ahead) is sampled as without overlap; every later one lags one update: the
metrics line of step n >= 2 has "rollout/policy_lag" 1 and "rollout/weight_step" n - 2 (its batch was sampled
from the weights after n - 2 updates while update n - 1 ran; without overlap, lag 0 and n - 1). A batch is a
function of (seed, step) and of its weights, as without overlap, so an overlapped run is reproducible; its
checkpoint of step n, taken once step n + 1's experience is in, holds the data position and algorithm state
after that experience, and the experience itself (with its judged rollouts) in pending/step_<n>.npz
(`save_pending`: arrays and JSON, never a pickle), which the resumed run trains on next, so it continues as the
uninterrupted run would.

Multi-process (`data_parallel`, docs/multihost.md): every process samples and judges its share of each step's
examples, [k::P], and the learner trains on the union of the shares as one global batch. Process 0 alone writes
config.yaml, the metrics log (the rollout-side metrics in it describe its share; the train/* ones the whole
batch), the judged-rollout files (its share) and the final model; each process keeps its own pending experience.
"""

import concurrent.futures
import contextlib
import dataclasses
import logging
import io
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import jax
import numpy as np

from rubric_jax.algorithms.base import Experience, RolloutContext, summary_stats
from rubric_jax.algorithms.registry import algorithm_class
from rubric_jax.inference.embedded import EmbeddedEngine
from rubric_jax.inference.engine import RolloutEngine, SamplingParams
from rubric_jax.inference.http import ClientStats
from rubric_jax.judges import llm, preflight
from rubric_jax.judges.base import Judge, JudgeRequest
from rubric_jax.judges.records import (FirstJudged, JudgedRollout, RecordingJudge, judged_rollout_from_json,
                                      judged_rollout_to_json, write_judged_rollouts)
from rubric_jax.core import value as core_value
from rubric_jax.core.advantages import whiten_tokens_by_group
from rubric_jax.core.rewards import weighted_fraction
from rubric_jax.models import sharding, train_step
from rubric_jax.models.value import make_value_train_step, make_values_fn
from rubric_jax.rubrics import parsing, prompts
from rubric_jax.rubrics.schema import Criterion, Rubric
from rubric_jax.rubrics.steps import split_steps
from rubric_jax.training import data_parallel, policy, runs
from rubric_jax.training.runs import RunStopped
from rubric_jax.training.evaluate import evaluate, evaluate_benchmarks
from rubric_jax.training.metrics import PhaseTimer
from rubric_jax.training.optim import learning_rate_schedule, make_optimizer, schedule_mismatch
from rubric_jax.training.run_config import (CriticConfig, JudgeConfig, MetaVerifierConfig, RLConfig,
                                             resolve_algorithm)
from rubric_jax.yaml_config import save_config

_LOG = logging.getLogger(__name__)

RL_PLOTS = {
    "reward": ("reward/mean", "outcome/accuracy"),
    "eval": ("eval/accuracy", "eval/rubric_score"),
    "loss": ("train/loss", "train/kl"),
    "policy": ("train/entropy", "train/clip_fraction", "mismatch/k3"),
    "response_length": ("response/length_mean",),
    "time": ("time/generation", "time/judging", "time/logprobs", "time/update", "time/rollout_wait", "time/sync",
             "time/checkpoint"),
    "critic": ("critic/loss", "critic/explained_variance", "critic/clip_fraction"),
}


ROLLOUT_LOG_DIR = "rollouts"
_ROLLOUT_LOG_NAME = re.compile(r"step_(\d+)\.jsonl")


def rollout_log_path(out: Path, step: int) -> Path:
    """The file of step `step`'s judged rollouts in the run directory `out` (`RolloutLogConfig`)."""
    return out / ROLLOUT_LOG_DIR / f"step_{step:06d}.jsonl"


def drop_rollout_logs_after(out: Path, step: int) -> None:
    """Deletes the rollout files of the steps after `step` in the run directory `out`: a run resumed from step
    `step` abandons them (module docstring)."""
    for path in (out / ROLLOUT_LOG_DIR).glob("step_*.jsonl"):
        match = _ROLLOUT_LOG_NAME.fullmatch(path.name)
        if match and int(match.group(1)) > step:
            path.unlink()


PENDING_DIR = "pending"
_PENDING_NAME = re.compile(r"step_(\d+)\.npz")


def _pending_dir(out: Path) -> Path:
    """out/pending; in a multi-process run, this process's out/pending/process_<k> (each samples its own share)."""
    directory = out / PENDING_DIR
    return directory if jax.process_count() == 1 else directory / f"process_{jax.process_index()}"


@dataclasses.dataclass(frozen=True)
class SampledExperience:
    """One step's experience as the learner takes it (`sample_experience`): the recipe's output, the entries it
    adds to the step's metrics line (the recipe's metrics, the prompt metrics, "time/generation" and
    "time/judging", "rollout/weight_step": the updates of the weights it was sampled from, "rollout/policy_lag":
    the step's updates before it minus those, the judge's and the meta-verifier's calls of the step as
    `call_metrics`), and its judged rollouts to log (None when the step logs none)."""

    experience: Experience
    metrics: dict[str, float]
    records: Optional[list[JudgedRollout]]
    logs_rollouts: bool = False  # whether `records` go to the step's rollout file (else only its samples)


def sample_experience(algorithm, examples: list, context: RolloutContext, recorder: RecordingJudge, step: int,
                      weight_step: int, logs_rollouts: bool, keeps_samples: bool = False) -> SampledExperience:
    """Step `step`'s experience of `examples` from the engine's weights after `weight_step` updates (step 2 of
    the module docstring), with `recorder` (the context's judge) keeping the judged rollouts when
    `logs_rollouts` (the step's rollout file) or `keeps_samples` (its first few, `samples_of`). It times itself
    and records its prompt metrics apart from the learner, so it may run in a background thread while the learner
    updates (`RolloutConfig.overlap`)."""
    timer = PhaseTimer()
    context = dataclasses.replace(context, timer=timer, prompt_metrics={})
    keeps = logs_rollouts or keeps_samples
    callers = {"judge": recorder, "meta_verifier": context.meta_verifier}
    calls_before = {name: caller.call_counts() for name, caller in callers.items() if caller is not None}
    recorder.recording = keeps
    try:
        experience = algorithm.experience(examples, context, step)
    finally:
        recorder.recording = False
    times = {name: seconds for name, seconds in timer.metrics().items() if name != "time/step"}
    metrics = {**experience.metrics, **{name: float(value) for name, value in context.prompt_metrics.items()},
               **times, "rollout/weight_step": float(weight_step), "rollout/policy_lag": float(step - weight_step)}
    for name, before in calls_before.items():
        metrics.update(call_metrics(name, before, callers[name].call_counts()))
    records = recorder.take(step + 1) if keeps else None
    return SampledExperience(experience, metrics, records, logs_rollouts)


def call_metrics(name: str, before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """The calls an LLM judge or meta-verifier made between two of its `call_counts` (`judges.llm.call_counts`),
    as one step's metrics under `name`: "<name>/calls", "<name>/call_failures", "<name>/call_failed/<reason>"
    (the reasons met in the step), "<name>/schema_violations" and "<name>/call_failure_rate" (the step's failed
    calls over its calls; absent without calls). {} for a judge without a chat server."""
    step = {key: count - before.get(key, 0) for key, count in after.items()}
    metrics = {f"{name}/{key}": float(count) for key, count in step.items()
               if count or not key.startswith("call_failed/")}
    if step.get("calls"):
        metrics[f"{name}/call_failure_rate"] = step["call_failures"] / step["calls"]
    return metrics


def samples_of(records: list[JudgedRollout], count: int) -> list[dict[str, Any]]:
    """The first `count` judged rollouts as samples to read (`RolloutLogConfig.samples_per_step`): id, question,
    response, each criterion with its weight and verdict, the rubric score (the weighted fraction of the rubric
    satisfied, as "eval/rubric_score"; a recipe's reward may shape it further), the judge's failure reason, its
    detail and the failed call's raw answer (cut, `judges.base.kept_answer`; null when the judge did not fail or
    kept none)."""
    samples = []
    for record in records[:count]:
        criteria, verdict = record.request.rubric.criteria, record.verdict
        satisfied = [None] * len(criteria) if verdict.failed else list(verdict.satisfied)
        score = None if verdict.failed else float(weighted_fraction(
            np.asarray([satisfied], np.float32), np.asarray([[c.weight for c in criteria]], np.float32),
            np.ones((1, len(criteria)), bool))[0])
        samples.append({"id": record.id, "question": record.request.question, "response": record.request.response,
                        "criteria": [{"text": c.text, "weight": c.weight, "satisfied": s}
                                     for c, s in zip(criteria, satisfied)],
                        "rubric_score": score, "judge_failure": verdict.reason or None,
                        "judge_detail": verdict.detail or None, "judge_answer": verdict.answer or None})
    return samples


def pending_path(out: Path, step: int) -> Path:
    """The file of the experience an overlapped run (`RolloutConfig.overlap`) had sampled ahead for the step
    after `step` when it checkpointed step `step`, in the run directory `out`."""
    return _pending_dir(out) / f"step_{step:06d}.npz"


def pending_arrays(sampled: SampledExperience) -> dict[str, np.ndarray]:
    """`sampled` as plain arrays, for `np.savez` (read back by `pending_from_arrays` with allow_pickle=False: a run
    directory is never a way to run code): the batch's arrays under "batch/<key>", the metrics' values as float64
    arrays, and the rest (prompt width, metric names, the judged rollouts' JSON, `judges.records`) as UTF-8 JSON."""
    meta = {"prompt_width": sampled.experience.prompt_width, "logs_rollouts": sampled.logs_rollouts,
            "experience_metrics": list(sampled.experience.metrics), "metrics": list(sampled.metrics),
            "records": None if sampled.records is None else [judged_rollout_to_json(r) for r in sampled.records]}
    return {**{f"batch/{key}": np.asarray(value) for key, value in sampled.experience.batch.items()},
            "experience_metric_values": np.array(list(sampled.experience.metrics.values()), np.float64),
            "metric_values": np.array(list(sampled.metrics.values()), np.float64),
            "meta": np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8)}


def pending_from_arrays(arrays: Mapping[str, np.ndarray]) -> SampledExperience:
    """The SampledExperience that `pending_arrays` wrote."""
    meta = json.loads(bytes(arrays["meta"]).decode("utf-8"))
    batch = {key.removeprefix("batch/"): arrays[key] for key in arrays if key.startswith("batch/")}
    experience = Experience(batch=batch, prompt_width=int(meta["prompt_width"]), metrics=dict(zip(
        meta["experience_metrics"], arrays["experience_metric_values"].tolist())))
    records = None if meta["records"] is None else [judged_rollout_from_json(r) for r in meta["records"]]
    return SampledExperience(experience, dict(zip(meta["metrics"], arrays["metric_values"].tolist())), records,
                             bool(meta["logs_rollouts"]))


def save_pending(out: Path, step: int, sampled: SampledExperience, oldest_kept: int) -> None:
    """Writes `sampled` as checkpoint `step`'s pending experience (`pending_path`, `pending_arrays`; written whole
    or not at all, before the checkpoint), and deletes those of the steps before `oldest_kept` (no checkpoint
    resumes there)."""
    path = pending_path(out, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, **pending_arrays(sampled))
    partial = path.with_suffix(".partial")
    partial.write_bytes(buffer.getvalue())
    os.replace(partial, path)
    for other in path.parent.glob("step_*.npz"):
        match = _PENDING_NAME.fullmatch(other.name)
        if match and int(match.group(1)) < oldest_kept:
            other.unlink()


def resume_pending(out: Path, step: int) -> Optional[SampledExperience]:
    """The pending experience of checkpoint `step` of the run directory `out` (None when that run did not sample
    ahead); those of later steps, which the resumed run abandons, are deleted."""
    for other in _pending_dir(out).glob("step_*.npz"):
        match = _PENDING_NAME.fullmatch(other.name)
        if match and int(match.group(1)) > step:
            other.unlink()
    path = pending_path(out, step)
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as arrays:
        return pending_from_arrays({key: arrays[key] for key in arrays.files})


def make_engine(config: RLConfig, model, tokenizer, version: str) -> RolloutEngine:
    """The rollout engine the config names, serving `model`'s weights under the name `version` (an SGLang server
    is sent them)."""
    eos_ids, pad_id = policy.eos_and_pad(tokenizer)
    if config.rollout.engine == "sglang":
        from rubric_jax.inference.sglang import SGLangEngine  # noqa: PLC0415  (only on hosts with a server)

        engine = SGLangEngine(config.rollout.sglang_url, tokenizer=tokenizer,
                              chat_template_kwargs=config.model.chat_template_kwargs, eos_token_ids=eos_ids,
                              seed=config.seed, weight_dir=os.path.join(config.output_dir, "weights"))
        engine.update_weights(model, version)
        return engine
    return EmbeddedEngine(model, tokenizer=tokenizer, chat_template_kwargs=config.model.chat_template_kwargs,
                          eos_token_ids=eos_ids, pad_id=pad_id, seed=config.seed,
                          weight_version=version, max_batch_size=config.rollout.max_batch_size)


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


def _chat_client(config: JudgeConfig | MetaVerifierConfig, seed: int, section: str) -> llm.ChatClient:
    """The chat client of an LLM section of the config: its server, credentials, model, decoding, request options
    and retry policy."""
    settings = llm.ChatSettings(model=config.model, temperature=config.temperature, max_tokens=config.max_tokens,
                                seed=seed, chat_template_kwargs=config.chat_template_kwargs,
                                extra_body=config.extra_body)
    return llm.chat_client(config.url, settings, seed=seed, headers=auth_headers(config, section),
                           max_in_flight=config.max_in_flight, max_attempts=config.max_attempts,
                           timeout_s=config.timeout_s)


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


def context_length(model: Any, task: Any) -> tuple[Any, int]:
    """(tokenizer, max_position_embeddings) of the policy `model` (a `ModelSpec`) would build, read without
    building it."""
    if model.path is None:
        return task.tokenizer(), model.init.max_position_embeddings
    from rubric_jax.models.config import ModelConfig  # noqa: PLC0415
    from rubric_jax.models.tokenizer import load_tokenizer  # noqa: PLC0415

    return load_tokenizer(model.path), ModelConfig.from_pretrained(model.path).max_position_embeddings


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


class JudgeFailureBudget:
    """The judge's failure budget (`JudgeConfig`): `observe` counts the consecutive steps whose failure rate, the
    larger of "judge/failure_rate" (failed rollouts) and "judge/call_failure_rate" (failed calls: with
    judge.failed_criterion score_zero a failed criterion call leaves its rollout judged), exceeds
    `max_failure_rate`, and raises RunStopped at the `max_failing_steps`-th, before that step's update."""

    RATES = ("judge/failure_rate", "judge/call_failure_rate")

    def __init__(self, config: JudgeConfig):
        self.config = config
        self.failing_steps = 0

    def observe(self, metrics: dict[str, float], step: int) -> None:
        rates = {key: metrics[key] for key in self.RATES if key in metrics}
        name, rate = max(rates.items(), key=lambda item: item[1], default=(None, None))
        limit = self.config.max_failure_rate
        if rate is None or rate <= limit:
            self.failing_steps = 0
            return
        self.failing_steps += 1
        if self.failing_steps < self.config.max_failing_steps:
            return
        reasons = sorted({key.split("/")[-1] for key in metrics
                          if key.startswith(("judge/failed/", "judge/call_failed/"))})
        where = f" at {self.config.url}" if self.config.kind == "llm" else ""
        raise RunStopped(f"{name} was above judge.max_failure_rate ({limit:g}) on "
                         f"{self.failing_steps} consecutive steps (step {step}: {rate:.0%}"
                         + (f"; {', '.join(reasons)}" if reasons else "") + f"): the judge{where} is failing, so "
                         f"the rewards are failures, not judgements; stopped before step {step}'s update (the "
                         "last checkpoint resumes)")


def make_judge(config: JudgeConfig, task: Any, seed: int) -> Judge:
    """The run's judge (`JudgeConfig`): the task's own, or an LLM judge over HTTP in the paper's format."""
    if config.kind == "task":
        return task.judge()
    chat = _chat_client(config, seed, "judge")
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
    return llm.LLMMetaVerifier(_chat_client(config, seed, "meta_verifier"), config.domain)


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
    """The jitted steps of one run, compiled per prompt width (the learner's `first_scored`); the critic's too
    when the run has one (`critic_graphdef` and `critic_optimizer`, its params in `state`)."""

    def __init__(self, config: RLConfig, algorithm, graphdef, state: policy.LearnerState, optimizer, mesh, rules,
                 critic_graphdef=None, critic_optimizer=None):
        self.config, self.algorithm, self.graphdef = config, algorithm, graphdef
        self.optimizer, self.mesh, self.rules = optimizer, mesh, rules
        self.abstract_params = jax.eval_shape(lambda p: p, state.params)
        self._compiled: dict[int, tuple[Any, Any]] = {}
        self.critic_graphdef, self.critic_optimizer = critic_graphdef, critic_optimizer
        self.abstract_critic = jax.eval_shape(lambda p: p, state.critic_params)
        self._compiled_critic: dict[int, tuple[Any, Any]] = {}

    @property
    def has_critic(self) -> bool:
        return self.critic_graphdef is not None

    def critic_steps(self, prompt_width: int):
        """(value update, values) of the critic (`models.value`)."""
        if prompt_width not in self._compiled_critic:
            common = dict(mesh=self.mesh, abstract_params=self.abstract_critic, rules=self.rules,
                          first_scored=prompt_width)
            update = make_value_train_step(
                self.critic_graphdef, self.critic_optimizer, clip=self.config.critic.value_clip,
                aggregate=self.algorithm.aggregate(), micro_batches=self.config.learner.micro_batches, **common)
            values = make_values_fn(self.critic_graphdef, micro_batches=self.config.learner.forward_splits, **common)
            self._compiled_critic[prompt_width] = (update, values)
        return self._compiled_critic[prompt_width]

    def steps(self, prompt_width: int):
        if prompt_width not in self._compiled:
            common = dict(mesh=self.mesh, abstract_params=self.abstract_params, rules=self.rules,
                          chunk_size=self.config.learner.chunk_size, temperature=self.config.rollout.temperature,
                          first_scored=prompt_width)
            loss_fn = self.algorithm.loss_fn()
            if self.config.learner.old_logprobs == "detached":
                loss_fn = train_step.with_detached_old_logprobs(loss_fn)
            update = train_step.make_train_step(
                self.graphdef, self.optimizer, loss_fn, aggregate=self.algorithm.aggregate(),
                micro_batches=self.config.learner.micro_batches, **common)
            logprobs = train_step.make_logprobs_fn(self.graphdef, micro_batches=self.config.learner.forward_splits,
                                                   **common)
            self._compiled[prompt_width] = (update, logprobs)
        return self._compiled[prompt_width]


_gae = jax.jit(core_value.gae_advantages, static_argnames=("gamma", "lam"))
_whiten = jax.jit(whiten_tokens_by_group)


def critic_advantages(batch: dict[str, np.ndarray], old_values_bt: np.ndarray, config: CriticConfig
                      ) -> dict[str, np.ndarray]:
    """`batch` plus the critic's "old_values_bt" and GAE's (`core.value.gae_advantages`) "advantages_bt" and
    "returns_bt" from the recipe's "token_rewards_bt": the advantages whitened when `config.whiten_advantages`
    (verl's masked_whiten after GAE) over all response tokens of the batch, or, when the recipe gives a
    "whiten_group_b" [B] (ints), within each group's rows (`core.advantages.whiten_tokens_by_group`: RLCER's
    roles); the returns (the critic's targets) never. ValueError when the recipe gave no token rewards."""
    if "token_rewards_bt" not in batch:
        raise ValueError("a recipe that uses the critic must put its rewards in Experience.batch['token_rewards_bt']")
    mask_bt = batch["response_mask_bt"]
    advantages_bt, returns_bt = _gae(batch["token_rewards_bt"], old_values_bt, mask_bt, gamma=config.gamma,
                                     lam=config.lam)
    if config.whiten_advantages:
        groups_b = batch.get("whiten_group_b", np.zeros(mask_bt.shape[0], np.int32))
        advantages_bt = _whiten(advantages_bt, groups_b, mask_bt)
    return {**batch, "old_values_bt": old_values_bt, "advantages_bt": np.asarray(advantages_bt),
            "returns_bt": np.asarray(returns_bt)}


def _critic_metrics(batch: dict[str, np.ndarray]) -> dict[str, float]:
    """The critic's fit before this step's updates, over response tokens: verl's vf_explained_var,
    1 - Var(R - V_old) / (Var(R) + 1e-5) (population variances; verl's sample variances give the same ratio up to
    the 1e-5), and the advantages' and returns' summary statistics."""
    mask_bt = batch["response_mask_bt"]
    if not mask_bt.any():
        return {}
    returns, old_values = (batch[key][mask_bt].astype(np.float64) for key in ("returns_bt", "old_values_bt"))
    return {"critic/explained_variance": float(1 - np.var(returns - old_values) / (np.var(returns) + 1e-5)),
            **summary_stats("critic/advantage", batch["advantages_bt"], mask_bt),
            **summary_stats("critic/return", batch["returns_bt"], mask_bt)}


def _mean_metrics(prefix: str, collected: list) -> dict[str, float]:
    collected = jax.device_get(collected)
    return {f"{prefix}/{name}": float(np.mean([m[name] for m in collected])) for name in collected[0]} if collected \
        else {}


def _update(learner: _Learner, state: policy.LearnerState, batch, prompt_width: int, step: int, seed: int):
    """Step 4 of the module docstring (each mini-batch also updates the critic, when there is one); returns the
    mean of each train/* and critic/* metric over the updates."""
    update, _ = learner.steps(prompt_width)
    critic_update = learner.critic_steps(prompt_width)[0] if learner.has_critic else None
    config = learner.config.learner
    rows = next(iter(batch.values())).shape[0]
    per_update = rows // config.mini_batches
    collected, critic_collected = [], []
    for epoch in range(config.epochs):
        order = np.random.default_rng((seed, step, epoch)).permutation(rows)
        for start in range(0, rows, per_update):
            index = order[start:start + per_update]
            mini_batch = sharding.global_batch({key: value[index] for key, value in batch.items()}, learner.mesh)
            state.params, state.opt_state, metrics = update(state.params, state.opt_state, mini_batch)
            collected.append(metrics)
            if critic_update is not None:
                state.critic_params, state.critic_opt_state, metrics = critic_update(
                    state.critic_params, state.critic_opt_state, mini_batch)
                critic_collected.append(metrics)
    return {**_mean_metrics("train", collected), **_mean_metrics("critic", critic_collected)}


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


def train_rl(config: RLConfig, task: Any, *, judge=None, model=None, tokenizer=None,
             benchmarks: Optional[Mapping[str, tuple[Any, list]]] = None) -> dict[str, float]:
    """`_train_rl`, whose launch, refused before its first step completes (a prompt over the context, a server
    that stops answering), leaves output_dir as it found it (`runs.undo_failed_launch`)."""
    with runs.undo_failed_launch(Path(config.output_dir)):
        return _train_rl(config, task, judge=judge, model=model, tokenizer=tokenizer, benchmarks=benchmarks or {})


def _train_rl(config: RLConfig, task: Any, *, judge, model, tokenizer, benchmarks) -> dict[str, float]:
    """Runs (or resumes) the RL run `config` on `task` (a `rubric_jax.data.tasks` task); the judge defaults to
    `config.judge`'s (`make_judge`: the task's own, or an LLM judge over HTTP, closed at the end), the model and
    tokenizer to `policy.build_policy(config.model)`; an LLM meta-verifier (`make_meta_verifier`, meta_verifier
    kind llm) reaches the recipe in its context and is closed at the end. Returns the last step's metrics. Writes
    config.yaml, metrics.jsonl, tensorboard/, checkpoints/, plots/, the final policy as a Hugging Face directory
    model/ and, with `rollout_log.every_steps`, the judged rollouts rollouts/step_<n>.jsonl under output_dir.
    Before writing anything it refuses (RunStopped, one line) a dataset row whose prompt the model cannot sample
    (`prompt_refusal`) and an LLM judge or meta-verifier whose server cannot do the work (`check_llm_roles`: one
    real request each, its answer read by the role's parser).

    `benchmarks`: name -> (task, examples) of each of `config.eval.benchmarks`
    (`rubric_jax.benchmark.benchmark_tasks`, which `rubric-jax train` calls), evaluated with the held-out rows;
    ValueError, before anything runs, when a run that evaluates is not given exactly the section's benchmarks."""
    sharding.maybe_initialize_distributed()  # a multi-process job (docs/multihost.md), before any computation
    evaluated = set(config.eval.benchmarks) if config.eval.every_steps else set()
    if set(benchmarks) != evaluated:
        raise ValueError(f"eval.benchmarks names {sorted(evaluated)} but the run was given the benchmarks "
                         f"{sorted(benchmarks)}: read them with rubric_jax.benchmark.benchmark_tasks")
    algorithm_config, config = resolve_algorithm(config)
    check_rubric_width(algorithm_config, task)
    algorithm = algorithm_class(config.algorithm.name)(algorithm_config)
    data_parallel.check_recipe(algorithm)
    data_parallel.check_overlap(algorithm, config.rollout.overlap)
    rollout = config.rollout
    check_frozen_engine(algorithm, config)
    judge_owned = judge is None
    judge = judge if judge is not None else make_judge(config.judge, task, config.seed)
    meta_verifier = make_meta_verifier(config.meta_verifier, config.seed)
    # Before anything is written: a relaunch that would rewrite a run's history (checked first: it needs neither
    # the model nor a server), a prompt the model cannot sample, or a server that cannot be reached or whose
    # answers do not parse, stops the launch with nothing changed on disk.
    try:
        runs.check_relaunch(Path(config.output_dir), config, lambda saved: resolve_algorithm(saved)[1])
        if (refusal := prompt_refusal(algorithm, task, config, model, tokenizer)) is not None:
            raise RunStopped(refusal)
        check_llm_roles(judge if judge_owned else None, meta_verifier, task, config.judge.format)
    except BaseException:
        for client in ([judge] if judge_owned else []) + ([meta_verifier] if meta_verifier is not None else []):
            client.close()
        raise
    mesh = policy.make_mesh(config.learner.mesh)
    if model is None:
        model, tokenizer = policy.build_policy(config.model, task, mesh)
    # Only now, with the judge answering, the history checked and the model built: a launch that fails before
    # this point has written nothing.
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        save_config(config, out / "config.yaml")
    optimizer = make_optimizer(config.optimizer)
    schedule = learning_rate_schedule(config.optimizer)
    critic_schedule = learning_rate_schedule(config.critic.optimizer)
    run_updates = config.steps * config.learner.epochs * config.learner.mini_batches
    for section, optimizer_config in (("optimizer", config.optimizer),
                                      *((("critic.optimizer", config.critic.optimizer),) if algorithm.uses_critic
                                        else ())):
        if (warning := schedule_mismatch(optimizer_config, run_updates, section)) is not None:
            _LOG.warning(warning)
    graphdef, state = policy.init_learner_state(model, optimizer, mesh, algorithm.needs_reference)
    rules = sharding.partition_rules(model.config)
    critic_graphdef = critic_optimizer = None
    if algorithm.uses_critic:
        critic_optimizer = make_optimizer(config.critic.optimizer)
        critic_graphdef, state.critic_params, state.critic_opt_state = policy.init_critic(
            graphdef, state.params, critic_optimizer, mesh)
    # Taken before the restore: a resumed run's frozen role still samples from the initial policy.
    initial_params = policy.copy_params(state.params) if algorithm.needs_frozen_engine else None

    checkpointer = runs.open_checkpoints(out, config.checkpoint)
    state, meta = runs.restore_latest(checkpointer, state, config.checkpoint, config.seed)
    start, position = (meta["step"], meta["data_position"]) if meta else (0, 0)
    pending = None  # the experience of the next step, when it was sampled ahead (`RolloutConfig.overlap`)
    if meta:
        algorithm.load_state_dict(meta["algorithm_state"])
        if jax.process_index() == 0:
            drop_rollout_logs_after(out, start)
        pending = resume_pending(out, start)

    engine = make_engine(config, policy.rollout_model(graphdef, state.params, rollout.engine), tokenizer,
                         f"step-{start}")
    frozen_engine = (make_frozen_engine(config, policy.rollout_model(graphdef, initial_params, rollout.engine),
                                        tokenizer)
                     if initial_params is not None else None)
    initial_params = None  # the embedded frozen engine holds its own reference; a frozen server has them on disk
    _, pad_id = policy.eos_and_pad(tokenizer)
    timer = PhaseTimer()
    recorder = RecordingJudge(judge)  # the recipe's judge; evaluation and the request counts use `judge` itself
    # Read by one thread at a time (`sample`, here or in the overlap thread), so its order is the run's.
    stream = data_parallel.StepStream(task.train_stream(position), rollout.prompts_per_step)
    context = RolloutContext(
        engine=engine, tokenizer=tokenizer, task=task, judge=recorder, pad_id=pad_id, seed=config.seed, timer=timer,
        sampling=SamplingParams(max_new_tokens=rollout.max_new_tokens, n=rollout.group_size,
                                temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k),
        chat_template_kwargs=config.model.chat_template_kwargs,
        max_prompt_tokens=rollout.max_prompt_tokens, prompt_truncation=rollout.prompt_truncation,
        frozen_engine=frozen_engine, meta_verifier=meta_verifier, stream=stream)
    learner = _Learner(config, algorithm, graphdef, state, optimizer, mesh, rules, critic_graphdef, critic_optimizer)
    eval_examples = task.eval_examples(config.eval.num_examples) if config.eval.every_steps else []
    updates_per_step = config.learner.epochs * config.learner.mini_batches

    writer = runs.open_metrics(out, config.metrics, config.steps, meta)
    judge_budget = JudgeFailureBudget(config.judge)
    data_metrics = task.data_metrics() if hasattr(task, "data_metrics") else {}
    metrics: dict[str, float] = {}
    judge_requests_seen: dict[str, int] = {}
    meta_verifier_requests_seen: dict[str, int] = {}
    engine_requests_seen: dict[str, int] = {}
    recomputes_old_logprobs = config.learner.old_logprobs == "recompute"

    def sample(step: int, weight_step: int) -> SampledExperience:
        """Step `step`'s experience of the stream's next examples, from the engine's weights (`weight_step`
        updates)."""
        log_every = config.rollout_log.every_steps
        examples = stream.next_share(rollout.prompts_per_step)
        return sample_experience(algorithm, examples, context, recorder, step, weight_step,
                                 logs_rollouts=bool(log_every) and (step + 1) % log_every == 0,
                                 keeps_samples=config.rollout_log.samples_per_step > 0)

    with writer, checkpointer, contextlib.closing(engine), contextlib.ExitStack() as owned, \
            runs.StopRequests() as stop:
        if judge_owned:
            owned.callback(judge.close)
        if frozen_engine is not None:
            owned.callback(frozen_engine.close)
        if meta_verifier is not None:
            owned.callback(meta_verifier.close)
        # Exits first: a sampling job in flight ends before the engine and judges close.
        background = owned.enter_context(concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollouts"))
        for step in range(start, config.steps):
            timer.reset()
            step_started = time.monotonic()
            sampled, pending = (pending if pending is not None else sample(step, step)), None
            # Sampled from the weights of `step` updates while the learner makes update step + 1 (module docstring).
            upcoming = background.submit(sample, step + 1, step) if rollout.overlap and step + 1 < config.steps \
                else None
            judge_budget.observe(sampled.metrics, step + 1)
            experience = sampled.experience
            learner_config = config.learner
            # This process's share in the shape all processes agree on (`data_parallel`); `inputs` the global batch.
            batch, width = data_parallel.align_batch(experience.batch, experience.prompt_width, pad_id,
                                                     learner_config.row_multiple)
            inputs = sharding.global_batch({key: batch[key] for key in train_step.POLICY_INPUTS}, mesh)
            if recomputes_old_logprobs or state.reference is not None:
                _, logprobs = learner.steps(width)
                with timer.phase("logprobs"):
                    if recomputes_old_logprobs:
                        batch["old_logp_bt"] = sharding.process_rows(logprobs(state.params, inputs), mesh)
                    if state.reference is not None:
                        batch["ref_logp_bt"] = sharding.process_rows(logprobs(state.reference, inputs), mesh)
            critic_metrics = {}
            if learner.has_critic:
                with timer.phase("values"):
                    _, values = learner.critic_steps(width)
                    batch = critic_advantages(batch, sharding.process_rows(values(state.critic_params, inputs), mesh),
                                              config.critic)
                critic_metrics = {**_critic_metrics(batch),
                                  "critic/learning_rate": float(critic_schedule((step + 1) * updates_per_step - 1))}
            with timer.phase("update"):
                train_metrics = _update(learner, state, batch, width, step, config.seed)
                jax.block_until_ready(state.params)
            mismatch_metrics = (_mismatch_metrics(batch, batch["old_logp_bt"]) if recomputes_old_logprobs
                                else {"mismatch/k3": train_metrics.pop("train/mismatch_k3")})
            if upcoming is not None:
                with timer.phase("rollout_wait"):  # the part of the next step's sampling the update did not hide
                    pending = upcoming.result()
            with timer.phase("sync"):
                engine.update_weights(policy.rollout_model(graphdef, state.params, rollout.engine), f"step-{step + 1}")
            metrics = {**data_metrics, **sampled.metrics, **train_metrics, **critic_metrics, **mismatch_metrics,
                       **_request_metrics("judge", judge.http_stats(), judge_requests_seen),
                       **_request_metrics("meta_verifier",
                                          meta_verifier.http_stats() if meta_verifier is not None else None,
                                          meta_verifier_requests_seen),
                       **_request_metrics("engine", engine.http_stats(), engine_requests_seen),
                       **{f"judge/{key}": value for key, value in judge.format_metrics().items()},
                       **({f"meta_verifier/{key}": value for key, value in meta_verifier.format_metrics().items()}
                          if meta_verifier is not None else {}),
                       "train/learning_rate": float(schedule((step + 1) * updates_per_step - 1))}
            if sampled.records is not None and sampled.logs_rollouts:
                if jax.process_index() == 0:  # its share of the rollouts (docs/multihost.md)
                    write_judged_rollouts(rollout_log_path(out, step + 1), sampled.records)
                metrics["rollout_log/records"] = len(sampled.records)
            if sampled.records is not None:
                writer.write_samples(step + 1, samples_of(sampled.records, config.rollout_log.samples_per_step))
            if config.eval.every_steps and (step + 1) % config.eval.every_steps == 0:
                with timer.phase("eval"):
                    shown = FirstJudged(config.eval.log_samples, f"eval-{step + 1}", step + 1)
                    metrics.update(evaluate(engine, tokenizer, task, judge, eval_examples, config.eval,
                                            max_new_tokens=rollout.max_new_tokens, seed=config.seed,
                                            recipes=(config.algorithm.name,), on_judged=shown))
                    metrics.update(evaluate_benchmarks(engine, tokenizer, benchmarks, config.eval,
                                                       max_new_tokens=rollout.max_new_tokens, seed=config.seed,
                                                       recipes=(config.algorithm.name,)))
                writer.write_samples(step + 1, samples_of(shown.records, shown.count), phase="eval")
            stopping = stop.stops_after(step, config.steps)
            if (step + 1) % config.checkpoint.every_steps == 0 or step + 1 == config.steps or stopping:
                with timer.phase("checkpoint"):
                    if pending is not None:
                        save_pending(out, step + 1, pending, min(checkpointer.all_steps(), default=step + 1))
                    meta = {"step": step + 1, "seed": config.seed, "data_position": stream.dataset.position,
                            "algorithm_state": algorithm.state_dict(), "metrics": {**metrics, **timer.metrics()}}
                    checkpointer.save(step + 1, state.tree(), meta)
            metrics.update(timer.metrics())
            metrics["time/step"] = time.monotonic() - step_started  # wall time: the phases and what lies between
            writer.write(step + 1, metrics)
            if stopping:
                checkpointer.wait()
                raise stop.interruption(step, config.steps, out / "checkpoints")
    runs.save_outputs(out, graphdef, state.params, tokenizer, RL_PLOTS if config.metrics.plots else None)
    return metrics
