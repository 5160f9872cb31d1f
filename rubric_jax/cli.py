"""`rubric-jax`: train, sft, eval and quickstart from the command line.

Configs are YAML files (configs/) read onto frozen dataclasses and validated before anything is computed; any
key can be overridden after the file, `key.sub=value` (the value read as YAML). A bad config exits with status
2 and one line naming the key.
"""

import argparse
import json
import sys
from typing import Optional, Sequence

from rubric_jax.training.run_config import EvalConfig, QuickstartConfig, RLConfig, SFTConfig, resolve_algorithm
from rubric_jax.yaml_config import apply_overrides, config_from_dict, load_config

DESCRIPTION = """Rubric-based RL of LLMs in JAX.

commands:
  quickstart  the CPU demonstration: a tiny model, an SFT warm start and RL with rubric rewards on multi-step
              arithmetic, held-out accuracy and rubric satisfaction before and after RL (a few minutes)
  train       an RL run from a config (algorithm, rollouts, learner, optimizer, checkpoints, metrics)
  sft         supervised fine-tuning on a task's reference solutions (the cold start of step-format recipes)
  eval        held-out accuracy (avg@k, pass@k) and rubric satisfaction of a saved model
"""


def _config_command(subparsers, name: str, help_text: str, default: Optional[str] = None):
    parser = subparsers.add_parser(name, help=help_text, description=help_text,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs=None if default is None else "?", default=default,
                        help="YAML config file" + (f" (default: the built-in {default})" if default else ""))
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="config overrides, each value read as YAML (e.g. optimizer.learning_rate=3e-6)")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rubric-jax", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
    evaluate = subparsers.add_parser("eval", help="held-out accuracy and rubric satisfaction of a saved model",
                                     description="Evaluates a Hugging Face model directory (e.g. <run>/model) on a "
                                                 "task's held-out set and prints the metrics as JSON.")
    evaluate.add_argument("model", help="a local Hugging Face model directory with its tokenizer")
    evaluate.add_argument("--task", default="arithmetic", help="a task of rubric_jax.data.tasks (default: arithmetic)")
    evaluate.add_argument("--task-seed", type=int, default=0)
    evaluate.add_argument("--examples", type=int, default=EvalConfig.num_examples)
    evaluate.add_argument("--samples", type=int, default=1, help="samples per example (k of avg@k, pass@k)")
    evaluate.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    evaluate.add_argument("--max-new-tokens", type=int, default=64)
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.add_argument("--output", help="also write the metrics to this JSON file")
    return parser


def _quickstart_config(args) -> QuickstartConfig:
    overrides = [f"output_dir={args.output_dir}", *args.overrides]
    if args.config:
        return load_config(QuickstartConfig, args.config, overrides)
    return config_from_dict(QuickstartConfig, apply_overrides({}, overrides))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "quickstart":
            config = _quickstart_config(args)
        elif args.command == "train":
            config = load_config(RLConfig, args.config, args.overrides)
            resolve_algorithm(config)
        elif args.command == "sft":
            config = load_config(SFTConfig, args.config, args.overrides)
        else:
            config = EvalConfig(num_examples=args.examples, samples_per_example=args.samples,
                                temperature=args.temperature)
        # Task names and parameters are checked here too, before any model is built.
        from rubric_jax.data.tasks import build_task  # noqa: PLC0415  (imports transformers: after the cheap checks)

        task_spec = (args.task, {}, args.task_seed) if args.command == "eval" else (
            config.task.name, config.task.params, config.task.seed)
        task = build_task(*task_spec)
    except (ValueError, OSError) as error:
        print(f"rubric-jax {args.command}: {error}", file=sys.stderr)
        return 2

    if args.command == "quickstart":
        from rubric_jax.quickstart import run_quickstart  # noqa: PLC0415

        run_quickstart(config)
    elif args.command == "train":
        from rubric_jax.training.rl import train_rl  # noqa: PLC0415

        train_rl(config, task)
    elif args.command == "sft":
        from rubric_jax.training.sft import train_sft  # noqa: PLC0415

        train_sft(config, task)
    else:
        from rubric_jax.quickstart import evaluate_directory  # noqa: PLC0415

        metrics = evaluate_directory(args.model, task, config, max_new_tokens=args.max_new_tokens, seed=args.seed)
        text = json.dumps(metrics, indent=2)
        print(text)
        if args.output:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
