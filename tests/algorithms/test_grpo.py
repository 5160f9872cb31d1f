"""The outcome-only GRPO baseline: one training step end to end through train_rl (every metric finite, the
update moves the policy), and its advantages recomputed in NumPy from the verifier's verdicts on the decoded
responses, for every `estimator`; ReMax's greedy baseline rollout (temperature 0, one per prompt, not trained on)
recorded at the engine. Also the helpers the recipe tests share: a tiny policy, a RolloutContext on an EmbeddedEngine (as
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
from rubric_jax.yaml_config import config_from_dict
from tests.core import reference_advantages as ref
from tests.core import reference_estimators as ref_est
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
    """A RolloutContext over an EmbeddedEngine serving `model`, as training.rl builds it, judging serially: the
    tests built on it read the judge's one call of a step (`ScriptedJudge.calls[-1]`); the pipelined step is
    proved equal to the serial one in test_pipelined_judging.py."""
    eos_ids, pad_id = policy.eos_and_pad(tokenizer)
    engine = EmbeddedEngine(nnx.merge(*nnx.split(model)), tokenizer=tokenizer, eos_token_ids=eos_ids, pad_id=pad_id)
    return RolloutContext(engine=engine, tokenizer=tokenizer, task=task, judge=judge or task.judge(), pad_id=pad_id,
                          seed=seed, sampling=SamplingParams(max_new_tokens=MAX_NEW_TOKENS, n=group),
                          timer=PhaseTimer(), pipelined_judging=False)


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


class RecordingEngine:
    """An engine that passes every call on and records (prompts, params, samples) of each."""

    def __init__(self, engine):
        self.engine = engine
        self.calls = []

    @property
    def weight_version(self):
        return self.engine.weight_version

    def generate(self, prompts, params):
        samples = self.engine.generate(prompts, params)
        self.calls.append((list(prompts), params, samples))
        return samples


def verdicts(task, context, examples, batch, prompt_width):
    """The verifier's verdicts [B] on the learner batch's decoded responses (row b answers examples[b // GROUP])."""
    texts = response_texts(batch, prompt_width, context.tokenizer)
    return np.array([task.is_correct(text, examples[b // GROUP]) for b, text in enumerate(texts)])


def expected_advantages(estimator, reward, lengths):
    """Each estimator recomputed from the verdicts by its NumPy loop reference (tests/core)."""
    ids, valid = np.arange(reward.size) // GROUP, np.ones(reward.size, bool)
    return {
        "grpo": lambda: numpy_grpo(reward, GROUP),
        "dr_grpo": lambda: ref.dr_grpo(reward, ids, valid),
        "rloo": lambda: ref.rloo(reward, ids, valid),
        "loo_std": lambda: ref.loo_std(reward, ids, valid),
        # pass@k is std-scaled by default (verl's norm_adv_by_std_in_grpo), gpg is not (F_norm = 1)
        "pass_at_k": lambda: ref_est.scale_by_group_std(ref_est.pass_at_k(reward, ids, valid), reward, ids, valid),
        "opo": lambda: ref_est.opo(reward, lengths, ids, valid),
        "gpg": lambda: ref_est.gpg(reward, ids, valid),
    }[estimator]()


@pytest.mark.parametrize("estimator", ["dr_grpo", "rloo", "loo_std", "pass_at_k", "opo", "gpg"])
def test_each_estimator_is_its_reference_on_the_verifiers_verdicts(parity, estimator):
    task, context, examples = parity
    experience = GRPO(GRPOConfig(estimator=estimator)).experience(examples, context, step=0)
    batch = experience.batch
    reward = verdicts(task, context, examples, batch, experience.prompt_width).astype(np.float64)
    lengths = batch["response_mask_bt"].sum(axis=1)
    expected = expected_advantages(estimator, reward, lengths)
    assert np.abs(expected).max() > 0.1, "no group with mixed verdicts: the check would be vacuous"
    assert_row_advantages(batch, expected)
    if estimator == "gpg":
        alpha = ref_est.gpg_alpha(reward, np.arange(reward.size) // GROUP, np.ones(reward.size, bool))
        assert experience.metrics["gpg/alpha"] == pytest.approx(alpha)


def test_pass_at_k_and_gpg_std_scaling_can_be_switched(parity):
    task, context, examples = parity
    for estimator, scale in (("pass_at_k", False), ("gpg", True)):
        experience = GRPO(GRPOConfig(estimator=estimator, scale_by_std=scale)).experience(examples, context, step=0)
        reward = verdicts(task, context, examples, experience.batch, experience.prompt_width).astype(np.float64)
        ids, valid = np.arange(reward.size) // GROUP, np.ones(reward.size, bool)
        unscaled = {"pass_at_k": ref_est.pass_at_k, "gpg": ref_est.gpg}[estimator](reward, ids, valid)
        expected = ref_est.scale_by_group_std(unscaled, reward, ids, valid) if scale else unscaled
        assert_row_advantages(experience.batch, expected)


def test_remax_baseline_is_one_greedy_rollout_per_prompt_that_is_not_trained_on(parity):
    task, context, examples = parity
    recording = RecordingEngine(context.engine)
    context = dataclasses.replace(context, engine=recording)
    experience = GRPO(GRPOConfig(estimator="remax")).experience(examples, context, step=0)
    [(prompts, sampled, _), (greedy_prompts, greedy, greedy_samples)] = recording.calls
    assert greedy_prompts == prompts and len(prompts) == PROMPTS
    assert (sampled.n, sampled.temperature) == (GROUP, context.sampling.temperature) and sampled.temperature > 0
    assert (greedy.n, greedy.temperature) == (1, 0.0) and greedy.seed != sampled.seed  # its own stream
    batch = experience.batch
    assert batch["tokens_bt"].shape[0] == PROMPTS * GROUP  # the greedy rows are not in the learner's batch
    reward = verdicts(task, context, examples, batch, experience.prompt_width).astype(np.float64)
    greedy_texts = [context.tokenizer.decode(s.output_ids, skip_special_tokens=True) for s in greedy_samples]
    greedy_reward = np.array([task.is_correct(text, examples[s.prompt_index])
                              for s, text in zip(greedy_samples, greedy_texts)], np.float64)
    expected = ref_est.remax(reward, greedy_reward[np.arange(reward.size) // GROUP], np.ones(reward.size, bool))
    assert np.abs(expected).max() > 0.5, "every rollout scored as its greedy baseline: the check would be vacuous"
    assert_row_advantages(batch, expected)
    assert experience.metrics["remax/greedy_accuracy"] == pytest.approx(greedy_reward.mean())
    assert experience.metrics["outcome/accuracy"] == pytest.approx(reward.mean())


def test_one_remax_step_end_to_end_from_yaml_params(tmp_path):
    config = tiny_rl_config(tmp_path, algorithm=AlgorithmSpec(name="grpo", params={"estimator": "remax"}))
    last = train_rl(config, parity_task())
    [line] = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert {"remax/greedy_accuracy", "advantage/mean", "train/loss", "train/grad_norm"} <= line.keys()
    assert all(math.isfinite(value) for value in last.values())


def test_estimator_config_is_validated():
    with pytest.raises(ValueError, match="estimator"):
        GRPOConfig(estimator="ppo")
    with pytest.raises(ValueError, match="algorithm.params.estimator"):
        config_from_dict(GRPOConfig, {"estimator": "reinforce"}, "algorithm.params")
    with pytest.raises(ValueError, match="scale_by_std"):
        GRPOConfig(estimator="grpo", scale_by_std=True)
    assert GRPOConfig(estimator="pass_at_k").std_scaled and not GRPOConfig(estimator="gpg").std_scaled
    assert not GRPOConfig(estimator="pass_at_k", scale_by_std=False).std_scaled
    assert config_from_dict(GRPOConfig, {"estimator": "gpg", "scale_by_std": True}).std_scaled
