"""The shared harness of the papers' comparison scripts (`experiments/<paper>/compare.py`, run from the repository
root as `python -m experiments.<paper>.compare --out DIR`): one SFT cold start, then every variant's RL run from
it with the same seeds, a held-out evaluation of each final policy, a table and plots.

Layout under `out`: sft/ (the cold start; skipped when sft/model exists, so a repeated command resumes), one
directory per variant and seed, `<variant>/seed<k>/` (each an RL run that resumes from its checkpoints),
table.md, results.json and plots/<metric>.png (one curve per variant, the mean over seeds at each step).

Table entries: a key starting with "eval/" is the held-out evaluation of the final policy (`evaluate_saved_model`,
the run's own eval settings); any other key is the mean of its training values over the last fifth of the steps
(at least one step), since single-step training metrics are noisy. With several seeds an entry is "mean ± std"
(population std over seeds). The row "sft" is the cold-start policy, evaluated once.
"""

import argparse
import dataclasses
import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from rubric_jax import strict_json
from rubric_jax.training.evaluate import evaluate_saved_model
from rubric_jax.training.metrics import read_metrics
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import (
    AlgorithmSpec, CheckpointConfig, EvalConfig, LearnerConfig, MetricsConfig, ModelInit, ModelSpec, RLConfig,
    SFTConfig)
from rubric_jax.training.sft import train_sft
from rubric_jax.yaml_config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SMOKE_RL_STEPS, SMOKE_SFT_STEPS, SMOKE_EVAL_EXAMPLES = 1, 2, 4


@dataclasses.dataclass(frozen=True)
class Variant:
    """One row of the comparison: a name and its RL run (model.path, output_dir and seed are the harness's)."""

    name: str
    config: RLConfig
    task: Any = None  # None: the comparison's task


def comparison_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every comparison script takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True, help="output directory (a repeated command resumes in it)")
    parser.add_argument("--steps", type=int, default=None, help="RL steps per variant (default: the configs')")
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT cold-start steps (default: the config's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="RL seeds, the same for every variant")
    parser.add_argument("--eval-examples", type=int, default=None, help="held-out problems (default: the configs')")
    parser.add_argument("--smoke", action="store_true",
                        help=f"a seconds-long check of the script: {SMOKE_SFT_STEPS} SFT steps, {SMOKE_RL_STEPS} RL "
                             f"step, {SMOKE_EVAL_EXAMPLES} eval problems")
    return parser


def load_configs(sft_file: str, rl_file: str, args: argparse.Namespace, *, smoke_max_positions: int = 96,
                 smoke_algorithm_params: Optional[dict] = None) -> tuple[SFTConfig, RLConfig]:
    """The cold start's and the method's configs from configs/; with --smoke, cut to a one-layer model, 2 prompts
    x 4 samples of 16 tokens and one update per step (`smoke_algorithm_params` overrides the recipe's own sizes,
    e.g. a rubricator's token budget), so that the script runs in seconds (the harness cuts the steps)."""
    sft, rl = load_config(SFTConfig, CONFIGS / sft_file), load_config(RLConfig, CONFIGS / rl_file)
    if not args.smoke:
        return sft, rl
    quiet = MetricsConfig(console=False, plots=False)
    model = ModelInit(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                      max_position_embeddings=smoke_max_positions)
    sft = dataclasses.replace(sft, model=ModelSpec(init=model), batch_size=4, metrics=quiet)
    algorithm = AlgorithmSpec(rl.algorithm.name, {**rl.algorithm.params, **(smoke_algorithm_params or {})})
    rl = dataclasses.replace(rl, rollout=dataclasses.replace(rl.rollout, prompts_per_step=2, group_size=4,
                                                             max_new_tokens=16),
                             learner=LearnerConfig(), algorithm=algorithm, metrics=quiet)
    return sft, rl


def eval_samples(args: argparse.Namespace, config: RLConfig) -> int:
    """k of the held-out pass@k: the config's samples per problem, 1 in smoke mode."""
    return 1 if args.smoke else config.eval.samples_per_example


def _sft_config(sft: SFTConfig, out: Path, args: argparse.Namespace) -> SFTConfig:
    steps = SMOKE_SFT_STEPS if args.smoke else args.sft_steps or sft.steps
    return dataclasses.replace(sft, output_dir=str(out / "sft"), steps=steps,
                               checkpoint=dataclasses.replace(sft.checkpoint, every_steps=min(
                                   sft.checkpoint.every_steps, steps)))


def _eval_config(config: EvalConfig, args: argparse.Namespace) -> EvalConfig:
    if args.smoke:
        return dataclasses.replace(config, num_examples=SMOKE_EVAL_EXAMPLES, samples_per_example=1, every_steps=0)
    if args.eval_examples:
        return dataclasses.replace(config, num_examples=args.eval_examples)
    return config


def _rl_config(variant: Variant, model_path: Path, out: Path, seed: int, args: argparse.Namespace) -> RLConfig:
    config = variant.config
    steps = SMOKE_RL_STEPS if args.smoke else args.steps or config.steps
    return dataclasses.replace(
        config, output_dir=str(out / variant.name / f"seed{seed}"), seed=seed, steps=steps,
        model=ModelSpec(path=str(model_path), chat_template_kwargs=config.model.chat_template_kwargs),
        eval=_eval_config(config.eval, args),
        checkpoint=CheckpointConfig(every_steps=min(config.checkpoint.every_steps, steps), keep=1))


def _evaluate(model_dir: Path, task: Any, config: RLConfig, seed: int, extra_eval) -> dict[str, float]:
    metrics = evaluate_saved_model(model_dir, task, config.eval, max_new_tokens=config.rollout.max_new_tokens,
                                 seed=seed, chat_template_kwargs=config.model.chat_template_kwargs)
    if extra_eval is not None:
        metrics.update(extra_eval(model_dir, task, config, seed))
    return metrics


def _tail_mean(lines: list[dict], key: str) -> float:
    values = [line[key] for line in lines if line.get(key) is not None]
    if not values:
        return math.nan
    tail = values[-max(1, len(values) // 5):]
    return float(np.mean(tail))


def _cell(values: Sequence[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.mean(values):.3f} ± {np.std(values):.3f}"


def _plot(out: Path, curves: dict[str, dict[str, list[dict]]], keys: Sequence[str], title: str) -> list[Path]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    written = []
    (out / "plots").mkdir(parents=True, exist_ok=True)
    for key in keys:
        figure = Figure(figsize=(6, 4))
        axes = figure.add_subplot()
        drawn = False
        for name, runs in curves.items():
            by_step: dict[int, list[float]] = {}
            for lines in runs.values():
                for line in lines:
                    if line.get(key) is not None:
                        by_step.setdefault(line["step"], []).append(line[key])
            if by_step:
                steps = sorted(by_step)
                axes.plot(steps, [np.mean(by_step[s]) for s in steps], marker="." if len(steps) < 30 else None,
                          label=name)
                drawn = True
        if not drawn:
            continue
        axes.set_xlabel("step")
        axes.set_ylabel(key)
        axes.set_title(f"{title}: {key}", fontsize=9)
        axes.legend(fontsize=7)
        path = out / "plots" / (key.replace("/", "_") + ".png")
        FigureCanvasAgg(figure).print_png(str(path))
        written.append(path)
    return written


def run_comparison(
    out_dir: str,
    *,
    args: argparse.Namespace,
    task: Any,
    sft: Optional[SFTConfig],
    variants: Sequence[Variant],
    table_keys: Sequence[str],
    curve_keys: Sequence[str],
    title: str,
    sft_task: Any = None,
    model_path: Optional[str] = None,
    extra_eval: Optional[Callable[[Path, Any, RLConfig, int], dict[str, float]]] = None,
) -> dict[str, dict[str, Any]]:
    """Runs the comparison (module docstring) and returns results.json's content: per row, {key: [value per
    seed]}. The cold start is `sft` on `sft_task` (default `task`), or, with sft None, the policy at
    `model_path`. `args` is `comparison_parser`'s namespace (steps, seeds, smoke). `extra_eval(model_dir, task,
    config, seed)` adds a paper's own held-out "eval/..." metrics (RLCER's hints, RGR-GRPO's test-time
    refinement) to every row's evaluation."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = [v.name for v in variants]
    if len(set(names)) != len(names) or "sft" in names:
        raise ValueError(f"variant names must be unique and not 'sft': {names}")
    if sft is not None:
        sft_config = _sft_config(sft, out, args)
        if not (out / "sft" / "model").exists():
            print(f"[{title}] SFT cold start: {sft_config.steps} steps", flush=True)
            train_sft(sft_config, sft_task if sft_task is not None else task)
        model = out / "sft" / "model"
    elif model_path is not None:
        model = Path(model_path)
    else:
        raise ValueError("give an SFT config or a model_path")

    first = _rl_config(variants[0], model, out, args.seeds[0], args)
    eval_keys = [k for k in table_keys if k.startswith("eval/")]
    results: dict[str, dict[str, list[float]]] = {}
    evaluated = _evaluate(model, task, first, args.seeds[0], extra_eval)
    results["sft"] = {k: [evaluated.get(k, math.nan)] for k in eval_keys}
    curves: dict[str, dict[str, list[dict]]] = {}
    for variant in variants:
        results[variant.name] = {k: [] for k in table_keys}
        curves[variant.name] = {}
        for seed in args.seeds:
            config = _rl_config(variant, model, out, seed, args)
            run_task = variant.task if variant.task is not None else task
            print(f"[{title}] {variant.name}, seed {seed}: {config.steps} steps", flush=True)
            train_rl(config, run_task)
            lines = read_metrics(Path(config.output_dir) / "metrics.jsonl")
            curves[variant.name][f"seed{seed}"] = lines
            evaluated = _evaluate(Path(config.output_dir) / "model", run_task, config, seed, extra_eval)
            for key in table_keys:
                value = evaluated.get(key, math.nan) if key.startswith("eval/") else _tail_mean(lines, key)
                results[variant.name][key].append(value)

    header = "| " + " | ".join(["variant", *table_keys]) + " |"
    rows = [header, "|" + "---|" * (len(table_keys) + 1)]
    for name, row in results.items():
        rows.append("| " + " | ".join([name, *(_cell(row.get(k, [])) for k in table_keys)]) + " |")
    table = f"# {title}\n\nSeeds {args.seeds}; eval/* on held-out problems after training, other columns the mean " \
            f"of the last fifth of training steps.\n\n" + "\n".join(rows) + "\n"
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(strict_json.dumps(results, indent=2))
    _plot(out, curves, curve_keys, title)
    print(table, flush=True)
    return results
