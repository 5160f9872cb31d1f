"""The attention implementations of `models.attention`: the splash kernel (Pallas interpret mode on CPU) against the
decoder's XLA attention, with padding on either side, grouped-query heads, gradients and a sharded mesh."""

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


def test_auto_is_xla_off_tpu():
    assert attention.resolve("auto", LENGTH) == "xla"
    assert attention.resolve("xla", LENGTH + 1) == "xla"


def test_bad_names_and_lengths_are_refused():
    with pytest.raises(ValueError, match="unknown attention implementation 'flash'"):
        Decoder(CONFIG, rngs=nnx.Rngs(0), attention="flash")
    with pytest.raises(ValueError, match="multiple of 128, got 100"):
        attention.resolve("splash", 100)
