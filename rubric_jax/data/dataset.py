"""Task "dataset": a dataset on disk (JSONL, JSON, Parquet, CSV, a `save_to_disk` directory, a directory of data
files, or a dataset name already in the local Hugging Face cache) read through Hugging Face `datasets` as a
memory-mapped Arrow table, its columns mapped onto the recipes' `Task` by a declarative config.

A row becomes a `Record`: the prompt (a text column, with an optional system prompt and prompt template, or a
chat-messages column), the gold answer and how it is checked (`answer_kind`), a reference answer, a rubric, a
grounding passage that only the judge sees, multiple-choice options, and tags. A preset (`presets.py`) fills the
mapping for the papers' datasets; keys given beside it override it.

Conventions:
- Rows are read where they lie: the table is memory-mapped, and a `Record` is built from one row when a batch
  asks for it, so a 100k-row dataset is never held as Python objects.
- Every row is checked once when the task is built (`record_from_row`). A bad row (a missing or empty column, a
  rubric that is empty or no list, a weight that is NaN or no number, a gold letter with no option, ...) is a
  `DatasetRowError` naming the file, the row and the column under `bad_rows: error` (the default), or is left
  out and counted by reason under `bad_rows: skip`: `data_metrics()` reports the counts, and the first skipped
  rows are logged with their reasons. Nothing is dropped silently, and no bad row reaches a run.
- Model text never enters here; dataset text is placed into prompts by plain substitution of `{question}` and
  `{options}` (never `str.format`, which LaTeX braces would break), and JSON-encoded rubric cells are read by
  `json.loads`.
- Held-out rows: `eval_path` (another file), `eval_split` (another split of `path`), or `eval_size` rows carved
  from the training rows by a permutation seeded by the task's seed: the first `eval_size` valid rows of that
  order are held out and never reach the train stream. The train stream visits the remaining valid rows in an
  order reshuffled each epoch from (seed, epoch); row p of the stream depends on (seed, p) only, so a resumed
  stream continues exactly (`train_stream(position)`).
- `Task.reference`, what the judge may see and the policy never does: the grounding passage when the dataset
  has one, else the reference answer, else the gold answer.
- Multiple choice: options come from a list column (`columns.options`) or, as GPQA stores them, from a correct
  column and incorrect columns (`columns.correct_option`, `columns.incorrect_options`), then shuffled per row from
  (seed, row) when `shuffle_options`; they are lettered A, B, ... and shown where the template says `{options}`
  (or after the question when the template does not). The gold is a letter, a 0-based index, or, with the
  correct/incorrect columns, the correct option's position after the shuffle.
"""

import collections
import dataclasses
import functools
import json
import logging
import math
import re
import string
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping, Optional, Sequence

import numpy as np
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from rubric_jax.data import arithmetic
from rubric_jax.judges.outcome import (
    EQUIVALENT, OutcomeVerifier, equivalence_status, final_answer_text, math_answer)
from rubric_jax.judges.programmatic import ProgrammaticJudge
from rubric_jax.rubrics import parsing
from rubric_jax.rubrics.schema import FORMATS, Criterion, ItemKind, Rubric

logger = logging.getLogger(__name__)

LETTERS = string.ascii_uppercase
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
ROLES = ("system", "user", "assistant")
MAX_LOGGED_SKIPS = 5
MAX_RUBRIC_ITEMS = 256  # of one row: far above any paper's (SRaR's rubrics average 7.5 items)
_ITEM_KINDS = {kind.name: kind for kind in ItemKind}


@dataclasses.dataclass(frozen=True)
class ColumnMap:
    """Which column holds what; None: the dataset has none. Exactly one of `prompt` (a text column) and
    `messages` (a column of chat messages, [{"role", "content"}, ...]) is required."""

    prompt: Optional[str] = None
    messages: Optional[str] = None
    answer: Optional[str] = None
    reference: Optional[str] = None
    rubric: Optional[str] = None
    grounding: Optional[str] = None
    tags: Optional[str] = None
    options: Optional[str] = None
    correct_option: Optional[str] = None
    incorrect_options: tuple[str, ...] = ()
    id: Optional[str] = None

    def __post_init__(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of columns.prompt and columns.messages must be set")
        if (self.correct_option is None) != (not self.incorrect_options):
            raise ValueError("columns.correct_option and columns.incorrect_options go together")
        if self.options is not None and self.correct_option is not None:
            raise ValueError("columns.options and columns.correct_option are two ways of giving the options: set one")


@dataclasses.dataclass(frozen=True)
class RubricItemFields:
    """How one rubric item reads, when items are mappings (a string item is its text, weight 1).

    text: the field of the item's text (required in every item). name: an optional title (RaR's "title").
    weight: the field of its weight or signed points (None: every item weighs 1); a weight may also be a label
    of `weight_labels` (e.g. RaR's {"Essential": 5, ...}). kind: the field of its type, an `ItemKind` name read
    case-insensitively (SRaR's SUGGEST / PITFALL / BONUS / ANSWER, RGR's factual / process; None: CRITERION for
    every item of the generic, rubric-grounded, RLCER and EvoRubric formats). tags: the field of its labels.
    required_elements, keywords, scoring_guide, verification_method: the fields of the rubric-grounded items'
    Definition 1 parts (rubric_grounded_rl.txt, Appendix E: "required_elements", "expected_keywords", ...), which
    its judge is shown."""

    text: str = "criterion"
    name: Optional[str] = None
    weight: Optional[str] = "weight"
    kind: Optional[str] = None
    tags: Optional[str] = None
    weight_labels: dict = dataclasses.field(default_factory=dict)
    required_elements: Optional[str] = None
    keywords: Optional[str] = None
    scoring_guide: Optional[str] = None
    verification_method: Optional[str] = None

    def __post_init__(self):
        for label, value in self.weight_labels.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"rubric_items.weight_labels[{label!r}] must be a finite number, got {value!r}")


@dataclasses.dataclass(frozen=True)
class DatasetConfig:
    """Task "dataset"'s params (module docstring). `path`: a file, a directory or a cached dataset name; `split`
    and `name` (the dataset's configuration) are those of `datasets.load_dataset` and `load_from_disk` (a single
    file is one split). `answer_kind`: how `is_correct` checks a response: "math" (the last box against the gold
    by math-verify), "choice" (the option letter), "exact" (the last box, or else the last line, equal to the gold
    up to case and white space), "none" (no gold: never correct, and no accuracy metric is logged).
    `rubric_encoding`: "items", a list of items (`rubric_items` says how each reads), or "srar_tags", SRaR's text
    of tagged lines ("<SUGGEST> ...", the authors' data; `parsing.parse_srar_rubric`). `excluded_options`: option texts left out (MMLU-Pro's "N/A"
    padding). `question_pattern`: a regular expression whose first group is the question inside the prompt text
    (the text column, or the last user message), for datasets that store their question wrapped in their own
    instruction (DAPO-Math-17k); the policy's prompt is then built from that question (with `prompt_template`).
    `max_rows`: only the first rows (quick runs)."""

    path: str
    split: str = "train"
    name: Optional[str] = None
    preset: Optional[str] = None
    columns: Optional[ColumnMap] = None
    rubric_items: RubricItemFields = RubricItemFields()
    rubric_encoding: Literal["items", "srar_tags"] = "items"
    rubric_format: str = "generic"
    answer_kind: Literal["math", "choice", "exact", "none"] = "none"
    system_prompt: Optional[str] = None
    prompt_template: Optional[str] = None
    question_pattern: Optional[str] = None
    shuffle_options: bool = True
    excluded_options: tuple[str, ...] = ()
    eval_path: Optional[str] = None
    eval_split: Optional[str] = None
    eval_size: int = 0
    bad_rows: Literal["error", "skip"] = "error"
    max_rows: Optional[int] = None

    def __post_init__(self):
        if self.columns is None:
            raise ValueError("task.params needs columns (or a preset that sets them)")
        if self.rubric_encoding == "srar_tags" and self.rubric_format != "srar":
            raise ValueError("rubric_encoding srar_tags reads SRaR rubrics: set rubric_format srar")
        if self.rubric_format not in FORMATS:
            raise ValueError(f"rubric_format must be one of {sorted(FORMATS)}, got {self.rubric_format!r}")
        if self.prompt_template is not None:
            if self.columns.prompt is None and self.question_pattern is None:
                raise ValueError("prompt_template applies to a text prompt column (columns.prompt) or to the "
                                 "question that question_pattern takes out of the messages")
            if self.prompt_template.count("{question}") != 1:
                raise ValueError("prompt_template must hold {question} exactly once")
        if self.question_pattern is not None:
            try:
                groups = re.compile(self.question_pattern).groups
            except re.error as error:
                raise ValueError(f"question_pattern is not a regular expression: {error}") from None
            if groups < 1:
                raise ValueError("question_pattern must have a group: the question")
        has_options = self.columns.options is not None or self.columns.correct_option is not None
        if self.answer_kind == "choice" and not has_options:
            raise ValueError("answer_kind choice needs columns.options or columns.correct_option")
        if self.answer_kind in ("math", "exact") and self.columns.answer is None:
            raise ValueError(f"answer_kind {self.answer_kind} needs columns.answer")
        if self.answer_kind == "choice" and self.columns.answer is None and self.columns.correct_option is None:
            raise ValueError("answer_kind choice needs columns.answer (a letter or index) or columns.correct_option")
        if sum(x is not None for x in (self.eval_path, self.eval_split)) + (self.eval_size > 0) > 1:
            raise ValueError("set at most one of eval_path, eval_split and eval_size")
        if self.eval_size < 0 or (self.max_rows is not None and self.max_rows < 1):
            raise ValueError(f"eval_size must be >= 0 and max_rows None or >= 1, got {self.eval_size}, {self.max_rows}")


@dataclasses.dataclass(frozen=True)
class Record:
    """One row as the recipes see it. `messages`: the policy's prompt; `question`: the question as the judge sees
    it (the text column before the template, or the last user message); `answer`: the gold (a letter for
    multiple choice); `options`: the lettered options' texts; `source` and `row`: where it came from."""

    source: str
    row: int
    messages: tuple[Mapping[str, str], ...]
    question: str
    answer: Optional[str]
    reference: Optional[str]
    rubric: Rubric
    grounding: Optional[str]
    options: tuple[str, ...]
    tags: tuple[str, ...]
    id: Optional[str]


class DatasetRowError(ValueError):
    """A row that cannot be used: `reason` (a short code, counted under `bad_rows: skip`), and the message naming
    the file, the row and the column."""

    def __init__(self, source: str, row: int, column: Optional[str], reason: str, problem: str):
        where = f"{source}: row {row}" + (f": column {column!r}" if column is not None else "")
        super().__init__(f"{where}: {problem}")
        self.reason = reason


# ---------------------------------------------------------------------------------------------- loading


def load_table(path: str, split: str = "train", name: Optional[str] = None):
    """The `datasets.Dataset` at `path` (module docstring): a file by its suffix, a `save_to_disk` directory (a
    DatasetDict is indexed by `split`), another directory as data files, else a dataset name resolved by
    `load_dataset` (the local cache, or the hub when the user's environment allows it). ValueError naming the
    path when nothing loads."""
    import datasets  # noqa: PLC0415  (pyarrow and pandas: only for dataset tasks)

    location = Path(path)
    try:
        if location.is_file():
            builder = FILE_BUILDERS.get("".join(location.suffixes[-1:]).lower())
            if builder is None:
                raise ValueError(f"{path}: unknown file type; expected one of {sorted(FILE_BUILDERS)}")
            try:
                return datasets.load_dataset(builder, data_files=str(location), split="train")
            except Exception:  # datasets' own message names neither the file nor the line (pyarrow's row is 0-based)
                problem = _file_problem(location.read_text(encoding="utf-8", errors="replace"), builder)
                if problem is None:
                    raise
                raise ValueError(f"dataset {path}: {problem}") from None
        if location.is_dir() and any((location / f).is_file() for f in ("state.json", "dataset_dict.json")):
            table = datasets.load_from_disk(str(location))
            return table[split] if isinstance(table, datasets.DatasetDict) else table
        if location.is_dir():
            return datasets.load_dataset(str(location), name, split=split)
        if path.startswith((".", "/", "~")) or location.suffix.lower() in FILE_BUILDERS:
            raise ValueError(f"dataset {path} does not exist")
        return datasets.load_dataset(path, name, split=split)
    except ValueError:
        raise
    except (FileNotFoundError, KeyError, OSError, datasets.exceptions.DatasetNotFoundError) as error:
        raise ValueError(f"dataset {path} (split {split!r}) does not load: {_one_line(error)}") from None
    except Exception as error:  # noqa: BLE001  (datasets raises many types for unreadable files)
        raise ValueError(f"dataset {path} (split {split!r}) does not load: {type(error).__name__}: "
                         f"{_one_line(error)}") from None


def _file_problem(text: str, builder: str) -> Optional[str]:
    """Why a data file's `text` did not load, in a user's terms: no rows (empty or blank, or a CSV header alone),
    or, for JSON (`builder` "json"), the first line of a JSON Lines file that is not a JSON object (numbered from 1,
    as editors do), or where a single JSON document breaks. None when neither explains it."""
    if not text.strip():
        return "the file is empty: it has no rows"
    if builder == "csv" and not "".join(text.splitlines()[1:]).strip():
        return "the file has only a header: it has no rows"
    if builder != "json":
        return None
    try:
        json.loads(text)
        return None  # one JSON document: its layout, not its syntax, is what datasets refused
    except json.JSONDecodeError as error:
        document_error = error
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    for number, line in lines:
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            if number == lines[0][0]:  # not JSON Lines: one document that breaks somewhere
                return (f"not valid JSON: {document_error.msg} at line {document_error.lineno}, column "
                        f"{document_error.colno}")
            return f"line {number} is not valid JSON: {error.msg} at column {error.colno}"
        if not isinstance(value, dict):
            return f"line {number} is not a JSON object (one row per line), got {_shown(value)}"
    return None


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


# ---------------------------------------------------------------------------------------------- rows


def _number_text(value: Any) -> Optional[str]:
    """A gold answer cell as text: a non-empty string stripped, an int or a finite float written plainly
    (AMC23's 27.0 is "27"), a list of such answers joined by ", " (OlympiadBench's final_answer)."""
    if isinstance(value, (list, tuple)):
        parts = [_number_text(v) for v in value]
        return ", ".join(parts) if parts and all(parts) else None
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, (float, np.floating)) and math.isfinite(value):
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    return None


def cell(row: Mapping[str, Any], column: str) -> Any:
    """Row `row`'s value of `column`; a dotted name reads into nested mappings ("reward_model.ground_truth", as
    DAPO-Math stores its answers); None when absent."""
    if column in row:
        return row[column]
    value: Any = row
    for part in column.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


class _RowReader:
    """Reads one row's cells, raising DatasetRowError that names the source, the row and the column."""

    def __init__(self, row: Mapping[str, Any], source: str, index: int):
        self.row, self.source, self.index = row, source, index

    def get(self, column: str) -> Any:
        return cell(self.row, column)

    def fail(self, column: Optional[str], reason: str, problem: str):
        raise DatasetRowError(self.source, self.index, column, reason, problem)

    def text(self, column: str, reason: str) -> str:
        value = self.get(column)
        if not isinstance(value, str) or not value.strip():
            self.fail(column, reason, f"expected a non-empty string, got {_shown(value)}")
        return value

    def strings(self, column: str, reason: str) -> tuple[str, ...]:
        value = self.get(column)
        if isinstance(value, str):
            value = _json_list(value) if value.lstrip().startswith("[") else [value]
        if value is None:
            return ()
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
            self.fail(column, reason, f"expected a list of non-empty strings, got {_shown(value)}")
        return tuple(value)


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _json_list(text: str) -> Any:
    """A JSON-encoded list cell (CSV and some Parquet files store nested lists as text); the text itself when
    it is not JSON, so that the caller's type check reports it."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _chat_messages(value: Any) -> bool:
    """Whether a cell looks like chat messages: a list (or its JSON text) of mappings with a role."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        value = _json_list(value)
    return (isinstance(value, (list, tuple)) and len(value) > 0
            and all(isinstance(m, Mapping) and "role" in m for m in value))


def _messages(reader: _RowReader, column: str) -> list[dict[str, str]]:
    value = reader.get(column)
    if isinstance(value, str):
        value = _json_list(value)
    ok = isinstance(value, (list, tuple)) and len(value) > 0 and all(
        isinstance(m, Mapping) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in value)
    if not ok or not any(m["role"] == "user" for m in value):
        reader.fail(column, "bad_messages", "expected a non-empty list of {role, content} chat messages with a user "
                                            f"message, roles among {ROLES}, got {_shown(value)}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _options(reader: _RowReader, columns: ColumnMap, config: DatasetConfig, seed: int
             ) -> tuple[tuple[str, ...], Optional[int], np.ndarray]:
    """(the options in the order shown, the shown position of the correct one when the columns give it (GPQA),
    the shuffle: order[i] is the original position of shown option i)."""
    if columns.correct_option is not None:
        options = [reader.text(columns.correct_option, "bad_options")]
        options += [reader.text(column, "bad_options") for column in columns.incorrect_options]
        correct = 0
    elif columns.options is not None:
        options = list(reader.strings(columns.options, "bad_options"))
        correct = None
    else:
        return (), None, np.arange(0)
    # GPQA's option cells carry stray newlines; MMLU-Pro pads its option lists with "N/A" at the end.
    options = [option.strip() for option in options if option.strip() not in config.excluded_options]
    if not 2 <= len(options) <= len(LETTERS):
        reader.fail(columns.options or columns.correct_option, "bad_options",
                    f"expected 2 to {len(LETTERS)} options, got {len(options)}")
    order = np.arange(len(options))
    if config.shuffle_options:
        order = np.random.default_rng([seed, reader.index]).permutation(len(options))
    shown = tuple(options[i] for i in order)
    return shown, (None if correct is None else int(np.flatnonzero(order == correct)[0])), order


def _choice_answer(reader: _RowReader, column: str, order: np.ndarray) -> str:
    """The gold letter after the options' shuffle `order`, from a letter ("C", "(C)") or a 0-based index."""
    value = reader.get(column)
    count = len(order)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        original = int(value)
    elif isinstance(value, str) and value.strip(" ()").upper() in LETTERS[:count] and value.strip(" ()"):
        original = LETTERS.index(value.strip(" ()").upper())
    else:
        original = -1
    if not 0 <= original < count:
        reader.fail(column, "bad_answer", f"expected an option letter in {LETTERS[0]}-{LETTERS[count - 1]} or a "
                                          f"0-based index below {count}, got {_shown(value)}")
    return LETTERS[int(np.flatnonzero(order == original)[0])]


def _item(reader: _RowReader, column: str, index: int, item: Any, fields: RubricItemFields) -> Criterion:
    where = f"item {index}"
    if isinstance(item, str):
        if not item.strip():
            reader.fail(column, "bad_rubric", f"{where}: an empty criterion")
        return Criterion(text=item)
    if not isinstance(item, Mapping):
        reader.fail(column, "bad_rubric", f"{where}: expected a mapping or a string, got {_shown(item)}")
    text = item.get(fields.text)
    if not isinstance(text, str) or not text.strip():
        reader.fail(column, "bad_rubric", f"{where}: field {fields.text!r} must be a non-empty string, got "
                                          f"{_shown(text)}")
    weight = 1.0 if fields.weight is None else item.get(fields.weight)
    if isinstance(weight, str) and weight in fields.weight_labels:
        weight = fields.weight_labels[weight]
    if isinstance(weight, bool) or not isinstance(weight, (int, float, np.integer, np.floating)) \
            or not math.isfinite(weight):
        labels = f" or one of the labels {sorted(fields.weight_labels)}" if fields.weight_labels else ""
        reader.fail(column, "bad_weight", f"{where}: field {fields.weight!r} must be a finite number{labels}, got "
                                          f"{_shown(weight)}")
    kind = ItemKind.CRITERION
    if fields.kind is not None:
        name = item.get(fields.kind)
        kind = _ITEM_KINDS.get(name.strip().upper()) if isinstance(name, str) else None
        if kind is None:
            reader.fail(column, "bad_rubric", f"{where}: field {fields.kind!r} must be one of {sorted(_ITEM_KINDS)}, "
                                              f"got {_shown(name)}")
    def optional(field: Optional[str], empty: Any) -> Any:
        value = item.get(field) if field is not None else None
        if value is None or (isinstance(value, str) and not value.strip()):
            return empty
        return tuple(value) if isinstance(value, list) else value

    try:
        return Criterion(text=text, weight=float(weight), kind=kind, name=optional(fields.name, None),
                         tags=optional(fields.tags, ()), required_elements=optional(fields.required_elements, ()),
                         keywords=optional(fields.keywords, ()), scoring_guide=optional(fields.scoring_guide, None),
                         verification_method=optional(fields.verification_method, None))
    except ValueError as error:
        reader.fail(column, "bad_rubric", f"{where}: {error}")


def _rubric(reader: _RowReader, column: Optional[str], config: DatasetConfig) -> Rubric:
    if column is None:
        return Rubric(format=config.rubric_format)
    value = reader.get(column)
    if config.rubric_encoding == "srar_tags":
        if not isinstance(value, str) or not value.strip():
            reader.fail(column, "empty_rubric", f"expected SRaR's tagged rubric lines, got {_shown(value)}")
        parsed = parsing.parse_srar_rubric(value, max_items=MAX_RUBRIC_ITEMS)
        if not parsed.ok:
            reader.fail(column, "bad_rubric", f"not an SRaR rubric ({parsed.reason}: {parsed.detail})")
        return parsed.rubric
    if isinstance(value, str):
        value = _json_list(value)
    if not isinstance(value, (list, tuple)):
        reader.fail(column, "bad_rubric", f"expected a list of rubric items, got {_shown(value)}")
    if not value:
        reader.fail(column, "empty_rubric", "the rubric has no item")
    criteria = tuple(_item(reader, column, i, item, config.rubric_items) for i, item in enumerate(value))
    try:
        return Rubric(criteria=criteria, format=config.rubric_format)
    except ValueError as error:
        reader.fail(column, "bad_rubric", str(error))


def _prompt_text(question: str, options: Sequence[str], template: Optional[str]) -> str:
    """The user message: `template` with `{question}` and `{options}` substituted (plain replacement; the
    options follow the question when the template has no `{options}`)."""
    listed = "\n".join(f"{LETTERS[i]}. {option}" for i, option in enumerate(options))
    if options and (template is None or "{options}" not in template):
        question = f"{question}\n\n{listed}"
    if template is None:
        return question
    before, after = template.split("{question}")
    return before.replace("{options}", listed) + question + after.replace("{options}", listed)


@functools.lru_cache(maxsize=8)
def _compiled(pattern: str) -> "re.Pattern":
    return re.compile(pattern, re.DOTALL)


def record_from_row(row: Mapping[str, Any], index: int, config: DatasetConfig, source: str, seed: int) -> Record:
    """The `Record` of row `index` of `source` (module docstring); DatasetRowError for a row that cannot be used."""
    reader = _RowReader(row, source, index)
    columns = config.columns
    options, correct, order = _options(reader, columns, config, seed)
    if columns.prompt is not None:
        if _chat_messages(reader.get(columns.prompt)):
            reader.fail(columns.prompt, "messages_in_prompt", "holds chat messages, not text: map it as "
                        f"columns.messages: {columns.prompt} (not columns.prompt)")
        question = reader.text(columns.prompt, "missing_prompt")
    else:
        messages = _messages(reader, columns.messages)
        question = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    if config.question_pattern is not None:
        match = _compiled(config.question_pattern).search(question)
        if match is None or not (match.group(1) or "").strip():
            reader.fail(columns.prompt or columns.messages, "bad_prompt",
                        f"question_pattern finds no question in {_shown(question)}")
        question = match.group(1).strip()
    if columns.prompt is not None or config.question_pattern is not None:
        messages = [{"role": "user", "content": _prompt_text(question, options, config.prompt_template)}]
    if config.system_prompt is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": config.system_prompt})
    answer = None
    if config.answer_kind == "choice":
        answer = LETTERS[correct] if correct is not None else _choice_answer(reader, columns.answer, order)
    elif columns.answer is not None:
        answer = _number_text(reader.get(columns.answer))
        if answer is None:
            reader.fail(columns.answer, "missing_answer",
                        f"expected a gold answer, got {_shown(reader.get(columns.answer))}")
    reference = None if columns.reference is None else reader.text(columns.reference, "missing_reference")
    grounding = None if columns.grounding is None else reader.text(columns.grounding, "missing_grounding")
    tags = () if columns.tags is None else reader.strings(columns.tags, "bad_tags")
    identifier = None if columns.id is None or reader.get(columns.id) is None else str(reader.get(columns.id))
    return Record(source=source, row=index, messages=tuple(messages), question=question, answer=answer,
                  reference=reference, rubric=_rubric(reader, columns.rubric, config), grounding=grounding,
                  options=options, tags=tags, id=identifier)


# ---------------------------------------------------------------------------------------------- the task


def _configured_columns(columns: ColumnMap) -> list[str]:
    named = [getattr(columns, f.name) for f in dataclasses.fields(ColumnMap) if f.name != "incorrect_options"]
    return [c for c in named if c is not None] + list(columns.incorrect_options)


@dataclasses.dataclass(frozen=True)
class _Part:
    """One loaded table and the rows of it in use (valid, in the order they are served)."""

    table: Any
    source: str
    rows: np.ndarray


class DatasetTask:
    """Task "dataset" (`rubric_jax.data.tasks`; module docstring). Built from a `DatasetConfig` and the task
    seed: loads the tables, checks every row, splits off the held-out rows."""

    def __init__(self, config: DatasetConfig, seed: int):
        self.config, self.seed = config, seed
        self.skipped: dict[str, int] = {}
        self.longest_rubric = 0  # the most items of any usable row's rubric (a recipe's max_items must hold it)
        self._rows_naming: collections.Counter = collections.Counter()  # criterion name -> usable rows with it
        train = self._load(config.path, config.split)
        if config.eval_path is not None:
            held_out = self._load(config.eval_path, config.split, split_name="eval")
        elif config.eval_split is not None:
            held_out = self._load(config.path, config.eval_split, split_name="eval")
        else:
            order = np.random.default_rng([seed, 0]).permutation(train.rows)
            held_out = _Part(train.table, train.source, order[:config.eval_size])
            train = _Part(train.table, train.source, np.sort(order[config.eval_size:]))
        if len(train.rows) == 0:
            raise ValueError(f"dataset {config.path}: no usable training row")
        self._train, self._eval = train, held_out

    def _load(self, path: str, split: str, split_name: str = "train") -> _Part:
        table = load_table(path, split, self.config.name)
        if self.config.max_rows is not None and len(table) > self.config.max_rows:
            table = table.select(range(self.config.max_rows))
        missing = [c for c in _configured_columns(self.config.columns)
                   if c not in table.column_names and c.split(".")[0] not in table.column_names]
        if missing:
            raise ValueError(f"dataset {path}: no column {missing[0]!r} (columns: {', '.join(table.column_names)})")
        source = path if Path(path).is_file() else f"{path}[{split}]"  # a file is one split
        return _Part(table, source, self._usable_rows(table, source, split_name))

    def _usable_rows(self, table, source: str, split_name: str) -> np.ndarray:
        """The rows that make a Record; a bad row raises (bad_rows: error) or is counted under
        "<split_name>/<reason>" (skip), the first few logged."""
        usable = []
        for index in range(len(table)):
            try:
                record = record_from_row(table[index], index, self.config, source, self.seed)
            except DatasetRowError as error:
                if self.config.bad_rows == "error":
                    raise
                key = f"{split_name}/{error.reason}"
                if sum(self.skipped.values()) < MAX_LOGGED_SKIPS:
                    logger.warning("skipping a bad row (bad_rows: skip): %s", error)
                self.skipped[key] = self.skipped.get(key, 0) + 1
                continue
            usable.append(index)
            self.longest_rubric = max(self.longest_rubric, len(record.rubric.criteria))
            self._rows_naming.update({c.name for c in record.rubric.criteria if c.name is not None})
        return np.asarray(usable, np.int64)

    def _record(self, part: _Part, index: int) -> Record:
        return record_from_row(part.table[int(index)], int(index), self.config, part.source, self.seed)

    def data_metrics(self) -> dict[str, float]:
        """Rows in use and rows skipped by reason ("data/skipped/<split>/<reason>"), for the run's metrics."""
        metrics = {"data/train_rows": float(len(self._train.rows)), "data/eval_rows": float(len(self._eval.rows))}
        metrics.update({f"data/skipped/{key}": float(count) for key, count in sorted(self.skipped.items())})
        return metrics

    # The recipes' Task interface.
    def prompt(self, example: Record) -> list[dict[str, str]]:
        return [dict(m) for m in example.messages]

    def question(self, example: Record) -> str:
        return example.question

    def rubric(self, example: Record) -> Rubric:
        return example.rubric

    @property
    def recurring_criterion_names(self) -> frozenset:
        """The criterion names of more than one usable row (train and held-out): metrics go by these names, and
        by tag for the other criteria (`base.criterion_metric_keys`)."""
        return frozenset(name for name, rows in self._rows_naming.items() if rows > 1)

    def reference(self, example: Record) -> Optional[str]:
        return next((x for x in (example.grounding, example.reference, example.answer) if x is not None), None)

    @property
    def has_outcome(self) -> bool:
        """False for `answer_kind: none`: no answer to check, so no accuracy metric (`base.has_outcome`)."""
        return self.config.answer_kind != "none"

    def is_correct(self, response: str, example: Record) -> bool:
        kind = self.config.answer_kind
        if kind == "none" or example.answer is None:
            return False
        if kind == "exact":
            return _normalised(final_answer_text(response)) == _normalised(example.answer)
        if kind == "choice":
            verifier = OutcomeVerifier(kind="choice", letters=LETTERS[:len(example.options)])
            return verifier.verify(response, example.answer).score == 1.0
        answer = math_answer(response)
        return answer is not None and equivalence_status(answer, example.answer) == EQUIVALENT

    def gold_answer(self, example: Record) -> Optional[str]:
        """The answer column as written (a letter for multiple choice), None when the row has none: what a
        string-matching accuracy compares with (SRaR's `accuracy: boxed_string`)."""
        return example.answer

    # What the trainer needs besides.
    def solution(self, example: Record) -> str:
        if example.reference is None:
            raise ValueError("SFT on a dataset task needs its reference answers: set columns.reference")
        return example.reference

    def train_stream(self, position: int) -> "DatasetStream":
        return DatasetStream(self, position)

    def train_records(self) -> Iterator[Record]:
        """Every usable training row's Record once, in file order (what the synthesis pipelines read)."""
        return (self._record(self._train, i) for i in self._train.rows)

    def eval_examples(self, count: int) -> list[Record]:
        """The first `count` held-out rows (all of them when there are fewer); ValueError when there are none."""
        if count > 0 and len(self._eval.rows) == 0:
            raise ValueError("the dataset task has no held-out rows: set task.params eval_size, eval_split or "
                             "eval_path")
        return [self._record(self._eval, i) for i in self._eval.rows[:count]]

    def judge(self):
        """A dataset's rubric items have no programmatic checks: its rubrics need an LLM judge (judge.kind llm).
        Without a rubric column every rubric is empty, and this judge returns no items."""
        if self.config.columns.rubric is not None:
            raise ValueError("task dataset has rubrics but no programmatic judge for them: set judge.kind: llm "
                             "(with judge.url, judge.model and judge.format)")
        return ProgrammaticJudge({})

    def tokenizer(self) -> transformers.PreTrainedTokenizerFast:
        return byte_tokenizer()


class DatasetStream:
    """The endless train stream of a DatasetTask, resumable by `position`: position p is row
    perm_e[p mod N] of the N training rows, perm_e the permutation of epoch e = p // N drawn from (seed, 1, e)."""

    def __init__(self, task: DatasetTask, position: int = 0):
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"position must be an int >= 0, got {position!r}")
        self.task, self._position = task, position
        self._epoch, self._order = -1, None

    @property
    def position(self) -> int:
        return self._position

    def _row(self, position: int) -> int:
        rows = self.task._train.rows
        epoch, offset = divmod(position, len(rows))
        if epoch != self._epoch:
            self._epoch = epoch
            self._order = np.random.default_rng([self.task.seed, 1, epoch]).permutation(rows)
        return int(self._order[offset])

    def next_batch(self, n: int) -> list[Record]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        start = self._position
        batch = [self.task._record(self.task._train, self._row(p)) for p in range(start, start + n)]
        self._position = start + n
        return batch


def _normalised(text: str) -> str:
    return " ".join(text.split()).casefold()


def byte_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A tokenizer for a model built from scratch on any text (`ModelSpec.init` with a dataset task): the 256
    byte-level tokens of GPT-2's alphabet and no merges, so every text encodes; <|endoftext|> (pad),
    <|im_start|>, <|im_end|> (eos) and the arithmetic task's ChatML template."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = arithmetic.SPECIAL_TOKENS
    vocab = {token: i for i, token in enumerate((*specials, *sorted(alphabet)))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=specials[arithmetic.PAD_ID], eos_token=specials[arithmetic.EOS_ID],
        additional_special_tokens=[specials[arithmetic.IM_START_ID]], chat_template=arithmetic.CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False)
