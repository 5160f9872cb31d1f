"""The critic (`rubric_jax.models.value`): its values are the head applied to the decoder's hidden state before each
response token; it starts at 0 and drops an untied lm_head; its head is laid out by the shared rules; the value
step's loss is the clipped value loss (hand-checked at the zero initial head), accumulates exactly over
micro-batches and shards, and fits returns on a repeated batch."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rubric_jax.models import sharding, train_step, value
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.decoder import Decoder
from tests.models.test_train_step import BATCH, CONFIG, LENGTH, PROMPT, TOL, policy_batch

UNTIED = ModelConfig(**{**CONFIG.__dict__, "tie_word_embeddings": False})


def critic(config=CONFIG, seed=0) -> value.ValueModel:
    model = value.ValueModel(Decoder(config, rngs=nnx.Rngs(seed), shard_activations=sharding.shard_activations),
                             rngs=nnx.Rngs(1))
    # A non-zero head, so that values (and the trunk's gradients) are not all 0.
    head = model.value_head
    head.kernel[...] = jax.random.normal(jax.random.key(seed + 7), head.kernel.shape) * 0.3
    head.bias[...] = jnp.full(head.bias.shape, 0.1)
    return model


def value_batch(seed=0):
    batch = policy_batch(seed)
    rng = np.random.default_rng(seed + 100)
    mask = batch["response_mask_bt"]
    batch["old_values_bt"] = np.where(mask, rng.normal(0, 0.5, mask.shape), 0).astype(np.float32)
    batch["returns_bt"] = np.where(mask, rng.normal(0, 1.0, mask.shape), 0).astype(np.float32)
    return batch


def inputs(batch):
    return [batch[key] for key in train_step.POLICY_INPUTS]


def test_values_are_the_head_on_the_hidden_state_before_each_response_token():
    model = critic()
    batch = value_batch()
    hidden, _ = model.trunk(*inputs(batch)[:3])
    kernel, bias = np.asarray(model.value_head.kernel[...], np.float64), np.asarray(model.value_head.bias[...])
    expected = np.zeros((BATCH, LENGTH))
    for b in range(BATCH):
        for t in range(1, LENGTH):
            if batch["response_mask_bt"][b, t]:
                expected[b, t] = np.asarray(hidden[b, t - 1], np.float64) @ kernel[:, 0] + bias[0]
    for first_scored in (1, PROMPT):
        values = value.sequence_values(model, *inputs(batch), first_scored=first_scored)
        assert values.dtype == jnp.float32
        np.testing.assert_allclose(values, expected, **TOL)
    assert np.any(expected != 0)


def test_a_fresh_critic_values_everything_at_zero_and_drops_an_untied_lm_head():
    model = value.ValueModel(Decoder(UNTIED, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1))
    assert model.trunk.lm_head is None
    paths = {".".join(map(str, path)) for path, _ in nnx.to_flat_state(nnx.state(model))}
    assert not any("lm_head" in path for path in paths)
    assert {"value_head.kernel", "value_head.bias", "trunk.embed_tokens.embedding"} <= paths
    np.testing.assert_array_equal(value.sequence_values(model, *inputs(value_batch())), 0)


def test_the_value_head_is_laid_out_by_the_shared_rules():
    mesh = sharding.make_mesh(1, 2, 2, devices=jax.devices()[:4])
    params = nnx.state(critic())
    shardings = sharding.param_shardings(params, mesh, sharding.partition_rules(CONFIG))
    assert shardings["value_head"]["kernel"].spec == jax.sharding.PartitionSpec("fsdp", None)
    assert shardings["value_head"]["bias"].spec == jax.sharding.PartitionSpec(None)
    assert shardings["trunk"]["embed_tokens"]["embedding"].spec == jax.sharding.PartitionSpec("tensor", "fsdp")


def one_value_step(model=None, *, mesh_shape=(1, 1, 1), clip=0.2, **step_kwargs):
    model = critic() if model is None else model
    rules = sharding.partition_rules(CONFIG)
    mesh = sharding.make_mesh(*mesh_shape, devices=jax.devices()[: int(np.prod(mesh_shape))])
    optimizer = optax.sgd(0.5)
    graphdef, params, opt_state = train_step.init_train_state(model, optimizer, mesh, rules)
    step = value.make_value_train_step(graphdef, optimizer, clip=clip, mesh=mesh, abstract_params=params,
                                       rules=rules, first_scored=PROMPT, **step_kwargs)
    params, _, metrics = step(params, opt_state, value_batch())
    return jax.device_get(metrics), jax.device_get(jax.tree.leaves(params))


def test_at_the_zero_head_the_value_loss_is_half_the_mean_squared_return():
    # V = 0 = inside [V_old - c, V_old + c] wherever |V_old| <= c, else the clip moves it to V_old -+ c.
    batch = value_batch()
    mask = batch["response_mask_bt"]
    old, returns, clip = batch["old_values_bt"].astype(np.float64), batch["returns_bt"].astype(np.float64), 0.2
    clipped = np.clip(0.0, old - clip, old + clip)
    per_token = 0.5 * np.maximum(returns ** 2, (clipped - returns) ** 2)
    metrics, _ = one_value_step(value.ValueModel(Decoder(CONFIG, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1)), clip=clip)
    np.testing.assert_allclose(metrics["loss"], per_token[mask].mean(), **TOL)
    np.testing.assert_allclose(metrics["clip_fraction"], np.mean(((clipped - returns) ** 2 > returns ** 2)[mask]),
                               **TOL)
    assert metrics["value_mean"] == 0 and metrics["grad_norm"] > 0


@pytest.mark.parametrize("micro_batches, mesh_shape", [(2, (1, 1, 1)), (4, (1, 1, 1)), (2, (2, 2, 2))])
def test_the_value_step_accumulates_exactly_over_micro_batches_and_shards(micro_batches, mesh_shape):
    model = critic()
    full_metrics, full_params = one_value_step(copy.deepcopy(model))
    metrics, params = one_value_step(model, micro_batches=micro_batches, mesh_shape=mesh_shape)
    assert metrics.keys() == {"loss", "grad_norm", "clip_fraction", "value_mean"}
    for key in metrics:
        np.testing.assert_allclose(metrics[key], full_metrics[key], **TOL, err_msg=key)
    assert 0 < full_metrics["clip_fraction"] < 1
    for leaf, full_leaf in zip(params, full_params):
        np.testing.assert_allclose(leaf, full_leaf, **TOL)


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_make_values_fn_equals_sequence_values(micro_batches):
    model = critic()
    expected = value.sequence_values(model, *inputs(value_batch()))
    rules = sharding.partition_rules(CONFIG)
    mesh = sharding.make_mesh(1, 2, 1, devices=jax.devices()[:2])
    graphdef, params = nnx.split(model)
    params = jax.device_put(params, sharding.param_shardings(params, mesh, rules))
    values = value.make_values_fn(graphdef, mesh=mesh, abstract_params=params, rules=rules, first_scored=PROMPT,
                                  micro_batches=micro_batches)
    np.testing.assert_allclose(values(params, value_batch()), expected, **TOL)


def test_the_critic_fits_the_returns_of_a_repeated_batch():
    rules = sharding.partition_rules(CONFIG)
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    optimizer = optax.adam(1e-2)
    graphdef, params, opt_state = train_step.init_train_state(critic(), optimizer, mesh, rules)
    step = value.make_value_train_step(graphdef, optimizer, clip=1e6, mesh=mesh, abstract_params=params,
                                       rules=rules, first_scored=PROMPT)
    batch = value_batch()
    losses = []
    for _ in range(30):
        params, opt_state, metrics = step(params, opt_state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.2 * losses[0]
