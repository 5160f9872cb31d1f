"""Sharding rules and the sharded learner on the 8 simulated CPU devices (tests/conftest.py): partition specs
are what the rules say, non-divisible dimensions fall back to replicated, and a sharded forward and train step
equal the unsharded ones on FSDP-only, TP-only and mixed meshes.
"""

import functools
import re

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rubric_jax.core import losses
from rubric_jax.models import sharding, train_step
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.decoder import Decoder
from rubric_jax.models.logprobs import sequence_logprobs

MODEL_FIXTURES = ["tiny_qwen3_dir", "tiny_qwen3_untied_dir", "tiny_qwen2_dir", "tiny_llama_dir", "tiny_qwen3_moe_dir",
                  "tiny_gemma3_dir"]
# (data, fsdp, expert, tensor). Tiny models: hidden 64, 4 query / 2 KV heads of 16, MLP 128, vocab 320. tensor=4
# splits query heads, the MLP and the vocabulary, but not the 2 KV heads, which fall back to replicated. "expert"
# splits the tiny Qwen3-MoE's 4 experts in two and the batch like "data".
MESHES = {"fsdp": (1, 8, 1, 1), "tensor": (2, 1, 1, 4), "mixed": (2, 2, 1, 2), "expert": (1, 2, 2, 2)}


def mesh_of(shape: tuple[int, int, int, int]):
    data, fsdp, expert, tensor = shape
    return sharding.make_mesh(data, fsdp, tensor, devices=jax.devices()[: int(np.prod(shape))], expert=expert)
# float32 on the CPU: a sharded computation differs from the unsharded one only in summation order.
TOL = dict(atol=2e-5, rtol=2e-5)
LEARNING_RATE = 0.1  # SGD: the update is linear in the gradient, so parameters compare as tightly as gradients


def abstract_decoder(directory) -> Decoder:
    return nnx.eval_shape(lambda: Decoder(ModelConfig.from_pretrained(directory), rngs=nnx.Rngs(0)))


def flat_params(state) -> dict[str, jax.Array]:
    return {".".join(map(str, path)): leaf.get_value() for path, leaf in nnx.to_flat_state(state)}


def test_partition_specs_are_what_the_rules_say(tiny_qwen3_untied_dir):
    rules = sharding.partition_rules(ModelConfig.from_pretrained(tiny_qwen3_untied_dir))
    params = nnx.state(abstract_decoder(tiny_qwen3_untied_dir))
    shardings = sharding.param_shardings(params, sharding.make_mesh(1, 2, 4), rules)
    specs = {path: s.spec for path, s in flat_params(shardings).items()}
    shapes = {path: leaf.shape for path, leaf in flat_params(params).items()}
    expected = {
        "embed_tokens.embedding": P("tensor", "fsdp"),
        "layers.0.self_attn.q_proj.kernel": P("fsdp", "tensor"),
        "layers.0.self_attn.k_proj.kernel": P("fsdp", None),  # 2 KV heads do not split 4 ways
        "layers.0.self_attn.v_proj.kernel": P("fsdp", None),
        "layers.0.self_attn.o_proj.kernel": P("tensor", "fsdp"),
        "layers.0.self_attn.q_norm.scale": P(None),
        "layers.0.input_layernorm.scale": P(None),
        "layers.1.mlp.gate_proj.kernel": P("fsdp", "tensor"),
        "layers.1.mlp.up_proj.kernel": P("fsdp", "tensor"),
        "layers.1.mlp.down_proj.kernel": P("tensor", "fsdp"),
        "norm.scale": P(None),
        "lm_head.kernel": P("fsdp", "tensor"),
    }
    for path, spec in expected.items():
        assert specs[path] == spec, path
        assert sharding.param_partition_spec(path, shapes[path], rules, {"data": 1, "fsdp": 2, "tensor": 4}) == spec


def test_experts_split_over_the_expert_axis_and_the_router_does_not(tiny_qwen3_moe_dir):
    rules = sharding.partition_rules(ModelConfig.from_pretrained(tiny_qwen3_moe_dir))
    params = nnx.state(abstract_decoder(tiny_qwen3_moe_dir))
    shardings = sharding.param_shardings(params, mesh_of(MESHES["expert"]), rules)
    specs = {path: s.spec for path, s in flat_params(shardings).items()}
    assert specs["layers.0.mlp.experts.gate_edf"] == specs["layers.0.mlp.experts.up_edf"] == \
        P("expert", "fsdp", "tensor")
    assert specs["layers.0.mlp.experts.down_efd"] == P("expert", "tensor", "fsdp")
    assert specs["layers.0.mlp.gate.kernel"] == P("fsdp", None)
    assert specs["layers.1.mlp.gate_proj.kernel"] == P("fsdp", "tensor")  # the dense layer: replicated over expert
    # 4 experts do not split 8 ways: that dimension falls back to replicated, the others keep their axes.
    assert sharding.param_partition_spec("layers.0.mlp.experts.gate_edf", (4, 64, 32), rules,
                                         {"data": 1, "fsdp": 2, "expert": 8, "tensor": 2}) == P(None, "fsdp", "tensor")


def test_qwen2_biases_split_like_their_kernels_output_heads(tiny_qwen2_dir):
    rules = sharding.partition_rules(ModelConfig.from_pretrained(tiny_qwen2_dir))
    params = nnx.state(abstract_decoder(tiny_qwen2_dir))
    for tensor, q_spec, kv_spec in [(4, P("tensor"), P(None)),  # 4 query heads split 4 ways, 2 KV heads do not
                                    (2, P("tensor"), P("tensor"))]:
        mesh = sharding.make_mesh(1, 8 // tensor, tensor)
        specs = {path: s.spec for path, s in flat_params(sharding.param_shardings(params, mesh, rules)).items()}
        assert specs["layers.0.self_attn.q_proj.bias"] == q_spec
        assert specs["layers.1.self_attn.k_proj.bias"] == specs["layers.1.self_attn.v_proj.bias"] == kv_spec
        # The bias splits exactly as its kernel's output axis does.
        for proj in ("q_proj", "k_proj", "v_proj"):
            assert specs[f"layers.0.self_attn.{proj}.bias"][0] == specs[f"layers.0.self_attn.{proj}.kernel"][1]


@pytest.mark.parametrize("fixture", MODEL_FIXTURES)
def test_every_parameter_has_a_rule(fixture, request):
    """Unmatched leaves are replicated silently, so a decoder parameter the rules forget must fail here."""
    directory = request.getfixturevalue(fixture)
    rules = sharding.partition_rules(ModelConfig.from_pretrained(directory))
    for path, leaf in flat_params(nnx.state(abstract_decoder(directory))).items():
        assert any(len(r.spec) == leaf.ndim and re.search(r.pattern, path) for r in rules), path


def test_non_divisible_dimensions_fall_back_to_replicated():
    rules = sharding.partition_rules()
    sizes = {"data": 2, "fsdp": 4, "tensor": 2}
    spec = functools.partial(sharding.param_partition_spec, axis_sizes=sizes)
    assert spec("lm_head.kernel", (64, 321), rules) == P("fsdp", None)
    assert spec("embed_tokens.embedding", (320, 62), rules) == P("tensor", None)
    assert spec("layers.3.mlp.down_proj.kernel", (128, 64), rules) == P("tensor", "fsdp")
    # A batch of 6 rows splits over data (2) but not over data x fsdp (8): the dividing prefix is kept.
    assert sharding.logical_to_mesh(("batch", "seq", "embed"), (6, 16, 64), sizes) == P("data", None, None)
    # The batch splits over "expert" too, after data and fsdp.
    assert sharding.logical_to_mesh(("batch", "seq", "embed"), (8, 16, 64), {**sizes, "fsdp": 2, "expert": 2}) == \
        P(("data", "fsdp", "expert"), None, None)
    assert sharding.logical_to_mesh(("batch", "seq", "vocab"), (8, 16, 321), sizes) == P(("data", "fsdp"), None, None)
    # Heads are the unit of the attention projections: 3 heads of 16 do not split over tensor=2 although 48 does.
    head_rules = sharding.partition_rules(ModelConfig("qwen3", 320, 64, 128, 1, 3, 3, 16, 128))
    assert spec("layers.0.self_attn.q_proj.kernel", (64, 48), head_rules) == P("fsdp", None)
    assert spec("layers.0.self_attn.q_proj.kernel", (64, 48), rules) == P("fsdp", "tensor")


def test_optimizer_state_follows_its_parameters(tiny_qwen3_dir):
    params = nnx.state(abstract_decoder(tiny_qwen3_dir))
    mesh, rules = sharding.make_mesh(2, 2, 2), sharding.partition_rules(ModelConfig.from_pretrained(tiny_qwen3_dir))
    param_specs = {p: s.spec for p, s in flat_params(sharding.param_shardings(params, mesh, rules)).items()}
    adam_state = sharding.param_shardings(jax.eval_shape(optax.adamw(1e-3).init, params), mesh, rules)[0]
    assert adam_state.count.spec == P()
    for moments in (adam_state.mu, adam_state.nu):
        assert {p: s.spec for p, s in flat_params(moments).items()} == param_specs


def test_shard_activations_is_a_no_op_outside_a_mesh_and_a_constraint_inside():
    x_btd = np.ones((8, 4, 6), np.float32)
    assert sharding.shard_activations(x_btd, ("batch", "seq", "embed")) is x_btd
    mesh = sharding.make_mesh(2, 2, 2)
    with jax.set_mesh(mesh):
        y_btd = jax.jit(lambda x: sharding.shard_activations(x * 2, ("batch", "seq", "embed")))(x_btd)
    assert y_btd.sharding.is_equivalent_to(NamedSharding(mesh, P(("data", "fsdp"), None, None)), y_btd.ndim)


def test_make_mesh_checks_the_device_count():
    assert dict(sharding.make_mesh(2, 1, 4).shape) == {"data": 2, "fsdp": 1, "expert": 1, "tensor": 4}
    assert dict(sharding.make_mesh(1, 2, 2, expert=2).shape) == {"data": 1, "fsdp": 2, "expert": 2, "tensor": 2}
    with pytest.raises(ValueError, match="needs 4 devices"):
        sharding.make_mesh(1, 2, 2)


def policy_batch(vocab_size: int, rows=8, length=16, prompt=5) -> dict[str, np.ndarray]:
    """Right-padded rows of random length with a `prompt`-token prompt; old logprobs near the model's."""
    rng = np.random.default_rng(0)
    index_bt = np.arange(length)[None, :]
    attention_mask_bt = index_bt < rng.integers(prompt + 2, length + 1, (rows, 1))
    return dict(
        tokens_bt=np.where(attention_mask_bt, rng.integers(0, vocab_size, (rows, length)), 0).astype(np.int32),
        positions_bt=np.broadcast_to(index_bt, (rows, length)).astype(np.int32),
        attention_mask_bt=attention_mask_bt,
        response_mask_bt=attention_mask_bt & (index_bt >= prompt),
        old_logp_bt=rng.normal(-6.0, 0.5, (rows, length)).astype(np.float32),
        advantages_bt=rng.normal(size=(rows, length)).astype(np.float32),
    )


@functools.cache
def run_learner(directory: str, mesh_shape: tuple[int, int, int, int]):
    """(logp, entropy) of a sharded forward and (metrics, params) after one sharded SGD step with PPO clip."""
    model = Decoder(ModelConfig.from_pretrained(directory), rngs=nnx.Rngs(0),
                    shard_activations=sharding.shard_activations)
    rules = sharding.partition_rules(model.config)
    mesh = mesh_of(mesh_shape)
    batch = policy_batch(model.config.vocab_size)
    optimizer = optax.sgd(LEARNING_RATE)
    graphdef, params, opt_state = train_step.init_train_state(model, optimizer, mesh, rules)

    @jax.jit
    def forward(params, batch):
        model = nnx.merge(graphdef, params)
        keys = ("tokens_bt", "positions_bt", "attention_mask_bt", "response_mask_bt")
        return sequence_logprobs(model, *(batch[k] for k in keys), chunk_size=6)

    with jax.set_mesh(mesh):
        logprobs = jax.device_get(forward(params, jax.device_put(batch, sharding.batch_sharding(mesh))))
    loss_fn = train_step.ratio_loss(losses.ppo_clip_loss, eps_low=0.2, eps_high=0.28)
    step = train_step.make_train_step(graphdef, optimizer, loss_fn, mesh=mesh, abstract_params=params, rules=rules,
                                      chunk_size=6)
    expected_shardings = sharding.param_shardings(params, mesh, rules)
    params, _, metrics = step(params, opt_state, batch)
    for array, expected in zip(jax.tree.leaves(params), jax.tree.leaves(expected_shardings)):
        assert array.sharding.is_equivalent_to(expected, array.ndim)
    return logprobs, jax.device_get(metrics), jax.device_get(flat_params(params))


# Qwen2 on the mixed mesh: its q/k/v biases split over "tensor" with their heads, and their gradients too. Qwen3-MoE
# on the expert mesh: the experts' stacked weights split over "expert" and like the dense MLP's, their grouped
# matmuls partitioned by XLA.
@pytest.mark.parametrize("fixture, mesh_name", [("tiny_qwen3_untied_dir", "fsdp"), ("tiny_qwen3_untied_dir", "tensor"),
                                                ("tiny_qwen3_untied_dir", "mixed"), ("tiny_qwen2_dir", "mixed"),
                                                ("tiny_qwen3_moe_dir", "expert"), ("tiny_gemma3_dir", "mixed")])
def test_sharded_forward_and_train_step_equal_unsharded(fixture, mesh_name, request):
    directory = str(request.getfixturevalue(fixture))
    logprobs, metrics, params = run_learner(directory, MESHES[mesh_name])
    ref_logprobs, ref_metrics, ref_params = run_learner(directory, (1, 1, 1, 1))
    for value, ref_value in zip(logprobs, ref_logprobs):
        np.testing.assert_allclose(value, ref_value, **TOL)
    assert metrics.keys() == ref_metrics.keys() == {"loss", "grad_norm", "entropy", "clip_fraction"}
    for name in metrics:
        np.testing.assert_allclose(metrics[name], ref_metrics[name], **TOL, err_msg=name)
    assert ref_metrics["grad_norm"] > 0
    for path in params:
        np.testing.assert_allclose(params[path], ref_params[path], **TOL, err_msg=path)
