"""Saving rollouts with their verdicts during training (`rollout_log`): the logged steps' files and no others,
each holding the step's rollouts with the verdicts its rewards were computed from (the step's evaluation not
among them); a run killed between a rollout file and its step's checkpoint resumes and writes that step's file
again, identical, and drops the files of the abandoned steps; the YAML section loads and is validated."""

import json

import numpy as np
import pytest

from rubric_jax.judges.records import read_judged_rollouts
from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.metrics import read_metrics
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_files import rollout_log_path
from rubric_jax.training.run_config import CheckpointConfig, EvalConfig, MetricsConfig, RLConfig, RolloutLogConfig
from rubric_jax.yaml_config import apply_overrides, config_from_dict, load_config
from tests.training.test_rl import tiny_rl_config
from tests.training.toy_task import CHECKS, RUBRIC, toy_task

ROLLOUTS_PER_STEP = 2 * 4  # tiny_rl_config: prompts_per_step x group_size


def logged_steps(run) -> list[str]:
    return sorted(p.name for p in (run / "rollouts").iterdir())


def test_every_second_step_saves_the_rollouts_its_rewards_came_from(tmp_path):
    config = tiny_rl_config(tmp_path, steps=4, rollout_log=RolloutLogConfig(every_steps=2),
                            eval=EvalConfig(num_examples=2, every_steps=2))
    train_rl(config, toy_task())
    run = tmp_path / "run"
    assert logged_steps(run) == ["step_000002.jsonl", "step_000004.jsonl"]
    lines = read_metrics(run / "metrics.jsonl")
    assert ["rollout_log/records" in line for line in lines] == [False, True, False, True]
    # Steps 2 and 4 also evaluated, and the evaluation's judge calls are in no file.
    assert all("eval/rubric_score" in lines[step - 1] for step in (2, 4))
    assert all(lines[step - 1]["eval/judge/failure_rate"] == 0 for step in (2, 4))  # the toy task's judge never fails

    for step in (2, 4):
        line, records = lines[step - 1], read_judged_rollouts(rollout_log_path(run, step))
        assert line["rollout_log/records"] == len(records) == ROLLOUTS_PER_STEP  # RaR judges each rollout once
        assert [r.id for r in records] == [f"step-{step}/{i}" for i in range(ROLLOUTS_PER_STEP)]
        assert {r.step for r in records} == {step} and {r.request.rubric for r in records} == {RUBRIC}
        assert len({r.request.question for r in records}) == 2  # two prompts, four samples each
        assert all(r.verdict is not None and not r.verdict.failed for r in records)
        # Each verdict is the task's judgement of its response, and the step's reward and criterion rates are
        # computed from them.
        judged = toy_task().judge().judge([r.request for r in records], len(RUBRIC.criteria))
        assert [list(r.verdict.satisfied) for r in records] == judged.satisfied_bk.tolist()
        satisfied = np.array([r.verdict.satisfied for r in records])
        weights = np.array([c.weight for c in RUBRIC.criteria])
        assert line["reward/mean"] == pytest.approx(np.mean(satisfied @ weights / weights.sum()))
        for k, name in enumerate(CHECKS):
            assert line[f"rubric/{name}"] == pytest.approx(satisfied[:, k].mean())
        # And each rollout carries what the recipe made of it: its reward (the weighted fraction), its group (one
        # per prompt) and the GRPO advantage it was trained with (sample std, RaR's default).
        reward = satisfied @ weights / weights.sum()
        assert [r.values["reward"] for r in records] == pytest.approx(reward)
        groups = np.array([r.values["group"] for r in records])
        assert [len(set(groups[i:i + 4])) for i in (0, 4)] == [1, 1] and groups[0] != groups[4]
        for rows in (slice(0, 4), slice(4, 8)):
            spread = reward[rows].std(ddof=1)
            expected = (reward[rows] - reward[rows].mean()) / (spread + 1e-6) if spread > 0 else 0 * reward[rows]
            assert [r.values["advantage"] for r in records[rows]] == pytest.approx(expected, abs=1e-5)


class Killed(Exception):
    pass


def test_a_killed_run_rewrites_the_rollout_files_of_the_steps_it_runs_again(tmp_path, monkeypatch):
    """Killed in the checkpoint of step 4, after its rollout file: the resumed run continues from step 3's
    checkpoint, keeps step 2's file, writes step 4's again (the same bytes: all randomness is a function of the
    seed and the step) and deletes a file of a step past the checkpoint that it does not log."""
    config = tiny_rl_config(tmp_path, steps=4, rollout_log=RolloutLogConfig(every_steps=2),
                            checkpoint=CheckpointConfig(every_steps=3, async_save=False))
    run = tmp_path / "run"
    original_save = Checkpointer.save

    def killed_at_step_4(self, step, *args, **kwargs):
        if step == 4:
            raise Killed
        return original_save(self, step, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(Checkpointer, "save", killed_at_step_4)
        with pytest.raises(Killed):
            train_rl(config, toy_task())
    assert Checkpointer(run / "checkpoints").latest_step() == 3
    assert logged_steps(run) == ["step_000002.jsonl", "step_000004.jsonl"]
    first_step_4 = rollout_log_path(run, 4).read_bytes()
    rollout_log_path(run, 2).write_text("")  # marks: a file the resumed run must leave alone
    rollout_log_path(run, 4).write_text("")  # ... and one it must write again
    rollout_log_path(run, 5).write_text("")  # a step after the checkpoint that the resumed run does not log

    train_rl(config, toy_task())
    assert logged_steps(run) == ["step_000002.jsonl", "step_000004.jsonl"]
    assert rollout_log_path(run, 2).read_text() == ""
    assert rollout_log_path(run, 4).read_bytes() == first_step_4
    records = read_judged_rollouts(rollout_log_path(run, 4))
    assert len(records) == ROLLOUTS_PER_STEP and {r.step for r in records} == {4}
    assert read_metrics(run / "metrics.jsonl")[-1]["rollout_log/records"] == ROLLOUTS_PER_STEP


VALID_RL = {"output_dir": "out", "steps": 3, "model": {"path": "some/model"}}


def test_the_yaml_section_loads_and_defaults_to_off(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("output_dir: out\nsteps: 3\nmodel: {path: some/model}\nrollout_log: {every_steps: 2}\n")
    assert load_config(RLConfig, path).rollout_log == RolloutLogConfig(every_steps=2)
    assert config_from_dict(RLConfig, VALID_RL).rollout_log.every_steps == 0


@pytest.mark.parametrize("override, message", [
    ("rollout_log.every_steps=-1", r"config rollout_log: every_steps must be >= 0 \(0: off\), got -1"),
    ("rollout_log.every_steps=often", "config key rollout_log.every_steps: expected an int"),
    ("rollout_log.every=2", "unknown config key rollout_log.every"),
])
def test_a_bad_rollout_log_section_names_its_key(override, message):
    with pytest.raises(ValueError, match=message):
        config_from_dict(RLConfig, apply_overrides(VALID_RL, [override]))


def test_every_step_and_evaluation_logs_its_first_judged_rollouts_as_samples(tmp_path):
    """Two samples of each step's rollouts, and three of step 2's evaluation (4 examples x 2 samples), in the
    order judged: the evaluation's first examples' samples."""
    config = tiny_rl_config(tmp_path, steps=2, metrics=MetricsConfig(console=False, tensorboard=True),
                            eval=EvalConfig(num_examples=4, samples_per_example=2, temperature=1.0, every_steps=2,
                                            log_samples=3))
    task = toy_task()
    train_rl(config, task)
    lines = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [(line["step"], line["phase"]) for line in lines] == [
        (1, "train"), (1, "train"), (2, "train"), (2, "train"), (2, "eval"), (2, "eval"), (2, "eval")]
    assert [line["id"] for line in lines] == ["step-1/0", "step-1/1", "step-2/0", "step-2/1",
                                              "eval-2/0", "eval-2/1", "eval-2/2"]
    held_out = [task.question(e) for e in task.eval_examples(4)]
    assert [line["question"] for line in lines[4:]] == [held_out[0], held_out[0], held_out[1]]
    for line in lines:
        assert line.keys() == {"step", "phase", "id", "question", "response", "criteria", "rubric_score",
                               "judge_failure", "judge_detail", "judge_answer", "recipe"}
        assert [c["text"] for c in line["criteria"]] == [c.text for c in RUBRIC.criteria]
        weights = np.array([c["weight"] for c in line["criteria"]])
        satisfied = np.array([c["satisfied"] for c in line["criteria"]], float)
        assert line["rubric_score"] == pytest.approx(weights @ satisfied / weights.sum())
        assert line["judge_failure"] is None and line["judge_detail"] is None and line["judge_answer"] is None
        # The recipe's view of a training rollout (RaR's reward is the rubric score here: no penalties); an
        # evaluation trains nothing.
        if line["phase"] == "train":
            assert line["recipe"]["reward"] == pytest.approx(line["rubric_score"])
            assert set(line["recipe"]) == {"reward", "advantage", "group"}
        else:
            assert line["recipe"] is None
    events = b"".join(path.read_bytes() for path in (tmp_path / "run" / "tensorboard").iterdir())
    assert b"samples/train" in events and b"step-1/0" in events and b"step-2/1" in events
    assert b"samples/eval" in events and b"eval-2/2" in events
