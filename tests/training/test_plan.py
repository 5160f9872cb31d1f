"""`rubric-jax plan`: a tiny model's learner compiled for TPU topologies on this CPU host (libtpu, no TPU).

The per-chip argument bytes are checked against the partition rules worked out by hand from the parameter shapes
and the mesh. Shapes are chosen so that no array is padded by TPU tiling ((8, 128) for 32-bit arrays, (32, 128)
for bool), except the optimizer's scalar step counts, each of which takes one 512-byte TPU tile.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from rubric_jax import cli
from rubric_jax.algorithms import registry
from rubric_jax.models import train_step
from rubric_jax.models.config import ModelConfig, preset_config
from rubric_jax.models.decoder import Decoder
from rubric_jax.training import plan
from rubric_jax.training.run_config import RLConfig
from rubric_jax.yaml_config import load_config

pytest.importorskip("libtpu")

WIDTH, MLP, HEADS, KV_HEADS, HEAD, VOCAB, LAYERS = 512, 1024, 4, 2, 128, 512, 1
TINY = ModelConfig(model_type="qwen3", vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=MLP,
                   num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD,
                   max_position_embeddings=4096)
TINY_QWEN2 = dataclasses.replace(TINY, model_type="qwen2")  # q/k/v biases instead of q/k norms
PROMPT, RESPONSE, ROWS = 128, 128, 128
# The inputs of the learner's batch that the rar recipe's step reads (jit drops the others: the rollout logprobs):
# int32 tokens and positions, bool masks, float32 advantages and old logprobs.
BATCH_BYTES_PER_TOKEN = 4 + 4 + 1 + 1 + 4 + 4
TILE = 512
# AdamW's state holds a step count, and so does its learning-rate schedule.
OPTIMIZER_SCALARS = 2


def _config_file(tmp_path, model: ModelConfig = TINY) -> str:
    (tmp_path / "model").mkdir(parents=True)
    (tmp_path / "model" / "config.json").write_text(json.dumps(model.to_hf_dict()))
    path = tmp_path / "run.yaml"
    path.write_text(f"output_dir: {tmp_path}/run\nsteps: 1\nmodel: {{path: {tmp_path}/model}}\n"
                    f"rollout: {{prompts_per_step: {ROWS // 4}, group_size: 4, max_new_tokens: {RESPONSE}, "
                    f"max_prompt_tokens: {PROMPT}}}\n")
    return str(path)


def _expected_parameters_per_chip(model: ModelConfig, *, fsdp: int, tensor: int) -> int:
    """The policy's parameters on one chip, by the partition rules of `models.sharding`."""
    def kernel(rows, cols, tensor_dim):
        # Every 2-D kernel is split over fsdp on its model dimension and over tensor on its other one.
        return rows * cols // fsdp // (tensor if tensor_dim else 1)

    per_layer = (kernel(WIDTH, HEADS * HEAD, True) + 2 * kernel(WIDTH, KV_HEADS * HEAD, True)
                 + kernel(HEADS * HEAD, WIDTH, True) + 3 * kernel(WIDTH, MLP, True)
                 + 2 * WIDTH)  # the norms are replicated
    if model.qk_norm:
        per_layer += 2 * HEAD  # replicated
    if model.qkv_bias:
        per_layer += (HEADS + 2 * KV_HEADS) * HEAD // tensor  # split over tensor by heads, like the kernels' outputs
    return LAYERS * per_layer + 2 * kernel(VOCAB, WIDTH, True) + WIDTH  # embedding, lm_head, final norm


def _expected_argument_bytes(model: ModelConfig, *, fsdp: int, tensor: int, data: int) -> int:
    """Parameters, AdamW's two moments and the batch per chip."""
    params = _expected_parameters_per_chip(model, fsdp=fsdp, tensor=tensor)
    batch = ROWS // (data * fsdp) * (PROMPT + RESPONSE) * BATCH_BYTES_PER_TOKEN
    return 3 * 4 * params + OPTIMIZER_SCALARS * TILE + batch


@pytest.mark.parametrize("model, topology, mesh", [(TINY, "v5e:2x2", dict(data=1, fsdp=4, tensor=1)),
                                                   (TINY, "v4:2x2x1", dict(data=1, fsdp=2, tensor=2)),
                                                   (TINY_QWEN2, "v4:2x2x1", dict(data=1, fsdp=2, tensor=2))],
                         ids=["qwen3-fsdp", "qwen3-tensor", "qwen2-tensor"])
def test_argument_bytes_follow_the_partition_rules(tmp_path, model, topology, mesh):
    # XLA attention: the splash kernel adds its mask tables to the arguments.
    overrides = ["model.attention=xla", *(f"learner.mesh.{axis}={size}" for axis, size in mesh.items())]
    config = load_config(RLConfig, _config_file(tmp_path, model), overrides)
    result = plan.plan_learner(config, model, topology, prompt_tokens=PROMPT)
    assert result.chips == 4 and result.mesh == {"expert": 1, **mesh}
    assert result.train.argument_bytes == _expected_argument_bytes(model, **mesh)
    assert result.fits and result.attention == "xla"
    assert result.train.flops > 0 and 0 < result.mfu_ceiling <= 1
    assert result.step_flops >= result.model_flops == 6 * result.parameters * ROWS * (PROMPT + RESPONSE)


# 8 experts of width 256, 2 per token: a mixture of experts' model FLOPs count its active parameters.
TINY_MOE = dataclasses.replace(TINY, model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                               moe_intermediate_size=256, norm_topk_prob=True)


def test_a_mixture_of_experts_splits_its_experts_over_the_expert_axis_and_counts_its_active_parameters(tmp_path):
    """On v5e:2x2 with fsdp 2: an expert axis of 2 (instead of data 2) halves each chip's share of the experts'
    parameters and moments, and nothing else; the model's FLOPs are 6 N_active tokens, with 2 of 8 experts."""
    experts = 3 * 8 * WIDTH * 256
    plans = {}
    for axis in ("data", "expert"):
        config = load_config(RLConfig, _config_file(tmp_path / axis, TINY_MOE),
                             ["model.attention=xla", "learner.mesh.fsdp=2", f"learner.mesh.{axis}=2",
                              "learner.router_aux_loss_coef=0.001"])
        plans[axis] = plan.plan_learner(config, TINY_MOE, "v5e:2x2", prompt_tokens=PROMPT)
    data, expert = plans["data"], plans["expert"]
    assert expert.mesh == {"data": 1, "fsdp": 2, "expert": 2, "tensor": 1}
    assert data.parameters == expert.parameters and data.active_parameters == expert.active_parameters
    assert expert.parameters - expert.active_parameters == experts * 6 // 8
    assert expert.model_flops == 6 * expert.active_parameters * ROWS * (PROMPT + RESPONSE)
    experts_bytes_per_chip = 4 * experts // 2  # the experts' D over fsdp 2
    assert data.state_bytes["policy"] - expert.state_bytes["policy"] == experts_bytes_per_chip // 2
    assert data.state_bytes["optimizer"] - expert.state_bytes["optimizer"] == experts_bytes_per_chip
    assert "B active per token" in expert.report() and "6 N_active tokens" in expert.report()
    assert expert.fits


def test_a_gemma3_model_is_planned_with_the_attention_it_runs(tmp_path):
    """`model.attention: auto` would pick splash on a TPU; Gemma 3's sliding-window layers attend by XLA, and the
    plan compiles and reports what the run would run."""
    gemma = dataclasses.replace(TINY, model_type="gemma3_text", layer_types=("sliding_attention",),
                                sliding_window=64, query_pre_attn_scalar=HEAD, tie_word_embeddings=True)
    config = load_config(RLConfig, _config_file(tmp_path, gemma), ["learner.mesh.fsdp=4"])
    result = plan.plan_learner(config, gemma, "v5e:2x2", prompt_tokens=PROMPT)
    assert result.attention == "xla" and "attention xla" in result.report() and result.fits


def test_scanned_layers_and_bfloat16_activations_keep_the_arguments_and_shrink_the_temporaries(tmp_path):
    """`model.scan_layers` with `model.compute_dtype=bfloat16` changes no argument (the parameters keep their
    per-layer arrays and float32), and the report says so; XLA's FLOP count, which counts the layer loop's body
    once, is not reported, and the step-time bound falls back on 6 N tokens. The step's temporaries (with remat:
    the residuals and one layer's activations) are smaller than the unrolled float32 decoder's."""
    base = ["model.attention=xla", "learner.mesh.fsdp=4", "model.remat=true"]
    wide = dataclasses.replace(TINY, num_layers=2)
    scanned, unrolled = (
        plan.plan_learner(load_config(RLConfig, _config_file(tmp_path / name, wide), [*base, *extra]), wide,
                          "v5e:2x2", prompt_tokens=PROMPT)
        for name, extra in (("scanned", ["model.scan_layers=true", "model.compute_dtype=bfloat16"]), ("unrolled", [])))
    assert scanned.train.argument_bytes == unrolled.train.argument_bytes
    assert scanned.compiled_flops is None and scanned.step_flops == scanned.model_flops
    assert "layers scanned, bfloat16 activations" in scanned.report()
    assert "compiled n/a (scanned layers)" in scanned.report()
    assert "layers unrolled, float32 activations" in unrolled.report() and unrolled.compiled_flops > 0
    assert scanned.train.temp_bytes < unrolled.train.temp_bytes


def test_a_second_role_a_critic_and_a_reference_are_planned_and_their_state_counted(tmp_path):
    """RLCER with PPO's critic and a KL reference: the rubricator's rows join the batch, the critic's update and
    values pass are compiled, and each phase carries the learner state that is not its argument (4 bytes a
    parameter, AdamW's two moments twice that plus two scalar counts)."""
    config = load_config(RLConfig, _config_file(tmp_path), [
        "model.attention=xla", "learner.mesh.fsdp=4", "rollout.prompts_per_step=4", "algorithm.name=rlcer",
        "algorithm.params.estimator=ppo_critic", "algorithm.params.policy_loss.kl_coef=0.1",
        "algorithm.params.rubricator_max_new_tokens=256"])
    result = plan.plan_learner(config, TINY, "v5e:2x2", prompt_tokens=PROMPT)
    # The rubricator's prompt holds a CoT, up to the prompt cap (max_prompt_tokens = PROMPT).
    assert {name: (r.rows, r.prompt_tokens, r.response_tokens) for name, r in result.roles.items()} == {
        "reasoner": (16, PROMPT, RESPONSE), "rubricator": (16, PROMPT, 256)}
    assert (result.rows, result.logprob_rows, result.length) == (32, 32, PROMPT + 256)
    assert [phase.name for phase in result.phases] == ["train step", "critic update", "logprobs", "critic values"]
    state = result.state_bytes
    policy_bytes = 4 * _expected_parameters_per_chip(TINY, fsdp=4, tensor=1)
    assert state["policy"] == state["reference"] == policy_bytes
    assert state["optimizer"] == 2 * policy_bytes + 2 * 4
    # The critic: the trunk without the (untied) lm_head, plus a [D, 1] head (split over fsdp) and its bias.
    lm_head_bytes = 4 * VOCAB * WIDTH // 4
    assert state["critic"] == policy_bytes - lm_head_bytes + 4 * (WIDTH // 4 + 1)
    assert state["critic optimizer"] == 2 * state["critic"] + 2 * 4
    everything = sum(state.values())
    for phase, arguments in (("train step", ("policy", "optimizer")), ("critic update", ("critic", "critic optimizer")),
                             ("logprobs", ("policy",)), ("critic values", ("critic",))):
        assert result.phase(phase).resident_bytes == everything - sum(state[key] for key in arguments)
        assert result.phase(phase).peak_bytes == result.phase(phase).compiled.total_bytes + \
            result.phase(phase).resident_bytes
    assert result.fits


def test_cli_plans_what_fits(tmp_path, capsys):
    assert cli.main(["plan", _config_file(tmp_path), "learner.mesh.fsdp=4", "rollout.prompts_per_step=1",
                     "--topology", "v5e:2x2"]) == 0
    out = capsys.readouterr().out
    assert "topology v5e:2x2: 4 chips" in out and "\nfits\n" in out and out.endswith("rollouts fit\n")
    assert "attention splash" in out  # "auto" on TPU for a sequence that is a multiple of 128


def test_rollouts_are_planned_in_the_decode_layout_and_read_the_cache_in_use(tmp_path):
    """TINY's 2 key/value heads on a 4-chip host: tensor 2, data 2. 128 slots of 128 + 2048 cache positions; the
    decode step with rows half full attends to 1224 slots (1088 + a chunk, in blocks of 2176 / 16) and reads the
    weights' shard, those slots' keys and values, and little else."""
    from rubric_jax.training import rollout_plan  # noqa: PLC0415

    config = load_config(RLConfig, _config_file(tmp_path), ["learner.mesh.fsdp=4", "rollout.max_new_tokens=1920"])
    rollouts = rollout_plan.plan_rollouts(config, TINY, "v5e:2x2", prompt_tokens=PROMPT)
    assert rollouts.mesh == dict(data=2, fsdp=1, expert=1, tensor=2)
    assert (rollouts.slots, rollouts.cache_slots, rollouts.attended_slots) == (ROWS, 2176, 1224)
    assert rollouts.weight_bytes == 4 * _expected_parameters_per_chip(TINY, fsdp=1, tensor=2)
    kv_bytes_per_slot = LAYERS * 2 * (ROWS // 2) * (KV_HEADS // 2) * HEAD * 4  # keys and values, float32
    assert rollouts.cache_bytes == kv_bytes_per_slot * 2176
    attended = rollouts.weight_bytes + kv_bytes_per_slot * 1224
    assert attended <= rollouts.decode_read_bytes <= 1.05 * attended
    assert rollouts.read_ratio == rollouts.decode_read_bytes / (rollouts.weight_bytes + rollouts.cache_bytes // 2)
    assert rollouts.fits and rollouts.max_slots > ROWS
    assert "decode step, rows 50% full (attending to 1224 of 2176 slots)" in rollouts.report()


def test_rollouts_bind_only_a_config_that_samples_with_the_embedded_engine(tmp_path, capsys, monkeypatch):
    """Rollouts planned against an HBM that holds the weights alone (no slot fits): a run on the embedded engine
    exits 1 for them, one that samples with SGLang is told what the embedded engine would need and exits 0."""
    from rubric_jax.training import rollout_plan  # noqa: PLC0415

    planned = rollout_plan.plan_rollouts

    def starved(*args, **kwargs):
        rollouts = planned(*args, **kwargs)
        return dataclasses.replace(rollouts, chip=dataclasses.replace(rollouts.chip, hbm_bytes=rollouts.weight_bytes))

    monkeypatch.setattr(rollout_plan, "plan_rollouts", starved)
    args = ["plan", _config_file(tmp_path), "learner.mesh.fsdp=4", "rollout.prompts_per_step=1",
            "--topology", "v5e:2x2"]
    assert cli.main(args) == 1
    captured = capsys.readouterr()
    assert "rollouts DO NOT FIT" in captured.out and "the rollouts do not fit in v5e:2x2's HBM" in captured.err
    assert "(at most 0 fit)" in captured.err
    assert cli.main(args[:2] + ["rollout.engine=sglang", "rollout.sglang_url=http://localhost:30000"] + args[2:]) == 0
    captured = capsys.readouterr()
    assert "this config samples with SGLang" in captured.out and "rollouts DO NOT FIT" in captured.out
    assert captured.err == ""


def test_cli_refuses_what_does_not_fit(tmp_path, capsys):
    # One layer, but an embedding and lm_head of 2 * 262144 * 16384 = 8.6 B parameters: with AdamW's moments
    # 103 GB, a quarter of it on each 16 GiB chip.
    wide = dataclasses.replace(TINY, vocab_size=262144, hidden_size=16384, num_layers=1)
    assert cli.main(["plan", _config_file(tmp_path, wide), "learner.mesh.fsdp=4", "--topology", "v5e:2x2"]) == 1
    captured = capsys.readouterr()
    assert "DOES NOT FIT" in captured.out and "does not fit in v5e:2x2's HBM" in captured.err


@pytest.mark.parametrize("args, message", [
    (["--topology", "v9:2x2"], "expected <generation>:<shape>"),
    (["--topology", "v5e:2x2"], "must have one device per chip of v5e:2x2 (4)"),
    (["--topology", "v5e:2x2", "--model-preset", "GPT-9"], "unknown model preset 'GPT-9'"),
])
def test_cli_input_errors_exit_2_with_one_line(tmp_path, capsys, args, message):
    assert cli.main(["plan", _config_file(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def _qwen2_parameters(vocab, hidden, mlp, layers, kv_width, tied):
    """A Qwen2 decoder's parameter count by hand: per layer the q and o kernels (hidden^2 each), k and v kernels
    (hidden x kv_width), the q/k/v biases (hidden + 2 kv_width), the SwiGLU MLP (3 hidden x mlp) and two norms;
    the embedding, the untied lm_head and the final norm."""
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_width + hidden + 2 * kv_width + 3 * hidden * mlp + 2 * hidden
    return layers * per_layer + (1 if tied else 2) * vocab * hidden + hidden


@pytest.mark.parametrize("name, parameters", [
    ("Llama-3.1-8B", 8_030_261_248),  # the model card's count
    # From Qwen2.5's published config.json shapes (head_dim 128): the published counts 3,085,938,688 (3B),
    # 7,615,616,512 (7B) and 32,763,876,352 (32B, its safetensors' 65,527,752,704 bfloat16 bytes / 2).
    ("Qwen2.5-3B", _qwen2_parameters(151936, 2048, 11008, 36, 2 * 128, tied=True)),
    ("Qwen2.5-7B", _qwen2_parameters(152064, 3584, 18944, 28, 4 * 128, tied=False)),
    ("Qwen2.5-32B", _qwen2_parameters(152064, 5120, 27648, 64, 8 * 128, tied=False)),
    # The model card's 30.5B: embedding and lm_head, and per layer the attention (q/k norms of 128), two norms,
    # the router and 128 experts' three [2048, 768] matrices.
    ("Qwen3-30B-A3B", 2 * 151936 * 2048 + 2048 + 48 * (
        2048 * 4096 * 2 + 2048 * 512 * 2 + 2 * 128 + 2 * 2048 + 2048 * 128 + 128 * 3 * 2048 * 768)),
])
def test_presets_have_the_published_parameter_counts(name, parameters):
    abstract = nnx.eval_shape(lambda: Decoder(preset_config(name), rngs=nnx.Rngs(0)))
    assert sum(leaf.size for leaf in jax.tree.leaves(nnx.state(abstract))) == parameters


@pytest.fixture
def synthetic_memory(monkeypatch):
    """The search's compiles replaced by a memory model (per chip: train step 1000 bytes / micro-batches, halved by
    remat; logprob pass 600 / forward micro-batches), so the search's policy is checked exactly and fast; the
    learners are still built for the topology. (XLA's TPU memory reports of a tiny model are too coarse for this:
    small temporaries may be placed off HBM and reported as 0.)"""

    def phase(name, total):
        return [plan.Phase(name, plan.Compiled(total, 0, 0, 0, 1.0, 0.0), resident_bytes=0)]

    monkeypatch.setattr(plan, "_update_phases", lambda learner: phase(
        "train step", (500 if learner.config.model.remat else 1000) // learner.config.learner.micro_batches))
    monkeypatch.setattr(plan, "_forward_phases", lambda learner: phase(
        "logprobs", 600 // learner.config.learner.forward_splits))


@pytest.mark.parametrize("budget, fits, overrides, train_tries, logprob_tries", [
    (300, True, ["learner.micro_batches=4", "learner.forward_micro_batches=2"],
     [("off", 1), ("off", 2), ("off", 4)], [1, 2]),  # the config's forward micro-batches, not the train step's
    (200, True, ["model.remat=true", "learner.micro_batches=4", "learner.forward_micro_batches=4"],
     [("off", 1), ("off", 2), ("off", 4), ("on", 1), ("on", 2), ("on", 4)], [1, 2, 4]),
    (100, False, ["model.remat=true", "learner.micro_batches=4", "learner.forward_micro_batches=4"],
     [("off", 1), ("off", 2), ("off", 4), ("on", 1), ("on", 2), ("on", 4)], [1, 2, 4]),
])
def test_search_doubles_micro_batches_then_tries_remat(tmp_path, synthetic_memory, budget, fits, overrides,
                                                       train_tries, logprob_tries):
    # 16 rows over 4 chips: at most 4 micro-batches of one row per chip.
    config = load_config(RLConfig, _config_file(tmp_path), ["learner.mesh.fsdp=4", "rollout.prompts_per_step=4"])
    tried = []
    result, found = plan.search_learner(config, TINY, "v5e:2x2", prompt_tokens=PROMPT, hbm_bytes=budget,
                                        log=tried.append)
    assert result.fits == fits and result.chip.hbm_bytes == budget and found == overrides
    assert [line.split(":")[0] for line in tried] == (
        [f"train step, remat {remat}, {micro} micro-batches" for remat, micro in train_tries]
        + [f"logprobs, {forward} micro-batches" for forward in logprob_tries])


def test_search_changes_nothing_that_fits(tmp_path, synthetic_memory):
    config = load_config(RLConfig, _config_file(tmp_path), ["learner.mesh.fsdp=4", "learner.forward_micro_batches=2"])
    result, found = plan.search_learner(config, TINY, "v5e:2x2", prompt_tokens=PROMPT, hbm_bytes=1000)
    assert result.fits and found == [] and (result.micro_batches, result.forward_micro_batches) == (1, 2)


def test_cli_search_reports_a_config_that_fits_as_it_is(tmp_path, capsys):
    assert cli.main(["plan", _config_file(tmp_path), "learner.mesh.fsdp=4", "rollout.prompts_per_step=1",
                     "model.attention=xla", "--topology", "v5e:2x2", "--search", "--hbm-gib", "8"]) == 0
    captured = capsys.readouterr()
    assert "8.00 GiB HBM" in captured.out and "\nfits\n" in captured.out
    assert captured.out.endswith("rollouts fit\nfits as configured\n")
    assert captured.err.count("tried: ") == 2  # one train step, one logprobs pass
    with pytest.raises(SystemExit) as exit_:
        cli.main(["plan", "run.yaml", "--topology", "v5e:2x2", "--hbm-gib", "-1"])
    assert exit_.value.code == 2 and "argument --hbm-gib: must be > 0, got -1.0" in capsys.readouterr().err


@pytest.mark.parametrize("name", registry.names())
def test_every_recipes_loss_reads_only_arrays_the_plan_provides(name):
    """`plan` compiles a recipe's loss on `plan.POLICY_BATCH` (and the reference's logprobs), to which the update
    step adds its token-mean weights: a loss that reads another array would fail there with a KeyError, so each
    registered recipe's loss is traced on it."""
    algorithm = registry.algorithm_class(name)(registry.algorithm_class(name).config_class())
    batch = {key: jax.ShapeDtypeStruct((4, 16) if key.endswith("_bt") else (4,),
                                       jnp.float32 if key not in ("tokens_bt", "positions_bt") else jnp.int32)
             for key in plan.POLICY_BATCH + ("ref_logp_bt", train_step.TOKEN_MEAN_WEIGHTS)}
    for key in ("attention_mask_bt", "response_mask_bt", "off_policy_b"):
        batch[key] = jax.ShapeDtypeStruct(batch[key].shape, jnp.bool_)
    logp = jax.ShapeDtypeStruct((4, 16), jnp.float32)
    loss_bt, _ = jax.eval_shape(algorithm.loss_fn(), logp, logp, batch)
    assert loss_bt.shape == (4, 16)
