"""EvoRubric (evorubric.txt): the recipe's rewards and advantages equal a NumPy recomputation from the same
generator outputs and judge verdicts (a scripted engine with hand-designed responses and proposals, and the
embedded engine with a random policy), for the full method and every ablation; each ablation switch changes
what the paper says it changes; judge failures, parse failures and empty rubrics are counted and never NaN; the
memory pool persists across steps and survives a checkpoint / resume round trip through train_rl (the pool
itself: tests/rubrics/test_memory_pool.py); External Evolving-RL samples its generator from the trainer's frozen
engine, never updated, also after a resume; shown responses are cut to their first tokens; the paper's generator
format (Table 5's prompt and JSON list) serves any task, and a step on a HealthBench-layout dataset runs its
policy, grader and LLM meta-verifier over HTTP (the meta-verifier client itself: tests/judges/test_llm.py)."""

import collections
import dataclasses
import hashlib
import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from rubric_jax.algorithms.base import RolloutContext
from rubric_jax.algorithms.evorubric import EvoRubric, EvoRubricConfig, generator_io
from rubric_jax.data import arithmetic, rubric_world
from rubric_jax.data.tasks import RubricWorldConfig, RubricWorldTask, build_task
from rubric_jax.inference.engine import RolloutEngine, Sample, SamplingParams
from rubric_jax.judges.base import Judge, JudgeRequest, RolloutVerdict, Verdicts
from rubric_jax.judges.llm import CHAT_PATH
from rubric_jax.rubrics import prompts
from rubric_jax.rubrics.schema import Criterion, Rubric
from rubric_jax.rubrics.steps import response_text
from rubric_jax.training import assembly
from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.metrics import PhaseTimer, read_metrics
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import (
    AlgorithmSpec, CheckpointConfig, JudgeConfig, MetaVerifierConfig, MetricsConfig, ModelInit, ModelSpec, RLConfig,
    RolloutConfig, TaskSpec)
from tests.core import reference_rewards as ref
from tests.core.reference_advantages import grpo as reference_grpo
from tests.inference.standin_server import ScriptedPolicy, StandinServer, fenced, http_error

TINY = ModelInit(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                 max_position_embeddings=320)
EOS = arithmetic.SPECIAL_TOKENS.index("<|im_end|>")
ABLATIONS = {
    "full": {},
    "no_meta_verifier": {"meta_verifier": False},
    "no_memory_pool": {"memory_pool": False},
    "no_peer_consensus": {"peer_consensus": False},
    "no_discriminative": {"discriminative": False},
    "external": {"train_generator": False},
    "separate_normalisation": {"score_normalisation": "separate"},
}


def coarse_task() -> RubricWorldTask:
    return build_task("arithmetic_rubrics", {"base_rubric": "coarse"}, 0)


def two_problems() -> list[arithmetic.Problem]:
    """Two train problems of three steps, the first with a multiplication (so "MU" is met by every response)."""
    problems = [p for p in coarse_task().train_stream(0).next_batch(200) if len(p.steps) == 3]
    with_mul = next(p for p in problems if "*" in p.question)
    return [with_mul, next(p for p in problems if p is not with_mul)]


def wrong_at(problem: arithmetic.Problem, step: int) -> str:
    """The gold solution with step `step` (1-based) off by one and the later steps computed from it."""
    lines, value = [], None
    for i, s in enumerate(problem.steps):
        left = s.left if value is None else value
        value = {"+": left + s.right, "-": left - s.right, "*": left * s.right}[s.op] + (i + 1 == step)
        lines.append(f"### Step {i + 1}: {left} {s.op} {s.right} = {value}")
    return "\n".join(lines + [f"\\boxed{{{value}}}"])


# ---------------------------------------------------------------- engines, judges and tasks for the tests


class ScriptedEngine(RolloutEngine):
    """Answers a reasoner prompt (the question) with `responses[question]` and a generator prompt with
    `proposals[question]`, sample j getting text j (cycled); every token has logprob -1."""

    weight_version = "scripted"

    def __init__(self, tokenizer, responses: dict, proposals: dict):
        self.tokenizer, self.responses, self.proposals = tokenizer, responses, proposals

    def generate(self, prompts, params):
        samples = []
        for i, prompt in enumerate(prompts):
            content = prompt[-1]["content"]
            if content.startswith("New rubrics for: "):
                texts = self.proposals[content.split("\n")[0][len("New rubrics for: "):]]
            else:
                texts = self.responses[content]
            for j in range(params.n):
                ids = self.tokenizer.encode(texts[j % len(texts)], add_special_tokens=False) + [EOS]
                stopped = len(ids) <= params.max_new_tokens
                ids = ids[:params.max_new_tokens]
                samples.append(Sample(prompt_index=i, output_ids=tuple(ids), logprobs=(-1.0,) * len(ids),
                                      finish_reason="stop" if stopped else "length",
                                      matched_stop=EOS if stopped else None, weight_version=self.weight_version))
        return samples

    async def agenerate(self, prompts, params):
        return self.generate(prompts, params)

    def update_weights(self, model, version):
        raise NotImplementedError


class Recording(RolloutEngine):
    """Delegates to `engine` and records every call, (prompts, params, samples), and every weight update's
    version."""

    def __init__(self, engine: RolloutEngine):
        self.engine, self.calls, self.updates = engine, [], []
        self.weight_version = engine.weight_version

    def generate(self, prompts, params):
        samples = self.engine.generate(prompts, params)
        self.calls.append((list(prompts), params, samples))
        return samples

    async def agenerate(self, prompts, params):
        return self.generate(prompts, params)

    def update_weights(self, model, version):
        self.updates.append(version)
        self.engine.update_weights(model, version)
        self.weight_version = version


FAIL_MARK = "### Step 9:"


class FlakyJudge(Judge):
    """The world's judge, except that a response containing FAIL_MARK is a failed judgement."""

    def __init__(self, judge: Judge):
        self.inner = judge

    def judge(self, requests, max_items):
        verdicts = self.inner.judge(requests, max_items)
        rows = [RolloutVerdict.failure("check_raised", "scripted") if FAIL_MARK in r.response
                else RolloutVerdict(tuple(verdicts.satisfied_bk[b, :len(r.rubric.criteria)]))
                for b, r in enumerate(requests)]
        return Verdicts.from_rollouts(rows, max_items)


PROPOSAL_TEXTS = ("+3 S1\n-3 WS", "+1 MU\n+2 NI", "none", "+1 EV\n+1 MU", "+2 SH\n+1 BX", "+2 MU", "+1 RP\n-1 MU",
                  "? not a rubric", "+1 MU\n+4 AN")


class NoisyMuJudge(Judge):
    """The world's judge, except that "MU" gets the partial credit (first byte of the response's SHA-256) / 255:
    a criterion that splits a random policy's responses (the world's own checks seldom do), deterministic in the
    text."""

    def __init__(self):
        self.inner = rubric_world.world_judge()

    def judge(self, requests, max_items):
        verdicts = self.inner.judge(requests, max_items)
        satisfied = np.array(verdicts.satisfied_bk)
        for b, request in enumerate(requests):
            for k, criterion in enumerate(request.rubric.criteria):
                if criterion.name == "MU":
                    satisfied[b, k] = hashlib.sha256(request.response.encode()).digest()[0] / 255
        return dataclasses.replace(verdicts, satisfied_bk=satisfied)


@dataclasses.dataclass(frozen=True)
class HashedProposalsTask(RubricWorldTask):
    """The coarse world, except that a generator output is read as one of PROPOSAL_TEXTS chosen by its hash: a
    random policy's text becomes a (deterministic) proposal, valid, flawed, empty or malformed."""

    def parse_generated_rubric(self, text, max_items, allow_empty=False):
        choice = hashlib.sha256(text.encode()).digest()[0] % len(PROPOSAL_TEXTS)
        return super().parse_generated_rubric(PROPOSAL_TEXTS[choice], max_items, allow_empty)


def hashed_task() -> HashedProposalsTask:
    world = RubricWorldConfig(base_rubric="coarse")
    return HashedProposalsTask(world.problems, 0, world)


def context_for(engine, task, tokenizer, *, n=4, max_new_tokens=64, judge=None, seed=0,
                frozen_engine=None) -> RolloutContext:
    return RolloutContext(engine=engine, tokenizer=tokenizer, task=task, judge=judge or task.judge(), pad_id=0,
                          seed=seed, sampling=SamplingParams(max_new_tokens=max_new_tokens, n=n),
                          timer=PhaseTimer(), frozen_engine=frozen_engine)


def scripted_world(examples, *, proposals=None, responses=None):
    """Responses per question: two gold solutions, one wrong at step 2, one wrong at step 1; proposals: the
    five generator outputs below (a valid pair; a criterion constant on a question with a multiplication and a
    flawed one; the empty list; one unrelated to correctness and a valid one; an unknown code), unless given."""
    default_responses = {e.question: [arithmetic.solution_text(e), arithmetic.solution_text(e), wrong_at(e, 2),
                                      wrong_at(e, 1)] for e in examples}
    default_proposals = {e.question: ["+3 S1\n-3 WS", "+1 MU\n+2 NI", "none", "+1 EV\n+2 S2", "+3 S1\n+9 XX"]
                         for e in examples}
    return {**default_responses, **(responses or {})}, {**default_proposals, **(proposals or {})}


def run_step(config, examples, *, task=None, responses=None, proposals=None, judge=None, algorithm=None, step=0,
             n=4):
    """One `experience` call on the scripted engine (and, when the recipe asks for one, a frozen scripted engine
    with the same script); returns (algorithm, experience, the recorded calls of both engines by role
    (`role_calls`), pool before)."""
    task = task or coarse_task()
    responses, proposals = scripted_world(examples, responses=responses, proposals=proposals)
    engine = Recording(ScriptedEngine(task.tokenizer(), responses, proposals))
    algorithm = algorithm or EvoRubric(config)
    frozen = Recording(ScriptedEngine(task.tokenizer(), responses, proposals)) if algorithm.needs_frozen_engine \
        else None
    before = algorithm.state_dict()
    context = context_for(engine, task, task.tokenizer(), n=n, judge=judge, frozen_engine=frozen)
    result = algorithm.experience(examples, context, step)
    return algorithm, result, role_calls(engine.calls + (frozen.calls if frozen else [])), before


def merged_calls(calls):
    """Several recorded engine calls as one (prompts, params, samples): their prompts and samples in order, each
    sample's prompt index shifted past the earlier calls' prompts."""
    prompts, samples = [], []
    for call_prompts, _, call_samples in calls:
        samples += [dataclasses.replace(s, prompt_index=s.prompt_index + len(prompts)) for s in call_samples]
        prompts += call_prompts
    return prompts, calls[0][1], samples


def role_calls(calls):
    """A step's recorded engine calls (of the policy engine, then of the frozen one) by role: [the reasoner's call,
    the generator's calls (one per question, `asample_group`) as one, the base rubric writes (n = 1, one per
    first visit) as one, when there were any], as the step sampled them before it sampled per question."""
    reasoner, rest = calls[0], calls[1:]
    generator = [c for c in rest if c[1].n > 1]
    written = [c for c in rest if c[1].n == 1]
    return [reasoner] + [merged_calls(part) for part in (generator, written) if part]


# ---------------------------------------------------------------- the NumPy reference of one step


def pool_dict(state) -> "collections.OrderedDict[str, list[Criterion]]":
    return collections.OrderedDict(
        (entry["question"], list(Rubric.from_dict({"criteria": entry["criteria"]}).criteria))
        for entry in state.get("pool", []))


def reference_answer(text: str) -> str:
    """The text after the last "</think>" (all of it without one; nothing when a "<think>" opens it unclosed),
    leading white space dropped: the rubric text whose tokens the generator's p_len counts."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1].lstrip()
    return "" if text.lstrip().startswith("<think>") else text.lstrip()


def reference_step(config: EvoRubricConfig, task, tokenizer, examples, calls, pool_before, *, judge=None,
                   failed=lambda t: False):
    """Eqs 1-4 and GRPO recomputed with loops from the recorded generations, the task's parser and
    meta-verifier and the world judge asked one criterion at a time. Returns (reasoner rewards [P*N], reasoner
    valid [P*N], generator rewards [P*M], advantages [P*N + P*M], pool after)."""
    (_, reasoner_params, reasoner_samples), (_, generator_params, generator_samples) = calls
    num_n, num_m = reasoner_params.n, generator_params.n
    judge = judge or rubric_world.world_judge()
    texts = [response_text(tokenizer, s.output_ids) for s in reasoner_samples]
    outputs = [response_text(tokenizer, s.output_ids) for s in generator_samples]
    pool_after = collections.OrderedDict(pool_before)
    reasoner_rewards, valid, generator_rewards = [], [], []
    for p, example in enumerate(examples):
        question = task.question(example)
        base = list(task.rubric(example).criteria)
        history = list(pool_before.get(question, [])) if config.memory_pool else []
        mine = texts[p * num_n:(p + 1) * num_n]
        graded = [not failed(t) for t in mine]

        def met(n, criterion):
            if not graded[n]:
                return 0.0
            request = JudgeRequest(question, mine[n], Rubric((criterion,)), task.reference(example))
            return float(judge.judge([request], 1).satisfied_bk[0, 0])

        def varies(row):
            column = [row[n] for n in range(num_n) if graded[n]]
            return len(column) > 1 and max(column) != min(column)

        batches, kept_all, lengths = [], [], []
        for m in range(num_m):
            parse = task.parse_generated_rubric(outputs[p * num_m + m], config.max_proposed, allow_empty=True)
            length = len(tokenizer.encode(reference_answer(outputs[p * num_m + m]), add_special_tokens=False))
            lengths.append(config.generator_length_coef * max(length - config.generator_length_budget, 0))
            if not parse.ok:
                batches.append(None)
                continue
            proposed = list(parse.rubric.criteria)
            verified = proposed
            if config.meta_verifier and proposed:
                invalid = task.meta_verify(example, proposed, base + history)
                verified = [c for c, v in zip(proposed, invalid) if v is None]
            rows = [[c.weight * met(n, c) for n in range(num_n)] for c in verified]
            kept = [(c, row) for c, row in zip(verified, rows) if varies(row) or not config.discriminative]
            kept_all += [c for c, _ in kept]
            vector = [sum(row[n] for _, row in kept) / len(kept) for n in range(num_n)] if kept else None
            batches.append(dict(proposed=proposed, verified=verified, kept=kept, vector=vector))
        for m, batch in enumerate(batches):
            if batch is None:
                generator_rewards.append(config.parse_failure_reward - lengths[m])
                continue
            peers = [b["vector"] for j, b in enumerate(batches) if j != m and b is not None and b["vector"]]
            rho = 0.0
            if batch["vector"] and peers:
                peer = [sum(v[n] for v in peers) / len(peers) for n in range(num_n)]
                rho = ref.pearson(batch["vector"], peer, graded)[0]
            n_proposed, n_verified, n_kept = len(batch["proposed"]), len(batch["verified"]), len(batch["kept"])
            consensus = rho * n_kept / n_proposed if n_proposed else 0.0
            meta = (n_verified - (n_proposed - n_verified)) / n_proposed if n_proposed else 0.0
            disc = n_kept / n_verified if n_verified else 0.0
            count_penalty = config.count_coef * max(n_proposed - config.count_budget, 0)
            generator_rewards.append(config.peer_consensus * consensus + config.meta_verifier * meta
                                     + config.discriminative * disc - count_penalty - lengths[m])
        # The pool: new texts appended in proposal order, FIFO-bounded; the question becomes most recently used.
        scored = list(history)
        for criterion in kept_all:
            if criterion.text not in {c.text for c in scored}:
                scored.append(criterion)
        scored = scored[-config.pool_max_per_question:]
        if config.memory_pool:
            pool_after.pop(question, None)
            if scored:
                pool_after[question] = scored
            while len(pool_after) > config.pool_max_questions:
                pool_after.popitem(last=False)
        for n in range(num_n):
            score = ref.evorubric_reasoner_rewards(
                [[met(n, c) for c in base]], [[c.weight for c in base]], [[True] * len(base)],
                [[met(n, c) for c in scored]], [[c.weight for c in scored]], [[True] * len(scored)], [0.0],
                config.score_normalisation)[0]
            length = len(reasoner_samples[p * num_n + n].output_ids)
            shaped = ref.dapo_overlong_shaping([0.0], [length], reasoner_params.max_new_tokens,
                                               config.overlong_buffer, config.overlong_factor)[0]
            reward = score + shaped
            ok = graded[n] or config.on_judge_failure == "zero_reward"
            reasoner_rewards.append(reward if graded[n] else 0.0)
            valid.append(ok)
    rewards_all = reasoner_rewards + generator_rewards
    group_ids = [p for p in range(len(examples)) for _ in range(num_n)] + \
                [len(examples) + p for p in range(len(examples)) for _ in range(num_m)]
    advantages = reference_grpo(rewards_all, group_ids, valid + [True] * len(generator_rewards),
                                std_ddof=config.std_ddof, eps=config.eps)
    return np.array(reasoner_rewards), np.array(valid), np.array(generator_rewards), advantages, pool_after


def row_advantages(batch) -> np.ndarray:
    """Each row's advantage (its value on every response token), NaN for a row with no response token."""
    out = []
    for advantage, mask in zip(batch["advantages_bt"], batch["response_mask_bt"]):
        values = advantage[mask]
        assert values.size == 0 or np.all(values == values[0])
        out.append(values[0] if values.size else np.nan)
        assert not advantage[~mask].any()
    return np.array(out)


def check_against_reference(config, task, examples, algorithm, result, calls, before, *, judge=None,
                            failed=lambda t: False):
    reasoner_reward, valid, generator_reward, advantages, pool_after = reference_step(
        config, task, task.tokenizer(), examples, calls, pool_dict(before), judge=judge, failed=failed)
    rows = len(reasoner_reward) + (len(generator_reward) if config.train_generator else 0)
    got = row_advantages(result.batch)
    assert got.shape == (rows,)
    expected = np.where(np.concatenate([valid, np.ones(len(generator_reward), bool)]), advantages, np.nan)[:rows]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert result.metrics["reward/mean"] == pytest.approx(reasoner_reward[valid].mean(), abs=1e-6)
    assert result.metrics["generator/reward/mean"] == pytest.approx(generator_reward.mean(), abs=1e-6)
    assert pool_dict(algorithm.state_dict()) == pool_after  # OrderedDicts: the order (LRU) counts too
    return reasoner_reward, generator_reward, advantages


# ---------------------------------------------------------------- rewards and advantages against the reference


@pytest.mark.parametrize("ablation", sorted(ABLATIONS))
def test_two_steps_match_the_numpy_reference(ablation):
    """The scripted world over two steps (the second sees the first's pool) for the method and each ablation."""
    config = EvoRubricConfig(generator_group_size=5, generator_max_new_tokens=24, responses_shown=2,
                             max_proposed=4, count_budget=1, count_coef=0.25, generator_length_budget=8,
                             generator_length_coef=0.01, overlong_buffer=16, **ABLATIONS[ablation])
    examples = two_problems()
    algorithm, result, calls, before = run_step(config, examples)
    rewards, generator_rewards, advantages = check_against_reference(config, coarse_task(), examples, algorithm,
                                                                     result, calls, before)
    assert np.abs(advantages).max() > 0.5 and np.ptp(rewards) > 0 and np.ptp(generator_rewards) > 0
    algorithm, result, calls, before = run_step(config, examples, algorithm=algorithm, step=1)
    check_against_reference(config, coarse_task(), examples, algorithm, result, calls, before)


@pytest.mark.parametrize("normalisation", ["joint", "separate"])
def test_hand_computed_scripted_step(normalisation):
    """The first question of the scripted world by hand (it has a multiplication, so every response uses one).

    Responses: gold, gold, wrong at step 2, wrong at step 1 (a wrong step's result is off by one, later steps
    follow from it, so the boxed answer is wrong). Scores s = points when met:
      S1 (+3): 3 3 3 0     WS (-3): 0 0 -3 -3     S2 (+2): 2 2 0 0     MU (+1): 1 1 1 1 (pruned)
    Proposals: m0 "S1 WS" (both kept), m1 "MU NI" (NI rejected: Unmeasurable Subjectivity; MU pruned), m2 none,
    m3 "S2" (kept), m4 malformed (unknown code XX).
    v_0 = (S1 + WS) / 2 = (1.5, 1.5, 0, -1.5), v_3 = (2, 2, 0, 0); rho_0 = rho_3 = corr(v_0, v_3)
        = 4.5 / sqrt(6.1875 * 4) (deviations (1.125, 1.125, -0.375, -1.875) and (1, 1, -1, -1)).
    R_gen = rho~ + r_meta + r_disc: m0 rho + 1 + 1; m1 0 + (1 - 1) / 2 + 0 = 0; m2 0; m3 rho + 1 + 1; m4 -1.
    Reasoner (eq 4): the base rubric's met points (answer 2 + format 0.5 for gold, format 0.5 for the wrong ones)
    over its positive points 2.5, the pool's over S1, WS, S2 (5, 5, 0, -3) over its positive points 5:
      separate: S_base + S_pool = (2.5, 2.5, 0.5, 0.5) / 2.5 + (5, 5, 0, -3) / 5;
      joint:    (2.5 + 5, 2.5 + 5, 0.5 + 0, 0.5 - 3) / (2.5 + 5).
    """
    proposals = {question: ["+3 S1\n-3 WS", "+1 MU\n+2 NI", "none", "+2 S2", "+3 S1\n+9 XX"]
                 for question in [e.question for e in two_problems()]}
    config = EvoRubricConfig(generator_group_size=5, responses_shown=2, max_proposed=4,
                             score_normalisation=normalisation)
    examples = two_problems()
    algorithm, result, _, _ = run_step(config, examples, proposals=proposals)
    assert [(c.name, c.weight) for c in pool_dict(algorithm.state_dict())[examples[0].question]] == [
        ("S1", 3), ("WS", -3), ("S2", 2)]
    rho = 4.5 / math.sqrt(6.1875 * 4)
    generator_reward = np.array([rho + 2, 0, 0, rho + 2, -1])
    base_points, pool_points = np.array([2.5, 2.5, 0.5, 0.5]), np.array([5, 5, 0, -3])
    reasoner_reward = (base_points / 2.5 + pool_points / 5 if normalisation == "separate"
                       else (base_points + pool_points) / 7.5)

    def grpo(r):  # sample std, eps 1e-6
        return (r - r.mean()) / (r.std(ddof=1) + 1e-6)

    advantages = row_advantages(result.batch)
    np.testing.assert_allclose(advantages[:4], grpo(reasoner_reward), rtol=1e-5)
    np.testing.assert_allclose(advantages[8:13], grpo(generator_reward), rtol=1e-5)
    metrics = result.metrics  # over both questions, whose proposals are the same
    assert metrics["evorubric/generator_format_rate"] == pytest.approx(4 / 5)
    assert metrics["evorubric/parse_failed/unrecognized"] == 2
    assert metrics["evorubric/meta_rejected_fraction"] == pytest.approx(1 / 5)
    assert metrics["evorubric/meta_rejected/unmeasurable_subjectivity"] == pytest.approx(1 / 5)
    assert metrics["evorubric/empty_proposal_rate"] == pytest.approx(1 / 4)


# ---------------------------------------------------------------- what each ablation changes


def ablation_runs(**changes):
    base_config = EvoRubricConfig(generator_group_size=5, responses_shown=2, max_proposed=4, **changes)
    examples = two_problems()
    full = run_step(EvoRubricConfig(generator_group_size=5, responses_shown=2, max_proposed=4), examples)
    return full, run_step(base_config, examples), examples


def test_without_peer_consensus_only_the_generator_reward_loses_rho_tilde():
    (full_alg, full, _, _), (alg, ablated, _, _), _ = ablation_runs(peer_consensus=False)
    difference = full.metrics["generator/reward/mean"] - ablated.metrics["generator/reward/mean"]
    assert difference == pytest.approx(full.metrics["generator/consensus_term"], abs=1e-6) and difference != 0
    assert ablated.metrics["generator/consensus_term"] == 0
    assert full.metrics["reward/mean"] == ablated.metrics["reward/mean"]
    assert full_alg.state_dict() == alg.state_dict()


def test_without_the_meta_verifier_nothing_is_audited_and_r_meta_is_gone(monkeypatch):
    calls = []
    original = RubricWorldTask.meta_verify
    monkeypatch.setattr(RubricWorldTask, "meta_verify", lambda self, *a: calls.append(a) or original(self, *a))
    (_, full, _, _), (alg, ablated, _, _), examples = ablation_runs(meta_verifier=False)
    assert len(calls) == 6  # the full run's parsed, non-empty proposals: 3 per question
    calls.clear()
    run_step(EvoRubricConfig(generator_group_size=5, responses_shown=2, max_proposed=4, meta_verifier=False),
             examples)
    assert not calls
    assert ablated.metrics["generator/meta_term"] == 0 and full.metrics["generator/meta_term"] != 0
    assert "evorubric/meta_rejected_fraction" not in ablated.metrics
    # The noise criterion NI (a hash of the text), which the meta-verifier rejects, splits these responses and
    # reaches the pool unaudited.
    assert all("NI" in [c.name for c in criteria] for criteria in pool_dict(alg.state_dict()).values())


def test_without_the_memory_pool_the_reasoner_uses_transient_rubrics_only():
    config = EvoRubricConfig(generator_group_size=5, responses_shown=2, max_proposed=4, memory_pool=False)
    examples = two_problems()
    full_alg, full, _, _ = run_step(EvoRubricConfig(generator_group_size=5, responses_shown=2, max_proposed=4),
                                    examples)
    alg, ablated, _, _ = run_step(config, examples)
    # First step: the pool was empty either way, so the reasoner is scored with the same (this step's) criteria.
    np.testing.assert_allclose(row_advantages(full.batch)[:8], row_advantages(ablated.batch)[:8])
    assert alg.state_dict() == {"pool": []} and full_alg.state_dict()["pool"]
    # Second step: the generator sees the base rubric only, and nothing was archived.
    _, second, calls, _ = run_step(config, examples, algorithm=alg, step=1)
    generator_prompts = calls[1][0]
    assert all(prompt[-1]["content"].endswith("Have: none") for prompt in generator_prompts)
    assert second.metrics["evorubric/archived"] == 0 and second.metrics["evorubric/pool_size"] == 0
    _, full_second, full_calls, _ = run_step(EvoRubricConfig(generator_group_size=5, responses_shown=2,
                                                             max_proposed=4), examples, algorithm=full_alg, step=1)
    assert not any(prompt[-1]["content"].endswith("Have: none") for prompt in full_calls[1][0])
    with pytest.raises(ValueError, match="memory_pool is off"):
        alg.load_state_dict(full_alg.state_dict())


def test_without_the_discriminative_reward_constant_criteria_are_kept_and_r_disc_is_gone():
    (_, full, _, _), (alg, ablated, _, _), examples = ablation_runs(discriminative=False)
    assert ablated.metrics["generator/disc_term"] == 0 and full.metrics["generator/disc_term"] > 0
    assert ablated.metrics["evorubric/pruned_fraction"] == 0 and full.metrics["evorubric/pruned_fraction"] > 0
    # MU is met by every response of the first question (a multiplication): only the unfiltered run keeps it.
    assert "MU" in {c.name for c in pool_dict(alg.state_dict())[examples[0].question]}


def is_generator_prompt(prompt) -> bool:
    return prompt[-1]["content"].startswith("New rubrics for: ")


def test_external_generator_samples_from_the_frozen_engine_only():
    config = EvoRubricConfig(generator_group_size=5, responses_shown=2, max_proposed=4, train_generator=False)
    assert EvoRubric(config).needs_frozen_engine and not EvoRubric(EvoRubricConfig()).needs_frozen_engine
    examples, task = two_problems(), coarse_task()
    responses, proposals = scripted_world(examples)
    engine, frozen = (Recording(ScriptedEngine(task.tokenizer(), responses, proposals)) for _ in range(2))
    EvoRubric(config).experience(examples, context_for(engine, task, task.tokenizer(), frozen_engine=frozen), 0)
    [(reasoner_prompts, _, _)] = engine.calls
    assert len(frozen.calls) == 2  # one per question (`asample_group`)
    generator_prompts, params, _ = merged_calls(frozen.calls)
    assert not any(map(is_generator_prompt, reasoner_prompts)) and len(reasoner_prompts) == 2
    assert all(map(is_generator_prompt, generator_prompts)) and len(generator_prompts) == 2 and params.n == 5
    with pytest.raises(ValueError, match="frozen_engine"):
        EvoRubric(config).experience(examples, context_for(engine, task, task.tokenizer()), 0)


def test_shown_responses_are_cut_to_their_first_tokens():
    """With shown_response_max_tokens 4 every shown response is its first four tokens, "### Step ", "1", ":", " "
    (the world's tokenizer has "### Step " as one token); without a cap the responses are shown whole."""
    examples, task = two_problems(), coarse_task()
    for cap, expected in ((4, lambda text: "### Step 1: "), (None, lambda text: text)):
        config = EvoRubricConfig(generator_group_size=2, responses_shown=3, shown_response_max_tokens=cap,
                                 max_proposed=4)
        _, _, calls, _ = run_step(config, examples)
        (_, _, reasoner_samples), (generator_prompts, _, _) = calls
        texts = [response_text(task.tokenizer(), s.output_ids) for s in reasoner_samples]
        for p, (example, prompt) in enumerate(zip(examples, generator_prompts)):
            shown = [expected(text) for text in texts[4 * p:4 * p + 3]]
            assert prompt == task.generator_prompt(example, shown, task.rubric(example).criteria)
            assert len(texts[4 * p]) > 12  # the cap cut something


def test_a_thinking_policys_shown_responses_are_its_answers():
    """A thinking policy (Qwen3's default mode) opens each response with a <think> block: the generator is shown
    the answer after it, cut to its first four tokens "### Step ", "1", ":", " " (the first four of the response
    would be "<", "t", "h", "i"); a response cut off while thinking is shown as nothing."""
    examples, task = two_problems(), coarse_task()
    thinking = {e.question: ["<think>" + "x" * 20 + "</think>\n\n" + arithmetic.solution_text(e),
                             "<think>" + "y" * 20 + "</think>" + wrong_at(e, 2), "<think>cut off", "<think>z"]
                for e in examples}
    config = EvoRubricConfig(generator_group_size=2, responses_shown=3, shown_response_max_tokens=4, max_proposed=4)
    _, _, calls, _ = run_step(config, examples, responses=thinking)
    (_, _, reasoner_samples), (generator_prompts, _, _) = calls
    assert response_text(task.tokenizer(), reasoner_samples[0].output_ids).startswith("<think>xxx")
    for example, prompt in zip(examples, generator_prompts):
        shown = ["### Step 1: ", "### Step 1: ", ""]
        assert prompt == task.generator_prompt(example, shown, task.rubric(example).criteria)


def test_the_generators_length_penalty_counts_its_rubric_text_not_its_thinking():
    """p_len = 0.1 max(tokens - 2, 0) over the rubric text (the world's tokenizer: one token a character).
    Proposals of each question, with the scripted world's responses (gold, gold, wrong at 2, wrong at 1):
      m0 "<think>" + 30 y + "</think>\n+3 S1": the world's parser reads no thinking, so it fails ("schema");
         rubric text "+3 S1", 5 tokens: p_len 0.3 (the whole output, 52 tokens with the stop token, would give
         5.0); R_gen = -1 - 0.3
      m1 "<think>" + 30 z, cut off while thinking: no rubric text, p_len 0, fails to parse: R_gen = -1
      m2 "+3 S1\n-3 WS", 11 tokens: p_len 0.9; both criteria verified and kept (S1 3 3 3 0, WS 0 0 -3 -3), no
         parsed peer (rho 0): R_gen = 0 + r_meta 1 + r_disc 1 - 0.9 = 1.1."""
    examples = two_problems()
    proposals = {e.question: ["<think>" + "y" * 30 + "</think>\n+3 S1", "<think>" + "z" * 30, "+3 S1\n-3 WS"]
                 for e in examples}
    config = EvoRubricConfig(generator_group_size=3, responses_shown=2, max_proposed=4, generator_length_budget=2,
                             generator_length_coef=0.1)
    _, result, calls, _ = run_step(config, examples, proposals=proposals)
    generator_reward = np.array([-1.3, -1.0, 1.1])
    advantages = row_advantages(result.batch)
    grpo = (generator_reward - generator_reward.mean()) / (generator_reward.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(advantages[8:11], grpo, rtol=1e-5)
    np.testing.assert_allclose(advantages[11:14], grpo, rtol=1e-5)
    metrics = result.metrics
    assert metrics["generator/reward/mean"] == pytest.approx(generator_reward.mean(), abs=1e-6)
    assert metrics["generator/length_penalty"] == pytest.approx((0.3 + 0 + 0.9) / 3, abs=1e-6)
    assert metrics["generator/rubric_length_mean"] == pytest.approx((5 + 0 + 11) / 3)
    assert metrics["generator/length_mean"] == pytest.approx((52 + 38 + 12) / 3)  # every generated token
    assert metrics["evorubric/parse_failed/schema"] == 4


def test_external_generator_rows_are_left_out_of_the_update():
    (full_alg, full, _, _), (alg, ablated, _, _), _ = ablation_runs(train_generator=False)
    assert full.batch["tokens_bt"].shape[0] == 2 * 4 + 2 * 5 and ablated.batch["tokens_bt"].shape[0] == 2 * 4
    np.testing.assert_allclose(row_advantages(full.batch)[:8], row_advantages(ablated.batch))
    assert full.metrics["generator/reward/mean"] == ablated.metrics["generator/reward/mean"]
    assert full_alg.state_dict() == alg.state_dict()


# ---------------------------------------------------------------- failures and empty rubrics mid-run


@pytest.mark.parametrize("on_judge_failure", ["zero_reward", "exclude"])
def test_judge_failures_and_malformed_proposals_are_counted_never_nan(on_judge_failure):
    config = EvoRubricConfig(generator_group_size=5, responses_shown=2, max_proposed=4,
                             on_judge_failure=on_judge_failure)
    examples = two_problems()
    broken = {examples[0].question: [arithmetic.solution_text(examples[0]), FAIL_MARK + " 1 + 1 = 2",
                                     wrong_at(examples[0], 2), wrong_at(examples[0], 1)]}
    malformed = {examples[1].question: ["+3 S1\n+3 S1", "", "+9 S1", "+1 S1\n+1 S2\n+1 S3\n+1 WS\n+1 EV", "none"]}
    task = coarse_task()
    algorithm, result, calls, before = run_step(config, examples, responses=broken, proposals=malformed,
                                                judge=FlakyJudge(task.judge()))
    check_against_reference(config, task, examples, algorithm, result, calls, before,
                            failed=lambda text: FAIL_MARK in text)
    metrics = result.metrics
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["judge/failure_rate"] == pytest.approx(1 / 8) and metrics["judge/failed/check_raised"] == 1
    assert metrics["evorubric/parse_failed/bad_id"] == 1 and metrics["evorubric/parse_failed/empty"] == 1
    assert metrics["evorubric/parse_failed/out_of_bounds"] == 1
    assert metrics["evorubric/parse_failed/too_many_items"] == 1
    assert metrics["evorubric/parse_failed/unrecognized"] == 1  # the first question's fifth proposal
    excluded = ~result.batch["response_mask_bt"][1].any()
    assert excluded == (on_judge_failure == "exclude")


@dataclasses.dataclass(frozen=True)
class EmptyRubricTask(RubricWorldTask):
    def rubric(self, example):
        return Rubric(criteria=())


def test_an_empty_base_rubric_and_empty_proposals_give_zero_advantages_not_nan():
    world = RubricWorldConfig()
    task = EmptyRubricTask(world.problems, 0, world)
    examples = two_problems()
    config = EvoRubricConfig(generator_group_size=3, responses_shown=2)
    empty = {e.question: ["none"] for e in examples}
    algorithm, result, calls, before = run_step(config, examples, task=task, proposals=empty)
    check_against_reference(config, task, examples, algorithm, result, calls, before)
    assert not result.batch["advantages_bt"].any()
    assert result.metrics["reward/mean"] == 0 and result.metrics["evorubric/empty_proposal_rate"] == 1
    assert "evorubric/consensus_rho_mean" not in result.metrics and "evorubric/pruned_fraction" not in result.metrics
    assert all(math.isfinite(v) for v in result.metrics.values())


def test_a_task_without_the_generator_role_is_rejected():
    task = build_task("arithmetic", {}, 0)
    context = context_for(ScriptedEngine(task.tokenizer(), {}, {}), task, task.tokenizer())
    with pytest.raises(ValueError, match="needs a task with generator_prompt, parse_generated_rubric, meta_verify"):
        EvoRubric(EvoRubricConfig()).experience(task.train_stream(0).next_batch(1), context, 0)


@pytest.mark.parametrize("field, value, message", [
    ("generator_group_size", 1, "needs peers"), ("max_proposed", 0, "max_proposed must be >= 1"),
    ("responses_shown", 0, "responses_shown"), ("count_coef", -1.0, "count_coef must be >= 0"),
    ("overlong_buffer", -1, "overlong_buffer must be >= 0"), ("std_ddof", 2, "std_ddof"),
    ("parse_failure_reward", math.inf, "parse_failure_reward must be finite"),
    ("pool_max_questions", 0, "pool_max_questions must be >= 1"),
])
def test_config_is_validated(field, value, message):
    with pytest.raises(ValueError, match=message):
        EvoRubricConfig(**{field: value})


# ---------------------------------------------------------------- base rubrics written by the initial policy


@dataclasses.dataclass(frozen=True)
class WrittenBaseTask(RubricWorldTask):
    """The coarse world with the base rubric the scripted initial policy writes (its first proposal, "+3 S1\n-3
    WS"), for the NumPy reference of a base_rubric generated step."""

    def rubric(self, example):
        return Rubric(criteria=(rubric_world.world_criterion("S1", 3), rubric_world.world_criterion("WS", -3)))


def written_base(state) -> dict:
    return {entry["question"]: [c["name"] for c in entry["criteria"]] for entry in state["base_rubrics"]}


def test_a_generated_base_rubric_is_written_once_by_the_frozen_initial_policy_and_checkpointed():
    """base_rubric generated: at a question's first visit the frozen engine answers one generator prompt with no
    existing criteria (n = 1); the parsed rubric is S_base and heads C_hist exactly as a task rubric would, is
    never written again, survives state_dict / load_state_dict, and a failed parse is retried next visit."""
    config = EvoRubricConfig(generator_group_size=5, responses_shown=2, max_proposed=4, base_rubric="generated")
    assert EvoRubric(config).needs_frozen_engine and EvoRubric(config).config.train_generator
    examples = two_problems()
    world = RubricWorldConfig(base_rubric="coarse")
    algorithm, result, calls, before = run_step(config, examples)
    reasoner_call, generator_call, [base_prompts, base_params, _] = calls
    assert len(base_prompts) == 2 and base_params.n == 1
    assert all(prompt[-1]["content"].endswith("Have: none") for prompt in base_prompts)
    assert all(prompt[-1]["content"].endswith("Have: S1 WS") for prompt in generator_call[0])
    assert written_base(algorithm.state_dict()) == {e.question: ["S1", "WS"] for e in examples}
    assert result.metrics["evorubric/base_rubrics_written"] == 2
    check_against_reference(config, WrittenBaseTask(world.problems, 0, world), examples, algorithm, result,
                            [reasoner_call, generator_call], before)

    restored = EvoRubric(config)
    restored.load_state_dict(algorithm.state_dict())
    _, second, calls, before = run_step(config, examples, algorithm=restored, step=1)
    assert len(calls) == 2 and second.metrics["evorubric/base_rubrics_written"] == 0  # nothing written again
    check_against_reference(config, WrittenBaseTask(world.problems, 0, world), examples, restored, second, calls,
                            before)
    with pytest.raises(ValueError, match="base_rubric is task"):
        EvoRubric(EvoRubricConfig()).load_state_dict(algorithm.state_dict())

    unparsable = {examples[1].question: ["+3 S1\n+9 XX", "+2 S2"]}
    algorithm, result, calls, _ = run_step(config, examples, proposals=unparsable)
    assert written_base(algorithm.state_dict()) == {examples[0].question: ["S1", "WS"]}
    assert result.metrics["evorubric/base_rubric_failed/unrecognized"] == 1
    assert result.metrics["evorubric/base_rubrics_written"] == 1
    _, result, calls, _ = run_step(config, examples, proposals=unparsable, algorithm=algorithm, step=1)
    assert len(calls[2][0]) == 1 and result.metrics["evorubric/base_rubric_failed/unrecognized"] == 1


# ---------------------------------------------------------------- train_rl end to end, checkpoint and resume


def rl_config(tmp_path, steps: int) -> RLConfig:
    params = {"generator_group_size": 3, "generator_max_new_tokens": 12, "responses_shown": 2, "max_proposed": 4,
              "generator_length_budget": 8, "generator_length_coef": 0.01}
    return RLConfig(output_dir=str(tmp_path / "run"), steps=steps, model=ModelSpec(init=TINY), seed=1,
                    task=TaskSpec(name="arithmetic_rubrics", params={"base_rubric": "coarse"}),
                    rollout=RolloutConfig(prompts_per_step=2, group_size=4, max_new_tokens=16),
                    algorithm=AlgorithmSpec(name="evorubric", params=params),
                    checkpoint=CheckpointConfig(every_steps=1, async_save=False),
                    metrics=MetricsConfig(console=False, tensorboard=False, plots=False))


def test_a_train_rl_step_end_to_end_matches_the_reference_and_its_pool_survives_resume(tmp_path, monkeypatch):
    """A random tiny policy on the embedded engine (its generator text read as a hashed proposal, "MU" graded as
    noise so that criteria survive the variance filter): one train_rl step whose experience equals the NumPy
    reference and whose every metric is finite; then a resumed run loads the checkpointed pool."""
    task, judge = hashed_task(), NoisyMuJudge()
    engines, steps = [], []
    make_engine = assembly.make_engine
    monkeypatch.setattr(assembly, "make_engine", lambda *a: engines.append(Recording(make_engine(*a))) or engines[-1])
    experience = EvoRubric.experience

    def spied(self, examples, context, step):
        before = self.state_dict()
        result = experience(self, examples, context, step)
        steps.append((self, examples, before, result))
        return result

    monkeypatch.setattr(EvoRubric, "experience", spied)
    config = rl_config(tmp_path, 1)
    last = train_rl(config, task, judge=judge)
    [line] = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert all(math.isfinite(value) for value in line.values()) and line == {"step": 1, **last}
    expected = {"reward/mean", "advantage/std", "outcome/accuracy", "generator/reward/mean",
                "generator/advantage/std", "evorubric/generator_format_rate", "evorubric/pool_size",
                "evorubric/consensus_rho_mean", "evorubric/pruned_fraction", "evorubric/meta_rejected_fraction",
                "evorubric/archived", "judge/failure_rate", "train/loss", "train/grad_norm", "mismatch/k3"}
    assert expected <= line.keys() and line["train/grad_norm"] > 0
    [(algorithm, examples, before, result)] = steps
    check_against_reference(algorithm.config, task, examples, algorithm, result,
                            role_calls(engines[0].calls[:1 + len(examples)]), before, judge=judge)

    _, meta = Checkpointer(tmp_path / "run" / "checkpoints").restore(1, None)
    saved = meta["algorithm_state"]
    assert saved["pool"] and line["evorubric/pool_size"] == sum(len(e["criteria"]) for e in saved["pool"])
    loaded = []
    load = EvoRubric.load_state_dict
    monkeypatch.setattr(EvoRubric, "load_state_dict", lambda self, state: loaded.append(state) or load(self, state))
    train_rl(rl_config(tmp_path, 2), task, judge=judge)
    assert loaded == [saved]
    resumed_before = steps[1][2]
    assert resumed_before == saved  # the resumed step started from the checkpointed pool
    _, meta = Checkpointer(tmp_path / "run" / "checkpoints").restore(2, None)
    after = pool_dict(meta["algorithm_state"])
    for question, criteria in pool_dict(saved).items():  # far below the bounds: step 1's criteria all stay
        assert after[question][:len(criteria)] == criteria


def test_train_rl_samples_the_external_generator_from_a_frozen_engine_that_survives_resume(tmp_path, monkeypatch):
    """External Evolving-RL through train_rl: the reasoner samples from the synced engine, the generator from a
    second engine serving the initial policy, which is sent no weight update, also after a resume. A resumed run's
    frozen generator samples exactly what the uninterrupted run's did at the same step (a learning rate large
    enough that step 1 moves the policy, so a frozen engine built from restored weights would differ)."""
    task, judge = hashed_task(), NoisyMuJudge()
    engines = []
    make_engine = assembly.make_engine
    monkeypatch.setattr(assembly, "make_engine", lambda *a: engines.append(Recording(make_engine(*a))) or engines[-1])

    def external(directory, steps, first):
        config = rl_config(tmp_path / directory, steps)
        params = {**config.algorithm.params, "train_generator": False}
        config = dataclasses.replace(config, algorithm=AlgorithmSpec("evorubric", params),
                                     optimizer=dataclasses.replace(config.optimizer, learning_rate=1e-2))
        engines.clear()
        train_rl(config, task, judge=judge)
        policy_engine, frozen = engines
        assert frozen.weight_version == "initial" and not frozen.updates
        assert policy_engine.updates == [f"step-{s}" for s in range(first, steps + 1)]
        assert not any(is_generator_prompt(prompt) for prompts, _, _ in policy_engine.calls for prompt in prompts)
        assert all(is_generator_prompt(prompt) for prompts, _, _ in frozen.calls for prompt in prompts)
        assert all(s.weight_version == "initial" for _, _, samples in frozen.calls for s in samples)
        return policy_engine, frozen

    _, uninterrupted = external("a", 2, first=1)
    external("b", 1, first=1)
    policy_engine, resumed = external("b", 2, first=2)
    assert policy_engine.calls[0][2][0].weight_version == "step-1"  # it resumed after step 1
    assert len(resumed.calls) == 2  # step 2's generator, one call per question
    prompts, _, samples = merged_calls(resumed.calls)
    expected_prompts, _, expected = merged_calls(uninterrupted.calls[2:])
    assert prompts == expected_prompts
    assert [(s.output_ids, s.logprobs) for s in samples] == [(s.output_ids, s.logprobs) for s in expected]


# ---------------------------------------------------------------- the paper's formats on a dataset task

HEALTHBENCH = Path(__file__).resolve().parents[1] / "fixtures" / "datasets" / "evorubric_healthbench.jsonl"


def healthbench_task():
    """Two HealthBench-layout rows (one multi-turn) with two expert criteria each; no generator role of its own."""
    return build_task("dataset", {"preset": "healthbench", "path": str(HEALTHBENCH)}, 0)


def test_the_paper_generator_format_is_table_5s_prompt_and_json_list_on_any_task():
    task = healthbench_task()
    example = task.train_stream(0).next_batch(1)[0]
    existing = task.rubric(example).criteria
    config = EvoRubricConfig(generator_format="paper", max_proposed=3)
    prompt, parse = generator_io(task, config)
    messages = prompt(example, ["REST it.", "Walk it off."], existing)
    assert messages == prompts.rubric_generator_prompt(task.question(example), ["REST it.", "Walk it off."], existing)
    assert messages[0]["content"].startswith("You are a world-class Rubric Design Specialist")

    empty = parse("[]")  # Table 5: "If no meaningful gap exists, output []": the empty proposal, not a failure
    assert empty.ok and empty.rubric.criteria == ()
    fenced = parse('<think>the gap is icing</think>```json\n[{"criterion": "Advises ICE.", "points": 4},\n'
                   ' {"criterion": "Recommends ASPIRIN.", "points": -10, "category": "Safety"}]\n```')
    assert [(c.text, c.weight, c.category) for c in fenced.rubric.criteria] == [
        ("Advises ICE.", 4, None), ("Recommends ASPIRIN.", -10, "Safety")]
    items = json.dumps([{"criterion": f"c{i}", "points": 1} for i in range(4)])
    failures = {"There is no gap.": "no_json", '[{"criterion": "Is kind.", "points": 0}]': "out_of_bounds",
                '[{"criterion": "Is kind.", "points": 11}]': "out_of_bounds", items: "too_many_items",
                '[{"criterion": "", "points": 2}]': "schema"}
    assert {text: parse(text).reason for text in failures} == failures

    world = coarse_task()  # the task format: the world's own prompt and parser, its "none" the empty proposal
    world_prompt, world_parse = generator_io(world, EvoRubricConfig())
    assert world_prompt == world.generator_prompt
    assert world_parse("none").ok and world_parse("none").rubric.criteria == ()


def test_the_task_check_asks_only_for_what_the_settings_use():
    task = healthbench_task()
    context = context_for(ScriptedEngine(task.tokenizer(), {}, {}), task, task.tokenizer(),
                          judge=rubric_world.world_judge())
    examples = task.train_stream(0).next_batch(1)
    with pytest.raises(ValueError, match="needs a task with generator_prompt, parse_generated_rubric, meta_verify"):
        EvoRubric(EvoRubricConfig()).experience(examples, context, 0)
    with pytest.raises(ValueError, match=r"needs a task with meta_verify \("):
        EvoRubric(EvoRubricConfig(generator_format="paper")).experience(examples, context, 0)
    # Nothing is asked of the task with the paper's generator and an LLM meta-verifier, or with no meta-verifier.
    EvoRubric(EvoRubricConfig(generator_format="paper"))._check_task(
        dataclasses.replace(context, meta_verifier=object()))
    EvoRubric(EvoRubricConfig(generator_format="paper", meta_verifier=False))._check_task(context)


TABLE_5_OPENING = "You are a world-class Rubric Design Specialist"
SERVED_RESPONSES = ("REST and ICE it, ELEVATE it, drink FLUIDS.", "REST it and take FLUIDS.",
                    "Walk through the SHARP pain; ASPIRIN helps.", "ICE it.")
SERVED_PROPOSALS = (
    json.dumps([{"criterion": "Advises ICE on the injury.", "points": 4},
                {"criterion": "Advises to consult a doctor.", "points": 2}]),
    json.dumps([{"criterion": "Advises to ELEVATE the limb.", "points": 3},
                {"criterion": "Mentions ICE packs.", "points": 2}]),
)


def served_reply(prompt: str, j: int) -> str:
    """The policy behind the stand-in's /generate: a prompt that opens with Table 5's system prompt gets
    SERVED_PROPOSALS, any other SERVED_RESPONSES, sample j text j (cycled)."""
    texts = SERVED_PROPOSALS if TABLE_5_OPENING in prompt else SERVED_RESPONSES
    return texts[j % len(texts)]


def served_chat(messages) -> str:
    """The grader (one criterion per call, RGR's rating prompt) and the meta-verifier (Table 6) of the stand-in.
    Grader: met iff every upper-case marker word of the criterion is in the response. Meta-verifier: "consult a
    doctor" is Trivial/Cliché, every other criterion VALID."""
    if messages[0]["role"] == "system":
        target = json.loads(fenced(messages[-1]["content"], "target_rubric"))["criterion"]
        return json.dumps({"verdict": "INVALID: Trivial/Cliché" if "doctor" in target else "VALID"})
    content = messages[-1]["content"]
    markers = re.findall(r"\b[A-Z]{3,}\b", fenced(content, "criterion"))
    return json.dumps({"rating": int(all(m in fenced(content, "response") for m in markers))})


def test_an_evorubric_step_on_a_dataset_task_runs_every_role_over_http(tmp_path):
    """One train_rl step on the HealthBench fixture with the paper's generator format: the policy (both roles)
    on the stand-in's /generate, the grader (format rating) and the Table 6 meta-verifier on its chat endpoint.

    Per question: the meta-verifier audits the 4 proposed criteria (the first call answered 503, retried) and
    rejects "consult a doctor"; the 3 verified ones (ICE twice, ELEVATE) split the responses, so all are
    archived; each of the 4 responses is graded on 2 expert + 3 verified criteria."""
    task = healthbench_task()
    script = ScriptedPolicy(task.tokenizer(), served_reply, EOS)
    answered = itertools.count()

    def respond(messages) -> str:
        # The launch's preflight asks the judge and the meta-verifier once each; then the run's first call (a
        # meta-verifier's) meets a 503.
        if next(answered) == 1:
            server.inject(http_error(503, CHAT_PATH))
        return served_chat(messages)

    with StandinServer(script, tokenizer=task.tokenizer(), responder=respond) as server:
        params = {"generator_format": "paper", "generator_group_size": 2, "generator_max_new_tokens": 160,
                  "responses_shown": 2, "shown_response_max_tokens": 16, "max_proposed": 4}
        config = RLConfig(
            output_dir=str(tmp_path / "run"), steps=1, seed=0,
            model=ModelSpec(init=dataclasses.replace(TINY, max_position_embeddings=384)),
            task=TaskSpec(name="dataset", params={"preset": "healthbench", "path": str(HEALTHBENCH)}),
            rollout=RolloutConfig(engine="sglang", sglang_url=server.base_url, prompts_per_step=2, group_size=4,
                                  max_new_tokens=48, max_prompt_tokens=192),
            algorithm=AlgorithmSpec(name="evorubric", params=params),
            judge=JudgeConfig(kind="llm", url=server.base_url, model="judge", format="rating", max_attempts=3),
            meta_verifier=MetaVerifierConfig(kind="llm", url=server.base_url, model="meta", domain="medical",
                                             max_attempts=3),
            checkpoint=CheckpointConfig(every_steps=1, async_save=False),
            metrics=MetricsConfig(console=False, tensorboard=False, plots=False))
        last = train_rl(config, task)
        chat_models = collections.Counter(body["model"] for body in server.chat_requests)
        generate_requests = server.requests["/generate"]

    # one request per prompt of each role's call (2 prompts, 2 roles); two syncs
    assert generate_requests == 4 and script.updates == ["step-0", "step-1"]
    assert sum(TABLE_5_OPENING in prompt for prompt in script.prompts) == 2 and len(script.prompts) == 4
    assert chat_models == {"meta": 2 * 4 + 1, "judge": 2 * 4 * (2 + 3) + 1}  # and each one's preflight
    assert last["meta_verifier/requests"] == 8 and last["meta_verifier/retries"] == 1
    assert last["meta_verifier/request_failures"] == 0 and last["judge/requests"] == 40
    assert last["judge/retries"] == 0 and last["judge/failure_rate"] == 0
    assert last["judge/calls"] == 40 and last["judge/call_failures"] == 0
    assert last["meta_verifier/call_failures"] == 0 and last["meta_verifier/call_failure_rate"] == 0
    assert last["evorubric/meta_rejected_fraction"] == 0.25 and last["evorubric/meta_rejected/trivial_cliche"] == 0.25
    assert last["evorubric/generator_format_rate"] == 1 and last["evorubric/pruned_fraction"] == 0
    assert last["evorubric/archived"] == 6 and last["evorubric/pool_size"] == 6
    assert all(math.isfinite(value) for value in last.values()) and last["train/grad_norm"] > 0
    _, meta = Checkpointer(tmp_path / "run" / "checkpoints").restore(1, None)
    assert {question: [c.text for c in criteria] for question, criteria in
            pool_dict(meta["algorithm_state"]).items()} == {
        question: ["Advises ICE on the injury.", "Advises to ELEVATE the limb.", "Mentions ICE packs."]
        for question in ("I twisted my ankle an hour ago. What should I do?", "A little. What should I do?")}
