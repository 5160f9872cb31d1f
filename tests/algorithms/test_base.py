"""The recipes' shared host-side helpers: summary statistics of a batch, by hand and against NumPy; merging the
rows of batches with different prompt and response widths; the trainer's row padding; the prompt cap of
`sample_groups` (verl's truncation modes by hand and as properties, what the engine and the learner receive, the
counts in the metrics)."""

import dataclasses
import json
import math
import types

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.algorithms.base import (
    RolloutContext, Rollouts, concat_batches, criterion_metric_keys, criterion_metrics, has_outcome,
    padded_prompt_width, rollout_metrics, rubric_metrics, sample_groups, summary_stats, truncate_prompt)
from rubric_jax.data.tasks import build_task
from rubric_jax.inference.engine import RolloutEngine, Sample, SamplingParams, prompt_token_ids
from rubric_jax.judges.base import RolloutVerdict, Verdicts
from rubric_jax.models.train_step import pack_sequences
from rubric_jax.rubrics.schema import Criterion, Rubric
from rubric_jax.training.data_parallel import pad_rows
from rubric_jax.training.metrics import PhaseTimer
from tests.data.dataset_fixtures import fixture_path


def numpy_stats(name: str, selected: np.ndarray) -> dict:
    return {f"{name}/mean": selected.mean(), f"{name}/std": selected.std(), f"{name}/min": selected.min(),
            f"{name}/max": selected.max()}


def test_summary_stats_by_hand_with_and_without_mask():
    values = jnp.asarray([[1.0, 2.0, 3.0], [4.0, 100.0, 6.0]])
    assert summary_stats("reward", values) == pytest.approx(
        {"reward/mean": 116 / 6, "reward/std": float(np.std([1, 2, 3, 4, 100, 6])), "reward/min": 1.0,
         "reward/max": 100.0}
    )
    mask = [[True, False, True], [False, False, True]]
    stats = summary_stats("reward", values, mask)
    assert stats == pytest.approx({"reward/mean": 10 / 3, "reward/std": math.sqrt(38 / 9), "reward/min": 1.0,
                                   "reward/max": 6.0})
    assert all(type(v) is float for v in stats.values())


def test_summary_stats_of_nothing_is_empty_and_shapes_must_match():
    assert summary_stats("x", [1.0, 2.0], [False, False]) == {}
    assert summary_stats("x", []) == {}
    with pytest.raises(ValueError, match="shape"):
        summary_stats("x", [1.0, 2.0], [True])


@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.booleans()), min_size=1, max_size=40))
def test_summary_stats_matches_numpy(pairs):
    values = np.array([v for v, _ in pairs])
    mask = np.array([m for _, m in pairs])
    assert summary_stats("v", values) == pytest.approx(numpy_stats("v", values), rel=1e-9, abs=1e-9)
    expected = numpy_stats("v", values[mask]) if mask.any() else {}
    assert summary_stats("v", values, mask) == pytest.approx(expected, rel=1e-9, abs=1e-9)


def packed(prompts, responses, prompt_width, response_width, pad_id=0):
    batch = pack_sequences(prompts, responses, pad_id=pad_id, prompt_width=prompt_width,
                           response_width=response_width)
    batch["advantages_bt"] = np.where(batch["response_mask_bt"], 1.0 + np.arange(len(prompts))[:, None], 0.0)
    batch["reward"] = np.arange(len(prompts), dtype=np.float32)
    return batch


def test_concat_batches_equals_packing_every_row_at_the_common_widths():
    short = ([[5, 6]], [[7, 8, 9]])
    long = ([[5, 6, 7, 8, 9], [3]], [[4], [4, 4, 4, 4, 4, 4]])
    merged, width = concat_batches([(packed(*short, 2, 3), 2), (packed(*long, 5, 6), 5)], pad_id=0)
    assert width == 5
    direct = pack_sequences(short[0] + long[0], short[1] + long[1], pad_id=0, prompt_width=5, response_width=6)
    for key, value in direct.items():
        np.testing.assert_array_equal(merged[key], value, err_msg=key)
    # Per-token extras move with their tokens; per-row arrays are concatenated as they are.
    np.testing.assert_array_equal(merged["advantages_bt"][merged["response_mask_bt"]], [1, 1, 1] + [1] + [2] * 6)
    np.testing.assert_array_equal(merged["advantages_bt"][~merged["response_mask_bt"]], 0)
    np.testing.assert_array_equal(merged["reward"], [0, 0, 1])


def test_concat_batches_rejects_mismatched_parts():
    with pytest.raises(ValueError, match="at least one"):
        concat_batches([], pad_id=0)
    a, b = packed([[1]], [[2]], 1, 1), packed([[1]], [[2]], 1, 1)
    del b["reward"]
    with pytest.raises(ValueError, match="different keys"):
        concat_batches([(a, 1), (b, 1)], pad_id=0)
    bad = packed([[1]], [[2]], 1, 1)
    bad["advantages_bt"] = np.zeros((1, 5))
    with pytest.raises(ValueError, match="advantages_bt"):
        concat_batches([(bad, 1)], pad_id=0)


def test_pad_rows_appends_masked_copies_of_row_zero():
    batch = packed([[1], [2, 3], [4]], [[5, 6], [7], [8, 9]], 2, 2)
    padded = pad_rows(batch, 4)
    assert padded["tokens_bt"].shape == (4, 4) and padded["reward"].shape == (4,)
    np.testing.assert_array_equal(padded["tokens_bt"][3], batch["tokens_bt"][0])
    assert not padded["response_mask_bt"][3].any() and padded["response_mask_bt"][:3].sum() == 5
    assert batch["tokens_bt"].shape == (3, 4) and batch["response_mask_bt"].sum() == 5  # the input is untouched
    assert pad_rows(batch, 3) is batch


# ---------------------------------------------------------------- the prompt cap


def test_truncate_prompt_by_hand_in_each_of_verls_modes():
    ids = list(range(10))
    assert truncate_prompt(ids, 4, "left") == [6, 7, 8, 9]
    assert truncate_prompt(ids, 4, "right") == [0, 1, 2, 3]
    assert truncate_prompt(ids, 5, "middle") == [0, 1, 7, 8, 9]  # the first 5 // 2 = 2, the last 3
    assert truncate_prompt(ids, 4, "middle") == [0, 1, 8, 9]
    assert truncate_prompt(ids, 10, "error") == ids  # within the cap: unchanged in every mode
    with pytest.raises(ValueError, match="10 tokens exceeds max_prompt_tokens=9"):
        truncate_prompt(ids, 9, "error")
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        truncate_prompt(ids, 0, "left")
    with pytest.raises(ValueError, match="unknown prompt_truncation"):
        truncate_prompt(ids, 3, "top")


@given(st.lists(st.integers(0, 99), min_size=1, max_size=40), st.integers(1, 45),
       st.sampled_from(["left", "right", "middle"]))
def test_a_truncated_prompt_is_a_head_and_a_tail_of_the_prompt_within_the_cap(ids, cap, mode):
    cut = truncate_prompt(ids, cap, mode)
    assert len(cut) == min(len(ids), cap)
    if len(ids) <= cap:
        assert cut == ids
        return
    head = {"left": 0, "right": cap, "middle": cap // 2}[mode]
    assert cut[:head] == ids[:head] and cut[head:] == ids[len(ids) - (cap - head):]


class EchoEngine(RolloutEngine):
    """Records the prompts of each call and answers each with the one token 5."""

    weight_version = "echo"

    def __init__(self):
        self.calls = []

    def generate(self, prompts, params):
        self.calls.append(list(prompts))
        return [Sample(prompt_index=i, output_ids=(5,), logprobs=(-1.0,), finish_reason="stop", matched_stop=5,
                       weight_version=self.weight_version) for i in range(len(prompts)) for _ in range(params.n)]

    async def agenerate(self, prompts, params):
        return self.generate(prompts, params)

    def update_weights(self, model, version):
        raise NotImplementedError


def test_sample_groups_truncates_prompts_over_the_cap_and_counts_them():
    task = build_task("arithmetic", {}, 0)
    tokenizer = task.tokenizer()
    short = [{"role": "user", "content": "1 + 2"}]
    long = [{"role": "user", "content": "1 + 2 " * 20}]
    short_ids, long_ids = (prompt_token_ids(p, tokenizer) for p in (short, long))
    cap = len(short_ids) + 3
    assert len(long_ids) > cap
    engine = EchoEngine()
    context = RolloutContext(engine=engine, tokenizer=tokenizer, task=task, judge=None, pad_id=0, seed=0,
                             sampling=SamplingParams(max_new_tokens=2, n=2), timer=PhaseTimer(),
                             max_prompt_tokens=cap, prompt_truncation="left")
    rollouts = sample_groups([short, long], context, step=0)
    # The engine gets the short prompt as it was and the long one as its last `cap` token ids.
    assert engine.calls == [[short, long_ids[-cap:]]]
    assert rollouts.prompt_width == padded_prompt_width([long_ids[-cap:]])
    np.testing.assert_array_equal(rollouts.batch["tokens_bt"][2:, rollouts.prompt_width - cap:rollouts.prompt_width],
                                  [long_ids[-cap:]] * 2)
    assert context.sampling_metrics == {"prompt/truncated": 1, "prompt/length_max": len(long_ids),
                                        "rollout/samples": 4, "rollout/null_logprobs": 0, "rollout/stale": 0}
    sample_groups([long, long], context, step=1)  # counts add up over the calls of a step
    assert context.sampling_metrics == {"prompt/truncated": 3, "prompt/length_max": len(long_ids),
                                        "rollout/samples": 8, "rollout/null_logprobs": 0, "rollout/stale": 0}

    uncapped = RolloutContext(engine=EchoEngine(), tokenizer=tokenizer, task=task, judge=None, pad_id=0, seed=0,
                              sampling=SamplingParams(max_new_tokens=2, n=2), timer=PhaseTimer())
    assert sample_groups([short, long], uncapped, step=0).prompt_width == padded_prompt_width([long_ids])
    assert uncapped.engine.calls == [[short, long]]
    assert {k: v for k, v in uncapped.sampling_metrics.items() if k.startswith("prompt/")} == {
        "prompt/truncated": 0, "prompt/length_max": len(long_ids)}
    with pytest.raises(ValueError, match="exceeds max_prompt_tokens"):
        sample_groups([long], dataclasses.replace(context, prompt_truncation="error"), step=0)


# ---------------------------------------------------------------- per-criterion metric keys, outcome metrics


def _verdicts(*rows):
    return Verdicts.from_rollouts([RolloutVerdict(satisfied=row) for row in rows], max(map(len, rows)))


def test_unnamed_criteria_of_different_rubrics_are_reported_by_tag_never_by_position():
    first = Rubric((Criterion("calls for help", 10, tags=("axis:accuracy",)),
                    Criterion("is concise", 5, tags=("axis:communication",))))
    second = Rubric((Criterion("asks the age", 5, tags=("axis:completeness",)),
                     Criterion("no dosage", -5, tags=("axis:accuracy",))))
    metrics = criterion_metrics(_verdicts((1.0, 0.0), (1.0, 0.5)), [first, second])
    # axis:accuracy: first's item 0 (1) and second's item 1 (0.5); the others one criterion each
    assert metrics == {"rubric/tag/axis:accuracy": 0.75, "rubric/tag/axis:communication": 0.0,
                       "rubric/tag/axis:completeness": 1.0}
    untagged = Rubric((Criterion("x"), Criterion("y", tags=("a", "b"))))
    assert criterion_metrics(_verdicts((1.0, 0.0), (0.0, 1.0)), [untagged, untagged]) == {
        "rubric/untagged": 0.5, "rubric/tag/a": 0.5, "rubric/tag/b": 0.5}


def test_recurring_names_are_keys_and_the_others_go_by_tag():
    rows = [Rubric((Criterion("a", name="shared", tags=("t",)), Criterion("b", name="only_here", tags=("t",)))),
            Rubric((Criterion("c", name="shared"),))]
    verdicts = _verdicts((1.0, 0.0), (0.0,))
    task = types.SimpleNamespace(recurring_criterion_names=frozenset({"shared"}))
    assert criterion_metrics(verdicts, rows, task) == {"rubric/shared": 0.5, "rubric/tag/t": 0.0}
    # a task that does not say: every name recurs (the built-in tasks' shared names)
    assert criterion_metrics(verdicts, rows) == {"rubric/shared": 0.5, "rubric/only_here": 0.0}
    assert criterion_metric_keys(Criterion("d", name="n", tags=("t",)), frozenset()) == ("rubric/tag/t",)


def test_rubric_metrics_keeps_its_judge_lines_beside_the_criterion_keys():
    verdicts = Verdicts.from_rollouts([RolloutVerdict(satisfied=(1.0,)), RolloutVerdict.failure("parse")], 1)
    rubric = Rubric((Criterion("a", name="n"),))
    metrics = rubric_metrics(verdicts, [rubric, rubric])
    assert metrics["rubric/n"] == 0.5 and metrics["judge/failure_rate"] == 0.5
    assert metrics["judge/failed/parse"] == 1.0


def test_the_arithmetic_task_keeps_its_named_keys():
    task = build_task("arithmetic", {}, 0)
    rubrics = [task.rubric(e) for e in task.eval_examples(2)]
    verdicts = _verdicts(*[(1.0,) * len(r.criteria) for r in rubrics])
    keys = set(criterion_metrics(verdicts, rubrics, task))
    assert keys == {f"rubric/{c.name}" for r in rubrics for c in r.criteria}
    assert all(not key.startswith(("rubric/tag/", "rubric/untagged")) for key in keys)


def test_a_dataset_task_without_answers_says_so_and_knows_its_recurring_names(tmp_path):
    healthbench = build_task("dataset", {"preset": "healthbench", "path": str(fixture_path("healthbench"))}, 0)
    assert not has_outcome(healthbench) and has_outcome(build_task("arithmetic", {}, 0))
    assert has_outcome(object())  # a task that does not say has answers
    # "Safety" in rows 0 and 2 (one of them held out), "Once" and "Twice in one row" in one row each
    def item(title, text):
        return {"title": title, "description": text, "weight": 1}

    rows = [[item("Safety", "a"), item("Once", "b")], [item("Twice in one row", "c"), item("Twice in one row", "d")],
            [item("Safety", "e")]]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "reference_answer": "r", "rubric": rubric}) + "\n"
                            for i, rubric in enumerate(rows)))
    task = build_task("dataset", {"preset": "rar", "path": str(path), "eval_size": 1}, 0)
    assert task.recurring_criterion_names == {"Safety"}


def test_rollout_metrics_leave_out_accuracy_for_a_task_without_outcome_answers():
    samples = [Sample(prompt_index=0, output_ids=(1, 2), logprobs=(0.0, 0.0), finish_reason="stop",
                      matched_stop=None, weight_version="v")]
    rollouts = Rollouts(samples, ["ab"], {}, 0)
    with_outcome = rollout_metrics(rollouts, np.array([True]), types.SimpleNamespace())
    assert with_outcome["outcome/accuracy"] == 1.0
    without = rollout_metrics(rollouts, np.array([False]), types.SimpleNamespace(has_outcome=False))
    assert without.keys() == with_outcome.keys() - {"outcome/accuracy"}
