"""LLM judges over any OpenAI-compatible chat endpoint (SGLang's `/v1/chat/completions` first).

Two ways of asking, as the papers do, each its own judge:
- `RolloutLLMJudge`: one call per rollout with every rubric item (SRaR's step-attributed judge, the
  rubric-grounded judge, RLCER's verifier). Its `RolloutFormat` names the prompt, the output schema and the
  parser.
- `CriterionLLMJudge`: one call per (rollout, criterion), output `{"rating": 0|1}` (RGR-GRPO). Its
  `CriterionFormat` names the same three for one criterion.
Beside the judges, `LLMMetaVerifier` audits generated rubrics rather than rollouts (EvoRubric's meta-verifier):
one call per proposed criterion, on the same `ChatClient` and under the same conventions.

Conventions:
- Request options beside the decoding (`ChatSettings`): `chat_template_kwargs`, the chat template's variables,
  sent as the body's `chat_template_kwargs` (read by SGLang, vLLM and llama.cpp's llama-server; e.g.
  {"enable_thinking": false}: a Qwen3 judge answers without thinking first, so a thought cut by max_tokens cannot
  fail the call), and `extra_body`, fields merged into every body as they are (e.g. {"reasoning_effort": "low"}
  for gpt-oss on SGLang or vLLM); a field the client sets itself (`CLIENT_FIELDS`) is refused. Both are sent
  only when non-empty: `transformers serve` answers 422 to a body with a field outside OpenAI's.
- Low temperature (0 by default), a fixed `max_tokens`, and JSON-schema-constrained decoding when the format
  has a schema, in the first response-format dialect the server takes (`RESPONSE_FORMAT_DIALECTS`): OpenAI's
  `{"type": "json_schema", "json_schema": {...}}` (SGLang, vLLM, llama.cpp's llama-server), then
  `{"type": "json_object", "schema": ...}` (llama-cpp-python's server, which answers 500 to the first), then
  none. A 4xx answer to a request that carried a schema, or a 5xx whose body names the response format or the
  schema, repeats the call in the next dialect; if that succeeds the client keeps that dialect for the rest of
  its life (`ChatClient.dialect`, `dialect_changes`). The parser stays the check in every dialect: a server may
  accept a schema and ignore it (`transformers serve`), which shows as answers sent under a schema that do not
  parse (`ChatClient.schema_violations`, counted by the judges).
- All calls of a batch are issued at once; the `JsonHttpClient` bounds how many are in flight and retries 5xx,
  timeouts, dropped connections and malformed bodies with backoff (its `stats` count them).
- Failures never raise. Every call is counted once in `failures` (a `parsing.FailureCounter`): read, or failed by
  its reason. A call fails when its request fails after its retries ("request_failed"; the transport's reason,
  e.g. "http_503", in the detail), when its answer was cut by max_tokens ("truncated", finish_reason "length",
  whether or not what came back parses: raise max_tokens), or when its answer does not parse or is off the
  parser's bounds (the parser's reason: "no_json", "schema", "out_of_bounds", ...). A failed call keeps its raw
  answer (`judges.base.kept_answer`: the first ANSWER_CHARS characters, marked when cut).
  - One call per rollout: a failed call fails that rollout with the call's reason, detail and answer.
  - One call per criterion (`CriterionLLMJudge`), by default (`failed_criterion="fail_rollout"`): any failed
    call fails the whole rollout, with the reason of its first failed criterion (by index), a detail naming that
    criterion ("criteria[k]") and how many of the rollout's calls failed, and that call's answer. Scoring an
    unknown verdict 0 would bias the reward: an unread pitfall criterion (negative weight) would silently not
    apply, an unread positive one would silently cost points, and a judge that never parses would look like a
    policy that never satisfies anything. `failed_criterion="score_zero"` is RGR-GRPO's own convention ("parse
    failure scores 0", rgr_grpo.txt): a failed answer scores its criterion 0 and the rollout stays judged; the
    call is still counted, so a run's per-step "judge/call_failure_rate" shows it and the failure budget stops
    a run whose judge never parses. A failed request fails the rollout in both, as the server, not the answer,
    is at fault.
  A failed rollout gets every item unsatisfied with step -1 (`judges.base`); the algorithm's FailurePolicy
  decides its reward. `call_counts()` hands a run these counts and the schema violations, which it logs per step.
- Tokens: each successful request's `usage` (`usage.prompt_tokens`, `usage.completion_tokens` of the OpenAI
  chat-completion body; `chat_reply`) is summed in the client's `prompt_tokens` and `completion_tokens`; an
  answer without a well-formed usage is counted in `replies_without_usage` instead (a server that sends none
  shows as such, not as free). `call_counts()` hands these on too, as "prompt_tokens", "completion_tokens" and
  "requests_without_usage". Only answers that came back count: a failed request's tokens, if billed, are unknown.
- Responses and rubrics reach the judge only through the prompt functions of `rubric_jax.rubrics.prompts`,
  which fence them; the judge's output is data, read by the parsers of `rubric_jax.rubrics.parsing` alone.
"""

import asyncio
import dataclasses
import itertools
import logging
import math
import os
import re
from typing import Any, Callable, Mapping, Optional, Sequence

from rubric_jax.inference.http import (ClientStats, JsonHttpClient, MalformedResponse, RequestFailed, RetryPolicy,
                                       collapsed_level)
from rubric_jax.judges.base import Judge, JudgeRequest, RolloutVerdict, Verdicts, check_requests, kept_answer
from rubric_jax.judges.outcome import extract_boxed
from rubric_jax.rubrics import parsing, prompts
from rubric_jax.rubrics.parsing import FailureCounter, ParseResult
from rubric_jax.rubrics.schema import Criterion

_LOG = logging.getLogger(__name__)
Messages = prompts.Messages
CHAT_PATH = "/v1/chat/completions"
REQUEST_FAILED = "request_failed"
TRUNCATED = "truncated"  # an answer cut by max_tokens (finish_reason "length")
FAILED_CRITERION = ("fail_rollout", "score_zero")  # what a failed per-criterion call does (module docstring)
META_VERIFIER_FAILED = "meta_verifier_failed"  # the rejection of a criterion the meta-verifier did not clear
UNLISTED_CATEGORY = "unlisted"  # an INVALID verdict that names none of the prompt's categories
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "requests_without_usage")  # the token counts of `call_counts`


# The body fields the client sets itself (`ChatClient._payload`), which `extra_body` may not carry: its value
# would silently replace the client's, or (stream) change the answer's shape.
CLIENT_FIELDS = ("model", "messages", "temperature", "max_tokens", "max_completion_tokens", "seed",
                 "response_format", "stream", "chat_template_kwargs")


def check_request_options(chat_template_kwargs: Any, extra_body: Any, section: str) -> None:
    """ValueError naming `section`'s key unless `chat_template_kwargs` maps template variable names (identifiers)
    to values and `extra_body` maps field names to values, none of them a field the client sets (CLIENT_FIELDS)."""
    if not isinstance(chat_template_kwargs, Mapping) or not all(
            isinstance(k, str) and k.isidentifier() for k in chat_template_kwargs):
        raise ValueError(f"{section}.chat_template_kwargs must map template variable names to values, got "
                         f"{chat_template_kwargs!r}")
    if not isinstance(extra_body, Mapping) or not all(isinstance(k, str) and k for k in extra_body):
        raise ValueError(f"{section}.extra_body must map request field names to values, got {extra_body!r}")
    for key in extra_body:
        if key in CLIENT_FIELDS:
            raise ValueError(f"{section}.extra_body.{key}: the client sets the request's {key} itself (extra_body "
                             f"may carry none of {', '.join(CLIENT_FIELDS)}; the template's variables go in "
                             f"{section}.chat_template_kwargs)")


@dataclasses.dataclass(frozen=True)
class ChatSettings:
    """The settings of every call: the served `model` name, `temperature` (0: greedy, the papers' judges),
    `max_tokens` of the answer, an optional `seed`, whether to send JSON schemas, and the request options
    `chat_template_kwargs` and `extra_body` (module docstring). SGLang honours `seed` only when started with
    `--enable-deterministic-inference` (otherwise a judge at temperature > 0 is not reproducible from it); every
    call asks for one answer, so a shared seed never makes two answers of one call identical."""

    model: str
    temperature: float = 0.0
    max_tokens: int = 2048
    seed: Optional[int] = None
    json_schema: bool = True
    chat_template_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    extra_body: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        check_request_options(self.chat_template_kwargs, self.extra_body, "ChatSettings")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"ChatSettings.model must be a non-empty str, got {self.model!r}")
        temperature = self.temperature
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"ChatSettings.temperature must be a finite number >= 0, got {self.temperature!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"ChatSettings.max_tokens must be an int >= 1, got {self.max_tokens!r}")


@dataclasses.dataclass(frozen=True)
class ChatReply:
    """The assistant's text, why it ended (OpenAI's `finish_reason`: "stop", "length" when max_tokens cut it, ...;
    None when the server gives none) and the tokens the server counted, (prompt_tokens, completion_tokens) of the
    body's `usage` (None when it has no such object with both counts as non-negative integers)."""

    text: str
    finish_reason: Optional[str] = None
    usage: Optional[tuple[int, int]] = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


def chat_reply(body: Any) -> ChatReply:
    """The reply of an OpenAI chat-completion body (`choices[0].message.content`, `choices[0].finish_reason`);
    MalformedResponse (which the client retries) for any other shape."""
    if not isinstance(body, dict):
        raise MalformedResponse(f"expected a JSON object, got {type(body).__name__}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedResponse("no choices[0] object")
    message = choices[0].get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        raise MalformedResponse("choices[0].message.content is not a string")
    finish_reason = choices[0].get("finish_reason")
    return ChatReply(content, finish_reason if isinstance(finish_reason, str) else None, _usage(body.get("usage")))


def _usage(usage: Any) -> Optional[tuple[int, int]]:
    """(prompt_tokens, completion_tokens) of a body's `usage` object, None unless both are integers >= 0: an odd
    usage leaves the answer good but its tokens unknown (`ChatClient.replies_without_usage`)."""
    if not isinstance(usage, dict):
        return None
    counts = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        return None
    return counts


class ChatClient:
    """Chat completions of one server: `complete(messages, schema)` returns the assistant's text. Counts, since its
    creation, the tokens of its answers and the answers without usage (module docstring)."""

    def __init__(self, http: JsonHttpClient, settings: ChatSettings):
        self.http = http
        self.settings = settings
        self.dialect = RESPONSE_FORMAT_DIALECTS[0] if settings.json_schema else "none"
        self.dialect_changes = 0
        self.schema_violations = 0
        self.prompt_tokens = self.completion_tokens = self.replies_without_usage = 0

    @property
    def schemas_sent(self) -> bool:
        """Whether requests with a schema carry it (the dialect is not "none")."""
        return self.dialect != "none"

    def note_unparsed(self, schema: Optional[Mapping[str, Any]]) -> None:
        """Counts an answer that did not parse although it was asked for under `schema` and was not cut by
        max_tokens: the server ignored the schema."""
        if schema is not None and self.schemas_sent:
            self.schema_violations += 1

    def format_metrics(self) -> dict[str, float]:
        """{"response_format": the dialect's rank (2 json_schema, 1 json_object, 0 none), "dialect_changes"}, for a
        run's metrics (the schema violations are in `call_counts`)."""
        return {"response_format": float(_rank(self.dialect) - 1), "dialect_changes": float(self.dialect_changes)}

    def _payload(self, messages: Messages, schema: Optional[Mapping[str, Any]], seed: Optional[int] = None,
                 dialect: str = "none") -> dict:
        payload = {
            **self.settings.extra_body,
            "model": self.settings.model,
            "messages": list(messages),
            "temperature": self.settings.temperature,
            "max_tokens": self.settings.max_tokens,
        }
        if self.settings.chat_template_kwargs:
            payload["chat_template_kwargs"] = dict(self.settings.chat_template_kwargs)
        seed = self.settings.seed if seed is None else seed
        if seed is not None:
            payload["seed"] = seed
        if schema is not None and dialect == "json_schema":
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "judgement", "schema": dict(schema), "strict": True},
            }
        elif schema is not None and dialect == "json_object":
            payload["response_format"] = {"type": "json_object", "schema": dict(schema)}
        return payload

    async def complete(self, messages: Messages, schema: Optional[Mapping[str, Any]] = None) -> str:
        """The answer to `messages`, constrained by `schema` while the server accepts schemas (module
        docstring). RequestFailed when the request does not succeed."""
        return (await self.reply(messages, schema)).text

    async def reply(self, messages: Messages, schema: Optional[Mapping[str, Any]] = None,
                    seed: Optional[int] = None) -> ChatReply:
        """`complete`'s answer with its finish reason; `seed` replaces the settings' seed for this call (a
        retried generation asks for another sample)."""
        dialect = self.dialect if schema is not None else "none"
        while True:
            try:
                answer = await self.http.post_json(CHAT_PATH, self._payload(messages, schema, seed, dialect),
                                                   chat_reply)
            except RequestFailed as error:
                if dialect == "none" or not _blames_the_format(error):
                    raise
                # The next dialect for this request; the client adopts it only once it has worked.
                dialect = RESPONSE_FORMAT_DIALECTS[RESPONSE_FORMAT_DIALECTS.index(dialect) + 1]
                continue
            if schema is not None and _rank(dialect) < _rank(self.dialect):
                self.dialect = dialect
                self.dialect_changes += 1
            self._count_usage(answer.usage)
            return answer

    def _count_usage(self, usage: Optional[tuple[int, int]]) -> None:
        if usage is None:
            self.replies_without_usage += 1
            return
        self.prompt_tokens += usage[0]
        self.completion_tokens += usage[1]


RESPONSE_FORMAT_DIALECTS = ("json_schema", "json_object", "none")
_ENVIRONMENT_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class MissingApiKey(RuntimeError):
    """The environment variable a config names for an API key is unset or empty."""


def check_credentials(api_key_env: Optional[str], headers: Mapping[str, Any], section: str) -> None:
    """The config-time checks of an LLM role's credentials (judge, meta-verifier, synthesis generator): ValueError
    unless `api_key_env` is None or an environment variable's name (the key itself never belongs in a config) and
    `headers` maps header names to strings, without an Authorization header beside a key."""
    if api_key_env is not None and not (isinstance(api_key_env, str) and _ENVIRONMENT_VARIABLE.fullmatch(api_key_env)):
        raise ValueError(f"{section}.api_key_env is the name of an environment variable holding the key (e.g. "
                         f"OPENAI_API_KEY), got {api_key_env!r}")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ValueError(f"{section}.headers must map header names to strings")
    if api_key_env is not None and "authorization" in {k.lower() for k in headers}:
        raise ValueError(f"{section}.api_key_env sets the Authorization header: leave it out of {section}.headers")


def request_headers(api_key_env: Optional[str], headers: Mapping[str, str], section: str) -> dict[str, str]:
    """`headers`, and "Authorization: Bearer <key>" with the key read from the environment variable
    `api_key_env`. MissingApiKey when that variable is unset or empty (naming it, never a key)."""
    result = dict(headers)
    if api_key_env is not None:
        key = os.environ.get(api_key_env, "")
        if not key:
            raise MissingApiKey(f"{section}.api_key_env names {api_key_env}, which is not set in the environment")
        result["Authorization"] = f"Bearer {key}"
    return result


def chat_client(url: str, settings: ChatSettings, *, seed: Optional[int], headers: Mapping[str, str],
                max_in_flight: int, max_attempts: int, timeout_s: float) -> ChatClient:
    """A ChatClient of the server at `url`: `settings`, `headers` with every request (`request_headers`), at most
    `max_in_flight` requests at once, each tried `max_attempts` times with `timeout_s` per attempt."""
    http = JsonHttpClient(url, max_in_flight=max_in_flight, seed=seed, headers=headers,
                          retry=RetryPolicy(max_attempts=max_attempts, timeout_s=timeout_s))
    return ChatClient(http, settings)


def _rank(dialect: str) -> int:
    return len(RESPONSE_FORMAT_DIALECTS) - RESPONSE_FORMAT_DIALECTS.index(dialect)


def _blames_the_format(error: RequestFailed) -> bool:
    """A 4xx (the schema's fault or the request's: the next dialect tells), or a 5xx whose body names the response
    format or the schema (llama-cpp-python's answer to a json_schema response_format)."""
    if error.status is None:
        return False
    detail = error.detail.lower()
    return 400 <= error.status < 500 or (error.status >= 500 and any(
        word in detail for word in ("response_format", "response format", "json_schema", "schema", "grammar")))


@dataclasses.dataclass(frozen=True)
class RolloutFormat:
    """How to ask one call per rollout: `messages(request)`, the output `schema(request)` (None: none) and
    `parse(text, request)`, a `parsing` parser whose values hold "satisfied_k" [K] in [0, 1] and, for a
    step-attributing judge, "step_k" [K]."""

    messages: Callable[[JudgeRequest], Messages]
    schema: Callable[[JudgeRequest], Optional[dict]]
    parse: Callable[[str, JudgeRequest], ParseResult]


@dataclasses.dataclass(frozen=True)
class CriterionFormat:
    """How to ask one call per criterion: `messages(request, k)` for criterion k, the output `schema()` and
    `parse(text)`, whose values hold the scalar "rating" in [0, 1]."""

    messages: Callable[[JudgeRequest, int], Messages]
    schema: Callable[[], Optional[dict]]
    parse: Callable[[str], ParseResult]


def srar_format(extract_answer: Callable[[str], Optional[str]] = extract_boxed) -> RolloutFormat:
    """SRaR's step-attributed judge (srar.txt, Appendix 7.4): every item's verdict and step in one call; the
    student's final answer shown is `extract_answer(response)` (the last \\boxed{} by default)."""
    return RolloutFormat(
        messages=lambda r: prompts.step_attributed_judge_prompt(
            r.question, r.rubric, r.response, extract_answer(r.response)
        ),
        schema=lambda r: parsing.srar_judge_schema(len(r.rubric.criteria)),
        parse=lambda text, r: parsing.parse_srar_judge(text, num_items=len(r.rubric.criteria)),
    )


def _weights(request: JudgeRequest) -> list[float]:
    return [c.weight for c in request.rubric.criteria]


def _grounding(request: JudgeRequest) -> str:
    if request.reference is None:
        raise ValueError("the rubric-grounded judge needs each request's grounding passage as `reference`")
    return request.reference


def grounded_format(max_grounding_chars: Optional[int] = None) -> RolloutFormat:
    """The rubric-grounded judge (rubric_grounded_rl.txt, section 3.1, Appendix D): the privileged grounding
    passage (the request's `reference`, required) and every weighted criterion in one call; satisfied_k is the
    awarded fraction s_k / w_k."""
    return RolloutFormat(
        messages=lambda r: prompts.privileged_grounding_judge_prompt(
            r.question, r.response, r.rubric, _grounding(r), max_grounding_chars=max_grounding_chars
        ),
        schema=lambda r: parsing.grounded_scores_schema(_weights(r)),
        parse=lambda text, r: parsing.parse_grounded_scores(text, weights=_weights(r)),
    )


def rlcer_verifier_format() -> RolloutFormat:
    """RLCER's verifier (rlcer.txt, Appendix B, Figure 10): a binary judgement of every rubric of the request on
    one rollout, in one call. The RLCER recipe sends one rubricator's list per call by default (the verifier was
    distilled on one list at a time) and all of the question's lists in one call with verifier_calls "pooled"."""
    return RolloutFormat(
        messages=lambda r: prompts.verifier_prompt(r.question, r.response, r.rubric),
        schema=lambda r: parsing.rlcer_verifier_schema(len(r.rubric.criteria)),
        parse=lambda text, r: parsing.parse_rlcer_verifier(text, num_items=len(r.rubric.criteria)),
    )


def rating_format(show_reference: bool = False) -> CriterionFormat:
    """RGR-GRPO's judge (rgr_grpo.txt, eq 3): one call per criterion, `{"rating": 0|1}`: does the response satisfy
    the criterion given the question, and for a multi-turn prompt the conversation's earlier turns (the request's
    `conversation`, each turn fenced, as `healthbench` shows it). As in eq 3 the judge sees no reference answer
    (the rubric was written from it); show_reference=True also shows the request's `reference`."""
    return CriterionFormat(
        messages=lambda r, k: prompts.criterion_judge_prompt(
            r.question, r.response, r.rubric.criteria[k], r.reference if show_reference else None,
            earlier_turns=prompts.turns_before_question(r.conversation)),
        schema=parsing.rating_schema,
        parse=parsing.parse_rating,
    )


def healthbench_format() -> CriterionFormat:
    """HealthBench's grader (openai/simple-evals, healthbench_eval.py): one call per criterion, shown the whole
    conversation (the request's `conversation`, else its question as one user turn), the response and the
    criterion with its points; `criteria_met` a JSON boolean. The rubric's score is the recipe's or the
    evaluation's (HealthBench's: `core.rewards.positive_points_score`)."""
    return CriterionFormat(
        messages=lambda r, k: prompts.healthbench_grader_prompt(
            r.conversation or ({"role": "user", "content": r.question},), r.response, r.rubric.criteria[k]),
        schema=parsing.healthbench_grade_schema,
        parse=parsing.parse_healthbench_grade,
    )


@dataclasses.dataclass(frozen=True)
class CallResult:
    """One judge call read: the parser's `values` when it succeeded, else the failure's `reason`, `detail` and
    kept raw `answer` ("" for a failed request), as the module docstring counts them."""

    values: Mapping[str, Any]
    reason: str = ""
    detail: str = ""
    answer: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason

    def verdict(self, detail: Optional[str] = None) -> RolloutVerdict:
        """The failed verdict of this failed call (its own detail unless `detail` is given)."""
        return RolloutVerdict.failure(self.reason, self.detail if detail is None else detail, self.answer)


async def read_call(chat: ChatClient, failures: FailureCounter, messages: Messages,
                    schema: Optional[Mapping[str, Any]], parse: Callable[[str], ParseResult]) -> CallResult:
    """Asks `messages` under `schema` and reads the answer with `parse`; the call is counted in `failures` and, when
    its answer, not cut, does not parse under a schema, in the client's schema violations (module docstring); a
    failed answer is logged with its reason (the 1st, 10th, 100th, ... of each reason a warning)."""
    try:
        reply = await chat.reply(messages, schema)
    except RequestFailed as error:
        failures.record_failure(REQUEST_FAILED)
        return CallResult({}, REQUEST_FAILED, f"{error.reason}: {error}")
    result = parse(reply.text)
    if reply.truncated:  # max_tokens is at fault, not the server's handling of the schema
        failures.record_failure(TRUNCATED)
        read = "it parses" if result.ok else f"{result.reason}: {result.detail}"
        return _failed_answer(chat, failures, TRUNCATED, f"cut at max_tokens={chat.settings.max_tokens} ({read})",
                              reply.text)
    if not failures.record(result):
        chat.note_unparsed(schema)
        return _failed_answer(chat, failures, result.reason, result.detail, reply.text)
    return CallResult(result.values)


def _failed_answer(chat: ChatClient, failures: FailureCounter, reason: str, detail: str, text: str) -> CallResult:
    """The failed call of an answer, logged with it the 1st, 10th, 100th, ... time its reason is counted (as the
    HTTP client logs its failures: `collapsed_level`)."""
    call = CallResult({}, reason, detail, kept_answer(text))
    count = failures.by_reason[reason]
    _LOG.log(collapsed_level(count), "%s answered %s: %s (failure %d of this kind); the answer: %r",
             chat.http.base_url, reason, detail, count, call.answer)
    return call


def call_counts(chat: ChatClient, failures: FailureCounter) -> dict[str, int]:
    """The calls of a judge or meta-verifier since its creation: "calls" (each counted once, failed ones
    included), "call_failures", "call_failed/<reason>" and "schema_violations" (`ChatClient.note_unparsed`), and
    its answers' tokens: "prompt_tokens", "completion_tokens", "requests_without_usage" (module docstring)."""
    return {"calls": failures.parsed, "call_failures": failures.failed,
            **{f"call_failed/{reason}": n for reason, n in sorted(failures.by_reason.items())},
            "schema_violations": chat.schema_violations,
            **dict(zip(USAGE_KEYS, (chat.prompt_tokens, chat.completion_tokens, chat.replies_without_usage)))}


class _LLMJudge(Judge):
    """What both LLM judges share: the chat client, the failure counter and the sync entry point."""

    def __init__(self, chat: ChatClient, failures: Optional[FailureCounter] = None):
        self.chat = chat
        self.failures = FailureCounter() if failures is None else failures

    def judge(self, requests: Sequence[JudgeRequest], max_items: int) -> Verdicts:
        return self.chat.http.run_sync(self.ajudge(requests, max_items))

    def http_stats(self) -> ClientStats:
        return self.chat.http.stats

    def format_metrics(self) -> dict[str, float]:
        return self.chat.format_metrics()

    def call_counts(self) -> dict[str, int]:
        return call_counts(self.chat, self.failures)

    def close(self) -> None:
        self.chat.http.close()


class RolloutLLMJudge(_LLMJudge):
    """One chat call per rollout with every rubric item (module docstring); `fmt` is e.g. `srar_format()`."""

    def __init__(self, chat: ChatClient, fmt: RolloutFormat, failures: Optional[FailureCounter] = None):
        super().__init__(chat, failures)
        self.fmt = fmt

    async def _judge_one(self, request: JudgeRequest) -> RolloutVerdict:
        call = await read_call(self.chat, self.failures, self.fmt.messages(request), self.fmt.schema(request),
                               lambda text: self.fmt.parse(text, request))
        if not call.ok:
            return call.verdict()
        steps = call.values.get("step_k")
        return RolloutVerdict(
            satisfied=tuple(call.values["satisfied_k"].tolist()),
            item_step=None if steps is None else tuple(steps.tolist()),
        )

    async def ajudge(self, requests: Sequence[JudgeRequest], max_items: int) -> Verdicts:
        check_requests(requests, max_items)
        for request in requests:
            self.fmt.messages(request)  # a misconfigured request (e.g. no grounding) raises before any call
        verdicts = await asyncio.gather(*(self._judge_one(r) for r in requests))
        return Verdicts.from_rollouts(verdicts, max_items)


class CriterionLLMJudge(_LLMJudge):
    """One chat call per (rollout, criterion) (module docstring); `fmt` is e.g. `rating_format()`;
    `failed_criterion` (FAILED_CRITERION) what a call whose answer failed does to its rollout: "fail_rollout"
    (default) or "score_zero" (RGR-GRPO's "parse failure scores 0")."""

    def __init__(self, chat: ChatClient, fmt: CriterionFormat, failures: Optional[FailureCounter] = None,
                 failed_criterion: str = "fail_rollout"):
        if failed_criterion not in FAILED_CRITERION:
            raise ValueError(f"failed_criterion must be one of {FAILED_CRITERION}, got {failed_criterion!r}")
        super().__init__(chat, failures)
        self.fmt = fmt
        self.failed_criterion = failed_criterion

    async def _judge_one(self, request: JudgeRequest) -> RolloutVerdict:
        criteria = request.rubric.criteria
        schema = self.fmt.schema()
        calls = await asyncio.gather(*(read_call(self.chat, self.failures, self.fmt.messages(request, k), schema,
                                                 self.fmt.parse) for k in range(len(criteria))))
        failed = [k for k, call in enumerate(calls) if not call.ok]
        failing = failed if self.failed_criterion == "fail_rollout" else \
            [k for k in failed if calls[k].reason == REQUEST_FAILED]
        if failing:
            k = failing[0]
            detail = f"criteria[{k}] {_short(criteria[k].text)}: {calls[k].detail}"
            if len(failed) > 1:
                detail += f" ({len(failed)} of {len(criteria)} criterion calls failed)"
            return calls[k].verdict(detail)
        return RolloutVerdict(satisfied=tuple(float(call.values["rating"]) if call.ok else 0.0 for call in calls))

    async def ajudge(self, requests: Sequence[JudgeRequest], max_items: int) -> Verdicts:
        check_requests(requests, max_items)
        verdicts = await asyncio.gather(*(self._judge_one(r) for r in requests))
        return Verdicts.from_rollouts(verdicts, max_items)


def _short(text: str, chars: int = 60) -> str:
    """A criterion's text quoted for a failure's detail, cut to `chars` characters."""
    return repr(text if len(text) <= chars else text[:chars] + "...")


@dataclasses.dataclass(frozen=True)
class MetaVerifyRequest:
    """One generator output to audit: the question, its proposed `criteria` and the `existing` criteria they must
    not duplicate (EvoRubric's base rubric and memory pool)."""

    question: str
    criteria: tuple[Criterion, ...]
    existing: tuple[Criterion, ...]


class LLMMetaVerifier:
    """EvoRubric's meta-verifier as an LLM (evorubric.txt, section 3.3.2 step 1, Appendix C: Table 6 for `domain`
    "medical", Table 7 for "writing_science"): v(r) for every proposed criterion r.

    One chat call per criterion, as the prompt judges one "Target Rubric" against the existing base rubrics
    (`prompts.meta_verifier_prompt`), with `parsing.meta_verdict_schema` as the response format and
    `parsing.parse_meta_verdict` as the reader. `verify` issues every call of a batch of requests at once (the
    client bounds how many are in flight and retries transient errors) and returns, per request, one entry per
    criterion: None (VALID), the INVALID category as the prompt names it, or UNLISTED_CATEGORY (an INVALID
    verdict naming no category: still a rejection).

    Failures never raise. A failed call (`read_call`: a request that failed after its retries, an answer cut by
    max_tokens, or one that does not parse, each counted by its reason) leaves the criterion not verified: its
    entry is META_VERIFIER_FAILED, a rejection (the parser's failure fill: "a rubric the meta-verifier did not
    clear is not used"), so a broken meta-verifier can only shrink the rubric, never let an unaudited criterion
    into the reward. `failures` counts every call since creation (`call_counts()` as a judge's), and a failed answer is
    logged with its raw text as a judge's is (`read_call`); `http_stats()` the requests, as a judge's do.
    """

    def __init__(self, chat: ChatClient, domain: str = "writing_science", failures: Optional[FailureCounter] = None):
        if domain not in prompts.META_VERIFIER_CATEGORIES:
            raise ValueError(f"domain must be one of {sorted(prompts.META_VERIFIER_CATEGORIES)}, got {domain!r}")
        self.chat, self.domain = chat, domain
        self.categories = prompts.META_VERIFIER_CATEGORIES[domain]
        self.schema = parsing.meta_verdict_schema(self.categories)
        self.failures = FailureCounter() if failures is None else failures

    def verify(self, requests: Sequence[MetaVerifyRequest]) -> list[tuple[Optional[str], ...]]:
        return self.chat.http.run_sync(self.averify(requests))

    async def averify(self, requests: Sequence[MetaVerifyRequest]) -> list[tuple[Optional[str], ...]]:
        for i, request in enumerate(requests):
            if not isinstance(request, MetaVerifyRequest):
                raise ValueError(f"requests[{i}] must be a MetaVerifyRequest, got {type(request).__name__}")
        # Every prompt is built before any call, so a malformed request raises with nothing sent.
        calls = [prompts.meta_verifier_prompt(r.question, c, r.existing, domain=self.domain)
                 for r in requests for c in r.criteria]
        verdicts = await asyncio.gather(*(self._verify_one(messages) for messages in calls))
        ends = itertools.accumulate(len(r.criteria) for r in requests)
        return [tuple(verdicts[end - len(r.criteria):end]) for r, end in zip(requests, ends)]

    async def _verify_one(self, messages: Messages) -> Optional[str]:
        call = await read_call(self.chat, self.failures, messages, self.schema,
                               lambda text: parsing.parse_meta_verdict(text, categories=self.categories))
        if not call.ok:
            return META_VERIFIER_FAILED
        if call.values["valid"]:
            return None
        category = int(call.values["category"])
        return self.categories[category] if category >= 0 else UNLISTED_CATEGORY

    def http_stats(self) -> ClientStats:
        return self.chat.http.stats

    def format_metrics(self) -> dict[str, float]:
        return self.chat.format_metrics()

    def call_counts(self) -> dict[str, int]:
        return call_counts(self.chat, self.failures)

    def close(self) -> None:
        self.chat.http.close()
