"""Task "dataset": the column mapping onto records (prompt, template, system prompt, answer, reference, rubric,
grounding, options, tags), the same rows read from JSONL, JSON, CSV, Parquet and save_to_disk, the seeded disjoint
held-out split, the resumable train stream, the bad-row policy (an error naming file, row and column, or a counted
skip), multiple-choice shuffling, outcome checks, the byte tokenizer, and the trainer's checks."""

import json
import math

import datasets
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.data import dataset
from rubric_jax.data.tasks import build_task
from rubric_jax.rubrics.schema import ItemKind
from rubric_jax.training.launch import check_rubric_width

ROWS = [
    {"q": f"Question {i}: what is {i} + {i}?", "gold": str(2 * i), "ref": f"{i} + {i} = {2 * i}",
     "passage": f"Passage {i}.", "labels": [f"topic:{i % 2}"],
     "items": [{"criterion": f"states {2 * i}", "points": 5, "tags": ["axis:accuracy"]},
               {"criterion": "is rude", "points": -2}]}
    for i in range(12)
]
COLUMNS = {"prompt": "q", "answer": "gold", "reference": "ref", "grounding": "passage", "tags": "labels",
           "rubric": "items"}
ITEMS = {"text": "criterion", "weight": "points", "tags": "tags"}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def params(path, **changes):
    return {"path": str(path), "columns": COLUMNS, "rubric_items": ITEMS, "answer_kind": "math", **changes}


@pytest.fixture
def rows_file(tmp_path):
    return write_jsonl(tmp_path / "rows.jsonl", ROWS)


def test_a_row_maps_onto_a_record(rows_file):
    task = build_task("dataset", params(rows_file, system_prompt="Be brief.",
                                        prompt_template="Solve: {question}\nAnswer in \\boxed{}."), 0)
    [record] = [r for r in task.train_stream(0).next_batch(12) if r.row == 3]
    assert task.prompt(record) == [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "Solve: Question 3: what is 3 + 3?\nAnswer in \\boxed{}."}]
    assert task.question(record) == "Question 3: what is 3 + 3?"  # the judge sees the question, not the template
    assert (record.answer, record.reference, record.grounding, record.tags) == ("6", "3 + 3 = 6", "Passage 3.",
                                                                               ("topic:1",))
    assert task.reference(record) == "Passage 3."  # the grounding passage first
    criteria = task.rubric(record).criteria
    assert [(c.text, c.weight, c.kind, c.tags) for c in criteria] == [
        ("states 6", 5.0, ItemKind.CRITERION, ("axis:accuracy",)), ("is rude", -2.0, ItemKind.CRITERION, ())]
    assert task.solution(record) == "3 + 3 = 6"
    assert task.is_correct("so it is \\boxed{6}", record) and not task.is_correct("\\boxed{7}", record)


def test_reference_falls_back_to_the_reference_answer_then_the_gold(rows_file):
    no_passage = {k: v for k, v in COLUMNS.items() if k != "grounding"}
    task = build_task("dataset", params(rows_file, columns=no_passage), 0)
    record = task.train_stream(0).next_batch(1)[0]
    assert task.reference(record) == record.reference
    gold_only = {k: v for k, v in no_passage.items() if k != "reference"}
    task = build_task("dataset", params(rows_file, columns=gold_only), 0)
    record = task.train_stream(0).next_batch(1)[0]
    assert task.reference(record) == record.answer
    with pytest.raises(ValueError, match="columns.reference"):
        task.solution(record)


def _write_every_format(tmp_path, rows):
    """The same rows as JSONL, a JSON list, CSV (nested lists as JSON text), Parquet and a save_to_disk
    DatasetDict."""
    paths = {"jsonl": write_jsonl(tmp_path / "rows.jsonl", rows)}
    (tmp_path / "rows.json").write_text(json.dumps(rows), encoding="utf-8")
    paths["json"] = tmp_path / "rows.json"
    flat = [{k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()} for row in rows]
    datasets.Dataset.from_list(flat).to_csv(str(tmp_path / "rows.csv"), index=False)
    paths["csv"] = tmp_path / "rows.csv"
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "rows.parquet"))
    paths["parquet"] = tmp_path / "rows.parquet"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "saved"))
    paths["save_to_disk"] = tmp_path / "saved"
    return paths


def test_every_file_format_gives_the_same_records(tmp_path):
    paths = _write_every_format(tmp_path, ROWS)
    seen = {}
    for kind, path in paths.items():
        task = build_task("dataset", params(path, eval_size=3), 0)
        records = task.train_stream(0).next_batch(9) + task.eval_examples(3)
        seen[kind] = [(r.row, r.messages, r.question, r.answer, r.reference, r.rubric, r.grounding, r.tags)
                      for r in records]
    assert all(value == seen["jsonl"] for value in seen.values()), {k: v[0] for k, v in seen.items()}


def test_the_table_is_memory_mapped_arrow(rows_file):
    task = build_task("dataset", params(rows_file), 0)
    assert isinstance(task._train.table, datasets.Dataset) and task._train.table.cache_files


def test_the_held_out_rows_are_seeded_and_never_trained_on(rows_file):
    task = build_task("dataset", params(rows_file, eval_size=4), 7)
    held_out = [r.row for r in task.eval_examples(10)]
    assert len(held_out) == 4 and len(set(held_out)) == 4
    trained = {r.row for r in task.train_stream(0).next_batch(8 * 3)}  # three epochs of the 8 training rows
    assert trained == set(range(12)) - set(held_out)
    assert [r.row for r in build_task("dataset", params(rows_file, eval_size=4), 7).eval_examples(4)] == held_out
    other_seeds = {tuple(r.row for r in build_task("dataset", params(rows_file, eval_size=4), s).eval_examples(4))
                   for s in range(5)}
    assert len(other_seeds) > 1
    assert task.data_metrics() == {"data/train_rows": 8.0, "data/eval_rows": 4.0}


def test_held_out_rows_from_another_file_or_split(tmp_path, rows_file):
    other = write_jsonl(tmp_path / "test.jsonl", ROWS[:2])
    task = build_task("dataset", params(rows_file, eval_path=str(other)), 0)
    assert [(r.source, r.row) for r in task.eval_examples(5)] == [(str(other), 0), (str(other), 1)]
    assert len({r.row for r in task.train_stream(0).next_batch(12)}) == 12
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                          "test": datasets.Dataset.from_list(ROWS[5:7])}).save_to_disk(str(tmp_path / "saved"))
    task = build_task("dataset", params(tmp_path / "saved", eval_split="test"), 0)
    assert [r.question for r in task.eval_examples(5)] == [ROWS[5]["q"], ROWS[6]["q"]]
    with pytest.raises(ValueError, match="no held-out rows"):
        build_task("dataset", params(rows_file), 0).eval_examples(1)


@given(st.integers(0, 40), st.integers(1, 9), st.integers(0, 3))
def test_a_resumed_stream_continues_exactly(position, batch, seed):
    task = _small_task(seed)
    uninterrupted = task.train_stream(0)
    uninterrupted.next_batch(position)
    resumed = task.train_stream(position)
    assert [r.row for r in resumed.next_batch(batch)] == [r.row for r in uninterrupted.next_batch(batch)]
    assert resumed.position == position + batch


_TASKS = {}


def _small_task(seed):
    """One task per seed over a module-level file (hypothesis draws many examples; the table loads once)."""
    if seed not in _TASKS:
        import tempfile  # noqa: PLC0415
        from pathlib import Path  # noqa: PLC0415
        directory = Path(tempfile.mkdtemp())
        _TASKS[seed] = build_task("dataset", params(write_jsonl(directory / "rows.jsonl", ROWS[:7])), seed)
    return _TASKS[seed]


def test_each_epoch_visits_every_training_row_once_in_a_new_order(rows_file):
    stream = build_task("dataset", params(rows_file), 3).train_stream(0)
    epochs = [[r.row for r in stream.next_batch(12)] for _ in range(3)]
    assert all(sorted(epoch) == list(range(12)) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) == 3


BAD_ROWS = [
    ({"q": None}, "q", "missing_prompt", "expected a non-empty string, got None"),
    ({"q": "   "}, "q", "missing_prompt", "expected a non-empty string"),
    ({"gold": None}, "gold", "missing_answer", "expected a gold answer, got None"),
    ({"gold": float("nan")}, "gold", "missing_answer", "expected a gold answer, got None"),  # Arrow: a null
    ({"items": []}, "items", "empty_rubric", "the rubric has no item"),
    ({"items": "not json"}, "items", "bad_rubric", "expected a list of rubric items, got 'not json'"),
    ({"items": {"criterion": "x"}}, "items", "bad_rubric", "expected a list of rubric items"),
    ({"items": [{"criterion": "x", "points": float("nan")}]}, "items", "bad_weight",
     "item 0: field 'points' must be a finite number, got None"),  # JSON's NaN: an Arrow null
    ({"items": [{"criterion": "x", "points": "5"}]}, "items", "bad_weight",
     "item 0: field 'points' must be a finite number, got '5'"),
    ({"items": [{"criterion": "ok", "points": 1}, {"points": 2}]}, "items", "bad_rubric",
     "item 1: field 'criterion' must be a non-empty string, got None"),
    ({"items": [3]}, "items", "bad_rubric", "item 0: expected a mapping or a string, got 3"),
    ({"labels": [1, 2]}, "labels", "bad_tags", "expected a list of non-empty strings, got [1, 2]"),
    ({"ref": ""}, "ref", "missing_reference", "expected a non-empty string"),
    ({"passage": 12}, "passage", "missing_grounding", "expected a non-empty string, got 12"),
]


@pytest.mark.parametrize("change, column, reason, problem", BAD_ROWS)
def test_a_bad_row_is_an_error_naming_file_row_and_column(tmp_path, change, column, reason, problem):
    rows = [dict(row) for row in ROWS]
    rows[5] = {**rows[5], **change}
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(dataset.DatasetRowError, match=None) as raised:
        build_task("dataset", params(path), 0)
    assert str(raised.value).startswith(f"{path}: row 5: column {column!r}: ")
    assert problem in str(raised.value) and raised.value.reason == reason


@pytest.mark.parametrize("change, column, reason, problem", BAD_ROWS)
def test_a_bad_row_is_skipped_and_counted_under_bad_rows_skip(tmp_path, change, column, reason, problem):
    rows = [dict(row) for row in ROWS]
    rows[5] = {**rows[5], **change}
    task = build_task("dataset", params(write_jsonl(tmp_path / "bad.jsonl", rows), bad_rows="skip", eval_size=2), 0)
    assert task.data_metrics() == {"data/train_rows": 9.0, "data/eval_rows": 2.0, f"data/skipped/train/{reason}": 1.0}
    served = {r.row for r in task.train_stream(0).next_batch(30)} | {r.row for r in task.eval_examples(2)}
    assert served == set(range(12)) - {5}


def test_a_nan_weight_of_a_float_column_is_a_bad_weight(tmp_path):
    rows = [{**row, "items": [{"criterion": "x", "points": 1.5, "tags": []}]} for row in ROWS]
    rows[2]["items"][0]["points"] = float("nan")
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "nan.parquet"))
    with pytest.raises(dataset.DatasetRowError, match="row 2: column 'items': item 0: field 'points' must be a "
                                                      "finite number, got nan"):
        build_task("dataset", params(tmp_path / "nan.parquet"), 0)


def test_a_column_the_table_lacks_is_named_with_the_columns_it_has(rows_file):
    with pytest.raises(ValueError, match=r"no column 'answer' \(columns: q, gold, ref"):
        build_task("dataset", params(rows_file, columns={**COLUMNS, "answer": "answer"}), 0)


@pytest.mark.parametrize("path, message", [
    ("{tmp}/missing.jsonl", "dataset {tmp}/missing.jsonl does not exist"),
    ("{tmp}/rows.txt", "rows.txt: unknown file type"),
    ("{tmp}/broken.jsonl", "dataset {tmp}/broken.jsonl: line 3 is not valid JSON: Expecting property name enclosed "
                           "in double quotes at column 2"),
    ("{tmp}/scalar.jsonl", "dataset {tmp}/scalar.jsonl: line 2 is not a JSON object (one row per line), got 7"),
    ("{tmp}/broken.json", "dataset {tmp}/broken.json: not valid JSON: Expecting ',' delimiter at line 2, column 13"),
    ("{tmp}/empty.jsonl", "dataset {tmp}/empty.jsonl: the file is empty: it has no rows"),
    ("{tmp}/blank.jsonl", "dataset {tmp}/blank.jsonl: the file is empty: it has no rows"),
    ("{tmp}/header.csv", "dataset {tmp}/header.csv: the file has only a header: it has no rows"),
])
def test_a_path_that_does_not_load_is_one_clear_error(tmp_path, path, message):
    (tmp_path / "rows.txt").write_text("x")
    (tmp_path / "broken.jsonl").write_text('{"q": "a"}\n\n{not json\n')  # a blank line still counts as a line
    (tmp_path / "scalar.jsonl").write_text('{"q": "a"}\n7\n')
    (tmp_path / "broken.json").write_text('[{"q": "a"},\n {"q": "b"} {"q": "c"}]\n')
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n \n")
    (tmp_path / "header.csv").write_text("q,gold\n")
    with pytest.raises(ValueError, match=None) as raised:
        build_task("dataset", params(path.replace("{tmp}", str(tmp_path))), 0)
    assert message.replace("{tmp}", str(tmp_path)) in str(raised.value)


@pytest.mark.parametrize("changes, message", [
    ({"columns": {"answer": "gold"}}, "exactly one of columns.prompt and columns.messages"),
    ({"columns": {"prompt": "q", "messages": "m"}}, "exactly one of columns.prompt and columns.messages"),
    ({"prompt_template": "no placeholder"}, "prompt_template must hold {question} exactly once"),
    ({"answer_kind": "choice"}, "answer_kind choice needs columns.options"),
    ({"columns": {"prompt": "q"}, "answer_kind": "math"}, "answer_kind math needs columns.answer"),
    ({"eval_size": 2, "eval_split": "test"}, "set at most one of eval_path, eval_split and eval_size"),
    ({"rubric_format": "nope"}, "rubric_format must be one of"),
    ({"bad_rows": "ignore"}, "task.params.bad_rows: expected one of ['error', 'skip']"),
    ({"colums": {}}, "unknown config key task.params.colums"),
    ({"preset": "nope"}, "task.params.preset: unknown preset 'nope'"),
    ({"rubric_items": {"weight_labels": {"Essential": "high"}}}, "weight_labels['Essential'] must be a finite"),
    ({"question_pattern": "(unclosed"}, "question_pattern is not a regular expression"),
    ({"question_pattern": "no group"}, "question_pattern must have a group: the question"),
    ({"columns": {"messages": "m"}, "prompt_template": "{question}!"}, "prompt_template applies to a text prompt"),
])
def test_the_config_is_checked(rows_file, changes, message):
    with pytest.raises(ValueError, match=None) as raised:
        build_task("dataset", params(rows_file, **changes), 0)
    assert message in str(raised.value)


def test_rubric_items_read_strings_labels_kinds_and_the_format(tmp_path):
    rows = [{"q": "q1", "gold": "1", "items": ["plain text", {"d": "labelled", "w": "Essential", "t": "pitfall"}]}]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    fields = {"text": "d", "weight": "w", "kind": "t", "weight_labels": {"Essential": 5}}
    task = build_task("dataset", {"path": str(path), "columns": {"prompt": "q", "answer": "gold", "rubric": "items"},
                                  "rubric_items": fields, "answer_kind": "math"}, 0)
    criteria = task.rubric(task.train_stream(0).next_batch(1)[0]).criteria
    assert [(c.text, c.weight, c.kind) for c in criteria] == [
        ("plain text", 1.0, ItemKind.CRITERION), ("labelled", 5.0, ItemKind.PITFALL)]
    rows = [{"q": "q1", "gold": "1", "items": [{"d": "a fact", "w": -1, "t": "factual"}]}]
    with pytest.raises(dataset.DatasetRowError, match=r"row 0: column 'items': criteria\[0\].weight: format 'rgr'"):
        build_task("dataset", {"path": str(write_jsonl(tmp_path / "rgr.jsonl", rows)), "rubric_format": "rgr",
                               "columns": {"prompt": "q", "answer": "gold", "rubric": "items"},
                               "rubric_items": {"text": "d", "weight": "w", "kind": "t"}, "answer_kind": "math"}, 0)


def test_chat_message_prompts_and_a_system_prompt(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                          {"role": "user", "content": "My knee hurts."}]},
            {"messages": [{"role": "system", "content": "Own system."}, {"role": "user", "content": "Q?"}]}]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    task = build_task("dataset", {"path": str(path), "columns": {"messages": "messages"}, "system_prompt": "S."}, 0)
    first, second = sorted(task.train_stream(0).next_batch(2), key=lambda r: r.row)
    assert task.prompt(first)[0] == {"role": "system", "content": "S."} and len(task.prompt(first)) == 4
    assert task.question(first) == "My knee hurts."
    assert task.prompt(second) == rows[1]["messages"]  # a conversation's own system message is kept
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"messages": [{"role": "robot", "content": "x"}]}])
    with pytest.raises(dataset.DatasetRowError, match="row 0: column 'messages': expected a non-empty list"):
        build_task("dataset", {"path": str(bad), "columns": {"messages": "messages"}}, 0)


@pytest.mark.parametrize("suffix", ["jsonl", "csv"])  # CSV holds the messages as JSON text
def test_a_prompt_column_of_chat_messages_is_an_error_naming_columns_messages(tmp_path, suffix):
    chats = [[{"role": "user", "content": f"Question {i}?"}] for i in range(2)]
    path = tmp_path / f"chat.{suffix}"
    if suffix == "jsonl":
        write_jsonl(path, [{"conversation": chat} for chat in chats])
    else:
        datasets.Dataset.from_dict({"conversation": [json.dumps(chat) for chat in chats]}).to_csv(path, index=False)
    with pytest.raises(dataset.DatasetRowError, match=None) as raised:
        build_task("dataset", {"path": str(path), "columns": {"prompt": "conversation"}}, 0)
    assert str(raised.value) == (f"{path}: row 0: column 'conversation': holds chat messages, not text: map it as "
                                 "columns.messages: conversation (not columns.prompt)")
    assert raised.value.reason == "messages_in_prompt"
    task = build_task("dataset", {"path": str(path), "columns": {"messages": "conversation"}}, 0)
    assert task.question(task.train_stream(0).next_batch(1)[0]).startswith("Question ")


def test_a_question_pattern_takes_the_question_out_of_its_wrapper(tmp_path):
    rows = [{"m": [{"role": "user", "content": "Solve this. QUESTION: What is 2+2? END"}]},
            {"m": [{"role": "user", "content": "No marker here."}]}]
    path = write_jsonl(tmp_path / "wrapped.jsonl", rows)
    params = {"path": str(path), "columns": {"messages": "m"}, "question_pattern": r"QUESTION:(.*)END",
              "prompt_template": "Q: {question}", "bad_rows": "skip"}
    task = build_task("dataset", params, 0)
    [record] = task.train_stream(0).next_batch(1)
    assert task.question(record) == "What is 2+2?" and task.prompt(record) == [{"role": "user",
                                                                                "content": "Q: What is 2+2?"}]
    assert task.data_metrics()["data/skipped/train/bad_prompt"] == 1.0
    with pytest.raises(dataset.DatasetRowError, match="row 1: column 'm': question_pattern finds no question in"):
        build_task("dataset", {**params, "bad_rows": "error"}, 0)


def test_dotted_columns_read_nested_cells(tmp_path):
    rows = [{"prompt": "Find x.", "reward_model": {"ground_truth": "3", "style": "rule"}}]
    path = write_jsonl(tmp_path / "nested.jsonl", rows)
    task = build_task("dataset", {"path": str(path), "answer_kind": "math",
                                  "columns": {"prompt": "prompt", "answer": "reward_model.ground_truth"}}, 0)
    assert task.train_stream(0).next_batch(1)[0].answer == "3"


GPQA_ROWS = [{"Question": f"Q{i}?", "Correct Answer": f"right {i}", "Incorrect Answer 1": f"wrong {i}a",
              "Incorrect Answer 2": f"wrong {i}b", "Incorrect Answer 3": f"wrong {i}c"} for i in range(6)]
GPQA_COLUMNS = {"prompt": "Question", "correct_option": "Correct Answer",
                "incorrect_options": ["Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"]}


def test_gpqa_options_are_shuffled_by_seed_and_the_gold_letter_follows_the_right_option(tmp_path):
    path = write_jsonl(tmp_path / "gpqa.jsonl", GPQA_ROWS)
    orders = set()
    for seed in range(4):
        task = build_task("dataset", {"path": str(path), "columns": GPQA_COLUMNS, "answer_kind": "choice"}, seed)
        for record in task.train_stream(0).next_batch(6):
            letter = record.answer
            assert record.options[dataset.LETTERS.index(letter)] == f"right {record.row}"
            assert f"\n{letter}. right {record.row}" in task.prompt(record)[0]["content"]
            assert task.is_correct(f"The answer is ({letter}).", record)
            assert not task.is_correct("The answer is (" + ("A" if letter != "A" else "B") + ").", record)
            orders.add(record.options)
    assert len(orders) > 6  # the shuffle depends on the seed


def test_options_with_a_letter_or_index_answer_are_remapped_through_the_shuffle(tmp_path):
    rows = [{"question": "Pick.", "options": ["w", "x", "y", "z"], "letter": "C", "index": 2}]
    path = write_jsonl(tmp_path / "mc.jsonl", rows)
    for answer in ("letter", "index"):
        for shuffle in (False, True):
            task = build_task("dataset", {"path": str(path), "answer_kind": "choice", "shuffle_options": shuffle,
                                          "columns": {"prompt": "question", "options": "options", "answer": answer},
                                          "prompt_template": "{question}\nOptions:\n{options}\nGo."}, 1)
            record = task.train_stream(0).next_batch(1)[0]
            assert record.options[dataset.LETTERS.index(record.answer)] == "y"
            assert record.answer == "C" or shuffle
            assert task.prompt(record)[0]["content"].startswith("Pick.\nOptions:\nA. ")
    bad = write_jsonl(tmp_path / "bad.jsonl", [{**rows[0], "letter": "E"}])
    with pytest.raises(dataset.DatasetRowError, match="column 'letter': expected an option letter in A-D"):
        build_task("dataset", {"path": str(bad), "answer_kind": "choice",
                               "columns": {"prompt": "question", "options": "options", "answer": "letter"}}, 0)


def test_exact_and_none_answers(tmp_path):
    path = write_jsonl(tmp_path / "e.jsonl", [{"q": "Capital of France?", "gold": "Paris"}])
    task = build_task("dataset", {"path": str(path), "answer_kind": "exact",
                                  "columns": {"prompt": "q", "answer": "gold"}}, 0)
    record = task.train_stream(0).next_batch(1)[0]
    assert task.is_correct("It is\n  paris ", record) and task.is_correct("\\boxed{PARIS}", record)
    assert not task.is_correct("Paris, France", record)
    task = build_task("dataset", {"path": str(path), "columns": {"prompt": "q"}}, 0)
    assert not task.is_correct("Paris", task.train_stream(0).next_batch(1)[0])


def test_a_rubric_needs_an_llm_judge_and_no_rubric_judges_no_items(rows_file):
    with pytest.raises(ValueError, match="set judge.kind: llm"):
        build_task("dataset", params(rows_file), 0).judge()
    no_rubric = {k: v for k, v in COLUMNS.items() if k != "rubric"}
    task = build_task("dataset", params(rows_file, columns=no_rubric), 0)
    from rubric_jax.judges.base import JudgeRequest  # noqa: PLC0415
    record = task.train_stream(0).next_batch(1)[0]
    verdicts = task.judge().judge([JudgeRequest(task.question(record), "x", task.rubric(record))], 0)
    assert verdicts.satisfied_bk.shape == (1, 0) and not verdicts.failed_b.any()


def test_the_recipes_max_items_must_hold_the_longest_rubric(rows_file):
    task = build_task("dataset", params(rows_file), 0)
    assert task.longest_rubric == 2

    class Narrow:
        max_items = 1

    with pytest.raises(ValueError, match="longest rubric has 2 items, more than algorithm.params.max_items"):
        check_rubric_width(Narrow(), task)
    Narrow.max_items = 2
    check_rubric_width(Narrow(), task)


@given(st.text(max_size=200))
def test_the_byte_tokenizer_encodes_any_text_and_decodes_it_back(text):
    tokenizer = _byte_tokenizer()
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert all(0 <= i < len(tokenizer) for i in ids)
    assert tokenizer.decode(ids) == text


_BYTE_TOKENIZER = []


def _byte_tokenizer():
    if not _BYTE_TOKENIZER:
        _BYTE_TOKENIZER.append(dataset.byte_tokenizer())
    return _BYTE_TOKENIZER[0]


def test_the_byte_tokenizer_has_chatml_special_tokens():
    tokenizer = _byte_tokenizer()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hé"}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>") == 1
    assert tokenizer.eos_token_id == 2 and tokenizer.pad_token_id == 0 and len(tokenizer) == 259
    assert tokenizer.decode(ids) == "<|im_start|>user\nhé<|im_end|>\n<|im_start|>assistant\n"
    assert math.isclose(len(tokenizer.encode("hé", add_special_tokens=False)), 3)  # h, and é's two bytes
    assert np.all(np.asarray(ids) < 259)
