"""`rubric-jax judge-agreement`: can the judge be trusted? Two raters' agreement on judged rollouts, and one
judge's self-consistency and sensitivity to the criteria's order and the response's length (`judges.agreement`,
docs/judge_agreement.md)."""

import argparse
import sys
from pathlib import Path
from typing import Optional

from rubric_jax import arguments
from rubric_jax.training.run_config import JudgeConfig

NAME = "judge-agreement"
SUMMARY = """can the judge be trusted: agreement (percent, Cohen's kappa, score correlations) of two judges, or a
judge and human labels, on judged rollouts (a run's saved ones); a judge's self-consistency and its
sensitivity to the criteria's order and the response's length; a markdown, PNG and JSON report"""
PARSER_ORDER = SUMMARY_ORDER = 6


def add_parser(subparsers) -> argparse.ArgumentParser:
    command = subparsers.add_parser(
        NAME,
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
    judging.add_argument("--format", default="rating", choices=arguments.JUDGE_FORMATS,
                         help="how both judges are asked (default: rating, one call per criterion)")
    judging.add_argument("--temperature", type=float, default=0.0, help="the judges' temperature (default 0)")
    judging.add_argument("--seed", type=int, default=0,
                         help="the judges' sampling seed (repeat r: seed + r), the permutations' and --sample's")
    judging.add_argument("--sample", type=arguments.positive_int, metavar="N",
                         help="a seeded random sample of N items (default: every item)")
    probes = command.add_argument_group("probes of one judge (A, or B when A is the saved verdicts)")
    probes.add_argument("--repeats", type=arguments.positive_int, default=1, metavar="N",
                        help="judge the items N times (needs --temperature > 0): self-consistency (default 1: off)")
    probes.add_argument("--permute", action="store_true",
                        help="re-judge with each item's criteria in a seeded random order: position sensitivity")
    probes.add_argument("--pad-chars", type=int, default=0, metavar="N",
                        help="re-judge with N+ characters of content-free filler appended to each response: length "
                             "sensitivity (default 0: off)")
    return command


def _judge(args, side: str) -> Optional[JudgeConfig]:
    """Judge `side`'s config from --judge-<side>-url and --judge-<side>-model; None when neither is given."""
    url, model = getattr(args, f"judge_{side}_url"), getattr(args, f"judge_{side}_model")
    if url is None and model is None:
        return None
    if url is None or model is None:
        raise ValueError(f"--judge-{side}-url and --judge-{side}-model go together")
    return JudgeConfig(kind="llm", url=url, model=model, format=args.format, temperature=args.temperature)


def check(args):
    """The checked inputs: (items, rater A, rater B or None, probes); ValueError naming the flag or the file's
    line."""
    import random  # noqa: PLC0415

    from rubric_jax.judges import agreement  # noqa: PLC0415  (imports jax: after the argument checks)
    from rubric_jax.judges.records import read_judged_rollouts  # noqa: PLC0415
    from rubric_jax.training.assembly import make_judge  # noqa: PLC0415

    if Path(args.output).suffix != ".md":
        raise ValueError(f"--output {args.output} must name a markdown file (.md): the plot and the numbers are "
                         "written beside it (.png, .json)")
    arguments.check_output_file(args.output)
    for flag, value in (("--pad-chars", args.pad_chars), ("--seed", args.seed), ("--temperature", args.temperature)):
        if value < 0:
            raise ValueError(f"{flag} must be >= 0, got {value}")
    if args.repeats > 1 and args.temperature <= 0:
        raise ValueError("--repeats needs --temperature > 0: greedy repeats measure no sampling variability")
    config_a, config_b = _judge(args, "a"), _judge(args, "b")
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


def run(checked, args) -> int:
    """The raters compared and probed, the report written and printed; status 1, with one line saying why, when a
    comparison compared nothing (every verdict of a side failed or missing, or no criteria:
    `agreement.incomparable`)."""
    from rubric_jax.judges import agreement  # noqa: PLC0415

    report = agreement.measure_agreement(*checked, log=lambda line: print(f"rubric-jax {NAME}: {line}",
                                                                           file=sys.stderr))
    markdown, plot, numbers = agreement.write_report(report, args.output)
    print(markdown.read_text(encoding="utf-8"), end="")
    print(f"rubric-jax {NAME}: wrote {markdown}, {plot}, {numbers}", file=sys.stderr)
    if report["incomparable"]:
        print(f"rubric-jax {NAME}: nothing compared in {'; '.join(report['incomparable'])}", file=sys.stderr)
        return 1
    return 0
