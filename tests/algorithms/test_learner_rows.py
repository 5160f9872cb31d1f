"""`Algorithm.learner_rows`: the rows each role adds to a step's learner batch, at their widest (what
`rubric-jax plan` compiles)."""

import dataclasses

from rubric_jax.algorithms.base import RoleRows, StepShape
from rubric_jax.algorithms.evorubric import EvoRubric, EvoRubricConfig
from rubric_jax.algorithms.rar import RaR, RaRConfig
from rubric_jax.algorithms.rlcer import RLCER, RLCERConfig

SHAPE = StepShape(prompts=4, group_size=8, prompt_tokens=100, response_tokens=1000)
CAPPED = dataclasses.replace(SHAPE, max_prompt_tokens=3000)


def test_a_one_role_recipe_has_the_policys_rows():
    assert RaR(RaRConfig()).learner_rows(SHAPE) == {"policy": RoleRows(32, 100, 1000)}


def test_rlcer_adds_a_rubricator_row_per_read_cot_whose_prompt_holds_the_cot():
    reasoner = RoleRows(32, 100, 1000)
    assert RLCER(RLCERConfig()).learner_rows(SHAPE) == {"reasoner": reasoner, "rubricator": RoleRows(32, 1100, 1000)}
    config = RLCERConfig(rubricators_per_question=2, rubricator_max_new_tokens=500)
    assert RLCER(config).learner_rows(CAPPED)["rubricator"] == RoleRows(8, 3000, 500)
    assert RLCER(dataclasses.replace(config, rubricator_training="frozen")).learner_rows(SHAPE) == {
        "reasoner": reasoner}


def test_evorubric_adds_the_generators_rows_whose_prompt_shows_the_responses():
    config = EvoRubricConfig(generator_group_size=4, generator_max_new_tokens=700, shown_response_max_tokens=200)
    assert EvoRubric(config).learner_rows(SHAPE)["generator"] == RoleRows(16, 100 + 8 * 200, 700)
    shown_two = dataclasses.replace(config, responses_shown=2, shown_response_max_tokens=None)
    assert EvoRubric(shown_two).learner_rows(SHAPE)["generator"] == RoleRows(16, 100 + 2 * 1000, 700)
    assert EvoRubric(config).learner_rows(CAPPED)["generator"] == RoleRows(16, 3000, 700)
    assert list(EvoRubric(dataclasses.replace(config, train_generator=False)).learner_rows(SHAPE)) == ["reasoner"]
