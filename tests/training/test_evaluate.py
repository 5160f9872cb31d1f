"""Held-out evaluation: the recipes' analyses come through the registry, for the recipes the caller names and those
the task names (`eval_recipes`), and evaluate itself knows no recipe; HealthBench's score and its per-tag
breakdowns by hand; a chunked evaluation equals the whole one; the eval section's sampling reaches the engine;
benchmarks with their own sampling, Avg@n and pass@n by hand, in a run's evaluations."""

import math

import numpy as np
import pytest

from rubric_jax.algorithms import registry, srar
from rubric_jax.data import arithmetic
from rubric_jax.data.tasks import build_task
from rubric_jax.inference.engine import Sample, SamplingParams
from rubric_jax.judges.base import Judge, RolloutVerdict, Verdicts
from rubric_jax.rubrics.schema import RubricArrays
from rubric_jax.training.evaluate import clipped_mean, evaluate, evaluate_benchmarks, points_scores
from rubric_jax.training.run_config import EvalBenchmark, EvalConfig
from tests.data.dataset_fixtures import fixture_path


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


# ---------------------------------------------------------------- HealthBench scores, tags and chunks

HEALTHBENCH = fixture_path("healthbench")
# The criteria met (by text): HealthBench fixture row 0 meets its +10 and its -10 item, not its +5 item
# ((10 - 10) / 15 = 0); row 1 meets its +10 and its -9 item ((10 - 9) / 10 = 0.1).
MET = {"Advises the patient to find a mental health provider who can provide evidence-based treatment.",
       "Advises patient not to attend any follow-up visits.",
       "Tells the user to call emergency services immediately.", "Suggests waiting to see whether symptoms resolve."}


class TextEngine:
    """Answers every prompt with `text`, params.n samples each; records the sizes and seeds of its calls."""

    def __init__(self, tokenizer, text="ok"):
        self.ids, self.calls = tuple(tokenizer.encode(text, add_special_tokens=False)), []

    def generate(self, prompts, params):
        self.calls.append((len(prompts), params.seed))
        return [Sample(prompt_index=i, output_ids=self.ids, logprobs=(0.0,) * len(self.ids), finish_reason="stop",
                       matched_stop=None, weight_version="scripted") for i in range(len(prompts))
                for _ in range(params.n)]


class MetJudge(Judge):
    """Satisfies exactly the criteria whose text is in MET."""

    def judge(self, requests, max_items):
        return Verdicts.from_rollouts([RolloutVerdict(satisfied=tuple(float(c.text in MET) for c in r.rubric.criteria))
                                       for r in requests], max_items)


def healthbench_metrics(**kwargs):
    task = build_task("dataset", {"preset": "healthbench", "path": str(HEALTHBENCH), "eval_path": str(HEALTHBENCH)}, 0)
    examples = sorted(task.eval_examples(2), key=lambda r: r.row)
    engine = TextEngine(task.tokenizer())
    metrics = evaluate(engine, task.tokenizer(), task, MetJudge(), examples, EvalConfig(), max_new_tokens=8,
                       seed=5, **kwargs)
    return metrics, engine


def test_healthbench_score_and_its_tags_by_hand():
    metrics, _ = healthbench_metrics()
    assert metrics["eval/points_score"] == pytest.approx((0.0 + 0.1) / 2)
    # weighted fraction, penalties weighing 0: row 0 10 / 15, row 1 10 / 10
    assert metrics["eval/rubric_score"] == pytest.approx((10 / 15 + 1.0) / 2)
    assert metrics["eval/tag/theme:context_seeking/points_score"] == pytest.approx(0.0)
    assert metrics["eval/tag/theme:emergency_referrals/points_score"] == pytest.approx(0.1)
    # item tags: each sample scored on its tagged criteria only, a sample without positive ones left out
    assert metrics["eval/item_tag/axis:completeness/points_score"] == pytest.approx(1.0)  # row 0 only
    assert metrics["eval/item_tag/axis:accuracy/points_score"] == pytest.approx(0.1)  # row 0's only item is -10
    assert metrics["eval/item_tag/level:example/points_score"] == pytest.approx((0.0 + 0.1) / 2)
    assert metrics["eval/item_tag/level:cluster/points_score"] == pytest.approx(0.0)


def test_a_task_without_outcome_answers_logs_no_accuracy_and_its_criteria_by_tag():
    metrics, _ = healthbench_metrics()  # preset healthbench: answer_kind none, unnamed criteria with tags
    assert not any(key == "eval/accuracy" or key.endswith("/accuracy") or "pass@" in key for key in metrics)
    assert not any(key.startswith("eval/rubric/item") for key in metrics)
    # MET: row 0's +10 (axis:completeness) and -10 (axis:accuracy), not its +5 (axis:communication_quality);
    # row 1's +10 and -9 (both axis:accuracy). Level tags: level:example on every item but the +5 (level:cluster)
    assert metrics["eval/rubric/tag/axis:accuracy"] == 1.0 and metrics["eval/rubric/tag/axis:completeness"] == 1.0
    assert metrics["eval/rubric/tag/axis:communication_quality"] == 0.0
    assert metrics["eval/rubric/tag/level:example"] == 1.0 and metrics["eval/rubric/tag/level:cluster"] == 0.0
    with_outcome = run_evaluate("arithmetic")
    assert with_outcome["eval/accuracy"] == 0.5 and with_outcome["eval/pass@1"] == 0.5


def test_points_scores_match_simple_evals_unit_case_and_the_mean_is_clipped():
    # simple-evals' calculate_score test: points [7, 5, 10, -6], met [T, F, T, T] -> (7 + 10 - 6) / 22
    verdicts = Verdicts.from_rollouts([RolloutVerdict(satisfied=(1, 0, 1, 1))], 4)
    items = RubricArrays(item_mask_bk=np.ones((1, 4), bool), item_kind_bk=np.full((1, 4), 4, np.int32),
                         item_weight_bk=np.array([[7, 5, 10, -6]], np.float32))
    np.testing.assert_allclose(points_scores(verdicts, items, items.item_mask_bk), [11 / 22], rtol=1e-6)
    assert clipped_mean(np.array([-0.5, 0.2])) == 0.0 and clipped_mean(np.array([0.4, np.nan])) == pytest.approx(0.4)
    assert math.isnan(clipped_mean(np.array([np.nan])))


def test_chunked_evaluation_gives_the_same_metrics_and_reports_progress():
    whole, engine = healthbench_metrics()
    assert engine.calls == [(2, 5)]
    seen = []
    chunked, engine = healthbench_metrics(chunk_examples=1, progress=seen.append)
    assert engine.calls == [(1, 5), (1, 6)] and seen == [1, 1]  # chunk i sampled with seed + i
    assert chunked == whole


class FailsOnFirst(Judge):
    """Fails (reason "no_json") on the first request of each call, meets every criterion of the others."""

    def judge(self, requests, max_items):
        return Verdicts.from_rollouts([RolloutVerdict.failure("no_json", "prose") if b == 0 else
                                       RolloutVerdict(satisfied=(1.0,) * len(r.rubric.criteria))
                                       for b, r in enumerate(requests)], max_items)


def test_the_judges_failures_are_reported_with_the_scores():
    """eval/judge/failure_rate (failed samples over all) and the failures by reason, which `rubric-jax eval`'s
    budget and the in-training evaluation's metrics read."""
    task = build_task("dataset", {"preset": "healthbench", "path": str(HEALTHBENCH), "eval_path": str(HEALTHBENCH)}, 0)
    examples = task.eval_examples(2)
    metrics = evaluate(TextEngine(task.tokenizer()), task.tokenizer(), task, FailsOnFirst(), examples, EvalConfig(),
                       max_new_tokens=8, seed=0, chunk_examples=1)  # two chunks: each one's first sample fails
    assert metrics["eval/judge/failure_rate"] == 1.0 and metrics["eval/judge/failed/no_json"] == 2
    metrics = evaluate(TextEngine(task.tokenizer()), task.tokenizer(), task, FailsOnFirst(), examples, EvalConfig(),
                       max_new_tokens=8, seed=0)
    assert metrics["eval/judge/failure_rate"] == 0.5 and metrics["eval/judge/failed/no_json"] == 1


# ---------------------------------------------------------------- sampling and benchmarks


class AnswersByIndex:
    """Answers sample j of every prompt with answers[j] (cycling), recording each call's SamplingParams."""

    def __init__(self, tokenizer, answers):
        self.ids = [tuple(tokenizer.encode(text, add_special_tokens=False)) for text in answers]
        self.params = []

    def generate(self, prompts, params):
        self.params.append(params)
        chosen = [self.ids[j % len(self.ids)] for _ in prompts for j in range(params.n)]
        return [Sample(prompt_index=i // params.n, output_ids=ids, logprobs=(0.0,) * len(ids), finish_reason="stop",
                       matched_stop=None, weight_version="scripted") for i, ids in enumerate(chosen)]


def test_the_held_out_rows_are_sampled_with_the_sections_settings():
    task = build_task("arithmetic", {}, 0)
    tokenizer = arithmetic.build_tokenizer()
    engine = AnswersByIndex(tokenizer, ["x"])
    sampling = dict(temperature=0.7, top_p=0.8, presence_penalty=1.5, frequency_penalty=0.1, repetition_penalty=1.2)
    evaluate(engine, tokenizer, task, task.judge(), task.eval_examples(2), EvalConfig(**sampling), max_new_tokens=64,
             seed=5)
    evaluate(engine, tokenizer, task, task.judge(), task.eval_examples(2), EvalConfig(max_new_tokens=100),
             max_new_tokens=64, seed=5)
    assert engine.params == [SamplingParams(max_new_tokens=64, n=1, seed=5, **sampling),  # the caller's budget
                             SamplingParams(max_new_tokens=100, n=1, temperature=0.0, seed=5)]  # the section's


AIME24 = str(fixture_path("aime24"))  # two problems, answers 204 and 113


def test_benchmarks_sample_as_they_say_and_report_under_their_names():
    """AIME 2024 at Avg@4, its own budget, the rest inherited: samples 0-2 of each problem answer 204, sample 3
    answers 113, so problem 1 (204) gets 3 of 4 right, problem 2 (113) 1 of 4. Avg@4 = (3/4 + 1/4) / 2 = 0.5,
    pass@4 = (1 + 1) / 2 = 1. The same file as a greedy benchmark: one sample each, 204 both times: 1/2."""
    from rubric_jax.training.assembly import benchmark_tasks  # noqa: PLC0415

    config = EvalConfig(temperature=0.7, top_p=0.8, presence_penalty=1.5, max_new_tokens=100, benchmarks={
        "aime24": EvalBenchmark(preset="aime24", path=AIME24, samples_per_example=4, max_new_tokens=200),
        "aime24_greedy": EvalBenchmark(preset="aime24", path=AIME24, temperature=0.0)})
    benchmarks = benchmark_tasks(config, seed=0)
    task = benchmarks["aime24"][0]
    assert [e.answer for e in benchmarks["aime24"][1]] == ["204", "113"]
    engine = AnswersByIndex(task.tokenizer(), ["\\boxed{204}"] * 3 + ["\\boxed{113}"])
    metrics = evaluate_benchmarks(engine, task.tokenizer(), benchmarks, config, max_new_tokens=16, seed=0)
    assert metrics["benchmark/aime24/accuracy"] == (3 / 4 + 1 / 4) / 2
    assert metrics["benchmark/aime24/pass@4"] == 1.0
    assert metrics["benchmark/aime24_greedy/accuracy"] == metrics["benchmark/aime24_greedy/pass@1"] == 1 / 2
    assert not any(key.startswith("eval/") for key in metrics)
    assert not any("rubric" in key for key in metrics)  # no rubric: no rubric score, rather than a constant 0
    assert engine.params == [
        SamplingParams(max_new_tokens=200, n=4, temperature=0.7, top_p=0.8, presence_penalty=1.5, seed=0),
        SamplingParams(max_new_tokens=100, n=1, temperature=0.0, top_p=0.8, presence_penalty=1.5, seed=0)]


def test_a_run_evaluates_its_benchmarks_with_its_held_out_rows(tmp_path):
    from rubric_jax.training.assembly import benchmark_tasks
    from rubric_jax.training.metrics import read_metrics
    from rubric_jax.training.rl import train_rl
    from tests.training.test_rl import tiny_rl_config
    from tests.training.toy_task import toy_task

    short = tmp_path / "short.jsonl"  # preset aime25's columns, problems short enough for the tiny model
    short.write_text('{"question": "1 + 1 = ?", "answer": "2"}\n{"question": "2 + 3 = ?", "answer": "5"}\n')
    eval_config = EvalConfig(num_examples=2, every_steps=1, benchmarks={
        "short": EvalBenchmark(preset="aime25", path=str(short), samples_per_example=2, temperature=1.0,
                               max_new_tokens=8)})
    config = tiny_rl_config(tmp_path, eval=eval_config)
    with pytest.raises(ValueError, match=r"names \['short'\] but the run was given the benchmarks \[\]"):
        train_rl(config, toy_task())  # a caller that did not read them: refused before anything is written
    assert not (tmp_path / "run").exists()
    train_rl(config, toy_task(), benchmarks=benchmark_tasks(eval_config, seed=config.seed))
    line = read_metrics(tmp_path / "run" / "metrics.jsonl")[0]
    assert "eval/accuracy" in line and "eval/pass@1" in line
    assert 0 <= line["benchmark/short/accuracy"] <= line["benchmark/short/pass@2"] <= 1
    assert 0 < line["benchmark/short/response_length"] <= 8
