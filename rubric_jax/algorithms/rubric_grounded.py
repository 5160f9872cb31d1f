"""Rubric-grounded GRPO (rubric_grounded_rl.txt): a frozen judge scores each response against weighted
criteria while seeing a grounding passage g that the policy never sees (the task's `reference`: a source
passage; for the arithmetic task the gold solution), and GRPO with a leave-one-out baseline turns the rubric
reward into advantages.

For each step (G = sampling.n responses per prompt; section 3, Algorithm 1; the steps of `base.GroupRecipe`,
each its method):
  1. sample G responses to x alone, no grounding in the prompt   draw: base.sample_groups (Task.prompt)
     the judge scores each against (g, x, rubric): s_ik in [0,1] base.judge_groups (Task.reference -> judge)
     the awarded fraction of criterion k's weight
  2. r_i = clip(sum_k w_k s_ik / sum_k w_k, 0, 1) (eqs 1-2)      reward: core.rewards.weighted_fraction,
     a judge parse failure: every s_ik = 0, so r_i = 0          clip_rewards (section 5.4, FailurePolicy
     (counted in judge/failed/<reason>)                           ZERO_REWARD; or out of its group and the
     optional truncation penalty (Appendix C): a response that   loss: EXCLUDE)
     did not end on its stop token has r_i times a factor, or    core.rewards.truncation_scaling (scale)
     leaves its group and the loss                               core.rewards.truncation_mask (mask)
  3. A_i = (r_i - b_i) / (s_i + eps), b_i and s_i the mean and   advantage: core.advantages.loo_std_advantages
     sample std of the other G - 1 rewards (eqs 4-6)             (`grounded_advantages`)
     readings of eq 5's "group standard deviation" s_i:
     std_over "others" (the other G - 1 rewards; std_ddof 1
     sample, NeMo-RL's, or 0 population) or "group" (all G          scale_by_group_std of
     rewards of the prompt)                                          rloo_advantages
     ablations: the group-mean baseline (GRPO), no std scaling   grpo_ / rloo_ / dr_grpo_advantages
     optional dynamic sampling (Appendix C): a group whose       informative: core.rubric_validity.
     rewards tie takes no part in the loss; "resample" (the       dapo_group_filter, base.dynamic_groups
     appendix's: further generation batches until the step
     holds prompts_per_step groups whose rewards differ) or
     "mask" (its rows are masked)
  4. A_i on every response token; PPO clip (eq 7) + beta k3 KL   core.advantages.broadcast_to_tokens,
     to the initial policy (eq 8), token mean (eq 9); GSPO,       base.policy_loss_fn
     dual clip, TIS / ICEPOP are PolicyLossConfig options

Dynamic sampling "mask" keeps the batch's fixed shape: a filtered group's response mask is switched off instead of
re-sampling prompts until the batch is full; "resample" re-samples (`base.dynamic_groups`: every generation batch
is judged, as the filter reads the reward). "grounded/kept_group_fraction" logs the groups that train.
The paper's numeric hyperparameters did not survive in its text; the defaults here (KL coefficient 0.01, eps
1e-6) are those of NeMo-RL, the framework the paper ran on (configs/rubric_grounded_paper.yaml).
"""

import dataclasses
import types
from typing import Literal, Optional

import jax.numpy as jnp
import numpy as np

from rubric_jax.algorithms import base
from rubric_jax.algorithms.dapo import kept_group_fraction
from rubric_jax.algorithms.registry import register
from rubric_jax.core import advantages, rewards
from rubric_jax.rubrics.parsing import FailurePolicy
from rubric_jax.rubrics.schema import rubric_arrays


@dataclasses.dataclass(frozen=True)
class RubricGroundedConfig:
    """max_items: rubric width K (the longest rubric must fit); on_judge_failure: "zero_reward" (the paper's) or
    "exclude"; baseline: "loo" (eqs 4-6) or "group_mean" (GRPO's, with the rollout itself in the mean);
    scale_by_std: divide by the (leave-one-out or group) std, the paper's "reward normalization"; std_ddof / eps:
    that std (1: sample std) and its epsilon; std_over: which rewards the leave-one-out baseline's std is taken
    over, "others" (the other G - 1: NeMo-RL's `calculate_baseline_and_std_per_prompt`, on which the paper ran,
    so the default) or "group" (all G rewards of the prompt, the other reading of eq 5's "group standard
    deviation"); it needs baseline "loo" and scale_by_std. dynamic_sampling: step 6, "off" (false), "mask" (true)
    or "resample", with max_num_gen_batches (0: no cap) and gen_batch_prompts (None: prompts_per_step) for
    "resample" only (`base.dynamic_groups`); truncation: "none", "scale" (reward times truncation_factor in
    [0, 1]) or "mask" (step 4). The policy loss defaults to the paper's: PPO clip 0.2, k3 KL with coefficient
    0.01, token mean."""

    policy_loss: base.PolicyLossConfig = base.PolicyLossConfig(kl_coef=0.01, kl_estimator="k3")
    max_items: int = 16
    on_judge_failure: Literal["zero_reward", "exclude"] = "zero_reward"
    baseline: Literal["loo", "group_mean"] = "loo"
    scale_by_std: bool = True
    std_ddof: int = 1
    eps: float = 1e-6
    std_over: Literal["others", "group"] = "others"
    dynamic_sampling: base.DynamicSampling = "off"
    max_num_gen_batches: int = 0
    gen_batch_prompts: Optional[int] = None
    truncation: Literal["none", "scale", "mask"] = "none"
    truncation_factor: float = 0.5

    def __post_init__(self):
        object.__setattr__(self, "dynamic_sampling", base.dynamic_sampling_mode(self.dynamic_sampling))
        base.check_resampling(self.dynamic_sampling, self.max_num_gen_batches, self.gen_batch_prompts)
        if self.max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {self.max_items}")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof must be 0 or 1, got {self.std_ddof}")
        if not self.eps >= 0:
            raise ValueError(f"eps must be >= 0, got {self.eps}")
        if self.std_over == "group" and not (self.baseline == "loo" and self.scale_by_std):
            raise ValueError("std_over chooses the std that divides the leave-one-out advantage: std_over group needs "
                             f"baseline loo and scale_by_std true, got baseline {self.baseline}, scale_by_std "
                             f"{self.scale_by_std}")
        if not 0 <= self.truncation_factor <= 1:
            raise ValueError(f"truncation_factor must be in [0, 1], got {self.truncation_factor}")


def grounded_advantages(reward_b: np.ndarray, group_ids: np.ndarray, valid_b: np.ndarray,
                        config: RubricGroundedConfig) -> np.ndarray:
    """Step 5: the advantage estimator `config` names, over the valid rows; [B], 0 on the others."""
    r, ids, valid = jnp.asarray(reward_b), jnp.asarray(group_ids), jnp.asarray(valid_b)
    std = dict(std_ddof=config.std_ddof, eps=config.eps)
    if config.baseline == "loo" and config.scale_by_std and config.std_over == "group":
        estimate = advantages.scale_by_group_std(advantages.rloo_advantages(r, ids, valid), r, ids, valid, **std)
    elif config.baseline == "loo":
        estimate = (advantages.loo_std_advantages(r, ids, valid, **std) if config.scale_by_std
                    else advantages.rloo_advantages(r, ids, valid))
    else:
        estimate = (advantages.grpo_advantages(r, ids, valid, **std) if config.scale_by_std
                    else advantages.dr_grpo_advantages(r, ids, valid))
    return np.asarray(estimate)


@register("rubric_grounded")
class RubricGrounded(base.GroupRecipe):
    config_class = RubricGroundedConfig
    console_metrics = ("grounded/zero_reward_fraction", "grounded/kept_group_fraction")
    plot_panels = types.MappingProxyType({
        "grounded/rewards": ("grounded/zero_reward_fraction", "grounded/empty_rubric_fraction"),
        "grounded/sampling": ("grounded/kept_group_fraction",),
    })

    @property
    def negative_weights(self) -> str:
        return ("weighted 0: the paper's weighted fraction (eqs 1-2; its rubrics have non-negative weights) lets a "
                "met penalty cost nothing")

    def draw(self, examples: list, context: base.RolloutContext, step: int, gen_batch: int) -> base.GroupBatch:
        """Step 1 (`base.GroupRecipe.draw`), refused for a question without a grounding passage."""
        for example in examples:
            if context.task.reference(example) is None:
                raise ValueError(f"rubric_grounded needs a grounding passage: the task's reference of the question "
                                 f"{context.task.question(example)!r} is None")
        return super().draw(examples, context, step, gen_batch)

    def reward(self, groups: base.GroupBatch, context: base.RolloutContext) -> tuple[np.ndarray, np.ndarray]:
        """Step 2: (r [B] float32, valid_b [B] bool, the rows in their groups' statistics)."""
        config = self.config
        items = rubric_arrays(groups.rubrics, config.max_items)
        # A failed judgement has every verdict 0 (judges.base), so its reward is 0: the paper's conservative zero.
        reward_b = np.asarray(rewards.clip_rewards(rewards.weighted_fraction(
            jnp.asarray(groups.verdicts.satisfied_bk), jnp.asarray(items.item_weight_bk),
            jnp.asarray(items.item_mask_bk))))
        valid_b = np.ones(len(reward_b), bool)
        if config.on_judge_failure == FailurePolicy.EXCLUDE.value:
            valid_b &= ~groups.verdicts.failed_b
        stopped_b = np.array([s.finish_reason == "stop" for s in groups.rollouts.samples], bool)
        if config.truncation == "scale":
            reward_b = np.asarray(rewards.truncation_scaling(
                jnp.asarray(reward_b), jnp.asarray(stopped_b), factor=config.truncation_factor))
        elif config.truncation == "mask":
            valid_b = np.asarray(rewards.truncation_mask(jnp.asarray(stopped_b), jnp.asarray(valid_b)))
        return reward_b, valid_b

    def advantage(self, reward_b: np.ndarray, group_ids: np.ndarray, valid_b: np.ndarray,
                  groups: base.GroupBatch) -> np.ndarray:
        """Step 3: the estimator the config names (`grounded_advantages`)."""
        return grounded_advantages(reward_b, group_ids, valid_b, self.config)

    def metrics(self, groups: base.GroupBatch, reward_b: np.ndarray, advantage_b: np.ndarray, trained_b: np.ndarray,
                context: base.RolloutContext) -> dict[str, float]:
        """`base.GroupRecipe.metrics` and "grounded/*": the zero-reward and empty-rubric fractions of the rows,
        the fraction of the groups that train."""
        return {
            **super().metrics(groups, reward_b, advantage_b, trained_b, context),
            "grounded/zero_reward_fraction": float(np.mean(reward_b == 0)),
            "grounded/empty_rubric_fraction": float(np.mean([not r.criteria for r in groups.rubrics])),
            "grounded/kept_group_fraction": kept_group_fraction(trained_b, groups.rollouts.group_ids),
        }
