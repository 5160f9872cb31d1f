"""Pipelined judging (`algorithms.base.sample_and_judge`): a group's judge requests go out the moment the engine
finishes the group, and the step it produces is exactly the serial step's (sample every group, then judge every
row): the batch, the verdicts, the advantages, the metrics, the recipe's rollout-log values and the judge's
records, row for row, for every recipe that judges per group, with the groups streamed out of prompt order."""

import asyncio
import dataclasses
import threading
import time

import numpy as np
import pytest

from rubric_jax.algorithms import base
from rubric_jax.algorithms.rar import RaR, RaRConfig
from rubric_jax.algorithms.rgr_grpo import RGRGRPO, RGRGRPOConfig
from rubric_jax.algorithms.rlcer import RLCER, RLCERConfig
from rubric_jax.algorithms.rubric_grounded import RubricGrounded, RubricGroundedConfig
from rubric_jax.algorithms.srar import SRaR, SRaRConfig
from rubric_jax.data import arithmetic
from rubric_jax.data.arithmetic_srar import ArithmeticSrarTask
from rubric_jax.data.tasks import build_task
from rubric_jax.inference.embedded import EmbeddedEngine
from rubric_jax.inference.engine import RolloutEngine, SamplingParams
from rubric_jax.judges.base import Judge
from rubric_jax.judges.records import RecordingJudge
from rubric_jax.training import policy
from rubric_jax.training.metrics import PhaseTimer
from rubric_jax.training.run_config import MeshConfig, ModelSpec
from tests.algorithms.test_grpo import GROUP, PROMPTS, make_context, tiny_policy
from tests.algorithms.test_rgr_grpo import TINY_RGR
from tests.algorithms.test_rlcer import WIDE, HashedRubricTask
from tests.algorithms.test_rubric_grounded import ScriptedJudge
from tests.training.test_rl import TINY
from tests.training.toy_task import toy_task

ORDER = (2, 0, 3, 1)  # the order the scrambled stream finishes the groups of a 4-prompt call


class ScrambledStream(RolloutEngine):
    """`engine`'s samples, its groups streamed in `order` (then any prompts beyond it, last first), a pause
    between groups so that judge tasks run before the next group arrives; `events` logs ("group", p) as each is
    yielded and the stream's end as ("end",)."""

    def __init__(self, engine: RolloutEngine, order=ORDER):
        self.engine, self.order, self.events = engine, order, []

    @property
    def weight_version(self) -> str:
        return self.engine.weight_version

    def generate(self, prompts, params):
        return self.engine.generate(prompts, params)

    async def agenerate(self, prompts, params):
        return self.generate(prompts, params)

    async def stream_groups(self, prompts, params):
        samples = await self.engine.agenerate(prompts, params)
        order = [p for p in self.order if p < len(prompts)]
        order += [p for p in reversed(range(len(prompts))) if p not in order]
        for p in order:
            await asyncio.sleep(0.01)
            self.events.append(("group", p))
            yield p, samples[p * params.n:(p + 1) * params.n]
        self.events.append(("end",))

    def update_weights(self, model, version):
        raise NotImplementedError


class ResponseJudge(ScriptedJudge):
    """The scripted judge's verdicts (a function of the request alone), judged in a worker thread with a short
    delay as a network judge's would be; `events` logs ("judged", rows) when each call starts."""

    def __init__(self, events=None):
        super().__init__()
        self.events = [] if events is None else events

    async def ajudge(self, requests, max_items):
        self.events.append(("judged", len(requests)))
        await asyncio.sleep(0.02)
        return self.judge(requests, max_items)


def assert_same_experience(pipelined: base.Experience, serial: base.Experience) -> None:
    assert pipelined.prompt_width == serial.prompt_width
    assert pipelined.batch.keys() == serial.batch.keys()
    for key in serial.batch:
        np.testing.assert_array_equal(pipelined.batch[key], serial.batch[key], err_msg=key)
    assert pipelined.metrics == serial.metrics
    assert len(pipelined.recipe_values) == len(serial.recipe_values)
    for (request_p, values_p), (request_s, values_s) in zip(pipelined.recipe_values, serial.recipe_values):
        assert request_p == request_s and values_p == values_s


def assert_same_records(pipelined: RecordingJudge, serial: RecordingJudge) -> None:
    records_p, records_s = pipelined.take(0), serial.take(0)
    assert len(records_p) == len(records_s) > 0
    for record_p, record_s in zip(records_p, records_s):
        assert record_p == record_s


def both_steps(recipe, examples, make):
    """The recipe's step 0 pipelined over a scrambled stream and serial over the plain engine, each with a fresh
    recording judge: (pipelined experience, serial experience, their recorders, the scrambled stream's events)."""
    results = []
    for pipelined in (True, False):
        context = make()
        engine = ScrambledStream(context.engine) if pipelined else context.engine
        events = engine.events if pipelined else []
        recorder = RecordingJudge(ResponseJudge(events) if isinstance(context.judge, ScriptedJudge)
                                  else context.judge)
        recorder.recording = True
        context = dataclasses.replace(context, engine=engine, judge=recorder, pipelined_judging=pipelined,
                                      sampling_metrics={})
        results.append((recipe.experience(examples, context, step=0), recorder, events))
    (experience_p, recorder_p, events), (experience_s, recorder_s, _) = results
    return experience_p, experience_s, recorder_p, recorder_s, events


def assert_judged_while_sampling(events) -> None:
    """The first group's judge call started before the stream yielded its last group."""
    first_judged = next(i for i, event in enumerate(events) if event[0] == "judged")
    last_group = max(i for i, event in enumerate(events) if event[0] == "group")
    assert first_judged < last_group, events


@pytest.fixture(scope="module")
def toy():
    task = toy_task()
    examples = task.train_stream(0).next_batch(PROMPTS)
    model, tokenizer = tiny_policy(task)
    return task, examples, lambda: make_context(task, model, tokenizer, ScriptedJudge(), seed=1)


@pytest.mark.parametrize("recipe", [
    RaR(RaRConfig()),
    RaR(RaRConfig(on_judge_failure="exclude", score="weighted_fraction")),
    RubricGrounded(RubricGroundedConfig()),
], ids=["rar", "rar_exclude", "rubric_grounded"])
def test_a_pipelined_step_of_a_group_recipe_equals_the_serial_step(toy, recipe):
    _, examples, make = toy
    experience_p, experience_s, recorder_p, recorder_s, events = both_steps(recipe, examples, make)
    assert_same_experience(experience_p, experience_s)
    assert_same_records(recorder_p, recorder_s)
    assert_judged_while_sampling(events)
    assert [e for e in events if e[0] == "judged"] == [("judged", GROUP)] * PROMPTS  # one call per group


@pytest.fixture(scope="module")
def srar_setup():
    task = ArithmeticSrarTask(arithmetic.ArithmeticConfig(), 0)
    return arithmetic.problems(4, 3), embedded_context(task, TINY, n=3, max_new_tokens=24, seed=2)


@pytest.mark.parametrize("config", [SRaRConfig(), SRaRConfig(advantage="merged", dynamic_sampling="mask")],
                         ids=["decoupled", "merged_mask"])
def test_a_pipelined_srar_step_equals_the_serial_step(srar_setup, config):
    examples, make = srar_setup
    experience_p, experience_s, recorder_p, recorder_s, _ = both_steps(SRaR(config), examples, make)
    assert_same_experience(experience_p, experience_s)
    assert_same_records(recorder_p, recorder_s)


def embedded_context(task, init, *, n, max_new_tokens, seed):
    """A context over an EmbeddedEngine serving a tiny random model of `init` for `task`, judged by the task's
    own judge."""
    model, tokenizer = policy.build_policy(ModelSpec(init=init), task, policy.make_mesh(MeshConfig()))

    def make():
        eos_ids, pad_id = policy.eos_and_pad(tokenizer)
        engine = EmbeddedEngine(model, tokenizer=tokenizer, eos_token_ids=eos_ids, pad_id=pad_id)
        return base.RolloutContext(engine=engine, tokenizer=tokenizer, task=task, judge=task.judge(),
                                   pad_id=pad_id, seed=seed, sampling=SamplingParams(max_new_tokens=max_new_tokens,
                                                                                     n=n), timer=PhaseTimer())

    return make


@pytest.mark.parametrize("config", [RGRGRPOConfig(), RGRGRPOConfig(exploration_assessment=False)],
                         ids=["paper", "refine_every_group"])
def test_a_pipelined_rgr_grpo_step_equals_the_serial_step(config):
    task = build_task("arithmetic_rgr", {}, 0)
    make = embedded_context(task, TINY_RGR, n=3, max_new_tokens=16, seed=4)
    experience_p, experience_s, recorder_p, recorder_s, _ = both_steps(RGRGRPO(config), arithmetic.problems(4, 5),
                                                                       make)
    assert experience_p.metrics["rgr/off_policy_fraction"] > 0  # the refinement pass ran
    assert_same_experience(experience_p, experience_s)
    assert_same_records(recorder_p, recorder_s)


@pytest.mark.parametrize("config", [
    RLCERConfig(estimator="grpo", max_items=4, rubricator_max_new_tokens=12),
    RLCERConfig(max_items=4, rubricators_per_question=2, verifier_calls="pooled", on_judge_failure="exclude"),
], ids=["grpo", "critic_pooled_exclude"])
def test_a_pipelined_rlcer_step_equals_the_serial_step(config):
    """The rubricator of each question follows its reasoner group, then the verifier: both per question."""
    task = HashedRubricTask(arithmetic.ArithmeticConfig(), 0)
    make = embedded_context(task, WIDE, n=4, max_new_tokens=16, seed=1)
    examples = task.train_stream(0).next_batch(4)
    experience_p, experience_s, recorder_p, recorder_s, _ = both_steps(RLCER(config), examples, make)
    assert experience_p.metrics["judge/failure_rate"] > 0 and experience_p.metrics["rlcer/rubric_count_mean"] > 0
    assert_same_experience(experience_p, experience_s)
    assert_same_records(recorder_p, recorder_s)


# ---------------------------------------------------------------- sample_and_judge itself


def request_of(task, examples):
    return lambda sample, text: base.rollout_request(examples[sample.prompt_index], text, task)


def test_failed_samples_are_never_sent_and_are_recorded_in_row_order(toy):
    task, examples, make = toy
    from tests.algorithms.test_failed_samples import FailingRows
    failed = {1: "abort", 4: "nan", 5: "nan", 6: "nan", 7: "nan", 14: "http_400"}  # group 1 failed whole
    results = []
    for pipelined in (True, False):
        context = make()
        judge = ResponseJudge()
        recorder = RecordingJudge(judge)
        recorder.recording = True
        engine = FailingRows(context.engine, failed)
        context = dataclasses.replace(context, engine=ScrambledStream(engine) if pipelined else engine,
                                      judge=recorder, pipelined_judging=pipelined)
        judged = base.sample_and_judge([task.prompt(e) for e in examples], context, 0, request_of(task, examples),
                                       8)
        results.append((judged, recorder.take(0), judge.calls))
    (pipelined, records_p, calls_p), (serial, records_s, calls_s) = results
    sent = sum(len(requests) for requests, _ in calls_p)
    assert sent == sum(len(requests) for requests, _ in calls_s) == PROMPTS * GROUP - len(failed)
    assert len(calls_p) == PROMPTS - 1  # the wholly failed group calls no judge
    assert list(pipelined.verdicts.reasons) == list(serial.verdicts.reasons)
    assert [pipelined.verdicts.reasons[b] for b in failed] == [base.FAILED_SAMPLE] * len(failed)
    np.testing.assert_array_equal(pipelined.verdicts.satisfied_bk, serial.verdicts.satisfied_bk)
    assert [r.request for r in records_p] == pipelined.requests == serial.requests == [r.request for r in records_s]
    assert [r.verdict for r in records_p] == [r.verdict for r in records_s]


class FailingStream(ScrambledStream):
    """Streams two groups, then fails as an engine whose server went away would."""

    async def stream_groups(self, prompts, params):
        samples = await self.engine.agenerate(prompts, params)
        for p in (0, 1):
            yield p, samples[p * params.n:(p + 1) * params.n]
        await asyncio.sleep(0.05)  # both groups' judging under way
        raise RuntimeError("the generation server went away")


class SlowJudge(Judge):
    def __init__(self):
        self.cancelled = 0

    def judge(self, requests, max_items):
        raise AssertionError("only ajudge is called")

    async def ajudge(self, requests, max_items):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def test_an_engine_failure_mid_stream_raises_and_cancels_the_judging_in_flight(toy):
    task, examples, make = toy
    judge = SlowJudge()
    context = make()
    context = dataclasses.replace(context, engine=FailingStream(context.engine), judge=judge,
                                  pipelined_judging=True)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="server went away"):
        base.sample_and_judge([task.prompt(e) for e in examples], context, 0, request_of(task, examples), 8)
    assert time.monotonic() - start < 20  # not waiting out the judge
    assert judge.cancelled == 2


def test_sample_and_judge_runs_inside_a_running_event_loop_as_in_a_notebook(toy):
    task, examples, make = toy
    context = dataclasses.replace(make(), judge=ResponseJudge(), pipelined_judging=True)

    async def in_a_notebook():
        return base.sample_and_judge([task.prompt(e) for e in examples], context, 0, request_of(task, examples), 8)

    judged = asyncio.run(in_a_notebook())
    serial = base.sample_and_judge([task.prompt(e) for e in examples],
                                   dataclasses.replace(make(), judge=ResponseJudge(), pipelined_judging=False), 0,
                                   request_of(task, examples), 8)
    assert judged.requests == serial.requests
    np.testing.assert_array_equal(judged.verdicts.satisfied_bk, serial.verdicts.satisfied_bk)
    assert threading.active_count() < 50  # the worker thread is gone with its pool


def test_the_pipelined_phases_time_the_stream_and_the_wait_after_it(toy):
    task, examples, make = toy
    context = make()
    context = dataclasses.replace(context, engine=ScrambledStream(context.engine), judge=ResponseJudge(),
                                  pipelined_judging=True)
    base.sample_and_judge([task.prompt(e) for e in examples], context, 0, request_of(task, examples), 8)
    timer = context.timer
    metrics = timer.metrics()
    assert metrics["time/generation"] > 0 and metrics["time/judging"] > 0
    assert timer.ended_at("judging") >= timer.ended_at("generation")
