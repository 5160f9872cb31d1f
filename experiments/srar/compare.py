"""SRaR against RaR and outcome-only GRPO, and SRaR's ablations, on the arithmetic task with its typed rubric,
on a CPU (srar.txt, Table 1's comparison, Table 9's rubric-aspect and Table 10's design ablations).

    python -m experiments.srar.compare --out runs/compare_srar [--steps 120] [--seeds 0 1 2]

One SFT cold start (configs/sft_arithmetic.yaml), then, from it and with the same seeds, rollouts, learner,
optimizer, policy loss (the authors' dual-clip PPO, 0.2 / 0.28, c = 10) and held-out evaluation
(configs/srar_cpu.yaml, task arithmetic_srar), one RL run per variant:

  srar               the paper's recipe: typed items attributed to steps, per-step normalisation, decoupled advantage
  srar_no_step_norm  ablation "w/o step norm.": the raw per-step rubric rewards on the tokens
  srar_merged        ablation "w/o decoupled adv.": one RaR-style scalar r_base + rubric, normalised, on scored steps
  srar_suggest_only  ablation (Table 9): PITFALL and BONUS items removed from the rubric
  rar_typed          RaR as the authors ran it (`compute_rar_advantage`): GRPO of r_base + the sum of the same
                     typed deltas, on every response token (srar advantage "rar")
  rar                RaR: the response-level weighted fraction of the same rubric (a PITFALL item met when
                     avoided, `core.rewards.typed_item_credit`) with GRPO advantages
  grpo               outcome-only GRPO: reward 1 for a correct answer

Table: held-out accuracy (avg@k) and pass@k, the per-type rubric scores (Figure 6), the looping rate (Table 3's
four criteria), step accuracy and the Faithful Reasoning Rate (Table 2; the task's programmatic step labels), all
under eval/srar/ from the evaluation of each final policy. Curves: training accuracy, the SUGGEST and PITFALL
scores and the looping rate over steps (SRaR's variants log them), response length.
Writes out/table.md, out/results.json and out/plots/ (`experiments.comparison`).
"""

import dataclasses
from typing import Optional, Sequence

from experiments.comparison import Variant, comparison_parser, eval_samples, load_configs, run_comparison
from rubric_jax.training.assembly import make_task
from rubric_jax.training.run_config import AlgorithmSpec, RLConfig

TITLE = "SRaR vs RaR, outcome-only GRPO and its ablations (arithmetic, CPU)"
ANALYSIS_KEYS = ["eval/srar/score/suggest", "eval/srar/score/pitfall", "eval/srar/score/bonus",
                 "eval/srar/looping_rate", "eval/srar/step_accuracy", "eval/srar/frr"]
CURVE_KEYS = ["outcome/accuracy", "srar/score/suggest", "srar/score/pitfall", "srar/looping_rate",
              "response/length_mean"]


def variants(base: RLConfig) -> list[Variant]:
    """The rows of the comparison: `base` (the SRaR run) with only its algorithm changed; every recipe trains with
    SRaR's policy loss, as the paper trains every method in one setting except the reward."""
    params = base.algorithm.params

    def run(name: str, algorithm_params: dict) -> RLConfig:
        return dataclasses.replace(base, algorithm=AlgorithmSpec(name, algorithm_params))

    shared = {"policy_loss": params["policy_loss"]}
    return [
        Variant("srar", base),
        Variant("srar_no_step_norm", run("srar", {**params, "step_normalization": False})),
        Variant("srar_merged", run("srar", {**params, "advantage": "merged"})),
        Variant("srar_suggest_only", run("srar", {**params, "rubric": "suggest_only"})),
        Variant("rar_typed", run("srar", {**params, "advantage": "rar"})),
        Variant("rar", run("rar", {**shared, "max_items": params["max_items"]})),
        Variant("grpo", run("grpo", shared)),
    ]


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = comparison_parser(TITLE).parse_args(argv)
    sft, base = load_configs("sft_arithmetic.yaml", "srar_cpu.yaml", args)
    task = make_task(base.task)
    k = eval_samples(args, base)
    return run_comparison(
        args.out, args=args, task=task, sft=sft, variants=variants(base),
        table_keys=["eval/accuracy", f"eval/pass@{k}", *ANALYSIS_KEYS], curve_keys=CURVE_KEYS, title=TITLE)


if __name__ == "__main__":
    main()
