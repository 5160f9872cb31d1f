"""`rubric-jax plan`: a run's learner compiled ahead of time for a TPU topology, on any host (libtpu installed).

`jax.experimental.topologies.get_topology_desc` describes the chips of a topology such as "v5p:4x4x4" without them
being attached; the learner's own jitted functions (`train_step.make_train_step` and `make_logprobs_fn`, built as
`training.rl` builds them: the recipe's loss and aggregation, micro-batches, chunk size, the mesh and partition
rules, the policy's attention kernel and remat) are lowered on `jax.ShapeDtypeStruct`s sharded over a mesh of
those chips and compiled by XLA's TPU compiler. The model is `nnx.eval_shape`d: no weights are read.

Conventions:
- One train step is one optimizer update: a mini-batch of the step's rows, each role's at its widest
  (`Algorithm.learner_rows`: the policy's prompts_per_step * group_size rows of prompt_tokens +
  rollout.max_new_tokens, a second role's rubricator or generator rows), padded as a run pads them. The logprob
  function runs over all the step's rows, in `learner.forward_micro_batches` micro-batches. A recipe with a critic
  also gets the critic's update and values pass compiled.
- Bytes are per chip (`compiled.memory_analysis()`): arguments, temporaries, outputs, counting a donated argument
  once (outputs aliased to it are not new memory), plus the learner state that is not the phase's argument but
  stays in HBM (`Phase.resident_bytes`): their sum is the phase's peak. A phase fits when its peak is at most
  the chip's HBM (or a smaller budget, `hbm_bytes`). `search_learner` finds the fewest micro-batches (and remat)
  that fit.
- FLOPs: XLA's count (`compiled.cost_analysis()`, per chip) times the chips and the micro-batches (XLA counts a
  loop body once). The model's FLOPs are 6 * N * tokens (forward and backward, attention not counted), N the
  parameters a token passes through: all of a dense model's, and a mixture of experts' with only
  num_experts_per_tok of its experts (its active parameters). The step's FLOPs are the larger of the two (XLA's
  count misses the splash kernel and counts the logits' chunk loop once); the step time's lower bound is those at
  the chips' peak bf16 rate, the MFU ceiling the model's FLOPs over them (what remat and attention add lowers it).
"""

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import nnx

import rubric_jax
from rubric_jax.algorithms.base import RoleRows, StepShape
from rubric_jax.algorithms.registry import algorithm_class
from rubric_jax.models import attention, sharding, train_step
from rubric_jax.models.config import ModelConfig, preset_config
from rubric_jax.models.decoder import Decoder
from rubric_jax.models.value import ValueModel, make_value_train_step, make_values_fn
from rubric_jax.training import policy
from rubric_jax.training.hbm_traffic import Traffic, hbm_traffic
from rubric_jax.training.optim import make_optimizer
from rubric_jax.training.run_config import RLConfig, resolve_algorithm

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    """A TPU generation: HBM per chip, peak dense bf16 FLOP/s per chip, HBM bandwidth per chip (bytes/s), and
    whether its two TensorCores act as one device (megacore)."""

    hbm_bytes: int
    peak_flops: float
    hbm_bandwidth: float
    megacore: bool = False


CHIPS = {
    "v4": Chip(32 * GIB, 275e12, 1228e9, megacore=True),
    "v5e": Chip(16 * GIB, 197e12, 819e9),
    "v5p": Chip(95 * GIB, 459e12, 2765e9, megacore=True),
    "v6e": Chip(32 * GIB, 918e12, 1640e9),
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
    if not rubric_jax.accelerator_attached():
        # A single host of its own: without them libtpu, finding no TPU VM around it, prints initialisation errors
        # ("Failed to find host bounds", "unexpected worker hostname"); the topology described is the same.
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        os.environ.setdefault("TPU_HOST_BOUNDS", "1,1,1")
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
    traffic: Optional[Traffic] = None

    @property
    def total_bytes(self) -> int:
        return self.argument_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes



@dataclasses.dataclass(frozen=True)
class Phase:
    """One compiled function of the learner ("train step", "logprobs", "critic update", "critic values") and the
    learner state that stays in HBM beside its arguments while it runs (`resident_bytes` per chip: the optimizer
    state during a forward pass, a KL reference, a critic and its optimizer state)."""

    name: str
    compiled: Compiled
    resident_bytes: int

    @property
    def peak_bytes(self) -> int:
        return self.compiled.total_bytes + self.resident_bytes

    def fits_in(self, hbm_bytes: int) -> bool:
        return self.compiled.out_of_memory is None and self.peak_bytes <= hbm_bytes

    def describe(self, hbm_bytes: int) -> str:
        c = self.compiled
        if c.out_of_memory is not None:
            return f"DOES NOT FIT: {c.out_of_memory}"
        return (f"arguments {_gib(c.argument_bytes)}, temporaries {_gib(c.temp_bytes)}, "
                f"outputs {_gib(c.output_bytes)} ({_gib(c.alias_bytes)} donated), other state "
                f"{_gib(self.resident_bytes)}; peak {_gib(self.peak_bytes)} = {self.peak_bytes / hbm_bytes:.0%} of "
                f"HBM; compiled in {c.compile_s:.0f} s")


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def compile_stats(function: Any, *args: Any, traffic: bool = False) -> Compiled:
    """`function.lower(*args).compile()` (a `train_step` function; args `ShapeDtypeStruct`s) and its report;
    with `traffic`, also the HBM bytes one run moves (`hbm_traffic`, read from the compiled program)."""
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
                    memory.alias_size_in_bytes, float(cost.get("flops", 0.0)), elapsed,
                    traffic=hbm_traffic(compiled.as_text()) if traffic else None)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A learner compiled for a topology (module docstring): its shapes, the learner state per chip, and each
    compiled phase (the train step, the logprob pass, and a critic's update and values when the recipe has one)."""

    topology: str
    chip: Chip
    mesh: dict[str, int]
    parameters: int
    active_parameters: int
    roles: dict[str, RoleRows]
    rows: int
    logprob_rows: int
    length: int
    micro_batches: int
    forward_micro_batches: int
    remat: bool
    scan_layers: bool
    compute_dtype: str
    attention: str
    state_bytes: dict[str, int]
    phases: tuple[Phase, ...]

    def phase(self, name: str) -> Phase:
        return next(phase for phase in self.phases if phase.name == name)

    @property
    def train(self) -> Compiled:
        return self.phase("train step").compiled

    @property
    def logprobs(self) -> Compiled:
        return self.phase("logprobs").compiled

    @property
    def chips(self) -> int:
        return math.prod(self.mesh.values())

    @property
    def fits(self) -> bool:
        return all(phase.fits_in(self.chip.hbm_bytes) for phase in self.phases)

    @property
    def model_flops(self) -> float:
        return 6.0 * self.active_parameters * self.rows * self.length

    @property
    def compiled_flops(self) -> Optional[float]:
        """The train step's FLOPs by XLA's count: per chip, times the chips, times the micro-batches (XLA counts a
        loop body once; the optimizer update outside the loop is negligible). None with scanned layers: the
        layer loop's body is counted once too, beside the embedding and unembedding, which run once per pass."""
        return None if self.scan_layers else self.train.flops * self.chips * self.micro_batches

    @property
    def step_flops(self) -> float:
        """The larger of the compiled FLOPs and 6 N tokens: XLA's count misses the splash kernel's FLOPs and
        counts the logits' chunk loop once, so it can fall below the model's."""
        return max(self.compiled_flops or 0.0, self.model_flops)

    @property
    def step_time_lower_bound_s(self) -> float:
        return self.step_flops / (self.chips * self.chip.peak_flops)

    @property
    def mfu_ceiling(self) -> float:
        return self.model_flops / self.step_flops

    def _active_note(self) -> str:
        if self.active_parameters == self.parameters:
            return ""
        return f" ({self.active_parameters / 1e9:.2f} B active per token)"

    def report(self) -> str:
        """The plan as a few lines of text."""
        hbm = self.chip.hbm_bytes
        mesh = " x ".join(f"{name} {size}" for name, size in self.mesh.items())
        roles = ", ".join(f"{name} {r.rows} x ({r.prompt_tokens} + {r.response_tokens})"
                          for name, r in self.roles.items())
        state = ", ".join(f"{name} {_gib(size)}" for name, size in self.state_bytes.items())
        lines = [
            f"topology {self.topology}: {self.chips} chips, mesh {mesh}, {_gib(hbm)} HBM and "
            f"{self.chip.peak_flops / 1e12:.0f} TFLOP/s bf16 per chip",
            f"model: {self.parameters / 1e9:.2f} B parameters{self._active_note()}; rows per step: {roles}; "
            f"learner state per chip: {state}",
            f"train step: {self.rows} rows x {self.length} tokens, {self.micro_batches} micro-batches, remat "
            f"{'on' if self.remat else 'off'}, layers {'scanned' if self.scan_layers else 'unrolled'}, "
            f"{self.compute_dtype} activations, attention {self.attention}; logprobs: {self.logprob_rows} rows, "
            f"{self.forward_micro_batches} micro-batches",
            *(f"{phase.name} per chip: {phase.describe(hbm)}" for phase in self.phases),
        ]
        if self.train.out_of_memory is None:
            # Without XLA's count the bound is the model's FLOPs at peak, and an MFU ceiling would say nothing.
            compiled, ceiling = (("n/a (scanned layers)", "") if self.compiled_flops is None else
                                 (f"{self.compiled_flops:.3e}", f", MFU <= {self.mfu_ceiling:.0%}"))
            n = "N_active" if self.active_parameters != self.parameters else "N"
            lines.append(f"FLOPs per train step: compiled {compiled}, 6 {n} tokens "
                         f"{self.model_flops:.3e}; step time >= {self.step_time_lower_bound_s:.2f} s{ceiling}")
        lines.append("fits" if self.fits else "DOES NOT FIT in HBM")
        return "\n".join(lines)


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _abstract_batch(rows: int, length: int, keys: tuple[str, ...], mesh: Any) -> dict[str, jax.ShapeDtypeStruct]:
    """The learner's batch arrays `keys` (`algorithms.base`'s Experience.batch plus what the learner adds): [B, T]
    per-token arrays ("_bt"), [B] per-row ones ("_b", RGR-GRPO's "off_policy_b")."""
    dtypes = {"tokens_bt": jnp.int32, "positions_bt": jnp.int32, "attention_mask_bt": jnp.bool_,
              "response_mask_bt": jnp.bool_, "off_policy_b": jnp.bool_}
    rows_sharding = sharding.batch_sharding(mesh)
    return {key: jax.ShapeDtypeStruct((rows, length) if key.endswith("_bt") else (rows,),
                                      dtypes.get(key, jnp.float32), sharding=rows_sharding)
            for key in keys}


def per_chip_bytes(tree: Any) -> int:
    """Bytes of one chip's shards of a tree of sharded `ShapeDtypeStruct`s (TPU tile padding not counted)."""
    return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
               for leaf in jax.tree.leaves(tree))


@dataclasses.dataclass(frozen=True)
class _Learner:
    """The learner's abstract state and jitted functions for one config on one topology, built as `rl._Learner`
    builds them; `state_bytes` its state per chip by name."""

    config: RLConfig
    topology: str
    chip: Chip
    mesh: Any
    parameters: int
    active_parameters: int
    roles: dict[str, RoleRows]
    rows: int
    length: int
    attention: str
    state: dict[str, Any]
    functions: dict[str, tuple[Any, tuple[str, ...], dict[str, jax.ShapeDtypeStruct]]]

    @property
    def state_bytes(self) -> dict[str, int]:
        return {name: per_chip_bytes(tree) for name, tree in self.state.items()}

    def phase(self, name: str) -> Phase:
        """Compiles function `name` on its state arguments and batch; the rest of the state is resident."""
        function, arguments, batch = self.functions[name]
        compiled = compile_stats(function, *(self.state[key] for key in arguments), batch)
        state_bytes = self.state_bytes
        return Phase(name, compiled, sum(state_bytes.values()) - sum(state_bytes[key] for key in arguments))


UPDATE_PHASES = ("train step", "critic update")
FORWARD_PHASES = ("logprobs", "critic values")
# Every array a recipe's loss may read (jit drops the ones it does not).
POLICY_BATCH = train_step.POLICY_INPUTS + ("advantages_bt", "rollout_logp_bt", "old_logp_bt", "off_policy_b")
CRITIC_BATCH = train_step.POLICY_INPUTS + ("old_values_bt", "returns_bt")


def _learner(config: RLConfig, model_config: ModelConfig, topology: str, prompt_tokens: int,
             hbm_bytes: Optional[int]) -> _Learner:
    chip, devices = topology_devices(topology)
    if hbm_bytes is not None:
        chip = dataclasses.replace(chip, hbm_bytes=hbm_bytes)
    learner, rollout = config.learner, config.rollout
    mesh_config = learner.mesh
    if mesh_config.devices != len(devices):
        raise ValueError(f"learner.mesh (data {mesh_config.data} x fsdp {mesh_config.fsdp} x expert "
                         f"{mesh_config.expert} x tensor {mesh_config.tensor}) must have one device per chip of "
                         f"{topology} ({len(devices)}): override it, e.g. learner.mesh.fsdp={len(devices)}")
    mesh = sharding.make_mesh(mesh_config.data, mesh_config.fsdp, mesh_config.tensor, devices=devices,
                              expert=mesh_config.expert)
    algorithm_config, resolved = resolve_algorithm(config)
    algorithm = algorithm_class(resolved.algorithm.name)(algorithm_config)
    roles = algorithm.learner_rows(StepShape(rollout.prompts_per_step, rollout.group_size, prompt_tokens,
                                             rollout.max_new_tokens, rollout.max_prompt_tokens))
    # As `concat_batches` and `data_parallel.align_batch` shape the step's batch: the widest prompt region, the
    # longest response region, rows padded to the learner's multiple.
    prompt_width = max(role.prompt_tokens for role in roles.values())
    length = prompt_width + max(role.response_tokens for role in roles.values())
    rows = -(-sum(role.rows for role in roles.values()) // learner.row_multiple) * learner.row_multiple
    options = policy.decoder_options(resolved.model)
    abstract_model = nnx.eval_shape(lambda: Decoder(model_config, rngs=nnx.Rngs(0), **options))
    graphdef, abstract_params = nnx.split(abstract_model)
    rules = sharding.partition_rules(model_config)

    def sharded(tree):
        return _abstract(tree, sharding.param_shardings(tree, mesh, rules))

    optimizer = make_optimizer(resolved.optimizer)
    state = {"policy": sharded(abstract_params), "optimizer": sharded(jax.eval_shape(optimizer.init, abstract_params))}
    if algorithm.needs_reference:
        state["reference"] = state["policy"]
    common = dict(mesh=mesh, rules=rules, first_scored=prompt_width)
    policy_common = dict(abstract_params=abstract_params, chunk_size=learner.chunk_size,
                         temperature=rollout.temperature, **common)
    batch_keys = POLICY_BATCH + (("ref_logp_bt",) if algorithm.needs_reference else ())
    functions = {
        "train step": (train_step.make_train_step(graphdef, optimizer, algorithm.loss_fn(),
                                                  aggregate=algorithm.aggregate(),
                                                  micro_batches=learner.micro_batches,
                                                  router_aux_loss_coef=learner.router_aux_loss_coef, **policy_common),
                       ("policy", "optimizer"),
                       _abstract_batch(rows // learner.mini_batches, length, batch_keys, mesh)),
        "logprobs": (train_step.make_logprobs_fn(graphdef, micro_batches=learner.forward_splits, **policy_common),
                     ("policy",), _abstract_batch(rows, length, train_step.POLICY_INPUTS, mesh)),
    }
    if algorithm.uses_critic:
        critic_graphdef, abstract_critic = nnx.split(nnx.eval_shape(
            lambda: ValueModel(Decoder(model_config, rngs=nnx.Rngs(0), **options), rngs=nnx.Rngs(0))))
        critic_optimizer = make_optimizer(resolved.critic.optimizer)
        state["critic"] = sharded(abstract_critic)
        state["critic optimizer"] = sharded(jax.eval_shape(critic_optimizer.init, abstract_critic))
        functions["critic update"] = (
            make_value_train_step(critic_graphdef, critic_optimizer, clip=resolved.critic.value_clip,
                                  aggregate=algorithm.aggregate(), micro_batches=learner.micro_batches,
                                  abstract_params=abstract_critic, **common),
            ("critic", "critic optimizer"), _abstract_batch(rows // learner.mini_batches, length, CRITIC_BATCH, mesh))
        functions["critic values"] = (
            make_values_fn(critic_graphdef, micro_batches=learner.forward_splits, abstract_params=abstract_critic,
                           **common),
            ("critic",), _abstract_batch(rows, length, train_step.POLICY_INPUTS, mesh))
    with jax.set_mesh(mesh):
        # The layers' own choice: a model with sliding-window layers (Gemma 3) resolves "auto" to XLA.
        kernel = attention.resolve(abstract_model.layers[0].self_attn.implementation, length,
                                   head_width=model_config.head_dim, dtype=abstract_model.dtype)
    return _Learner(config=config, topology=topology, chip=chip, mesh=mesh, parameters=_count(abstract_params),
                    active_parameters=active_parameters(abstract_params, model_config), roles=roles, rows=rows,
                    length=length, attention=kernel, state=state, functions=functions)


def _update_phases(learner: _Learner) -> list[Phase]:
    return [learner.phase(name) for name in UPDATE_PHASES if name in learner.functions]


def _forward_phases(learner: _Learner) -> list[Phase]:
    return [learner.phase(name) for name in FORWARD_PHASES if name in learner.functions]


def _plan(update_learner: _Learner, forward_learner: _Learner, phases: Sequence[Phase]) -> Plan:
    update_config = update_learner.config
    return Plan(topology=update_learner.topology, chip=update_learner.chip, mesh=dict(update_learner.mesh.shape),
                parameters=update_learner.parameters, active_parameters=update_learner.active_parameters,
                roles=update_learner.roles,
                rows=update_learner.rows // update_config.learner.mini_batches, logprob_rows=forward_learner.rows,
                length=update_learner.length, micro_batches=update_config.learner.micro_batches,
                forward_micro_batches=forward_learner.config.learner.forward_splits,
                remat=update_config.model.remat, scan_layers=update_config.model.scan_layers,
                compute_dtype=update_config.model.compute_dtype, attention=update_learner.attention,
                state_bytes=update_learner.state_bytes, phases=tuple(phases))


def plan_learner(config: RLConfig, model_config: ModelConfig, topology: str, *, prompt_tokens: int,
                 hbm_bytes: Optional[int] = None) -> Plan:
    """Compiles `config`'s learner for `model_config` on `topology` (module docstring), the policy's prompts
    padded to `prompt_tokens` (a second role's prompts to their widest, `Algorithm.learner_rows`); `hbm_bytes`
    replaces the chip's HBM as the budget a step must fit in (headroom). ValueError when the config's mesh does
    not have one device per chip of the topology."""
    learner = _learner(config, model_config, topology, prompt_tokens, hbm_bytes)
    return _plan(learner, learner, _update_phases(learner) + _forward_phases(learner))


def _changed(config: RLConfig, *, remat: Optional[bool] = None, micro_batches: Optional[int] = None,
             forward_micro_batches: Optional[int] = None) -> Optional[RLConfig]:
    """`config` with these values, or None where its rows do not split into them (`RLConfig`'s check)."""
    learner = config.learner
    try:
        return dataclasses.replace(
            config, model=dataclasses.replace(config.model, remat=config.model.remat if remat is None else remat),
            learner=dataclasses.replace(
                learner, micro_batches=micro_batches or learner.micro_batches,
                forward_micro_batches=forward_micro_batches or learner.forward_micro_batches))
    except ValueError:
        return None


def search_learner(config: RLConfig, model_config: ModelConfig, topology: str, *, prompt_tokens: int,
                   hbm_bytes: Optional[int] = None, log: Any = lambda line: None) -> tuple[Plan, list[str]]:
    """The smallest change of `config` whose learner fits, found by compiling (`plan_learner`):
    - the updates (the train step, and a critic's): `learner.micro_batches` doubled until they fit or the
      mini-batch's rows no longer split over the micro-batches and the mesh's batch shards; then, if remat was off,
      the same from the config's micro-batches with `model.remat=true` (remat costs a forward pass of compute,
      more micro-batches only smaller matmuls, so micro-batches come first);
    - the passes without gradients (logprobs, a critic's values): `learner.forward_micro_batches` doubled likewise
      (remat does not change them).
    Returns (the plan of the first fit of each, or of the last candidate tried, and the overrides that changed,
    e.g. ["learner.micro_batches=256", "learner.forward_micro_batches=64"]). `log(line)` hears of each compile."""

    def fit(phases: Sequence[Phase], chip: Chip) -> bool:
        return all(phase.fits_in(chip.hbm_bytes) for phase in phases)

    def tried(phases: Sequence[Phase], chip: Chip, setting: str) -> None:
        for phase in phases:
            log(f"{phase.name}, {setting}: {phase.describe(chip.hbm_bytes)}")

    # Forward micro-batches stay as they are while the updates' are searched (by default they follow them).
    base = _changed(config, forward_micro_batches=config.learner.forward_splits)
    update_learner = updates = None
    for remat in dict.fromkeys((config.model.remat, True)):
        candidate = _changed(base, remat=remat)
        while candidate is not None:
            update_learner = _learner(candidate, model_config, topology, prompt_tokens, hbm_bytes)
            updates = _update_phases(update_learner)
            tried(updates, update_learner.chip,
                  f"remat {'on' if remat else 'off'}, {candidate.learner.micro_batches} micro-batches")
            if fit(updates, update_learner.chip):
                break
            candidate = _changed(candidate, micro_batches=2 * candidate.learner.micro_batches)
        if fit(updates, update_learner.chip):
            break
    candidate = update_learner.config
    while candidate is not None:
        forward_learner = _learner(candidate, model_config, topology, prompt_tokens, hbm_bytes)
        forwards = _forward_phases(forward_learner)
        tried(forwards, forward_learner.chip, f"{candidate.learner.forward_splits} micro-batches")
        if fit(forwards, forward_learner.chip):
            break
        candidate = _changed(candidate, forward_micro_batches=2 * candidate.learner.forward_splits)
    plan = _plan(update_learner, forward_learner, updates + forwards)
    overrides = []
    if plan.remat != config.model.remat:
        overrides.append("model.remat=true")
    if plan.micro_batches != config.learner.micro_batches:
        overrides.append(f"learner.micro_batches={plan.micro_batches}")
    if plan.forward_micro_batches != config.learner.forward_splits:
        overrides.append(f"learner.forward_micro_batches={plan.forward_micro_batches}")
    return plan, overrides


def _count(abstract_params: Any) -> int:
    return sum(leaf.size for leaf in jax.tree.leaves(abstract_params))


def active_parameters(abstract_params: Any, config: ModelConfig) -> int:
    """The parameters one token passes through: every parameter, but of a mixture of experts' stacked experts only
    the num_experts_per_tok of num_experts that route it (the embedding counts whole, as in 6 N)."""
    def active(path, leaf) -> int:
        if ".experts." in f".{sharding.path_str(path)}.":
            return leaf.size // config.num_experts * config.num_experts_per_tok
        return leaf.size

    return sum(jax.tree.leaves(jax.tree_util.tree_map_with_path(active, abstract_params)))


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
