"""Kill and resume: an RL run SIGKILLed in a subprocess after a checkpoint resumes from it, and its metrics for
every later step equal those of an uninterrupted run with the same seed (timings aside); every step appears
exactly once in the resumed run's metrics.jsonl. Also with PPO's critic, whose params and optimizer state the
checkpoint must carry for its values (hence the advantages) to continue exactly."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import RLConfig
from rubric_jax.yaml_config import load_config
from tests.training import critic_recipe
from tests.training.toy_task import toy_task
train_rl(load_config(RLConfig, sys.argv[1]), toy_task())
"""
STEPS = 12


def write_config(directory: Path, algorithm: str) -> Path:
    config = {
        "output_dir": str(directory / "run"), "steps": STEPS, "seed": 5,
        "model": {"init": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2,
                           "num_kv_heads": 1, "head_dim": 16, "max_position_embeddings": 96}},
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 16},
        "learner": {"mini_batches": 2},
        "algorithm": {"name": algorithm},
        "optimizer": {"learning_rate": 3e-3},
        "critic": {"optimizer": {"learning_rate": 3e-3}},
        "checkpoint": {"every_steps": 2, "keep": 2, "async_save": True},
        "metrics": {"console": False, "tensorboard": False, "plots": False},
    }
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start(config: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(config)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output
    return output


def comparable(lines: list[dict]) -> dict[int, dict]:
    return {line["step"]: {k: v for k, v in line.items() if not k.startswith("time/")} for line in lines}


@pytest.mark.parametrize("algorithm", ["rar", "toy_critic"])
def test_a_killed_run_resumes_and_matches_the_uninterrupted_run(tmp_path, algorithm):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    uninterrupted = start(write_config(tmp_path / "a", algorithm))
    finish(uninterrupted)

    config = write_config(tmp_path / "b", algorithm)
    killed = start(config)
    checkpoints = Checkpointer(tmp_path / "b" / "run" / "checkpoints")
    deadline = time.monotonic() + 300
    while (checkpoints.latest_step() or 0) < 2:
        assert killed.poll() is None and time.monotonic() < deadline, killed.communicate()[0]
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    resumed_from = Checkpointer(tmp_path / "b" / "run" / "checkpoints").latest_step()
    assert 2 <= resumed_from < STEPS

    output = finish(start(config))
    assert f"resuming {tmp_path / 'b' / 'run'} from step {resumed_from}" in output

    expected = comparable(read_metrics(tmp_path / "a" / "run" / "metrics.jsonl"))
    lines = read_metrics(tmp_path / "b" / "run" / "metrics.jsonl")
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    got = comparable(lines)
    assert got == expected
    # The runs learned something: the comparison is not between constant metrics.
    assert len({round(line["train/loss"], 6) for line in expected.values()}) > 1
    if algorithm == "toy_critic":
        assert len({round(line["critic/explained_variance"], 6) for line in expected.values()}) > 1
