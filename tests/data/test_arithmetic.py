"""The arithmetic task: chains and their bounds, gold solution text, the character tokenizer, the judge's checks
on gold, wrong and adversarial responses, disjoint train / held-out streams, and exact resume."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.data.arithmetic import (
    ANSWER_CHECK,
    EOS_ID,
    FORMAT_CHECK,
    IM_START_ID,
    MAX_RESULT,
    MAX_STEPS,
    PAD_ID,
    VOCAB_SIZE,
    ArithmeticConfig,
    ArithmeticDataset,
    Problem,
    Step,
    arithmetic_judge,
    build_tokenizer,
    eval_set,
    is_correct,
    problem_from_steps,
    problem_rubric,
    problems,
    prompt_messages,
    reference_for,
    sample_problem,
    solution_text,
    split_of,
    step_check_name,
)
from rubric_jax.judges.base import JudgeRequest
from rubric_jax.models.tokenizer import apply_chat_template, load_tokenizer
from rubric_jax.rubrics.steps import response_step_ids, split_steps

EXAMPLE = problem_from_steps([Step(3, "+", 4, 7), Step(7, "*", 2, 14), Step(14, "-", 5, 9)])
CONFIGS = [
    ArithmeticConfig(),
    ArithmeticConfig(min_steps=1, max_steps=MAX_STEPS, max_operand=99),
    ArithmeticConfig(min_steps=1, max_steps=3, max_operand=3, operators=("-",)),  # dead ends at 0: redrawn
    ArithmeticConfig(min_steps=4, max_steps=MAX_STEPS, max_operand=99, operators=("+",)),  # dead ends at 99
    ArithmeticConfig(operators=("*",)),
]
problem_strategy = st.builds(
    lambda seed, config: sample_problem(np.random.default_rng(seed), config),
    st.integers(0, 2**32 - 1),
    st.sampled_from(CONFIGS),
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _judge(response: str, problem: Problem = EXAMPLE, reference=None):
    """(satisfied, item_step, reason) of one response against the problem's rubric."""
    request = JudgeRequest(
        question=problem.question,
        response=response,
        rubric=problem_rubric(problem),
        reference=reference_for(problem) if reference is None else reference,
    )
    verdicts = arithmetic_judge().judge([request], max_items=MAX_STEPS + 2)
    n = len(problem_rubric(problem).criteria)
    return verdicts.satisfied_bk[0, :n].tolist(), verdicts.item_step_bk[0, :n].tolist(), verdicts.reasons[0]


# ---------------------------------------------------------------- problems


def test_problems_are_deterministic_per_seed():
    assert problems(0, 50) == problems(0, 50)
    assert problems(0, 50) != problems(1, 50)
    assert problems(0, 50)[:20] == problems(0, 20)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(min_steps=0), "min_steps"),
        (dict(min_steps=True), "min_steps"),
        (dict(min_steps=3, max_steps=2), "max_steps"),
        (dict(max_steps=MAX_STEPS + 1), "max_steps"),
        (dict(max_operand=0), "max_operand"),
        (dict(max_operand=MAX_RESULT + 1), "max_operand"),
        (dict(max_operand=9.0), "max_operand"),
        (dict(operators=()), "operators"),
        (dict(operators=("+", "+")), "operators"),
        (dict(operators=("/",)), "operators"),
        (dict(operators="+-"), "operators"),
        # 2 - 1 - 1 = 0 is the longest chain of "-" over operands 1..2
        (dict(min_steps=1, max_steps=3, max_operand=2, operators=("-",)), "max_steps"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ArithmeticConfig(**kwargs)


def test_config_stores_operators_as_a_tuple():
    assert ArithmeticConfig(operators=["+", "*"]).operators == ("+", "*")


@pytest.mark.parametrize("config", CONFIGS)
def test_chains_follow_the_config_and_stay_in_bounds(config):
    drawn = problems(7, 300, config)
    for problem in drawn:
        assert config.min_steps <= len(problem.steps) <= config.max_steps
        assert 1 <= problem.steps[0].left <= config.max_operand
        for previous, step in zip(problem.steps, problem.steps[1:]):
            assert step.left == previous.result
        for step in problem.steps:
            assert step.op in config.operators and 1 <= step.right <= config.max_operand
            assert 0 <= step.result <= MAX_RESULT
        assert problem.answer == problem.steps[-1].result
    assert {len(p.steps) for p in drawn} == set(range(config.min_steps, config.max_steps + 1))


def test_question_parenthesises_the_chain():
    assert EXAMPLE.question == "Compute ((3 + 4) * 2) - 5."
    assert EXAMPLE.answer == 9
    assert problem_from_steps([Step(3, "+", 4, 7)]).question == "Compute 3 + 4."
    assert prompt_messages(EXAMPLE) == [{"role": "user", "content": "Compute ((3 + 4) * 2) - 5."}]


def test_steps_and_problems_are_validated():
    with pytest.raises(ValueError, match="result"):
        Step(3, "+", 4, 8)
    with pytest.raises(ValueError, match="op"):
        Step(3, "/", 4, 0)
    with pytest.raises(ValueError, match=r"steps\[1\].left"):
        problem_from_steps([Step(3, "+", 4, 7), Step(8, "*", 2, 16)])
    with pytest.raises(ValueError, match="question"):
        Problem(question="Compute 1 + 1.", steps=EXAMPLE.steps, answer=9)
    with pytest.raises(ValueError, match="answer"):
        Problem(question=EXAMPLE.question, steps=EXAMPLE.steps, answer=14)


def test_solution_text_is_one_line_per_step_then_the_box():
    assert solution_text(EXAMPLE) == (
        "### Step 1: 3 + 4 = 7\n### Step 2: 7 * 2 = 14\n### Step 3: 14 - 5 = 9\n\\boxed{9}"
    )


@given(problem_strategy)
def test_split_steps_finds_steps_one_to_n_at_the_line_starts(problem):
    text = solution_text(problem)
    spans = split_steps(text)
    line_starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
    assert [span.number for span in spans] == list(range(1, len(problem.steps) + 1))
    assert [span.header_start for span in spans] == line_starts[: len(problem.steps)]


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_ids(tokenizer):
    assert len(tokenizer) == VOCAB_SIZE == 101
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (PAD_ID, EOS_ID) == (0, 2)
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == IM_START_ID == 1
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("### Step \\boxed{", add_special_tokens=False)) == [
        "### Step ",
        "\\boxed{",
    ]


def test_characters_outside_the_vocabulary_raise(tokenizer):
    with pytest.raises(Exception, match="UNK"):
        tokenizer.encode("é", add_special_tokens=False)


@given(problem_strategy)
def test_tokenizer_round_trips_solutions_and_prompts(problem):
    tokenizer = build_tokenizer()
    text = solution_text(problem)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    prompt = apply_chat_template(tokenizer, prompt_messages(problem))
    assert tokenizer.decode(prompt) == f"<|im_start|>user\n{problem.question}<|im_end|>\n<|im_start|>assistant\n"


def test_saved_tokenizer_loads_with_identical_ids(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    text = solution_text(EXAMPLE)
    assert loaded.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
    assert apply_chat_template(loaded, prompt_messages(EXAMPLE)) == apply_chat_template(
        tokenizer, prompt_messages(EXAMPLE)
    )
    assert (len(loaded), loaded.pad_token_id, loaded.eos_token_id) == (VOCAB_SIZE, PAD_ID, EOS_ID)


def test_response_step_ids_give_each_token_its_step(tokenizer):
    ids = tokenizer.encode(solution_text(EXAMPLE), add_special_tokens=False) + [EOS_ID]
    header = tokenizer.convert_tokens_to_ids("### Step ")
    # each header opens the next step, which runs to the next header; the box and the EOS are in the last step
    expected = np.cumsum([token == header for token in ids])
    np.testing.assert_array_equal(response_step_ids(tokenizer, ids), expected)


# ---------------------------------------------------------------- rubric and judge


def test_rubric_has_a_named_criterion_per_step_then_answer_and_format():
    rubric = problem_rubric(EXAMPLE)
    assert rubric.format == "generic"
    assert [c.name for c in rubric.criteria] == [step_check_name(k) for k in (1, 2, 3)] + [ANSWER_CHECK, FORMAT_CHECK]
    assert rubric.criteria[1].text == "Step 2 computes 7 * 2 = 14"
    with pytest.raises(ValueError, match="MAX_STEPS"):
        problem_rubric(problem_from_steps([Step(1, "*", 1, 1)] * (MAX_STEPS + 1)))


@given(problem_strategy)
def test_gold_solution_satisfies_every_criterion(problem):
    n = len(problem.steps)
    satisfied, steps, reason = _judge(solution_text(problem), problem)
    assert (satisfied, steps, reason) == ([1.0] * (n + 2), list(range(1, n + 1)) + [0, 0], "")
    assert is_correct(solution_text(problem), problem)


def test_a_wrong_step_propagates_to_the_later_steps_and_the_answer():
    response = "### Step 1: 3 + 4 = 7\n### Step 2: 7 * 2 = 15\n### Step 3: 15 - 5 = 10\n\\boxed{10}"
    assert _judge(response) == ([1.0, 0.0, 0.0, 0.0, 1.0], [1, 2, 3, 0, 0], "")
    assert not is_correct(response, EXAMPLE)


def test_a_later_step_with_the_gold_values_is_satisfied_after_a_slip():
    response = "### Step 1: 3 + 4 = 7\n### Step 2: 7 * 2 = 15\n### Step 3: 14 - 5 = 9\n\\boxed{9}"
    assert _judge(response) == ([1.0, 0.0, 1.0, 1.0, 1.0], [1, 2, 3, 0, 0], "")


@pytest.mark.parametrize(
    "response, satisfied, steps",
    [
        ("hello", [0, 0, 0, 0, 0], [-1, -1, -1, 0, 0]),
        ("", [0, 0, 0, 0, 0], [-1, -1, -1, 0, 0]),
        ("\\boxed{9}", [0, 0, 0, 1, 0], [-1, -1, -1, 0, 0]),
        # a missing step: no attribution, and the format fails
        ("### Step 1: 3 + 4 = 7\n### Step 3: 14 - 5 = 9\n\\boxed{9}", [1, 0, 1, 1, 0], [1, -1, 3, 0, 0]),
        # whitespace-tolerant, and surrounding blank space is not a format error
        ("\n### Step 1:3+4=7\n### Step 2:  7\t*  2 =14 \n### Step 3: 14 - 5 = 9\n\\boxed{ 9 }\n", [1] * 5,
         [1, 2, 3, 0, 0]),
        # the first header of a step counts: a later repeat does not rescue it, nor hedge it
        ("### Step 1: 3 + 4 = 8\n### Step 1: 3 + 4 = 7\n### Step 2: 7 * 2 = 14\n### Step 3: 14 - 5 = 9\n\\boxed{9}",
         [0, 1, 1, 1, 0], [1, 2, 3, 0, 0]),
        ("### Step 1: 3 + 4 = 7 ### Step 1: 3 + 4 = 8\n### Step 2: 7 * 2 = 14\n### Step 3: 14 - 5 = 9\n\\boxed{9}",
         [1, 1, 1, 1, 0], [1, 2, 3, 0, 0]),
        # steps out of order: each step is judged, the format is not met
        ("### Step 2: 7 * 2 = 14\n### Step 1: 3 + 4 = 7\n### Step 3: 14 - 5 = 9\n\\boxed{9}", [1, 1, 1, 1, 0],
         [1, 2, 3, 0, 0]),
        # the equation must be the whole first line of the step, with the gold operator
        ("### Step 1: 3 + 4 = 7 = 8\n### Step 2:\n7 * 2 = 14\n### Step 3: 14 + -5 = 9\n\\boxed{9}",
         [0, 0, 0, 1, 0], [1, 2, 3, 0, 0]),
        ("### Step 1: 4 + 3 = 7\n### Step 2: 7 * 2 = 14\n### Step 3: 14 - 5 = 9\n\\boxed{9}", [0, 1, 1, 1, 1],
         [1, 2, 3, 0, 0]),
        # the last box is the answer, and it must hold an integer
        ("### Step 1: 3 + 4 = 7\n### Step 2: 7 * 2 = 14\n### Step 3: 14 - 5 = 9\n\\boxed{9}\\boxed{8}",
         [1, 1, 1, 0, 0], [1, 2, 3, 0, 0]),
        ("### Step 1: 3 + 4 = 7\n### Step 2: 7 * 2 = 14\n### Step 3: 14 - 5 = 9\n\\boxed{9.0}", [1, 1, 1, 0, 0],
         [1, 2, 3, 0, 0]),
        # a header in fenced code is no step; numbers too long to be results do not match (nor raise)
        ("```\n### Step 1: 3 + 4 = 7\n```\n### Step 2: 7 * 2 = " + "1" * 5000 + "\n\\boxed{" + "9" * 5000 + "}",
         [0, 0, 0, 0, 0], [-1, 2, -1, 0, 0]),
    ],
)
def test_checks_on_wrong_and_adversarial_responses(response, satisfied, steps):
    assert _judge(response) == ([float(s) for s in satisfied], steps, "")


@given(st.text(alphabet=st.sampled_from(list("### Step 0123456789+-*=:\n\\boxed{} ")), max_size=120))
def test_checks_never_fail_a_rollout_on_model_text(response):
    satisfied, _, reason = _judge(response)
    assert reason == "" and all(s in (0.0, 1.0) for s in satisfied)


def test_a_missing_or_mismatched_reference_fails_the_rollout():
    assert _judge(solution_text(EXAMPLE), reference="9")[2] == "check_raised"
    two_steps = problem_from_steps(EXAMPLE.steps[:2])
    assert _judge(solution_text(EXAMPLE), reference=reference_for(two_steps))[2] == "check_raised"


# ---------------------------------------------------------------- splits and resume


def test_train_and_eval_streams_are_disjoint_whatever_the_seeds():
    config = ArithmeticConfig()
    train = ArithmeticDataset(config, 0, "train").next_batch(3000)
    held_out = eval_set(config, 1, 500)
    assert {split_of(p) for p in train} == {"train"} and {split_of(p) for p in held_out} == {"eval"}
    assert not {p.question for p in train} & {p.question for p in held_out}
    fraction = np.mean([split_of(p) == "eval" for p in problems(0, 3000, config)])
    assert 0.07 < fraction < 0.13


def test_resuming_at_a_position_continues_the_stream():
    config = ArithmeticConfig()
    dataset = ArithmeticDataset(config, 3, "train")
    first, second = dataset.next_batch(5), dataset.next_batch(7)
    assert dataset.position == 12
    resumed = ArithmeticDataset(config, 3, "train", position=5)
    assert resumed.next_batch(7) == second and resumed.position == 12
    assert resumed.next_batch(4) == dataset.next_batch(4)
    assert next(iter(ArithmeticDataset(config, 3, "train"))) == first[0]
    assert ArithmeticDataset(config, 4, "train").next_batch(12) != first + second


def test_eval_set_is_the_start_of_the_eval_stream():
    config = ArithmeticConfig()
    first_ten = ArithmeticDataset(config, 0, "eval").next_batch(10)
    assert eval_set(config, 0, 20)[:10] == eval_set(config, 0, 10) == first_ten


@pytest.mark.parametrize(
    "kwargs, field",
    [(dict(seed=-1), "seed"), (dict(split="test"), "split"), (dict(position=-1), "position"),
     (dict(config=None), "config")],
)
def test_dataset_validation_names_the_field(kwargs, field):
    arguments = {**dict(config=ArithmeticConfig(), seed=0, split="train", position=0), **kwargs}
    with pytest.raises(ValueError, match=field):
        ArithmeticDataset(**arguments)
