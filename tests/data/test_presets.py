"""Every preset of task "dataset" on a hand-written fixture in its dataset's own layout (tests/fixtures/datasets/,
from the dataset cards and loaders that docs/datasets.md names): the prompt, the gold answer, the rubric, the
grounding passage and the tags each row gives, and the outcome check on a right and a wrong answer."""

import pytest

from rubric_jax.data import dataset, presets
from rubric_jax.data.tasks import build_task
from rubric_jax.rubrics.schema import ItemKind
from tests.data.dataset_fixtures import fixture_path



def fixture_task(preset, seed=0, **changes):
    return build_task("dataset", {"preset": preset, "path": str(fixture_path(preset)), **changes}, seed)


def records(task):
    return sorted(task.train_stream(0).next_batch(len(task._train.rows)), key=lambda r: r.row)


def test_every_preset_has_a_fixture_and_a_source():
    assert set(presets.PRESET_SOURCES) == set(presets.PRESETS)
    assert all(kind in ("card", "copies", "ours", "unverified") for _, kind in presets.PRESET_SOURCES.values())
    for preset in presets.PRESETS:
        assert fixture_path(preset).is_file(), preset


# (preset, row, the gold, a right response, a wrong one)
MATH = [
    ("math500", 1, "26000", "So the value is \\boxed{26000}.", "\\boxed{26}"),
    ("math500", 2, "\\frac{8}{21}", "\\boxed{8/21}", "\\boxed{\\frac{21}{8}}"),
    ("aime24", 0, "204", "\\boxed{204}", "\\boxed{240}"),
    ("aime25", 0, "70", "\\boxed{70}", "\\boxed{7}"),
    ("amc23", 0, "27", "They meet \\boxed{27} miles from A.", "\\boxed{18}"),  # the float 27.0 read as "27"
    ("minerva", 0, "1.6", "The image is \\boxed{1.60} cm across.", "\\boxed{16}"),
    ("olympiadbench", 1, "$\\frac{1}{2 n+2}$", "\\boxed{\\frac{1}{2n+2}}", "\\boxed{\\frac{1}{n}}"),
    ("dapo_math", 0, "34", "...\nAnswer: 34", "Answer: 35"),  # DAPO's own "Answer:" line
    ("srar", 1, "25", "### Step 1: ...\n\\boxed{25}", "\\boxed{24}"),  # the float 25.0 read as "25"
    ("rgr", 0, "9.9", "\\boxed{9.9}", "\\boxed{98}"),
]


@pytest.mark.parametrize("preset, row, gold, right, wrong", MATH)
def test_math_presets_read_the_gold_and_check_answers(preset, row, gold, right, wrong):
    task = fixture_task(preset)
    record = records(task)[row]
    assert record.answer == gold
    assert task.is_correct(right, record) and not task.is_correct(wrong, record)


def test_math_prompts_ask_for_a_boxed_answer_and_dapo_keeps_its_own():
    record = records(fixture_task("math500"))[1]
    assert fixture_task("math500").prompt(record) == [{"role": "user", "content": (
        "What is the value of $513^2 - 487^2$?\n\nPlease reason step by step, and put your final answer within "
        "\\boxed{}.")}]
    assert record.reference.endswith("\\boxed{26000}$.") and record.tags == ("Algebra",)
    assert record.id == "test/algebra/2592.json"
    dapo = records(fixture_task("dapo_math"))[0]
    assert len(dapo.messages) == 1 and dapo.messages[0]["content"].startswith("Solve the following math problem")
    assert dapo.id == "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"


def test_dapo_math_question_takes_the_problem_out_of_dapos_instruction():
    task = fixture_task("dapo_math_question")
    second = records(task)[1]
    assert task.question(second) == "Let $f(x) = x^2 - 3x + 2$. Find $f(5)$."
    assert task.prompt(second) == [{"role": "user", "content": presets.MATH_INSTRUCTION.replace(
        "{question}", "Let $f(x) = x^2 - 3x + 2$. Find $f(5)$.")}]
    assert second.answer == "12" and task.is_correct("\\boxed{12}", second)


def test_gpqa_options_are_stripped_shuffled_and_lettered():
    for seed in range(3):
        task = fixture_task("gpqa", seed)
        for record in records(task):
            assert len(record.options) == 4 and all(o == o.strip() for o in record.options)
            right = {0: "10^-4 eV", 1: "a secondary allylic alcohol", 2: "glycolysis"}[record.row]
            assert record.options[dataset.LETTERS.index(record.answer)] == right
            assert task.is_correct(f"Answer: ({record.answer})", record)
    first = records(fixture_task("gpqa"))[0]
    assert first.tags == ("Physics",) and first.id == "rec06pnAkLOr2t2mp"
    assert "10^-8 eV" in first.options  # the cell's trailing newline is gone


def test_mmlu_pro_drops_na_padding_and_keeps_the_letter():
    task = fixture_task("mmlu_pro")
    first, second = records(task)
    assert first.answer == "I" and first.options[8] == "Unsafe practices, Distress, Fear, Serious"
    assert second.options == ("21", "27", "29", "33") and second.answer == "C" and second.tags == ("math",)
    assert "\nD. 33\n" in task.prompt(second)[0]["content"] and "N/A" not in task.prompt(second)[0]["content"]
    assert task.is_correct("\\boxed{C}", second) and not task.is_correct("\\boxed{E}", second)


def test_supergpqa_reads_answer_letter():
    first, second = records(fixture_task("supergpqa"))
    assert (first.answer, first.options[8], first.tags) == ("I", "India", ("History",))
    assert (second.answer, len(second.options)) == ("B", 4)


def test_healthbench_reads_conversations_points_and_tags():
    task = fixture_task("healthbench")
    first, second = records(task)
    assert task.prompt(second) == [dict(m) for m in second.messages] and len(second.messages) == 3
    assert task.question(second) == "About 20 minutes ago."
    assert [(c.weight, c.tags) for c in task.rubric(first).criteria] == [
        (10.0, ("level:example", "axis:completeness")), (-10.0, ("level:example", "axis:accuracy")),
        (5.0, ("level:cluster", "cluster:communication", "axis:communication_quality"))]
    assert first.tags == ("theme:context_seeking", "physician_agreed_category:enough-context")
    assert not task.is_correct("anything", first)  # no gold: answer_kind none
    no_rubric = fixture_task("healthbench", columns={"rubric": None})
    assert records(no_rubric)[0].rubric.criteria == ()


def test_rar_reads_titles_descriptions_and_signed_weights():
    first = records(fixture_task("rar"))[0]
    assert [(c.name, c.weight) for c in first.rubric.criteria] == [
        ("Identify Most Sensitive Modality", 5.0), ("Explains Sensitivity", 3.0), ("Pregnancy Exception", -1.0)]
    assert first.rubric.criteria[0].text.startswith("Essential Criteria: Identifies")
    assert first.reference.startswith("The most sensitive imaging modality")


def test_longwriter_zero_reads_a_chat_prompt_and_has_no_rubric():
    task = fixture_task("longwriter_zero")
    first, second = records(task)
    assert task.question(first).startswith("Write a 3000-word short story") and first.rubric.criteria == ()
    assert task.prompt(second) == [{"role": "user", "content": "请写一篇不少于5000字的关于城市更新与社区记忆的评论文章。"}]


def test_researchqa_reads_unweighted_items_from_a_json_list():
    first, second = records(fixture_task("researchqa"))
    assert [c.weight for c in first.rubric.criteria] == [1.0, 1.0]
    assert second.tags == ("Genetics",) and second.id == "rqa-0002"


def test_rubric_grounded_reads_the_passage_and_definition_1_fields():
    task = fixture_task("rubric_grounded")
    first = records(task)[0]
    assert task.reference(first) == first.grounding and first.grounding.startswith("The study reports")
    criterion = first.rubric.criteria[0]
    assert (criterion.name, criterion.weight, criterion.required_elements, criterion.keywords) == (
        "Trapping mechanism", 3.0, ("hydrogen trapping", "coherent precipitates"), ("trap", "precipitate"))
    assert criterion.scoring_guide.startswith("Full credit") and first.rubric.format == "rubric_grounded"
    assert "passage" not in str(task.prompt(first))  # the policy never sees the passage


def test_rgr_reads_factual_and_process_criteria_in_either_case():
    second = records(fixture_task("rgr"))[1]
    assert [(c.kind, c.weight) for c in second.rubric.criteria] == [(ItemKind.FACTUAL, 9.0), (ItemKind.PROCESS, 4.0)]


def test_srar_reads_the_authors_tagged_rubric_lines():
    first = records(fixture_task("srar"))[0]
    kinds = [c.kind for c in first.rubric.criteria]
    assert kinds == [ItemKind.SUGGEST, ItemKind.SUGGEST, ItemKind.PITFALL, ItemKind.BONUS, ItemKind.ANSWER]
    assert first.rubric.criteria[2].text == "Forgets the negative factor pairs."
    assert first.question.startswith("Let $S$ be the sum")
