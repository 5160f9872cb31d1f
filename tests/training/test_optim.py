"""The optimizer: schedule values by hand and against a plain-loop reference, decay only on matrices, clipping."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rubric_jax.training.optim import OptimizerConfig, learning_rate_schedule, make_optimizer, schedule_mismatch


def reference_lr(config: OptimizerConfig, step: int) -> float:
    """The module docstring's formulas, one step at a time."""
    peak = config.learning_rate
    if step < config.warmup_steps:
        return peak * (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return peak
    floor = config.min_lr_ratio * peak
    progress = min(1.0, (step - config.warmup_steps) / (config.total_steps - config.warmup_steps))
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def test_hand_computed_warmup_then_cosine_to_the_floor():
    config = OptimizerConfig(learning_rate=1e-3, warmup_steps=4, schedule="cosine", total_steps=10, min_lr_ratio=0.1)
    lr = learning_rate_schedule(config)
    expected = {0: 2.5e-4, 1: 5e-4, 3: 1e-3, 4: 1e-3, 7: 1e-4 + 9e-4 * 0.5, 10: 1e-4, 50: 1e-4}
    for step, value in expected.items():
        assert float(lr(step)) == pytest.approx(value, rel=1e-6), step


@pytest.mark.parametrize(
    "config",
    [
        OptimizerConfig(learning_rate=3e-6),
        OptimizerConfig(learning_rate=1e-6, warmup_steps=10),
        OptimizerConfig(learning_rate=5e-7, warmup_steps=7, schedule="cosine", total_steps=100, min_lr_ratio=0.05),
        OptimizerConfig(learning_rate=1e-5, schedule="cosine", total_steps=30),
    ],
)
def test_schedule_equals_the_reference_at_every_step(config):
    steps = np.arange(0, 130)
    values = np.asarray(jax.jit(jax.vmap(learning_rate_schedule(config)))(steps))
    np.testing.assert_allclose(values, [reference_lr(config, int(s)) for s in steps], rtol=1e-5)


def test_weight_decay_only_on_matrices():
    config = OptimizerConfig(learning_rate=0.1, weight_decay=0.5, max_grad_norm=None)
    params = {"kernel": jnp.full((2, 3), 2.0), "scale": jnp.full((3,), 2.0), "bias": jnp.full((3,), -1.0)}
    optimizer = make_optimizer(config)
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    updates, _ = optimizer.update(zero_grads, optimizer.init(params), params)
    new = optax.apply_updates(params, updates)
    np.testing.assert_allclose(new["kernel"], 2.0 - 0.1 * 0.5 * 2.0, rtol=1e-6)  # decoupled decay lr * wd * p
    np.testing.assert_array_equal(new["scale"], params["scale"])
    np.testing.assert_array_equal(new["bias"], params["bias"])


@pytest.mark.parametrize("max_grad_norm, scale", [(1.0, 0.1), (100.0, 1.0)])
def test_clipping_scales_the_gradient_adam_sees(max_grad_norm, scale):
    config = OptimizerConfig(learning_rate=1e-3, b1=0.9, max_grad_norm=max_grad_norm)
    params = {"a": jnp.zeros((2, 2)), "b": jnp.zeros((4,))}
    grads = {"a": jnp.full((2, 2), 3.0), "b": jnp.full((4,), 4.0)}  # global norm sqrt(4 * 9 + 4 * 16) = 10
    optimizer = make_optimizer(config)
    _, state = optimizer.update(grads, optimizer.init(params), params)
    mu = optax.tree_utils.tree_get(state, "mu")
    for key in grads:
        np.testing.assert_allclose(mu[key], (1 - 0.9) * scale * grads[key], rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(learning_rate=0.0), "learning_rate"),
        (dict(learning_rate=float("nan")), "learning_rate"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(b1=1.0), "b1"),
        (dict(b2=-0.1), "b2"),
        (dict(eps=0), "eps"),
        (dict(warmup_steps=-1), "warmup_steps"),
        (dict(warmup_steps=2.5), "warmup_steps"),
        (dict(schedule="linear"), "schedule"),
        (dict(schedule="cosine"), "total_steps"),
        (dict(schedule="cosine", warmup_steps=10, total_steps=10), "total_steps"),
        (dict(min_lr_ratio=1.5), "min_lr_ratio"),
        (dict(max_grad_norm=0.0), "max_grad_norm"),
        (dict(learning_rate=True), "learning_rate"),
    ],
)
def test_invalid_config_is_a_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"optimizer\.{field}"):
        OptimizerConfig(**kwargs)


def test_a_cosine_schedule_longer_or_shorter_than_the_run_is_named():
    config = OptimizerConfig(learning_rate=1e-3, warmup_steps=4, schedule="cosine", total_steps=804)
    warning = schedule_mismatch(config, 204)
    # 200 of the decay's 800 updates: a quarter; lr at update 203 is floor 0 + 1e-3 (1 + cos(pi * 199 / 800)) / 2
    assert warning.startswith("optimizer.total_steps is 804 but the run makes 204 optimizer updates: its cosine "
                              "schedule ends 25% of the way through its decay")
    assert f"learning rate {1e-3 * (1 + math.cos(math.pi * 199 / 800)) / 2:.3g} at the last update" in warning
    assert warning.endswith("set optimizer.total_steps=204 to fit the schedule to the run")
    assert schedule_mismatch(config, 804) is None
    assert schedule_mismatch(OptimizerConfig(learning_rate=1e-3), 10) is None  # constant: no length
    assert "critic.optimizer.total_steps is 804" in schedule_mismatch(config, 2000, "critic.optimizer")
