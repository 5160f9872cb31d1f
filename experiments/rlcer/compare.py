"""RLCER against outcome-only GRPO and the paper's ablations in the rubric world, on a CPU (rlcer.txt: Table 1's
RLCER vs RLVR, Figure 5's Rubric Only, Figures 1 and 6's w/o evolving, Figure 7's rubrics as in-prompt hints).

    python -m experiments.rlcer.compare --out runs/compare_rlcer [--steps 120] [--seeds 0 1 2]

One SFT cold start (configs/sft_rubric_world.yaml: step-format solutions and "+3 S1" rubric lines), then, from it
and with the same seeds, rollouts, learner, optimizer and held-out evaluation (configs/rlcer_cpu.yaml, task
arithmetic_rubrics, the world's programmatic verifier), one RL run per variant:

  rlcer                    the paper's recipe: reasoner reward = +-1 outcome + CoT reward from the valid rubrics;
                           rubricator reward = valid fraction + format
  grpo                     RLVR: outcome-only GRPO (configs/grpo_cpu.yaml's algorithm), no rubricator
  rlcer_rubric_only        RQ1's "Rubric Only": the reasoner rewarded by the CoT reward alone
  rlcer_wo_evolving        RQ3's "w/o evolving" (section 5.4): the rubricator rewarded for its format only
  rlcer_frozen_rubricator  the rubricator not trained at all (its rows left out of the update)
  rlcer_penalty_as_written eq 7 as written: a penalty rubric valid when its flaw comes with right answers (the
                           recipe's default validates it by the absence of its flaw, docs/fidelity/rlcer.md)

Table: held-out accuracy (avg@k) and pass@k, and over the last fifth of training corr(u_k, z), the valid
fraction, the CoT reward, the rubricator's format rate and the training accuracy; then RQ4: held-out accuracy and
pass@k of every final policy and the cold start without and with its own rubric as an in-prompt hint
(`rubric_jax.algorithms.rlcer_eval.hint_evaluation`: the policy answers, its rubricator writes a rubric for that
answer, the policy answers again with the rubric appended; the harness's extra_eval). Curves: corr, valid
fraction and CoT reward (Figure 6), training accuracy and reward. Writes out/table.md, out/results.json and
out/plots/ (`experiments.comparison`).
"""

import dataclasses
import functools
from pathlib import Path
from typing import Any, Optional, Sequence

from experiments.comparison import CONFIGS, Variant, comparison_parser, eval_samples, load_configs, run_comparison
from rubric_jax.algorithms.rlcer import RLCERConfig, rubricator_io
from rubric_jax.algorithms.rlcer_eval import hint_evaluation
from rubric_jax.training.assembly import make_task, saved_model_engine
from rubric_jax.training.run_config import AlgorithmSpec, RLConfig
from rubric_jax.yaml_config import config_from_dict, load_config

TITLE = "RLCER vs outcome-only GRPO and its ablations (rubric world, CPU)"
RLCER_KEYS = ["rlcer/corr_mean", "rlcer/valid_fraction", "rlcer/cot_reward_mean", "rlcer/rubricator_format_rate"]


def variants(base: RLConfig) -> list[Variant]:
    """The rows of the comparison: `base` (the RLCER run) with only its algorithm changed."""
    params = base.algorithm.params

    def rlcer(**changes) -> RLConfig:
        return dataclasses.replace(base, algorithm=AlgorithmSpec("rlcer", {**params, **changes}))

    grpo = load_config(RLConfig, CONFIGS / "grpo_cpu.yaml").algorithm
    return [
        Variant("rlcer", base),
        Variant("grpo", dataclasses.replace(base, algorithm=grpo)),
        Variant("rlcer_rubric_only", rlcer(reasoner_reward="cot_only")),
        Variant("rlcer_wo_evolving", rlcer(rubricator_training="format_only")),
        Variant("rlcer_frozen_rubricator", rlcer(rubricator_training="frozen")),
        Variant("rlcer_penalty_as_written", rlcer(penalty_validity="as_written")),
    ]


def hint_eval(model_dir: Path, task: Any, config: RLConfig, seed: int, *, rlcer_params: dict) -> dict[str, float]:
    """`hint_evaluation` of the policy saved in `model_dir` on the run's held-out problems, with its lengths,
    eval temperature and samples, and the rubricator settings `rlcer_params` of the RLCER config (the same for
    every row, outcome-only GRPO's included): the harness's extra_eval."""
    engine, tokenizer = saved_model_engine(model_dir, seed=seed, chat_template_kwargs=config.model.chat_template_kwargs)
    return hint_evaluation(engine, tokenizer, task, task.eval_examples(config.eval.num_examples),
                           samples_per_example=config.eval.samples_per_example, temperature=config.eval.temperature,
                           max_new_tokens=config.rollout.max_new_tokens,
                           rubricator_max_new_tokens=rlcer_params["rubricator_max_new_tokens"],
                           rubricator=rubricator_io(task, config_from_dict(RLCERConfig, rlcer_params)), seed=seed)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = comparison_parser(TITLE).parse_args(argv)
    sft, base = load_configs("sft_rubric_world.yaml", "rlcer_cpu.yaml", args, smoke_max_positions=256,
                                 smoke_algorithm_params={"rubricator_max_new_tokens": 8})
    task = make_task(base.task)
    sft_task = make_task(sft.task)
    k = eval_samples(args, base)
    hint_keys = ["eval/no_hint_accuracy", "eval/hint_accuracy", f"eval/no_hint_pass@{k}", f"eval/hint_pass@{k}",
                 "eval/hint_rubric_format_rate"]
    return run_comparison(
        args.out, args=args, task=task, sft=sft, sft_task=sft_task, variants=variants(base),
        table_keys=["eval/accuracy", f"eval/pass@{k}", *RLCER_KEYS, "outcome/accuracy", *hint_keys],
        curve_keys=[*RLCER_KEYS, "outcome/accuracy", "reward/mean", "eval/accuracy"],
        title=TITLE, extra_eval=functools.partial(hint_eval, rlcer_params=base.algorithm.params))

if __name__ == "__main__":
    main()
