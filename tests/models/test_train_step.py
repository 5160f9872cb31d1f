"""The train step's loss plumbing: micro-batch accumulation equals the full batch for every aggregation mode
(also sharded over simulated devices), the KL penalty adds exactly coef * kl per token, the SFT loss is the
masked cross-entropy computed from full logits, and `make_logprobs_fn` equals `sequence_logprobs`, in one call or
over micro-batches."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rubric_jax.core import aggregation, kl, losses
from rubric_jax.models import sharding, train_step
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.decoder import Decoder
from rubric_jax.models.logprobs import sequence_logprobs

CONFIG = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64, tie_word_embeddings=True)
BATCH, LENGTH, PROMPT = 8, 12, 4
TOL = dict(rtol=2e-5, atol=2e-6)
AGGREGATIONS = {
    "token_mean": aggregation.token_mean,
    "seq_mean_token_mean": aggregation.seq_mean_token_mean,
    "seq_mean_token_sum": aggregation.seq_mean_token_sum,
    "seq_mean_token_sum_norm": functools.partial(aggregation.seq_mean_token_sum_norm, norm_constant=8.0),
    "token_sum_norm": functools.partial(aggregation.token_sum_norm, norm_constant=8.0),
}


def policy_batch(seed: int = 0) -> dict[str, np.ndarray]:
    """Prompts of PROMPT tokens, responses of ragged lengths (one row empty), advantages of both signs."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, LENGTH - PROMPT + 1, BATCH)
    lengths[3] = 0
    response_mask = np.arange(LENGTH)[None, :] - PROMPT < lengths[:, None]
    response_mask &= np.arange(LENGTH)[None, :] >= PROMPT
    attention_mask = (np.arange(LENGTH)[None, :] < PROMPT) | response_mask
    return {
        "tokens_bt": rng.integers(0, CONFIG.vocab_size, (BATCH, LENGTH)).astype(np.int32),
        "positions_bt": np.broadcast_to(np.arange(LENGTH, dtype=np.int32), (BATCH, LENGTH)).copy(),
        "attention_mask_bt": attention_mask,
        "response_mask_bt": response_mask,
        "old_logp_bt": np.where(response_mask, rng.normal(-4.0, 0.5, (BATCH, LENGTH)), 0).astype(np.float32),
        "advantages_bt": np.where(response_mask, rng.normal(size=(BATCH, 1)), 0).astype(np.float32),
        "ref_logp_bt": np.where(response_mask, rng.normal(-4.0, 0.5, (BATCH, LENGTH)), 0).astype(np.float32),
    }


def one_step(loss_fn, *, mesh_shape=(1, 1, 1), decoder_options=None, **step_kwargs):
    model = Decoder(CONFIG, rngs=nnx.Rngs(0), shard_activations=sharding.shard_activations, **(decoder_options or {}))
    rules = sharding.partition_rules(CONFIG)
    mesh = sharding.make_mesh(*mesh_shape, devices=jax.devices()[: int(np.prod(mesh_shape))])
    optimizer = optax.sgd(0.5)
    graphdef, params, opt_state = train_step.init_train_state(model, optimizer, mesh, rules)
    step = train_step.make_train_step(graphdef, optimizer, loss_fn, mesh=mesh, abstract_params=params, rules=rules,
                                      chunk_size=4, **step_kwargs)
    params, _, metrics = step(params, opt_state, policy_batch())
    return jax.device_get(metrics), jax.device_get(jax.tree.leaves(params))


PPO = train_step.ratio_loss(losses.ppo_clip_loss, eps_low=0.2, eps_high=0.28)


@pytest.mark.parametrize("name", AGGREGATIONS)
@pytest.mark.parametrize("micro_batches", [2, 4, 8])
def test_micro_batches_accumulate_to_the_full_batch(name, micro_batches):
    full_metrics, full_params = one_step(PPO, aggregate=AGGREGATIONS[name])
    metrics, params = one_step(PPO, aggregate=AGGREGATIONS[name], micro_batches=micro_batches)
    assert metrics.keys() == full_metrics.keys() == {"loss", "grad_norm", "entropy", "clip_fraction"}
    for key in metrics:
        np.testing.assert_allclose(metrics[key], full_metrics[key], **TOL, err_msg=key)
    assert full_metrics["grad_norm"] > 0
    for leaf, full_leaf in zip(params, full_params):
        np.testing.assert_allclose(leaf, full_leaf, **TOL)


def test_micro_batches_on_a_sharded_mesh_equal_the_unsharded_full_batch():
    full_metrics, full_params = one_step(PPO)
    metrics, params = one_step(PPO, mesh_shape=(2, 2, 2), micro_batches=2)
    for key in metrics:
        np.testing.assert_allclose(metrics[key], full_metrics[key], **TOL, err_msg=key)
    for leaf, full_leaf in zip(params, full_params):
        np.testing.assert_allclose(leaf, full_leaf, **TOL)


def test_a_decoder_scanning_its_layers_takes_the_same_step_on_a_sharded_mesh():
    """`scan_layers` (with remat, as the paper configs run it) over micro-batches on a 2 x 2 x 2 mesh: the loss, the
    gradient norm and every updated parameter of the unrolled decoder's unsharded full-batch step."""
    full_metrics, full_params = one_step(PPO)
    metrics, params = one_step(PPO, mesh_shape=(2, 2, 2), micro_batches=2,
                               decoder_options=dict(remat=True, scan_layers=True))
    for key in metrics:
        np.testing.assert_allclose(metrics[key], full_metrics[key], **TOL, err_msg=key)
    for leaf, full_leaf in zip(params, full_params):
        np.testing.assert_allclose(leaf, full_leaf, **TOL)


def test_micro_batches_must_divide_into_an_int():
    with pytest.raises(ValueError, match="micro_batches"):
        one_step(PPO, micro_batches=0)


def test_kl_penalty_adds_coef_times_kl_per_token():
    coef = 0.3
    plain, _ = one_step(PPO)
    penalised, _ = one_step(train_step.with_kl_penalty(PPO, kl.kl_k3, coef))
    # The first step's loss is evaluated at the initial parameters in both runs: recompute the KL there.
    model = Decoder(CONFIG, rngs=nnx.Rngs(0))
    batch = policy_batch()
    logp, _ = sequence_logprobs(model, *(batch[k] for k in ("tokens_bt", "positions_bt", "attention_mask_bt",
                                                             "response_mask_bt")), chunk_size=4)
    kl_bt = kl.kl_k3(logp, batch["ref_logp_bt"], batch["response_mask_bt"])
    expected_kl = aggregation.finalize(*aggregation.token_mean(kl_bt, batch["response_mask_bt"]))
    np.testing.assert_allclose(penalised["kl"], expected_kl, **TOL)
    np.testing.assert_allclose(penalised["loss"], plain["loss"] + coef * expected_kl, **TOL)
    assert penalised["kl"] > 0


def test_the_sft_loss_is_the_masked_cross_entropy_of_full_logits():
    metrics, _ = one_step(train_step.confidence_penalized_nll(0.0))
    model = Decoder(CONFIG, rngs=nnx.Rngs(0))
    batch = policy_batch()
    hidden, _ = model(batch["tokens_bt"], batch["positions_bt"], batch["attention_mask_bt"])
    log_probs = np.asarray(jax.nn.log_softmax(model.logits(hidden), axis=-1), np.float64)
    total, count = 0.0, 0
    for b in range(BATCH):
        for t in range(1, LENGTH):
            if batch["response_mask_bt"][b, t]:
                total -= log_probs[b, t - 1, batch["tokens_bt"][b, t]]
                count += 1
    np.testing.assert_allclose(metrics["loss"], total / count, rtol=1e-5)


@pytest.mark.parametrize("micro_batches, remat, scan_layers", [(1, False, False), (2, False, False),
                                                                 (4, True, False), (2, True, True)])
def test_make_logprobs_fn_equals_sequence_logprobs(micro_batches, remat, scan_layers):
    """Also over micro-batches: every row comes back in its place (the rows differ, so a permutation would show);
    a remat decoder too (its layers are re-traced inside the micro-batch loop), and one scanning its layers on
    the sharded mesh."""
    model = Decoder(CONFIG, rngs=nnx.Rngs(0), remat=remat, scan_layers=scan_layers)
    rules = sharding.partition_rules(CONFIG)
    mesh = sharding.make_mesh(1, 2, 1, devices=jax.devices()[:2])
    graphdef, params = nnx.split(model)
    params = jax.device_put(params, sharding.param_shardings(params, mesh, rules))
    batch = policy_batch()
    logprobs = train_step.make_logprobs_fn(graphdef, mesh=mesh, abstract_params=params, rules=rules, chunk_size=4,
                                           first_scored=PROMPT, micro_batches=micro_batches)
    expected, _ = sequence_logprobs(Decoder(CONFIG, rngs=nnx.Rngs(0)), *(batch[k] for k in (
        "tokens_bt", "positions_bt", "attention_mask_bt", "response_mask_bt")), chunk_size=4)
    np.testing.assert_allclose(logprobs(params, batch), expected, **TOL)
    assert jnp.any(expected != 0)


def test_the_confidence_penalty_subtracts_coef_times_the_mean_entropy():
    plain, _ = one_step(train_step.confidence_penalized_nll(0.0))
    penalised, _ = one_step(train_step.confidence_penalized_nll(0.25))
    assert penalised["entropy"] == plain["entropy"] > 0
    np.testing.assert_allclose(penalised["loss"], plain["loss"] - 0.25 * plain["entropy"], **TOL)
    with pytest.raises(ValueError, match="coef"):
        train_step.confidence_penalized_nll(-1.0)


def token_mean_entropy_bonus(logp_bt, entropy_bt, batch):
    """Only an entropy bonus, weighted to be a token mean whatever the aggregation (an RGR / LUFFY bonus with a
    zero policy term); the log-probabilities enter with weight 0 so that the loss still depends on the model."""
    return 0.0 * logp_bt - 0.25 * entropy_bt * batch[train_step.TOKEN_MEAN_WEIGHTS], {}


@pytest.mark.parametrize("name", AGGREGATIONS)
def test_the_token_mean_weights_make_a_term_the_whole_batch_token_mean(name):
    """loss = -0.25 x the token mean of the entropy over the whole batch (the "entropy" metric), whatever the
    aggregation, in one pass or over micro-batches: the rows' lengths differ (policy_batch), so each micro-batch's
    own token mean differs from the batch's, and LUFFY's mean of per-micro-batch means would not give this."""
    full_metrics, full_params = one_step(token_mean_entropy_bonus, aggregate=AGGREGATIONS[name])
    np.testing.assert_allclose(full_metrics["loss"], -0.25 * full_metrics["entropy"], **TOL)
    metrics, params = one_step(token_mean_entropy_bonus, aggregate=AGGREGATIONS[name], micro_batches=4)
    np.testing.assert_allclose(metrics["loss"], full_metrics["loss"], **TOL)
    for leaf, full_leaf in zip(params, full_params):
        np.testing.assert_allclose(leaf, full_leaf, **TOL)
    assert full_metrics["grad_norm"] > 0
