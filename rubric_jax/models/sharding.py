"""The one place that maps parameters and activations to PartitionSpecs over a mesh with axes
(data, fsdp, expert, tensor).

Axes:
- "data": pure data parallelism; parameters are replicated over it, the batch is split over it.
- "fsdp": the batch is split over it too, and every large parameter is sharded over it along its model
  dimension D (ZeRO-3 style: XLA all-gathers a weight where it is used, reduce-scatters its gradient).
- "expert": the batch is split over it too, and a mixture of experts' stacked expert weights are sharded over it
  along their expert dimension E (Qwen3-MoE; other parameters are replicated over it, as over "data"). Under
  GSPMD a layer's experts are all-gathered where they are used, as "fsdp" gathers a weight: the axis divides the
  experts' parameter, gradient and optimizer memory, while every device still runs the grouped matmuls of its own
  tokens (no token all-to-all).
- "tensor": Megatron-style tensor parallelism; attention heads, MLP hidden units and the vocabulary are split
  over it, activations between blocks are replicated over it.
A mesh may give any axis size 1, so one rule set serves FSDP-only, TP-only and mixed meshes.

Parameter rules (regexes on the contract's dotted paths of `rubric_jax.models`, first match wins):
  embed_tokens.embedding [V, D]        (tensor, fsdp)
  self_attn.{q,k,v}_proj.kernel [D, H*hd]  (fsdp, tensor)      bias [H*hd]  (tensor,)
  self_attn.o_proj.kernel [H*hd, D]    (tensor, fsdp)          bias [D]     replicated
  mlp.{gate,up}_proj.kernel [D, F]     (fsdp, tensor)
  mlp.down_proj.kernel [F, D]          (tensor, fsdp)
  mlp.gate.kernel [D, E]               (fsdp, None)           the Qwen3-MoE router
  mlp.experts.{gate,up}_edf [E, D, F]  (expert, fsdp, tensor) mlp.experts.down_efd [E, F, D]  (expert, tensor, fsdp)
  *norm.scale                          replicated
  lm_head.kernel [D, V]                (fsdp, tensor)
  value_head.kernel [D, 1]             (fsdp, None)            bias [1]     replicated   (a critic, `models.value`)
A path matches by `re.search`, so an optimizer state's moments, whose paths end in their parameter's path,
get their parameter's layout; a leaf no rule matches (Adam's step count) is replicated.

Fallback: a mesh axis is kept on a dimension only if it divides it; otherwise that dimension is replicated
over that axis (for a dimension split over several axes, the longest dividing prefix of them is kept). For
attention projections the unit is a head, not an element: "tensor" must divide the number of heads (q) or
of KV heads (k, v), so a head is never split across devices (`partition_rules` reads head_dim from the config).
Replicating never changes results, only memory and communication.

Activations use logical axis names (`LOGICAL_AXES`), mapped with the same divisibility fallback and
constrained by `shard_activations`, the Decoder's hook; it is a no-op outside a mesh context
(`jax.set_mesh`), so single-device code and tests pay nothing.

Multi-host: every sharding here is a NamedSharding over the global mesh (all processes' devices), so
`jax.make_array_from_callback(shape, sharding, read_slice)` builds a parameter on any number of hosts, each
reading only its own slices; `global_batch` assembles each process's rows into one batch
(`jax.make_array_from_process_local_data`) and `process_rows` gives a process its rows of a result back.
"""

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from rubric_jax.models.config import ModelConfig

MESH_AXES = ("data", "fsdp", "expert", "tensor")
BATCH_AXES = ("data", "fsdp", "expert")

# A dimension's mesh axes: one axis name, a tuple of names (split over their product), or None (replicated).
AxisSpec = str | tuple[str, ...] | None


@dataclasses.dataclass(frozen=True)
class PartitionRule:
    """Parameters whose dotted path matches `pattern` (re.search) get `spec`, one entry per dimension.

    `units[i]` is the size of the indivisible block along dimension i (a head's head_dim for attention
    projections, else 1): a mesh axis must divide shape[i] // units[i] to be kept on that dimension.
    """

    pattern: str
    spec: tuple[AxisSpec, ...]
    units: tuple[int, ...] | None = None


def partition_rules(config: ModelConfig | None = None) -> tuple[PartitionRule, ...]:
    """The parameter rules of the module docstring. With a `ModelConfig`, its head_dim makes whole heads the
    unit of tensor-parallel splits of the attention projections; without one, single elements are (only
    for callers that know no config: it may split a head across devices, which is correct but slower)."""
    head = 1 if config is None else config.head_dim
    return (
        PartitionRule(r"embed_tokens\.embedding$", ("tensor", "fsdp")),
        PartitionRule(r"self_attn\.[qkv]_proj\.kernel$", ("fsdp", "tensor"), (1, head)),
        PartitionRule(r"self_attn\.[qkv]_proj\.bias$", ("tensor",), (head,)),
        PartitionRule(r"self_attn\.o_proj\.kernel$", ("tensor", "fsdp"), (head, 1)),
        PartitionRule(r"self_attn\.o_proj\.bias$", (None,)),
        PartitionRule(r"mlp\.(gate|up)_proj\.kernel$", ("fsdp", "tensor")),
        PartitionRule(r"mlp\.down_proj\.kernel$", ("tensor", "fsdp")),
        # Qwen3-MoE: the router [D, E] like a kernel's input side; the experts' stacked [E, D, F] / [E, F, D] over
        # "expert", each expert split like the dense MLP's kernels.
        PartitionRule(r"mlp\.gate\.kernel$", ("fsdp", None)),
        PartitionRule(r"mlp\.experts\.(gate|up)_edf$", ("expert", "fsdp", "tensor")),
        PartitionRule(r"mlp\.experts\.down_efd$", ("expert", "tensor", "fsdp")),
        PartitionRule(r"norm\.scale$", (None,)),
        PartitionRule(r"lm_head\.kernel$", ("fsdp", "tensor")),
        PartitionRule(r"value_head\.kernel$", ("fsdp", None)),
        PartitionRule(r"value_head\.bias$", (None,)),
    )


# Activation logical axes: the decoder's residual stream (batch, seq, embed) and the logprob chunks' logits
# (batch, seq, vocab). "embed" (D) is replicated over "tensor": TP splits heads and MLP units inside a block
# and all-reduces back to full D, so the residual stream stays whole and the logit matmul needs no all-reduce
# over D. "vocab" is split like the unembedding's V.
LOGICAL_AXES: Mapping[str, AxisSpec] = {"batch": BATCH_AXES, "seq": None, "embed": None, "vocab": "tensor"}


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None, *,
              expert: int = 1) -> Mesh:
    """A (data, fsdp, expert, tensor) mesh over `devices` (default: all devices of all processes).

    data * fsdp * expert * tensor must equal the number of devices. Axes are `AxisType.Auto`: XLA propagates
    shardings from the parameters, inputs and `shard_activations` constraints (GSPMD), as the decoder expects.
    `jax.make_mesh` orders devices so that "tensor", the innermost axis, stays within fast interconnect.
    """
    devices = jax.devices() if devices is None else list(devices)
    sizes = (data, fsdp, expert, tensor)
    if int(np.prod(sizes)) != len(devices):
        named = " x ".join(f"{name}={size}" for name, size in zip(MESH_AXES, sizes))
        raise ValueError(f"mesh {named} needs {int(np.prod(sizes))} devices, got {len(devices)}")
    return jax.make_mesh(sizes, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def decode_mesh(devices: Sequence[jax.Device], num_kv_heads: int, tensor: int | None = None) -> Mesh:
    """The rollout engine's layout over `devices` (every process's, grouped by process): a (data, fsdp, expert,
    tensor) mesh with fsdp and expert 1, "tensor" within a process, `tensor` devices wide (None: the most that
    divide both a process's devices and the key/value heads, so a head is never split), "data" across the rest.
    Decoding reads every weight once per step, so splitting the weights over a host's chips divides each chip's
    reads; rows split over "data". ValueError when `tensor` does not divide a process's devices or the key/value
    heads."""
    devices = sorted(devices, key=lambda device: (device.process_index, device.id))
    per_process = sum(device.process_index == devices[0].process_index for device in devices)
    if tensor is None:
        tensor = max(t for t in range(1, per_process + 1) if per_process % t == 0 and num_kv_heads % t == 0)
    if per_process % tensor or num_kv_heads % tensor:
        raise ValueError(f"rollout.tensor_parallel={tensor} must divide each process's {per_process} devices and the "
                         f"model's {num_kv_heads} key/value heads")
    return Mesh(np.array(devices).reshape(len(devices) // tensor, 1, 1, tensor), MESH_AXES,
                axis_types=(AxisType.Auto,) * len(MESH_AXES))


def process_submesh(mesh: Mesh) -> Mesh:
    """This process's rows of `mesh` (a `decode_mesh`, whose "tensor" groups lie within processes), as a mesh of
    its own: the devices this process decodes on, by itself."""
    rows = [row for row in mesh.devices if row.flat[0].process_index == jax.process_index()]
    return Mesh(np.array(rows), mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def _fitting_axes(axes: AxisSpec, units: int, axis_sizes: Mapping[str, int]) -> AxisSpec:
    """The longest prefix of `axes` (present in the mesh) whose total size divides `units`; None if empty."""
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    kept, product = [], 1
    for name in names:
        if name not in axis_sizes or units % (product * axis_sizes[name]):
            break
        kept.append(name)
        product *= axis_sizes[name]
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else tuple(kept)


def fit_spec(
    spec: Sequence[AxisSpec], shape: Sequence[int], axis_sizes: Mapping[str, int], units: Sequence[int] | None = None
) -> PartitionSpec:
    """`spec` with every dimension's axes cut back to what divides it (see the module docstring's fallback)."""
    units = units or (1,) * len(shape)
    return PartitionSpec(*(_fitting_axes(a, n // u, axis_sizes) for a, n, u in zip(spec, shape, units)))


def path_str(path: Sequence[Any]) -> str:
    """A pytree key path as the contract's dotted path: ('layers', 0, 'mlp', ...) -> 'layers.0.mlp...'.
    nnx.Variable's own `.value` key is dropped."""
    names = []
    for key in path:
        if isinstance(key, jax.tree_util.GetAttrKey) and key.name == "value":
            continue
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                names.append(str(getattr(key, attr)))
                break
        else:
            names.append(str(key))
    return ".".join(names)


def param_partition_spec(
    path: str | Sequence[Any], shape: Sequence[int], rules: Sequence[PartitionRule], axis_sizes: Mapping[str, int]
) -> PartitionSpec:
    """PartitionSpec of a parameter (or of a leaf whose path ends in one) of this shape on a mesh of
    `axis_sizes` ({name: size}). `path` is dotted ('layers.0.mlp.up_proj.kernel') or a pytree key path.
    The first rule whose pattern matches and whose rank equals the leaf's applies; none: replicated."""
    path = path if isinstance(path, str) else path_str(path)
    for rule in rules:
        if len(rule.spec) == len(shape) and re.search(rule.pattern, path):
            return fit_spec(rule.spec, shape, axis_sizes, rule.units)
    return PartitionSpec()


def param_shardings(abstract_state: Any, mesh: Mesh, rules: Sequence[PartitionRule] | None = None) -> Any:
    """A pytree of NamedSharding matching `abstract_state` (nnx.State, optimizer state, or any pytree of
    arrays / ShapeDtypeStructs, e.g. from `jax.eval_shape`), for `jax.jit` in/out_shardings,
    `jax.device_put` or `jax.make_array_from_callback`. Pass `partition_rules(config)` (the default,
    `partition_rules()`, does not know head_dim), and the same rules everywhere one model's layout is built."""
    rules = partition_rules() if rules is None else rules
    axis_sizes = dict(mesh.shape)
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: NamedSharding(mesh, param_partition_spec(path, np.shape(leaf), rules, axis_sizes)),
        abstract_state,
    )


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows over (data, fsdp, expert), everything else replicated: the layout of every [B, ...] input of a step."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def _check_rows_split(sharding: NamedSharding) -> None:
    """ValueError unless the processes hold disjoint, equal shares of a batch's rows under `sharding`: a batch
    axis, not "tensor", must run across processes (each process's devices then cover batch_shards / processes
    distinct row blocks)."""
    blocks = int(np.prod([sharding.mesh.shape[axis] for axis in BATCH_AXES]))
    local = {index[0].start for index in sharding.addressable_devices_indices_map((blocks,)).values()}
    if len(local) * jax.process_count() != blocks:
        raise ValueError(
            f"mesh {dict(sharding.mesh.shape)} gives this process {len(local)} of {blocks} batch shards over "
            f"{jax.process_count()} processes: data * fsdp * expert must split evenly among the processes"
        )


def global_batch(local_batch: Mapping[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
    """Every process's rows as one global batch laid out by `batch_sharding(mesh)`: with n rows per process
    (the same n everywhere), a process's rows are the block of n global rows its devices hold, process k's the
    k-th on a mesh whose devices are in process order (`jax.make_array_from_process_local_data`). One process:
    its batch, placed. Each process calls this with its own rows; ValueError when the mesh does not split the
    rows among the processes (`_check_rows_split`)."""
    sharding = batch_sharding(mesh)
    _check_rows_split(sharding)
    return {key: jax.make_array_from_process_local_data(sharding, np.asarray(value))
            for key, value in local_batch.items()}


def process_rows(array: jax.Array, mesh: Mesh) -> np.ndarray:
    """This process's rows of a global [B, ...] array laid out by `batch_sharding(mesh)`, on the host: the
    inverse of `global_batch`."""
    return np.asarray(multihost_utils.global_array_to_host_local_array(array, mesh, PartitionSpec(BATCH_AXES)))


def logical_to_mesh(
    logical_axes: Sequence[str | None], shape: Sequence[int], axis_sizes: Mapping[str, int]
) -> PartitionSpec:
    """PartitionSpec of an activation whose dimensions are named `logical_axes` (keys of `LOGICAL_AXES`, or
    None for replicated), with the divisibility fallback. An unknown name raises KeyError."""
    return fit_spec([LOGICAL_AXES[a] if a is not None else None for a in logical_axes], shape, axis_sizes)


def shard_activations(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """`jax.lax.with_sharding_constraint` of `x` to its logical axes on the current mesh (`jax.set_mesh`);
    `x` unchanged outside a mesh context. The Decoder's activation-sharding hook."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_mesh(logical_axes, x.shape, dict(mesh.shape)))
