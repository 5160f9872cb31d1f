"""A jitted, sharded policy-gradient step: logprobs -> a core per-token loss -> aggregation -> grads -> optax update.

State: the model as `nnx.split(model)` (a static graphdef and an `nnx.State` of parameters; the decoder holds
no other variables) and an optax optimizer state. Both are donated to the step and come back with the
layouts of `sharding.param_shardings`; every batch array is split by rows over (data, fsdp).

The step is generic in the loss: `loss_fn(logp_bt, entropy_bt, batch) -> (loss_bt, info)` is any per-token loss
(a `rubric_jax.core.losses` function, usually through `ratio_loss`), `aggregate` any `core.aggregation` mode.

Batch: a dict of [B, ...] arrays. The step reads "tokens_bt", "positions_bt", "attention_mask_bt" and
"response_mask_bt"; everything else ("old_logp_bt", "advantages_bt", ...) is for `loss_fn`. Per-token arrays
are aligned with the target tokens, as `logprobs.sequence_logprobs` returns them (and as a rollout engine
reports logprobs). B must be divisible by data * fsdp.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rubric_jax.core import aggregation
from rubric_jax.models import sharding
from rubric_jax.models.logprobs import DEFAULT_CHUNK_SIZE, sequence_logprobs

Batch = Mapping[str, jax.Array]
TokenLossFn = Callable[[jax.Array, jax.Array, Batch], tuple[jax.Array, Any]]
AggregateFn = Callable[[jax.Array, jax.Array], aggregation.LossTerms]


def ratio_loss(core_loss: Callable[..., tuple[jax.Array, Any]], **hyperparameters) -> TokenLossFn:
    """Adapts a core ratio loss `core_loss(logp_bt, old_logp_bt, advantages_bt, mask_bt, **hyperparameters)`
    (ppo_clip_loss, dual_clip_ppo_loss, gspo_loss, cispo_loss, no_clip_pg_loss) to a `loss_fn` reading
    batch["old_logp_bt"], batch["advantages_bt"] and batch["response_mask_bt"]."""

    def loss_fn(logp_bt, entropy_bt, batch):
        del entropy_bt
        return core_loss(
            logp_bt, batch["old_logp_bt"], batch["advantages_bt"], batch["response_mask_bt"], **hyperparameters
        )

    return loss_fn


def _token_mean(values_bt: jax.Array, mask_bt: jax.Array) -> jax.Array:
    return aggregation.finalize(*aggregation.token_mean(values_bt, mask_bt))


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


def make_train_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    loss_fn: TokenLossFn,
    *,
    mesh: Mesh,
    abstract_params: Any,
    rules: Sequence[sharding.PartitionRule],
    aggregate: AggregateFn = aggregation.token_mean,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
    first_scored: int = 1,
) -> Callable[[nnx.State, optax.OptState, Batch], tuple[nnx.State, optax.OptState, dict[str, jax.Array]]]:
    """Returns step(params, opt_state, batch) -> (params, opt_state, metrics), jitted over `mesh`.

    `abstract_params` (the params, or their `jax.eval_shape`) and `rules` (`sharding.partition_rules(config)`)
    fix the layouts of the parameters and optimizer state, in and out; params and opt_state are donated, so
    the caller must use the returned ones. The loss is finalize(aggregate(loss_bt, response_mask)); metrics
    (float32 scalars, replicated): "loss", "grad_norm" (global L2 norm before the update), "entropy" (token
    mean over response tokens) and, when the loss's info has `clipped_bt`, "clip_fraction" (its token mean).
    The step traces under `jax.set_mesh(mesh)`, so the decoder's `shard_activations` hook takes effect.
    `chunk_size`, `temperature` and `first_scored` (skip a shared prompt region) go to
    `logprobs.sequence_logprobs`.
    """
    param_shardings = sharding.param_shardings(abstract_params, mesh, rules)
    opt_shardings = sharding.param_shardings(jax.eval_shape(optimizer.init, abstract_params), mesh, rules)
    replicated = NamedSharding(mesh, PartitionSpec())

    def loss_and_aux(params, batch):
        model = nnx.merge(graphdef, params)
        mask_bt = batch["response_mask_bt"]
        logp_bt, entropy_bt = sequence_logprobs(
            model,
            batch["tokens_bt"],
            batch["positions_bt"],
            batch["attention_mask_bt"],
            mask_bt,
            chunk_size=chunk_size,
            temperature=temperature,
            first_scored=first_scored,
        )
        loss_bt, info = loss_fn(logp_bt, entropy_bt, batch)
        metrics = {"entropy": _token_mean(entropy_bt, mask_bt)}
        if hasattr(info, "clipped_bt"):
            metrics["clip_fraction"] = _token_mean(info.clipped_bt, mask_bt)
        return aggregation.finalize(*aggregate(loss_bt, mask_bt)), metrics

    def step(params, opt_state, batch):
        (loss, metrics), grads = jax.value_and_grad(loss_and_aux, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads), **metrics}

    jitted = jax.jit(
        step,
        in_shardings=(param_shardings, opt_shardings, sharding.batch_sharding(mesh)),
        out_shardings=(param_shardings, opt_shardings, replicated),
        donate_argnums=(0, 1),
    )

    def sharded_step(params, opt_state, batch):
        with jax.set_mesh(mesh):
            return jitted(params, opt_state, batch)

    return sharded_step
