"""The learner of the RL loop (steps 3 and 4 of `training.rl`, `learn`): its jitted steps per prompt width (policy
update, logprobs; the critic's value update and values, for a recipe that uses PPO's critic), the epochs x
mini-batches update of one step, GAE advantages from the critic's values, and the engine/learner logprob
mismatch."""

from typing import Any

import jax
import numpy as np

from rubric_jax.algorithms.base import Experience, summary_stats
from rubric_jax.core import value as core_value
from rubric_jax.core.advantages import whiten_tokens_by_group
from rubric_jax.models import sharding, train_step
from rubric_jax.models.value import make_value_train_step, make_values_fn
from rubric_jax.training import data_parallel, policy
from rubric_jax.training.metrics import PhaseTimer
from rubric_jax.training.optim import learning_rate_schedule
from rubric_jax.training.run_config import CriticConfig, RLConfig


def mismatch_metrics(batch: dict[str, np.ndarray], old_logp_bt: np.ndarray) -> dict[str, float]:
    """How far the engine's logprobs are from the learner's on the same tokens: the k3 estimate of
    KL(engine || learner) and the largest absolute difference (0 up to numerics for the embedded engine), over the
    response tokens whose engine logprob is finite (a server sends -inf as null: `inference.sglang`)."""
    mask = batch["response_mask_bt"] & np.isfinite(batch["rollout_logp_bt"])
    if not mask.any():
        return {}
    delta = (old_logp_bt - batch["rollout_logp_bt"])[mask].astype(np.float64)
    return {"mismatch/k3": float(np.mean(np.expm1(delta) - delta)), "mismatch/max_abs": float(np.abs(delta).max())}


class Learner:
    """The jitted steps of one run, compiled per prompt width (the learner's `first_scored`); the critic's too
    when the run has one (`critic_graphdef` and `critic_optimizer`, its params in `state`); and the learning rates
    of a step's updates."""

    def __init__(self, config: RLConfig, algorithm, graphdef, state: policy.LearnerState, optimizer, mesh, rules,
                 critic_graphdef=None, critic_optimizer=None):
        self.config, self.algorithm, self.graphdef = config, algorithm, graphdef
        self.optimizer, self.mesh, self.rules = optimizer, mesh, rules
        self.abstract_params = jax.eval_shape(lambda p: p, state.params)
        self._compiled: dict[int, tuple[Any, Any]] = {}
        self.critic_graphdef, self.critic_optimizer = critic_graphdef, critic_optimizer
        self.abstract_critic = jax.eval_shape(lambda p: p, state.critic_params)
        self._compiled_critic: dict[int, tuple[Any, Any]] = {}
        self._schedule = learning_rate_schedule(config.optimizer)
        self._critic_schedule = learning_rate_schedule(config.critic.optimizer)

    def _last_update(self, step: int) -> int:
        """The optimizer's count at the last update of step `step` (0-based): every step makes epochs x
        mini-batches updates."""
        return (step + 1) * self.config.learner.epochs * self.config.learner.mini_batches - 1

    def learning_rate(self, step: int) -> float:
        """The policy's learning rate at the last update of step `step` (0-based): "train/learning_rate"."""
        return float(self._schedule(self._last_update(step)))

    def critic_learning_rate(self, step: int) -> float:
        """The critic's learning rate at the last update of step `step` (0-based): "critic/learning_rate"."""
        return float(self._critic_schedule(self._last_update(step)))

    @property
    def has_critic(self) -> bool:
        return self.critic_graphdef is not None

    def critic_steps(self, prompt_width: int):
        """(value update, values) of the critic (`models.value`)."""
        if prompt_width not in self._compiled_critic:
            common = dict(mesh=self.mesh, abstract_params=self.abstract_critic, rules=self.rules,
                          first_scored=prompt_width)
            update = make_value_train_step(
                self.critic_graphdef, self.critic_optimizer, clip=self.config.critic.value_clip,
                aggregate=self.algorithm.aggregate(), micro_batches=self.config.learner.micro_batches, **common)
            values = make_values_fn(self.critic_graphdef, micro_batches=self.config.learner.forward_splits, **common)
            self._compiled_critic[prompt_width] = (update, values)
        return self._compiled_critic[prompt_width]

    def steps(self, prompt_width: int):
        if prompt_width not in self._compiled:
            common = dict(mesh=self.mesh, abstract_params=self.abstract_params, rules=self.rules,
                          chunk_size=self.config.learner.chunk_size, temperature=self.config.rollout.temperature,
                          first_scored=prompt_width)
            loss_fn = self.algorithm.loss_fn()
            if self.config.learner.old_logprobs == "detached":
                loss_fn = train_step.with_detached_old_logprobs(loss_fn)
            update = train_step.make_train_step(
                self.graphdef, self.optimizer, loss_fn, aggregate=self.algorithm.aggregate(),
                micro_batches=self.config.learner.micro_batches,
                router_aux_loss_coef=self.config.learner.router_aux_loss_coef, **common)
            logprobs = train_step.make_logprobs_fn(self.graphdef, micro_batches=self.config.learner.forward_splits,
                                                   **common)
            self._compiled[prompt_width] = (update, logprobs)
        return self._compiled[prompt_width]


_gae = jax.jit(core_value.gae_advantages, static_argnames=("gamma", "lam"))
_whiten = jax.jit(whiten_tokens_by_group)


def critic_advantages(batch: dict[str, np.ndarray], old_values_bt: np.ndarray, config: CriticConfig
                      ) -> dict[str, np.ndarray]:
    """`batch` plus the critic's "old_values_bt" and GAE's (`core.value.gae_advantages`) "advantages_bt" and
    "returns_bt" from the recipe's "token_rewards_bt": the advantages whitened when `config.whiten_advantages`
    (verl's masked_whiten after GAE) over all response tokens of the batch, or, when the recipe gives a
    "whiten_group_b" [B] (ints), within each group's rows (`core.advantages.whiten_tokens_by_group`: RLCER's
    roles); the returns (the critic's targets) never. ValueError when the recipe gave no token rewards."""
    if "token_rewards_bt" not in batch:
        raise ValueError("a recipe that uses the critic must put its rewards in Experience.batch['token_rewards_bt']")
    mask_bt = batch["response_mask_bt"]
    advantages_bt, returns_bt = _gae(batch["token_rewards_bt"], old_values_bt, mask_bt, gamma=config.gamma,
                                     lam=config.lam)
    if config.whiten_advantages:
        groups_b = batch.get("whiten_group_b", np.zeros(mask_bt.shape[0], np.int32))
        advantages_bt = _whiten(advantages_bt, groups_b, mask_bt)
    return {**batch, "old_values_bt": old_values_bt, "advantages_bt": np.asarray(advantages_bt),
            "returns_bt": np.asarray(returns_bt)}


def critic_metrics(batch: dict[str, np.ndarray]) -> dict[str, float]:
    """The critic's fit before this step's updates, over response tokens: verl's vf_explained_var,
    1 - Var(R - V_old) / (Var(R) + 1e-5) (population variances; verl's sample variances give the same ratio up to
    the 1e-5), and the advantages' and returns' summary statistics."""
    mask_bt = batch["response_mask_bt"]
    if not mask_bt.any():
        return {}
    returns, old_values = (batch[key][mask_bt].astype(np.float64) for key in ("returns_bt", "old_values_bt"))
    return {"critic/explained_variance": float(1 - np.var(returns - old_values) / (np.var(returns) + 1e-5)),
            **summary_stats("critic/advantage", batch["advantages_bt"], mask_bt),
            **summary_stats("critic/return", batch["returns_bt"], mask_bt)}


def _mean_metrics(prefix: str, collected: list) -> dict[str, float]:
    collected = jax.device_get(collected)
    return {f"{prefix}/{name}": float(np.mean([m[name] for m in collected])) for name in collected[0]} if collected \
        else {}


def update_policy(learner: Learner, state: policy.LearnerState, batch, prompt_width: int, step: int, seed: int):
    """Step 4 of the module docstring (each mini-batch also updates the critic, when there is one); returns the
    mean of each train/* and critic/* metric over the updates."""
    update, _ = learner.steps(prompt_width)
    critic_update = learner.critic_steps(prompt_width)[0] if learner.has_critic else None
    config = learner.config.learner
    rows = next(iter(batch.values())).shape[0]
    per_update = rows // config.mini_batches
    collected, critic_collected = [], []
    for epoch in range(config.epochs):
        order = np.random.default_rng((seed, step, epoch)).permutation(rows)
        for start in range(0, rows, per_update):
            index = order[start:start + per_update]
            mini_batch = sharding.global_batch({key: value[index] for key, value in batch.items()}, learner.mesh)
            state.params, state.opt_state, metrics = update(state.params, state.opt_state, mini_batch)
            collected.append(metrics)
            if critic_update is not None:
                state.critic_params, state.critic_opt_state, metrics = critic_update(
                    state.critic_params, state.critic_opt_state, mini_batch)
                critic_collected.append(metrics)
    return {**_mean_metrics("train", collected), **_mean_metrics("critic", critic_collected)}



def learn(learner: Learner, state: policy.LearnerState, experience: Experience, step: int, pad_id: int,
          timer: PhaseTimer) -> dict[str, float]:
    """Steps 3 and 4 of `training.rl` on this process's share `experience` of step `step`'s batch (0-based),
    updating `state` in place: the old logprobs recomputed (with learner.old_logprobs "recompute") and the frozen
    reference's (for a KL penalty), timed as "logprobs"; the critic's values and GAE advantages ("values"), when
    the run has a critic; then the update ("update", blocked on, so it times the device's work). Returns the
    step's train/* metrics, the critic's (its fit before the update, `critic_metrics`, and its learning rate) and
    the engine/learner mismatch, in this order."""
    config = learner.config
    recomputes_old_logprobs = config.learner.old_logprobs == "recompute"
    # This process's share in the shape all processes agree on (`data_parallel`); `inputs` the global batch.
    batch, width = data_parallel.align_batch(experience.batch, experience.prompt_width, pad_id,
                                             config.learner.row_multiple)
    inputs = sharding.global_batch({key: batch[key] for key in train_step.POLICY_INPUTS}, learner.mesh)
    if recomputes_old_logprobs or state.reference is not None:
        _, logprobs = learner.steps(width)
        with timer.phase("logprobs"):
            if recomputes_old_logprobs:
                batch["old_logp_bt"] = sharding.process_rows(logprobs(state.params, inputs), learner.mesh)
            if state.reference is not None:
                batch["ref_logp_bt"] = sharding.process_rows(logprobs(state.reference, inputs), learner.mesh)
    critic_step = {}
    if learner.has_critic:
        with timer.phase("values"):
            _, values = learner.critic_steps(width)
            batch = critic_advantages(batch, sharding.process_rows(values(state.critic_params, inputs), learner.mesh),
                                      config.critic)
        critic_step = {**critic_metrics(batch), "critic/learning_rate": learner.critic_learning_rate(step)}
    with timer.phase("update"):
        train_metrics = update_policy(learner, state, batch, width, step, config.seed)
        jax.block_until_ready(state.params)
    mismatch = (mismatch_metrics(batch, batch["old_logp_bt"]) if recomputes_old_logprobs
                else {"mismatch/k3": train_metrics.pop("train/mismatch_k3")})
    return {**train_metrics, **critic_step, **mismatch}
