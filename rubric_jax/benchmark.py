"""The work behind `rubric-jax eval` and `rubric-jax validate`: a saved model evaluated on a task or on a dataset
(a preset over a file, or a run config's task and judge), with a progress bar and a JSON and markdown report; and
a run config checked against its dataset, its first prompts rendered, without training.

- `dataset_params(preset, path, split)`: task "dataset" params that hold out the whole file, as a benchmark is
  evaluated: every usable row, in the seeded order.
- `evaluate_model`: `training.evaluate.evaluate` in chunks, a tqdm bar on stderr.
- `judge_failure(metrics, judge)`: training's failure budget (`JudgeConfig.max_failure_rate`) applied to the
  evaluation as a whole; `failed_judge_report` the report of an evaluation whose judge failed: what depends on
  its verdicts is null, "judge_failure" says why (`rubric-jax eval` then exits 1).
- `markdown_report(metrics, title)`: the metrics as markdown tables: the overall ones, then the per-tag and
  per-criterion-tag breakdowns (HealthBench's themes and axes); a value that is null or not finite reads "n/a".
- `validation_report(config, task, tokenizer, rows)`: what `rubric-jax validate` prints: rows used and skipped,
  the rubrics' negative-weight criteria and what the configured reward does with them, each role's longest
  prompt (the recipe's `role_prompts`: SRaR's step format, RLCER's rubricator, ...), each LLM role's answer to one
  real request (the launch's preflight), the first rows' prompts as each role and the judge receive them; and what
  `rubric-jax train` would refuse at launch (a prompt longer than the model's context, by dataset row; a judge
  whose answer does not parse; ...).
"""

import collections
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from rubric_jax import strict_json
from rubric_jax.algorithms.registry import algorithm_class
from rubric_jax.data import presets
from rubric_jax.inference.engine import RolloutEngine
from rubric_jax.judges import llm
from rubric_jax.judges.base import Judge, JudgeRequest
from rubric_jax.judges.preflight import PreflightFailed, require_parsed
from rubric_jax.training.evaluate import evaluate
from rubric_jax.training.assembly import make_judge, make_meta_verifier
from rubric_jax.training.launch import (PLACEHOLDER_RESPONSE, check_frozen_engine, check_rubric_width, llm_preflights,
                                        prompt_lengths, prompt_refusal)
from rubric_jax.training.run_config import EvalConfig, JudgeConfig, RLConfig, resolve_algorithm

DEFAULT_CHUNK = 32
# What an evaluation measures without its judge's verdicts (outcomes, lengths, the judge's own failure counts):
# kept when the judge failed, every other metric is null then.
_JUDGE_FREE = re.compile(r"eval/(accuracy|pass@\d+|response_length|tag/.+/accuracy|judge/.+)")
JUDGE_FAILURE_KEY = "judge_failure"


def dataset_params(preset: str, path: str, split: str = "train") -> dict[str, Any]:
    """Task "dataset"'s params for evaluating `preset` on the file `path`: the whole file held out."""
    if preset not in presets.PRESETS:
        raise ValueError(f"--dataset {preset!r} is neither a preset nor a YAML config; presets: "
                         f"{', '.join(sorted(presets.PRESETS))}")
    return {"preset": preset, "path": path, "split": split, "eval_path": path}


def evaluate_model(engine: RolloutEngine, tokenizer: Any, task: Any, judge: Judge, examples: Sequence[Any],
                   config: EvalConfig, *, max_new_tokens: int, seed: int, recipes: Sequence[str] = (),
                   chunk_examples: int = DEFAULT_CHUNK, on_judged: Optional[Callable] = None) -> dict[str, float]:
    """`evaluate` over `examples` in chunks of `chunk_examples`, with a progress bar on stderr (`on_judged`:
    `evaluate`'s hook)."""
    from tqdm import tqdm  # noqa: PLC0415

    with tqdm(total=len(examples), unit="example", desc="evaluating", file=sys.stderr) as bar:
        return evaluate(engine, tokenizer, task, judge, examples, config, max_new_tokens=max_new_tokens, seed=seed,
                        recipes=recipes, chunk_examples=chunk_examples, progress=bar.update, on_judged=on_judged)


def judge_failure(metrics: Mapping[str, float], judge: JudgeConfig) -> Optional[str]:
    """One line naming the rate and the failures by reason when the evaluation's "eval/judge/failure_rate"
    (failed samples over every sample evaluated) exceeds `judge.max_failure_rate`, training's budget; else None.
    The budget applies to the whole evaluation, not per chunk: an evaluation is one measurement, averaged over all
    its samples, so `judge.max_failing_steps` (consecutive training steps) has no counterpart here."""
    rate, limit = metrics["eval/judge/failure_rate"], judge.max_failure_rate
    if rate <= limit:
        return None
    reasons = [f"{key.removeprefix('eval/judge/failed/')} {int(count)}" for key, count in sorted(metrics.items())
               if key.startswith("eval/judge/failed/")]
    where = f" at {judge.url}" if judge.kind == "llm" else ""
    return (f"the judge{where} failed on {rate:.0%} of the samples" + (f" ({', '.join(reasons)})" if reasons else "")
            + f", above judge.max_failure_rate ({limit:g}): its scores are failures, not judgements, and are not "
            "reported")


def failed_judge_report(metrics: Mapping[str, float], failure: str) -> dict[str, Any]:
    """The report of an evaluation whose judge failed (`judge_failure`'s line `failure`): every metric computed
    from the judge's verdicts null (a rubric score of failures is no result), the others kept (accuracy, lengths,
    "eval/judge/..."), and the line under JUDGE_FAILURE_KEY."""
    kept = {key: value if _JUDGE_FREE.fullmatch(key) else None for key, value in metrics.items()}
    return {JUDGE_FAILURE_KEY: failure, **kept}


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    def cell(value: Any) -> str:
        if value is None or isinstance(value, float) and not math.isfinite(value):
            return "n/a"
        return f"{value:.4f}" if isinstance(value, float) else str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]


def markdown_report(metrics: Mapping[str, Any], title: str) -> str:
    """The metrics as markdown (module docstring): a judge failure (`failed_judge_report`) first, then
    "eval/tag/<tag>/<name>" and "eval/item_tag/<tag>/<name>" keys in their own tables, one row per tag."""
    overall, by_tag, by_item_tag = [], collections.defaultdict(dict), collections.defaultdict(dict)
    failure = metrics.get(JUDGE_FAILURE_KEY)
    for key, value in metrics.items():
        if key == JUDGE_FAILURE_KEY:
            continue
        for prefix, table in (("eval/tag/", by_tag), ("eval/item_tag/", by_item_tag)):
            if key.startswith(prefix):
                tag, _, name = key[len(prefix):].rpartition("/")
                table[tag][name] = value
                break
        else:
            overall.append((key, value))
    lines = [f"# {title}", ""]
    if failure is not None:
        lines += [f"**The judge failed**: {failure}.", ""]
    lines += _table(("metric", "value"), overall)
    for heading, table in (("By example tag", by_tag), ("By criterion tag", by_item_tag)):
        if table:
            names = sorted({name for values in table.values() for name in values})
            rows = [(tag, *(values.get(name, "") for name in names)) for tag, values in sorted(table.items())]
            lines += ["", f"## {heading}", "", *_table(("tag", *names), rows)]
    return "\n".join(lines) + "\n"


def _rendered_prompt(tokenizer: Any, messages, chat_template_kwargs: Mapping[str, Any]) -> tuple[str, int]:
    from rubric_jax.models.tokenizer import apply_chat_template  # noqa: PLC0415

    ids = apply_chat_template(tokenizer, messages, template_kwargs=chat_template_kwargs)
    return tokenizer.decode(ids), len(ids)


def _judge_prompt(judge: Judge, request: JudgeRequest) -> Optional[list]:
    """The first call an LLM judge would make for `request`; None for a judge that sends none (programmatic)."""
    if not isinstance(judge, (llm.RolloutLLMJudge, llm.CriterionLLMJudge)) or not request.rubric.criteria:
        return None
    if isinstance(judge, llm.CriterionLLMJudge):
        return judge.fmt.messages(request, 0)
    return judge.fmt.messages(request)


def validation_report(config: RLConfig, task: Any, tokenizer: Any, rows: int, *, ask_servers: bool = True
                      ) -> tuple[str, list[str]]:
    """What `rubric-jax validate` prints (module docstring), and what `rubric-jax train` would refuse at launch
    (a line each, naming what to fix; empty when it would start): the task's rows in use and skipped, the longest
    rubric against the recipe's max_items (ValueError when it does not fit), the judge (ValueError when it
    cannot judge the task's rubrics), a prompt the model cannot sample (`rl.prompt_refusal`, naming the dataset
    row), the recipe's frozen-engine server (`rl.check_frozen_engine`), and, with `ask_servers`, each LLM role's
    preflight (`rl.llm_preflights`: the raw answer and whether it parsed; a server that does not answer, refuses
    the credentials or the model name, or answers what does not parse is refused); then the first `rows`
    training rows' policy and judge prompts."""
    algorithm_config, config = resolve_algorithm(config)
    check_rubric_width(algorithm_config, task)
    algorithm = algorithm_class(config.algorithm.name)(algorithm_config)
    refusals = []
    try:
        check_frozen_engine(algorithm, config)
    except ValueError as error:
        refusals.append(str(error))
    judge = meta_verifier = None
    try:
        judge = make_judge(config.judge, task, config.seed)
        meta_verifier = make_meta_verifier(config.meta_verifier, config.seed)
        lines = _validation_lines(config, algorithm, task, tokenizer, rows, judge, meta_verifier, ask_servers,
                                  refusals)
    finally:
        for client in (judge, meta_verifier):
            if client is not None:
                client.close()
    return lines, refusals


def _validation_lines(config: RLConfig, algorithm: Any, task: Any, tokenizer: Any, rows: int, judge: Judge,
                      meta_verifier: Any, ask_servers: bool, refusals: list[str]) -> str:
    lines = [f"config: algorithm {config.algorithm.name}, task {config.task.name}, judge {config.judge.kind}"
             + (f" ({config.judge.format} at {config.judge.url}, model {config.judge.model})"
                if config.judge.kind == "llm" else "")]
    kwargs = config.model.chat_template_kwargs
    if hasattr(task, "data_metrics"):
        data = task.data_metrics()
        skipped = {k[len("data/skipped/"):]: int(v) for k, v in data.items() if k.startswith("data/skipped/")}
        lines.append(f"data: {int(data['data/train_rows'])} training rows, {int(data['data/eval_rows'])} held out"
                     + (", skipped " + ", ".join(f"{k} {v}" for k, v in skipped.items()) if skipped else
                        ", none skipped")
                     + f"; longest rubric {task.longest_rubric} items")
        lines += _penalty_lines(algorithm, task)
        lines += _prompt_lengths(algorithm, task, tokenizer, kwargs, config.rollout.max_prompt_tokens)
        if (refusal := prompt_refusal(algorithm, task, config)) is not None:
            refusals.append(refusal)
    if ask_servers:
        lines += _server_checks(judge, meta_verifier, task, config, refusals)
    for example in task.train_stream(0).next_batch(rows):
        where = f"{example.source} row {example.row}" if hasattr(example, "source") else "example"
        for role, messages in algorithm.role_prompts(task, example, PLACEHOLDER_RESPONSE).items():
            text, count = _rendered_prompt(tokenizer, messages, kwargs)
            lines += ["", f"--- {where}: {role} prompt ({count} tokens) ---", text]
        request = JudgeRequest(task.question(example), PLACEHOLDER_RESPONSE, task.rubric(example),
                               task.reference(example), None, tuple(task.prompt(example)))
        messages = _judge_prompt(judge, request)
        lines += ["", f"--- {where}: judge prompt ---"]
        lines += ([f"[{m['role']}]\n{m['content']}" for m in messages] if messages is not None else
                  ["(no prompt: the task's own judge" + (", an empty rubric" if not request.rubric.criteria
                                                         else "") + ")"])
    return "\n".join(lines) + "\n"


def _penalty_lines(algorithm: Any, task: Any) -> list[str]:
    """A line on the training rows' negative-weight criteria and what the configured reward does with them
    (`Algorithm.negative_weights`), and one on the rows whose rubric has no positive weight (a weighted score
    gives them 0 whatever the response: no signal); nothing when there are none."""
    penalties = without_positive = 0
    for example in task.train_records():
        weights = [c.weight for c in task.rubric(example).criteria]
        penalties += sum(w < 0 for w in weights)
        without_positive += bool(weights) and max(weights) <= 0
    lines = [f"rubrics: {penalties} criteria with a negative weight: {algorithm.negative_weights}"] if penalties else []
    if without_positive:
        lines.append(f"rubrics: {without_positive} rows with no positive weight: a weighted score (positive points, "
                     "weighted fraction) gives them 0 whatever the response")
    return lines


def _server_checks(judge: Judge, meta_verifier: Any, task: Any, config: RLConfig, refusals: list[str]) -> list[str]:
    """A line per LLM role's preflight (`rl.llm_preflights`): what was asked, whether the answer parsed, the raw
    answer; each failure is also added to `refusals`."""
    try:
        answers = llm_preflights(judge, meta_verifier, task, config.judge.format)
    except PreflightFailed as error:
        refusals.append(str(error))
        return [f"server check: {error}"]
    lines = []
    for answer in answers:
        lines.append(f"{answer.section} check: {answer.asked}: {answer.verdict}; raw answer: {answer.shown}")
        try:
            require_parsed(answer)
        except PreflightFailed as error:
            refusals.append(str(error))
    return lines


def _prompt_lengths(algorithm: Any, task: Any, tokenizer: Any, chat_template_kwargs: Mapping[str, Any],
                    cap: Optional[int]) -> list[str]:
    """A line per role on its prompts' token lengths over the training rows: the longest (and where), and how
    many exceed the rollout's cap, which truncates them (`rollout.max_prompt_tokens`)."""
    longest: dict[str, tuple[int, str]] = {}
    over: collections.Counter = collections.Counter()
    for role, length, example in prompt_lengths(algorithm, task, tokenizer, chat_template_kwargs):
        if length > longest.get(role, (0, ""))[0]:
            longest[role] = length, f"{example.source} row {example.row}"
        over[role] += cap is not None and length > cap
    capped = "; {} over rollout.max_prompt_tokens ({}), which cuts them"
    return [f"{role} prompts: the longest has {length} tokens ({where})"
            + (capped.format(over[role], cap) if cap is not None else "") for role, (length, where) in longest.items()]


def samples_markdown(samples: Sequence[Mapping[str, Any]]) -> str:
    """Judged samples (`training.run_files.samples_of`) as markdown to read: each one's question and response fenced
    (model text never forms the document's structure), then its criteria with weight and verdict, its rubric score
    and any judge failure, with its detail and the judge's raw answer (fenced too: model text)."""
    lines = ["## Samples"]
    for sample in samples:
        lines += ["", f"### {sample['id']}", "", "Question:", "", *_fenced(sample["question"]), "", "Response:", "",
                  *_fenced(sample["response"]), ""]
        lines += [f"- [{_verdict_mark(c['satisfied'])}] ({c['weight']:g}) {_one_line(c['text'])}"
                  for c in sample["criteria"]]
        score = sample["rubric_score"]
        lines.append(f"\nrubric score: {'-' if score is None else f'{score:.3f}'}"
                     + (f"; judge failure: {sample['judge_failure']}" if sample["judge_failure"] else ""))
        if sample.get("judge_detail"):
            lines.append(f"\njudge failure detail: {_one_line(sample['judge_detail'])}")
        if sample.get("judge_answer"):
            lines += ["", "The judge's answer:", "", *_fenced(sample["judge_answer"])]
    return "\n".join(lines) + "\n"


def _fenced(text: str) -> list[str]:
    """`text` in a code fence longer than any run of backticks inside it, so it cannot close the fence."""
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, text, fence]


def _verdict_mark(satisfied: Optional[float]) -> str:
    """"x" met, " " not met, "?" not judged (the judge failed), else the partial score."""
    if satisfied is None:
        return "?"
    return {1.0: "x", 0.0: " "}.get(satisfied, f"{satisfied:.2f}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def write_report(metrics: Mapping[str, Any], json_path: str, title: str,
                 samples: Sequence[Mapping[str, Any]] = ()) -> Path:
    """Writes the metrics as JSON at `json_path` (strict: NaN and infinities as null) and as markdown beside it
    (same name, .md; `samples` after the metrics, as `samples_markdown` writes them); the markdown path."""
    path = Path(json_path)
    path.write_text(strict_json.dumps(dict(metrics), indent=2) + "\n", encoding="utf-8")
    markdown = path.with_suffix(".md")
    text = markdown_report(metrics, title)
    if samples:
        text += "\n" + samples_markdown(samples)
    markdown.write_text(text, encoding="utf-8")
    return markdown
