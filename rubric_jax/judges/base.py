"""The judge interface: requests in, fixed-shape verdict arrays [B, K] out, with a failure flag per rollout.

Conventions (DESIGN.md; `rubric_jax.core.srar`):
- `satisfied_bk` [B, K] float32 in [0, 1] (0 / 1 for binary judges), item k of rollout b's rubric; items past the
  rubric's length (padding to K = max_items) are 0.
- `item_step_bk` [B, K] int32: the step the judge attributed the item to (k >= 1 a `### Step k:` step, 0 the whole
  response), -1 when there is no attribution (judges that do not attribute, padding, failures).
- A judge that fails on a rollout (an unparsable output, a request that failed, a check that raised) marks it in
  `failed_b` with a reason, and the rollout gets every item unsatisfied and step -1: SRaR's convention ("any
  failure -> every item not satisfied", REFERENCE.md section 2), which takes it out of every step group. What
  its reward becomes is the algorithm's `rubric_jax.rubrics.parsing.FailurePolicy` (zero reward or excluded).
- A failed LLM call keeps the judge's raw answer (`RolloutVerdict.answer`, `Verdicts.answers`), cut to its first
  ANSWER_CHARS characters by `kept_answer`, so a rollout log shows what the judge wrote.
- A failure never raises; a programmer error (a request that is not a JudgeRequest, a rubric longer than
  max_items, a judge misconfigured for the rubric) raises ValueError naming the field.
"""

import abc
import collections
import dataclasses
import math
from typing import Mapping, Optional, Sequence

import numpy as np

from rubric_jax.inference.http import ClientStats
from rubric_jax.rubrics.schema import Rubric

_INT32 = np.iinfo(np.int32)
ANSWER_CHARS = 300  # of a failed call's raw answer kept in its verdict
_CUT_MARK = " [... cut: {} characters in all]"
_MAX_KEPT_CHARS = ANSWER_CHARS + len(_CUT_MARK.format(10**20))


def kept_answer(text: str) -> str:
    """A judge's raw answer as a failed verdict keeps it: whole up to ANSWER_CHARS characters, else its first
    ANSWER_CHARS and a mark saying it was cut and how long it was."""
    return text if len(text) <= ANSWER_CHARS else text[:ANSWER_CHARS] + _CUT_MARK.format(len(text))


@dataclasses.dataclass(frozen=True)
class JudgeRequest:
    """One rollout to judge: the question, the response text, the rubric to judge it against, an optional
    reference (ground truth, or the privileged grounding passage of rubric-grounded GRPO), the response's
    number of steps (SRaR's judge attributes items to steps 1..num_steps), when known, and the conversation the
    response answers (the task's prompt messages; HealthBench's grader reads every turn), when known."""

    question: str
    response: str
    rubric: Rubric
    reference: Optional[str] = None
    num_steps: Optional[int] = None
    conversation: Optional[tuple[Mapping[str, str], ...]] = None

    def __post_init__(self):
        for field in ("question", "response"):
            if not isinstance(getattr(self, field), str):
                raise ValueError(f"{field} must be a str, got {type(getattr(self, field)).__name__}")
        if self.reference is not None and not isinstance(self.reference, str):
            raise ValueError(f"reference must be None or a str, got {type(self.reference).__name__}")
        if not isinstance(self.rubric, Rubric):
            raise ValueError(f"rubric must be a Rubric, got {type(self.rubric).__name__}")
        if self.conversation is not None:
            conversation = tuple(self.conversation)
            if not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                       for m in conversation):
                raise ValueError("conversation must be a sequence of {role, content} messages")
            object.__setattr__(self, "conversation", conversation)
        if self.num_steps is not None and (
            isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int) or self.num_steps < 0
        ):
            raise ValueError(f"num_steps must be None or a non-negative int, got {self.num_steps!r}")


@dataclasses.dataclass(frozen=True)
class RolloutVerdict:
    """One rollout's judgement before padding: one score in [0, 1] per rubric item, the items' steps (None: no
    attribution), and, for a failure, a short `reason` code (counted by metrics), a free-text `detail` and the
    raw `answer` of the failed call ("" when there was none, e.g. a request that failed; `kept_answer`: at most
    ANSWER_CHARS characters and a cut mark).

    A failure carries no scores: `RolloutVerdict.failure(reason, detail, answer)`. Values outside [0, 1], non-finite
    scores, or steps that do not match the scores are programmer errors (ValueError): a judge turns bad model
    output into a failure before building a verdict.
    """

    satisfied: tuple[float, ...] = ()
    item_step: Optional[tuple[int, ...]] = None
    reason: str = ""
    detail: str = ""
    answer: str = ""

    def __post_init__(self):
        satisfied = tuple(float(s) for s in self.satisfied)
        if not all(math.isfinite(s) and 0.0 <= s <= 1.0 for s in satisfied):
            raise ValueError(f"satisfied must be finite scores in [0, 1], got {satisfied}")
        object.__setattr__(self, "satisfied", satisfied)
        if self.item_step is not None:
            item_step = tuple(int(k) for k in self.item_step)
            if len(item_step) != len(satisfied):
                raise ValueError(f"item_step has {len(item_step)} entries for {len(satisfied)} items")
            if not all(_INT32.min <= k <= _INT32.max for k in item_step):
                raise ValueError(f"item_step must fit int32, got {item_step}")
            object.__setattr__(self, "item_step", item_step)
        if not all(isinstance(text, str) for text in (self.reason, self.detail, self.answer)):
            raise ValueError("reason, detail and answer must be str")
        if self.reason and (satisfied or self.item_step):
            raise ValueError(f"a failed verdict ({self.reason!r}) carries no scores or steps")
        if (self.detail or self.answer) and not self.reason:
            raise ValueError("detail or answer without a failure reason")
        check_answer(self.answer)

    @classmethod
    def failure(cls, reason: str, detail: str = "", answer: str = "") -> "RolloutVerdict":
        if not reason:
            raise ValueError("a failure needs a non-empty reason")
        return cls(reason=reason, detail=detail, answer=answer)

    @property
    def failed(self) -> bool:
        return bool(self.reason)


@dataclasses.dataclass(frozen=True)
class Verdicts:
    """A batch of judgements (module docstring): `satisfied_bk` float32 [B, K], `item_step_bk` int32 [B, K],
    `failed_b` bool [B], `reasons` ("" when ok, a short code when failed), `details` (free text, "" when ok;
    empty tuple = all "") and `answers` (a failed call's kept raw answer, as `RolloutVerdict.answer`; empty tuple =
    all ""). Validated on construction: shapes, dtypes, scores in [0, 1], and the failure
    convention (a failed row has a reason, scores 0 and steps -1; an ok row has no reason). The arrays are
    read-only copies."""

    satisfied_bk: np.ndarray
    item_step_bk: np.ndarray
    failed_b: np.ndarray
    reasons: tuple[str, ...]
    details: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()

    def __post_init__(self):
        satisfied = np.array(self.satisfied_bk, np.float32)  # copies, made read-only below
        steps = np.array(self.item_step_bk)
        failed = np.array(self.failed_b)
        if satisfied.ndim != 2 or steps.shape != satisfied.shape or failed.shape != satisfied.shape[:1]:
            raise ValueError(
                f"satisfied_bk [B, K], item_step_bk [B, K] and failed_b [B] disagree: {satisfied.shape}, "
                f"{steps.shape}, {failed.shape}"
            )
        if not np.issubdtype(steps.dtype, np.integer) or failed.dtype != bool:
            raise ValueError(f"item_step_bk must be integers and failed_b bool, got {steps.dtype}, {failed.dtype}")
        if steps.size and not _INT32.min <= steps.min() <= steps.max() <= _INT32.max:
            raise ValueError("item_step_bk must fit int32")
        if not (np.isfinite(satisfied).all() and (satisfied >= 0).all() and (satisfied <= 1).all()):
            raise ValueError("satisfied_bk must be finite and in [0, 1]")
        reasons = tuple(self.reasons)
        details = tuple(self.details) or ("",) * len(reasons)
        answers = tuple(self.answers) or ("",) * len(reasons)
        if not len(reasons) == len(details) == len(answers) == len(failed):
            raise ValueError(f"reasons, details and answers need one entry per rollout ({len(failed)})")
        if [bool(r) for r in reasons] != failed.tolist():
            raise ValueError("a rollout is failed exactly when it has a reason")
        if any(answer and not reason for reason, answer in zip(reasons, answers)):
            raise ValueError("an answer is kept for a failed rollout only")
        for answer in answers:
            check_answer(answer)
        if (satisfied[failed] != 0).any() or (steps[failed] != -1).any():
            raise ValueError("a failed rollout must have every item unsatisfied and step -1")
        steps = steps.astype(np.int32)
        for array in (satisfied, steps, failed):
            array.setflags(write=False)
        object.__setattr__(self, "satisfied_bk", satisfied)
        object.__setattr__(self, "item_step_bk", steps)
        object.__setattr__(self, "failed_b", failed)
        object.__setattr__(self, "reasons", reasons)
        object.__setattr__(self, "details", details)
        object.__setattr__(self, "answers", answers)

    @classmethod
    def from_rollouts(cls, verdicts: Sequence[RolloutVerdict], max_items: int) -> "Verdicts":
        """Pad per-rollout verdicts to [B, K = max_items]: padding 0 / -1, no attribution -1, a failure all
        unsatisfied with step -1. ValueError if a verdict has more than max_items items."""
        check_max_items(max_items)
        shape = (len(verdicts), max_items)
        satisfied = np.zeros(shape, np.float32)
        steps = np.full(shape, -1, np.int32)
        for b, verdict in enumerate(verdicts):
            if not isinstance(verdict, RolloutVerdict):
                raise ValueError(f"verdicts[{b}] must be a RolloutVerdict, got {type(verdict).__name__}")
            n = len(verdict.satisfied)
            if n > max_items:
                raise ValueError(f"verdicts[{b}] has {n} items, more than max_items={max_items}")
            satisfied[b, :n] = verdict.satisfied
            if verdict.item_step is not None:
                steps[b, :n] = verdict.item_step
        return cls(
            satisfied_bk=satisfied,
            item_step_bk=steps,
            failed_b=np.array([v.failed for v in verdicts], bool).reshape(-1),
            reasons=tuple(v.reason for v in verdicts),
            details=tuple(v.detail for v in verdicts),
            answers=tuple(v.answer for v in verdicts),
        )

    @classmethod
    def concatenate(cls, parts: Sequence["Verdicts"]) -> "Verdicts":
        """The rows of `parts` (all of one width K) in order, as one batch."""
        widths = {part.satisfied_bk.shape[1] for part in parts}
        if len(widths) > 1:
            raise ValueError(f"verdicts of different widths cannot be concatenated: {sorted(widths)}")
        width = widths.pop() if widths else 0
        return cls(
            satisfied_bk=np.concatenate([p.satisfied_bk for p in parts]) if parts else np.zeros((0, width)),
            item_step_bk=np.concatenate([p.item_step_bk for p in parts]) if parts else np.zeros((0, width), int),
            failed_b=np.concatenate([p.failed_b for p in parts]) if parts else np.zeros(0, bool),
            reasons=tuple(r for p in parts for r in p.reasons),
            details=tuple(d for p in parts for d in p.details),
            answers=tuple(a for p in parts for a in p.answers),
        )

    def widened(self, max_items: int) -> "Verdicts":
        """These verdicts with K = `max_items` (>= the current K) columns, the new ones unsatisfied and attributed to
        no step (-1), as a judge asked with that K returns them."""
        extra = max_items - self.satisfied_bk.shape[1]
        if extra < 0:
            raise ValueError(f"widened to {max_items} columns, fewer than the {self.satisfied_bk.shape[1]} held")
        return dataclasses.replace(self, satisfied_bk=np.pad(self.satisfied_bk, ((0, 0), (0, extra))),
                                   item_step_bk=np.pad(self.item_step_bk, ((0, 0), (0, extra)), constant_values=-1))

    def take(self, rows: np.ndarray) -> "Verdicts":
        """The rows `rows` (indices, in that order) as one batch."""
        return type(self)(
            satisfied_bk=self.satisfied_bk[rows], item_step_bk=self.item_step_bk[rows], failed_b=self.failed_b[rows],
            reasons=tuple(self.reasons[r] for r in rows), details=tuple(self.details[r] for r in rows),
            answers=tuple(self.answers[r] for r in rows),
        )

    def failure_counts(self) -> collections.Counter:
        """Failed rollouts counted by reason."""
        return collections.Counter(reason for reason in self.reasons if reason)


def check_answer(answer: str) -> None:
    """ValueError unless `answer` is a str no longer than `kept_answer` leaves one."""
    if not isinstance(answer, str) or len(answer) > _MAX_KEPT_CHARS:
        raise ValueError(f"a kept answer is a str of at most {_MAX_KEPT_CHARS} characters (`kept_answer`)")


def check_max_items(max_items: int) -> None:
    if isinstance(max_items, bool) or not isinstance(max_items, (int, np.integer)) or max_items < 0:
        raise ValueError(f"max_items must be a non-negative int, got {max_items!r}")


def check_requests(requests: Sequence[JudgeRequest], max_items: int) -> None:
    """ValueError unless every request is a JudgeRequest whose rubric has at most max_items criteria."""
    check_max_items(max_items)
    for b, request in enumerate(requests):
        if not isinstance(request, JudgeRequest):
            raise ValueError(f"requests[{b}] must be a JudgeRequest, got {type(request).__name__}")
        if len(request.rubric.criteria) > max_items:
            raise ValueError(
                f"requests[{b}].rubric has {len(request.rubric.criteria)} criteria, more than max_items={max_items}"
            )


class Judge(abc.ABC):
    """Judges B rollouts against their rubrics into Verdicts [B, K = max_items] (module docstring)."""

    @abc.abstractmethod
    def judge(self, requests: Sequence[JudgeRequest], max_items: int) -> Verdicts:
        """Synchronous judgement of `requests`, in order."""

    async def ajudge(self, requests: Sequence[JudgeRequest], max_items: int) -> Verdicts:
        """Asynchronous judgement. This default runs `judge` inline, on the event loop's thread: CPU judges are
        quick, and the outcome verifier's time limits are cheapest on the main thread. Network judges override
        it with concurrent requests."""
        return self.judge(requests, max_items)

    @property
    def unrecorded(self) -> "Judge":
        """This judge without any recording of its calls: itself, or a recorder's inner judge. A caller that judges
        in pieces (`algorithms.base.sample_and_judge`: group by group as they finish) calls it, then `record`s
        every row once in row order, so the record does not depend on which piece finished first."""
        return self

    def record(self, requests: Sequence[JudgeRequest], verdicts: Verdicts) -> None:
        """Verdicts of `requests` that reached the caller outside `judge` / `ajudge` (judged through `unrecorded`,
        or a failed sample's, decided without asking: `algorithms.base.judge_requests`): nothing to do by
        default; a recorder (`records.RecordingJudge`) keeps them."""

    def http_stats(self) -> Optional[ClientStats]:
        """The request counters (retries, failures) of the judge's HTTP client; None for judges without one."""
        return None

    def format_metrics(self) -> dict[str, float]:
        """An LLM judge's response-format dialect (`llm.ChatClient.format_metrics`); {} for judges without a chat
        server."""
        return {}

    def call_counts(self) -> dict[str, int]:
        """An LLM judge's calls since its creation (`llm.call_counts`: answers read, failed calls by reason,
        schema violations), which a run turns into per-step counts; {} for judges without a chat server."""
        return {}

    def close(self) -> None:
        """Releases the judge's connections (its HTTP client's); a no-op for judges without any."""
