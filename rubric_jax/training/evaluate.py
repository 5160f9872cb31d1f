"""Held-out evaluation: accuracy (avg@k, pass@k) and rubric satisfaction of the policy served by an engine.

For E examples and k = `samples_per_example` samples each (greedy when temperature is 0, then k = 1):
- "eval/accuracy": avg@k, the mean over examples of the fraction of their k samples that are correct;
- "eval/pass@k": the fraction of examples with at least one correct sample (k samples drawn, so the plain
  estimate, not the unbiased estimator for n > k);
- "eval/rubric_score": the mean over samples of the weighted fraction of the rubric satisfied
  (`core.rewards.weighted_fraction` of `typed_item_credit`: a typed rubric's PITFALL item counts when avoided;
  judge failures count 0), and "eval/rubric/<name>" per criterion;
- "eval/response_length": the mean number of response tokens;
- "eval/<recipe>/...": the analyses that recipes contribute through the registry
  (`registry.register(name, eval_metrics=fn)`), for each recipe the caller names in `recipes` (the RL trainer:
  its algorithm) and each the task names in its `eval_recipes` attribute (a tuple of registered names; the
  SRaR world, task arithmetic_srar, names "srar"). The task's own list is what `rubric-jax eval`, which has no
  algorithm, and a comparison's evaluation of its SFT model and of every baseline go by, so all report the same
  analysis. Today SRaR contributes one (`algorithms.srar.analysis_metrics`: per-type scores and rates of typed
  rubrics, the looping rate and its four criteria, and, for a task with `step_labels`, step accuracy, FRR, MTR).
"""

from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from rubric_jax.algorithms.base import rubric_metrics
from rubric_jax.algorithms.registry import eval_metrics_fn
from rubric_jax.core import rewards
from rubric_jax.inference.engine import RolloutEngine, SamplingParams
from rubric_jax.judges.base import Judge, JudgeRequest
from rubric_jax.rubrics.schema import rubric_arrays
from rubric_jax.rubrics.steps import response_text, split_steps
from rubric_jax.training.run_config import EvalConfig


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
) -> dict[str, float]:
    """The module docstring's metrics for `examples`, with the analyses of `recipes` and `task.eval_recipes`
    (ValueError for a name no recipe is registered under)."""
    k = config.samples_per_example
    params = SamplingParams(max_new_tokens=max_new_tokens, n=k, temperature=config.temperature, seed=seed)
    samples = engine.generate([task.prompt(e) for e in examples], params)
    texts = [response_text(tokenizer, s.output_ids) for s in samples]
    owners = [examples[s.prompt_index] for s in samples]
    correct = np.array([task.is_correct(t, e) for t, e in zip(texts, owners)], bool).reshape(len(examples), k)
    rubrics = [task.rubric(e) for e in owners]
    max_items = max(len(r.criteria) for r in rubrics)
    verdicts = judge.judge([
        JudgeRequest(task.question(e), t, r, task.reference(e), len(split_steps(t)))
        for e, t, r in zip(owners, texts, rubrics)], max_items)
    items = rubric_arrays(rubrics, max_items)
    credit_bk = rewards.typed_item_credit(
        jnp.asarray(verdicts.satisfied_bk), jnp.asarray(items.item_kind_bk), jnp.asarray(verdicts.failed_b))
    scores = np.asarray(rewards.weighted_fraction(
        credit_bk, jnp.asarray(items.item_weight_bk), jnp.asarray(items.item_mask_bk)))
    metrics = {
        "eval/accuracy": float(correct.mean()),
        f"eval/pass@{k}": float(correct.any(axis=1).mean()),
        "eval/rubric_score": float(scores.mean()),
        "eval/response_length": float(np.mean([len(s.output_ids) for s in samples])),
    }
    metrics.update({f"eval/{name}": value for name, value in rubric_metrics(verdicts, rubrics).items()})
    for recipe in dict.fromkeys((*recipes, *getattr(task, "eval_recipes", ()))):
        analysis = eval_metrics_fn(recipe)
        if analysis is not None:
            metrics.update({f"eval/{recipe}/{name}": value for name, value in analysis(
                task, owners, texts, correct.reshape(-1), verdicts, rubrics).items()})
    return metrics
