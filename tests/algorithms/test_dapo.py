"""DAPO: one training step end to end through train_rl; the shaped rewards and advantages recomputed in NumPy
from the verifier's verdicts and the response lengths; each switch (dynamic sampling, overlong shaping) changes
exactly what DAPO says it does; a batch with no informative group trains on nothing without NaN."""

import dataclasses
import math

import numpy as np
import pytest

from rubric_jax.algorithms.dapo import DAPO, DAPOConfig
from rubric_jax.training.metrics import read_metrics
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import AlgorithmSpec
from tests.algorithms.test_grpo import (
    GROUP, MAX_NEW_TOKENS, PROMPTS, ParityTask, assert_row_advantages, make_context, numpy_grpo, parity_task,
    response_texts, tiny_policy)
from tests.training.test_rl import tiny_rl_config

BUFFER = 6


@dataclasses.dataclass(frozen=True)
class NeverCorrectTask(ParityTask):
    def is_correct(self, response, example):
        return False


def numpy_overlong(lengths, max_length, buffer, factor=1.0):
    """DAPO eq 13: 0 up to L_max - buffer, then -(L - (L_max - buffer)) / buffer * factor, -factor past L_max."""
    out = np.zeros(len(lengths))
    for b, length in enumerate(lengths):
        if length > max_length:
            out[b] = -factor
        elif length > max_length - buffer:
            out[b] = -(length - (max_length - buffer)) / buffer * factor
    return out


@pytest.fixture(scope="module")
def setup():
    task = parity_task()
    model, tokenizer = tiny_policy(task)
    context = make_context(task, model, tokenizer, seed=1)  # a seed whose responses and groups both vary
    examples = task.train_stream(0).next_batch(PROMPTS)

    def run(**changes):
        return DAPO(DAPOConfig(overlong_buffer=BUFFER, **changes)).experience(examples, context, step=0)

    return task, context, examples, run


def verdicts_and_lengths(task, context, examples, experience):
    """Correctness and response lengths of every row, recomputed from the packed tokens: the lengths from the
    full response region of the run without dynamic sampling (its mask is the sampled one)."""
    texts = response_texts(experience.batch, experience.prompt_width, context.tokenizer)
    correct = np.array([task.is_correct(text, examples[b // GROUP]) for b, text in enumerate(texts)])
    return correct, experience.batch["response_mask_bt"].sum(axis=1)


def test_one_dapo_step_end_to_end(tmp_path):
    config = tiny_rl_config(tmp_path, algorithm=AlgorithmSpec(name="dapo", params={"overlong_buffer": BUFFER}))
    last = train_rl(config, parity_task())
    [line] = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert {"reward/mean", "advantage/mean", "dapo/kept_group_fraction", "dapo/overlong_penalty_mean",
            "train/loss", "train/grad_norm", "train/clip_fraction"} <= line.keys()
    assert all(math.isfinite(value) for value in last.values())
    assert 0 < line["dapo/kept_group_fraction"] <= 1 and line["train/grad_norm"] > 0


def test_rewards_advantages_and_filter_match_numpy(setup):
    task, context, examples, run = setup
    unfiltered = run(dynamic_sampling=False)
    correct, lengths = verdicts_and_lengths(task, context, examples, unfiltered)
    assert (lengths > MAX_NEW_TOKENS - BUFFER).any() and (lengths <= MAX_NEW_TOKENS - BUFFER).any()
    reward = np.where(correct, 1.0, -1.0) + numpy_overlong(lengths, MAX_NEW_TOKENS, BUFFER)
    mixed_group = np.repeat([0 < correct[g:g + GROUP].sum() < GROUP for g in range(0, len(correct), GROUP)], GROUP)
    assert mixed_group.any() and not mixed_group.all(), "the filter check needs kept and dropped groups"
    expected = numpy_grpo(reward, GROUP)

    experience = run()
    batch = experience.batch
    np.testing.assert_array_equal(batch["response_mask_bt"], unfiltered.batch["response_mask_bt"]
                                  & mixed_group[:, None])
    assert_row_advantages(batch, np.where(mixed_group, expected, 0))
    metrics = experience.metrics
    assert metrics["reward/mean"] == pytest.approx(reward.mean(), abs=1e-6)
    assert metrics["dapo/kept_group_fraction"] == pytest.approx(mixed_group.mean())
    assert metrics["dapo/overlong_penalty_mean"] == pytest.approx(-numpy_overlong(lengths, MAX_NEW_TOKENS,
                                                                                  BUFFER).mean(), abs=1e-6)
    assert metrics["advantage/mean"] == pytest.approx(expected[mixed_group].mean(), abs=1e-5)


def test_dynamic_sampling_switch_changes_only_the_mask_of_uninformative_groups(setup):
    _, _, _, run = setup
    on, off = run(), run(dynamic_sampling=False)
    assert set(on.batch) == set(off.batch)
    for key in on.batch.keys() - {"response_mask_bt", "advantages_bt"}:
        np.testing.assert_array_equal(on.batch[key], off.batch[key])
    kept = on.batch["response_mask_bt"].any(axis=1)
    np.testing.assert_array_equal(on.batch["advantages_bt"][kept], off.batch["advantages_bt"][kept])
    assert off.metrics["dapo/kept_group_fraction"] == 1.0 and on.metrics["dapo/kept_group_fraction"] < 1.0


def test_overlong_switch_changes_only_the_rewards_of_long_responses(setup):
    task, context, examples, run = setup
    shaped, plain = run(dynamic_sampling=False), run(dynamic_sampling=False, overlong_shaping=False)
    correct, _ = verdicts_and_lengths(task, context, examples, plain)
    for key in plain.batch.keys() - {"advantages_bt"}:
        np.testing.assert_array_equal(shaped.batch[key], plain.batch[key])
    assert_row_advantages(plain.batch, numpy_grpo(np.where(correct, 1.0, -1.0), GROUP))
    assert plain.metrics["dapo/overlong_penalty_mean"] == 0 < shaped.metrics["dapo/overlong_penalty_mean"]
    assert plain.metrics["reward/mean"] == pytest.approx(np.where(correct, 1.0, -1.0).mean())


def test_clip_higher_and_token_mean_are_the_default_loss():
    loss = DAPOConfig().policy_loss
    assert (loss.loss, loss.eps_low, loss.eps_high, loss.aggregation, loss.kl_coef) == (
        "ppo", 0.2, 0.28, "token_mean", 0.0)


def test_a_batch_without_informative_groups_trains_on_nothing(setup):
    _, context, examples, _ = setup
    task = NeverCorrectTask(context.task.config, 0)
    experience = DAPO(DAPOConfig(overlong_buffer=BUFFER)).experience(
        examples, dataclasses.replace(context, task=task), step=0)
    assert not experience.batch["response_mask_bt"].any() and not experience.batch["advantages_bt"].any()
    assert experience.metrics["dapo/kept_group_fraction"] == 0
    assert all(math.isfinite(value) for value in experience.metrics.values())


def test_config_is_validated(setup):
    with pytest.raises(ValueError, match="overlong_buffer"):
        DAPOConfig(overlong_buffer=-1)
    with pytest.raises(ValueError, match="shorter than max_length"):
        DAPOConfig(max_length=64, overlong_buffer=64)
    _, context, examples, _ = setup
    with pytest.raises(ValueError, match="shorter than L_max"):
        DAPO(DAPOConfig()).experience(examples, context, step=0)  # DAPO's 4096-token buffer, 16-token responses
