"""One module per paper's recipe, each reading like its paper's algorithm box and composing `rubric_jax.core`
functions; all run through the same trainer.

base.py             the task interface, the rollout context, `Experience`, `PolicyLossConfig`, the `Algorithm`
                    base class, the host-side steps recipes compose (sample groups, merge roles' rows, judge
                    them, metrics) and `GroupRecipe`, the response-level recipes' shared algorithm box, whose
                    steps (draw, reward, informative, advantage, metrics) a variant overrides one at a time.
registry.py         recipes by name (`register`, `algorithm_class`, `names`) and their evaluation analyses
                    (`register(name, eval_metrics=fn)`, `eval_metrics_fn`); a user's own recipe modules from a
                    run config's `algorithm.imports` (`import_recipe_modules`; docs/extending.md).
rubric_grounded.py  rubric-grounded GRPO: the judge sees the grounding, weighted criteria, LOO baseline, k3 KL.
srar.py             SRaR: step-attributed typed rubric items, step-wise normalisation, decoupled advantage.
rlcer.py            RLCER: reasoner and rubricator roles, validity by correlation (rlcer_eval.py: RQ4's hints).
evorubric.py        EvoRubric: reasoner and generator roles, meta-verifier, pruning, consensus, memory pool.
rgr_grpo.py         RGR-GRPO: factual gating, self-refinement of the best rollout, mixed-policy loss.
grpo.py, dapo.py    the outcome-only baselines: GRPO (RLVR); DAPO (clip-higher, dynamic sampling, overlong).
rar.py              RaR: the response-level rubric reward (weighted fraction) with GRPO advantages.
"""

from rubric_jax.algorithms import (  # noqa: F401  (importing a recipe registers it)
    dapo, evorubric, grpo, rar, rgr_grpo, rlcer, rubric_grounded, srar)
from rubric_jax.algorithms.registry import algorithm_class, names, register  # noqa: F401
