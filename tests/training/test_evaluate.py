"""Held-out evaluation: the recipes' analyses come through the registry, for the recipes the caller names and those
the task names (`eval_recipes`), and evaluate itself knows no recipe."""

import pytest

from rubric_jax.algorithms import registry, srar
from rubric_jax.data import arithmetic
from rubric_jax.data.tasks import build_task
from rubric_jax.inference.engine import Sample
from rubric_jax.training.evaluate import evaluate
from rubric_jax.training.run_config import EvalConfig


class ScriptedEngine:
    """Answers prompt i with responses[i], one sample per prompt."""

    def __init__(self, tokenizer, responses):
        self.ids = [tuple(tokenizer.encode(text, add_special_tokens=False)) for text in responses]

    def generate(self, prompts, params):
        assert params.n == 1 and len(prompts) == len(self.ids)
        return [Sample(prompt_index=i, output_ids=ids, logprobs=(0.0,) * len(ids), finish_reason="stop",
                       matched_stop=None, weight_version="scripted") for i, ids in enumerate(self.ids)]


def run_evaluate(task_name, **kwargs):
    """Two held-out problems: the first answered with its gold solution (answer and every step right), the second
    with a wrong boxed answer and no step (answer wrong, steps not all right: a response without steps)."""
    task = build_task(task_name, {}, 0)
    examples = task.eval_examples(2)
    tokenizer = arithmetic.build_tokenizer()
    responses = [arithmetic.solution_text(examples[0]), f"\\boxed{{{examples[1].answer + 1}}}"]
    return evaluate(ScriptedEngine(tokenizer, responses), tokenizer, task, task.judge(), examples, EvalConfig(),
                    max_new_tokens=64, seed=0, **kwargs)


def test_the_task_names_the_recipes_whose_analysis_an_evaluation_reports():
    metrics = run_evaluate("arithmetic_srar")
    assert metrics["eval/accuracy"] == 0.5
    # A✓S✓ and A✗S✗: FRR 1/2, MTR 0; only the first response has steps, all correct
    assert metrics["eval/srar/frr"] == 0.5 and metrics["eval/srar/mtr"] == 0.0
    assert metrics["eval/srar/step_accuracy"] == 1.0
    assert "eval/srar/looping_rate" in metrics


def test_the_caller_names_recipes_too():
    plain = run_evaluate("arithmetic")
    assert not any(key.startswith("eval/srar/") for key in plain)
    with_srar = run_evaluate("arithmetic", recipes=("srar",))
    srar_keys = {key for key in with_srar if key.startswith("eval/srar/")}
    assert srar_keys and with_srar.keys() - srar_keys == plain.keys()
    # a recipe without an analysis adds nothing; a name no recipe has is an error
    assert run_evaluate("arithmetic", recipes=("grpo",)).keys() == plain.keys()
    with pytest.raises(ValueError, match="unknown recipe 'nope'"):
        run_evaluate("arithmetic", recipes=("nope",))


def test_registry_holds_each_recipes_analysis():
    assert registry.eval_metrics_fn("srar") is srar.analysis_metrics
    assert registry.eval_metrics_fn("grpo") is None
    with pytest.raises(ValueError, match="unknown recipe"):
        registry.eval_metrics_fn("nope")
