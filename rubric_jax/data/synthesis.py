"""Rubric synthesis pipelines (`rubric-jax synthesize CONFIG`): a strong LLM behind an OpenAI-compatible server
turns documents or questions into training data with rubrics, written in the layout a dataset-task preset reads.

The pipelines (`SynthesisConfig.pipeline`), each an async function of one source record built from the stage
prompts of `rubrics.prompts` and the schemas of `rubrics.synthesis_schemas`:
- "grounded" (rubric_grounded_rl.txt, section 3.4, Appendix E): a document -> stage 1 semantic analysis ->
  stage 2 joint question-rubric synthesis (several questions) -> stage 3 rubric enrichment of each question's
  criteria -> quality checks -> Appendix E records (preset "rubric_grounded").
- "rgr" (rgr_grpo.txt, section 2.2): a question with its gold answer -> a reference answer -> the correctness
  filter (the dataset task's `is_correct`: math-verify on the boxed answer, or the option letter) -> weighted
  factual / process rubric conditioned on the question and the reference -> records of preset "rgr".
- "rar" (Rubrics as Rewards): a question with its reference answer (or one generated, then filtered, as RGR's)
  -> 7-20 Essential / Important / Optional / Pitfall items -> records of preset "rar".

Inputs are read by task "dataset" (`input` holds its params: a preset or a column map over a file), every usable
row in file order; a document is the row's prompt text.

Conventions:
- Each stage call sends the stage's prompt and, where the stage answers JSON, its pydantic model's JSON schema as
  `response_format`, in the first dialect the server takes (`judges.llm.ChatClient`). The answer
  is validated by the model (`parsing.parse_structured`); an answer cut by max_tokens ("truncated"), not JSON
  ("no_json"), or off the schema ("schema") is asked again, with another seed, up to `output_attempts` times,
  then the source (or, in stage 3, the one question) is discarded and counted by "<stage>/<reason>". Nothing
  invalid is ever written.
- Quality checks (the rubric-grounded paper's: minimum criteria, minimum total weight, non-empty question, every
  criterion field present, non-negative weights; our additions named in each pipeline's params) discard the
  record and count "quality/<check>".
- A request that fails after the HTTP client's retries (server down, timeouts) leaves its source unfinished: it
  is counted in the run's `request_failed` and not indexed, so the next run tries it again.
- Bounded concurrency: at most `max_concurrent_sources` sources in flight, and the client's `max_in_flight`
  requests on the wire.
- Output (`output_dir`): one JSONL file per split (`<split>.jsonl`), appended as sources finish, every record
  carrying its source's content hash; `index.jsonl`, one line per finished source (its hash, split, records
  written, discards and stage counts), appended and synced after that source's records; `manifest.json`, the
  config. The split of a source is a function of its content hash alone (`split_of`), so every question of one
  document lands in one split, and the split does not depend on order or concurrency.
- Idempotent resume: a source whose hash is in the index is skipped. On start, records whose source is not in
  the index (a run killed between a source's records and its index line) and a torn last line are removed, so a
  killed run, restarted, duplicates nothing and loses nothing. Sources with the same content are one source.
  Resuming with a different config (other than the server's address and the concurrency) is refused.
- The summary (`summary.json`, `summary.md`, `plots/`) is computed from the output files and the index, so it
  describes the whole corpus across resumed runs: records per split, criteria per record, weight distribution,
  question / passage / reference lengths, and every stage's calls, failures and discards.
"""

import asyncio
import collections
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal, Mapping, Optional, Sequence

from rubric_jax import strict_json
from rubric_jax.data import tasks
from rubric_jax.data.dataset import Record
from rubric_jax.inference.http import RequestFailed
from rubric_jax.judges import preflight
from rubric_jax.judges.llm import (ChatClient, ChatSettings, chat_client, check_credentials, check_request_options,
                                   request_headers)
from rubric_jax.rubrics import parsing, prompts
from rubric_jax.rubrics import synthesis_schemas as schemas
from rubric_jax.yaml_config import config_from_dict, config_to_dict

INDEX_FILE, MANIFEST_FILE = "index.jsonl", "manifest.json"
SUMMARY_JSON, SUMMARY_MD = "summary.json", "summary.md"
REQUEST_FAILED = "request_failed"
# Config keys that may change between a run and its resumption: where the server is and how hard it is pushed.
_OPERATIONAL_KEYS = {"output_dir", "max_concurrent_sources"}
_OPERATIONAL_GENERATOR_KEYS = {"url", "max_in_flight", "max_attempts", "timeout_s"}
# Generator keys added after manifests were first written: empty (their default, nothing sent) equals absent.
_LATER_GENERATOR_KEYS = {"chat_template_kwargs", "extra_body"}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
    """The generator: an OpenAI-compatible chat server at `url` serving `model` (the papers': GPT-OSS-120B for
    rubric-grounded, OpenAI o3 for RGR-GRPO), its sampling (`temperature` > 0, so that a retried stage samples
    another answer), `max_tokens` per answer, whether to send JSON schemas, and the HTTP client's bounds and
    retries (`max_in_flight`, `max_attempts`, `timeout_s`). Credentials as a judge's (`JudgeConfig`): `api_key_env`,
    the name of an environment variable whose value is sent as "Authorization: Bearer <value>" (a hosted
    generator's key never enters the config), and `headers`, sent with every request. Request options as a
    judge's too (`judges.llm`): `chat_template_kwargs` (the template's variables, e.g. {enable_thinking: false})
    and `extra_body` (fields added to every request, e.g. {reasoning_effort: high} for gpt-oss), not sent when
    empty; an extra_body key the client sets itself is refused."""

    url: str
    model: str
    temperature: float = 0.7
    max_tokens: int = 8192
    json_schema: bool = True
    max_in_flight: int = 32
    max_attempts: int = 5
    timeout_s: float = 600.0
    api_key_env: Optional[str] = None
    headers: dict = dataclasses.field(default_factory=dict)
    chat_template_kwargs: dict = dataclasses.field(default_factory=dict)
    extra_body: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        _require(bool(self.url) and bool(self.model), "generator.url and generator.model must be set")
        _require(self.temperature >= 0, f"generator.temperature must be >= 0, got {self.temperature}")
        for name in ("max_tokens", "max_in_flight", "max_attempts"):
            _require(getattr(self, name) >= 1, f"generator.{name} must be >= 1, got {getattr(self, name)}")
        check_credentials(self.api_key_env, self.headers, "generator")
        check_request_options(self.chat_template_kwargs, self.extra_body, "generator")


@dataclasses.dataclass(frozen=True)
class GroundedParams:
    """Pipeline "grounded": `questions_per_document` asked of stage 2; quality checks `min_criteria` (the paper's
    rubrics hold 5-10 criteria), `max_criteria`, `min_total_weight` (> 0 keeps the reward's normaliser away from
    zero); `passage_check` "verbatim" discards a question whose grounding passage is not in its document (white
    space aside), "none" keeps it; `max_document_chars` cuts the document shown to the generator (None: whole)."""

    questions_per_document: int = 3
    min_criteria: int = 5
    max_criteria: int = 10
    min_total_weight: float = 1.0
    passage_check: Literal["verbatim", "none"] = "verbatim"
    max_document_chars: Optional[int] = None

    def __post_init__(self):
        _require(self.questions_per_document >= 1, "params.questions_per_document must be >= 1")
        _require(1 <= self.min_criteria <= self.max_criteria,
                 f"params need 1 <= min_criteria <= max_criteria, got {self.min_criteria}, {self.max_criteria}")
        _require(self.min_total_weight >= 0, "params.min_total_weight must be >= 0")
        _require(self.max_document_chars is None or self.max_document_chars >= 1,
                 "params.max_document_chars must be None or >= 1")


@dataclasses.dataclass(frozen=True)
class RGRParams:
    """Pipeline "rgr": quality checks `min_criteria`, `max_criteria`, and `max_reference_chars` (the paper drops
    "prompts whose reference answers were excessively long"; None: no limit). The correctness filter needs the
    input's gold answer (`answer_kind` math or choice, or exact)."""

    min_criteria: int = 3
    max_criteria: int = 20
    max_reference_chars: Optional[int] = None

    def __post_init__(self):
        _require(1 <= self.min_criteria <= self.max_criteria,
                 f"params need 1 <= min_criteria <= max_criteria, got {self.min_criteria}, {self.max_criteria}")
        _require(self.max_reference_chars is None or self.max_reference_chars >= 1,
                 "params.max_reference_chars must be None or >= 1")


@dataclasses.dataclass(frozen=True)
class RaRParams:
    """Pipeline "rar": `min_criteria` to `max_criteria` items (RaR's 7 to 20); `generate_reference`: write the
    reference answer first (RGR's stage and correctness filter, which then needs a gold answer) instead of
    reading the input's reference column."""

    min_criteria: int = 7
    max_criteria: int = 20
    generate_reference: bool = False
    max_reference_chars: Optional[int] = None

    def __post_init__(self):
        _require(1 <= self.min_criteria <= self.max_criteria,
                 f"params need 1 <= min_criteria <= max_criteria, got {self.min_criteria}, {self.max_criteria}")


PARAMS = {"grounded": GroundedParams, "rgr": RGRParams, "rar": RaRParams}
DEFAULT_SPLITS = {"train": 0.70, "validation": 0.15, "test": 0.15}


@dataclasses.dataclass(frozen=True)
class SynthesisConfig:
    """`rubric-jax synthesize`: the `pipeline` (module docstring) and its `params` (`PARAMS[pipeline]`), the
    `input` (task "dataset" params), the `generator`, where to write (`output_dir`), the `splits` (name ->
    fraction, summing to 1; the rubric-grounded paper's 70/15/15 by default), `output_attempts` (generations per
    stage call before a discard), `max_concurrent_sources`, the `seed` of every generation's sampling seed, and
    whether to draw the summary's `plots`."""

    pipeline: Literal["grounded", "rgr", "rar"]
    output_dir: str
    input: dict
    generator: GeneratorConfig
    params: dict = dataclasses.field(default_factory=dict)
    splits: dict = dataclasses.field(default_factory=lambda: dict(DEFAULT_SPLITS))
    output_attempts: int = 3
    max_concurrent_sources: int = 16
    seed: int = 0
    plots: bool = True

    def __post_init__(self):
        _require(bool(self.splits) and all(isinstance(k, str) and k.isidentifier() for k in self.splits),
                 f"splits must map split names to fractions, got {self.splits!r}")
        fractions = list(self.splits.values())
        _require(all(isinstance(f, (int, float)) and not isinstance(f, bool) and f >= 0 for f in fractions)
                 and abs(sum(fractions) - 1.0) < 1e-9, f"splits' fractions must be >= 0 and sum to 1, got {fractions}")
        _require(self.output_attempts >= 1, f"output_attempts must be >= 1, got {self.output_attempts}")
        _require(self.max_concurrent_sources >= 1,
                 f"max_concurrent_sources must be >= 1, got {self.max_concurrent_sources}")

    def pipeline_params(self):
        return config_from_dict(PARAMS[self.pipeline], dict(self.params), "params")


# ---------------------------------------------------------------------------------------------- hashing, splits


def content_hash(fields: Mapping[str, Any]) -> str:
    """The first 16 hex digits of the SHA-256 of `fields` as canonical JSON (sorted keys): a source's identity."""
    text = json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def split_of(source_hash: str, splits: Mapping[str, float]) -> str:
    """The split of a source: u = SHA-256("split:" + hash) read as a number in [0, 1), placed on the splits'
    cumulative fractions in their given order. A function of the hash alone."""
    digest = hashlib.sha256(f"split:{source_hash}".encode("utf-8")).hexdigest()
    u = int(digest[:15], 16) / 16**15
    total = 0.0
    for name, fraction in splits.items():
        total += fraction
        if u < total:
            return name
    return next(name for name, fraction in reversed(splits.items()) if fraction > 0)


def _stage_seed(seed: int, source_hash: str, stage: str, attempt: int) -> int:
    """A generation's sampling seed, a function of (run seed, source, stage, attempt): a resumed run asks what
    the first run would have."""
    return int(hashlib.sha256(f"{seed}:{source_hash}:{stage}:{attempt}".encode()).hexdigest()[:8], 16)


# ---------------------------------------------------------------------------------------------- stage calls


class Discarded(Exception):
    """A source or record left out, for `reason` ("<stage>/<failure>" or "quality/<check>")."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass
class SourceTally:
    """What one source cost and lost: stage calls and failures by stage, discards by reason."""

    calls: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    failures: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    discards: collections.Counter = dataclasses.field(default_factory=collections.Counter)


class StageCaller:
    """Asks one source's stages (module docstring: attempts, seeds, validation, counting)."""

    def __init__(self, chat: ChatClient, source_hash: str, attempts: int, seed: int, tally: SourceTally):
        self.chat, self.source_hash, self.attempts, self.seed, self.tally = chat, source_hash, attempts, seed, tally

    async def ask(self, stage: str, messages: prompts.Messages, model: Optional[type] = None, key: str = ""):
        """The stage's validated answer: a `model` instance, or the text when `model` is None. `key` tells
        apart several calls of one stage for one source (a question's enrichment). Discarded("<stage>/<reason>")
        after `attempts` failed answers; RequestFailed when the server does not answer."""
        schema = None if model is None else model.model_json_schema()
        reason = ""
        for attempt in range(self.attempts):
            self.tally.calls[stage] += 1
            reply = await self.chat.reply(messages, schema,
                                          seed=_stage_seed(self.seed, self.source_hash, f"{stage}{key}", attempt))
            if reply.truncated:
                reason = "truncated"
            elif model is None:
                if reply.text.strip():
                    return reply.text
                reason = "empty"
            else:
                result = parsing.parse_structured(reply.text, model)
                if result.ok:
                    return result.value
                reason = result.reason
            self.tally.failures[f"{stage}/{reason}"] += 1
        raise Discarded(f"{stage}/{reason}")


def _check(ok: bool, check: str) -> None:
    if not ok:
        raise Discarded(f"quality/{check}")


def _normalised_space(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------------------------------------- the pipelines


@dataclasses.dataclass(frozen=True)
class Source:
    """One input row: its Record, its content hash, and the text the pipeline works from."""

    record: Record
    hash: str


Pipeline = Callable[[Source, StageCaller, Any, Any], Awaitable[list[dict]]]


async def grounded_pipeline(source: Source, ask: StageCaller, params: GroundedParams, task: Any) -> list[dict]:
    """Rubric-grounded (section 3.4): analysis, synthesis, enrichment, quality checks -> Appendix E records. A
    question that fails its enrichment or a check is discarded alone; the document's other questions stay."""
    document = source.record.question
    shown = document if params.max_document_chars is None else document[:params.max_document_chars]
    analysis = await ask.ask("analysis", prompts.document_analysis_prompt(shown), schemas.DocumentAnalysis)
    synthesis = await ask.ask("synthesis", prompts.question_rubric_synthesis_prompt(
        shown, analysis.model_dump(), num_questions=params.questions_per_document,
        min_criteria=params.min_criteria, max_criteria=params.max_criteria), schemas.SynthesisOutput)
    items = synthesis.items[:params.questions_per_document]
    outcomes = await asyncio.gather(*(_grounded_record(source, ask, params, analysis, item, n)
                                      for n, item in enumerate(items)), return_exceptions=True)
    records = []
    for outcome in outcomes:
        if isinstance(outcome, Discarded):
            ask.tally.discards[outcome.reason] += 1
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            records.append(outcome)
    return records


async def _grounded_record(source: Source, ask: StageCaller, params: GroundedParams,
                           analysis: schemas.DocumentAnalysis, item: schemas.SynthesizedItem, n: int) -> dict:
    criteria = item.criteria
    _check(len(criteria) >= params.min_criteria, "min_criteria")
    _check(len(criteria) <= params.max_criteria, "max_criteria")
    _check(sum(c.weight for c in criteria) >= params.min_total_weight, "min_total_weight")
    if params.passage_check == "verbatim":
        _check(_normalised_space(item.passage) in _normalised_space(source.record.question), "passage_not_in_document")
    shown = [c.model_dump(include={"name", "description", "weight", "required_elements", "expected_keywords",
                                   "verification_method"}) for c in criteria]
    enrichment = await ask.ask("enrichment", prompts.rubric_enrichment_prompt(item.question, item.passage, shown),
                               schemas.EnrichmentOutput, key=f"/{n}")
    by_id = {e.id: e for e in enrichment.criteria}
    ids = [f"c_{k + 1}" for k in range(len(criteria))]
    # An enrichment that skips, repeats or invents a criterion is incomplete: the question is discarded.
    _check(len(by_id) == len(enrichment.criteria) and set(by_id) == set(ids), "enrichment_ids")
    record = schemas.GroundedExample(
        question=item.question, passage=item.passage, question_rationale=item.question_rationale,
        document_analysis=analysis, doc_hash=source.hash,
        criteria=[schemas.GroundedCriterion(
            id=k, weight=c.weight, name=c.name, description=c.description, required_elements=c.required_elements,
            scoring_guide=c.scoring_guide, verification_method=by_id[k].verification_method,
            expected_keywords=list(dict.fromkeys([*c.expected_keywords, *by_id[k].expected_keywords])),
            expected_concepts=by_id[k].expected_concepts) for k, c in zip(ids, criteria)])
    return record.model_dump()


async def _reference_answer(source: Source, ask: StageCaller, task: Any, max_chars: Optional[int]) -> str:
    """RGR's reference answer, kept only if its final answer is correct (the task's `is_correct`) and, with
    `max_chars`, not longer."""
    record = source.record
    reference = await ask.ask("reference", prompts.reference_answer_prompt(record.messages[-1]["content"]))
    _check(task.is_correct(reference, record), "reference_incorrect")
    _check(max_chars is None or len(reference) <= max_chars, "reference_too_long")
    return reference


async def rgr_pipeline(source: Source, ask: StageCaller, params: RGRParams, task: Any) -> list[dict]:
    """RGR-GRPO (section 2.2): reference answer, correctness filter, rubric -> one preset "rgr" record."""
    record = source.record
    reference = await _reference_answer(source, ask, task, params.max_reference_chars)
    rubric = await ask.ask("rubric", prompts.rgr_rubric_synthesis_prompt(record.question, reference),
                           schemas.RGRRubricOutput)
    _check(len(rubric.criteria) >= params.min_criteria, "min_criteria")
    _check(len(rubric.criteria) <= params.max_criteria, "max_criteria")
    example = schemas.RGRExample(question=record.question, answer=record.answer,
                                 options=list(record.options) or None, reference_answer=reference,
                                 rubric=rubric.criteria, source_hash=source.hash)
    return [example.model_dump(exclude_none=True)]


async def rar_pipeline(source: Source, ask: StageCaller, params: RaRParams, task: Any) -> list[dict]:
    """Rubrics as Rewards: the reference (the input's, or generated and filtered), then the rubric -> one preset
    "rar" record."""
    record = source.record
    if params.generate_reference:
        reference = await _reference_answer(source, ask, task, params.max_reference_chars)
    else:
        reference = record.reference
    rubric = await ask.ask("rubric", prompts.rar_rubric_generation_prompt(
        record.question, reference, min_items=params.min_criteria, max_items=params.max_criteria),
        schemas.RaRRubricOutput)
    _check(len(rubric.rubric) >= params.min_criteria, "min_criteria")
    _check(len(rubric.rubric) <= params.max_criteria, "max_criteria")
    _check(any(item.weight > 0 for item in rubric.rubric), "no_positive_item")
    example = schemas.RaRExample(question=record.question, reference_answer=reference, rubric=rubric.rubric,
                                 source_hash=source.hash)
    return [example.model_dump()]


PIPELINES: dict[str, Pipeline] = {"grounded": grounded_pipeline, "rgr": rgr_pipeline, "rar": rar_pipeline}
# The field of a record that holds its source's content hash, by pipeline.
HASH_FIELDS = {"grounded": "doc_hash", "rgr": "source_hash", "rar": "source_hash"}
# The dataset-task preset that reads each pipeline's records.
OUTPUT_PRESETS = {"grounded": "rubric_grounded", "rgr": "rgr", "rar": "rar"}


def source_fields(pipeline: str, record: Record) -> dict[str, Any]:
    """What a source's content hash covers: the document for "grounded"; the question (the policy's prompt, its
    options included), gold answer and reference for the others."""
    if pipeline == "grounded":
        return {"document": record.question}
    return {"prompt": [dict(m) for m in record.messages], "answer": record.answer, "reference": record.reference}


# ---------------------------------------------------------------------------------------------- the output store


def _read_lines(path: Path) -> tuple[list[dict], bool]:
    """The JSON objects of a JSONL file, and whether its last line was torn (a kill mid-write): a line that does
    not decode is allowed only last; earlier it means the file is not ours, ValueError."""
    if not path.exists():
        return [], False
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                return rows, True
            raise ValueError(f"{path}:{number} is not JSON; this is not a synthesis output") from None
    return rows, False


def _append_synced(path: Path, lines: Sequence[str]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))
        handle.flush()
        os.fsync(handle.fileno())


def _rewrite(path: Path, rows: Sequence[dict]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text("".join(strict_json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    os.replace(temporary, path)


class OutputStore:
    """The output directory (module docstring): split files, the content-hash index and the manifest."""

    def __init__(self, directory: Path, splits: Sequence[str], hash_field: str):
        self.directory, self.hash_field = directory, hash_field
        self.paths = {name: directory / f"{name}.jsonl" for name in splits}
        self.index_path = directory / INDEX_FILE
        directory.mkdir(parents=True, exist_ok=True)
        for path in self.paths.values():
            path.touch()  # every split has its file, empty until a source lands in it
        entries, torn = _read_lines(self.index_path)
        if torn:
            _rewrite(self.index_path, entries)
        self.entries = {entry["hash"]: entry for entry in entries}
        self.repaired = self._drop_unindexed_records()

    def _drop_unindexed_records(self) -> int:
        """Removes records whose source is not indexed, and torn last lines; returns how many records went."""
        dropped = 0
        for path in self.paths.values():
            rows, torn = _read_lines(path)
            kept = [row for row in rows if row.get(self.hash_field) in self.entries]
            if torn or len(kept) < len(rows):
                dropped += len(rows) - len(kept)
                _rewrite(path, kept)
        return dropped

    def done(self, source_hash: str) -> bool:
        return source_hash in self.entries

    def commit(self, source_hash: str, split: str, records: Sequence[dict], tally: SourceTally) -> None:
        """Appends a finished source's records to its split's file, then its index line, each synced."""
        if records:
            _append_synced(self.paths[split], [strict_json.dumps(r, ensure_ascii=False) for r in records])
        entry = {"hash": source_hash, "split": split, "records": len(records), "calls": dict(tally.calls),
                 "failures": dict(tally.failures), "discards": dict(tally.discards)}
        _append_synced(self.index_path, [strict_json.dumps(entry)])
        self.entries[source_hash] = entry

    def records(self) -> dict[str, list[dict]]:
        return {name: _read_lines(path)[0] for name, path in self.paths.items()}


def check_manifest(directory: Path, config: SynthesisConfig) -> None:
    """Writes the config as the output directory's manifest, or, when one is there, checks that this config
    continues it (module docstring); ValueError otherwise."""
    current = config_to_dict(config)
    path = directory / MANIFEST_FILE
    if path.exists():
        previous = json.loads(path.read_text(encoding="utf-8"))
        differing = sorted(key for key in set(current) | set(previous) if key not in _OPERATIONAL_KEYS and (
            _comparable(current.get(key), key) != _comparable(previous.get(key), key)))
        if differing:
            raise ValueError(f"{directory} holds a synthesis with another config (differing: {', '.join(differing)}); "
                             "resume it with the same config, or use another output_dir")
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(strict_json.dumps(current, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _comparable(value: Any, key: str) -> Any:
    if key == "generator" and isinstance(value, dict):
        return {k: v for k, v in value.items()
                if k not in _OPERATIONAL_GENERATOR_KEYS and not (k in _LATER_GENERATOR_KEYS and v == {})}
    return value


# ---------------------------------------------------------------------------------------------- the run


@dataclasses.dataclass
class RunCounts:
    """What this run did (the summary counts the whole corpus from the index)."""

    sources: int = 0
    skipped_done: int = 0
    duplicates: int = 0
    finished: int = 0
    records: int = 0
    request_failed: int = 0
    repaired: int = 0


def make_chat(config: GeneratorConfig, seed: int) -> ChatClient:
    """The generator's chat client (`llm.chat_client`); MissingApiKey when its key's variable is unset."""
    settings = ChatSettings(model=config.model, temperature=config.temperature, max_tokens=config.max_tokens,
                            json_schema=config.json_schema, chat_template_kwargs=config.chat_template_kwargs,
                            extra_body=config.extra_body)
    return chat_client(config.url, settings, seed=seed,
                       headers=request_headers(config.api_key_env, config.headers, "generator"),
                       max_in_flight=config.max_in_flight, max_attempts=config.max_attempts,
                       timeout_s=config.timeout_s)


def _check_input(config: SynthesisConfig, params: Any, task: Any) -> None:
    """ValueError when the input lacks a column the pipeline reads."""
    columns, answer_kind = task.config.columns, task.config.answer_kind
    needs_gold = config.pipeline == "rgr" or (config.pipeline == "rar" and params.generate_reference)
    if needs_gold and answer_kind == "none":
        raise ValueError(f"pipeline {config.pipeline} filters its reference answers by the gold answer: give the "
                         "input an answer column and an answer_kind (math, choice or exact)")
    if config.pipeline == "rar" and not params.generate_reference and columns.reference is None:
        raise ValueError("pipeline rar reads the input's reference answers: set input.columns.reference, or "
                         "params.generate_reference: true")


@dataclasses.dataclass(frozen=True)
class SynthesisPlan:
    """A checked synthesis (`plan_synthesis`): the config, its pipeline params, the input task and its distinct
    sources in file order, the number of duplicate input rows left out."""

    config: SynthesisConfig
    params: Any
    task: Any
    sources: tuple[Source, ...]
    duplicates: int


def preflight_request(config: SynthesisConfig, params: Any, source: Source
                      ) -> tuple[str, prompts.Messages, type]:
    """(stage, messages, answer model) of the first structured stage call the pipeline makes for `source`: the
    grounded pipeline's document analysis; the rgr and rar pipelines' rubric, shown the source's reference answer
    (a stand-in naming its gold answer when it has none: the run generates one first)."""
    record = source.record
    if config.pipeline == "grounded":
        shown = record.question if params.max_document_chars is None else record.question[:params.max_document_chars]
        return "analysis", prompts.document_analysis_prompt(shown), schemas.DocumentAnalysis
    reference = record.reference or f"The answer is \\boxed{{{record.answer}}}."
    if config.pipeline == "rgr":
        return "rubric", prompts.rgr_rubric_synthesis_prompt(record.question, reference), schemas.RGRRubricOutput
    messages = prompts.rar_rubric_generation_prompt(record.question, reference, min_items=params.min_criteria,
                                                    max_items=params.max_criteria)
    return "rubric", messages, schemas.RaRRubricOutput


def preflight_generator(config: SynthesisConfig, params: Any, source: Source) -> None:
    """The generator's preflight (`judges.preflight`): one real stage request shaped like `source`'s
    (`preflight_request`), with the seed the run's first attempt uses, validated by the stage's pydantic model.
    PreflightFailed (one line, with the raw answer) unless the server answers and the answer validates."""
    stage, messages, model = preflight_request(config, params, source)
    chat = make_chat(config.generator, config.seed)
    try:
        preflight.require_parsed(preflight.preflight(
            chat, "generator", f"a {config.pipeline} pipeline's {stage} request ({source.record.source} row "
            f"{source.record.row})", messages, model.model_json_schema(),
            lambda text: parsing.parse_structured(text, model), seed=_stage_seed(config.seed, source.hash, stage, 0)))
    finally:
        chat.http.close()


def plan_synthesis(config: SynthesisConfig, *, check_generator: bool = False) -> SynthesisPlan:
    """Every check that needs no server: the params, the input (read through task "dataset", every row checked)
    and its columns, and the output directory's manifest (written when new). ValueError naming the problem.
    With `check_generator` (`rubric-jax synthesize`), the generator's preflight on the first source before the
    manifest is written (`preflight_generator`): PreflightFailed when its server cannot do the work."""
    params = config.pipeline_params()
    task = tasks.build_task("dataset", config.input, config.seed)
    _check_input(config, params, task)
    sources, seen, duplicates = [], set(), 0
    for record in task.train_records():
        source_hash = content_hash(source_fields(config.pipeline, record))
        if source_hash in seen:
            duplicates += 1
            continue
        seen.add(source_hash)
        sources.append(Source(record, source_hash))
    if check_generator and sources:
        preflight_generator(config, params, sources[0])
    check_manifest(Path(config.output_dir), config)
    return SynthesisPlan(config, params, task, tuple(sources), duplicates)


def run_synthesis(plan: SynthesisPlan, *, progress: bool = True) -> dict[str, Any]:
    """Runs (or resumes) a planned synthesis; returns the corpus summary (also written to output_dir)."""
    config = plan.config
    out = Path(config.output_dir)
    store = OutputStore(out, list(config.splits), HASH_FIELDS[config.pipeline])
    counts = RunCounts(sources=len(plan.sources), duplicates=plan.duplicates, repaired=store.repaired)
    pending = [s for s in plan.sources if not store.done(s.hash)]
    counts.skipped_done = len(plan.sources) - len(pending)
    chat = make_chat(config.generator, config.seed)
    try:
        chat.http.run_sync(_run(config, plan.params, plan.task, pending, store, chat, counts, progress))
    finally:
        chat.http.close()
    summary, samples = corpus_summary(config, store, counts)
    write_summary(out, summary, samples, config.plots)
    return summary


def synthesize(config: SynthesisConfig, *, progress: bool = True) -> dict[str, Any]:
    """`run_synthesis(plan_synthesis(config))`."""
    return run_synthesis(plan_synthesis(config), progress=progress)


async def _run(config: SynthesisConfig, params: Any, task: Any, pending: Sequence[Source], store: OutputStore,
               chat: ChatClient, counts: RunCounts, progress: bool) -> None:
    from tqdm import tqdm  # noqa: PLC0415

    pipeline = PIPELINES[config.pipeline]
    limit = asyncio.Semaphore(config.max_concurrent_sources)
    retried, discarded = collections.Counter(), collections.Counter()

    def advance() -> None:
        bar.update(1)
        bar.set_postfix(records=counts.records, retried=sum(retried.values()), discarded=sum(discarded.values()),
                        request_failed=counts.request_failed)

    async def one(source: Source) -> None:
        async with limit:
            tally = SourceTally()
            ask = StageCaller(chat, source.hash, config.output_attempts, config.seed, tally)
            try:
                records = await pipeline(source, ask, params, task)
            except Discarded as discard:
                tally.discards[discard.reason] += 1
                records = []
            except RequestFailed:
                counts.request_failed += 1
                advance()
                return
            store.commit(source.hash, split_of(source.hash, config.splits), records, tally)
            counts.finished += 1
            counts.records += len(records)
            retried.update(tally.failures)
            discarded.update(tally.discards)
            advance()

    with tqdm(total=len(pending), unit="source", desc=f"synthesize {config.pipeline}", disable=not progress,
              dynamic_ncols=True) as bar:
        await asyncio.gather(*(one(source) for source in pending))


# ---------------------------------------------------------------------------------------------- the summary


def _stats(values: Sequence[float]) -> dict[str, float]:
    """count, mean, min, median (the upper one of an even count) and max of `values`; {"count": 0} when empty."""
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    return {"count": len(ordered), "mean": sum(ordered) / len(ordered), "min": ordered[0],
            "median": ordered[len(ordered) // 2], "max": ordered[-1]}


def _criteria_of(pipeline: str, record: dict) -> list[dict]:
    return record["criteria"] if pipeline == "grounded" else record["rubric"]


def corpus_summary(config: SynthesisConfig, store: OutputStore, counts: RunCounts
                   ) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """(the summary, its histograms' samples): the corpus statistics the rubric-grounded paper tracks (criteria
    per example, weight distribution, lengths) and every stage's calls, failures and discards, over the whole
    output (index and files), with this run's counts."""
    by_split = store.records()
    records = [r for rows in by_split.values() for r in rows]
    criteria = [_criteria_of(config.pipeline, r) for r in records]
    calls, failures, discards = collections.Counter(), collections.Counter(), collections.Counter()
    for entry in store.entries.values():
        calls.update(entry["calls"])
        failures.update(entry["failures"])
        discards.update(entry["discards"])
    weights = [float(c["weight"]) for items in criteria for c in items]
    text_fields = ("question", "passage" if config.pipeline == "grounded" else "reference_answer")
    lengths = {name: [len(r[name]) for r in records] for name in text_fields}
    summary = {
        "pipeline": config.pipeline,
        "preset": OUTPUT_PRESETS[config.pipeline],
        "sources": {"input": counts.sources, "finished": len(store.entries),
                    "with_records": sum(1 for e in store.entries.values() if e["records"]),
                    "duplicates_in_input": counts.duplicates},
        "this_run": dataclasses.asdict(counts),
        "records": {name: len(rows) for name, rows in by_split.items()},
        "criteria_per_record": dict(sorted(collections.Counter(len(items) for items in criteria).items())),
        "weights": dict(sorted(collections.Counter(weights).items())),
        "total_weight": _stats([sum(float(c["weight"]) for c in items) for items in criteria]),
        "lengths_chars": {name: _stats(values) for name, values in lengths.items()},
        "stage_calls": dict(sorted(calls.items())),
        "stage_failures": dict(sorted(failures.items())),
        "discards": dict(sorted(discards.items())),
    }
    if config.pipeline in ("rgr", "rar"):
        key = "type" if config.pipeline == "rgr" else None
        kinds = collections.Counter(c[key] if key else c["description"].split(" Criteria:", 1)[0]
                                    for items in criteria for c in items)
        summary["criteria_by_kind"] = dict(sorted(kinds.items()))
    samples = {"criteria_per_record": [len(items) for items in criteria], "weights": weights,
               **{f"{name}_chars": values for name, values in lengths.items()}}
    return summary, samples


_REASON_TABLES = ("stage_failures", "discards")


def markdown_summary(summary: Mapping[str, Any]) -> str:
    lines = [f"# Synthesis summary: pipeline {summary['pipeline']} (records read by preset {summary['preset']})", ""]
    sources = summary["sources"]
    lines += [f"Sources: {sources['input']} in the input ({sources['duplicates_in_input']} duplicate rows left out), "
              f"{sources['finished']} finished, {sources['with_records']} with records. This run: "
              f"{summary['this_run']['finished']} finished, {summary['this_run']['skipped_done']} already done, "
              f"{summary['this_run']['request_failed']} left for the next run after failed requests, "
              f"{summary['this_run']['repaired']} unindexed records of a killed run removed.", ""]
    lines += ["| split | records |", "|---|---|"] + [f"| {k} | {v} |" for k, v in summary["records"].items()]
    total = summary["total_weight"]
    if total["count"]:
        lines += ["", f"Total weight per record: mean {total['mean']:.2f}, min {total['min']:g}, "
                      f"max {total['max']:g}."]
    for title, key in (("Criteria per record", "criteria_per_record"), ("Weights", "weights"),
                       ("Criteria by kind", "criteria_by_kind"), ("Stage calls", "stage_calls"),
                       ("Stage failures (retried)", "stage_failures"), ("Discards", "discards")):
        if key in summary:
            lines += ["", f"## {title}", "", f"| {'reason' if key in _REASON_TABLES else 'value'} | count |",
                      "|---|---|"]
            lines += [f"| {k} | {v} |" for k, v in summary[key].items()] or ["| (none) | 0 |"]
    lines += ["", "## Lengths (characters)", "", "| field | count | mean | min | median | max |", "|---|---|---|---|---|---|"]
    for name, stats in summary["lengths_chars"].items():
        cells = [stats.get(k, "") for k in ("count", "mean", "min", "median", "max")]
        lines.append(f"| {name} | " + " | ".join(f"{c:.1f}" if isinstance(c, float) else str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write_summary(out: Path, summary: Mapping[str, Any], samples: Mapping[str, Sequence[float]], plots: bool
                  ) -> None:
    """summary.json, summary.md and, with `plots`, the histograms of `samples` under plots/."""
    (out / SUMMARY_JSON).write_text(strict_json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (out / SUMMARY_MD).write_text(markdown_summary(summary), encoding="utf-8")
    if plots:
        plot_histograms(samples, out / "plots")


def plot_histograms(samples: Mapping[str, Sequence[float]], directory: Path) -> None:
    """One PNG histogram per sample list (criteria per record, weights, lengths)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    from matplotlib import pyplot  # noqa: PLC0415

    directory.mkdir(parents=True, exist_ok=True)
    for name, values in samples.items():
        figure, axis = pyplot.subplots(figsize=(5, 3.2))
        axis.hist(values, bins=min(30, max(1, len(set(values)))))
        axis.set_title(name.replace("_", " "))
        axis.set_ylabel("count")
        figure.tight_layout()
        figure.savefig(directory / f"{name}.png", dpi=100)
        pyplot.close(figure)

