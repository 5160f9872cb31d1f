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
import logging
import time
from pathlib import Path
from typing import Any, Mapping, Optional

import jax

from rubric_jax.algorithms.base import RolloutContext
from rubric_jax.algorithms.registry import algorithm_class
from rubric_jax.inference.engine import SamplingParams
from rubric_jax.judges.records import FirstJudged, RecordingJudge, write_judged_rollouts
from rubric_jax.models import sharding, train_step
from rubric_jax.training import data_parallel, policy, runs
from rubric_jax.training.assembly import make_engine, make_frozen_engine, make_judge, make_meta_verifier
from rubric_jax.training.evaluate import evaluate, evaluate_benchmarks
from rubric_jax.training.experience import SampledExperience, request_metrics, sample_experience
from rubric_jax.training.failure_budget import JudgeFailureBudget
from rubric_jax.training.launch import check_frozen_engine, check_llm_roles, check_rubric_width, prompt_refusal
from rubric_jax.training.learner import Learner, critic_advantages, critic_metrics, mismatch_metrics, update_policy
from rubric_jax.training.metrics import PhaseTimer
from rubric_jax.training.optim import learning_rate_schedule, make_optimizer, schedule_mismatch
from rubric_jax.training.run_config import RLConfig, resolve_algorithm
from rubric_jax.training.run_files import (drop_rollout_logs_after, resume_pending, rollout_log_path, samples_of,
                                           save_pending)
from rubric_jax.training.runs import RunStopped
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
    (`training.assembly.benchmark_tasks`, which `rubric-jax train` calls), evaluated with the held-out rows;
    ValueError, before anything runs, when a run that evaluates is not given exactly the section's benchmarks."""
    sharding.maybe_initialize_distributed()  # a multi-process job (docs/multihost.md), before any computation
    evaluated = set(config.eval.benchmarks) if config.eval.every_steps else set()
    if set(benchmarks) != evaluated:
        raise ValueError(f"eval.benchmarks names {sorted(evaluated)} but the run was given the benchmarks "
                         f"{sorted(benchmarks)}: read them with training.assembly.benchmark_tasks")
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
    learner = Learner(config, algorithm, graphdef, state, optimizer, mesh, rules, critic_graphdef, critic_optimizer)
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
            critic_step = {}
            if learner.has_critic:
                with timer.phase("values"):
                    _, values = learner.critic_steps(width)
                    batch = critic_advantages(batch, sharding.process_rows(values(state.critic_params, inputs), mesh),
                                              config.critic)
                critic_step = {**critic_metrics(batch),
                                  "critic/learning_rate": float(critic_schedule((step + 1) * updates_per_step - 1))}
            with timer.phase("update"):
                train_metrics = update_policy(learner, state, batch, width, step, config.seed)
                jax.block_until_ready(state.params)
            mismatch = (mismatch_metrics(batch, batch["old_logp_bt"]) if recomputes_old_logprobs
                                else {"mismatch/k3": train_metrics.pop("train/mismatch_k3")})
            if upcoming is not None:
                with timer.phase("rollout_wait"):  # the part of the next step's sampling the update did not hide
                    pending = upcoming.result()
            with timer.phase("sync"):
                engine.update_weights(policy.rollout_model(graphdef, state.params, rollout.engine), f"step-{step + 1}")
            metrics = {**data_metrics, **sampled.metrics, **train_metrics, **critic_step, **mismatch,
                       **request_metrics("judge", judge.http_stats(), judge_requests_seen),
                       **request_metrics("meta_verifier",
                                          meta_verifier.http_stats() if meta_verifier is not None else None,
                                          meta_verifier_requests_seen),
                       **request_metrics("engine", engine.http_stats(), engine_requests_seen),
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
