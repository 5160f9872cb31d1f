"""Gemma 3 beyond the families' shared parity tests (tests/models/test_decoder.py and test_safetensors_io.py run the
text fixture through those): the multimodal checkpoints' language model, read from either tensor layout, its
vision tower left out, saved back as the text model; the local layers' window; the presets; the chat template and
the end-of-turn stop token."""

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from rubric_jax.models.config import GLOBAL, SLIDING, ModelConfig, preset_config
from rubric_jax.models.safetensors_io import load_hf_checkpoint, save_hf_checkpoint
from rubric_jax.models.tokenizer import apply_chat_template, load_tokenizer
from rubric_jax.training import policy
from tests.tiny_checkpoints import GEMMA_END_OF_TURN_ID, GEMMA_EOS_ID, VOCAB_SIZE

PARITY_TOL = dict(atol=1e-4, rtol=1e-4)


def left_padded_batch(seed: int = 0, lengths=(12, 9, 5), width: int = 12):
    rng = np.random.default_rng(seed)
    mask_bt = np.arange(width)[None, :] >= width - np.asarray(lengths)[:, None]
    tokens_bt = np.where(mask_bt, rng.integers(0, VOCAB_SIZE, mask_bt.shape), 0)
    return tokens_bt, np.maximum(np.cumsum(mask_bt, axis=1) - 1, 0), mask_bt


def decoder_logits(model, tokens_bt, positions_bt, mask_bt) -> np.ndarray:
    hidden_btd, _ = model(jnp.asarray(tokens_bt), jnp.asarray(positions_bt), jnp.asarray(mask_bt))
    return np.asarray(model.logits(hidden_btd))


def multimodal_logits(directory, tokens_bt, positions_bt, mask_bt) -> np.ndarray:
    hf = transformers.AutoModelForImageTextToText.from_pretrained(directory, attn_implementation="eager").eval()
    assert type(hf).__name__ == "Gemma3ForConditionalGeneration"
    with torch.no_grad():
        return hf(input_ids=torch.as_tensor(tokens_bt), attention_mask=torch.as_tensor(mask_bt.astype(np.int64)),
                  position_ids=torch.as_tensor(positions_bt)).logits.numpy()


def test_a_multimodal_config_reads_as_its_language_model(tiny_gemma3_multimodal_dir, tiny_gemma3_dir):
    config = ModelConfig.from_pretrained(tiny_gemma3_multimodal_dir)
    assert config.language_model and config.model_type == "gemma3_text"
    assert dataclasses.replace(config, language_model=False) == ModelConfig.from_pretrained(tiny_gemma3_dir)
    assert config.layer_types == (SLIDING, GLOBAL, SLIDING) and config.sliding_window == 4
    assert config.eos_token_id == (GEMMA_EOS_ID, GEMMA_END_OF_TURN_ID)


def _renamed_checkpoint(source, destination, rename):
    destination.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (destination / name).write_bytes((source / name).read_bytes())
    tensors = load_file(source / "model.safetensors")
    save_file({rename(name): tensor for name, tensor in tensors.items()}, destination / "model.safetensors",
              metadata={"format": "pt"})
    return destination


@pytest.mark.parametrize("layout", ["published", "transformers5"])
def test_the_language_model_of_either_layout_gives_transformers_logits(tiny_gemma3_multimodal_dir, tmp_path, layout):
    """transformers writes the published names (`language_model.model.*`); its in-memory layout
    (`model.language_model.*`, which some exports save) reads the same."""
    directory = tiny_gemma3_multimodal_dir
    if layout == "transformers5":
        directory = _renamed_checkpoint(directory, tmp_path / "renamed", lambda name: name.replace(
            "language_model.model.", "model.language_model.").replace("vision_tower.", "model.vision_tower."))
        assert any(name.startswith("model.language_model.") for name in load_file(directory / "model.safetensors"))
    batch = left_padded_batch()
    got = decoder_logits(load_hf_checkpoint(directory), *batch)
    expected = multimodal_logits(tiny_gemma3_multimodal_dir, *batch)
    np.testing.assert_allclose(got[batch[2]], expected[batch[2]], **PARITY_TOL)


def test_a_missing_language_model_tensor_is_named(tiny_gemma3_multimodal_dir, tmp_path):
    source = tiny_gemma3_multimodal_dir
    broken = tmp_path / "broken"
    _renamed_checkpoint(source, broken, lambda name: name)
    tensors = load_file(broken / "model.safetensors")
    del tensors["language_model.model.layers.1.pre_feedforward_layernorm.weight"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing tensors 'model.layers.1.pre_feedforward_layernorm.weight'"):
        load_hf_checkpoint(broken)


def test_the_language_model_saves_as_a_text_model_transformers_loads(tiny_gemma3_multimodal_dir, tmp_path):
    model = load_hf_checkpoint(tiny_gemma3_multimodal_dir)
    save_hf_checkpoint(model, tmp_path / "text", tokenizer_dir=tiny_gemma3_multimodal_dir)
    assert json.loads((tmp_path / "text" / "config.json").read_text())["architectures"] == ["Gemma3ForCausalLM"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "text", attn_implementation="eager").eval()
    assert type(hf).__name__ == "Gemma3ForCausalLM"
    tokens_bt, positions_bt, mask_bt = left_padded_batch(1)
    with torch.no_grad():
        expected = hf(input_ids=torch.as_tensor(tokens_bt), attention_mask=torch.as_tensor(mask_bt.astype(np.int64)),
                      position_ids=torch.as_tensor(positions_bt)).logits.numpy()
    np.testing.assert_allclose(decoder_logits(model, tokens_bt, positions_bt, mask_bt)[mask_bt], expected[mask_bt],
                               **PARITY_TOL)


def test_a_local_layer_sees_only_its_window(tiny_gemma3_dir):
    """Changing a token more than `sliding_window` positions back changes the output only through the global
    layer: with the global layer's attention to it masked too (a model of local layers alone), nothing changes."""
    model = load_hf_checkpoint(tiny_gemma3_dir)
    local_only = load_hf_checkpoint(tiny_gemma3_dir)
    object.__setattr__(local_only, "config", dataclasses.replace(local_only.config, layer_types=(SLIDING,) * 3))
    tokens_bt, positions_bt, mask_bt = left_padded_batch(2, lengths=(16,), width=16)
    changed_bt = tokens_bt.copy()
    changed_bt[0, 2] = (changed_bt[0, 2] + 1) % VOCAB_SIZE
    window = model.config.sliding_window
    # Three local layers carry position 2 at most 3 * (window - 1) positions on.
    far = slice(2 + 3 * (window - 1) + 1, None)
    before, after = (decoder_logits(local_only, t, positions_bt, mask_bt) for t in (tokens_bt, changed_bt))
    np.testing.assert_array_equal(before[0, far], after[0, far])
    assert not np.allclose(before[0, 3], after[0, 3])
    before, after = (decoder_logits(model, t, positions_bt, mask_bt) for t in (tokens_bt, changed_bt))
    assert not np.allclose(before[0, -1], after[0, -1])


def test_presets_have_the_published_shapes():
    one_b = preset_config("gemma-3-1b")
    assert one_b.layer_types.count(GLOBAL) == 4 and one_b.layer_types[5] == GLOBAL and one_b.sliding_window == 512
    assert one_b.rope_scaling is None and preset_config("gemma-3-4b").rope_scaling.factor == 8.0
    big = preset_config("gemma-3-27b")
    assert big.attention_scale == 168 ** -0.5 and big.head_dim == 128
    for name in ("gemma-3-1b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b"):
        assert ModelConfig.from_hf_dict(preset_config(name).to_hf_dict()) == preset_config(name)


@pytest.mark.parametrize("change, named", [
    ({"final_logit_softcapping": 30.0}, "soft-capping"),
    ({"attn_logit_softcapping": 50.0}, "soft-capping"),
    ({"use_bidirectional_attention": True}, "bidirectional"),
    ({"hidden_activation": "gelu"}, "gelu"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ({"layer_types": ["sliding_attention"]}, "layer_types"),
])
def test_unsupported_gemma3_configs_are_value_errors_naming_the_key(tiny_gemma3_dir, change, named):
    saved = json.loads((tiny_gemma3_dir / "config.json").read_text())
    saved.pop("rope_parameters")
    with pytest.raises(ValueError, match=named):
        ModelConfig.from_hf_dict({**saved, **change})


def test_splash_attention_is_refused_for_sliding_windows(tiny_gemma3_dir):
    with pytest.raises(ValueError, match="attends by XLA only"):
        load_hf_checkpoint(tiny_gemma3_dir, attention="splash")


def test_the_chat_template_folds_the_system_message_and_the_turn_stops_at_end_of_turn(tiny_gemma3_dir):
    tokenizer = load_tokenizer(tiny_gemma3_dir)
    ids = apply_chat_template(tokenizer, [{"role": "system", "content": "Grade strictly."},
                                          {"role": "user", "content": "what is two plus two?"}])
    assert tokenizer.decode(ids) == ("<bos><start_of_turn>user\nGrade strictly.\n\nwhat is two plus two?"
                                     "<end_of_turn>\n<start_of_turn>model\n")
    # The tokenizer's eos is <eos>; the config lists <end_of_turn> too, and a response stops at either.
    assert tokenizer.eos_token_id == GEMMA_EOS_ID
    model_config = ModelConfig.from_pretrained(tiny_gemma3_dir)
    assert policy.eos_and_pad(tokenizer, model_config.eos_token_id) == ([GEMMA_EOS_ID, GEMMA_END_OF_TURN_ID], 0)
