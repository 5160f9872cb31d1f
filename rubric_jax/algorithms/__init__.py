"""One module per paper's recipe, each reading like its paper's algorithm box and composing `rubric_jax.core`
functions; all run through the same trainer.

base.py      the task interface, the rollout context, `Experience`, `PolicyLossConfig`, the `Algorithm` base
             class and the host-side steps recipes compose (sample groups, judge them, metrics).
registry.py  recipes by name (`register`, `algorithm_class`, `names`).
rar.py       RaR: the response-level rubric reward (weighted fraction) with GRPO advantages ("rar").
"""

from rubric_jax.algorithms import rar  # noqa: F401  (registers the recipes)
from rubric_jax.algorithms.registry import algorithm_class, names, register  # noqa: F401
