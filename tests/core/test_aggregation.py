import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rubric_jax.core import aggregation as agg
from tests.core import reference_losses as ref
from tests.core.reference_losses import SEEDS, random_policy_batch

NORM_CONSTANT = 7.0
MODES = {
    "token-mean": jax.jit(agg.token_mean),
    "seq-mean-token-mean": jax.jit(agg.seq_mean_token_mean),
    "seq-mean-token-sum": jax.jit(agg.seq_mean_token_sum),
    "seq-mean-token-sum-norm": jax.jit(functools.partial(agg.seq_mean_token_sum_norm, norm_constant=NORM_CONSTANT)),
}
# verl's normalisation counts every row, masked ones included, so it is kept out of MODES, whose properties
# (padding rows change nothing, an all-masked batch is (0, 0)) it does not have by design.
token_sum_norm = jax.jit(agg.token_sum_norm, static_argnames="norm_constant")
finalize = jax.jit(agg.finalize)
# d finalize(mode(loss, mask)) / d loss and d loss_sum / d loss, compiled once per mode
FINALIZED_GRADS = {
    mode: jax.jit(jax.grad(lambda loss, mask, fn=fn: agg.finalize(*fn(loss, mask)))) for mode, fn in MODES.items()
}
SUM_GRADS = {mode: jax.jit(jax.grad(lambda loss, mask, fn=fn: fn(loss, mask).loss_sum)) for mode, fn in MODES.items()}
ROWS, TOKENS = 6, 5


# ---------------------------------------------------------------- hand-computed cases


def test_every_mode_hand_computed():
    # row 0: tokens 1, 2, 3; row 1: token 4; row 2: fully masked (NaN padding must not leak)
    loss = jnp.asarray([[1.0, 2.0, 3.0], [4.0, jnp.nan, jnp.inf], [jnp.nan, 9.0, 9.0]])
    mask = jnp.asarray([[True, True, True], [True, False, False], [False, False, False]])
    expected = {
        "token-mean": (10.0, 4.0),  # 10 / 4 = 2.5
        "seq-mean-token-mean": (2.0 + 4.0, 2.0),  # mean(2, 4) = 3
        "seq-mean-token-sum": (6.0 + 4.0, 2.0),  # mean(6, 4) = 5
        "seq-mean-token-sum-norm": (10.0, 2.0 * NORM_CONSTANT),  # 10 / 14
    }
    for mode, (loss_sum, denominator) in expected.items():
        terms = MODES[mode](loss, mask)
        np.testing.assert_allclose(terms, (loss_sum, denominator), rtol=1e-6)
        np.testing.assert_allclose(finalize(*terms), loss_sum / denominator, rtol=1e-6)


def test_finalize_is_zero_with_zero_gradient_on_a_zero_denominator():
    value, grad = jax.jit(jax.value_and_grad(agg.finalize))(jnp.float32(0.0), jnp.float32(0.0))
    assert float(value) == 0.0 and float(grad) == 0.0
    np.testing.assert_allclose(finalize(jnp.float32(3.0), jnp.float32(4.0)), 0.75)


@pytest.mark.parametrize("norm_constant", [0.0, -1.0])
@pytest.mark.parametrize("fn", [agg.seq_mean_token_sum_norm, agg.token_sum_norm])
def test_norm_constant_must_be_positive(fn, norm_constant):
    with pytest.raises(ValueError, match="norm_constant"):
        fn(jnp.zeros((1, 1)), jnp.ones((1, 1), bool), norm_constant=norm_constant)


def test_token_sum_norm_hand_computed_counts_every_row():
    # the batch of test_every_mode_hand_computed: valid tokens 1, 2, 3, 4 (sum 10) in rows 0 and 1; row 2 fully
    # masked but a row of the batch all the same: denominator 3 rows * 7
    loss = jnp.asarray([[1.0, 2.0, 3.0], [4.0, jnp.nan, jnp.inf], [jnp.nan, 9.0, 9.0]])
    mask = jnp.asarray([[True, True, True], [True, False, False], [False, False, False]])
    terms = token_sum_norm(loss, mask, norm_constant=NORM_CONSTANT)
    np.testing.assert_allclose(terms, (10.0, 3 * NORM_CONSTANT), rtol=1e-6)
    # an all-masked batch: (0, rows * constant), finalized to 0
    terms = token_sum_norm(loss, jnp.zeros_like(mask), norm_constant=NORM_CONSTANT)
    assert (float(terms.loss_sum), float(terms.denominator)) == (0.0, 3 * NORM_CONSTANT)
    assert float(finalize(*terms)) == 0.0


def test_token_sum_norm_gives_verls_agg_loss_and_verls_actor_update():
    # 4 rows of T = 3, token losses chosen by hand; row sums 6, 4, 0 (row fully masked), 5 -> S = 15
    loss = jnp.asarray([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [0.0, 0.0, 0.0], [2.0, 3.0, 0.0]])
    mask = jnp.asarray([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]], bool)
    # verl's agg_loss on the whole batch, loss_scale_factor None -> the response length 3: 15 / 3 = 5;
    # here norm_constant = loss_scale_factor / B = 3 / 4
    np.testing.assert_allclose(finalize(*token_sum_norm(loss, mask, norm_constant=3 / 4)), 15 / 3, rtol=1e-6)
    # verl's dp_actor with micro-batches of 2 rows (rows 0-1: sum 10; rows 2-3: sum 5), loss_scale_factor 3:
    # each micro-batch's agg_loss times 1 / gradient_accumulation = 1/2: 10/3/2 + 5/3/2 = 2.5;
    # here norm_constant = loss_scale_factor / micro-batch rows = 3 / 2, cut into the same micro-batches
    parts = [token_sum_norm(loss[rows], mask[rows], norm_constant=3 / 2) for rows in (slice(0, 2), slice(2, 4))]
    total = jax.tree.map(jnp.add, *parts)
    np.testing.assert_allclose(total, (15.0, 4 * 3 / 2), rtol=1e-6)
    np.testing.assert_allclose(finalize(*total), 2.5, rtol=1e-6)


def test_token_sum_norm_counts_padding_rows():
    loss, mask = jnp.asarray([[1.0, 2.0]]), jnp.asarray([[True, True]])
    padded_loss = jnp.concatenate([loss, jnp.full((3, 2), jnp.nan)])
    padded_mask = jnp.concatenate([mask, jnp.zeros((3, 2), bool)])
    np.testing.assert_allclose(finalize(*token_sum_norm(loss, mask, norm_constant=2.0)), 3 / 2)
    np.testing.assert_allclose(finalize(*token_sum_norm(padded_loss, padded_mask, norm_constant=2.0)), 3 / 8)


def test_dr_grpo_norm_counts_valid_rows_so_padding_rows_change_nothing():
    loss, mask = jnp.asarray([[1.0, 2.0]]), jnp.asarray([[True, True]])
    padded_loss = jnp.concatenate([loss, jnp.full((3, 2), jnp.nan)])
    padded_mask = jnp.concatenate([mask, jnp.zeros((3, 2), bool)])
    for fn in MODES.values():
        np.testing.assert_array_equal(fn(loss, mask), fn(padded_loss, padded_mask))


# ---------------------------------------------------------------- against the NumPy loop reference


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_every_mode_matches_reference(dtype):
    # bfloat16 losses: the reference sums the same rounded values in float64, and the sums run in float32,
    # so float32's tolerance holds.
    for seed in SEEDS:
        batch = random_policy_batch(np.random.RandomState(seed))
        loss = batch.advantages.astype(dtype)  # per-token values with NaN / inf garbage on masked tokens
        verl = functools.partial(token_sum_norm, norm_constant=NORM_CONSTANT)
        for mode, fn in {**MODES, "token-sum-norm": verl}.items():
            loss_sum, denominator = fn(loss, batch.mask)
            expected_sum, expected_denominator = ref.aggregate(loss.astype(np.float64), batch.mask, mode, NORM_CONSTANT)
            assert np.asarray(loss_sum).dtype == np.float32
            np.testing.assert_allclose(loss_sum, expected_sum, rtol=1e-5, atol=1e-5)
            assert float(denominator) == expected_denominator


# ---------------------------------------------------------------- properties

losses_bt = arrays(np.float32, (ROWS, TOKENS), elements=st.floats(-10, 10, width=32))
masks_bt = arrays(np.bool_, (ROWS, TOKENS))


def with_garbage(loss_bt, mask_bt):
    """Masked tokens hold NaN: any leak into a sum shows."""
    return np.where(mask_bt, loss_bt, np.nan).astype(np.float32)


def sum_tolerance(loss_bt, mask_bt):
    """Float32 summation-order error bound for sums of these values."""
    return dict(rtol=1e-5, atol=1e-6 * (1.0 + float(np.abs(loss_bt[mask_bt]).sum())))


@given(loss_bt=losses_bt, mask_bt=masks_bt, assignment=arrays(np.int32, (ROWS,), elements=st.integers(0, 3)))
def test_reference_item_7_every_mode_sums_over_micro_batches_and_shards_to_the_full_batch(loss_bt, mask_bt, assignment):
    """Rows go to up to 4 micro-batches (some may be empty). Two ways to cut: fixed-shape micro-batches that
    keep every row and mask out the others' (padding rows), and shards holding only their own rows. Summing
    their (loss_sum, denominator) pairs gives the full batch's pair: denominators exactly, sums up to
    float32 summation order, and so the finalized loss."""
    loss_bt = with_garbage(loss_bt, mask_bt)
    tolerance = sum_tolerance(loss_bt, mask_bt)
    for mode, fn in MODES.items():
        full = fn(loss_bt, mask_bt)
        padded = [fn(loss_bt, mask_bt & (assignment == k)[:, None]) for k in range(4)]
        shards = [fn(loss_bt[assignment == k], mask_bt[assignment == k]) for k in range(4)]
        for parts in (padded, shards):
            total = functools.reduce(lambda a, b: jax.tree.map(jnp.add, a, b), parts)
            assert float(total.denominator) == float(full.denominator), mode
            np.testing.assert_allclose(total.loss_sum, full.loss_sum, **tolerance, err_msg=mode)
            np.testing.assert_allclose(finalize(*total), finalize(*full), rtol=1e-5, atol=1e-5, err_msg=mode)


@given(loss_bt=losses_bt, mask_bt=masks_bt, assignment=arrays(np.int32, (ROWS,), elements=st.integers(0, 3)),
       norm_constant=st.sampled_from([1.0, NORM_CONSTANT, 2048.0, 0.375]))
def test_reference_item_7_token_sum_norm_sums_over_row_splits_to_the_full_batch(loss_bt, mask_bt, assignment,
                                                                                  norm_constant):
    """Shards and micro-batches holding only their own rows (as the trainer deals rows and as data parallelism
    shards them; some may be empty) add up to the full batch's pair: the denominator exactly (the constants are
    integers or dyadic, module docstring), the sum up to float32 summation order. A gradient reaches exactly the
    valid tokens."""
    loss_bt = with_garbage(loss_bt, mask_bt)
    full = token_sum_norm(loss_bt, mask_bt, norm_constant=norm_constant)
    shards = [token_sum_norm(loss_bt[assignment == k], mask_bt[assignment == k], norm_constant=norm_constant)
              for k in range(4)]
    total = functools.reduce(lambda a, b: jax.tree.map(jnp.add, a, b), shards)
    assert float(total.denominator) == float(full.denominator) == ROWS * norm_constant
    np.testing.assert_allclose(total.loss_sum, full.loss_sum, **sum_tolerance(loss_bt, mask_bt))
    np.testing.assert_allclose(finalize(*total), finalize(*full), rtol=1e-5, atol=1e-5)
    grad = jax.grad(lambda x: agg.finalize(*agg.token_sum_norm(x, mask_bt, norm_constant=norm_constant)))(loss_bt)
    np.testing.assert_array_equal(np.asarray(grad) != 0, mask_bt)
    np.testing.assert_allclose(np.asarray(grad)[mask_bt], 1 / (ROWS * norm_constant), rtol=1e-6)


@given(loss_bt=arrays(np.float32, (ROWS, TOKENS), elements=st.floats(allow_nan=True, allow_infinity=True, width=32)))
def test_reference_item_8_all_masked_batch_gives_zero_not_nan(loss_bt):
    mask_bt = np.zeros((ROWS, TOKENS), bool)
    for mode, fn in MODES.items():
        terms = fn(loss_bt, mask_bt)
        assert (float(terms.loss_sum), float(terms.denominator)) == (0.0, 0.0), mode
        assert float(finalize(*terms)) == 0.0, mode
        grad = FINALIZED_GRADS[mode](loss_bt, mask_bt)
        np.testing.assert_array_equal(grad, 0.0, err_msg=mode)
    terms = token_sum_norm(loss_bt, mask_bt, norm_constant=NORM_CONSTANT)
    assert (float(terms.loss_sum), float(finalize(*terms))) == (0.0, 0.0)
    grad = jax.grad(lambda x: agg.finalize(*agg.token_sum_norm(x, mask_bt, norm_constant=NORM_CONSTANT)))(loss_bt)
    np.testing.assert_array_equal(grad, 0.0)


@given(loss_bt=losses_bt, mask_bt=masks_bt)
def test_reference_item_8_numerator_and_denominator_use_the_same_mask(loss_bt, mask_bt):
    """Each term, recomputed from loss[mask] alone: garbage on masked tokens reaches neither the numerator
    nor the denominator, every valid token reaches both, and the result is finite."""
    garbage_bt = with_garbage(loss_bt, mask_bt)
    tolerance = sum_tolerance(loss_bt, mask_bt)
    row_valid = mask_bt.any(axis=1)
    row_sums = np.asarray([loss_bt[b, mask_bt[b]].astype(np.float64).sum() for b in range(ROWS)])
    row_means = np.asarray([row_sums[b] / mask_bt[b].sum() if row_valid[b] else 0.0 for b in range(ROWS)])
    expected = {
        "token-mean": (row_sums.sum(), mask_bt.sum()),
        "seq-mean-token-mean": (row_means.sum(), row_valid.sum()),
        "seq-mean-token-sum": (row_sums.sum(), row_valid.sum()),
        "seq-mean-token-sum-norm": (row_sums.sum(), row_valid.sum() * NORM_CONSTANT),
    }
    for mode, fn in MODES.items():
        terms = fn(garbage_bt, mask_bt)
        np.testing.assert_allclose(terms.loss_sum, expected[mode][0], **tolerance, err_msg=mode)
        assert float(terms.denominator) == float(expected[mode][1]), mode
        assert np.isfinite(float(finalize(*terms))), mode
        # the gradient reaches exactly the valid tokens
        grad = SUM_GRADS[mode](garbage_bt, mask_bt)
        np.testing.assert_array_equal(np.asarray(grad) != 0, mask_bt, err_msg=mode)


# ---------------------------------------------------------------- token-mean weights (an entropy bonus as LUFFY's)

ALL_MODES = {**MODES, "token-sum-norm": jax.jit(functools.partial(agg.token_sum_norm, norm_constant=NORM_CONSTANT))}


def test_token_mean_weights_hand_computed():
    """w = D / (N a): D the mode's denominator, N = 4 valid tokens, a = d loss_sum / d x of the token."""
    mask = jnp.asarray([[True, True, True], [True, False, False], [False, False, False]])
    x = jnp.asarray([[1.0, 2.0, 3.0], [4.0, jnp.nan, jnp.nan], [jnp.nan, 9.0, 9.0]])  # token mean 10 / 4 = 2.5
    expected = {
        "token-mean": (1.0, 1.0),  # D = 4, a = 1: 4 / 4
        "seq-mean-token-mean": (1.5, 0.5),  # D = 2 sequences; a = 1/3 on row 0: 2 / (4 / 3); a = 1 on row 1: 2 / 4
        "seq-mean-token-sum": (0.5, 0.5),  # D = 2, a = 1
        "seq-mean-token-sum-norm": (3.5, 3.5),  # D = 2 x 7 = 14, a = 1: 14 / 4
        "token-sum-norm": (5.25, 5.25),  # D = 3 rows x 7 = 21 (every row counts), a = 1: 21 / 4
    }
    for mode, (row0, row1) in expected.items():
        weights = jax.jit(agg.token_mean_weights, static_argnums=0)(ALL_MODES[mode], mask)
        np.testing.assert_allclose(weights, [[row0] * 3, [row1, 0, 0], [0, 0, 0]], rtol=1e-6, err_msg=mode)
        np.testing.assert_allclose(finalize(*ALL_MODES[mode](weights * x, mask)), 2.5, rtol=1e-6, err_msg=mode)
    np.testing.assert_array_equal(agg.token_mean_weights(ALL_MODES["token-mean"], jnp.zeros((2, 3), bool)), 0)


@given(loss_bt=losses_bt, mask_bt=masks_bt, assignment=arrays(np.int32, (ROWS,), elements=st.integers(0, 3)))
def test_token_mean_weights_give_the_whole_batch_token_mean_over_any_row_split(loss_bt, mask_bt, assignment):
    """Weights computed once over the whole batch, then its rows dealt into up to 4 shards (as the train step
    deals micro-batches): the shards' weighted sums over the whole batch's denominator are the token mean of the
    whole batch, whatever the mode, although the shards' own token means differ."""
    loss_bt = with_garbage(loss_bt, mask_bt)
    expected = finalize(*agg.token_mean(loss_bt, mask_bt))
    for mode, fn in ALL_MODES.items():
        weights_bt = np.asarray(agg.token_mean_weights(fn, mask_bt))
        weighted_bt = np.where(mask_bt, weights_bt * loss_bt, np.nan).astype(np.float32)
        shards = [fn(weighted_bt[assignment == k], mask_bt[assignment == k]) for k in range(4)]
        total = functools.reduce(jnp.add, [part.loss_sum for part in shards])
        np.testing.assert_allclose(finalize(total, fn(loss_bt, mask_bt).denominator), expected, rtol=1e-5, atol=1e-5,
                                   err_msg=mode)
