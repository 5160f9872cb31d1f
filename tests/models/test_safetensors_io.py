"""Hugging Face checkpoint load/save: the name table against transformers' files, bit-exact round trips,
transformers reading what rubric_jax writes, loading straight into sharded meshes, atomic writes, bad input.

The tiny checkpoints (float32, unit-scale random weights) come from conftest.py.
"""

import contextlib
import json
import shutil
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from jax.sharding import NamedSharding
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from rubric_jax.models import safetensors_io
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.decoder import Decoder
from rubric_jax.models.safetensors_io import hf_name_table, load_hf_checkpoint, save_hf_checkpoint
from rubric_jax.models.sharding import make_mesh, param_partition_spec, partition_rules

MODEL_FIXTURES = ["tiny_qwen3_dir", "tiny_qwen3_untied_dir", "tiny_qwen2_dir", "tiny_qwen2_untied_dir",
                  "tiny_llama_dir", "tiny_qwen3_moe_dir", "tiny_gemma3_dir"]
TOKENS = np.array([[5, 17, 250, 3, 99, 300, 7, 64], [1, 2, 3, 4, 5, 6, 7, 8]])
# Per-parameter bytes of the fixtures run from 64 (a q_norm scale in float32) to 80 KiB (the embedding): 16 KiB
# shards give several files, some holding many small tensors, the embedding one of its own.
SMALL_SHARD_BYTES = 16 * 1024


@pytest.fixture(params=MODEL_FIXTURES)
def model_dir(request):
    return request.getfixturevalue(request.param)


def _file_tensors(directory) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint directory (single file or sharded), by HF name."""
    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def _file_dtypes(directory) -> dict[str, str]:
    dtypes = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(file, framework="numpy") as f:
            dtypes.update({name: f.get_slice(name).get_dtype() for name in f.keys()})
    return dtypes


def _params(model) -> dict[tuple, jax.Array]:
    return {path: var.get_value() for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _assert_params_equal(a, b) -> None:
    params_a, params_b = _params(a), _params(b)
    assert params_a.keys() == params_b.keys()
    for path in params_a:
        assert params_a[path].dtype == params_b[path].dtype, path
        np.testing.assert_array_equal(np.asarray(params_a[path]), np.asarray(params_b[path]), err_msg=str(path))


def _torch_logits(directory) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.tensor(TOKENS)).logits.numpy()


def _copy_checkpoint(source, destination, *, tensors=None, config_changes=None):
    """A copy of `source` (config.json and model.safetensors) with the tensors and config keys replaced."""
    destination.mkdir()
    config = {**json.loads((source / "config.json").read_text()), **(config_changes or {})}
    (destination / "config.json").write_text(json.dumps(config))
    save_file(_file_tensors(source) if tensors is None else tensors, destination / "model.safetensors",
              metadata={"format": "pt"})
    return destination


# ------------------------------------------------------------------------------------------ the name table


def test_name_table_covers_exactly_what_transformers_saves(model_dir):
    config = ModelConfig.from_pretrained(model_dir)
    table = hf_name_table(config)
    model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    params = _params(model)
    saved = _file_tensors(model_dir)
    assert table.keys() == saved.keys()
    for name, (path, transpose, expert) in table.items():
        expected = saved[name].shape[::-1] if transpose else saved[name].shape
        assert params[path].shape[0 if expert is None else 1:] == expected, name
    assert {entry.path for entry in table.values()} == params.keys()


# -------------------------------------------------------------------------------------------------- load


def test_load_gives_the_file_tensors_bit_exact(model_dir):
    model = load_hf_checkpoint(model_dir)
    params = _params(model)
    for name, tensor in _file_tensors(model_dir).items():
        path, transpose, expert = hf_name_table(model.config)[name]
        param = np.asarray(params[path]) if expert is None else np.asarray(params[path])[expert]
        np.testing.assert_array_equal(param, tensor.T if transpose else tensor, err_msg=name)
        assert params[path].dtype == jnp.float32


def test_load_casts_to_param_dtype_and_passes_decoder_options(tiny_qwen3_dir):
    model = load_hf_checkpoint(tiny_qwen3_dir, param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)
    embedding = model.embed_tokens.embedding.get_value()
    assert embedding.dtype == jnp.bfloat16 and model.dtype == jnp.bfloat16
    expected = _file_tensors(tiny_qwen3_dir)["model.embed_tokens.weight"].astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(np.asarray(embedding), expected)


@pytest.mark.parametrize(
    "axes", [dict(fsdp=8), dict(tensor=2, fsdp=4), dict(data=2, fsdp=2, tensor=2)], ids=["fsdp", "tp", "mixed"]
)
def test_load_into_a_mesh_places_every_parameter_with_its_rule(tiny_llama_dir, axes):
    mesh = make_mesh(**axes)
    model = load_hf_checkpoint(tiny_llama_dir, mesh=mesh)
    reference = _params(load_hf_checkpoint(tiny_llama_dir))
    rules = partition_rules(model.config)
    for path, array in _params(model).items():
        spec = param_partition_spec(".".join(map(str, path)), array.shape, rules, dict(mesh.shape))
        assert array.sharding == NamedSharding(mesh, spec), path
        np.testing.assert_array_equal(np.asarray(array), np.asarray(reference[path]), err_msg=str(path))
    # The layouts are real splits, not replication: each device holds its share of the q projection.
    q_kernel = model.layers[0].self_attn.q_proj.kernel.get_value()
    split = axes.get("fsdp", 1) * axes.get("tensor", 1)
    assert q_kernel.addressable_shards[0].data.size == q_kernel.size // split


def test_loading_into_a_mesh_reads_only_each_devices_slice(tiny_llama_dir, monkeypatch):
    """The memory claim: with a sharded layout no tensor is read whole, and devices sharing a slice share a read."""
    reads = []

    class RecordingSlice:
        def __init__(self, name, slice_):
            self.name, self.slice_ = name, slice_

        def get_shape(self):
            return self.slice_.get_shape()

        def __getitem__(self, index):
            block = self.slice_[index]
            reads.append((self.name, block.size))
            return block

    @contextlib.contextmanager
    def recording_safe_open(*args, **kwargs):
        with safe_open(*args, **kwargs) as reader:
            yield SimpleNamespace(keys=reader.keys, get_slice=lambda name: RecordingSlice(name, reader.get_slice(name)))

    monkeypatch.setattr(safetensors_io, "safe_open", recording_safe_open)
    load_hf_checkpoint(tiny_llama_dir, mesh=make_mesh(fsdp=8))
    sizes = {name: t.size for name, t in _file_tensors(tiny_llama_dir).items()}
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    assert [size for name, size in reads if name == q_proj] == [sizes[q_proj] // 8] * 8
    # Norm scales are replicated: one whole read serves all eight devices.
    assert [size for name, size in reads if name == "model.norm.weight"] == [sizes["model.norm.weight"]]


def test_tied_lm_head_and_rotary_buffers_in_the_file_are_ignored(tiny_qwen3_dir, tmp_path):
    tensors = _file_tensors(tiny_qwen3_dir)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] + 1  # transformers ties: the copy is unused
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)
    directory = _copy_checkpoint(tiny_qwen3_dir, tmp_path / "ckpt", tensors=tensors)
    _assert_params_equal(load_hf_checkpoint(directory), load_hf_checkpoint(tiny_qwen3_dir))


# ------------------------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("max_shard_bytes", [None, SMALL_SHARD_BYTES], ids=["single", "sharded"])
def test_save_then_load_is_bit_exact(tiny_llama_dir, tmp_path, param_dtype, max_shard_bytes):
    model = load_hf_checkpoint(tiny_llama_dir, param_dtype=param_dtype)
    save_hf_checkpoint(model, tmp_path / "out", max_shard_bytes=max_shard_bytes)
    _assert_params_equal(load_hf_checkpoint(tmp_path / "out", param_dtype=param_dtype), model)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    dtype_name = np.dtype(param_dtype).name
    assert config["dtype"] == config["torch_dtype"] == dtype_name
    assert set(_file_dtypes(tmp_path / "out").values()) == {"BF16" if param_dtype == jnp.bfloat16 else "F32"}
    assert ModelConfig.from_hf_dict(config) == model.config


def test_sharded_save_writes_a_consistent_index(tiny_llama_dir, tmp_path):
    model = load_hf_checkpoint(tiny_llama_dir)
    save_hf_checkpoint(model, tmp_path / "out", max_shard_bytes=SMALL_SHARD_BYTES)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and not (tmp_path / "out" / "model.safetensors").exists()
    assert files == [f"model-{k:05d}-of-{len(files):05d}.safetensors" for k in range(1, len(files) + 1)]
    assert index["weight_map"].keys() == hf_name_table(model.config).keys()
    saved = {}
    for file in files:
        tensors = load_file(tmp_path / "out" / file)
        assert all(index["weight_map"][name] == file for name in tensors)
        assert sum(t.nbytes for t in tensors.values()) <= SMALL_SHARD_BYTES or len(tensors) == 1
        saved.update(tensors)
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in saved.values())


@pytest.mark.parametrize("max_shard_bytes", [None, SMALL_SHARD_BYTES], ids=["single", "sharded"])
def test_a_resaved_checkpoint_is_what_transformers_wrote(model_dir, tmp_path, max_shard_bytes):
    """Same tensor names, shapes, dtypes and values as transformers' own files, and transformers loads it to
    the same logits: the contract SGLang's /update_weights_from_disk relies on."""
    save_hf_checkpoint(load_hf_checkpoint(model_dir), tmp_path / "out", max_shard_bytes=max_shard_bytes)
    original, resaved = _file_tensors(model_dir), _file_tensors(tmp_path / "out")
    assert resaved.keys() == original.keys()
    for file in (tmp_path / "out").glob("*.safetensors"):
        with safe_open(file, framework="numpy") as f:
            assert f.metadata() == {"format": "pt"}  # what transformers writes, and checks on load
    for name in original:
        assert resaved[name].dtype == original[name].dtype, name
        np.testing.assert_array_equal(resaved[name], original[name], err_msg=name)
    np.testing.assert_allclose(_torch_logits(tmp_path / "out"), _torch_logits(model_dir), atol=1e-5, rtol=0)


def test_save_in_bfloat16_loads_in_transformers_as_bfloat16(tiny_qwen3_dir, tmp_path):
    save_hf_checkpoint(load_hf_checkpoint(tiny_qwen3_dir), tmp_path / "out", dtype=jnp.bfloat16)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype="auto")
    assert hf.dtype == torch.bfloat16
    embedding = hf.get_input_embeddings().weight.detach().float().numpy()
    expected = _file_tensors(tiny_qwen3_dir)["model.embed_tokens.weight"].astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(embedding, expected.astype(np.float32))
    # And back into float32 parameters: bfloat16 widens exactly.
    reloaded = load_hf_checkpoint(tmp_path / "out").embed_tokens.embedding.get_value()
    np.testing.assert_array_equal(np.asarray(reloaded), expected.astype(np.float32))


def test_save_from_a_mesh_gathers_each_parameter(tiny_qwen3_untied_dir, tmp_path):
    model = load_hf_checkpoint(tiny_qwen3_untied_dir, mesh=make_mesh(fsdp=4, tensor=2))
    save_hf_checkpoint(model, tmp_path / "out")
    _assert_params_equal(load_hf_checkpoint(tmp_path / "out"), load_hf_checkpoint(tiny_qwen3_untied_dir))


def test_save_copies_the_tokenizer(tiny_qwen3_dir, tmp_path):
    save_hf_checkpoint(load_hf_checkpoint(tiny_qwen3_dir), tmp_path / "out", tokenizer_dir=tiny_qwen3_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "out" / name).read_bytes() == (tiny_qwen3_dir / name).read_bytes()
    original = transformers.AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    copied = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    text = "### Step 1: what is two plus two?"
    assert copied(text)["input_ids"] == original(text)["input_ids"]


# ------------------------------------------------------------------------------------------ atomic writes


def test_save_replaces_an_existing_directory_only_when_told_to(tiny_qwen3_dir, tmp_path):
    """Including the directory the model and the tokenizer are read from, as a trainer saving in place does."""
    shutil.copytree(tiny_qwen3_dir, tmp_path / "out")
    (tmp_path / "out" / "stale.txt").write_text("old")
    model = load_hf_checkpoint(tmp_path / "out")
    with pytest.raises(FileExistsError, match="overwrite"):
        save_hf_checkpoint(model, tmp_path / "out")
    save_hf_checkpoint(model, tmp_path / "out", overwrite=True, tokenizer_dir=tmp_path / "out")
    assert not (tmp_path / "out" / "stale.txt").exists()
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (tiny_qwen3_dir / "tokenizer.json").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    _assert_params_equal(load_hf_checkpoint(tmp_path / "out"), load_hf_checkpoint(tiny_qwen3_dir))


def test_a_save_that_fails_midway_leaves_the_old_checkpoint_whole(tiny_qwen3_dir, tmp_path, monkeypatch):
    model = load_hf_checkpoint(tiny_qwen3_dir)
    shutil.copytree(tiny_qwen3_dir, tmp_path / "out")
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    host_tensor, calls = safetensors_io._host_tensor, []

    def fail_on_the_fifth_tensor(*args):
        calls.append(args)
        if len(calls) == 5:
            raise OSError("disk full")
        return host_tensor(*args)

    monkeypatch.setattr(safetensors_io, "_host_tensor", fail_on_the_fifth_tensor)
    with pytest.raises(OSError, match="disk full"):
        save_hf_checkpoint(model, tmp_path / "out", overwrite=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging directory left behind


# ---------------------------------------------------------------------------------------------- bad input


def test_a_missing_tensor_is_a_value_error_naming_it(tiny_qwen3_dir, tmp_path):
    tensors = _file_tensors(tiny_qwen3_dir)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    directory = _copy_checkpoint(tiny_qwen3_dir, tmp_path / "ckpt", tensors=tensors)
    with pytest.raises(ValueError, match=r"missing tensors 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_hf_checkpoint(directory)


def test_an_unexpected_tensor_is_a_value_error_naming_it(tiny_llama_dir, tmp_path):
    tensors = {**_file_tensors(tiny_llama_dir), "model.layers.0.mlp.gate_proj.bias": np.zeros(128, np.float32)}
    directory = _copy_checkpoint(tiny_llama_dir, tmp_path / "ckpt", tensors=tensors)
    with pytest.raises(ValueError, match=r"unexpected tensors 'model\.layers\.0\.mlp\.gate_proj\.bias'"):
        load_hf_checkpoint(directory)


def test_a_qwen2_checkpoint_without_its_biases_or_with_an_o_proj_bias_is_a_value_error(tiny_qwen2_dir, tmp_path):
    tensors = _file_tensors(tiny_qwen2_dir)
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    directory = _copy_checkpoint(tiny_qwen2_dir, tmp_path / "missing", tensors=tensors)
    with pytest.raises(ValueError, match=r"missing tensors 'model\.layers\.1\.self_attn\.k_proj\.bias'"):
        load_hf_checkpoint(directory)
    tensors = {**_file_tensors(tiny_qwen2_dir), "model.layers.0.self_attn.o_proj.bias": np.zeros(64, np.float32)}
    directory = _copy_checkpoint(tiny_qwen2_dir, tmp_path / "extra", tensors=tensors)
    with pytest.raises(ValueError, match=r"unexpected tensors 'model\.layers\.0\.self_attn\.o_proj\.bias'"):
        load_hf_checkpoint(directory)


def test_a_shape_disagreeing_with_the_config_is_a_value_error_naming_the_tensor(tiny_qwen3_dir, tmp_path):
    directory = _copy_checkpoint(tiny_qwen3_dir, tmp_path / "ckpt", config_changes={"intermediate_size": 96})
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.mlp\.\w+_proj\.weight' .* shape \(\d+, \d+\)"):
        load_hf_checkpoint(directory)


@pytest.mark.parametrize(
    "change, named",
    [({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "gpt2"),
     ({"architectures": ["Qwen3ForSequenceClassification"]}, "Qwen3ForSequenceClassification")],
)
def test_an_unsupported_architecture_is_a_value_error_naming_it(tiny_qwen3_dir, tmp_path, change, named):
    directory = _copy_checkpoint(tiny_qwen3_dir, tmp_path / "ckpt", config_changes=change)
    with pytest.raises(ValueError, match=named):
        load_hf_checkpoint(directory)


def test_a_directory_without_weights_is_a_file_not_found_error(tiny_qwen3_dir, tmp_path):
    (tmp_path / "config.json").write_bytes((tiny_qwen3_dir / "config.json").read_bytes())
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf_checkpoint(tmp_path)
