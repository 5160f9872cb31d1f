"""A run directory is history (`runs.check_relaunch`): a relaunch resumes only under the config the run started
with, apart from `runs.RELAUNCH_SAFE_KEYS`; `checkpoint.resume: false` never writes over a run; a launch that
fails writes nothing into the run it was pointed at, and one refused before its first step completes leaves
nothing behind (`runs.undo_failed_launch`). A signal stops a run at the end of its step with a
checkpoint; a damaged latest checkpoint is set aside and the one before it resumes; a cosine schedule left
behind by a `steps` override is warned about."""

import dataclasses
import os
import signal
from pathlib import Path

import pytest
import yaml

from rubric_jax import cli
from rubric_jax.data.tasks import build_task
from rubric_jax.judges.base import Judge
from rubric_jax.training import rl, runs, sft
from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.metrics import read_metrics
from rubric_jax.training.optim import OptimizerConfig
from rubric_jax.training.run_config import (AlgorithmSpec, CheckpointConfig, EvalConfig, MetricsConfig, ModelSpec,
                                            SFTConfig, resolve_algorithm)
from rubric_jax.yaml_config import config_to_dict
from tests.training.test_rl import TINY, tiny_rl_config
from tests.training.toy_task import toy_task


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 1-step run; returns (its config, the bytes of its config.yaml and metrics.jsonl)."""
    tmp_path = tmp_path_factory.mktemp("finished")
    config = tiny_rl_config(tmp_path)
    rl.train_rl(config, toy_task())
    return config, _history(config)


def _history(config) -> tuple[bytes, bytes]:
    out = Path(config.output_dir)
    return (out / "config.yaml").read_bytes(), (out / "metrics.jsonl").read_bytes()


def test_a_relaunch_with_another_config_is_refused_naming_the_keys_and_changes_nothing(finished_run):
    config, history = finished_run
    changed = dataclasses.replace(config, steps=3, algorithm=AlgorithmSpec(name="grpo"),
                                  optimizer=OptimizerConfig(learning_rate=5e-4))
    with pytest.raises(runs.RunStopped) as error:
        rl.train_rl(changed, toy_task())
    message = str(error.value)
    assert message.startswith(f"output_dir {config.output_dir} holds a run with another config (")
    assert "algorithm.name: 'rar' -> 'grpo'" in message and "optimizer.learning_rate:" in message
    assert "(steps:" not in message and "; steps:" not in message  # steps may change
    assert _history(config) == history



def _saved_dapo_run(tmp_path, algorithm_params: dict):
    """A directory holding a DAPO run's history (a metrics line) and a config.yaml with `algorithm_params` as an
    older version would have written them; returns (that directory, the config a relaunch resolves)."""
    config = tiny_rl_config(tmp_path, algorithm=AlgorithmSpec(name="dapo"))
    _, resolved = resolve_algorithm(config)
    written = config_to_dict(resolved)
    written["algorithm"]["params"] = algorithm_params
    out = Path(config.output_dir)
    out.mkdir(parents=True)
    (out / "config.yaml").write_text(yaml.safe_dump(written), encoding="utf-8")
    (out / "metrics.jsonl").write_text('{"step": 1}\n', encoding="utf-8")
    return out, resolved


def test_a_config_saved_before_a_rename_resumes_and_its_missing_keys_are_named(tmp_path, caplog):
    """A run saved `dynamic_sampling: true` (now "mask") and no `max_num_gen_batches`: the saved config read
    again by today's code is the relaunch's own, so it resumes, and the keys it took defaults for are logged."""
    params = config_to_dict(resolve_algorithm(tiny_rl_config(tmp_path / "x", algorithm=AlgorithmSpec(
        name="dapo")))[0])
    older = {key: value for key, value in params.items() if key not in ("max_num_gen_batches", "gen_batch_prompts")}
    assert older["dynamic_sampling"] == "mask"
    older["dynamic_sampling"] = True
    out, resolved = _saved_dapo_run(tmp_path, older)
    with caplog.at_level("WARNING", logger="rubric_jax.training.runs"):
        runs.check_relaunch(out, resolved, lambda saved: resolve_algorithm(saved)[1])
    assert "algorithm.params.max_num_gen_batches=0" in caplog.text
    assert "algorithm.params.gen_batch_prompts=None" in caplog.text
    assert "dynamic_sampling" not in caplog.text

    changed = dataclasses.replace(resolved, algorithm=dataclasses.replace(
        resolved.algorithm, params={**resolved.algorithm.params, "dynamic_sampling": "off"}))
    with pytest.raises(runs.RunStopped, match="algorithm.params.dynamic_sampling: 'mask' -> 'off'"):
        runs.check_relaunch(out, changed, lambda saved: resolve_algorithm(saved)[1])


def test_a_saved_config_that_no_longer_loads_is_refused_with_the_loaders_reason(tmp_path):
    out, resolved = _saved_dapo_run(tmp_path, {"a_key_since_removed": 1})
    with pytest.raises(runs.RunStopped, match="config.yaml no longer loads .*a_key_since_removed"):
        runs.check_relaunch(out, resolved, lambda saved: resolve_algorithm(saved)[1])

def test_checkpoint_resume_false_on_a_run_is_refused(finished_run):
    config, history = finished_run
    fresh = dataclasses.replace(config, checkpoint=dataclasses.replace(config.checkpoint, resume=False))
    with pytest.raises(runs.RunStopped, match="holds a run and checkpoint.resume is false"):
        rl.train_rl(fresh, toy_task())
    assert _history(config) == history


def test_a_launch_with_a_bad_model_path_leaves_the_run_untouched(finished_run, tmp_path):
    config, history = finished_run
    broken = dataclasses.replace(config, model=ModelSpec(path=str(tmp_path / "no_model")))
    with pytest.raises(runs.RunStopped, match="model.init"):  # the config differs: refused before the model loads
        rl.train_rl(broken, toy_task())
    assert _history(config) == history
    # Into a fresh directory the launch fails when the model loads, and writes nothing there either.
    fresh = dataclasses.replace(broken, output_dir=str(tmp_path / "fresh"))
    with pytest.raises((ValueError, OSError)):
        rl.train_rl(fresh, toy_task())
    assert not (tmp_path / "fresh").exists()


TINY_TRAIN = ["train", "configs/rar_arithmetic.yaml", "steps=1", "model.path=null",
              "model.init={hidden_size: 32, intermediate_size: 64, num_layers: 1, num_heads: 2, num_kv_heads: 1, "
              "head_dim: 16, max_position_embeddings: 256}", "rollout.prompts_per_step=2", "rollout.group_size=2",
              "learner.mini_batches=1", "eval.every_steps=0", "metrics.console=false", "metrics.plots=false"]


def test_a_launch_refused_in_its_first_step_leaves_nothing_behind(tmp_path, capsys):
    """`rubric-jax train` whose first step refuses a prompt over `rollout.max_prompt_tokens` (after config.yaml,
    metrics.jsonl, tensorboard/ and checkpoints/ were created): a fresh output_dir is gone, and one that held a
    user's file holds just that file again."""
    refusing = [*TINY_TRAIN, "rollout.max_prompt_tokens=5", "rollout.prompt_truncation=error"]
    assert cli.main([*refusing, f"output_dir={tmp_path}/fresh"]) == 1
    assert "exceeds max_prompt_tokens=5" in capsys.readouterr().err
    assert not (tmp_path / "fresh").exists()
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    assert cli.main([*refusing, f"output_dir={tmp_path}/kept"]) == 1
    assert [path.name for path in (tmp_path / "kept").iterdir()] == ["notes.txt"]


def test_a_launch_that_fails_after_its_first_step_keeps_the_run(tmp_path, monkeypatch):
    """Once a step has completed the directory holds a run: a failure in the second step removes nothing, and
    its step 1 checkpoint stays."""
    sample_experience = rl.sample_experience

    def fails_at_step_two(algorithm, examples, context, judge, step, *args, **kwargs):
        if step == 1:
            raise RuntimeError("the engine went away")
        return sample_experience(algorithm, examples, context, judge, step, *args, **kwargs)

    monkeypatch.setattr(rl, "sample_experience", fails_at_step_two)
    config = tiny_rl_config(tmp_path, steps=2)
    with pytest.raises(RuntimeError, match="the engine went away"):
        rl.train_rl(config, toy_task())
    out = Path(config.output_dir)
    assert [line["step"] for line in read_metrics(out / "metrics.jsonl")] == [1]
    assert (out / "config.yaml").is_file() and [path.name for path in (out / "checkpoints").iterdir()] == ["1"]


def test_safe_keys_may_change_and_the_run_resumes(tmp_path):
    config = tiny_rl_config(tmp_path)
    rl.train_rl(config, toy_task())
    longer = dataclasses.replace(config, steps=2, eval=EvalConfig(every_steps=0),
                                 checkpoint=CheckpointConfig(every_steps=2, keep=2))
    rl.train_rl(longer, toy_task())
    assert [line["step"] for line in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2]


def test_the_cli_reports_a_refused_relaunch_in_one_line_and_exits_1(tmp_path, capsys):
    args = ["train", "configs/rar_arithmetic.yaml", f"output_dir={tmp_path}/run", "steps=1", "model.path=null",
            "model.init={hidden_size: 32, intermediate_size: 64, num_layers: 1, num_heads: 2, num_kv_heads: 1, "
            "head_dim: 16, max_position_embeddings: 256}",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "learner.mini_batches=1", "eval.every_steps=0",
            "metrics.console=false", "metrics.plots=false", "metrics.tensorboard=false"]
    assert cli.main(args) == 0
    capsys.readouterr()
    assert cli.main([*args, "optimizer.learning_rate=0.5"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"rubric-jax train: output_dir {tmp_path}/run holds a run")
    assert "optimizer.learning_rate" in err


def test_a_steps_override_that_leaves_the_cosine_schedule_behind_is_warned_about(tmp_path, caplog):
    optimizer = OptimizerConfig(learning_rate=1e-3, warmup_steps=1, schedule="cosine", total_steps=800)
    rl.train_rl(tiny_rl_config(tmp_path, optimizer=optimizer), toy_task())
    assert "optimizer.total_steps is 800 but the run makes 1 optimizer updates" in caplog.text


class SignallingJudge(Judge):
    """The toy task's judge, which sends this process `signal_number` during its call number `call` (from 0)."""

    def __init__(self, call: int, signal_number: int):
        self.inner, self.call, self.signal_number, self.calls = toy_task().judge(), call, signal_number, 0

    def judge(self, requests, max_items):
        if self.calls == self.call:
            os.kill(os.getpid(), self.signal_number)
        self.calls += 1
        return self.inner.judge(requests, max_items)


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_run_after_its_step_with_a_checkpoint_and_it_resumes(tmp_path, signal_number):
    handler = signal.getsignal(signal_number)
    config = tiny_rl_config(tmp_path, steps=4, checkpoint=CheckpointConfig(every_steps=10))
    with pytest.raises(runs.RunInterrupted, match=f"stopped by {signal.Signals(signal_number).name} after step 2 "
                                                  "of 4, checkpointed in") as error:
        # call 2: the first of step 2's (the judge is called once per group, of 2 prompts a step)
        rl.train_rl(config, toy_task(), judge=SignallingJudge(2, signal_number))
    assert error.value.exit_code == 128 + signal_number
    assert signal.getsignal(signal_number) is handler  # the run's handler is gone
    assert Checkpointer(tmp_path / "run" / "checkpoints").latest_step() == 2
    rl.train_rl(config, toy_task())
    assert [line["step"] for line in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3, 4]


def test_a_damaged_latest_checkpoint_is_set_aside_and_the_one_before_it_resumes(tmp_path, caplog):
    config = tiny_rl_config(tmp_path, steps=2, checkpoint=CheckpointConfig(every_steps=1, keep=3))
    rl.train_rl(config, toy_task())
    checkpoints = tmp_path / "run" / "checkpoints"
    for path in (checkpoints / "2" / "state").rglob("*"):
        if path.is_file():
            path.write_bytes(b"\0" * 7)  # a disk that filled up mid-write
    rl.train_rl(dataclasses.replace(config, steps=3), toy_task())
    assert "checkpoint step 2 of" in caplog.text and "set aside as 2.unrestorable; resuming from step 1" in caplog.text
    assert (checkpoints / "2.unrestorable").is_dir()
    assert Checkpointer(checkpoints).all_steps() == [1, 2, 3]
    assert [line["step"] for line in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3]


def test_a_signal_stops_sft_after_its_step_with_a_checkpoint(tmp_path, monkeypatch):
    calls = []
    batch_of = sft.sft_batch

    def signalling_batch(*args):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return batch_of(*args)

    monkeypatch.setattr(sft, "sft_batch", signalling_batch)
    config = SFTConfig(output_dir=str(tmp_path / "sft"), steps=4, model=ModelSpec(init=TINY), batch_size=2,
                       max_response_tokens=32, checkpoint=CheckpointConfig(every_steps=10),
                       metrics=MetricsConfig(console=False, tensorboard=False, plots=False))
    with pytest.raises(runs.RunInterrupted, match="stopped by SIGTERM after step 2 of 4"):
        sft.train_sft(config, build_task("arithmetic", {}, 0))
    assert Checkpointer(tmp_path / "sft" / "checkpoints").latest_step() == 2
