"""Fail fast (`judges.preflight`): before step 1 a run sends each LLM role one real request shaped like its work
(the judge's, the meta-verifier's; `rubric-jax synthesize` the generator's) and stops with one line holding the
raw answer when it does not parse; `rubric-jax validate` does the same and also refuses what train refuses at
launch, a prompt longer than the model's context naming the dataset row. Stand-in servers here (the answers are
chosen); tests/judges/test_real_server.py and test_llama_server.py ask real ones."""

import json
from pathlib import Path

import pytest

from rubric_jax import cli
from rubric_jax.algorithms.registry import algorithm_class
from rubric_jax.data.tasks import build_task
from rubric_jax.models.tokenizer import apply_chat_template
from rubric_jax.rubrics import parsing
from rubric_jax.rubrics import synthesis_schemas as schemas
from rubric_jax.training import assembly, launch, rl, runs
from rubric_jax.training.run_config import JudgeConfig, MetaVerifierConfig, RLConfig, resolve_algorithm
from rubric_jax.yaml_config import load_config
from tests.data.dataset_fixtures import FIXTURES
from tests.data.synthesis_generators import QuestionGenerator
from tests.inference.standin_server import StandinServer
from tests.training.test_rl import tiny_rl_config
from tests.training.toy_task import RUBRIC, toy_task

REPO = Path(__file__).resolve().parents[2]
PROSE = "I think the response is quite good overall."
RAR_ROWS = FIXTURES / "rar.jsonl"


def rating_judge(url: str) -> JudgeConfig:
    return JudgeConfig(kind="llm", url=url, model="judge", format="rating")


def test_train_stops_before_step_1_with_the_raw_answer_when_the_judge_does_not_parse(tmp_path):
    reason = parsing.parse_rating(PROSE).reason
    with StandinServer(responder=lambda messages: PROSE) as server:
        with pytest.raises(runs.RunStopped) as stopped:
            rl.train_rl(tiny_rl_config(tmp_path, judge=rating_judge(server.base_url)), toy_task())
        [request] = server.chat_requests  # one request, in the judge's format, under its schema
    assert str(stopped.value) == (f"judge: its answer to a judge.format rating request (criterion 1 of the first "
                                  f"example) does not parse: {reason} ({parsing.parse_rating(PROSE).detail}); raw "
                                  f"answer: {json.dumps(PROSE)}")
    assert request["model"] == "judge" and request["response_format"]["json_schema"]["schema"] == \
        parsing.rating_schema()
    assert RUBRIC.criteria[0].text in request["messages"][-1]["content"]  # the toy task's first criterion
    assert not (tmp_path / "run").exists()


def test_a_judge_and_a_meta_verifier_whose_answers_parse_pass_and_their_counts_start_after(tmp_path):
    """The judge's rating and the meta-verifier's verdict parse: the launch goes on, the clients' request counts
    start again (the run's metrics count the run's requests), and a prose meta-verifier stops it."""
    def respond(messages):
        return '{"verdict": "VALID"}' if "Target Rubric" in messages[-1]["content"] else '{"rating": 1}'

    task = toy_task()
    with StandinServer(responder=respond) as server:
        judge = assembly.make_judge(rating_judge(server.base_url), task, 0)
        verifier = assembly.make_meta_verifier(MetaVerifierConfig(kind="llm", url=server.base_url, model="judge",
                                                            domain="writing_science"), 0)
        try:
            launch.check_llm_roles(judge, verifier, task, "rating")
            assert judge.http_stats().requests == 0 and verifier.http_stats().requests == 0
            assert len(server.chat_requests) == 2
            server.responder = lambda messages: PROSE
            with pytest.raises(runs.RunStopped, match=r"^meta_verifier: its answer to a meta-verifier request "
                                                    r"\(criterion 1 of the first example\) does not parse"):
                launch.check_llm_roles(None, verifier, task, "rating")
        finally:
            judge.close()
            verifier.close()


def validate(*overrides: str) -> int:
    return cli.main(["validate", str(REPO / "configs/rar_dataset_cpu.yaml"), f"task.params.path={RAR_ROWS}",
                     *overrides, "--rows", "1"])


def test_validate_shows_the_judges_answer_and_exits_1_when_it_does_not_parse(capsys):
    with StandinServer(responder=lambda messages: '{"rating": 1}') as server:
        assert validate(f"judge.url={server.base_url}") == 0
        out = capsys.readouterr().out
        assert "judge check: a judge.format rating request (criterion 1 of " in out
        assert ': parsed; raw answer: "{\\"rating\\": 1}"\n' in out

        server.responder = lambda messages: PROSE
        assert validate(f"judge.url={server.base_url}") == 1
    captured = capsys.readouterr()
    assert f"does not parse: {parsing.parse_rating(PROSE).reason}" in captured.out
    [line] = captured.err.splitlines()
    assert line.startswith("rubric-jax validate: judge: its answer to a judge.format rating request (criterion 1 of")
    assert line.endswith(f"raw answer: {json.dumps(PROSE)}")


def test_validate_and_train_name_the_dataset_row_whose_prompt_is_longer_than_the_context(tmp_path, capsys):
    """The RaR fixture's two rows have policy prompts of different lengths; a model whose context lies between
    them cannot sample the longer one: validate and train both name that row (file and row number), before
    anything is written. A cap with truncation cuts it to fit, and validate passes."""
    task = build_task("dataset", {"preset": "rar", "path": str(RAR_ROWS)}, 0)
    lengths = {record.row: len(apply_chat_template(task.tokenizer(), task.prompt(record)))
               for record in task.train_records()}
    row = max(lengths, key=lengths.get)
    context = min(lengths.values()) + 1
    assert context <= lengths[row]
    sizes = [f"model.init.max_position_embeddings={context}", "rollout.max_new_tokens=8",
             "rollout.max_prompt_tokens=null"]
    expected = (f"{RAR_ROWS} row {row}: its policy prompt has {lengths[row]} tokens, and the model's "
                f"max_position_embeddings is {context}, which leaves no room for a response")

    assert validate(*sizes, "--offline") == 1
    assert capsys.readouterr().err.startswith(f"rubric-jax validate: {expected}")
    assert validate(*sizes[:2], f"rollout.max_prompt_tokens={context - 1}", "--offline") == 0

    config = load_config(RLConfig, str(REPO / "configs/rar_dataset_cpu.yaml"),
                         [f"task.params.path={RAR_ROWS}", f"output_dir={tmp_path / 'run'}", *sizes])
    with pytest.raises(runs.RunStopped, match=f"^{expected}".replace("(", r"\(").replace(")", r"\)")):
        rl.train_rl(config, task)
    assert not (tmp_path / "run").exists()
    algorithm_config, config = resolve_algorithm(config)
    assert launch.prompt_refusal(algorithm_class("rar")(algorithm_config), task, config).startswith(expected)


def test_synthesize_stops_with_the_generators_raw_answer_before_writing_anything(tmp_path, capsys):
    """`rubric-jax synthesize`: the generator's first rubric request (the RaR fixture's first row) answered in
    prose stops the command with exit 1 and one line, no manifest written; a valid rubric lets it plan."""
    args = ["synthesize", "--no-progress", str(REPO / "configs/synthesize_rar.yaml"), f"output_dir={tmp_path / 'out'}",
            f"input.path={RAR_ROWS}"]
    with StandinServer(responder=lambda messages: PROSE) as server:
        assert cli.main([*args, f"generator.url={server.base_url}"]) == 1
        [request] = server.chat_requests
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("rubric-jax synthesize: generator: its answer to a rar pipeline's rubric request (")
    parsed = parsing.parse_structured(PROSE, schemas.RaRRubricOutput)
    assert line.endswith(f"does not parse: {parsed.reason} ({parsed.detail}); raw answer: {json.dumps(PROSE)}")
    assert request["response_format"]["type"] == "json_schema" and not (tmp_path / "out").exists()

    with StandinServer(responder=QuestionGenerator({})) as server:
        assert cli.main([*args, f"generator.url={server.base_url}"]) == 0
    assert (tmp_path / "out" / "manifest.json").is_file()
