"""Judged rollouts on disk: what a training run saves (`RecordingJudge`, the run's `rollout_log`) and what
`rubric-jax judge-agreement` reads as its items.

One JSON object a line (`judged_rollout_to_json`):

    {"id": "step-3/7", "step": 3, "question": ..., "response": ...,
     "rubric": Rubric.to_dict(), "reference": str | null, "num_steps": int | null,
     "conversation": [{"role", "content"}, ...] | null,
     "recipe": {"reward": float, "advantage": float, "group": int, ...} | null,
     "verdict": {"satisfied": [float in [0, 1], one per criterion], "item_step": [int, ...] | null,
                 "reason": "" | a failure code, "detail": "" | the failure's free text,
                 "answer": "" | the failed call's raw answer (`judges.base.kept_answer`: cut, and marked so)}}

`recipe` holds what the training recipe made of the rollout (`JudgedRollout.values`: its reward, the advantage it
trained with, its group within the step; `with_recipe_values`), null for a request that is no rollout of the
recipe's (a verifier's call, a rollout left out of the batch) and outside training; optional on reading (files
written before it read as null), a NaN written as null reads back as NaN.
`verdict` is optional (an item written by hand to be judged has none); a failed verdict has `reason` set and no
scores (`satisfied` empty, `item_step` null). `answer` is optional on reading ("" when absent: files written
before it was kept). `step` is the training step whose experience the rollout is (1-based,
as in metrics.jsonl), null outside training. Reading is strict (`judged_rollout_from_json`): unknown keys, wrong
types, a rubric that does not validate, scores that do not match the rubric's length, a failed verdict with
scores are ValueErrors naming the file's line, because these files feed statistics, where a silently dropped
field would bias the result.
"""

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from rubric_jax import strict_json
from rubric_jax.inference.http import ClientStats
from rubric_jax.judges.base import Judge, JudgeRequest, RolloutVerdict, Verdicts
from rubric_jax.rubrics.schema import Rubric

_KEYS = ("id", "step", "question", "response", "rubric", "reference", "num_steps", "conversation", "recipe",
         "verdict")
_VERDICT_KEYS = ("satisfied", "item_step", "reason", "detail", "answer")


@dataclasses.dataclass(frozen=True)
class JudgedRollout:
    """A rollout, the request its judge was sent, and the verdict (None: not judged yet). `id` names it among
    the records read together; `step` is the training step whose experience it is (None outside training);
    `values` what the recipe made of it, {"reward": ..., "advantage": ..., "group": ...} (module docstring,
    `with_recipe_values`), None when it has none."""

    id: str
    request: JudgeRequest
    verdict: Optional[RolloutVerdict] = None
    step: Optional[int] = None
    values: Optional[dict[str, float]] = None

    def __post_init__(self):
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"id must be a non-empty str, got {self.id!r}")
        if not isinstance(self.request, JudgeRequest):
            raise ValueError(f"request must be a JudgeRequest, got {type(self.request).__name__}")
        if self.verdict is not None and not isinstance(self.verdict, RolloutVerdict):
            raise ValueError(f"verdict must be None or a RolloutVerdict, got {type(self.verdict).__name__}")
        if self.step is not None and not _is_int(self.step):
            raise ValueError(f"step must be an int or null, got {self.step!r}")
        if self.values is not None and not (isinstance(self.values, Mapping) and all(
                isinstance(k, str) and _is_number(v) for k, v in self.values.items())):
            raise ValueError(f"values must be null or an object of numbers, got {self.values!r}")
        if self.verdict is not None and not self.verdict.failed \
                and len(self.verdict.satisfied) != len(self.request.rubric.criteria):
            raise ValueError(f"{self.id}: the verdict scores {len(self.verdict.satisfied)} criteria, the rubric has "
                             f"{len(self.request.rubric.criteria)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


RecipeValues = Sequence[tuple[JudgeRequest, Mapping[str, float]]]
"""What a recipe made of the rollouts it had judged (`algorithms.base.Experience.recipe_values`): (the request
object it sent its judge, that rollout's values) pairs, a request matched by identity (`is`), never by equality:
two rollouts may send equal requests."""


def with_recipe_values(records: Iterable[JudgedRollout], recipe_values: RecipeValues) -> list[JudgedRollout]:
    """`records` (a `RecordingJudge.take`, whose requests are the objects the recipe sent) with each record's
    `values` set from the pair of `recipe_values` whose request is its request (`is`); a record without one (a
    verifier's call, a rollout the batch does not train) keeps its values."""
    by_request = {id(request): values for request, values in recipe_values}
    return [dataclasses.replace(record, values=dict(by_request[id(record.request)]))
            if id(record.request) in by_request else record for record in records]


def verdict_rows(verdicts: Verdicts, requests: Sequence[JudgeRequest]) -> list[RolloutVerdict]:
    """The per-rollout verdicts of a padded batch, each cut to its request's rubric length."""
    rows = []
    for b, request in enumerate(requests):
        if verdicts.failed_b[b]:
            rows.append(RolloutVerdict.failure(verdicts.reasons[b], verdicts.details[b], verdicts.answers[b]))
            continue
        k = len(request.rubric.criteria)
        steps = verdicts.item_step_bk[b, :k]
        rows.append(RolloutVerdict(satisfied=tuple(verdicts.satisfied_bk[b, :k].tolist()),
                                   item_step=None if (steps == -1).all() else tuple(steps.tolist())))
    return rows


def judged_rollout_to_json(record: JudgedRollout) -> dict[str, Any]:
    request, verdict = record.request, record.verdict
    return {
        "id": record.id,
        "step": record.step,
        "question": request.question,
        "response": request.response,
        "rubric": request.rubric.to_dict(),
        "reference": request.reference,
        "num_steps": request.num_steps,
        "conversation": None if request.conversation is None else [dict(m) for m in request.conversation],
        "recipe": None if record.values is None else dict(record.values),
        "verdict": None if verdict is None else {
            "satisfied": list(verdict.satisfied),
            "item_step": None if verdict.item_step is None else list(verdict.item_step),
            "reason": verdict.reason,
            "detail": verdict.detail,
            "answer": verdict.answer,
        },
    }


def _verdict_from_json(data: Any) -> Optional[RolloutVerdict]:
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise ValueError(f"verdict must be an object or null, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_VERDICT_KEYS))
    if unknown:
        raise ValueError(f"verdict: unknown keys {unknown}; allowed {list(_VERDICT_KEYS)}")
    satisfied, item_step = data.get("satisfied"), data.get("item_step")
    if not isinstance(satisfied, list) or not all(
            isinstance(s, (int, float)) and not isinstance(s, bool) for s in satisfied):
        raise ValueError(f"verdict.satisfied must be a list of numbers, got {satisfied!r}")
    if item_step is not None and not (isinstance(item_step, list) and all(_is_int(k) for k in item_step)):
        raise ValueError(f"verdict.item_step must be a list of ints or null, got {item_step!r}")
    try:  # RolloutVerdict checks the scores' range, the steps' length, that a failure has neither, the answer's size
        return RolloutVerdict(satisfied=tuple(satisfied), item_step=item_step, reason=data.get("reason", ""),
                              detail=data.get("detail", ""), answer=data.get("answer", ""))
    except ValueError as error:
        raise ValueError(f"verdict: {error}") from None


def _values_from_json(data: Any) -> Optional[dict[str, float]]:
    if data is None:
        return None
    if not isinstance(data, Mapping) or not all(value is None or _is_number(value) for value in data.values()):
        raise ValueError(f"recipe must be an object of numbers (null for NaN) or null, got {data!r}")
    return {key: math.nan if value is None else value for key, value in data.items()}


def judged_rollout_from_json(data: Any) -> JudgedRollout:
    """The inverse of judged_rollout_to_json (module docstring); ValueError naming the field."""
    if not isinstance(data, Mapping):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise ValueError(f"unknown keys {unknown}; allowed {list(_KEYS)}")
    for key in ("id", "question", "response", "rubric"):
        if key not in data:
            raise ValueError(f"missing key {key!r}")
    conversation = data.get("conversation")
    if conversation is not None and not isinstance(conversation, list):
        raise ValueError(f"conversation must be a list of messages or null, got {type(conversation).__name__}")
    request = JudgeRequest(question=data["question"], response=data["response"],
                           rubric=Rubric.from_dict(data["rubric"]), reference=data.get("reference"),
                           num_steps=data.get("num_steps"),
                           conversation=None if conversation is None else tuple(conversation))
    return JudgedRollout(id=data["id"], request=request, verdict=_verdict_from_json(data.get("verdict")),
                         step=data.get("step"), values=_values_from_json(data.get("recipe")))


def jsonl_files(path: str | os.PathLike) -> list[Path]:
    """`path` itself, or the *.jsonl files of a directory in name order (a run's rollouts/ directory)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if not files:
            raise ValueError(f"{path} holds no .jsonl files")
        return files
    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    return [path]


def read_judged_rollouts(path: str | os.PathLike) -> list[JudgedRollout]:
    """Every record of a JSONL file or a directory of them (`jsonl_files`); blank lines are skipped. ValueError
    naming the file and line of a bad record, or a repeated id."""
    records, seen = [], {}
    for file in jsonl_files(path):
        with open(file, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                where = f"{file}:{number}"
                try:
                    record = judged_rollout_from_json(json.loads(line))
                except ValueError as error:  # json's decode errors included
                    raise ValueError(f"{where}: {error}") from None
                if record.id in seen:
                    raise ValueError(f"{where}: id {record.id!r} repeats {seen[record.id]}")
                seen[record.id] = where
                records.append(record)
    return records


def write_judged_rollouts(path: str | os.PathLike, records: Iterable[JudgedRollout]) -> None:
    """Writes `records` to `path` atomically (a temporary file `<path>.tmp`, which no reader lists, renamed over
    it), so a killed writer leaves the old file or the new one, never half of one; a write that raises removes
    its temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(strict_json.dumps(judged_rollout_to_json(record), ensure_ascii=False) + "\n")
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


class FirstJudged:
    """Keeps the first `count` rollouts of the batches it is called with, `(requests, verdicts)` in the order
    judged (an `evaluate` `on_judged` hook), as `records` with ids "<id_prefix>/<n>" and step `step`: the sample
    generations of an evaluation, without holding all of them."""

    def __init__(self, count: int, id_prefix: str, step: Optional[int] = None):
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self.count, self.id_prefix, self.step = count, id_prefix, step
        self.records: list[JudgedRollout] = []

    def __call__(self, requests: Sequence[JudgeRequest], verdicts: Verdicts) -> None:
        room = self.count - len(self.records)
        if room <= 0:
            return
        requests = list(requests)[:room]
        rows = verdict_rows(verdicts, requests)
        self.records += [JudgedRollout(id=f"{self.id_prefix}/{len(self.records) + n}", request=request,
                                       verdict=verdict, step=self.step)
                         for n, (request, verdict) in enumerate(zip(requests, rows))]


class RecordingJudge(Judge):
    """A judge that passes every call to `inner` and, while `recording`, keeps each request with its verdict
    (`take()` hands them over and clears them). The training loop wraps its judge in one to save rollouts; it is
    recipe-blind, so whatever a recipe sends its judge (policy rollouts, refined responses) is what is saved."""

    def __init__(self, inner: Judge):
        self.inner = inner
        self.recording = False
        self._kept: list[tuple[JudgeRequest, RolloutVerdict]] = []

    def _keep(self, requests: Sequence[JudgeRequest], verdicts: Verdicts) -> Verdicts:
        if self.recording:
            self._kept.extend(zip(requests, verdict_rows(verdicts, requests)))
        return verdicts

    def judge(self, requests: Sequence[JudgeRequest], max_items: int) -> Verdicts:
        return self._keep(requests, self.inner.judge(requests, max_items))

    async def ajudge(self, requests: Sequence[JudgeRequest], max_items: int) -> Verdicts:
        return self._keep(requests, await self.inner.ajudge(requests, max_items))

    @property
    def unrecorded(self) -> Judge:
        return self.inner.unrecorded

    def record(self, requests: Sequence[JudgeRequest], verdicts: Verdicts) -> None:
        self._keep(requests, verdicts)

    def take(self, step: int) -> list[JudgedRollout]:
        """The kept rollouts as records of training step `step` (ids "step-<step>/<n>" in judging order)."""
        kept, self._kept = self._kept, []
        return [JudgedRollout(id=f"step-{step}/{n}", request=request, verdict=verdict, step=step)
                for n, (request, verdict) in enumerate(kept)]

    def http_stats(self) -> Optional[ClientStats]:
        return self.inner.http_stats()

    def format_metrics(self) -> dict[str, float]:
        return self.inner.format_metrics()

    def call_counts(self) -> dict[str, int]:
        return self.inner.call_counts()

    def close(self) -> None:
        self.inner.close()

