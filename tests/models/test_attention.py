"""The attention implementations of `models.attention`: the splash kernel (Pallas interpret mode on CPU) against the
decoder's XLA attention, with padding on either side, grouped-query heads, gradients and a sharded mesh; the
compacted arrangement the cuDNN kernel runs in (real tokens moved to the front, lengths as masks) through
`jax.nn.dot_product_attention`'s XLA implementation against a loop transcription of masked causal attention, with
left and right padding, gaps and a row of padding only; the cuDNN kernel itself where a GPU is present; and the
choice of kernel by platform, dtype and head width."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_jax.models import attention, sharding
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.decoder import Decoder

CONFIG = ModelConfig(model_type="qwen3", vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=512)
LENGTH = attention.SPLASH_BLOCK


def _inputs(rows: int = 2):
    """Tokens, positions and a mask with left padding (row 0), right padding (row 1) and none (the others)."""
    tokens_bt = jax.random.randint(jax.random.key(1), (rows, LENGTH), 0, CONFIG.vocab_size)
    mask_bt = np.ones((rows, LENGTH), bool)
    mask_bt[0, :37] = False
    mask_bt[1, 90:] = False
    positions_bt = np.maximum(np.cumsum(mask_bt, axis=1) - 1, 0).astype(np.int32)
    return tokens_bt, positions_bt, mask_bt


def _decoders():
    return (Decoder(CONFIG, rngs=nnx.Rngs(0), attention="xla"),
            Decoder(CONFIG, rngs=nnx.Rngs(0), attention="splash"))


def test_splash_matches_xla_on_real_tokens():
    tokens_bt, positions_bt, mask_bt = _inputs()
    xla, splash = _decoders()
    hidden_xla, _ = xla(tokens_bt, positions_bt, mask_bt)
    hidden_splash, _ = splash(tokens_bt, positions_bt, mask_bt)
    np.testing.assert_allclose(np.asarray(hidden_splash)[mask_bt], np.asarray(hidden_xla)[mask_bt],
                               rtol=1e-5, atol=1e-5)
    assert np.isfinite(np.asarray(hidden_splash)).all()


def test_splash_gradients_match_xla():
    tokens_bt, positions_bt, mask_bt = _inputs()

    def loss(model):
        hidden_btd, _ = model(tokens_bt, positions_bt, mask_bt)
        return jnp.sum(jnp.where(mask_bt[..., None], jnp.sin(hidden_btd), 0))

    grads = [jax.tree.leaves(nnx.grad(loss)(model)) for model in _decoders()]
    for grad_xla, grad_splash in zip(*grads):
        # float32 sums in another order: a few entries differ by ~1e-4 of the largest
        np.testing.assert_allclose(grad_splash, grad_xla, rtol=1e-3, atol=1e-4 * np.abs(grad_xla).max())


def test_splash_under_a_mesh_matches_xla():
    tokens_bt, positions_bt, mask_bt = _inputs(rows=4)
    mesh = sharding.make_mesh(fsdp=2, tensor=2, devices=jax.devices()[:4])
    xla, splash = _decoders()
    hidden_xla, _ = xla(tokens_bt, positions_bt, mask_bt)
    with jax.set_mesh(mesh):
        hidden_splash = jax.jit(lambda *args: splash(*args)[0])(tokens_bt, positions_bt, mask_bt)
    np.testing.assert_allclose(np.asarray(hidden_splash)[mask_bt], np.asarray(hidden_xla)[mask_bt],
                               rtol=1e-5, atol=1e-5)


def _qkv_valid(rows=6, length=11, heads=4, kv_heads=2, width=8, dtype=jnp.float32):
    """Random q [B, T, H, k], k and v [B, KV, T, k]; validity with left padding (row 0), right padding (row 1),
    gaps (row 2), none (rows 3 and 5) and no real token at all (row 4)."""
    keys = jax.random.split(jax.random.key(7), 3)
    q_bthk = jax.random.normal(keys[0], (rows, length, heads, width), dtype)
    k_bnsk, v_bnsk = (jax.random.normal(key, (rows, kv_heads, length, width), dtype) for key in keys[1:])
    valid_bt = np.ones((rows, length), bool)
    valid_bt[0, :4] = False
    valid_bt[1, 7:] = False
    valid_bt[2, [0, 3, 4, 9]] = False
    valid_bt[4] = False
    return q_bthk, k_bnsk, v_bnsk, valid_bt


def _loop_attention(q_bthk, k_bnsk, v_bnsk, valid_bt):
    """Real query t of row b attends to the real keys s <= t: softmax(q k / sqrt(k)) v, one (b, t, h) at a time;
    NaN for padded queries (no defined output)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q_bthk, k_bnsk, v_bnsk))
    rows, length, heads, width = q.shape
    group = heads // k.shape[1]
    out = np.full(q.shape, np.nan)
    for b in range(rows):
        for t in range(length):
            if not valid_bt[b, t]:
                continue
            keys = [s for s in range(t + 1) if valid_bt[b, s]]
            for h in range(heads):
                n = h // group
                scores = np.array([q[b, t, h] @ k[b, n, s] for s in keys]) / np.sqrt(width)
                weights = np.exp(scores - scores.max())
                weights /= weights.sum()
                out[b, t, h] = sum(w * v[b, n, s] for w, s in zip(weights, keys))
    return out


def test_the_compacted_arrangement_is_masked_causal_attention():
    q_bthk, k_bnsk, v_bnsk, valid_bt = _qkv_valid()
    with jax.default_matmul_precision("highest"):  # no TF32 on a GPU
        out = np.asarray(attention.compacted_attention(q_bthk, k_bnsk, v_bnsk, valid_bt, implementation="xla"))
    expected = _loop_attention(q_bthk, k_bnsk, v_bnsk, valid_bt)
    np.testing.assert_allclose(out[valid_bt], expected[valid_bt], rtol=1e-5, atol=1e-6)
    assert np.isfinite(out).all()  # padded queries, the all-padding row included


def test_the_compacted_arrangement_has_the_gradients_of_masked_attention():
    q_bthk, k_bnsk, v_bnsk, valid_bt = _qkv_valid()
    causal_ts = np.tril(np.ones((valid_bt.shape[1],) * 2, bool))

    def masked(q_bthk, k_bnsk, v_bnsk):
        group = q_bthk.shape[2] // k_bnsk.shape[1]
        k_bhsk, v_bhsk = (jnp.repeat(x, group, axis=1) for x in (k_bnsk, v_bnsk))
        scores = jnp.einsum("bthk,bhsk->bhts", q_bthk, k_bhsk) / np.sqrt(q_bthk.shape[-1])
        mask = causal_ts[None, None] & valid_bt[:, None, None, :]
        probs = jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1)
        return jnp.einsum("bhts,bhsk->bthk", probs, v_bhsk)

    def compacted(q_bthk, k_bnsk, v_bnsk):
        return attention.compacted_attention(q_bthk, k_bnsk, v_bnsk, valid_bt, implementation="xla")

    def loss(fn):
        return lambda *qkv: jnp.sum(jnp.where(valid_bt[:, :, None, None], jnp.sin(fn(*qkv)), 0))

    argnums = (0, 1, 2)
    for got, want in zip(jax.grad(loss(compacted), argnums)(q_bthk, k_bnsk, v_bnsk),
                         jax.grad(loss(masked), argnums)(q_bthk, k_bnsk, v_bnsk)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        assert np.isfinite(np.asarray(got)).all()


def test_the_compacted_arrangement_under_a_mesh_matches_one_device():
    q_bthk, k_bnsk, v_bnsk, valid_bt = _qkv_valid()
    expected = attention.compacted_attention(q_bthk, k_bnsk, v_bnsk, valid_bt, implementation="xla")
    mesh = sharding.make_mesh(fsdp=2, tensor=2, devices=jax.devices()[:4])
    with jax.set_mesh(mesh):
        out = jax.jit(lambda *args: attention.compacted_attention(*args, implementation="xla"))(
            q_bthk, k_bnsk, v_bnsk, valid_bt)
    np.testing.assert_allclose(np.asarray(out)[valid_bt], np.asarray(expected)[valid_bt], rtol=1e-5, atol=1e-6)


def test_a_cudnn_decoder_runs_the_compacted_arrangement(monkeypatch):
    """The decoder's "cudnn" attention is `compacted_attention`: with its kernel swapped for jax's XLA one (cuDNN needs
    a GPU), the decoder equals the XLA decoder on real tokens, left and right padding and a gap included."""
    calls = []

    def compacted_by_xla(*args):
        calls.append(1)
        return compacted_attention(*args, implementation="xla")

    compacted_attention = attention.compacted_attention
    monkeypatch.setattr(attention, "compacted_attention", compacted_by_xla)
    tokens_bt, positions_bt, mask_bt = _inputs(rows=3)
    mask_bt[2, 50:60] = False
    xla, cudnn = (Decoder(CONFIG, rngs=nnx.Rngs(0), attention=name) for name in ("xla", "cudnn"))
    with jax.default_matmul_precision("highest"):  # no TF32 on a GPU
        hidden_xla, _ = xla(tokens_bt, positions_bt, mask_bt)
        hidden_cudnn, _ = cudnn(tokens_bt, positions_bt, mask_bt)
    assert len(calls) == CONFIG.num_layers
    np.testing.assert_allclose(np.asarray(hidden_cudnn)[mask_bt], np.asarray(hidden_xla)[mask_bt],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_cudnn_is_masked_causal_attention_on_a_gpu(dtype):
    """Head width 128 as Qwen3's; float32 operands are attended in bfloat16. Measured on an H200: largest
    difference from the float64 loop about 0.008 for unit-normal operands, XLA's bfloat16 attention's 0.012."""
    q_bthk, k_bnsk, v_bnsk, valid_bt = _qkv_valid(length=160, heads=4, kv_heads=2, width=128, dtype=dtype)
    out = np.asarray(attention.compacted_attention(q_bthk, k_bnsk, v_bnsk, valid_bt), np.float32)
    expected = _loop_attention(q_bthk.astype(jnp.bfloat16).astype(jnp.float32), k_bnsk.astype(jnp.bfloat16)
                               .astype(jnp.float32), v_bnsk.astype(jnp.bfloat16).astype(jnp.float32), valid_bt)
    np.testing.assert_allclose(out[valid_bt], expected[valid_bt], rtol=0, atol=3e-2)
    assert np.isfinite(out).all()


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the choice on a CPU")
def test_auto_is_xla_on_cpu():
    for dtype in (jnp.float32, jnp.bfloat16):
        assert attention.resolve("auto", LENGTH, head_width=128, dtype=dtype) == "xla"
    assert attention.resolve("xla", LENGTH + 1, head_width=128, dtype=jnp.float32) == "xla"


def test_auto_takes_cudnn_on_a_gpu_for_16_bit_activations_and_a_head_width_it_takes(monkeypatch):
    monkeypatch.setattr(attention, "current_platform", lambda: "gpu")
    assert attention.resolve("auto", 100, head_width=128, dtype=jnp.bfloat16) == "cudnn"
    assert attention.resolve("auto", 100, head_width=64, dtype=jnp.float16) == "cudnn"
    assert attention.resolve("auto", 100, head_width=128, dtype=jnp.float32) == "xla"  # no silent bfloat16
    assert attention.resolve("auto", 100, head_width=160, dtype=jnp.bfloat16) == "xla"
    monkeypatch.setattr(attention, "current_platform", lambda: "tpu")
    assert attention.resolve("auto", LENGTH, head_width=128, dtype=jnp.float32) == "splash"
    assert attention.resolve("auto", 100, head_width=128, dtype=jnp.float32) == "xla"


def test_bad_names_lengths_and_head_widths_are_refused():
    with pytest.raises(ValueError, match="unknown attention implementation 'flash'"):
        Decoder(CONFIG, rngs=nnx.Rngs(0), attention="flash")
    with pytest.raises(ValueError, match="multiple of 128, got 100"):
        attention.resolve("splash", 100, head_width=128, dtype=jnp.float32)
    with pytest.raises(ValueError, match="head width that is a multiple of 8 and at most 128, got 12"):
        attention.resolve("cudnn", 100, head_width=12, dtype=jnp.bfloat16)
