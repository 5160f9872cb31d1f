"""Tasks and data sets.

arithmetic.py  Synthetic multi-step arithmetic for the CPU quickstart: `Problem`s drawn by `ArithmeticConfig`,
               gold `solution_text` in `### Step k:` lines, a resumable train / held-out `ArithmeticDataset`,
               a character tokenizer (`build_tokenizer`), per-problem rubrics (`problem_rubric`) and the
               programmatic judge of their registered checks (`arithmetic_judge`).
dataset.py     task "dataset": local files (JSONL, JSON, Parquet, CSV, save_to_disk) through Hugging Face
               `datasets`, memory-mapped, their columns mapped onto the Task interface; bad rows named or skipped.
presets.py     the column mappings of the papers' datasets (HealthBench, RaR, GPQA, MMLU-Pro, MATH500, ...).
tasks.py       tasks by name for configs (`build_task(name, params, seed)`): each implements the recipes' `Task`
               interface plus what the trainer needs (train stream, held-out set, SFT solution, judge, tokenizer).
"""
