"""The paper configs whose policy is a Qwen2.5 base model (rgr_grpo_paper.yaml: Qwen2.5-7B, dapo_paper.yaml:
Qwen2.5-32B) load a Qwen2 checkpoint: each config as written, with model.path pointed at the tiny Qwen2 checkpoint
and only what a CPU host cannot run changed, builds its policy through the trainer's own calls (`resolve_algorithm`,
`policy.make_mesh`, `policy.build_policy`), with the config's decoder options, and computes transformers' logits.
A real Qwen2.5 directory takes the same path; `rubric-jax plan` reads it, or the preset the config's model names.
"""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from jax.sharding import NamedSharding

from rubric_jax.models import sharding
from rubric_jax.models.config import ModelConfig, preset_config
from rubric_jax.training import plan, policy
from rubric_jax.training.run_config import RLConfig, resolve_algorithm
from rubric_jax.yaml_config import load_config

ROOT = Path(__file__).resolve().parents[2]
PAPERS = ("rgr_grpo", "dapo")
# A CPU host cannot run bfloat16 activations (XLA's CPU backend, `policy.build_policy`), and the tests have 8
# simulated devices, not DAPO's 16.
CPU_OVERRIDES = ["model.compute_dtype=float32", "learner.mesh.fsdp=8"]
TOKENS = np.array([[5, 17, 250, 3, 99, 300, 7, 64], [1, 2, 3, 4, 5, 6, 7, 8]])


def paper_config(paper: str, *overrides: str) -> RLConfig:
    return load_config(RLConfig, ROOT / "configs" / f"{paper}_paper.yaml", list(overrides))


@pytest.mark.parametrize("paper", PAPERS)
def test_the_paper_configs_model_is_a_qwen2_preset(paper):
    """The model the config names (model.path's directory name) is a Qwen2 architecture `plan` knows."""
    written = paper_config(paper)
    preset = preset_config(Path(written.model.path).name)
    assert preset.model_type == "qwen2" and preset.qkv_bias
    assert plan.model_config(written, Path(written.model.path).name) == preset


@pytest.mark.parametrize("paper", PAPERS)
def test_the_paper_config_builds_its_policy_from_a_qwen2_checkpoint(paper, tiny_qwen2_untied_dir):
    written = paper_config(paper)
    _, config = resolve_algorithm(paper_config(paper, f"model.path={tiny_qwen2_untied_dir}", *CPU_OVERRIDES))
    # Nothing else of the model section changed: dapo's remat and scanned layers are built as written.
    assert dataclasses.replace(config.model, path=written.model.path, compute_dtype=written.model.compute_dtype) \
        == written.model
    mesh = policy.make_mesh(config.learner.mesh)
    model, tokenizer = policy.build_policy(config.model, None, mesh)
    assert model.config == ModelConfig.from_pretrained(tiny_qwen2_untied_dir) == plan.model_config(config, None)
    assert (model.remat, model.scan_layers) == (config.model.remat, config.model.scan_layers)
    assert tokenizer.eos_token_id == model.config.eos_token_id

    rules = sharding.partition_rules(model.config)
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        array = variable.get_value()
        spec = sharding.param_partition_spec(".".join(map(str, path)), array.shape, rules, dict(mesh.shape))
        assert array.sharding == NamedSharding(mesh, spec), path

    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen2_untied_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = hf(torch.tensor(TOKENS)).logits.numpy()
    positions = np.broadcast_to(np.arange(TOKENS.shape[1]), TOKENS.shape)
    hidden, _ = model(TOKENS, positions, np.ones(TOKENS.shape, bool))
    # float32 on the CPU, summation order only (tests/models/test_decoder.py's PARITY_TOL).
    np.testing.assert_allclose(np.asarray(model.logits(hidden)), expected, atol=1e-4, rtol=1e-4)
