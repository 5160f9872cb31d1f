"""A run's judge health (`JudgeConfig`): the server is probed before anything is written (an unreachable URL or
refused credentials stop the launch with one line), credentials come from an environment variable and headers,
and judge failures beyond the failure budget stop the run before it trains on them."""

import dataclasses
import http.server
import json
import socket
import threading

import numpy as np
import pytest

from rubric_jax import cli
from rubric_jax.judges import preflight
from rubric_jax.judges.base import Judge, Verdicts
from rubric_jax.training import assembly, launch, rl, runs
from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.metrics import read_metrics
from rubric_jax.training.run_config import JudgeConfig
from tests.training.test_rl import tiny_rl_config
from tests.training.toy_task import toy_task

KEY = "s3cret-key-value"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ModelsServer:
    """GET /v1/models answered 200 listing "served-judge" when the request carries "Authorization: Bearer KEY"
    (or when no key is required), else 401; every request's headers are kept. POST /v1/chat/completions answers
    `answer` under "served-judge", and under any other name only with `any_name` (as SGLang), else 404 (as
    vLLM), with a `usage` object as servers send it (tokens counted as words)."""

    def __init__(self, require_key: bool, answer: str = '{"rating": 1}', any_name: bool = False):
        seen = self.headers = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def reply(self, status: int, body: bytes = b""):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                seen.append(dict(self.headers))
                authorised = not require_key or self.headers.get("Authorization") == f"Bearer {KEY}"
                body = json.dumps({"object": "list", "data": [{"id": "served-judge"}]}).encode()
                self.reply(200, body) if authorised else self.reply(401)

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if request["model"] != "served-judge" and not any_name:
                    self.reply(404, json.dumps({"error": f"model {request['model']} not found"}).encode())
                    return
                prompt_tokens = sum(len(m["content"].split()) for m in request["messages"])
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(answer.split()),
                         "total_tokens": prompt_tokens + len(answer.split())}
                self.reply(200, json.dumps({"choices": [{"message": {"role": "assistant", "content": answer},
                                                         "finish_reason": "stop"}], "usage": usage}).encode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def llm_judge(url: str, **fields) -> JudgeConfig:
    return JudgeConfig(kind="llm", url=url, model="served-judge", format="rating", **fields)


def test_an_unreachable_judge_stops_the_launch_before_anything_is_written(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}"
    config = tiny_rl_config(tmp_path, judge=llm_judge(url))
    with pytest.raises(runs.RunStopped, match=f"judge.url {url} does not answer \\(connection"):
        rl.train_rl(config, toy_task())
    assert not (tmp_path / "run").exists()


def test_the_cli_reports_an_unreachable_judge_in_one_line_and_exits_1(tmp_path, capsys):
    url = f"http://127.0.0.1:{closed_port()}"
    status = cli.main(["train", "configs/rar_dataset_cpu.yaml", f"output_dir={tmp_path}/run", f"judge.url={url}"])
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"rubric-jax train: judge.url {url} does not answer")
    assert not (tmp_path / "run").exists()  # the CLI's writability check creates nothing either


def test_the_key_comes_from_the_environment_and_refused_credentials_stop_the_launch(tmp_path, monkeypatch):
    with ModelsServer(require_key=True) as server:
        judge = llm_judge(server.url, api_key_env="RUBRIC_JAX_TEST_KEY", headers={"X-Project": "rubrics"})
        monkeypatch.delenv("RUBRIC_JAX_TEST_KEY", raising=False)
        with pytest.raises(runs.RunStopped, match="judge.api_key_env names RUBRIC_JAX_TEST_KEY, which is not set"):
            assembly.make_judge(judge, toy_task(), 0)

        monkeypatch.setenv("RUBRIC_JAX_TEST_KEY", "wrong")
        config = tiny_rl_config(tmp_path, judge=judge)
        with pytest.raises(runs.RunStopped, match=f"judge.url {server.url} refused the credentials \\(HTTP 401\\): "
                                                "set judge.api_key_env"):
            rl.train_rl(config, toy_task())
        assert not (tmp_path / "run").exists()

        monkeypatch.setenv("RUBRIC_JAX_TEST_KEY", KEY)
        client = assembly.make_judge(judge, toy_task(), 0)
        try:
            assert preflight.served_models(client.chat, "judge") == ["served-judge"]  # answers 200
        finally:
            client.close()
        assert server.headers[-1]["Authorization"] == f"Bearer {KEY}"
        assert server.headers[-1]["X-Project"] == "rubrics"


def test_a_model_the_server_does_not_list_is_refused_unless_the_server_answers_any_name(tmp_path, caplog):
    """A server that lists its models and refuses others (404) stops the launch naming what it serves; one that
    answers the unlisted name (SGLang, llama-server) lets the run start with a warning."""
    other = dataclasses.replace(llm_judge("http://x:1"), model="other-judge")
    with ModelsServer(require_key=False) as server:
        config = tiny_rl_config(tmp_path, judge=dataclasses.replace(other, url=server.url))
        with pytest.raises(runs.RunStopped, match=r"judge.model 'other-judge' is not among the models "
                                                f"{server.url} serves \\(served-judge\\) and the server refused it "
                                                r"\(HTTP 404\): set judge.model to one of them"):
            rl.train_rl(config, toy_task())
        assert not (tmp_path / "run").exists()
    with ModelsServer(require_key=False, any_name=True) as server:
        client = assembly.make_judge(dataclasses.replace(other, url=server.url), toy_task(), 0)
        try:
            launch.check_llm_roles(client, None, toy_task(), "rating")
        finally:
            client.close()
    assert "judge.model 'other-judge' is not among the models" in caplog.text and "served-judge" in caplog.text
    assert "the server answered it" in caplog.text


@pytest.mark.parametrize("fields, message", [
    ({"api_key_env": "sk-abc123 key"}, "judge.api_key_env is the name of an environment variable"),
    ({"api_key_env": "KEY", "headers": {"authorization": "Bearer x"}}, "leave it out of judge.headers"),
    ({"headers": {"X-Count": 3}}, "judge.headers must map header names to strings"),
    ({"max_failure_rate": 1.5}, "judge.max_failure_rate must be in [0, 1]"),
    ({"max_failing_steps": 0}, "judge.max_failing_steps must be >= 1"),
])
def test_bad_judge_health_settings_are_refused(fields, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        llm_judge("http://127.0.0.1:1", **fields)


class ScriptedFailures(Judge):
    """The toy task's judge, except that every row of the steps numbered in `failing_steps` (from 0) fails. The
    judge is called once per group (pipelined judging): `calls_per_step` calls a step (tiny_rl_config's 2
    prompts)."""

    def __init__(self, failing_steps: set[int], calls_per_step: int = 2):
        self.inner = toy_task().judge()
        self.failing_steps, self.calls_per_step, self.calls = failing_steps, calls_per_step, 0

    def judge(self, requests, max_items):
        call, self.calls = self.calls, self.calls + 1
        if call // self.calls_per_step not in self.failing_steps:
            return self.inner.judge(requests, max_items)
        rows = len(requests)
        return Verdicts(np.zeros((rows, max_items), np.float32), np.full((rows, max_items), -1, np.int32),
                        np.ones(rows, bool), ("http_500",) * rows)


def test_judge_failures_beyond_the_budget_stop_the_run_before_its_update(tmp_path):
    config = tiny_rl_config(tmp_path, steps=5, judge=JudgeConfig(max_failing_steps=2))
    # Step 1 judged, steps 2-3 failed: the budget of 2 consecutive failing steps is spent at step 3.
    with pytest.raises(runs.RunStopped, match=r"judge/failure_rate was above judge.max_failure_rate \(0.5\) on 2 "
                                            r"consecutive steps \(step 3: 100%; http_500\).*before step 3's update"):
        rl.train_rl(config, toy_task(), judge=ScriptedFailures({1, 2}))
    lines = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2]
    assert lines[0]["judge/failure_rate"] == 0 and lines[1]["judge/failure_rate"] == 1
    assert Checkpointer(tmp_path / "run" / "checkpoints").latest_step() == 2


def test_failing_steps_that_are_not_consecutive_or_a_budget_of_1_never_stop(tmp_path):
    config = tiny_rl_config(tmp_path / "a", steps=4, judge=JudgeConfig(max_failing_steps=2))
    rl.train_rl(config, toy_task(), judge=ScriptedFailures({0, 2}))
    assert len(read_metrics(tmp_path / "a" / "run" / "metrics.jsonl")) == 4
    config = tiny_rl_config(tmp_path / "b", steps=2, judge=JudgeConfig(max_failure_rate=1.0, max_failing_steps=1))
    rl.train_rl(config, toy_task(), judge=ScriptedFailures({0, 1}))
    assert len(read_metrics(tmp_path / "b" / "run" / "metrics.jsonl")) == 2
