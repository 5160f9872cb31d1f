"""RGR-GRPO, "Reward and Guidance through Rubrics" (rgr_grpo.txt): a rubric reward of factual and process
criteria, gated on the factual ones, and rubric-guided off-policy exploration: when no on-policy rollout of a
group meets every criterion, the policy refines the group's best rollout on the criteria it failed, and the
refinement joins the group as its off-policy rollout, trained with a shaped, unclipped objective.

For each step (G = sampling.n rollouts per prompt; Algorithm 1 of Appendix B; `rubric_reward`, `reward` and
`advantage` are the recipe's methods a variant overrides):
  1. sample G responses per prompt: o_1..o_{G-1} on-policy, the G-th     base.sample_and_follow; steps 2-5
     held in reserve                                                     on each group as soon as it is
                                                                         sampled (group_work)
  2. judge each against its rubric of factual and process criteria       base.rollout_request, judge_group
  3. r_i = 1 if every factual criterion is met, else                     rubric_reward:
     sum_k w_k s_k / sum_k w_k over all criteria (eqs 4-5)               core.rewards.rgr_factual_gated_reward
  4. exploration assessment of o_1..o_{G-1}: o_best = argmax r (eq 7),   core.rubric_validity.rgr_exploration_assessment
     ties at r = 1 going to a rollout meeting every criterion;           (`assessment_key`)
     solved iff o_best meets every criterion, C_failed its unmet ones (eq 8)
  5. solved group: o_G is the reserved on-policy sample (plain GRPO)
     unsolved group: o_G ~ pi_old(. | q, o_best, C_failed) (eq 9), one     base.asample_group(stream=1, seeded
     sample, judged and rewarded as in 2-3; it replaces the reserved      by the group) of `refinement_prompt`
     sample and is trained as a response to the original prompt q
  6. length penalty r_i - lambda (L_i - L*) (section 3)                  reward: core.rewards.rgr_length_shaping
  7. A_i = r_i - mean_g r: eq 1 without the std, which the paper drops   advantage:
     (section 3, after Dr.GRPO); scale_by_std restores eq 1               core.advantages.dr_grpo_advantages
                                                                         (grpo_advantages, sample std)
  8. mixed-policy loss (eq 10): on-policy tokens -r A, no clip; the      core.losses.rgr_mixed_policy_loss
     refinement's tokens -f(p) A, f(p) = p / (p + gamma) (eq 11), f(p)   core.losses.clip_off_policy_weight
     optionally clipped to [off_min_clip, off_max_clip] (LUFFY's clips,  (off by default)
     not in the paper); no KL;
     summed over each response's tokens and averaged over responses
     (eq 10's 1/G sum_i sum_t: seq_mean_token_sum); minus               core.losses.subtract_entropy_bonus
     entropy_coeff (section 3: 0.01) times the token mean of the         core.aggregation.token_mean_weights
     entropy over the batch's response tokens (LUFFY's masked_mean;
     entropy_aggregation "as_loss": aggregated like the loss, as
     verl's agg_loss with the loss's mode)

The paper's ablations (Table 2) are switches: refine=False is Rubric-GRPO (every rollout on-policy, the rest
unchanged); exploration_assessment=False refines every group, solved or not ("w/o EA"); shaping=False trains o_G
with the on-policy term -r A, r its ratio to pi_old under q (eq 10 with f the identity, "w/o Shaping");
criteria="factual" keeps only the factual criteria, for the reward, the assessment and the refinement
("Fact-Only Rubrics").

Judge failures: a failed rollout's rubric reward is 0 (FailurePolicy ZERO_REWARD) or it leaves its group and
the loss (EXCLUDE); either way it never becomes o_best, and a group with no judged on-policy rollout is not
refined. An empty rubric is solved (nothing to refine on) and rewards 0. The length penalty applies to every
response, judged or not.

Metrics, besides reward/ (after the length penalty), advantage/, rubric/, judge/, response/ and outcome/accuracy
(every row, refinements included): "rgr/rubric_reward/*" (eq 5, before the length penalty),
"rgr/solved_group_fraction" (groups whose best on-policy rollout meets every criterion, whether or not refinement
is on), "rgr/off_policy_fraction" (groups refined: the off-policy mixture ratio of Figure 4),
"rgr/on_policy_accuracy", and, when a group was refined, "rgr/refined_better_fraction" (refinements whose rubric
reward beats their attempt's), "rgr/refined_accuracy" and "rgr/refined_rubric_reward/*" (the accuracies only for a
task with outcome answers, `base.has_outcome`); the loss adds
"train/off_policy_tokens", "train/on_policy_ratio" and "train/shaped_prob" (`RGRGRPO.loss_fn`).

Batch: base's layout plus "off_policy_b" [B] bool, the refined rows, which `loss_fn` reads. A refined row's
prompt region holds q and its "rollout_logp_bt" the engine's logprobs under the refinement prompt (the behaviour
policy's), so the trainer's mismatch/* diagnostics also measure, on those rows, how far the refinement context
moved the policy; the learner's old logprobs, recomputed under q, enter its loss only without shaping.
"""

import dataclasses
import types
from typing import Any, Literal, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from rubric_jax.algorithms import base
from rubric_jax.algorithms.registry import register
from rubric_jax.core import advantages, losses, rewards, rubric_validity
from rubric_jax.inference.engine import RolloutEngine, SamplingParams
from rubric_jax.judges.base import Judge, JudgeRequest, Verdicts
from rubric_jax.models import train_step
from rubric_jax.rubrics import prompts
from rubric_jax.rubrics.parsing import FailurePolicy
from rubric_jax.rubrics.schema import Criterion, ItemKind, Rubric, rubric_arrays
from rubric_jax.rubrics.steps import response_text, split_steps

Criteria = Literal["all", "factual"]


@dataclasses.dataclass(frozen=True)
class RGRGRPOConfig:
    """max_items: rubric width K. criteria: "all" or "factual" (ablation). refine / exploration_assessment /
    shaping: the ablation switches (module docstring); the last two act on refined rollouts, so they must keep
    their defaults when refine is off. gamma: the shaping constant (0.1). entropy_coeff: the entropy bonus (0.01).
    entropy_aggregation: "token_mean" (default: coeff times the token-mean entropy over the (mini-)batch's response
    tokens, LUFFY's `masked_mean(entropy)`, on whose actor the paper's off-policy term is built) or "as_loss" (each
    token's bonus aggregated with the loss, `aggregation` / `norm_constant`, as verl's later `agg_loss(entropy,
    loss_agg_mode)`; with seq_mean_token_sum_norm it weighs (batch tokens) / (sequences x norm_constant) times
    the token mean: 0.2 for responses of 1024 tokens under the paper's 5120).
    length_coef / target_length: lambda and L* of the length penalty in tokens (1e-4, 2000). scale_by_std / eps:
    GRPO's std scaling (off in the paper) and its epsilon. on_judge_failure: "zero_reward" or "exclude".
    aggregation / norm_constant: the loss aggregation (`base.PolicyLossConfig`). off_max_clip / off_min_clip:
    LUFFY's off-policy clips on the refinement tokens' shaped weight f(p) (`core.losses.clip_off_policy_weight`);
    None (LUFFY's -1) turns a clip off, and both are off because the paper states neither; they act on shaped
    refined rows, so they need refine and shaping on. refinement_max_prompt_tokens: the cap on refinement prompts
    (q, o_best, C_failed), which `rollout.max_prompt_tokens` (the cap on questions, Table 5's max_prompt_length)
    does not govern: o_best alone may fill max_new_tokens, so the paper's 1024 cannot have applied to them;
    None: no cap."""

    max_items: int = 16
    criteria: Criteria = "all"
    refine: bool = True
    exploration_assessment: bool = True
    shaping: bool = True
    gamma: float = 0.1
    entropy_coeff: float = 0.01
    entropy_aggregation: Literal["token_mean", "as_loss"] = "token_mean"
    length_coef: float = 1e-4
    target_length: float = 2000.0
    scale_by_std: bool = False
    eps: float = 1e-6
    on_judge_failure: Literal["zero_reward", "exclude"] = "zero_reward"
    aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"] = (
        "seq_mean_token_sum"
    )
    norm_constant: Optional[float] = None
    off_max_clip: Optional[float] = None
    off_min_clip: Optional[float] = None
    refinement_max_prompt_tokens: Optional[int] = None

    def __post_init__(self):
        if self.max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {self.max_items}")
        if not self.gamma > 0:
            raise ValueError(f"gamma must be > 0, got {self.gamma}")
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        for name in ("entropy_coeff", "length_coef", "target_length"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.refine and not (self.exploration_assessment and self.shaping):
            raise ValueError("exploration_assessment and shaping act on refined rollouts: with refine false they "
                             "must stay true")
        clips = {name: getattr(self, name) for name in ("off_max_clip", "off_min_clip")
                 if getattr(self, name) is not None}
        for name, bound in clips.items():
            if not bound >= 0:
                raise ValueError(f"{name} must be >= 0 or null, got {bound!r}")
        if len(clips) == 2 and self.off_min_clip > self.off_max_clip:
            raise ValueError(f"off_min_clip {self.off_min_clip} must not exceed off_max_clip {self.off_max_clip}")
        if self.refinement_max_prompt_tokens is not None and not self.refinement_max_prompt_tokens >= 1:
            raise ValueError(f"refinement_max_prompt_tokens must be null or >= 1, got "
                             f"{self.refinement_max_prompt_tokens!r}")
        if clips and not (self.refine and self.shaping):
            raise ValueError("off_max_clip / off_min_clip clip the shaped weight of refined rollouts: they need "
                             "refine and shaping true")
        self.policy_loss  # noqa: B018  (building it validates aggregation and norm_constant)

    @property
    def policy_loss(self) -> base.PolicyLossConfig:
        return base.PolicyLossConfig(aggregation=self.aggregation, norm_constant=self.norm_constant)


def refinement_prompt(task: Any, example: Any, attempt: str, failed: Sequence[Criterion]) -> list[dict[str, str]]:
    """The prompt refining `attempt` on its `failed` criteria (eq 9): the task's own `refinement_prompt(example,
    attempt, failed)` when it has one (a prompt sized for a small model's context), else the paper's template
    (`prompts.self_refinement_prompt`)."""
    if hasattr(task, "refinement_prompt"):
        return task.refinement_prompt(example, attempt, failed)
    return prompts.self_refinement_prompt(task.question(example), attempt, failed)


def _rubric_items(rubrics: Sequence[Rubric], max_items: int, criteria: Criteria) -> tuple[np.ndarray, ...]:
    """(weights [B, K], factual [B, K], counted [B, K]) of the rubrics: `counted` the items the reward, the
    assessment and the refinement see, every existing item or the factual ones only."""
    items = rubric_arrays(rubrics, max_items)
    factual = items.item_kind_bk == int(ItemKind.FACTUAL)
    counted = items.item_mask_bk & (factual if criteria == "factual" else True)
    return items.item_weight_bk, factual, counted


def assessment_key(rubric_b: np.ndarray, satisfied_bk: np.ndarray, counted_bk: np.ndarray) -> np.ndarray:
    """The value o_best maximises (eq 7): the gated reward r (eq 5), plus 1 on a rollout that meets every counted
    criterion. Such a rollout has r = 1, the largest reward, so the key only breaks ties at r = 1, which the
    factual gate makes common (every fact met, a process criterion failed): without it the lowest tied row would
    win and a group holding a perfect solution would be refined, against section 2.3 ("if the current group of
    responses already contains a perfect solution, additional off-policy exploration is unnecessary")."""
    complete_b = np.all(~counted_bk | (satisfied_bk >= 1), axis=1)
    return rubric_b + complete_b.astype(rubric_b.dtype)


def _failed_criteria(rubric: Rubric, failed_k: np.ndarray) -> list[Criterion]:
    return [rubric.criteria[k] for k in np.flatnonzero(failed_k)]


@dataclasses.dataclass
class _Rows:
    """The step's G rows per prompt as the learner gets them: on-policy rollouts, with refined rows swapped in;
    `requests` each row's judge request (a refined row's is its refinement's)."""

    samples: list
    texts: list
    requests: list
    batch: dict
    satisfied_bk: np.ndarray
    item_step_bk: np.ndarray
    failed_b: np.ndarray
    reasons: list
    off_policy_b: np.ndarray

    def verdicts(self) -> Verdicts:
        return Verdicts(self.satisfied_bk, self.item_step_bk, self.failed_b, tuple(self.reasons))


@register("rgr_grpo")
class RGRGRPO(base.Algorithm):
    config_class = RGRGRPOConfig
    console_metrics = ("rgr/off_policy_fraction", "rgr/solved_group_fraction")
    plot_panels = types.MappingProxyType({
        "rgr/refinement": ("rgr/off_policy_fraction", "rgr/solved_group_fraction", "rgr/refined_better_fraction"),
        "rgr/rubric_reward": ("rgr/rubric_reward/mean", "rgr/refined_rubric_reward/mean"),
    })

    @property
    def negative_weights(self) -> str:
        return ("weighted 0: eq 4's weighted fraction (the paper's weights are positive) lets a met penalty cost "
                "nothing")

    @property
    def policy_loss(self) -> base.PolicyLossConfig:
        return self.config.policy_loss

    def role_prompts(self, task: Any, example: Any, placeholder: str) -> dict[str, list[dict[str, str]]]:
        """The policy's prompt, and its refinement prompt for an attempt that failed every criterion."""
        return {"policy": task.prompt(example),
                "refinement": refinement_prompt(task, example, placeholder, task.rubric(example).criteria)}

    def loss_fn(self) -> train_step.TokenLossFn:
        """Eq 10 per token with the entropy bonus. Token metrics (means over all response tokens):
        "off_policy_tokens" (the refined rows' share), "on_policy_ratio" (r on on-policy tokens, 0 elsewhere) and
        "shaped_prob" (f(p) on shaped tokens after the off-policy clips, 0 elsewhere): divide the last two by their
        rows' share of the tokens for their means over those tokens; with an off-policy clip set, also
        "off_clipped_high" / "off_clipped_low" (tokens at that bound; divide likewise by "off_policy_tokens" for
        LUFFY's off_ratio_max_clip_frac / off_ratio_min_clip_frac). With an entropy bonus aggregated as a token
        mean, the batch must hold the train step's `train_step.TOKEN_MEAN_WEIGHTS`."""
        config = self.config
        gamma, coeff, shaping = config.gamma, config.entropy_coeff, config.shaping
        token_mean_entropy = config.entropy_aggregation == "token_mean" and coeff > 0

        def loss_fn(logp_bt, entropy_bt, batch):
            mask_bt = batch["response_mask_bt"]
            off_policy_b = batch["off_policy_b"]
            loss_bt, info = losses.rgr_mixed_policy_loss(
                logp_bt, batch["old_logp_bt"], batch["advantages_bt"], mask_bt,
                off_policy_b if shaping else jnp.zeros_like(off_policy_b), gamma=gamma,
                off_max_clip=config.off_max_clip, off_min_clip=config.off_min_clip)
            if token_mean_entropy:
                entropy_bt = entropy_bt * batch[train_step.TOKEN_MEAN_WEIGHTS]
            loss_bt = losses.subtract_entropy_bonus(loss_bt, entropy_bt, mask_bt, coeff=coeff)
            metrics = {"off_policy_tokens": mask_bt & off_policy_b[:, None], "on_policy_ratio": info.ratio_bt,
                       "shaped_prob": info.shaped_prob_bt}
            if config.off_max_clip is not None:
                metrics["off_clipped_high"] = info.off_clipped_high_bt
            if config.off_min_clip is not None:
                metrics["off_clipped_low"] = info.off_clipped_low_bt
            return loss_bt, metrics

        return loss_fn

    def rubric_reward(self, satisfied_bk: np.ndarray, items: tuple[np.ndarray, ...]) -> np.ndarray:
        """Step 3: each rollout's rubric reward [B] float32 from its verdicts [B, K] and its rubric's (weights,
        factual, counted) [B, K] (`_rubric_items`): eq 5's factual gate over eq 4's weighted fraction. Also what
        the exploration assessment ranks (`assessment_key`)."""
        return np.asarray(rewards.rgr_factual_gated_reward(*(jnp.asarray(a) for a in (satisfied_bk, *items))))

    def reward(self, rubric_b: np.ndarray, lengths_b: np.ndarray, failed_b: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """Step 6 and the failure policy: (r [B] float32, the rubric rewards [B] with the length penalty over the
        response lengths in tokens [B]; valid_b [B] bool, the rows in their groups' statistics and the loss: every
        row, or the judged ones (not `failed_b`) under on_judge_failure "exclude")."""
        config = self.config
        reward_b = np.asarray(rewards.rgr_length_shaping(
            jnp.asarray(rubric_b), jnp.asarray(lengths_b), target_length=config.target_length,
            coef=config.length_coef))
        if config.on_judge_failure == FailurePolicy.EXCLUDE.value:
            return reward_b, ~failed_b
        return reward_b, np.ones(len(reward_b), bool)

    def advantage(self, reward_b: np.ndarray, group_ids: np.ndarray, valid_b: np.ndarray) -> np.ndarray:
        """Step 7: [B] float32 advantages of the rewards [B] within the groups [B], over the valid rows [B] (0 on
        the others): r - mean_g, or GRPO's (sample std) with scale_by_std."""
        r, ids, valid = jnp.asarray(reward_b), jnp.asarray(group_ids), jnp.asarray(valid_b)
        if self.config.scale_by_std:
            return np.asarray(advantages.grpo_advantages(r, ids, valid, std_ddof=1, eps=self.config.eps))
        return np.asarray(advantages.dr_grpo_advantages(r, ids, valid))

    def experience(self, examples: Sequence[Any], context: base.RolloutContext, step: int) -> base.Experience:
        config, group = self.config, context.sampling.n
        if group < 2:
            raise ValueError(f"RGR-GRPO needs sampling.n >= 2 (G - 1 on-policy rollouts and o_G), got {group}")
        # 1-5: G rollouts per prompt; each group, as soon as it is sampled, judged, assessed and, unsolved, its best
        # rollout refined and the refinement judged (`group_work`).
        task = context.task
        rollouts, work = base.sample_and_follow(
            [task.prompt(e) for e in examples], context, step,
            lambda g, samples, texts: self.group_work(examples[g], g, samples, texts, context, step))
        requests = [r for group_work in work for r in group_work.requests]
        verdicts = Verdicts.concatenate([group_work.verdicts for group_work in work])
        rubrics = [r.rubric for r in requests]
        items = _rubric_items(rubrics, config.max_items, config.criteria)
        rows = _Rows(samples=list(rollouts.samples), texts=list(rollouts.texts), requests=list(requests),
                     batch=dict(rollouts.batch), satisfied_bk=np.array(verdicts.satisfied_bk),
                     item_step_bk=np.array(verdicts.item_step_bk), failed_b=np.array(verdicts.failed_b),
                     reasons=list(verdicts.reasons), off_policy_b=np.zeros(len(rollouts.samples), bool))
        context.judge.record(requests, verdicts)
        group_ids = rollouts.group_ids
        last_rows = np.arange(len(examples)) * group + group - 1
        best_g = np.array([g * group + w.best if w.best >= 0 else -1 for g, w in enumerate(work)], np.int64)
        solved_g = np.array([w.solved for w in work], bool)
        refined_groups = np.array([g for g, w in enumerate(work) if w.refinement is not None], np.int64)
        refine_g = np.isin(np.arange(len(examples)), refined_groups)
        if refined_groups.size:
            refined = [work[g].refinement for g in refined_groups]
            self._swap_in_refinements(rows, refined, last_rows[refined_groups], rollouts.prompt_width, context)
        rubric_b = self.rubric_reward(rows.satisfied_bk, items)
        # 6-7: length penalty, group-relative advantages.
        lengths_b = np.array([len(s.output_ids) for s in rows.samples], np.float32)
        reward_b, valid_b = self.reward(rubric_b, lengths_b, rows.failed_b)
        advantage_b = self.advantage(reward_b, group_ids, valid_b)
        batch = rows.batch
        batch["response_mask_bt"] = batch["response_mask_bt"] & valid_b[:, None]
        batch["advantages_bt"] = np.asarray(
            advantages.broadcast_to_tokens(jnp.asarray(advantage_b), jnp.asarray(batch["response_mask_bt"])))
        batch["off_policy_b"] = rows.off_policy_b

        trained = base.Rollouts(rows.samples, rows.texts, batch, rollouts.prompt_width)
        correct_b = base.outcome_correctness(examples, trained, context.task)
        best_rubric_g = np.where(best_g >= 0, rubric_b[np.maximum(best_g, 0)], 0)  # o_best's row is on-policy
        refined_rows = last_rows[refined_groups]
        metrics = {
            **base.summary_stats("reward", reward_b),
            **base.summary_stats("rgr/rubric_reward", rubric_b),
            **base.summary_stats("advantage", advantage_b),
            **base.rubric_metrics(rows.verdicts(), rubrics, context.task),
            **base.rollout_metrics(trained, correct_b, context.task),
            "rgr/solved_group_fraction": float(np.mean(solved_g)),
            "rgr/off_policy_fraction": float(np.mean(refine_g)),
        }
        outcome = base.has_outcome(context.task)
        if outcome:
            metrics["rgr/on_policy_accuracy"] = float(np.mean(correct_b[~rows.off_policy_b]))
        if refined_groups.size:
            metrics["rgr/refined_better_fraction"] = float(np.mean(
                rubric_b[refined_rows] > best_rubric_g[refined_groups]))
            if outcome:
                metrics["rgr/refined_accuracy"] = float(np.mean(correct_b[refined_rows]))
            metrics.update(base.summary_stats("rgr/refined_rubric_reward", rubric_b[refined_rows]))
        values = base.recipe_values(rows.requests, reward_b, np.where(valid_b, advantage_b, 0.0), group_ids)
        return base.Experience(batch=batch, prompt_width=rollouts.prompt_width, metrics=metrics, recipe_values=values)

    async def group_work(self, example: Any, group_index: int, samples: Sequence[Any], texts: Sequence[str],
                         context: base.RolloutContext, step: int) -> "GroupWork":
        """Steps 2-5 on one group, run as soon as it is sampled (`base.sample_and_follow`): its G rollouts judged
        (step 2), rewarded (3) and assessed over the G - 1 on-policy ones that were judged (4); unsolved (or every
        group, without the exploration assessment), its best rollout refined on the criteria it failed (one
        sample, stream 1, seeded by the group's index: `base.asample_group`; capped by
        `refinement_max_prompt_tokens`) and the refinement judged (5). The judge's `unrecorded` judges; `experience`
        records the first pass, then the refinements, in row order."""
        config, task, group = self.config, context.task, len(samples)
        judge = context.judge.unrecorded
        requests = [base.rollout_request(example, text, task) for text in texts]
        verdicts = await base.judge_group(judge, requests, samples, config.max_items)
        rubrics = [r.rubric for r in requests]
        items = _rubric_items(rubrics, config.max_items, config.criteria)
        counted_bk = items[2]
        rubric_b = self.rubric_reward(verdicts.satisfied_bk, items)
        assessed_b = (np.arange(group) < group - 1) & ~verdicts.failed_b
        assessment = rubric_validity.rgr_exploration_assessment(
            jnp.asarray(assessment_key(rubric_b, verdicts.satisfied_bk, counted_bk)),
            jnp.asarray(verdicts.satisfied_bk), jnp.asarray(counted_bk), jnp.zeros(group, jnp.int32),
            jnp.asarray(assessed_b))
        best, solved = int(assessment.best_index[0]), bool(assessment.solved[0])
        work = GroupWork(requests, verdicts, best, solved)
        if not (config.refine and best >= 0 and (not solved or not config.exploration_assessment)):
            return work
        prompt = refinement_prompt(task, example, texts[best],
                                   _failed_criteria(rubrics[best], np.asarray(assessment.failed_bk)[best]))
        single = dataclasses.replace(context, sampling=dataclasses.replace(context.sampling, n=1),
                                     max_prompt_tokens=config.refinement_max_prompt_tokens)
        refined = await base.asample_group([prompt], single, step, stream=1, group=group_index)
        refined_requests = [base.rollout_request(example, refined.texts[0], task)]
        refined_verdicts = await base.judge_group(judge, refined_requests, refined.samples, config.max_items)
        return dataclasses.replace(work, refinement=Refinement(refined, refined_requests, refined_verdicts))

    def _swap_in_refinements(self, rows: _Rows, refined: Sequence["Refinement"], target_rows: np.ndarray,
                             prompt_width: int, context: base.RolloutContext) -> None:
        """Writes each group's refinement over its group's reserved row (`target_rows`): its response after the
        row's own prompt region (q), the engine's logprobs, its verdict, and off_policy_b; the refinements'
        verdicts recorded by the run's judge, in row order."""
        requests = [r for refinement in refined for r in refinement.requests]
        verdicts = Verdicts.concatenate([refinement.verdicts for refinement in refined])
        context.judge.record(requests, verdicts)
        samples = [refinement.rollouts.samples[0] for refinement in refined]
        batch, response_width = rows.batch, context.sampling.max_new_tokens
        prompt_ids = [batch["tokens_bt"][r, :prompt_width][batch["attention_mask_bt"][r, :prompt_width]]
                      for r in target_rows]
        packed = train_step.pack_sequences(prompt_ids, [s.output_ids for s in samples], pad_id=context.pad_id,
                                           prompt_width=prompt_width, response_width=response_width)
        for key, value in packed.items():
            batch[key][target_rows] = value
        batch["rollout_logp_bt"][target_rows] = np.concatenate([np.pad(
            refinement.rollouts.batch["rollout_logp_bt"][:, refinement.rollouts.prompt_width:],
            ((0, 0), (prompt_width, 0))) for refinement in refined])
        for refinement, request, reason, r in zip(refined, requests, verdicts.reasons, target_rows):
            rows.samples[r] = dataclasses.replace(refinement.rollouts.samples[0],
                                                  prompt_index=rows.samples[r].prompt_index)
            rows.texts[r] = refinement.rollouts.texts[0]
            rows.requests[r] = request
            rows.reasons[r] = reason
        rows.satisfied_bk[target_rows] = verdicts.satisfied_bk
        rows.item_step_bk[target_rows] = verdicts.item_step_bk
        rows.failed_b[target_rows] = verdicts.failed_b
        rows.off_policy_b[target_rows] = True


@dataclasses.dataclass(frozen=True)
class Refinement:
    """One group's refinement o_G (step 5): its rollout (one sample), its judge request and verdict."""

    rollouts: base.Rollouts
    requests: list[JudgeRequest]
    verdicts: Verdicts


@dataclasses.dataclass(frozen=True)
class GroupWork:
    """Steps 2-5 on one group (`RGRGRPO.group_work`): its requests and verdicts [G, K], o_best's index in the
    group (-1: no rollout was assessed), whether o_best meets every criterion, and its refinement (None: the
    group was not refined)."""

    requests: list[JudgeRequest]
    verdicts: Verdicts
    best: int
    solved: bool
    refinement: Optional[Refinement] = None


def refine_at_test_time(
    engine: RolloutEngine,
    tokenizer: Any,
    task: Any,
    judge: Judge,
    examples: Sequence[Any],
    *,
    max_new_tokens: int,
    seed: int,
    temperature: float = 0.0,
    criteria: Criteria = "all",
) -> dict[str, float]:
    """Rubric-guided self-refinement at test time (rgr_grpo.txt, section 5.2, Figure 8) as one round of the
    training-time refinement (eqs 8-9): each example's response (greedy by default, as the paper evaluates) is
    judged against its rubric, and a response that misses some criterion (of `criteria`: "all", or "factual" as
    the paper's Fact-Only setting) is refined once on the criteria it missed (`refinement_prompt`); the
    refinement replaces it. The rubric is built from the reference, so this measures how well the policy uses
    rubric guidance, not its unaided accuracy.

    Metrics: "refine/accuracy_before" and "refine/accuracy_after" (task.is_correct), "refine/refined_fraction"
    (the examples refined) and "refine/judge_failure_rate" (a response whose judgement failed is not refined:
    there is nothing to refine it on).
    """
    def generate(prompts_, call_seed):
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=call_seed)
        return [response_text(tokenizer, s.output_ids) for s in engine.generate(prompts_, params)]

    texts = generate([task.prompt(e) for e in examples], seed)
    rubrics = [task.rubric(e) for e in examples]
    max_items = max(len(r.criteria) for r in rubrics)
    verdicts = judge.judge([JudgeRequest(task.question(e), text, rubric, task.reference(e), len(split_steps(text)))
                            for e, text, rubric in zip(examples, texts, rubrics)], max_items)
    _, _, counted_bk = _rubric_items(rubrics, max_items, criteria)
    missed_bk = counted_bk & (verdicts.satisfied_bk < 1)
    refined = np.flatnonzero(~verdicts.failed_b & missed_bk.any(axis=1))
    after = list(texts)
    if refined.size:
        refine_prompts = [refinement_prompt(task, examples[i], texts[i], _failed_criteria(rubrics[i], missed_bk[i]))
                          for i in refined]
        for i, text in zip(refined, generate(refine_prompts, seed + 1)):
            after[i] = text
    return {
        "refine/accuracy_before": float(np.mean([task.is_correct(t, e) for t, e in zip(texts, examples)])),
        "refine/accuracy_after": float(np.mean([task.is_correct(t, e) for t, e in zip(after, examples)])),
        "refine/refined_fraction": refined.size / len(examples),
        "refine/judge_failure_rate": float(np.mean(verdicts.failed_b)),
    }
