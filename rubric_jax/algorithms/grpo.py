"""GRPO with an outcome-only reward (RLVR; Shao et al. 2024, "DeepSeekMath", section 4.1): the baseline every
rubric recipe is measured against. A response earns 1 when the task's verifier finds its answer correct and 0
otherwise; no rubric and no judge enter the reward (rubric satisfaction is still measured by the trainer's eval).

For each step (G = sampling.n responses per prompt):
  1. sample G responses per prompt                               base.sample_groups
  2. r_i = 1 if task.is_correct(o_i) else 0                      Task.is_correct
  3. A_i from the rewards by `estimator` (below); by default      core.advantages.grpo_advantages
     A_i = (r_i - mean_g r) / (std_g r + eps), sample std
     (0 for a group whose answers are all right or all wrong)
     broadcast to the response's tokens                          core.advantages.broadcast_to_tokens
  4. PPO clip update (+ optional KL to the initial policy)        base.policy_loss_fn

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
sampling stream 1), judges it with the same verifier, and uses its reward only as the baseline of that prompt's
G rollouts: it is not in the learner's batch and not in the outcome metrics ("remax/greedy_accuracy" logs it).
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
    `stream` and `gen_batch` as `base.sample_groups`'."""
    rollouts = base.sample_groups([context.task.prompt(e) for e in examples], context, step, stream=stream,
                                  gen_batch=gen_batch)
    with context.timer.phase("judging"):
        correct_b = np.array([context.task.is_correct(text, examples[s.prompt_index])
                              for s, text in zip(rollouts.samples, rollouts.texts)], bool)
    return rollouts, correct_b


def greedy_rewards(examples: Sequence[Any], context: base.RolloutContext, step: int) -> np.ndarray:
    """ReMax's baseline: the verifier's reward of one greedy (temperature 0) rollout per prompt, [P] float32."""
    greedy = dataclasses.replace(context.sampling, n=1, temperature=0.0)
    rollouts, correct = outcome_rollouts(examples, dataclasses.replace(context, sampling=greedy), step,
                                         stream=GREEDY_STREAM)
    reward_p = np.zeros(len(examples), np.float32)
    reward_p[rollouts.group_ids] = correct
    return reward_p


@register("grpo")
class GRPO(base.Algorithm):
    config_class = GRPOConfig

    @property
    def policy_loss(self) -> base.PolicyLossConfig:
        return self.config.policy_loss

    def outcome_advantages(self, reward_b: np.ndarray, group_ids: np.ndarray, length_b: np.ndarray,
                           baseline_b: Optional[np.ndarray]) -> np.ndarray:
        """Step 3 by `estimator`: [B] advantages of the rewards [B]; length_b [B] response lengths (opo),
        baseline_b [B] the greedy reward of each row's prompt (remax, else None)."""
        c = self.config
        r, ids = jnp.asarray(reward_b), jnp.asarray(group_ids)
        by_estimator = {
            "grpo": lambda: advantages.grpo_advantages(r, ids, std_ddof=c.std_ddof, eps=c.eps),
            "dr_grpo": lambda: advantages.dr_grpo_advantages(r, ids),
            "rloo": lambda: advantages.rloo_advantages(r, ids),
            "loo_std": lambda: advantages.loo_std_advantages(r, ids, std_ddof=c.std_ddof, eps=c.eps),
            "pass_at_k": lambda: advantages.pass_at_k_advantages(r, ids),
            "opo": lambda: advantages.opo_advantages(r, jnp.asarray(length_b), ids),
            "remax": lambda: advantages.remax_advantages(r, jnp.asarray(baseline_b)),
            "gpg": lambda: advantages.gpg_advantages(r, ids),
        }
        advantage_b = by_estimator[c.estimator]()
        if c.std_scaled:
            advantage_b = advantages.scale_by_group_std(advantage_b, r, ids, std_ddof=c.std_ddof, eps=c.eps)
        return np.asarray(advantage_b)

    def experience(self, examples: Sequence[Any], context: base.RolloutContext, step: int) -> base.Experience:
        rollouts, correct_b = outcome_rollouts(examples, context, step)
        reward_b = correct_b.astype(np.float32)
        group_ids = rollouts.group_ids
        batch = dict(rollouts.batch)
        metrics = {}
        baseline_b = None
        if self.config.estimator == "remax":
            greedy_p = greedy_rewards(examples, context, step)
            baseline_b = greedy_p[group_ids]
            metrics["remax/greedy_accuracy"] = float(greedy_p.mean())
        if self.config.estimator == "gpg":
            metrics["gpg/alpha"] = float(advantages.gpg_alpha(jnp.asarray(reward_b), jnp.asarray(group_ids)))
        length_b = batch["response_mask_bt"].sum(axis=1)
        advantage_b = self.outcome_advantages(reward_b, group_ids, length_b, baseline_b)
        batch["advantages_bt"] = np.asarray(
            advantages.broadcast_to_tokens(jnp.asarray(advantage_b), jnp.asarray(batch["response_mask_bt"])))
        metrics.update({
            **base.summary_stats("reward", reward_b),
            **base.summary_stats("advantage", advantage_b),
            **base.rollout_metrics(rollouts, correct_b, context.task),
        })
        return base.Experience(batch=batch, prompt_width=rollouts.prompt_width, metrics=metrics)
