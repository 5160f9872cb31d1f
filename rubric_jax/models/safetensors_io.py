"""Hugging Face safetensors checkpoints <-> `Decoder`: load a local model directory straight into (sharded)
parameters, and save a model back in the layout transformers and SGLang read.

Conventions:
- `hf_name_table(config)` is the one mapping between Hugging Face tensor names and the Decoder's NNX state paths
  (the contract in `rubric_jax/models/__init__.py`); load and save both use it. A torch Linear weight is
  [out, in] and an NNX kernel [in, out], so those entries are transposes; embeddings, norms and biases are not.
- Files: a single `model.safetensors`, or shards `model-00001-of-0000N.safetensors` with
  `model.safetensors.index.json` ({"metadata": {"total_size": bytes, ...}, "weight_map": {name: file}}), the
  names transformers' `save_pretrained` uses. The safetensors metadata is {"format": "pt"}, which
  transformers requires.
- Tied embeddings (`tie_word_embeddings`): no `lm_head.weight` is saved, and one found on load is ignored, as
  transformers does (the embedding is the unembedding).
- A multimodal checkpoint (`ModelConfig.language_model`: Gemma 3 4B and up) loads as its language model: its
  tensors are named `model.language_model.*` (what transformers 5 writes) or `language_model.model.*` (the
  published files), read as the text model's `model.*`; the vision tower and the projector are left unread. It
  saves as the text model (`Gemma3ForCausalLM`), which transformers and SGLang load with the same tokenizer.

Host memory (the host never holds two copies of the model, nor one whole copy):
- Load builds the Decoder abstractly (`nnx.eval_shape`: shapes only, no random init) and creates each
  parameter with `jax.make_array_from_callback`: the callback reads, from the memory-mapped file, only the slice
  one device holds (`safe_open(...).get_slice`), transposes and casts that slice, and the device copies it in.
  Devices holding the same slice share one read. Peak host use is one tensor's slices at a time.
- Save gathers one parameter at a time to the host (`jax.device_get`), converts it, writes it, and drops it
  before the next; the safetensors header is computed from shapes alone, so each file is streamed.
- Multi-process save of a model whose parameters span processes: only process 0 writes. A parameter sharded
  over devices of several processes is gathered with `multihost_utils.process_allgather`, a collective every
  process joins in the same (the table's) order: it is replicated on every device for the moment of the gather,
  one parameter at a time. The save ends with a barrier, so no process returns before the directory is in place.
- Save is atomic: everything is written to a sibling staging directory, fsynced, and renamed into place, so a
  crash leaves either the old checkpoint or the new one, never a half-written one.
"""

import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import shutil
import struct
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from safetensors import safe_open

from rubric_jax.models.config import ModelConfig
from rubric_jax.models.decoder import Decoder
from rubric_jax.models.sharding import PartitionRule, param_partition_spec, partition_rules
from rubric_jax.models.tokenizer import tokenizer_files

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"

NnxPath = tuple[Union[str, int], ...]


class HfTensor(NamedTuple):
    """Where an HF tensor lives in the Decoder: its NNX state path, whether the HF tensor is the transpose of the
    NNX parameter (or of its slice), and, for a parameter stacked over experts ([E, ...], `decoder.Experts`), the
    expert whose slice [expert] it is (None: the whole parameter)."""

    path: NnxPath
    transpose: bool
    expert: Optional[int] = None


HfNameTable = dict[str, HfTensor]

_SAFETENSORS_DTYPES = {
    np.dtype(np.float64): "F64",
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
}

# Tensors some published checkpoints carry that hold no parameter of ours: old Llama exports saved RoPE's
# inverse frequencies as a buffer (the decoder computes them from the config).
_IGNORED_TENSORS = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")
# A multimodal checkpoint's language model, in either layout, and what is not the language model.
_LANGUAGE_MODEL_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                            ("language_model.lm_head.", "lm_head."))
_NOT_LANGUAGE_MODEL = re.compile(r"^(model\.)?(vision_tower|multi_modal_projector)\.")


def hf_name_table(config: ModelConfig) -> HfNameTable:
    """Every HF tensor of a `config` model, in transformers' state-dict order, mapped to its place in the Decoder
    (`HfTensor`: NNX state path, whether it is stored transposed ([out, in] in the file, [in, out] in the
    Decoder), and a stacked expert parameter's expert). Experts are stored one tensor per expert and projection,
    as the published Qwen3-MoE checkpoints are (transformers fuses them only in memory)."""
    table: HfNameTable = {"model.embed_tokens.weight": HfTensor(("embed_tokens", "embedding"), False)}
    for i in range(config.num_layers):
        hf, path = f"model.layers.{i}", ("layers", i)
        for proj, bias in (("q_proj", config.qkv_bias), ("k_proj", config.qkv_bias), ("v_proj", config.qkv_bias),
                           ("o_proj", config.o_proj_bias)):
            table[f"{hf}.self_attn.{proj}.weight"] = HfTensor(path + ("self_attn", proj, "kernel"), True)
            if bias:
                table[f"{hf}.self_attn.{proj}.bias"] = HfTensor(path + ("self_attn", proj, "bias"), False)
        if config.qk_norm:
            for norm in ("q_norm", "k_norm"):
                table[f"{hf}.self_attn.{norm}.weight"] = HfTensor(path + ("self_attn", norm, "scale"), False)
        if config.sparse_layer(i):
            table[f"{hf}.mlp.gate.weight"] = HfTensor(path + ("mlp", "gate", "kernel"), True)
            for j in range(config.num_experts):
                for proj, stacked in (("gate_proj", "gate_edf"), ("up_proj", "up_edf"), ("down_proj", "down_efd")):
                    table[f"{hf}.mlp.experts.{j}.{proj}.weight"] = HfTensor(path + ("mlp", "experts", stacked),
                                                                             True, j)
        else:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                table[f"{hf}.mlp.{proj}.weight"] = HfTensor(path + ("mlp", proj, "kernel"), True)
        norms = ("input_layernorm", "post_attention_layernorm") + \
            (("pre_feedforward_layernorm", "post_feedforward_layernorm") if config.gemma else ())
        for norm in norms:
            table[f"{hf}.{norm}.weight"] = HfTensor(path + (norm, "scale"), False)
    table["model.norm.weight"] = HfTensor(("norm", "scale"), False)
    if not config.tie_word_embeddings:
        table["lm_head.weight"] = HfTensor(("lm_head", "kernel"), True)
    return table


def _hf_shape(nnx_shape: Sequence[int], transpose: bool) -> tuple[int, ...]:
    return tuple(reversed(nnx_shape)) if transpose else tuple(nnx_shape)


def _check_table_covers(table: HfNameTable, params: Mapping[NnxPath, Any]) -> None:
    """The table and the Decoder's parameters must name the same paths: a parameter without an HF name would be
    silently left at its init on load and dropped on save."""
    table_paths = {entry.path for entry in table.values()}
    unnamed = sorted(map(str, set(params) - table_paths))
    absent = sorted(map(str, table_paths - set(params)))
    if unnamed or absent:
        raise RuntimeError(
            f"hf_name_table and the Decoder disagree: parameters without an HF name {unnamed}, "
            f"table paths the Decoder lacks {absent}"
        )


def _summary(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


# ----------------------------------------------------------------------------------------------------- load


@contextlib.contextmanager
def _open_tensors(directory: Path) -> Iterator[dict[str, Any]]:
    """{HF name: safetensors slice handle} over every file of the checkpoint, open for the block's duration.
    The names are those the files hold (the index only says which files to open)."""
    if (directory / INDEX_NAME).is_file():
        with open(directory / INDEX_NAME, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif (directory / WEIGHTS_NAME).is_file():
        files = [WEIGHTS_NAME]
    else:
        raise FileNotFoundError(f"no {WEIGHTS_NAME} or {INDEX_NAME} in {directory}")
    with contextlib.ExitStack() as stack:
        handles = {}
        for file in files:
            reader = stack.enter_context(safe_open(str(directory / file), framework="numpy"))
            handles.update({name: reader.get_slice(name) for name in reader.keys()})
        yield handles


def _language_model_tensors(handles: Mapping[str, Any]) -> dict[str, Any]:
    """A multimodal checkpoint's language-model tensors under the text model's names (module docstring)."""
    renamed = {}
    for name, handle in handles.items():
        if _NOT_LANGUAGE_MODEL.match(name):
            continue
        for prefix, text_prefix in _LANGUAGE_MODEL_PREFIXES:
            if name.startswith(prefix):
                name = text_prefix + name[len(prefix):]
                break
        renamed[name] = handle
    return renamed


def _is_ignorable(name: str, config: ModelConfig) -> bool:
    """A tensor a published checkpoint may carry without it being a parameter: see `_IGNORED_TENSORS`, and a
    tied model's `lm_head.weight` (transformers ties it to the embedding and ignores the stored copy)."""
    return bool(_IGNORED_TENSORS.match(name)) or (config.tie_word_embeddings and name == "lm_head.weight")


def _check_tensor_names(table: HfNameTable, names: Sequence[str], config: ModelConfig, directory: Path) -> None:
    missing = sorted(set(table) - set(names))
    if missing:
        raise ValueError(f"checkpoint {directory} is missing tensors {_summary(missing)}")
    extra = sorted(n for n in set(names) - set(table) if not _is_ignorable(n, config))
    if extra:
        raise ValueError(
            f"checkpoint {directory} has unexpected tensors {_summary(extra)}, which a {config.model_type} "
            f"model of this config.json does not have"
        )


BlockReader = Callable[[tuple[slice, ...]], np.ndarray]


def _tensor_reader(handle: Any, transpose: bool) -> BlockReader:
    """Reads the block `index` (in the NNX layout) of the tensor behind `handle`."""
    return lambda index: handle[index[::-1]].T if transpose else handle[index]


def _stacked_reader(handles: Sequence[Any], transpose: bool) -> BlockReader:
    """Reads the block `index` of a parameter stacked over experts ([E, ...]) from one tensor per expert."""
    readers = [_tensor_reader(handle, transpose) for handle in handles]
    return lambda index: np.stack([readers[e](index[1:]) for e in range(len(readers))[index[0]]])


def _read_sharded(read: BlockReader, shape: tuple[int, ...], dtype: Any, sharding: jax.sharding.Sharding
                  ) -> jax.Array:
    """The parameter `read` reads as a jax.Array of `shape` (the NNX layout), `dtype` and `sharding`. Each
    addressable device's slice is read from the files on its own (devices holding the same slice share one read),
    so the host holds at most this process's distinct slices of one parameter: the whole of it only when
    it is replicated."""
    blocks: dict[tuple, np.ndarray] = {}

    def read_block(index: tuple[slice, ...]) -> np.ndarray:
        key = tuple((s.start, s.stop, s.step) for s in index)
        if key not in blocks:
            blocks[key] = read(index).astype(dtype, copy=False)
        return blocks[key]

    return jax.make_array_from_callback(shape, sharding, read_block)


def _by_parameter(table: HfNameTable) -> dict[NnxPath, list[tuple[str, HfTensor]]]:
    """The table's entries grouped by NNX parameter, in table order (a stacked parameter's experts in order)."""
    grouped: dict[NnxPath, list[tuple[str, HfTensor]]] = {}
    for name, entry in table.items():
        grouped.setdefault(entry.path, []).append((name, entry))
    return grouped


def load_hf_checkpoint(
    directory: Union[str, os.PathLike],
    *,
    mesh: Optional[Mesh] = None,
    rules: Optional[Sequence[PartitionRule]] = None,
    param_dtype: Any = jnp.float32,
    **decoder_kwargs: Any,
) -> Decoder:
    """A Decoder with the weights of the local Hugging Face directory `directory` (config.json plus
    model.safetensors or a sharded index), every parameter cast to `param_dtype`.

    With `mesh`, each parameter is placed with the NamedSharding of `sharding.param_partition_spec` under
    `rules` (default `partition_rules(config)`); without, on the default device. `decoder_kwargs` (dtype,
    remat, shard_activations) go to the Decoder's constructor.

    Raises ValueError for an unsupported architecture (from `ModelConfig`), a missing or unexpected tensor,
    or a tensor whose shape disagrees with config.json; each message names the tensors.
    """
    directory = Path(directory)
    config = ModelConfig.from_pretrained(directory)
    table = hf_name_table(config)
    rules = partition_rules(config) if rules is None else rules
    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0), param_dtype=param_dtype, **decoder_kwargs))
    graphdef, abstract_state = nnx.split(abstract)
    variables = dict(nnx.to_flat_state(abstract_state))
    _check_table_covers(table, variables)
    with _open_tensors(directory) as handles:
        if config.language_model:
            handles = _language_model_tensors(handles)
        _check_tensor_names(table, list(handles), config, directory)
        for path, entries in _by_parameter(table).items():
            leaf = variables[path].get_value()
            transpose, stacked = entries[0][1].transpose, entries[0][1].expert is not None
            expected = _hf_shape(leaf.shape[1:] if stacked else leaf.shape, transpose)
            for name, _ in entries:
                file_shape = tuple(handles[name].get_shape())
                if file_shape != expected:
                    raise ValueError(
                        f"tensor {name!r} in {directory} has shape {file_shape}, but config.json implies {expected}")
            if mesh is None:
                sharding = SingleDeviceSharding(jax.local_devices()[0])
            else:
                spec = param_partition_spec(".".join(map(str, path)), leaf.shape, rules, dict(mesh.shape))
                sharding = NamedSharding(mesh, spec)
            read = _stacked_reader([handles[name] for name, _ in entries], transpose) if stacked else \
                _tensor_reader(handles[entries[0][0]], transpose)
            variables[path] = variables[path].replace(_read_sharded(read, leaf.shape, leaf.dtype, sharding))
    return nnx.merge(graphdef, nnx.from_flat_state(variables))


def check_model_directory(path: Union[str, os.PathLike], what: str = "model directory") -> None:
    """ValueError, naming `what` and `path`, unless `path` is a local Hugging Face model directory that
    `load_hf_checkpoint` and `tokenizer.load_tokenizer` load: config.json of a supported architecture
    (`ModelConfig`'s own checks), safetensors weights and tokenizer files. A launch checks this before any model is
    built, so that a wrong path is one line, not a traceback from deep in the load."""
    directory = Path(path)
    if not directory.is_dir():
        raise ValueError(f"{what} {path} " + ("is not a directory" if directory.exists() else "does not exist"))
    if not (directory / CONFIG_NAME).is_file():
        raise ValueError(f"{what} {path} is not a Hugging Face model directory: it has no {CONFIG_NAME}")
    try:
        ModelConfig.from_pretrained(directory)
    except ValueError as error:  # json's decode errors are ValueErrors too
        raise ValueError(f"{what} {path}: {CONFIG_NAME}: {error}") from None
    if not ((directory / WEIGHTS_NAME).is_file() or (directory / INDEX_NAME).is_file()):
        raise ValueError(f"{what} {path} has no weights: no {WEIGHTS_NAME} or {INDEX_NAME}")
    try:
        tokenizer_files(directory)
    except FileNotFoundError as error:
        raise ValueError(f"{what} {path}: {error}") from None


# ----------------------------------------------------------------------------------------------------- save


@dataclasses.dataclass(frozen=True)
class _TensorToWrite:
    """One HF tensor of a checkpoint being saved: its header entry, and how to produce its bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    fetch: Callable[[], np.ndarray]
    collective: bool = False  # spans processes: every process must call `fetch`

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def _host_tensor(array: jax.Array, transpose: bool, dtype: np.dtype, expert: Optional[int] = None) -> np.ndarray:
    """`array` (or its slice [expert]) gathered to this host in HF layout and `dtype`, C-contiguous. An array
    spanning several processes is gathered with `process_allgather`, a collective: every process must fetch it,
    in the same order."""
    if expert is not None:
        array = array[expert]
    if array.is_fully_addressable:
        host = np.asarray(jax.device_get(array))
    else:
        host = multihost_utils.process_allgather(array, tiled=True)
    return np.ascontiguousarray((host.T if transpose else host).astype(dtype, copy=False))


def _tensors_to_write(model: Decoder, dtype: Optional[Any]) -> list[_TensorToWrite]:
    table = hf_name_table(model.config)
    params = {path: var.get_value() for path, var in nnx.to_flat_state(nnx.state(model))}
    _check_table_covers(table, params)
    tensors = []
    for name, (path, transpose, expert) in table.items():
        array = params[path]
        np_dtype = np.dtype(dtype if dtype is not None else array.dtype)
        if np_dtype not in _SAFETENSORS_DTYPES:
            raise ValueError(f"cannot save tensor {name!r} as {np_dtype}; "
                             f"supported: {sorted(map(str, _SAFETENSORS_DTYPES))}")
        shape = array.shape if expert is None else array.shape[1:]
        fetch = functools.partial(_host_tensor, array, transpose, np_dtype, expert)
        tensors.append(_TensorToWrite(name, _hf_shape(shape, transpose), np_dtype, fetch,
                                      collective=not array.is_fully_addressable))
    return tensors


def _write_safetensors(path: Path, tensors: Sequence[_TensorToWrite]) -> None:
    """Streams `tensors` into a safetensors file: the header (8-byte little-endian length, then JSON padded with
    spaces to a multiple of 8 so the data is aligned) is known from shapes alone, then each tensor's bytes in
    order, fetched one at a time."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": _SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                          "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for t in tensors:
            data = t.fetch()
            if data.shape != t.shape or data.dtype != t.dtype:
                raise RuntimeError(f"tensor {t.name!r} came back as {data.shape} {data.dtype}, not {t.shape} {t.dtype}")
            f.write(data.reshape(-1).view(np.uint8).data)


def _split_into_shards(tensors: Sequence[_TensorToWrite], max_shard_bytes: Optional[int]) -> list[list[_TensorToWrite]]:
    """Consecutive groups of at most `max_shard_bytes` of tensor data (a larger tensor gets a shard of its own),
    as transformers splits; one group when `max_shard_bytes` is None."""
    if max_shard_bytes is None:
        return [list(tensors)]
    shards: list[list[_TensorToWrite]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


def _write_weights(directory: Path, tensors: Sequence[_TensorToWrite], max_shard_bytes: Optional[int]) -> None:
    shards = _split_into_shards(tensors, max_shard_bytes)
    if len(shards) == 1:
        _write_safetensors(directory / WEIGHTS_NAME, shards[0])
        return
    weight_map = {}
    for k, shard in enumerate(shards, start=1):
        file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        _write_safetensors(directory / file, shard)
        weight_map.update({t.name: file for t in shard})
    index = {
        "metadata": {
            "total_size": sum(t.nbytes for t in tensors),
            "total_parameters": sum(math.prod(t.shape) for t in tensors),
        },
        "weight_map": dict(sorted(weight_map.items())),
    }
    _write_json(directory / INDEX_NAME, index)


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def _config_dict(config: ModelConfig, tensors: Sequence[_TensorToWrite]) -> dict[str, Any]:
    """config.to_hf_dict() with the weights' dtype, under transformers 5's key ("dtype") and 4's ("torch_dtype"):
    SGLang's dtype="auto" serves the model in it."""
    hf = config.to_hf_dict()
    dtypes = {t.dtype.name for t in tensors}
    if len(dtypes) == 1:
        hf["dtype"] = hf["torch_dtype"] = dtypes.pop()
    return hf


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(directory: Path) -> None:
    """Flushes every file of `directory`, then its entries, to disk: the rename that publishes the directory
    must not reach the disk before the data it names."""
    for path in directory.iterdir():
        _fsync(path)
    _fsync(directory)


@contextlib.contextmanager
def _atomic_directory(directory: Path, overwrite: bool) -> Iterator[Path]:
    """Yields a staging directory beside `directory`; on success renames it to `directory` (replacing an
    existing one only if `overwrite`), on failure deletes it. Rename within one filesystem is atomic, so
    readers see the old checkpoint or the new one. Replacing takes two renames (old aside, new in): a crash
    between them leaves `directory` absent and the old checkpoint at `.<name>.old-<id>`, still not a torn one."""
    if directory.exists() and not overwrite:
        raise FileExistsError(f"{directory} exists; pass overwrite=True to replace it")
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.with_name(f".{directory.name}.tmp-{uuid.uuid4().hex}")
    staging.mkdir()
    try:
        yield staging
        _fsync_tree(staging)
        if directory.exists():
            retired = directory.with_name(f".{directory.name}.old-{uuid.uuid4().hex}")
            os.replace(directory, retired)
            os.replace(staging, directory)
            shutil.rmtree(retired)
        else:
            os.replace(staging, directory)
        _fsync(directory.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def save_hf_checkpoint(
    model: Decoder,
    directory: Union[str, os.PathLike],
    *,
    max_shard_bytes: Optional[int] = None,
    dtype: Optional[Any] = None,
    tokenizer_dir: Optional[Union[str, os.PathLike]] = None,
    overwrite: bool = False,
) -> None:
    """Writes `model` as a Hugging Face checkpoint in `directory`: config.json and the weights under their HF
    names, shapes (transposed back to [out, in]) and dtype (`dtype`, default each parameter's own), loadable by
    transformers' `from_pretrained` and SGLang's `/update_weights_from_disk`.

    `max_shard_bytes` splits the weights into shards with an index when they exceed it (one file otherwise).
    `tokenizer_dir` copies the tokenizer files found there (`tokenizer.TOKENIZER_FILES`). The write is atomic;
    an existing `directory` is replaced as a whole only with `overwrite=True` (FileExistsError otherwise).
    Parameters are gathered to the host one at a time.

    A model whose parameters span several processes (module docstring) is saved by all of them together: every
    process calls this with the same arguments, process 0 writes, the others take part in gathering, and all
    return once the directory is in place. A model on this process's devices alone is written by its caller.
    """
    tensors = _tensors_to_write(model, dtype)
    collective = any(tensor.collective for tensor in tensors)
    if not collective or jax.process_index() == 0:
        tokenizer_paths = tokenizer_files(tokenizer_dir) if tokenizer_dir is not None else []
        with _atomic_directory(Path(directory), overwrite) as staging:
            _write_weights(staging, tensors, max_shard_bytes)
            _write_json(staging / CONFIG_NAME, _config_dict(model.config, tensors))
            for source in tokenizer_paths:
                shutil.copyfile(source, staging / source.name)
    else:
        for tensor in tensors:
            if tensor.collective:
                tensor.fetch()
    if collective:
        multihost_utils.sync_global_devices(f"save_hf_checkpoint {directory}")
