"""One process of the multi-process RL run of `test_multihost.py`: `train_rl` on the toy task, whose judge
appends the questions of every call (one JSON list per line) to OUT/questions_<process index>.jsonl.

    python -m tests.training.multihost_rl_worker CONFIG OUT
"""

import json
import sys
from pathlib import Path

import jax

from rubric_jax.judges.programmatic import ProgrammaticJudge
from rubric_jax.models import sharding
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import RLConfig
from rubric_jax.yaml_config import load_config
from tests.training.toy_task import CHECKS, toy_task


class QuestionLoggingJudge(ProgrammaticJudge):
    def __init__(self, path: Path):
        super().__init__(CHECKS)
        self.path = path

    def judge(self, requests, max_items):
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(json.dumps([request.question for request in requests]) + "\n")
        return super().judge(requests, max_items)


def main(config: Path, out: Path) -> None:
    sharding.maybe_initialize_distributed()
    judge = QuestionLoggingJudge(out / f"questions_{jax.process_index()}.jsonl")
    train_rl(load_config(RLConfig, config), toy_task(), judge=judge)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
