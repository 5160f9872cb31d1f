"""PPO with a critic in the trainer: GAE advantages from the critic's values (against verl's loops), the critic's
metrics, its own optimizer and learning rate, its params and optimizer state in the checkpoint, and the `critic`
config section's validation; RLCER with its paper's estimator, ppo_critic. (Kill-and-resume with a critic:
tests/training/test_resume.py.)"""

import math

import numpy as np
import pytest

from rubric_jax.algorithms.rlcer import RLCER, RLCERConfig
from rubric_jax.training import policy
from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.metrics import read_metrics
from rubric_jax.training.optim import OptimizerConfig
from rubric_jax.training.learner import critic_advantages
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import (
    AlgorithmSpec, CriticConfig, LearnerConfig, ModelSpec, RLConfig, RolloutConfig)
from rubric_jax.yaml_config import config_from_dict
from tests.algorithms.test_rlcer import WIDE, hashed, world_step  # noqa: F401  (hashed: a fixture)
from tests.core import reference_value as ref
from tests.training import critic_recipe  # noqa: F401  (registers "toy_critic")
from tests.training.test_rl import tiny_rl_config
from tests.training.toy_task import toy_task


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("seed", range(5))
def test_critic_advantages_are_verls_gae_whitened_over_the_batch(seed, whiten):
    batch = ref.random_value_batch(np.random.RandomState(seed))
    if batch.mask.sum() < 2:
        pytest.skip("whitening needs two valid tokens")
    config = CriticConfig(gamma=0.99, lam=0.95, whiten_advantages=whiten)
    out = critic_advantages({"token_rewards_bt": batch.rewards, "response_mask_bt": batch.mask}, batch.values,
                            config)
    advantages, returns = ref.verl_gae(batch.rewards, batch.values, batch.mask, 0.99, 0.95)
    expected = ref.verl_whiten(advantages, batch.mask) if whiten else np.where(batch.mask, advantages, 0)
    np.testing.assert_allclose(out["advantages_bt"], expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["returns_bt"], np.where(batch.mask, returns, 0), rtol=2e-5, atol=2e-6)
    assert out["old_values_bt"] is batch.values


def test_critic_advantages_are_whitened_within_each_whitening_group_by_hand():
    """Values 0 and gamma = lam = 1, so GAE's advantage on each token of a row is the reward on its last token.
    Reasoner rows (group 0): r = 1 and -1 on two tokens each; rubricator rows (group 1): r = 0.5 and 1.5 on one.
    Per group (sample std): reasoner tokens 1, 1, -1, -1 -> mean 0, std sqrt(4 / 3): +-sqrt(3) / 2; rubricator
    tokens 0.5, 1.5 -> mean 1, std sqrt(0.5): -+sqrt(0.5).
    Jointly: mean (1 + 1 - 1 - 1 + 0.5 + 1.5) / 6 = 1 / 3, deviations 2/3, 2/3, -4/3, -4/3, 1/6, 7/6, sample
    variance (4 + 4 + 16 + 16) / 9 / 5 + (1 + 49) / 36 / 5 = 7 / 6."""
    mask = np.array([[1, 1], [1, 1], [0, 1], [0, 1]], bool)
    rewards = np.array([[0, 1], [0, -1], [0, 0.5], [0, 1.5]], np.float32)
    batch = {"token_rewards_bt": rewards, "response_mask_bt": mask, "whiten_group_b": np.array([0, 0, 1, 1])}
    out = critic_advantages(batch, np.zeros((4, 2), np.float32), CriticConfig())
    half_root3, root_half = np.sqrt(3) / 2, np.sqrt(0.5)
    np.testing.assert_allclose(out["advantages_bt"], [[half_root3] * 2, [-half_root3] * 2, [0, -root_half],
                                                      [0, root_half]], rtol=1e-6)
    np.testing.assert_allclose(out["returns_bt"], np.where(mask, rewards[:, 1:], 0), rtol=1e-6)
    joint = critic_advantages({**batch, "whiten_group_b": np.zeros(4, np.int32)}, np.zeros((4, 2), np.float32),
                              CriticConfig())
    expected_joint = (np.array([[1, 1], [-1, -1], [0, 0.5], [0, 1.5]]) - 1 / 3) / np.sqrt(7 / 6)
    np.testing.assert_allclose(joint["advantages_bt"], np.where(mask, expected_joint, 0), rtol=1e-6)
    without_groups = {key: value for key, value in batch.items() if key != "whiten_group_b"}
    np.testing.assert_allclose(critic_advantages(without_groups, np.zeros((4, 2), np.float32),
                                                 CriticConfig())["advantages_bt"], joint["advantages_bt"])


def test_critic_advantages_need_token_rewards():
    mask = np.ones((2, 3), bool)
    with pytest.raises(ValueError, match="token_rewards_bt"):
        critic_advantages({"response_mask_bt": mask, "advantages_bt": np.zeros((2, 3))}, np.zeros((2, 3)),
                          CriticConfig())


def test_a_critic_run_logs_the_critics_metrics_and_checkpoints_its_params_and_optimizer_state(tmp_path):
    critic = CriticConfig(optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=4), value_clip=0.2,
                          gamma=1.0, lam=0.95)
    config = tiny_rl_config(tmp_path, steps=2, algorithm=AlgorithmSpec(name="toy_critic"), critic=critic,
                            learner=LearnerConfig(mini_batches=2))
    train_rl(config, toy_task())
    first, second = read_metrics(tmp_path / "run" / "metrics.jsonl")
    expected = {"critic/loss", "critic/grad_norm", "critic/clip_fraction", "critic/value_mean",
                "critic/explained_variance", "critic/learning_rate", "critic/advantage/mean", "critic/advantage/std",
                "critic/return/mean", "time/values", "train/loss", "train/clip_fraction"}
    assert expected <= first.keys() and expected <= second.keys()
    assert all(math.isfinite(v) for line in (first, second) for v in line.values() if isinstance(v, float))
    # Two updates per step, warmup 4: the critic's lr after step 1 is at update 1, (1 + 1) / 4 of its peak.
    assert first["critic/learning_rate"] == pytest.approx(3e-3 * 2 / 4)
    assert second["critic/learning_rate"] == pytest.approx(3e-3)
    # The fresh critic values every state at 0, so its first fit explains nothing: 1 - var(R) / (var(R) + 1e-5),
    # which is only the epsilon's share; whitening centres advantages.
    return_var = first["critic/return/std"] ** 2
    assert first["critic/explained_variance"] == pytest.approx(1e-5 / (return_var + 1e-5), rel=1e-3)
    assert first["critic/advantage/mean"] == pytest.approx(0, abs=1e-5)
    assert first["critic/loss"] > 0 and first["critic/grad_norm"] > 0
    # By step 2 the critic has been trained: its values are no longer all 0.
    assert abs(second["critic/explained_variance"]) > 1e-3

    checkpoints = Checkpointer(tmp_path / "run" / "checkpoints")
    tree, _ = checkpoints.restore(None, None)
    checkpoints.close()
    assert set(tree) == {"params", "opt_state", "critic"} and set(tree["critic"]) == {"params", "opt_state"}
    kernel = np.asarray(tree["critic"]["params"]["value_head"]["kernel"]["value"])
    assert kernel.shape == (32, 1) and np.any(kernel != 0)
    assert "lm_head" not in tree["critic"]["params"]["trunk"]


def test_a_recipe_without_a_critic_builds_none():
    state = policy.LearnerState(params={}, opt_state={})
    assert "critic" not in state.tree()
    assert policy.LearnerState.from_tree(state.tree()).critic_params is None


@pytest.mark.parametrize("section, message", [
    ({"value_clip": -0.1}, "value_clip"),
    ({"gamma": 1.5}, "gamma"),
    ({"lam": -0.5}, "lam"),
    ({"optimizer": {"learning_rate": 0}}, "learning_rate"),
    ({"clip": 0.2}, "critic.clip"),
])
def test_the_critic_section_is_validated(section, message):
    data = {"output_dir": "x", "steps": 1, "model": {"init": {}}, "critic": section}
    with pytest.raises(ValueError, match=message):
        config_from_dict(RLConfig, data)


def test_the_critic_sections_defaults_are_verls_and_a_partial_optimizer_keeps_the_critics_lr():
    config = config_from_dict(RLConfig, {"output_dir": "x", "steps": 1, "model": {"init": {}},
                                         "critic": {"optimizer": {"warmup_steps": 10}}})
    assert config.critic.optimizer.learning_rate == 1e-5 and config.critic.optimizer.warmup_steps == 10
    assert (config.critic.value_clip, config.critic.gamma, config.critic.lam) == (0.5, 1.0, 1.0)
    assert config.critic.whiten_advantages


# ---------------------------------------------------------------- RLCER with the critic (its paper's estimator)


def test_rlcers_critic_estimator_hands_each_rows_reward_on_its_last_token():
    critic, _ = world_step(RLCERConfig())
    ablation, _ = world_step(RLCERConfig(estimator="grpo"))
    assert RLCER(RLCERConfig()).uses_critic and not RLCER(RLCERConfig(estimator="grpo")).uses_critic
    assert "advantages_bt" not in critic.batch and "token_rewards_bt" not in ablation.batch
    mask = critic.batch["response_mask_bt"]
    np.testing.assert_array_equal(mask, ablation.batch["response_mask_bt"])
    rewards = critic.batch["token_rewards_bt"]
    last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)
    off_last = np.ones(mask.shape, bool)
    off_last[np.arange(len(last)), last] = False
    assert np.all(rewards[off_last] == 0)
    # The same rollouts and rewards as the GRPO ablation: 8 reasoner rows, then 8 rubricator rows.
    row_rewards = rewards.sum(axis=1)
    assert row_rewards[:8].mean() == pytest.approx(ablation.metrics["reward/mean"], abs=1e-6)
    assert row_rewards[8:].mean() == pytest.approx(ablation.metrics["rubricator/reward/mean"], abs=1e-6)
    assert np.std(row_rewards[:8]) > 0 and np.std(row_rewards[8:]) > 0
    assert "advantage/mean" not in critic.metrics and "advantage/mean" in ablation.metrics


@pytest.mark.parametrize("whitening", ["per_role", "joint"])
def test_rlcers_critic_advantages_are_whitened_per_role_unless_joint(whitening):
    """Sections 4.1 and 4.5: advantages "computed separately for each role". Per role, each role's response
    tokens have whitened advantages of mean 0 and sample std 1 (the critic's values are 0 here); jointly, only the
    batch's tokens together do."""
    experience, _ = world_step(RLCERConfig(advantage_whitening=whitening))
    batch = experience.batch
    roles = np.repeat([0, 1], 8)
    np.testing.assert_array_equal(batch["whiten_group_b"], roles if whitening == "per_role" else 0)
    out = critic_advantages(batch, np.zeros(batch["response_mask_bt"].shape, np.float32), CriticConfig())
    mask = batch["response_mask_bt"]
    groups = [roles == 0, roles == 1] if whitening == "per_role" else [np.ones(16, bool)]
    for rows in groups:
        tokens = out["advantages_bt"][rows][mask[rows]]
        assert tokens.mean() == pytest.approx(0, abs=1e-5) and tokens.std(ddof=1) == pytest.approx(1, abs=1e-4)
    if whitening == "joint":
        reasoner_tokens = out["advantages_bt"][roles == 0][mask[roles == 0]]
        assert abs(reasoner_tokens.mean()) > 1e-3  # the two roles' rewards differ in scale


def test_rlcer_trains_with_its_critic_end_to_end(tmp_path, hashed):
    task, _, _ = hashed
    config = tiny_rl_config(tmp_path, model=ModelSpec(init=WIDE), seed=5, steps=2,
                            rollout=RolloutConfig(prompts_per_step=3, group_size=4, max_new_tokens=16),
                            critic=CriticConfig(optimizer=OptimizerConfig(learning_rate=1e-3)),
                            algorithm=AlgorithmSpec(name="rlcer", params={"max_items": 4,
                                                                          "rubricator_max_new_tokens": 12}))
    train_rl(config, task)
    lines = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert {"critic/loss", "critic/explained_variance", "critic/advantage/std", "rlcer/valid_fraction",
                "rubricator/reward/mean", "train/loss"} <= line.keys()
        assert all(math.isfinite(v) for v in line.values())
        assert line["train/grad_norm"] > 0 and line["critic/grad_norm"] > 0
    # One update per step: step 1's update saw the zero-initialised head, step 2's a trained critic.
    assert lines[0]["critic/value_mean"] == 0 and lines[1]["critic/value_mean"] != 0
