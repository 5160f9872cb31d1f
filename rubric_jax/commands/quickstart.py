"""`rubric-jax quickstart`: the CPU quickstart, a tiny Qwen3-architecture model learns multi-step arithmetic.

1. a random model with the task's character tokenizer
2. SFT warm start on generated `### Step k:` solutions                      training.sft
3. held-out evaluation of the SFT policy: accuracy and rubric satisfaction    training.evaluate
4. RL with rubric rewards (per-step criteria, the boxed answer and the format, checked by the programmatic
   judge), through the embedded engine                                      training.rl
5. the same evaluation of the RL policy; report.json and plots

Everything is seeded by `seed`; both runs resume from their checkpoints when the command is repeated.
"""

import argparse
import time
from pathlib import Path
from typing import Any

from rubric_jax import strict_json
from rubric_jax.training.run_config import QuickstartConfig
from rubric_jax.yaml_config import apply_overrides, config_from_dict, load_config, save_config

NAME = "quickstart"
SUMMARY = """the CPU demonstration: a tiny model, an SFT warm start and RL with rubric rewards on multi-step
arithmetic, held-out accuracy and rubric satisfaction before and after RL (a few minutes)"""
PARSER_ORDER = SUMMARY_ORDER = 0
HEADLINE = ("eval/accuracy", "eval/rubric_score")


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME, formatter_class=argparse.RawDescriptionHelpFormatter,
        help="CPU demonstration: SFT then RL with rubric rewards on multi-step arithmetic",
        description="Trains a tiny Qwen3-architecture model on synthetic multi-step arithmetic: an SFT warm start "
                    "on `### Step k:` solutions, then RL (RaR: rubric rewards from per-step checks, GRPO "
                    "advantages, PPO clip) through the embedded sampler. Prints held-out accuracy and rubric "
                    "satisfaction after SFT and after RL, writes report.json, metrics (JSONL, TensorBoard) and "
                    "plots under the output directory. Repeating the command resumes from its checkpoints.")
    parser.add_argument("--config", help="a quickstart YAML config (default: the built-in one, which "
                                         "configs/quickstart.yaml spells out)")
    parser.add_argument("--output-dir", default="runs/quickstart", help="default: runs/quickstart")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    return parser


def check(args) -> tuple[QuickstartConfig, Any]:
    """The quickstart's config (--config's file or the built-in one, --output-dir and the overrides applied) and
    its task; ValueError when either does not build or the output directory cannot be written."""
    from rubric_jax.training.assembly import make_task  # noqa: PLC0415  (imports the model stack)
    from rubric_jax.training.runs import check_writable_directory  # noqa: PLC0415

    overrides = [f"output_dir={args.output_dir}", *args.overrides]
    if args.config:
        config = load_config(QuickstartConfig, args.config, overrides)
    else:
        config = config_from_dict(QuickstartConfig, apply_overrides({}, overrides))
    task = make_task(config.task)
    check_writable_directory(config.output_dir, "output_dir")
    return config, task


def run(checked: tuple[QuickstartConfig, Any], args) -> int:
    run_quickstart(*checked)
    return 0


def run_quickstart(config: QuickstartConfig, task: Any) -> dict[str, Any]:
    """Steps 1-5 of the module docstring on `task` (the config's); returns the report (also written to
    output_dir/report.json)."""
    from rubric_jax.training.evaluate import evaluate_saved_model  # noqa: PLC0415
    from rubric_jax.training.rl import train_rl  # noqa: PLC0415
    from rubric_jax.training.sft import train_sft  # noqa: PLC0415

    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(config, out / "config.yaml")
    rl_config = config.rl_config()
    max_new_tokens = rl_config.rollout.max_new_tokens
    started = time.monotonic()

    print(f"[quickstart] SFT warm start: {config.sft.steps} steps of {config.sft.batch_size} examples", flush=True)
    train_sft(config.sft_config(), task)
    sft_seconds = time.monotonic() - started
    before = evaluate_saved_model(out / "sft" / "model", task, config.eval, max_new_tokens=max_new_tokens,
                                  seed=config.seed)
    print(f"[quickstart] after SFT: accuracy {before['eval/accuracy']:.3f}, rubric score "
          f"{before['eval/rubric_score']:.3f}; RL with {rl_config.algorithm.name}: {config.rl.steps} steps of "
          f"{config.rl.rollout.prompts_per_step} prompts x {config.rl.rollout.group_size} samples", flush=True)
    train_rl(rl_config, task)
    rl_seconds = time.monotonic() - started - sft_seconds
    after = evaluate_saved_model(out / "rl" / "model", task, config.eval, max_new_tokens=max_new_tokens,
                                 seed=config.seed)
    report = {
        "before_rl": before,
        "after_rl": after,
        "improvement": {name: after[name] - before[name] for name in HEADLINE},
        "eval_examples": config.eval.num_examples,
        "seconds": {"sft": sft_seconds, "rl": rl_seconds, "total": time.monotonic() - started},
        "plots": sorted(str(p) for p in out.glob("*/plots/*.png")),
    }
    (out / "report.json").write_text(strict_json.dumps(report, indent=2))
    print(_table(before, after))
    print(f"[quickstart] {report['seconds']['total']:.0f} s; report {out / 'report.json'}, plots in "
          f"{out / 'sft' / 'plots'} and {out / 'rl' / 'plots'}", flush=True)
    return report


def _table(before: dict[str, float], after: dict[str, float]) -> str:
    names = [n for n in before if n in after and not n.startswith(("eval/judge/failed", "eval/srar/"))]
    width = max(len(n) for n in names)
    rows = [f"{'held-out metric':<{width}}  {'after SFT':>9}  {'after RL':>9}  {'change':>8}"]
    rows += [f"{n:<{width}}  {before[n]:9.3f}  {after[n]:9.3f}  {after[n] - before[n]:+8.3f}" for n in names]
    return "\n".join(rows)
