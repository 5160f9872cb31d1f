"""Decoder parity with transformers (torch on the CPU, float32), KV-cache decoding, dtypes, remat, ModelConfig.

The tiny checkpoints come from conftest.py; torch and transformers are test dependencies, so a missing torch
fails these tests rather than skipping them.
"""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from rubric_jax.models.config import Llama3RopeScaling, ModelConfig, preset_config
from rubric_jax.models.decoder import (
    ACTIVATION_AXES,
    MAX_QUERY_BLOCKS,
    MIN_QUERY_BLOCK,
    Decoder,
    causal_query_blocks,
    init_cache,
    local_rope_inv_freq,
    rope_inv_freq,
)
from rubric_jax.models.safetensors_io import load_hf_checkpoint
from tests.tiny_checkpoints import CHAT_TEMPLATE, VOCAB_SIZE

MODEL_FIXTURES = ["tiny_qwen3_dir", "tiny_qwen3_untied_dir", "tiny_qwen2_dir", "tiny_qwen2_untied_dir",
                  "tiny_llama_dir", "tiny_qwen3_moe_dir", "tiny_gemma3_dir"]
# float32 on the CPU: the two implementations differ only in summation order; observed max |diff| ~2e-5 on
# logits of magnitude up to ~60 (tied Qwen3), ~2e-6 on magnitude ~4.
PARITY_TOL = dict(atol=1e-4, rtol=1e-4)
# The cache path sums attention over S_max slots, the full forward over T: the extra slots add exact zeros.
CACHE_TOL = dict(atol=1e-5, rtol=1e-5)
# Positions start here so that every batch runs past the Llama fixture's original_max_position_embeddings (64).
POSITION_OFFSET = 56


@dataclasses.dataclass(frozen=True)
class Loaded:
    config: ModelConfig
    hf: torch.nn.Module
    decoder: Decoder


@functools.cache
def _load(directory: str) -> Loaded:
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    decoder = load_hf_checkpoint(directory)
    return Loaded(decoder.config, hf, decoder)


@pytest.fixture(params=MODEL_FIXTURES)
def loaded(request) -> Loaded:
    return _load(str(request.getfixturevalue(request.param)))


@pytest.fixture
def qwen3(tiny_qwen3_dir) -> Loaded:
    return _load(str(tiny_qwen3_dir))


@functools.partial(jax.jit, static_argnums=0)
def _logits_and_cache(graphdef, state, tokens_bt, positions_bt, mask_bt, cache):
    model = nnx.merge(graphdef, state)
    hidden_btd, cache = model(tokens_bt, positions_bt, mask_bt, cache)
    return model.logits(hidden_btd), cache


def run(model: Decoder, tokens_bt, positions_bt, mask_bt, cache=None):
    """Jitted (logits [B, T, V] float32, cache); one compilation per model structure and shape."""
    graphdef, state = nnx.split(model)
    return _logits_and_cache(graphdef, state, jnp.asarray(tokens_bt), jnp.asarray(positions_bt),
                             jnp.asarray(mask_bt), cache)


def padded_batch(seed: int, lengths, width: int, padding: str):
    """Random tokens [B, width] with `lengths` real tokens per row, padded on the `padding` side; positions
    count real tokens from POSITION_OFFSET (cumsum(mask) - 1, as generation code computes them)."""
    rng = np.random.default_rng(seed)
    index_bt = np.arange(width)[None, :]
    lengths_b1 = np.asarray(lengths)[:, None]
    mask_bt = index_bt < lengths_b1 if padding == "right" else index_bt >= width - lengths_b1
    tokens_bt = np.where(mask_bt, rng.integers(0, VOCAB_SIZE, mask_bt.shape), 0)
    return tokens_bt, positions_of(mask_bt), mask_bt


def positions_of(mask_bt):
    return POSITION_OFFSET + np.maximum(np.cumsum(mask_bt, axis=1) - 1, 0)


def hf_logits(hf, tokens_bt, positions_bt, mask_bt) -> np.ndarray:
    with torch.no_grad():
        return hf(
            input_ids=torch.as_tensor(tokens_bt),
            attention_mask=torch.as_tensor(mask_bt.astype(np.int64)),
            position_ids=torch.as_tensor(positions_bt),
        ).logits.numpy()


# ---------------------------------------------------------------- parity with transformers


@pytest.mark.parametrize("padding", ["right", "left"])
def test_logits_match_transformers(loaded, padding):
    tokens_bt, positions_bt, mask_bt = padded_batch(0, lengths=[20, 13, 6], width=20, padding=padding)
    expected = hf_logits(loaded.hf, tokens_bt, positions_bt, mask_bt)
    logits_btv, _ = run(loaded.decoder, tokens_bt, positions_bt, mask_bt)
    assert logits_btv.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(logits_btv)[mask_bt], expected[mask_bt], **PARITY_TOL)


@pytest.mark.parametrize("padding", ["right", "left"])
def test_logits_match_transformers_across_causal_query_blocks(qwen3, padding):
    width = 3 * MIN_QUERY_BLOCK + 17  # three query blocks, the last attending to every key
    assert len(causal_query_blocks(width)) == 3
    tokens_bt, positions_bt, mask_bt = padded_batch(4, lengths=[width, 250, 130], width=width, padding=padding)
    expected = hf_logits(qwen3.hf, tokens_bt, positions_bt, mask_bt)
    logits_btv, _ = run(qwen3.decoder, tokens_bt, positions_bt, mask_bt)
    np.testing.assert_allclose(np.asarray(logits_btv)[mask_bt], expected[mask_bt], **PARITY_TOL)


@pytest.mark.parametrize("length", [1, 5, MIN_QUERY_BLOCK, 2 * MIN_QUERY_BLOCK - 1, 2 * MIN_QUERY_BLOCK, 1000, 8192,
                                    100_003])
def test_causal_query_blocks_tile_the_sequence(length):
    blocks = causal_query_blocks(length)
    assert blocks[0][0] == 0 and blocks[-1][1] == length
    assert all(stop == next_start for (_, stop), (next_start, _) in zip(blocks, blocks[1:]))
    assert 1 <= len(blocks) <= MAX_QUERY_BLOCKS
    assert len(blocks) == 1 or min(stop - start for start, stop in blocks) >= MIN_QUERY_BLOCK


def test_rope_frequencies_match_transformers(loaded):
    rotary = loaded.hf.model.rotary_emb
    if loaded.config.gemma:  # one set per layer type: global layers scaled linearly, local ones by their own theta
        np.testing.assert_allclose(rope_inv_freq(loaded.config), rotary.full_attention_inv_freq.numpy(), rtol=1e-6)
        np.testing.assert_allclose(local_rope_inv_freq(loaded.config), rotary.sliding_attention_inv_freq.numpy(),
                                   rtol=1e-6)
        return
    np.testing.assert_allclose(rope_inv_freq(loaded.config), rotary.inv_freq.numpy(), rtol=1e-6)


def test_llama3_scaling_changes_low_and_medium_frequencies(tiny_llama_dir):
    config = _load(str(tiny_llama_dir)).config
    scaled = rope_inv_freq(config)
    plain = rope_inv_freq(dataclasses.replace(config, rope_scaling=None))
    # head_dim 16, theta 5e5: frequency 0 is kept, 1 is interpolated, 2..7 are divided by the factor.
    assert scaled[0] == plain[0]
    assert plain[1] / config.rope_scaling.factor < scaled[1] < plain[1]
    np.testing.assert_allclose(scaled[2:], plain[2:] / config.rope_scaling.factor, rtol=1e-6)


# ---------------------------------------------------------------- KV-cache decoding


@pytest.mark.parametrize("padding", ["left", "right"])
def test_cached_decoding_matches_full_forward(loaded, padding):
    # A prompt of width 8 (rows of 8, 5 and 3 tokens), then 5 tokens fed as chunks of 1, 2, 1, 1; in the
    # third chunk row 2 is a padded step (a finished row that keeps stepping). Right padding leaves a gap of
    # padded slots between a row's prompt and its continuation; positions carry on from the real tokens.
    prompt_bt, _, prompt_mask_bt = padded_batch(1, lengths=[8, 5, 3], width=8, padding=padding)
    continuation_bt = np.random.default_rng(2).integers(0, VOCAB_SIZE, (3, 5))
    continuation_mask_bt = np.ones((3, 5), bool)
    continuation_mask_bt[2, 3] = False
    tokens_bt = np.concatenate([prompt_bt, continuation_bt], axis=1)
    mask_bt = np.concatenate([prompt_mask_bt, continuation_mask_bt], axis=1)
    positions_bt = positions_of(mask_bt)
    full_btv, _ = run(loaded.decoder, tokens_bt, positions_bt, mask_bt)

    cache = init_cache(loaded.config, batch_size=3, max_len=16)
    for start, stop in [(0, 8), (8, 9), (9, 11), (11, 12), (12, 13)]:
        chunk = slice(start, stop)
        step_btv, cache = run(loaded.decoder, tokens_bt[:, chunk], positions_bt[:, chunk], mask_bt[:, chunk], cache)
        valid_bt = mask_bt[:, chunk]
        np.testing.assert_allclose(np.asarray(step_btv)[valid_bt], np.asarray(full_btv[:, chunk])[valid_bt],
                                   **CACHE_TOL)
    assert int(cache.end) == 13
    np.testing.assert_array_equal(np.asarray(cache.valid_bs[:, :13]), mask_bt)
    assert not np.asarray(cache.valid_bs[:, 13:]).any()


@pytest.mark.parametrize("padding", ["left", "right"])
def test_prefill_leaves_the_cache_a_cached_pass_leaves(loaded, padding):
    """`Decoder.prefill` (the pass without a cache, here over two causal query blocks of 64) gives the hidden
    states and the keys, values and validity that feeding the prompt into an empty cache of as many slots gives."""
    tokens_bt, positions_bt, mask_bt = padded_batch(4, lengths=[128, 90, 3], width=128, padding=padding)
    cache = init_cache(loaded.config, batch_size=3, max_len=128)
    cached_btd, cached = jax.jit(lambda m, *a: m(*a))(loaded.decoder, tokens_bt, positions_bt, mask_bt, cache)
    prefilled_btd, prefilled = jax.jit(lambda m, *a: m.prefill(*a))(loaded.decoder, tokens_bt, positions_bt,
                                                                    mask_bt)
    np.testing.assert_allclose(np.asarray(prefilled_btd)[mask_bt], np.asarray(cached_btd)[mask_bt], **CACHE_TOL)
    for got, expected in zip(prefilled.k_bnsk + prefilled.v_bnsk, cached.k_bnsk + cached.v_bnsk):
        valid = np.asarray(mask_bt)[:, None, :, None].repeat(got.shape[1], 1).repeat(got.shape[3], 3)
        np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(expected)[valid], **CACHE_TOL)
    np.testing.assert_array_equal(prefilled.valid_bs, cached.valid_bs)
    assert int(prefilled.end) == int(cached.end) == 128


def test_per_row_ends_write_and_attend_at_each_rows_own_slot(qwen3):
    """A cache with one write position per row (continuous batching): after the prompt, the rows' ends are moved
    apart (0, 2 and 4 unwritten slots of gap, as rows refilled at different times would leave), then 3 tokens are
    fed one at a time. Each row lands at its own slots and matches the full forward."""
    prompt_bt, _, prompt_mask_bt = padded_batch(1, lengths=[8, 5, 3], width=8, padding="left")
    continuation_bt = np.random.default_rng(3).integers(0, VOCAB_SIZE, (3, 3))
    tokens_bt = np.concatenate([prompt_bt, continuation_bt], axis=1)
    mask_bt = np.concatenate([prompt_mask_bt, np.ones((3, 3), bool)], axis=1)
    positions_bt = positions_of(mask_bt)
    full_btv, _ = run(qwen3.decoder, tokens_bt, positions_bt, mask_bt)

    cache = init_cache(qwen3.config, batch_size=3, max_len=20, per_row_end=True)
    _, cache = run(qwen3.decoder, prompt_bt, positions_bt[:, :8], prompt_mask_bt, cache)
    np.testing.assert_array_equal(cache.end, [8, 8, 8])
    gap_b = np.array([0, 2, 4])
    cache = dataclasses.replace(cache, end=cache.end + gap_b)
    for t in range(8, 11):
        step_btv, cache = run(qwen3.decoder, tokens_bt[:, t:t + 1], positions_bt[:, t:t + 1], mask_bt[:, t:t + 1],
                              cache)
        np.testing.assert_allclose(step_btv[:, 0], full_btv[:, t], **CACHE_TOL)
    np.testing.assert_array_equal(cache.end, 11 + gap_b)
    for b, gap in enumerate(gap_b):
        expected_s = np.concatenate([prompt_mask_bt[b], np.zeros(gap, bool), np.ones(3, bool),
                                     np.zeros(9 - gap, bool)])
        np.testing.assert_array_equal(cache.valid_bs[b], expected_s)


def test_ragged_decode_kernel_attends_as_the_xla_path(qwen3):
    """The ragged Pallas decode kernel (`attention="splash"`, interpret mode on CPU) against the XLA path on the
    same weights and cache: left-padded prompts, rows whose ends are moved apart (unwritten, invalid slots inside
    their range), and a step in which one row feeds a padded token. Each row's logits and the caches agree."""
    splash = Decoder(qwen3.config, rngs=nnx.Rngs(0), attention="splash")
    nnx.update(splash, nnx.state(qwen3.decoder))
    prompt_bt, positions_bt, prompt_mask_bt = padded_batch(2, lengths=[8, 5, 3], width=8, padding="left")
    xla_cache = init_cache(qwen3.config, batch_size=3, max_len=16, per_row_end=True)
    _, xla_cache = run(qwen3.decoder, prompt_bt, positions_bt, prompt_mask_bt, xla_cache)
    xla_cache = ragged_cache = dataclasses.replace(xla_cache, end=xla_cache.end + np.array([0, 2, 4]))
    tokens_bt = np.random.default_rng(4).integers(0, VOCAB_SIZE, (3, 3))
    fed_bt = np.array([[True, True, True], [True, False, True], [True, True, True]])
    for t in range(3):
        args = (tokens_bt[:, t:t + 1], positions_bt[:, -1:] + 1 + t, fed_bt[:, t:t + 1])
        xla_btv, xla_cache = run(qwen3.decoder, *args, xla_cache)
        ragged_btv, ragged_cache = run(splash, *args, ragged_cache)
        real_b = fed_bt[:, t]  # a padded query's output is discarded (zeros from the kernel, a mean from XLA)
        np.testing.assert_allclose(ragged_btv[real_b], xla_btv[real_b], **CACHE_TOL)
        for xla_leaf, ragged_leaf in zip(jax.tree.leaves(xla_cache), jax.tree.leaves(ragged_cache)):
            np.testing.assert_allclose(ragged_leaf, xla_leaf, **CACHE_TOL)


# ---------------------------------------------------------------- dtypes and remat


@pytest.mark.parametrize("param_dtype", [jnp.bfloat16, jnp.float32], ids=["bf16_params", "f32_params"])
def test_bfloat16_activations_stay_close_to_float32(qwen3, tiny_qwen3_dir, param_dtype):
    decoder = load_hf_checkpoint(tiny_qwen3_dir, dtype=jnp.bfloat16, param_dtype=param_dtype)
    tokens_bt, positions_bt, mask_bt = padded_batch(0, lengths=[20, 13, 6], width=20, padding="left")
    graphdef, state = nnx.split(decoder)
    hidden_btd, _ = jax.eval_shape(lambda s: nnx.merge(graphdef, s)(tokens_bt, positions_bt, mask_bt), state)
    assert hidden_btd.dtype == jnp.bfloat16
    assert decoder.layers[0].mlp.up_proj.kernel.dtype == param_dtype
    low_btv, _ = run(decoder, tokens_bt, positions_bt, mask_bt)
    reference_btv, _ = run(qwen3.decoder, tokens_bt, positions_bt, mask_bt)
    low, reference = np.asarray(low_btv)[mask_bt], np.asarray(reference_btv)[mask_bt]
    assert low.dtype == np.float32 and np.isfinite(low).all()
    # bfloat16 keeps 8 significant bits (unit roundoff 2^-8 ~ 0.4%), and some twenty roundings through two
    # layers and the unembedding compound: observed max |error| 0.7% and mean 0.1% of max |logit| (1.2% and
    # 0.2% on the other fixtures). The bounds, 5% and 1%, leave room for other seeds and XLA versions while
    # still failing when the bfloat16 path breaks.
    scale = np.abs(reference).max()
    assert np.abs(low - reference).max() < 0.05 * scale
    assert np.abs(low - reference).mean() < 0.01 * scale


def _loss_grads_and_jaxpr(decoder: Decoder, tokens_bt, positions_bt, mask_bt):
    """Loss (negative log-likelihood of the input tokens), its gradients, and the jaxpr of both, as text."""
    graphdef, state = nnx.split(decoder)

    def loss(state):
        logits_btv, _ = _logits_and_cache(graphdef, state, tokens_bt, positions_bt, mask_bt, None)
        logprobs_btv = jax.nn.log_softmax(logits_btv)
        return -jnp.sum(jnp.where(mask_bt[..., None], logprobs_btv * jax.nn.one_hot(tokens_bt, VOCAB_SIZE), 0))

    loss_and_grads = jax.jit(jax.value_and_grad(loss))
    return *loss_and_grads(state), str(jax.make_jaxpr(loss_and_grads)(state))


def test_remat_gives_identical_outputs_and_gradients(qwen3):
    tokens_bt, positions_bt, mask_bt = map(jnp.asarray, padded_batch(3, lengths=[16, 9], width=16, padding="left"))
    rematted = Decoder(qwen3.config, rngs=nnx.Rngs(0), remat=True)
    nnx.update(rematted, nnx.state(qwen3.decoder))
    np.testing.assert_array_equal(run(rematted, tokens_bt, positions_bt, mask_bt)[0],
                                  run(qwen3.decoder, tokens_bt, positions_bt, mask_bt)[0])
    (loss, grads, jaxpr), (remat_loss, remat_grads, remat_jaxpr) = [
        _loss_grads_and_jaxpr(decoder, tokens_bt, positions_bt, mask_bt) for decoder in (qwen3.decoder, rematted)
    ]
    # Under differentiation XLA compiles the recomputed forward separately, so sums may round differently:
    # equal to float32 rounding (observed 1e-6 relative), not bit for bit.
    np.testing.assert_allclose(remat_loss, loss, rtol=1e-5)
    for remat_grad, grad in zip(jax.tree.leaves(remat_grads), jax.tree.leaves(grads)):
        assert np.abs(remat_grad - grad).max() <= 1e-5 * np.abs(grad).max()
    # The flag reaches the computation: the backward pass recomputes each layer (jax.checkpoint's primitive is
    # named remat in the jaxpr), and nothing without the flag.
    assert (remat_jaxpr.count("remat"), jaxpr.count("remat")) == (qwen3.config.num_layers, 0)


@pytest.mark.parametrize("remat", [False, True], ids=["plain", "remat"])
def test_scanned_layers_give_the_unrolled_outputs_and_gradients(qwen3, remat):
    """`scan_layers`: the same arithmetic as the unrolled layers (equal to float32 rounding: XLA fuses a loop body
    differently), one scan and no unrolled layer in the program (remat: one checkpoint, inside the loop); decoding
    with a cache is unchanged."""
    tokens_bt, positions_bt, mask_bt = map(jnp.asarray, padded_batch(3, lengths=[16, 9], width=16, padding="left"))
    scanned = Decoder(qwen3.config, rngs=nnx.Rngs(0), remat=remat, scan_layers=True)
    nnx.update(scanned, nnx.state(qwen3.decoder))
    np.testing.assert_allclose(run(scanned, tokens_bt, positions_bt, mask_bt)[0],
                               run(qwen3.decoder, tokens_bt, positions_bt, mask_bt)[0], rtol=1e-5, atol=1e-5)
    (loss, grads, _), (scan_loss, scan_grads, scan_jaxpr) = [
        _loss_grads_and_jaxpr(decoder, tokens_bt, positions_bt, mask_bt) for decoder in (qwen3.decoder, scanned)]
    np.testing.assert_allclose(scan_loss, loss, rtol=1e-5)
    assert jax.tree.structure(scan_grads) == jax.tree.structure(grads)  # each layer's own gradients
    for scan_grad, grad in zip(jax.tree.leaves(scan_grads), jax.tree.leaves(grads)):
        assert np.abs(scan_grad - grad).max() <= 1e-5 * np.abs(grad).max()
    assert scan_jaxpr.count("scan[") >= 1 and scan_jaxpr.count("remat") == int(remat)

    cache = init_cache(scanned.config, batch_size=2, max_len=20)
    cached, _ = run(scanned, tokens_bt, positions_bt, mask_bt, cache)
    np.testing.assert_array_equal(cached, run(qwen3.decoder, tokens_bt, positions_bt, mask_bt, cache)[0])


def test_shard_activations_hook_sees_every_residual_stream(qwen3):
    calls = []

    def record(x, logical_axes):
        calls.append((x.shape, logical_axes))
        return x

    graphdef, state = nnx.split(Decoder(qwen3.config, rngs=nnx.Rngs(0), shard_activations=record))
    jax.eval_shape(lambda s: nnx.merge(graphdef, s)(jnp.zeros((2, 5), int), jnp.zeros((2, 5), int), jnp.ones((2, 5))),
                   state)
    assert calls == [((2, 5, qwen3.config.hidden_size), ACTIVATION_AXES)] * (qwen3.config.num_layers + 1)


def test_unembed_kernel_is_the_embedding_transpose_when_tied(loaded):
    kernel_dv = loaded.decoder.unembed_kernel()
    assert kernel_dv.shape == (loaded.config.hidden_size, loaded.config.vocab_size)
    expected = loaded.hf.lm_head.weight.detach().numpy().T
    np.testing.assert_array_equal(np.asarray(kernel_dv), expected)
    assert (loaded.decoder.lm_head is None) == loaded.config.tie_word_embeddings


# ---------------------------------------------------------------- ModelConfig


def test_config_round_trips_through_transformers(loaded, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(loaded.config.to_hf_dict()))
    hf_config = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(hf_config) is type(loaded.hf.config)
    assert hf_config.rope_parameters == loaded.hf.config.rope_parameters
    assert ModelConfig.from_hf_dict(hf_config.to_dict()) == loaded.config
    assert ModelConfig.from_pretrained(tmp_path) == loaded.config


def test_transformers4_layout_reads_the_same(tiny_llama_dir):
    saved = json.loads((tiny_llama_dir / "config.json").read_text())
    legacy = {k: v for k, v in saved.items() if k != "rope_parameters"}
    rope = dict(saved["rope_parameters"])
    legacy["rope_theta"] = rope.pop("rope_theta")
    legacy["rope_scaling"] = {"type" if k == "rope_type" else k: v for k, v in rope.items()}  # the oldest key
    assert ModelConfig.from_hf_dict(legacy) == ModelConfig.from_hf_dict(saved)


def test_published_llama_3_2_config():
    # Meta-Llama-3.2-1B's config.json (transformers 4 layout), abridged to the keys the decoder reads.
    config = ModelConfig.from_hf_dict({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
        "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0, "mlp_bias": False, "tie_word_embeddings": True, "bos_token_id": 128000,
        "eos_token_id": 128001, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    })
    assert (config.num_kv_heads, config.head_dim, config.qk_norm) == (8, 64, False)
    assert config.rope_scaling == Llama3RopeScaling(32.0, 1.0, 4.0, 8192)


def test_published_qwen2_5_7b_config_is_the_preset():
    # Qwen/Qwen2.5-7B's (base) config.json, transformers 4 layout, as published.
    config = ModelConfig.from_hf_dict({
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
        "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2",
        "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1", "use_cache": True, "use_mrope": False, "use_sliding_window": False,
        "vocab_size": 152064,
    })
    assert (config.head_dim, config.qkv_bias, config.o_proj_bias, config.qk_norm) == (128, True, False, False)
    assert config == dataclasses.replace(preset_config("Qwen2.5-7B"), bos_token_id=151643, eos_token_id=151643)


def test_qwen2_has_qkv_biases_and_no_o_proj_bias(tiny_qwen2_dir):
    config = ModelConfig.from_pretrained(tiny_qwen2_dir)
    attention = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))).layers[0].self_attn
    assert [p.bias.shape for p in (attention.q_proj, attention.k_proj, attention.v_proj)] == [(64,), (32,), (32,)]
    assert attention.o_proj.bias is None and attention.q_norm is None
    with pytest.raises(ValueError, match="'qwen2' takes no attention_bias"):
        dataclasses.replace(config, attention_bias=True)


def test_qwen2_missing_keys_take_transformers_defaults(tiny_qwen2_dir):
    saved = json.loads((tiny_qwen2_dir / "config.json").read_text())
    bare = {k: v for k, v in saved.items() if k not in ("max_position_embeddings", "rope_parameters", "rms_norm_eps")}
    config, defaults = ModelConfig.from_hf_dict(bare), transformers.Qwen2Config()
    assert config.max_position_embeddings == defaults.max_position_embeddings == 32768
    assert config.rope_theta == defaults.rope_parameters["rope_theta"] == 10000.0
    assert config.rms_norm_eps == defaults.rms_norm_eps == 1e-6


@pytest.mark.parametrize("change", [
    {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 1},
    # Refused even when transformers would slide no layer (max_window_layers >= num_hidden_layers): the config
    # says so with use_sliding_window false.
    {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 28},
    {"layer_types": ["full_attention", "sliding_attention"]},
])
def test_qwen2_sliding_window_is_refused_naming_its_keys(tiny_qwen2_dir, change):
    config = {**json.loads((tiny_qwen2_dir / "config.json").read_text()), **change}
    with pytest.raises(ValueError, match=r"unsupported sliding-window attention \(use_sliding_window=.*"
                                         r"max_window_layers=.*layer_types="):
        ModelConfig.from_hf_dict(config)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"model_type": "mistral"}, "mistral"),
        ({"architectures": ["Qwen3ForSequenceClassification"]}, "Qwen3ForSequenceClassification"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "yarn"),
        ({"hidden_act": "gelu"}, "gelu"),
        ({"use_sliding_window": True}, "sliding"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"num_key_value_heads": 3}, "num_kv_heads"),
        ({"head_dim": 15}, "head_dim"),
        ({"num_hidden_layers": None}, "num_hidden_layers"),
    ],
)
def test_unsupported_or_invalid_config_is_a_value_error_naming_it(tiny_qwen3_dir, change, named):
    config = {**json.loads((tiny_qwen3_dir / "config.json").read_text()), **change}
    with pytest.raises(ValueError, match=named):
        ModelConfig.from_hf_dict(config)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
        ({"moe_intermediate_size": 0}, "moe_intermediate_size"),
        ({"mlp_only_layers": [2]}, "mlp_only_layers"),
        ({"hidden_act": "gelu"}, "gelu"),
    ],
)
def test_invalid_moe_config_is_a_value_error_naming_it(tiny_qwen3_moe_dir, change, named):
    config = {**json.loads((tiny_qwen3_moe_dir / "config.json").read_text()), **change}
    with pytest.raises(ValueError, match=named):
        ModelConfig.from_hf_dict(config)


def test_moe_config_reads_either_expert_count_key_and_names_its_sparse_layers(tiny_qwen3_moe_dir):
    """transformers 5 writes `num_local_experts`; the published Qwen3-MoE configs say `num_experts`."""
    written = json.loads((tiny_qwen3_moe_dir / "config.json").read_text())
    published = {**{k: v for k, v in written.items() if k != "num_local_experts"}, "num_experts": 4}
    assert ModelConfig.from_hf_dict(written) == ModelConfig.from_hf_dict(published)
    config = ModelConfig.from_hf_dict(written)
    assert (config.num_experts, config.num_experts_per_tok, config.norm_topk_prob) == (4, 2, True)
    assert [config.sparse_layer(i) for i in range(2)] == [True, False]  # mlp_only_layers = [1]
    assert [dataclasses.replace(config, mlp_only_layers=(), decoder_sparse_step=2).sparse_layer(i)
            for i in range(2)] == [False, True]
    with pytest.raises(ValueError, match="has no experts"):
        dataclasses.replace(config, model_type="qwen3")
    with pytest.raises(ValueError, match="scan_layers needs layers of one structure"):
        Decoder(config, rngs=nnx.Rngs(0), scan_layers=True)


def test_invalid_llama3_scaling_is_a_value_error():
    with pytest.raises(ValueError, match="low_freq_factor"):
        Llama3RopeScaling(factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0, original_max_position_embeddings=64)


def test_tiny_tokenizer_loads_with_its_chat_template(tiny_qwen3_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    messages = [{"role": "user", "content": "what is two plus two?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    text = tokenizer.decode(ids["input_ids"])
    assert text == "<|im_start|>user\nwhat is two plus two?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.chat_template == CHAT_TEMPLATE and max(ids["input_ids"]) < VOCAB_SIZE
