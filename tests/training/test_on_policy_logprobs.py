"""learner.old_logprobs detached: on one epoch of one mini-batch the old logprobs are the update's own, detached
(`train_step.with_detached_old_logprobs`), so the learner's extra forward pass is skipped.

The parameters after an update equal those of the path that recomputes the old logprobs up to float rounding:
the two paths differ only in how the old logprobs are computed (a separate compiled forward pass, or the update's
own), which agree to about 1e-6 in float32, so every ratio is 1 +- 1e-6 in one path and exactly 1 in the other,
and each gradient element differs by about 1e-6 of the token terms summed into it. With SGD the update is the
gradient times the learning rate, so the two updates agree within 1e-4 of the largest. Adam divides each
gradient element by its magnitude plus eps, which would amplify that rounding without bound on an element whose
gradient is near 0, so the run-level comparison takes eps = 1e-3: an update then moves by at most
lr * |delta g| / eps, orders of magnitude inside the 1e-3 * lr tolerance. The same holds for
learner.forward_micro_batches, which splits the old and reference logprobs pass into sequential micro-batches."""

import dataclasses

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from rubric_jax.algorithms.base import PolicyLossConfig
from rubric_jax.algorithms.rar import RaR, RaRConfig
from rubric_jax.models import sharding, train_step
from rubric_jax.training import rl
from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.metrics import read_metrics
from rubric_jax.training.optim import OptimizerConfig
from rubric_jax.training.run_config import AlgorithmSpec, LearnerConfig
from tests.training.test_rl import experience, tiny_rl_config  # noqa: F401  (experience is a fixture)
from tests.training.toy_task import toy_task

RUN_OPTIMIZER = OptimizerConfig(learning_rate=1e-3, eps=1e-3)


@pytest.mark.parametrize("loss", [
    PolicyLossConfig(),
    PolicyLossConfig(loss="dual_clip", rollout_correction="tis", kl_coef=0.1),
    PolicyLossConfig(token_selection="high_entropy", rollout_correction="icepop", aggregation="seq_mean_token_mean"),
], ids=["ppo", "dual_clip_tis_kl", "high_entropy_icepop"])
def test_the_detached_update_gives_the_parameters_of_the_recomputed_one(experience, loss):  # noqa: F811
    model, mesh, result = experience
    algorithm = RaR(RaRConfig(policy_loss=loss))
    graphdef, params = nnx.split(model)
    common = dict(mesh=mesh, abstract_params=params, rules=sharding.partition_rules(model.config),
                  first_scored=result.prompt_width)
    logprobs = train_step.make_logprobs_fn(graphdef, **common)
    batch = dict(result.batch)
    batch["ref_logp_bt"] = np.asarray(logprobs(params, batch)) - 0.01  # a reference a little off the policy
    optimizer = optax.sgd(1.0)

    def one_update(loss_fn, batch):
        step = train_step.make_train_step(graphdef, optimizer, loss_fn, aggregate=algorithm.aggregate(), **common)
        start = jax.tree.map(np.array, params)  # a fresh copy: the step donates its inputs
        updated, _, metrics = step(start, optimizer.init(start), batch)
        return jax.tree.map(np.asarray, updated), jax.device_get(metrics)

    recomputed, recomputed_metrics = one_update(
        algorithm.loss_fn(), {**batch, "old_logp_bt": np.asarray(logprobs(params, batch))})
    detached, detached_metrics = one_update(train_step.with_detached_old_logprobs(algorithm.loss_fn()), batch)

    initial = jax.tree.leaves(jax.tree.map(np.asarray, params))
    recomputed_updates = [a - p for a, p in zip(jax.tree.leaves(recomputed), initial)]
    detached_updates = [b - p for b, p in zip(jax.tree.leaves(detached), initial)]
    largest = max(np.abs(u).max() for u in recomputed_updates)
    assert largest > 1e-4  # the update did move the parameters
    for a, b in zip(recomputed_updates, detached_updates):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * largest)
    assert detached_metrics["clip_fraction"] == 0  # every ratio is exactly 1
    # The loss is a mean of -A r over zero-mean advantages (|A| of order 1): it differs by about 1e-6 of |A|.
    np.testing.assert_allclose(detached_metrics["loss"], recomputed_metrics["loss"], rtol=0, atol=1e-6)
    # The engine is the same policy here: its logprobs match the learner's.
    assert 0 <= detached_metrics["mismatch_k3"] < 1e-8


def test_the_detached_old_logprobs_are_the_updates_own_with_their_gradient():
    """A probe loss sees old_logp_bt = logp_bt, and its gradient flows through logp_bt only."""
    seen = {}

    def probe(logp_bt, entropy_bt, batch):
        seen["old"] = batch["old_logp_bt"]
        return jax.numpy.exp(logp_bt - batch["old_logp_bt"]), {}

    wrapped = train_step.with_detached_old_logprobs(probe)
    logp = jax.numpy.array([[-1.0, -2.0, -3.0]])
    batch = {"response_mask_bt": np.array([[False, True, True]]), "rollout_logp_bt": np.array([[0.0, -2.5, -3.0]])}
    grad = jax.grad(lambda x: wrapped(x, None, batch)[0].sum())(logp)
    np.testing.assert_array_equal(seen["old"], logp)
    np.testing.assert_array_equal(grad, np.ones((1, 3)))  # d exp(x - sg(x)) / dx = exp(0) = 1
    _, metrics = wrapped(logp, None, batch)
    np.testing.assert_allclose(metrics["mismatch_k3"], [[0.0, np.expm1(0.5) - 0.5, 0.0]], rtol=1e-6)


def test_a_detached_run_skips_the_old_logprobs_pass_and_matches_the_recomputing_run(tmp_path, monkeypatch):
    calls = []
    original = train_step.make_logprobs_fn

    def counting(*args, **kwargs):
        logprobs = original(*args, **kwargs)

        def counted(params, batch):
            calls.append(1)
            return logprobs(params, batch)

        return counted

    monkeypatch.setattr(train_step, "make_logprobs_fn", counting)

    def run(name, old_logprobs, kl_coef):
        config = tiny_rl_config(tmp_path / name, steps=2, learner=LearnerConfig(old_logprobs=old_logprobs),
                                optimizer=RUN_OPTIMIZER,
                                algorithm=AlgorithmSpec(name="rar", params={"policy_loss": {"kl_coef": kl_coef}}))
        calls.clear()
        rl.train_rl(config, toy_task())
        state, _ = Checkpointer(tmp_path / name / "run" / "checkpoints").restore(2, None)
        return len(calls), read_metrics(tmp_path / name / "run" / "metrics.jsonl"), state["params"]

    recompute_calls, recompute_lines, recompute_params = run("recompute", "recompute", 0.0)
    detached_calls, detached_lines, detached_params = run("detached", "detached", 0.0)
    kl_calls, kl_lines, _ = run("detached_kl", "detached", 0.1)
    assert recompute_calls == 2  # one old-logprobs pass per step
    assert detached_calls == 0  # skipped
    assert kl_calls == 2  # the reference's logprobs only
    for line in detached_lines:
        assert "time/logprobs" not in line and "mismatch/max_abs" not in line
        assert 0 <= line["mismatch/k3"] < 1e-8 and line["train/clip_fraction"] == 0
    assert all("time/logprobs" in line and line["train/kl"] >= 0 for line in kl_lines)
    # Two updates of the same batches: the recomputing and the detached run agree to float rounding.
    for a, b in zip(jax.tree.leaves(recompute_params), jax.tree.leaves(detached_params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-3 * RUN_OPTIMIZER.learning_rate)
    for recomputed, detached in zip(recompute_lines, detached_lines):
        assert detached["reward/mean"] == recomputed["reward/mean"]


def test_detached_old_logprobs_need_one_epoch_of_one_mini_batch():
    assert LearnerConfig(old_logprobs="detached").old_logprobs == "detached"
    for changes in ({"epochs": 2}, {"mini_batches": 2}):
        with pytest.raises(ValueError, match="old_logprobs detached needs epochs = mini_batches = 1"):
            dataclasses.replace(LearnerConfig(old_logprobs="detached"), **changes)


def test_forward_micro_batches_split_the_old_and_reference_logprobs_without_changing_the_run(tmp_path, monkeypatch):
    """learner.forward_micro_batches reaches the learner's logprobs pass, and splitting it changes no result beyond
    float rounding: 2 steps with kl (old and reference logprobs) in 1 and in 8 micro-batches of one row."""
    splits = []
    original = train_step.make_logprobs_fn

    def recording(*args, **kwargs):
        splits.append(kwargs["micro_batches"])
        return original(*args, **kwargs)

    monkeypatch.setattr(train_step, "make_logprobs_fn", recording)

    def run(name, forward_micro_batches):
        config = tiny_rl_config(tmp_path / name, steps=2, optimizer=RUN_OPTIMIZER,
                                learner=LearnerConfig(forward_micro_batches=forward_micro_batches),
                                algorithm=AlgorithmSpec(name="rar", params={"policy_loss": {"kl_coef": 0.1}}))
        rl.train_rl(config, toy_task())
        state, _ = Checkpointer(tmp_path / name / "run" / "checkpoints").restore(2, None)
        return read_metrics(tmp_path / name / "run" / "metrics.jsonl"), state["params"]

    whole_lines, whole_params = run("whole", None)
    split_lines, split_params = run("split", 8)
    assert set(splits) == {1, 8}
    for a, b in zip(jax.tree.leaves(whole_params), jax.tree.leaves(split_params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-3 * RUN_OPTIMIZER.learning_rate)
    for whole, split in zip(whole_lines, split_lines):
        assert split["reward/mean"] == whole["reward/mean"]
        np.testing.assert_allclose(split["train/kl"], whole["train/kl"], rtol=1e-4, atol=1e-7)
        assert split["mismatch/max_abs"] < 1e-4
