"""GRPO with an outcome-only reward (RLVR; Shao et al. 2024, "DeepSeekMath", section 4.1): the baseline every
rubric recipe is measured against. A response earns 1 when the task's verifier finds its answer correct and 0
otherwise; no rubric and no judge enter the reward (rubric satisfaction is still measured by the trainer's eval).

For each step (G = sampling.n responses per prompt; the steps of `base.GroupRecipe`, each its method):
  1. sample G responses per prompt, check their answers          draw: base.sample_groups, Task.is_correct
                                                                 (`outcome_groups`)
  2. r_i = 1 if task.is_correct(o_i) else 0                      reward
  3. A_i from the rewards by `estimator` (below); by default      advantage: core.advantages.grpo_advantages
     A_i = (r_i - mean_g r) / (std_g r + eps), sample std
     (0 for a group whose answers are all right or all wrong)
  4. A_i on the response's tokens                                core.advantages.broadcast_to_tokens
  5. PPO clip update (+ optional KL to the initial policy)        base.policy_loss_fn

`estimator` (algorithm.params.estimator) picks step 3's outcome-advantage estimator, each as verl names it:
  grpo       (r - mean_g) / (std_g + eps), std by std_ddof                         grpo_advantages
  dr_grpo    r - mean_g (Dr.GRPO)                                                  dr_grpo_advantages
  rloo       r - mean of the other G-1 (RLOO)                                      rloo_advantages
  loo_std    (r - LOO mean) / (LOO std + eps) (rubric-grounded RL, NeMo-RL)        loo_std_advantages
  pass_at_k  max_g r - max of the others: only a group's unique best rollout      pass_at_k_advantages
             gets its margin over the second best (verl's grpo_passk); k = G
  opo        r - sum_j l_j r_j / sum_j l_j, l = response length in tokens (OPO)    opo_advantages
  remax      r - r(greedy rollout of the same prompt) (ReMax)                      remax_advantages
  gpg        alpha (r - mean_g), alpha = B / (B - M), M = rows of tied groups     gpg_advantages
             (GPG, F_norm = 1)
`scale_by_std` divides pass_at_k's or gpg's advantage by its group's reward std + eps (std_ddof)
(`scale_by_group_std`): verl's norm_adv_by_std_in_grpo for pass@k, GPG's F_norm = std. Unset (null), each takes
its source's default: on for pass_at_k (verl), off for gpg (verl, and the GPG paper's best ablation); setting it
for any other estimator is an error.

ReMax samples, in each step, one extra rollout per prompt at temperature 0 (greedy decoding, n = 1, its own
sampling stream 1; in step 1, as the groups' extras["greedy_baseline_b"]), judges it with the same verifier, and
uses its reward only as the baseline of that prompt's G rollouts: it is not in the learner's batch and not in the
outcome metrics ("remax/greedy_accuracy" logs it).
GPG logs its "gpg/alpha". GPG's own loss is the plain policy gradient -A log pi; PPO's clipped ratio has the same
value and gradient at the first update on fresh rollouts (learner.epochs 1, one mini-batch).
"""

import dataclasses
import typing
from typing import Any, Literal, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from rubric_jax.algorithms import base
from rubric_jax.algorithms.registry import register
from rubric_jax.core import advantages

Estimator = Literal["grpo", "dr_grpo", "rloo", "loo_std", "pass_at_k", "opo", "remax", "gpg"]
STD_SCALED = {"pass_at_k": True, "gpg": False}  # the estimators that take scale_by_std, and its default for each
GREEDY_STREAM = 1  # ReMax's greedy rollouts draw from their own sampling stream


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """estimator: step 3's outcome-advantage estimator (module docstring). std_ddof / eps: the std (1: sample std,
    as verl and TRL) and epsilon of grpo and loo_std, and of scale_by_std. scale_by_std: pass_at_k's and gpg's
    std scaling (None: the estimator's default)."""

    policy_loss: base.PolicyLossConfig = base.PolicyLossConfig()
    estimator: Estimator = "grpo"
    std_ddof: int = 1
    eps: float = 1e-6
    scale_by_std: Optional[bool] = None

    def __post_init__(self):
        if self.estimator not in typing.get_args(Estimator):
            raise ValueError(f"estimator must be one of {typing.get_args(Estimator)}, got {self.estimator!r}")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof must be 0 or 1, got {self.std_ddof}")
        if not self.eps >= 0:
            raise ValueError(f"eps must be >= 0, got {self.eps}")
        if self.scale_by_std is not None and self.estimator not in STD_SCALED:
            raise ValueError(f"scale_by_std applies to the estimators {sorted(STD_SCALED)} only, "
                             f"not {self.estimator!r}; leave it unset")

    @property
    def std_scaled(self) -> bool:
        """Whether pass_at_k's or gpg's advantage is divided by its group's reward std."""
        default = STD_SCALED.get(self.estimator, False)
        return default if self.scale_by_std is None else self.scale_by_std


def outcome_rollouts(examples: Sequence[Any], context: base.RolloutContext, step: int, *, stream: int = 0,
                     gen_batch: int = 0):
    """Step 1 and the verifier's verdicts of the outcome recipes (GRPO, DAPO): (rollouts, correct_b bool [B]);
    `stream` and `gen_batch` as `base.sample_groups`'. The verifier is these recipes' judge: timed as judging."""
    rollouts = base.sample_groups([context.task.prompt(e) for e in examples], context, step, stream=stream,
                                  gen_batch=gen_batch)
    with context.timer.phase("judging"):
        correct_b = base.outcome_correctness(examples, rollouts, context.task)
    return rollouts, correct_b


def outcome_groups(examples: list, context: base.RolloutContext, step: int, gen_batch: int) -> base.GroupBatch:
    """`outcome_rollouts` of generation batch `gen_batch` as groups (the outcome recipes' `draw`)."""
    rollouts, correct_b = outcome_rollouts(examples, context, step, gen_batch=gen_batch)
    return base.GroupBatch(examples=examples, rollouts=rollouts, correct_b=correct_b)


def greedy_rewards(examples: Sequence[Any], context: base.RolloutContext, step: int) -> np.ndarray:
    """ReMax's baseline: the verifier's reward of one greedy (temperature 0) rollout per prompt, [P] float32."""
    greedy = dataclasses.replace(context.sampling, n=1, temperature=0.0)
    rollouts, correct = outcome_rollouts(examples, dataclasses.replace(context, sampling=greedy), step,
                                         stream=GREEDY_STREAM)
    reward_p = np.zeros(len(examples), np.float32)
    reward_p[rollouts.group_ids] = correct
    return reward_p


@register("grpo")
class GRPO(base.GroupRecipe):
    config_class = GRPOConfig

    def draw(self, examples: list, context: base.RolloutContext, step: int, gen_batch: int) -> base.GroupBatch:
        """Step 1 (`outcome_groups`); for ReMax also each row's greedy baseline, extras["greedy_baseline_b"]."""
        groups = outcome_groups(examples, context, step, gen_batch)
        if self.config.estimator != "remax":
            return groups
        greedy_p = greedy_rewards(examples, context, step)
        return dataclasses.replace(groups, extras={"greedy_baseline_b": greedy_p[groups.rollouts.group_ids]})

    def reward(self, groups: base.GroupBatch, context: base.RolloutContext) -> tuple[np.ndarray, np.ndarray]:
        """Step 2: 1 for a right answer, 0 otherwise, [B] float32; every row valid but a failed sample's (the
        engine's failure, not the policy's: out of its group's statistics)."""
        return groups.correct_b.astype(np.float32), ~groups.rollouts.failed_b

    def advantage(self, reward_b: np.ndarray, group_ids: np.ndarray, valid_b: np.ndarray,
                  groups: base.GroupBatch) -> np.ndarray:
        """Step 3 by `estimator` over the valid rows, [B]: opo reads the response lengths, remax the greedy
        baseline of each row's prompt (`draw`)."""
        c = self.config
        r, ids, valid = jnp.asarray(reward_b), jnp.asarray(group_ids), jnp.asarray(valid_b)
        by_estimator = {
            "grpo": lambda: advantages.grpo_advantages(r, ids, valid, std_ddof=c.std_ddof, eps=c.eps),
            "dr_grpo": lambda: advantages.dr_grpo_advantages(r, ids, valid),
            "rloo": lambda: advantages.rloo_advantages(r, ids, valid),
            "loo_std": lambda: advantages.loo_std_advantages(r, ids, valid, std_ddof=c.std_ddof, eps=c.eps),
            "pass_at_k": lambda: advantages.pass_at_k_advantages(r, ids, valid),
            "opo": lambda: advantages.opo_advantages(
                r, jnp.asarray(groups.rollouts.batch["response_mask_bt"].sum(axis=1)), ids, valid),
            "remax": lambda: advantages.remax_advantages(r, jnp.asarray(groups.extras["greedy_baseline_b"]), valid),
            "gpg": lambda: advantages.gpg_advantages(r, ids, valid),
        }
        advantage_b = by_estimator[c.estimator]()
        if c.std_scaled:
            advantage_b = advantages.scale_by_group_std(advantage_b, r, ids, valid, std_ddof=c.std_ddof, eps=c.eps)
        return np.asarray(advantage_b)

    def metrics(self, groups: base.GroupBatch, reward_b: np.ndarray, advantage_b: np.ndarray, trained_b: np.ndarray,
                context: base.RolloutContext) -> dict[str, float]:
        """`base.GroupRecipe.metrics`, and ReMax's greedy accuracy or GPG's alpha under those estimators."""
        metrics = super().metrics(groups, reward_b, advantage_b, trained_b, context)
        if self.config.estimator == "remax":
            metrics["remax/greedy_accuracy"] = float(groups.extras["greedy_baseline_b"].mean())
        if self.config.estimator == "gpg":
            metrics["gpg/alpha"] = float(advantages.gpg_alpha(
                jnp.asarray(reward_b), jnp.asarray(groups.rollouts.group_ids), jnp.asarray(trained_b)))
        return metrics
