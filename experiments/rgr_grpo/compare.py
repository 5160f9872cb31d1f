"""RGR-GRPO against its baselines and the paper's ablations (rgr_grpo.txt, Tables 1-2) on RGR's arithmetic world,
on a CPU.

    python -m experiments.rgr_grpo.compare --out runs/compare_rgr_grpo [--steps 120] [--seeds 0 1 2]

One SFT cold start (configs/sft_arithmetic_rgr.yaml: step-format solutions, and refinements of corrupted attempts
on the criteria they fail), then, from it and with the same seeds, rollouts, learner, optimizer and held-out
evaluation (configs/rgr_grpo_cpu.yaml), one RL run per variant on task arithmetic_rgr with two-digit operands
(where the cold start rarely solves a problem alone but often refines one: `rubric_jax.data.arithmetic_rgr`):

  rgr_grpo             the paper's recipe: gated factual / process reward, exploration assessment, refinement of
                       each unsolved group's best rollout as its 8th, off-policy rollout, shaped mixed-policy loss
  rubric_grpo          Rubric-GRPO: the same reward and loss, every rollout on-policy (refine: false)
  rgr_grpo_no_ea       w/o EA: every group refined, solved or not
  rgr_grpo_no_shaping  w/o Shaping: the refinement trained with the on-policy term -r A
  rgr_grpo_fact_only   Fact-Only Rubrics: the reward, the assessment and the refinement see factual criteria only
  grpo                 Outcome-GRPO: reward 1 for a correct answer, GRPO advantages, PPO clip (configs/grpo_cpu.yaml)

Table: held-out accuracy (avg@4 and pass@4 at temperature 1), rubric score, and over the last fifth of training
the off-policy mixture ratio (groups refined), how often a refinement beat its attempt, the solved-group
fraction and the policy's entropy (Figures 4 and 6). A second table measures rubric-guided self-refinement at
test time (section 5.2, Figure 8) on every final policy and the cold start: greedy accuracy on held-out
problems before and after one refinement round on the criteria each response fails (`refine_at_test_time`).
Writes out/table.md, out/results.json (the refinement keys included) and out/plots/ (`experiments.comparison`).
"""

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from experiments.comparison import SMOKE_EVAL_EXAMPLES, Variant, comparison_parser, run_comparison
from rubric_jax.algorithms.rgr_grpo import refine_at_test_time
from rubric_jax.data.tasks import build_task
from rubric_jax.inference.embedded import EmbeddedEngine
from rubric_jax.models.safetensors_io import load_hf_checkpoint
from rubric_jax.models.tokenizer import load_tokenizer
from rubric_jax.training import policy
from rubric_jax.training.config import load_config
from rubric_jax.training.run_config import (
    AlgorithmSpec, LearnerConfig, MetricsConfig, ModelInit, ModelSpec, RLConfig, SFTConfig)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TITLE = "RGR-GRPO vs baselines and ablations (arithmetic, CPU)"
REFINE_KEYS = ("refine/accuracy_before", "refine/accuracy_after", "refine/refined_fraction")
# Room for the longest refinement prompt (arithmetic_rgr.REFINEMENT_PROMPT_TOKENS) and a 64-token answer.
SMOKE_MODEL = ModelInit(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                        max_position_embeddings=320)


def variants(base: RLConfig) -> list[Variant]:
    """The rows of the comparison: `base` (the RGR-GRPO run) with only its algorithm changed."""
    params = base.algorithm.params

    def rgr(**changes) -> RLConfig:
        return dataclasses.replace(base, algorithm=AlgorithmSpec("rgr_grpo", {**params, **changes}))

    grpo = load_config(RLConfig, CONFIGS / "grpo_cpu.yaml").algorithm
    return [
        Variant("rgr_grpo", base),
        Variant("rubric_grpo", rgr(refine=False)),
        Variant("rgr_grpo_no_ea", rgr(exploration_assessment=False)),
        Variant("rgr_grpo_no_shaping", rgr(shaping=False)),
        Variant("rgr_grpo_fact_only", rgr(criteria="factual")),
        Variant("grpo", dataclasses.replace(base, algorithm=grpo)),
    ]


def smoke_configs(sft: SFTConfig, rl: RLConfig) -> tuple[SFTConfig, RLConfig]:
    """A tiny model, batch and response length, so that --smoke runs in seconds (the harness cuts the steps)."""
    sft = dataclasses.replace(sft, model=ModelSpec(init=SMOKE_MODEL), batch_size=4,
                              metrics=MetricsConfig(console=False, plots=False))
    rl = dataclasses.replace(rl, rollout=dataclasses.replace(rl.rollout, prompts_per_step=2, group_size=4,
                                                             max_new_tokens=16),
                             learner=LearnerConfig(), metrics=MetricsConfig(console=False, plots=False))
    return sft, rl


def test_time_refinement(model_dir: Path, task: Any, examples: Sequence[Any], *, max_new_tokens: int,
                         seed: int) -> dict[str, float]:
    """`refine_at_test_time` of the policy saved in `model_dir`, greedy, on `examples`."""
    model, tokenizer = load_hf_checkpoint(model_dir), load_tokenizer(model_dir)
    eos_ids, pad_id = policy.eos_and_pad(tokenizer)
    engine = EmbeddedEngine(model, tokenizer=tokenizer, eos_token_ids=eos_ids, pad_id=pad_id, seed=seed)
    return refine_at_test_time(engine, tokenizer, task, task.judge(), examples, max_new_tokens=max_new_tokens,
                               seed=seed)


def _cell(values: Sequence[float]) -> str:
    return f"{values[0]:.3f}" if len(values) == 1 else f"{np.mean(values):.3f} ± {np.std(values):.3f}"


def add_test_time_refinement(out: Path, results: dict, task: Any, examples: Sequence[Any], max_new_tokens: int,
                             seeds: Sequence[int]) -> None:
    """Measures test-time refinement of the cold start and of every variant's final policies on `examples`, adds
    the REFINE_KEYS to `results` and to results.json's rows, and a table to table.md."""
    saved = json.loads((out / "results.json").read_text())
    for name, row in results.items():
        directories = [out / "sft" / "model"] if name == "sft" else [out / name / f"seed{s}" / "model" for s in seeds]
        measured = [test_time_refinement(d, task, examples, max_new_tokens=max_new_tokens, seed=seeds[0])
                    for d in directories]
        for key in REFINE_KEYS:
            row[key] = saved[name][key] = [m[key] for m in measured]
    (out / "results.json").write_text(json.dumps(saved, indent=2))
    lines = ["| variant | " + " | ".join(REFINE_KEYS) + " |", "|" + "---|" * (len(REFINE_KEYS) + 1)]
    lines += [f"| {name} | " + " | ".join(_cell(row[key]) for key in REFINE_KEYS) + " |"
              for name, row in results.items()]
    with (out / "table.md").open("a") as table:
        table.write(f"\n## Rubric-guided self-refinement at test time (greedy, {len(examples)} held-out problems)"
                    "\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = comparison_parser(TITLE).parse_args(argv)
    sft = load_config(SFTConfig, CONFIGS / "sft_arithmetic_rgr.yaml")
    base = load_config(RLConfig, CONFIGS / "rgr_grpo_cpu.yaml")
    if args.smoke:
        sft, base = smoke_configs(sft, base)
    task = build_task(base.task.name, base.task.params, base.task.seed)
    sft_task = build_task(sft.task.name, sft.task.params, sft.task.seed)
    k = 1 if args.smoke else base.eval.samples_per_example  # the harness evaluates one sample per problem in smoke
    results = run_comparison(
        args.out, args=args, task=task, sft=sft, sft_task=sft_task, variants=variants(base),
        table_keys=["eval/accuracy", f"eval/pass@{k}", "eval/rubric_score", "rgr/off_policy_fraction",
                    "rgr/refined_better_fraction", "rgr/solved_group_fraction", "train/entropy"],
        curve_keys=["eval/accuracy", f"eval/pass@{k}", "reward/mean", "rgr/off_policy_fraction",
                    "rgr/solved_group_fraction", "train/entropy"],
        title=TITLE)
    count = SMOKE_EVAL_EXAMPLES if args.smoke else args.eval_examples or base.eval.num_examples
    add_test_time_refinement(Path(args.out), results, task, task.eval_examples(count), base.rollout.max_new_tokens,
                             args.seeds)
    return results


if __name__ == "__main__":
    main()
