"""`rubric-jax synthesize`: a rubric dataset built by an LLM from documents or questions (`data.synthesis`: the
papers' pipelines), resumable, with a corpus summary."""

import argparse
import sys

from rubric_jax import arguments, strict_json
from rubric_jax.yaml_config import load_config

NAME = "synthesize"
SUMMARY = """build a rubric dataset with an LLM from documents or questions (the papers' pipelines: rubric-grounded,
RGR-GRPO, Rubrics as Rewards), resumable, in the layout a dataset preset reads, with a corpus summary"""
PARSER_ORDER, SUMMARY_ORDER = 4, 5


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = arguments.config_command(
        subparsers, NAME, "rubric synthesis from a YAML config (configs/synthesize_*.yaml): every input row "
                          "through the pipeline's LLM stages into output_dir/<split>.jsonl, with a summary; "
                          "a rerun resumes, skipping what is done")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def check(args):
    """The synthesis plan (`synthesis.plan_synthesis`): the config, its input and its output directory checked,
    and the generator's preflight, whose failure (PreflightFailed: its server cannot do the work) exits 1."""
    from rubric_jax.data import synthesis  # noqa: PLC0415
    from rubric_jax.training.runs import check_writable_directory  # noqa: PLC0415

    config = load_config(synthesis.SynthesisConfig, args.config, args.overrides)
    check_writable_directory(config.output_dir)
    return synthesis.plan_synthesis(config, check_generator=True)


def run(plan, args) -> int:
    """Runs the checked plan and prints the corpus counts; status 1, with one line giving the reasons (discards,
    failed stages, sources left after failed requests), when the corpus holds no record. Training on the output
    is suggested only when its train split holds records."""
    from rubric_jax.data import synthesis  # noqa: PLC0415

    summary = synthesis.run_synthesis(plan, progress=not args.no_progress)
    print(strict_json.dumps({key: summary[key] for key in ("sources", "records", "discards")}, indent=2))
    out = plan.config.output_dir
    if not sum(summary["records"].values()):
        reasons = [f"{title} " + ", ".join(f"{reason} {count}" for reason, count in summary[key].items())
                   for title, key in (("discarded:", "discards"), ("failed stage calls:", "stage_failures"))
                   if summary[key]]
        left = summary["this_run"]["request_failed"]
        reasons += [f"{left} sources left for the next run after failed requests"] if left else []
        print(f"rubric-jax {NAME}: wrote no record to {out} from {summary['sources']['input']} sources ("
              + ("; ".join(reasons) or "no source produced one") + "): see its summary.md", file=sys.stderr)
        return 1
    suggestion = (f"; train on it with task.params {{preset: {summary['preset']}, path: {out}/train.jsonl}}"
                  if summary["records"].get("train") else "")
    print(f"rubric-jax {NAME}: wrote {out} (summary.md){suggestion}", file=sys.stderr)
    return 0
