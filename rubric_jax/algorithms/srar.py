r"""SRaR, "Step-wise Rubric Rewards for LLM Reasoning" (srar.txt): a judge attributes each typed rubric item
(SUGGEST / PITFALL / BONUS / ANSWER) to a `### Step N:` step of the response; each step's rubric reward is
normalised across the rollouts of its prompt and placed on that step's tokens only, on top of the outcome-only
GRPO advantage, which the rubric never enters (the decoupled advantage, eq 6).

Algorithm 1, for each training step (G = sampling.n responses per prompt; `reward` and `advantage` are the
recipe's methods a variant overrides):
  3.     sample G responses to the step-format prompt             base.sample_and_judge (line 8 per group
                                                                  as it finishes; re-sampling: sample_groups)
         (the task's prompt, or Appendix 7.3's format prompt)     rubrics.prompts.step_format_prompt
  6.     r_base = (1 - lambda) r_acc + lambda r_fmt               reward: core.rewards.srar_base_reward
         r_acc by `accuracy`: "task" task.is_correct (math-verify for the math presets), or "boxed_string"
         the authors' string-normalised last box = the gold answer  boxed_string_correct
         r_fmt = a step header and a box                          has_step_format
  7.     each token's step from the tokenizer's offset mapping     rubrics.steps.response_step_ids
         and each response's step count from its headers          rubrics.steps.step_spans
  8.     step-attributed judging of the typed rubric              base.sample_and_judge (re-sampling:
                                                                  base.judge_groups of the kept groups)
  9.     d[k, i] = sum of the budgeted deltas of step k's items   advantage: core.srar.srar_item_deltas,
                                                                  srar_step_rewards
         (eq 3: +R_SUG / N_SUG, -|R_PIT| / N_PIT, +R_BON / N_BON per satisfied item; ANSWER items carry none)
  11-13. d_bar[k, i] = (d[k, i] - mean_Gk) / (std_Gk + eps)       core.srar.srar_step_normalize
         over G_k (any k the judge wrote, as the authors' code), by `step_groups`: "authors" the group's
         rollouts with a delta at step k (their code, the default); "paper" those with any item attributed to
         k (eq 4, line 12; core.srar.srar_attributed_items); 0 when |G_k| <= 1 or std_Gk <= eps
  16.    A_base = (r_base - mean_g) / (std_g + eps)              core.advantages.grpo_advantages
  15,17. A[t] = A_base + d_bar[0] + d_bar[step of t]              core.srar.srar_token_offsets
         (step 0 is the whole response; tokens outside every step get A_base + d_bar[0]; the d_bar of a step
         the response does not have also goes to every token, as the authors' fallback; -1 to none)
  20.    PPO update; by default the authors' run: clip 0.2 / 0.28, dual clip c = 10, token-mean, no KL
         (REFERENCE.md section 2)                                  base.policy_loss_fn
         optional, as in the authors' DAPO setting: dynamic sampling on accuracy, a group whose answers are all
         right or all wrong takes no part in the loss: "resample" (the authors' run, verl's filter_groups:
         further generation batches until prompts_per_step groups  base.dynamic_groups,
         with mixed answers are kept; only those are judged) or    algorithms.dapo.mixed_accuracy
         "mask" (fixed batch shape: the rows are masked)

The paper's ablations (Appendix 17 and 18), each switching exactly one thing:
- step_normalization=False ("w/o step norm."): lines 11-13 are skipped, the raw d[k, i] is the token offset.
- advantage="merged" ("w/o decoupled adv."): one RaR-style scalar r_base + sum of the rollout's deltas is
  GRPO-normalised and placed on the tokens of the steps that received rubric scores
  (core.srar.srar_merged_advantages).
- rubric="suggest_only" (Table 9): PITFALL and BONUS items are removed from every rubric before judging
  (SUGGEST and ANSWER items stay, so N_SUG and the SUGGEST deltas are unchanged).
And the paper's RaR baseline (Tables 1 and 9) as the authors ran it (`recipe/SRaR/srar_advantage.py:
compute_rar_advantage` with `RaRRewardManager`): advantage="rar", the GRPO advantage of r_base + the sum of the
rollout's eq 3 deltas on every response token (the same judge, rubric and steps; the steps play no part).

Conventions:
- Std: sample std (std_ddof 1), the authors' code; the paper's equations write the population std (std_ddof 0).
- A rubric item of another kind (a generic CRITERION) carries no delta: SRaR on an untyped rubric is GRPO on
  r_base (Proposition 20.7, as for an empty rubric).
- A failed judgement has every item unsatisfied (`judges.base`). "zero_reward" (default, the authors'
  convention): the rollout earns no rubric credit, so it is in no step group, and keeps its outcome advantage.
  "exclude": it is masked out of every group statistic and of the loss.

Metrics, besides reward/* (r_base), advantage/* (over response tokens), rubric/*, judge/*, response/* and
outcome/accuracy: "srar/format_rate", "srar/steps_mean" (step headers per response), "srar/rubric_offset/*"
(the decoupled rubric term over response tokens) and `analysis_metrics` under "srar/": per-type rubric scores
(Figure 6) and satisfaction rates (Table 7), the looping rate by the four criteria of section 4.3.2 (Table 3),
and, for a task that labels steps (`step_labels(response, example) -> list[bool]`), step accuracy, the Faithful
Reasoning Rate and the Misaligned Trajectory Rate (Table 2).
"""

import dataclasses
import math
import re
import types
from typing import Any, Literal, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from rubric_jax.algorithms import base
from rubric_jax.algorithms.dapo import kept_group_fraction, mixed_accuracy
from rubric_jax.algorithms.registry import register
from rubric_jax.core import advantages, rewards, srar
from rubric_jax.core.rewards import ANSWER, BONUS, PITFALL, SUGGEST, TypedBudgets
from rubric_jax.judges.base import Verdicts
from rubric_jax.judges.outcome import extract_boxed
from rubric_jax.rubrics import prompts
from rubric_jax.rubrics.parsing import FailurePolicy
from rubric_jax.rubrics.schema import ItemKind, Rubric, RubricArrays, rubric_arrays
from rubric_jax.rubrics.steps import response_step_ids, split_steps, step_spans

TYPE_NAMES = {SUGGEST: "suggest", PITFALL: "pitfall", BONUS: "bonus", ANSWER: "answer"}

# Section 4.3.2's looping criteria: (i) more than 20 self-correction phrases, (ii) "### Step 1" more than once,
# (iii) repeated step headings, (iv) more than 10% duplicate paragraphs.
MAX_SELF_CORRECTIONS = 20
MAX_DUPLICATE_PARAGRAPH_FRACTION = 0.10
# The paper does not list its phrases; these are the revision markers of its case studies ("Wait, actually",
# "Hmm, let me parse that carefully", "Wait, no") and their common variants. Case-insensitive, whole words.
SELF_CORRECTION = re.compile(
    r"\b(?:wait|hmm+|actually|oops|on second thought|i made (?:a|an) (?:mistake|error)"
    r"|that(?:'s| is) (?:not right|wrong|incorrect)"
    r"|let me (?:re-?check|double-check|verify|reconsider|re-?examine|re-?compute|re-?calculate|re-?evaluate|redo))\b",
    re.IGNORECASE,
)
_BLANK_LINE = re.compile(r"\n[ \t]*\n")


@dataclasses.dataclass(frozen=True)
class SRaRConfig:
    """max_items: rubric width K (the longest rubric must fit). format_weight: lambda of r_base (0.1 in the
    paper). budgets: R_SUG, R_PIT, R_BON (0.8, -1.0, 1.0). Steps are not capped (`core.srar`). prompt: "task"
    (the task's own prompt, already in step format for arithmetic) or "step_format" (Appendix 7.3 around the
    task's question). advantage / step_normalization / rubric: the ablations and the RaR baseline (module
    docstring). dynamic_sampling: drop the groups of uniform accuracy (module docstring, line 20): "off" (false),
    "mask" (true) or "resample", with max_num_gen_batches (0: no cap) and gen_batch_prompts (None: prompts_per_step)
    for "resample" only (`base.dynamic_groups`). on_judge_failure: "zero_reward" or "exclude". std_ddof / eps: of
    both normalisations.
    step_groups: who is in G_k for eq 4's normalisation, "authors" (the rollouts with a delta-bearing item at k:
    their `compute_rubric_deltas`, from which their numbers come, so the default) or "paper" (the rollouts with
    any item attributed to k, eq 4 and Algorithm 1 line 12 as written); it acts on the decoupled advantage's
    step normalisation only, so "paper" needs advantage "decoupled" and step_normalization on.
    accuracy: r_acc, "task" (`Task.is_correct`: math-verify equivalence of the last box for the math presets, the
    default, as before) or "boxed_string" (`boxed_string_correct`, the authors' `compute_score_boxed`; needs a
    task with `gold_answer(example)`). Training's r_acc only: evaluation keeps the task's check."""

    policy_loss: base.PolicyLossConfig = base.PolicyLossConfig(
        loss="dual_clip", eps_low=0.2, eps_high=0.28, clip_ratio_c=10.0)
    max_items: int = 16
    format_weight: float = 0.1
    budgets: TypedBudgets = TypedBudgets()
    prompt: Literal["task", "step_format"] = "task"
    advantage: Literal["decoupled", "merged", "rar"] = "decoupled"
    step_normalization: bool = True
    rubric: Literal["full", "suggest_only"] = "full"
    dynamic_sampling: base.DynamicSampling = "off"
    max_num_gen_batches: int = 0
    gen_batch_prompts: Optional[int] = None
    on_judge_failure: Literal["zero_reward", "exclude"] = "zero_reward"
    std_ddof: int = 1
    eps: float = 1e-6
    step_groups: Literal["authors", "paper"] = "authors"
    accuracy: Literal["task", "boxed_string"] = "task"

    def __post_init__(self):
        object.__setattr__(self, "dynamic_sampling", base.dynamic_sampling_mode(self.dynamic_sampling))
        base.check_resampling(self.dynamic_sampling, self.max_num_gen_batches, self.gen_batch_prompts)
        if self.max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {self.max_items}")
        if not 0 <= self.format_weight <= 1:
            raise ValueError(f"format_weight must be in [0, 1], got {self.format_weight}")
        for name in ("suggest", "pitfall", "bonus"):
            if not math.isfinite(getattr(self.budgets, name)):
                raise ValueError(f"budgets.{name} must be finite, got {getattr(self.budgets, name)}")
        if self.advantage != "decoupled" and not self.step_normalization:
            raise ValueError("step_normalization=False ablates the decoupled advantage's step offsets; the "
                             f"{self.advantage} advantage has none (it GRPO-normalises one scalar), so it needs "
                             "step_normalization=True")
        if self.step_groups == "paper" and not (self.advantage == "decoupled" and self.step_normalization):
            raise ValueError("step_groups decides who is in G_k for the decoupled advantage's step normalisation "
                             "(eq 4); with advantage "
                             f"{self.advantage} and step_normalization {self.step_normalization} there is none, so "
                             "step_groups paper would change nothing: keep step_groups authors")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"std_ddof must be 0 or 1, got {self.std_ddof}")
        if not self.eps >= 0:
            raise ValueError(f"eps must be >= 0, got {self.eps}")


# ---------------------------------------------------------------- host-side pieces of the recipe


def has_step_format(text: str) -> bool:
    r"""SRaR's format reward r_fmt (eq 6; the authors' code): the response has a `### Step N:` header
    (`rubrics.steps.split_steps`, outside fenced code) and a `\boxed{`."""
    return bool(split_steps(text)) and "\\boxed{" in text


_TEXT_WRAPPERS = (re.compile(r"\\text\{(.*?)\}"), re.compile(r"\\textbf\{(.*?)\}"), re.compile(r"\\boxed\{(.*?)\}"))
_BRACELESS_FRACTION = re.compile(r"\\frac([^{])(.)")


def normalize_boxed_string(answer: str) -> str:
    r"""The SRaR authors' answer normalisation (`reward_manager.py:normalize_answer`): strip; delete every comma,
    space and `$`; unwrap the first `}` of each `	ext{...}`, then `	extbf{...}`, then `oxed{...}`; rewrite
    `rac` followed by two characters, the first not `{`, as `frac{a}{b}`; strip.

    Transcribed with its quirks, which are what the authors' accuracy measured: the rewritten fraction loses its
    backslash (`rac12` -> `frac{1}{2}`, never equal to `rac{1}{2}`), commas go even inside tuples
    (`1,2` -> `12`), and a nested brace ends an unwrapped group early (`	ext{a{b}c}` -> `a{bc}`)."""
    answer = answer.strip()
    for character in (",", " ", "$"):
        answer = answer.replace(character, "")
    for wrapper in _TEXT_WRAPPERS:
        answer = wrapper.sub(r"\1", answer)
    return _BRACELESS_FRACTION.sub(r"frac{\1}{\2}", answer).strip()


def boxed_string_correct(response: str, gold: str) -> bool:
    r"""SRaR's r_acc as the authors computed it (`compute_score_boxed`): the last box's content and the gold answer,
    each `normalize_boxed_string`-ed, are equal strings, and the box's is not empty. The box is read as everywhere
    here (`judges.outcome.extract_boxed`: the last `oxed{`, braces balanced, None when it never closes); the
    authors' reader differs only on `box{`, `oxed {` (not read by theirs) and escaped braces (counted by
    theirs). No math-verify: `rac12` and `0.5` differ, `1,000` and `1000` agree."""
    boxed = extract_boxed(response)
    answer = normalize_boxed_string(boxed) if boxed is not None else ""
    return bool(answer) and answer == normalize_boxed_string(gold)


def rollout_steps(rollouts: base.Rollouts, tokenizer: Any) -> tuple[np.ndarray, np.ndarray]:
    """(step_ids_bt [B, T] int32, num_steps_b [B] int32) of the packed rollouts: each response token's step
    (`response_step_ids`, the tokenizer's offset mapping of the text the judge saw), 0 on the prompt and padding;
    and each response's number of steps, counted from its headers (`step_spans`, 1 without a header)."""
    step_ids_bt = np.zeros(rollouts.batch["tokens_bt"].shape, np.int32)
    start = rollouts.prompt_width
    for b, sample in enumerate(rollouts.samples):
        step_ids_bt[b, start:start + len(sample.output_ids)] = response_step_ids(tokenizer, sample.output_ids)
    num_steps_b = np.array([len(step_spans(text)) for text in rollouts.texts], np.int32)
    return step_ids_bt, num_steps_b


@dataclasses.dataclass(frozen=True)
class _KindsView:
    """`task` with every rubric cut to the item kinds `kinds` (the SUGGEST-only ablation); the rest is the task's."""

    task: Any
    kinds: frozenset

    def rubric(self, example: Any) -> Rubric:
        rubric = self.task.rubric(example)
        return dataclasses.replace(rubric, criteria=tuple(c for c in rubric.criteria if c.kind in self.kinds))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)


def decoupled_advantages(
    config: SRaRConfig,
    base_b: np.ndarray,
    group_ids: np.ndarray,
    verdicts: Verdicts,
    items: RubricArrays,
    num_steps_b: np.ndarray,
    step_ids_bt: np.ndarray,
    response_mask_bt: np.ndarray,
    valid_b: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1, lines 9-17: (A [B, T], the rubric offset r_tilde [B, T]) with A = A_base + r_tilde on the
    response tokens of valid rollouts, 0 elsewhere; r_tilde uses d_bar over the step groups of
    `config.step_groups`, or the raw d without step normalisation."""
    group_ids, valid = jnp.asarray(group_ids), jnp.asarray(valid_b)
    token_mask = jnp.asarray(response_mask_bt) & valid[:, None]
    outcome_b = advantages.grpo_advantages(
        jnp.asarray(base_b), group_ids, valid, std_ddof=config.std_ddof, eps=config.eps)
    delta_bk, members_bk = srar.srar_item_deltas(
        jnp.asarray(verdicts.satisfied_bk), jnp.asarray(items.item_kind_bk), jnp.asarray(items.item_mask_bk),
        config.budgets)
    if config.step_groups == "paper":
        members_bk = srar.srar_attributed_items(jnp.asarray(items.item_mask_bk), jnp.asarray(~verdicts.failed_b))
    step_rewards = srar.srar_step_rewards(delta_bk, members_bk, jnp.asarray(verdicts.item_step_bk))
    if config.step_normalization:
        step_offsets = srar.srar_step_normalize(
            step_rewards, group_ids, valid, std_ddof=config.std_ddof, eps=config.eps)
    else:
        step_offsets = step_rewards._replace(value_bk=jnp.where(valid[:, None], step_rewards.value_bk, 0.0))
    offsets_bt = srar.srar_token_offsets(
        step_offsets, jnp.asarray(num_steps_b), jnp.asarray(step_ids_bt), token_mask)
    advantages_bt = advantages.broadcast_to_tokens(outcome_b, token_mask) + offsets_bt
    return np.asarray(advantages_bt, np.float32), np.asarray(offsets_bt, np.float32)


def merged_advantages(
    config: SRaRConfig,
    base_b: np.ndarray,
    group_ids: np.ndarray,
    verdicts: Verdicts,
    items: RubricArrays,
    num_steps_b: np.ndarray,
    step_ids_bt: np.ndarray,
    response_mask_bt: np.ndarray,
    valid_b: np.ndarray,
) -> np.ndarray:
    """The "w/o decoupled adv." ablation (`core.srar.srar_merged_advantages`), [B, T]."""
    return np.asarray(srar.srar_merged_advantages(
        jnp.asarray(base_b), jnp.asarray(group_ids), jnp.asarray(verdicts.satisfied_bk),
        jnp.asarray(items.item_kind_bk), jnp.asarray(items.item_mask_bk), jnp.asarray(verdicts.item_step_bk),
        jnp.asarray(num_steps_b), jnp.asarray(step_ids_bt), jnp.asarray(response_mask_bt), jnp.asarray(valid_b),
        budgets=config.budgets, std_ddof=config.std_ddof, eps=config.eps), np.float32)


def rar_advantages(
    config: SRaRConfig,
    base_b: np.ndarray,
    group_ids: np.ndarray,
    verdicts: Verdicts,
    items: RubricArrays,
    response_mask_bt: np.ndarray,
    valid_b: np.ndarray,
) -> np.ndarray:
    """The authors' RaR baseline (`compute_rar_advantage`): GRPO of r_base + `core.srar.srar_rubric_total` on every
    response token of the valid rollouts, [B, T]."""
    total_b = jnp.asarray(base_b, jnp.float32) + srar.srar_rubric_total(
        jnp.asarray(verdicts.satisfied_bk), jnp.asarray(items.item_kind_bk), jnp.asarray(items.item_mask_bk),
        config.budgets)
    valid = jnp.asarray(valid_b)
    advantage_b = advantages.grpo_advantages(total_b, jnp.asarray(group_ids), valid, std_ddof=config.std_ddof,
                                             eps=config.eps)
    return np.asarray(advantages.broadcast_to_tokens(advantage_b, jnp.asarray(response_mask_bt) & valid[:, None]),
                      np.float32)


def response_token_mean(values_bt: np.ndarray, response_mask_bt: np.ndarray) -> np.ndarray:
    """[B] float64: each row's mean over its response tokens (0 for a row without any): a token-level advantage
    as one number per rollout (the rollout log's "advantage"). In float64, so a row whose tokens share one float32
    value gets exactly that value."""
    mask_bt = np.asarray(response_mask_bt, bool)
    total = np.where(mask_bt, np.asarray(values_bt, np.float64), 0).sum(axis=1)
    return total / np.maximum(mask_bt.sum(axis=1), 1)


# ---------------------------------------------------------------- analysis metrics (training and eval)


def typed_rubric_metrics(verdicts: Verdicts, items: RubricArrays, budgets: TypedBudgets = TypedBudgets()) -> dict:
    """Per item type, over the rollouts whose rubric has items of that type (failed judgements count as
    unsatisfied): "rate/<type>", the mean fraction of the type's items satisfied (Table 7; for PITFALL the rate
    of falling in), and, for SUGGEST / PITFALL / BONUS, "score/<type>", the mean of the type's summed eq 3 deltas
    (Figure 6's scores, in [0, R_SUG], [-|R_PIT|, 0], [0, R_BON]). "rubric_score": the mean weighted fraction of
    `core.rewards.typed_item_credit` (what a response-level RaR reward would pay). A type no rollout has is absent."""
    satisfied = np.asarray(verdicts.satisfied_bk, np.float32)
    delta_bk, _ = srar.srar_item_deltas(
        jnp.asarray(satisfied), jnp.asarray(items.item_kind_bk), jnp.asarray(items.item_mask_bk), budgets)
    delta_bk = np.asarray(delta_bk)
    metrics = {}
    for kind, name in TYPE_NAMES.items():
        of_type = items.item_mask_bk & (items.item_kind_bk == kind)
        rows = of_type.any(axis=1)
        if not rows.any():
            continue
        metrics[f"rate/{name}"] = float(np.mean((satisfied * of_type).sum(1)[rows] / of_type.sum(1)[rows]))
        if kind != ANSWER:
            metrics[f"score/{name}"] = float(np.mean((delta_bk * of_type).sum(1)[rows]))
    if len(satisfied):
        credit = np.asarray(rewards.typed_item_credit(satisfied, items.item_kind_bk, verdicts.failed_b))
        metrics["rubric_score"] = float(np.mean(rewards.weighted_fraction(
            jnp.asarray(credit), jnp.asarray(items.item_weight_bk), jnp.asarray(items.item_mask_bk))))
    return metrics


@dataclasses.dataclass(frozen=True)
class LoopingReport:
    """Section 4.3.2's four looping criteria of one response: (i) `self_corrections`, the number of
    SELF_CORRECTION phrases (looping above MAX_SELF_CORRECTIONS); (ii) `step_one_repeated`, "### Step 1" written
    more than once; (iii) `repeated_headings`, two step headings alike: the same number, or the same title (the
    rest of the header's line, white space collapsed, case folded, when not empty); (iv)
    `duplicate_paragraph_fraction`, the fraction of paragraphs (blocks between blank lines, stripped, white
    space collapsed) that repeat an earlier one (looping above MAX_DUPLICATE_PARAGRAPH_FRACTION)."""

    self_corrections: int
    step_one_repeated: bool
    repeated_headings: bool
    duplicate_paragraph_fraction: float

    @property
    def looping(self) -> bool:
        """Any of the four criteria holds."""
        return (self.self_corrections > MAX_SELF_CORRECTIONS or self.step_one_repeated
                or self.repeated_headings or self.duplicate_paragraph_fraction > MAX_DUPLICATE_PARAGRAPH_FRACTION)


def _normalized(text: str) -> str:
    return " ".join(text.split()).casefold()


def looping_report(text: str) -> LoopingReport:
    """The four looping criteria of `text` (LoopingReport)."""
    spans = split_steps(text)
    numbers = [span.number for span in spans]
    titles = [_normalized(text[span.start:span.end].split("\n", 1)[0]) for span in spans]
    titles = [title for title in titles if title]
    paragraphs = [_normalized(p) for p in _BLANK_LINE.split(text)]
    paragraphs = [p for p in paragraphs if p]
    repeats = len(paragraphs) - len(set(paragraphs))
    return LoopingReport(
        self_corrections=len(SELF_CORRECTION.findall(text)),
        step_one_repeated=numbers.count(1) > 1,
        repeated_headings=len(set(numbers)) < len(numbers) or len(set(titles)) < len(titles),
        duplicate_paragraph_fraction=repeats / len(paragraphs) if paragraphs else 0.0,
    )


def looping_metrics(texts: Sequence[str]) -> dict[str, float]:
    """Table 3's looping analysis of a batch of responses: "looping_rate" (any criterion), the rate of each
    criterion ("loop/self_corrections", "loop/step_one_repeated", "loop/repeated_headings",
    "loop/duplicate_paragraphs") and "self_corrections_mean" (Mean S-C). {} for no text."""
    if not texts:
        return {}
    reports = [looping_report(text) for text in texts]
    return {
        "looping_rate": float(np.mean([r.looping for r in reports])),
        "loop/self_corrections": float(np.mean([r.self_corrections > MAX_SELF_CORRECTIONS for r in reports])),
        "loop/step_one_repeated": float(np.mean([r.step_one_repeated for r in reports])),
        "loop/repeated_headings": float(np.mean([r.repeated_headings for r in reports])),
        "loop/duplicate_paragraphs": float(np.mean(
            [r.duplicate_paragraph_fraction > MAX_DUPLICATE_PARAGRAPH_FRACTION for r in reports])),
        "self_corrections_mean": float(np.mean([r.self_corrections for r in reports])),
    }


def step_label_metrics(labels: Sequence[Sequence[bool]], correct_b: np.ndarray) -> dict[str, float]:
    """Table 2's step-level analysis from per-step correctness labels of each response and its answer's
    correctness: "step_accuracy", correct steps over all steps (absent when no response has a step); "frr", the
    Faithful Reasoning Rate, the fraction of responses with a correct answer and all steps correct (A✓S✓);
    "mtr", the Misaligned Trajectory Rate, (A✓S✗ + A✗S✓) / total. A response without steps does not have
    all-correct steps (S✗). {} for no response."""
    correct_b = np.asarray(correct_b, bool)
    if len(labels) != len(correct_b):
        raise ValueError(f"got {len(labels)} label lists for {len(correct_b)} responses")
    if not len(labels):
        return {}
    all_steps_correct = np.array([bool(steps) and all(steps) for steps in labels], bool)
    metrics = {
        "frr": float(np.mean(correct_b & all_steps_correct)),
        "mtr": float(np.mean(correct_b != all_steps_correct)),
    }
    total = sum(len(steps) for steps in labels)
    if total:
        metrics["step_accuracy"] = sum(sum(map(bool, steps)) for steps in labels) / total
    return metrics


def analysis_metrics(
    task: Any,
    examples: Sequence[Any],
    texts: Sequence[str],
    correct_b: np.ndarray,
    verdicts: Verdicts,
    rubrics: Sequence[Rubric],
    budgets: TypedBudgets = TypedBudgets(),
) -> dict[str, float]:
    """SRaR's analysis of responses `texts` to `examples` (one example per response) judged into `verdicts`
    against `rubrics`: `typed_rubric_metrics`, `looping_metrics` and, when the task has `step_labels`,
    `step_label_metrics`. Keys without a prefix: the recipe logs them under "srar/", an evaluation under its own."""
    metrics = {**typed_rubric_metrics(verdicts, rubric_arrays(rubrics, verdicts.satisfied_bk.shape[1]), budgets),
               **looping_metrics(texts)}
    if hasattr(task, "step_labels"):
        labels = [task.step_labels(text, example) for text, example in zip(texts, examples)]
        metrics.update(step_label_metrics(labels, correct_b))
    return metrics


# ---------------------------------------------------------------- the recipe


@register("srar", eval_metrics=analysis_metrics)
class SRaR(base.Algorithm):
    config_class = SRaRConfig
    console_metrics = ("srar/format_rate", "srar/steps_mean", "srar/rubric_offset/mean")
    plot_panels = types.MappingProxyType({
        "srar/steps": ("srar/format_rate", "srar/steps_mean", "srar/looping_rate"),
        "srar/rubric_offset": ("srar/rubric_offset/mean", "srar/rubric_offset/std"),
        "srar/item_scores": ("srar/score/suggest", "srar/score/pitfall", "srar/score/bonus"),
    })

    @property
    def negative_weights(self) -> str:
        return "not read: SRaR scores items by type and budget, not weight (a PITFALL item is its penalty)"

    @property
    def policy_loss(self) -> base.PolicyLossConfig:
        return self.config.policy_loss

    def _context(self, context: base.RolloutContext) -> base.RolloutContext:
        if self.config.rubric == "suggest_only":
            kinds = frozenset({ItemKind.SUGGEST, ItemKind.ANSWER})
            return dataclasses.replace(context, task=_KindsView(context.task, kinds))
        return context

    def _prompt(self, task: Any, example: Any):
        if self.config.prompt == "step_format":
            return prompts.step_format_prompt(task.question(example))
        return task.prompt(example)

    def role_prompts(self, task: Any, example: Any, placeholder: str) -> dict[str, list[dict[str, str]]]:
        return {"policy": self._prompt(task, example)}

    def _groups(self, examples: list, context: base.RolloutContext, step: int, gen_batch: int) -> base.GroupBatch:
        """Line 3 and r_acc of generation batch `gen_batch` (`base.dynamic_groups`' `draw`). Line 8 too, each
        group judged as it finishes (`base.sample_and_judge`), unless dynamic sampling re-samples: then the
        groups are judged after the selection (`experience`), so that only the groups that train are judged."""
        task = context.task
        prompts = [self._prompt(task, e) for e in examples]
        if self.config.dynamic_sampling == "resample":
            rollouts, judged = base.sample_groups(prompts, context, step, gen_batch=gen_batch), None
        else:
            judged = base.sample_and_judge(prompts, context, step,
                                           lambda s, text: base.rollout_request(examples[s.prompt_index], text, task),
                                           self.config.max_items, gen_batch=gen_batch)
            rollouts = judged.rollouts
        owners = [examples[s.prompt_index] for s in rollouts.samples]
        correct_b = np.array([self._is_correct(task, t, e) for t, e in zip(rollouts.texts, owners)], bool)
        groups = base.GroupBatch(examples=examples, rollouts=rollouts, correct_b=correct_b)
        if judged is None:
            return groups
        return dataclasses.replace(groups, verdicts=judged.verdicts, rubrics=[r.rubric for r in judged.requests],
                                   requests=judged.requests)

    def _is_correct(self, task: Any, text: str, example: Any) -> bool:
        """r_acc of `config.accuracy` (SRaRConfig)."""
        if self.config.accuracy == "task":
            return task.is_correct(text, example)
        if not hasattr(task, "gold_answer"):
            raise ValueError(f"algorithm.params.accuracy boxed_string compares the box with the gold answer, and "
                             f"task {type(task).__name__} has no gold_answer(example): use accuracy task")
        gold = task.gold_answer(example)
        return gold is not None and boxed_string_correct(text, gold)

    def reward(self, groups: base.GroupBatch, context: base.RolloutContext) -> tuple[np.ndarray, np.ndarray]:
        """Line 6 and the failure policy, for judged `groups`: (r_base [B] float32, valid_b [B] bool: the rows in
        the group and step statistics and the loss, the judged ones under on_judge_failure "exclude")."""
        format_b = np.array([has_step_format(t) for t in groups.rollouts.texts], bool)
        base_b = np.asarray(rewards.srar_base_reward(
            jnp.asarray(groups.correct_b), jnp.asarray(format_b), format_weight=self.config.format_weight))
        if self.config.on_judge_failure == FailurePolicy.EXCLUDE.value:
            return base_b, ~groups.verdicts.failed_b
        return base_b, np.ones(len(base_b), bool)

    def advantage(self, reward_b: np.ndarray, group_ids: np.ndarray, valid_b: np.ndarray, groups: base.GroupBatch,
                  step_ids_bt: np.ndarray, num_steps_b: np.ndarray) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """Lines 9-17 by `config.advantage`, from r_base [B], the group ids [B], the valid rows [B], the judged
        `groups` (verdicts with their steps, rubrics) and the steps of the response tokens (`rollout_steps`):
        (A [B, T] float32 on the response tokens of the valid rows, 0 elsewhere; the decoupled advantage's rubric
        offset r_tilde [B, T], None for the merged and RaR advantages)."""
        config = self.config
        items = rubric_arrays(groups.rubrics, config.max_items)
        mask_bt = groups.rollouts.batch["response_mask_bt"] & valid_b[:, None]
        if config.advantage == "rar":
            return rar_advantages(config, reward_b, group_ids, groups.verdicts, items, mask_bt, valid_b), None
        inputs = (config, reward_b, group_ids, groups.verdicts, items, num_steps_b, step_ids_bt, mask_bt, valid_b)
        if config.advantage == "merged":
            return merged_advantages(*inputs), None
        return decoupled_advantages(*inputs)

    def experience(self, examples: Sequence[Any], context: base.RolloutContext, step: int) -> base.Experience:
        config = self.config
        context = self._context(context)
        task = context.task
        groups, keep_b, sampling_metrics = base.dynamic_groups(
            examples, context, config, lambda batch, gen_batch: self._groups(batch, context, step, gen_batch),
            mixed_accuracy)
        if groups.verdicts is None:  # re-sampled: line 8 on the groups that train only
            groups = base.judge_groups(groups, context, config.max_items)
        rollouts, owners, correct_b = groups.rollouts, groups.owners, groups.correct_b
        group_ids = rollouts.group_ids
        step_ids_bt, num_steps_b = rollout_steps(rollouts, context.tokenizer)
        base_b, valid_b = self.reward(groups, context)
        metrics = dict(sampling_metrics)
        if config.dynamic_sampling != "off":  # per group, so the kept groups' statistics are unchanged
            valid_b = valid_b & keep_b
            metrics["srar/kept_group_fraction"] = kept_group_fraction(keep_b, group_ids)
        advantages_bt, offsets_bt = self.advantage(base_b, group_ids, valid_b, groups, step_ids_bt, num_steps_b)
        batch = dict(rollouts.batch)
        batch["response_mask_bt"] = batch["response_mask_bt"] & valid_b[:, None]
        batch["advantages_bt"] = advantages_bt
        if offsets_bt is not None:
            metrics.update(base.summary_stats("srar/rubric_offset", offsets_bt, batch["response_mask_bt"]))

        verdicts, rubrics = groups.verdicts, groups.rubrics
        metrics.update({
            **base.summary_stats("reward", base_b),
            **base.summary_stats("advantage", advantages_bt, batch["response_mask_bt"]),
            "srar/format_rate": float(np.mean([has_step_format(t) for t in rollouts.texts])),
            "srar/steps_mean": float(np.mean([len(split_steps(t)) for t in rollouts.texts])),
            **{f"srar/{k}": v for k, v in analysis_metrics(
                task, owners, rollouts.texts, correct_b, verdicts, rubrics, config.budgets).items()},
            **base.rubric_metrics(verdicts, rubrics, task),
            **base.rollout_metrics(rollouts, correct_b, task),
        })
        row_advantage_b = response_token_mean(advantages_bt, batch["response_mask_bt"])
        values = base.recipe_values(groups.requests, base_b, row_advantage_b, group_ids)
        return base.Experience(batch=batch, prompt_width=rollouts.prompt_width, metrics=metrics, recipe_values=values)
