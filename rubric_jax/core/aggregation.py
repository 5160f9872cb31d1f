"""Loss aggregation: per-token losses [B, T] -> a (loss_sum, denominator) pair, loss = loss_sum / denominator.

Returning the pair instead of the ratio is what makes gradient accumulation and data parallelism exact:
sum the pairs of all micro-batches and shards (`jax.tree.map(jnp.add, a, b)`, or `jax.lax.psum` of the
pair), then `finalize` once. The denominators depend only on the mask, never on parameters, so the
gradient of the full-batch loss is (sum of the gradients of the loss_sums) / (sum of the denominators).

Conventions shared by every mode (verl's names):
- Numerator and denominator use the same mask: a masked token adds nothing to either, whatever its value
  (NaN padding included). A row is a valid sequence iff it has at least one valid token; fully masked rows
  are excluded from every sequence count, so padding a batch with masked rows changes nothing. The exception
  is `token_sum_norm` (verl's normalisation), whose denominator counts every row of the batch.
- An all-masked batch gives (0, 0) (`token_sum_norm`: (0, B * norm_constant)), and `finalize` of it is 0,
  not NaN.
- Micro-batches and shards split the batch by rows, never along T (a sequence's token mean needs its whole row).
- Sums run in float32 (bfloat16 losses are promoted); the denominators are float32 counts, exact while
  they stay below 2^24 (16.7M tokens), so accumulation differs from the full batch only by summation order.
  The norm modes' counts times norm_constant are exact too when norm_constant is an integer (or a dyadic
  fraction such as 2048.5); otherwise each part's denominator is rounded to float32 once.
"""

from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from rubric_jax.core.segments import stats_dtype


class LossTerms(NamedTuple):
    """A loss as numerator and denominator (scalars); a pytree, so tree-map addition and psum accumulate it."""

    loss_sum: jax.Array
    denominator: jax.Array


def _row_sums(loss_bt: jax.Array, mask_bt: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-row masked sum [B] and valid-token count [B], both in the loss's compute dtype."""
    chex.assert_rank([loss_bt, mask_bt], 2)
    chex.assert_equal_shape([loss_bt, mask_bt])
    dtype = stats_dtype(loss_bt)
    mask_bt = mask_bt.astype(bool)
    sums_b = jnp.sum(jnp.where(mask_bt, loss_bt.astype(dtype), 0), axis=-1)
    return sums_b, jnp.sum(mask_bt, axis=-1).astype(dtype)


def token_mean(loss_bt: jax.Array, mask_bt: jax.Array) -> LossTerms:
    """token-mean (DAPO, verl's default): (sum of valid token losses, number of valid tokens).

    Every valid token of the global batch weighs the same, so long sequences weigh more in total.
    """
    sums_b, counts_b = _row_sums(loss_bt, mask_bt)
    return LossTerms(jnp.sum(sums_b), jnp.sum(counts_b))


def seq_mean_token_mean(loss_bt: jax.Array, mask_bt: jax.Array) -> LossTerms:
    """seq-mean-token-mean (the GRPO paper's 1/G sum_i 1/|o_i| sum_t; GSPO's aggregation):
    (sum over valid sequences of each sequence's token mean, number of valid sequences).
    """
    sums_b, counts_b = _row_sums(loss_bt, mask_bt)
    valid_b = counts_b > 0
    means_b = jnp.where(valid_b, sums_b / jnp.maximum(counts_b, 1), 0)
    return LossTerms(jnp.sum(means_b), jnp.sum(valid_b).astype(sums_b.dtype))


def seq_mean_token_sum(loss_bt: jax.Array, mask_bt: jax.Array) -> LossTerms:
    """seq-mean-token-sum: (sum over valid sequences of each sequence's token sum, number of valid sequences)."""
    sums_b, counts_b = _row_sums(loss_bt, mask_bt)
    return LossTerms(jnp.sum(sums_b), jnp.sum(counts_b > 0).astype(sums_b.dtype))


def seq_mean_token_sum_norm(loss_bt: jax.Array, mask_bt: jax.Array, *, norm_constant: float) -> LossTerms:
    """seq-mean-token-sum-norm, Dr.GRPO's constant normaliser (Liu et al. 2025, "Understanding R1-Zero-like
    training": a constant in place of each sequence's 1/|o_i|): (sum of valid token losses, number of valid
    sequences * norm_constant).

    norm_constant (a static number > 0, e.g. the maximum response length) replaces each sequence's length,
    so no sequence is up- or down-weighted by its length. Sequences are counted as in the other sequence
    modes: rows with at least one valid token, so that padding rows (added to fill a micro-batch or a shard,
    or left where dynamic sampling dropped groups) change nothing. The price: a row that is entirely masked for
    another reason (an empty or rejected response) is not counted either.

    verl's mode of the same name differs: its `agg_loss` divides the sum of the sequence losses by a constant
    (`loss_scale_factor`, by default the padded response length) and counts no sequences at all;
    `token_sum_norm` is that normalisation.
    """
    if not norm_constant > 0:
        raise ValueError(f"norm_constant must be > 0, got {norm_constant}")
    sums_b, counts_b = _row_sums(loss_bt, mask_bt)
    return LossTerms(jnp.sum(sums_b), jnp.sum(counts_b > 0).astype(sums_b.dtype) * norm_constant)


def token_sum_norm(loss_bt: jax.Array, mask_bt: jax.Array, *, norm_constant: float) -> LossTerms:
    """verl's seq-mean-token-sum-norm (verl/trainer/ppo/core_algos.py, `agg_loss`): the sum of valid token
    losses over a constant, whatever the sequences: (sum of valid token losses, B * norm_constant), B the
    number of rows of the batch, masked rows included.

    verl's `agg_loss` returns sum / loss_scale_factor for whatever (micro-)batch it is handed. A constant per
    call cannot be cut into (sum, denominator) parts that add up over micro-batches and shards, so the constant
    goes to the batch's rows instead, each row carrying norm_constant whether or not it has a valid token: any
    split of the batch by rows (micro-batches, data-parallel shards) adds up to exactly (sum, B * norm_constant),
    and this is verl's value
    - of `agg_loss` on a batch of B rows, with norm_constant = loss_scale_factor / B;
    - of an update of verl's FSDP actor (dp_actor.py: each micro-batch's `agg_loss` times 1 / gradient
      accumulation, gradients averaged over data-parallel ranks, so sum / (loss_scale_factor * the number of
      micro-batches) = sum / (B * loss_scale_factor / micro_batch_rows)), with norm_constant =
      loss_scale_factor / ppo_micro_batch_size_per_gpu.

    Unlike every other mode, a fully masked row counts: padding rows (the trainer pads the batch to a multiple of
    its micro-batches) lower the loss's scale, as would masking rows out of a batch kept whole to form a
    micro-batch (split by rows instead). An all-masked batch gives (0, B * norm_constant), finalized to 0.
    """
    if not norm_constant > 0:
        raise ValueError(f"norm_constant must be > 0, got {norm_constant}")
    sums_b, _ = _row_sums(loss_bt, mask_bt)
    return LossTerms(jnp.sum(sums_b), jnp.asarray(sums_b.shape[0] * norm_constant, sums_b.dtype))


def token_mean_weights(aggregate: Callable[[jax.Array, jax.Array], LossTerms], mask_bt: jax.Array) -> jax.Array:
    """Per-token weights w [B, T] under which `aggregate` of a weighted per-token term is that term's token mean:
    finalize(*aggregate(w * x, mask_bt)) = finalize(*token_mean(x, mask_bt)) for every x [B, T].

    For a term that must be token-averaged over the whole batch whatever the loss's mode (LUFFY's entropy bonus,
    coeff times the masked mean of the entropy; RGR-GRPO section 3): add w * x to the per-token
    loss. Every mode of this module is linear in the token losses, loss_sum = sum a_bt x_bt with a_bt a function
    of the token's own row's mask (1, or 1 / the row's valid-token count); so w = D / (N a) with D the batch's
    denominator and N its valid-token count, and weights computed once over the whole batch serve each of its
    micro-batches and shards, whose pairs then add up to D / N * sum x over D. 0 on masked tokens and for an
    all-masked batch. `aggregate` is a mode of this module (norm_constant bound), a is its gradient at 0.
    """
    chex.assert_rank(mask_bt, 2)
    zeros_bt = jnp.zeros(mask_bt.shape, jnp.float32)
    coefficient_bt = jax.grad(lambda x_bt: aggregate(x_bt, mask_bt).loss_sum)(zeros_bt)
    denominator = aggregate(zeros_bt, mask_bt).denominator
    count = token_mean(zeros_bt, mask_bt).denominator
    live_bt = mask_bt.astype(bool) & (coefficient_bt > 0)
    return jnp.where(live_bt, denominator / jnp.where(live_bt, count * coefficient_bt, 1), 0)


def finalize(loss_sum: jax.Array, denominator: jax.Array) -> jax.Array:
    """loss_sum / max(denominator, tiny), and 0 where the denominator is 0 (an all-masked batch), with a
    zero (not NaN) gradient there."""
    loss_sum = jnp.asarray(loss_sum)
    denominator = jnp.asarray(denominator, loss_sum.dtype)
    tiny = jnp.finfo(loss_sum.dtype).tiny
    return jnp.where(denominator > 0, loss_sum / jnp.maximum(denominator, tiny), 0)
