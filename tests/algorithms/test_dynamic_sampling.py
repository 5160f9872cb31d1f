"""Dynamic sampling's re-sampling (`algorithms.base.dynamic_groups`; DAPO's Algorithm 1, verl's `filter_groups`) on
hand-built cases: a scripted engine answers each example with fixed responses, so which groups are informative
(answers neither all right nor all wrong) is known before the step runs. Checked by hand: which examples train and
in which order (the first informative groups in sampling order, the surplus trimmed), how many examples the step
drew from the stream, each generation batch's own seed, what a step stopped short by `max_num_gen_batches` trains
on (the informative groups, the rest of the batch masked uninformative groups; none at all when nothing was
informative), that SRaR judges only the groups that train, and the agreement of processes on drawing again. Also
the config: the modes, the booleans of older configs, and the settings refused outside "resample"."""

import dataclasses
import math

import numpy as np
import pytest

from rubric_jax.algorithms.base import RolloutContext
from rubric_jax.algorithms.dapo import DAPO, DAPOConfig
from rubric_jax.algorithms.rubric_grounded import RubricGroundedConfig
from rubric_jax.algorithms.srar import SRaR, SRaRConfig
from rubric_jax.data import arithmetic
from rubric_jax.data.arithmetic_srar import ArithmeticSrarTask
from rubric_jax.inference.engine import RolloutEngine, Sample, SamplingParams
from rubric_jax.judges.base import Judge, RolloutVerdict, Verdicts
from rubric_jax.rubrics.schema import Rubric
from rubric_jax.training import data_parallel
from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.metrics import PhaseTimer, read_metrics
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import AlgorithmSpec, RLConfig, RolloutConfig
from rubric_jax.yaml_config import config_from_dict
from tests.training.test_rl import tiny_rl_config
from tests.training.toy_task import RUBRIC, ToyTask

TOKENIZER = arithmetic.build_tokenizer()
G = 2
MIXED, RIGHT, WRONG = ("1", "0"), ("1", "1"), ("0", "0")  # "1" is a right answer


@dataclasses.dataclass(frozen=True)
class Item:
    name: str
    answers: tuple[str, ...]


class ScriptedTask:
    """Examples are Items: the prompt is the item's name, a response is right when it is "1"; no rubric."""

    def prompt(self, example):
        return [{"role": "user", "content": example.name}]

    def question(self, example):
        return example.name

    def rubric(self, example):
        return Rubric()

    def reference(self, example):
        return "the reference"

    def is_correct(self, response, example):
        return response == "1"


class ScriptedEngine(RolloutEngine):
    """Answers each prompt with its item's responses (each ending with EOS); records each call's item names and
    sampling seed."""

    weight_version = "scripted"

    def __init__(self, items):
        self.answers = {item.name: item.answers for item in items}
        self.calls = []

    def generate(self, prompts, params):
        names = [prompt[-1]["content"] for prompt in prompts]
        self.calls.append((names, params.seed))
        samples = []
        for p, name in enumerate(names):
            assert len(self.answers[name]) == params.n
            for text in self.answers[name]:
                ids = tuple(TOKENIZER.encode(text, add_special_tokens=False)) + (arithmetic.EOS_ID,)
                samples.append(Sample(p, ids, (0.0,) * len(ids), "stop", arithmetic.EOS_ID, self.weight_version))
        return samples

    async def agenerate(self, prompts, params):
        return self.generate(prompts, params)

    def update_weights(self, model, version):
        raise NotImplementedError


class ScriptedStream:
    """An `ExampleStream` over a list, for one process of `processes`: its share of n examples is the list's next
    n / processes, and `others` are the informative-group counts the other process reports after each generation
    batch (none: this is the only process)."""

    def __init__(self, items, prompts_per_step, processes=1, others=()):
        self.items, self.position, self.processes = list(items), 0, processes
        self.prompts_per_step, self.quota = prompts_per_step, prompts_per_step // processes
        self.others, self.counts = list(others), []

    def next_share(self, n):
        self.position += n // self.processes
        return self.items[self.position - n // self.processes:self.position]

    def fewest(self, count):
        self.counts.append(count)
        other = self.others[len(self.counts) - 1] if self.others else count
        return min(count, other)


class RecordingJudge(Judge):
    """Satisfies nothing and records the questions it was asked about."""

    def __init__(self):
        self.questions = []

    def judge(self, requests, max_items):
        self.questions += [request.question for request in requests]
        return Verdicts.from_rollouts([RolloutVerdict(satisfied=(0.0,) * len(r.rubric.criteria)) for r in requests],
                                      max_items)


def solved(example) -> bool:
    """The arithmetic stream's two-step problems (about half): the tasks below make every rollout of them right
    (or, for the rubric-grounded task, give them an empty rubric, so every reward is 0)."""
    return len(example.steps) == 2


def parity(response) -> bool:
    """Right about half the time for a random policy: an even number of digits."""
    return sum(c.isdigit() for c in response) % 2 == 0


@dataclasses.dataclass(frozen=True)
class HalfSolvedTask(ToyTask):
    """The toy task with an outcome of uniform accuracy on the `solved` questions (all right), random elsewhere."""

    def is_correct(self, response, example):
        return solved(example) or parity(response)


@dataclasses.dataclass(frozen=True)
class HalfSolvedSrarTask(ArithmeticSrarTask):
    def is_correct(self, response, example):
        return solved(example) or parity(response)


@dataclasses.dataclass(frozen=True)
class HalfTiedTask(ToyTask):
    """The toy task whose `solved` questions have an empty rubric: every rollout's reward 0, a tied group."""

    def rubric(self, example):
        return Rubric() if solved(example) else RUBRIC


def items(*kinds):
    return [Item(f"e{i}", answers) for i, answers in enumerate(kinds)]


def context_for(engine, stream, judge=None):
    return RolloutContext(engine=engine, tokenizer=TOKENIZER, task=ScriptedTask(), judge=judge or RecordingJudge(),
                          pad_id=arithmetic.PAD_ID, seed=7, sampling=SamplingParams(max_new_tokens=4, n=G),
                          timer=PhaseTimer(), stream=stream)


def run_dapo(kinds, prompts_per_step=3, **params):
    """One DAPO step (no overlong shaping) on the scripted items `kinds`, as the trainer runs it: the step's first
    prompts_per_step examples from the stream, the rest drawn by the recipe."""
    stream = ScriptedStream(items(*kinds), prompts_per_step)
    engine = ScriptedEngine(stream.items)
    config = DAPOConfig(overlong_shaping=False, **params)
    experience = DAPO(config).experience(stream.next_share(prompts_per_step), context_for(engine, stream), step=4)
    return experience, engine, stream


def trained_items(experience):
    """Each row's item name, read from the packed prompt tokens."""
    width = experience.prompt_width
    texts = [TOKENIZER.decode(row[:width], skip_special_tokens=True) for row in experience.batch["tokens_bt"]]
    return [text.split("\n")[1] for text in texts]  # "user\n<name>\nassistant\n"


def test_resampling_keeps_the_first_informative_groups_in_sampling_order_and_trims_the_surplus():
    # Batch 0 (the step's three examples): e0 and e2 informative, e1 all right. Batch 1 (the stream's next three):
    # e3 all wrong, e4 informative (fills the step), e5 informative (surplus, dropped as verl trims its batch).
    experience, engine, stream = run_dapo([MIXED, RIGHT, MIXED, WRONG, MIXED, MIXED], dynamic_sampling="resample")
    assert [names for names, _ in engine.calls] == [["e0", "e1", "e2"], ["e3", "e4", "e5"]]
    assert trained_items(experience) == ["e0", "e0", "e2", "e2", "e4", "e4"]
    assert stream.position == 6  # both batches drawn from the stream: a checkpoint saves this position
    batch = experience.batch
    assert batch["response_mask_bt"].any(axis=1).all()
    # r = +1 / -1 (DAPO, section 2.4), a mixed group's GRPO advantage: (1 - 0) / (sqrt(2) + 1e-6), sample std
    expected = 1 / (math.sqrt(2) + 1e-6)
    advantage_b = np.array([row[mask][0] for row, mask in zip(batch["advantages_bt"], batch["response_mask_bt"])])
    np.testing.assert_allclose(advantage_b, [expected, -expected] * 3, rtol=1e-6)
    assert {key: value for key, value in experience.metrics.items() if key.startswith("dynamic_sampling/")} == {
        "dynamic_sampling/gen_batches": 2.0, "dynamic_sampling/groups_drawn": 6.0,
        "dynamic_sampling/groups_kept": 3.0, "dynamic_sampling/cap_hit": 0.0}
    assert experience.metrics["dapo/kept_group_fraction"] == 1.0
    # Each generation batch its own seed; the first the one of the step without re-sampling (stream 0, batch 0).
    seeds = [seed for _, seed in engine.calls]
    _, mask_engine, _ = run_dapo([MIXED, RIGHT, MIXED], dynamic_sampling="mask")
    assert seeds[0] == mask_engine.calls[0][1] and seeds[0] != seeds[1]


def test_a_generation_batch_larger_than_the_step_completes_the_steps_examples_from_the_stream():
    # prompts_per_step 2, batches of 3: batch 0 is the step's e0, e1 and the stream's e2; e1 and e2 informative.
    experience, engine, stream = run_dapo([RIGHT, MIXED, MIXED, MIXED], prompts_per_step=2,
                                          dynamic_sampling="resample", gen_batch_prompts=3)
    assert [names for names, _ in engine.calls] == [["e0", "e1", "e2"]]
    assert trained_items(experience) == ["e1", "e1", "e2", "e2"] and stream.position == 3


def test_a_step_stopped_by_the_cap_trains_its_informative_groups_and_masks_the_fill():
    # Two batches at most: e2 is the only informative group. The step is filled with the first uninformative
    # groups drawn (e0, e1), their rows off.
    experience, engine, stream = run_dapo([RIGHT, WRONG, MIXED, WRONG, RIGHT, WRONG, MIXED],
                                          dynamic_sampling="resample", max_num_gen_batches=2)
    assert len(engine.calls) == 2 and stream.position == 6
    assert trained_items(experience) == ["e2", "e2", "e0", "e0", "e1", "e1"]
    np.testing.assert_array_equal(experience.batch["response_mask_bt"].any(axis=1), [True] * 2 + [False] * 4)
    assert not experience.batch["advantages_bt"][2:].any()
    metrics = experience.metrics
    assert (metrics["dynamic_sampling/cap_hit"], metrics["dynamic_sampling/groups_kept"],
            metrics["dynamic_sampling/gen_batches"]) == (1.0, 1.0, 2.0)
    assert metrics["dapo/kept_group_fraction"] == pytest.approx(1 / 3)


def test_a_step_without_any_informative_group_trains_on_nothing():
    experience, _, _ = run_dapo([RIGHT, WRONG, RIGHT, WRONG, WRONG, RIGHT], dynamic_sampling="resample",
                                max_num_gen_batches=2)
    assert trained_items(experience) == ["e0", "e0", "e1", "e1", "e2", "e2"]
    assert not experience.batch["response_mask_bt"].any() and not experience.batch["advantages_bt"].any()
    assert experience.metrics["dynamic_sampling/groups_kept"] == 0 and experience.metrics["dynamic_sampling/cap_hit"]
    assert all(math.isfinite(value) for value in experience.metrics.values())



def test_a_step_that_keeps_drawing_says_so_every_ten_batches(caplog):
    """Without a cap a step of solved prompts draws for ever, as verl's: the log says so while it draws."""
    with caplog.at_level("WARNING", logger="rubric_jax.algorithms.base"):
        experience, engine, _ = run_dapo([RIGHT] * 12, prompts_per_step=1, dynamic_sampling="resample",
                                         max_num_gen_batches=12)
    assert len(engine.calls) == 12 and experience.metrics["dynamic_sampling/cap_hit"] == 1.0
    warnings = [r.getMessage() for r in caplog.records if r.name == "rubric_jax.algorithms.base"]
    assert warnings == ["dynamic sampling: 10 generation batches drawn, 0 of 1 informative groups kept on this "
                        "process (max_num_gen_batches 12)"]

def test_mask_mode_draws_nothing_more_and_logs_as_before():
    experience, engine, stream = run_dapo([MIXED, RIGHT, MIXED, MIXED], dynamic_sampling=True)
    assert len(engine.calls) == 1 and stream.position == 3
    assert trained_items(experience) == ["e0", "e0", "e1", "e1", "e2", "e2"]
    np.testing.assert_array_equal(experience.batch["response_mask_bt"].any(axis=1), [1, 1, 0, 0, 1, 1])
    assert not any(key.startswith("dynamic_sampling/") for key in experience.metrics)


def test_srar_judges_only_the_groups_that_train():
    stream = ScriptedStream(items(MIXED, RIGHT, WRONG, MIXED, MIXED, MIXED), 2)
    judge = RecordingJudge()
    experience = SRaR(SRaRConfig(dynamic_sampling="resample")).experience(
        stream.next_share(2), context_for(ScriptedEngine(stream.items), stream, judge), step=0)
    # batch 0: e0 informative, e1 not; batch 1: e2 not, e3 fills the step
    assert judge.questions == ["e0", "e0", "e3", "e3"] and trained_items(experience) == judge.questions
    assert experience.metrics["srar/kept_group_fraction"] == 1.0


def test_every_process_draws_until_the_process_short_of_its_quota_has_it():
    # One process of two: quota 1 of the step's 2 prompts, batches of 2 (its share: 1 example). It has its group
    # after batch 0; the other process reports 0, then 0, then 1: both draw three batches, this one dropping its
    # later informative groups.
    stream = ScriptedStream(items(MIXED, MIXED, MIXED), 2, processes=2, others=(0, 0, 1))
    engine = ScriptedEngine(stream.items)
    experience = DAPO(DAPOConfig(overlong_shaping=False, dynamic_sampling="resample")).experience(
        stream.next_share(2), context_for(engine, stream), step=0)
    assert stream.counts == [1, 1, 1] and len(engine.calls) == 3
    assert trained_items(experience) == ["e0", "e0"]
    assert experience.metrics["dynamic_sampling/gen_batches"] == 3


def test_fewest_over_processes_is_the_minimum_of_the_gathered_counts(monkeypatch):
    assert data_parallel.fewest_over_processes(5) == 5  # one process
    gathered = []

    def allgather(values):
        gathered.append(values.tolist())
        return np.array([values, [2]])

    monkeypatch.setattr(data_parallel.jax, "process_count", lambda: 2)
    monkeypatch.setattr(data_parallel.multihost_utils, "process_allgather", allgather)
    assert data_parallel.fewest_over_processes(5) == 2 and data_parallel.fewest_over_processes(1) == 1
    assert gathered == [[5], [1]]


def test_the_modes_and_the_booleans_of_older_configs():
    for config_class in (DAPOConfig, SRaRConfig, RubricGroundedConfig):
        read = [config_from_dict(config_class, {"dynamic_sampling": value}, "algorithm.params").dynamic_sampling
                for value in (True, False, "off", "mask", "resample")]
        assert read == ["mask", "off", "off", "mask", "resample"]
        with pytest.raises(ValueError, match="algorithm.params.dynamic_sampling"):
            config_from_dict(config_class, {"dynamic_sampling": "sometimes"}, "algorithm.params")
        with pytest.raises(ValueError, match="dynamic_sampling must be one of"):
            config_class(dynamic_sampling=1)
        for setting in ({"max_num_gen_batches": 3}, {"gen_batch_prompts": 8}):
            with pytest.raises(ValueError, match="settings of dynamic_sampling resample, not of mask"):
                config_class(dynamic_sampling="mask", **setting)
        with pytest.raises(ValueError, match="max_num_gen_batches must be >= 0"):
            config_class(dynamic_sampling="resample", max_num_gen_batches=-1)
    assert DAPOConfig().dynamic_sampling == "mask" and SRaRConfig().dynamic_sampling == "off"


def test_a_generation_batch_smaller_than_the_step_and_groups_of_one_are_refused_at_load(tmp_path):
    params = {"dynamic_sampling": "resample", "gen_batch_prompts": 1, "overlong_buffer": 4}
    with pytest.raises(ValueError, match="gen_batch_prompts .1. must be at least rollout.prompts_per_step .2."):
        tiny_rl_config(tmp_path, algorithm=AlgorithmSpec(name="dapo", params=params))
    params["gen_batch_prompts"] = 4
    config = tiny_rl_config(tmp_path, algorithm=AlgorithmSpec(name="dapo", params=params))
    assert isinstance(config, RLConfig) and config.rollout == RolloutConfig(prompts_per_step=2, group_size=4,
                                                                           max_new_tokens=16)
    with pytest.raises(ValueError, match="resample needs rollout.group_size > 1"):
        tiny_rl_config(tmp_path, algorithm=AlgorithmSpec(name="dapo", params=params),
                       rollout=RolloutConfig(prompts_per_step=2, group_size=1, max_new_tokens=16))


def test_resampling_needs_the_runs_stream():
    with pytest.raises(ValueError, match="RolloutContext.stream"):
        DAPO(DAPOConfig(overlong_shaping=False, dynamic_sampling="resample")).experience(
            items(MIXED), context_for(ScriptedEngine(items(MIXED)), None), step=0)


RESAMPLE = {"dapo": (HalfSolvedTask, {"overlong_buffer": 4}), "srar": (HalfSolvedSrarTask, {}),
            "rubric_grounded": (HalfTiedTask, {})}


@pytest.mark.parametrize("recipe", sorted(RESAMPLE))
def test_one_resampling_step_of_each_recipe_end_to_end(tmp_path, recipe):
    task_class, params = RESAMPLE[recipe]
    task = task_class(arithmetic.ArithmeticConfig(), 0)
    first = task.train_stream(0).next_batch(2)
    assert any(map(solved, first)), "the first batch needs an uninformative group for the step to draw again"
    params = {**params, "dynamic_sampling": "resample", "max_num_gen_batches": 3}
    train_rl(tiny_rl_config(tmp_path, algorithm=AlgorithmSpec(name=recipe, params=params)), task)
    [line] = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert all(math.isfinite(value) for value in line.values())
    batches = line["dynamic_sampling/gen_batches"]
    assert 2 <= batches <= 3 and line["dynamic_sampling/groups_drawn"] == 2 * batches
    assert line["dynamic_sampling/cap_hit"] == (line["dynamic_sampling/groups_kept"] < 2)
    # the checkpoint's data position counts every example the step drew
    _, meta = Checkpointer(tmp_path / "run" / "checkpoints").restore(None, None)
    assert meta["data_position"] == 2 * batches
    if line["dynamic_sampling/groups_kept"]:
        assert line["train/grad_norm"] > 0
