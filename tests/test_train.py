"""`rubric_jax.train`, the one public call: what `rubric-jax train` runs, from Python (a config object, its
plain data or a YAML file, with the command line's overrides), returning the last step's metrics; a bad input is
the ValueError the command reports, before anything is written."""

import pytest

import rubric_jax
from rubric_jax.training.metrics import read_metrics
from rubric_jax.yaml_config import config_to_dict, load_config
from tests.test_cli import TINY_RL
from tests.training.test_rl import tiny_rl_config


def test_train_runs_a_config_and_returns_its_last_steps_metrics(tmp_path):
    """An RLConfig of the CPU arithmetic task: one step, its metrics those of the run's last metrics.jsonl line
    (which adds the step)."""
    metrics = rubric_jax.train(tiny_rl_config(tmp_path))
    [last] = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert metrics.keys() == last.keys() - {"step"} and last["step"] == 1
    assert metrics["reward/mean"] == pytest.approx(last["reward/mean"])


def test_train_reads_a_yaml_file_with_overrides(tmp_path):
    out = tmp_path / "run"
    overrides = [*TINY_RL[1:], f"output_dir={out}", "steps=1", "rollout.prompts_per_step=2", "rollout.group_size=2",
                 "rollout.max_new_tokens=8", "eval.every_steps=0", "metrics.console=false"]
    metrics = rubric_jax.train(TINY_RL[0], overrides)
    assert metrics.keys() == read_metrics(out / "metrics.jsonl")[-1].keys() - {"step"}
    saved = load_config(type(tiny_rl_config(tmp_path)), out / "config.yaml")
    assert (saved.steps, saved.rollout.group_size, saved.model.path) == (1, 2, None)


@pytest.mark.parametrize("form", ["config", "plain data", "yaml file"])
def test_a_bad_override_is_the_value_error_naming_its_key(tmp_path, form):
    config = tiny_rl_config(tmp_path)
    given = {"config": config, "plain data": config_to_dict(config), "yaml file": TINY_RL[0]}[form]
    with pytest.raises(ValueError, match="optimizer.learnin_rate"):
        rubric_jax.train(given, ["optimizer.learnin_rate=1e-5"])
    with pytest.raises(ValueError, match="^config file .* does not exist"):
        rubric_jax.train(str(tmp_path / "missing.yaml"))
    assert not (tmp_path / "run").exists()
