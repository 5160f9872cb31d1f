"""Synthesis -> training (issue 15): the five fixture documents through configs/synthesize_grounded.yaml against a
scripted generator, then one CPU step of configs/rubric_grounded_dataset_cpu.yaml on the synthesized train split
as written, with the grounded judge over HTTP. No conversion between the two: the records are read by preset
rubric_grounded."""

import dataclasses
import math
from pathlib import Path

from rubric_jax.data import synthesis
from rubric_jax.data.tasks import build_task
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import RLConfig
from rubric_jax.yaml_config import load_config
from tests.data.synthesis_generators import DocumentGenerator
from tests.inference.standin_server import StandinServer, fenced
from tests.training.test_dataset_runs import first_criterion_in_full, json_lines

REPO = Path(__file__).resolve().parents[2]


def test_synthesize_five_documents_then_train_one_step(tmp_path):
    out = tmp_path / "synthesized"
    with StandinServer(responder=DocumentGenerator()) as server:
        config = load_config(synthesis.SynthesisConfig, REPO / "configs/synthesize_grounded.yaml", [
            f"output_dir={out}", f"input.path={REPO / 'tests/fixtures/synthesis/documents.jsonl'}",
            f"generator.url={server.base_url}", "splits={train: 1.0}"])
        summary = synthesis.synthesize(config, progress=False)
    assert summary["records"] == {"train": 7}

    run = load_config(RLConfig, REPO / "configs/rubric_grounded_dataset_cpu.yaml", [
        f"output_dir={tmp_path / 'run'}", "steps=1", f"task.params.path={out / 'train.jsonl'}"])
    task = build_task(run.task.name, run.task.params, run.task.seed)
    with StandinServer(tokenizer=task.tokenizer(), responder=first_criterion_in_full) as judge:
        last = train_rl(dataclasses.replace(run, judge=dataclasses.replace(run.judge, url=judge.base_url)), task)
        requests = list(judge.chat_requests)[1:]  # after the launch's preflight request

    # One judge call per rollout, each showing a synthesized question's passage and its five criteria.
    assert len(requests) == run.rollout.prompts_per_step * run.rollout.group_size
    passages = {fenced(r["messages"][-1]["content"], "source_passage") for r in requests}
    assert passages <= {record.grounding for record in task.train_records()}
    assert all(len(json_lines(r["messages"][-1]["content"], "criteria")) == 5 for r in requests)
    # Weights 1..5 (total 15): c_1 in full, the others half theirs, (1 + 14 / 2) / 15 for every rollout.
    assert math.isclose(last["reward/mean"], 8 / 15, rel_tol=1e-6)
    assert math.isfinite(last["train/loss"])
