"""A critic for PPO with a value function: the policy's decoder architecture with a scalar value head in place of
the unembedding, as verl builds its critic (an `AutoModelForTokenClassification` with one label, loaded from the
actor's checkpoint: the same trunk, the language-model head replaced by a [D, 1] projection).

- `ValueModel(trunk, rngs=...)`: takes a `Decoder` (the policy's weights, copied by the caller) as its trunk and
  adds `value_head` [D, 1] + bias. An untied trunk's `lm_head` is dropped (the critic never unembeds, so neither
  its [D, V] weights nor their optimizer moments are kept); a tied trunk keeps its embedding, which it reads.
  The head starts at zero, so every initial value is 0 (no random baseline before the first critic update;
  verl's head starts random at the config's initializer range).
- Parameter paths are the decoder's under "trunk." plus "value_head.kernel" / "value_head.bias", so one rule
  table (`sharding.partition_rules(config)`) lays out policy and critic alike.
- `sequence_values`: values_bt aligned with the target tokens as logprobs are, values_bt[b, t] = V(tokens before
  t), read from the hidden state at t - 1 (verl's `values[:, -response_length - 1:-1]`); float32; 0 off the
  response mask (verl's critic multiplies its values by the mask too).
- `make_values_fn` and `make_value_train_step` are the critic's counterparts of the policy's `make_logprobs_fn`
  and `make_train_step`, on the same jit, sharding and exact micro-batch accumulation (`train_step`).
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from rubric_jax.core import aggregation
from rubric_jax.core.value import clipped_value_loss
from rubric_jax.models import sharding, train_step
from rubric_jax.models.decoder import Decoder, Linear


class ValueModel(nnx.Module):
    """A decoder trunk and a scalar value head (module docstring). The head computes in float32 whatever the
    trunk's compute dtype: it is a [D, 1] product, and the values feed a regression."""

    def __init__(self, trunk: Decoder, *, rngs: nnx.Rngs):
        trunk.lm_head = None
        self.trunk = trunk
        param_dtype = trunk.embed_tokens.embedding[...].dtype
        self.value_head = Linear(trunk.config.hidden_size, 1, use_bias=True, dtype=jnp.float32,
                                 param_dtype=param_dtype, rngs=rngs, kernel_init=nnx.initializers.zeros_init())


def sequence_values(
    model: ValueModel,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    attention_mask_bt: jax.Array,
    response_mask_bt: jax.Array,
    *,
    first_scored: int = 1,
) -> jax.Array:
    """values_bt float32 [B, T]: V(tokens_bt[b, :t]) on response tokens, aligned with the targets as
    `logprobs.sequence_logprobs` is (position 0 has no preceding state: 0); 0 wherever response_mask_bt is False,
    with no gradient there. `first_scored` (static, 1 <= first_scored <= T), as in `sequence_logprobs`: positions
    before it are not scored (0), and the head reads only the hidden states from first_scored - 1 on."""
    length = tokens_bt.shape[1]
    if not 1 <= first_scored <= length:
        raise ValueError(f"first_scored must be in [1, T = {length}], got {first_scored}")
    hidden_btd, _ = model.trunk(tokens_bt, positions_bt, attention_mask_bt)
    values_bt = model.value_head(hidden_btd[:, first_scored - 1:-1])[..., 0]
    values_bt = jnp.pad(values_bt, ((0, 0), (first_scored, 0)))
    return jnp.where(response_mask_bt.astype(bool), values_bt, 0)


def make_values_fn(
    graphdef: nnx.GraphDef, *, mesh: Mesh, abstract_params: Any, rules: Sequence[sharding.PartitionRule],
    first_scored: int = 1, micro_batches: int = 1,
) -> Callable[[nnx.State, train_step.Batch], jax.Array]:
    """Returns values(params, batch) -> values_bt (float32 [B, T], rows sharded as the batch): the critic's
    `sequence_values` of the batch's response tokens, without gradients (the old values of a PPO step), over
    `micro_batches` sequential micro-batches (`train_step.make_forward_fn`)."""

    def values(model, batch):
        return sequence_values(model, *(batch[key] for key in train_step.POLICY_INPUTS), first_scored=first_scored)

    return train_step.make_forward_fn(graphdef, values, mesh=mesh, abstract_params=abstract_params, rules=rules,
                                      micro_batches=micro_batches)


def make_value_train_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    *,
    clip: float,
    mesh: Mesh,
    abstract_params: Any,
    rules: Sequence[sharding.PartitionRule],
    aggregate: train_step.AggregateFn = aggregation.token_mean,
    micro_batches: int = 1,
    first_scored: int = 1,
) -> Callable[[nnx.State, optax.OptState, train_step.Batch], tuple[nnx.State, optax.OptState, dict[str, jax.Array]]]:
    """The critic's `train_step.make_update_step`: `sequence_values`, then `core.value.clipped_value_loss` against
    batch["returns_bt"] with batch["old_values_bt"] as the clip's centre and `clip` its range. Metrics: "loss",
    "grad_norm", "clip_fraction" (verl's vf_clipfrac) and "value_mean" (verl's vpred_mean), means over response
    tokens."""

    def forward_loss(model, batch):
        values_bt = sequence_values(model, *(batch[key] for key in train_step.POLICY_INPUTS),
                                    first_scored=first_scored)
        loss_bt, info = clipped_value_loss(values_bt, batch["old_values_bt"], batch["returns_bt"],
                                           batch["response_mask_bt"], clip=clip)
        return loss_bt, {"clip_fraction": info.clipped_bt, "value_mean": values_bt}

    return train_step.make_update_step(graphdef, optimizer, forward_loss, mesh=mesh, abstract_params=abstract_params,
                                       rules=rules, aggregate=aggregate, micro_batches=micro_batches)
