"""RLCER, "Reinforcing Chain-of-Thought Reasoning with Self-Evolving Rubrics" (rlcer.txt): one policy plays two
roles, a reasoner that answers and a rubricator that writes rubrics for the reasoner's CoTs. A CoT is rewarded by
the valid rubrics it meets, a rubric being valid when meeting it goes with right answers; the rubricator is
rewarded by how many of its rubrics are valid, so the rubrics evolve with the reasoner.

For each step (P questions, N = sampling.n reasoner rollouts each; section 4, Algorithm 1, Figure 4;
`reasoner_reward`, `rubricator_reward` and `advantage` are the recipe's methods a variant overrides):
  1. sample N reasoner rollouts (C_n, A_n) per question Q; steps 2-5     base.sample_and_follow (Task.prompt),
     run on each question as soon as its rollouts are sampled             question_work
  2. z_n = I(A, A_n), the task's verifier                                  Task.is_correct
  3. one rubricator rollout R_m ~ pi(. | Q, C_m) for each of the first     rubricator_io: the paper's prompt
     M of the question's N rollouts (M = N: one per reasoner rollout;      (Figure 9) or Task.rubricator_prompt;
     the rollouts are i.i.d., so the first M are a uniform subset)         base.asample_group (n = 1, stream 1,
                                                                           seeded per question)
  4. parse R_m into K_m rubrics tau_k = (c_k, s_k); a failure has no       rubricator_io: parsing.
     rubric and format reward 0 (eq 11; with the paper's format: also      parse_rlcer_rubricator (check_scores)
     max / min = the sums of the points and min <= current_score <         or Task.parse_generated_rubric
     (max + min) / 2, Appendix B)
  5. the verifier judges each rubricator's list R_m on each of the         question_requests, base.judge_group
     question's N rollouts: v_kn in {0, 1} (one request per (rollout,      (a call per question),
     list), N * M per question: the verifier was distilled on one list     question_judgements
     at a time; "pooled": one request per rollout with all K lists)
  6. tau_k valid iff corr(u_k, z) > alpha and std(v_k) > 0 over the        core.rubric_validity.
     question's rollouts (eq 7; Pearson; u_k = v_k for a reward rubric,    rlcer_sign_aware_validity
     1 - v_k for a penalty: penalty_validity below; a verdict whose
     call failed takes no part)
  7. reasoner: r_n = r_outcome (+1 / -1, eq 8) + r_cot (eq 6: min-max      reasoner_reward:
                                                                           core.rewards.rlcer_outcome_reward,
     normalised points of the question's valid rubrics that C_n meets)     core.rubric_validity.rlcer_cot_reward
     optional: DAPO's overlong penalty (Appendix A's "overlong buffer")    core.rewards.dapo_overlong_shaping
  8. rubricator: r_m = K_valid,m / K_m + format_m (eqs 10-12)              rubricator_reward:
                                                                           core.rubric_validity.rlcer_rubricator_reward
  9. advantages (section 4.5, Table 3), by `estimator`:
     "ppo_critic" (the paper's: PPO with a critic, critic lr 1e-5): each   core.value.last_token_rewards;
     row's reward on its last response token; the trainer's critic gives   training.rl (Algorithm.uses_critic,
     GAE advantages over both roles' rows (`critic` section of the run),   the run's critic section),
     whitened per role ("computed separately for each role", sections     core.advantages.
     4.1, 4.5; advantage_whitening)                                        whiten_tokens_by_group
     "grpo" (ablation; the paper calls GRPO unsuitable, after eq 13):      advantage: core.roles (role_mask,
                                                                           select_by_role),
     role-specific advantages, GRPO over each question's N reasoner        core.advantages.grpo_advantages,
     rollouts; the rubricator's rollouts each read another CoT, so no      core.roles.role_batch_advantages
     GRPO group of one context exists: normalised over all rubricator
     rollouts of the batch (reasoner_advantage, rubricator_advantage)
 10. one PPO-clip update over both roles' rows (eq 13, no KL)              base.concat_batches, base.policy_loss_fn

Ablations (section 5):
- reasoner_reward "cot_only": RQ1's "Rubric Only", r_n = r_cot without the outcome term (the outcome still decides
  which rubrics are valid); "random_cot_only": RQ1's control, r_n uniform in [0, 1), no rubric in the reward.
- rubricator_training "format_only": section 5.4's "w/o evolving", the rubricator rewarded by the format only
  (eq 11), its rubrics still generated and used; "frozen": the rubricator is not trained at all, its rows are left
  out of the update (rubrics still generated and used).

Conventions:
- Penalty rubrics (negative points): the verifier's v_k = 1 means the flaw is present (Figure 10). Eq 7 as
  written validates a rubric by corr(v_k, z), which makes a penalty rubric valid when its flaw comes with right
  answers: every useful penalty ("a step states a wrong result") is invalid, and every valid one lowers the CoT
  reward of right answers. penalty_validity "flaw_absent" (the default) validates a penalty rubric by
  corr(1 - v_k, z) = corr(sign(s_k) v_k, z): valid when its flaw comes with wrong answers, the reading in which
  "satisfying the rubric aligns with producing correct answers" (section 4.3) and every valid rubric's
  contribution to eq 6's score agrees with correctness. "as_written" follows the text (the CPU comparison of
  experiments/RESULTS.md ran under it: its rubricator learned to drop the "wrong result" penalty). The CoT
  reward (eq 6) uses v_k either way; "rlcer/corr_mean" reports the correlation that validity thresholds.
- Verifier calls: "per_list" (the default) asks the verifier about one rubricator's list per request (Figure 10's
  prompt takes one rubricator's list, and Appendix A's verifier was distilled on its responses), requests
  ordered (question, rollout, list); "pooled" asks once per rollout with the question's K rubrics in one list. A failed request makes the
  verdicts of its list (pooled: of every list) on that rollout unknown: they take no part in that rubric's
  correlation (eq 7 over the rollouts whose verdict is known) nor in that rollout's CoT reward (eq 6 min-max
  normalised over the valid rubrics it was judged on). A rollout none of whose requests succeeded is a failed
  judgement (on_judge_failure).
- Pooling: the CoT reward of a rollout uses the valid rubrics of all M rubricators of its question (Figure 4:
  "all the valid rubrics are collected"); a criterion two rubricators both wrote counts twice, as two rubrics.
- Judge failures: a failed judgement (above) takes no part in validity (its verdicts are unknown, not "unmet");
  on_judge_failure "zero_reward" gives it r_cot = 0 (its outcome term stays), "exclude" takes it out of its group
  and of the loss. A question without any parsed rubric has no valid rubric: r_cot = 0 for its rollouts.
- Rubricator format: rubricator_format "task" uses the task's rubricator prompt and parser (the CPU rubric world
  writes "+3 S1" lines and declares no score, so eq 11's current_score check has nothing to apply to there);
  "paper" uses Figure 9's prompt and `parsing.parse_rlcer_rubricator` with the score check: an output whose
  current_score is not below (max + min) / 2 fails the format ("inconsistent_scores"): format reward 0 and, as
  for any format failure, no rubric (the paper does not say whether such rubrics still count).
- Batch rows: the reasoner's P * N rows (prompt-major, N per question), then the rubricator's P * M rows
  (prompt-major, M per question), in one batch whose prompt region is the rubricator's wider one.
- Metrics: "reward/*", "advantage/*", "response/*", "outcome/accuracy" are the reasoner's (comparable with the
  other recipes); "rubricator/reward/*", "rubricator/advantage/*", "rubricator/length_mean" (the advantages under
  estimator "grpo"; with the critic the trainer logs "critic/*" over both roles' tokens); "rlcer/corr_mean"
  (mean corr(u_k, z), the correlation validity thresholds, over proposed rubrics where it is defined), "rlcer/valid_fraction" (eq 10 averaged
  over the parsed rubricator outputs), "rlcer/cot_reward_mean" (over judged reasoner rollouts),
  "rlcer/rubricator_format_rate", "rlcer/rubric_count_mean" (per parsed output), "rlcer/no_valid_rubric_fraction"
  (questions), "rlcer/proposed/<name>" (fraction of parsed outputs proposing a named criterion) and
  "rlcer/valid/<name>" (fraction of its proposals found valid), "rlcer/parse_failed/<reason>" (counts),
  "judge/failure_rate" and "judge/failed/<reason>" (over the verifier's requests, i.e. calls).
"""

import collections
import dataclasses
import functools
import types
from typing import Any, Callable, Literal, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rubric_jax.algorithms import base
from rubric_jax.algorithms.registry import register
from rubric_jax.core import advantages, rewards, roles, rubric_validity, value
from rubric_jax.inference.engine import Sample
from rubric_jax.judges.base import JudgeRequest, Verdicts
from rubric_jax.rubrics import parsing, prompts
from rubric_jax.rubrics.parsing import FailurePolicy, RubricParse
from rubric_jax.rubrics.schema import Rubric, rubric_arrays
from rubric_jax.rubrics.steps import split_steps

REASONER, RUBRICATOR = 0, 1
RUBRICATOR_STREAM, RANDOM_REWARD_STREAM = 1, 2  # sampling streams of one step (base.sample_groups)


@dataclasses.dataclass(frozen=True)
class RLCERConfig:
    """alpha: eq 7's correlation threshold (0.2 in the paper); max_items: the most rubrics one rubricator output
    may hold (a longer one is a format failure; the paper's prompt asks for 5-15); rubricators_per_question: M,
    None for one per reasoner rollout (the paper's); rubricator_max_new_tokens: the rubricator's length budget
    (None: the reasoner's); reasoner_reward / rubricator_training: the ablations (module docstring);
    estimator: step 9's "ppo_critic" (the paper's) or "grpo" (the ablation); under "grpo",
    reasoner_advantage / rubricator_advantage: "grpo" (per question) or "batch" (per role over the batch,
    `core.roles.role_batch_advantages`; unused under "ppo_critic"); under "ppo_critic", advantage_whitening: how the
    trainer whitens the GAE advantages (when the run's `critic.whiten_advantages`): "per_role" (the default: each
    role's over its own tokens, the paper's "advantages computed separately for each role", sections 4.1 and 4.5)
    or "joint" (over both roles' tokens together, verl's masked_whiten over the batch);
    on_judge_failure, penalty_validity, verifier_calls and
    rubricator_format: module docstring;
    overlong_buffer: DAPO's soft overlong penalty on the reasoner's reward, a ramp to -1 over the last
    overlong_buffer tokens of its max_new_tokens (0: off; the paper's Table 3: 4096 of 12288); std_ddof / eps:
    the "grpo" advantages' std (1: sample std) and epsilon. The policy loss defaults to the paper's (Table 3): PPO clip
    0.2, no KL."""

    policy_loss: base.PolicyLossConfig = base.PolicyLossConfig()
    alpha: float = 0.2
    max_items: int = 15
    rubricators_per_question: Optional[int] = None
    rubricator_max_new_tokens: Optional[int] = None
    reasoner_reward: Literal["outcome_and_cot", "cot_only", "random_cot_only"] = "outcome_and_cot"
    rubricator_training: Literal["evolving", "format_only", "frozen"] = "evolving"
    estimator: Literal["ppo_critic", "grpo"] = "ppo_critic"
    reasoner_advantage: Literal["grpo", "batch"] = "grpo"
    rubricator_advantage: Literal["batch", "grpo"] = "batch"
    advantage_whitening: Literal["per_role", "joint"] = "per_role"
    on_judge_failure: Literal["zero_reward", "exclude"] = "zero_reward"
    penalty_validity: Literal["flaw_absent", "as_written"] = "flaw_absent"
    verifier_calls: Literal["per_list", "pooled"] = "per_list"
    rubricator_format: Literal["task", "paper"] = "task"
    overlong_buffer: int = 0
    std_ddof: int = 1
    eps: float = 1e-6

    def __post_init__(self):
        if not -1 <= self.alpha < 1:
            raise ValueError(f"alpha must be in [-1, 1) (a correlation threshold), got {self.alpha}")
        if self.max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {self.max_items}")
        if self.rubricators_per_question is not None and self.rubricators_per_question < 1:
            raise ValueError(f"rubricators_per_question must be None or >= 1, got {self.rubricators_per_question}")
        if self.rubricator_max_new_tokens is not None and self.rubricator_max_new_tokens < 1:
            raise ValueError(f"rubricator_max_new_tokens must be None or >= 1, got {self.rubricator_max_new_tokens}")
        if self.overlong_buffer < 0:
            raise ValueError(f"overlong_buffer must be >= 0, got {self.overlong_buffer}")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof must be 0 or 1, got {self.std_ddof}")
        if not self.eps >= 0:
            raise ValueError(f"eps must be >= 0, got {self.eps}")


class RubricTable(NamedTuple):
    """The rubrics of P questions, M rubricator outputs each, laid out on a flat axis of K = M * max_items slots
    (slot m * max_items + j is rubric j of output m): `parses` [P * M], `mask_pk` (the slot holds a rubric),
    `points_pk` (its signed points), `names` [P][K] (criterion names, None for empty slots), `lists` [P * M]:
    each output's rubric (empty when it failed to parse), and `rubrics` [P]: each question's rubrics in slot
    order (the pooled verifier call's list: verdict column i is the i-th filled slot)."""

    parses: list[RubricParse]
    mask_pk: np.ndarray
    points_pk: np.ndarray
    names: list[list[Optional[str]]]
    lists: list[Rubric]
    rubrics: list[Rubric]
    max_items: int


def rubric_table(parses: Sequence[RubricParse], num_questions: int, max_items: int) -> RubricTable:
    """Step 4's rubrics as a RubricTable; `parses` are prompt-major (M consecutive outputs per question)."""
    per_question = len(parses) // num_questions
    parsed = [p.rubric if p.ok else Rubric() for p in parses]
    items = rubric_arrays(parsed, max_items)
    shape = (num_questions, per_question * max_items)
    names = [[None] * shape[1] for _ in range(num_questions)]
    rubrics = []
    for q in range(num_questions):
        criteria = []
        for m, rubric in enumerate(parsed[q * per_question:(q + 1) * per_question]):
            criteria.extend(rubric.criteria)
            for j, criterion in enumerate(rubric.criteria):
                names[q][m * max_items + j] = criterion.name
        template = next((r for r in parsed[q * per_question:(q + 1) * per_question] if r.criteria), Rubric())
        rubrics.append(dataclasses.replace(template, criteria=tuple(criteria)))
    return RubricTable(parses=list(parses), mask_pk=items.item_mask_bk.reshape(shape),
                       points_pk=items.item_weight_bk.reshape(shape), names=names, lists=parsed, rubrics=rubrics,
                       max_items=max_items)


class Judgements(NamedTuple):
    """Step 5's verdicts: v_pkn [P, K, N] (0 in empty slots and where the request failed), known_pkn (the verdict
    of slot k on rollout n came back from a request that did not fail), judged_pn [P, N] (some request about the
    rollout succeeded, or none was made: a question without rubrics asks nothing) and the verifier's Verdicts,
    one row per request (None when no question has a rubric); `requests` the requests sent and `request_rows`
    the reasoner row each is about (a rollout has one request per rubric list under "per_list")."""

    v_pkn: np.ndarray
    known_pkn: np.ndarray
    judged_pn: np.ndarray
    verdicts: Optional[Verdicts]
    requests: tuple[JudgeRequest, ...] = ()
    request_rows: tuple[int, ...] = ()


def question_requests(example: Any, texts: Sequence[str], table: RubricTable, calls: str, task: Any
                      ) -> tuple[list[JudgeRequest], list[tuple[int, np.ndarray]]]:
    """Step 5's requests about one question's N rollouts (`texts`), against its rubrics (`table` of that question
    alone): for each rollout in order, one request per parsed rubric list of the question ("per_list", in output
    order) or one request with the question's pooled list ("pooled"); with each request its target (the
    rollout's index n, the table slots its verdict columns fill)."""
    if calls == "pooled":
        lists = [(table.rubrics[0], np.flatnonzero(table.mask_pk[0]))]
    else:
        lists = [(rubric, m * table.max_items + np.arange(len(rubric.criteria)))
                 for m, rubric in enumerate(table.lists)]
    requests, targets = [], []
    for n, text in enumerate(texts):
        for rubric, slots in lists:
            if rubric.criteria:
                requests.append(JudgeRequest(question=task.question(example), response=text, rubric=rubric,
                                             reference=task.reference(example), num_steps=len(split_steps(text))))
                targets.append((n, slots))
    return requests, targets


class QuestionWork(NamedTuple):
    """Steps 2-5 on one question once its reasoner group is sampled (`RLCER.question_work`): the outcomes z_n [N],
    its M rubricator rollouts, their parses, and the verifier's requests (`question_requests`) with their targets
    and verdicts (None when no list has a rubric)."""

    correct_n: np.ndarray
    rubricator: base.Rollouts
    parses: list[RubricParse]
    requests: list[JudgeRequest]
    targets: list[tuple[int, np.ndarray]]
    verdicts: Optional[Verdicts]


def question_judgements(work: Sequence[QuestionWork], num_slots: int, num_rollouts: int) -> Judgements:
    """Step 5's Judgements of every question's work, questions in order: v_pkn, known_pkn and judged_pn filled
    from each request's verdict, and the verifier's Verdicts [requests, K] (K the widest request's, each
    question's widened to it), rows in request order."""
    v_pkn = np.zeros((len(work), num_slots, num_rollouts), np.float32)
    asked_pkn, known_pkn = np.zeros(v_pkn.shape, bool), np.zeros(v_pkn.shape, bool)
    for q, question in enumerate(work):
        for i, (n, slots) in enumerate(question.targets):
            v_pkn[q, slots, n] = question.verdicts.satisfied_bk[i, :len(slots)]
            asked_pkn[q, slots, n] = True
            known_pkn[q, slots, n] = not question.verdicts.failed_b[i]
    judged_pn = ~asked_pkn.any(axis=1) | known_pkn.any(axis=1)
    asked = [question for question in work if question.verdicts is not None]
    if not asked:
        return Judgements(v_pkn, known_pkn, judged_pn, None)
    width = max(len(slots) for question in asked for _, slots in question.targets)
    verdicts = Verdicts.concatenate([question.verdicts.widened(width) for question in asked])
    return Judgements(v_pkn, known_pkn, judged_pn, verdicts,
                      tuple(r for question in asked for r in question.requests),
                      tuple(q * num_rollouts + n for q, question in enumerate(work) for n, _ in question.targets))


def _recorded(found: Judgements, context: base.RolloutContext) -> Judgements:
    """`found`, its verifier calls recorded by the run's judge in request order (`Judge.record`)."""
    if found.verdicts is not None:
        context.judge.record(list(found.requests), found.verdicts)
    return found


class QuestionScores(NamedTuple):
    """Steps 6-7 per question: valid_pk (eq 7), corr_pk and corr_defined_pk (the correlation eq 7 thresholds,
    defined when both vary over the rollouts with known verdicts), cot_pn (eq 6 over the valid rubrics with known
    verdicts; 0 for a rollout with none)."""

    valid_pk: jax.Array
    corr_pk: jax.Array
    corr_defined_pk: jax.Array
    cot_pn: jax.Array


@functools.partial(jax.jit, static_argnames=("alpha", "flaw_absent"))
def question_scores(v_pkn: jax.Array, z_pn: jax.Array, known_pkn: jax.Array, mask_pk: jax.Array,
                    points_pk: jax.Array, *, alpha: float, flaw_absent: bool = True) -> QuestionScores:
    """Steps 6-7 of the module docstring for P questions at once (the core functions vmapped over questions);
    `flaw_absent`: validate penalty rubrics by the absence of their flaw (penalty_validity, module docstring)."""
    if flaw_absent:
        valid_pk = jax.vmap(functools.partial(rubric_validity.rlcer_sign_aware_validity, alpha=alpha))(
            v_pkn, z_pn, points_pk, mask_pk, known_pkn)
        u_pkn = jax.vmap(rubric_validity.rlcer_merit_indicator)(v_pkn, points_pk)
    else:
        valid_pk = jax.vmap(functools.partial(rubric_validity.rlcer_rubric_validity, alpha=alpha))(
            v_pkn, z_pn, mask_pk, known_pkn)
        u_pkn = v_pkn
    corr = jax.vmap(rubric_validity.masked_pearson)(u_pkn, z_pn, known_pkn)
    cot_pn = jax.vmap(rubric_validity.rlcer_cot_reward)(v_pkn, points_pk, valid_pk, known_pkn)
    return QuestionScores(valid_pk=valid_pk, corr_pk=corr.value, corr_defined_pk=corr.defined, cot_pn=cot_pn)


def role_advantages(reward_b: np.ndarray, role_ids: np.ndarray, group_ids: np.ndarray, valid_b: np.ndarray,
                    estimators: Sequence[str], *, std_ddof: int, eps: float) -> np.ndarray:
    """Step 9: each role's advantages with its estimator ("grpo": per group id; "batch": over the role's rows of
    the batch), computed on that role's valid rows and merged into one [B] array (0 on invalid rows)."""
    r, ids, groups = jnp.asarray(reward_b), jnp.asarray(role_ids), jnp.asarray(group_ids)
    by_role = []
    for role, estimator in enumerate(estimators):
        mask = roles.role_mask(ids, role, jnp.asarray(valid_b))
        if estimator == "grpo":
            by_role.append(advantages.grpo_advantages(r, groups, mask, std_ddof=std_ddof, eps=eps))
        else:
            by_role.append(roles.role_batch_advantages(r, ids, mask, num_roles=len(estimators), std_ddof=std_ddof,
                                                       eps=eps))
    return np.asarray(roles.select_by_role(ids, jnp.stack(by_role)))


def reasoner_rewards(correct_b: np.ndarray, cot_b: np.ndarray, mode: str, rng: np.random.Generator) -> np.ndarray:
    """Step 7 under `mode` (RLCERConfig.reasoner_reward): r_outcome + r_cot (eq 9), r_cot alone (RQ1's Rubric
    Only) or a uniform draw in [0, 1) (RQ1's random control), [B] float32."""
    if mode == "random_cot_only":
        return rng.random(len(correct_b)).astype(np.float32)
    if mode == "cot_only":
        return cot_b.astype(np.float32)
    return np.asarray(rewards.rlcer_outcome_reward(jnp.asarray(correct_b))) + cot_b.astype(np.float32)


def rubricator_rewards(valid_mk: np.ndarray, mask_mk: np.ndarray, format_m: np.ndarray, mode: str) -> np.ndarray:
    """Step 8 under `mode` (RLCERConfig.rubricator_training): the format reward alone (eq 11) for "format_only"
    (section 5.4's w/o evolving), else K_valid / K + format (eq 12; "frozen" reports it without training on it),
    [M] float32."""
    if mode == "format_only":
        return format_m.astype(np.float32)
    return np.asarray(rubric_validity.rlcer_rubricator_reward(
        jnp.asarray(valid_mk), jnp.asarray(mask_mk), jnp.asarray(format_m)))


def rlcer_metrics(table: RubricTable, scores: QuestionScores, judged_pn: np.ndarray,
                   verdicts: Optional[Verdicts]) -> dict[str, float]:
    """The "rlcer/*" and "judge/*" metrics of the module docstring."""
    num_outputs = len(table.parses)
    format_m = np.array([p.ok for p in table.parses], bool)
    mask_mk = table.mask_pk.reshape(num_outputs, -1)
    valid_pk, corr_pk, defined_pk = (np.asarray(a) for a in (scores.valid_pk, scores.corr_pk, scores.corr_defined_pk))
    fraction_m = np.asarray(rubric_validity.rlcer_valid_fraction(jnp.asarray(valid_pk.reshape(mask_mk.shape)),
                                                                 jnp.asarray(mask_mk)))
    metrics = {
        "rlcer/rubricator_format_rate": float(format_m.mean()),
        "rlcer/no_valid_rubric_fraction": float(np.mean(~valid_pk.any(axis=1))),
        "judge/failure_rate": 0.0 if verdicts is None else float(np.mean(verdicts.failed_b)),
    }
    if judged_pn.any():
        metrics["rlcer/cot_reward_mean"] = float(np.asarray(scores.cot_pn)[judged_pn].mean())
    if format_m.any():
        metrics["rlcer/rubric_count_mean"] = float(mask_mk.sum(axis=1)[format_m].mean())
        metrics["rlcer/valid_fraction"] = float(fraction_m[format_m].mean())
    defined = table.mask_pk & defined_pk
    if defined.any():
        metrics["rlcer/corr_mean"] = float(corr_pk[defined].mean())
    proposed, valid = collections.Counter(), collections.Counter()
    for q, names in enumerate(table.names):
        for k, name in enumerate(names):
            if name is not None:
                proposed[name] += 1
                valid[name] += int(valid_pk[q, k])
    metrics.update({f"rlcer/proposed/{name}": count / int(format_m.sum()) for name, count in proposed.items()})
    metrics.update({f"rlcer/valid/{name}": valid[name] / count for name, count in proposed.items()})
    failures = collections.Counter(p.reason for p in table.parses if not p.ok)
    metrics.update({f"rlcer/parse_failed/{reason}": float(count) for reason, count in failures.items()})
    if verdicts is not None:
        metrics.update({f"judge/failed/{reason}": float(count) for reason, count in verdicts.failure_counts().items()})
    return metrics


def rubricator_io(task: Any, config: RLCERConfig) -> tuple[Callable, Callable]:
    """Steps 3-4's (prompt(example, cot) -> messages, parse(text) -> RubricParse) under config.rubricator_format:
    Figure 9's prompt with `parsing.parse_rlcer_rubricator` (its score check on: eq 11 with Appendix B's
    current_score < (max + min) / 2), or the task's own."""
    if config.rubricator_format == "paper":
        return (lambda example, cot: prompts.rubricator_prompt(task.question(example), cot),
                functools.partial(parsing.parse_rlcer_rubricator, max_items=config.max_items, check_scores=True))
    return task.rubricator_prompt, functools.partial(task.parse_generated_rubric, max_items=config.max_items)


def _trained_batch(rollouts: base.Rollouts, row_b: np.ndarray, trained_b: np.ndarray, critic: bool,
                   whiten_group: int) -> dict[str, np.ndarray]:
    """The rollouts' learner arrays with the untrained rows' response masks off and, per row, the reward on its last
    token ("token_rewards_bt", for the critic, with "whiten_group_b": the rows' whitening group) or the advantage on
    every token ("advantages_bt")."""
    batch = dict(rollouts.batch)
    mask_bt = jnp.asarray(batch["response_mask_bt"] & trained_b[:, None])
    batch["response_mask_bt"] = np.asarray(mask_bt)
    if critic:
        batch["token_rewards_bt"] = np.asarray(value.last_token_rewards(jnp.asarray(row_b), mask_bt))
        batch["whiten_group_b"] = np.full(len(row_b), whiten_group, np.int32)
    else:
        batch["advantages_bt"] = np.asarray(advantages.broadcast_to_tokens(jnp.asarray(row_b), mask_bt))
    return batch


@register("rlcer")
class RLCER(base.Algorithm):
    config_class = RLCERConfig
    console_metrics = ("rlcer/valid_fraction", "rlcer/corr_mean", "rubricator/reward/mean")
    plot_panels = types.MappingProxyType({
        "rlcer/rubric_validity": ("rlcer/valid_fraction", "rlcer/no_valid_rubric_fraction",
                                  "rlcer/rubricator_format_rate"),
        "rlcer/rewards": ("reward/mean", "rlcer/cot_reward_mean", "rubricator/reward/mean"),
    })

    @property
    def policy_loss(self) -> base.PolicyLossConfig:
        return self.config.policy_loss

    @property
    def uses_critic(self) -> bool:
        return self.config.estimator == "ppo_critic"

    def learner_rows(self, shape: base.StepShape) -> dict[str, base.RoleRows]:
        """The reasoner's rows, then (unless frozen) M rubricator rows per question, whose prompts hold a CoT:
        at most the prompt cap, else the question's prompt plus a whole response."""
        rows = {"reasoner": super().learner_rows(shape)["policy"]}
        if self.config.rubricator_training != "frozen":
            per_question = self.config.rubricators_per_question or shape.group_size
            prompt = shape.max_prompt_tokens or shape.prompt_tokens + shape.response_tokens
            rows["rubricator"] = base.RoleRows(shape.prompts * per_question, prompt,
                                               self.config.rubricator_max_new_tokens or shape.response_tokens)
        return rows

    def role_prompts(self, task: Any, example: Any, placeholder: str) -> dict[str, list[dict[str, str]]]:
        rubricator_prompt, _ = rubricator_io(task, self.config)
        return {"reasoner": task.prompt(example), "rubricator": rubricator_prompt(example, placeholder)}

    def reasoner_reward(self, correct_b: np.ndarray, cot_b: np.ndarray, lengths_b: np.ndarray,
                        context: base.RolloutContext, step: int) -> np.ndarray:
        """Step 7: the reasoner's reward [P * N] float32 from its outcomes z [P * N] bool, its CoT rewards r_cot
        [P * N] (eq 6 over the valid rubrics) and its response lengths in tokens [P * N] (DAPO's overlong penalty
        with overlong_buffer), under reasoner_reward (`reasoner_rewards`); RQ1's random control draws from the
        run's seed and `step`."""
        config = self.config
        reward_b = reasoner_rewards(correct_b, cot_b, config.reasoner_reward,
                                    np.random.default_rng([context.seed, step, RANDOM_REWARD_STREAM]))
        if config.overlong_buffer:
            reward_b = np.asarray(rewards.dapo_overlong_shaping(
                jnp.asarray(reward_b), jnp.asarray(lengths_b), max_length=context.sampling.max_new_tokens,
                buffer_length=config.overlong_buffer))
        return reward_b

    def rubricator_reward(self, valid_mk: np.ndarray, mask_mk: np.ndarray, format_m: np.ndarray) -> np.ndarray:
        """Step 8: each rubricator output's reward [M] float32 from its rubrics' validity and existence [M, K] and
        its format [M] bool, under rubricator_training (`rubricator_rewards`)."""
        return rubricator_rewards(valid_mk, mask_mk, format_m, self.config.rubricator_training)

    def advantage(self, reward_b: np.ndarray, role_ids: np.ndarray, group_ids: np.ndarray,
                  valid_b: np.ndarray) -> np.ndarray:
        """Step 9 under estimator "grpo": [B] advantages of both roles' rows (rewards [B], role ids [B], group ids
        [B]: a reasoner row's question), each role by its estimator over its valid rows (`role_advantages`), 0 on
        the others. Unused with the critic, whose advantages the trainer computes."""
        config = self.config
        return role_advantages(reward_b, role_ids, group_ids, valid_b,
                               (config.reasoner_advantage, config.rubricator_advantage), std_ddof=config.std_ddof,
                               eps=config.eps)

    async def question_work(self, example: Any, question: int, samples: Sequence[Sample], texts: Sequence[str],
                            context: base.RolloutContext, step: int) -> QuestionWork:
        """Steps 2-5 on question `question` (its reasoner group's samples and texts), run as soon as the group is
        sampled (`base.sample_and_follow`): z_n; one rubricator rollout on each of the first M CoTs (stream
        RUBRICATOR_STREAM, seeded by the question's index: `base.asample_group`), parsed; the verifier's
        verdicts of the question's requests (`question_requests`; the judge's `unrecorded`: `experience`
        records them, in order)."""
        config, task = self.config, context.task
        correct_n = np.array([task.is_correct(text, example) for text in texts], bool)
        per_question = config.rubricators_per_question or len(samples)
        sampling = dataclasses.replace(context.sampling, n=1, max_new_tokens=(
            config.rubricator_max_new_tokens or context.sampling.max_new_tokens))
        prompt_fn, parse_fn = rubricator_io(task, config)
        rubricator = await base.asample_group([prompt_fn(example, text) for text in texts[:per_question]],
                                              dataclasses.replace(context, sampling=sampling), step,
                                              stream=RUBRICATOR_STREAM, group=question)
        parses = [parse_fn(text) for text in rubricator.texts]
        table = rubric_table(parses, 1, config.max_items)
        requests, targets = question_requests(example, texts, table, config.verifier_calls, task)
        verdicts = None
        if requests:
            verdicts = await base.judge_group(context.judge.unrecorded, requests, [samples[n] for n, _ in targets],
                                              max(len(slots) for _, slots in targets))
        return QuestionWork(correct_n, rubricator, parses, requests, targets, verdicts)

    def experience(self, examples: Sequence[Any], context: base.RolloutContext, step: int) -> base.Experience:
        config, task = self.config, context.task
        num_questions, num_rollouts = len(examples), context.sampling.n
        per_question = config.rubricators_per_question or num_rollouts
        if per_question > num_rollouts:
            raise ValueError(f"rubricators_per_question ({per_question}) exceeds the reasoner's group size "
                             f"({num_rollouts}): each rubricator reads a distinct reasoner rollout")
        if config.overlong_buffer >= context.sampling.max_new_tokens:
            raise ValueError(f"overlong_buffer ({config.overlong_buffer}) must be shorter than the reasoner's "
                             f"max_new_tokens ({context.sampling.max_new_tokens})")
        # 1-5: the reasoner's rollouts; for each question as its group is sampled, the outcomes, its rubricator
        # rollouts, parsed, and the verifier's verdicts (`question_work`).
        reasoner, work = base.sample_and_follow(
            [task.prompt(e) for e in examples], context,
            step, lambda q, samples, texts: self.question_work(examples[q], q, samples, texts, context, step))
        correct_b = np.concatenate([question.correct_n for question in work])
        read = [b for b in range(len(reasoner.samples)) if b % num_rollouts < per_question]
        rubricator = base.concat_rollouts([question.rubricator for question in work], context.pad_id)
        table = rubric_table([p for question in work for p in question.parses], num_questions, config.max_items)
        judgements = _recorded(question_judgements(work, table.mask_pk.shape[1], num_rollouts), context)
        judged_pn = judgements.judged_pn
        scores = question_scores(jnp.asarray(judgements.v_pkn),
                                 jnp.asarray(correct_b.reshape(num_questions, num_rollouts)),
                                 jnp.asarray(judgements.known_pkn), jnp.asarray(table.mask_pk),
                                 jnp.asarray(table.points_pk), alpha=config.alpha,
                                 flaw_absent=config.penalty_validity == "flaw_absent")
        lengths_b = np.array([len(s.output_ids) for s in reasoner.samples], np.int32)
        reasoner_reward_b = self.reasoner_reward(correct_b, np.asarray(scores.cot_pn).reshape(-1), lengths_b,
                                                 context, step)
        # 8: the rubricator's reward.
        format_m = np.array([p.ok for p in table.parses], bool)
        rubricator_reward_m = self.rubricator_reward(
            np.asarray(scores.valid_pk).reshape(len(read), config.max_items),
            table.mask_pk.reshape(len(read), config.max_items), format_m)
        # 9: the critic's rewards, or role-specific advantages over both roles' rows.
        reasoner_trained_b = np.ones(len(correct_b), bool)
        if config.on_judge_failure == FailurePolicy.EXCLUDE.value:
            reasoner_trained_b = judged_pn.reshape(-1)
        rubricator_trained_m = np.full(len(read), config.rubricator_training != "frozen")
        if self.uses_critic:
            reasoner_row_b, rubricator_row_m, metrics = reasoner_reward_b, rubricator_reward_m, {}
        else:
            advantage_b = self.advantage(
                np.concatenate([reasoner_reward_b, rubricator_reward_m]),
                np.repeat([REASONER, RUBRICATOR], [len(correct_b), len(read)]),
                np.concatenate([reasoner.group_ids, np.asarray(read) // num_rollouts]),
                np.concatenate([reasoner_trained_b, rubricator_trained_m]))
            reasoner_row_b, rubricator_row_m = advantage_b[:len(correct_b)], advantage_b[len(correct_b):]
            metrics = {**base.summary_stats("advantage", reasoner_row_b, reasoner_trained_b),
                       **base.summary_stats("rubricator/advantage", rubricator_row_m, rubricator_trained_m)}
        # 10: one batch over both roles (the frozen rubricator's rows left out); with the critic, each role its own
        # whitening group unless advantage_whitening is joint.
        per_role = config.advantage_whitening == "per_role"
        parts = [(_trained_batch(reasoner, reasoner_row_b, reasoner_trained_b, self.uses_critic, REASONER),
                  reasoner.prompt_width)]
        if config.rubricator_training != "frozen":
            parts.append((_trained_batch(rubricator, rubricator_row_m, rubricator_trained_m, self.uses_critic,
                                         RUBRICATOR if per_role else REASONER), rubricator.prompt_width))
        batch, prompt_width = base.concat_batches(parts, context.pad_id)
        rubricator_lengths = np.array([len(s.output_ids) for s in rubricator.samples], np.float64)
        metrics = {
            **metrics,
            **base.summary_stats("reward", reasoner_reward_b),
            **base.summary_stats("rubricator/reward", rubricator_reward_m),
            **base.rollout_metrics(reasoner, correct_b, task),
            **rlcer_metrics(table, scores, judged_pn, judgements.verdicts),
            "rubricator/length_mean": float(rubricator_lengths.mean()),
            "rubricator/truncated_fraction": float(np.mean([s.finish_reason == "length"
                                                            for s in rubricator.samples])),
        }
        # The reasoner's values for its verifier calls (the critic's advantages come later, from the trainer).
        trained_advantage_b = None if self.uses_critic else np.where(reasoner_trained_b, reasoner_row_b, 0.0)
        values = base.recipe_values(judgements.requests, reasoner_reward_b, trained_advantage_b, reasoner.group_ids,
                                    judgements.request_rows)
        return base.Experience(batch=batch, prompt_width=prompt_width, metrics=metrics, recipe_values=values)
