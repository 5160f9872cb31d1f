"""The run configs, YAML sections as frozen dataclasses (`yaml_config.load_config(RLConfig, path, overrides)`):
`RLConfig` (`rubric-jax train`), `SFTConfig` (`rubric-jax sft`), `QuickstartConfig` (`rubric-jax quickstart`,
which derives one SFT and one RL run from it).

Everything that can be checked without compute is checked on construction, so a bad config fails before a
model is built: each section validates its own fields, and the top-level configs check the combinations
(batch divisibility by micro-batches and the mesh, a sampling temperature that would make every group
identical, a missing SGLang URL, ...). `resolve_algorithm` reads `algorithm.params` into the recipe's own config
class, so that its unknown keys and wrong types are errors too (`check_run_config` runs every check). Errors are
ValueErrors naming the full key.
"""

import dataclasses
import math
import re
from typing import Any, Literal, Optional

from rubric_jax.algorithms.base import StepShape
from rubric_jax.algorithms.registry import algorithm_class, import_recipe_modules
from rubric_jax.inference.engine import SamplingParams
from rubric_jax.judges.llm import check_credentials, check_request_options
from rubric_jax.training.optim import OptimizerConfig
from rubric_jax.yaml_config import config_from_dict, config_to_dict, merged


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclasses.dataclass(frozen=True)
class ModelInit:
    """A randomly initialised decoder built in code (the quickstart and tests), with the task's tokenizer.
    A "qwen3_moe" model has `num_experts` experts of width `moe_intermediate_size` in every layer, routing each
    token to `num_experts_per_tok` of them (renormalised, as Qwen3-30B-A3B); the other types ignore these three."""

    model_type: Literal["qwen3", "qwen2", "llama", "qwen3_moe"] = "qwen3"
    hidden_size: int = 64
    intermediate_size: int = 192
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    max_position_embeddings: int = 256
    tie_word_embeddings: bool = True
    num_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    seed: int = 0

    def __post_init__(self):
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "max_position_embeddings", "num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            _require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        _require(self.num_heads % self.num_kv_heads == 0,
                 f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        _require(self.num_experts_per_tok <= self.num_experts,
                 f"num_experts_per_tok ({self.num_experts_per_tok}) must be at most num_experts ({self.num_experts})")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Where the policy comes from: `path`, a local Hugging Face directory (weights and tokenizer), or `init`,
    a random model (the tokenizer then comes from the task). Exactly one of them.

    chat_template_kwargs: variables of the chat template for every prompt the policy is given (rollouts, SFT,
    evaluation), e.g. {"enable_thinking": false}: a Qwen3 template's non-thinking mode, which SRaR runs in.
    Nothing checks that the template reads them; a variable it does not read has no effect.

    attention: the learner's full-sequence attention (`models.attention`): "auto" (by backend: Pallas splash
    attention on TPU, XLA elsewhere: a run's float32 policy never gets cuDNN silently), "xla", "splash" or "cudnn"
    (CUDA GPUs; attention in bfloat16). `remat`: rematerialise each layer in the backward pass
    (less activation memory, one more forward pass of compute). `scan_layers`: the learner's passes loop over the
    layers' stacked parameters (`Decoder`): the same arithmetic, compiled once. `compute_dtype`: the learner's
    activations and matmul operands ("bfloat16": mixed precision as verl's FSDP runs it, parameters, optimizer
    state, logprobs and losses staying float32; half the activation memory of "float32", the default)."""

    path: Optional[str] = None
    init: Optional[ModelInit] = None
    chat_template_kwargs: dict = dataclasses.field(default_factory=dict)
    attention: Literal["auto", "xla", "splash", "cudnn"] = "auto"
    remat: bool = False
    scan_layers: bool = False
    compute_dtype: Literal["float32", "bfloat16"] = "float32"

    def __post_init__(self):
        _require((self.path is None) != (self.init is None), "exactly one of model.path and model.init must be set")
        _require(all(isinstance(k, str) and k.isidentifier() for k in self.chat_template_kwargs),
                 f"model.chat_template_kwargs keys must be template variable names, got "
                 f"{list(self.chat_template_kwargs)}")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """A task of `rubric_jax.data` by name, its own parameters, and the seed of its example streams."""

    name: str = "arithmetic"
    seed: int = 0
    params: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """The learner's device mesh (`sharding.make_mesh`): data x fsdp x expert x tensor devices ("expert" shards a
    mixture of experts' expert weights and splits the batch like "data"; `models.sharding`)."""

    data: int = 1
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1

    def __post_init__(self):
        for name in ("data", "fsdp", "tensor", "expert"):
            _require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def batch_shards(self) -> int:
        return self.data * self.fsdp * self.expert

    @property
    def devices(self) -> int:
        return self.batch_shards * self.tensor


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Sampling: `prompts_per_step` prompts, `group_size` samples each, from the embedded engine or an SGLang
    server at `sglang_url`.

    `max_prompt_tokens` caps every prompt of every role (None: no cap; the papers' "max prompt length"): a longer
    one is cut as `prompt_truncation` says (`algorithms.base.truncate_prompt`: verl's modes) and counted in the
    metric "prompt/truncated". `frozen_sglang_url`: a second SGLang server for a recipe that samples a role from
    the frozen initial policy (`Algorithm.needs_frozen_engine`); it is sent the initial weights once and never
    updated, so it must not be the policy's server. The embedded engine makes its frozen copy in process.
    `decode_slots`: the embedded engine's decode slots (rows decoded at once, by continuous batching; None: a
    call's rows rounded up to a power of two, at most 256; `inference.embedded.EmbeddedEngine`).
    `tensor_parallel`: the embedded engine's decode layout (`models.sharding.decode_mesh`): each process samples its
    prompts on all of its devices, the weights split over `tensor_parallel` of them (None: as many as divide both
    a process's devices and the model's key/value heads), rows over the rest. The samples do not depend on it
    (up to float summation order: relaunch-safe).

    `overlap`: sample (and judge) step n + 1's experience in a background thread while the learner updates on
    step n's, from the weights before that update: every batch after the first is one policy version old
    (metrics "rollout/policy_lag", "rollout/weight_step"), so a `rollout_correction` (TIS, ICEPOP) should
    weight it. The run stays a function of (seed, step), and a checkpoint keeps the experience sampled ahead
    (`training.rl`). Either engine works; the embedded one shares the learner's devices, so only an SGLang
    server gains time.

    `pipelined_judging`: a group's judge requests are sent as soon as the engine finishes the group, while later
    groups are still sampling (`algorithms.base.sample_and_judge`); false judges once every group is sampled. The
    batches, verdicts and advantages are the same either way (relaunch-safe); only the step's time differs.

    A failed sample (aborted by the server, a NaN met, its request failed for good: `inference.engine.Sample`) is
    kept out of the loss and its group handled as a judge failure is (`algorithms.base.judge_requests`), counted
    in "rollout/failed/<reason>" and "rollout/failure_rate"; a rate above `max_failure_rate` on
    `max_failing_steps` consecutive steps stops the run (`training.failure_budget`; 1.0 turns that off)."""

    engine: Literal["embedded", "sglang"] = "embedded"
    sglang_url: Optional[str] = None
    frozen_sglang_url: Optional[str] = None
    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 64
    max_prompt_tokens: Optional[int] = None
    prompt_truncation: Literal["error", "left", "right", "middle"] = "middle"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    decode_slots: Optional[int] = None
    tensor_parallel: Optional[int] = None
    overlap: bool = False
    pipelined_judging: bool = True
    max_failure_rate: float = 0.5
    max_failing_steps: int = 3

    def __post_init__(self):
        _require(0 <= self.max_failure_rate <= 1, f"rollout.max_failure_rate must be in [0, 1], got "
                                                  f"{self.max_failure_rate}")
        _require(self.max_failing_steps >= 1, f"rollout.max_failing_steps must be >= 1, got {self.max_failing_steps}")
        for name in ("prompts_per_step", "group_size", "max_new_tokens"):
            _require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        _require(self.decode_slots is None or self.decode_slots >= 1,
                 f"decode_slots must be None (chosen per call) or >= 1, got {self.decode_slots}")
        _require(self.tensor_parallel is None or self.tensor_parallel >= 1,
                 f"tensor_parallel must be None (chosen by the devices) or >= 1, got {self.tensor_parallel}")
        _require(self.max_prompt_tokens is None or self.max_prompt_tokens >= 1,
                 f"max_prompt_tokens must be None (no cap) or >= 1, got {self.max_prompt_tokens}")
        _require((self.engine == "sglang") == (self.sglang_url is not None),
                 "sglang_url is required by engine sglang, and only by it")
        _require(self.frozen_sglang_url is None or self.engine == "sglang",
                 "frozen_sglang_url is for engine sglang only (the embedded engine copies the initial weights)")
        _require(self.frozen_sglang_url is None or self.frozen_sglang_url != self.sglang_url,
                 "frozen_sglang_url must be a second server: the policy's server is sent every step's weights")
        _require(self.temperature > 0 or self.group_size == 1,
                 f"temperature 0 makes the {self.group_size} samples of a group identical, so every advantage "
                 "would be 0; sample with temperature > 0")

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """PPO-style updates per rollout batch: `epochs` passes, each over `mini_batches` optimizer updates, each
    accumulated exactly over `micro_batches`; `chunk_size` positions per logits chunk.

    `old_logprobs`: "recompute" runs the learner over the batch before its updates for the old logprobs;
    "detached" (one epoch of one mini-batch only: the one update then starts from the old policy) takes them as
    the update's own logprobs, detached (`train_step.with_detached_old_logprobs`), and skips that forward pass;
    the mismatch metric "mismatch/k3" is then the update's, and "mismatch/max_abs" is not logged.

    `forward_micro_batches`: the sequential micro-batches of the learner's passes without gradients over the whole
    step's rows (old and reference logprobs, the critic's old values; verl's log_prob_micro_batch_size); null
    (default) is `micro_batches`, so with one mini-batch a forward micro-batch has the train step's rows.

    `router_aux_loss_coef`: a mixture of experts' load-balancing loss, times this, added to the policy loss
    (`train_step.make_train_step`); 0 (default) leaves the routers to the RL loss alone, as verl does (transformers
    trains Qwen3-MoE with 0.001)."""

    epochs: int = 1
    mini_batches: int = 1
    micro_batches: int = 1
    forward_micro_batches: Optional[int] = None
    chunk_size: int = 256
    old_logprobs: Literal["recompute", "detached"] = "recompute"
    router_aux_loss_coef: float = 0.0
    mesh: MeshConfig = MeshConfig()

    def __post_init__(self):
        for name in ("epochs", "mini_batches", "micro_batches", "chunk_size"):
            _require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        _require(self.router_aux_loss_coef >= 0, f"router_aux_loss_coef must be >= 0, got {self.router_aux_loss_coef}")
        _require(self.forward_micro_batches is None or self.forward_micro_batches >= 1,
                 f"forward_micro_batches must be >= 1 or null, got {self.forward_micro_batches}")
        _require(self.old_logprobs == "recompute" or self.epochs == self.mini_batches == 1,
                 f"old_logprobs detached needs epochs = mini_batches = 1 (one update from the old policy), got "
                 f"epochs {self.epochs}, mini_batches {self.mini_batches}")

    @property
    def forward_splits(self) -> int:
        """The micro-batches of the passes without gradients (`forward_micro_batches`, default `micro_batches`)."""
        return self.micro_batches if self.forward_micro_batches is None else self.forward_micro_batches

    @property
    def row_multiple(self) -> int:
        """The row counts a step's batch must be a multiple of: every mini-batch's micro-batches and every forward
        micro-batch split evenly over the mesh's data * fsdp * expert shards."""
        return math.lcm(self.mini_batches * self.micro_batches, self.forward_splits) * self.mesh.batch_shards


@dataclasses.dataclass(frozen=True)
class CriticConfig:
    """PPO's critic, for a recipe that trains with one (`Algorithm.uses_critic`; ignored otherwise; verl's
    `critic` and `algorithm.gamma / lam`): a value model initialised from the policy's initial weights
    (`models.value`), updated on every mini-batch of the policy's updates by its own AdamW `optimizer` on the
    clipped value loss with range `value_clip` (aggregated like the policy loss); the recipe's token rewards become
    GAE(`gamma`, `lam`) advantages, whitened over the batch's response tokens when `whiten_advantages` (verl's
    defaults throughout: lr 1e-5, clip 0.5, gamma = lam = 1, whitening on)."""

    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=1e-5)
    value_clip: float = 0.5
    gamma: float = 1.0
    lam: float = 1.0
    whiten_advantages: bool = True

    def __post_init__(self):
        _require(self.value_clip >= 0, f"value_clip must be >= 0, got {self.value_clip}")
        for name in ("gamma", "lam"):
            _require(0 <= getattr(self, name) <= 1, f"{name} must be in [0, 1], got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
    """A recipe of `rubric_jax.algorithms` by name, and its config (the recipe's own config class).

    imports: the modules that define recipes of the user's own (module names, or paths of Python files relative
    to the current directory), imported when the config is read, before `name` is looked up
    (`registry.import_recipe_modules`; docs/extending.md): `rubric-jax train` then trains a recipe defined
    outside the package, e.g. `algorithm: {name: critz, imports: [my_recipes.critz]}`."""

    name: str = "rar"
    params: dict = dataclasses.field(default_factory=dict)
    imports: tuple[str, ...] = ()

    def __post_init__(self):
        import_recipe_modules(self.imports)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints every `every_steps` steps and at the end, the last `keep` kept, written in the
    background with `async_save`; `resume` continues from the output directory's latest checkpoint."""

    every_steps: int = 10
    keep: int = 3
    async_save: bool = True
    resume: bool = True

    def __post_init__(self):
        _require(self.every_steps >= 1, f"every_steps must be >= 1, got {self.every_steps}")
        _require(self.keep >= 1, f"keep must be >= 1, got {self.keep}")


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How a multi-process run (docs/multihost.md) joins and notices a failed host, in seconds.

    initialization_timeout_s: how long every process waits at launch for all of them to join (a pod's workers
    start minutes apart); then the launch fails, naming the missing process where it can
    (`jax.distributed.initialize(initialization_timeout=)`). heartbeat_timeout_s: a process that sends no
    heartbeat for this long (dead, frozen, or cut off from the network) fails the run on every process
    (`heartbeat_timeout_seconds`). shutdown_timeout_s: at the end, how long the processes wait for each other to
    finish, process 0 writing the final model meanwhile (`shutdown_timeout_seconds`). shared_dir_timeout_s: how
    long the other processes look for the token process 0 writes into output_dir at launch before they declare
    it not shared (a network filesystem's attribute cache can hide a new file for a while). JAX's defaults are
    300, 100 and 300; a pod's workers need the longer initialisation."""

    initialization_timeout_s: int = 600
    heartbeat_timeout_s: int = 100
    shutdown_timeout_s: int = 300
    shared_dir_timeout_s: int = 60

    def __post_init__(self):
        for name in ("initialization_timeout_s", "heartbeat_timeout_s", "shutdown_timeout_s", "shared_dir_timeout_s"):
            _require(isinstance(getattr(self, name), int) and getattr(self, name) >= 1,
                     f"{name} must be an int >= 1 (seconds), got {getattr(self, name)!r}")


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    """Where metrics go besides metrics.jsonl: TensorBoard events, a console line per step, PNG plots at the end."""

    tensorboard: bool = True
    console: bool = True
    plots: bool = True


# The fields of the eval section that say how it samples, which a benchmark may set for itself.
EVAL_SAMPLING_FIELDS = ("samples_per_example", "max_new_tokens", "temperature", "top_p", "presence_penalty",
                        "frequency_penalty", "repetition_penalty")
_BENCHMARK_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclasses.dataclass(frozen=True)
class EvalBenchmark:
    """One benchmark of the eval section (`EvalConfig.benchmarks`): the dataset preset `preset`
    (`rubric_jax.data.presets`) over the file or directory `path` (its `split`), its first `num_examples` usable
    rows in file order (null: all of them), scored by the preset's answer check alone: a benchmark measures
    accuracy, not rubric satisfaction, so a rubric column is not read, and a preset without answers is refused
    when the benchmark is read (`training.assembly.benchmark_tasks`, as `rubric-jax train` checks its task).
    `params`: task "dataset" params over the preset's, for a copy laid out otherwise (e.g. {columns: {prompt:
    problem}} for math-ai/aime25). Each sampling field (`EVAL_SAMPLING_FIELDS`) left null takes the eval
    section's value."""

    preset: str
    path: str
    split: str = "train"
    num_examples: Optional[int] = None
    params: dict = dataclasses.field(default_factory=dict)
    samples_per_example: Optional[int] = None
    max_new_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None

    def __post_init__(self):
        _require(bool(self.preset) and bool(self.path), "preset and path must name a dataset preset and its file")
        _require(self.num_examples is None or self.num_examples >= 1,
                 f"num_examples must be >= 1 or null (every row), got {self.num_examples}")

    def task_params(self) -> dict[str, Any]:
        """Task "dataset"'s params for this benchmark: `params` over the preset, the whole file held out, its
        rubrics not read."""
        return merged(self.params, {"preset": self.preset, "path": self.path, "split": self.split,
                                    "eval_path": self.path, "columns": {"rubric": None}})


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation: `num_examples` examples, `samples_per_example` samples each (avg@k, the mean accuracy
    over the k = samples_per_example samples of each example, and pass@k) at `temperature` (0: greedy, then k
    must be 1) and `top_p`, with the `presence_penalty`, `frequency_penalty` and `repetition_penalty` of
    `inference.engine.SamplingParams` (SGLang's, on the tokens each sample generates; none by default), up to
    `max_new_tokens` tokens (null: the rollouts' `rollout.max_new_tokens` in a run); every `every_steps` RL steps
    (0: only where a command asks for it). `log_samples` (0: off): the first judged samples of each evaluation,
    to read (as `RolloutLogConfig.samples_per_step`'s, with phase "eval"; `rubric-jax eval` prints them and puts
    them in its report).

    `benchmarks`: name -> `EvalBenchmark`, evaluated at each of the run's evaluations after the held-out rows, each
    with the section's sampling but for the fields it sets itself (`for_benchmark`), its metrics under
    "benchmark/<name>/..." (`training.evaluate.evaluate_benchmarks`): e.g. SRaR's Avg@32 on AIME 2024 is
    {aime24: {preset: aime24, path: ..., samples_per_example: 32}} and its metric "benchmark/aime24/accuracy".
    Names are letters, digits, "_", "-" and "."; `rubric-jax train` reads the benchmarks' files with the task's,
    before the run starts."""

    num_examples: int = 64
    samples_per_example: int = 1
    temperature: float = 0.0
    every_steps: int = 0
    log_samples: int = 2
    max_new_tokens: Optional[int] = None
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    benchmarks: dict[str, EvalBenchmark] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        _require(self.num_examples >= 1, f"num_examples must be >= 1, got {self.num_examples}")
        _require(self.samples_per_example >= 1, f"samples_per_example must be >= 1, got {self.samples_per_example}")
        _require(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        _require(self.temperature > 0 or self.samples_per_example == 1,
                 "greedy evaluation (temperature 0) gives one answer per example: samples_per_example must be 1")
        _require(self.every_steps >= 0, f"every_steps must be >= 0, got {self.every_steps}")
        _require(self.log_samples >= 0, f"log_samples must be >= 0 (0: off), got {self.log_samples}")
        _require(self.max_new_tokens is None or self.max_new_tokens >= 1,
                 f"max_new_tokens must be >= 1 or null (the rollouts'), got {self.max_new_tokens}")
        self.sampling_params(max_new_tokens=1, seed=0)  # top_p and the penalties in SGLang's ranges
        for name in self.benchmarks:
            _require(_BENCHMARK_NAME.fullmatch(name) is not None,
                     f"benchmarks: {name!r} is not a benchmark name (letters, digits, _ - . only)")
            try:
                self.for_benchmark(name)
            except ValueError as error:
                raise ValueError(f"benchmarks.{name}: {error}") from None

    def for_benchmark(self, name: str) -> "EvalConfig":
        """The section as benchmark `name` samples: the sampling fields it sets replace the section's (how many
        of its rows are evaluated is the benchmark's own `num_examples`: `training.assembly.benchmark_tasks`)."""
        benchmark = self.benchmarks[name]
        own = {field: getattr(benchmark, field) for field in EVAL_SAMPLING_FIELDS
               if getattr(benchmark, field) is not None}
        return dataclasses.replace(self, benchmarks={}, **own)

    def sampling_params(self, max_new_tokens: int, seed: int) -> SamplingParams:
        """The sampling of one evaluation call: the section's, up to its own `max_new_tokens` or, when it sets
        none, the caller's."""
        return SamplingParams(max_new_tokens=self.max_new_tokens or max_new_tokens, n=self.samples_per_example,
                              temperature=self.temperature, top_p=self.top_p, seed=seed,
                              presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                              repetition_penalty=self.repetition_penalty)


@dataclasses.dataclass(frozen=True)
class RolloutLogConfig:
    """Rollouts saved with their verdicts, for judge agreement (`rubric-jax judge-agreement`) and later analysis:
    every `every_steps` RL steps (0: never), the step's judge calls as JSONL (`judges.records`: one request and
    its verdict a line, ids "step-<n>/<i>" in judging order) in output_dir/rollouts/step_<n>.jsonl, n the step
    as in metrics.jsonl (step n: the rollouts sampled by the policy after n - 1 updates, whose rewards step n's
    update trained on), zero-padded to 6 digits. Whatever the recipe sends the judge in that step is saved
    (policy rollouts, refined responses); the step's evaluation is not. Each file is written atomically before
    the step's checkpoint, so a resumed run rewrites the files of the steps it re-runs.

    `samples_per_step` (0: off): every step, the first judged rollouts of the step as samples to read (question,
    response, each criterion's verdict, the rubric score and the judge's failure reason) in output_dir/samples.jsonl
    and TensorBoard's text tab (`MetricsWriter.write_samples`), with phase "train"."""

    every_steps: int = 0
    samples_per_step: int = 2

    def __post_init__(self):
        _require(self.every_steps >= 0, f"every_steps must be >= 0 (0: off), got {self.every_steps}")
        _require(self.samples_per_step >= 0, f"samples_per_step must be >= 0 (0: off), got {self.samples_per_step}")


@dataclasses.dataclass(frozen=True)
class TokenPrice:
    """What an LLM role's tokens cost, in USD per million: `prompt` (input) and `completion` (output) tokens, both
    given, each a finite number >= 0. A run logs "<role>/cost" (its step's prompt_tokens * prompt +
    completion_tokens * completion, over 1e6) and "<role>/cost_total" (the run's so far, carried across a resume)
    (`training.accounting`)."""

    prompt: float
    completion: float

    def __post_init__(self):
        for name in ("prompt", "completion"):
            value = getattr(self, name)
            _require(math.isfinite(value) and value >= 0, f"{name} must be a finite number >= 0, got {value}")


def _check_chat_role(config: Any, section: str) -> None:
    """The checks an LLM role's section shares (`JudgeConfig`, `MetaVerifierConfig`): url and model exactly with
    kind llm, positive counts, a non-negative temperature and a positive timeout, an environment variable's name
    for the key and string headers (the key itself never belongs in a config), template variable names in
    chat_template_kwargs and no field of the client's own in extra_body (`llm.check_request_options`)."""
    llm = config.kind == "llm"
    _require(llm == (config.url is not None) and llm == (config.model is not None),
             f"{section}.url and {section}.model are required by {section}.kind llm, and only by it")
    for name in ("max_tokens", "max_in_flight", "max_attempts"):
        _require(getattr(config, name) >= 1, f"{section}.{name} must be >= 1, got {getattr(config, name)}")
    _require(config.temperature >= 0 and config.timeout_s > 0,
             f"{section}.temperature must be >= 0, timeout_s > 0")
    check_credentials(config.api_key_env, config.headers, section)
    check_request_options(config.chat_template_kwargs, config.extra_body, section)
    _require(llm or config.price_per_million_tokens is None,
             f"{section}.price_per_million_tokens is for {section}.kind llm only")


CRITERION_FORMATS = ("rating", "healthbench")  # the judge formats of one call per criterion


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    """Who judges the rollouts: "task", the task's own judge (programmatic on the synthetic tasks), or "llm", an
    OpenAI-compatible chat server at `url` (SGLang's) serving `model`, asked in the paper's `format`:
    "grounded" (rubric-grounded GRPO: the reference passage and every weighted criterion in one call), "srar"
    (SRaR's step-attributed judge), "rlcer_verifier" (RLCER's verifier), "rating" (RGR-GRPO: one call per
    criterion) or "healthbench" (HealthBench's grader, one call per criterion, shown the whole conversation).
    `max_in_flight` bounds concurrent calls; `max_attempts` and `timeout_s` are the retry policy.
    `max_grounding_chars`: format "grounded" only, the grounding passage cut to its first characters (the paper's
    "maximum passage length"; None: the whole passage). `failed_criterion`: formats "rating" and "healthbench"
    only, what a criterion call that failed (its answer unparsed, off the schema or cut by max_tokens) does:
    "fail_rollout" (default: the rollout's judgement failed, counted in "judge/failure_rate") or "score_zero"
    (RGR-GRPO's "parse failure scores 0": the criterion scores 0 and the rollout stays judged; the call still
    counts in "judge/call_failure_rate", which the failure budget also watches; `judges.llm`).

    Authentication: `api_key_env`, the name of an environment variable whose value is sent as
    "Authorization: Bearer <value>" (the key never enters the config, config.yaml or the logs), and `headers`,
    sent with every request. Health: before step 1 a run sends the server one real request (`judges.preflight`)
    and stops (exit 1, one line) when it does not answer, refuses the credentials or a `model` it does not list,
    or answers what does not parse in `format`; it stops the same way when "judge/failure_rate" (or the per-call
    "judge/call_failure_rate", when larger) exceeds `max_failure_rate` on `max_failing_steps` consecutive steps (a
    run whose rewards are judge failures cannot learn). `max_failure_rate: 1.0` turns that off.

    Request options (`judges.llm`, empty by default and then not sent): `chat_template_kwargs`, the chat
    template's variables, sent as every request's `chat_template_kwargs` (SGLang, vLLM, llama.cpp's llama-server),
    e.g. {enable_thinking: false} for a Qwen3 judge, which otherwise thinks first and can spend max_tokens before
    it answers; `extra_body`, fields added to every request body as they are, e.g. {reasoning_effort: low} for
    gpt-oss. A key of extra_body the client sets itself (model, messages, temperature, max_tokens, seed,
    response_format, ...: `llm.CLIENT_FIELDS`) is refused here. `transformers serve` refuses a request with
    either (422).

    Accounting (`training.accounting`): every step logs the judge's tokens (read from each answer's `usage`),
    its requests' latency and how long the step waited for it after sampling; `price_per_million_tokens`
    ({prompt: x, completion: y}, USD per million tokens, `TokenPrice`; None: no cost logged) adds
    "judge/cost" and "judge/cost_total". It may change on a relaunch (a total then goes on at the new price)."""

    kind: Literal["task", "llm"] = "task"
    url: Optional[str] = None
    model: Optional[str] = None
    format: Literal["grounded", "srar", "rlcer_verifier", "rating", "healthbench"] = "grounded"
    temperature: float = 0.0
    max_tokens: int = 2048
    max_in_flight: int = 64
    max_attempts: int = 5
    timeout_s: float = 600.0
    max_grounding_chars: Optional[int] = None
    api_key_env: Optional[str] = None
    headers: dict = dataclasses.field(default_factory=dict)
    max_failure_rate: float = 0.5
    max_failing_steps: int = 3
    failed_criterion: Literal["fail_rollout", "score_zero"] = "fail_rollout"
    chat_template_kwargs: dict = dataclasses.field(default_factory=dict)
    extra_body: dict = dataclasses.field(default_factory=dict)
    price_per_million_tokens: Optional[TokenPrice] = None

    def __post_init__(self):
        _check_chat_role(self, "judge")
        _require(self.failed_criterion == "fail_rollout" or (self.kind == "llm" and self.format in CRITERION_FORMATS),
                 f"judge.failed_criterion {self.failed_criterion} is for kind llm with a format of one call per "
                 f"criterion ({', '.join(CRITERION_FORMATS)}), got kind {self.kind}, format {self.format}")
        _require(0 <= self.max_failure_rate <= 1, f"judge.max_failure_rate must be in [0, 1], got "
                                                  f"{self.max_failure_rate}")
        _require(self.max_failing_steps >= 1, f"judge.max_failing_steps must be >= 1, got {self.max_failing_steps}")
        _require(self.max_grounding_chars is None or (self.format == "grounded" and self.max_grounding_chars >= 0),
                 f"judge.max_grounding_chars is for format grounded only and must be >= 0, got "
                 f"{self.max_grounding_chars}")


@dataclasses.dataclass(frozen=True)
class MetaVerifierConfig:
    """Who audits the criteria a recipe's policy generates (EvoRubric's meta-verifier, evorubric.txt section 3.3.2
    step 1; read by a recipe that has one): "task", the task's own `meta_verify` (programmatic in the rubric
    world), or "llm", an OpenAI-compatible chat server at `url` serving `model`, asked with Appendix C's prompt of
    `domain` ("medical": Table 6, "writing_science": Table 7), one call per proposed criterion
    (`judges.llm.LLMMetaVerifier`). The decoding (`temperature`, `max_tokens`), the HTTP fields
    (`max_in_flight`, `max_attempts`, `timeout_s`), the authentication (`api_key_env`, `headers`), the request
    options (`chat_template_kwargs`, `extra_body`) and the accounting (`price_per_million_tokens`: "meta_verifier/
    cost" and "meta_verifier/cost_total") are `JudgeConfig`'s; its server gets a preflight request before step 1
    as the judge's does."""

    kind: Literal["task", "llm"] = "task"
    url: Optional[str] = None
    model: Optional[str] = None
    domain: Literal["medical", "writing_science"] = "writing_science"
    temperature: float = 0.0
    max_tokens: int = 2048
    max_in_flight: int = 64
    max_attempts: int = 5
    timeout_s: float = 600.0
    api_key_env: Optional[str] = None
    headers: dict = dataclasses.field(default_factory=dict)
    chat_template_kwargs: dict = dataclasses.field(default_factory=dict)
    extra_body: dict = dataclasses.field(default_factory=dict)
    price_per_million_tokens: Optional[TokenPrice] = None

    def __post_init__(self):
        _check_chat_role(self, "meta_verifier")


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """`rubric-jax train`: an RL run of `steps` steps (module docstring)."""

    output_dir: str
    steps: int
    model: ModelSpec
    seed: int = 0
    task: TaskSpec = TaskSpec()
    rollout: RolloutConfig = RolloutConfig()
    learner: LearnerConfig = LearnerConfig()
    algorithm: AlgorithmSpec = AlgorithmSpec()
    judge: JudgeConfig = JudgeConfig()
    meta_verifier: MetaVerifierConfig = MetaVerifierConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    critic: CriticConfig = CriticConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    metrics: MetricsConfig = MetricsConfig()
    eval: EvalConfig = EvalConfig()
    rollout_log: RolloutLogConfig = RolloutLogConfig()
    distributed: DistributedConfig = DistributedConfig()

    def __post_init__(self):
        _require(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        rows, learner = self.learner_rows(), self.learner
        _require(rows % learner.row_multiple == 0,
                 f"the step's {rows} learner rows (rollout.prompts_per_step * rollout.group_size, and a second "
                 f"role's) must split evenly into learner.mini_batches ({learner.mini_batches}) x "
                 f"learner.micro_batches ({learner.micro_batches}) and into learner.forward_micro_batches "
                 f"({learner.forward_splits}), each x the mesh's data * fsdp * expert ({learner.mesh.batch_shards})")
        gen_batch_prompts = self.algorithm_config_value("gen_batch_prompts")
        _require(gen_batch_prompts is None or gen_batch_prompts >= self.rollout.prompts_per_step,
                 f"algorithm.params.gen_batch_prompts ({gen_batch_prompts}) must be at least rollout.prompts_per_step "
                 f"({self.rollout.prompts_per_step}): a step's first generation batch holds its examples")
        _require(self.algorithm_config_value("dynamic_sampling") != "resample" or self.rollout.group_size > 1,
                 "algorithm.params.dynamic_sampling resample needs rollout.group_size > 1: a group of one response "
                 "is never informative, so every step would draw until its cap")
        if self.model.init is not None:
            _require(self.rollout.max_new_tokens < self.model.init.max_position_embeddings,
                     f"rollout.max_new_tokens ({self.rollout.max_new_tokens}) leaves no room for a prompt in "
                     f"model.init.max_position_embeddings ({self.model.init.max_position_embeddings})")


    def learner_rows(self) -> int:
        """The rows of a step's learner batch: every role's (`Algorithm.learner_rows`; RLCER's rubricator and
        EvoRubric's generator add theirs to the policy's prompts_per_step * group_size)."""
        rollout = self.rollout
        algorithm = algorithm_class(self.algorithm.name)
        shape = StepShape(rollout.prompts_per_step, rollout.group_size, rollout.max_prompt_tokens or 1,
                          rollout.max_new_tokens, rollout.max_prompt_tokens)
        roles = algorithm(config_from_dict(algorithm.config_class, self.algorithm.params, "algorithm.params")
                          ).learner_rows(shape)
        return sum(role.rows for role in roles.values())

    def algorithm_config_value(self, name: str) -> Any:
        """The recipe config's field `name` as `algorithm.params` resolves it (None when the recipe has none)."""
        config_class = algorithm_class(self.algorithm.name).config_class
        return getattr(config_from_dict(config_class, self.algorithm.params, "algorithm.params"), name, None)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """`rubric-jax sft`: masked cross-entropy on the task's reference solutions (chat-formatted; only the
    assistant's tokens, its end-of-turn token included, are scored), `steps` updates of `batch_size` examples,
    accumulated over `micro_batches`; the trained model is saved as a Hugging Face directory `output_dir/model`."""

    output_dir: str
    steps: int
    model: ModelSpec
    seed: int = 0
    task: TaskSpec = TaskSpec()
    batch_size: int = 32
    micro_batches: int = 1
    max_response_tokens: int = 128
    confidence_penalty: float = 0.0
    chunk_size: int = 256
    mesh: MeshConfig = MeshConfig()
    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=1e-3, warmup_steps=10)
    checkpoint: CheckpointConfig = CheckpointConfig()
    metrics: MetricsConfig = MetricsConfig()

    def __post_init__(self):
        _require(self.steps >= 1, f"steps must be >= 1, got {self.steps}")
        _require(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        _require(self.micro_batches >= 1, f"micro_batches must be >= 1, got {self.micro_batches}")
        _require(self.confidence_penalty >= 0, f"confidence_penalty must be >= 0, got {self.confidence_penalty}")
        _require(self.batch_size % (self.micro_batches * self.mesh.batch_shards) == 0,
                 f"batch_size ({self.batch_size}) must split evenly into micro_batches ({self.micro_batches}) "
                 f"x the mesh's data * fsdp * expert ({self.mesh.batch_shards})")


QUICKSTART_SFT_STEPS = 800
QUICKSTART_RL_STEPS = 120


@dataclasses.dataclass(frozen=True)
class SFTStage:
    """The quickstart's SFT run, with a confidence penalty that keeps the cloned policy exploratory: sampled at
    temperature 1 it still slips often enough for RL to have something to learn from."""

    steps: int = QUICKSTART_SFT_STEPS
    batch_size: int = 32
    micro_batches: int = 1
    confidence_penalty: float = 0.1
    optimizer: OptimizerConfig = OptimizerConfig(
        learning_rate=3e-3, weight_decay=0.0, warmup_steps=20, schedule="cosine", total_steps=QUICKSTART_SFT_STEPS,
        min_lr_ratio=0.1)


@dataclasses.dataclass(frozen=True)
class RLStage:
    """The quickstart's RL run (RaR on the task's per-step rubric)."""

    steps: int = QUICKSTART_RL_STEPS
    rollout: RolloutConfig = RolloutConfig(prompts_per_step=16, group_size=8, max_new_tokens=64)
    learner: LearnerConfig = LearnerConfig(mini_batches=2)
    algorithm: AlgorithmSpec = AlgorithmSpec()
    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=1e-4, weight_decay=0.0)


@dataclasses.dataclass(frozen=True)
class QuickstartConfig:
    """`rubric-jax quickstart`: a random model, an SFT warm start on the task's solutions, then RL, with
    held-out evaluation before and after RL. `sft_config()` and `rl_config()` are the two derived runs (in
    output_dir/sft and output_dir/rl; RL starts from the SFT model)."""

    output_dir: str
    model: ModelInit = ModelInit(hidden_size=128, intermediate_size=384, num_heads=4, num_kv_heads=2, head_dim=32,
                                 max_position_embeddings=128)
    seed: int = 0
    task: TaskSpec = TaskSpec()
    sft: SFTStage = SFTStage()
    rl: RLStage = RLStage()
    eval: EvalConfig = EvalConfig(num_examples=256, samples_per_example=4, temperature=1.0)
    checkpoint: CheckpointConfig = CheckpointConfig(every_steps=20)
    metrics: MetricsConfig = MetricsConfig()

    def __post_init__(self):
        self.sft_config()
        self.rl_config()

    def sft_config(self) -> SFTConfig:
        return SFTConfig(
            output_dir=f"{self.output_dir}/sft", steps=self.sft.steps, model=ModelSpec(init=self.model),
            seed=self.seed, task=self.task, batch_size=self.sft.batch_size, micro_batches=self.sft.micro_batches,
            max_response_tokens=self.rl.rollout.max_new_tokens, confidence_penalty=self.sft.confidence_penalty,
            optimizer=self.sft.optimizer, checkpoint=self.checkpoint, metrics=self.metrics,
        )

    def rl_config(self) -> RLConfig:
        return RLConfig(
            output_dir=f"{self.output_dir}/rl", steps=self.rl.steps, model=ModelSpec(path=f"{self.output_dir}/sft/model"),
            seed=self.seed, task=self.task, rollout=self.rl.rollout, learner=self.rl.learner,
            algorithm=self.rl.algorithm, optimizer=self.rl.optimizer, checkpoint=self.checkpoint,
            metrics=self.metrics, eval=self.eval,
        )


def resolve_algorithm(config: RLConfig) -> tuple[Any, RLConfig]:
    """(the recipe's config, `config` with algorithm.params replaced by every field of it, defaults included,
    so the saved config is complete). ValueError naming algorithm.name / algorithm.params.<key>."""
    algorithm_config = config_from_dict(
        algorithm_class(config.algorithm.name).config_class, config.algorithm.params, "algorithm.params")
    resolved = dataclasses.replace(
        config.algorithm, params=config_to_dict(algorithm_config))
    return algorithm_config, dataclasses.replace(config, algorithm=resolved)
