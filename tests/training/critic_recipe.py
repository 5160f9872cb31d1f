"""A recipe for trainer tests of the critic path, registered as "toy_critic": the toy task's rubric fraction as a
sequence reward on each response's last token (`core.value.last_token_rewards`), no advantages of its own."""

import dataclasses
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from rubric_jax.algorithms import base
from rubric_jax.algorithms.registry import register
from rubric_jax.core.value import last_token_rewards


@dataclasses.dataclass(frozen=True)
class ToyCriticConfig:
    policy_loss: base.PolicyLossConfig = base.PolicyLossConfig()


@register("toy_critic")
class ToyCritic(base.Algorithm):
    config_class = ToyCriticConfig

    @property
    def policy_loss(self) -> base.PolicyLossConfig:
        return self.config.policy_loss

    @property
    def uses_critic(self) -> bool:
        return True

    def experience(self, examples: Sequence[Any], context: base.RolloutContext, step: int) -> base.Experience:
        rollouts = base.sample_groups([context.task.prompt(e) for e in examples], context, step)
        verdicts, rubrics = base.judge_rollouts(examples, rollouts, context, max_items=4)
        reward_b = verdicts.satisfied_bk.mean(axis=1).astype(np.float32)
        batch = dict(rollouts.batch)
        batch["token_rewards_bt"] = np.asarray(
            last_token_rewards(jnp.asarray(reward_b), jnp.asarray(batch["response_mask_bt"])))
        return base.Experience(batch=batch, prompt_width=rollouts.prompt_width,
                               metrics={**base.summary_stats("reward", reward_b),
                                        **base.rubric_metrics(verdicts, rubrics)})
