"""The embedded engine in its decode layout (`policy.rollout_model`, `models.sharding.decode_mesh`) on the 8-device
CPU mesh: the weights split over "tensor" within the process (as wide as the key/value heads allow), rows over
"data", in the compute dtype; the samples those of the same weights on one device.

"The same samples" up to float summation order: a tensor-parallel matmul whose contraction is split (o_proj,
down_proj) sums its partial products in another order, so logits differ in the last bits, and a draw whose uniform
falls that close to a boundary of the inverse CDF picks the token next to the other layout's (index order). So
each sample is the single-device one, or equal to it up to a step where the two tokens are neighbours, the
logprobs before it equal to float tolerance; a wrong layout, key or position would make most samples differ from
their first token on.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_jax.inference.embedded import EmbeddedEngine
from rubric_jax.inference.engine import SamplingParams
from rubric_jax.models import sharding
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.decoder import Decoder
from rubric_jax.training import policy
from tests.training.test_multihost import Launcher, finish

CONFIG = ModelConfig(model_type="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                     num_heads=8, num_kv_heads=4, head_dim=16, max_position_embeddings=512)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9] * 12, [3, 4]]
PARAMS = SamplingParams(max_new_tokens=40, n=4, temperature=1.0, seed=5, stop_token_ids=tuple(range(2, 256, 17)))


def learner_params(mesh=None, **options):
    """(graphdef, the parameters on the host's default device, the same laid out over `mesh` by the learner's
    partition rules; None: every device's FSDP mesh)."""
    model = Decoder(CONFIG, rngs=nnx.Rngs(0), shard_activations=sharding.shard_activations, **options)
    graphdef, params = nnx.split(model)
    mesh = mesh or sharding.make_mesh(1, len(jax.devices()), 1)
    shardings = sharding.param_shardings(params, mesh, sharding.partition_rules(CONFIG))
    placed = jax.tree.map(lambda leaf, s: jax.make_array_from_callback(leaf.shape, s, lambda index: leaf[index]),
                          params, shardings)
    return graphdef, params, placed


def assert_same_samples_up_to_rounding(got, expected):
    diverged = 0
    for a, b in zip(got, expected):
        assert (a.prompt_index, a.weight_version) == (b.prompt_index, b.weight_version)
        steps = [k for k, (x, y) in enumerate(zip(a.output_ids, b.output_ids)) if x != y]
        same = len(a.output_ids) if not steps else steps[0]
        np.testing.assert_allclose(a.logprobs[:same], b.logprobs[:same], atol=1e-5)
        if steps or len(a.output_ids) != len(b.output_ids):
            diverged += 1
            assert steps and abs(a.output_ids[same] - b.output_ids[same]) == 1
    assert diverged <= len(got) // 8


def test_the_decode_layout_splits_the_weights_within_the_process_and_samples_as_one_device():
    graphdef, params, placed = learner_params()
    model = policy.rollout_model(graphdef, placed, "embedded")
    kernel = model.layers[0].mlp.up_proj.kernel[...]
    assert dict(kernel.sharding.mesh.shape) == dict(data=2, fsdp=1, expert=1, tensor=4)  # 4 key/value heads
    assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    assert kernel.addressable_shards[0].data.shape == (64, 128 // 4)
    one_device = nnx.merge(graphdef, policy.copy_params(params))
    samples = EmbeddedEngine(model, eos_token_ids=(), decode_slots=8).generate(PROMPTS, PARAMS)
    assert_same_samples_up_to_rounding(
        samples, EmbeddedEngine(one_device, eos_token_ids=(), decode_slots=8).generate(PROMPTS, PARAMS))
    assert len({len(s.output_ids) for s in samples}) > 3  # rows finish at different steps, slots are refilled


def test_rollout_weights_are_held_in_the_compute_dtype_and_sample_as_the_learners_float32_ones():
    """bfloat16 activations on float32 parameters: every matmul casts its weights to bfloat16, so weights held in
    bfloat16 give the same samples at half the bytes (on one device, where summation orders are the same)."""
    graphdef, params, _ = learner_params(dtype=jnp.bfloat16)
    single = jax.device_put(params, jax.devices()[0])
    model = policy.rollout_model(graphdef, single, "embedded")
    assert {leaf.dtype for leaf in jax.tree.leaves(nnx.state(model))} == {jnp.dtype(jnp.bfloat16)}
    float32 = nnx.merge(graphdef, policy.copy_params(single))
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    expected = EmbeddedEngine(float32, eos_token_ids=()).generate(PROMPTS, greedy)
    got = EmbeddedEngine(model, eos_token_ids=()).generate(PROMPTS, greedy)
    assert [s.output_ids for s in got] == [s.output_ids for s in expected]
    np.testing.assert_array_equal([s.logprobs for s in got], [s.logprobs for s in expected])


def test_a_tensor_width_that_splits_a_head_is_refused():
    graphdef, _, placed = learner_params()
    with pytest.raises(ValueError, match="rollout.tensor_parallel=8 must divide"):
        policy.rollout_model(graphdef, placed, "embedded", tensor=8)


def test_in_two_processes_each_samples_its_share_on_its_own_devices_as_one_device(tmp_path):
    """Two processes of 4 devices, the learner's FSDP mesh over all 8: each process's engine holds its weights on
    its own 4 devices (`tensor=2`: tensor 2 x data 2) and samples its share of the prompts, as one device samples them."""
    launcher = Launcher("tests.training.multihost_rollout_worker", tmp_path / "cache")
    try:
        finish(launcher.start_pair(tmp_path / "run", tmp_path))
    finally:
        launcher.kill_all()
    graphdef, params, _ = learner_params(sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1]))
    one_device = EmbeddedEngine(nnx.merge(graphdef, params), eos_token_ids=(), decode_slots=8)
    for process in range(2):
        result = json.loads((tmp_path / f"samples_{process}.json").read_text())
        assert result["layout"] == {"mesh": dict(data=2, fsdp=1, expert=1, tensor=2), "devices": 4, "local": True}
        expected = one_device.generate(PROMPTS[process::2], PARAMS)
        got = [dataclasses.replace(sample, output_ids=tuple(ids), logprobs=tuple(logprobs))
               for sample, (_, ids, logprobs) in zip(expected, result["samples"])]
        assert [index for index, _, _ in result["samples"]] == [s.prompt_index for s in expected]
        assert_same_samples_up_to_rounding(got, expected)
