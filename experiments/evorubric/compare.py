"""EvoRubric against a static base rubric and the paper's ablations in the rubric world, on a CPU (evorubric.txt:
Table 1's EvoRubric vs Static Rubric-RL, Table 2's ablations, Figure 3(a)'s training curves).

    python -m experiments.evorubric.compare --out runs/compare_evorubric [--steps 120] [--seeds 0 1 2]

One SFT cold start (configs/sft_rubric_world.yaml: step-format solutions and "+3 S1" rubric lines, generator
examples included), then, from it and with the same seeds, rollouts, learner, optimizer and held-out evaluation
(configs/evorubric_cpu.yaml: task arithmetic_rubrics with the coarse base rubric, answer and format only; the
world's programmatic grader and meta-verifier), one RL run per variant:

  evorubric                       the paper's recipe (reasoner + rubric generator, meta-verifier, zero-variance
                                  pruning, LOO peer consensus, memory pool)
  rar                             Static Rubric-RL: RaR on the coarse base rubric alone, no generator
  evorubric_wo_meta_verifier      Table 2 (1): no rule-level audit, r_meta left out
  evorubric_wo_memory_pool        Table 2 (2): nothing archived across steps (transient rubrics)
  evorubric_wo_peer_consensus     Table 2 (3): rho~ left out of the generator reward
  evorubric_wo_discriminative     Table 2 (4): no variance filter, r_disc left out
  evorubric_external              Table 2 (5), "External Evolving-RL": the generator is the frozen initial model
                                  (the trainer's frozen engine), proposing but never trained or updated

Table: held-out accuracy (avg@k) and pass@k, the base rubric's held-out score, and over the last fifth of
training the consensus rho, the pruned and meta-rejected fractions, the pool size, the generator's format rate
and the training accuracy. Curves: training accuracy and reward, consensus, pool size, generator reward, held-out
accuracy. Writes out/table.md, out/results.json and out/plots/ (`experiments.comparison`).
"""

import dataclasses
from typing import Optional, Sequence

from experiments.comparison import Variant, comparison_parser, eval_samples, load_configs, run_comparison
from rubric_jax.training.assembly import make_task
from rubric_jax.training.run_config import AlgorithmSpec, RLConfig

TITLE = "EvoRubric vs a static base rubric and its ablations (rubric world, CPU)"
EVORUBRIC_KEYS = ["evorubric/consensus_rho_mean", "evorubric/pruned_fraction", "evorubric/meta_rejected_fraction",
                  "evorubric/pool_size", "evorubric/generator_format_rate"]
ABLATIONS = {
    "evorubric_wo_meta_verifier": {"meta_verifier": False},
    "evorubric_wo_memory_pool": {"memory_pool": False},
    "evorubric_wo_peer_consensus": {"peer_consensus": False},
    "evorubric_wo_discriminative": {"discriminative": False},
    "evorubric_external": {"train_generator": False},
}


def variants(base: RLConfig) -> list[Variant]:
    """The rows of the comparison: `base` (the EvoRubric run) with only its algorithm changed; RaR keeps the
    same policy loss and judge-failure policy."""
    params = base.algorithm.params

    def evorubric(**changes) -> RLConfig:
        return dataclasses.replace(base, algorithm=AlgorithmSpec("evorubric", {**params, **changes}))

    rar = AlgorithmSpec("rar", {"max_items": 8, "on_judge_failure": params["on_judge_failure"],
                                "policy_loss": params["policy_loss"]})
    return [Variant("evorubric", base), Variant("rar", dataclasses.replace(base, algorithm=rar)),
            *(Variant(name, evorubric(**changes)) for name, changes in ABLATIONS.items())]


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = comparison_parser(TITLE).parse_args(argv)
    sft, base = load_configs("sft_rubric_world.yaml", "evorubric_cpu.yaml", args, smoke_max_positions=320,
                                 smoke_algorithm_params={"generator_group_size": 2, "generator_max_new_tokens": 8})
    task = make_task(base.task)
    sft_task = make_task(sft.task)
    k = eval_samples(args, base)
    return run_comparison(
        args.out, args=args, task=task, sft=sft, sft_task=sft_task, variants=variants(base),
        table_keys=["eval/accuracy", f"eval/pass@{k}", "eval/rubric_score", *EVORUBRIC_KEYS, "outcome/accuracy"],
        curve_keys=["outcome/accuracy", "reward/mean", "evorubric/consensus_rho_mean", "evorubric/pool_size",
                    "generator/reward/mean", "eval/accuracy"],
        title=TITLE)


if __name__ == "__main__":
    main()
