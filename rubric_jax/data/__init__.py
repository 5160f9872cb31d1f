"""Tasks and data sets.

arithmetic.py  Synthetic multi-step arithmetic for the CPU quickstart: `Problem`s drawn by `ArithmeticConfig`,
               gold `solution_text` in `### Step k:` lines, a resumable train / held-out `ArithmeticDataset`,
               a character tokenizer (`build_tokenizer`), per-problem rubrics (`problem_rubric`) and the
               programmatic judge of their registered checks (`arithmetic_judge`).
tasks.py       tasks by name for configs (`build_task(name, params, seed)`): each implements the recipes' `Task`
               interface plus what the trainer needs (train stream, held-out set, SFT solution, judge, tokenizer).
"""
