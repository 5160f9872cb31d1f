"""Rubrics: the five papers' rubric data model, their prompt templates, and parsers of every model output.

Imports only `rubric_jax.core`, numpy and the standard library (DESIGN.md's import rule). The modules:

schema.py    `ItemKind` (SUGGEST=0, PITFALL=1, BONUS=2, ANSWER=3 as in core.rewards; CRITERION, FACTUAL, PROCESS),
             `Criterion`, `Rubric` (validated per paper format, FORMATS; strict `to_dict` / `from_dict`),
             `RubricArrays` and `rubric_arrays(rubrics, max_items)`: padded [B, K] mask, kind, weight arrays.
prompts.py   `fence(text, tag)`, which keeps model-generated text from forging a prompt's structure, and one
             chat-message builder per paper prompt (reasoner, step format, rubricator, verifier, judges,
             meta-verifier, rubric generators, self-refinement).
parsing.py   `ParseResult` / `RubricParse` (values of caller-fixed shapes, ok, reason), `FailurePolicy`,
             `FailureCounter`, and one parser per model output; a parser never raises on a str.
steps.py     `split_steps` at the authors' `### Step N:` headers (not inside fenced code) and
             `response_step_ids(tokenizer, ids)`: each response token's step [T], exactly through the tokenizer's
             offsets, for `core.srar` (0 = outside any step).
memory_pool.py  `MemoryPool`: EvoRubric's per-question archive of verified criteria, bounded, checkpointable.
"""
