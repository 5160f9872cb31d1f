"""What every recipe shares: the task interface, the rollout context, the experience a recipe hands the learner,
the policy-loss settings, and the host-side steps each recipe composes (sample groups, judge them, pack them).

An algorithm (one paper's recipe, `rubric_jax.algorithms.<name>`) turns a batch of task examples into
`Experience`: it builds prompts, samples G responses per prompt from the rollout engine, has them judged,
computes rewards and token advantages with `rubric_jax.core`, and returns the learner's arrays and its metrics.
The trainer (`rubric_jax.training.rl`) then recomputes the old logprobs, runs the updates with the algorithm's
`loss_fn` and `aggregate`, syncs the weights and checkpoints the algorithm's `state_dict`.

Conventions:
- Experience.batch is the `train_step.pack_sequences` layout plus "rollout_logp_bt" (the engine's logprobs,
  kept for mismatch diagnostics and corrections) and "advantages_bt"; a recipe may add per-token arrays of its
  own for its loss. The trainer adds "old_logp_bt" and, when the recipe asks for a reference, "ref_logp_bt".
- Rows are prompt-major, G consecutive rows per prompt, and row b's group id is b // G.
- Metrics are flat {name: float} with "/"-separated names: "reward/...", "rubric/<criterion name>",
  "judge/...", "response/...", "advantage/...", "outcome/accuracy".
"""

import abc
import collections
import dataclasses
from typing import Any, Literal, Mapping, Optional, Protocol, Sequence

import numpy as np

from rubric_jax.core import aggregation, kl, losses
from rubric_jax.inference.engine import RolloutBatch, RolloutEngine, Sample, SamplingParams, prompt_token_ids
from rubric_jax.judges.base import Judge, JudgeRequest, Verdicts
from rubric_jax.models import train_step
from rubric_jax.rubrics.schema import Rubric
from rubric_jax.rubrics.steps import response_text, split_steps

PROMPT_WIDTH_MULTIPLE = 16  # prompt widths are rounded up to this, so the learner's step rarely recompiles


class Task(Protocol):
    """A dataset's examples as the recipes see them (`rubric_jax.data` implements it for each task)."""

    def prompt(self, example: Any) -> list[dict[str, str]]:
        """The chat messages the policy answers."""

    def question(self, example: Any) -> str:
        """The question as the judge sees it."""

    def rubric(self, example: Any) -> Rubric:
        """The example's rubric."""

    def reference(self, example: Any) -> Optional[str]:
        """What the judge may see and the policy never does (a ground truth, a grounding passage), or None."""

    def is_correct(self, response: str, example: Any) -> bool:
        """Outcome correctness of a response (accuracy metrics; outcome rewards)."""


@dataclasses.dataclass
class RolloutContext:
    """What a recipe needs from the run: the engine, the tokenizer, the task, the judge, the sampling settings
    (`sampling.n` is the group size G), the run's seed, and a timer whose `phase(name)` contexts time generation
    and judging."""

    engine: RolloutEngine
    tokenizer: Any
    task: Task
    judge: Judge
    sampling: SamplingParams
    pad_id: int
    seed: int
    timer: Any


@dataclasses.dataclass(frozen=True)
class Experience:
    """A recipe's output for one step: the learner's arrays (module docstring), the width of the shared prompt
    region (the learner's `first_scored`), and the step's metrics."""

    batch: dict[str, np.ndarray]
    prompt_width: int
    metrics: dict[str, float]


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
    """The policy loss most recipes share: PPO's clipped ratio (eps_low / eps_high: DAPO's clip-higher when
    they differ), an optional KL penalty against the frozen initial policy (`kl_coef` > 0 makes the trainer keep
    a reference copy; `kl_estimator` a `core.kl` estimator), and the loss aggregation mode (`norm_constant` is
    Dr.GRPO's constant, required by seq_mean_token_sum_norm only)."""

    eps_low: float = 0.2
    eps_high: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k2", "k3", "k1_k2_grad", "k3_k2_grad"] = "k3"
    aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"] = (
        "token_mean"
    )
    norm_constant: Optional[float] = None

    def __post_init__(self):
        for name in ("eps_low", "eps_high", "kl_coef"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if (self.aggregation == "seq_mean_token_sum_norm") != (self.norm_constant is not None):
            raise ValueError("norm_constant is required by aggregation seq_mean_token_sum_norm, and only by it")


def policy_loss_fn(config: PolicyLossConfig) -> train_step.TokenLossFn:
    """PPO clip with `config`'s clip range, plus the KL penalty when kl_coef > 0."""
    loss_fn = train_step.ratio_loss(losses.ppo_clip_loss, eps_low=config.eps_low, eps_high=config.eps_high)
    if config.kl_coef > 0:
        estimator = getattr(kl, f"kl_{config.kl_estimator}")
        loss_fn = train_step.with_kl_penalty(loss_fn, estimator, config.kl_coef)
    return loss_fn


def aggregate_fn(config: PolicyLossConfig) -> train_step.AggregateFn:
    """The `core.aggregation` mode `config.aggregation` names."""
    mode = getattr(aggregation, config.aggregation)
    if config.aggregation == "seq_mean_token_sum_norm":
        return lambda loss_bt, mask_bt: mode(loss_bt, mask_bt, norm_constant=config.norm_constant)
    return mode


class Algorithm(abc.ABC):
    """One paper's recipe (module docstring). Subclasses set `config_class` and implement `experience`."""

    config_class: type

    def __init__(self, config: Any):
        if not isinstance(config, self.config_class):
            raise ValueError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config

    @abc.abstractmethod
    def experience(self, examples: Sequence[Any], context: RolloutContext, step: int) -> Experience:
        """Rollouts, judgements, rewards and advantages of one step's examples."""

    @property
    @abc.abstractmethod
    def policy_loss(self) -> PolicyLossConfig:
        """The recipe's policy-loss settings."""

    def loss_fn(self) -> train_step.TokenLossFn:
        return policy_loss_fn(self.policy_loss)

    def aggregate(self) -> train_step.AggregateFn:
        return aggregate_fn(self.policy_loss)

    @property
    def needs_reference(self) -> bool:
        """Whether the learner must keep the frozen initial policy (for a KL penalty)."""
        return self.policy_loss.kl_coef > 0

    def state_dict(self) -> dict[str, Any]:
        """State that persists across steps (a rubric memory pool, ...), JSON-serialisable; saved in checkpoints."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state, got {sorted(state)}")


# ---------------------------------------------------------------- host-side steps the recipes compose


@dataclasses.dataclass(frozen=True)
class Rollouts:
    """G samples per prompt, prompt-major, with their decoded texts and the packed learner arrays."""

    samples: list[Sample]
    texts: list[str]
    batch: dict[str, np.ndarray]
    prompt_width: int

    @property
    def group_ids(self) -> np.ndarray:
        return np.array([s.prompt_index for s in self.samples], np.int32)


def padded_prompt_width(prompt_ids: Sequence[Sequence[int]]) -> int:
    """The longest prompt's length rounded up to PROMPT_WIDTH_MULTIPLE: the learner's prompt region."""
    return -(-max(len(ids) for ids in prompt_ids) // PROMPT_WIDTH_MULTIPLE) * PROMPT_WIDTH_MULTIPLE


def sample_groups(prompts: Sequence[Any], context: RolloutContext, step: int) -> Rollouts:
    """`sampling.n` samples per prompt (chat messages or ids) from the engine, seeded by (run seed, step) (so a
    resumed run samples what the uninterrupted one did), decoded (`steps.response_text`, the text whose steps the
    judge numbers) and packed for the learner with the rollout logprobs."""
    seed = int(np.random.SeedSequence((context.seed, step)).generate_state(1)[0] >> 1)
    params = dataclasses.replace(context.sampling, seed=seed)
    with context.timer.phase("generation"):
        samples = context.engine.generate(list(prompts), params)
    prompt_ids = [prompt_token_ids(prompt, context.tokenizer) for prompt in prompts]
    prompt_width = padded_prompt_width(prompt_ids)
    response_width = params.max_new_tokens
    batch = train_step.pack_sequences(
        [prompt_ids[s.prompt_index] for s in samples],
        [s.output_ids for s in samples],
        pad_id=context.pad_id,
        prompt_width=prompt_width,
        response_width=response_width,
    )
    rollout = RolloutBatch.from_samples(samples, context.pad_id, response_width)
    batch["rollout_logp_bt"] = np.pad(rollout.logprobs_bt, ((0, 0), (prompt_width, 0)))
    texts = [response_text(context.tokenizer, s.output_ids) for s in samples]
    return Rollouts(samples=samples, texts=texts, batch=batch, prompt_width=prompt_width)


def judge_rollouts(
    examples: Sequence[Any], rollouts: Rollouts, context: RolloutContext, max_items: int
) -> tuple[Verdicts, list[Rubric]]:
    """Every rollout judged against its example's rubric (the reference shown to the judge only); returns the
    verdicts [B, max_items] and each row's rubric."""
    rubrics = [context.task.rubric(examples[s.prompt_index]) for s in rollouts.samples]
    requests = [
        JudgeRequest(
            question=context.task.question(examples[s.prompt_index]),
            response=text,
            rubric=rubric,
            reference=context.task.reference(examples[s.prompt_index]),
            num_steps=len(split_steps(text)),
        )
        for s, text, rubric in zip(rollouts.samples, rollouts.texts, rubrics)
    ]
    with context.timer.phase("judging"):
        verdicts = context.judge.judge(requests, max_items)
    return verdicts, rubrics


def rubric_metrics(verdicts: Verdicts, rubrics: Sequence[Rubric]) -> dict[str, float]:
    """Per-criterion satisfaction rates by criterion name ("rubric/<name>", over the rows whose rubric has it,
    failed rows included as unsatisfied), and judge failures: "judge/failure_rate", "judge/failed/<reason>"."""
    totals, counts = collections.defaultdict(float), collections.defaultdict(int)
    for b, rubric in enumerate(rubrics):
        for k, criterion in enumerate(rubric.criteria):
            name = criterion.name or f"item{k}"
            totals[name] += float(verdicts.satisfied_bk[b, k])
            counts[name] += 1
    metrics = {f"rubric/{name}": totals[name] / counts[name] for name in totals}
    metrics["judge/failure_rate"] = float(np.mean(verdicts.failed_b)) if len(rubrics) else 0.0
    for reason, count in verdicts.failure_counts().items():
        metrics[f"judge/failed/{reason}"] = float(count)
    return metrics


def rollout_metrics(rollouts: Rollouts, correct_b: np.ndarray) -> dict[str, float]:
    """Response lengths, the truncated fraction (finish reason "length"), and outcome accuracy."""
    lengths = np.array([len(s.output_ids) for s in rollouts.samples], np.float64)
    return {
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated_fraction": float(np.mean([s.finish_reason == "length" for s in rollouts.samples])),
        "outcome/accuracy": float(np.mean(correct_b)),
    }


def summary_stats(name: str, values, mask=None) -> dict[str, float]:
    """Mean, population std, min and max of `values` (where `mask` is true) as `<name>/<stat>` floats.

    Nothing selected gives {}: a statistic of nothing is absent from the log, not a 0 or NaN that would plot as data.
    """
    values = np.asarray(values, dtype=np.float64)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != values.shape:
            raise ValueError(f"mask shape {mask.shape} differs from values shape {values.shape}")
        values = values[mask]
    if values.size == 0:
        return {}
    return {
        f"{name}/mean": float(values.mean()),
        f"{name}/std": float(values.std()),
        f"{name}/min": float(values.min()),
        f"{name}/max": float(values.max()),
    }
