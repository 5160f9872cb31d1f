"""Rubric-grounded GRPO against its baselines and two of its ablations on the arithmetic task, on a CPU.

    python -m experiments.rubric_grounded.compare --out runs/compare_rubric_grounded [--steps 120] [--seeds 0 1 2]

One SFT cold start (configs/sft_arithmetic.yaml), then, from it and with the same seeds, rollouts, learner,
optimizer and held-out evaluation (configs/rubric_grounded_cpu.yaml), one RL run per variant:

  rubric_grounded             the paper's recipe: weighted criteria judged against the grounding (the gold
                              solution), reward clipped to [0, 1], LOO baseline with the others' std, k3 KL
  rubric_grounded_group_mean  ablation: GRPO's group-mean baseline and group std instead of eqs 4-6's LOO
  rubric_grounded_no_std      ablation: the LOO baseline without the std normalisation (RLOO)
  rar                         RaR: the same rubric reward with GRPO advantages and no KL (configs/rar_arithmetic.yaml)
  grpo                        outcome-only GRPO: reward 1 for a correct answer (configs/grpo_cpu.yaml)

The task's judge is programmatic and always reads the gold solution, so the paper's central contrast, a judge
with and without the grounding passage, has no counterpart here; the rubric's reward is already in [0, 1], so
"no reward clipping" would change nothing. The ablations are those that change something on this task.
Writes out/table.md, out/results.json and out/plots/ (`experiments.comparison`).
"""

import dataclasses
from typing import Optional, Sequence

from experiments.comparison import CONFIGS, Variant, comparison_parser, eval_samples, load_configs, run_comparison
from rubric_jax.training.assembly import make_task
from rubric_jax.training.run_config import AlgorithmSpec, RLConfig
from rubric_jax.yaml_config import load_config

TITLE = "rubric-grounded GRPO vs baselines (arithmetic, CPU)"


def variants(base: RLConfig) -> list[Variant]:
    """The rows of the comparison: `base` (the rubric-grounded run) with only its algorithm changed."""
    grounded = base.algorithm.params

    def run(algorithm: AlgorithmSpec) -> RLConfig:
        return dataclasses.replace(base, algorithm=algorithm)

    def algorithm_of(config_file: str) -> AlgorithmSpec:
        return load_config(RLConfig, CONFIGS / config_file).algorithm

    return [
        Variant("rubric_grounded", base),
        Variant("rubric_grounded_group_mean",
                run(AlgorithmSpec("rubric_grounded", {**grounded, "baseline": "group_mean"}))),
        Variant("rubric_grounded_no_std", run(AlgorithmSpec("rubric_grounded", {**grounded, "scale_by_std": False}))),
        Variant("rar", run(algorithm_of("rar_arithmetic.yaml"))),
        Variant("grpo", run(algorithm_of("grpo_cpu.yaml"))),
    ]


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = comparison_parser(TITLE).parse_args(argv)
    sft, base = load_configs("sft_arithmetic.yaml", "rubric_grounded_cpu.yaml", args)
    task = make_task(base.task)
    k = eval_samples(args, base)
    return run_comparison(
        args.out, args=args, task=task, sft=sft, variants=variants(base),
        table_keys=["eval/accuracy", f"eval/pass@{k}", "eval/rubric_score", "reward/mean", "outcome/accuracy"],
        curve_keys=["reward/mean", "eval/accuracy", "train/entropy"], title=TITLE)


if __name__ == "__main__":
    main()
