"""Judges: rubric verdicts [B, K] for a batch of rollouts, and outcome verification of final answers.

base.py          `JudgeRequest`, `RolloutVerdict`, `Verdicts` (satisfied_bk, item_step_bk, failed_b, reasons) with
                 the failure convention (a failed rollout: every item unsatisfied, step -1, the failed call's raw
                 answer kept, `kept_answer`), and the `Judge` ABC.
programmatic.py  `ProgrammaticJudge`: criteria checked by registered predicates (`register_check`) or `RegexCheck`s,
                 optionally attributed to a `### Step N:` step (`Attributed`) for SRaR.
llm.py           LLM judges over an OpenAI-compatible chat endpoint: `RolloutLLMJudge` (one call per rollout, all
                 items: SRaR, rubric-grounded, RLCER verifier formats) and `CriterionLLMJudge` (one call per
                 criterion: RGR-GRPO's `{"rating": 0|1}`, HealthBench's grader), on a `ChatClient` with retries
                 and schema fallback; EvoRubric's meta-verifier as an LLM (`LLMMetaVerifier`).
outcome.py       `extract_boxed`, `extract_choice`, `answers_equivalent` (math-verify under a wall-clock limit, in a
                 child process) and `OutcomeVerifier` (0 / 1 score and a reason).
records.py       judged rollouts on disk (JSONL): what a run saves (`RecordingJudge`) and judge-agreement reads.
agreement.py     `rubric-jax judge-agreement`'s statistics (kappa, correlations, self-consistency, position and length
                 probes) and report; imported as `rubric_jax.judges.agreement` (it loads scikit-learn and scipy).
"""

from rubric_jax.judges.base import Judge, JudgeRequest, RolloutVerdict, Verdicts
from rubric_jax.judges.llm import (
    ChatClient,
    ChatSettings,
    CriterionFormat,
    CriterionLLMJudge,
    RolloutFormat,
    LLMMetaVerifier,
    MetaVerifyRequest,
    RolloutLLMJudge,
    grounded_format,
    healthbench_format,
    rating_format,
    rlcer_verifier_format,
    srar_format,
)
from rubric_jax.judges.outcome import (
    OutcomeVerdict,
    OutcomeVerifier,
    answers_equivalent,
    equivalence_status,
    extract_boxed,
    extract_choice,
)
from rubric_jax.judges.programmatic import (
    Attributed,
    ProgrammaticJudge,
    RegexCheck,
    register_check,
    registered_check,
    step_at,
)
from rubric_jax.judges.records import (
    JudgedRollout,
    RecordingJudge,
    read_judged_rollouts,
    verdict_rows,
    with_recipe_values,
    write_judged_rollouts,
)

__all__ = [
    "Attributed",
    "ChatClient",
    "ChatSettings",
    "CriterionFormat",
    "CriterionLLMJudge",
    "Judge",
    "JudgeRequest",
    "JudgedRollout",
    "LLMMetaVerifier",
    "MetaVerifyRequest",
    "OutcomeVerdict",
    "OutcomeVerifier",
    "ProgrammaticJudge",
    "RecordingJudge",
    "RegexCheck",
    "RolloutFormat",
    "RolloutLLMJudge",
    "RolloutVerdict",
    "Verdicts",
    "answers_equivalent",
    "equivalence_status",
    "extract_boxed",
    "extract_choice",
    "grounded_format",
    "healthbench_format",
    "rating_format",
    "read_judged_rollouts",
    "register_check",
    "registered_check",
    "rlcer_verifier_format",
    "srar_format",
    "step_at",
    "verdict_rows",
    "with_recipe_values",
    "write_judged_rollouts",
]
