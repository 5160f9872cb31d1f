"""Qwen3-MoE's expert math (`models.moe`): against a NumPy transcription in loops, against transformers'
`Qwen3MoeSparseMoeBlock` and `load_balancing_loss_func` on random weights, and its invariants (a token's output
depends on that token alone; identical experts reduce to the dense SwiGLU MLP; no [tokens, experts, width]
activation is ever built)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.qwen3_moe import modeling_qwen3_moe
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig

from rubric_jax.models.moe import experts_swiglu, load_balancing_loss, route_top_k

TOKENS, WIDTH, EXPERT_WIDTH, EXPERTS, TOP_K = 11, 16, 8, 6, 2
TOL = dict(atol=1e-5, rtol=1e-5)


def random_weights(seed: int, experts: int = EXPERTS):
    rng = np.random.default_rng(seed)
    return dict(router_ed=rng.normal(size=(experts, WIDTH)).astype(np.float32),
                gate_edf=rng.normal(size=(experts, WIDTH, EXPERT_WIDTH)).astype(np.float32) / 4,
                up_edf=rng.normal(size=(experts, WIDTH, EXPERT_WIDTH)).astype(np.float32) / 4,
                down_efd=rng.normal(size=(experts, EXPERT_WIDTH, WIDTH)).astype(np.float32) / 4)


def moe_block(x_td, w, *, normalize: bool, top_k: int = TOP_K) -> np.ndarray:
    weights_tk, experts_tk = route_top_k(jnp.asarray(x_td) @ jnp.asarray(w["router_ed"]).T, top_k,
                                         normalize=normalize)
    return np.asarray(experts_swiglu(jnp.asarray(x_td), weights_tk, experts_tk, *(jnp.asarray(w[name]) for name in
                                                                                   ("gate_edf", "up_edf", "down_efd"))))


def reference_block(x_td, w, *, normalize: bool, top_k: int = TOP_K) -> np.ndarray:
    """Per token: softmax of the router logits, the k largest (lower index first on ties), renormalised or not,
    and the weighted sum of those experts' SwiGLU MLPs."""
    out = np.zeros_like(x_td, dtype=np.float64)
    for t, x_d in enumerate(x_td.astype(np.float64)):
        logits = w["router_ed"].astype(np.float64) @ x_d
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        chosen = sorted(range(len(probs)), key=lambda e: (-probs[e], e))[:top_k]
        total = sum(probs[e] for e in chosen) if normalize else 1.0
        for e in chosen:
            gate, up = x_d @ w["gate_edf"][e], x_d @ w["up_edf"][e]
            hidden = gate / (1 + np.exp(-gate)) * up
            out[t] += probs[e] / total * (hidden @ w["down_efd"][e])
    return out


@pytest.mark.parametrize("normalize", [True, False], ids=["norm_topk_prob", "raw_top_k"])
def test_matches_the_loop_reference(normalize):
    w = random_weights(0)
    x_td = np.random.default_rng(1).normal(size=(TOKENS, WIDTH)).astype(np.float32)
    np.testing.assert_allclose(moe_block(x_td, w, normalize=normalize), reference_block(x_td, w, normalize=normalize),
                               **TOL)


@pytest.mark.parametrize("normalize", [True, False], ids=["norm_topk_prob", "raw_top_k"])
def test_matches_transformers_sparse_moe_block(normalize):
    """transformers' block with our weights: its router weight is [E, D], its fused gate_up_proj [E, 2F, D] (gate
    first) and down_proj [E, D, F], each the transpose of ours."""
    config = Qwen3MoeConfig(hidden_size=WIDTH, moe_intermediate_size=EXPERT_WIDTH, num_experts=EXPERTS,
                            num_experts_per_tok=TOP_K, norm_topk_prob=normalize)
    block = modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(config).eval()
    w = random_weights(2)
    with torch.no_grad():
        block.gate.weight.copy_(torch.from_numpy(w["router_ed"]))
        gate_up = np.concatenate([w["gate_edf"], w["up_edf"]], axis=2).transpose(0, 2, 1)
        block.experts.gate_up_proj.copy_(torch.from_numpy(np.ascontiguousarray(gate_up)))
        block.experts.down_proj.copy_(torch.from_numpy(np.ascontiguousarray(w["down_efd"].transpose(0, 2, 1))))
        x_btd = np.random.default_rng(3).normal(size=(1, TOKENS, WIDTH)).astype(np.float32)
        expected = block(torch.from_numpy(x_btd)).numpy()[0]
    np.testing.assert_allclose(moe_block(x_btd[0], w, normalize=normalize), expected, **TOL)


def test_load_balancing_loss_matches_transformers_with_padding():
    rng = np.random.default_rng(4)
    layers, batch, length = 3, 2, 5
    logits_lte = rng.normal(size=(layers, batch * length, EXPERTS)).astype(np.float32)
    mask_bt = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    expected = modeling_qwen3_moe.load_balancing_loss_func(
        tuple(torch.from_numpy(layer) for layer in logits_lte), EXPERTS, TOP_K, torch.from_numpy(mask_bt))
    got = load_balancing_loss(jnp.asarray(logits_lte), jnp.asarray(mask_bt.reshape(-1)), TOP_K)
    np.testing.assert_allclose(got, expected.item(), **TOL)
    # Uniform routing gives the loss's least value, k (each f_e = k / E, each P_e = 1 / E).
    uniform = load_balancing_loss(jnp.zeros((layers, batch * length, EXPERTS)), jnp.ones(batch * length), TOP_K)
    np.testing.assert_allclose(uniform, TOP_K, **TOL)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), top_k=st.integers(1, EXPERTS))
def test_each_token_is_routed_alone_and_identical_experts_are_the_dense_mlp(seed, top_k):
    """Permuting the tokens permutes the outputs (no token sees another's routing or group); with every expert the
    same MLP and renormalised weights, the block is that dense SwiGLU MLP whatever the routing."""
    w = random_weights(seed)
    x_td = np.random.default_rng(seed + 1).normal(size=(TOKENS, WIDTH)).astype(np.float32)
    out = moe_block(x_td, w, normalize=False, top_k=top_k)
    perm = np.random.default_rng(seed + 2).permutation(TOKENS)
    np.testing.assert_allclose(moe_block(x_td[perm], w, normalize=False, top_k=top_k), out[perm], **TOL)
    same = {name: np.broadcast_to(w[name][:1], w[name].shape) for name in ("gate_edf", "up_edf", "down_efd")}
    gate, up = x_td @ same["gate_edf"][0], x_td @ same["up_edf"][0]
    dense = (gate / (1 + np.exp(-gate)) * up) @ same["down_efd"][0]
    np.testing.assert_allclose(moe_block(x_td, {**w, **same}, normalize=True, top_k=top_k), dense,
                               atol=1e-4, rtol=1e-4)


def test_no_activation_spans_every_expert():
    """The experts' program holds no array with both an experts and a model-width dimension beyond the weights: its
    largest activation is the assignments' [T * k, max(D, F)]."""
    w = random_weights(5, experts=32)
    x_td = jnp.zeros((64, WIDTH))
    weights_tk, experts_tk = route_top_k(x_td @ jnp.asarray(w["router_ed"]).T, TOP_K, normalize=True)
    jaxpr = jax.make_jaxpr(experts_swiglu)(x_td, weights_tk, experts_tk, w["gate_edf"], w["up_edf"], w["down_efd"])
    sizes = [np.prod(var.aval.shape) for eqn in jaxpr.eqns for var in eqn.outvars]
    assert max(sizes) == 64 * TOP_K * WIDTH


def test_gradients_reach_the_chosen_experts_and_the_router_only():
    """d(sum of outputs) reaches exactly the experts some token chose (the others get exact zeros) and the router
    through the routing weights; the gradients equal finite differences of the loop reference."""
    w = random_weights(6, experts=8)
    x_td = np.random.default_rng(7).normal(size=(3, WIDTH)).astype(np.float32)

    def total(router_ed, gate_edf):
        weights_tk, experts_tk = route_top_k(x_td @ router_ed.T, TOP_K, normalize=True)
        return jnp.sum(experts_swiglu(x_td, weights_tk, experts_tk, gate_edf, w["up_edf"], w["down_efd"]))

    router_grad, gate_grad = jax.grad(total, argnums=(0, 1))(jnp.asarray(w["router_ed"]), jnp.asarray(w["gate_edf"]))
    _, experts_tk = route_top_k(x_td @ w["router_ed"].T, TOP_K, normalize=True)
    chosen = set(np.asarray(experts_tk).reshape(-1).tolist())
    for e in range(8):
        assert (np.abs(np.asarray(gate_grad[e])).sum() > 0) == (e in chosen), e
    assert np.abs(np.asarray(router_grad)).sum() > 0
    step = 1e-3
    for e in sorted(chosen)[:2]:
        bumped = {**w, "gate_edf": w["gate_edf"].astype(np.float64).copy()}
        bumped["gate_edf"][e, 0, 0] += step
        lowered = {**w, "gate_edf": w["gate_edf"].astype(np.float64).copy()}
        lowered["gate_edf"][e, 0, 0] -= step
        numeric = (reference_block(x_td, bumped, normalize=True).sum()
                   - reference_block(x_td, lowered, normalize=True).sum()) / (2 * step)
        np.testing.assert_allclose(gate_grad[e, 0, 0], numeric, rtol=1e-3, atol=1e-4)
