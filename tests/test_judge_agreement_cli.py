"""`rubric-jax judge-agreement` end to end: two scripted judges behind stand-in OpenAI servers (RLCER's verifier
format: one call per rollout, every criterion in order), judge A biased towards the first criterion shown and
against long responses, judge B keyword-honest and failing on one item; the report's numbers against tables
computed by hand below. Then saved verdicts against human labels, and each bad input as one line, status 2."""

import collections
import json

import pytest

from rubric_jax import cli
from rubric_jax.judges.base import JudgeRequest, RolloutVerdict
from rubric_jax.judges.records import JudgedRollout, write_judged_rollouts
from rubric_jax.rubrics.schema import Criterion, Rubric
from tests.inference.standin_server import StandinServer, fenced
from tests.test_cli import run_cli

FRUIT = Rubric((Criterion("Mentions apples.", name="apples"), Criterion("Mentions pears.", name="pears")))
RESPONSES = ["apples and pears", "apples", "pears", "nothing"]
SAVED = [(1, 1), (1, 0), (0, 1), None]  # the run's judge; no verdict saved for the last item


def write_items(path, saved=SAVED, reference=None):
    write_judged_rollouts(path, [
        JudgedRollout(id=f"step-1/{i}", step=1, request=JudgeRequest("Name some fruit.", text, FRUIT, reference),
                      verdict=None if verdict is None else RolloutVerdict(satisfied=verdict))
        for i, (text, verdict) in enumerate(zip(RESPONSES, saved))])
    return path


def verifier(primacy: bool, fails_on: str = ""):
    """An RLCER verifier: a criterion holds when its fruit is in the response; `primacy`: the first criterion
    shown always holds, responses over 100 characters satisfy nothing, and the second identical call about the
    response "apples" says every criterion holds (sampling noise); `fails_on`: an unparsable answer there."""
    calls = collections.Counter()

    def respond(messages):
        text = "\n".join(m["content"] for m in messages)
        response = fenced(text, "response")
        criteria = [json.loads(line)["criterion"] for line in fenced(text, "rubrics").splitlines()]
        calls[text] += 1
        if response == fails_on:
            return "I cannot judge this."
        judgement = [(primacy and j == 0) or c.split()[-1].rstrip(".") in response for j, c in enumerate(criteria)]
        if primacy and len(response) > 100:
            judgement = [False] * len(criteria)
        if primacy and response == "apples" and calls[text] == 2:
            judgement = [True] * len(criteria)
        return json.dumps({"judgement": judgement, "final_score": 0})

    return respond


def test_two_judges_compared_and_probed(tmp_path, capsys):
    items = write_items(tmp_path / "rollouts" / "step_000001.jsonl")
    output = tmp_path / "report.md"
    with StandinServer(responder=verifier(primacy=True)) as a, \
            StandinServer(responder=verifier(primacy=False, fails_on="nothing")) as b:
        status = cli.main(["judge-agreement", str(tmp_path / "rollouts"), "--output", str(output),
                           "--judge-a-url", a.base_url, "--judge-a-model", "judge-a",
                           "--judge-b-url", b.base_url, "--judge-b-model", "judge-b", "--format", "rlcer_verifier",
                           "--temperature", "0.7", "--seed", "3", "--repeats", "2", "--permute", "--pad-chars", "100"])
        a_seeds = [body["seed"] for body in a.chat_requests]
    assert status == 0 and items.exists()
    # A: 4 items x (first pass, repeat, permuted, padded); the repeat samples with seed + 1
    assert sorted(a_seeds) == [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4]
    report = json.loads(output.with_suffix(".json").read_text())
    assert output.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    out, err = capsys.readouterr()
    assert out == output.read_text() and "judging 4 items: repeat 2 of 2" in err
    assert report["rater_a"] == f"judge-a at {a.base_url} (rlcer_verifier)" and report["probed"] == report["rater_a"]

    # A (apples shown first: always holds) on items 0-3: (1, 1), (1, 0), (1, 1), (1, 0); B: (1, 1), (1, 0),
    # (0, 1), and fails on item 3, so 3 items are compared.
    # pairs item-major: A [1, 1, 1, 0, 1, 1], B [1, 1, 1, 0, 0, 1]: p_o = 5/6; P(A 1) = 5/6, P(B 1) = 4/6
    # p_e = 5/6 * 4/6 + 1/6 * 2/6 = 22/36; kappa = (30/36 - 22/36) / (14/36) = 4/7
    a_vs_b = report["a_vs_b"]
    assert a_vs_b["items_compared"] == 3
    assert a_vs_b["excluded"]["second"] == {"missing": 0, "failed": 1, "failed_by_reason": {"no_json": 1}}
    assert a_vs_b["overall"]["confusion"] == [[1, 0], [1, 4]]
    assert a_vs_b["overall"]["agreement"] == pytest.approx(5 / 6) and a_vs_b["overall"]["kappa"] == pytest.approx(4 / 7)
    # apples: A [1, 1, 1] (constant), B [1, 1, 0]: p_o = 2/3 = p_e -> kappa 0; pears: equal -> kappa 1
    assert a_vs_b["criteria"]["apples"]["agreement"] == pytest.approx(2 / 3)
    assert a_vs_b["criteria"]["apples"]["kappa"] == pytest.approx(0)
    assert a_vs_b["criteria"]["pears"]["agreement"] == 1 and a_vs_b["criteria"]["pears"]["kappa"] == pytest.approx(1)
    # scores (weights 1): A [1, 0.5, 1], B [1, 0.5, 0.5]; deviations [1/6, -1/3, 1/6], [1/3, -1/6, -1/6]:
    # r = (1/12) / (1/6) = 1/2; ranks [2.5, 1, 2.5], [3, 1.5, 1.5]: rho = 0.75 / 1.5 = 1/2; B - A mean -1/6
    scores = a_vs_b["scores"]
    assert scores["pearson"] == pytest.approx(0.5) and scores["spearman"] == pytest.approx(0.5)
    assert scores["mean_difference"] == pytest.approx(-1 / 6) and scores["mean_abs_difference"] == pytest.approx(1 / 6)

    # repeats: [1, 1, 1, 0, 1, 1, 1, 0] and [1, 1, 1, 1, 1, 1, 1, 0] (item 1 all satisfied): 7 of 8 unanimous;
    # P(1) 6/8 and 7/8, p_e = 42/64 + 2/64 = 44/64; kappa = (56/64 - 44/64) / (20/64) = 3/5;
    # score std over the runs: item 1 [0.5, 1] -> 0.25, others 0: mean 1/16
    consistency = report["self_consistency"]
    assert consistency["unanimous_fraction"] == 7 / 8 and consistency["mean_pairwise_agreement"] == 7 / 8
    assert consistency["mean_pairwise_kappa"] == pytest.approx(0.6) and consistency["mean_score_std"] == 1 / 16

    # permuted (2 criteria: swapped, pears first: always holds), back in the original order: (1, 1), (1, 1),
    # (0, 1), (0, 1): [1, 1, 1, 1, 0, 1, 0, 1] against [1, 1, 1, 0, 1, 1, 1, 0]: p_o = 4/8; both P(1) = 6/8,
    # p_e = 36/64 + 4/64 = 40/64; kappa = (32/64 - 40/64) / (24/64) = -1/3; scores [1, .5, 1, .5] -> [1, 1, .5, .5]
    position = report["position"]
    assert position["overall"]["agreement"] == 0.5 and position["overall"]["kappa"] == pytest.approx(-1 / 3)
    assert position["scores"]["mean_difference"] == 0 and position["scores"]["mean_abs_difference"] == 0.25
    # padded past 100 characters: nothing holds; p_o = 2/8, p_e = 6/8 * 0 + 2/8 * 1 = 2/8: kappa 0;
    # scores [1, .5, 1, .5] -> 0: mean shift -3/4, correlation undefined (constant)
    length = report["length"]
    assert length["overall"]["agreement"] == 0.25 and length["overall"]["kappa"] == pytest.approx(0)
    assert length["scores"]["mean_difference"] == -0.75 and length["scores"]["pearson"] is None

    markdown = output.read_text()
    assert "| all criteria | 6 | 83.3% | 0.571 | 4 | 1 | 0 | 1 |" in markdown
    assert "B failed on 1 (no_json 1), has no rating for 0" in markdown
    assert "| mean pairwise Cohen's kappa | 0.600 |" in markdown
    assert "Pearson r = undefined, Spearman rho = undefined over 4 responses (the second rater's scores are " \
           "constant)" in markdown


def test_saved_verdicts_against_human_labels(tmp_path, capsys):
    items = write_items(tmp_path / "items.jsonl")
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps({"id": f"step-1/{i}", "satisfied": s}) + "\n"
                              for i, s in enumerate([[1, 1], [0, 0], [0, 1], [0, 0]])))
    output = tmp_path / "report.md"
    assert cli.main(["judge-agreement", str(items), "--use-saved-verdicts", "--labels", str(labels),
                     "--output", str(output)]) == 0
    report = json.loads(output.with_suffix(".json").read_text())
    # items 0-2 (no saved verdict for item 3): saved [1, 1, 1, 0, 0, 1], labels [1, 1, 0, 0, 0, 1]: p_o = 5/6;
    # P(1) 4/6 and 3/6, p_e = 12/36 + 6/36 = 1/2; kappa = (5/6 - 1/2) / (1/2) = 2/3
    overall = report["a_vs_b"]["overall"]
    assert overall["agreement"] == pytest.approx(5 / 6) and overall["kappa"] == pytest.approx(2 / 3)
    assert report["a_vs_b"]["excluded"]["first"]["missing"] == 1 and "probed" not in report
    assert report["rater_b"] == f"human labels ({labels})"
    assert "A failed on 0, has no rating for 1" in capsys.readouterr().out

    # --sample 2: two of the four items, the same two for the same seed
    samples = []
    for _ in range(2):
        assert cli.main(["judge-agreement", str(items), "--use-saved-verdicts", "--labels", str(labels),
                         "--sample", "2", "--seed", "1", "--output", str(output)]) == 0
        samples.append(json.loads(output.with_suffix(".json").read_text()))
    assert samples[0] == samples[1] and samples[0]["items"] == 2
    excluded = samples[0]["a_vs_b"]["excluded"]["first"]["missing"]
    assert samples[0]["a_vs_b"]["items_compared"] + excluded == 2


@pytest.fixture
def inputs(tmp_path):
    write_items(tmp_path / "items.jsonl")
    write_items(tmp_path / "unjudged.jsonl", saved=[None] * 4)
    (tmp_path / "bad.jsonl").write_text('{"id": "x"}\n')
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "labels.jsonl").write_text('{"id": "step-1/9", "satisfied": [1, 1]}\n')
    return tmp_path


JUDGE_A = ["--judge-a-url", "http://127.0.0.1:1", "--judge-a-model", "a"]
SAVED_AND_LABELS = ["--use-saved-verdicts", "--labels", "{tmp}/labels.jsonl"]
BAD_INPUTS = [
    (["{tmp}/items.jsonl", *JUDGE_A, "--permute"], "the following arguments are required: --output"),
    (["{tmp}/items.jsonl", *JUDGE_A, "--permute", "--output", "{tmp}/r.json"], "must name a markdown file (.md)"),
    (["{tmp}/items.jsonl", *JUDGE_A, "--permute", "--output", "{tmp}/no/r.md"], "the directory {tmp}/no does not"),
    (["{tmp}/items.jsonl", "--permute", "--output", "{tmp}/r.md"],
     "rater A is either a judge (--judge-a-url, --judge-a-model) or --use-saved-verdicts: give one"),
    (["{tmp}/items.jsonl", *JUDGE_A, "--use-saved-verdicts", "--permute", "--output", "{tmp}/r.md"], "give only one"),
    (["{tmp}/items.jsonl", "--judge-a-url", "http://127.0.0.1:1", "--permute", "--output", "{tmp}/r.md"],
     "--judge-a-url and --judge-a-model go together"),
    (["{tmp}/items.jsonl", *JUDGE_A, "--labels", "{tmp}/labels.jsonl", "--judge-b-url", "u", "--judge-b-model", "b",
      "--output", "{tmp}/r.md"], "rater B is either a judge (--judge-b-url, --judge-b-model) or --labels"),
    (["{tmp}/missing.jsonl", *JUDGE_A, "--permute", "--output", "{tmp}/r.md"], "{tmp}/missing.jsonl does not exist"),
    (["{tmp}/bad.jsonl", *JUDGE_A, "--permute", "--output", "{tmp}/r.md"], "{tmp}/bad.jsonl:1: missing key"),
    (["{tmp}/empty.jsonl", *JUDGE_A, "--permute", "--output", "{tmp}/r.md"], "{tmp}/empty.jsonl holds no items"),
    (["{tmp}/items.jsonl", *SAVED_AND_LABELS, "--output", "{tmp}/r.md"],
     "{tmp}/labels.jsonl:1: no item has the id 'step-1/9'"),
    (["{tmp}/items.jsonl", *JUDGE_A, "--repeats", "2", "--output", "{tmp}/r.md"], "--repeats needs --temperature > 0"),
    (["{tmp}/items.jsonl", *JUDGE_A, "--repeats", "0", "--output", "{tmp}/r.md"], "argument --repeats: must be >= 1"),
    (["{tmp}/items.jsonl", *JUDGE_A, "--pad-chars", "-1", "--output", "{tmp}/r.md"], "--pad-chars must be >= 0"),
    (["{tmp}/items.jsonl", *JUDGE_A, "--permute", "--temperature", "-1", "--output", "{tmp}/r.md"],
     "--temperature must be >= 0"),
    (["{tmp}/items.jsonl", *JUDGE_A, "--sample", "0", "--output", "{tmp}/r.md"], "argument --sample: must be >= 1"),
    (["{tmp}/items.jsonl", *JUDGE_A, "--format", "vibes", "--output", "{tmp}/r.md"], "invalid choice: 'vibes'"),
    (["{tmp}/items.jsonl", *JUDGE_A, "--permute", "--format", "grounded", "--output", "{tmp}/r.md"],
     "--format grounded shows the judge each item's reference (its grounding passage); 4 items have none, the "
     "first 'step-1/0'"),
    (["{tmp}/items.jsonl", *JUDGE_A, "--output", "{tmp}/r.md"], "nothing to measure"),
    (["{tmp}/items.jsonl", "--use-saved-verdicts", "--permute", "--output", "{tmp}/r.md"], "they need a judge"),
    (["{tmp}/unjudged.jsonl", "--use-saved-verdicts", "--judge-b-url", "u", "--judge-b-model", "b",
      "--output", "{tmp}/r.md"], "--use-saved-verdicts: no item of {tmp}/unjudged.jsonl has a saved verdict"),
]


@pytest.mark.parametrize("args, message", BAD_INPUTS)
def test_each_bad_input_is_one_line_naming_the_problem(inputs, capsys, args, message):
    status, err = run_cli(["judge-agreement", *(arg.replace("{tmp}", str(inputs)) for arg in args)], capsys)
    assert status == 2
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("rubric-jax judge-agreement: ") and "Traceback" not in err
    assert message.replace("{tmp}", str(inputs)) in err


# ---------------------------------------------------------------- failed verdicts: left out, counted; nothing left


def strict_loads(text: str):
    """json.loads refusing NaN and +-Infinity (Python reads them; JSON has none)."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_failures_on_both_sides_are_left_out_and_counted(tmp_path, capsys):
    items = write_items(tmp_path / "items.jsonl")
    output = tmp_path / "report.md"
    with StandinServer(responder=verifier(primacy=False, fails_on="nothing")) as a, \
            StandinServer(responder=verifier(primacy=False, fails_on="apples")) as b:
        status = cli.main(["judge-agreement", str(items), "--output", str(output), "--format", "rlcer_verifier",
                           "--judge-a-url", a.base_url, "--judge-a-model", "a",
                           "--judge-b-url", b.base_url, "--judge-b-model", "b"])
    out, err = capsys.readouterr()
    assert status == 0 and "nothing compared" not in err
    a_vs_b = strict_loads(output.with_suffix(".json").read_text())["a_vs_b"]
    # A fails on item 3 ("nothing"), B on item 1 ("apples"): items 0 and 2 are compared, both judges honest
    assert a_vs_b["items_compared"] == 2 and a_vs_b["overall"]["pairs"] == 4 and a_vs_b["overall"]["agreement"] == 1
    assert a_vs_b["excluded"] == {"first": {"missing": 0, "failed": 1, "failed_by_reason": {"no_json": 1}},
                                  "second": {"missing": 0, "failed": 1, "failed_by_reason": {"no_json": 1}}}
    assert "Items compared: 2 of 4. Excluded: A failed on 1 (no_json 1), has no rating for 0; B failed on 1 " \
           "(no_json 1), has no rating for 0." in out


def test_judges_that_never_parse_compare_nothing_and_exit_1(tmp_path, capsys):
    """Two judges whose every answer is prose: no agreement is reported (the issue's "100% over 35 pairs"), the
    failures are counted, the command exits 1 with one line saying why; the JSON stays strict (NaN as null)."""
    items = write_items(tmp_path / "items.jsonl")
    output = tmp_path / "report.md"
    with StandinServer(responder=lambda messages: "Looks fine to me.") as a, \
            StandinServer(responder=verifier(primacy=False, fails_on="nothing")) as b:
        status = cli.main(["judge-agreement", str(items), "--output", str(output), "--format", "rlcer_verifier",
                           "--judge-a-url", a.base_url, "--judge-a-model", "a",
                           "--judge-b-url", b.base_url, "--judge-b-model", "b", "--permute"])
    out, err = capsys.readouterr()
    assert status == 1
    reason = ("A vs B: no item was rated by both (A failed on 4 (no_json 4), has no rating for 0; B failed on 1 "
              "(no_json 1), has no rating for 0)")
    position = ("Position: criteria permuted: no item was rated by both (original order failed on 4 (no_json 4), "
                "has no rating for 0; permuted failed on 4 (no_json 4), has no rating for 0)")
    assert err.endswith(f"\nrubric-jax judge-agreement: nothing compared in {reason}; {position}\n")
    report = strict_loads(output.with_suffix(".json").read_text())
    assert report["incomparable"] == [reason, position]
    assert report["a_vs_b"]["overall"] == {"pairs": 0, "agreement": None, "kappa": None, "confusion": [[0, 0], [0, 0]]}
    assert f"**Nothing compared** in {reason}; {position}." in out and out == output.read_text()


def test_items_without_criteria_compare_nothing(tmp_path, capsys):
    items = tmp_path / "items.jsonl"
    write_judged_rollouts(items, [JudgedRollout(id="x", step=1, request=JudgeRequest("Q?", "A.", Rubric(())),
                                                verdict=RolloutVerdict(satisfied=()))])
    labels = tmp_path / "labels.jsonl"
    labels.write_text('{"id": "x", "satisfied": []}\n')
    status, err = run_cli(["judge-agreement", str(items), "--use-saved-verdicts", "--labels", str(labels),
                           "--output", str(tmp_path / "report.md")], capsys)
    assert status == 1
    assert err.endswith("rubric-jax judge-agreement: nothing compared in A vs B: the 1 items compared have no "
                        "criteria\n")
