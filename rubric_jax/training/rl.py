"""The RL loop (`rubric-jax train`): after the setup (`_train_rl`: launch checks, the model, the learner and its
state, a checkpoint restored, the engines, the recipe's context), for each step (`_Run.step`)

  1. the next `prompts_per_step` examples of the task's train stream
  2. experience = algorithm.experience(...)          rollouts (engine) -> judges -> rewards -> token advantages
                                                      (`experience.sample_experience`);
                                                      a recipe that re-samples (dynamic_sampling resample) draws
                                                      its further generation batches from the same stream
                                                      (`RolloutContext.stream`, `algorithms.base.dynamic_groups`)
  3. old logprobs recomputed by the learner           (`learner.learn`, which makes step 4 too; and the frozen
                                                      reference's, for a KL penalty); the engine's logprobs
                                                      stay in the batch ("rollout_logp_bt")
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
     every step its first `rollout_log.samples_per_step` judged rollouts (both `run_files.write_step_rollouts`),
     and every evaluation its first `eval.log_samples`, as samples to read (samples.jsonl and TensorBoard text,
     phase "train" or "eval"); metrics (`_Run.step_metrics`: metrics.jsonl, TensorBoard, and the console with the
     recipe's `console_metrics` after the default keys) and, every `checkpoint.every_steps` and at the end, an
     orbax checkpoint of params, optimizer state, reference, data position, algorithm state and the step's
     metrics. At the end, the plots of RL_PLOTS and the recipe's `plot_panels`.

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
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import jax

from rubric_jax.algorithms.base import Algorithm, RolloutContext
from rubric_jax.algorithms.registry import algorithm_class
from rubric_jax.inference.engine import SamplingParams
from rubric_jax.judges.records import FirstJudged, RecordingJudge
from rubric_jax.models import sharding
from rubric_jax.training import assembly, data_parallel, multihost, policy, runs
from rubric_jax.training.accounting import RunCosts
from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.evaluate import evaluate, evaluate_benchmarks
from rubric_jax.training.experience import SampledExperience, request_metrics, sample_experience
from rubric_jax.training.failure_budget import FailureBudget, judge_failure_budget, rollout_failure_budget
from rubric_jax.training.launch import check_frozen_engine, check_llm_roles, check_rubric_width, prompt_refusal
from rubric_jax.training.learner import Learner, learn
from rubric_jax.training.metrics import DEFAULT_CONSOLE_KEYS, MetricsWriter, PhaseTimer
from rubric_jax.training.optim import make_optimizer, schedule_mismatch
from rubric_jax.training.run_config import RLConfig, resolve_algorithm
from rubric_jax.training.run_files import drop_rollout_logs_after, resume_pending, samples_of, save_pending, \
    write_step_rollouts
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


def console_keys(algorithm: Algorithm) -> tuple[str, ...]:
    """The keys of the run's console line: the default ones (`metrics.DEFAULT_CONSOLE_KEYS`), then the recipe's
    own (`Algorithm.console_metrics`), each once."""
    return tuple(dict.fromkeys((*DEFAULT_CONSOLE_KEYS, *algorithm.console_metrics)))


def plot_panels(algorithm: Algorithm) -> dict[str, tuple[str, ...]]:
    """The run's plots: RL_PLOTS and the recipe's own panels (`Algorithm.plot_panels`; a recipe's panel of the
    name of one of RL_PLOTS replaces it)."""
    return {**RL_PLOTS, **algorithm.plot_panels}


def train_rl(config: RLConfig, task: Any, *, judge=None, model=None, tokenizer=None,
             benchmarks: Optional[Mapping[str, tuple[Any, list]]] = None) -> dict[str, float]:
    """`_train_rl`, whose launch, refused before its first step completes (a prompt over the context, a server
    that stops answering), leaves output_dir as it found it (`runs.undo_failed_launch`). A multi-process job
    (docs/multihost.md) is joined first, with the run's timeouts (`multihost.initialize`), and a process that
    fails alone leaves it at exit (`multihost.failures_leave_the_job`)."""
    multihost.initialize(config.distributed)
    with multihost.failures_leave_the_job(), runs.undo_failed_launch(Path(config.output_dir)):
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
    # Before anything else: hosts given different runs, or output directories of their own, stop here.
    multihost.check_same_config(config)
    multihost.check_shared_directory(Path(config.output_dir), config.distributed.shared_dir_timeout_s)
    _check_benchmarks(config, benchmarks)
    algorithm_config, config = resolve_algorithm(config)
    algorithm = _checked_algorithm(config, algorithm_config, task)
    clients = _open_clients(config, task, judge)
    _refuse_launch(config, algorithm, task, model, tokenizer, clients)
    mesh = policy.make_mesh(config.learner.mesh)
    if model is None:
        model, tokenizer = policy.build_policy(config.model, task, mesh)
    out = _start_output_dir(config)
    _warn_of_schedule_mismatches(config, algorithm)
    learner, state = _init_learner(config, algorithm, model, mesh)
    # Taken before the restore: a resumed run's frozen role still samples from the initial policy.
    initial_params = policy.copy_params(state.params) if algorithm.needs_frozen_engine else None
    checkpointer = runs.open_checkpoints(out, config.checkpoint)
    state, meta, pending = _restore(checkpointer, state, algorithm, config, out)
    start = meta["step"] if meta else 0
    engine = assembly.make_engine(config, policy.rollout_model(learner.graphdef, state.params, config.rollout.engine,
                                                               tensor=config.rollout.tensor_parallel),
                                  tokenizer, f"step-{start}")
    frozen_engine = _frozen_engine(config, learner.graphdef, initial_params, tokenizer)
    del initial_params  # the embedded frozen engine holds its own reference; a frozen server has them on disk
    recorder = RecordingJudge(clients.judge)  # the recipe's judge; evaluation and the request counts use the judge
    context = _rollout_context(config, task, engine, frozen_engine, tokenizer, recorder, clients.meta_verifier,
                               meta["data_position"] if meta else 0)
    run = _Run(config=config, task=task, algorithm=algorithm, out=out, learner=learner, state=state,
               context=context, recorder=recorder, judge=clients.judge, benchmarks=benchmarks,
               eval_examples=task.eval_examples(config.eval.num_examples) if config.eval.every_steps else [],
               writer=runs.open_metrics(out, config.metrics, config.steps, meta, console_keys(algorithm)),
               checkpointer=checkpointer, pending=pending,
               costs=RunCosts({"judge": config.judge.price_per_million_tokens,
                               "meta_verifier": config.meta_verifier.price_per_million_tokens},
                              meta["metrics"] if meta else {}))
    metrics: dict[str, float] = {}
    with _running(run, clients, frozen_engine) as (background, stop):
        for step in range(start, config.steps):
            metrics = run.step(step, background, stop)
    runs.save_outputs(out, learner.graphdef, state.params, tokenizer,
                      plot_panels(algorithm) if config.metrics.plots else None)
    return metrics


def _check_benchmarks(config: RLConfig, benchmarks: Mapping[str, Any]) -> None:
    """ValueError when a run that evaluates is not given exactly `config.eval.benchmarks`' benchmarks (and one
    that does not evaluate, any)."""
    evaluated = set(config.eval.benchmarks) if config.eval.every_steps else set()
    if set(benchmarks) != evaluated:
        raise ValueError(f"eval.benchmarks names {sorted(evaluated)} but the run was given the benchmarks "
                         f"{sorted(benchmarks)}: read them with training.assembly.benchmark_tasks")


def _checked_algorithm(config: RLConfig, algorithm_config: Any, task: Any) -> Algorithm:
    """The run's recipe, once the task's rubrics fit its width (`check_rubric_width`) and it can run as
    configured: in this many processes, with or without overlap, with the frozen engine it needs."""
    check_rubric_width(algorithm_config, task)
    algorithm = algorithm_class(config.algorithm.name)(algorithm_config)
    data_parallel.check_recipe(algorithm)
    data_parallel.check_overlap(algorithm, config.rollout.overlap)
    check_frozen_engine(algorithm, config)
    return algorithm


@dataclasses.dataclass(frozen=True)
class _Clients:
    """The run's judge (`owned` when the run built it from `config.judge`, and so closes it) and its LLM
    meta-verifier (None without one; always the run's own)."""

    judge: Any
    owned: bool
    meta_verifier: Any

    def to_close(self) -> list:
        """The clients the run closes, the judge first."""
        return ([self.judge] if self.owned else []) + ([self.meta_verifier] if self.meta_verifier is not None else [])


def _open_clients(config: RLConfig, task: Any, judge: Any) -> _Clients:
    """`judge`, else the config's (`make_judge`), and the config's meta-verifier (`make_meta_verifier`)."""
    owned = judge is None
    judge = assembly.make_judge(config.judge, task, config.seed) if owned else judge
    return _Clients(judge, owned, assembly.make_meta_verifier(config.meta_verifier, config.seed))


def _refuse_launch(config: RLConfig, algorithm: Algorithm, task: Any, model: Any, tokenizer: Any,
                   clients: _Clients) -> None:
    """Before anything is written: a relaunch that would rewrite a run's history (checked first: it needs neither
    the model nor a server), a prompt the model cannot sample, or a server that cannot be reached or whose
    answers do not parse, stops the launch (RunStopped) with nothing changed on disk and the run's clients
    closed."""
    try:
        runs.check_relaunch(Path(config.output_dir), config, lambda saved: resolve_algorithm(saved)[1])
        if (refusal := prompt_refusal(algorithm, task, config, model, tokenizer)) is not None:
            raise RunStopped(refusal)
        check_llm_roles(clients.judge if clients.owned else None, clients.meta_verifier, task, config.judge.format)
    except BaseException:
        for client in clients.to_close():
            client.close()
        raise


def _start_output_dir(config: RLConfig) -> Path:
    """The run's output directory, created, with its config.yaml (written by process 0). Only called once the
    judge answers, the history is checked and the model is built: a launch that fails before has written
    nothing."""
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:
        save_config(config, out / "config.yaml")
    return out


def _warn_of_schedule_mismatches(config: RLConfig, algorithm: Algorithm) -> None:
    """Logs a warning for the policy's (and the critic's) learning-rate schedule that does not fit the run's
    updates (`schedule_mismatch`)."""
    run_updates = config.steps * config.learner.epochs * config.learner.mini_batches
    for section, optimizer_config in (("optimizer", config.optimizer),
                                      *((("critic.optimizer", config.critic.optimizer),) if algorithm.uses_critic
                                        else ())):
        if (warning := schedule_mismatch(optimizer_config, run_updates, section)) is not None:
            _LOG.warning(warning)


def _init_learner(config: RLConfig, algorithm: Algorithm, model: Any, mesh: Any
                  ) -> tuple[Learner, policy.LearnerState]:
    """The run's learner and its fresh state on `mesh`: the policy's params and optimizer state, the frozen
    reference for a recipe that needs one, and the critic's params and optimizer state for one that uses it."""
    optimizer = make_optimizer(config.optimizer)
    graphdef, state = policy.init_learner_state(model, optimizer, mesh, algorithm.needs_reference)
    critic_graphdef = critic_optimizer = None
    if algorithm.uses_critic:
        critic_optimizer = make_optimizer(config.critic.optimizer)
        critic_graphdef, state.critic_params, state.critic_opt_state = policy.init_critic(
            graphdef, state.params, critic_optimizer, mesh)
    learner = Learner(config, algorithm, graphdef, state, optimizer, mesh, sharding.partition_rules(model.config),
                      critic_graphdef, critic_optimizer)
    return learner, state


def _restore(checkpointer: Checkpointer, state: policy.LearnerState, algorithm: Algorithm, config: RLConfig,
             out: Path) -> tuple[policy.LearnerState, Optional[dict], Optional[SampledExperience]]:
    """(state, checkpoint meta, pending experience) of the run resumed from its latest checkpoint
    (`runs.restore_latest`), the recipe's state restored and the rollout files of later steps deleted; (`state`,
    None, None) for a fresh run."""
    state, meta = runs.restore_latest(checkpointer, state, config.checkpoint, config.seed)
    if not meta:
        return state, None, None
    algorithm.load_state_dict(meta["algorithm_state"])
    if jax.process_index() == 0:
        drop_rollout_logs_after(out, meta["step"])
    return state, meta, resume_pending(out, meta["step"])


def _frozen_engine(config: RLConfig, graphdef: Any, initial_params: Any, tokenizer: Any) -> Any:
    """The engine of a recipe's frozen role, sampling the initial policy `initial_params` (`make_frozen_engine`);
    None when the recipe has none (`initial_params` None)."""
    if initial_params is None:
        return None
    return assembly.make_frozen_engine(config, policy.rollout_model(graphdef, initial_params, config.rollout.engine,
                                                                    tensor=config.rollout.tensor_parallel),
                                       tokenizer)


def _rollout_context(config: RLConfig, task: Any, engine: Any, frozen_engine: Any, tokenizer: Any,
                     recorder: RecordingJudge, meta_verifier: Any, position: int) -> RolloutContext:
    """What the recipe samples and judges with: the engines, the recording judge, the meta-verifier, the
    sampling settings and the task's train stream from `position`, read one step's share at a time."""
    rollout = config.rollout
    _, pad_id = policy.eos_and_pad(tokenizer)
    return RolloutContext(
        engine=engine, tokenizer=tokenizer, task=task, judge=recorder, pad_id=pad_id, seed=config.seed,
        timer=PhaseTimer(),
        sampling=SamplingParams(max_new_tokens=rollout.max_new_tokens, n=rollout.group_size,
                                temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k),
        chat_template_kwargs=config.model.chat_template_kwargs,
        max_prompt_tokens=rollout.max_prompt_tokens, prompt_truncation=rollout.prompt_truncation,
        frozen_engine=frozen_engine, meta_verifier=meta_verifier, pipelined_judging=rollout.pipelined_judging,
        # Read by one thread at a time (`_Run.sample`, here or in the overlap thread), so its order is the run's.
        stream=data_parallel.StepStream(task.train_stream(position), rollout.prompts_per_step))


@contextlib.contextmanager
def _running(run: "_Run", clients: _Clients, frozen_engine: Any
             ) -> Iterator[tuple[concurrent.futures.ThreadPoolExecutor, runs.StopRequests]]:
    """While the steps run: the metrics writer, the checkpointer and the engine open; the run's own judge, frozen
    engine and meta-verifier closed after the steps; the thread that samples ahead (`RolloutConfig.overlap`),
    and the stop requests (`runs.StopRequests`)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(run.writer)
        stack.enter_context(run.checkpointer)
        stack.enter_context(contextlib.closing(run.engine))
        if clients.owned:
            stack.callback(clients.judge.close)
        if frozen_engine is not None:
            stack.callback(frozen_engine.close)
        if clients.meta_verifier is not None:
            stack.callback(clients.meta_verifier.close)
        # Exits before them: a sampling job in flight ends before the engine and judges close.
        background = stack.enter_context(concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollouts"))
        yield background, stack.enter_context(runs.StopRequests())


@dataclasses.dataclass
class _Run:
    """A run's parts as its steps use them, and its step (`step`: steps 1-6 of the module docstring)."""

    config: RLConfig
    task: Any
    algorithm: Algorithm
    out: Path
    learner: Learner
    state: policy.LearnerState  # updated in place by each step
    context: RolloutContext
    recorder: RecordingJudge  # the context's judge
    judge: Any  # the judge itself: evaluation and the request counts
    benchmarks: Mapping[str, tuple[Any, list]]
    eval_examples: list
    writer: MetricsWriter
    checkpointer: Checkpointer
    pending: Optional[SampledExperience]  # the next step's experience, when sampled ahead (`RolloutConfig.overlap`)
    costs: RunCosts  # the priced roles' costs, the run's totals carried from the checkpoint it resumed
    budgets: tuple[FailureBudget, ...] = dataclasses.field(init=False)
    data_metrics: dict[str, float] = dataclasses.field(init=False)
    requests_seen: dict[str, dict[str, int]] = dataclasses.field(init=False)  # each HTTP client's reported counts

    def __post_init__(self):
        self.budgets = (judge_failure_budget(self.config.judge), rollout_failure_budget(self.config.rollout))
        self.data_metrics = self.task.data_metrics() if hasattr(self.task, "data_metrics") else {}
        self.requests_seen = {"judge": {}, "meta_verifier": {}, "engine": {}}

    @property
    def engine(self) -> Any:
        return self.context.engine

    @property
    def timer(self) -> PhaseTimer:
        """The phases of the step (the context's; `sample_experience` times its sampling on a timer of its own)."""
        return self.context.timer

    def step(self, step: int, background: concurrent.futures.ThreadPoolExecutor, stop: runs.StopRequests
             ) -> dict[str, float]:
        """Step `step` (0-based) of the module docstring, with the next step's experience sampled ahead in
        `background` (`RolloutConfig.overlap`); writes and returns its metrics line. RunInterrupted, once the step
        is checkpointed, when `stop` says so."""
        self.timer.reset()
        step_started = time.monotonic()
        sampled = self.step_experience(step)
        upcoming = self.sample_ahead(step, background)
        for budget in self.budgets:
            budget.observe(sampled.metrics, step + 1)
        learned = learn(self.learner, self.state, sampled.experience, step, self.context.pad_id, self.timer)
        self.wait_for(upcoming)
        self.sync(step)
        metrics = self.step_metrics(step, sampled, learned)
        metrics.update(write_step_rollouts(self.out, self.writer, step + 1, sampled,
                                           self.config.rollout_log.samples_per_step))
        metrics.update(self.evaluate_when_due(step))
        stopping = stop.stops_after(step, self.config.steps)
        if (step + 1) % self.config.checkpoint.every_steps == 0 or step + 1 == self.config.steps or stopping:
            self.save_checkpoint(step, metrics)
        metrics.update(self.timer.metrics())
        metrics["time/step"] = time.monotonic() - step_started  # wall time: the phases and what lies between
        self.writer.write(step + 1, metrics)
        if stopping:
            self.checkpointer.wait()
            raise stop.interruption(step, self.config.steps, self.out / "checkpoints")
        return metrics

    def sample(self, step: int, weight_step: int) -> SampledExperience:
        """Steps 1 and 2: step `step`'s experience of the stream's next examples, from the engine's weights
        (`weight_step` updates)."""
        log_every = self.config.rollout_log.every_steps
        examples = self.context.stream.next_share(self.config.rollout.prompts_per_step)
        return sample_experience(self.algorithm, examples, self.context, self.recorder, step, weight_step,
                                 logs_rollouts=bool(log_every) and (step + 1) % log_every == 0,
                                 keeps_samples=self.config.rollout_log.samples_per_step > 0)

    def step_experience(self, step: int) -> SampledExperience:
        """Step `step`'s experience: the one sampled ahead (the previous step's overlap, or a resumed
        checkpoint's pending file), else sampled now from the weights of `step` updates."""
        sampled, self.pending = self.pending, None
        return sampled if sampled is not None else self.sample(step, step)

    def sample_ahead(self, step: int, background: concurrent.futures.ThreadPoolExecutor
                     ) -> Optional[concurrent.futures.Future]:
        """With overlap and a step after `step`: that step's experience, sampled in `background` from the weights
        of `step` updates while the learner makes update step + 1 (module docstring)."""
        if not self.config.rollout.overlap or step + 1 >= self.config.steps:
            return None
        return background.submit(self.sample, step + 1, step)

    def wait_for(self, upcoming: Optional[concurrent.futures.Future]) -> None:
        """Takes the experience sampled ahead as the next step's, timing as "rollout_wait" the part of its
        sampling the update did not hide."""
        if upcoming is not None:
            with self.timer.phase("rollout_wait"):
                self.pending = upcoming.result()

    def sync(self, step: int) -> None:
        """Step 5: the policy's weights after step `step` to the engine, as version "step-<step + 1>"."""
        with self.timer.phase("sync"):
            self.engine.update_weights(
                policy.rollout_model(self.learner.graphdef, self.state.params, self.config.rollout.engine,
                                     tensor=self.config.rollout.tensor_parallel),
                f"step-{step + 1}")

    def step_metrics(self, step: int, sampled: SampledExperience, learned: dict[str, float]) -> dict[str, float]:
        """Step `step`'s metrics line before its rollout log, evaluation and times: the task's data metrics, the
        experience's (`SampledExperience.metrics`), the learner's (`learner.learn`), the step's HTTP requests of
        the judge, the meta-verifier and the engine (`request_metrics`), the judge's and the meta-verifier's
        format metrics and costs (`accounting.RunCosts`), and the learning rate."""
        meta_verifier = self.context.meta_verifier
        clients = {"judge": self.judge, "meta_verifier": meta_verifier, "engine": self.engine}
        requests = {key: value for name, client in clients.items()
                    for key, value in request_metrics(name, client.http_stats() if client is not None else None,
                                                      self.requests_seen[name]).items()}
        return {**self.data_metrics, **sampled.metrics, **learned, **requests,
                **{f"judge/{key}": value for key, value in self.judge.format_metrics().items()},
                **({f"meta_verifier/{key}": value for key, value in meta_verifier.format_metrics().items()}
                   if meta_verifier is not None else {}),
                **self.costs.step(sampled.metrics), "train/learning_rate": self.learner.learning_rate(step)}

    def evaluate_when_due(self, step: int) -> dict[str, float]:
        """Every `eval.every_steps`: the held-out examples' and the benchmarks' metrics after step `step`, its
        first `eval.log_samples` judged as samples to read; {} on other steps."""
        every = self.config.eval.every_steps
        if not every or (step + 1) % every:
            return {}
        max_new_tokens, recipes = self.config.rollout.max_new_tokens, (self.config.algorithm.name,)
        tokenizer = self.context.tokenizer
        with self.timer.phase("eval"):
            shown = FirstJudged(self.config.eval.log_samples, f"eval-{step + 1}", step + 1)
            metrics = {**evaluate(self.engine, tokenizer, self.task, self.judge, self.eval_examples, self.config.eval,
                                  max_new_tokens=max_new_tokens, seed=self.config.seed, recipes=recipes,
                                  on_judged=shown, judge_price=self.config.judge.price_per_million_tokens),
                       **evaluate_benchmarks(self.engine, tokenizer, self.benchmarks, self.config.eval,
                                             max_new_tokens=max_new_tokens, seed=self.config.seed, recipes=recipes)}
        self.writer.write_samples(step + 1, samples_of(shown.records, shown.count), phase="eval")
        return metrics

    def save_checkpoint(self, step: int, metrics: dict[str, float]) -> None:
        """The checkpoint of step `step` + 1: state, data position, the recipe's state and the metrics so far, and
        the experience sampled ahead (`save_pending`, written first), timed as "checkpoint"."""
        with self.timer.phase("checkpoint"):
            if self.pending is not None:
                save_pending(self.out, step + 1, self.pending, min(self.checkpointer.all_steps(), default=step + 1))
            meta = {"step": step + 1, "seed": self.config.seed, "data_position": self.context.stream.dataset.position,
                    "algorithm_state": self.algorithm.state_dict(), "metrics": {**metrics, **self.timer.metrics()}}
            self.checkpointer.save(step + 1, self.state.tree(), meta)
