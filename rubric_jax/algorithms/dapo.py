"""DAPO, "Decoupled Clip and Dynamic sAmpling Policy Optimization" (Yu et al. 2025): outcome-reward GRPO with
four changes, each its own switch here: clip-higher (eps_low 0.2, eps_high 0.28), dynamic sampling, a
token-level loss (token-mean aggregation) and overlong reward shaping; no KL term.

For each step (G = sampling.n responses per prompt; the steps of `base.GroupRecipe`, each its method):
  1. sample G responses per prompt, check their answers          draw: grpo.outcome_groups
     dynamic sampling (eq 11, Algorithm 1): a group whose        informative: mixed_accuracy
     answers are all right or all wrong has no gradient;         (core.rubric_validity.dapo_group_filter),
     "resample": further generation batches until                base.dynamic_groups
     prompts_per_step groups with mixed answers are kept;         (switch: dynamic_sampling;
     "mask": its rows are masked out of the loss                  max_num_gen_batches, gen_batch_prompts)
  2. r_i = +1 if task.is_correct(o_i) else -1 (section 2.4)     reward: core.rewards.rlcer_outcome_reward
     r_i += R_length(|o_i|) (eq 13): 0 up to L_max - buffer,      core.rewards.dapo_overlong_shaping
     then a linear ramp to -factor at L_max                      (switch: overlong_shaping)
  3. A_i = (r_i - mean_g r) / (std_g r + eps), sample std        advantage: core.advantages.grpo_advantages
  4. A_i on the response tokens of the kept groups               core.advantages.broadcast_to_tokens
  5. clipped update with (eps_low, eps_high) = (0.2, 0.28),       base.policy_loss_fn
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
import types
from typing import Optional

import jax.numpy as jnp
import numpy as np

from rubric_jax.algorithms import base
from rubric_jax.algorithms.grpo import outcome_groups
from rubric_jax.algorithms.registry import register
from rubric_jax.core import rewards, rubric_validity


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


@register("dapo")
class DAPO(base.GroupRecipe):
    config_class = DAPOConfig
    console_metrics = ("dapo/kept_group_fraction",)
    plot_panels = types.MappingProxyType({
        "dapo/sampling": ("dapo/kept_group_fraction", "dapo/overlong_penalty_mean"),
    })

    def _max_length(self, context: base.RolloutContext) -> int:
        max_length = self.config.max_length or context.sampling.max_new_tokens
        if self.config.overlong_shaping and self.config.overlong_buffer >= max_length:
            raise ValueError(f"overlong_buffer ({self.config.overlong_buffer}) must be shorter than L_max "
                             f"({max_length}, the rollout's max_new_tokens), or every response would be punished")
        return max_length

    def draw(self, examples: list, context: base.RolloutContext, step: int, gen_batch: int) -> base.GroupBatch:
        """Step 1 (`outcome_groups`), refused before any sampling when the overlong buffer would punish every
        response."""
        self._max_length(context)
        return outcome_groups(examples, context, step, gen_batch)

    def informative(self, groups: base.GroupBatch, context: base.RolloutContext) -> np.ndarray:
        """Step 1's filter on accuracy, not on the shaped reward (`mixed_accuracy`)."""
        return mixed_accuracy(groups)

    def reward(self, groups: base.GroupBatch, context: base.RolloutContext) -> tuple[np.ndarray, np.ndarray]:
        """Step 2: +1 / -1 by the verifier, plus the overlong penalty when overlong_shaping is on, [B] float32;
        every row valid (dynamic sampling decides which groups train)."""
        config = self.config
        reward_b = np.asarray(rewards.rlcer_outcome_reward(jnp.asarray(groups.correct_b)))
        if config.overlong_shaping:
            lengths_b = np.array([len(s.output_ids) for s in groups.rollouts.samples], np.int32)
            reward_b = np.asarray(rewards.dapo_overlong_shaping(
                jnp.asarray(reward_b), jnp.asarray(lengths_b), max_length=self._max_length(context),
                buffer_length=config.overlong_buffer, factor=config.overlong_factor))
        return reward_b, np.ones(len(reward_b), bool)

    def metrics(self, groups: base.GroupBatch, reward_b: np.ndarray, advantage_b: np.ndarray, trained_b: np.ndarray,
                context: base.RolloutContext) -> dict[str, float]:
        """`base.GroupRecipe.metrics`, "dapo/kept_group_fraction" and "dapo/overlong_penalty_mean" (the mean of
        what step 2's shaping took from the outcome reward)."""
        outcome_b = np.asarray(rewards.rlcer_outcome_reward(jnp.asarray(groups.correct_b)))
        return {**super().metrics(groups, reward_b, advantage_b, trained_b, context),
                "dapo/kept_group_fraction": kept_group_fraction(trained_b, groups.rollouts.group_ids),
                "dapo/overlong_penalty_mean": float(np.mean(outcome_b - reward_b))}
