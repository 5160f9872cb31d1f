"""DAPO, "Decoupled Clip and Dynamic sAmpling Policy Optimization" (Yu et al. 2025): outcome-reward GRPO with
four changes, each its own switch here: clip-higher (eps_low 0.2, eps_high 0.28), dynamic sampling, a
token-level loss (token-mean aggregation) and overlong reward shaping; no KL term.

For each step (G = sampling.n responses per prompt):
  1. sample G responses per prompt                               base.sample_groups
  2. r_i = +1 if task.is_correct(o_i) else -1 (section 2.4)     core.rewards.rlcer_outcome_reward
  3. r_i += R_length(|o_i|) (eq 13): 0 up to L_max - buffer,      core.rewards.dapo_overlong_shaping
     then a linear ramp to -factor at L_max                      (switch: overlong_shaping)
  4. A_i = (r_i - mean_g r) / (std_g r + eps), sample std        core.advantages.grpo_advantages
  5. dynamic sampling (eq 11, Algorithm 1): a group whose        core.rubric_validity.dapo_group_filter,
     answers are all right or all wrong has no gradient;         base.dynamic_groups
     "resample": further generation batches until                (switch: dynamic_sampling;
     prompts_per_step groups with mixed answers are kept;         max_num_gen_batches, gen_batch_prompts)
     "mask": its rows are masked out of the loss
  6. clipped update with (eps_low, eps_high) = (0.2, 0.28),       base.policy_loss_fn
     token-mean aggregation (eq 12), no KL

Dynamic sampling: "resample" is DAPO's (verl's `filter_groups`, metric acc: generation batches of
`gen_batch_prompts`, the informative groups kept in sampling order and trimmed to prompts_per_step, at most
`max_num_gen_batches` batches; `base.dynamic_groups`, which also says what a step cut short by the cap trains on).
"mask" (the default, what this recipe did before the modes) keeps the batch's fixed shape without re-sampling: a
filtered group's response mask is switched off, so it adds nothing to any loss sum or denominator, and fewer
prompts train. "dapo/kept_group_fraction" logs the fraction of the step's groups that train. The filter reads
accuracy (eq 11's 0 < |{correct}| < G), not the shaped reward, as DAPO does.
"""

import dataclasses
from typing import Any, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from rubric_jax.algorithms import base
from rubric_jax.algorithms.grpo import outcome_rollouts
from rubric_jax.algorithms.registry import register
from rubric_jax.core import advantages, rewards, rubric_validity


@dataclasses.dataclass(frozen=True)
class DAPOConfig:
    """dynamic_sampling / overlong_shaping: DAPO's switches (steps 5 and 3); dynamic_sampling is "off", "mask"
    (the default, kept from before the modes: true reads as it) or "resample" (DAPO's, `base.dynamic_groups`),
    with max_num_gen_batches (0: no cap, verl's default) and gen_batch_prompts (None: prompts_per_step, verl's
    default) for "resample" only; max_length: L_max in tokens (None: the rollout's max_new_tokens);
    overlong_buffer / overlong_factor: eq 13's L_cache and its penalty at L_max (DAPO's 4096 and 1); std_ddof /
    eps: GRPO's std (1: sample std) and epsilon. The policy loss defaults to DAPO's: clip-higher, token-mean, no
    KL."""

    policy_loss: base.PolicyLossConfig = base.PolicyLossConfig(eps_low=0.2, eps_high=0.28)
    dynamic_sampling: base.DynamicSampling = "mask"
    max_num_gen_batches: int = 0
    gen_batch_prompts: Optional[int] = None
    overlong_shaping: bool = True
    max_length: Optional[int] = None
    overlong_buffer: int = 4096
    overlong_factor: float = 1.0
    std_ddof: int = 1
    eps: float = 1e-6

    def __post_init__(self):
        object.__setattr__(self, "dynamic_sampling", base.dynamic_sampling_mode(self.dynamic_sampling))
        base.check_resampling(self.dynamic_sampling, self.max_num_gen_batches, self.gen_batch_prompts)
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"max_length must be None or >= 1, got {self.max_length}")
        if self.overlong_buffer < 0:
            raise ValueError(f"overlong_buffer must be >= 0, got {self.overlong_buffer}")
        if not self.overlong_factor >= 0:
            raise ValueError(f"overlong_factor must be >= 0, got {self.overlong_factor}")
        if self.max_length is not None and self.overlong_shaping and self.overlong_buffer >= self.max_length:
            raise ValueError(f"overlong_buffer ({self.overlong_buffer}) must be shorter than max_length "
                             f"({self.max_length}), or every response would be punished")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof must be 0 or 1, got {self.std_ddof}")
        if not self.eps >= 0:
            raise ValueError(f"eps must be >= 0, got {self.eps}")


def kept_group_fraction(keep_b: np.ndarray, group_ids: np.ndarray) -> float:
    """The fraction of the batch's groups that a per-group filter keeps."""
    return len(np.unique(group_ids[keep_b])) / len(np.unique(group_ids))


def mixed_accuracy(groups: base.GroupBatch) -> np.ndarray:
    """Eq 11's filter on accuracy: [B] bool, the rows of the groups whose answers are neither all right nor all
    wrong (`core.rubric_validity.dapo_group_filter`)."""
    return np.asarray(rubric_validity.dapo_group_filter(
        jnp.asarray(groups.correct_b, jnp.float32), jnp.asarray(groups.rollouts.group_ids)))


def outcome_groups(examples: list, context: base.RolloutContext, step: int, gen_batch: int) -> base.GroupBatch:
    """Step 1 and the verifier's verdicts of generation batch `gen_batch` (`base.dynamic_groups`' `draw`)."""
    rollouts, correct_b = outcome_rollouts(examples, context, step, gen_batch=gen_batch)
    return base.GroupBatch(examples=examples, rollouts=rollouts, correct_b=correct_b)


@register("dapo")
class DAPO(base.Algorithm):
    config_class = DAPOConfig

    @property
    def policy_loss(self) -> base.PolicyLossConfig:
        return self.config.policy_loss

    def _max_length(self, context: base.RolloutContext) -> int:
        max_length = self.config.max_length or context.sampling.max_new_tokens
        if self.config.overlong_shaping and self.config.overlong_buffer >= max_length:
            raise ValueError(f"overlong_buffer ({self.config.overlong_buffer}) must be shorter than L_max "
                             f"({max_length}, the rollout's max_new_tokens), or every response would be punished")
        return max_length

    def experience(self, examples: Sequence[Any], context: base.RolloutContext, step: int) -> base.Experience:
        config = self.config
        max_length = self._max_length(context)
        groups, keep_b, sampling_metrics = base.dynamic_groups(
            examples, context, config, lambda batch, gen_batch: outcome_groups(batch, context, step, gen_batch),
            mixed_accuracy)
        rollouts, correct_b = groups.rollouts, groups.correct_b
        group_ids = rollouts.group_ids
        outcome_b = np.asarray(rewards.rlcer_outcome_reward(jnp.asarray(correct_b)))
        reward_b = outcome_b
        if config.overlong_shaping:
            lengths_b = np.array([len(s.output_ids) for s in rollouts.samples], np.int32)
            reward_b = np.asarray(rewards.dapo_overlong_shaping(
                jnp.asarray(outcome_b), jnp.asarray(lengths_b), max_length=max_length,
                buffer_length=config.overlong_buffer, factor=config.overlong_factor))
        advantage_b = np.asarray(advantages.grpo_advantages(
            jnp.asarray(reward_b), jnp.asarray(group_ids), std_ddof=config.std_ddof, eps=config.eps))
        batch = dict(rollouts.batch)
        batch["response_mask_bt"] = batch["response_mask_bt"] & keep_b[:, None]
        batch["advantages_bt"] = np.asarray(
            advantages.broadcast_to_tokens(jnp.asarray(advantage_b), jnp.asarray(batch["response_mask_bt"])))
        metrics = {
            **base.summary_stats("reward", reward_b),
            **base.summary_stats("advantage", advantage_b, keep_b),
            **base.rollout_metrics(rollouts, correct_b, context.task),
            "dapo/kept_group_fraction": kept_group_fraction(keep_b, group_ids),
            "dapo/overlong_penalty_mean": float(np.mean(outcome_b - reward_b)),
            **sampling_metrics,
        }
        return base.Experience(batch=batch, prompt_width=rollouts.prompt_width, metrics=metrics)
