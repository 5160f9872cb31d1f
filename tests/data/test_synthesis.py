"""The rubric synthesis pipelines (`rubric_jax.data.synthesis`) end to end against the stand-in server, whose
scripted generators (`tests/data/synthesis_generators.py`) answer validly or with known faults, so every count
below follows from the fixtures: tests/fixtures/synthesis/documents.jsonl (5 documents), and the dataset
fixtures of MATH-500 and RaR read through their presets."""

import csv
import json
import shutil
from pathlib import Path

import pytest

from rubric_jax.cli import main
from rubric_jax.data import synthesis
from rubric_jax.data.tasks import build_task
from rubric_jax.judges.llm import MissingApiKey
from rubric_jax.rubrics import schema as rubric_schema
from rubric_jax.rubrics import synthesis_schemas as schemas
from rubric_jax.yaml_config import load_config
from tests.data.synthesis_generators import DocumentGenerator, QuestionGenerator, first_sentence
from tests.inference.standin_server import StandinServer, fenced, http_error

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = REPO / "tests/fixtures/synthesis/documents.jsonl"
MATH500 = REPO / "tests/fixtures/datasets/math500.jsonl"
RAR = REPO / "tests/fixtures/datasets/rar.jsonl"


def config(name: str, out: Path, url: str, *overrides: str) -> synthesis.SynthesisConfig:
    return load_config(synthesis.SynthesisConfig, REPO / "configs" / f"synthesize_{name}.yaml",
                       [f"output_dir={out}", f"generator.url={url}", *overrides])


def grounded_config(out: Path, url: str, *overrides: str) -> synthesis.SynthesisConfig:
    return config("grounded", out, url, f"input.path={DOCUMENTS}", *overrides)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def documents() -> list[str]:
    return [row["text"] for row in lines(DOCUMENTS)]


# ---------------------------------------------------------------- pipeline grounded


@pytest.fixture(scope="module")
def grounded_run(tmp_path_factory):
    """One run of configs/synthesize_grounded.yaml on the five documents: (summary, output dir, requests)."""
    out = tmp_path_factory.mktemp("grounded")
    with StandinServer(responder=DocumentGenerator()) as server:
        summary = synthesis.synthesize(grounded_config(out, server.base_url), progress=False)
        return summary, out, list(server.chat_requests)


def test_grounded_counts_follow_from_the_scripted_faults(grounded_run):
    summary, out, requests = grounded_run
    # Two questions a document: hydrogen 2, molten-salt 2 (after one retry), lithium 2 (after one retry),
    # perovskite 0 (stage 2 off the schema three times), arsenic 1 (its second question's enrichment skips an id).
    assert sum(summary["records"].values()) == 7
    assert summary["sources"] == {"input": 5, "finished": 5, "with_records": 4, "duplicates_in_input": 0}
    assert summary["stage_failures"] == {"analysis/truncated": 1, "synthesis/no_json": 1, "synthesis/schema": 3}
    assert summary["discards"] == {"synthesis/schema": 1, "quality/enrichment_ids": 1}
    # Stage 1 once a document plus Lithium's retry; stage 2 once plus molten-salt's retry and Perovskite's two;
    # stage 3 once a question of the four documents that reached it.
    assert summary["stage_calls"] == {"analysis": 6, "synthesis": 8, "enrichment": 8}
    assert len(requests) == 22
    assert summary["criteria_per_record"] == {5: 7}
    assert summary["weights"] == {w: 7 for w in (1.0, 2.0, 3.0, 4.0, 5.0)}
    assert summary["total_weight"]["mean"] == 15.0


def test_grounded_records_are_appendix_e_records_of_their_documents(grounded_run):
    _, out, _ = grounded_run
    by_hash = {synthesis.content_hash({"document": text}): text for text in documents()}
    written = [row for name in ("train", "validation", "test") for row in lines(out / f"{name}.jsonl")]
    for name in ("train", "validation", "test"):
        for row in lines(out / f"{name}.jsonl"):
            assert synthesis.split_of(row["doc_hash"], synthesis.DEFAULT_SPLITS) == name
    for row in written:
        schemas.GroundedExample.model_validate(row)  # raises on any schema violation
        document = by_hash[row["doc_hash"]]
        assert row["passage"] == first_sentence(document)
        assert "perovskite" not in document.lower()
        assert [c["id"] for c in row["criteria"]] == ["c_1", "c_2", "c_3", "c_4", "c_5"]
        # Stage 3 augments the keywords and gives the concepts and the verification pattern.
        assert all(c["expected_keywords"] == ["key", "term"] and c["expected_concepts"] == ["concept"]
                   and c["verification_method"] == "Look for it." for c in row["criteria"])
    arsenic = [row for row in written if "Arsenic" in by_hash[row["doc_hash"]]]
    assert [row["question"][:10] for row in arsenic] == ["Question 1"]


def test_every_stage_call_sends_its_schema_and_retries_sample_anew(grounded_run):
    _, _, requests = grounded_run
    formats = [r["response_format"] for r in requests]
    assert all(f["type"] == "json_schema" for f in formats)
    names = {tuple(sorted(f["json_schema"]["schema"]["properties"])) for f in formats}
    assert names == {("concepts", "contribution", "depth", "genre", "reasoning_mode"), ("items",), ("criteria",)}
    retried = [r for r in requests if "molten-salt" in r["messages"][-1]["content"]
               and r["messages"][-1]["content"].startswith("You write exam questions")]
    assert len(retried) == 2 and retried[0]["seed"] != retried[1]["seed"]


def test_the_output_trains_as_preset_rubric_grounded(grounded_run):
    _, out, _ = grounded_run
    task = build_task("dataset", {"preset": "rubric_grounded", "path": str(out / "train.jsonl")}, 0)
    records = list(task.train_records())
    assert len(records) == len(lines(out / "train.jsonl"))
    rubric = records[0].rubric
    assert rubric.format == "rubric_grounded" and len(rubric.criteria) == 5
    assert rubric.criteria[0].keywords == ("key", "term") and rubric.criteria[0].required_elements == ("element 1",)
    assert records[0].grounding and records[0].grounding in " ".join(documents())


def test_summary_files_and_plots(grounded_run):
    summary, out, _ = grounded_run
    assert json.loads((out / "summary.json").read_text())["discards"] == summary["discards"]
    markdown = (out / "summary.md").read_text()
    assert "| synthesis/schema | 3 |" in markdown and "| quality/enrichment_ids | 1 |" in markdown
    for name in ("criteria_per_record", "weights", "question_chars", "passage_chars"):
        assert (out / "plots" / f"{name}.png").stat().st_size > 0


def test_a_rerun_skips_every_finished_source(grounded_run, tmp_path):
    _, out, _ = grounded_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = {name: (copy / f"{name}.jsonl").read_text() for name in ("train", "validation", "test")}
    generator = DocumentGenerator()
    with StandinServer(responder=generator) as server:
        summary = synthesis.synthesize(grounded_config(copy, server.base_url), progress=False)
        assert server.chat_requests == []
    assert summary["this_run"]["skipped_done"] == 5 and summary["this_run"]["finished"] == 0
    assert {name: (copy / f"{name}.jsonl").read_text() for name in before} == before


def test_the_passage_check_discards_a_passage_not_in_the_document(tmp_path):
    class Paraphrasing(DocumentGenerator):
        def __call__(self, messages):
            answer = super().__call__(messages)
            if messages[-1]["content"].startswith("You write exam questions") and not answer.startswith("Here"):
                items = json.loads(answer)
                items["items"][0]["passage"] = "A paraphrase that is nowhere in the document."
                return json.dumps(items)
            return answer

    with StandinServer(responder=Paraphrasing()) as server:
        summary = synthesis.synthesize(grounded_config(tmp_path, server.base_url), progress=False)
    # Each of the four documents that reach stage 3 loses its first question to the check.
    assert summary["discards"]["quality/passage_not_in_document"] == 4
    assert sum(summary["records"].values()) == 3


def test_quality_checks_min_criteria_and_total_weight(tmp_path):
    with StandinServer(responder=DocumentGenerator()) as server:
        summary = synthesis.synthesize(grounded_config(tmp_path / "a", server.base_url, "params.min_criteria=6",
                                                       "params.max_criteria=8"), progress=False)
        assert summary["discards"]["quality/min_criteria"] == 8 and sum(summary["records"].values()) == 0
        summary = synthesis.synthesize(grounded_config(tmp_path / "b", server.base_url,
                                                       "params.min_total_weight=15.5"), progress=False)
        assert summary["discards"]["quality/min_total_weight"] == 8


# ---------------------------------------------------------------- pipelines rgr and rar


def math500_answers() -> dict[str, str]:
    return {row["problem"]: row["answer"] for row in lines(MATH500)}


def test_rgr_filters_incorrect_references_and_writes_preset_rgr(tmp_path):
    answers = math500_answers()
    wrong = next(iter(answers))[:30]  # the first question's reference gets a wrong final answer
    with StandinServer(responder=QuestionGenerator(answers, wrong_for=(wrong,))) as server:
        summary = synthesis.synthesize(config("rgr", tmp_path, server.base_url, f"input.path={MATH500}"),
                                       progress=False)
    assert summary["discards"] == {"quality/reference_incorrect": 1}
    assert sum(summary["records"].values()) == len(answers) - 1
    assert summary["stage_calls"] == {"reference": len(answers), "rubric": len(answers) - 1}
    assert summary["criteria_by_kind"] == {"factual": len(answers) - 1, "process": 2 * (len(answers) - 1)}
    rows = [row for name in ("train", "validation") for row in lines(tmp_path / f"{name}.jsonl")]
    assert sorted(row["question"] for row in rows) == sorted(q for q in answers if not q.startswith(wrong))
    for row in rows:
        assert row["answer"] == answers[row["question"]] and "options" not in row
        assert f"\\boxed{{{row['answer']}}}" in row["reference_answer"]
    for name in ("train", "validation"):
        if lines(tmp_path / f"{name}.jsonl"):
            task = build_task("dataset", {"preset": "rgr", "path": str(tmp_path / f"{name}.jsonl")}, 0)
            for record in task.train_records():
                assert record.rubric.format == "rgr"
                assert [c.kind for c in record.rubric.criteria] == [rubric_schema.ItemKind.FACTUAL,
                                                                   rubric_schema.ItemKind.PROCESS,
                                                                   rubric_schema.ItemKind.PROCESS]
                assert task.is_correct(record.reference, record)


def test_rgr_on_multiple_choice_keeps_the_options_its_gold_letter_counts(tmp_path):
    """GPQA through preset gpqa (options shuffled by seed): the generator boxes the letter the prompt shows for the
    correct option, so every reference passes the filter, and the records keep the shuffled options."""
    rows = list(csv.DictReader(open(REPO / "tests/fixtures/datasets/gpqa.csv", encoding="utf-8")))
    correct = {row["Question"].strip(): row["Correct Answer"].strip() for row in rows}

    class Lettered(QuestionGenerator):
        def __call__(self, messages):
            content = messages[-1]["content"]
            if content.startswith("Write a reference solution"):
                question = fenced(content, "question")
                option = next(a for q, a in correct.items() if q in question)
                letter = next(line[0] for line in question.splitlines() if line[2:].strip() == option)
                return f"Checked each option.\n\\boxed{{{letter}}}"
            return super().__call__(messages)

    with StandinServer(responder=Lettered({})) as server:
        summary = synthesis.synthesize(config("rgr", tmp_path, server.base_url, "input.preset=gpqa",
                                              f"input.path={REPO / 'tests/fixtures/datasets/gpqa.csv'}"),
                                       progress=False)
    assert summary["discards"] == {} and sum(summary["records"].values()) == len(rows)
    written = [row for name in ("train", "validation") for row in lines(tmp_path / f"{name}.jsonl")]
    for row in written:
        assert row["options"][ord(row["answer"]) - ord("A")].strip() == correct[row["question"].strip()]
    path = tmp_path / "all.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in written))
    task = build_task("dataset", {"preset": "rgr", "path": str(path), "answer_kind": "choice",
                                  "columns": {"options": "options"}, "shuffle_options": False}, 0)
    assert all(task.is_correct(record.reference, record) for record in task.train_records())


def test_rar_writes_weighted_categories_read_by_preset_rar(tmp_path):
    rows = lines(RAR)
    with StandinServer(responder=QuestionGenerator({})) as server:
        summary = synthesis.synthesize(config("rar", tmp_path, server.base_url, f"input.path={RAR}"), progress=False)
        prompts = [r["messages"][-1]["content"] for r in server.chat_requests]
    assert summary["stage_calls"] == {"rubric": len(rows)} and summary["discards"] == {}
    assert summary["criteria_by_kind"] == {"Essential": 4, "Important": 4, "Optional": 4, "Pitfall": 2}
    # Requests run concurrently, in any order: each prompt shows exactly one row's reference answer.
    assert sorted(next(i for i, row in enumerate(rows) if row["reference_answer"] in p) for p in prompts) == \
        list(range(len(rows)))
    written = [row for name in ("train", "validation", "test") for row in lines(tmp_path / f"{name}.jsonl")]
    assert sorted(r["question"] for r in written) == sorted(r["question"] for r in rows)
    for name in ("train", "validation", "test"):
        if lines(tmp_path / f"{name}.jsonl"):
            task = build_task("dataset", {"preset": "rar", "path": str(tmp_path / f"{name}.jsonl")}, 0)
            weights = [c.weight for record in task.train_records() for c in record.rubric.criteria]
            assert weights[:7] == [5, 5, 4, 3, 2, 1, -1]


class WrongWeights(QuestionGenerator):
    def __call__(self, messages):
        answer = json.loads(super().__call__(messages))
        answer["rubric"][0]["weight"] = 4  # an Essential item weighs 5
        return json.dumps(answer)


def test_rar_schema_violations_are_retried_then_discarded(tmp_path):
    with StandinServer(responder=WrongWeights({})) as server:
        summary = synthesis.synthesize(config("rar", tmp_path, server.base_url, f"input.path={RAR}"), progress=False)
    assert summary["stage_failures"] == {"rubric/schema": 6}
    assert summary["discards"] == {"rubric/schema": 2}
    assert sum(summary["records"].values()) == 0
    assert all(not (tmp_path / f"{name}.jsonl").read_text() for name in ("train", "validation", "test"))


def test_the_command_that_wrote_no_record_exits_1_with_the_reasons(tmp_path, capsys, monkeypatch):
    """`rubric-jax synthesize` whose every source was discarded: status 1, one line with the discards, and no
    suggestion to train on the empty file. The generator's preflight would refuse this generator first
    (tests/training/test_preflight.py); here it is passed, as for a generator that fails only on later sources."""
    monkeypatch.setattr(synthesis, "preflight_generator", lambda *args: None)
    with StandinServer(responder=WrongWeights({})) as server:
        status = main(["synthesize", str(REPO / "configs" / "synthesize_rar.yaml"), f"output_dir={tmp_path}",
                       f"generator.url={server.base_url}", f"input.path={RAR}", "--no-progress"])
    out, err = capsys.readouterr()
    assert status == 1
    assert err.endswith(f"rubric-jax synthesize: wrote no record to {tmp_path} from 2 sources (discarded: "
                        "rubric/schema 2; failed stage calls: rubric/schema 6): see its summary.md\n")
    assert "train on it" not in err and "train.jsonl" not in err
    assert json.loads(out)["records"] == {"train": 0, "validation": 0, "test": 0}

    with StandinServer(responder=QuestionGenerator({})) as server:  # valid rubrics: records, and the suggestion
        status = main(["synthesize", str(REPO / "configs" / "synthesize_rar.yaml"), f"output_dir={tmp_path / 'ok'}",
                       f"generator.url={server.base_url}", f"input.path={RAR}", "--no-progress"])
    out, err = capsys.readouterr()
    assert status == 0 and json.loads(out)["records"]["train"] == 2  # both rows hash to the train split
    assert err.endswith(f"train on it with task.params {{preset: rar, path: {tmp_path / 'ok'}/train.jsonl}}\n")


def test_inputs_without_the_columns_a_pipeline_reads_are_refused_before_any_request(tmp_path):
    with pytest.raises(ValueError, match="gold answer"):
        synthesis.plan_synthesis(config("rgr", tmp_path / "a", "http://127.0.0.1:9", f"input.path={RAR}",
                                        "input.preset=rar", "input.columns.rubric=null"))
    with pytest.raises(ValueError, match="reference answers"):
        synthesis.plan_synthesis(config("rar", tmp_path / "b", "http://127.0.0.1:9", f"input.path={DOCUMENTS}",
                                        "input.preset=null", "input.columns={prompt: text}"))


# ---------------------------------------------------------------- failures, resume, manifest


def test_failed_requests_leave_sources_for_the_next_run(tmp_path):
    generator = DocumentGenerator()
    with StandinServer(responder=generator) as server:
        for _ in range(5):
            server.inject(http_error(503, path="/v1/chat/completions"))
        first = synthesis.synthesize(grounded_config(tmp_path, server.base_url, "generator.max_attempts=1",
                                                     "max_concurrent_sources=1"), progress=False)
        assert first["this_run"]["request_failed"] == 5 and first["sources"]["finished"] == 0
        assert all(not (tmp_path / f"{name}.jsonl").read_text() for name in ("train", "validation", "test"))
        second = synthesis.synthesize(grounded_config(tmp_path, server.base_url), progress=False)
    assert second["this_run"]["finished"] == 5 and sum(second["records"].values()) == 7


def test_unindexed_records_and_torn_lines_of_a_killed_run_are_removed(grounded_run, tmp_path):
    _, out, _ = grounded_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    index = lines(copy / "index.jsonl")
    dropped = next(e for e in index if e["records"])
    # The kill came after the records of `dropped` and before its index line, mid-way through a last line.
    (copy / "index.jsonl").write_text("".join(json.dumps(e) + "\n" for e in index if e is not dropped)
                                      + '{"hash": "torn')
    with open(copy / f"{dropped['split']}.jsonl", "a") as handle:
        handle.write('{"question": "torn')
    with StandinServer(responder=DocumentGenerator()) as server:
        summary = synthesis.synthesize(grounded_config(copy, server.base_url), progress=False)
    assert summary["this_run"]["repaired"] == dropped["records"] and summary["this_run"]["finished"] == 1
    for name in ("train", "validation", "test"):
        assert sorted((copy / f"{name}.jsonl").read_text().splitlines()) == \
            sorted((out / f"{name}.jsonl").read_text().splitlines())
    assert len(lines(copy / "index.jsonl")) == 5


def test_resuming_with_another_config_is_refused(tmp_path):
    url = "http://127.0.0.1:9"
    synthesis.plan_synthesis(grounded_config(tmp_path, url))
    synthesis.plan_synthesis(grounded_config(tmp_path, "http://10.0.0.1:30000", "max_concurrent_sources=2",
                                             "generator.max_in_flight=4"))  # where and how hard: allowed
    with pytest.raises(ValueError, match="differing: params"):
        synthesis.plan_synthesis(grounded_config(tmp_path, url, "params.min_criteria=4"))
    with pytest.raises(ValueError, match="differing: generator"):
        synthesis.plan_synthesis(grounded_config(tmp_path, url, "generator.model=other"))


def test_duplicate_sources_are_one(tmp_path):
    doubled = tmp_path / "docs.jsonl"
    doubled.write_text(DOCUMENTS.read_text() + DOCUMENTS.read_text().splitlines()[0] + "\n")
    plan = synthesis.plan_synthesis(config("grounded", tmp_path / "out", "http://127.0.0.1:9",
                                           f"input.path={doubled}"))
    assert len(plan.sources) == 5 and plan.duplicates == 1


# ---------------------------------------------------------------- hashing and splits


def test_content_hash_is_canonical():
    assert synthesis.content_hash({"a": 1, "b": "x"}) == synthesis.content_hash({"b": "x", "a": 1})
    assert synthesis.content_hash({"a": 1}) != synthesis.content_hash({"a": 2})
    assert len(synthesis.content_hash({"a": 1})) == 16


def test_split_fractions_hold_over_many_hashes():
    splits = {"train": 0.7, "validation": 0.15, "test": 0.15, "never": 0.0}
    n = 20000
    counts = {name: 0 for name in splits}
    for i in range(n):
        counts[synthesis.split_of(synthesis.content_hash({"i": i}), splits)] += 1
    assert counts["never"] == 0
    for name in ("train", "validation", "test"):
        p = splits[name]
        # Five binomial standard deviations: a false alarm about once in 3.5 million.
        assert abs(counts[name] - n * p) < 5 * (n * p * (1 - p)) ** 0.5


def test_config_validation():
    base = {"pipeline": "grounded", "output_dir": "x", "input": {}, "generator": {"url": "u", "model": "m"}}
    with pytest.raises(ValueError, match="sum to 1"):
        synthesis.SynthesisConfig(**{**base, "generator": synthesis.GeneratorConfig("u", "m"),
                                     "splits": {"train": 0.7, "test": 0.2}})
    with pytest.raises(ValueError, match="min_criteria"):
        synthesis.GroundedParams(min_criteria=6, max_criteria=5)
    with pytest.raises(ValueError, match="generator.url"):
        synthesis.GeneratorConfig(url="", model="m")
    with pytest.raises(ValueError, match="generator.api_key_env is the name of an environment variable"):
        synthesis.GeneratorConfig(url="u", model="m", api_key_env="sk-123 secret")
    with pytest.raises(ValueError, match="generator.api_key_env sets the Authorization header"):
        synthesis.GeneratorConfig(url="u", model="m", api_key_env="KEY", headers={"authorization": "Bearer x"})
    with pytest.raises(ValueError, match="generator.headers must map header names to strings"):
        synthesis.GeneratorConfig(url="u", model="m", headers={"X-Team": 3})
    with pytest.raises(ValueError, match="generator.extra_body.response_format: the client sets"):
        synthesis.GeneratorConfig(url="u", model="m", extra_body={"response_format": {"type": "text"}})


def test_the_generators_request_options_reach_its_client():
    generator = synthesis.GeneratorConfig(url="http://127.0.0.1:9", model="m",
                                          chat_template_kwargs={"enable_thinking": False},
                                          extra_body={"reasoning_effort": "high"})
    chat = synthesis.make_chat(generator, seed=0)
    try:
        assert chat.settings.chat_template_kwargs == {"enable_thinking": False}
        assert chat.settings.extra_body == {"reasoning_effort": "high"}
    finally:
        chat.http.close()


def test_a_manifest_from_before_the_request_options_resumes_unless_they_are_set(tmp_path):
    url = "http://127.0.0.1:9"
    synthesis.plan_synthesis(grounded_config(tmp_path, url))
    manifest = tmp_path / synthesis.MANIFEST_FILE
    written = json.loads(manifest.read_text())
    for key in ("chat_template_kwargs", "extra_body"):
        del written["generator"][key]
    manifest.write_text(json.dumps(written))
    synthesis.plan_synthesis(grounded_config(tmp_path, url))  # empty options = none: the same synthesis
    manifest.write_text(json.dumps(written))
    with pytest.raises(ValueError, match="differing: generator"):
        synthesis.plan_synthesis(grounded_config(tmp_path, url, "generator.chat_template_kwargs={enable_thinking: false}"))


def test_a_generator_key_unset_in_the_environment_is_refused_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("RUBRIC_JAX_TEST_GENERATOR_KEY", raising=False)
    with StandinServer(responder=QuestionGenerator({})) as server:
        with pytest.raises(MissingApiKey, match="generator.api_key_env names RUBRIC_JAX_TEST_GENERATOR_KEY, which is not"):
            synthesis.synthesize(config("rar", tmp_path, server.base_url, f"input.path={RAR}",
                                        "generator.api_key_env=RUBRIC_JAX_TEST_GENERATOR_KEY"), progress=False)
        assert server.chat_requests == []
