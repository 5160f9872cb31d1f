"""The routers' load-balancing loss through the decoder and the train step (`Decoder.forward_with_router_statistics`,
`moe.load_balancing_token_loss`, `make_train_step(router_aux_loss_coef=...)`): the statistics summed over layers
give transformers' `load_balancing_loss_func` of the model's own router logits, scanned layers collect the same
ones, and the train step adds exactly coef times the balance's token mean, whatever the aggregation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers
from transformers.models.qwen3_moe import modeling_qwen3_moe

from rubric_jax.core import aggregation, losses
from rubric_jax.models import moe, sharding, train_step
from rubric_jax.models.safetensors_io import load_hf_checkpoint
from tests.models.test_sharding import policy_batch
from tests.tiny_checkpoints import SHAPES, VOCAB_SIZE, _save_tiny_model

ROWS, LENGTH, PROMPT = 4, 12, 5
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def all_sparse_dir(tmp_path_factory):
    """Three mixture-of-experts layers (none dense, so the layers can be scanned), 4 experts, 2 per token."""
    config = transformers.Qwen3MoeConfig(**{**SHAPES, "num_hidden_layers": 3}, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[],
                                         tie_word_embeddings=False, max_position_embeddings=512)
    return _save_tiny_model(tmp_path_factory, "all_sparse_moe", config)


def right_padded_batch() -> dict[str, np.ndarray]:
    return policy_batch(VOCAB_SIZE, rows=ROWS, length=LENGTH, prompt=PROMPT)


def router_balance(model, batch, mask_key: str) -> float:
    _, router = model.forward_with_router_statistics(
        *(jnp.asarray(batch[key]) for key in ("tokens_bt", "positions_bt", "attention_mask_bt")))
    mask_bt = jnp.asarray(batch[mask_key])
    balance_bt = moe.load_balancing_token_loss(router.probs_bte, router.assigned_bte, mask_bt, router.layers)
    return float(jnp.sum(balance_bt) / jnp.sum(mask_bt))


@pytest.mark.parametrize("fixture", ["all_sparse_dir", "tiny_qwen3_moe_dir"])
@pytest.mark.parametrize("mask_key", ["attention_mask_bt", "response_mask_bt"])
def test_router_statistics_give_transformers_load_balancing_loss(fixture, mask_key, request):
    """transformers takes the loss over every sparse layer's router logits of the forward pass (the tiny
    checkpoint's dense layer 1 has none), with padding masked out by the mask it is given."""
    directory = request.getfixturevalue(fixture)
    batch = right_padded_batch()
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        router_logits = hf(input_ids=torch.as_tensor(batch["tokens_bt"]),
                           attention_mask=torch.as_tensor(batch["attention_mask_bt"].astype(np.int64)),
                           output_router_logits=True).router_logits
        expected = modeling_qwen3_moe.load_balancing_loss_func(
            router_logits, hf.config.num_experts, hf.config.num_experts_per_tok,
            torch.as_tensor(batch[mask_key].astype(np.int64)))
    assert len(router_logits) == (3 if fixture == "all_sparse_dir" else 1)
    np.testing.assert_allclose(router_balance(load_hf_checkpoint(directory), batch, mask_key), float(expected),
                               **TOL)


def test_dense_models_have_no_router_statistics(tiny_qwen3_dir):
    model = load_hf_checkpoint(tiny_qwen3_dir)
    with pytest.raises(ValueError, match="no router"):
        router_balance(model, right_padded_batch(), "attention_mask_bt")


def test_scanned_layers_collect_the_unrolled_statistics(all_sparse_dir):
    batch = right_padded_batch()
    inputs = [jnp.asarray(batch[key]) for key in ("tokens_bt", "positions_bt", "attention_mask_bt")]
    hidden_btd, router = load_hf_checkpoint(all_sparse_dir).forward_with_router_statistics(*inputs)
    scanned_btd, scanned = load_hf_checkpoint(all_sparse_dir, scan_layers=True).forward_with_router_statistics(
        *inputs)
    assert scanned.layers == router.layers == 3
    np.testing.assert_allclose(scanned_btd, hidden_btd, **TOL)
    np.testing.assert_allclose(scanned.probs_bte, router.probs_bte, **TOL)
    np.testing.assert_array_equal(scanned.assigned_bte, router.assigned_bte)
    # Every token's assignments over the layers sum to layers x top_k, its probabilities to layers.
    np.testing.assert_array_equal(router.assigned_bte.sum(-1), 6.0)
    np.testing.assert_allclose(router.probs_bte.sum(-1), 3.0, **TOL)


@functools.cache
def step_metrics(directory: str, coef: float, aggregate_name: str, micro_batches: int = 1):
    model = load_hf_checkpoint(directory, shard_activations=sharding.shard_activations)
    rules = sharding.partition_rules(model.config)
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    optimizer = optax.sgd(0.1)
    graphdef, params, opt_state = train_step.init_train_state(model, optimizer, mesh, rules)
    step = train_step.make_train_step(
        graphdef, optimizer, train_step.ratio_loss(losses.ppo_clip_loss, eps_low=0.2, eps_high=0.28), mesh=mesh,
        abstract_params=params, rules=rules, aggregate=getattr(aggregation, aggregate_name),
        micro_batches=micro_batches, router_aux_loss_coef=coef, chunk_size=4)
    params, _, metrics = step(params, opt_state, right_padded_batch())
    return jax.device_get(metrics), jax.device_get(jax.tree.leaves(params))


@pytest.mark.parametrize("aggregate_name", ["token_mean", "seq_mean_token_sum"])
def test_the_step_adds_coef_times_the_router_balance_token_mean(all_sparse_dir, aggregate_name):
    directory = str(all_sparse_dir)
    plain, plain_params = step_metrics(directory, 0.0, aggregate_name)
    balanced, balanced_params = step_metrics(directory, 0.5, aggregate_name)
    assert "router_balance" not in plain
    expected = router_balance(load_hf_checkpoint(directory), right_padded_batch(), "response_mask_bt")
    np.testing.assert_allclose(balanced["router_balance"], expected, **TOL)
    np.testing.assert_allclose(balanced["loss"] - plain["loss"], 0.5 * expected, **TOL)
    np.testing.assert_allclose(balanced["entropy"], plain["entropy"], **TOL)
    assert any(not np.allclose(a, b) for a, b in zip(plain_params, balanced_params))


def test_micro_batches_take_each_their_own_expert_shares(all_sparse_dir):
    """With two micro-batches the balance is each micro-batch's, weighted by its response tokens."""
    directory = str(all_sparse_dir)
    batch = right_padded_batch()
    dealt = [{key: value[start::2] for key, value in batch.items()} for start in (0, 1)]
    model = load_hf_checkpoint(directory)
    counts = [part["response_mask_bt"].sum() for part in dealt]
    expected = sum(router_balance(model, part, "response_mask_bt") * count for part, count in zip(dealt, counts))
    metrics, _ = step_metrics(directory, 0.5, "token_mean", micro_batches=2)
    np.testing.assert_allclose(metrics["router_balance"], expected / sum(counts), **TOL)


def test_a_negative_coefficient_is_refused():
    with pytest.raises(ValueError, match="router_aux_loss_coef"):
        train_step.make_train_step(None, optax.sgd(0.1), None, mesh=None, abstract_params=None, rules=(),
                                   router_aux_loss_coef=-1.0)
