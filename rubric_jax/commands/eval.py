"""`rubric-jax eval`: a saved model evaluated on a task or on a dataset (a preset over a file, or a run config's
task and judge), with a progress bar and a JSON and markdown report.

- `dataset_params(preset, path, split)`: task "dataset" params that hold out the whole file, as a benchmark is
  evaluated: every usable row, in the seeded order.
- `evaluate_model`: `training.evaluate.evaluate` in chunks, a tqdm bar on stderr.
- `judge_failure(metrics, judge)`: training's failure budget (`JudgeConfig.max_failure_rate`) applied to the
  evaluation as a whole; `failed_judge_report` the report of an evaluation whose judge failed: what depends on
  its verdicts is null, "judge_failure" says why (the command then exits 1).
- `markdown_report(metrics, title)`: the metrics as markdown tables: the overall ones (an LLM judge's requests,
  tokens, latency and, with a run config whose judge has `price_per_million_tokens`, cost among them:
  "eval/judge/...", `training.accounting`), then the per-tag and per-criterion-tag breakdowns (HealthBench's themes
  and axes); a value that is null or not finite reads "n/a".
- `samples_markdown`, `write_report`: the judged samples as markdown; the report written as JSON and markdown.
"""

import argparse
import collections
import contextlib
import dataclasses
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from rubric_jax import arguments, strict_json
from rubric_jax.inference.engine import RolloutEngine
from rubric_jax.judges.base import Judge
from rubric_jax.training.run_config import EvalConfig, JudgeConfig, RLConfig, TokenPrice
from rubric_jax.yaml_config import load_config

NAME = "eval"
SUMMARY = """held-out accuracy (avg@k, pass@k) and rubric satisfaction of a saved model, on a task or a dataset
(a preset over a file, or a run config's task and judge), with a JSON and markdown report"""
PARSER_ORDER, SUMMARY_ORDER = 5, 3

DEFAULT_CHUNK = 32
# What an evaluation measures without its judge's verdicts (outcomes, lengths, the judge's own failure counts):
# kept when the judge failed, every other metric is null then.
_JUDGE_FREE = re.compile(r"eval/(accuracy|pass@\d+|response_length|tag/.+/accuracy|judge/.+)")
JUDGE_FAILURE_KEY = "judge_failure"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="held-out accuracy and rubric satisfaction of a saved model",
                                   description="Evaluates a Hugging Face model directory (e.g. <run>/model) on a "
                                               "task's held-out set, or on a dataset (--dataset: a preset over "
                                               "--data-path, every row, or a run config's task, judge and held-out "
                                               "rows), and prints the metrics as JSON; --output also writes them "
                                               "as JSON and as a markdown table beside it (.md). An LLM judge's "
                                               "server must answer before sampling starts (else exit 2); when more "
                                               "than judge.max_failure_rate of the verdicts failed, the report says "
                                               "the judge failed, gives no score from its verdicts, and the "
                                               "command exits 1.")
    parser.add_argument("model", help="a local Hugging Face model directory with its tokenizer")
    parser.add_argument("--task", default="arithmetic", help="a task of rubric_jax.data.tasks (default: arithmetic)")
    parser.add_argument("--task-seed", type=int, default=0)
    parser.add_argument("--dataset", metavar="PRESET_OR_CONFIG",
                        help="a dataset preset (with --data-path) or an RL config YAML whose task and judge to use")
    parser.add_argument("--data-path", help="the preset's file or directory")
    parser.add_argument("--split", default="train", help="the split of --data-path (default: train)")
    parser.add_argument("--judge-url", help="an OpenAI-compatible judge server (rubric datasets need one)")
    parser.add_argument("--judge-model", help="the judge's served model name")
    parser.add_argument("--judge-format", default="rating", choices=arguments.JUDGE_FORMATS,
                        help="how the judge is asked (default: rating, one call per criterion)")
    parser.add_argument("--sglang-url", help="sample from an SGLang server already serving the model (the "
                                             "directory then gives the tokenizer only)")
    parser.add_argument("--recipe", action="append", default=[], metavar="NAME",
                        help="also report this recipe's analysis (e.g. srar); repeatable")
    parser.add_argument("--examples", type=arguments.positive_int, default=None,
                        help=f"examples to evaluate (default: every row of a dataset, {EvalConfig.num_examples} "
                             "of a task)")
    parser.add_argument("--samples", type=arguments.positive_int, default=1,
                        help="samples per example (k of avg@k, pass@k)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=EvalConfig.top_p)
    for name, default in (("presence", EvalConfig.presence_penalty), ("frequency", EvalConfig.frequency_penalty),
                          ("repetition", EvalConfig.repetition_penalty)):
        parser.add_argument(f"--{name}-penalty", type=float, default=default,
                            help=f"SGLang's {name} penalty on the tokens a sample has generated (default: "
                                 f"{default:g}, none)")
    parser.add_argument("--max-new-tokens", type=arguments.positive_int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chat-template-kwargs", type=_template_kwargs, default={}, metavar="JSON",
                        help='the chat template\'s variables, e.g. \'{"enable_thinking": false}\' (Qwen3 '
                             "non-thinking mode)")
    parser.add_argument("--log-samples", type=arguments.non_negative_int, default=EvalConfig.log_samples,
                        metavar="N",
                        help="print the first N judged samples (question, response, verdicts) to stderr and put "
                             f"them in --output's report (default: {EvalConfig.log_samples}; 0: none)")
    parser.add_argument("--output", help="also write the metrics to this JSON file")
    return parser


def _template_kwargs(text: str) -> dict:
    """An argparse type: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({error.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


@dataclasses.dataclass(frozen=True)
class EvalPlan:
    """What `rubric-jax eval` evaluates: the task (name, params, seed), how many of its held-out examples (None:
    all), with which sampling (`eval`), judge and chat-template variables."""

    task: tuple[str, dict, int]
    count: Optional[int]
    eval: EvalConfig
    judge: JudgeConfig
    chat_template_kwargs: dict


@dataclasses.dataclass(frozen=True)
class CheckedEval:
    """An `EvalPlan` with its task built and its judge made (its server answering, for an LLM judge)."""

    plan: EvalPlan
    task: Any
    judge: Judge


def check(args) -> CheckedEval:
    """The plan from the flags (`_eval_plan`), the model directory and --output checked, the task built and the
    judge made; ValueError naming the flag to fix."""
    from rubric_jax.data.tasks import build_task  # noqa: PLC0415  (imports transformers: after the cheap checks)
    from rubric_jax.models.safetensors_io import check_model_directory  # noqa: PLC0415

    plan = _eval_plan(args)
    check_model_directory(args.model)
    if args.output:
        arguments.check_output_file(args.output)
    task = build_task(*plan.task)
    return CheckedEval(plan, task, _eval_judge(plan.judge, task, args))


def _eval_plan(args) -> EvalPlan:
    """The task, count, sampling, judge and chat-template variables the flags give; ValueError for flags that do
    not go together."""
    judge, kwargs, count = JudgeConfig(), args.chat_template_kwargs, args.examples
    if args.dataset is None:
        if args.data_path is not None:
            raise ValueError("--data-path goes with --dataset")
        task, count = (args.task, {}, args.task_seed), count or EvalConfig.num_examples
    elif args.dataset.endswith((".yaml", ".yml")):
        run = load_config(RLConfig, args.dataset)
        task, judge, count = (run.task.name, run.task.params, run.task.seed), run.judge, count or run.eval.num_examples
        kwargs = kwargs or run.model.chat_template_kwargs
    else:
        if args.data_path is None:
            raise ValueError(f"--dataset {args.dataset} needs --data-path (the preset's file)")
        task = ("dataset", dataset_params(args.dataset, args.data_path, args.split), args.task_seed)
    if args.judge_url is not None or args.judge_model is not None:
        if args.judge_url is None or args.judge_model is None:
            raise ValueError("--judge-url and --judge-model go together")
        judge = JudgeConfig(kind="llm", url=args.judge_url, model=args.judge_model, format=args.judge_format)
    sampling = EvalConfig(samples_per_example=args.samples, temperature=args.temperature, top_p=args.top_p,
                          presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                          repetition_penalty=args.repetition_penalty, log_samples=args.log_samples)
    return EvalPlan(task, count, sampling, judge, kwargs)


def dataset_params(preset: str, path: str, split: str = "train") -> dict[str, Any]:
    """Task "dataset"'s params for evaluating `preset` on the file `path`: the whole file held out."""
    from rubric_jax.data import presets  # noqa: PLC0415

    if preset not in presets.PRESETS:
        raise ValueError(f"--dataset {preset!r} is neither a preset nor a YAML config; presets: "
                         f"{', '.join(sorted(presets.PRESETS))}")
    return {"preset": preset, "path": path, "split": split, "eval_path": path}


def _eval_judge(config: JudgeConfig, task: Any, args) -> Judge:
    """The judge of `rubric-jax eval`, and its recipes checked; ValueError naming the flags to set, or the judge's
    URL when its server does not answer or refuses the credentials (`judges.preflight.served_models`)."""
    from rubric_jax.algorithms.registry import eval_metrics_fn  # noqa: PLC0415
    from rubric_jax.judges.preflight import PreflightFailed, served_models  # noqa: PLC0415
    from rubric_jax.training.assembly import make_judge  # noqa: PLC0415

    for recipe in args.recipe:
        eval_metrics_fn(recipe)
    try:
        judge = make_judge(config, task, args.seed)
    except ValueError as error:
        raise ValueError(f"{error} (on the command line: --judge-url, --judge-model, --judge-format)") from None
    if config.kind == "llm":  # a server that does not answer is refused before any sampling, as train's is
        try:
            served_models(judge.chat, "judge")
        except PreflightFailed as error:
            judge.close()
            raise ValueError(f"{error} (on the command line: --judge-url)") from None
    return judge


def run(checked: CheckedEval, args) -> int:
    """Samples and judges the held-out examples, prints the report (and the first judged samples on stderr),
    writes --output; status 1 when the judge failed beyond its budget (`judge_failure`)."""
    from rubric_jax.judges.records import FirstJudged  # noqa: PLC0415
    from rubric_jax.training.assembly import saved_model_engine  # noqa: PLC0415
    from rubric_jax.training.run_files import samples_of  # noqa: PLC0415

    plan, task = checked.plan, checked.task
    shown = FirstJudged(plan.eval.log_samples, "eval")
    with contextlib.closing(checked.judge):
        engine, tokenizer = saved_model_engine(args.model, seed=args.seed, sglang_url=args.sglang_url,
                                               chat_template_kwargs=plan.chat_template_kwargs)
        with contextlib.closing(engine):
            count = plan.count or int(task.data_metrics()["data/eval_rows"])
            metrics = evaluate_model(engine, tokenizer, task, checked.judge, task.eval_examples(count), plan.eval,
                                     max_new_tokens=args.max_new_tokens, seed=args.seed, recipes=args.recipe,
                                     on_judged=shown, judge_price=plan.judge.price_per_million_tokens)
    samples = samples_of(shown.records, shown.count)
    if samples:
        print(samples_markdown(samples), file=sys.stderr)
    failure = judge_failure(metrics, plan.judge)
    report = metrics if failure is None else failed_judge_report(metrics, failure)
    print(strict_json.dumps(report, indent=2))
    if args.output:
        write_report(report, args.output, f"{args.model} on {args.dataset or args.task}", samples)
    if failure is not None:
        print(f"rubric-jax eval: {failure}", file=sys.stderr)
        return 1
    return 0


def evaluate_model(engine: RolloutEngine, tokenizer: Any, task: Any, judge: Judge, examples: Sequence[Any],
                   config: EvalConfig, *, max_new_tokens: int, seed: int, recipes: Sequence[str] = (),
                   chunk_examples: int = DEFAULT_CHUNK, on_judged: Optional[Callable] = None,
                   judge_price: Optional[TokenPrice] = None) -> dict[str, float]:
    """`training.evaluate.evaluate` over `examples` in chunks of `chunk_examples`, with a progress bar on stderr
    (`on_judged`, `judge_price`: `evaluate`'s)."""
    from tqdm import tqdm  # noqa: PLC0415

    from rubric_jax.training.evaluate import evaluate  # noqa: PLC0415

    with tqdm(total=len(examples), unit="example", desc="evaluating", file=sys.stderr) as bar:
        return evaluate(engine, tokenizer, task, judge, examples, config, max_new_tokens=max_new_tokens, seed=seed,
                        recipes=recipes, chunk_examples=chunk_examples, progress=bar.update, on_judged=on_judged,
                        judge_price=judge_price)


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


def samples_markdown(samples: Sequence[Mapping[str, Any]]) -> str:
    """Judged samples (`training.run_files.samples_of`) as markdown to read: each one's question and response fenced
    (model text never forms the document's structure), then its criteria with weight and verdict, its rubric score
    and any judge failure, with its detail and the judge's raw answer (fenced too: model text)."""
    lines = ["## Samples"]
    for sample in samples:
        lines += ["", f"### {sample['id']}", "", "Question:", "", *_fenced(sample["question"]), "", "Response:", "",
                  *_fenced(sample["response"]), ""]
        lines += [f"- [{_verdict_mark(c['satisfied'])}] ({c['weight']:g}) {arguments.one_line(c['text'])}"
                  for c in sample["criteria"]]
        score = sample["rubric_score"]
        lines.append(f"\nrubric score: {'-' if score is None else f'{score:.3f}'}"
                     + (f"; judge failure: {sample['judge_failure']}" if sample["judge_failure"] else ""))
        if sample.get("judge_detail"):
            lines.append(f"\njudge failure detail: {arguments.one_line(sample['judge_detail'])}")
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
