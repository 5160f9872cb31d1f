"""The RL loop end to end on a tiny random model: one full step writes every metric the issue lists (finite),
checkpoints, plots and the final model; the update optimises its objective on a repeated batch; the KL path
keeps a frozen reference; several epochs, mini-batches and micro-batches run; the engine gets each step's
weights."""

import dataclasses
import itertools
import json
import math

import jax
import numpy as np
import optax
import pytest
import transformers
from flax import nnx

from rubric_jax.algorithms.base import RolloutContext
from rubric_jax.algorithms.rar import RaR, RaRConfig
from rubric_jax.algorithms.registry import register
from rubric_jax.inference.embedded import EmbeddedEngine
from rubric_jax.inference.engine import SamplingParams
from rubric_jax.models import sharding, train_step
from rubric_jax.models.safetensors_io import load_hf_checkpoint
from rubric_jax.models.tokenizer import load_tokenizer
from rubric_jax.training import policy
from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.metrics import PhaseTimer, read_metrics
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import (
    AlgorithmSpec, CheckpointConfig, LearnerConfig, MeshConfig, MetricsConfig, ModelInit, ModelSpec, RLConfig,
    RolloutConfig)
from rubric_jax.data.tasks import build_task
from rubric_jax.training.run_config import JudgeConfig, MetaVerifierConfig
from rubric_jax.yaml_config import load_config
from tests.inference.standin_server import StandinServer, http_error
from tests.tiny_checkpoints import EMPTY_THINK_BLOCK
from tests.training.toy_task import CHECKS, toy_task

TINY = ModelInit(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                 max_position_embeddings=96)


def tiny_rl_config(tmp_path, **changes) -> RLConfig:
    fields = dict(
        output_dir=str(tmp_path / "run"), steps=1, model=ModelSpec(init=TINY), seed=3,
        rollout=RolloutConfig(prompts_per_step=2, group_size=4, max_new_tokens=16),
        checkpoint=CheckpointConfig(every_steps=1), metrics=MetricsConfig(console=False))
    fields.update(changes)
    return RLConfig(**fields)


def test_a_learner_scanning_its_layers_trains_and_bfloat16_activations_are_refused_on_cpu(tmp_path):
    """`model.scan_layers`: two steps, finite metrics, a gradient, and the learner's logprobs of the sampled
    tokens those of the engine (the same model decoding unrolled with its cache). `model.compute_dtype: bfloat16`,
    which the paper configs add for accelerators, stops a CPU run before anything is written."""
    config = tiny_rl_config(tmp_path, steps=2, model=ModelSpec(init=TINY, scan_layers=True))
    train_rl(config, toy_task())
    lines = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert all(math.isfinite(value) for value in line.values())
        assert line["train/grad_norm"] > 0 and line["mismatch/max_abs"] < 1e-4

    config = tiny_rl_config(tmp_path / "bf16", model=ModelSpec(init=TINY, compute_dtype="bfloat16"))
    with pytest.raises(ValueError, match="model.compute_dtype bfloat16 needs GPUs or TPUs"):
        train_rl(config, toy_task())
    assert not (tmp_path / "bf16" / "run").exists()


def test_one_full_rl_step_writes_every_metric_checkpoint_plot_and_model(tmp_path):
    config = tiny_rl_config(tmp_path)
    last = train_rl(config, toy_task())
    run = tmp_path / "run"
    [line] = read_metrics(run / "metrics.jsonl")
    assert line["step"] == 1 and line == {"step": 1, **last}
    expected = {"reward/mean", "reward/std", "advantage/mean", "advantage/std", "outcome/accuracy",
                "response/length_mean", "response/truncated_fraction", "judge/failure_rate",
                "train/loss", "train/grad_norm", "train/entropy", "train/clip_fraction", "train/learning_rate",
                "mismatch/k3", "mismatch/max_abs", "time/generation", "time/judging", "time/logprobs",
                "time/update", "time/sync", "time/checkpoint", "time/step"}
    expected |= {f"rubric/{name}" for name in CHECKS}
    assert expected <= line.keys()
    assert all(math.isfinite(value) for value in line.values())
    # The learner's logprobs of the sampled tokens are the engine's (the same model, one step earlier).
    assert line["mismatch/max_abs"] < 1e-4
    assert 0 < line["reward/mean"] < 1 and line["advantage/std"] > 0 and line["train/grad_norm"] > 0
    assert Checkpointer(run / "checkpoints").latest_step() == 1
    assert {p.name for p in (run / "plots").iterdir()} >= {"reward.png", "loss.png", "time.png"}
    assert list((run / "tensorboard").iterdir())
    assert load_config(RLConfig, run / "config.yaml").algorithm.params["max_items"] == 16
    saved = load_hf_checkpoint(run / "model")
    assert saved.config.hidden_size == TINY.hidden_size


@register("test_rl_recipe_outputs")
class RaRWithOutputs(RaR):
    """RaR with a console key and a plot panel of its own (`Algorithm.console_metrics`, `Algorithm.plot_panels`)."""

    console_metrics = ("response/truncated_fraction", "reward/mean")
    plot_panels = {"truncation": ("response/truncated_fraction", "reward/std")}


def test_a_recipes_console_metrics_and_plot_panels_join_the_runs(tmp_path, capsys):
    """The console line shows the recipe's keys after the default ones (a default one it names, once), and the
    recipe's panel is plotted beside the default ones."""
    config = tiny_rl_config(tmp_path, algorithm=AlgorithmSpec(name="test_rl_recipe_outputs"),
                            metrics=MetricsConfig(tensorboard=False))
    train_rl(config, toy_task())
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step 1/1 |")]
    shown = [part.rsplit(" ", 1)[0] for part in line.split(" | ")[1:-2]]
    assert shown == ["reward/mean", "judge/failure_rate", "train/loss", "train/grad_norm", "train/entropy",
                     "response/truncated_fraction"]
    assert {path.name for path in (tmp_path / "run" / "plots").iterdir()} >= {"truncation.png", "reward.png",
                                                                              "loss.png"}


@pytest.mark.parametrize("source", ["init", "checkpoint"])
def test_one_rl_step_trains_a_qwen2_policy_and_its_biases(tmp_path, tiny_qwen2_untied_dir, source):
    """Qwen2 end to end, random (`model.init.model_type: qwen2`) or from a Hugging Face directory: the engine's
    logprobs are the learner's, the q/k/v biases get gradients, and the saved model is Qwen2 with its biases."""
    if source == "init":
        model = ModelSpec(init=dataclasses.replace(TINY, model_type="qwen2"))
        initial_bias = np.zeros(TINY.num_heads * TINY.head_dim, np.float32)  # Linear biases start at zero
    else:
        model = ModelSpec(path=str(tiny_qwen2_untied_dir))
        initial_bias = np.asarray(load_hf_checkpoint(tiny_qwen2_untied_dir).layers[0].self_attn.q_proj.bias[...])
    last = train_rl(tiny_rl_config(tmp_path, model=model), toy_task())
    assert all(math.isfinite(value) for value in last.values())
    assert last["mismatch/max_abs"] < 1e-4 and last["train/grad_norm"] > 0
    saved = load_hf_checkpoint(tmp_path / "run" / "model")
    attention = saved.layers[0].self_attn
    assert saved.config.model_type == "qwen2" and attention.o_proj.bias is None
    assert not np.array_equal(np.asarray(attention.q_proj.bias[...]), initial_bias)


def test_several_epochs_mini_batches_and_micro_batches_and_a_kl_penalty(tmp_path):
    config = tiny_rl_config(
        tmp_path, steps=2,
        learner=LearnerConfig(epochs=2, mini_batches=2, micro_batches=2, mesh=MeshConfig(fsdp=2)),
        algorithm=AlgorithmSpec(name="rar", params={"policy_loss": {"kl_coef": 0.1}}))
    train_rl(config, toy_task())
    lines = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2]
    assert lines[0]["train/kl"] == pytest.approx(0, abs=1e-6)  # first update: the policy is the reference
    assert lines[1]["train/kl"] > 0
    state, meta = Checkpointer(tmp_path / "run" / "checkpoints").restore(None, None)
    assert "reference" in state and meta["step"] == 2 and meta["data_position"] == 4


@pytest.fixture
def experience():
    """One RaR step of a tiny random policy on the toy task: rows with advantages of both signs."""
    task = toy_task()
    mesh = policy.make_mesh(MeshConfig())
    model, tokenizer = policy.build_policy(ModelSpec(init=TINY), task, mesh)
    engine = EmbeddedEngine(nnx.merge(*nnx.split(model)), tokenizer=tokenizer, eos_token_ids=[2], pad_id=0)
    context = RolloutContext(engine=engine, tokenizer=tokenizer, task=task, judge=task.judge(), pad_id=0, seed=0,
                             sampling=SamplingParams(max_new_tokens=16, n=8), timer=PhaseTimer())
    result = RaR(RaRConfig()).experience(task.train_stream(0).next_batch(4), context, step=0)
    assert (result.batch["advantages_bt"] > 0).any() and (result.batch["advantages_bt"] < 0).any()
    return model, mesh, result


def test_the_update_optimises_its_objective_on_a_repeated_batch(experience):
    model, mesh, result = experience
    algorithm = RaR(RaRConfig())
    graphdef, params = nnx.split(model)
    rules = sharding.partition_rules(model.config)
    common = dict(mesh=mesh, abstract_params=params, rules=rules, first_scored=result.prompt_width)
    batch = dict(result.batch)
    batch["old_logp_bt"] = np.asarray(train_step.make_logprobs_fn(graphdef, **common)(params, batch))
    optimizer = optax.adam(3e-3)
    step = train_step.make_train_step(graphdef, optimizer, algorithm.loss_fn(), aggregate=algorithm.aggregate(),
                                      **common)
    params, opt_state = policy.copy_params(params), optimizer.init(params)
    losses = []
    for _ in range(8):
        params, opt_state, metrics = step(params, opt_state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0] - 0.05, losses
    # The policy moved towards the rows with positive advantages: sum_i A_i (log pi_new - log pi_old)(o_i) > 0.
    new_logp = np.asarray(train_step.make_logprobs_fn(graphdef, **common)(params, batch))
    mask = batch["response_mask_bt"]
    assert (batch["advantages_bt"] * (new_logp - batch["old_logp_bt"]))[mask].sum() > 0


def test_each_step_syncs_its_weights_to_the_engine(tmp_path, monkeypatch):
    versions = []
    original = EmbeddedEngine.update_weights

    def recording(self, model, version):
        versions.append((version, jax.device_get(nnx.to_flat_state(nnx.state(model))[0][1].get_value()).copy()))
        return original(self, model, version)

    monkeypatch.setattr(EmbeddedEngine, "update_weights", recording)
    train_rl(tiny_rl_config(tmp_path, steps=2), toy_task())
    assert [v for v, _ in versions] == ["step-1", "step-2"]
    assert not np.array_equal(versions[0][1], versions[1][1])
    line = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]
    assert json.dumps(line)  # plain JSON


def test_request_metrics_report_each_steps_retries_and_failures():
    from rubric_jax.inference.http import ClientStats, JsonHttpClient
    from rubric_jax.judges import ChatClient, ChatSettings, RolloutLLMJudge, srar_format
    from rubric_jax.training.experience import request_metrics

    http = JsonHttpClient("http://127.0.0.1:9")
    try:
        judge = RolloutLLMJudge(ChatClient(http, ChatSettings(model="judge")), srar_format())
        assert judge.http_stats() is http.stats
    finally:
        http.close()
    assert toy_task().judge().http_stats() is None
    stats, seen = ClientStats(requests=10, retries=3, failures=1), {}
    assert request_metrics("judge", stats, seen) == {"judge/requests": 10, "judge/retries": 3,
                                                      "judge/request_failures": 1}
    stats.requests, stats.retries = 14, 5
    assert request_metrics("judge", stats, seen) == {"judge/requests": 4, "judge/retries": 2,
                                                      "judge/request_failures": 0}
    assert request_metrics("engine", None, {}) == {}


def test_an_llm_judge_from_the_config_judges_over_http_and_its_requests_are_logged(tmp_path):

    with StandinServer() as server:
        answered = itertools.count()

        def respond(messages):
            # One criterion in every call: rated 1 when the response has a step header, else 0. Once the launch's
            # preflight request is answered, a 503 for the run's first request.
            if next(answered) == 0:
                server.inject(http_error(503, "/v1/chat/completions"))
            return json.dumps({"rating": int("### Step" in messages[-1]["content"].split("<response>")[-1])})

        server.responder = respond
        config = tiny_rl_config(tmp_path, judge=JudgeConfig(kind="llm", url=server.base_url, model="judge",
                                                            format="rating", max_attempts=3))
        last = train_rl(config, build_task("arithmetic", {}, 0))
        calls = len(server.chat_requests) - 1  # the preflight's, not the run's
    rubric_items = sum(len(build_task("arithmetic", {}, 0).rubric(p).criteria)
                       for p in build_task("arithmetic", {}, 0).train_stream(0).next_batch(2))
    assert calls == rubric_items * 4  # every (rollout, criterion) answered once; the 503 was retried
    assert last["judge/requests"] == calls and last["judge/retries"] == 1 and last["judge/request_failures"] == 0
    assert last["judge/failure_rate"] == 0 and math.isfinite(last["train/loss"])
    assert last["judge/calls"] == calls and last["judge/call_failures"] == last["judge/schema_violations"] == 0
    assert last["judge/call_failure_rate"] == 0


def test_judge_config_is_validated():
    with pytest.raises(ValueError, match="judge.url and judge.model"):
        JudgeConfig(kind="llm", model="judge")
    with pytest.raises(ValueError, match="judge.url and judge.model"):
        JudgeConfig(url="http://x:1")
    with pytest.raises(ValueError, match="max_in_flight"):
        JudgeConfig(kind="llm", url="http://x:1", model="m", max_in_flight=0)


def test_meta_verifier_config_is_validated_and_built():
    from rubric_jax.rubrics.prompts import META_VERIFIER_CATEGORIES
    from rubric_jax.training.assembly import make_meta_verifier
    from rubric_jax.yaml_config import config_from_dict

    for bad, message in ((dict(kind="llm", model="m"), "meta_verifier.url and meta_verifier.model"),
                         (dict(url="http://x:1"), "meta_verifier.url and meta_verifier.model"),
                         (dict(kind="llm", url="http://x:1", model="m", max_attempts=0), "max_attempts")):
        with pytest.raises(ValueError, match=message):
            MetaVerifierConfig(**bad)
    with pytest.raises(ValueError, match="meta_verifier.domain"):
        config_from_dict(RLConfig, {"output_dir": "o", "steps": 1, "model": {"path": "m"},
                                    "meta_verifier": {"domain": "legal"}})
    assert make_meta_verifier(MetaVerifierConfig(), seed=0) is None  # kind task: the recipe asks the task
    verifier = make_meta_verifier(MetaVerifierConfig(kind="llm", url="http://127.0.0.1:9", model="m",
                                                     domain="medical", temperature=0.3), seed=0)
    try:
        assert verifier.categories == META_VERIFIER_CATEGORIES["medical"]
        assert verifier.chat.settings.temperature == 0.3 and verifier.http_stats().requests == 0
    finally:
        verifier.close()


def test_llm_roles_carry_their_request_options():
    from rubric_jax.training.assembly import make_judge, make_meta_verifier

    options = dict(chat_template_kwargs={"enable_thinking": False}, extra_body={"reasoning_effort": "low"})
    judge = make_judge(JudgeConfig(kind="llm", url="http://127.0.0.1:9", model="Qwen/Qwen3-32B", format="rating",
                                   **options), task=None, seed=0)
    verifier = make_meta_verifier(MetaVerifierConfig(kind="llm", url="http://127.0.0.1:9", model="m", **options),
                                  seed=0)
    try:
        for role in (judge, verifier):
            assert role.chat.settings.chat_template_kwargs == {"enable_thinking": False}
            assert role.chat.settings.extra_body == {"reasoning_effort": "low"}
    finally:
        judge.close()
        verifier.close()


def test_a_prompt_cap_truncates_every_prompt_over_it_and_logs_the_count(tmp_path):
    """The toy task's prompts have 39 to 45 tokens: with a cap of 30 every one of the 2 prompts per step is cut
    to its last 30 tokens (which keep the assistant header), and the step trains on them."""
    rollout = RolloutConfig(prompts_per_step=2, group_size=4, max_new_tokens=16, max_prompt_tokens=30,
                            prompt_truncation="left")
    last = train_rl(tiny_rl_config(tmp_path, steps=2, rollout=rollout), toy_task())
    lines = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [line["prompt/truncated"] for line in lines] == [2, 2]  # counted per step, not accumulated
    assert all(39 <= line["prompt/length_max"] <= 45 for line in lines)
    assert math.isfinite(last["train/loss"])
    uncapped = train_rl(tiny_rl_config(tmp_path / "uncapped"), toy_task())
    assert uncapped["prompt/truncated"] == 0


def test_the_models_chat_template_kwargs_render_every_rollout_prompt(tmp_path, tiny_qwen3_dir):
    """A policy from a Hugging Face directory whose template, as Qwen3's, reads enable_thinking: with
    model.chat_template_kwargs {enable_thinking: false}, the trainer's prompts grow by the empty think block."""
    task = toy_task()
    rollout = RolloutConfig(prompts_per_step=2, group_size=2, max_new_tokens=8)
    lengths = {}
    for name, kwargs in (("plain", {}), ("no_thinking", {"enable_thinking": False})):
        model = ModelSpec(path=str(tiny_qwen3_dir), chat_template_kwargs=kwargs)
        last = train_rl(tiny_rl_config(tmp_path / name, model=model, rollout=rollout), task)
        lengths[name] = last["prompt/length_max"]
    block = load_tokenizer(tiny_qwen3_dir).encode(EMPTY_THINK_BLOCK, add_special_tokens=False)
    assert lengths["no_thinking"] == lengths["plain"] + len(block)
    with pytest.raises(ValueError, match="chat_template_kwargs keys"):
        ModelSpec(path="x", chat_template_kwargs={"not a name": 1})


def test_a_qwen3_moe_policy_takes_rl_steps_on_the_embedded_engine_and_exports_its_experts(tmp_path,
                                                                                          tiny_qwen3_moe_dir):
    """Qwen3-MoE from its checkpoint: two RL steps sampled by the embedded engine, the learner's logprobs those of
    the engine, the experts' weights updated, and the final model/ a checkpoint in the published per-expert layout
    that transformers loads as Qwen3-MoE."""
    config = tiny_rl_config(tmp_path, steps=2, model=ModelSpec(path=str(tiny_qwen3_moe_dir)))
    train_rl(config, toy_task())
    for line in read_metrics(tmp_path / "run" / "metrics.jsonl"):
        assert all(math.isfinite(value) for value in line.values())
        assert line["train/grad_norm"] > 0 and line["mismatch/max_abs"] < 1e-4
    before, after = (nnx.state(load_hf_checkpoint(directory)) for directory in
                     (tiny_qwen3_moe_dir, tmp_path / "run" / "model"))
    experts_before, experts_after = (np.asarray(state["layers"][0]["mlp"]["experts"]["gate_edf"][...])
                                     for state in (before, after))
    assert (np.abs(experts_after - experts_before).reshape(4, -1).max(axis=1) > 0).any()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model")
    assert type(hf).__name__ == "Qwen3MoeForCausalLM"


def test_a_multimodal_gemma3_checkpoints_language_model_takes_rl_steps_and_exports_a_text_model(
        tmp_path, tiny_gemma3_multimodal_dir):
    """Gemma 3 as most users have it on disk (a multimodal checkpoint): two RL steps sampled by the embedded engine
    with Gemma's chat template, the learner's logprobs those of the engine, and a model/ that transformers loads
    as Gemma3ForCausalLM."""
    config = tiny_rl_config(tmp_path, steps=2, model=ModelSpec(path=str(tiny_gemma3_multimodal_dir)))
    train_rl(config, toy_task())
    for line in read_metrics(tmp_path / "run" / "metrics.jsonl"):
        assert all(math.isfinite(value) for value in line.values())
        assert line["train/grad_norm"] > 0 and line["mismatch/max_abs"] < 1e-4
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model")
    assert type(hf).__name__ == "Gemma3ForCausalLM"
    assert load_tokenizer(tmp_path / "run" / "model").chat_template == \
        load_tokenizer(tiny_gemma3_multimodal_dir).chat_template


def test_a_random_qwen3_moe_policy_scans_its_layers_and_trains_its_routers_to_balance(tmp_path):
    """`ModelInit(model_type="qwen3_moe")`: every layer sparse, so the learner scans them; with
    `learner.router_aux_loss_coef` the step logs the routers' balance (4 experts, 2 per token: about 2)."""
    init = dataclasses.replace(TINY, model_type="qwen3_moe", num_layers=2, num_experts=4, num_experts_per_tok=2,
                               moe_intermediate_size=16)
    config = tiny_rl_config(tmp_path, model=ModelSpec(init=init, scan_layers=True),
                            learner=LearnerConfig(router_aux_loss_coef=0.01))
    train_rl(config, toy_task())
    (line,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert line["train/grad_norm"] > 0 and line["mismatch/max_abs"] < 1e-4
    assert 1.5 < line["train/router_balance"] < 4
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model")
    assert type(hf).__name__ == "Qwen3MoeForCausalLM" and hf.config.num_experts == 4


def test_rollout_prompt_cap_and_frozen_server_are_validated(tmp_path):
    with pytest.raises(ValueError, match="max_prompt_tokens must be None"):
        RolloutConfig(max_prompt_tokens=0)
    with pytest.raises(ValueError, match="frozen_sglang_url is for engine sglang"):
        RolloutConfig(frozen_sglang_url="http://x:2")
    with pytest.raises(ValueError, match="must be a second server"):
        RolloutConfig(engine="sglang", sglang_url="http://x:1", frozen_sglang_url="http://x:1")
    # A recipe that samples from the frozen initial policy needs the second server, checked before any compute.
    rollout = RolloutConfig(engine="sglang", sglang_url="http://127.0.0.1:9", prompts_per_step=2, group_size=4,
                            max_new_tokens=16)
    config = tiny_rl_config(tmp_path, rollout=rollout,
                            algorithm=AlgorithmSpec(name="evorubric", params={"train_generator": False}))
    with pytest.raises(ValueError, match="rollout.frozen_sglang_url"):
        train_rl(config, build_task("arithmetic_rubrics", {}, 0))
    assert not (tmp_path / "run").exists()
