"""Judged rollouts on disk (`judges.records`): every field survives a write and a read, failed verdicts and
unjudged items included; the reader is strict and names the file and line of a bad record; a directory is read
in name order; writes are atomic; `RecordingJudge` passes verdicts through unchanged and keeps them only while
recording."""

import asyncio
import dataclasses
import json
import math
import re

import pytest

from rubric_jax.judges.base import Judge, JudgeRequest, RolloutVerdict, Verdicts, kept_answer
from rubric_jax.judges.records import (FirstJudged, JudgedRollout, RecordingJudge, judged_rollout_from_json,
                                       judged_rollout_to_json, read_judged_rollouts, with_recipe_values,
                                       write_judged_rollouts)
from rubric_jax.rubrics.schema import Criterion, ItemKind, Rubric

RUBRIC = Rubric(criteria=(
    Criterion(text="states the sum", name="sum", weight=2.0, kind=ItemKind.SUGGEST, tags=("axis:accuracy",)),
    Criterion(text="shows no working", name="no_working", weight=-1.0, kind=ItemKind.PITFALL),
))
SHORT_RUBRIC = Rubric(criteria=(Criterion(text="is polite", name="polite"),))
CONVERSATION = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 3 = ?"})


def request(response: str = "### Step 1: 2 + 3 = 5", rubric: Rubric = RUBRIC) -> JudgeRequest:
    return JudgeRequest(question="2 + 3 = ?", response=response, rubric=rubric, reference="5", num_steps=1,
                        conversation=CONVERSATION)


RECORDS = [
    JudgedRollout(id="step-3/0", step=3, request=request(),
                  verdict=RolloutVerdict(satisfied=(1.0, 0.25), item_step=(1, 0))),
    JudgedRollout(id="step-3/1", step=3, request=request("no idea"),
                  verdict=RolloutVerdict.failure("no_json", "criteria[1] 'shows no working': no JSON object",
                                                 kept_answer("maybe? " * 100))),
    JudgedRollout(id="step-3/2", step=3, request=request("5"), verdict=RolloutVerdict(satisfied=(0.0, 1.0))),
    JudgedRollout(id="by-hand", request=JudgeRequest(question="q", response="r", rubric=SHORT_RUBRIC)),
]


def test_every_field_round_trips_through_a_file(tmp_path):
    path = tmp_path / "records.jsonl"
    write_judged_rollouts(path, RECORDS)
    assert read_judged_rollouts(path) == RECORDS
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert lines[1]["verdict"] == {"satisfied": [], "item_step": None, "reason": "no_json",
                                   "detail": "criteria[1] 'shows no working': no JSON object",
                                   "answer": ("maybe? " * 100)[:300] + " [... cut: 700 characters in all]"}
    assert lines[0]["conversation"] == [dict(m) for m in CONVERSATION]
    assert lines[3]["verdict"] is None and lines[3]["step"] is None and lines[3]["conversation"] is None


def valid_line() -> dict:
    return judged_rollout_to_json(RECORDS[0])


def changed(**changes) -> dict:
    line = valid_line()
    for key, value in changes.items():
        if key.startswith("verdict_"):
            line["verdict"][key.removeprefix("verdict_")] = value
        else:
            line[key] = value
    return line


@pytest.mark.parametrize("line, message", [
    (changed(score=1.0), r"unknown keys \['score'\]"),
    (changed(verdict_confidence=0.9), r"verdict: unknown keys \['confidence'\]"),
    ({k: v for k, v in valid_line().items() if k != "question"}, "missing key 'question'"),
    (changed(rubric={"criteria": [{"name": "sum"}]}), r"criteria\[0\]: missing key 'text'"),
    (changed(rubric={"criteria": [{"text": "a", "weight": "heavy"}]}), r"criteria\[0\]\.weight must be a number"),
    (changed(verdict_satisfied=[1.0], verdict_item_step=None), "the verdict scores 1 criteria, the rubric has 2"),
    (changed(verdict_satisfied=[1.0, 1.5]), r"satisfied must be finite scores in \[0, 1\]"),
    (changed(verdict_satisfied=[True, False]), "verdict.satisfied must be a list of numbers"),
    (changed(verdict_item_step=[1.5, 0]), "verdict.item_step must be a list of ints"),
    (changed(verdict_item_step=[1]), "item_step has 1 entries for 2 items"),
    (changed(verdict_reason="unparsable"), "a failed verdict .'unparsable'. carries no scores"),
    (changed(verdict_answer="maybe?"), "detail or answer without a failure reason"),
    (changed(verdict_answer=["maybe?"]), "reason, detail and answer must be str"),
    (changed(step=True), "step must be an int or null"),
    (changed(conversation="2 + 3 = ?"), "conversation must be a list of messages or null"),
    (changed(conversation=[{"role": "user"}]), r"conversation must be a sequence of \{role, content\} messages"),
    (changed(num_steps=-1), "num_steps must be None or a non-negative int"),
    (changed(id=""), "id must be a non-empty str"),
    ([valid_line()], "expected a JSON object, got list"),
])
def test_a_bad_record_is_an_error_naming_its_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(judged_rollout_to_json(RECORDS[2])) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}:2: .*{message}"):
        read_judged_rollouts(path)
    with pytest.raises(ValueError, match=message):
        judged_rollout_from_json(line)


def test_a_file_written_before_answers_were_kept_still_reads(tmp_path):
    """Rollout logs of older runs have no verdict "answer": it reads as "" (none kept)."""
    line = judged_rollout_to_json(RECORDS[1])
    del line["verdict"]["answer"]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(line) + "\n")
    (record,) = read_judged_rollouts(path)
    assert record.verdict == RolloutVerdict.failure(RECORDS[1].verdict.reason, RECORDS[1].verdict.detail)
    assert record.verdict.answer == ""


def test_recipe_values_round_trip_with_and_without_values(tmp_path):
    valued = [dataclasses.replace(RECORDS[0], values={"reward": 0.75, "advantage": -1.25, "group": 3}),
              dataclasses.replace(RECORDS[2], values={"reward": math.nan, "advantage": 0.0, "group": 0}), RECORDS[3]]
    path = tmp_path / "records.jsonl"
    write_judged_rollouts(path, valued)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert lines[0]["recipe"] == {"reward": 0.75, "advantage": -1.25, "group": 3}
    assert lines[1]["recipe"]["reward"] is None  # strict JSON: NaN as null, read back as NaN
    assert lines[2]["recipe"] is None
    read = read_judged_rollouts(path)
    assert read[0] == valued[0] and read[2] == valued[2] and type(read[0].values["group"]) is int
    assert math.isnan(read[1].values["reward"]) and read[1].values["advantage"] == 0.0


def test_a_file_written_before_recipe_values_still_reads(tmp_path):
    line = judged_rollout_to_json(RECORDS[0])
    del line["recipe"]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(line) + "\n")
    assert read_judged_rollouts(path) == [RECORDS[0]] and RECORDS[0].values is None


@pytest.mark.parametrize("recipe", [[0.5], {"reward": "high"}, {"reward": True}, "0.5"])
def test_bad_recipe_values_are_an_error(recipe):
    with pytest.raises(ValueError, match="recipe must be an object of numbers"):
        judged_rollout_from_json(changed(recipe=recipe))
    with pytest.raises(ValueError, match="values must be null or an object of numbers"):
        dataclasses.replace(RECORDS[0], values=recipe)


def test_with_recipe_values_matches_requests_by_identity_not_equality():
    first, twin, verifier_call = request("5"), request("5"), request("5", SHORT_RUBRIC)
    assert first == twin and first is not twin  # two rollouts of one group may send equal requests
    records = [JudgedRollout(id=f"step-1/{n}", step=1, request=r) for n, r in enumerate([first, twin, verifier_call])]
    values = [(twin, {"reward": 1.0, "advantage": 0.5, "group": 1}),
              (first, {"reward": 0.0, "advantage": -0.5, "group": 1}),
              (request("unrecorded"), {"reward": 2.0, "advantage": 0.0, "group": 2})]
    attached = with_recipe_values(records, values)
    assert [r.values for r in attached] == [{"reward": 0.0, "advantage": -0.5, "group": 1},
                                            {"reward": 1.0, "advantage": 0.5, "group": 1}, None]
    assert [dataclasses.replace(r, values=None) for r in attached] == records  # nothing else changes
    assert with_recipe_values(records, ()) == records


def test_bad_json_and_a_repeated_id_name_their_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", \n')
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}:1: "):
        read_judged_rollouts(path)
    write_judged_rollouts(tmp_path / "runs" / "a.jsonl", RECORDS[:2])
    write_judged_rollouts(tmp_path / "runs" / "b.jsonl", RECORDS[2:0:-1])  # its second record repeats a.jsonl's
    runs = re.escape(str(tmp_path / "runs"))
    with pytest.raises(ValueError, match=f"^{runs}/b.jsonl:2: id 'step-3/1' repeats {runs}/a.jsonl:2$"):
        read_judged_rollouts(tmp_path / "runs")


def test_a_directory_is_read_in_name_order_skipping_other_files_and_blank_lines(tmp_path):
    write_judged_rollouts(tmp_path / "step_000010.jsonl", RECORDS[2:])
    write_judged_rollouts(tmp_path / "step_000002.jsonl", RECORDS[:2])
    (tmp_path / "notes.txt").write_text("not a record")
    (tmp_path / "step_000011.jsonl.tmp").write_text("a torn temporary file")
    with open(tmp_path / "step_000002.jsonl", "a", encoding="utf-8") as handle:
        handle.write("\n   \n")
    assert read_judged_rollouts(tmp_path) == RECORDS


def test_reading_nothing_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="holds no .jsonl files"):
        read_judged_rollouts(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        read_judged_rollouts(tmp_path / "missing.jsonl")


def test_writes_are_atomic_and_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "rollouts" / "step_000001.jsonl"
    write_judged_rollouts(path, RECORDS[:1])
    write_judged_rollouts(path, RECORDS[1:3])  # replaces, never appends
    assert read_judged_rollouts(path) == RECORDS[1:3]

    def failing():
        yield RECORDS[0]
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed mid-write"):
        write_judged_rollouts(path, failing())
    assert read_judged_rollouts(path) == RECORDS[1:3]
    assert [p.name for p in path.parent.iterdir()] == [path.name]


class ScriptedJudge(Judge):
    """Answers each request with the verdict scripted for its response text; counts its closes."""

    def __init__(self, verdicts: dict[str, RolloutVerdict]):
        self.verdicts, self.closed = verdicts, 0

    def judge(self, requests, max_items):
        return Verdicts.from_rollouts([self.verdicts[r.response] for r in requests], max_items)

    def close(self):
        self.closed += 1


def test_recording_judge_keeps_verdicts_only_while_recording_and_passes_them_through():
    scripted = {"a": RolloutVerdict(satisfied=(1.0, 0.5), item_step=(2, 0)),
                "b": RolloutVerdict.failure("x", "why", "maybe?"), "c": RolloutVerdict(satisfied=(0.0,))}
    inner = ScriptedJudge(scripted)
    judge = RecordingJudge(inner)
    batch = [request("a"), request("b"), request("c", SHORT_RUBRIC)]
    unrecorded = judge.judge(batch, max_items=4)
    assert judge.take(1) == []

    judge.recording = True
    verdicts = judge.judge(batch, max_items=4)
    expected = Verdicts.from_rollouts(list(scripted.values()), 4)
    for got in (unrecorded, verdicts):
        assert got.satisfied_bk.tolist() == expected.satisfied_bk.tolist()
        assert got.item_step_bk.tolist() == expected.item_step_bk.tolist()
        assert got.reasons == expected.reasons and got.details == expected.details
        assert got.answers == expected.answers == ("", "maybe?", "")
    asyncio.run(judge.ajudge(batch[2:], max_items=1))
    judge.recording = False
    judge.judge(batch, max_items=4)

    # Each row cut to its rubric's length (padding dropped), in judging order, async calls included.
    assert judge.take(7) == [
        JudgedRollout(id="step-7/0", step=7, request=batch[0], verdict=scripted["a"]),
        JudgedRollout(id="step-7/1", step=7, request=batch[1], verdict=scripted["b"]),
        JudgedRollout(id="step-7/2", step=7, request=batch[2], verdict=scripted["c"]),
        JudgedRollout(id="step-7/3", step=7, request=batch[2], verdict=scripted["c"]),
    ]
    assert judge.take(7) == []  # take() clears
    judge.close()
    assert inner.closed == 1 and judge.http_stats() is None and judge.call_counts() == {}


def test_recorded_rows_without_attribution_have_no_steps():
    """A row whose items all have step -1 (no attribution) is kept with item_step None, as the judge built it."""
    judge = RecordingJudge(ScriptedJudge({"a": RolloutVerdict(satisfied=(1.0, 0.0))}))
    judge.recording = True
    judge.judge([request("a")], max_items=2)
    [record] = judge.take(0)
    assert record.verdict == RolloutVerdict(satisfied=(1.0, 0.0), item_step=None)


def test_first_judged_keeps_the_first_rollouts_across_batches_and_no_more():
    scripted = {"a": RolloutVerdict(satisfied=(1.0, 0.5), item_step=(2, 0)),
                "b": RolloutVerdict.failure("x", "why", "maybe?"), "c": RolloutVerdict(satisfied=(0.0,))}
    judge = ScriptedJudge(scripted)
    keep = FirstJudged(3, "eval-4", step=4)
    for batch in ([request("a"), request("b")], [request("c", SHORT_RUBRIC), request("a")], [request("b")]):
        keep(batch, judge.judge(batch, max_items=2))
    assert keep.records == [
        JudgedRollout(id="eval-4/0", step=4, request=request("a"), verdict=scripted["a"]),
        JudgedRollout(id="eval-4/1", step=4, request=request("b"), verdict=scripted["b"]),
        JudgedRollout(id="eval-4/2", step=4, request=request("c", SHORT_RUBRIC), verdict=scripted["c"]),
    ]
    none = FirstJudged(0, "eval")
    none([request("a")], judge.judge([request("a")], max_items=2))
    assert none.records == []
    with pytest.raises(ValueError, match="count must be >= 0"):
        FirstJudged(-1, "eval")
