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
  own for its loss. Per-token arrays are named "*_bt" ([B, T], ...), per-row arrays anything else ([B], ...).
  The trainer pads the rows to a multiple of its mini-batch split with copies of row 0 whose response mask is
  off, so a recipe may return any number of rows. The trainer adds "old_logp_bt" (with learner.old_logprobs
  detached, the loss sees the update's own logprobs, detached, under that name instead) and, when the recipe
  asks for a reference, "ref_logp_bt".
- Rows are prompt-major, G consecutive rows per prompt, and row b's group id is b // G.
- Metrics are flat {name: float} with "/"-separated names: "reward/...", "rubric/<criterion name>" or
  "rubric/tag/<tag>" (`criterion_metric_keys`),
  "judge/...", "response/...", "advantage/...", "outcome/accuracy" (for tasks with outcome answers, `has_outcome`).
  A recipe names its own headline metrics for the run's console and plots (`Algorithm.console_metrics`,
  `Algorithm.plot_panels`).
- Experience.recipe_values carries, for the rollout log, what the recipe made of each rollout it had judged
  (`recipe_values`; `judges.records.with_recipe_values` attaches them to the recorded judge calls).

Extension points: a recipe is a sequence of named steps, each an overridable method (the response-level recipes
share `GroupRecipe`'s: `draw`, `reward`, `informative`, `advantage`, `metrics`; the others name theirs in their
module docstrings), so a variant overrides the one step it changes and inherits the rest, fixes included.
"""

import abc
import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import logging
import types
from typing import Any, Callable, Coroutine, Literal, Mapping, Optional, Protocol, Sequence, Set, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from rubric_jax.core import advantages, aggregation, kl, losses, rubric_validity
from rubric_jax.inference.engine import (RolloutBatch, RolloutEngine, Sample, SamplingParams, prompt_token_ids,
                                         stale_samples)
from rubric_jax.judges.base import Judge, JudgeRequest, Verdicts
from rubric_jax.judges.llm import LLMMetaVerifier
from rubric_jax.judges.records import RecipeValues
from rubric_jax.models import train_step
from rubric_jax.rubrics.schema import Criterion, Rubric
from rubric_jax.rubrics.steps import response_text, split_steps

_LOG = logging.getLogger(__name__)
T = TypeVar("T")
LONG_DRAW_BATCHES = 10  # dynamic_groups warns every this many generation batches of one step

PROMPT_WIDTH_MULTIPLE = 16  # prompt widths are rounded up to this, so the learner's step rarely recompiles
FAILED_SAMPLE = "failed_sample"  # the verdict reason of a failed sample, never sent to the judge (judge_requests)


class Task(Protocol):
    """A dataset's examples as the recipes see them (`rubric_jax.data` implements it for each task)."""

    def prompt(self, example: Any) -> list[dict[str, str]]:
        """The chat messages the policy answers."""

    def question(self, example: Any) -> str:
        """The question as the judge sees it."""

    def rubric(self, example: Any) -> Rubric:
        """The example's rubric. A task whose rubrics differ per example may set `recurring_criterion_names`, the
        criterion names that more than one of its rubrics has (absent or None: every name recurs); the others
        are reported by tag (`criterion_metric_keys`)."""

    def reference(self, example: Any) -> Optional[str]:
        """What the judge may see and the policy never does (a ground truth, a grounding passage), or None."""

    def is_correct(self, response: str, example: Any) -> bool:
        """Outcome correctness of a response (accuracy metrics; outcome rewards). A task without outcome
        answers (a dataset task with `answer_kind: none`) sets an attribute `has_outcome = False` (absent: True;
        `has_outcome`): its `is_correct` is False for every response, and no accuracy metric is logged for it."""


class ExampleStream(Protocol):
    """The run's train stream as dynamic sampling's re-sampling draws from it (`RolloutContext.stream`;
    `training.data_parallel.StepStream` implements it). In a run of P processes every process draws every example
    and keeps its share, so the streams of all processes stay at one position."""

    prompts_per_step: int  # the step's prompts, over all processes

    @property
    def quota(self) -> int:
        """This process's part of the step's prompts: prompts_per_step / P."""

    def next_share(self, n: int) -> list:
        """This process's share of the stream's next `n` examples (every process must call it with the same n)."""

    def fewest(self, count: int) -> int:
        """The smallest `count` over the processes (every process must call it)."""


def has_outcome(task: Any) -> bool:
    """Whether `task`'s `is_correct` checks answers (its `has_outcome` attribute; absent: True). Accuracy metrics
    (outcome/accuracy, eval/accuracy, eval/pass@k, ...) are logged only for such tasks: for a task with no answers
    to check they would be a constant 0 that reads as a failing policy."""
    return bool(getattr(task, "has_outcome", True))


@dataclasses.dataclass
class RolloutContext:
    """What a recipe needs from the run: the engine, the tokenizer, the task, the judge, the sampling settings
    (`sampling.n` is the group size G), the run's seed, and a timer whose `phase(name)` contexts time generation
    and judging.

    chat_template_kwargs: the chat template's variables for every prompt rendered here (`ModelSpec`'s).
    max_prompt_tokens / prompt_truncation: the cap every `sample_groups` call applies to its prompts
    (`truncate_prompt`; None: no cap). frozen_engine: an engine serving the initial weights that never receives
    a weight update, for a role played by an unoptimised model (the trainer makes one when the recipe's
    `needs_frozen_engine`). meta_verifier: an LLM auditor of generated criteria (`judges.llm.LLMMetaVerifier`,
    EvoRubric's meta-verifier; the run's `meta_verifier` section), None where the task's own `meta_verify` serves.
    sampling_metrics: what `sample_groups` records about the prompts and samples ("prompt/truncated", summed over
    the calls; "rollout/samples", "rollout/failed/<reason>", "rollout/null_logprobs", "rollout/stale", also sums;
    "prompt/length_max", tokens before truncation), shared by every copy of the context (`dataclasses.replace`);
    the trainer hands each step's experience a context with a fresh dict (`training.rl.sample_experience`).
    pipelined_judging: `sample_and_judge` judges each group as the engine finishes it (True) or every row once
    sampling is done (False); the results are the same. stream: the run's train stream, from which dynamic
    sampling's re-sampling draws the step's further generation batches (`dynamic_groups`); None outside a
    training run."""

    engine: RolloutEngine
    tokenizer: Any
    task: Task
    judge: Judge
    sampling: SamplingParams
    pad_id: int
    seed: int
    timer: Any
    chat_template_kwargs: dict = dataclasses.field(default_factory=dict)
    max_prompt_tokens: Optional[int] = None
    prompt_truncation: Literal["error", "left", "right", "middle"] = "middle"
    frozen_engine: Optional[RolloutEngine] = None
    meta_verifier: Optional[LLMMetaVerifier] = None
    sampling_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    stream: Optional[ExampleStream] = None
    pipelined_judging: bool = True


@dataclasses.dataclass(frozen=True)
class Experience:
    """A recipe's output for one step: the learner's arrays (module docstring), the width of the shared prompt
    region (the learner's `first_scored`), the step's metrics, and `recipe_values`: for each judge request the
    recipe sent about one of its training rollouts, the request object and that rollout's values
    {"reward", "advantage", "group"} (`recipe_values`), for the rollout log (`judges.records.with_recipe_values`
    matches them to the recorded calls by identity). Values are plain floats and ints; the requests are the live
    objects the judge was handed, so the pairs are read while the step's judge records are taken, not saved."""

    batch: dict[str, np.ndarray]
    prompt_width: int
    metrics: dict[str, float]
    recipe_values: RecipeValues = ()

# The `core.aggregation` modes with a constant normaliser, `PolicyLossConfig.norm_constant`.
NORM_AGGREGATIONS = ("seq_mean_token_sum_norm", "token_sum_norm")


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
    """The policy loss every recipe shares (`policy_loss_fn`, `aggregate_fn`); the defaults are plain PPO.

    - `loss`, the per-token policy loss (`core.losses`):
      - "ppo": PPO's clipped token ratio with clip range (eps_low, eps_high), DAPO's clip-higher when they differ
        (`ppo_clip_loss`).
      - "dual_clip": the same with a negative-advantage token's loss capped at -A c, c = `clip_ratio_c` > 1
        (`dual_clip_ppo_loss`; rubric_grounded_rl.txt, Appendix C). verl's "vanilla" is this, with c = 3.
      - "gspo": GSPO's clipped sequence ratio (`gspo_loss`), whose range is orders of magnitude narrower and so has
        its own fields (gspo_eps_low, gspo_eps_high: the GSPO paper's 3e-4, 4e-4); a sequence-level loss, it needs
        aggregation seq_mean_token_mean (GSPO; with token_mean long responses would weigh more, REFERENCE.md
        section 4, item 9) or seq_mean_token_sum (which is LUSPO, TRL's "luspo": each sequence's loss times
        its length).
      - "gmpo": GMPO's geometric mean of the token ratios, each log r clipped on its advantage's pessimistic side
        to (-gmpo_eps_low, gmpo_eps_high) in log space (`gmpo_loss`; the paper's 0.4, 0.4; verl's "geo_mean");
        sequence-level, it needs aggregation seq_mean_token_mean.
      - "sapo": SAPO's soft gate (4 / tau) sigmoid(tau (r - 1)) in place of the clip, tau = sapo_tau_pos where
        A > 0, sapo_tau_neg elsewhere (`sapo_loss`; the paper's 1.0, 1.05; verl and TRL aggregate it with
        seq_mean_token_mean).
      - "clip_cov": PPO's clip (eps_low, eps_high) with max(floor(clip_cov_ratio n), 1) of the valid tokens whose
        covariance of logp and A lies in (clip_cov_lb, clip_cov_ub) detached, chosen at random (`clip_cov_loss`;
        verl's defaults 2e-4, (1, 5)). verl draws them from torch's global generator; here the key is a function
        of the micro-batch (the integer sum of the bit patterns of its response tokens' old logprobs), so a
        resumed run draws what the uninterrupted one did. The token metric clip_fraction counts both clips.
      - "kl_cov": the unclipped -r A plus kl_cov_coef |log r| on the max(floor(kl_cov_ratio n), 1) tokens of
        largest covariance (`kl_cov_loss`; verl's ratio 2e-4, coefficient 1).
        Both covariance losses compute the covariance and n over the micro-batch the step hands the loss, as verl.
      - "cispo": CISPO's detached clipped weight, -sg(clip(r, 1 - cispo_eps_low, 1 + cispo_eps_high)) A logp
        (`cispo_loss`); cispo_eps_high is required (MiniMax-M1 tunes it); cispo_eps_low 1 means no lower bound.
      - "vespo": VESPO's detached gamma weight of the sequence ratio, -sg(phi(w)) A logp, with (vespo_k_pos,
        vespo_lambda_pos) where A >= 0 and (vespo_k_neg, vespo_lambda_neg) where A < 0 (`vespo_loss`; TRL's
        defaults 2, 3, 3, 2).
      - "gpg": the plain policy gradient -A logp, no ratio, no clip (`policy_gradient_loss`; GPG's loss, verl's
        "gpg"); PPO's gradient on fresh rollouts, and still the on-policy one on later updates of a batch.
    - TRL's `loss_type` as (loss, aggregation): "grpo" (ppo, seq_mean_token_mean); "dapo" (ppo, token_mean);
      "bnpo" (ppo, token_mean: TRL normalises by the tokens of each local micro-batch, here by the whole batch's,
      exactly accumulated; equal with one micro-batch); "dr_grpo" (ppo, token_sum_norm, norm_constant = the
      maximum completion length); "cispo" (cispo, token_mean, cispo_eps_low 1, cispo_eps_high = TRL's
      epsilon_high - 1: TRL's epsilon_high caps the ratio itself); "sapo" (sapo, seq_mean_token_mean); "luspo"
      (gspo, seq_mean_token_sum); "vespo" (vespo, token_mean). importance_sampling_level "sequence" with "grpo" is
      (gspo, seq_mean_token_mean). TRL's `delta` (INTELLECT-2's two-sided clip, coef_1 capped at delta) equals
      dual_clip with clip_ratio_c = delta for delta > 1 + eps_high (the range TRL recommends).
    - `token_selection`: "all", or "high_entropy": the policy loss kept only on the valid tokens whose entropy is
      among the top `entropy_top_fraction` of the micro-batch's (`core.losses.high_entropy_mask`, "Beyond the
      80/20 Rule", whose 0.2 is the default; TRL's top_entropy_quantile). Dropped tokens stay in the
      aggregation's denominator, as in the paper's objective and TRL; the KL term is not masked.
    - `rollout_correction`: rollout/train mismatch weights, w = pi_old / pi_rollout from the learner's old
      logprobs and the engine's, detached, multiplying each token's policy loss (the KL term is not reweighted)
      (`train_step.with_rollout_correction`): "tis" min(w, tis_cap); "icepop" w inside [is_low, is_high], else 0;
      "seq_mask_tis" a whole sequence zeroed when its geometric-mean w leaves [is_low, is_high]; "none".
      With `rollout.overlap` the engine's policy is also one update behind the learner's, which w corrects too.
    - `kl_coef` > 0 adds a KL penalty against the frozen initial policy (the trainer then keeps a reference
      copy); `kl_estimator` names a `core.kl` estimator ("abs" is verl's |logp - ref_logp|).
    - `aggregation`: a `core.aggregation` mode; `norm_constant`, required by the two constant-normaliser modes
      only, is Dr.GRPO's constant per valid sequence (seq_mean_token_sum_norm) or verl's per row of the batch
      (token_sum_norm: verl's loss_scale_factor / ppo_micro_batch_size_per_gpu reproduces a verl update).
    """

    loss: Literal["ppo", "dual_clip", "gspo", "gmpo", "sapo", "clip_cov", "kl_cov", "cispo", "vespo", "gpg"] = "ppo"
    eps_low: float = 0.2
    eps_high: float = 0.2
    clip_ratio_c: float = 3.0
    gspo_eps_low: float = 3e-4
    gspo_eps_high: float = 4e-4
    gmpo_eps_low: float = 0.4
    gmpo_eps_high: float = 0.4
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    clip_cov_ratio: float = 2e-4
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-4
    kl_cov_coef: float = 1.0
    cispo_eps_low: float = 1.0
    cispo_eps_high: Optional[float] = None
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    token_selection: Literal["all", "high_entropy"] = "all"
    entropy_top_fraction: float = 0.2
    rollout_correction: Literal["none", "tis", "icepop", "seq_mask_tis"] = "none"
    tis_cap: float = 2.0
    is_low: float = 0.5
    is_high: float = 5.0
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k2", "k3", "k1_k2_grad", "k3_k2_grad", "abs"] = "k3"
    aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm",
                         "token_sum_norm"] = (
        "token_mean"
    )
    norm_constant: Optional[float] = None

    def __post_init__(self):
        for name in ("eps_low", "eps_high", "gspo_eps_low", "gspo_eps_high", "gmpo_eps_low", "gmpo_eps_high",
                     "cispo_eps_low", "kl_cov_coef", "vespo_k_pos", "vespo_k_neg", "kl_coef", "is_low"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("sapo_tau_pos", "sapo_tau_neg", "vespo_lambda_pos", "vespo_lambda_neg"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("clip_cov_ratio", "kl_cov_ratio"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)!r}")
        if not 0 <= self.entropy_top_fraction <= 1:
            raise ValueError(f"entropy_top_fraction must be in [0, 1], got {self.entropy_top_fraction!r}")
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise ValueError(f"clip_cov_lb must be < clip_cov_ub, got ({self.clip_cov_lb!r}, {self.clip_cov_ub!r})")
        if not self.clip_ratio_c > 1:
            raise ValueError(f"clip_ratio_c must be > 1 (the dual clip's c), got {self.clip_ratio_c!r}")
        if not self.tis_cap > 0:
            raise ValueError(f"tis_cap must be > 0, got {self.tis_cap!r}")
        if not self.is_high >= self.is_low:
            raise ValueError(f"is_high must be >= is_low, got [{self.is_low!r}, {self.is_high!r}]")
        if self.loss == "cispo" and not (self.cispo_eps_high is not None and self.cispo_eps_high >= 0):
            raise ValueError(f"loss cispo needs cispo_eps_high >= 0, got {self.cispo_eps_high!r}")
        sequence_modes = SEQUENCE_LOSS_AGGREGATIONS.get(self.loss)
        if sequence_modes is not None and self.aggregation not in sequence_modes:
            raise ValueError(f"loss {self.loss} needs aggregation {' or '.join(sequence_modes)} (a sequence-level "
                             f"objective), got {self.aggregation}")
        if (self.aggregation in NORM_AGGREGATIONS) != (self.norm_constant is not None):
            raise ValueError(f"norm_constant is required by aggregation {' and '.join(NORM_AGGREGATIONS)}, "
                             "and only by them")


# the aggregations under which a sequence-level loss is its paper's objective (GSPO / LUSPO, GMPO)
SEQUENCE_LOSS_AGGREGATIONS = {"gspo": ("seq_mean_token_mean", "seq_mean_token_sum"), "gmpo": ("seq_mean_token_mean",)}


def micro_batch_key(batch: train_step.Batch) -> jax.Array:
    """A PRNG key that is a function of the micro-batch alone: the wrapping uint32 sum of the bit patterns of
    its response tokens' old logprobs, an integer sum, so the same whatever the summation order or sharding."""
    old_logp_bt = jnp.where(batch["response_mask_bt"], jnp.asarray(batch["old_logp_bt"], jnp.float32), 0)
    return jax.random.key(jnp.sum(jax.lax.bitcast_convert_type(old_logp_bt, jnp.uint32), dtype=jnp.uint32))


def _clip_cov_loss(config: PolicyLossConfig) -> train_step.TokenLossFn:
    settings = dict(eps_low=config.eps_low, eps_high=config.eps_high, clip_cov_ratio=config.clip_cov_ratio,
                    clip_cov_lb=config.clip_cov_lb, clip_cov_ub=config.clip_cov_ub)

    def loss_fn(logp_bt, entropy_bt, batch):
        keyed = functools.partial(losses.clip_cov_loss, key=micro_batch_key(batch))
        return train_step.ratio_loss(keyed, **settings)(logp_bt, entropy_bt, batch)

    return loss_fn


def _policy_gradient_loss(logp_bt, old_logp_bt, advantages_bt, mask_bt):
    del old_logp_bt  # no ratio: the loss of `train_step.ratio_loss`'s shape that ignores pi_old
    return losses.policy_gradient_loss(logp_bt, advantages_bt, mask_bt), ()


def _ratio_loss(config: PolicyLossConfig) -> train_step.TokenLossFn:
    if config.loss == "clip_cov":
        return _clip_cov_loss(config)
    if config.loss == "gpg":
        return train_step.ratio_loss(_policy_gradient_loss)
    core_loss, settings = {
        "ppo": (losses.ppo_clip_loss, dict(eps_low=config.eps_low, eps_high=config.eps_high)),
        "dual_clip": (losses.dual_clip_ppo_loss, dict(eps_low=config.eps_low, eps_high=config.eps_high,
                                                      clip_ratio_c=config.clip_ratio_c)),
        "gspo": (losses.gspo_loss, dict(eps_low=config.gspo_eps_low, eps_high=config.gspo_eps_high)),
        "gmpo": (losses.gmpo_loss, dict(eps_low=config.gmpo_eps_low, eps_high=config.gmpo_eps_high)),
        "sapo": (losses.sapo_loss, dict(tau_pos=config.sapo_tau_pos, tau_neg=config.sapo_tau_neg)),
        "kl_cov": (losses.kl_cov_loss, dict(kl_cov_ratio=config.kl_cov_ratio, kl_coef=config.kl_cov_coef)),
        "cispo": (losses.cispo_loss, dict(eps_low=config.cispo_eps_low, eps_high=config.cispo_eps_high)),
        "vespo": (losses.vespo_loss, dict(k_pos=config.vespo_k_pos, lambda_pos=config.vespo_lambda_pos,
                                          k_neg=config.vespo_k_neg, lambda_neg=config.vespo_lambda_neg)),
    }[config.loss]
    return train_step.ratio_loss(core_loss, **settings)


def _with_high_entropy_tokens(loss_fn: train_step.TokenLossFn, top_fraction: float) -> train_step.TokenLossFn:
    """`loss_fn`'s loss kept on the high-entropy tokens only (`core.losses.high_entropy_mask`), 0 elsewhere; the
    dropped tokens stay in the denominator. Adds the token metric "entropy_selected"."""

    def selected(logp_bt, entropy_bt, batch):
        loss_bt, metrics = loss_fn(logp_bt, entropy_bt, batch)
        keep_bt = losses.high_entropy_mask(entropy_bt, batch["response_mask_bt"], top_fraction=top_fraction)
        return jnp.where(keep_bt, loss_bt, 0), {**metrics, "entropy_selected": keep_bt}

    return selected


def _rollout_weights(config: PolicyLossConfig) -> train_step.WeightsFn:
    if config.rollout_correction == "tis":
        return lambda old, rollout, mask: losses.tis_weights(old, rollout, mask, cap=config.tis_cap)
    if config.rollout_correction == "icepop":
        return lambda old, rollout, mask: losses.icepop_weights(old, rollout, mask, low=config.is_low,
                                                                high=config.is_high)
    return lambda old, rollout, mask: losses.seq_mask_tis_weights(old, rollout, mask, low=config.is_low,
                                                                  high=config.is_high)


def policy_loss_fn(config: PolicyLossConfig) -> train_step.TokenLossFn:
    """The per-token loss `config` describes: the ratio loss, on the selected tokens only when a token selection
    is chosen, times the rollout-correction weights when one is chosen, plus the KL penalty when kl_coef > 0."""
    loss_fn = _ratio_loss(config)
    if config.token_selection == "high_entropy":
        loss_fn = _with_high_entropy_tokens(loss_fn, config.entropy_top_fraction)
    if config.rollout_correction != "none":
        loss_fn = train_step.with_rollout_correction(loss_fn, _rollout_weights(config))
    if config.kl_coef > 0:
        estimator = getattr(kl, f"kl_{config.kl_estimator}")
        loss_fn = train_step.with_kl_penalty(loss_fn, estimator, config.kl_coef)
    return loss_fn


def aggregate_fn(config: PolicyLossConfig) -> train_step.AggregateFn:
    """The `core.aggregation` mode `config.aggregation` names."""
    mode = getattr(aggregation, config.aggregation)
    if config.aggregation in NORM_AGGREGATIONS:
        return lambda loss_bt, mask_bt: mode(loss_bt, mask_bt, norm_constant=config.norm_constant)
    return mode


@dataclasses.dataclass(frozen=True)
class StepShape:
    """A step's sampling budget as a run configures it: `prompts` questions of `group_size` rollouts, prompts of
    `prompt_tokens` (padded), responses of at most `response_tokens`, and the cap every prompt obeys
    (`max_prompt_tokens`, None for none)."""

    prompts: int
    group_size: int
    prompt_tokens: int
    response_tokens: int
    max_prompt_tokens: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class RoleRows:
    """The rows one role adds to a step's learner batch, at their widest: `rows` rows of a prompt region of
    `prompt_tokens` and a response region of `response_tokens`."""

    rows: int
    prompt_tokens: int
    response_tokens: int


class Algorithm(abc.ABC):
    """One paper's recipe (module docstring). Subclasses set `config_class` and implement `experience`.

    Class attributes a recipe sets for the run's display of its own headline metrics (keys its `experience`
    logs; a key a step does not log, under a setting that leaves it out, is shown as missing, not an error):
    - `console_metrics`: the metric keys the run's console shows for this recipe besides its defaults.
    - `plot_panels`: panel name -> the metric keys plotted together in that panel, besides the default panels.
    """

    config_class: type
    console_metrics: tuple[str, ...] = ()
    plot_panels: Mapping[str, tuple[str, ...]] = types.MappingProxyType({})

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
    def uses_critic(self) -> bool:
        """Whether the recipe trains with PPO's critic (RLCER's section 4.5): its Experience.batch then holds
        "token_rewards_bt" (each row's rewards on its response tokens, `core.value.last_token_rewards` for a
        sequence reward) instead of "advantages_bt", and the trainer writes GAE advantages from the critic's
        values (`training.rl`, the run's `critic` config)."""
        return False

    @property
    def needs_reference(self) -> bool:
        """Whether the learner must keep the frozen initial policy (for a KL penalty)."""
        return self.policy_loss.kl_coef > 0

    @property
    def negative_weights(self) -> str:
        """What the configured reward does with a task rubric's negative-weight (penalty) criteria, in words that
        follow "N criteria with a negative weight: " (`rubric-jax validate` prints it when the data has some)."""
        return "not read: this recipe's reward does not use the task's rubric weights"

    def role_prompts(self, task: Any, example: Any, placeholder: str) -> dict[str, list[dict[str, str]]]:
        """The prompt of each role of the recipe for `example`, by role name, as `sample_groups` is handed them;
        a prompt built from model text (a CoT, a response to refine) shows `placeholder` in its place. What
        `rubric-jax validate` renders; the default is the task's prompt for the one policy role."""
        del placeholder
        return {"policy": task.prompt(example)}

    def learner_rows(self, shape: StepShape) -> dict[str, RoleRows]:
        """The rows of one step's learner batch by role, each role at its widest (what `training.plan` compiles:
        `concat_batches` pads the roles to the widest prompt and the longest response). The default is the one
        policy role: prompts x group_size rows."""
        return {"policy": RoleRows(shape.prompts * shape.group_size, shape.prompt_tokens, shape.response_tokens)}

    @property
    def needs_frozen_engine(self) -> bool:
        """Whether a role samples from the frozen initial policy (`RolloutContext.frozen_engine`)."""
        return False

    @property
    def resamples(self) -> bool:
        """Whether the recipe draws further generation batches from the run's stream within a step (a config with
        `dynamic_sampling: resample`, `dynamic_groups`)."""
        return getattr(self.config, "dynamic_sampling", "off") == "resample"

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

    @property
    def failed_b(self) -> np.ndarray:
        """[B] bool: the failed samples (`Sample.failure`: aborted, a NaN met, a request failed), which
        `sample_groups` keeps out of the loss."""
        return np.array([bool(s.failure) for s in self.samples], bool)


def padded_prompt_width(prompt_ids: Sequence[Sequence[int]]) -> int:
    """The longest prompt's length rounded up to PROMPT_WIDTH_MULTIPLE: the learner's prompt region."""
    return -(-max(len(ids) for ids in prompt_ids) // PROMPT_WIDTH_MULTIPLE) * PROMPT_WIDTH_MULTIPLE


def truncate_prompt(ids: Sequence[int], max_tokens: int, mode: Literal["error", "left", "right", "middle"]
                    ) -> list[int]:
    """`ids` cut to at most `max_tokens` (>= 1) tokens as verl cuts a prompt longer than `data.max_prompt_length`
    (its `data.truncation` option): "left" keeps the last max_tokens, "right" the first, "middle" the first
    max_tokens // 2 and the last max_tokens - max_tokens // 2; "error" raises ValueError. A chat prompt's
    instructions open it and its assistant header closes it, so "middle" keeps both and cuts the content between
    (a generator's shown responses, a long question); "right" would cut the header, so the policy would continue
    the user's turn. A prompt within the cap is returned unchanged."""
    ids = list(ids)
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if len(ids) <= max_tokens:
        return ids
    if mode == "left":
        return ids[-max_tokens:]
    if mode == "right":
        return ids[:max_tokens]
    if mode == "middle":
        head = max_tokens // 2
        return ids[:head] + ids[len(ids) - (max_tokens - head):]
    if mode == "error":
        raise ValueError(f"a prompt of {len(ids)} tokens exceeds max_prompt_tokens={max_tokens} "
                         "(prompt_truncation error)")
    raise ValueError(f"unknown prompt_truncation {mode!r}")


@dataclasses.dataclass(frozen=True)
class SamplingCall:
    """One engine call as `sample_groups` and `sample_and_judge` make it: the sampling settings with the call's
    seed, the prompts as sent (a truncated one as its token ids), their token ids, and the engine's weight version
    when the call started (`record_samples`' "rollout/stale")."""

    params: SamplingParams
    prompts: list
    prompt_ids: list[list[int]]
    weight_version: str


def sampling_call(prompts: Sequence[Any], context: RolloutContext, step: int, stream: int = 0,
                  gen_batch: int = 0, group: Optional[int] = None) -> SamplingCall:
    """The call `sample_groups` documents: seeded by (run seed, step[, stream][, gen_batch]), or, for one group's
    call (`asample_group`), by (run seed, step, stream, gen_batch, group + 1); its prompts capped at
    `context.max_prompt_tokens` and counted in `context.sampling_metrics`."""
    entropy = (context.seed, step) if stream == 0 else (context.seed, step, stream)
    if gen_batch:
        entropy = (context.seed, step, stream, gen_batch)
    if group is not None:
        entropy = (context.seed, step, stream, gen_batch, group + 1)
    seed = int(np.random.SeedSequence(entropy).generate_state(1)[0] >> 1)
    params = dataclasses.replace(context.sampling, seed=seed)
    prompts = list(prompts)
    prompt_ids = [prompt_token_ids(prompt, context.tokenizer, context.chat_template_kwargs) for prompt in prompts]
    recorded = context.sampling_metrics
    recorded["prompt/length_max"] = max(recorded.get("prompt/length_max", 0), max(len(ids) for ids in prompt_ids))
    recorded.setdefault("prompt/truncated", 0)
    limit = context.max_prompt_tokens
    for p, ids in enumerate(prompt_ids):
        if limit is not None and len(ids) > limit:
            prompt_ids[p] = prompts[p] = truncate_prompt(ids, limit, context.prompt_truncation)
            recorded["prompt/truncated"] += 1
    return SamplingCall(params=params, prompts=prompts, prompt_ids=prompt_ids,
                        weight_version=context.engine.weight_version)


def packed_rollouts(call: SamplingCall, samples: Sequence[Sample], texts: Sequence[str],
                    context: RolloutContext) -> Rollouts:
    """The call's samples (prompt-major) and their texts recorded (`record_samples`) and packed for the learner
    with the rollout logprobs; a failed sample's response mask is off."""
    samples = list(samples)
    record_samples(context.sampling_metrics, samples, call.weight_version)
    prompt_width = padded_prompt_width(call.prompt_ids)
    response_width = call.params.max_new_tokens
    batch = train_step.pack_sequences(
        [call.prompt_ids[s.prompt_index] for s in samples],
        [s.output_ids for s in samples],
        pad_id=context.pad_id,
        prompt_width=prompt_width,
        response_width=response_width,
    )
    rollout = RolloutBatch.from_samples(samples, context.pad_id, response_width)
    batch["rollout_logp_bt"] = np.pad(rollout.logprobs_bt, ((0, 0), (prompt_width, 0)))
    batch["response_mask_bt"] &= ~np.array([bool(s.failure) for s in samples])[:, None]
    return Rollouts(samples=samples, texts=list(texts), batch=batch, prompt_width=prompt_width)


def sample_groups(prompts: Sequence[Any], context: RolloutContext, step: int, *, stream: int = 0,
                  gen_batch: int = 0) -> Rollouts:
    """`sampling.n` samples per prompt (chat messages or ids) from the engine, seeded by (run seed, step) (so a
    resumed run samples what the uninterrupted one did), decoded (`steps.response_text`, the text whose steps the
    judge numbers) and packed for the learner with the rollout logprobs.

    Prompts are capped here, for every recipe and role: a prompt longer than `context.max_prompt_tokens` is
    truncated (`truncate_prompt`, mode `context.prompt_truncation`) and sent to the engine as its truncated token
    ids, and counted in `context.sampling_metrics["prompt/truncated"]`; "prompt/length_max" is the longest prompt
    before truncation.

    A recipe that samples several times in one step (one call per role, a refinement pass) gives each call its
    own `stream` number, so that the calls draw independent randomness; `gen_batch` numbers dynamic sampling's
    generation batches within the step (`dynamic_groups`), each drawing its own. A stream or batch number enters
    the entropy only when it is not 0: `SeedSequence` pads its entropy with zeros, so (s, t) and (s, t, 0) would
    seed alike."""
    call = sampling_call(prompts, context, step, stream, gen_batch)
    with context.timer.phase("generation"):
        samples = context.engine.generate(call.prompts, call.params)
    return packed_rollouts(call, samples, [response_text(context.tokenizer, s.output_ids) for s in samples], context)


@dataclasses.dataclass(frozen=True)
class JudgedRollouts:
    """Rollouts (prompt-major) with each row's judge request and the verdicts [B, max_items]."""

    rollouts: Rollouts
    requests: list[JudgeRequest]
    verdicts: Verdicts


RequestOf = Callable[[Sample, str], JudgeRequest]  # a row's judge request from its sample and decoded text


def sample_and_judge(prompts: Sequence[Any], context: RolloutContext, step: int, request_of: RequestOf,
                     max_items: int, *, stream: int = 0, gen_batch: int = 0) -> JudgedRollouts:
    """`sample_groups`' rollouts, each judged: `request_of(sample, text)` is a row's request, judged with K =
    `max_items` as `judge_requests` does (a failed sample's not sent), verdicts in row order.

    Pipelined (`context.pipelined_judging`, the default): each group's requests go to the judge the moment the
    engine finishes the group (`sample_and_follow`), while later groups are still sampling; the rows, verdicts
    and judge records are assembled prompt-major once every group is in, so the result equals the serial one for
    a judge whose verdict depends on its request alone. Serial: exactly `sample_groups`, then `judge_requests`
    in one call."""
    if not context.pipelined_judging:
        rollouts = sample_groups(prompts, context, step, stream=stream, gen_batch=gen_batch)
        requests = [request_of(s, text) for s, text in zip(rollouts.samples, rollouts.texts)]
        return JudgedRollouts(rollouts, requests, judge_requests(requests, context, max_items, rollouts.failed_b))
    judge = context.judge.unrecorded

    async def judged(prompt_index: int, samples: list[Sample], texts: list[str]):
        requests = [request_of(s, text) for s, text in zip(samples, texts)]
        return requests, await judge_group(judge, requests, samples, max_items)

    rollouts, groups = sample_and_follow(prompts, context, step, judged, stream=stream, gen_batch=gen_batch)
    requests = [r for group_requests, _ in groups for r in group_requests]
    verdicts = Verdicts.concatenate([group_verdicts for _, group_verdicts in groups])
    context.judge.record(requests, verdicts)
    return JudgedRollouts(rollouts, requests, verdicts)


async def judge_group(judge: Judge, requests: Sequence[JudgeRequest], samples: Sequence[Sample],
                      max_items: int) -> Verdicts:
    """The verdicts [len, max_items] of one group's `requests` about its `samples`, awaited from `judge` (call it
    with a judge's `unrecorded` and record the rows once, in row order); a failed sample's request is not sent
    (`judge_requests`)."""
    sent = np.flatnonzero([not s.failure for s in samples])
    judged = await judge.ajudge([requests[i] for i in sent], max_items) if len(sent) else None
    return with_failed_samples(judged, sent, len(requests), max_items)


GroupFollow = Callable[[int, list[Sample], list[str]], Coroutine[Any, Any, T]]


def sample_and_follow(prompts: Sequence[Any], context: RolloutContext, step: int, follow: GroupFollow, *,
                      stream: int = 0, gen_batch: int = 0) -> tuple[Rollouts, list[T]]:
    """`sample_groups`' rollouts and, for each group, `await follow(prompt index, its samples, their texts)`: the
    step's work on that group once it is sampled (judging it, a second role's sampling from it with
    `asample_group` and judging that); (rollouts, the follow-ups' results in prompt order).

    Pipelined (`context.pipelined_judging`): a group's follow-up starts the moment the engine's stream yields the
    group (`RolloutEngine.stream_groups`), while later groups are still sampling; "generation" times the stream
    (the follow-ups that overlap it included) and "judging" the wait for the follow-ups after the last group.
    Serial: the whole call is sampled ("generation"), then every follow-up runs, concurrently ("judging"). A
    follow-up that reads nothing but its group, and draws its randomness from its group's index, gives the same
    result either way. A failure in the stream or in a follow-up cancels the follow-ups still running and
    raises."""
    if not context.pipelined_judging:
        rollouts, n = sample_groups(prompts, context, step, stream=stream, gen_batch=gen_batch), context.sampling.n
        with context.timer.phase("judging"):
            results = run_coroutine(_gathered(
                follow(p, rollouts.samples[p * n:(p + 1) * n], rollouts.texts[p * n:(p + 1) * n])
                for p in range(len(rollouts.samples) // n)))
        return rollouts, results
    call = sampling_call(prompts, context, step, stream, gen_batch)
    groups, results = run_coroutine(_followed_stream(call, context, follow))
    samples = [s for p in range(len(call.prompts)) for s in groups[p][0]]
    texts = [t for p in range(len(call.prompts)) for t in groups[p][1]]
    return packed_rollouts(call, samples, texts, context), results


async def _followed_stream(call: SamplingCall, context: RolloutContext, follow: GroupFollow
                           ) -> tuple[dict[int, tuple[list[Sample], list[str]]], list]:
    """({prompt index: (its samples, texts)}, the follow-ups' results in prompt order): each group's follow-up
    started as soon as the engine's stream yields the group (`sample_and_follow`)."""
    groups, following = {}, {}
    try:
        with context.timer.phase("generation"):
            async for p, samples in context.engine.stream_groups(call.prompts, call.params):
                texts = [response_text(context.tokenizer, s.output_ids) for s in samples]
                groups[p] = (samples, texts)
                following[p] = asyncio.ensure_future(follow(p, samples, texts))
        with context.timer.phase("judging"):
            results = await asyncio.gather(*(following[p] for p in range(len(call.prompts))))
    except BaseException:
        for task in following.values():
            task.cancel()
        raise
    return groups, list(results)


async def _gathered(coroutines) -> list:
    """The coroutines' results in order, run concurrently; the others cancelled when one fails."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


async def asample_group(prompts: Sequence[Any], context: RolloutContext, step: int, *, stream: int, group: int,
                        gen_batch: int = 0) -> Rollouts:
    """A second role's rollouts for one group of the step (a `sample_and_follow` follow-up's): `sample_groups`'
    of `prompts`, awaited, seeded by (run seed, step, stream, gen_batch, group + 1), so each group's draw is its
    own and the same whether the follow-ups run during sampling or after it. Not timed (the follow-up's phase
    is `sample_and_follow`'s)."""
    call = sampling_call(prompts, context, step, stream, gen_batch, group=group)
    samples = await context.engine.agenerate(call.prompts, call.params)
    return packed_rollouts(call, samples, [response_text(context.tokenizer, s.output_ids) for s in samples], context)


def run_coroutine(coroutine: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coroutine)`, in a worker thread when this thread already runs an event loop (a notebook's)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def record_samples(recorded: dict[str, float], samples: Sequence[Sample], version: str) -> None:
    """Adds one engine call's samples to `RolloutContext.sampling_metrics`: "rollout/samples", the failed ones by
    reason ("rollout/failed/<reason>", `Sample.failure`), the logprobs the server sent as null (-inf) in the
    others ("rollout/null_logprobs"), and the samples any of whose tokens came from weights other than `version`,
    the engine's when the call started ("rollout/stale": a weight update landed during the call)."""
    recorded["rollout/samples"] = recorded.get("rollout/samples", 0) + len(samples)
    for sample in samples:
        if sample.failure:
            key = f"rollout/failed/{sample.failure}"
            recorded[key] = recorded.get(key, 0) + 1
    null_logprobs = sum(int(np.isneginf(s.logprobs).sum()) for s in samples if not s.failure and s.logprobs)
    recorded["rollout/null_logprobs"] = recorded.get("rollout/null_logprobs", 0) + null_logprobs
    recorded["rollout/stale"] = recorded.get("rollout/stale", 0) + len(stale_samples(samples, version))


def failure_rate(metrics: Mapping[str, float]) -> Optional[float]:
    """The share of a step's samples that failed, from its `record_samples` counts; None without samples."""
    total = metrics.get("rollout/samples", 0)
    failed = sum(value for key, value in metrics.items() if key.startswith("rollout/failed/"))
    return failed / total if total else None


def concat_batches(parts: Sequence[tuple[Mapping[str, np.ndarray], int]], pad_id: int) -> tuple[dict, int]:
    """Rows of several packed batches (`pack_sequences` layout plus per-token and per-row arrays), each given with
    its prompt width, as one batch: every part is re-padded to the widest prompt region (left) and the longest
    response region (right), so all responses start at the returned prompt width. Token ids pad with `pad_id`,
    every other per-token array with 0 / False; per-row arrays ([B] or [B, K]) are concatenated as they are and
    must agree in trailing shape; the result equals packing every row at the common widths. The parts must have
    the same keys. For recipes whose roles have different prompts (RLCER's rubricator reads a CoT, RGR's
    refinement pass) but train in one update."""
    if not parts:
        raise ValueError("concat_batches needs at least one part")
    keys = set(parts[0][0])
    if any(set(batch) != keys for batch, _ in parts):
        raise ValueError(f"parts have different keys: {[sorted(batch) for batch, _ in parts]}")
    prompt_width = max(width for _, width in parts)
    response_width = max(batch["tokens_bt"].shape[1] - width for batch, width in parts)
    merged = {}
    for key in sorted(keys):
        arrays = []
        for batch, width in parts:
            value = np.asarray(batch[key])
            length = batch["tokens_bt"].shape[1]
            if key.endswith("_bt"):
                if value.shape[:2] != batch["tokens_bt"].shape:
                    raise ValueError(f"{key} has shape {value.shape}, expected {batch['tokens_bt'].shape}")
                trailing = ((0, 0),) * (value.ndim - 2)
                value = np.pad(value, ((0, 0), (prompt_width - width, 0)) + trailing,
                               constant_values=pad_id if key == "tokens_bt" else 0)
                right = ((0, 0), (0, response_width - (length - width))) + trailing
                # positions carry the last one into the right padding, as pack_sequences lays them out
                value = np.pad(value, right, mode="edge") if key == "positions_bt" else np.pad(
                    value, right, constant_values=pad_id if key == "tokens_bt" else 0)
            arrays.append(value)
        merged[key] = np.concatenate(arrays, axis=0)
    return merged, prompt_width


def rollout_request(example: Any, text: str, task: Task) -> JudgeRequest:
    """The judge request of one rollout: its example's question, rubric, reference (shown to the judge only) and
    prompt, the response text and its number of steps."""
    return JudgeRequest(question=task.question(example), response=text, rubric=task.rubric(example),
                        reference=task.reference(example), num_steps=len(split_steps(text)),
                        conversation=tuple(task.prompt(example)))


def rollout_requests(examples: Sequence[Any], rollouts: Rollouts, task: Task) -> list[JudgeRequest]:
    """One judge request per rollout (row order), `rollout_request` of the row's example."""
    return [rollout_request(examples[s.prompt_index], text, task) for s, text in zip(rollouts.samples, rollouts.texts)]


def judge_requests(requests: Sequence[JudgeRequest], context: RolloutContext, max_items: int,
                   failed_b: Optional[np.ndarray] = None) -> Verdicts:
    """The context's judge on `requests` in one call, timed as the "judging" phase: verdicts [len, max_items].
    A request about a failed sample (`failed_b`, [len] bool; None: none) is not sent: its verdict is a failure
    with reason FAILED_SAMPLE, so the recipe's `on_judge_failure` decides its group's statistics (the sample
    itself is out of the loss already). The judge records every row, sent or not, in row order
    (`Judge.record`), so the rollout log keeps the failed samples too."""
    failed_b = np.zeros(len(requests), bool) if failed_b is None else np.asarray(failed_b, bool)
    sent = np.flatnonzero(~failed_b)
    with context.timer.phase("judging"):
        judged = context.judge.unrecorded.judge([requests[i] for i in sent], max_items) if len(sent) else None
    verdicts = with_failed_samples(judged, sent, len(requests), max_items)
    context.judge.record(list(requests), verdicts)
    return verdicts


def with_failed_samples(judged: Optional[Verdicts], sent: np.ndarray, total: int, max_items: int) -> Verdicts:
    """Verdicts [total, max_items] whose rows `sent` are `judged`'s, in order, and the others failures with reason
    FAILED_SAMPLE."""
    satisfied = np.zeros((total, max_items), np.float32)
    steps = np.full((total, max_items), -1, np.int32)
    reasons, details, answers = [FAILED_SAMPLE] * total, [""] * total, [""] * total
    if judged is not None:
        satisfied[sent], steps[sent] = judged.satisfied_bk, judged.item_step_bk
        for i, row in enumerate(sent):
            reasons[row], details[row], answers[row] = judged.reasons[i], judged.details[i], judged.answers[i]
    return Verdicts(satisfied, steps, np.array([bool(r) for r in reasons]), tuple(reasons), tuple(details),
                    tuple(answers))


def judge_rollouts(
    examples: Sequence[Any], rollouts: Rollouts, context: RolloutContext, max_items: int
) -> tuple[Verdicts, list[Rubric]]:
    """Every rollout judged against its example's rubric (`rollout_requests`; failed samples not sent:
    `judge_requests`); returns the verdicts [B, max_items] and each row's rubric. A recipe that hands the rollout
    log its values judges through `judge_groups`, which keeps the requests."""
    requests = rollout_requests(examples, rollouts, context.task)
    return judge_requests(requests, context, max_items, rollouts.failed_b), [r.rubric for r in requests]


def judge_groups(groups: "GroupBatch", context: RolloutContext, max_items: int) -> "GroupBatch":
    """`groups` with every rollout judged against its example's rubric (`rollout_requests`): its verdicts
    [B, max_items], each row's rubric and each row's judge request (the object the judge was handed, which
    `recipe_values` pairs with the row's values)."""
    requests = rollout_requests(groups.examples, groups.rollouts, context.task)
    verdicts = judge_requests(requests, context, max_items, groups.rollouts.failed_b)
    return dataclasses.replace(groups, verdicts=verdicts,
                               rubrics=[r.rubric for r in requests], requests=requests)


def outcome_correctness(examples: Sequence[Any], rollouts: Rollouts, task: Task) -> np.ndarray:
    """[B] bool: each rollout's answer checked by the task's verifier (`Task.is_correct`), in row order."""
    return np.array([task.is_correct(text, examples[s.prompt_index])
                     for s, text in zip(rollouts.samples, rollouts.texts)], bool)


def recipe_values(requests: Sequence[JudgeRequest], reward_b: np.ndarray, advantage_b: Optional[np.ndarray],
                  group_ids: np.ndarray, rows: Optional[Sequence[int]] = None) -> RecipeValues:
    """`Experience.recipe_values` of judged rows: request i is about batch row rows[i] (None: row i), whose values
    are {"reward": reward_b[row], "advantage": advantage_b[row], "group": group_ids[row]}. `advantage_b` is what
    the learner trains the row with (0 for a row out of the loss); None leaves "advantage" out (a critic's
    advantages come later, from the trainer). Python floats and ints, as the rollout log writes them."""
    rows = range(len(requests)) if rows is None else rows
    pairs = []
    for request, row in zip(requests, rows):
        values = {"reward": float(reward_b[row]), "group": int(group_ids[row])}
        if advantage_b is not None:
            values["advantage"] = float(advantage_b[row])
        pairs.append((request, values))
    return tuple(pairs)


def criterion_metric_keys(criterion: Criterion, recurring_names: Optional[Set[str]] = None) -> tuple[str, ...]:
    """The metric keys a criterion's verdict is averaged under: "rubric/<name>" when it has a name that recurs
    across the task's rubrics (`recurring_names`; None: every name does), else "rubric/tag/<tag>" for each of its
    tags (HealthBench's "axis:accuracy", "theme:..."), else "rubric/untagged". Never its position: the k-th
    criteria of different rubrics are different criteria, and a name that only one rubric has would make one key
    per row of the dataset."""
    if criterion.name is not None and (recurring_names is None or criterion.name in recurring_names):
        return (f"rubric/{criterion.name}",)
    return tuple(f"rubric/tag/{tag}" for tag in criterion.tags) or ("rubric/untagged",)


def criterion_metrics(verdicts: Verdicts, rubrics: Sequence[Rubric], task: Any = None) -> dict[str, float]:
    """Per-criterion satisfaction rates under `criterion_metric_keys` (the task's `recurring_criterion_names`,
    absent or None: every name recurs), each over the criteria of the rows that have that key, failed rows
    included as unsatisfied."""
    recurring = getattr(task, "recurring_criterion_names", None)
    totals, counts = collections.defaultdict(float), collections.defaultdict(int)
    for b, rubric in enumerate(rubrics):
        for k, criterion in enumerate(rubric.criteria):
            for key in criterion_metric_keys(criterion, recurring):
                totals[key] += float(verdicts.satisfied_bk[b, k])
                counts[key] += 1
    return {key: totals[key] / counts[key] for key in totals}


def rubric_metrics(verdicts: Verdicts, rubrics: Sequence[Rubric], task: Any = None) -> dict[str, float]:
    """Per-criterion satisfaction rates (`criterion_metrics`: "rubric/<name>", "rubric/tag/<tag>"), and judge
    failures: "judge/failure_rate", "judge/failed/<reason>", over the rollouts sent to the judge (a failed sample's
    FAILED_SAMPLE verdict is the engine's failure, counted under "rollout/failed/")."""
    metrics = criterion_metrics(verdicts, rubrics, task)
    sent_b = np.array([reason != FAILED_SAMPLE for reason in verdicts.reasons], bool)
    metrics["judge/failure_rate"] = float(np.mean(verdicts.failed_b[sent_b])) if sent_b.any() else 0.0
    for reason, count in verdicts.failure_counts().items():
        if reason != FAILED_SAMPLE:
            metrics[f"judge/failed/{reason}"] = float(count)
    return metrics


def rollout_metrics(rollouts: Rollouts, correct_b: np.ndarray, task: Any) -> dict[str, float]:
    """Response lengths, the truncated fraction (finish reason "length"), and outcome accuracy ("outcome/accuracy",
    only for a task with outcome answers: `has_outcome`)."""
    lengths = np.array([len(s.output_ids) for s in rollouts.samples], np.float64)
    metrics = {
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated_fraction": float(np.mean([s.finish_reason == "length" for s in rollouts.samples])),
    }
    if has_outcome(task):
        metrics["outcome/accuracy"] = float(np.mean(correct_b))
    return metrics


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


# ---------------------------------------------------------------- dynamic sampling (DAPO; verl's filter_groups)

# A recipe config's `dynamic_sampling` key: a mode, or the boolean of the configs written before the modes existed
# (`dynamic_sampling_mode`).
DynamicSampling = Literal[False, True, "off", "mask", "resample"]
DYNAMIC_SAMPLING_MODES = ("off", "mask", "resample")


def dynamic_sampling_mode(value: Any) -> str:
    """A recipe's `dynamic_sampling` as one of DYNAMIC_SAMPLING_MODES: "off" (every group trains), "mask" (the
    groups a recipe's filter finds uninformative keep their rows with the response mask off: the batch's shape
    stays, fewer prompts train) or "resample" (DAPO's: further generation batches until the step has
    prompts_per_step informative groups, `dynamic_groups`). A boolean reads as it did before the modes existed:
    true "mask", false "off" (YAML also reads a bare `off` as false). ValueError for anything else."""
    if isinstance(value, bool):
        return "mask" if value else "off"
    if value not in DYNAMIC_SAMPLING_MODES:
        raise ValueError(f"dynamic_sampling must be one of {list(DYNAMIC_SAMPLING_MODES)} (or true / false: mask / "
                         f"off), got {value!r}")
    return value


def check_resampling(mode: str, max_num_gen_batches: int, gen_batch_prompts: Optional[int]) -> None:
    """ValueError unless the re-sampling settings are valid for `mode`: max_num_gen_batches >= 0 (0: no cap, verl's
    default) and gen_batch_prompts None or >= 1, each set only with mode "resample" (else it would read as a
    setting that has no effect)."""
    if max_num_gen_batches < 0:
        raise ValueError(f"max_num_gen_batches must be >= 0 (0: no cap), got {max_num_gen_batches}")
    if gen_batch_prompts is not None and gen_batch_prompts < 1:
        raise ValueError(f"gen_batch_prompts must be None (prompts_per_step) or >= 1, got {gen_batch_prompts}")
    if mode != "resample" and (max_num_gen_batches or gen_batch_prompts is not None):
        raise ValueError(f"max_num_gen_batches and gen_batch_prompts are settings of dynamic_sampling resample, "
                         f"not of {mode}")


@dataclasses.dataclass(frozen=True)
class GroupBatch:
    """Sampled groups as a recipe scores them: the examples (one per group), their rollouts (G rows each,
    prompt-major: row b belongs to group b // G), each row's outcome correctness (`Task.is_correct`), and, once
    judged (`judge_groups`), the verdicts [B, K], each row's rubric and each row's judge request. `extras` holds
    per-row arrays [B, ...] a recipe draws with its groups (GRPO's ReMax baseline); dynamic sampling selects and
    concatenates them with the rows."""

    examples: list
    rollouts: Rollouts
    correct_b: np.ndarray
    verdicts: Optional[Verdicts] = None
    rubrics: Optional[list[Rubric]] = None
    requests: Optional[list[JudgeRequest]] = None
    extras: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def owners(self) -> list:
        """Each row's example."""
        return [self.examples[s.prompt_index] for s in self.rollouts.samples]


def group_rows(group_ids: np.ndarray, groups: Sequence[int]) -> np.ndarray:
    """The rows of `groups`, group after group in the given order, each group's rows in batch order."""
    return np.concatenate([np.flatnonzero(group_ids == g) for g in groups] + [np.zeros(0, np.int64)])


def take_groups(groups: GroupBatch, chosen: Sequence[int]) -> GroupBatch:
    """The groups `chosen` (indices into `groups.examples`) of `groups`, in that order, renumbered 0, 1, ..."""
    rollouts = groups.rollouts
    rows = group_rows(rollouts.group_ids, chosen)
    position = {int(g): i for i, g in enumerate(chosen)}
    samples = [dataclasses.replace(rollouts.samples[r], prompt_index=position[rollouts.samples[r].prompt_index])
               for r in rows]
    taken = Rollouts(samples=samples, texts=[rollouts.texts[r] for r in rows],
                     batch={key: value[rows] for key, value in rollouts.batch.items()},
                     prompt_width=rollouts.prompt_width)
    return GroupBatch(
        examples=[groups.examples[g] for g in chosen], rollouts=taken, correct_b=groups.correct_b[rows],
        verdicts=None if groups.verdicts is None else groups.verdicts.take(rows),
        rubrics=None if groups.rubrics is None else [groups.rubrics[r] for r in rows],
        requests=None if groups.requests is None else [groups.requests[r] for r in rows],
        extras={key: value[rows] for key, value in groups.extras.items()})


def concat_rollouts(parts: Sequence[Rollouts], pad_id: int) -> Rollouts:
    """The rollouts of `parts` (non-empty, each prompt-major over its own prompts) as one Rollouts, part after
    part, the prompt indices running over every part's prompts; the packed rows re-padded to the widest prompt
    (`concat_batches`: equal to packing every row at the common widths). For a second role sampled group by
    group (`asample_group`) and for dynamic sampling's generation batches."""
    if not parts:
        raise ValueError("concat_rollouts needs at least one part")
    samples, offset = [], 0
    for part in parts:
        samples += [dataclasses.replace(s, prompt_index=s.prompt_index + offset) for s in part.samples]
        offset += 1 + max((s.prompt_index for s in part.samples), default=-1)
    batch, prompt_width = concat_batches([(part.batch, part.prompt_width) for part in parts], pad_id)
    return Rollouts(samples=samples, texts=[t for part in parts for t in part.texts], batch=batch,
                    prompt_width=prompt_width)


def concat_groups(parts: Sequence[GroupBatch], pad_id: int) -> GroupBatch:
    """The groups of `parts` (non-empty, each judged or none, with the same extras) as one GroupBatch, part after
    part; the packed rows re-padded to the widest prompt (`concat_rollouts`)."""
    if not parts:
        raise ValueError("concat_groups needs at least one part")
    rollouts = concat_rollouts([p.rollouts for p in parts], pad_id)
    judged = parts[0].verdicts is not None
    if any((p.verdicts is not None) != judged for p in parts):
        raise ValueError("concat_groups needs every part judged or none")
    verdicts = Verdicts.concatenate([p.verdicts for p in parts]) if judged else None
    return GroupBatch(examples=[e for p in parts for e in p.examples], rollouts=rollouts,
                      correct_b=np.concatenate([p.correct_b for p in parts]), verdicts=verdicts,
                      rubrics=[r for p in parts for r in p.rubrics] if judged else None,
                      requests=None if any(p.requests is None for p in parts) else [
                          r for p in parts for r in p.requests],
                      extras={key: np.concatenate([p.extras[key] for p in parts]) for key in parts[0].extras})


def group_decisions(keep_b: np.ndarray, group_ids: np.ndarray, groups: int) -> np.ndarray:
    """[groups] bool: a group is kept when any of its rows is (`core.rubric_validity.dapo_group_filter` decides per
    group, so the rows of a kept group that are off are rows masked out of it, not a different decision)."""
    keep_g = np.zeros(groups, bool)
    np.logical_or.at(keep_g, np.asarray(group_ids), np.asarray(keep_b, bool))
    return keep_g


def dynamic_groups(
    examples: Sequence[Any],
    context: RolloutContext,
    config: Any,
    draw: Callable[[list, int], GroupBatch],
    informative: Callable[[GroupBatch], np.ndarray],
) -> tuple[GroupBatch, np.ndarray, dict[str, float]]:
    """A step's groups under dynamic sampling (DAPO, Yu et al. 2025, section 3.2 and Algorithm 1; verl's
    `recipe/dapo` `filter_groups`): (the groups that train, keep_b [B] bool, metrics).

    `config` is the recipe's config, with `dynamic_sampling` (a mode of `dynamic_sampling_mode`; a config without
    it: "off"), `max_num_gen_batches` and `gen_batch_prompts`. `draw(examples, gen_batch)` samples (seeded by the
    generation batch, `sample_groups`' `gen_batch`) and judges the groups of `examples`, as far as `informative` needs;
    `informative(groups)` is the recipe's filter, [B] bool rows to keep (eq 11: a group whose accuracy, or reward,
    is the same for every rollout has no gradient and is not kept).

    - "off": `draw(examples, 0)`, every row kept. "mask": the same groups, keep_b = `informative`'s rows.
    - "resample": generation batches of `gen_batch_prompts` examples (None: prompts_per_step), the first the step's
      `examples` completed from `context.stream`, each later one the stream's next, until every process holds
      its quota (prompts_per_step / P) of informative groups or `max_num_gen_batches` batches are drawn (0: no
      cap; then a step whose prompts are all solved or all failed draws for ever, as verl's). The informative
      groups of this process beyond its quota are dropped (the first kept first, verl's trimming to the train
      batch size); with P processes the decision to draw again is taken on the smallest count over the processes
      (`ExampleStream.fewest`), the same on every process, so the streams stay in step and every share trains
      exactly its quota. When the cap stops the step short, verl raises; here the informative groups train and
      the step is filled to its quota with the first uninformative groups drawn, their rows off (keep_b False, as
      "mask" leaves them): the batch keeps its shape, and a step with no informative group trains on nothing.
      Metrics: "dynamic_sampling/gen_batches" (batches drawn), "dynamic_sampling/groups_drawn" and
      "dynamic_sampling/groups_kept" (informative groups that train; both of this process's share) and
      "dynamic_sampling/cap_hit" (1 when the cap stopped the step short).
      The draws move the stream, so the data position a checkpoint saves includes them and a resumed run draws
      what the uninterrupted one did; the seeds are a function of (run seed, step, generation batch)."""
    mode = getattr(config, "dynamic_sampling", "off")
    if mode != "resample":
        groups = draw(list(examples), 0)
        keep_b = informative(groups) if mode == "mask" else np.ones(len(groups.correct_b), bool)
        return groups, keep_b, {}
    stream = context.stream
    if stream is None:
        raise ValueError("dynamic_sampling resample draws further examples from the run's train stream, and this "
                         "rollout context has none (RolloutContext.stream)")
    size = config.gen_batch_prompts or stream.prompts_per_step
    if size < stream.prompts_per_step:
        raise ValueError(f"gen_batch_prompts ({size}) must be at least prompts_per_step ({stream.prompts_per_step})")
    quota = stream.quota
    batch_examples = list(examples) + stream.next_share(size - stream.prompts_per_step)
    kept, uninformative = [], []  # (groups, keep_b) of the informative groups (up to the quota), of the others
    kept_count = uninformative_count = drawn = 0
    gen_batch = 0
    while True:
        groups = draw(batch_examples, gen_batch)
        keep_b = np.asarray(informative(groups), bool)
        keep_g = group_decisions(keep_b, groups.rollouts.group_ids, len(groups.examples))
        drawn += len(groups.examples)
        for chosen, parts in ((np.flatnonzero(keep_g)[:quota - kept_count], kept),
                              (np.flatnonzero(~keep_g)[:quota - uninformative_count], uninformative)):
            if len(chosen):
                parts.append((take_groups(groups, chosen), keep_b[group_rows(groups.rollouts.group_ids, chosen)]))
        kept_count = sum(len(p.examples) for p, _ in kept)
        uninformative_count = sum(len(p.examples) for p, _ in uninformative)
        gen_batch += 1
        full = stream.fewest(kept_count) >= quota
        if full or 0 < config.max_num_gen_batches <= gen_batch:
            break
        if gen_batch % LONG_DRAW_BATCHES == 0:  # with no cap, a run whose prompts are all solved would draw silently
            _LOG.warning("dynamic sampling: %d generation batches drawn, %d of %d informative groups kept on this "
                         "process (max_num_gen_batches %d)", gen_batch, kept_count, quota, config.max_num_gen_batches)
        batch_examples = stream.next_share(size)
    candidates = kept + uninformative  # the informative groups first, then those that fill a short step
    merged = concat_groups([p for p, _ in candidates], context.pad_id)
    selected = take_groups(merged, range(quota))
    keep_b = np.concatenate([k for _, k in candidates])[group_rows(merged.rollouts.group_ids, range(quota))]
    metrics = {"dynamic_sampling/gen_batches": float(gen_batch), "dynamic_sampling/groups_drawn": float(drawn),
               "dynamic_sampling/groups_kept": float(kept_count), "dynamic_sampling/cap_hit": float(not full)}
    return selected, keep_b, metrics


# ---------------------------------------------------------------- the response-level skeleton


class GroupRecipe(Algorithm):
    """The algorithm box the response-level recipes share (RaR, GRPO, DAPO, rubric-grounded GRPO): one scalar
    reward per response, a group-relative advantage on every response token. For each step (G = sampling.n):

      1. sample G responses per prompt, judge them, check their answers     draw
         (a config with `dynamic_sampling`: further generation batches,     dynamic_groups, informative
         or the uninformative groups masked)
      2. r_i [B], and valid_b [B]: the rows in the group statistics          reward
      3. A_i [B] from the rewards, group ids and valid rows                  advantage
      4. A_i on the response tokens of the rows that train (valid and kept)  core.advantages.broadcast_to_tokens
      5. the step's metrics                                                  metrics
      and, for the rollout log, each judged row's reward, advantage, group   recipe_values

    Each numbered step is a method with the signature documented on it: a variant overrides the step it changes
    (a new reward, a new estimator) and inherits the others, sampling, judging, packing, dynamic sampling and
    metrics included, so a fix to them reaches it. The config has `policy_loss`; a judged recipe's also
    `max_items` (the rubric width K), and the default advantage reads `std_ddof` and `eps`."""

    @property
    def policy_loss(self) -> PolicyLossConfig:
        return self.config.policy_loss

    def draw(self, examples: list, context: RolloutContext, step: int, gen_batch: int) -> GroupBatch:
        """Step 1 for generation batch `gen_batch` of the step (`dynamic_groups`' `draw`; 0 without dynamic
        sampling): G responses to each example's prompt, each judged against its rubric as its group finishes
        (`sample_and_judge`, K = config.max_items), and each answer's correctness (`outcome_correctness`)."""
        task = context.task
        judged = sample_and_judge([task.prompt(e) for e in examples], context, step,
                                  lambda s, text: rollout_request(examples[s.prompt_index], text, task),
                                  self.config.max_items, gen_batch=gen_batch)
        return GroupBatch(examples=examples, rollouts=judged.rollouts,
                          correct_b=outcome_correctness(examples, judged.rollouts, task), verdicts=judged.verdicts,
                          rubrics=[r.rubric for r in judged.requests], requests=judged.requests)

    @abc.abstractmethod
    def reward(self, groups: GroupBatch, context: RolloutContext) -> tuple[np.ndarray, np.ndarray]:
        """Step 2: (reward_b [B] float32, valid_b [B] bool) of the drawn `groups` (rows prompt-major; verdicts,
        rubrics and correctness in `groups`): each rollout's reward, and the rows that take part in their group's
        statistics and the loss (a failed judgement under an "exclude" policy is not valid)."""

    def informative(self, groups: GroupBatch, context: RolloutContext) -> np.ndarray:
        """Dynamic sampling's filter (`dynamic_groups`' `informative`), [B] bool: the valid rows of the groups whose
        rewards differ (`core.rubric_validity.dapo_group_filter` on `reward`); a group whose rewards tie has no
        gradient. Read only when the config has `dynamic_sampling` other than "off"."""
        reward_b, valid_b = self.reward(groups, context)
        return np.asarray(rubric_validity.dapo_group_filter(
            jnp.asarray(reward_b), jnp.asarray(groups.rollouts.group_ids), jnp.asarray(valid_b)))

    def advantage(self, reward_b: np.ndarray, group_ids: np.ndarray, valid_b: np.ndarray,
                  groups: GroupBatch) -> np.ndarray:
        """Step 3: advantage_b [B] float32 from the rewards [B], the group ids [B] (row b's prompt) and the valid
        rows [B] (0 on the others); `groups` holds what else an estimator may read (verdicts and rubrics for a
        per-criterion one, the rollouts' lengths, `extras`). The default is GRPO's, (r - mean_g) / (std_g + eps)
        over the valid rows, std by config.std_ddof (`core.advantages.grpo_advantages`)."""
        del groups
        return np.asarray(advantages.grpo_advantages(
            jnp.asarray(reward_b), jnp.asarray(group_ids), jnp.asarray(valid_b), std_ddof=self.config.std_ddof,
            eps=self.config.eps))

    def metrics(self, groups: GroupBatch, reward_b: np.ndarray, advantage_b: np.ndarray, trained_b: np.ndarray,
                context: RolloutContext) -> dict[str, float]:
        """Step 5: "reward/*" over every row, "advantage/*" over the rows that train (`trained_b`, valid and kept
        by dynamic sampling), "rubric/*" and "judge/*" when the groups were judged (`rubric_metrics`),
        "response/*" and "outcome/accuracy" (`rollout_metrics`). A recipe adds its own to these (dynamic
        sampling's are added after)."""
        metrics = {**summary_stats("reward", reward_b), **summary_stats("advantage", advantage_b, trained_b)}
        if groups.verdicts is not None:
            metrics.update(rubric_metrics(groups.verdicts, groups.rubrics, context.task))
        metrics.update(rollout_metrics(groups.rollouts, groups.correct_b, context.task))
        return metrics

    def experience(self, examples: Sequence[Any], context: RolloutContext, step: int) -> Experience:
        groups, keep_b, sampling_metrics = dynamic_groups(
            examples, context, self.config, lambda batch, gen_batch: self.draw(batch, context, step, gen_batch),
            lambda drawn: self.informative(drawn, context))
        group_ids = groups.rollouts.group_ids
        reward_b, valid_b = self.reward(groups, context)
        advantage_b = self.advantage(reward_b, group_ids, valid_b, groups)
        trained_b = valid_b & keep_b
        batch = dict(groups.rollouts.batch)
        batch["response_mask_bt"] = batch["response_mask_bt"] & trained_b[:, None]
        batch["advantages_bt"] = np.asarray(advantages.broadcast_to_tokens(
            jnp.asarray(advantage_b), jnp.asarray(batch["response_mask_bt"])))
        metrics = {**self.metrics(groups, reward_b, advantage_b, trained_b, context), **sampling_metrics}
        values = recipe_values(groups.requests or (), reward_b, np.where(trained_b, advantage_b, 0.0), group_ids)
        return Experience(batch=batch, prompt_width=groups.rollouts.prompt_width, metrics=metrics,
                          recipe_values=values)
