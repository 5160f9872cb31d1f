"""`rubric-jax`: train, sft, eval and quickstart from the command line.

Configs are YAML files (configs/) read onto frozen dataclasses and validated before anything is computed; any
key can be overridden after the file, `key.sub=value` (the value read as YAML).

Everything the user gives a command is checked before any model is built: the arguments, the config file and
its overrides (keys, types, values, the algorithm's and the task's parameters), the model directory (a Hugging
Face directory: config.json of a supported architecture, safetensors weights, tokenizer files) and the places
the command will write. A problem exits with status 2 and one line on stderr, `rubric-jax <command>: ...`.
Those checks raise ValueError (the configs' own convention) or OSError (a path), the two types caught, and only
around the checks: an error once the run has started is a bug or an accident of the run, with its traceback.
"""

import argparse
import contextlib
import dataclasses
import json
import sys
import typing
import tempfile
from pathlib import Path
from typing import NoReturn, Optional, Sequence

from rubric_jax import strict_json
from rubric_jax.judges.preflight import PreflightFailed
from rubric_jax.training.run_config import (
    EvalConfig, JudgeConfig, QuickstartConfig, RLConfig, SFTConfig, resolve_algorithm)
from rubric_jax.yaml_config import apply_overrides, config_from_dict, load_config

DESCRIPTION = """Rubric-based RL of LLMs in JAX.

commands:
  quickstart  the CPU demonstration: a tiny model, an SFT warm start and RL with rubric rewards on multi-step
              arithmetic, held-out accuracy and rubric satisfaction before and after RL (a few minutes)
  train       an RL run from a config (algorithm, rollouts, learner, optimizer, checkpoints, metrics)
  sft         supervised fine-tuning on a task's reference solutions (the cold start of step-format recipes)
  eval        held-out accuracy (avg@k, pass@k) and rubric satisfaction of a saved model, on a task or a dataset
              (a preset over a file, or a run config's task and judge), with a JSON and markdown report
  validate    check a run config and its dataset without training: rows used and skipped, what train would refuse
              at launch (a prompt longer than the model's context, by dataset row), one real request to each LLM
              judge and meta-verifier (its raw answer and whether it parses), the first prompts
  synthesize  build a rubric dataset with an LLM from documents or questions (the papers' pipelines: rubric-grounded,
              RGR-GRPO, Rubrics as Rewards), resumable, in the layout a dataset preset reads, with a corpus summary
  judge-agreement
              can the judge be trusted: agreement (percent, Cohen's kappa, score correlations) of two judges, or a
              judge and human labels, on judged rollouts (a run's saved ones); a judge's self-consistency and its
              sensitivity to the criteria's order and the response's length; a markdown, PNG and JSON report
  plan        compile a run's learner ahead of time for a TPU topology (e.g. v5p:4x4x4) on any host: HBM per chip,
              FLOPs, a step-time bound and the MFU ceiling; exits 1 when the step does not fit (docs/scale.md)
"""


JUDGE_FORMATS = typing.get_args(typing.get_type_hints(JudgeConfig)["format"])


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors in the commands' one-line form (argparse prints the usage first), an
    unknown argument reported by the command it was given to (`commands`: name -> that command's parser)."""

    commands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.commands[parsed.command].error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def _int_at_least(minimum: int):
    """An argparse type: an integer >= `minimum`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _config_command(subparsers, name: str, help_text: str, default: Optional[str] = None):
    parser = subparsers.add_parser(name, help=help_text, description=help_text,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs=None if default is None else "?", default=default,
                        help="YAML config file" + (f" (default: the built-in {default})" if default else ""))
    parser.add_argument("overrides", nargs="*", default=[], metavar="key.sub=value",
                        help="config overrides, each value read as YAML (e.g. optimizer.learning_rate=3e-6)")
    return parser


def _template_kwargs(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({error.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rubric-jax", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a runtime error instead of its one-line summary")
    subparsers = parser.add_subparsers(dest="command", required=True)
    quickstart = subparsers.add_parser(
        "quickstart", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="CPU demonstration: SFT then RL with rubric rewards on multi-step arithmetic",
        description="Trains a tiny Qwen3-architecture model on synthetic multi-step arithmetic: an SFT warm start "
                    "on `### Step k:` solutions, then RL (RaR: rubric rewards from per-step checks, GRPO "
                    "advantages, PPO clip) through the embedded sampler. Prints held-out accuracy and rubric "
                    "satisfaction after SFT and after RL, writes report.json, metrics (JSONL, TensorBoard) and "
                    "plots under the output directory. Repeating the command resumes from its checkpoints.")
    quickstart.add_argument("--config", help="a quickstart YAML config (default: the built-in one, which "
                                             "configs/quickstart.yaml spells out)")
    quickstart.add_argument("--output-dir", default="runs/quickstart", help="default: runs/quickstart")
    quickstart.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    _config_command(subparsers, "train", "RL training from a YAML config (see configs/); resumes from the output "
                                         "directory's latest checkpoint unless checkpoint.resume=false")
    _config_command(subparsers, "sft", "SFT on a task's reference solutions from a YAML config; saves the model "
                                       "as a Hugging Face directory output_dir/model")
    validate = _config_command(subparsers, "validate", "check an RL config and its dataset without training: the "
                                                       "config, every row of the dataset, the recipe's max_items, "
                                                       "every prompt against the model's context, one real request "
                                                       "to each LLM judge and meta-verifier (the raw answer and "
                                                       "whether it parses); prints the first rows' policy and judge "
                                                       "prompts; exits 1 when train would refuse to start")
    validate.add_argument("--rows", type=_positive_int, default=2, help="rows whose prompts are shown (default 2)")
    validate.add_argument("--offline", action="store_true",
                          help="send the LLM judge and meta-verifier nothing (check the config and the data only)")
    synthesize = _config_command(
        subparsers, "synthesize", "rubric synthesis from a YAML config (configs/synthesize_*.yaml): every input row "
                                  "through the pipeline's LLM stages into output_dir/<split>.jsonl, with a summary; "
                                  "a rerun resumes, skipping what is done")
    synthesize.add_argument("--no-progress", action="store_true", help="no progress bar")
    evaluate = subparsers.add_parser("eval", help="held-out accuracy and rubric satisfaction of a saved model",
                                     description="Evaluates a Hugging Face model directory (e.g. <run>/model) on a "
                                                 "task's held-out set, or on a dataset (--dataset: a preset over "
                                                 "--data-path, every row, or a run config's task, judge and held-out "
                                                 "rows), and prints the metrics as JSON; --output also writes them "
                                                 "as JSON and as a markdown table beside it (.md). An LLM judge's "
                                                 "server must answer before sampling starts (else exit 2); when more "
                                                 "than judge.max_failure_rate of the verdicts failed, the report says "
                                                 "the judge failed, gives no score from its verdicts, and the "
                                                 "command exits 1.")
    evaluate.add_argument("model", help="a local Hugging Face model directory with its tokenizer")
    evaluate.add_argument("--task", default="arithmetic", help="a task of rubric_jax.data.tasks (default: arithmetic)")
    evaluate.add_argument("--task-seed", type=int, default=0)
    evaluate.add_argument("--dataset", metavar="PRESET_OR_CONFIG",
                          help="a dataset preset (with --data-path) or an RL config YAML whose task and judge to use")
    evaluate.add_argument("--data-path", help="the preset's file or directory")
    evaluate.add_argument("--split", default="train", help="the split of --data-path (default: train)")
    evaluate.add_argument("--judge-url", help="an OpenAI-compatible judge server (rubric datasets need one)")
    evaluate.add_argument("--judge-model", help="the judge's served model name")
    evaluate.add_argument("--judge-format", default="rating", choices=JUDGE_FORMATS,
                          help="how the judge is asked (default: rating, one call per criterion)")
    evaluate.add_argument("--sglang-url", help="sample from an SGLang server already serving the model (the "
                                               "directory then gives the tokenizer only)")
    evaluate.add_argument("--recipe", action="append", default=[], metavar="NAME",
                          help="also report this recipe's analysis (e.g. srar); repeatable")
    evaluate.add_argument("--examples", type=_positive_int, default=None,
                          help=f"examples to evaluate (default: every row of a dataset, {EvalConfig.num_examples} "
                               "of a task)")
    evaluate.add_argument("--samples", type=_positive_int, default=1, help="samples per example (k of avg@k, pass@k)")
    evaluate.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    evaluate.add_argument("--top-p", type=float, default=EvalConfig.top_p)
    for name, default in (("presence", EvalConfig.presence_penalty), ("frequency", EvalConfig.frequency_penalty),
                          ("repetition", EvalConfig.repetition_penalty)):
        evaluate.add_argument(f"--{name}-penalty", type=float, default=default,
                              help=f"SGLang's {name} penalty on the tokens a sample has generated (default: "
                                   f"{default:g}, none)")
    evaluate.add_argument("--max-new-tokens", type=_positive_int, default=64)
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.add_argument("--chat-template-kwargs", type=_template_kwargs, default={}, metavar="JSON",
                          help='the chat template\'s variables, e.g. \'{"enable_thinking": false}\' (Qwen3 '
                               "non-thinking mode)")
    evaluate.add_argument("--log-samples", type=_non_negative_int, default=EvalConfig.log_samples, metavar="N",
                          help="print the first N judged samples (question, response, verdicts) to stderr and put "
                               f"them in --output's report (default: {EvalConfig.log_samples}; 0: none)")
    evaluate.add_argument("--output", help="also write the metrics to this JSON file")
    _agreement_command(subparsers)
    plan = _config_command(subparsers, "plan", "compile an RL config's learner (train step and logprobs) ahead of time "
                                               "for a TPU topology and report its memory per chip, FLOPs and MFU "
                                               "ceiling; needs libtpu (pip install -e '.[tpu]'), no TPU")
    plan.add_argument("--topology", required=True, help="<generation>:<shape>, e.g. v5e:2x2, v4:2x2x1, v5p:4x4x4")
    plan.add_argument("--model-preset", help="a published architecture (e.g. Qwen3-8B) instead of model.path's "
                                             "config.json")
    plan.add_argument("--prompt-tokens", type=_positive_int,
                      help="prompt width of the step (default: rollout.max_prompt_tokens)")
    plan.add_argument("--hbm-gib", type=_positive_float,
                      help="the memory budget per chip in GiB (default: the chip's HBM), to leave headroom")
    plan.add_argument("--search", action="store_true",
                      help="if the learner does not fit, double learner.micro_batches (then with model.remat=true) "
                           "and learner.forward_micro_batches until it does, and print the overrides")
    parser.commands = subparsers.choices
    return parser


def _load(cls, path: str, overrides: Sequence[str]):
    if not Path(path).is_file():
        raise ValueError(f"config file {path} " + ("is a directory" if Path(path).is_dir() else "does not exist"))
    return load_config(cls, path, overrides)


def _quickstart_config(args) -> QuickstartConfig:
    overrides = [f"output_dir={args.output_dir}", *args.overrides]
    if args.config:
        return _load(QuickstartConfig, args.config, overrides)
    return config_from_dict(QuickstartConfig, apply_overrides({}, overrides))


def _check_model_directory(path: str, what: str = "model directory") -> None:
    """ValueError unless `path` is a local Hugging Face model directory this project loads: config.json of a
    supported architecture (`ModelConfig`'s own checks), safetensors weights and tokenizer files."""
    # imported here: they import transformers, which `rubric-jax --help` and the config checks do without
    from rubric_jax.models.config import ModelConfig  # noqa: PLC0415
    from rubric_jax.models.safetensors_io import INDEX_NAME, WEIGHTS_NAME  # noqa: PLC0415
    from rubric_jax.models.tokenizer import tokenizer_files  # noqa: PLC0415

    directory = Path(path)
    if not directory.is_dir():
        raise ValueError(f"{what} {path} " + ("is not a directory" if directory.exists() else "does not exist"))
    if not (directory / "config.json").is_file():
        raise ValueError(f"{what} {path} is not a Hugging Face model directory: it has no config.json")
    try:
        ModelConfig.from_pretrained(directory)
    except ValueError as error:  # json's decode errors are ValueErrors too
        raise ValueError(f"{what} {path}: config.json: {error}") from None
    if not ((directory / WEIGHTS_NAME).is_file() or (directory / INDEX_NAME).is_file()):
        raise ValueError(f"{what} {path} has no weights: no {WEIGHTS_NAME} or {INDEX_NAME}")
    try:
        tokenizer_files(directory)
    except FileNotFoundError as error:
        raise ValueError(f"{what} {path}: {error}") from None


def _check_writable_directory(path: str, what: str = "output directory") -> None:
    """Writes and deletes a scratch file in the directory `path`, or, when it does not exist yet, in its nearest
    existing ancestor (where the run will create it); ValueError if that is not a directory or the write fails.
    Trying is the only reliable check (permissions say nothing to root or on a read-only file system), and it
    creates nothing, so a launch refused later leaves no trace."""
    existing = next(p for p in (Path(path), *Path(path).parents) if p.exists())  # "." or "/" at the latest
    if not existing.is_dir():
        raise ValueError(f"cannot write the {what} {path}: {existing} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise ValueError(f"cannot write the {what} {path}: {error.strerror or error}") from None


def _check_output_file(path: str) -> None:
    if Path(path).is_dir():
        raise ValueError(f"--output {path} is a directory")
    parent = Path(path).parent
    if not parent.is_dir():
        raise ValueError(f"--output {path}: the directory {parent} does not exist")
    _check_writable_directory(str(parent), "--output file's directory")


def _checked_config(args):
    """The command's config, every input checked (module docstring); ValueError or OSError naming the problem."""
    if args.command == "quickstart":
        config = _quickstart_config(args)
    elif args.command == "train":
        config = _load(RLConfig, args.config, args.overrides)
        resolve_algorithm(config)
    elif args.command == "validate":
        config = _load(RLConfig, args.config, args.overrides)
        resolve_algorithm(config)
    elif args.command == "sft":
        config = _load(SFTConfig, args.config, args.overrides)
    elif args.command == "synthesize":
        from rubric_jax.data import synthesis  # noqa: PLC0415

        config = _load(synthesis.SynthesisConfig, args.config, args.overrides)
        _check_writable_directory(config.output_dir)
        return synthesis.plan_synthesis(config, check_generator=True)
    else:
        config = _eval_plan(args)
        _check_model_directory(args.model)
        if args.output:
            _check_output_file(args.output)
    if args.command in ("train", "sft", "validate") and config.model.path is not None:
        _check_model_directory(config.model.path, "model.path")
    return config


@dataclasses.dataclass(frozen=True)
class _EvalPlan:
    """What `rubric-jax eval` evaluates: the task (name, params, seed), how many of its held-out examples (None:
    all), with which sampling (`eval`), judge and chat-template variables."""

    task: tuple[str, dict, int]
    count: Optional[int]
    eval: EvalConfig
    judge: JudgeConfig
    chat_template_kwargs: dict


def _eval_plan(args) -> _EvalPlan:
    from rubric_jax.benchmark import dataset_params  # noqa: PLC0415

    judge, kwargs, count = JudgeConfig(), args.chat_template_kwargs, args.examples
    if args.dataset is None:
        if args.data_path is not None:
            raise ValueError("--data-path goes with --dataset")
        task, count = (args.task, {}, args.task_seed), count or EvalConfig.num_examples
    elif args.dataset.endswith((".yaml", ".yml")):
        run = _load(RLConfig, args.dataset, [])
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
    return _EvalPlan(task, count, sampling, judge, kwargs)


def _one_line(error: Exception) -> str:
    if isinstance(error, OSError) and error.strerror and error.filename:
        return f"{error.filename}: {error.strerror}"
    return " ".join(str(error).split())


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs a command; a runtime error it does not report itself is one line and exit 1, Ctrl-C one line and 130
    (`--debug` lets both through with their tracebacks)."""
    args = build_parser().parse_args(argv)
    if args.debug:
        return _command(args)
    try:
        return _command(args)
    except KeyboardInterrupt:
        print(f"rubric-jax {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # a bug or an environment problem: one line, the traceback behind --debug
        print(f"rubric-jax {args.command}: {type(error).__name__}: {_one_line(error)} (rerun with --debug for the "
              "traceback)", file=sys.stderr)
        return 1


def _command(args) -> int:
    if args.command == "judge-agreement":
        return _judge_agreement(args)
    if args.command == "plan":
        return _plan(args)
    try:
        config = _checked_config(args)
        # The synthesis plan holds its input task; every other command's task is checked here, before any model
        # is built.
        task = None if args.command == "synthesize" else _checked_task(args, config)
        benchmarks = _checked_benchmarks(args, config)
        if args.command == "eval":
            judge = _eval_judge(config.judge, task, args)
        elif args.command == "validate":
            return _validate(config, task, args)
        elif args.command != "synthesize":
            _check_writable_directory(config.output_dir, "output_dir")
        if args.command == "train":
            from rubric_jax.training.launch import check_rubric_width  # noqa: PLC0415

            check_rubric_width(resolve_algorithm(config)[0], task)
    except (ValueError, OSError) as error:
        print(f"rubric-jax {args.command}: {_one_line(error)}", file=sys.stderr)
        return 2
    except PreflightFailed as error:  # the synthesis generator's server cannot do the work
        print(f"rubric-jax {args.command}: {_one_line(error)}", file=sys.stderr)
        return 1

    if args.command == "synthesize":
        return _synthesize(config, progress=not args.no_progress)
    if args.command == "quickstart":
        from rubric_jax.quickstart import run_quickstart  # noqa: PLC0415

        run_quickstart(config)
    elif args.command in ("train", "sft"):
        from rubric_jax.training.rl import train_rl  # noqa: PLC0415
        from rubric_jax.training.runs import RunStopped  # noqa: PLC0415
        from rubric_jax.training.sft import train_sft  # noqa: PLC0415

        try:
            if args.command == "train":
                train_rl(config, task, benchmarks=benchmarks)
            else:
                train_sft(config, task)
        except RunStopped as error:
            print(f"rubric-jax {args.command}: {_one_line(error)}", file=sys.stderr)
            return error.exit_code
    else:
        from rubric_jax import benchmark  # noqa: PLC0415
        from rubric_jax.training import assembly  # noqa: PLC0415
        from rubric_jax.judges.records import FirstJudged  # noqa: PLC0415
        from rubric_jax.training.run_files import samples_of  # noqa: PLC0415

        shown = FirstJudged(config.eval.log_samples, "eval")
        with contextlib.closing(judge):
            engine, tokenizer = assembly.saved_model_engine(args.model, seed=args.seed, sglang_url=args.sglang_url,
                                                       chat_template_kwargs=config.chat_template_kwargs)
            with contextlib.closing(engine):
                count = config.count or int(task.data_metrics()["data/eval_rows"])
                metrics = benchmark.evaluate_model(engine, tokenizer, task, judge, task.eval_examples(count),
                                                   config.eval, max_new_tokens=args.max_new_tokens, seed=args.seed,
                                                   recipes=args.recipe, on_judged=shown)
        samples = samples_of(shown.records, shown.count)
        if samples:
            print(benchmark.samples_markdown(samples), file=sys.stderr)
        failure = benchmark.judge_failure(metrics, config.judge)
        report = metrics if failure is None else benchmark.failed_judge_report(metrics, failure)
        print(strict_json.dumps(report, indent=2))
        if args.output:
            benchmark.write_report(report, args.output, f"{args.model} on {args.dataset or args.task}", samples)
        if failure is not None:
            print(f"rubric-jax eval: {failure}", file=sys.stderr)
            return 1
    return 0


def _validate(config, task, args) -> int:
    """Prints `rubric-jax validate`'s report; what train would refuse at launch, a line each on stderr, exits 1."""
    from rubric_jax.benchmark import validation_report  # noqa: PLC0415
    from rubric_jax.training.runs import RunStopped  # noqa: PLC0415

    try:
        report, refusals = validation_report(config, task, _validation_tokenizer(config, task), args.rows,
                                             ask_servers=not args.offline)
    except RunStopped as error:  # a judge's API key that is not set
        report, refusals = "", [str(error)]
    print(report, end="")
    for refusal in refusals:
        print(f"rubric-jax validate: {_one_line(refusal)}", file=sys.stderr)
    return 1 if refusals else 0


def _checked_task(args, config):
    from rubric_jax.data.tasks import build_task  # noqa: PLC0415  (imports transformers: after the cheap checks)

    return build_task(*(config.task if args.command == "eval" else (
        config.task.name, config.task.params, config.task.seed)))


def _checked_benchmarks(args, config) -> dict:
    """The evaluation benchmarks of an RL run that evaluates (`train`, `validate`), their files read as the task's
    are (`training.assembly.benchmark_tasks`); none for the other commands."""
    if args.command not in ("train", "validate") or not config.eval.every_steps:
        return {}
    from rubric_jax.training.assembly import benchmark_tasks  # noqa: PLC0415

    return benchmark_tasks(config.eval, config.seed)


def _synthesize(plan, *, progress: bool) -> int:
    """Runs a checked `rubric-jax synthesize` plan and prints the corpus counts; status 1, with one line giving
    the reasons (discards, failed stages, sources left after failed requests), when the corpus holds no record.
    Training on the output is suggested only when its train split holds records."""
    from rubric_jax.data import synthesis  # noqa: PLC0415

    summary = synthesis.run_synthesis(plan, progress=progress)
    print(strict_json.dumps({key: summary[key] for key in ("sources", "records", "discards")}, indent=2))
    out = plan.config.output_dir
    if not sum(summary["records"].values()):
        reasons = [f"{title} " + ", ".join(f"{reason} {count}" for reason, count in summary[key].items())
                   for title, key in (("discarded:", "discards"), ("failed stage calls:", "stage_failures"))
                   if summary[key]]
        left = summary["this_run"]["request_failed"]
        reasons += [f"{left} sources left for the next run after failed requests"] if left else []
        print(f"rubric-jax synthesize: wrote no record to {out} from {summary['sources']['input']} sources ("
              + ("; ".join(reasons) or "no source produced one") + "): see its summary.md", file=sys.stderr)
        return 1
    suggestion = (f"; train on it with task.params {{preset: {summary['preset']}, path: {out}/train.jsonl}}"
                  if summary["records"].get("train") else "")
    print(f"rubric-jax synthesize: wrote {out} (summary.md){suggestion}", file=sys.stderr)
    return 0


def _eval_judge(config: JudgeConfig, task, args):
    """The judge of `rubric-jax eval`, and its recipes checked; ValueError naming the flags to set, or the judge's
    URL when its server does not answer or refuses the credentials (`judges.preflight.served_models`)."""
    from rubric_jax.algorithms.registry import eval_metrics_fn  # noqa: PLC0415
    from rubric_jax.judges.preflight import served_models  # noqa: PLC0415
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


def _validation_tokenizer(config: RLConfig, task):
    """The tokenizer the run would render its prompts with: the model directory's, or the task's."""
    if config.model.path is None:
        return task.tokenizer()
    from rubric_jax.models.tokenizer import load_tokenizer  # noqa: PLC0415

    return load_tokenizer(config.model.path)


def _agreement_command(subparsers) -> None:
    """The parser of `rubric-jax judge-agreement`."""
    command = subparsers.add_parser(
        "judge-agreement",
        help="can the judge be trusted: two judges' (or a judge's and human labels') agreement, and a judge's "
             "self-consistency and position and length sensitivity",
        description="Compares two raters of the same rubric items, judge A and judge B (two OpenAI-compatible "
                    "judges; A may be the verdicts saved with the items, B human labels): percent agreement and "
                    "Cohen's kappa per criterion and overall (scores binarised at 0.5), Pearson and Spearman "
                    "correlations of the per-response rubric scores. Probes one judge (A, or B when A is saved "
                    "verdicts): its self-consistency over repeats, and how its verdicts move when the criteria are "
                    "permuted or the responses padded with content-free filler. Failed verdicts are excluded and "
                    "counted. Writes --output (markdown) and beside it a confusion-table plot (.png) and the "
                    "numbers (.json); docs/judge_agreement.md.")
    command.add_argument("items", help="judged rollouts: a JSONL file (rubric_jax.judges.records) or a directory "
                                       "of them, e.g. a run's rollouts/ directory")
    command.add_argument("--output", required=True, metavar="REPORT.md",
                         help="the markdown report; REPORT.png and REPORT.json are written beside it")
    rater_a = command.add_argument_group("rater A: a judge, or the saved verdicts")
    rater_a.add_argument("--judge-a-url", metavar="URL", help="judge A's OpenAI-compatible server")
    rater_a.add_argument("--judge-a-model", metavar="NAME", help="judge A's served model name")
    rater_a.add_argument("--use-saved-verdicts", action="store_true",
                         help="rater A is the verdict saved with each item (the run's judge); no re-judging")
    rater_b = command.add_argument_group("rater B (optional with a probe): a judge, or human labels")
    rater_b.add_argument("--judge-b-url", metavar="URL", help="judge B's OpenAI-compatible server")
    rater_b.add_argument("--judge-b-model", metavar="NAME", help="judge B's served model name")
    rater_b.add_argument("--labels", metavar="FILE",
                         help='human labels, JSONL: {"id": <item id>, "satisfied": [0 or 1 per criterion]} a line; '
                              "unlabelled items are excluded and counted")
    judging = command.add_argument_group("judging")
    judging.add_argument("--format", default="rating", choices=JUDGE_FORMATS,
                         help="how both judges are asked (default: rating, one call per criterion)")
    judging.add_argument("--temperature", type=float, default=0.0, help="the judges' temperature (default 0)")
    judging.add_argument("--seed", type=int, default=0,
                         help="the judges' sampling seed (repeat r: seed + r), the permutations' and --sample's")
    judging.add_argument("--sample", type=_positive_int, metavar="N",
                         help="a seeded random sample of N items (default: every item)")
    probes = command.add_argument_group("probes of one judge (A, or B when A is the saved verdicts)")
    probes.add_argument("--repeats", type=_positive_int, default=1, metavar="N",
                        help="judge the items N times (needs --temperature > 0): self-consistency (default 1: off)")
    probes.add_argument("--permute", action="store_true",
                        help="re-judge with each item's criteria in a seeded random order: position sensitivity")
    probes.add_argument("--pad-chars", type=int, default=0, metavar="N",
                        help="re-judge with N+ characters of content-free filler appended to each response: length "
                             "sensitivity (default 0: off)")


def _agreement_judge(args, side: str) -> Optional[JudgeConfig]:
    """Judge `side`'s config from --judge-<side>-url and --judge-<side>-model; None when neither is given."""
    url, model = getattr(args, f"judge_{side}_url"), getattr(args, f"judge_{side}_model")
    if url is None and model is None:
        return None
    if url is None or model is None:
        raise ValueError(f"--judge-{side}-url and --judge-{side}-model go together")
    return JudgeConfig(kind="llm", url=url, model=model, format=args.format, temperature=args.temperature)


def _agreement_plan(args):
    """The checked inputs of `rubric-jax judge-agreement`: (items, rater A, rater B or None, probes); ValueError
    naming the flag or the file's line."""
    import random  # noqa: PLC0415

    from rubric_jax.judges import agreement  # noqa: PLC0415  (imports jax: after the argument checks)
    from rubric_jax.judges.records import read_judged_rollouts  # noqa: PLC0415
    from rubric_jax.training.assembly import make_judge  # noqa: PLC0415

    if Path(args.output).suffix != ".md":
        raise ValueError(f"--output {args.output} must name a markdown file (.md): the plot and the numbers are "
                         "written beside it (.png, .json)")
    _check_output_file(args.output)
    for flag, value in (("--pad-chars", args.pad_chars), ("--seed", args.seed), ("--temperature", args.temperature)):
        if value < 0:
            raise ValueError(f"{flag} must be >= 0, got {value}")
    if args.repeats > 1 and args.temperature <= 0:
        raise ValueError("--repeats needs --temperature > 0: greedy repeats measure no sampling variability")
    config_a, config_b = _agreement_judge(args, "a"), _agreement_judge(args, "b")
    if (config_a is None) == (not args.use_saved_verdicts):
        raise ValueError("rater A is either a judge (--judge-a-url, --judge-a-model) or --use-saved-verdicts: give "
                         + ("one" if config_a is None else "only one"))
    if config_b is not None and args.labels is not None:
        raise ValueError("rater B is either a judge (--judge-b-url, --judge-b-model) or --labels: give only one")
    items = read_judged_rollouts(args.items)
    if not items:
        raise ValueError(f"{args.items} holds no items")
    if args.format == "grounded" and (config_a is not None or config_b is not None):
        missing = [item.id for item in items if item.request.reference is None]
        if missing:
            raise ValueError(f"--format grounded shows the judge each item's reference (its grounding passage); "
                             f"{len(missing)} items have none, the first {missing[0]!r}")
    labels = None if args.labels is None else agreement.read_human_labels(args.labels, items)
    if args.use_saved_verdicts and all(item.verdict is None for item in items):
        raise ValueError(f"--use-saved-verdicts: no item of {args.items} has a saved verdict")
    keep = range(len(items))
    if args.sample is not None and args.sample < len(items):
        keep = sorted(random.Random(args.seed).sample(range(len(items)), args.sample))
    items = [items[i] for i in keep]

    def rater(config: JudgeConfig):
        return agreement.Rater(f"{config.model} at {config.url} ({config.format})",
                               judge_at=lambda seed: make_judge(config, None, seed))

    a = rater(config_a) if config_a is not None else agreement.Rater(
        f"the verdicts saved in {args.items}", ratings=[item.verdict for item in items])
    b = rater(config_b) if config_b is not None else None
    if labels is not None:
        b = agreement.Rater(f"human labels ({args.labels})", ratings=[labels[i] for i in keep])
    probes = agreement.Probes(repeats=args.repeats, permute=args.permute, pad_chars=args.pad_chars, seed=args.seed)
    agreement.check_plan(a, b, probes)
    return items, a, b, probes


def _judge_agreement(args) -> int:
    """`rubric-jax judge-agreement`: the inputs checked (one line on stderr, status 2, for a problem), the raters
    compared and probed, the report written and printed; status 1, with one line saying why, when a comparison
    compared nothing (every verdict of a side failed or missing, or no criteria: `agreement.incomparable`)."""
    try:
        items, a, b, probes = _agreement_plan(args)
    except (ValueError, OSError) as error:
        print(f"rubric-jax {args.command}: {_one_line(error)}", file=sys.stderr)
        return 2
    from rubric_jax.judges import agreement  # noqa: PLC0415

    report = agreement.measure_agreement(items, a, b, probes,
                                         log=lambda line: print(f"rubric-jax {args.command}: {line}", file=sys.stderr))
    markdown, plot, numbers = agreement.write_report(report, args.output)
    print(markdown.read_text(encoding="utf-8"), end="")
    print(f"rubric-jax {args.command}: wrote {markdown}, {plot}, {numbers}", file=sys.stderr)
    if report["incomparable"]:
        print(f"rubric-jax {args.command}: nothing compared in {'; '.join(report['incomparable'])}", file=sys.stderr)
        return 1
    return 0


def _plan(args) -> int:
    """`rubric-jax plan`: the inputs checked (one line on stderr, status 2, for a problem), the learner compiled
    and its report printed; status 1 when the step does not fit in the chips' HBM."""
    from rubric_jax.training import plan  # noqa: PLC0415  (imports the model stack)

    try:
        config = _load(RLConfig, args.config, args.overrides)
        prompt_tokens = args.prompt_tokens or config.rollout.max_prompt_tokens
        if prompt_tokens is None:
            raise ValueError("the config has no rollout.max_prompt_tokens: give --prompt-tokens")
        model = plan.model_config(config, args.model_preset)
        hbm_bytes = None if args.hbm_gib is None else int(args.hbm_gib * plan.GIB)
        options = dict(prompt_tokens=prompt_tokens, hbm_bytes=hbm_bytes)
        if args.search:
            result, overrides = plan.search_learner(config, model, args.topology, **options,
                                                    log=lambda line: print(f"tried: {line}", file=sys.stderr))
        else:
            result, overrides = plan.plan_learner(config, model, args.topology, **options), []
    except (ValueError, OSError) as error:
        print(f"rubric-jax plan: {_one_line(error)}", file=sys.stderr)
        return 2
    print(result.report())
    if not result.fits:
        advice = "no micro-batch count or remat setting fits: plan a larger topology" if args.search else \
            "raise learner.micro_batches, set model.remat=true (or try --search), or plan a larger topology"
        print(f"rubric-jax plan: the learner does not fit in {args.topology}'s HBM: {advice}", file=sys.stderr)
        return 1
    if args.search:
        print("fits as configured" if not overrides else f"fits with: {' '.join(overrides)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

