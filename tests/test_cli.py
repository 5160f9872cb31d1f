"""The `rubric-jax` command end to end on a tiny model: `sft` from a YAML config with overrides, then `eval` of
the saved model, whose JSON holds the held-out metrics; a second `sft` with the same output resumes. Each way
each command can be given bad input ends in one line on stderr naming the problem, with status 2."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import rubric_jax
from rubric_jax import cli
from rubric_jax.models.config import ModelConfig
from tests.data.dataset_fixtures import FIXTURES
from tests.inference.standin_server import StandinServer, fenced


def test_sft_then_eval_from_the_command_line(tmp_path, capsys):
    config = {
        "output_dir": str(tmp_path / "sft"), "steps": 2,
        "model": {"init": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2,
                           "num_kv_heads": 1, "head_dim": 16, "max_position_embeddings": 128}},
        "batch_size": 4, "max_response_tokens": 64, "metrics": {"console": False, "plots": False},
    }
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli.main(["sft", str(path), "checkpoint.every_steps=1", "optimizer.learning_rate=1e-3"]) == 0
    assert yaml.safe_load((tmp_path / "sft" / "config.yaml").read_text())["optimizer"]["learning_rate"] == 1e-3

    assert cli.main(["sft", str(path), "steps=3", "checkpoint.every_steps=1"]) == 0
    assert "resuming" in capsys.readouterr().out
    lines = (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]

    output = tmp_path / "eval.json"
    assert cli.main(["eval", str(tmp_path / "sft" / "model"), "--examples", "4", "--samples", "2",
                     "--temperature", "1.0", "--max-new-tokens", "16", "--output", str(output),
                     "--chat-template-kwargs", '{"enable_thinking": false}']) == 0
    metrics = json.loads(output.read_text())
    assert json.loads(capsys.readouterr().out) == metrics
    assert {"eval/accuracy", "eval/pass@2", "eval/rubric_score", "eval/rubric/arithmetic.step1"} <= metrics.keys()
    assert all(0 <= metrics[key] <= 1 for key in ("eval/accuracy", "eval/pass@2", "eval/rubric_score"))


def test_validate_reports_the_rows_and_renders_the_first_prompts(capsys):
    assert cli.main(["validate", *DATASET_RL, "--rows", "1", "--offline"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("config: algorithm rar, task dataset, judge llm (rating at http://127.0.0.1:1, model judge)\n"
                          "data: 2 training rows, 0 held out, none skipped; longest rubric 3 items\n")
    assert f"\npolicy prompts: the longest has 142 tokens ({FIXTURES / 'rar.jsonl'} row 0)\n" in out  # no cap set
    assert f"--- {FIXTURES / 'rar.jsonl'} row " in out and "policy prompt (" in out and "judge prompt ---" in out
    assert "<response>\n(the policy's response)\n</response>" in out  # the judge's prompt, fences and all


def test_eval_on_dataset_presets_writes_json_and_markdown(tmp_path, capsys):
    """A tiny model with the dataset task's byte tokenizer (one SFT step on MATH500's solutions), evaluated on
    the MATH500 fixture (outcomes, per-subject tags) and on the HealthBench fixture with a judge over HTTP that
    meets every criterion."""
    config = {"output_dir": str(tmp_path / "sft"), "steps": 1, "batch_size": 2, "max_response_tokens": 32,
              "model": {"init": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2,
                                 "num_kv_heads": 1, "head_dim": 16, "max_position_embeddings": 512}},
              "task": {"name": "dataset", "params": {"preset": "math500", "path": str(FIXTURES / "math500.jsonl")}},
              "metrics": {"console": False, "plots": False}}
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["sft", str(tmp_path / "sft.yaml")]) == 0
    model = str(tmp_path / "sft" / "model")
    output = tmp_path / "math.json"
    assert cli.main(["eval", model, "--dataset", "math500", "--data-path", str(FIXTURES / "math500.jsonl"),
                     "--samples", "2", "--temperature", "1.0", "--top-p", "0.8", "--presence-penalty", "1.5",
                     "--max-new-tokens", "8", "--output", str(output)]) == 0
    metrics = json.loads(output.read_text())
    assert {"eval/accuracy", "eval/pass@2", "eval/tag/Algebra/accuracy", "eval/tag/Precalculus/accuracy"} <= metrics.keys()
    markdown = output.with_suffix(".md").read_text()
    assert markdown.startswith(f"# {model} on math500\n") and "## By example tag" in markdown
    assert "| Algebra | " in markdown

    with StandinServer() as server:
        server.responder = lambda messages: json.dumps({"explanation": "-", "criteria_met": True})
        assert cli.main(["eval", model, "--dataset", "healthbench", "--data-path", str(FIXTURES / "healthbench.jsonl"),
                         "--judge-url", server.base_url, "--judge-model", "grader", "--judge-format", "healthbench",
                         "--max-new-tokens", "8", "--output", str(tmp_path / "hb.json")]) == 0
        calls = len(server.chat_requests)
    metrics = json.loads((tmp_path / "hb.json").read_text())
    assert calls == 3 + 2  # one call per criterion of the two conversations
    # every criterion met: row 0 (10 - 10 + 5) / 15, row 1 (10 - 9) / 10; the mean clipped to [0, 1]
    assert metrics["eval/points_score"] == pytest.approx((5 / 15 + 0.1) / 2)
    assert metrics["eval/item_tag/axis:accuracy/points_score"] == pytest.approx(0.1)  # row 0's is only -10
    report = (tmp_path / "hb.md").read_text()
    assert "## By criterion tag" in report
    # The first two judged samples (--log-samples' default), in the report and on stderr: each criterion met, with
    # its weight (row 0's are 10, -10 and 5), the response fenced.
    samples = report[report.index("## Samples"):]
    assert samples in capsys.readouterr().err
    assert samples.count("\n### eval/") == 2 and "### eval/0" in samples and "### eval/1" in samples
    first = samples[:samples.index("### eval/1")]
    marks = [re.match(r"- \[(.)\] \((\S+)\) ", line).groups() for line in first.splitlines() if line.startswith("- [")]
    assert marks == [("x", "10"), ("x", "-10"), ("x", "5")]
    assert "Response:\n\n```\n" in first and "rubric score: " in first

    # A run config's task and judge: its held-out rows (one of MATH500's three), its task judge.
    run = {"output_dir": str(tmp_path / "rl"), "steps": 1, "model": {"path": model},
           "task": {"name": "dataset", "params": {"preset": "math500", "path": str(FIXTURES / "math500.jsonl"),
                                                  "eval_size": 1}},
           "algorithm": {"name": "grpo"}, "eval": {"num_examples": 5}}
    (tmp_path / "rl.yaml").write_text(yaml.safe_dump(run))
    assert cli.main(["eval", model, "--dataset", str(tmp_path / "rl.yaml"), "--max-new-tokens", "8",
                     "--output", str(tmp_path / "run.json")]) == 0
    metrics = json.loads((tmp_path / "run.json").read_text())
    # MATH500 has answers, no rubrics: its subject tag's accuracy, and no rubric score of 0.
    assert metrics["eval/accuracy"] in (0.0, 1.0) and [k for k in metrics if k.startswith("eval/tag/")] == [
        "eval/tag/Prealgebra/accuracy"] and "eval/rubric_score" not in metrics


# ---------------------------------------------------------------- bad input: one line, status 2, no traceback

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RL = str(CONFIGS / "rar_arithmetic.yaml")
RL_INIT = [RL, "model={init: {}}"]  # a random model instead of the SFT model the file names, so later checks run
SFT = str(CONFIGS / "sft_arithmetic.yaml")
# An RL config over the RaR fixture (rubrics of 2 and 3 items) with an LLM judge, given as overrides.
DATASET_RL = [*RL_INIT, "task.name=dataset", f"task.params={{preset: rar, path: {FIXTURES / 'rar.jsonl'}}}",
              "judge={kind: llm, url: 'http://127.0.0.1:1', model: judge, format: rating}",
              "algorithm.name=rar", "algorithm.params={max_items: 4}"]
VALID_MODEL = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=64).to_hf_dict()


@pytest.fixture
def inputs(tmp_path):
    """Every kind of bad input, on disk: configs that are not YAML, not a mapping, with an unknown key; a plain
    file; directories that are not Hugging Face models in each way; one that passes the directory checks (its
    files are empty: the checks do not load weights)."""
    (tmp_path / "bad.yaml").write_text("steps: [1, 2\n")
    (tmp_path / "list.yaml").write_text("- steps\n")
    (tmp_path / "unknown.yaml").write_text("nokey: 1\n")
    (tmp_path / "afile").write_text("")
    models = {"nojson": None, "badjson": "{not json", "gpt2": json.dumps({"model_type": "gpt2"}),
              "noweights": json.dumps(VALID_MODEL), "notokenizer": json.dumps(VALID_MODEL),
              "complete": json.dumps(VALID_MODEL)}
    for name, config in models.items():
        (tmp_path / name).mkdir()
        if config is not None:
            (tmp_path / name / "config.json").write_text(config)
    for name in ("notokenizer", "complete"):
        (tmp_path / name / "model.safetensors").write_text("")
    (tmp_path / "complete" / "tokenizer.json").write_text("")
    return tmp_path


# train's and sft's config file argument
CONFIG_FILE_CASES = [
    ([], "the following arguments are required: config (see"),
    (["{tmp}/missing.yaml"], "config file {tmp}/missing.yaml does not exist"),
    (["{tmp}"], "config file {tmp} is a directory"),
    (["{tmp}/bad.yaml"], "{tmp}/bad.yaml: not valid YAML"),
    (["{tmp}/list.yaml"], "the top level must be a mapping"),
    (["{tmp}/unknown.yaml"], "unknown config key nokey"),
]
BAD_INPUTS = {
    "quickstart": [
        (["--config", "{tmp}/missing.yaml"], "config file {tmp}/missing.yaml does not exist"),
        (["--config", "{tmp}"], "config file {tmp} is a directory"),
        (["--config", "{tmp}/bad.yaml"], "{tmp}/bad.yaml: not valid YAML: expected ',' or ']'"),
        (["--config", "{tmp}/list.yaml"], "the top level must be a mapping"),
        (["--config", "{tmp}/unknown.yaml"], "unknown config key nokey"),
        (["nokey=1"], "unknown config key nokey"),
        (["seed"], "override 'seed' is not of the form key.sub=value"),
        (["seed=[1"], "override 'seed=[1': the value is not valid YAML"),
        (["seed=abc"], "config key seed: expected an int, got 'abc'"),
        (["task.name=nope"], "config key task.name: unknown task 'nope'"),
        (["--output-dir", "{tmp}/afile/sub"], "cannot write the output_dir {tmp}/afile/sub: {tmp}/afile is not a "
                                              "directory"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
    "train": [
        *CONFIG_FILE_CASES,
        ([RL, "optimizer.learning_rate"], "is not of the form key.sub=value"),
        ([RL, "steps=many"], "config key steps: expected an int"),
        ([RL, "algorithm.name=nope"], "config key algorithm.name: unknown algorithm 'nope'"),
        ([RL, "algorithm.params.nokey=1"], "unknown config key algorithm.params.nokey"),
        ([RL, "model.path={tmp}/missing"], "model.path {tmp}/missing does not exist"),
        ([RL, "model.path={tmp}/nojson"], "model.path {tmp}/nojson is not a Hugging Face model directory"),
        ([*RL_INIT, "task.name=nope"], "unknown task 'nope'"),
        ([*RL_INIT, "output_dir={tmp}/afile"], "cannot write the output_dir {tmp}/afile: {tmp}/afile is not a "
                                               "directory"),
        ([*DATASET_RL, "algorithm.params.max_items=2"],
         "the task's longest rubric has 3 items, more than algorithm.params.max_items (2): raise max_items"),
        ([*RL_INIT, "eval.benchmarks={aime25: {preset: aime25, path: '{tmp}/missing.jsonl'}}"],
         "eval.benchmarks.aime25: dataset {tmp}/missing.jsonl does not exist"),
    ],
    "sft": [
        *CONFIG_FILE_CASES,
        ([SFT, "=3"], "override '=3' is not of the form key.sub=value"),
        ([SFT, "batch_size=0"], "batch_size must be >= 1, got 0"),
        ([SFT, "task.name=nope"], "unknown task 'nope'"),
        ([SFT, "model={path: {tmp}/gpt2}"], "model.path {tmp}/gpt2: config.json: unsupported model_type 'gpt2'"),
        ([SFT, "output_dir={tmp}/afile/sub"], "cannot write the output_dir {tmp}/afile/sub: {tmp}/afile is not a "
                                              "directory"),
    ],
    "eval": [
        ([], "the following arguments are required: model"),
        (["{tmp}/missing"], "model directory {tmp}/missing does not exist"),
        (["{tmp}/afile"], "model directory {tmp}/afile is not a directory"),
        (["{tmp}/nojson"], "model directory {tmp}/nojson is not a Hugging Face model directory: it has no "
                           "config.json"),
        (["{tmp}/badjson"], "model directory {tmp}/badjson: config.json: Expecting property name"),
        (["{tmp}/gpt2"], "unsupported model_type 'gpt2'"),
        (["{tmp}/noweights"], "model directory {tmp}/noweights has no weights: no model.safetensors"),
        (["{tmp}/notokenizer"], "model directory {tmp}/notokenizer: no tokenizer files in {tmp}/notokenizer"),
        (["{tmp}/complete", "--samples", "0"], "argument --samples: must be >= 1, got 0"),
        (["{tmp}/complete", "--samples", "two"], "argument --samples: expected an integer, got 'two'"),
        (["{tmp}/complete", "--samples", "2"], "greedy evaluation (temperature 0) gives one answer per example"),
        (["{tmp}/complete", "--examples", "0"], "argument --examples: must be >= 1, got 0"),
        (["{tmp}/complete", "--max-new-tokens", "-1"], "argument --max-new-tokens: must be >= 1, got -1"),
        (["{tmp}/complete", "--temperature", "-1"], "temperature must be >= 0, got -1.0"),
        (["{tmp}/complete", "--presence-penalty", "2.5"], "presence_penalty must be in [-2, 2] (0: none), got 2.5"),
        (["{tmp}/complete", "--repetition-penalty", "0"], "repetition_penalty must be in (0, 2] (1: none), got 0.0"),
        (["{tmp}/complete", "--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
        (["{tmp}/complete", "--task", "nope"], "unknown task 'nope'"),
        (["{tmp}/complete", "--output", "{tmp}"], "--output {tmp} is a directory"),
        (["{tmp}/complete", "--output", "{tmp}/missing/m.json"], "the directory {tmp}/missing does not exist"),
        (["{tmp}/complete", "--chat-template-kwargs", "enable_thinking=false"],
         "argument --chat-template-kwargs: expected a JSON object, got 'enable_thinking=false'"),
        (["{tmp}/complete", "--chat-template-kwargs", "[1]"], "argument --chat-template-kwargs: expected a JSON object"),
        (["{tmp}/complete", "--dataset", "nope", "--data-path", "x"], "--dataset 'nope' is neither a preset nor a "
                                                                     "YAML config; presets: aime24"),
        (["{tmp}/complete", "--dataset", "math500"], "--dataset math500 needs --data-path"),
        (["{tmp}/complete", "--data-path", "x.jsonl"], "--data-path goes with --dataset"),
        (["{tmp}/complete", "--dataset", "math500", "--data-path", "{tmp}/missing.jsonl"],
         "dataset {tmp}/missing.jsonl does not exist"),
        (["{tmp}/complete", "--dataset", "{tmp}/missing.yaml"], "config file {tmp}/missing.yaml does not exist"),
        (["{tmp}/complete", "--judge-url", "http://127.0.0.1:1"], "--judge-url and --judge-model go together"),
        (["{tmp}/complete", "--judge-format", "vibes"], "argument --judge-format: invalid choice: 'vibes'"),
        (["{tmp}/complete", "--recipe", "nope"], "unknown recipe 'nope'"),
        (["{tmp}/complete", "--dataset", "healthbench", "--data-path", str(FIXTURES / "healthbench.jsonl")],
         "set judge.kind: llm (with judge.url, judge.model and judge.format) (on the command line: --judge-url"),
    ],
    "validate": [
        *CONFIG_FILE_CASES,
        ([RL, "algorithm.name=nope"], "config key algorithm.name: unknown algorithm 'nope'"),
        ([RL, "model.path={tmp}/missing"], "model.path {tmp}/missing does not exist"),
        ([*RL_INIT, "--rows", "0"], "argument --rows: must be >= 1, got 0"),
        ([*DATASET_RL, "algorithm.params.max_items=2"],
         "the task's longest rubric has 3 items, more than algorithm.params.max_items (2): raise max_items"),
        ([*DATASET_RL, "judge.kind=task", "judge.url=null", "judge.model=null"],
         "task dataset has rubrics but no programmatic judge for them"),
        ([*DATASET_RL, "task.params.path={tmp}/afile"], "{tmp}/afile: unknown file type"),
    ],
}


def run_cli(argv, capsys):
    """`rubric-jax argv` in process: (exit status, stderr)."""
    try:
        status = cli.main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        status = exit_.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize("command, args, message", [
    (command, args, message) for command, cases in BAD_INPUTS.items() for args, message in cases])
def test_each_bad_input_is_one_line_naming_the_problem(inputs, capsys, command, args, message):
    status, err = run_cli([command, *(arg.replace("{tmp}", str(inputs)) for arg in args)], capsys)
    assert status == 2
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"rubric-jax {command}: ") and "Traceback" not in err
    assert message.replace("{tmp}", str(inputs)) in err


def test_bad_input_from_a_shell(tmp_path):
    """The installed command's path: a separate interpreter, nothing on stderr but the one line."""
    result = subprocess.run([sys.executable, "-m", "rubric_jax.cli", "eval", str(tmp_path / "nonexistent")],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"rubric-jax eval: model directory {tmp_path / 'nonexistent'} does not exist\n"


TINY_RL = ["configs/rar_arithmetic.yaml", "model.path=null",
           "model.init={hidden_size: 32, intermediate_size: 64, num_layers: 1, num_heads: 2, num_kv_heads: 1, "
           "head_dim: 16, max_position_embeddings: 256}"]


def test_an_unexpected_runtime_error_is_one_line_and_debug_shows_the_traceback(tmp_path, monkeypatch, capsys):
    from rubric_jax.training import rl

    def broken(config, task, **_):
        raise RuntimeError("the accelerator\nwent away")

    monkeypatch.setattr(rl, "train_rl", broken)
    args = ["train", *TINY_RL, f"output_dir={tmp_path}/run"]
    assert cli.main(args) == 1
    assert capsys.readouterr().err == ("rubric-jax train: RuntimeError: the accelerator went away (rerun with --debug "
                                       "for the traceback)\n")
    with pytest.raises(RuntimeError, match="the accelerator"):
        cli.main(["--debug", *args])


def test_ctrl_c_outside_the_training_loop_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    from rubric_jax.training import rl

    def interrupted(config, task, **_):
        raise KeyboardInterrupt

    monkeypatch.setattr(rl, "train_rl", interrupted)
    assert cli.main(["train", *TINY_RL, f"output_dir={tmp_path}/run"]) == 130
    assert capsys.readouterr().err == "rubric-jax train: interrupted\n"


# ---------------------------------------------------------------- eval's judge: probed, and held to the budget

# The RaR fixture (two rows: rubrics of 3 and 2 items) judged in RLCER's verifier format: one call per sample.
RAR_EVAL = ["--dataset", "rar", "--data-path", str(FIXTURES / "rar.jsonl"), "--judge-model", "judge",
            "--judge-format", "rlcer_verifier", "--max-new-tokens", "4"]


def test_eval_refuses_a_judge_nobody_serves_before_sampling(tiny_qwen3_dir, tmp_path, capsys):
    output = tmp_path / "eval.json"
    assert cli.main(["eval", str(tiny_qwen3_dir), *RAR_EVAL, "--judge-url", "http://127.0.0.1:1",
                     "--output", str(output)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not output.exists() and not output.with_suffix(".md").exists()  # no score claimed
    # the last line (the datasets library may draw a progress bar first, reading the file)
    last = err.splitlines()[-1]
    assert last.startswith("rubric-jax eval: judge.url http://127.0.0.1:1 does not answer (")
    assert last.endswith("start the server or correct the URL (on the command line: --judge-url)")


def verifier_failing_on(*questions: str):
    """An RLCER verifier meeting every criterion, answering prose (no JSON) for the samples of `questions`."""
    def respond(messages):
        text = "\n".join(m["content"] for m in messages)
        if any(question in text for question in questions):
            return "I cannot judge this."
        criteria = fenced(text, "rubrics").splitlines()
        return json.dumps({"judgement": [True] * len(criteria), "final_score": 0})

    return respond


def strict_loads(text: str):
    """json.loads that refuses NaN and +-Infinity, which Python's json reads but JSON does not have."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_eval_whose_judge_fails_above_the_budget_exits_1_and_reports_no_score(tiny_qwen3_dir, tmp_path, capsys):
    output = tmp_path / "eval.json"
    with StandinServer(responder=verifier_failing_on("ureteric stone", "stiff neck")) as server:
        status = cli.main(["eval", str(tiny_qwen3_dir), *RAR_EVAL, "--judge-url", server.base_url,
                           "--output", str(output)])
    out, err = capsys.readouterr()
    assert status == 1
    failure = (f"the judge at {server.base_url} failed on 100% of the samples (no_json 2), above "
               "judge.max_failure_rate (0.5): its scores are failures, not judgements, and are not reported")
    assert err.endswith(f"\nrubric-jax eval: {failure}\n")
    report = strict_loads(output.read_text())
    assert strict_loads(out) == report
    assert report["judge_failure"] == failure
    assert report["eval/judge/failure_rate"] == 1.0 and report["eval/judge/failed/no_json"] == 2
    assert report["eval/rubric_score"] is None and report["eval/points_score"] is None  # not a 0.0 result
    assert "eval/accuracy" not in report  # RaR rows have no gold answer: no outcome metric, judged or not
    markdown = output.with_suffix(".md").read_text()
    assert markdown.startswith(f"# {tiny_qwen3_dir} on rar\n\n**The judge failed**: {failure}.\n")
    assert "| eval/rubric_score | n/a |" in markdown and "| eval/judge/failure_rate | 1.0000 |" in markdown


def test_eval_whose_judge_fails_within_the_budget_reports_the_failure_rate(tiny_qwen3_dir, tmp_path, capsys):
    output = tmp_path / "eval.json"
    with StandinServer(responder=verifier_failing_on("stiff neck")) as server:
        status = cli.main(["eval", str(tiny_qwen3_dir), *RAR_EVAL, "--judge-url", server.base_url,
                           "--output", str(output)])
    assert status == 0
    report = strict_loads(output.read_text())
    assert strict_loads(capsys.readouterr().out) == report and "judge_failure" not in report
    # one of the two samples failed: 0.5, not above judge.max_failure_rate (0.5); the other met every criterion
    # (weights 5, 3, -1: a negative weight counts 0, so 8 / 8), the failed one counts 0
    assert report["eval/judge/failure_rate"] == 0.5 and report["eval/judge/failed/no_json"] == 1
    assert report["eval/rubric_score"] == 0.5
    assert "| eval/judge/failure_rate | 0.5000 |" in output.with_suffix(".md").read_text()


# What a CPU host must not see: libtpu's initialisation errors (with the test extra's libtpu installed) and
# transformers' notice of a missing PyTorch (the base install has none).
START_UP_NOISE = ("Failed to find host bounds", "unexpected worker hostname", "InitGoogle", "PyTorch was not found")


@pytest.mark.skipif(rubric_jax.accelerator_attached(), reason="a host with an accelerator initialises it")
def test_a_cpu_command_prints_no_accelerator_or_torch_notices(tmp_path):
    """`rubric-jax validate` as a user runs it, without JAX_PLATFORMS and without torch (hidden, as in the base
    install), then the TPU topology `rubric-jax plan` describes through libtpu: stderr holds none of the notices,
    and JAX runs on the CPU."""
    script = ("import sys; sys.modules['torch'] = None\n"
              "import jax\nfrom rubric_jax import cli\nfrom rubric_jax.training.plan import topology_devices\n"
              "status = cli.main(sys.argv[1:])\n"
              "print(jax.devices()[0].platform, len(topology_devices('v5e:2x2')[1]) if HAS_LIBTPU else 4)\n"
              "sys.exit(status)\n").replace("HAS_LIBTPU", str(importlib.util.find_spec("libtpu") is not None))
    env = {key: value for key, value in os.environ.items() if key != "JAX_PLATFORMS"}
    result = subprocess.run([sys.executable, "-c", script, "validate", *TINY_RL, "--rows", "1"], env=env, text=True,
                            capture_output=True, timeout=300, check=False, cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("\ncpu 4\n")
    assert not [line for line in result.stderr.splitlines() if any(noise in line for noise in START_UP_NOISE)], \
        result.stderr
