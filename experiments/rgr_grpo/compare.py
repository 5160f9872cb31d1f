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
fraction and the policy's entropy (Figures 4 and 6). Columns eval/refine/* measure rubric-guided
self-refinement at test time (section 5.2, Figure 8) on every final policy and the cold start: greedy accuracy on
held-out problems before and after one refinement round on the criteria each response fails
(`refine_at_test_time`). Writes out/table.md, out/results.json and out/plots/ (`experiments.comparison`).
"""

import dataclasses
from pathlib import Path
from typing import Any, Optional, Sequence

from experiments.comparison import CONFIGS, Variant, comparison_parser, eval_samples, load_configs, run_comparison
from rubric_jax.algorithms.rgr_grpo import refine_at_test_time
from rubric_jax.training.assembly import make_task, saved_model_engine
from rubric_jax.training.run_config import AlgorithmSpec, RLConfig
from rubric_jax.yaml_config import load_config

TITLE = "RGR-GRPO vs baselines and ablations (arithmetic, CPU)"
REFINE_KEYS = ("eval/refine/accuracy_before", "eval/refine/accuracy_after", "eval/refine/refined_fraction")


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


def test_time_refinement(model_dir: Path, task: Any, config: RLConfig, seed: int) -> dict[str, float]:
    """`refine_at_test_time` of the policy saved in `model_dir`, greedy, on the run's held-out problems, as
    "eval/refine/..." metrics: the harness's extra_eval."""
    engine, tokenizer = saved_model_engine(model_dir, seed=seed, chat_template_kwargs=config.model.chat_template_kwargs)
    measured = refine_at_test_time(engine, tokenizer, task, task.judge(), task.eval_examples(config.eval.num_examples),
                                   max_new_tokens=config.rollout.max_new_tokens, seed=seed)
    return {f"eval/{key}": value for key, value in measured.items()}


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = comparison_parser(TITLE).parse_args(argv)
    # Room for the longest refinement prompt (arithmetic_rgr.REFINEMENT_PROMPT_TOKENS) and a 64-token answer.
    sft, base = load_configs("sft_arithmetic_rgr.yaml", "rgr_grpo_cpu.yaml", args, smoke_max_positions=320)
    task = make_task(base.task)
    sft_task = make_task(sft.task)
    k = eval_samples(args, base)
    return run_comparison(
        args.out, args=args, task=task, sft=sft, sft_task=sft_task, variants=variants(base),
        table_keys=["eval/accuracy", f"eval/pass@{k}", "eval/rubric_score", *REFINE_KEYS, "rgr/off_policy_fraction",
                    "rgr/refined_better_fraction", "rgr/solved_group_fraction", "train/entropy"],
        curve_keys=["eval/accuracy", f"eval/pass@{k}", "reward/mean", "rgr/off_policy_fraction",
                    "rgr/solved_group_fraction", "train/entropy"],
        title=TITLE, extra_eval=test_time_refinement)


if __name__ == "__main__":
    main()
