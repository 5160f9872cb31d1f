"""Chunked per-token logprobs and entropy: against full logits and jax.nn.log_softmax (values, gradients, bf16
inputs, masking, temperature), their memory, and `sequence_logprobs` against transformers' logits.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from rubric_jax.models.logprobs import sequence_logprobs, token_logprobs_and_entropy
from rubric_jax.models.safetensors_io import load_hf_checkpoint

MODEL_FIXTURES = ["tiny_qwen3_dir", "tiny_qwen3_untied_dir", "tiny_llama_dir"]
B, T, D, V = 3, 13, 16, 101  # T prime: only chunk sizes 1 and >= 13 divide it
# float32 on the CPU: chunked and full logits differ only in summation order.
TOL = dict(atol=2e-5, rtol=2e-5)


def reference(hidden_btd, kernel_dv, targets_bt, mask_bt, temperature=1.0):
    """Full [B, T, V] float32 logits, jax.nn.log_softmax, a gather and -sum p log p; 0 where masked."""
    logits_btv = jnp.einsum(
        "btd,dv->btv", hidden_btd.astype(jnp.float32), kernel_dv.astype(jnp.float32), precision="highest"
    ) / temperature
    log_probs_btv = jax.nn.log_softmax(logits_btv, axis=-1)
    logp_bt = jnp.take_along_axis(log_probs_btv, jnp.where(mask_bt, targets_bt, 0)[..., None], axis=-1)[..., 0]
    entropy_bt = -jnp.sum(jnp.exp(log_probs_btv) * log_probs_btv, axis=-1)
    return jnp.where(mask_bt, logp_bt, 0), jnp.where(mask_bt, entropy_bt, 0)


def random_inputs(seed=0, dtype=jnp.float32, logit_scale=3.0):
    """Logits of std ~logit_scale (peaked and flat rows both occur); ~20% of tokens masked with target -1."""
    keys = jax.random.split(jax.random.key(seed), 4)
    hidden_btd = jax.random.normal(keys[0], (B, T, D)).astype(dtype)
    kernel_dv = (logit_scale * D**-0.5 * jax.random.normal(keys[1], (D, V))).astype(dtype)
    mask_bt = jax.random.bernoulli(keys[3], 0.8, (B, T))
    targets_bt = jnp.where(mask_bt, jax.random.randint(keys[2], (B, T), 0, V), -1)
    return hidden_btd, kernel_dv, targets_bt, mask_bt


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 13, 64])
def test_chunked_equals_full_logits(chunk_size):
    inputs = random_inputs()
    logp_bt, entropy_bt = jax.jit(token_logprobs_and_entropy, static_argnames="chunk_size")(
        *inputs, chunk_size=chunk_size
    )
    ref_logp_bt, ref_entropy_bt = reference(*inputs)
    assert logp_bt.dtype == entropy_bt.dtype == jnp.float32
    np.testing.assert_allclose(logp_bt, ref_logp_bt, **TOL)
    np.testing.assert_allclose(entropy_bt, ref_entropy_bt, **TOL)


def test_bfloat16_inputs_give_float32_results():
    """bf16 hidden and kernel: the products are exact in float32 and accumulate in float32, so the results match
    the float32 reference on the same (bf16-rounded) values, not a bf16 computation."""
    inputs = random_inputs(dtype=jnp.bfloat16)
    logp_bt, entropy_bt = token_logprobs_and_entropy(*inputs, chunk_size=4)
    assert logp_bt.dtype == entropy_bt.dtype == jnp.float32
    ref_logp_bt, ref_entropy_bt = reference(*inputs)
    np.testing.assert_allclose(logp_bt, ref_logp_bt, **TOL)
    np.testing.assert_allclose(entropy_bt, ref_entropy_bt, **TOL)


@pytest.mark.parametrize("chunk_size", [4, 7, 64])
def test_gradients_equal_full_logits_gradients(chunk_size):
    hidden_btd, kernel_dv, targets_bt, mask_bt = random_inputs(seed=1)
    weights = jax.random.normal(jax.random.key(2), (2, B, T))

    def objective(fn, hidden_btd, kernel_dv):
        logp_bt, entropy_bt = fn(hidden_btd, kernel_dv, targets_bt, mask_bt)
        return jnp.sum(weights[0] * logp_bt + weights[1] * entropy_bt)

    chunked = functools.partial(token_logprobs_and_entropy, chunk_size=chunk_size)
    grads = jax.jit(jax.grad(functools.partial(objective, chunked), argnums=(0, 1)))(hidden_btd, kernel_dv)
    ref_grads = jax.grad(functools.partial(objective, reference), argnums=(0, 1))(hidden_btd, kernel_dv)
    for grad, ref_grad in zip(grads, ref_grads):
        np.testing.assert_allclose(grad, ref_grad, atol=1e-5, rtol=1e-4)
    # A masked token's hidden state gets no gradient (its logits never reach the outputs).
    assert not np.any(np.asarray(grads[0])[~np.asarray(mask_bt)])


def test_masked_tokens_are_zero_whatever_their_inputs():
    """NaN hidden states and out-of-range targets at masked positions: values 0 there, everything finite, and
    the masked positions get zero gradient."""
    hidden_btd, kernel_dv, targets_bt, mask_bt = random_inputs()
    hidden_btd = jnp.where(mask_bt[..., None], hidden_btd, jnp.nan)
    targets_bt = jnp.where(mask_bt, targets_bt, 10**6)

    def objective(hidden_btd, kernel_dv):
        logp_bt, entropy_bt = token_logprobs_and_entropy(hidden_btd, kernel_dv, targets_bt, mask_bt, chunk_size=4)
        return jnp.sum(logp_bt) + jnp.sum(entropy_bt), (logp_bt, entropy_bt)

    grad_fn = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)
    (_, (logp_bt, entropy_bt)), grads = grad_fn(hidden_btd, kernel_dv)
    masked = ~np.asarray(mask_bt)
    assert np.all(np.asarray(logp_bt)[masked] == 0) and np.all(np.asarray(entropy_bt)[masked] == 0)
    assert all(np.all(np.isfinite(x)) for x in (logp_bt, entropy_bt, *grads))
    assert not np.any(np.asarray(grads[0])[masked])


def test_temperature_divides_the_logits():
    inputs = random_inputs()
    results = token_logprobs_and_entropy(*inputs, chunk_size=4, temperature=0.7)
    for result, expected in zip(results, reference(*inputs, temperature=0.7)):
        np.testing.assert_allclose(result, expected, **TOL)


def test_chunked_memory_stays_far_below_the_full_logits():
    """Compiled only: the temporaries of the forward and of value_and_grad w.r.t. hidden and kernel hold a few
    [B, chunk, V] buffers, never [B, T, V] (full logits here: 134 MB; one chunk: 2 MB)."""
    batch, length, width, vocab, chunk = 1, 4096, 32, 8192, 64
    hidden = jax.ShapeDtypeStruct((batch, length, width), jnp.float32)
    kernel = jax.ShapeDtypeStruct((width, vocab), jnp.float32)
    tokens = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    mask = jax.ShapeDtypeStruct((batch, length), bool)

    def objective(hidden_btd, kernel_dv, targets_bt, mask_bt):
        logp_bt, entropy_bt = token_logprobs_and_entropy(hidden_btd, kernel_dv, targets_bt, mask_bt, chunk_size=chunk)
        return jnp.sum(logp_bt) + jnp.sum(entropy_bt)

    full_logits_bytes = batch * length * vocab * 4
    for fn in (objective, jax.value_and_grad(objective, argnums=(0, 1))):
        temp_bytes = jax.jit(fn).lower(hidden, kernel, tokens, mask).compile().memory_analysis().temp_size_in_bytes
        assert temp_bytes < 0.25 * full_logits_bytes


@functools.cache
def _hf_and_decoder(directory: str):
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    return hf, load_hf_checkpoint(directory)


@pytest.fixture(params=MODEL_FIXTURES)
def hf_and_decoder(request):
    return _hf_and_decoder(str(request.getfixturevalue(request.param)))


def left_padded_batch(vocab_size: int, lengths=(12, 9, 16), width=16, prompt=4):
    """Tokens [3, width], left-padded to `lengths` real tokens; the response is what follows a `prompt`-token
    prompt; positions count real tokens (cumsum(mask) - 1)."""
    rng = np.random.default_rng(0)
    attention_mask_bt = np.arange(width)[None, :] >= width - np.asarray(lengths)[:, None]
    positions_bt = np.maximum(np.cumsum(attention_mask_bt, axis=1) - 1, 0)
    tokens_bt = np.where(attention_mask_bt, rng.integers(0, vocab_size, attention_mask_bt.shape), 0)
    response_mask_bt = attention_mask_bt & (positions_bt >= prompt)
    return tokens_bt.astype(np.int32), positions_bt.astype(np.int32), attention_mask_bt, response_mask_bt


# first_scored 4 is where the earliest response starts (nothing lost); 9 cuts into two rows' responses.
@pytest.mark.parametrize("first_scored", [1, 4, 9])
def test_sequence_logprobs_match_transformers(hf_and_decoder, first_scored):
    """Aligned with the target tokens: logp[b, t] = log p(tokens[b, t] | tokens[b, :t]) from transformers'
    logits at position t - 1; 0 off the response (and at position 0) and before `first_scored`."""
    hf, decoder = hf_and_decoder
    tokens_bt, positions_bt, attention_mask_bt, response_mask_bt = left_padded_batch(decoder.config.vocab_size)
    with torch.no_grad():
        logits_btv = hf(
            input_ids=torch.from_numpy(tokens_bt).long(),
            attention_mask=torch.from_numpy(attention_mask_bt).long(),
            position_ids=torch.from_numpy(positions_bt).long(),
        ).logits.float()
    log_probs_btv = torch.log_softmax(logits_btv[:, :-1], dim=-1)
    targets_bt1 = torch.from_numpy(tokens_bt[:, 1:, None]).long()
    ref_logp_bt = np.pad(log_probs_btv.gather(-1, targets_bt1)[..., 0], ((0, 0), (1, 0)))
    ref_entropy_bt = np.pad(-(log_probs_btv.exp() * log_probs_btv).sum(-1), ((0, 0), (1, 0)))

    @functools.partial(jax.jit, static_argnums=0)
    def run(graphdef, state, *batch):
        return sequence_logprobs(nnx.merge(graphdef, state), *batch, chunk_size=5, first_scored=first_scored)

    logp_bt, entropy_bt = run(*nnx.split(decoder), tokens_bt, positions_bt, attention_mask_bt, response_mask_bt)
    scored_bt = response_mask_bt & (np.arange(tokens_bt.shape[1]) >= first_scored)
    assert scored_bt.sum() > 0
    np.testing.assert_allclose(logp_bt, np.where(scored_bt, ref_logp_bt, 0), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(entropy_bt, np.where(scored_bt, ref_entropy_bt, 0), atol=1e-4, rtol=1e-4)
    assert np.all(np.asarray(logp_bt)[:, 0] == 0)


@pytest.mark.parametrize("first_scored", [0, 17])
def test_first_scored_out_of_range_is_a_value_error(hf_and_decoder, first_scored):
    _, decoder = hf_and_decoder
    batch = left_padded_batch(decoder.config.vocab_size)
    with pytest.raises(ValueError, match="first_scored"):
        sequence_logprobs(decoder, *batch, first_scored=first_scored)
