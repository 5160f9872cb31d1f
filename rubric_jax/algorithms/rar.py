"""RaR, "Rubrics as Rewards" (Gunjal et al. 2025), the response-level rubric baseline: each response's reward is
the weighted fraction of its rubric that the judge finds satisfied, and GRPO turns the group's rewards into
advantages. The scalar the step-wise methods (SRaR) and the grounded judge (rubric-grounded GRPO) refine.

For each step (G = sampling.n responses per prompt; the steps of `base.GroupRecipe`, each its method):
  1. sample G responses per prompt, judge each against its        draw: base.sample_groups,
     example's rubric                                             base.judge_groups
  2. r_i = sum_k w_k s_ik / sum_k max(w_k, 0)                    reward: core.rewards.positive_points_score
     (`score: positive_points`, the default: HealthBench's score; with non-negative weights it is RaR's
     sum_k w_k s_ik / sum_k w_k, core.rewards.weighted_fraction, and a met penalty w_k < 0 subtracts)
     or `score: weighted_fraction` (a negative weight counts 0)     core.rewards.weighted_fraction
     (a typed rubric's PITFALL item: s = 1 when avoided)          core.rewards.typed_item_credit
     a rollout whose judgement failed: reward 0 (FailurePolicy ZERO_REWARD) or out of its group and the loss
     (EXCLUDE)
  3. A_i = (r_i - mean_g r) / (std_g r + eps), sample std        advantage: core.advantages.grpo_advantages
  4. A_i on the response's tokens                                core.advantages.broadcast_to_tokens
  5. PPO clip update (+ optional KL to the initial policy)        base.policy_loss_fn
"""

import dataclasses
from typing import Literal

import jax.numpy as jnp
import numpy as np

from rubric_jax.algorithms import base
from rubric_jax.algorithms.registry import register
from rubric_jax.core import rewards
from rubric_jax.rubrics.parsing import FailurePolicy
from rubric_jax.rubrics.schema import rubric_arrays


@dataclasses.dataclass(frozen=True)
class RaRConfig:
    """max_items: rubric width K (the longest rubric must fit); on_judge_failure: "zero_reward" or "exclude";
    std_ddof / eps: GRPO's std (1: sample std) and epsilon.

    score: step 3's rubric score. "positive_points" (the default): the points of the met items, penalties
    included, over the positive points (HealthBench's grader, `core.rewards.positive_points_score`). On a rubric
    without negative weights it equals RaR's weighted fraction exactly (the same sums, property-tested in
    tests/core/test_rewards.py), so the default changes nothing there; on rubrics with penalties (HealthBench's,
    RaR-Medicine's "Pitfall Criteria" at -1 / -2) a met penalty subtracts its points, so the data's penalties
    reach the policy. The score is at most 1 and may be negative (GRPO's normalisation takes it as it is); a
    rubric with no positive points (penalties only) scores 0 whatever the response, as documented there
    (`rubric-jax validate` counts such rows). "weighted_fraction": a negative weight counts 0, so a met penalty
    costs nothing (`rubric-jax validate` says how many criteria that silences). A typed rubric's PITFALL item
    (SRaR-style, positive weight) earns its weight when avoided in either score."""

    policy_loss: base.PolicyLossConfig = base.PolicyLossConfig()
    max_items: int = 16
    score: Literal["weighted_fraction", "positive_points"] = "positive_points"
    on_judge_failure: Literal["zero_reward", "exclude"] = "zero_reward"
    std_ddof: int = 1
    eps: float = 1e-6

    def __post_init__(self):
        if self.max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {self.max_items}")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof must be 0 or 1, got {self.std_ddof}")


@register("rar")
class RaR(base.GroupRecipe):
    config_class = RaRConfig

    @property
    def negative_weights(self) -> str:
        if self.config.score == "positive_points":
            return "counted: a met one subtracts its points from the reward (score: positive_points)"
        return ("weighted 0: a met penalty costs nothing (score: weighted_fraction; score: positive_points "
                "counts them)")

    def reward(self, groups: base.GroupBatch, context: base.RolloutContext) -> tuple[np.ndarray, np.ndarray]:
        """Step 2: the rubric score of `config.score` of each response's typed item credit, [B] float32; every row
        valid, or the judged ones under on_judge_failure "exclude"."""
        items = rubric_arrays(groups.rubrics, self.config.max_items)
        verdicts = groups.verdicts
        credit_bk = rewards.typed_item_credit(
            jnp.asarray(verdicts.satisfied_bk), jnp.asarray(items.item_kind_bk), jnp.asarray(verdicts.failed_b))
        score = rewards.positive_points_score if self.config.score == "positive_points" else rewards.weighted_fraction
        reward_b = np.asarray(score(credit_bk, jnp.asarray(items.item_weight_bk), jnp.asarray(items.item_mask_bk)))
        if self.config.on_judge_failure == FailurePolicy.EXCLUDE.value:
            return reward_b, ~verdicts.failed_b
        return reward_b, np.ones(len(reward_b), bool)
