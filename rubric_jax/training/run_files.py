"""The files of a run directory beside its checkpoints and metrics (`training.rl`'s module docstring): the judged
rollouts of every `rollout_log.every_steps`-th step (rollouts/step_<n>.jsonl, `judges.records`), the samples to
read (samples.jsonl rows, `samples_of`) and the experience an overlapped run sampled ahead of its checkpoint
(pending/step_<n>.npz: arrays and JSON, never a pickle, so resuming never runs what a run directory holds)."""

import io
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping, Optional

import jax
import numpy as np

from rubric_jax.algorithms.base import Experience
from rubric_jax.core.rewards import weighted_fraction
from rubric_jax.judges.records import (JudgedRollout, judged_rollout_from_json, judged_rollout_to_json,
                                       write_judged_rollouts)
from rubric_jax.training.experience import SampledExperience
from rubric_jax.training.metrics import MetricsWriter


ROLLOUT_LOG_DIR = "rollouts"
_ROLLOUT_LOG_NAME = re.compile(r"step_(\d+)\.jsonl")


def rollout_log_path(out: Path, step: int) -> Path:
    """The file of step `step`'s judged rollouts in the run directory `out` (`RolloutLogConfig`)."""
    return out / ROLLOUT_LOG_DIR / f"step_{step:06d}.jsonl"


def drop_rollout_logs_after(out: Path, step: int) -> None:
    """Deletes the rollout files of the steps after `step` in the run directory `out`: a run resumed from step
    `step` abandons them (module docstring)."""
    for path in (out / ROLLOUT_LOG_DIR).glob("step_*.jsonl"):
        match = _ROLLOUT_LOG_NAME.fullmatch(path.name)
        if match and int(match.group(1)) > step:
            path.unlink()


PENDING_DIR = "pending"
_PENDING_NAME = re.compile(r"step_(\d+)\.npz")


def _pending_dir(out: Path) -> Path:
    """out/pending; in a multi-process run, this process's out/pending/process_<k> (each samples its own share)."""
    directory = out / PENDING_DIR
    return directory if jax.process_count() == 1 else directory / f"process_{jax.process_index()}"


def samples_of(records: list[JudgedRollout], count: int) -> list[dict[str, Any]]:
    """The first `count` judged rollouts as samples to read (`RolloutLogConfig.samples_per_step`): id, question,
    response, each criterion with its weight and verdict, the rubric score (the weighted fraction of the rubric
    satisfied, as "eval/rubric_score"; a recipe's reward may shape it further), the judge's failure reason, its
    detail and the failed call's raw answer (cut, `judges.base.kept_answer`; null when the judge did not fail or
    kept none), and what the recipe made of the rollout, its reward, advantage and group (`JudgedRollout.values`;
    null for an evaluation's samples and for a judge call that is about no trained rollout)."""
    samples = []
    for record in records[:count]:
        criteria, verdict = record.request.rubric.criteria, record.verdict
        satisfied = [None] * len(criteria) if verdict.failed else list(verdict.satisfied)
        score = None if verdict.failed else float(weighted_fraction(
            np.asarray([satisfied], np.float32), np.asarray([[c.weight for c in criteria]], np.float32),
            np.ones((1, len(criteria)), bool))[0])
        samples.append({"id": record.id, "question": record.request.question, "response": record.request.response,
                        "criteria": [{"text": c.text, "weight": c.weight, "satisfied": s}
                                     for c, s in zip(criteria, satisfied)],
                        "rubric_score": score, "judge_failure": verdict.reason or None,
                        "judge_detail": verdict.detail or None, "judge_answer": verdict.answer or None,
                        "recipe": record.values})
    return samples


def write_step_rollouts(out: Path, writer: MetricsWriter, step: int, sampled: SampledExperience,
                        samples_per_step: int) -> dict[str, int]:
    """Where the loop turns step `step`'s judged rollouts into files (`step` completed steps; the records are
    those `sample_experience` took from the recorder, and travel with the experience they judged, in memory and in
    the pending file): its rollout file (`rollout_log_path`) when the step logs one, written by process 0 alone
    (its share, docs/multihost.md), and its first `samples_per_step` as samples to read (`samples_of`; `writer`
    writes on process 0 alone). Returns what the step's metrics line gains: "rollout_log/records", the rollouts
    a logged step judged."""
    if sampled.records is None:
        return {}
    logged = {}
    if sampled.logs_rollouts:
        if jax.process_index() == 0:
            write_judged_rollouts(rollout_log_path(out, step), sampled.records)
        logged["rollout_log/records"] = len(sampled.records)
    writer.write_samples(step, samples_of(sampled.records, samples_per_step))
    return logged


def pending_path(out: Path, step: int) -> Path:
    """The file of the experience an overlapped run (`RolloutConfig.overlap`) had sampled ahead for the step
    after `step` when it checkpointed step `step`, in the run directory `out`."""
    return _pending_dir(out) / f"step_{step:06d}.npz"


def pending_arrays(sampled: SampledExperience) -> dict[str, np.ndarray]:
    """`sampled` as plain arrays, for `np.savez` (read back by `pending_from_arrays` with allow_pickle=False: a run
    directory is never a way to run code): the batch's arrays under "batch/<key>", the metrics' values as float64
    arrays, and the rest (prompt width, metric names, the judged rollouts' JSON, `judges.records`) as UTF-8 JSON."""
    meta = {"prompt_width": sampled.experience.prompt_width, "logs_rollouts": sampled.logs_rollouts,
            "experience_metrics": list(sampled.experience.metrics), "metrics": list(sampled.metrics),
            "records": None if sampled.records is None else [judged_rollout_to_json(r) for r in sampled.records]}
    return {**{f"batch/{key}": np.asarray(value) for key, value in sampled.experience.batch.items()},
            "experience_metric_values": np.array(list(sampled.experience.metrics.values()), np.float64),
            "metric_values": np.array(list(sampled.metrics.values()), np.float64),
            "meta": np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8)}


def pending_from_arrays(arrays: Mapping[str, np.ndarray]) -> SampledExperience:
    """The SampledExperience that `pending_arrays` wrote."""
    meta = json.loads(bytes(arrays["meta"]).decode("utf-8"))
    batch = {key.removeprefix("batch/"): arrays[key] for key in arrays if key.startswith("batch/")}
    experience = Experience(batch=batch, prompt_width=int(meta["prompt_width"]), metrics=dict(zip(
        meta["experience_metrics"], arrays["experience_metric_values"].tolist())))
    records = None if meta["records"] is None else [judged_rollout_from_json(r) for r in meta["records"]]
    return SampledExperience(experience, dict(zip(meta["metrics"], arrays["metric_values"].tolist())), records,
                             bool(meta["logs_rollouts"]))


def save_pending(out: Path, step: int, sampled: SampledExperience, oldest_kept: int) -> None:
    """Writes `sampled` as checkpoint `step`'s pending experience (`pending_path`, `pending_arrays`; written whole
    or not at all, before the checkpoint), and deletes those of the steps before `oldest_kept` (no checkpoint
    resumes there)."""
    path = pending_path(out, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, **pending_arrays(sampled))
    partial = path.with_suffix(".partial")
    partial.write_bytes(buffer.getvalue())
    os.replace(partial, path)
    for other in path.parent.glob("step_*.npz"):
        match = _PENDING_NAME.fullmatch(other.name)
        if match and int(match.group(1)) < oldest_kept:
            other.unlink()


def resume_pending(out: Path, step: int) -> Optional[SampledExperience]:
    """The pending experience of checkpoint `step` of the run directory `out` (None when that run did not sample
    ahead); those of later steps, which the resumed run abandons, are deleted."""
    for other in _pending_dir(out).glob("step_*.npz"):
        match = _PENDING_NAME.fullmatch(other.name)
        if match and int(match.group(1)) > step:
            other.unlink()
    path = pending_path(out, step)
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as arrays:
        return pending_from_arrays({key: arrays[key] for key in arrays.files})

