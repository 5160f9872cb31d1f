"""`rubric-jax eval` on every preset's fixture: the evaluation (a scripted policy and judge, so that the expected
scores are known) gives avg@k for the presets with a gold answer and the weighted rubric score for those with a
rubric, each checked against a plain loop over the fixture's rubrics; its report (markdown, samples, strict JSON);
and the evaluation benchmarks of a run, read as eval reads a dataset."""

import json
import math

import pytest

from rubric_jax.commands import eval as eval_command
from rubric_jax.data import presets
from rubric_jax.training import assembly
from rubric_jax.data.tasks import build_task
from rubric_jax.judges.base import Judge, RolloutVerdict, Verdicts
from rubric_jax.rubrics.schema import ItemKind
from rubric_jax.training.run_config import EvalBenchmark, EvalConfig
from tests.data.dataset_fixtures import fixture_path
from tests.training.test_evaluate import TextEngine


class AllMet(Judge):
    """Every criterion satisfied."""

    def judge(self, requests, max_items):
        return Verdicts.from_rollouts([RolloutVerdict(satisfied=(1.0,) * len(r.rubric.criteria)) for r in requests],
                                      max_items)


def expected_rubric_score(rubrics) -> float:
    """Every criterion met: a PITFALL earns nothing (it was fallen into), a negative weight counts 0."""
    scores = []
    for rubric in rubrics:
        weights = [max(c.weight, 0.0) for c in rubric.criteria]
        earned = [w * (c.kind != ItemKind.PITFALL) for w, c in zip(weights, rubric.criteria)]
        scores.append(sum(earned) / sum(weights) if sum(weights) else 0.0)
    return sum(scores) / len(scores)


@pytest.mark.parametrize("preset", sorted(presets.PRESETS))
def test_every_preset_evaluates_with_known_scores(preset):
    task = build_task("dataset", eval_command.dataset_params(preset, str(fixture_path(preset))), 0)
    examples = task.eval_examples(int(task.data_metrics()["data/eval_rows"]))
    assert len(examples) == len(task.train_stream(0).next_batch(len(examples)))  # the whole file is evaluated
    first = examples[0]
    answer = f"\\boxed{{{first.answer}}}" if first.answer is not None else "I do not know."
    tokenizer = task.tokenizer()
    judge = AllMet() if task.config.columns.rubric is not None else task.judge()
    metrics = eval_command.evaluate_model(TextEngine(tokenizer, answer), tokenizer, task, judge, examples,
                                       EvalConfig(samples_per_example=2, temperature=1.0), max_new_tokens=8, seed=0,
                                       chunk_examples=1)
    if task.config.answer_kind == "none":  # no answers to check: no accuracy metric at all
        assert not any(key.endswith("accuracy") or "pass@" in key for key in metrics if "/rubric/" not in key)
    else:
        expected_accuracy = sum(task.is_correct(answer, e) for e in examples) / len(examples)
        assert metrics["eval/accuracy"] == pytest.approx(expected_accuracy)
    if first.answer is not None:
        assert task.is_correct(answer, first) and metrics["eval/accuracy"] > 0
    if any(e.rubric.criteria for e in examples):
        assert metrics["eval/rubric_score"] == pytest.approx(expected_rubric_score([e.rubric for e in examples]))
    else:  # an answers-only benchmark reports no rubric score, rather than a constant 0
        assert not any("rubric" in key for key in metrics)
    report = eval_command.markdown_report(metrics, preset)
    assert report.startswith(f"# {preset}\n\n| metric | value |\n|---|---|\n| {next(iter(metrics))} | ")


def test_samples_markdown_fences_model_text_so_it_cannot_close_its_fence():
    """A response holding a fence of its own and a heading stays inside a longer fence; criteria are one line each,
    marked met, not met, partial or unjudged, with their weights."""
    response = "```\n# Forged heading\n```````\nstill the response"
    samples = [
        {"id": "eval/0", "question": "2 + 3?", "response": response, "rubric_score": 0.5, "judge_failure": None,
         "criteria": [{"text": "states\nthe sum", "weight": 2.0, "satisfied": 1.0},
                      {"text": "is brief", "weight": -1.0, "satisfied": 0.0},
                      {"text": "half", "weight": 1.0, "satisfied": 0.5}]},
        {"id": "eval/1", "question": "q", "response": "r", "rubric_score": None, "judge_failure": "no_json",
         "judge_detail": "criteria[0] 'is polite':\nno JSON object", "judge_answer": "## Verdict\n```\nmet",
         "criteria": [{"text": "is polite", "weight": 1.0, "satisfied": None}]},
    ]
    markdown = eval_command.samples_markdown(samples)
    fence = "`" * 8  # one longer than the response's longest run of backticks (7)
    assert f"Response:\n\n{fence}\n{response}\n{fence}\n" in markdown
    assert [line for line in markdown.splitlines() if line.startswith("- [")] == [
        "- [x] (2) states the sum", "- [ ] (-1) is brief", "- [0.50] (1) half", "- [?] (1) is polite"]
    assert "rubric score: 0.500\n" in markdown and "rubric score: -; judge failure: no_json\n" in markdown
    assert "\njudge failure detail: criteria[0] 'is polite': no JSON object\n" in markdown
    # the judge's raw answer is model text: fenced, its heading and fence inside a longer fence
    assert "The judge's answer:\n\n````\n## Verdict\n```\nmet\n````\n" in markdown
    assert markdown.count(f"\n{fence}\n") == 2 and markdown.startswith("## Samples\n\n### eval/0\n")


def test_the_report_writes_undefined_values_as_null_and_n_a(tmp_path):
    """HealthBench's points score is NaN where no sample has positive points (`evaluate.clipped_mean`): strict
    JSON null in the report, "n/a" in its markdown."""
    metrics = {"eval/accuracy": 0.5, "eval/points_score": math.nan, "eval/tag/t/points_score": math.inf}
    markdown = eval_command.write_report(metrics, str(tmp_path / "eval.json"), "title")

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    assert json.loads((tmp_path / "eval.json").read_text(), parse_constant=refuse) == {
        "eval/accuracy": 0.5, "eval/points_score": None, "eval/tag/t/points_score": None}
    text = markdown.read_text()
    assert "| eval/points_score | n/a |" in text and "| t | n/a |" in text and "| eval/accuracy | 0.5000 |" in text


def test_benchmark_tasks_read_their_rows_not_their_rubrics_and_name_what_does_not_read(tmp_path):
    """A preset with a rubric column (rgr) is read for its answers only; a copy laid out otherwise reads through
    `params`; a missing file, an unknown preset and a preset without answers are refused naming the eval_command."""
    config = EvalConfig(benchmarks={"rgr": EvalBenchmark(preset="rgr", path=str(fixture_path("rgr")), num_examples=1)})
    task, examples = assembly.benchmark_tasks(config, seed=0)["rgr"]
    assert len(examples) == 1 and task.rubric(examples[0]).criteria == () and task.has_outcome
    renamed = tmp_path / "aime25.jsonl"  # a copy that names the question "problem" (math-ai/aime25)
    renamed.write_text('{"problem": "1 + 1 = ?", "answer": "2"}\n')
    config = EvalConfig(benchmarks={"aime25": EvalBenchmark(preset="aime25", path=str(renamed),
                                                            params={"columns": {"prompt": "problem"}})})
    task, examples = assembly.benchmark_tasks(config, seed=0)["aime25"]
    assert [(task.question(e), e.answer) for e in examples] == [("1 + 1 = ?", "2")]
    for bad, message in ((EvalBenchmark(preset="aime25", path=str(tmp_path / "no.jsonl")), "does not exist"),
                         (EvalBenchmark(preset="aime", path=str(renamed)), "aime"),
                         (EvalBenchmark(preset="rar", path=str(fixture_path("rar"))), "preset rar has no answers")):
        with pytest.raises(ValueError, match=f"^eval.benchmarks.x: .*{message}"):
            assembly.benchmark_tasks(EvalConfig(benchmarks={"x": bad}), seed=0)


def test_the_report_shows_what_an_llm_judge_used_and_cost(tmp_path):
    """An LLM judge over HTTP (the stand-in, one call per criterion): its requests, the tokens of its answers'
    usage, its latencies and its cost at the run config's price are in the JSON and markdown reports."""
    from rubric_jax.training.run_config import JudgeConfig, TokenPrice  # noqa: PLC0415
    from tests.inference.standin_server import StandinServer  # noqa: PLC0415

    task = build_task("dataset", eval_command.dataset_params("rgr", str(fixture_path("rgr"))), 0)
    examples = task.eval_examples(2)
    tokenizer = task.tokenizer()
    price = TokenPrice(prompt=0.05, completion=0.2)
    with StandinServer(responder=lambda messages: '{"rating": 1}') as server:
        config = JudgeConfig(kind="llm", url=server.base_url, model="judge", format="rating",
                             price_per_million_tokens=price)
        judge = assembly.make_judge(config, task, 0)
        try:
            metrics = eval_command.evaluate_model(TextEngine(tokenizer, "42"), tokenizer, task, judge, examples,
                                                  EvalConfig(), max_new_tokens=8, seed=0,
                                                  judge_price=config.price_per_million_tokens)
        finally:
            judge.close()
        calls = len(server.chat_requests)
        prompt = sum(len(m["content"].split()) for body in server.chat_requests for m in body["messages"])
    assert calls == sum(len(e.rubric.criteria) for e in examples)
    assert metrics["eval/judge/requests"] == calls and metrics["eval/judge/request_failures"] == 0
    assert metrics["eval/judge/prompt_tokens"] == prompt and metrics["eval/judge/completion_tokens"] == 2 * calls
    assert metrics["eval/judge/requests_without_usage"] == 0
    assert 0 < metrics["eval/judge/latency_p50_s"] <= metrics["eval/judge/latency_p95_s"]
    assert metrics["eval/judge/cost"] == pytest.approx((prompt * 0.05 + 2 * calls * 0.2) / 1e6)
    markdown = eval_command.write_report(metrics, str(tmp_path / "report.json"), "rgr").read_text()
    report = json.loads((tmp_path / "report.json").read_text())
    for key in ("requests", "prompt_tokens", "completion_tokens", "latency_p95_s", "cost"):
        assert report[f"eval/judge/{key}"] == metrics[f"eval/judge/{key}"]
        assert f"| eval/judge/{key} | " in markdown
