"""`rubric-jax plan`: a run's learner compiled ahead of time for a TPU topology, on any host (libtpu installed).

`jax.experimental.topologies.get_topology_desc` describes the chips of a topology such as "v5p:4x4x4" without them
being attached; the learner's own jitted functions (`train_step.make_train_step` and `make_logprobs_fn`, built as
`training.rl` builds them: the recipe's loss and aggregation, micro-batches, chunk size, the mesh and partition
rules, the policy's attention kernel and remat) are lowered on `jax.ShapeDtypeStruct`s sharded over a mesh of
those chips and compiled by XLA's TPU compiler. The model is `nnx.eval_shape`d: no weights are read.

Conventions:
- One train step is one optimizer update: a mini-batch of prompts_per_step * group_size / mini_batches rows of
  T = prompt_tokens + rollout.max_new_tokens tokens. The logprob function runs over all the step's rows. Rows a
  recipe adds for a second role (a rubricator's, a generator's) are not counted.
- Bytes are per chip (`compiled.memory_analysis()`): arguments, temporaries, outputs, and their total, peak HBM
  use, counting a donated argument once (outputs aliased to it are not new memory). A step fits when its total
  is at most the chip's HBM.
- FLOPs: XLA's count (`compiled.cost_analysis()`, per chip) times the chips and the micro-batches (XLA counts a
  loop body once). The model's FLOPs are 6 * N * tokens (forward and backward, N the parameter count, attention
  not counted). The step's FLOPs are the larger of the two (XLA's count misses the splash kernel and counts the
  logits' chunk loop once); the step time's lower bound is those at the chips' peak bf16 rate, the MFU ceiling
  the model's FLOPs over them (what remat and attention add lowers it).
"""

import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from rubric_jax.algorithms.registry import algorithm_class
from rubric_jax.models import attention, sharding, train_step
from rubric_jax.models.config import ModelConfig, preset_config
from rubric_jax.models.decoder import Decoder
from rubric_jax.training import policy
from rubric_jax.training.optim import make_optimizer
from rubric_jax.training.run_config import RLConfig, resolve_algorithm

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    """A TPU generation: HBM per chip, peak dense bf16 FLOP/s per chip, and whether its two TensorCores act as
    one device (megacore)."""

    hbm_bytes: int
    peak_flops: float
    megacore: bool = False


CHIPS = {
    "v4": Chip(32 * GIB, 275e12, megacore=True),
    "v5e": Chip(16 * GIB, 197e12),
    "v5p": Chip(95 * GIB, 459e12, megacore=True),
    "v6e": Chip(32 * GIB, 918e12),
}


def topology_devices(topology: str) -> tuple[Chip, list[Any]]:
    """(the chip, the device descriptions of every chip) of a topology "<generation>:<shape>", e.g. "v5e:2x2" or
    "v5p:4x4x4". ValueError for an unknown generation or a shape libtpu rejects, or without libtpu."""
    generation = topology.split(":")[0]
    if ":" not in topology or generation not in CHIPS:
        raise ValueError(f"topology {topology!r}: expected <generation>:<shape> with a generation of {sorted(CHIPS)}, "
                         "e.g. v5p:4x4x4")
    chip = CHIPS[generation]
    # libtpu takes a machine-wide lock file unless told otherwise; describing chips opens none of them, so plans
    # may run side by side (and beside tests).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies  # noqa: PLC0415  (loads libtpu)

    try:
        description = topologies.get_topology_desc(
            platform="tpu", topology_name=topology, **({"chip_config_name": "megacore"} if chip.megacore else {}))
    except (RuntimeError, ValueError) as error:  # libtpu missing, or a shape it rejects
        raise ValueError(f"topology {topology!r}: {error} (planning needs libtpu: pip install -e '.[tpu]')") from None
    return chip, list(description.devices)


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What XLA reports of one compiled function, per chip. `out_of_memory`: the TPU compiler's message when it
    refused the program for want of HBM (the other fields are then 0)."""

    argument_bytes: int
    temp_bytes: int
    output_bytes: int
    alias_bytes: int
    flops: float
    compile_s: float
    out_of_memory: Optional[str] = None

    @property
    def total_bytes(self) -> int:
        return self.argument_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes

    def describe(self, hbm_bytes: int) -> str:
        if self.out_of_memory is not None:
            return f"DOES NOT FIT: {self.out_of_memory}"
        return (f"arguments {_gib(self.argument_bytes)}, temporaries {_gib(self.temp_bytes)}, outputs "
                f"{_gib(self.output_bytes)} ({_gib(self.alias_bytes)} donated), total {_gib(self.total_bytes)} = "
                f"{self.total_bytes / hbm_bytes:.0%} of HBM; compiled in {self.compile_s:.0f} s")


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def compile_stats(function: Any, *args: Any) -> Compiled:
    """`function.lower(*args).compile()` (a `train_step` function; args `ShapeDtypeStruct`s) and its report."""
    started = time.monotonic()
    try:
        compiled = function.lower(*args).compile()
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        return Compiled(0, 0, 0, 0, 0.0, time.monotonic() - started, " ".join(str(error).split()))
    elapsed = time.monotonic() - started
    memory, cost = compiled.memory_analysis(), compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return Compiled(memory.argument_size_in_bytes, memory.temp_size_in_bytes, memory.output_size_in_bytes,
                    memory.alias_size_in_bytes, float(cost.get("flops", 0.0)), elapsed)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A learner compiled for a topology (module docstring): its shapes and what XLA reports."""

    topology: str
    chip: Chip
    mesh: dict[str, int]
    parameters: int
    rows: int
    logprob_rows: int
    length: int
    micro_batches: int
    remat: bool
    attention: str
    train: Compiled
    logprobs: Compiled

    @property
    def chips(self) -> int:
        return self.mesh["data"] * self.mesh["fsdp"] * self.mesh["tensor"]

    @property
    def fits(self) -> bool:
        return all(c.out_of_memory is None and c.total_bytes <= self.chip.hbm_bytes
                   for c in (self.train, self.logprobs))

    @property
    def model_flops(self) -> float:
        return 6.0 * self.parameters * self.rows * self.length

    @property
    def compiled_flops(self) -> float:
        """The train step's FLOPs by XLA's count: per chip, times the chips, times the micro-batches (XLA counts a
        loop body once; the optimizer update outside the loop is negligible)."""
        return self.train.flops * self.chips * self.micro_batches

    @property
    def step_flops(self) -> float:
        """The larger of the compiled FLOPs and 6 N tokens: XLA's count misses the splash kernel's FLOPs and
        counts the logits' chunk loop once, so it can fall below the model's."""
        return max(self.compiled_flops, self.model_flops)

    @property
    def step_time_lower_bound_s(self) -> float:
        return self.step_flops / (self.chips * self.chip.peak_flops)

    @property
    def mfu_ceiling(self) -> float:
        return self.model_flops / self.step_flops

    def report(self) -> str:
        """The plan as a few lines of text."""
        hbm = self.chip.hbm_bytes
        mesh = " x ".join(f"{name} {size}" for name, size in self.mesh.items())
        lines = [
            f"topology {self.topology}: {self.chips} chips, mesh {mesh}, {_gib(hbm)} HBM and "
            f"{self.chip.peak_flops / 1e12:.0f} TFLOP/s bf16 per chip",
            f"model: {self.parameters / 1e9:.2f} B parameters; train step: {self.rows} rows x {self.length} tokens, "
            f"{self.micro_batches} micro-batches, remat {'on' if self.remat else 'off'}, attention {self.attention}",
            f"train step per chip: {self.train.describe(hbm)}",
            f"logprobs ({self.logprob_rows} rows) per chip: {self.logprobs.describe(hbm)}",
        ]
        if self.train.out_of_memory is None:
            lines.append(f"FLOPs per train step: compiled {self.compiled_flops:.3e}, 6 N tokens "
                         f"{self.model_flops:.3e}; step time >= {self.step_time_lower_bound_s:.2f} s, "
                         f"MFU <= {self.mfu_ceiling:.0%}")
        lines.append("fits" if self.fits else "DOES NOT FIT in HBM")
        return "\n".join(lines)


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _abstract_batch(rows: int, length: int, with_reference: bool, mesh: Any) -> dict[str, jax.ShapeDtypeStruct]:
    """The learner's batch (`algorithms.base`'s Experience.batch plus the old and reference logprobs)."""
    dtypes = {"tokens_bt": jnp.int32, "positions_bt": jnp.int32, "attention_mask_bt": jnp.bool_,
              "response_mask_bt": jnp.bool_, "advantages_bt": jnp.float32, "rollout_logp_bt": jnp.float32,
              "old_logp_bt": jnp.float32, **({"ref_logp_bt": jnp.float32} if with_reference else {})}
    rows_sharding = sharding.batch_sharding(mesh)
    return {key: jax.ShapeDtypeStruct((rows, length), dtype, sharding=rows_sharding) for key, dtype in dtypes.items()}


def plan_learner(config: RLConfig, model_config: ModelConfig, topology: str, *, prompt_tokens: int) -> Plan:
    """Compiles `config`'s learner for `model_config` on `topology` (module docstring), prompts padded to
    `prompt_tokens` (the step's first scored position). ValueError when the config's mesh does not have one device
    per chip of the topology."""
    chip, devices = topology_devices(topology)
    mesh_config = config.learner.mesh
    if mesh_config.data * mesh_config.fsdp * mesh_config.tensor != len(devices):
        raise ValueError(f"learner.mesh (data {mesh_config.data} x fsdp {mesh_config.fsdp} x tensor "
                         f"{mesh_config.tensor}) must have one device per chip of {topology} ({len(devices)}): "
                         f"override it, e.g. learner.mesh.fsdp={len(devices)}")
    mesh = sharding.make_mesh(mesh_config.data, mesh_config.fsdp, mesh_config.tensor, devices=devices)
    algorithm_config, config = resolve_algorithm(config)
    algorithm = algorithm_class(config.algorithm.name)(algorithm_config)
    options = policy.decoder_options(config.model)
    graphdef, abstract_params = nnx.split(nnx.eval_shape(lambda: Decoder(model_config, rngs=nnx.Rngs(0), **options)))
    optimizer = make_optimizer(config.optimizer)
    rules = sharding.partition_rules(model_config)
    params = _abstract(abstract_params, sharding.param_shardings(abstract_params, mesh, rules))
    opt_state = jax.eval_shape(optimizer.init, abstract_params)
    opt_state = _abstract(opt_state, sharding.param_shardings(opt_state, mesh, rules))

    learner, rollout = config.learner, config.rollout
    # As `rl._Learner.steps` builds them.
    common = dict(mesh=mesh, abstract_params=abstract_params, rules=rules, chunk_size=learner.chunk_size,
                  temperature=rollout.temperature, first_scored=prompt_tokens)
    update = train_step.make_train_step(graphdef, optimizer, algorithm.loss_fn(), aggregate=algorithm.aggregate(),
                                        micro_batches=learner.micro_batches, **common)
    logprobs = train_step.make_logprobs_fn(graphdef, **common)
    length, rows = prompt_tokens + rollout.max_new_tokens, rollout.batch_size
    batch = _abstract_batch(rows // learner.mini_batches, length, algorithm.needs_reference, mesh)
    train = compile_stats(update, params, opt_state, batch)
    logprob_stats = compile_stats(logprobs, params, _abstract_batch(rows, length, False, mesh))
    with jax.set_mesh(mesh):
        kernel = attention.resolve(config.model.attention, length)
    return Plan(topology=topology, chip=chip, mesh=dict(mesh.shape), parameters=_count(abstract_params),
                rows=rows // learner.mini_batches, logprob_rows=rows, length=length,
                micro_batches=learner.micro_batches, remat=config.model.remat, attention=kernel,
                train=train, logprobs=logprob_stats)


def _count(abstract_params: Any) -> int:
    return sum(leaf.size for leaf in jax.tree.leaves(abstract_params))


def model_config(config: RLConfig, preset: Optional[str]) -> ModelConfig:
    """The architecture to plan: the `config.MODEL_PRESETS` entry `preset`, else model.path's config.json.
    ValueError when neither is there (a random model.init needs its task's tokenizer: name a preset)."""
    if preset is not None:
        return preset_config(preset)
    if config.model.path is None:
        raise ValueError("plan reads the model from model.path's config.json; with model.init, name --model-preset")
    path = Path(config.model.path) / "config.json"
    if not path.is_file():
        raise ValueError(f"model.path: {path} does not exist; name a --model-preset instead")
    return ModelConfig.from_pretrained(config.model.path)
