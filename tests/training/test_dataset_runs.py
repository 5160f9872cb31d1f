"""One RL step of each paper's CPU twin on its fixture dataset (configs/<twin>_dataset_cpu.yaml), loaded as
`rubric-jax train` loads it, with every judge request going over HTTP to the stand-in server, which answers in
that paper's judge format. Each responder reads the items a request shows from the prompt's fenced JSON lines
(`rubrics.prompts`) and returns a fixed, format-valid verdict, so that the requests a step makes, and the rewards
the verdicts give, are known from the fixture's rows.

RLCER's tiny random policy never writes a rubricator output that parses, so its verifier would get no request:
its twin runs with the policy served by the stand-in too (rollout.engine sglang), a script answering the
reasoner with a boxed answer and the rubricator (Figure 9's prompt) with a valid JSON rubric."""

import dataclasses
import json
import math
from pathlib import Path
from typing import Callable

import pytest

from rubric_jax.data import arithmetic
from rubric_jax.data.tasks import build_task
from rubric_jax.training.rl import train_rl
from rubric_jax.training.run_config import RLConfig
from rubric_jax.yaml_config import load_config
from tests.inference.standin_server import ScriptedPolicy, StandinServer, fenced

REPO = Path(__file__).resolve().parents[2]


def json_lines(content: str, tag: str) -> list[dict]:
    """The items a prompt renders one JSON object a line inside the fence `tag`."""
    return [json.loads(line) for line in fenced(content, tag).splitlines()]


# ---------------------------------------------------------------- the judges, one per format


def essential_rating(messages) -> str:
    """Rating format (one criterion a call): RaR's "Essential Criteria" items met, every other item not."""
    criterion = fenced(messages[-1]["content"], "criterion")
    return json.dumps({"rating": int(criterion.startswith("Essential Criteria:"))})


def factual_rating(messages) -> str:
    """Rating format: RGR's factual criteria met, its process criteria not (the prompt labels the kind)."""
    return json.dumps({"rating": int("Criterion (Factual):" in messages[-1]["content"])})


def ten_point_grade(messages) -> str:
    """HealthBench's grader (one criterion a call, shown as "[points] text"): the +-10-point criteria met."""
    met = fenced(messages[-1]["content"], "criterion").startswith(("[10] ", "[-10] "))
    return json.dumps({"explanation": "scripted", "criteria_met": met})


def first_criterion_in_full(messages) -> str:
    """The rubric-grounded judge (every criterion in one call): c_1 its whole weight, the others half theirs."""
    rows = json_lines(messages[-1]["content"], "criteria")
    scores = {row["id"]: row["weight"] * (1 if row["id"] == "c_1" else 0.5) for row in rows}
    return json.dumps({"scores": scores, "total": sum(scores.values()),
                       "max_total": sum(row["weight"] for row in rows), "reasoning": "scripted"})


def pitfalls_avoided(messages) -> str:
    """SRaR's step-attributed judge (every item in one call): every item satisfied but the PITFALLs (satisfied
    would mean the response fell into them), each in step 1."""
    rows = json_lines(messages[-1]["content"], "rubric_items")
    return json.dumps([{"id": row["id"], "satisfied": row["type"] != "PITFALL", "step": 1} for row in rows])


CORRECT_FOR_THE_FIRST_QUESTION = "\\boxed{34}"  # the gold answers of dapo_math.jsonl's rows: 34, then 12
CORRECT_FOR_THE_SECOND_QUESTION = "\\boxed{12}"


def boxed_34_verifier(messages) -> str:
    """RLCER's verifier (one rubricator's list a call): a reward rubric is met by a response that boxes 34, a
    penalty rubric never."""
    content = messages[-1]["content"]
    rows = json_lines(content, "rubrics")
    met = [row["points"] > 0 and CORRECT_FOR_THE_FIRST_QUESTION in fenced(content, "response") for row in rows]
    return json.dumps({"judgement": met, "final_score": sum(r["points"] for r, m in zip(rows, met) if m)})


# ---------------------------------------------------------------- RLCER's policy, served by the stand-in

FIGURE_9_CLOSING = "Return only the JSON object without additional commentary."  # kept by the left truncation
RUBRICATOR_OUTPUT = json.dumps({
    "question_domain": "math/algebra",
    "rubrics": [{"category": "Flow", "criterion": "Boxes 34 as the answer.", "points": 3},
                {"category": "Focus", "criterion": "Repeats a step.", "points": -2}],
    "maximum_score": 3, "minimum_score": -2, "current_score": 0},
    separators=(",", ":"))  # 0 < (3 - 2) / 2: the format holds


def served_reply(prompt: str, j: int) -> str:
    """The policy behind the stand-in's /generate: a rubricator prompt (Figure 9's) gets RUBRICATOR_OUTPUT, a
    reasoner prompt (the twin samples two) gets 34 boxed in sample 0 and 12 in sample 1."""
    if FIGURE_9_CLOSING in prompt:
        return RUBRICATOR_OUTPUT
    return (CORRECT_FOR_THE_FIRST_QUESTION, CORRECT_FOR_THE_SECOND_QUESTION)[j]


# ---------------------------------------------------------------- the twins


def per_criterion(config: RLConfig, rows) -> int:
    """One request per (rollout, criterion)."""
    return config.rollout.group_size * sum(len(row.rubric.criteria) for row in rows)


def per_rollout(config: RLConfig, rows) -> int:
    """One request per rollout, with every item of its rubric."""
    return config.rollout.group_size * len(rows)


def per_criterion_and_refinements(config: RLConfig, rows) -> int:
    """RGR-GRPO: per (rollout, criterion), and once more per criterion for the refinement of every group, all
    of them unsolved (no rollout meets the process criteria)."""
    return (config.rollout.group_size + 1) * sum(len(row.rubric.criteria) for row in rows)


def per_rollout_and_list(config: RLConfig, rows) -> int:
    """RLCER's verifier_calls per_list: each of a question's N rollouts asked about each of the lists of its
    M = N rubricators."""
    return len(rows) * config.rollout.group_size ** 2


@dataclasses.dataclass(frozen=True)
class Twin:
    """A CPU twin: its config's name, the judge's responder, the requests one step makes (from the config and
    the step's rows) and the metrics the scripted verdicts give; `served`: the policy runs on the stand-in."""

    name: str
    responder: Callable
    requests: Callable
    metrics: dict
    served: bool = False
    absent: tuple = ()  # metrics the step must not log (outcome/accuracy where answer_kind is none)


TWINS = [
    # RaR's score (positive points, the default): row 0 (weights 5, 3, -1) meets its 5, not its -1, of 5 + 3;
    # row 1 (weights 5, 1) its 5 of 5 + 1. Each title is one row's: no name recurs, no tags: "rubric/untagged".
    Twin("rar", essential_rating, per_criterion,
         {"reward/mean": (5 / 8 + 5 / 6) / 2, "rubric/untagged": 2 / 5},
         absent=("outcome/accuracy", "rubric/Blood Cultures", "rubric/item0")),
    # HealthBench's score (score: positive_points): row 0 meets +10 and -10 of its positive 10 + 5, (10 - 10) / 15
    # (the weighted fraction would pay 10 / 15); row 1 meets +10 (-9 unmet), 10 / 10. Items unnamed: by tag,
    # axis:accuracy = row 0's -10 (met), row 1's +10 (met) and -9 (not); level:example all but row 0's +5.
    Twin("healthbench", ten_point_grade, per_criterion,
         {"reward/mean": (0 / 15 + 10 / 10) / 2, "rubric/tag/axis:completeness": 1, "rubric/tag/axis:accuracy": 2 / 3,
          "rubric/tag/axis:communication_quality": 0, "rubric/tag/level:example": 3 / 4},
         absent=("outcome/accuracy", "rubric/item0")),
    # Row 0: weights 3, 2 -> (3 + 1) / 5; row 1: weights 2, 3 -> (2 + 1.5) / 5. Names one row's each: untagged.
    Twin("rubric_grounded", first_criterion_in_full, per_rollout,
         {"reward/mean": (4 / 5 + 3.5 / 5) / 2, "rubric/untagged": (1 + 0.5 + 1 + 0.5) / 4,
          "grounded/zero_reward_fraction": 0}, absent=("outcome/accuracy", "rubric/Trapping mechanism")),
    # Every SUGGEST met: R_SUG = 0.8 per rubric; the BONUS (row 0 only) R_BON = 1; no PITFALL fallen into.
    Twin("srar", pitfalls_avoided, per_rollout,
         {"srar/rate/suggest": 1, "srar/rate/answer": 1, "srar/rate/bonus": 1, "srar/rate/pitfall": 0,
          "srar/score/suggest": 0.8, "srar/score/bonus": 1, "srar/score/pitfall": 0, "srar/rubric_score": 1}),
    # Every factual criterion met: the gate pays 1, refinements included, but no group is solved.
    Twin("rgr_grpo", factual_rating, per_criterion_and_refinements,
         {"rgr/rubric_reward/mean": 1, "rgr/solved_group_fraction": 0, "rgr/off_policy_fraction": 1,
          "rgr/refined_better_fraction": 0}),
    # Question 1 (gold 34): z = [1, 0] and the +3 rubric met as [1, 0]: valid (corr 1); the -2 one never met:
    # invalid (no variance). Question 2 (gold 12): z = [0, 1], the +3 rubric met as [1, 0]: invalid (corr -1).
    # Reasoner: +-1 + r_cot, r_cot = 1 for the response meeting question 1's valid rubrics (both lists' +3),
    # else 0: [2, -1] and [-1, 1]. Rubricators: valid fraction + format: 1/2 + 1 for question 1's, 0 + 1 for 2's.
    Twin("rlcer", boxed_34_verifier, per_rollout_and_list,
         {"reward/mean": (2 - 1 - 1 + 1) / 4, "rubricator/reward/mean": (1.5 + 1.5 + 1 + 1) / 4,
          "outcome/accuracy": 0.5, "rlcer/rubricator_format_rate": 1, "rlcer/valid_fraction": 0.25,
          "rlcer/no_valid_rubric_fraction": 0.5, "rlcer/cot_reward_mean": 0.25}, served=True),
]


@pytest.mark.parametrize("twin", TWINS, ids=[twin.name for twin in TWINS])
def test_one_step_of_each_cpu_twin_judges_its_dataset_over_http(twin, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the configs name their fixture relative to the repository root
    path = Path(f"configs/{twin.name}_dataset_cpu.yaml")
    spec = load_config(RLConfig, path).task
    task = build_task(spec.name, spec.params, spec.seed)
    policy = ScriptedPolicy(task.tokenizer(), served_reply, arithmetic.EOS_ID) if twin.served else None
    with StandinServer(policy, tokenizer=task.tokenizer(), responder=twin.responder) as server:
        overrides = [f"output_dir={tmp_path / 'run'}", f"judge.url={server.base_url}", "steps=1"]
        if twin.served:
            overrides += ["rollout.engine=sglang", f"rollout.sglang_url={server.base_url}"]
        config = load_config(RLConfig, path, overrides)
        last = train_rl(config, task)
        preflight, *bodies = server.chat_requests  # the launch's one request first, then the step's
        generate_requests = server.requests["/generate"]

    rows = task.train_stream(0).next_batch(config.rollout.prompts_per_step)  # the rows the step read
    expected = twin.requests(config, rows)
    assert expected > 0 and len(bodies) == expected
    assert {body["model"] for body in [preflight, *bodies]} == {config.judge.model}
    assert last["judge/requests"] == expected and last["judge/retries"] == 0
    assert last["judge/request_failures"] == 0 and last["judge/failure_rate"] == 0
    assert {key: last[key] for key in twin.metrics} == pytest.approx(twin.metrics)
    assert not set(twin.absent) & set(last)
    assert math.isfinite(last["train/loss"])
    if twin.served:  # one /generate per prompt: each question's reasoner prompt and its M rubricator prompts (M
        # = rubricators_per_question, null: the group size); the initial weights and the step's sent
        rubricators = config.algorithm.params.get("rubricators_per_question") or config.rollout.group_size
        assert generate_requests == config.rollout.prompts_per_step * (1 + rubricators)
        assert policy.updates == ["step-0", "step-1"]
