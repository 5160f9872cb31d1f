"""Presets of task "dataset": the column mapping, answer check, rubric reading and prompt of the datasets the
five papers train and evaluate on, as `DatasetConfig` params. `task.params: {preset: NAME, path: ...}` starts
from PRESETS[NAME]; every key given beside the preset overrides it, mappings key by key (so
`columns: {rubric: null}` runs HealthBench without its rubrics, and `columns: {prompt: problem}` reads a mirror
that names its question column otherwise).

PRESET_SOURCES names, for each preset, the dataset (Hugging Face id or file) whose layout it reads and how its
column names were checked: "card" (the dataset card's features or the owner's loading code was read), "copies"
(only consistent third-party copies and loaders were seen), "ours" (no public release: the layout is this
project's, built from the paper's description) or "unverified" (nothing showed the columns: the preset assumes
the common layout, and `rubric-jax validate` names the columns a file really has when it differs).
docs/datasets.md has the details and what could not be checked.
"""

from typing import Any

# Qwen2.5-Math's instruction, which RLCER's reasoner prompt and the math evaluations of the papers use.
MATH_INSTRUCTION = "{question}\n\nPlease reason step by step, and put your final answer within \\boxed{}."
# The multiple-choice instruction: the options, then the letter in a box (judges.outcome.extract_choice).
CHOICE_INSTRUCTION = ("{question}\n\n{options}\n\nThink step by step, then give the letter of the correct option "
                      "as \\boxed{LETTER}.")


# DAPO-Math-17k's instruction around each problem (its prompt column; verl's math_dapo reads the "Answer:" line).
DAPO_WRAPPER = (r"^Solve the following math problem step by step\. The last line of your response should be of the "
                r"form Answer: \$Answer \(without quotes\) where \$Answer is the answer to the problem\.\s*(.*?)\s*"
                r"Remember to put your answer on its own line after \"Answer:\"\.\s*$")


def _math(question: str, answer: str, **columns: Any) -> dict[str, Any]:
    return {"columns": {"prompt": question, "answer": answer, **columns}, "answer_kind": "math",
            "prompt_template": MATH_INSTRUCTION}


def _choice(question: str, **columns: Any) -> dict[str, Any]:
    return {"columns": {"prompt": question, **columns}, "answer_kind": "choice", "prompt_template": CHOICE_INSTRUCTION}


PRESETS: dict[str, dict[str, Any]] = {
    # Math: a problem and its final answer (a string, or a number written plainly).
    "math500": _math("problem", "answer", reference="solution", tags="subject", id="unique_id"),
    "aime24": _math("problem", "answer", reference="solution", id="id"),
    "aime25": _math("question", "answer"),
    "amc23": _math("question", "answer", id="id"),
    "minerva": _math("question", "answer"),
    "olympiadbench": _math("question", "final_answer"),
    # DAPO-Math-17k as released: its own prompt (asking for an "Answer:" line) in a chat-messages column, the
    # answer nested in reward_model.
    "dapo_math": {"columns": {"messages": "prompt", "answer": "reward_model.ground_truth", "id": "extra_info.index"},
                  "answer_kind": "math"},
    # The same file, the problem taken out of DAPO's instruction and asked for a boxed answer (RLCER's reasoner).
    "dapo_math_question": {
        "columns": {"messages": "prompt", "answer": "reward_model.ground_truth", "id": "extra_info.index"},
        "question_pattern": DAPO_WRAPPER, "prompt_template": MATH_INSTRUCTION, "answer_kind": "math"},
    # Multiple choice.
    "gpqa": _choice("Question", correct_option="Correct Answer",
                    incorrect_options=["Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"],
                    tags="High-level domain", id="Record ID"),
    "mmlu_pro": {**_choice("question", options="options", answer="answer", tags="category", id="question_id"),
                 "shuffle_options": False, "excluded_options": ["N/A"]},
    "supergpqa": {**_choice("question", options="options", answer="answer_letter", tags="discipline", id="uuid"),
                  "shuffle_options": False},
    # Rubric datasets.
    "healthbench": {
        "columns": {"messages": "prompt", "rubric": "rubrics", "tags": "example_tags", "id": "prompt_id"},
        "rubric_items": {"text": "criterion", "weight": "points", "tags": "tags"},
        "answer_kind": "none",
    },
    "rar": {
        "columns": {"prompt": "question", "reference": "reference_answer", "rubric": "rubric"},
        "rubric_items": {"text": "description", "name": "title", "weight": "weight"},
        "answer_kind": "none",
    },
    # Unverified (only the dataset's name is known): verl's RL layout, a chat-messages prompt column, no rubric.
    "longwriter_zero": {"columns": {"messages": "prompt"}, "answer_kind": "none"},
    "researchqa": {
        "columns": {"prompt": "query", "rubric": "rubric", "tags": "field", "id": "id"},
        "rubric_items": {"text": "rubric_item", "weight": None},
        "answer_kind": "none",
    },
    "rubric_grounded": {
        "columns": {"prompt": "question", "grounding": "passage", "rubric": "criteria"},
        "rubric_items": {"text": "description", "name": "name", "weight": "weight",
                         "required_elements": "required_elements", "keywords": "expected_keywords",
                         "scoring_guide": "scoring_guide", "verification_method": "verification_method"},
        "rubric_format": "rubric_grounded",
        "answer_kind": "none",
    },
    "rgr": {
        "columns": {"prompt": "question", "answer": "answer", "reference": "reference_answer", "rubric": "rubric"},
        "rubric_items": {"text": "description", "weight": "weight", "kind": "type"},
        "rubric_format": "rgr",
        "answer_kind": "math",
    },
    "srar": {
        "columns": {"prompt": "problem", "answer": "ground_truth", "rubric": "rubric"},
        "rubric_encoding": "srar_tags",
        "rubric_format": "srar",
        "answer_kind": "math",
    },
}

PRESET_SOURCES: dict[str, tuple[str, str]] = {
    "math500": ("HuggingFaceH4/MATH-500", "copies"),
    "aime24": ("HuggingFaceH4/aime_2024", "card"),
    "aime25": ("opencompass/AIME2025 (configs AIME2025-I, AIME2025-II)", "copies"),
    "amc23": ("math-ai/amc23", "copies"),
    "minerva": ("math-ai/minervamath", "copies"),
    "olympiadbench": ("math-ai/olympiadbench; Qwen2.5-Math's evaluation/data/olympiadbench", "card"),
    "dapo_math": ("BytedTsinghua-SIA/DAPO-Math-17k", "copies"),
    "dapo_math_question": ("BytedTsinghua-SIA/DAPO-Math-17k", "copies"),
    "gpqa": ("Idavidrein/gpqa", "card"),
    "mmlu_pro": ("TIGER-Lab/MMLU-Pro", "card"),
    "supergpqa": ("m-a-p/SuperGPQA", "card"),
    "healthbench": ("openai/simple-evals healthbench_eval.py (the oss_eval, hard and consensus JSONL)", "card"),
    "rar": ("ScaleAI/RaR-Medicine, ScaleAI/RaR-Science", "card"),
    "longwriter_zero": ("THU-KEG/LongWriter-Zero-RLData", "unverified"),
    "researchqa": ("realliyifei/ResearchQA (test.json, valid.json)", "card"),
    "rubric_grounded": ("rubric_grounded_rl.txt, Appendix E (no public release)", "ours"),
    "rgr": ("rgr_grpo.txt, section 2 (no public release)", "ours"),
    "srar": ("akarinmoe/SRaR, recipe/SRaR (its raw parquet: problem, rubric, ground_truth)", "card"),
}
