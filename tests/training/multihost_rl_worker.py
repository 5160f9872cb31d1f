"""One process of the multi-process RL runs of `test_multihost.py`: `train_rl` on the toy task (or, with TASK
`half_tied`, the toy task whose two-step problems have an empty rubric, `test_dynamic_sampling.HalfTiedTask`), whose
judge appends the questions of every call (one JSON list per line) to OUT/questions_<process index>.jsonl.

    python -m tests.training.multihost_rl_worker CONFIG OUT [TASK]
"""

import json
import sys
from pathlib import Path

import jax

from rubric_jax.judges.programmatic import ProgrammaticJudge
from rubric_jax.training import multihost
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import RLConfig
from rubric_jax.yaml_config import load_config
from tests.algorithms.test_dynamic_sampling import HalfTiedTask
from tests.training.toy_task import CHECKS, toy_task


class QuestionLoggingJudge(ProgrammaticJudge):
    def __init__(self, path: Path):
        super().__init__(CHECKS)
        self.path = path

    def judge(self, requests, max_items):
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(json.dumps([request.question for request in requests]) + "\n")
        return super().judge(requests, max_items)


TASKS = {"toy": toy_task, "half_tied": lambda: HalfTiedTask(toy_task().config, 0)}


def main(config: Path, out: Path, task: str = "toy") -> None:
    multihost.initialize(load_config(RLConfig, config).distributed)
    judge = QuestionLoggingJudge(out / f"questions_{jax.process_index()}.jsonl")
    train_rl(load_config(RLConfig, config), TASKS[task](), judge=judge)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:])
