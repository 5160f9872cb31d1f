"""The outcome-only GRPO baseline: one training step end to end through train_rl (every metric finite, the
update moves the policy), and its advantages recomputed in NumPy from the verifier's verdicts on the decoded
responses. Also the helpers the recipe tests share: a tiny policy, a RolloutContext on an EmbeddedEngine (as
training.rl builds it), and a task whose verifier a random policy passes about half the time."""

import dataclasses
import math

import numpy as np
import pytest
from flax import nnx

from rubric_jax.algorithms.base import RolloutContext
from rubric_jax.algorithms.grpo import GRPO, GRPOConfig
from rubric_jax.inference.embedded import EmbeddedEngine
from rubric_jax.inference.engine import SamplingParams
from rubric_jax.training import policy
from rubric_jax.training.metrics import PhaseTimer, read_metrics
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import AlgorithmSpec, MeshConfig, ModelSpec
from tests.training.test_rl import TINY, tiny_rl_config
from tests.training.toy_task import ToyTask, toy_task

PROMPTS, GROUP, MAX_NEW_TOKENS = 4, 4, 16


@dataclasses.dataclass(frozen=True)
class ParityTask(ToyTask):
    """The toy task with a verifier that random text passes about half the time: an even number of digits."""

    def is_correct(self, response, example):
        return sum(c.isdigit() for c in response) % 2 == 0


def parity_task() -> ParityTask:
    return ParityTask(toy_task().config, 0)


def tiny_policy(task):
    """(model, tokenizer) of a tiny random decoder for `task`."""
    return policy.build_policy(ModelSpec(init=TINY), task, policy.make_mesh(MeshConfig()))


def make_context(task, model, tokenizer, judge=None, *, group=GROUP, seed=0) -> RolloutContext:
    """A RolloutContext over an EmbeddedEngine serving `model`, as training.rl builds it."""
    eos_ids, pad_id = policy.eos_and_pad(tokenizer)
    engine = EmbeddedEngine(nnx.merge(*nnx.split(model)), tokenizer=tokenizer, eos_token_ids=eos_ids, pad_id=pad_id)
    return RolloutContext(engine=engine, tokenizer=tokenizer, task=task, judge=judge or task.judge(), pad_id=pad_id,
                          seed=seed, sampling=SamplingParams(max_new_tokens=MAX_NEW_TOKENS, n=group),
                          timer=PhaseTimer())


def response_texts(batch, prompt_width, tokenizer) -> list[str]:
    """Each row's response decoded from the packed tokens, independently of the recipe's own texts."""
    return [tokenizer.decode(list(tokens[prompt_width:][mask[prompt_width:]]), skip_special_tokens=True)
            for tokens, mask in zip(batch["tokens_bt"], batch["response_mask_bt"])]


def numpy_grpo(rewards, group, valid=None, eps=1e-6):
    """(r - mean_g) / (sample std_g + eps) over each group's valid rows; 0 for invalid rows and tied groups."""
    valid = np.ones(len(rewards), bool) if valid is None else valid
    out = np.zeros(len(rewards))
    for start in range(0, len(rewards), group):
        rows = [b for b in range(start, start + group) if valid[b]]
        values = np.array([rewards[b] for b in rows], np.float64)
        if len(values) > 1 and values.std(ddof=1) > 0:
            for b, value in zip(rows, values):
                out[b] = (value - values.mean()) / (values.std(ddof=1) + eps)
    return out


def assert_row_advantages(batch, expected_b, atol=1e-5):
    """advantages_bt holds expected_b[b] on row b's response tokens and 0 elsewhere."""
    mask = batch["response_mask_bt"]
    np.testing.assert_allclose(batch["advantages_bt"], np.where(mask, expected_b[:, None], 0), atol=atol)


@pytest.fixture(scope="module")
def parity():
    task = parity_task()
    model, tokenizer = tiny_policy(task)
    return task, make_context(task, model, tokenizer), task.train_stream(0).next_batch(PROMPTS)


def test_one_grpo_step_end_to_end(tmp_path):
    config = tiny_rl_config(tmp_path, algorithm=AlgorithmSpec(name="grpo"))
    last = train_rl(config, parity_task())
    [line] = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert {"reward/mean", "reward/std", "advantage/mean", "outcome/accuracy", "response/length_mean",
            "train/loss", "train/grad_norm", "train/entropy", "train/clip_fraction"} <= line.keys()
    assert all(math.isfinite(value) for value in last.values())
    assert 0 < line["reward/mean"] < 1 and line["reward/mean"] == line["outcome/accuracy"]
    assert line["train/grad_norm"] > 0


def test_advantages_are_grpo_of_the_verifiers_verdicts(parity):
    task, context, examples = parity
    experience = GRPO(GRPOConfig()).experience(examples, context, step=0)
    batch = experience.batch
    texts = response_texts(batch, experience.prompt_width, context.tokenizer)
    correct = np.array([task.is_correct(text, examples[b // GROUP]) for b, text in enumerate(texts)])
    expected = numpy_grpo(correct.astype(np.float64), GROUP)
    assert np.abs(expected).max() > 0.5, "no group with mixed verdicts: the check would be vacuous"
    assert_row_advantages(batch, expected)
    assert experience.metrics["reward/mean"] == pytest.approx(correct.mean())
    assert experience.metrics["outcome/accuracy"] == pytest.approx(correct.mean())


def test_config_is_validated():
    with pytest.raises(ValueError, match="std_ddof"):
        GRPOConfig(std_ddof=2)
    with pytest.raises(ValueError, match="eps"):
        GRPOConfig(eps=-1.0)
