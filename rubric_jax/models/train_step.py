"""A jitted, sharded policy-gradient step: logprobs -> a per-token loss -> aggregation -> grads -> optax update,
with exact gradient accumulation over micro-batches.

State: the model as `nnx.split(model)` (a static graphdef and an `nnx.State` of parameters; the decoder holds
no other variables) and an optax optimizer state. Both are donated to the step and come back with the
layouts of `sharding.param_shardings`; every batch array is split by rows over (data, fsdp, expert).

`make_update_step` is generic in the model and its loss: `forward_loss(model, batch) -> (loss_bt,
token_metrics)`; `make_train_step` is the policy's (`models.value.make_value_train_step` a critic's). The policy
step is generic in the loss: `loss_fn(logp_bt, entropy_bt, batch) -> (loss_bt, token_metrics)` is any
per-token loss (a `rubric_jax.core.losses` function through `ratio_loss`, with `with_rollout_correction`,
`with_kl_penalty` and `with_detached_old_logprobs` on top, or `confidence_penalized_nll` for SFT), and
`token_metrics` a dict of per-token diagnostics [B, T] (e.g. {"clip_fraction": clipped_bt}) that the step
reports as their mean over response tokens. `aggregate` is any `core.aggregation` mode.

Gradient accumulation is exact: with `micro_batches = M` the batch's rows are dealt into M micro-batches (row
i goes to micro-batch i mod M, so each keeps its share of every device's rows), and the gradients of the
aggregation's loss *sums*, each divided by the whole batch's denominator (known before any micro-batch: it
depends only on the masks), are summed over a `lax.scan`: the gradient of the full batch's loss for every
aggregation mode, up to float summation order (`core.aggregation`). Token-mean metrics accumulate as
(sum, count) pairs.

Batch: a dict of [B, ...] arrays. The step reads "tokens_bt", "positions_bt", "attention_mask_bt" and
"response_mask_bt"; everything else ("old_logp_bt", "advantages_bt", "ref_logp_bt", ...) is for `loss_fn`. The
step adds TOKEN_MEAN_WEIGHTS, `aggregation.token_mean_weights` of the whole (mini-)batch under the step's
aggregation, before dealing micro-batches: a per-token term times these weights, added to the loss, contributes
its token mean over the whole batch's response tokens whatever the aggregation and the micro-batching (an
entropy bonus as LUFFY aggregates it).
Per-token arrays are aligned with the target tokens, as `logprobs.sequence_logprobs` returns them (and as a
rollout engine reports logprobs). B must be divisible by micro_batches * data * fsdp * expert.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rubric_jax.core import aggregation
from rubric_jax.models import moe, sharding
from rubric_jax.models.logprobs import DEFAULT_CHUNK_SIZE, hidden_logprobs, sequence_logprobs

Batch = Mapping[str, jax.Array]
TokenMetrics = Mapping[str, jax.Array]
TokenLossFn = Callable[[jax.Array, jax.Array, Batch], tuple[jax.Array, TokenMetrics]]
AggregateFn = Callable[[jax.Array, jax.Array], aggregation.LossTerms]
KlFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
WeightsFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
ForwardLossFn = Callable[[nnx.Module, Batch], tuple[jax.Array, TokenMetrics]]

POLICY_INPUTS = ("tokens_bt", "positions_bt", "attention_mask_bt", "response_mask_bt")
TOKEN_MEAN_WEIGHTS = "token_mean_weights_bt"  # added by the update step (module docstring)


def ratio_loss(core_loss: Callable[..., tuple[jax.Array, Any]], **hyperparameters) -> TokenLossFn:
    """Adapts a core ratio loss `core_loss(logp_bt, old_logp_bt, advantages_bt, mask_bt, **hyperparameters)`
    (ppo_clip_loss, dual_clip_ppo_loss, gspo_loss, cispo_loss, no_clip_pg_loss) to a `loss_fn` reading
    batch["old_logp_bt"], batch["advantages_bt"] and batch["response_mask_bt"]. Token metrics: "clip_fraction"
    (and "dual_clip_fraction") where the loss's info reports clipped tokens."""

    def loss_fn(logp_bt, entropy_bt, batch):
        del entropy_bt
        loss_bt, info = core_loss(
            logp_bt, batch["old_logp_bt"], batch["advantages_bt"], batch["response_mask_bt"], **hyperparameters
        )
        metrics = {}
        if hasattr(info, "clipped_bt"):
            metrics["clip_fraction"] = info.clipped_bt
        if hasattr(info, "dual_clipped_bt"):
            metrics["dual_clip_fraction"] = info.dual_clipped_bt
        return loss_bt, metrics

    return loss_fn


def with_kl_penalty(loss_fn: TokenLossFn, kl_fn: KlFn, coef: float) -> TokenLossFn:
    """`loss_fn` plus coef * kl_fn(logp_bt, batch["ref_logp_bt"], response_mask_bt) per token (GRPO's KL loss
    against a frozen reference policy; kl_fn a `core.kl` estimator). Adds the token metric "kl"."""

    def penalised(logp_bt, entropy_bt, batch):
        loss_bt, metrics = loss_fn(logp_bt, entropy_bt, batch)
        kl_bt = kl_fn(logp_bt, batch["ref_logp_bt"], batch["response_mask_bt"])
        return loss_bt + coef * kl_bt, {**metrics, "kl": kl_bt}

    return penalised


def with_rollout_correction(loss_fn: TokenLossFn, weights_fn: WeightsFn) -> TokenLossFn:
    """`loss_fn`'s per-token loss times the rollout/train mismatch weights
    weights_fn(batch["old_logp_bt"], batch["rollout_logp_bt"], batch["response_mask_bt"]), a `core.losses`
    correction (tis_weights, icepop_weights, seq_mask_tis_weights: detached, 0 on masked and non-finite tokens).
    A token weighted 0 stays in the aggregation's denominator: it is dropped from the gradient, not from the batch.
    Wrap the policy loss before `with_kl_penalty`, so that the KL term is not reweighted. Adds the token metrics
    "is_weight" (the weights) and "is_zeroed" (tokens whose weight is 0)."""

    def corrected(logp_bt, entropy_bt, batch):
        loss_bt, metrics = loss_fn(logp_bt, entropy_bt, batch)
        weights_bt = weights_fn(batch["old_logp_bt"], batch["rollout_logp_bt"], batch["response_mask_bt"])
        return loss_bt * weights_bt, {**metrics, "is_weight": weights_bt, "is_zeroed": weights_bt == 0}

    return corrected


def with_detached_old_logprobs(loss_fn: TokenLossFn) -> TokenLossFn:
    """`loss_fn` with batch["old_logp_bt"] = stop_gradient(logp_bt): the old policy is the one being
    differentiated, as on an update that starts from the policy of the batch's old logprobs (one epoch of one
    mini-batch), so a ratio is exp(logp - sg(logp)) = 1 with the gradient of logp, and the separate forward pass
    that computes the old logprobs is not needed. Wrap it outermost, so every wrapper below reads these old
    logprobs. When the batch holds "rollout_logp_bt" (the engine's), adds the token metric "mismatch_k3",
    exp(d) - 1 - d with d = old - rollout logprob: the k3 estimate of KL(engine || learner) per token (0 where the
    engine's logprob is not finite)."""

    def detached(logp_bt, entropy_bt, batch):
        old_logp_bt = jax.lax.stop_gradient(logp_bt)
        loss_bt, metrics = loss_fn(logp_bt, entropy_bt, {**batch, "old_logp_bt": old_logp_bt})
        if "rollout_logp_bt" in batch:
            usable_bt = batch["response_mask_bt"] & jnp.isfinite(batch["rollout_logp_bt"])
            delta_bt = jnp.where(usable_bt, old_logp_bt - batch["rollout_logp_bt"], 0)
            metrics = {**metrics, "mismatch_k3": jnp.expm1(delta_bt) - delta_bt}
        return loss_bt, metrics

    return detached


def confidence_penalized_nll(coef: float) -> TokenLossFn:
    """SFT's per-token loss on the tokens of batch["response_mask_bt"] (the assistant's): -log p(target), with
    `aggregation.token_mean` the usual masked cross-entropy, minus coef * H(p), the confidence penalty of
    Pereyra et al. 2017 ("Regularizing neural networks by penalizing confident output distributions"), H the
    entropy of the next-token distribution at the scored position. coef > 0 keeps the cloned policy from
    collapsing onto its demonstrations, so that it still explores when sampled."""
    if not coef >= 0:
        raise ValueError(f"coef must be >= 0, got {coef!r}")

    def loss_fn(logp_bt, entropy_bt, batch):
        del batch
        return -logp_bt - coef * entropy_bt, {}

    return loss_fn


def init_train_state(
    model: nnx.Module,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    rules: Sequence[sharding.PartitionRule],
) -> tuple[nnx.GraphDef, nnx.State, optax.OptState]:
    """Splits `model`, places its parameters on `mesh` by `rules` (`sharding.partition_rules(config)`) and builds
    the optimizer state there, each moment with its parameter's layout. Returns (graphdef, params, opt_state).
    Parameters already placed so (`load_hf_checkpoint(directory, mesh=mesh)`) are not moved."""
    graphdef, params = nnx.split(model)
    params = jax.device_put(params, sharding.param_shardings(params, mesh, rules))
    opt_shardings = sharding.param_shardings(jax.eval_shape(optimizer.init, params), mesh, rules)
    return graphdef, params, jax.jit(optimizer.init, out_shardings=opt_shardings)(params)


def _deal_rows(batch: Batch, micro_batches: int) -> Batch:
    """[B, ...] -> [M, B / M, ...] with row i in micro-batch i mod M: each device keeps its rows."""

    def deal(x):
        rows = x.shape[0] // micro_batches
        dealt = jnp.swapaxes(x.reshape(rows, micro_batches, *x.shape[1:]), 0, 1)
        return sharding.shard_activations(dealt, (None, "batch") + (None,) * (x.ndim - 1))

    return jax.tree.map(deal, batch)


def _undeal_rows(x_mb: jax.Array) -> jax.Array:
    """The inverse of `_deal_rows` for one array: [M, B / M, ...] -> [B, ...]."""
    rows = jnp.swapaxes(x_mb, 0, 1)
    return sharding.shard_activations(rows.reshape(-1, *x_mb.shape[2:]), ("batch",) + (None,) * (x_mb.ndim - 2))


def _on_mesh(jitted: Callable, mesh: Mesh, prepare: Callable[..., tuple] = lambda *args: args) -> Callable:
    """`jitted(*prepare(*args))` called under `jax.set_mesh(mesh)`, so the decoder's `shard_activations` hook takes
    effect; its `.lower(*args)` lowers the same call ahead of time (arguments may be `jax.ShapeDtypeStruct`s with
    shardings: `training.plan` compiles the learner's steps for a TPU topology that is not attached)."""

    def call(*args):
        with jax.set_mesh(mesh):
            return jitted(*prepare(*args))

    def lower(*args):
        with jax.set_mesh(mesh):
            return jitted.lower(*prepare(*args))

    call.lower = lower
    return call


def make_update_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    forward_loss: ForwardLossFn,
    *,
    mesh: Mesh,
    abstract_params: Any,
    rules: Sequence[sharding.PartitionRule],
    aggregate: AggregateFn = aggregation.token_mean,
    micro_batches: int = 1,
) -> Callable[[nnx.State, optax.OptState, Batch], tuple[nnx.State, optax.OptState, dict[str, jax.Array]]]:
    """Returns step(params, opt_state, batch) -> (params, opt_state, metrics), jitted over `mesh`, for any model
    whose loss is per token: `forward_loss(model, batch) -> (loss_bt, token_metrics)` runs the model (the policy's
    logprobs in `make_train_step`, a critic's values in `models.value`) and the per-token loss.

    `abstract_params` (the params, or their `jax.eval_shape`) and `rules` (`sharding.partition_rules(config)`)
    fix the layouts of the parameters and optimizer state, in and out; params and opt_state are donated, so
    the caller must use the returned ones. The loss is finalize(aggregate(loss_bt, response_mask)), its
    gradient accumulated over `micro_batches` (module docstring). Metrics (float32 scalars, replicated):
    "loss", "grad_norm" (global L2 norm of the accumulated gradient, before the optimizer clips it) and each
    token metric as its mean over response tokens. The step traces under `jax.set_mesh(mesh)`, so the
    decoder's `shard_activations` hook takes effect.
    """
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be an int >= 1, got {micro_batches!r}")
    param_shardings = sharding.param_shardings(abstract_params, mesh, rules)
    opt_shardings = sharding.param_shardings(jax.eval_shape(optimizer.init, abstract_params), mesh, rules)
    replicated = NamedSharding(mesh, PartitionSpec())

    def scaled_loss_and_sums(params, batch, scale):
        mask_bt = batch["response_mask_bt"]
        loss_bt, token_metrics = forward_loss(nnx.merge(graphdef, params), batch)
        terms = aggregate(loss_bt, mask_bt)
        metric_sums = {name: aggregation.token_mean(values_bt, mask_bt) for name, values_bt in token_metrics.items()}
        return terms.loss_sum * scale, (terms, metric_sums)

    grad_fn = jax.grad(scaled_loss_and_sums, has_aux=True)

    def accumulated_grads(params, batch, scale):
        if micro_batches == 1:
            return grad_fn(params, batch, scale)

        def body(total, micro_batch):
            grads, aux = grad_fn(params, micro_batch, scale)
            return jax.tree.map(jnp.add, total, (grads, aux)), None

        micro = _deal_rows(batch, micro_batches)
        shapes = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro), scale)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        return jax.lax.scan(body, zeros, micro)[0]

    def step(params, opt_state, batch):
        # The denominator depends on the masks only, so it is known before any micro-batch: each micro-batch's
        # gradient is d(loss_sum) / n with the whole batch's n, and their sum is the full batch's gradient.
        mask_bt = batch["response_mask_bt"]
        denominator = aggregate(jnp.zeros(mask_bt.shape, jnp.float32), mask_bt).denominator
        scale = aggregation.finalize(jnp.ones((), denominator.dtype), denominator)
        batch = {**batch, TOKEN_MEAN_WEIGHTS: aggregation.token_mean_weights(aggregate, mask_bt)}
        grads, (terms, metric_sums) = accumulated_grads(params, batch, scale)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {name: aggregation.finalize(*pair) for name, pair in metric_sums.items()}
        return params, opt_state, {"loss": aggregation.finalize(*terms), "grad_norm": optax.tree.norm(grads), **metrics}

    jitted = jax.jit(
        step,
        in_shardings=(param_shardings, opt_shardings, sharding.batch_sharding(mesh)),
        out_shardings=(param_shardings, opt_shardings, replicated),
        donate_argnums=(0, 1),
    )

    return _on_mesh(jitted, mesh)


def make_train_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    loss_fn: TokenLossFn,
    *,
    mesh: Mesh,
    abstract_params: Any,
    rules: Sequence[sharding.PartitionRule],
    aggregate: AggregateFn = aggregation.token_mean,
    micro_batches: int = 1,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
    first_scored: int = 1,
    router_aux_loss_coef: float = 0.0,
) -> Callable[[nnx.State, optax.OptState, Batch], tuple[nnx.State, optax.OptState, dict[str, jax.Array]]]:
    """The policy's `make_update_step`: `sequence_logprobs` of the batch's response tokens, then
    `loss_fn(logp_bt, entropy_bt, batch)`. Metrics: "loss", "grad_norm", "entropy" and each of the loss's token
    metrics, as means over response tokens. `chunk_size`, `temperature` and `first_scored` (skip a shared prompt
    region) go to `logprobs.sequence_logprobs`.

    `router_aux_loss_coef` > 0 (a mixture of experts only) adds coef times the routers' load-balancing loss
    (`moe.load_balancing_token_loss`) over the response tokens, whatever the aggregation (TOKEN_MEAN_WEIGHTS):
    each micro-batch's expert shares f_e are its own, as transformers takes them per forward pass, and only
    the tokens the loss trains count (transformers counts every non-padding token). Token metric
    "router_balance": that loss, unscaled (num_experts_per_tok when assignments and probabilities spread evenly).
    """
    if not router_aux_loss_coef >= 0:
        raise ValueError(f"router_aux_loss_coef must be >= 0, got {router_aux_loss_coef!r}")

    def forward_loss(model, batch):
        tokens_bt, positions_bt, attention_mask_bt, response_mask_bt = (batch[key] for key in POLICY_INPUTS)
        if router_aux_loss_coef:
            hidden_btd, router = model.forward_with_router_statistics(tokens_bt, positions_bt, attention_mask_bt)
        else:
            (hidden_btd, _), router = model(tokens_bt, positions_bt, attention_mask_bt), None
        logp_bt, entropy_bt = hidden_logprobs(model, hidden_btd, tokens_bt, response_mask_bt, chunk_size=chunk_size,
                                              temperature=temperature, first_scored=first_scored)
        loss_bt, token_metrics = loss_fn(logp_bt, entropy_bt, batch)
        token_metrics = {"entropy": entropy_bt, **token_metrics}
        if router is not None:
            balance_bt = moe.load_balancing_token_loss(router.probs_bte, router.assigned_bte, response_mask_bt,
                                                       router.layers)
            loss_bt = loss_bt + router_aux_loss_coef * balance_bt * batch[TOKEN_MEAN_WEIGHTS]
            token_metrics["router_balance"] = balance_bt
        return loss_bt, token_metrics

    return make_update_step(graphdef, optimizer, forward_loss, mesh=mesh, abstract_params=abstract_params,
                            rules=rules, aggregate=aggregate, micro_batches=micro_batches)


def make_forward_fn(
    graphdef: nnx.GraphDef,
    forward: Callable[[nnx.Module, Batch], jax.Array],
    *,
    mesh: Mesh,
    abstract_params: Any,
    rules: Sequence[sharding.PartitionRule],
    micro_batches: int = 1,
) -> Callable[[nnx.State, Batch], jax.Array]:
    """Returns fn(params, batch) -> forward(model, batch), a [B, T] array with rows sharded as the batch, jitted
    over `mesh`, without gradients; the batch is cut to the POLICY_INPUTS it reads. With `micro_batches = M` the
    rows are dealt into M micro-batches as the train step deals them and run one after another (`lax.scan`), so
    the pass's activations are those of B / M rows; each row's result does not depend on M (up to float summation
    order). B must be divisible by M * data * fsdp * expert."""
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be an int >= 1, got {micro_batches!r}")
    param_shardings = sharding.param_shardings(abstract_params, mesh, rules)
    batch_sharding = sharding.batch_sharding(mesh)

    def run(params, batch):
        if micro_batches == 1:
            return forward(nnx.merge(graphdef, params), batch)
        def body(params, micro_batch):
            return params, forward(nnx.merge(graphdef, params), micro_batch)

        # The parameters ride in the carry: a module merged from values closed over from outside the loop cannot
        # be remat-ed inside it (flax's trace-level check).
        return _undeal_rows(jax.lax.scan(body, params, _deal_rows(batch, micro_batches))[1])

    jitted = jax.jit(run, in_shardings=(param_shardings, batch_sharding), out_shardings=batch_sharding)

    return _on_mesh(jitted, mesh, lambda params, batch: (params, {key: batch[key] for key in POLICY_INPUTS}))


def make_logprobs_fn(
    graphdef: nnx.GraphDef,
    *,
    mesh: Mesh,
    abstract_params: Any,
    rules: Sequence[sharding.PartitionRule],
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
    first_scored: int = 1,
    micro_batches: int = 1,
) -> Callable[[nnx.State, Batch], jax.Array]:
    """Returns logprobs(params, batch) -> logp_bt (float32 [B, T], rows sharded as the batch): the policy's
    `sequence_logprobs` of the batch's response tokens, without gradients, over `micro_batches` sequential
    micro-batches (`make_forward_fn`). The learner's old logprobs (the policy before this batch's updates) and the
    frozen reference policy's logprobs for KL."""

    def logprobs(model, batch):
        logp_bt, _ = sequence_logprobs(
            model,
            *(batch[key] for key in POLICY_INPUTS),
            chunk_size=chunk_size,
            temperature=temperature,
            first_scored=first_scored,
        )
        return logp_bt

    return make_forward_fn(graphdef, logprobs, mesh=mesh, abstract_params=abstract_params, rules=rules,
                           micro_batches=micro_batches)


def pack_sequences(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    pad_id: int,
    prompt_width: int,
    response_width: int,
) -> dict[str, np.ndarray]:
    """The step's batch layout for prompt-response pairs, T = prompt_width + response_width: each prompt
    left-padded to `prompt_width`, its response right after it and right-padded (so every response starts at
    column prompt_width, the step's `first_scored`). "positions_bt" count a row's real tokens (cumsum(mask) - 1,
    padding 0: a row's results do not depend on its padding, as in the rollout engine), "attention_mask_bt" marks
    real tokens, "response_mask_bt" response tokens. ValueError for an empty prompt or a sequence too long."""
    if len(prompts) != len(responses):
        raise ValueError(f"got {len(prompts)} prompts and {len(responses)} responses")
    length = prompt_width + response_width
    tokens_bt = np.full((len(prompts), length), pad_id, np.int32)
    attention_mask_bt = np.zeros((len(prompts), length), bool)
    response_mask_bt = np.zeros((len(prompts), length), bool)
    for b, (prompt, response) in enumerate(zip(prompts, responses)):
        if not 1 <= len(prompt) <= prompt_width:
            raise ValueError(f"prompt {b} has {len(prompt)} tokens; expected 1 to prompt_width={prompt_width}")
        if len(response) > response_width:
            raise ValueError(f"response {b} has {len(response)} tokens, more than response_width={response_width}")
        start, end = prompt_width - len(prompt), prompt_width + len(response)
        tokens_bt[b, start:end] = list(prompt) + list(response)
        attention_mask_bt[b, start:end] = True
        response_mask_bt[b, prompt_width:end] = True
    positions_bt = np.maximum(np.cumsum(attention_mask_bt, axis=1) - 1, 0).astype(np.int32)
    return {
        "tokens_bt": tokens_bt,
        "positions_bt": positions_bt,
        "attention_mask_bt": attention_mask_bt,
        "response_mask_bt": response_mask_bt,
    }
