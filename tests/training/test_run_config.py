"""The run configs: every YAML in configs/ loads and validates, the quickstart YAML spells out the built-in
quickstart, and each kind of bad config (unknown key, wrong type, bad literal, missing key, impossible
combination, unknown algorithm or task, bad algorithm or task parameters) is a ValueError naming the key, raised
before any model is built (the CLI exits with status 2 and the message)."""

import dataclasses
from pathlib import Path

import pytest

from rubric_jax import cli
from rubric_jax.data.synthesis import SynthesisConfig
from rubric_jax.data.tasks import build_task
from rubric_jax.training.run_config import (AlgorithmSpec, LearnerConfig, MeshConfig, QuickstartConfig, RLConfig,
                                            SFTConfig, resolve_algorithm)
from rubric_jax.yaml_config import apply_overrides, config_from_dict, load_config
from tests.data.dataset_fixtures import fixture_path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
VALID_RL = {"output_dir": "out", "steps": 3, "model": {"path": "some/model"}}


def rl_config(*overrides: str) -> RLConfig:
    config = config_from_dict(RLConfig, apply_overrides(VALID_RL, overrides))
    resolve_algorithm(config)
    return config


def config_kind(name: str) -> type:
    """configs/ naming: quickstart.yaml, sft_*.yaml (SFT cold starts), synthesize_*.yaml (rubric synthesis),
    every other file an RL run."""
    if name == "quickstart.yaml":
        return QuickstartConfig
    if name.startswith("synthesize_"):
        return SynthesisConfig
    return SFTConfig if name.startswith("sft_") else RLConfig


def test_every_config_file_loads_and_validates():
    """Every config's task is built; a paper config's dataset (a placeholder path: the data is the user's) is
    read from the fixture in its preset's layout instead, with one row held out."""
    names = sorted(p.name for p in CONFIGS.glob("*.yaml"))
    assert {"quickstart.yaml", "sft_arithmetic.yaml", "rar_arithmetic.yaml"} <= set(names)
    for name in names:
        cls = config_kind(name)
        config = load_config(cls, CONFIGS / name)
        if cls is SynthesisConfig:
            config.pipeline_params()
            check_synthesis_input(config)
            continue
        if cls is RLConfig:
            resolve_algorithm(config)
        task = config.task
        params = dict(task.params)
        if task.name == "dataset" and not (ROOT / params["path"]).exists():
            fixture = str(fixture_path(params["preset"]))
            params.update(path=fixture, **({"eval_path": fixture} if "eval_path" in params else {"eval_size": 1}))
        build_task(task.name, params, task.seed)


def check_synthesis_input(config: SynthesisConfig) -> None:
    """A synthesis config's input (a placeholder path) builds over the fixture of its preset, or, without one, the
    documents fixture."""
    params = dict(config.input)
    preset = params.get("preset")
    params["path"] = str(fixture_path(preset) if preset else ROOT / "tests/fixtures/synthesis/documents.jsonl")
    assert len(list(build_task("dataset", params, config.seed).train_records())) >= 2


def test_quickstart_yaml_is_the_built_in_quickstart():
    def resolved(config: QuickstartConfig):
        """The config with its free-form parameters (task, algorithm) read into their own config classes."""
        task = build_task(config.task.name, config.task.params, config.task.seed)
        algorithm_config, _ = resolve_algorithm(config.rl_config())
        bare_algorithm = AlgorithmSpec(name=config.rl.algorithm.name)  # its params compared as algorithm_config
        return dataclasses.replace(config, task=None, rl=dataclasses.replace(config.rl, algorithm=bare_algorithm)), (
            task, algorithm_config)

    built_in = QuickstartConfig(output_dir="runs/quickstart")
    assert resolved(load_config(QuickstartConfig, CONFIGS / "quickstart.yaml")) == resolved(built_in)


def test_resolved_algorithm_params_hold_every_field():
    _, resolved = resolve_algorithm(rl_config("algorithm.params.max_items=4"))
    params = resolved.algorithm.params
    assert params["max_items"] == 4 and params["on_judge_failure"] == "zero_reward"
    assert params["policy_loss"]["eps_low"] == 0.2


@pytest.mark.parametrize("override, message", [
    ("stepz=3", "unknown config key stepz"),
    ("rollout.group_sise=4", "unknown config key rollout.group_sise"),
    ("steps=three", "config key steps: expected an int"),
    ("rollout.temperature=hot", "config key rollout.temperature: expected a number"),
    ("rollout.engine=vllm", "config key rollout.engine: expected one of"),
    ("checkpoint.async_save=1", "config key checkpoint.async_save: expected true or false"),
    ("optimizer.schedule=cosine", "optimizer.total_steps"),
    ("steps=0", "steps must be >= 1"),
    ("learner.mini_batches=5", "must split evenly"),
    ("learner.micro_batches=3", "must split evenly"),
    ("learner.mesh.fsdp=3", "must split evenly"),
    ("learner.forward_micro_batches=3", "must split evenly"),
    ("learner.forward_micro_batches=0", "forward_micro_batches must be >= 1 or null"),
    ("rollout.temperature=0", "temperature 0 makes the 8 samples of a group identical"),
    ("rollout.engine=sglang", "sglang_url is required"),
    ("rollout.sglang_url=http://x", "sglang_url is required"),
    ("model.init={}", "exactly one of model.path and model.init"),
    ("eval.samples_per_example=4", "samples_per_example must be 1"),
    ("eval.presence_penalty=2.5", "config eval: presence_penalty must be in"),
    ("eval.top_p=0", "config eval: top_p must be in"),
    ("eval.max_new_tokens=0", "config eval: max_new_tokens must be >= 1 or null"),
    ("eval.benchmarks={aime: {preset: aime24, path: a.jsonl, samples_per_example: 4}}",
     "config eval: benchmarks.aime: greedy evaluation"),
    ("eval.benchmarks={aime: {preset: aime24, path: a.jsonl, repetition_penalty: 0}}",
     "config eval: benchmarks.aime: repetition_penalty must be in"),
    ("eval.benchmarks={x: {preset: aime24}}", "missing config key eval.benchmarks.x.path"),
    ("eval.benchmarks={x: {preset: aime24, path: a.jsonl, samples: 4}}",
     "unknown config key eval.benchmarks.x.samples"),
    ("eval.benchmarks={a/b: {preset: aime24, path: a.jsonl}}",
     "config eval: benchmarks: 'a/b' is not a benchmark name"),
    ("judge.extra_body={max_tokens: 64}", "judge.extra_body.max_tokens: the client sets"),
    ("judge.extra_body={chat_template_kwargs: {}}", "judge.extra_body.chat_template_kwargs: the client sets"),
    ("judge.chat_template_kwargs={enable-thinking: false}", "judge.chat_template_kwargs must map template variable"),
    ("meta_verifier.extra_body={messages: []}", "meta_verifier.extra_body.messages: the client sets"),
    ("rollout.decode_slots=0", "decode_slots must be None"),
    ("rollout.max_batch_size=8", "unknown config key rollout.max_batch_size"),
    ("algorithm.name=ppo", "config key algorithm.name: unknown algorithm 'ppo'"),
    ("algorithm.params.max_itemz=4", "unknown config key algorithm.params.max_itemz"),
    ("algorithm.params.on_judge_failure=retry", "algorithm.params.on_judge_failure: expected one of"),
    ("algorithm.params.policy_loss.aggregation=seq_mean_token_sum_norm", "norm_constant is required"),
    ("algorithm.params.policy_loss.eps_low=-0.1", "eps_low must be >= 0"),
])
def test_each_kind_of_bad_rl_config_names_its_key(override, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        rl_config(override)


def test_a_missing_required_key_is_named():
    with pytest.raises(ValueError, match="missing config key steps"):
        config_from_dict(RLConfig, {"output_dir": "out", "model": {"path": "m"}})


def test_an_init_model_must_leave_room_for_the_response():
    with pytest.raises(ValueError, match="rollout.max_new_tokens"):
        rl_config("model={init: {max_position_embeddings: 64}}", "rollout.max_new_tokens=64")


@pytest.mark.parametrize("name, params, message", [
    ("sums", {}, "task.name: unknown task 'sums'"),
    ("arithmetic", {"max_step": 3}, "unknown config key task.params.max_step"),
    ("arithmetic", {"min_steps": 4, "max_steps": 3}, "task.params"),
])
def test_bad_tasks_name_their_key(name, params, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        build_task(name, params, 0)


def test_quickstart_stages_derive_valid_runs():
    config = QuickstartConfig(output_dir="q")
    assert config.sft_config().output_dir == "q/sft" and config.rl_config().model.path == "q/sft/model"
    assert config.rl_config().optimizer == config.rl.optimizer
    with pytest.raises(ValueError, match="must split evenly"):
        dataclasses.replace(config, rl=dataclasses.replace(config.rl, learner=dataclasses.replace(
            config.rl.learner, micro_batches=3)))


def test_the_cli_rejects_a_bad_config_before_building_anything(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text((CONFIGS / "rar_arithmetic.yaml").read_text() + "\nlearning_rate: 1e-5\n")
    assert cli.main(["train", str(path)]) == 2
    assert "unknown config key learning_rate" in capsys.readouterr().err
    assert cli.main(["train", str(CONFIGS / "rar_arithmetic.yaml"), "algorithm.params.max_items=0"]) == 2
    assert "max_items must be >= 1" in capsys.readouterr().err
    assert cli.main(["quickstart", "--output-dir", str(tmp_path), "task.params.operators=[/]"]) == 2
    assert "task.params" in capsys.readouterr().err
    assert not any(tmp_path.iterdir()) or [p.name for p in tmp_path.iterdir()] == ["bad.yaml"]


@pytest.mark.parametrize("command", ["quickstart", "train", "sft", "eval"])
def test_every_command_explains_itself(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    assert len(capsys.readouterr().out) > 300


def test_forward_micro_batches_default_to_micro_batches_and_join_the_row_multiple():
    learner = LearnerConfig(mini_batches=2, micro_batches=4, mesh=MeshConfig(fsdp=2))
    assert learner.forward_splits == 4 and learner.row_multiple == 2 * 4 * 2
    learner = dataclasses.replace(learner, forward_micro_batches=16)
    assert learner.forward_splits == 16 and learner.row_multiple == 16 * 2
    assert dataclasses.replace(learner, forward_micro_batches=3).row_multiple == 24 * 2


def test_the_row_check_counts_a_second_roles_rows():
    """RLCER's rubricator adds M rows per question: 4 x 8 reasoner rows + 4 x 8 rubricator rows = 64 split into
    8 micro-batches of one row on each of 8 chips, which the reasoner's 32 rows alone would not."""
    rlcer = rl_config("algorithm.name=rlcer", "rollout.prompts_per_step=4", "rollout.group_size=8",
                      "learner.mini_batches=1", "learner.micro_batches=8", "learner.mesh.fsdp=8")
    assert rlcer.learner_rows() == 64 and rlcer.learner.row_multiple == 64
    with pytest.raises(ValueError, match="the step's 32 learner rows"):
        rl_config("rollout.prompts_per_step=4", "rollout.group_size=8", "learner.mini_batches=1",
                  "learner.micro_batches=8", "learner.mesh.fsdp=8")
