"""The CPU quickstart (`rubric-jax quickstart`): a tiny Qwen3-architecture model learns multi-step arithmetic.

1. a random model with the task's character tokenizer
2. SFT warm start on generated `### Step k:` solutions                      training.sft
3. held-out evaluation of the SFT policy: accuracy and rubric satisfaction    training.evaluate
4. RL with rubric rewards (per-step criteria, the boxed answer and the format, checked by the programmatic
   judge), through the embedded engine                                      training.rl
5. the same evaluation of the RL policy; report.json and plots

Everything is seeded by `seed`; both runs resume from their checkpoints when the command is repeated.
"""

import time
from pathlib import Path
from typing import Any

from rubric_jax import strict_json
from rubric_jax.data.tasks import build_task
from rubric_jax.training.evaluate import evaluate_saved_model
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import QuickstartConfig
from rubric_jax.training.sft import train_sft
from rubric_jax.yaml_config import save_config

HEADLINE = ("eval/accuracy", "eval/rubric_score")


def _table(before: dict[str, float], after: dict[str, float]) -> str:
    names = [n for n in before if n in after and not n.startswith(("eval/judge/failed", "eval/srar/"))]
    width = max(len(n) for n in names)
    rows = [f"{'held-out metric':<{width}}  {'after SFT':>9}  {'after RL':>9}  {'change':>8}"]
    rows += [f"{n:<{width}}  {before[n]:9.3f}  {after[n]:9.3f}  {after[n] - before[n]:+8.3f}" for n in names]
    return "\n".join(rows)


def run_quickstart(config: QuickstartConfig) -> dict[str, Any]:
    """Steps 1-5 of the module docstring; returns the report (also written to output_dir/report.json)."""
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(config, out / "config.yaml")
    task = build_task(config.task.name, config.task.params, config.task.seed)
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
