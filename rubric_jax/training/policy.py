"""The policy a run trains, from its `ModelSpec`, and the learner state around it (what a checkpoint holds).

- `build_policy`: a Hugging Face directory loaded straight onto the mesh (its own tokenizer), or a random decoder
  of the `ModelInit` architecture with the task's tokenizer (vocabulary padded up to a multiple of 64, as real
  checkpoints pad theirs; eos and pad from the tokenizer). `save_policy` writes one back as such a directory.
- `LearnerState`: params, optimizer state, (when a recipe has a KL penalty) the frozen reference params and (when
  it trains with a critic, `init_critic`) the critic's params and optimizer state, as one pytree for
  `Checkpointer`; `abstract_learner_state` gives the shapes and shardings to restore into.
"""

import dataclasses
import tempfile
from pathlib import Path
from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rubric_jax.models import sharding, train_step
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.decoder import Decoder
from rubric_jax.models.safetensors_io import load_hf_checkpoint, save_hf_checkpoint
from rubric_jax.models.tokenizer import load_tokenizer
from rubric_jax.models.value import ValueModel
from rubric_jax.training.run_config import MeshConfig, ModelSpec

VOCAB_MULTIPLE = 64


def make_mesh(config: MeshConfig) -> Mesh:
    """The learner's mesh over the first data * fsdp * expert * tensor devices (all of them when the config names
    them all; ValueError when there are fewer)."""
    if config.devices > jax.device_count():
        raise ValueError(f"learner.mesh needs {config.devices} devices, there are {jax.device_count()}")
    return sharding.make_mesh(config.data, config.fsdp, config.tensor, devices=jax.devices()[:config.devices],
                              expert=config.expert)


def decoder_options(spec: ModelSpec) -> dict[str, Any]:
    """The Decoder's keyword arguments of a run's policy besides its config: the sharding hook, `spec`'s attention
    kernel, remat, layer scan and compute dtype."""
    return dict(shard_activations=sharding.shard_activations, attention=spec.attention, remat=spec.remat,
                scan_layers=spec.scan_layers, dtype=jnp.dtype(spec.compute_dtype))


def build_policy(spec: ModelSpec, task: Any, mesh: Mesh) -> tuple[Decoder, Any]:
    """(decoder on `mesh`, tokenizer) for `spec` (module docstring). ValueError for bfloat16 activations on CPU
    devices, whose XLA backend cannot run all of the float32-accumulating bfloat16 matmuls a train step needs."""
    if spec.compute_dtype == "bfloat16" and mesh.devices.flat[0].platform == "cpu":
        raise ValueError("model.compute_dtype bfloat16 needs GPUs or TPUs (XLA's CPU backend cannot run every "
                         "bfloat16 matmul with float32 accumulation): use float32 on CPU")
    if spec.path is not None:
        model = load_hf_checkpoint(spec.path, mesh=mesh, **decoder_options(spec))
        return model, load_tokenizer(spec.path)
    tokenizer = task.tokenizer()
    init = spec.init
    config = ModelConfig(
        model_type=init.model_type,
        vocab_size=-(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE,
        hidden_size=init.hidden_size,
        intermediate_size=init.intermediate_size,
        num_layers=init.num_layers,
        num_heads=init.num_heads,
        num_kv_heads=init.num_kv_heads,
        head_dim=init.head_dim,
        max_position_embeddings=init.max_position_embeddings,
        tie_word_embeddings=init.tie_word_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        **(dict(num_experts=init.num_experts, num_experts_per_tok=init.num_experts_per_tok,
                moe_intermediate_size=init.moe_intermediate_size, norm_topk_prob=True)
           if init.model_type == "qwen3_moe" else {}),
    )
    model = Decoder(config, rngs=nnx.Rngs(init.seed), **decoder_options(spec))
    graphdef, params = nnx.split(model)
    rules = sharding.partition_rules(config)
    return nnx.merge(graphdef, jax.device_put(params, sharding.param_shardings(params, mesh, rules))), tokenizer


def save_policy(graphdef: nnx.GraphDef, params: nnx.State, tokenizer: Any, directory: Path) -> None:
    """The policy as a Hugging Face directory with its tokenizer (an older one there replaced atomically):
    loadable by `ModelSpec(path=...)`, transformers and SGLang."""
    with tempfile.TemporaryDirectory() as tokenizer_dir:
        tokenizer.save_pretrained(tokenizer_dir)
        save_hf_checkpoint(nnx.merge(graphdef, params), directory, tokenizer_dir=tokenizer_dir, overwrite=True)


def eos_and_pad(tokenizer: Any, model_eos: Optional[int | tuple[int, ...]] = None) -> tuple[list[int], int]:
    """The ids a response stops at, the tokenizer's eos first, then the model config's `eos_token_id` (one id or
    several), and the pad id (eos when the tokenizer has no pad token). A chat model's config lists the token its
    template ends a turn with where the tokenizer's eos is not it: Gemma 3's <end_of_turn> beside <eos>, Llama 3's
    <|eot_id|> beside <|end_of_text|>."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos token; the sampler could never stop a response")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    listed = (model_eos,) if isinstance(model_eos, int) else tuple(model_eos or ())
    return [eos, *(i for i in dict.fromkeys(listed) if i != eos)], pad


def copy_params(params: nnx.State) -> nnx.State:
    """A copy with its own buffers: the train step donates (invalidates) the params it is given, so whatever
    must outlive a step (the rollout engine's weights, the frozen reference) holds a copy."""
    return jax.tree.map(jnp.copy, params)


def rollout_dtype(dtype: Any, compute_dtype: Any) -> Any:
    """A parameter's dtype in the embedded engine: the compute dtype where that is narrower, else its own."""
    narrower = jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize > jnp.dtype(compute_dtype).itemsize
    return jnp.dtype(compute_dtype) if narrower else jnp.dtype(dtype)


def rollout_model(graphdef: nnx.GraphDef, params: nnx.State, engine: str, *, tensor: Optional[int] = None) -> Decoder:
    """The policy to hand the rollout engine `engine` ("embedded" or "sglang", `RolloutConfig.engine`).

    SGLang: a copy of `params` (`copy_params`), the global model, which `save_hf_checkpoint` writes once, from
    process 0, for every process's server.
    Embedded: the weights in the decode layout over the learner's devices (`sharding.decode_mesh`:
    tensor-parallel within a process, `tensor` wide, None: as wide as the key/value heads allow), each process's
    on its own devices alone, in the policy's compute dtype (`rollout_dtype`: every matmul casts its weights to
    it, so the samples are those of the learner's float32 parameters, at half the bytes a decode step reads and a
    sync moves). One resharding copy of the learner's
    arrays (a collective: every process calls this), then each process's shards become a model of its own: each
    process samples its prompts on its chips, and a model larger than one chip samples."""
    if engine == "sglang":
        return nnx.merge(graphdef, copy_params(params))
    learner_model = nnx.merge(graphdef, params)
    learner_devices = jax.tree.leaves(params)[0].sharding.device_set
    mesh = sharding.decode_mesh(list(learner_devices), learner_model.config.num_kv_heads, tensor)
    shardings = sharding.param_shardings(params, mesh, sharding.partition_rules(learner_model.config))
    cast = lambda leaf: jnp.array(leaf, dtype=rollout_dtype(leaf.dtype, learner_model.dtype), copy=True)  # noqa: E731
    laid_out = jax.jit(lambda tree: jax.tree.map(cast, tree), out_shardings=shardings)(params)
    local_mesh = sharding.process_submesh(mesh)
    return nnx.merge(graphdef, jax.tree.map(
        lambda leaf, placed: jax.make_array_from_single_device_arrays(
            leaf.shape, NamedSharding(local_mesh, placed.spec), [shard.data for shard in leaf.addressable_shards]),
        laid_out, shardings))


@dataclasses.dataclass
class LearnerState:
    params: nnx.State
    opt_state: optax.OptState
    reference: Optional[nnx.State] = None
    critic_params: Optional[nnx.State] = None
    critic_opt_state: Optional[optax.OptState] = None

    def tree(self) -> dict[str, Any]:
        tree = {"params": self.params, "opt_state": self.opt_state}
        if self.reference is not None:
            tree["reference"] = self.reference
        if self.critic_params is not None:
            tree["critic"] = {"params": self.critic_params, "opt_state": self.critic_opt_state}
        return tree

    @classmethod
    def from_tree(cls, tree: dict[str, Any]) -> "LearnerState":
        critic = tree.get("critic", {})
        return cls(tree["params"], tree["opt_state"], tree.get("reference"), critic.get("params"),
                   critic.get("opt_state"))


def init_learner_state(model: Decoder, optimizer: optax.GradientTransformation, mesh: Mesh,
                       with_reference: bool) -> tuple[nnx.GraphDef, LearnerState]:
    """The model split onto `mesh` with a fresh optimizer state (and a frozen copy as the reference)."""
    graphdef, params, opt_state = train_step.init_train_state(
        model, optimizer, mesh, sharding.partition_rules(model.config))
    return graphdef, LearnerState(params, opt_state, copy_params(params) if with_reference else None)


def init_critic(graphdef: nnx.GraphDef, params: nnx.State, optimizer: optax.GradientTransformation, mesh: Mesh
                ) -> tuple[nnx.GraphDef, nnx.State, optax.OptState]:
    """A critic (`models.value.ValueModel`) initialised from a copy of the policy's `params`, as verl's critic
    starts from the actor's checkpoint, laid out on `mesh` by the policy's rules, with a fresh optimizer state of
    its own. Returns (critic graphdef, critic params, critic optimizer state)."""
    trunk = nnx.merge(graphdef, copy_params(params))
    return train_step.init_train_state(ValueModel(trunk, rngs=nnx.Rngs(0)), optimizer, mesh,
                                       sharding.partition_rules(trunk.config))


def abstract_learner_state(state: LearnerState) -> dict[str, Any]:
    """Shapes, dtypes and shardings of `state.tree()`, to restore a checkpoint onto the same layout."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state.tree())
