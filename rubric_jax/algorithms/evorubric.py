"""EvoRubric (Guan et al. 2026, evorubric.txt): one policy plays a Reasoner and a Rubric Generator. The generator
proposes criteria that separate the reasoner's responses, a multi-level verification keeps the valid,
discriminative and agreed-on ones, and a memory pool archives them as the reasoner's evolving rubric; both roles
are trained in one update.

For each step (N = sampling.n responses and M = generator_group_size rubric sets per question q;
`generator_reward`, `reasoner_reward` and `advantage` are the recipe's methods a variant overrides):
  1. o_1..o_N ~ pi(. | q, p_rea); then, per question, as soon as     base.sample_and_follow,           eq 1
     its group is sampled, steps 1-4 of that question                _question_steps
     the base rubric of q: the task's, or (base_rubric generated)    _base_rubric,                     4.1 (2)
     at q's first visit written once by the frozen initial policy    _written_base_rubric
     from the generator prompt with these responses and no existing  (base.asample_group, stream 2),
     criteria, parsed, kept per question and checkpointed            kept by _base_rubrics
  2. R_1..R_M ~ pi(. | q, O, C_hist, p_gen), C_hist = base rubric     _generate: base.asample_group     eq 2
     + pool[q]; O = the answers (thinking stripped) of the first     (stream 1, the question's group),
     responses_shown responses                                       generator_io: Table 5's prompt    Table 5
     each R_m parsed (a failure is counted and earns                  (prompts.rubric_generator_prompt,
     parse_failure_reward - p_len; "[]" is the empty proposal)        parsing.parse_evorubric_rubrics)
                                                                     or the task's (generator_format);
                                                                     _propose
  3. meta-verifier: R~_m = {r in R_m | v(r) = 1}, every criterion     _meta_verdicts: context.          3.3.2 step 1
     of q's M proposals audited in one awaited call (concurrent      meta_verifier, an LLM             Tables 6-7
     requests) against base rubric + pool[q]; a criterion the LLM    (judges.llm.LLMMetaVerifier.
     could not judge is rejected ("meta_verifier_failed")            averify, one call per criterion),
                                                                     else task.meta_verify
  4. grader: s(o_n, r) = points(r) when o_n meets r, for every        base.judge_group with             step 2
     r in R~_m (one judge request per response, over the base        context.judge's unrecorded; the
     rubric, pool[q] and every R~_m of q)                            step's rows recorded once, in
                                                                     row order (Judge.record)
     once every question is in, in prompt order:
  5. variance filter: R^_m = {r in R~_m | std_n s_r > 0}              zero_variance_prune               step 3
  6. LOO consensus: rho_m = corr(v_m, v_\\m), v_m = mean of R^_m       evorubric_batch_scores,           step 4
                                                                     evorubric_peer_consensus
  7. R_gen(R_m) = rho~_m + r_meta + r_disc - p_num - p_len; p_len     generator_reward:                 eq 3
                                                                     evorubric_scaled_consensus,
     counts the rubric text's tokens (the output after its           evorubric_meta_reward,
     thinking: `rubric_text_tokens`)                                 evorubric_discriminative_reward
                                                                     (core.rubric_validity, vmapped
                                                                     over questions: generator_terms);
                                                                     rewards.excess_penalty (count, tokens)
  8. pool[q] <- pool[q] + (R^_1 u ... u R^_M), before the reasoner    MemoryPool.archive                3.4.1
     is scored ("archived ... prior to this scoring phase")
  9. R_rea(o_i) = S_base + S_pool - p_len: the positive-points score  reasoner_reward:                  eq 4
                                                                     evorubric_joint_reasoner_reward
     of the base rubric and pool[q] as one checklist (one            (score_normalisation joint) or
     denominator), or the sum of each source's own                   evorubric_reasoner_reward
     (score_normalisation); p_len is DAPO's overlong penalty         (separate);
                                                                     rewards.dapo_overlong_shaping     Table 8
 10. A = GRPO per question, for each role on its own rollouts         advantage: roles.role_mask,
                                                                     select_by_role,
                                                                     advantages.grpo_advantages
 11. one clipped update over the rows of both roles                   base.concat_batches, policy_loss_fn  eq 5

Steps 1-4 run per question (`base.sample_and_follow`): with `RolloutContext.pipelined_judging` (the default) a
question's generator, meta-verifier and grader start the moment the engine's stream yields its reasoner group,
while later groups are still sampling; without it, once every group is sampled, all questions concurrently. Either
way each question reads only its own group and the state as it was before the step (C_hist's pool part is read
before any question's steps; the pool is archived and the generated base rubrics are kept after all, in prompt
order), its draws are seeded by its group (`base.asample_group`: the generator's M samples and a generated base
rubric are seeded per question, by (seed, step, stream, 0, p + 1), no longer by one call over all questions), and
its grader K is its own rubric's length, widened to the step's widest (unsatisfied, step -1): the step is the
same in both modes, and a judge's rollout log holds the rows in row order. A question drawn twice in one step
reads the same pool; with base_rubric generated its first draw writes the base rubric (from its own shown
responses) and the later draws await it. The meta-verifier's and the generator's time is inside the step's
"generation" / "judging" phases (no "time/meta_verifier" of its own).

Ablations (section 4.3, Table 2), one switch each:
- meta_verifier False ("w/o Meta-Verifier"): no audit; every parsed criterion counts as verified and r_meta
  leaves eq 3.
- memory_pool False ("w/o Memory Pool"): nothing is archived across steps; C_hist is the base rubric and S_pool
  scores this step's R^ only ("transient rubrics").
- peer_consensus False ("w/o Peer Consensus"): rho~ leaves eq 3.
- discriminative False ("w/o Discriminative Reward"): no variance filter (R^_m = R~_m) and r_disc leaves eq 3.
- train_generator False ("External Evolving-RL"): the generator is a separate, unoptimised model of the same
  size: it samples from the trainer's frozen engine (`RolloutContext.frozen_engine`, the initial policy, never
  sent a weight update) and its rows are left out of the update; it still proposes, is verified and feeds the
  pool.

Where the paper is silent (each choice is a config field): M (generator_group_size); the forms of r_meta, r_disc
(core.rubric_validity) and of p_num, the generator's p_len (core.rewards.excess_penalty, linear above a budget);
the reward of an unparsable proposal (parse_failure_reward, default -1: the r_meta of a proposal the
meta-verifier rejects entirely); which responses the generator sees (the first responses_shown of the group, a
uniform sample since the N responses are exchangeable; None shows all) and how much of each (its first
shown_response_max_tokens tokens of its answer); the pool's key (the question text), its
bounds and its eviction rule (`MemoryPool`); the meta-verifier's model (the run's meta_verifier.model); the
prompt of a generated base rubric (`_written_base_rubric`: Table 5's, with the first visit's shown responses). A
criterion the LLM meta-verifier could not judge (its request failed after retries, or its verdict did not parse)
is rejected, so only an audited criterion reaches the reward. A judge failure on a response takes it out of its
question's score matrix (the response mask of steps 5-6) and, as in RaR, gives it reward 0 or excludes it
(on_judge_failure).

Metrics: "reward/*", "advantage/*" the reasoner's (its valid rows), "reasoner/base_score/*" and
"reasoner/pool_score/*" (S_base, S_pool); "generator/reward/*", "generator/advantage/*", the means of eq 3's terms
("generator/consensus_term", "meta_term", "disc_term", "count_penalty", "length_penalty", ablated terms 0) and
"generator/length_mean" (generated tokens, thinking included), "generator/rubric_length_mean" (the rubric text's
tokens, p_len's); "evorubric/generator_format_rate", "evorubric/parse_failed/<reason>",
"evorubric/empty_proposal_rate", "evorubric/proposed_mean" (criteria per parsed proposal),
"evorubric/meta_rejected_fraction" and "evorubric/meta_rejected/<category>" (of the proposed criteria;
"meta_verifier_failed": those the LLM meta-verifier could not judge, whose requests the trainer logs as
"meta_verifier/*"),
"evorubric/pruned_fraction" (of the verified ones), "evorubric/consensus_rho_mean" (over the proposals whose rho
is defined: R^_m and some peer's R^ non-empty), "evorubric/archived" (criteria added to the pool this step),
"evorubric/pool_size" and "evorubric/pool_questions" (the whole pool); with base_rubric generated,
"evorubric/base_rubrics_written" (this step), "evorubric/base_rubric_questions" (in all) and
"evorubric/base_rubric_failed/<reason>" (parse failures this step); "rubric/..." and "judge/*" over every
graded criterion; "response/*" and "outcome/accuracy" of the reasoner. A fraction of nothing is left out.
"""

import asyncio
import collections
import dataclasses
import functools
import re
import types
import unicodedata
from typing import Any, Callable, Literal, Mapping, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rubric_jax.algorithms import base
from rubric_jax.algorithms.registry import register
from rubric_jax.core import advantages, rewards, roles, rubric_validity
from rubric_jax.judges.base import JudgeRequest, Verdicts
from rubric_jax.judges.llm import MetaVerifyRequest
from rubric_jax.rubrics import parsing, prompts
from rubric_jax.rubrics.memory_pool import MemoryPool, pooled
from rubric_jax.rubrics.parsing import FailurePolicy
from rubric_jax.rubrics.schema import Criterion, Rubric
from rubric_jax.rubrics.steps import response_text, split_steps

REASONER, GENERATOR = 0, 1  # role ids (core.roles)


@dataclasses.dataclass(frozen=True)
class EvoRubricConfig:
    """EvoRubric's settings (module docstring); the defaults follow the paper where it gives a value.

    policy_loss: Appendix B eq 5 / Table 8: clip (0.2, 0.28), no KL, the sequence-mean of token means.
    generator_group_size: M rubric sets per question (>= 2: the consensus needs peers; the paper gives no M).
    generator_max_new_tokens: the generator's token budget; responses_shown: reasoner responses in its prompt
    (None: all N, as eq 2 conditions on the whole group O); shown_response_max_tokens: the first tokens of each
    shown response's answer, its thinking stripped (`shown_answer`; None: whole answers), which bounds the prompt
    by responses_shown x this cap plus the question and C_hist (N = 8 responses of up to 8192 tokens would not fit
    Table 8's 12288-token prompt).
    max_proposed: the most criteria a proposal may hold (more is a parse failure); the score
    matrix's K.
    count_budget / count_coef: p_num = count_coef * max(|R_m| - count_budget, 0) (Table 5 asks for 0 to 6).
    generator_length_budget / generator_length_coef: the generator's p_len, the same form over the tokens of its
    rubric text, its thinking not counted (`rubric_text_tokens`).
    overlong_buffer / overlong_factor: the reasoner's p_len, DAPO's overlong penalty over the last
    overlong_buffer tokens of rollout.max_new_tokens (Table 8: 4096 of 8192, factor 1.0; 0: no penalty).
    score_normalisation: eq 4's S_base + S_pool: "joint" (the default), the met points of the base rubric and the
    pool over the positive points of both, one checklist under section 3's r = sum_k s_k / K_pos
    (`rubric_validity.evorubric_joint_reasoner_reward`; 3.3.2 step 2 speaks of "the denominator" of "a normalized
    Reasoner reward"), or "separate", each source over its own positive points and the two scores added
    (`rubric_validity.evorubric_reasoner_reward`), under which a one-criterion pool weighs as much as the whole
    base rubric and a penalty-only pool adds 0 even when its penalty is met (docs/fidelity/evorubric.md, row 21).
    parse_failure_reward: R_gen of an unparsable proposal (before its p_len).
    pool_max_per_question / pool_max_questions: the memory pool's bounds (`MemoryPool`).
    generator_format: "paper", Table 5's prompt (`prompts.rubric_generator_prompt`) and JSON list
    (`parsing.parse_evorubric_rubrics`), for any task; "task", the task's own `generator_prompt` and
    `parse_generated_rubric` (the rubric world's "+3 S1" lines) (`generator_io`).
    base_rubric: S_base's rubric (module docstring, step 1): "task", the task's own (an expert rubric, Table 3's
    "EvoRubric (expert)"; none for a dataset without rubrics), or "generated", written once per question by the
    frozen initial policy (section 4.1: "generated few-shot by the corresponding base model"; Table 3's "8B
    self-generated"), the task's rubric unused.
    meta_verifier, memory_pool, peer_consensus, discriminative, train_generator: the ablation switches
    (train_generator False samples the generator from the trainer's frozen engine, the initial policy). Who
    meta-verifies is the run's `meta_verifier` section: an LLM (`RolloutContext.meta_verifier`) or, without one,
    the task's `meta_verify`.
    on_judge_failure, std_ddof, eps: as RaR ("zero_reward" or "exclude"; GRPO's std, 1 = sample, and epsilon).
    """

    policy_loss: base.PolicyLossConfig = base.PolicyLossConfig(eps_low=0.2, eps_high=0.28,
                                                               aggregation="seq_mean_token_mean")
    generator_group_size: int = 4
    generator_max_new_tokens: int = 512
    responses_shown: Optional[int] = None
    shown_response_max_tokens: Optional[int] = 1024
    max_proposed: int = 8
    count_budget: int = 6
    count_coef: float = 0.1
    generator_length_budget: int = 256
    generator_length_coef: float = 1e-3
    overlong_buffer: int = 0
    overlong_factor: float = 1.0
    score_normalisation: Literal["joint", "separate"] = "joint"
    parse_failure_reward: float = -1.0
    pool_max_per_question: int = 32
    pool_max_questions: int = 100_000
    generator_format: Literal["task", "paper"] = "task"
    base_rubric: Literal["task", "generated"] = "task"
    meta_verifier: bool = True
    memory_pool: bool = True
    peer_consensus: bool = True
    discriminative: bool = True
    train_generator: bool = True
    on_judge_failure: Literal["zero_reward", "exclude"] = "zero_reward"
    std_ddof: int = 1
    eps: float = 1e-6

    def __post_init__(self):
        if self.generator_group_size < 2:
            raise ValueError(f"generator_group_size must be >= 2 (the LOO consensus needs peers), "
                             f"got {self.generator_group_size}")
        for name in ("generator_max_new_tokens", "max_proposed", "pool_max_per_question", "pool_max_questions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("responses_shown", "shown_response_max_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be None (all) or >= 1, got {getattr(self, name)}")
        for name in ("count_budget", "count_coef", "generator_length_budget", "generator_length_coef",
                     "overlong_buffer", "overlong_factor", "eps"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not np.isfinite(self.parse_failure_reward):
            raise ValueError(f"parse_failure_reward must be finite, got {self.parse_failure_reward}")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof must be 0 or 1, got {self.std_ddof}")


# ---------------------------------------------------------------- verification (steps 5-7), per question


class GeneratorTerms(NamedTuple):
    """Steps 5-7 for P questions: kept [P, M, K] (R^), rho [P, M], has_criteria [P, M] (R^_m non-empty), and
    eq 3's terms [P, M]: consensus (rho~), meta (r_meta), disc (r_disc)."""

    kept: jax.Array
    rho: jax.Array
    has_criteria: jax.Array
    consensus: jax.Array
    meta: jax.Array
    disc: jax.Array


@functools.partial(jax.jit, static_argnames="variance_filter")
def generator_terms(scores_pmkn, proposed_pmk, verified_pmk, response_mask_pn, *, variance_filter: bool = True):
    """Steps 5-7 of the module docstring for each of P questions (core.rubric_validity, vmapped).

    scores [P, M, K, N] (s = points when met, 0 elsewhere), proposed / verified [P, M, K] (verified within
    proposed), response_mask [P, N] (responses the judge graded). variance_filter False is the "w/o
    Discriminative Reward" ablation: R^ = R~.
    """

    def one(scores, proposed, verified, response_mask):
        verified = verified & proposed
        if variance_filter:
            kept = rubric_validity.zero_variance_prune(scores, verified, response_mask)
        else:
            kept = verified
        batch = rubric_validity.evorubric_batch_scores(scores, kept)
        rho = rubric_validity.evorubric_peer_consensus(batch.vectors_mn, batch.has_criteria_m, response_mask)
        return GeneratorTerms(
            kept=kept, rho=rho, has_criteria=batch.has_criteria_m,
            consensus=rubric_validity.evorubric_scaled_consensus(rho, kept, proposed),
            meta=rubric_validity.evorubric_meta_reward(verified, proposed),
            disc=rubric_validity.evorubric_discriminative_reward(kept, verified))

    return jax.vmap(one)(scores_pmkn, proposed_pmk, verified_pmk, response_mask_pn)


# ---------------------------------------------------------------- the recipe


def generator_io(task: Any, config: EvoRubricConfig) -> tuple[Callable, Callable]:
    """Step 2's (prompt(example, responses, existing) -> messages, parse(text) -> RubricParse) under
    config.generator_format: Table 5's prompt on the task's question with `parsing.parse_evorubric_rubrics`, or the
    task's own pair. Either way an empty proposal parses, as Table 5 asks for one when nothing is missing ("If no
    meaningful gap exists, output []"; the rubric world writes "none"): a parsed empty rubric (E2)."""
    if config.generator_format == "paper":
        return (lambda example, responses, existing: prompts.rubric_generator_prompt(
                    task.question(example), responses, existing),
                functools.partial(parsing.parse_evorubric_rubrics, max_items=config.max_proposed))
    return task.generator_prompt, functools.partial(task.parse_generated_rubric, max_items=config.max_proposed,
                                                    allow_empty=True)


@dataclasses.dataclass(frozen=True)
class _Proposals:
    """Steps 2-3 for P questions and M generators ([p][m]): the parsed criteria R_m (None: the output did not
    parse), the verified ones R~_m, the parse failures by reason and the meta-verifier's INVALID categories."""

    parsed: list[list[Optional[tuple[Criterion, ...]]]]
    verified: list[list[tuple[Criterion, ...]]]
    parse_failures: collections.Counter
    rejected: collections.Counter


class _QuestionSteps(NamedTuple):
    """Steps 1-4 of one question (`EvoRubric._question_steps`): its base rubric and, when its group wrote it
    (base_rubric generated), the parse of the written one; its M generator rollouts (one group, prompt index 0),
    their parsed R_m (None: unparsable) and verified R~_m, the parse failures by reason and the meta-verifier's
    INVALID categories; the grader's rubric (base rubric, pool, every R~_m), its N requests and their verdicts
    [N, len(rubric.criteria)]."""

    base_rubric: tuple[Criterion, ...]
    written: Optional[Any]
    generator: base.Rollouts
    parsed: list[Optional[tuple[Criterion, ...]]]
    verified: list[tuple[Criterion, ...]]
    parse_failures: collections.Counter
    rejected: collections.Counter
    rubric: Rubric
    requests: list[JudgeRequest]
    verdicts: Verdicts


class _FirstVisits:
    """base_rubric generated: `first`, {question: the prompt index of its first draw in the step} of the questions
    without a written base rubric, and, made on the step's event loop as first asked for, the future of each
    one's written rubric (a parse), which the group of its first draw sets and its later draws await."""

    def __init__(self, first: dict[str, int]):
        self.first, self._results = first, {}

    def result(self, question: str) -> asyncio.Future:
        if question not in self._results:
            self._results[question] = asyncio.get_running_loop().create_future()
        return self._results[question]


def shown_answer(tokenizer: Any, text: str, max_tokens: Optional[int]) -> str:
    """What the generator is shown of a reasoner response (eq 2's O): its answer, the thinking stripped
    (`parsing.thinking_stripped`: "" for a response cut off while thinking), cut to its first `max_tokens` tokens
    (None: whole). A thinking policy's first tokens are thinking, which the paper's generator does not read: Table 9
    shows it answer snippets, and Table 8's 12288-token prompt holds eight answers, not eight 8192-token rollouts."""
    answer = parsing.thinking_stripped(text)
    if max_tokens is None:
        return answer
    ids = tokenizer.encode(answer, add_special_tokens=False)
    return answer if len(ids) <= max_tokens else response_text(tokenizer, ids[:max_tokens])


def rubric_text_tokens(tokenizer: Any, text: str) -> int:
    """The length the generator's p_len counts (eq 3: p_len "constrains the verbosity of the generated rubric
    text"): the tokens of its output's answer, the thinking stripped (`parsing.thinking_stripped`; 0 for an output
    cut off while thinking, which holds no rubric text and fails to parse), encoded without special tokens (the
    stop token is no text)."""
    return len(tokenizer.encode(parsing.thinking_stripped(text), add_special_tokens=False))


def verified_columns(existing, verified) -> dict[tuple[int, int, int], int]:
    """{(p, m, k): judge column} of each verified criterion in step 4's rubric of question p: after the
    question's existing criteria (base rubric, then pool), proposal by proposal."""
    columns = {}
    for p, batches in enumerate(verified):
        column = len(existing[p])
        for m, batch in enumerate(batches):
            for k in range(len(batch)):
                columns[p, m, k] = column
                column += 1
    return columns


def _metric_slug(text: str) -> str:
    """A category as a metric name: accents dropped (Table 6's "Trivial/Cliché" is "trivial_cliche"), every run
    of other characters one underscore."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "_", ascii_text.lower()).strip("_") or "unnamed"


def _written_base_rubrics(entries: Any) -> dict[str, tuple[Criterion, ...]]:
    """`EvoRubric.state_dict`'s "base_rubrics" read back; ValueError naming the entry for a malformed one."""
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f"base_rubrics must be a list, got {type(entries).__name__}")
    written = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or set(entry) != {"question", "criteria"}:
            raise ValueError(f"base_rubrics[{i}] must be a mapping with the keys 'question' and 'criteria'")
        if not isinstance(entry["question"], str) or entry["question"] in written:
            raise ValueError(f"base_rubrics[{i}].question must be a string not seen before")
        try:
            written[entry["question"]] = Rubric.from_dict({"criteria": entry["criteria"]}).criteria
        except ValueError as error:
            raise ValueError(f"base_rubrics[{i}].{error}") from None
    return written


@register("evorubric")
class EvoRubric(base.Algorithm):
    config_class = EvoRubricConfig
    console_metrics = ("evorubric/pool_size", "evorubric/consensus_rho_mean", "generator/reward/mean")
    plot_panels = types.MappingProxyType({
        "evorubric/pool": ("evorubric/pool_size", "evorubric/archived"),
        "evorubric/verification": ("evorubric/meta_rejected_fraction", "evorubric/pruned_fraction",
                                   "evorubric/consensus_rho_mean"),
        "evorubric/reasoner_scores": ("reasoner/base_score/mean", "reasoner/pool_score/mean"),
    })

    @property
    def negative_weights(self) -> str:
        if self.config.base_rubric == "generated":
            return "not read: the base rubrics are generated (base_rubric: generated), not the task's"
        return "counted: a met one subtracts its points (the positive-points score of the base rubric, eq 4)"

    def __init__(self, config: EvoRubricConfig):
        super().__init__(config)
        self.pool = MemoryPool(config.pool_max_per_question, config.pool_max_questions)
        self.written_base_rubrics: dict[str, tuple[Criterion, ...]] = {}  # base_rubric generated, by question

    @property
    def policy_loss(self) -> base.PolicyLossConfig:
        return self.config.policy_loss

    def learner_rows(self, shape: base.StepShape) -> dict[str, base.RoleRows]:
        """The reasoner's rows, then (when trained) generator_group_size generator rows per question, whose prompts
        show responses: at most the prompt cap, else the question's prompt plus the shown responses at their cap
        (the rubrics the prompt also shows are not counted then)."""
        rows = {"reasoner": super().learner_rows(shape)["policy"]}
        config = self.config
        if config.train_generator:
            shown = (config.responses_shown or shape.group_size) * (config.shown_response_max_tokens
                                                                     or shape.response_tokens)
            rows["generator"] = base.RoleRows(shape.prompts * config.generator_group_size,
                                              shape.max_prompt_tokens or shape.prompt_tokens + shown,
                                              config.generator_max_new_tokens)
        return rows

    def role_prompts(self, task: Any, example: Any, placeholder: str) -> dict[str, list[dict[str, str]]]:
        generator_prompt, _ = generator_io(task, self.config)
        return {"reasoner": task.prompt(example),
                "generator": generator_prompt(example, [placeholder], self.written_base_rubrics.get(
                    task.question(example), task.rubric(example).criteria))}

    @property
    def needs_frozen_engine(self) -> bool:
        """External Evolving-RL (train_generator False): the generator is the unoptimised initial model; and the
        base model writes the base rubrics (base_rubric generated)."""
        return not self.config.train_generator or self.config.base_rubric == "generated"

    def state_dict(self) -> dict[str, Any]:
        """The memory pool and, with base_rubric generated, the written base rubrics (in the order written)."""
        state = self.pool.state_dict()
        if self.config.base_rubric == "generated":
            state["base_rubrics"] = [{"question": question, "criteria": Rubric(criteria).to_dict()["criteria"]}
                                     for question, criteria in self.written_base_rubrics.items()]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not self.config.memory_pool and state.get("pool"):
            raise ValueError("memory_pool is off (the w/o Memory Pool ablation) but the state holds a pool")
        if self.config.base_rubric != "generated" and state.get("base_rubrics"):
            raise ValueError("base_rubric is task but the state holds generated base rubrics")
        written = _written_base_rubrics(state.get("base_rubrics", []))
        self.pool.load_state_dict({key: value for key, value in state.items() if key != "base_rubrics"})
        self.written_base_rubrics = written

    def experience(self, examples: Sequence[Any], context: base.RolloutContext, step: int) -> base.Experience:
        config, task = self.config, context.task
        self._check_task(context)
        questions = [task.question(e) for e in examples]
        num_responses = context.sampling.n

        # 1-4 per question, as its reasoner group is sampled (`_question_steps`): base rubric, generator rollouts,
        # parsed, meta-verified, the responses graded. C_hist's pool part is read before any of them.
        history = [self.pool.criteria(q) if config.memory_pool else () for q in questions]
        visits = self._first_visits(questions, context)
        follow = functools.partial(self._question_steps, examples, questions, history, visits,
                                   self._generator_context(context), context.judge.unrecorded, context, step)
        reasoner, groups = base.sample_and_follow([task.prompt(e) for e in examples], context, step, follow)
        base_rubrics, base_metrics = self._base_rubrics(questions, visits, groups)
        existing = [b + h for b, h in zip(base_rubrics, history)]
        generator = base.concat_rollouts([g.generator for g in groups], context.pad_id)
        proposals = _Proposals(parsed=[g.parsed for g in groups], verified=[g.verified for g in groups],
                               parse_failures=sum((g.parse_failures for g in groups), collections.Counter()),
                               rejected=sum((g.rejected for g in groups), collections.Counter()))
        # The grader's verdicts at the step's K (the widest rubric), recorded once, in row order.
        rubrics = [g.rubric for g in groups]
        requests = [r for g in groups for r in g.requests]
        max_items = max(len(r.criteria) for r in rubrics)
        verdicts = Verdicts.concatenate([g.verdicts.widened(max_items) for g in groups])
        context.judge.record(requests, verdicts)
        judged = ~verdicts.failed_b

        # 5-7. Score matrix, variance filter, LOO consensus, generator reward (eq 3).
        columns = verified_columns(existing, proposals.verified)
        scores, proposed_mask, verified_mask = self._score_matrix(proposals, columns, verdicts, num_responses)
        terms = jax.device_get(generator_terms(scores, proposed_mask, verified_mask,
                                               judged.reshape(len(examples), num_responses),
                                               variance_filter=config.discriminative))
        generator_reward, generator_terms_ = self.generator_reward(proposals, terms, generator, context.tokenizer)

        # 8. R^ archived into the pool before the reasoner is scored (w/o the pool: scored with R^ alone). A
        # question is scored with its pool as its own archive left it (a question drawn twice in one step is
        # scored with the criteria graded on its own responses).
        kept = [[(c, columns[p, m, k]) for m, batch in enumerate(verified) for k, c in enumerate(batch)
                 if terms.kept[p, m, k]] for p, verified in enumerate(proposals.verified)]
        scored_pool = [pooled(h, [c for c, _ in pairs], config.pool_max_per_question)
                       for h, pairs in zip(history, kept)]
        archived = [self.pool.archive(q, [c for c, _ in pairs]) if config.memory_pool else []
                    for q, pairs in zip(questions, kept)]
        # Each pool criterion's judge column: the old pool's own, else the first kept proposal of its text.
        pool_columns = [{c.text: len(b) + j for j, c in enumerate(h)} for b, h in zip(base_rubrics, history)]
        for graded, pairs in zip(pool_columns, kept):
            for criterion, column in pairs:
                graded.setdefault(criterion.text, column)

        # 9. Reasoner reward (eq 4); a judge failure gives 0 or leaves the group (on_judge_failure).
        reasoner_reward, base_score, pool_score = self.reasoner_reward(
            base_rubrics, scored_pool, pool_columns, verdicts, reasoner, context.sampling.max_new_tokens)
        if config.on_judge_failure == FailurePolicy.ZERO_REWARD.value:
            reasoner_reward, reasoner_valid = np.where(judged, reasoner_reward, 0.0), np.ones_like(judged)
        else:
            reasoner_valid = judged

        # 10. GRPO per question, role by role.
        role_ids = np.repeat([REASONER, GENERATOR], [len(reasoner.samples), len(generator.samples)])
        advantage = self.advantage(
            np.concatenate([reasoner_reward, generator_reward]),
            np.concatenate([reasoner.group_ids, len(examples) + generator.group_ids]), role_ids,
            np.concatenate([reasoner_valid, np.ones(len(generator.samples), bool)]))
        reasoner_advantage, generator_advantage = advantage[role_ids == REASONER], advantage[role_ids == GENERATOR]

        # 11. One update over both roles (the generator's rows only when it is trained).
        parts = [(self._with_advantages(reasoner.batch, reasoner_advantage, reasoner_valid), reasoner.prompt_width)]
        if config.train_generator:
            parts.append((self._with_advantages(generator.batch, generator_advantage, None), generator.prompt_width))
        batch, prompt_width = base.concat_batches(parts, context.pad_id)

        correct = base.outcome_correctness(examples, reasoner, task)
        metrics = {
            **base.summary_stats("reward", reasoner_reward, reasoner_valid),
            **base.summary_stats("advantage", reasoner_advantage, reasoner_valid),
            **base.summary_stats("reasoner/base_score", base_score, judged),
            **base.summary_stats("reasoner/pool_score", pool_score, judged),
            **base.summary_stats("generator/reward", generator_reward),
            **base.summary_stats("generator/advantage", generator_advantage),
            **{f"generator/{name}": float(np.mean(value)) for name, value in generator_terms_.items()},
            "generator/length_mean": float(np.mean([len(s.output_ids) for s in generator.samples])),
            **base.rubric_metrics(verdicts, [rubrics[s.prompt_index] for s in reasoner.samples], task),
            **base.rollout_metrics(reasoner, correct, task),
            **self._evolution_metrics(proposals, terms, verified_mask, archived),
            **base_metrics,
        }
        values = base.recipe_values(requests, reasoner_reward, np.where(reasoner_valid, reasoner_advantage, 0.0),
                                    reasoner.group_ids)
        return base.Experience(batch=batch, prompt_width=prompt_width, metrics=metrics, recipe_values=values)

    # -------------------------------------------------------------- the steps, one method each

    def _check_task(self, context) -> None:
        """ValueError unless the task has what the settings ask of it: the generator's prompt and parser
        (generator_format task) and `meta_verify` (the meta-verifier on, with no LLM meta-verifier in the
        context)."""
        config, task = self.config, context.task
        needed = ("generator_prompt", "parse_generated_rubric") if config.generator_format == "task" else ()
        if config.meta_verifier and context.meta_verifier is None:
            needed += ("meta_verify",)
        missing = [name for name in needed if not callable(getattr(task, name, None))]
        if missing:
            raise ValueError(f"evorubric needs a task with {', '.join(missing)} (e.g. task arithmetic_rubrics), "
                             f"got {type(task).__name__}; any task serves with algorithm.params.generator_format "
                             "paper and meta_verifier.kind llm")

    def _shown_responses(self, texts: Sequence[str], context) -> list[str]:
        """The responses of one question (its group's texts) the generator sees: the first responses_shown of its
        N, each its answer's first shown_response_max_tokens tokens (`shown_answer`)."""
        config = self.config
        return [shown_answer(context.tokenizer, text, config.shown_response_max_tokens)
                for text in texts[:config.responses_shown or len(texts)]]

    def _frozen_engine(self, context, role: str):
        """The context's frozen initial policy, which `role` samples from; ValueError naming the role without one."""
        if context.frozen_engine is None:
            raise ValueError(f"{role} samples from the frozen initial policy: the context needs a frozen_engine "
                             "(train_rl makes one)")
        return context.frozen_engine

    def _generator_context(self, context) -> base.RolloutContext:
        """The context the generator samples in (step 2): M samples per prompt with the generator's token budget,
        from the frozen initial policy when the generator is not trained (External Evolving-RL: "a separate,
        unoptimized external model of the same scale"); ValueError at once without a frozen engine then."""
        config = self.config
        sampling = dataclasses.replace(context.sampling, n=config.generator_group_size,
                                       max_new_tokens=config.generator_max_new_tokens)
        engine = context.engine if config.train_generator else self._frozen_engine(
            context, "train_generator False (External Evolving-RL)")
        return dataclasses.replace(context, engine=engine, sampling=sampling)

    def _first_visits(self, questions, context) -> "_FirstVisits":
        """base_rubric generated: the step's questions without a written base rubric, each with the prompt index of
        its first draw in the step, whose group writes it (`_written_base_rubric`); none for base_rubric task.
        ValueError at once when some are to be written and the context has no frozen engine."""
        first = {}
        if self.config.base_rubric == "generated":
            for p, question in enumerate(questions):
                if question not in self.written_base_rubrics:
                    first.setdefault(question, p)
        if first:
            self._frozen_engine(context, "base_rubric generated")
        return _FirstVisits(first)

    async def _question_steps(self, examples, questions, history, visits, generator_context, judge, context, step,
                              p: int, samples: list, texts: list[str]) -> "_QuestionSteps":
        """Steps 1-4 for question p once its reasoner group (`samples`, `texts`) is sampled (`sample_and_follow`'s
        follow-up): its base rubric (`_base_rubric`), C_hist = that + `history[p]` (the pool as it was before any
        question's follow-up), its M generator rollouts (`_generate`), parsed and meta-verified (`_propose`), and
        its responses graded against the base rubric, the pool and every verified proposal (`judge`, the context
        judge's `unrecorded`; K = this rubric's length, `experience` widens it to the step's and records)."""
        task = context.task
        example = examples[p]
        shown = self._shown_responses(texts, context)
        base_rubric, written = await self._base_rubric(examples, questions, visits, p, shown, context, step)
        existing = base_rubric + history[p]
        generator = await self._generate(example, shown, existing, generator_context, step, p)
        parsed, verified, parse_failures, rejected = await self._propose(example, generator.texts, existing, context)
        rubric = Rubric(criteria=existing + tuple(c for batch in verified for c in batch))
        conversation = tuple(task.prompt(example))
        requests = [JudgeRequest(question=questions[p], response=text, rubric=rubric, reference=task.reference(example),
                                 num_steps=len(split_steps(text)), conversation=conversation) for text in texts]
        verdicts = await base.judge_group(judge, requests, samples, len(rubric.criteria))
        return _QuestionSteps(base_rubric=base_rubric, written=written, generator=generator, parsed=parsed,
                              verified=verified, parse_failures=parse_failures, rejected=rejected, rubric=rubric,
                              requests=requests, verdicts=verdicts)

    async def _base_rubric(self, examples, questions, visits, p, shown, context, step
                           ) -> tuple[tuple[Criterion, ...], Optional[Any]]:
        """Question p's base rubric (S_base's, and the head of C_hist), and the parse of the one its group wrote
        (else None). base_rubric task: the task's rubric. base_rubric generated: the rubric the frozen initial
        policy wrote at the question's first visit (`_written_base_rubric`), written in this step by the group of
        the question's first draw in it, which the question's later draws in the step await; an unparsable one is
        the empty rubric this step (`_base_rubrics` counts it and leaves it unwritten)."""
        if self.config.base_rubric == "task":
            return context.task.rubric(examples[p]).criteria, None
        question = questions[p]
        if question in self.written_base_rubrics:
            return self.written_base_rubrics[question], None
        written = visits.result(question)
        if visits.first[question] == p:
            try:
                written.set_result(await self._written_base_rubric(examples[p], shown, context, step, p))
            except BaseException:
                written.cancel()
                raise
            result = written.result()
            return (result.rubric.criteria if result.ok else ()), result
        result = await asyncio.shield(written)
        return (result.rubric.criteria if result.ok else ()), None

    async def _written_base_rubric(self, example, shown, context, step, p):
        """base_rubric generated, at a question's first visit: one sample (stream 2, seeded by its group p,
        `asample_group`) of the frozen initial policy on the generator prompt (`generator_io`) with the question's
        shown responses and no existing criteria, parsed (the paper gives no prompt for its base rubrics: Table
        5's, which asks for what separates the responses, so without responses it would rightly answer [])."""
        config = self.config
        prompt, parse = generator_io(context.task, config)
        sampling = dataclasses.replace(context.sampling, n=1, max_new_tokens=config.generator_max_new_tokens)
        frozen = dataclasses.replace(context, engine=self._frozen_engine(context, "base_rubric generated"),
                                     sampling=sampling)
        written = await base.asample_group([prompt(example, shown, ())], frozen, step, stream=2, group=p)
        return parse(written.texts[0])

    def _base_rubrics(self, questions, visits, groups) -> tuple[list[tuple[Criterion, ...]], dict]:
        """Each question's base rubric (its group's) and their metrics, once every group is in; with base_rubric
        generated the rubrics written this step are kept (in the order of their questions' first draws, so the
        checkpointed order does not depend on which group finished first); a parse failure is counted
        ("evorubric/base_rubric_failed/<reason>") and tried again at the question's next visit."""
        base_rubrics = [g.base_rubric for g in groups]
        if self.config.base_rubric == "task":
            return base_rubrics, {}
        failures = collections.Counter()
        for question, p in visits.first.items():
            result = groups[p].written
            if result.ok:
                self.written_base_rubrics[question] = result.rubric.criteria
            else:
                failures[result.reason] += 1
        metrics = {"evorubric/base_rubrics_written": float(len(visits.first) - sum(failures.values())),
                   "evorubric/base_rubric_questions": float(len(self.written_base_rubrics))}
        metrics.update({f"evorubric/base_rubric_failed/{reason}": float(n) for reason, n in sorted(failures.items())})
        return base_rubrics, metrics

    async def _generate(self, example, shown, existing, generator_context, step, p) -> base.Rollouts:
        """Step 2's rollouts of question p: M samples of one prompt showing the question, its shown responses
        (`_shown_responses`) and the existing criteria (C_hist), in the generator's context (`_generator_context`),
        seeded by the question's group (`asample_group`, stream 1)."""
        prompt, _ = generator_io(generator_context.task, self.config)
        return await base.asample_group([prompt(example, shown, existing)], generator_context, step, stream=1,
                                        group=p)

    async def _propose(self, example, texts, existing, context):
        """Steps 2-3 for one question: each of its M generator outputs parsed (`generator_io`), each parsed
        criterion meta-verified (`_meta_verdicts`); without the meta-verifier every parsed criterion counts as
        verified. (parsed R_m, None where the output did not parse; verified R~_m; parse failures by reason;
        the meta-verifier's INVALID categories counted.)"""
        _, parse = generator_io(context.task, self.config)
        results = [parse(text) for text in texts]
        parsed = [r.rubric.criteria if r.ok else None for r in results]
        verdicts = await self._meta_verdicts(example, parsed, existing, context)
        verified = [tuple(c for c, v in zip(batch or (), verdicts.get(m, ())) if v is None)
                    for m, batch in enumerate(parsed)]
        return (parsed, verified, collections.Counter(r.reason for r in results if not r.ok),
                collections.Counter(v for vs in verdicts.values() for v in vs if v is not None))

    async def _meta_verdicts(self, example, parsed, existing, context) -> dict[int, tuple[Optional[str], ...]]:
        """Step 3 for one question: {m: per criterion of the parsed R_m, None (VALID) or its INVALID category},
        against the question's existing criteria (base rubric and pool); all None without the meta-verifier. The
        LLM meta-verifier gets every non-empty proposal of the question in one awaited call (`averify`: its
        requests run concurrently; a criterion it could not judge is rejected as META_VERIFIER_FAILED); the
        task's `meta_verify` is asked once per proposal."""
        audited = [m for m, batch in enumerate(parsed) if batch]
        if not self.config.meta_verifier:
            return {m: (None,) * len(parsed[m]) for m in audited}
        if not audited:
            answers = []
        elif context.meta_verifier is not None:
            answers = await context.meta_verifier.averify([
                MetaVerifyRequest(context.task.question(example), parsed[m], existing) for m in audited])
        else:
            answers = [context.task.meta_verify(example, parsed[m], existing) for m in audited]
        for m, answer in zip(audited, answers):
            if len(answer) != len(parsed[m]):
                raise ValueError(f"the meta-verifier gave {len(answer)} verdicts for {len(parsed[m])} criteria")
        return {m: tuple(answer) for m, answer in zip(audited, answers)}

    def _score_matrix(self, proposals, columns, verdicts, num_responses):
        """Step 4's verdicts as the score matrix [P, M, K, N], s = points when met (partial credit scales them),
        with the proposed and verified masks [P, M, K]. The verified criteria of R_m take its first slots (their
        order in R~_m) and the rejected ones the next: every function downstream is order-free within R_m."""
        config = self.config
        shape = (len(proposals.parsed), config.generator_group_size, config.max_proposed)
        scores = np.zeros(shape + (num_responses,), np.float32)
        proposed, verified = np.zeros(shape, bool), np.zeros(shape, bool)
        for p, batches in enumerate(proposals.verified):
            rows = slice(p * num_responses, (p + 1) * num_responses)
            for m, batch in enumerate(batches):
                proposed[p, m, :len(proposals.parsed[p][m] or ())] = True
                verified[p, m, :len(batch)] = True
                for k, criterion in enumerate(batch):
                    scores[p, m, k] = criterion.weight * verdicts.satisfied_bk[rows, columns[p, m, k]]
        return scores, proposed, verified

    def generator_reward(self, proposals: "_Proposals", terms: GeneratorTerms, generator: base.Rollouts,
                         tokenizer: Any) -> tuple[np.ndarray, dict]:
        """Step 7: eq 3 per generator rollout [P * M] float32, from the step's proposals (parsed and verified,
        steps 2-3), their verification terms (steps 5-6) and the generator's rollouts (their rubric text's tokens,
        p_len), with the ablated terms left out; an unparsable proposal earns parse_failure_reward - p_len. Also
        returns each term [P * M] and the rubric text lengths (for the metrics)."""
        config = self.config
        count = np.array([len(batch or ()) for batches in proposals.parsed for batch in batches], np.float32)
        lengths = np.array([rubric_text_tokens(tokenizer, text) for text in generator.texts], np.float32)
        parsed = np.array([batch is not None for batches in proposals.parsed for batch in batches])
        penalties = {
            "count_penalty": np.asarray(rewards.excess_penalty(count, budget=config.count_budget,
                                                               coef=config.count_coef)),
            "length_penalty": np.asarray(rewards.excess_penalty(lengths, budget=config.generator_length_budget,
                                                                coef=config.generator_length_coef)),
        }
        quality = {
            "consensus_term": terms.consensus.reshape(-1) * config.peer_consensus,
            "meta_term": terms.meta.reshape(-1) * config.meta_verifier,
            "disc_term": terms.disc.reshape(-1) * config.discriminative,
        }
        reward = np.where(parsed, sum(quality.values()) - penalties["count_penalty"], config.parse_failure_reward)
        return reward - penalties["length_penalty"], {**quality, **penalties, "rubric_length_mean": lengths}

    def reasoner_reward(self, base_rubrics, scored_pool, pool_columns, verdicts, reasoner: base.Rollouts,
                        max_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Step 9: eq 4 per reasoner rollout [P * N] float32 under score_normalisation, with DAPO's overlong
        penalty over `max_length` tokens; and each source's own positive-points score [P * N] (S_base, S_pool, for
        the metrics). Per question p: its base rubric `base_rubrics[p]` and scored pool `scored_pool[p]`
        (criteria); `verdicts` step 4's [P * N, K], the base rubric's in the first columns, a pool criterion's in
        the column of its text in `pool_columns[p]`."""
        num_rows = len(reasoner.samples)
        base_items = _ItemArrays(num_rows, max([len(r) for r in base_rubrics] + [1]))
        pool_items = _ItemArrays(num_rows, max([len(c) for c in scored_pool] + [1]))
        for b, sample in enumerate(reasoner.samples):
            p = sample.prompt_index
            for k, criterion in enumerate(base_rubrics[p]):
                base_items.set(b, k, verdicts.satisfied_bk[b, k], criterion.weight)
            for j, criterion in enumerate(scored_pool[p]):
                pool_items.set(b, j, verdicts.satisfied_bk[b, pool_columns[p][criterion.text]], criterion.weight)
        lengths = jnp.asarray([len(s.output_ids) for s in reasoner.samples], jnp.float32)
        # DAPO's shaping adds R_length(L) <= 0, which is -p_len; without a buffer it is 0 (L <= max_new_tokens).
        length_penalty = -rewards.dapo_overlong_shaping(jnp.zeros_like(lengths), lengths, max_length=max_length,
                                                        buffer_length=self.config.overlong_buffer,
                                                        factor=self.config.overlong_factor)
        reward_fn = (rubric_validity.evorubric_joint_reasoner_reward if self.config.score_normalisation == "joint"
                     else rubric_validity.evorubric_reasoner_reward)
        reward = reward_fn(*base_items.arrays(), *pool_items.arrays(), length_penalty)
        base_score = rewards.positive_points_score(*base_items.arrays())
        pool_score = rewards.positive_points_score(*pool_items.arrays())
        return np.asarray(reward), np.asarray(base_score), np.asarray(pool_score)

    def advantage(self, reward_b: np.ndarray, group_ids: np.ndarray, role_ids: np.ndarray,
                  valid_b: np.ndarray) -> np.ndarray:
        """Step 10: [B] advantages of both roles' rows from their rewards [B], group ids [B] (a question's
        reasoner rows and its generator rows are different groups) and role ids [B]: GRPO within each group,
        computed for each role on that role's valid rows only (core.roles), 0 on the others."""
        reward_b, group_ids, role_ids = jnp.asarray(reward_b), jnp.asarray(group_ids), jnp.asarray(role_ids)
        by_role = jnp.stack([
            advantages.grpo_advantages(reward_b, group_ids, roles.role_mask(role_ids, role, jnp.asarray(valid_b)),
                                       std_ddof=self.config.std_ddof, eps=self.config.eps)
            for role in (REASONER, GENERATOR)])
        return np.asarray(roles.select_by_role(role_ids, by_role))

    @staticmethod
    def _with_advantages(batch, advantage_b, valid_b):
        """A role's packed rows with their advantages on the response tokens (rows not in `valid_b` masked)."""
        batch = dict(batch)
        if valid_b is not None:
            batch["response_mask_bt"] = batch["response_mask_bt"] & valid_b[:, None]
        batch["advantages_bt"] = np.asarray(advantages.broadcast_to_tokens(
            jnp.asarray(advantage_b), jnp.asarray(batch["response_mask_bt"])))
        return batch

    def _evolution_metrics(self, proposals, terms, verified_mask, archived) -> dict[str, float]:
        """The generator's format rate and parse failures by reason; the meta-verifier's rejections (overall and
        by category, fractions of the proposed criteria); the pruned fraction (of the verified criteria); the mean
        consensus rho over the proposals whose rho is defined (R^_m and a peer's R^ non-empty); the pool. A
        fraction of nothing is left out (`base.summary_stats`' convention)."""
        outputs = [batch for batches in proposals.parsed for batch in batches]
        parsed = [batch for batch in outputs if batch is not None]
        num_proposed = sum(len(batch) for batch in parsed)
        num_verified = int(verified_mask.sum())
        metrics = {
            "evorubric/generator_format_rate": len(parsed) / len(outputs),
            "evorubric/archived": float(sum(len(a) for a in archived)),
            "evorubric/pool_size": float(len(self.pool)),
            "evorubric/pool_questions": float(self.pool.num_questions),
        }
        metrics.update({f"evorubric/parse_failed/{reason}": float(n)
                        for reason, n in sorted(proposals.parse_failures.items())})
        if parsed:
            metrics["evorubric/empty_proposal_rate"] = sum(not batch for batch in parsed) / len(parsed)
            metrics["evorubric/proposed_mean"] = num_proposed / len(parsed)
        if num_proposed and self.config.meta_verifier:
            metrics["evorubric/meta_rejected_fraction"] = sum(proposals.rejected.values()) / num_proposed
            metrics.update({f"evorubric/meta_rejected/{_metric_slug(category)}": n / num_proposed
                            for category, n in sorted(proposals.rejected.items())})
        if num_verified:
            metrics["evorubric/pruned_fraction"] = 1 - float(terms.kept.sum()) / num_verified
        has = np.asarray(terms.has_criteria)
        defined = has & (has.sum(axis=1, keepdims=True) - has > 0)
        if defined.any():
            metrics["evorubric/consensus_rho_mean"] = float(np.asarray(terms.rho)[defined].mean())
        return metrics


class _ItemArrays:
    """One source of eq 4 (the base rubric or the pool) as [B, K] verdicts, points and item mask."""

    def __init__(self, rows: int, width: int):
        self.satisfied = np.zeros((rows, width), np.float32)
        self.points = np.zeros((rows, width), np.float32)
        self.mask = np.zeros((rows, width), bool)

    def set(self, row: int, item: int, satisfied: float, points: float) -> None:
        self.satisfied[row, item], self.points[row, item], self.mask[row, item] = satisfied, points, True

    def arrays(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        return jnp.asarray(self.satisfied), jnp.asarray(self.points), jnp.asarray(self.mask)
