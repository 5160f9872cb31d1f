"""Rubric-grounded GRPO: one training step end to end through train_rl, with judge failures and an empty rubric
mid-run and then with the policy-loss options on; the rewards and LOO advantages recomputed in NumPy from a
scripted judge's partial-credit verdicts; the grounding reaches the judge and never the policy; each switch
(baseline, std scaling, dynamic sampling, truncation penalty, failure policy) changes exactly what the paper
says; a failed or empty judgement is a zero reward, counted, never a NaN."""

import dataclasses
import math
import zlib

import numpy as np
import pytest

from rubric_jax.algorithms.rubric_grounded import RubricGrounded, RubricGroundedConfig, grounded_advantages
from rubric_jax.judges.base import Judge, JudgeRequest, RolloutVerdict, Verdicts
from rubric_jax.rubrics.schema import Rubric
from rubric_jax.training.metrics import read_metrics
from rubric_jax.training.assembly import make_judge
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import AlgorithmSpec, JudgeConfig, RolloutConfig
from tests.algorithms.test_grpo import GROUP, PROMPTS, assert_row_advantages, make_context, tiny_policy
from tests.training.test_rl import tiny_rl_config
from tests.training.toy_task import RUBRIC, ToyTask, toy_task

FAILED_ROWS = (1, 5, 6)  # rows 5 and 6 share a group


class ScriptedJudge(Judge):
    """Partial-credit scores in {0, 1/4, ..., 1} that are a fixed function of (response, criterion), failures
    ("bad_json") on the given rows of each call, and a record of every request and verdict."""

    def __init__(self, failed_rows=()):
        self.failed_rows = set(failed_rows)
        self.calls = []

    def judge(self, requests, max_items):
        verdicts = []
        for b, request in enumerate(requests):
            if b in self.failed_rows:
                verdicts.append(RolloutVerdict.failure("bad_json", "scripted"))
                continue
            scores = [zlib.crc32(f"{request.response}|{k}".encode()) % 5 / 4
                      for k in range(len(request.rubric.criteria))]
            verdicts.append(RolloutVerdict(satisfied=tuple(scores)))
        result = Verdicts.from_rollouts(verdicts, max_items)
        self.calls.append((list(requests), result))
        return result


@dataclasses.dataclass(frozen=True)
class EmptyRubricTask(ToyTask):
    """The toy task whose rubric is empty for the questions in `empty`."""

    empty: frozenset = frozenset()

    def rubric(self, example):
        return Rubric() if example.question in self.empty else RUBRIC


def numpy_rewards(verdicts: Verdicts, rubrics) -> np.ndarray:
    """clip(sum_k w_k s_k / sum_k w_k, 0, 1) per row, 0 for an empty rubric (eqs 1-2)."""
    out = np.zeros(len(rubrics))
    for b, rubric in enumerate(rubrics):
        weights = np.array([c.weight for c in rubric.criteria], np.float64)
        if weights.sum() > 0:
            scores = verdicts.satisfied_bk[b, :len(weights)].astype(np.float64)
            out[b] = min(max((weights * scores).sum() / weights.sum(), 0.0), 1.0)
    return out


def numpy_loo(rewards, group, valid, *, scale=True, eps=1e-6, whole_group_std=False):
    """Eqs 4-6 row by row: b_i, s_i the mean and sample std of the group's other valid rewards; A_i =
    (r_i - b_i) / (s_i + eps) where s_i > 0, else r_i - b_i (unscaled when `scale` is False); 0 when invalid
    or alone. With `whole_group_std`, s_i is the sample std of all the group's valid rewards, and A_i = 0 where
    it is 0 (then r_i = b_i)."""
    out = np.zeros(len(rewards))
    for b in range(len(rewards)):
        start = b - b % group
        members = np.array([rewards[j] for j in range(start, start + group) if valid[j]], np.float64)
        others = np.array([rewards[j] for j in range(start, start + group) if j != b and valid[j]], np.float64)
        if not valid[b] or len(others) == 0:
            continue
        centred = rewards[b] - others.mean()
        spread = members if whole_group_std else others
        std = spread.std(ddof=1) if len(spread) > 1 else 0.0
        out[b] = centred / (std + eps) if scale and std > 0 else (0.0 if scale and whole_group_std else centred)
    return out


def numpy_group(rewards, group, valid, *, scale=True, eps=1e-6):
    """GRPO's group baseline (the rollout itself in the mean) with or without the sample std."""
    out = np.zeros(len(rewards))
    for start in range(0, len(rewards), group):
        rows = [b for b in range(start, start + group) if valid[b]]
        values = np.array([rewards[b] for b in rows], np.float64)
        if len(values) < 2:
            continue
        for b, value in zip(rows, values):
            centred = value - values.mean()
            std = values.std(ddof=1)
            out[b] = (centred / (std + eps) if std > 0 else 0.0) if scale else centred
    return out


@pytest.fixture(scope="module")
def setup():
    """A run function for one step on 4 prompts x 4 rollouts, the first prompt's rubric empty, rows 1, 5, 6
    failing judgement; returns (experience, the judge's last requests and verdicts, stopped flags)."""
    base = toy_task()
    examples = base.train_stream(0).next_batch(PROMPTS)
    task = EmptyRubricTask(base.config, 0, empty=frozenset({examples[0].question}))
    model, tokenizer = tiny_policy(task)
    judge = ScriptedJudge(FAILED_ROWS)
    context = make_context(task, model, tokenizer, judge, seed=1)  # a seed with stopped and truncated responses

    def run(**changes):
        experience = RubricGrounded(RubricGroundedConfig(**changes)).experience(examples, context, step=0)
        requests, verdicts = judge.calls[-1]
        return experience, requests, verdicts

    return task, context, examples, run


def rubrics_of(task, examples):
    return [task.rubric(examples[b // GROUP]) for b in range(len(examples) * GROUP)]


def stopped_rows(experience, context) -> np.ndarray:
    """Rows whose response ends with the tokenizer's end-of-sequence token (the others were truncated)."""
    eos = context.tokenizer.eos_token_id
    return np.array([tokens[mask][-1] == eos for tokens, mask in
                     zip(experience.batch["tokens_bt"], experience.batch["response_mask_bt"])])


def test_one_step_end_to_end_with_judge_failures_and_an_empty_rubric(tmp_path):
    base = toy_task()
    first = base.train_stream(0).next_batch(1)[0]
    task = EmptyRubricTask(base.config, 0, empty=frozenset({first.question}))
    serial = RolloutConfig(prompts_per_step=2, group_size=4, max_new_tokens=16, pipelined_judging=False)
    last = train_rl(tiny_rl_config(tmp_path, algorithm=AlgorithmSpec(name="rubric_grounded"), rollout=serial),
                    task, judge=ScriptedJudge(FAILED_ROWS))  # failing rows of the step's one judge call
    [line] = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert all(math.isfinite(value) for value in last.values())
    assert {"reward/mean", "advantage/mean", "rubric/has_digit", "outcome/accuracy", "train/loss", "train/kl",
            "train/grad_norm", "grounded/zero_reward_fraction", "grounded/kept_group_fraction"} <= line.keys()
    assert line["judge/failure_rate"] == pytest.approx(len(FAILED_ROWS) / 8)
    assert line["judge/failed/bad_json"] == len(FAILED_ROWS)
    assert line["grounded/empty_rubric_fraction"] == 0.5  # one prompt of two
    assert line["train/grad_norm"] > 0


def test_one_step_end_to_end_with_the_policy_loss_options(tmp_path):
    params = {"dynamic_sampling": True, "truncation": "scale",
              "policy_loss": {"loss": "gspo", "aggregation": "seq_mean_token_mean", "rollout_correction": "tis"}}
    last = train_rl(tiny_rl_config(tmp_path, algorithm=AlgorithmSpec(name="rubric_grounded", params=params)),
                    toy_task())
    assert all(math.isfinite(value) for value in last.values())
    # the embedded engine samples with the learner's weights: every TIS weight is 1 up to float error
    assert last["train/is_weight"] == pytest.approx(1.0, abs=1e-4) and last["train/is_zeroed"] == 0
    assert last["train/grad_norm"] > 0


def test_rewards_and_loo_advantages_match_numpy_from_the_judges_verdicts(setup):
    task, context, examples, run = setup
    experience, requests, verdicts = run()
    rubrics = rubrics_of(task, examples)
    rewards = numpy_rewards(verdicts, rubrics)
    assert verdicts.failed_b[list(FAILED_ROWS)].all() and (rewards[list(FAILED_ROWS)] == 0).all()
    assert (rewards[:GROUP] == 0).all()  # the empty rubric
    assert len(set(np.round(rewards[GROUP:], 6))) > 4, "partial credit should give many reward levels"
    expected = numpy_loo(rewards, GROUP, np.ones(len(rewards), bool))
    assert_row_advantages(experience.batch, expected, atol=1e-4)
    metrics = experience.metrics
    assert metrics["reward/mean"] == pytest.approx(rewards.mean(), abs=1e-6)
    assert metrics["judge/failure_rate"] == pytest.approx(len(FAILED_ROWS) / len(rewards))
    assert metrics["judge/failed/bad_json"] == len(FAILED_ROWS)
    assert metrics["grounded/empty_rubric_fraction"] == pytest.approx(1 / PROMPTS)
    assert metrics["grounded/zero_reward_fraction"] == pytest.approx(np.mean(rewards == 0))
    assert all(math.isfinite(value) for value in metrics.values())


def test_the_grounding_reaches_the_judge_and_never_the_policy(setup):
    task, context, examples, run = setup
    experience, requests, _ = run()
    tokens, width = experience.batch["tokens_bt"], experience.prompt_width
    for b, request in enumerate(requests):
        grounding = task.reference(examples[b // GROUP])
        assert grounding and request.reference == grounding
        prompt = context.tokenizer.decode(list(tokens[b, :width]), skip_special_tokens=True)
        assert examples[b // GROUP].question in prompt and grounding not in prompt


@pytest.mark.parametrize("changes, estimator", [
    ({"baseline": "group_mean"}, lambda r, v: numpy_group(r, GROUP, v)),
    ({"scale_by_std": False}, lambda r, v: numpy_loo(r, GROUP, v, scale=False)),
    ({"baseline": "group_mean", "scale_by_std": False}, lambda r, v: numpy_group(r, GROUP, v, scale=False)),
    ({"std_over": "group"}, lambda r, v: numpy_loo(r, GROUP, v, whole_group_std=True)),
])
def test_estimator_switches_change_only_the_advantages(setup, changes, estimator):
    task, _, examples, run = setup
    default, _, _ = run()
    changed, _, verdicts = run(**changes)
    rewards = numpy_rewards(verdicts, rubrics_of(task, examples))
    for key in default.batch.keys() - {"advantages_bt"}:
        np.testing.assert_array_equal(changed.batch[key], default.batch[key])
    assert_row_advantages(changed.batch, estimator(rewards, np.ones(len(rewards), bool)), atol=1e-4)
    assert changed.metrics["reward/mean"] == default.metrics["reward/mean"]


@pytest.mark.parametrize("std_over, std_ddof, expected", [
    # r = (1, 0.5, 0.5, 0). Row 0: the others (0.5, 0.5, 0) have mean 1/3, so r - b = 2/3; their squared
    # deviations (1/6)^2 + (1/6)^2 + (1/3)^2 = 1/6.
    ("others", 1, 2 / 3 / math.sqrt(1 / 6 / 2)),  # sample std sqrt(1/12): 4 / sqrt(3) = 2.309
    ("others", 0, 2 / 3 / math.sqrt(1 / 6 / 3)),  # population std sqrt(1/18): 2 sqrt(2) = 2.828
    # the whole group (1, 0.5, 0.5, 0): mean 0.5, squared deviations 0.25 + 0 + 0 + 0.25 = 0.5
    ("group", 1, 2 / 3 / math.sqrt(0.5 / 3)),  # sample std sqrt(1/6): 1.633
    ("group", 0, 2 / 3 / math.sqrt(0.5 / 4)),  # population std sqrt(1/8): 1.886
])
def test_the_readings_of_the_group_standard_deviation_by_hand(std_over, std_ddof, expected):
    """Eq 5's "group standard deviation" read three ways (and the whole group's with either ddof). Rows 1 and 2
    equal their others' mean (0.5), so A = 0 there; row 3 mirrors row 0."""
    config = RubricGroundedConfig(std_over=std_over, std_ddof=std_ddof, eps=0.0)
    advantage = grounded_advantages(np.array([1.0, 0.5, 0.5, 0.0], np.float32), np.zeros(4, np.int32),
                                    np.ones(4, bool), config)
    np.testing.assert_allclose(advantage, [expected, 0, 0, -expected], rtol=1e-6, atol=1e-7)


def test_dynamic_sampling_drops_only_the_groups_whose_rewards_tie(setup):
    task, _, examples, run = setup
    default, _, verdicts = run()
    filtered, _, _ = run(dynamic_sampling=True)
    rewards = numpy_rewards(verdicts, rubrics_of(task, examples))
    tied = np.repeat([np.ptp(rewards[g:g + GROUP]) == 0 for g in range(0, len(rewards), GROUP)], GROUP)
    assert tied.any() and not tied.all()  # the empty-rubric group ties at 0
    np.testing.assert_array_equal(filtered.batch["response_mask_bt"],
                                  default.batch["response_mask_bt"] & ~tied[:, None])
    np.testing.assert_array_equal(filtered.batch["advantages_bt"][~tied], default.batch["advantages_bt"][~tied])
    assert filtered.metrics["grounded/kept_group_fraction"] == pytest.approx(1 - tied.mean())
    assert default.metrics["grounded/kept_group_fraction"] == 1.0


def test_truncation_scale_multiplies_only_truncated_rewards(setup):
    task, context, examples, run = setup
    default, _, verdicts = run()
    scaled, _, _ = run(truncation="scale", truncation_factor=0.25)
    stopped = stopped_rows(default, context)
    assert stopped.any() and not stopped.all()
    rewards = numpy_rewards(verdicts, rubrics_of(task, examples))
    expected = numpy_loo(np.where(stopped, rewards, 0.25 * rewards), GROUP, np.ones(len(rewards), bool))
    assert_row_advantages(scaled.batch, expected, atol=1e-4)
    np.testing.assert_array_equal(scaled.batch["response_mask_bt"], default.batch["response_mask_bt"])


def test_truncation_mask_takes_truncated_rows_out_of_groups_and_loss(setup):
    task, context, examples, run = setup
    default, _, verdicts = run()
    masked, _, _ = run(truncation="mask")
    stopped = stopped_rows(default, context)
    rewards = numpy_rewards(verdicts, rubrics_of(task, examples))
    np.testing.assert_array_equal(masked.batch["response_mask_bt"],
                                  default.batch["response_mask_bt"] & stopped[:, None])
    assert_row_advantages(masked.batch, numpy_loo(rewards, GROUP, stopped), atol=1e-4)


def test_excluding_failed_judgements_instead_of_zero_reward(setup):
    task, _, examples, run = setup
    default, _, verdicts = run()
    excluded, _, _ = run(on_judge_failure="exclude")
    ok = ~verdicts.failed_b
    rewards = numpy_rewards(verdicts, rubrics_of(task, examples))
    np.testing.assert_array_equal(excluded.batch["response_mask_bt"], default.batch["response_mask_bt"] & ok[:, None])
    assert_row_advantages(excluded.batch, numpy_loo(rewards, GROUP, ok), atol=1e-4)


def test_every_judgement_failing_gives_zero_rewards_and_advantages(setup):
    task, context, examples, _ = setup
    judge = ScriptedJudge(range(PROMPTS * GROUP))
    experience = RubricGrounded(RubricGroundedConfig()).experience(
        examples, dataclasses.replace(context, judge=judge), step=0)
    assert not experience.batch["advantages_bt"].any()
    assert experience.metrics["reward/mean"] == 0 and experience.metrics["judge/failure_rate"] == 1
    assert all(math.isfinite(value) for value in experience.metrics.values())


def test_paper_defaults_and_validation(setup):
    config = RubricGroundedConfig()
    assert (config.baseline, config.scale_by_std, config.on_judge_failure, config.dynamic_sampling,
            config.truncation) == ("loo", True, "zero_reward", "off", "none")
    loss = config.policy_loss
    assert (loss.loss, loss.eps_low, loss.eps_high, loss.kl_estimator, loss.aggregation) == (
        "ppo", 0.2, 0.2, "k3", "token_mean") and loss.kl_coef > 0
    with pytest.raises(ValueError, match="truncation_factor"):
        RubricGroundedConfig(truncation_factor=1.5)
    with pytest.raises(ValueError, match="max_items"):
        RubricGroundedConfig(max_items=0)
    assert config.std_over == "others" and config.std_ddof == 1
    for changes in ({"baseline": "group_mean"}, {"scale_by_std": False}):
        with pytest.raises(ValueError, match="std_over"):
            RubricGroundedConfig(std_over="group", **changes)

    @dataclasses.dataclass(frozen=True)
    class Ungrounded(ToyTask):
        def reference(self, example):
            return None

    task, context, examples, _ = setup
    with pytest.raises(ValueError, match="grounding"):
        RubricGrounded(config).experience(examples, dataclasses.replace(context, task=Ungrounded(task.config, 0)), 0)


def test_the_judge_config_truncates_the_grounding_passage():
    """Section 4.3's maximum passage length reaches the judge's prompt through judge.max_grounding_chars."""
    llm = dict(kind="llm", url="http://127.0.0.1:9", model="judge", format="grounded")
    request = JudgeRequest("Q?", "an answer", RUBRIC, reference="0123456789")
    cut = make_judge(JudgeConfig(**llm, max_grounding_chars=4), toy_task(), seed=0)
    whole = make_judge(JudgeConfig(**llm), toy_task(), seed=0)
    cut_prompt, whole_prompt = (j.fmt.messages(request)[-1]["content"] for j in (cut, whole))
    assert "SOURCE PASSAGE (truncated):" in cut_prompt and "0123" in cut_prompt and "01234" not in cut_prompt
    assert "SOURCE PASSAGE:" in whole_prompt and "0123456789" in whole_prompt
    for bad in (dict(llm, max_grounding_chars=-1), dict(llm, format="rating", max_grounding_chars=4)):
        with pytest.raises(ValueError, match="max_grounding_chars"):
            JudgeConfig(**bad)
