"""Idempotent resume of `rubric-jax synthesize` (issue 15, item 2): a subprocess is killed (SIGKILL) mid-run and
the same command run again; the output then equals an uninterrupted run's, with nothing duplicated or lost, and
the second run asked the generator only about the sources the first had not finished. Then the CLI's input
errors."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rubric_jax.data import synthesis
from rubric_jax.yaml_config import load_config
from tests.data.synthesis_generators import DocumentGenerator
from tests.inference.standin_server import StandinServer

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs/synthesize_grounded.yaml"
SPLITS = ("train", "validation", "test")
DOCUMENTS = 40


def write_documents(path: Path) -> None:
    with open(path, "w") as handle:
        for i in range(DOCUMENTS):
            text = (f"Sample {i} of the corpus reports a measured effect of size {i}. The effect grows with "
                    f"temperature and falls with pressure in experiment {i}.")
            handle.write(json.dumps({"id": f"doc-{i}", "text": text}) + "\n")


def command(out: Path, documents: Path, url: str) -> list[str]:
    return [sys.executable, "-m", "rubric_jax.cli", "synthesize", str(CONFIG), f"output_dir={out}",
            f"input.path={documents}", f"generator.url={url}", "max_concurrent_sources=2", "--no-progress"]


def index_lines(out: Path) -> int:
    """The complete lines of the index (a kill may tear the last one, which the resumed run drops)."""
    path = out / synthesis.INDEX_FILE
    return sum(line.endswith("\n") for line in path.read_text().splitlines(keepends=True)) if path.exists() else 0


def split_lines(out: Path) -> dict[str, list[str]]:
    return {name: sorted((out / f"{name}.jsonl").read_text().splitlines()) for name in SPLITS}


def test_a_killed_synthesis_resumes_without_duplicates_or_losses(tmp_path):
    documents = tmp_path / "documents.jsonl"
    write_documents(documents)
    generator = DocumentGenerator()
    with StandinServer(responder=generator, latency_s=0.03) as server:
        reference = tmp_path / "uninterrupted"
        synthesis.synthesize(load_config(synthesis.SynthesisConfig, CONFIG, [
            f"output_dir={reference}", f"input.path={documents}", f"generator.url={server.base_url}"]),
            progress=False)

        out = tmp_path / "killed"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        process = subprocess.Popen(command(out, documents, server.base_url), cwd=REPO, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while index_lines(out) < 6 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.communicate()
        finished_before_kill = index_lines(out)
        assert 6 <= finished_before_kill < DOCUMENTS, "the kill must come mid-run"

        requests_before = len(server.chat_requests)
        resumed = subprocess.run(command(out, documents, server.base_url), cwd=REPO, env=env, capture_output=True,
                                 text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr
        # The first is the command's generator preflight (one request about the first source, done or not).
        second_run_requests = server.chat_requests[requests_before + 1:]

    summary = json.loads((out / synthesis.SUMMARY_JSON).read_text())
    assert summary["this_run"]["skipped_done"] == finished_before_kill
    assert summary["this_run"]["finished"] == DOCUMENTS - finished_before_kill
    assert split_lines(out) == split_lines(reference)
    records = [json.loads(line) for lines in split_lines(out).values() for line in lines]
    assert len(records) == 2 * DOCUMENTS
    assert len({(r["doc_hash"], r["question"]) for r in records}) == len(records)
    assert sorted(json.loads(line)["hash"] for line in (out / synthesis.INDEX_FILE).read_text().splitlines()) == \
        sorted(json.loads(line)["hash"] for line in (reference / synthesis.INDEX_FILE).read_text().splitlines())
    # The resumed run asked about unfinished documents only (those cut mid-flight included), 4 calls for each:
    # analysis, synthesis, two enrichments.
    done = {json.loads(line)["hash"] for line in (out / synthesis.INDEX_FILE).read_text().splitlines()[
        :finished_before_kill]}
    asked = {synthesis.content_hash({"document": r["messages"][-1]["content"].split("<document>\n")[1].split(
        "\n</document>")[0]}) for r in second_run_requests if "<document>" in r["messages"][-1]["content"]}
    assert not asked & done
    assert len(second_run_requests) == 4 * (DOCUMENTS - finished_before_kill)


def test_cli_input_errors_exit_2_with_one_line(tmp_path, capsys):
    from rubric_jax.cli import main

    assert main(["synthesize", str(CONFIG), f"output_dir={tmp_path}", "input.path=nowhere.jsonl"]) == 2
    assert "rubric-jax synthesize: dataset nowhere.jsonl does not exist" in capsys.readouterr().err
    assert main(["synthesize", str(CONFIG), f"output_dir={tmp_path}", "splits={train: 0.5}"]) == 2
    assert "sum to 1" in capsys.readouterr().err
    assert main(["synthesize", str(CONFIG), f"output_dir={tmp_path}", "params.min_criteria=0"]) == 2
    assert "min_criteria" in capsys.readouterr().err
