"""Held-out evaluation: accuracy (avg@k, pass@k) and rubric satisfaction of the policy served by an engine.

For E examples and k = `samples_per_example` samples each (greedy when temperature is 0, then k = 1):
- "eval/accuracy": avg@k, the mean over examples of the fraction of their k samples that are correct;
- "eval/pass@k": the fraction of examples with at least one correct sample (k samples drawn, so the plain
  estimate, not the unbiased estimator for n > k); neither (nor "eval/tag/<tag>/accuracy") for a task without
  outcome answers (`algorithms.base.has_outcome`: a dataset task with `answer_kind: none`);
- "eval/rubric_score": the mean over samples of the weighted fraction of the rubric satisfied
  (`core.rewards.weighted_fraction` of `typed_item_credit`: a typed rubric's PITFALL item counts when avoided;
  judge failures count 0), and "eval/rubric/<name>" or "eval/rubric/tag/<tag>" per criterion
  (`algorithms.base.criterion_metric_keys`); none when no example has a rubric (a dataset without rubrics, a
  benchmark): a constant 0 would read as a policy that meets nothing;
- "eval/points_score" (rubrics with signed points only, e.g. HealthBench): the HealthBench score, points of the
  met criteria, penalties included, over the positive points, its mean over samples clipped to [0, 1];
- "eval/tag/<tag>/..." and "eval/item_tag/<tag>/points_score": per-tag breakdowns (`tag_metrics`) for
  examples and criteria that carry tags;
- "eval/response_length": the mean number of response tokens;
- "eval/failed_samples": the samples the engine failed (`Sample.failure`: an SGLang abort, a NaN met, a prompt's
  request that failed for good), only when there are any; they count as wrong answers;
- "eval/judge/failure_rate": the fraction of samples whose verdict failed (always reported, 0 when none did), and
  "eval/judge/failed/<reason>" their counts by reason; `rubric-jax eval` holds the rate to the judge's failure
  budget (`benchmark.judge_failure`), the RL trainer logs it with each in-training evaluation;
- for a judge over HTTP, what it used (`training.accounting`, `evaluation_metrics`): "eval/judge/requests",
  "eval/judge/request_failures", "eval/judge/prompt_tokens", "eval/judge/completion_tokens",
  "eval/judge/requests_without_usage", "eval/judge/latency_p50_s" and "eval/judge/latency_p95_s" (of its
  successful requests), and "eval/judge/cost" (USD) when the judge has a price (`judge_price`);
- "eval/<recipe>/...": the analyses that recipes contribute through the registry
  (`registry.register(name, eval_metrics=fn)`), for each recipe the caller names in `recipes` (the RL trainer:
  its algorithm) and each the task names in its `eval_recipes` attribute (a tuple of registered names; the
  SRaR world, task arithmetic_srar, names "srar"). The task's own list is what `rubric-jax eval`, which has no
  algorithm, and a comparison's evaluation of its SFT model and of every baseline go by, so all report the same
  analysis. Today SRaR contributes one (`algorithms.srar.analysis_metrics`: per-type scores and rates of typed
  rubrics, the looping rate and its four criteria, and, for a task with `step_labels`, step accuracy, FRR, MTR).

Sampling is the eval section's (`EvalConfig.sampling_params`): temperature, top-p, SGLang's presence, frequency
and repetition penalties, and its own `max_new_tokens` or else the caller's.

Benchmarks (`EvalConfig.benchmarks`): `training.assembly.benchmark_tasks` reads each benchmark's rows once
(training builds no task), `evaluate_benchmarks` evaluates them, each with its own sampling
(`EvalConfig.for_benchmark`) and its preset's answer check as the judge, and reports the metrics above under
"benchmark/<name>/" instead of "eval/": "benchmark/<name>/accuracy" (Avg@n, n = its samples_per_example),
"benchmark/<name>/pass@n", "benchmark/<name>/response_length", the recipes' analyses (SRaR's looping rate on
AIME 2025, ...). A benchmark has no rubric, so it reports no rubric metrics.
"""

import contextlib
import math
import os
from typing import Any, Callable, Mapping, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from rubric_jax.algorithms.base import has_outcome, rubric_metrics
from rubric_jax.algorithms.registry import eval_metrics_fn
from rubric_jax.core import rewards
from rubric_jax.inference.engine import RolloutEngine
from rubric_jax.judges.base import Judge, JudgeRequest, Verdicts
from rubric_jax.rubrics.schema import RubricArrays, rubric_arrays
from rubric_jax.rubrics.steps import response_text, split_steps
from rubric_jax.training.accounting import evaluation_metrics, metered
from rubric_jax.training.assembly import saved_model_engine
from rubric_jax.training.run_config import EvalConfig, TokenPrice


def evaluate(
    engine: RolloutEngine,
    tokenizer: Any,
    task: Any,
    judge: Judge,
    examples: Sequence[Any],
    config: EvalConfig,
    *,
    max_new_tokens: int,
    seed: int,
    recipes: Sequence[str] = (),
    chunk_examples: Optional[int] = None,
    progress: Optional[Callable[[int], None]] = None,
    on_judged: Optional[Callable[[Sequence[JudgeRequest], Verdicts], None]] = None,
    judge_price: Optional[TokenPrice] = None,
) -> dict[str, float]:
    """The module docstring's metrics for `examples`, with the analyses of `recipes` and `task.eval_recipes`
    (ValueError for a name no recipe is registered under), sampled as `config` says, up to `max_new_tokens`
    tokens when `config` sets no budget of its own; the judge's cost at `judge_price` (None: none reported).

    `chunk_examples`: sample and judge that many examples at a time (None: all at once), chunk i sampled with seed
    `seed + i`, and `progress(n)` called after each chunk with its number of examples (a progress bar's update).
    `on_judged(requests, verdicts)` is called with each chunk's judge requests and verdicts, in sample order (e.g.
    `records.FirstJudged`, to keep sample generations)."""
    k = config.samples_per_example
    step = chunk_examples or max(len(examples), 1)
    rubrics_e = [task.rubric(e) for e in examples]
    max_items = max((len(r.criteria) for r in rubrics_e), default=0)
    lengths, texts, owners, rubrics, parts, failed = [], [], [], [], [], 0
    with metered(judge) as judging:
        for i, start in enumerate(range(0, len(examples), step)):
            chunk = examples[start:start + step]
            params = config.sampling_params(max_new_tokens, seed + i)
            samples = engine.generate([task.prompt(e) for e in chunk], params)
            chunk_texts = [response_text(tokenizer, s.output_ids) for s in samples]
            chunk_owners = [chunk[s.prompt_index] for s in samples]
            chunk_rubrics = [rubrics_e[start + s.prompt_index] for s in samples]
            requests = [
                JudgeRequest(task.question(e), t, r, task.reference(e), len(split_steps(t)), tuple(task.prompt(e)))
                for e, t, r in zip(chunk_owners, chunk_texts, chunk_rubrics)]
            parts.append(judge.judge(requests, max_items))
            if on_judged is not None:
                on_judged(requests, parts[-1])
            lengths += [len(s.output_ids) for s in samples]
            failed += sum(bool(s.failure) for s in samples)
            texts, owners, rubrics = texts + chunk_texts, owners + chunk_owners, rubrics + chunk_rubrics
            if progress is not None:
                progress(len(chunk))
    verdicts = Verdicts.concatenate(parts)
    correct = np.array([task.is_correct(t, e) for t, e in zip(texts, owners)], bool).reshape(len(examples), k)
    items = rubric_arrays(rubrics, max_items)
    credit_bk = rewards.typed_item_credit(
        jnp.asarray(verdicts.satisfied_bk), jnp.asarray(items.item_kind_bk), jnp.asarray(verdicts.failed_b))
    scores = np.asarray(rewards.weighted_fraction(
        credit_bk, jnp.asarray(items.item_weight_bk), jnp.asarray(items.item_mask_bk)))
    outcome = has_outcome(task)
    metrics = evaluation_metrics("eval/judge", judging, judge_price)
    if outcome:
        metrics.update({"eval/accuracy": float(correct.mean()), f"eval/pass@{k}": float(correct.any(axis=1).mean())})
    if max_items:
        metrics["eval/rubric_score"] = float(scores.mean())
    metrics["eval/response_length"] = float(np.mean(lengths))
    if failed:  # the engine's failures (`Sample.failure`), judged and counted as they came: wrong, scored 0
        metrics["eval/failed_samples"] = float(failed)
    signed = bool((items.item_mask_bk & (items.item_weight_bk < 0)).any())
    if signed:
        metrics["eval/points_score"] = clipped_mean(points_scores(verdicts, items, items.item_mask_bk))
    metrics.update(tag_metrics(owners, correct.reshape(-1) if outcome else None, scores if max_items else None,
                               verdicts, items, rubrics, signed))
    metrics.update({f"eval/{name}": value for name, value in rubric_metrics(verdicts, rubrics, task).items()})
    for recipe in dict.fromkeys((*recipes, *getattr(task, "eval_recipes", ()))):
        analysis = eval_metrics_fn(recipe)
        if analysis is not None:
            metrics.update({f"eval/{recipe}/{name}": value for name, value in analysis(
                task, owners, texts, correct.reshape(-1), verdicts, rubrics).items()})
    return metrics


def evaluate_benchmarks(
    engine: RolloutEngine,
    tokenizer: Any,
    benchmarks: dict[str, tuple[Any, list]],
    config: EvalConfig,
    *,
    max_new_tokens: int,
    seed: int,
    recipes: Sequence[str] = (),
) -> dict[str, float]:
    """`evaluate` of each benchmark (name -> (task, examples), `training.assembly.benchmark_tasks`) with its own
    sampling (`config.for_benchmark(name)`) and its task's answer check as the judge, the metrics keyed
    "benchmark/<name>/..." for "eval/..."."""
    metrics = {}
    for name, (task, examples) in benchmarks.items():
        found = evaluate(engine, tokenizer, task, task.judge(), examples, config.for_benchmark(name),
                         max_new_tokens=max_new_tokens, seed=seed, recipes=recipes)
        metrics.update({f"benchmark/{name}/{key.removeprefix('eval/')}": value for key, value in found.items()})
    return metrics


def points_scores(verdicts: Verdicts, items: RubricArrays, counted_bk: np.ndarray) -> np.ndarray:
    """Each sample's HealthBench score over the items in `counted_bk` (`core.rewards.positive_points_score`:
    points of the met items, penalties included, over the positive points), NaN where those items have no
    positive points (HealthBench leaves such a sample out of that tag's mean)."""
    score = np.asarray(rewards.positive_points_score(
        jnp.asarray(verdicts.satisfied_bk), jnp.asarray(items.item_weight_bk), jnp.asarray(counted_bk)))
    positive = (np.where(counted_bk, items.item_weight_bk, 0) > 0).any(axis=1)
    return np.where(positive, score, np.nan)


def clipped_mean(values: np.ndarray) -> float:
    """HealthBench's aggregate: the mean of the defined values clipped to [0, 1] (a sample's own score may be
    negative; the mean is clipped, not each score); NaN when none is defined."""
    values = values[~np.isnan(values)]
    return float(np.clip(values.mean(), 0.0, 1.0)) if values.size else math.nan


def tag_metrics(owners: Sequence[Any], correct_s: Optional[np.ndarray], rubric_scores_s: Optional[np.ndarray],
                verdicts: Verdicts, items: RubricArrays, rubrics: Sequence[Any], signed: bool) -> dict[str, float]:
    """Per-tag breakdowns, for tasks whose examples or criteria carry tags (a dataset task's `tags` column,
    HealthBench's "theme:..." and "axis:..."):
    - "eval/tag/<tag>/accuracy" (unless `correct_s` is None: a task without outcome answers), ".../rubric_score"
      (unless `rubric_scores_s` is None: examples without rubrics) (and ".../points_score" for signed rubrics): the samples of the examples with that tag;
    - "eval/item_tag/<tag>/points_score": each sample scored on only the criteria with that tag (HealthBench's
      rubric-level tags), over the samples whose tagged criteria have positive points, mean clipped to [0, 1]."""
    metrics: dict[str, float] = {}
    example_tags = [tuple(getattr(owner, "tags", ())) for owner in owners]
    points = points_scores(verdicts, items, items.item_mask_bk) if signed else None
    for tag in sorted({t for tags in example_tags for t in tags}):
        rows = np.array([tag in tags for tags in example_tags])
        if correct_s is not None:
            metrics[f"eval/tag/{tag}/accuracy"] = float(correct_s[rows].mean())
        if rubric_scores_s is not None:
            metrics[f"eval/tag/{tag}/rubric_score"] = float(rubric_scores_s[rows].mean())
        if points is not None:
            metrics[f"eval/tag/{tag}/points_score"] = clipped_mean(points[rows])
    item_tags = sorted({t for rubric in rubrics for c in rubric.criteria for t in c.tags})
    for tag in item_tags:
        tagged = np.zeros_like(items.item_mask_bk)
        for b, rubric in enumerate(rubrics):
            tagged[b, :len(rubric.criteria)] = [tag in c.tags for c in rubric.criteria]
        metrics[f"eval/item_tag/{tag}/points_score"] = clipped_mean(points_scores(verdicts, items, tagged))
    return metrics


def evaluate_saved_model(model_dir: str | os.PathLike, task: Any, config: EvalConfig, *, max_new_tokens: int, seed: int,
                         chat_template_kwargs: Optional[Mapping[str, Any]] = None) -> dict[str, float]:
    """`evaluate` of the Hugging Face policy saved in `model_dir` (the embedded sampler,
    `assembly.saved_model_engine`) on the task's first `config.num_examples` held-out examples, judged by the
    task's own judge, its prompts rendered with `chat_template_kwargs`."""
    engine, tokenizer = saved_model_engine(model_dir, seed=seed, chat_template_kwargs=chat_template_kwargs)
    with contextlib.closing(engine):
        return evaluate(engine, tokenizer, task, task.judge(), task.eval_examples(config.num_examples), config,
                        max_new_tokens=max_new_tokens, seed=seed)
