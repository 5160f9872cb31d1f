"""Mixture-of-experts math of Qwen3-MoE (transformers' `Qwen3MoeSparseMoeBlock`): the top-k router, the experts'
SwiGLU computed by grouped matmuls, and the router's load-balancing loss.

Conventions (as transformers' Qwen3-MoE):
- The router is a bias-free linear map to E expert logits per token; its softmax is taken in float32, the k most
  probable experts are kept, and with `norm_topk_prob` their probabilities are renormalised to sum to one (the
  Qwen3-MoE checkpoints set it); the weights are then cast to the activations' dtype.
- Expert e computes down_e(silu(gate_e(x)) * up_e(x)); a token's output is the weighted sum over its k experts.
- The experts run as grouped matmuls (`jax.lax.ragged_dot`): the T * k (token, expert) assignments are sorted by
  expert, each expert's contiguous group multiplied by its own weights, and the results unsorted. No dense
  [T, E, ...] activation exists: the work is T * k expert MLPs, not T * E.
- Weights are stacked per expert, input dimension first: gate_edf, up_edf [E, D, F], down_efd [E, F, D] (the
  checkpoint's per-expert [F, D] / [D, F] linear weights, transposed; `models.safetensors_io`).

Axis letters: t tokens, d model width, f expert MLP width, e experts, k experts per token, a assignments (t * k).
"""

import jax
import jax.numpy as jnp


def route_top_k(router_logits_te: jax.Array, top_k: int, *, normalize: bool) -> tuple[jax.Array, jax.Array]:
    """(weights_tk float32, experts_tk int32): each token's k most probable experts under softmax(router logits) in
    float32, most probable first, and their probabilities, renormalised over the k when `normalize`
    (`norm_topk_prob`). Ties go to the lower expert index, as `torch.topk` and `jax.lax.top_k` both break them."""
    probs_te = jax.nn.softmax(router_logits_te.astype(jnp.float32), axis=-1)
    weights_tk, experts_tk = jax.lax.top_k(probs_te, top_k)
    if normalize:
        weights_tk = weights_tk / jnp.sum(weights_tk, axis=-1, keepdims=True)
    return weights_tk, experts_tk.astype(jnp.int32)


def experts_swiglu(x_td: jax.Array, weights_tk: jax.Array, experts_tk: jax.Array, gate_edf: jax.Array,
                   up_edf: jax.Array, down_efd: jax.Array) -> jax.Array:
    """[T, D]: sum over k of weights_tk * down_e(silu(gate_e(x)) * up_e(x)) for e = experts_tk, by grouped matmuls
    over the assignments sorted by expert (module docstring). The weights are cast to x's dtype first, as
    transformers does."""
    top_k = experts_tk.shape[1]
    num_experts = gate_edf.shape[0]
    expert_a = experts_tk.reshape(-1)
    # A stable sort keeps each expert's tokens in token order.
    order_a = jnp.argsort(expert_a, stable=True)
    token_a = order_a // top_k
    group_sizes_e = jnp.bincount(expert_a, length=num_experts).astype(jnp.int32)
    x_ad = x_td[token_a]
    hidden_af = jax.nn.silu(jax.lax.ragged_dot(x_ad, gate_edf, group_sizes_e)) * \
        jax.lax.ragged_dot(x_ad, up_edf, group_sizes_e)
    out_ad = jax.lax.ragged_dot(hidden_af, down_efd, group_sizes_e)
    weighted_ad = out_ad * weights_tk.astype(x_td.dtype).reshape(-1)[order_a][:, None]
    return jnp.zeros_like(x_td).at[token_a].add(weighted_ad)


def router_statistics(router_logits_te: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array]:
    """(probs_te, assigned_te), float32 [T, E]: one MoE layer's router probabilities (softmax in float32) and each
    token's assignments (1 for each of its top-k experts, taken on the unnormalised softmax), the per-token
    quantities of the load-balancing loss. Summed over layers, they stay sufficient for it."""
    num_experts = router_logits_te.shape[-1]
    probs_te = jax.nn.softmax(router_logits_te.astype(jnp.float32), axis=-1)
    _, experts_tk = jax.lax.top_k(probs_te, top_k)
    return probs_te, jnp.sum(jax.nn.one_hot(experts_tk, num_experts, dtype=jnp.float32), axis=-2)


def load_balancing_token_loss(probs_bte: jax.Array, assigned_bte: jax.Array, mask_bt: jax.Array,
                              num_layers: int) -> jax.Array:
    """[B, T] float32: the load-balancing loss as a per-token term, from the `router_statistics` of the tokens
    summed over `num_layers` MoE layers. Its mean over the tokens of `mask_bt` is `load_balancing_loss` of those
    tokens, with the same gradient: E * sum_e sg(f_e) * p_te / L per token, f_e the share of the masked tokens'
    assignments that go to expert e (a count, with no gradient, as in Switch Transformers), p_te the token's router
    probability of e averaged over the layers. 0 off the mask."""
    num_experts = probs_bte.shape[-1]
    mask_bt = mask_bt.astype(jnp.float32)
    rows = num_layers * jnp.maximum(jnp.sum(mask_bt), 1.0)
    share_e = jax.lax.stop_gradient(jnp.einsum("bte,bt->e", assigned_bte, mask_bt) / rows)
    return num_experts * jnp.einsum("bte,e->bt", probs_bte, share_e) / num_layers * mask_bt


def load_balancing_loss(router_logits_lte: jax.Array, valid_t: jax.Array, top_k: int) -> jax.Array:
    """The router's auxiliary loss of Switch Transformers as Qwen3-MoE computes it (transformers'
    `load_balancing_loss_func`): E * sum_e f_e * P_e over every layer's router logits [L, T, E], where f_e is the
    share of the valid tokens' top-k assignments (over all layers) that go to expert e (the f_e sum to k) and P_e
    the mean router probability of expert e over the valid tokens of every layer. valid_t [T] masks padding; the
    top-k is taken on the unnormalised softmax, as there."""
    probs_lte, assigned_lte = jax.vmap(router_statistics, in_axes=(0, None))(router_logits_lte, top_k)
    valid_1t = valid_t[None, :]
    loss_1t = load_balancing_token_loss(jnp.sum(probs_lte, 0)[None], jnp.sum(assigned_lte, 0)[None], valid_1t,
                                        router_logits_lte.shape[0])
    return jnp.sum(loss_1t) / jnp.maximum(jnp.sum(valid_1t.astype(jnp.float32)), 1.0)
