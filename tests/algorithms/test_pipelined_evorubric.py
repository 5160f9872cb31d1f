"""EvoRubric's pipelined step (`base.sample_and_follow`): each question's generator, meta-verifier and grader start
as soon as the engine's stream yields its reasoner group, and the step equals the serial one (every group sampled,
then every question's steps): the batch, the metrics, the rollout-log values, the judge's records and the recipe's
state (the memory pool, the written base rubrics), over two consecutive steps, so that the second reads the pool
the first archived, with the groups streamed out of prompt order (tests/algorithms/test_pipelined_judging.py's
harness), for the method and ablations, a question drawn twice in one step, base rubrics the initial policy writes
and an awaited meta-verifier."""

import asyncio
import dataclasses

import pytest

from rubric_jax.algorithms.evorubric import EvoRubric, EvoRubricConfig
from rubric_jax.data import rubric_world
from rubric_jax.judges.base import Judge
from rubric_jax.judges.records import RecordingJudge
from tests.algorithms.test_evorubric import TINY, NoisyMuJudge, hashed_task
from tests.algorithms.test_pipelined_judging import (ScrambledStream, assert_judged_while_sampling,
                                                     assert_same_experience, assert_same_records, embedded_context)

SMALL = dict(generator_group_size=3, generator_max_new_tokens=12, responses_shown=2, max_proposed=4,
             generator_length_budget=8, generator_length_coef=0.01)
CONFIGS = {
    "default": {},
    "no_memory_pool": {"memory_pool": False},
    "no_meta_verifier": {"meta_verifier": False},
    "generated_base_rubric": {"base_rubric": "generated"},
    "external_generator": {"train_generator": False},
}


class DelayedJudge(Judge):
    """`NoisyMuJudge`'s verdicts (a function of the request alone), answered after a short delay as a network
    judge's would be; `events` logs ("judged", rows) when each call starts."""

    def __init__(self, events):
        self.inner, self.events = NoisyMuJudge(), events

    def judge(self, requests, max_items):
        return self.inner.judge(requests, max_items)

    async def ajudge(self, requests, max_items):
        self.events.append(("judged", len(requests)))
        await asyncio.sleep(0.02)
        return self.judge(requests, max_items)


class AwaitedMetaVerifier:
    """An LLM meta-verifier's interface (`averify`, awaited after a short delay) with the world's verdicts; `verify`
    (the blocking call) is not to be used inside a step's follow-ups."""

    def __init__(self):
        self.calls = 0

    def verify(self, requests):
        raise AssertionError("a question's follow-up awaits averify")

    async def averify(self, requests):
        self.calls += 1
        await asyncio.sleep(0.01)
        return [tuple(rubric_world.meta_verify(r.criteria, r.existing)) for r in requests]


@pytest.fixture(scope="module")
def setup():
    task = hashed_task()
    problems = task.train_stream(0).next_batch(3)
    examples = [problems[0], problems[1], problems[0], problems[2]]  # the first question drawn twice
    return task, examples, embedded_context(task, TINY, n=3, max_new_tokens=16, seed=3)


def two_steps(config, examples, make, *, pipelined, meta_verifier=None):
    """Steps 0 and 1 of a fresh EvoRubric on fresh contexts (the frozen engine the same engine): per step (its
    experience, its judge's records, the recipe's state after it, the stream's events)."""
    recipe, steps = EvoRubric(config), []
    for step in (0, 1):
        context = make()
        events = []
        engine = ScrambledStream(context.engine) if pipelined else context.engine
        recorder = RecordingJudge(DelayedJudge(engine.events if pipelined else events))
        recorder.recording = True
        context = dataclasses.replace(context, engine=engine, judge=recorder, pipelined_judging=pipelined,
                                      frozen_engine=engine, meta_verifier=meta_verifier,
                                      sampling_metrics={})
        experience = recipe.experience(examples, context, step)
        steps.append((experience, recorder, recipe.state_dict(), engine.events if pipelined else events))
    return steps


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_two_pipelined_evorubric_steps_equal_the_serial_steps(setup, name):
    task, examples, make = setup
    config = EvoRubricConfig(**SMALL, **CONFIGS[name])
    pipelined = two_steps(config, examples, make, pipelined=True)
    serial = two_steps(config, examples, make, pipelined=False)
    for (experience_p, recorder_p, state_p, events), (experience_s, recorder_s, state_s, _) in zip(pipelined,
                                                                                                    serial):
        assert_same_experience(experience_p, experience_s)
        assert_same_records(recorder_p, recorder_s)
        assert state_p == state_s
        assert_judged_while_sampling(events)
        assert [e for e in events if e[0] == "judged"] == [("judged", 3)] * len(examples)  # one call per question
    if config.memory_pool:
        assert pipelined[0][2]["pool"]  # the second step read a pool
    if config.base_rubric == "generated":
        assert pipelined[0][2]["base_rubrics"]
        metrics = pipelined[0][0].metrics
        assert metrics["evorubric/base_rubrics_written"] + sum(
            v for k, v in metrics.items() if k.startswith("evorubric/base_rubric_failed/")) == 3  # once per question


def test_an_awaited_meta_verifier_gives_the_serial_step(setup):
    task, examples, make = setup
    config = EvoRubricConfig(**SMALL)
    verifiers = [AwaitedMetaVerifier(), AwaitedMetaVerifier()]
    pipelined = two_steps(config, examples, make, pipelined=True, meta_verifier=verifiers[0])
    serial = two_steps(config, examples, make, pipelined=False, meta_verifier=verifiers[1])
    for (experience_p, recorder_p, state_p, _), (experience_s, recorder_s, state_s, _) in zip(pipelined, serial):
        assert_same_experience(experience_p, experience_s)
        assert_same_records(recorder_p, recorder_s)
        assert state_p == state_s
    assert 0 < verifiers[0].calls == verifiers[1].calls <= 2 * len(examples)  # at most one call per question
    # The world's meta-verifier, awaited, decides as the task's does.
    task_steps = two_steps(config, examples, make, pipelined=True)
    for (experience_a, *_), (experience_t, *_) in zip(pipelined, task_steps):
        assert_same_experience(experience_a, experience_t)
