"""GRPO with an outcome-only reward (RLVR; Shao et al. 2024, "DeepSeekMath", section 4.1): the baseline every
rubric recipe is measured against. A response earns 1 when the task's verifier finds its answer correct and 0
otherwise; no rubric and no judge enter the reward (rubric satisfaction is still measured by the trainer's eval).

For each step (G = sampling.n responses per prompt):
  1. sample G responses per prompt                               base.sample_groups
  2. r_i = 1 if task.is_correct(o_i) else 0                      Task.is_correct
  3. A_i = (r_i - mean_g r) / (std_g r + eps), sample std        core.advantages.grpo_advantages
     (0 for a group whose answers are all right or all wrong)
     broadcast to the response's tokens                          core.advantages.broadcast_to_tokens
  4. PPO clip update (+ optional KL to the initial policy)        base.policy_loss_fn
"""

import dataclasses
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from rubric_jax.algorithms import base
from rubric_jax.algorithms.registry import register
from rubric_jax.core import advantages


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """std_ddof / eps: GRPO's std (1: sample std, as verl and TRL) and epsilon."""

    policy_loss: base.PolicyLossConfig = base.PolicyLossConfig()
    std_ddof: int = 1
    eps: float = 1e-6

    def __post_init__(self):
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof must be 0 or 1, got {self.std_ddof}")
        if not self.eps >= 0:
            raise ValueError(f"eps must be >= 0, got {self.eps}")


def outcome_rollouts(examples: Sequence[Any], context: base.RolloutContext, step: int):
    """Step 1 and the verifier's verdicts of the outcome recipes (GRPO, DAPO): (rollouts, correct_b bool [B])."""
    rollouts = base.sample_groups([context.task.prompt(e) for e in examples], context, step)
    with context.timer.phase("judging"):
        correct_b = np.array([context.task.is_correct(text, examples[s.prompt_index])
                              for s, text in zip(rollouts.samples, rollouts.texts)], bool)
    return rollouts, correct_b


@register("grpo")
class GRPO(base.Algorithm):
    config_class = GRPOConfig

    @property
    def policy_loss(self) -> base.PolicyLossConfig:
        return self.config.policy_loss

    def experience(self, examples: Sequence[Any], context: base.RolloutContext, step: int) -> base.Experience:
        rollouts, correct_b = outcome_rollouts(examples, context, step)
        reward_b = correct_b.astype(np.float32)
        advantage_b = np.asarray(advantages.grpo_advantages(
            jnp.asarray(reward_b), jnp.asarray(rollouts.group_ids), std_ddof=self.config.std_ddof,
            eps=self.config.eps))
        batch = dict(rollouts.batch)
        batch["advantages_bt"] = np.asarray(
            advantages.broadcast_to_tokens(jnp.asarray(advantage_b), jnp.asarray(batch["response_mask_bt"])))
        metrics = {
            **base.summary_stats("reward", reward_b),
            **base.summary_stats("advantage", advantage_b),
            **base.rollout_metrics(rollouts, correct_b),
        }
        return base.Experience(batch=batch, prompt_width=rollouts.prompt_width, metrics=metrics)
