"""The embedded engine's rollouts compiled ahead of time for a TPU topology (`rubric-jax plan`, beside the learner's
plan of `training.plan`): its shared prefill and one decode step, on the chips' compiler, read for bytes.

Decoding is bound by HBM bandwidth: a step reads the weights' shard and the KV cache it attends to, and produces
one token per row. So the figure of merit is the HBM bytes a step reads per chip (`hbm_traffic`, read from the
compiled program, not XLA's "bytes accessed", which counts VMEM copies too) against the least it must read, the
weights' shard plus the cache in use. Conventions:
- Layout: the engine's decode layout (`models.sharding.decode_mesh`, `rollout.tensor_parallel`): "tensor" over a
  host's chips, up to the largest count dividing both them and the key/value heads (a head is never split),
  "data" over the rest; the slots' rows split over "data", their cache's heads over "tensor"
  (`inference.embedded.slot_shardings`), the parameters by the partition rules.
- Shapes are the engine's for one call of the step's rows (`inference.embedded`): the slots and prompts per
  prefill the engine picks for them (`embedded.call_shapes`: the rows rounded up to a power of two, at most
  `rollout.decode_slots` or 256), rounded up to a multiple of "data"; each slot's cache holds P + N positions
  (the prompt width and max_new_tokens, each rounded up to a power of two); the sampling mode is the config's.
- The decode step planned has every row half full (`fill`): it attends to the window the engine uses then
  (`attention_window` of that share of the cache plus a chunk), and the least it must read is the weights plus
  that share of the cache. A model that decodes by the ragged Pallas kernel (`model.attention: splash`,
  `models.ragged_decode`) is planned as compiled, but `hbm_traffic` counts a custom call's operands whole: its
  step's bytes are then an upper bound that counts the whole cache, not the blocks in use the kernel reads.
- Weights are held in the compute dtype where it is narrower than the parameters' (`policy.rollout_model`:
  bfloat16 for a float32 policy with bfloat16 activations), and a weight sync moves those bytes per chip.
- The throughput bound is rows / (bytes read per chip / HBM bandwidth): tokens per second at the roofline.
"""

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rubric_jax.inference import embedded
from rubric_jax.models import sharding
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.decoder import Decoder
from rubric_jax.training import policy
from rubric_jax.training.plan import GIB, Chip, Compiled, compile_stats, per_chip_bytes, topology_devices
from rubric_jax.training.run_config import RLConfig, resolve_algorithm


@dataclasses.dataclass(frozen=True)
class RolloutPlan:
    """The embedded engine's rollouts on a topology (module docstring); bytes are per chip."""

    topology: str
    chip: Chip
    engine: str
    mesh: dict[str, int]
    slots: int
    prompt_width: int
    max_steps: int
    attended_slots: int
    fill: float
    prefill_prompts: int
    weight_bytes: int
    cache_bytes: int
    slot_state_bytes: int
    prefill: Compiled
    decode: Compiled

    @property
    def cache_slots(self) -> int:
        return self.prompt_width + self.max_steps

    @property
    def used_cache_bytes(self) -> int:
        """The cache in use when every row is `fill` full."""
        return int(self.cache_bytes * self.fill)

    @property
    def decode_read_bytes(self) -> int:
        return self.decode.traffic.read_bytes

    @property
    def least_read_bytes(self) -> int:
        return self.weight_bytes + self.used_cache_bytes

    @property
    def read_ratio(self) -> float:
        return self.decode_read_bytes / self.least_read_bytes

    @property
    def tokens_per_s_bound(self) -> float:
        return self.slots * self.chip.hbm_bandwidth / self.decode_read_bytes

    @property
    def max_slots(self) -> int:
        """The most slots whose state (`slot_state_bytes` per slot, per chip) fits in HBM beside the weights and
        the decode step's temporaries (none counted when the step did not compile for want of HBM)."""
        slot_bytes = self.slot_state_bytes / (self.slots // self.mesh["data"])
        free = self.chip.hbm_bytes - self.weight_bytes - self.decode.temp_bytes
        return max(0, int(free // slot_bytes)) * self.mesh["data"]

    @property
    def fits(self) -> bool:
        return (self.decode.out_of_memory is None and self.prefill.out_of_memory is None
                and self.slots <= self.max_slots)

    @property
    def binding(self) -> bool:
        """Whether the run samples with the engine planned, so that its rollouts must fit (an SGLang run's
        plan shows what `rollout.engine=embedded` would take)."""
        return self.engine == "embedded"

    def report(self) -> str:
        return "\n".join(([] if self.binding else [
            "rollouts: this config samples with SGLang; the embedded engine's plan below is for "
            "rollout.engine=embedded (on a TPU)"]) + [self._figures()])

    def _figures(self) -> str:
        mesh = " x ".join(f"{name} {size}" for name, size in self.mesh.items())
        gib = lambda n: f"{n / GIB:.2f} GiB"  # noqa: E731
        if self.decode.out_of_memory is not None or self.prefill.out_of_memory is not None:
            return (f"rollouts: decode layout {mesh}, {self.slots} slots of {self.prompt_width} + {self.max_steps} "
                    f"cache positions; per chip weights {gib(self.weight_bytes)}, KV cache {gib(self.cache_bytes)}; "
                    f"at most {self.max_slots} slots fit\nrollouts DO NOT FIT: "
                    f"{self.decode.out_of_memory or self.prefill.out_of_memory}")
        step_s = self.decode_read_bytes / self.chip.hbm_bandwidth
        return "\n".join([
            f"rollouts: decode layout {mesh}, {self.slots} slots of {self.prompt_width} + {self.max_steps} cache "
            f"positions; per chip weights {gib(self.weight_bytes)}, KV cache {gib(self.cache_bytes)}; at most "
            f"{self.max_slots} slots fit",
            f"prefill of {self.prefill_prompts} prompts: per chip arguments {gib(self.prefill.argument_bytes)}, "
            f"temporaries {gib(self.prefill.temp_bytes)}; compiled in {self.prefill.compile_s:.0f} s",
            f"decode step, rows {self.fill:.0%} full (attending to {self.attended_slots} of {self.cache_slots} "
            f"slots): reads "
            f"{gib(self.decode_read_bytes)} of HBM per chip = {self.read_ratio:.2f} x (weights + KV in use, "
            f"{gib(self.least_read_bytes)}); >= {step_s * 1e3:.1f} ms at {self.chip.hbm_bandwidth / 1e12:.2f} TB/s: "
            f"<= {self.tokens_per_s_bound:,.0f} tokens/s; a weight sync moves {gib(self.weight_bytes)} per chip",
            "rollouts fit" if self.fits else "rollouts DO NOT FIT in HBM",
        ])


def plan_rollouts(config: RLConfig, model_config: ModelConfig, topology: str, *, prompt_tokens: int,
                  hbm_bytes: Optional[int] = None, fill: float = 0.5) -> RolloutPlan:
    """Compiles the embedded engine's prefill and decode step of `config`'s rollouts for `model_config` on
    `topology` (module docstring), prompts of `prompt_tokens`, the decode step with every row `fill` (in (0, 1])
    of its cache in use; `hbm_bytes` replaces the chip's HBM."""
    if not 0 < fill <= 1:
        raise ValueError(f"fill must be in (0, 1], got {fill}")
    chip, devices = topology_devices(topology)
    if hbm_bytes is not None:
        chip = dataclasses.replace(chip, hbm_bytes=hbm_bytes)
    mesh = sharding.decode_mesh(devices, model_config.num_kv_heads, config.rollout.tensor_parallel)
    data = mesh.shape["data"]
    _, resolved = resolve_algorithm(config)
    rollout = config.rollout
    model = nnx.eval_shape(lambda: Decoder(model_config, rngs=nnx.Rngs(0), **policy.decoder_options(resolved.model)))
    graphdef, abstract_params = nnx.split(model)
    params = jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(
                              leaf.shape, policy.rollout_dtype(leaf.dtype, model.dtype), sharding=s),
                          abstract_params,
                          sharding.param_shardings(abstract_params, mesh, sharding.partition_rules(model_config)))
    # The engine's shapes for a call of the step's rows, the slots and prefill prompts rounded up to split over
    # "data".
    slots, prefill_prompts = embedded.call_shapes(rollout.prompts_per_step * rollout.group_size,
                                                  rollout.prompts_per_step, rollout.decode_slots)
    slots, prefill_prompts = (-(-n // data) * data for n in (slots, prefill_prompts))
    width, max_steps = embedded.bucket(prompt_tokens), embedded.bucket(rollout.max_new_tokens)
    mode = embedded._sampling_mode(embedded.SamplingParams(max_new_tokens=rollout.max_new_tokens,
                                                           temperature=rollout.temperature, top_p=rollout.top_p,
                                                           top_k=rollout.top_k))
    stop_ids_s = np.full(embedded.STOP_IDS_BUCKET, -1, np.int32)
    sampling = (stop_ids_s, np.float32(rollout.temperature), np.int32(rollout.top_k), np.float32(rollout.top_p),
                None)
    abstract_slots = jax.eval_shape(lambda: embedded._empty_slots(model_config, slots, width + max_steps, max_steps,
                                                                  model.dtype, False, 0))
    abstract_slots = jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
                                  abstract_slots, embedded.slot_shardings(abstract_slots, mesh))
    attended = embedded.attention_window(int((width + max_steps) * fill) + embedded.CHUNK_STEPS, width + max_steps)

    def decode(params, slots):
        return embedded.decode_step(nnx.merge(graphdef, params), slots, *sampling, mode=mode,
                                    attended_slots=attended)

    rows_sharding = sharding.batch_sharding(mesh)
    prompt = jax.ShapeDtypeStruct((prefill_prompts, width), jnp.int32, sharding=rows_sharding)
    prompt_mask = jax.ShapeDtypeStruct((prefill_prompts, width), jnp.bool_, sharding=rows_sharding)
    with jax.set_mesh(mesh):
        decode_compiled = compile_stats(jax.jit(decode, donate_argnums=(1,)), params, abstract_slots, traffic=True)
        prefill_compiled = compile_stats(jax.jit(lambda p, t, m: embedded._prefill_prompts(graphdef, p, t, m)),
                                         params, prompt, prompt_mask)
    return RolloutPlan(
        topology=topology, chip=chip, engine=rollout.engine, mesh=dict(mesh.shape), slots=slots, prompt_width=width,
        max_steps=max_steps,
        attended_slots=attended, fill=fill, prefill_prompts=prefill_prompts, weight_bytes=per_chip_bytes(params),
        cache_bytes=per_chip_bytes((abstract_slots.cache.k_bnsk, abstract_slots.cache.v_bnsk)),
        slot_state_bytes=per_chip_bytes(abstract_slots),
        prefill=prefill_compiled, decode=decode_compiled)
