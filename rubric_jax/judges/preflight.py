"""Fail fast: before any work, one real request to an LLM role's server (the judge, the meta-verifier, the
synthesis generator), shaped like the work's and read by the role's own parser.

`preflight(chat, section, messages, schema, parse)`:
1. GET /v1/models (OpenAI's listing, uncounted by the client's stats): PreflightFailed naming the URL when nothing
   answers or the server refuses the credentials (401, 403); otherwise the served names, when the server lists any.
2. The request itself, on the role's own `ChatClient` (its model name, credentials, decoding and response-format
   dialect negotiation, which the client keeps for the run). When it fails after the client's retries:
   PreflightFailed; a 4xx under a model name the server does not list says so, naming the served models (a wrong
   `<section>.model`). When the server answers under an unlisted name it is known to answer any name (SGLang,
   llama-server): a warning, and the run proceeds.
3. The answer, read by `parse` (the role's parser: a `ParseResult`, `RubricParse` or `StructuredParse`, anything
   with ok / reason / detail): a `PreflightAnswer`. `require_parsed` turns one that did not parse into
   PreflightFailed with one line: the parser's reason and detail and the raw answer, cut to RAW_SHOWN_CHARS.

The callers (`training.rl` at a run's launch, `rubric-jax validate`, `rubric-jax synthesize`) build the request
from their first example, with a stand-in response; nothing here writes anything.
"""

import dataclasses
import json
import logging
from typing import Any, Callable, Mapping, Optional

from rubric_jax.inference.http import RequestFailed
from rubric_jax.judges.llm import ChatClient, Messages

_LOG = logging.getLogger(__name__)

# Long enough for a loaded server to list its models, short enough that a wrong URL is reported at once.
PROBE_TIMEOUT_S = 30.0
# Enough of a raw answer to see what the server does (prose, a refusal, JSON off the schema) on one line.
RAW_SHOWN_CHARS = 300


class PreflightFailed(RuntimeError):
    """An LLM role's server cannot do the work: it does not answer, refuses the credentials or the model name, or
    answers what its parser cannot read. The message is one line naming the config section to fix."""


@dataclasses.dataclass(frozen=True)
class PreflightAnswer:
    """The answer to a preflight request: the `section` asked ("judge", "meta_verifier", "generator"), what was
    `asked` (e.g. "a judge.format rating request"), the raw `text` and `finish_reason`, and the parser's verdict
    (`ok`, `reason`, `detail`)."""

    section: str
    asked: str
    text: str
    finish_reason: Optional[str]
    ok: bool
    reason: str = ""
    detail: str = ""

    @property
    def shown(self) -> str:
        """The raw answer as one quoted line, cut to RAW_SHOWN_CHARS."""
        cut = self.text[:RAW_SHOWN_CHARS]
        return json.dumps(cut) + (f" (cut; {len(self.text)} characters)" if len(self.text) > RAW_SHOWN_CHARS else "")

    @property
    def verdict(self) -> str:
        """"parsed", or why not: the parser's reason and detail, and a cut by max_tokens."""
        if self.ok:
            return "parsed"
        cut = f"; cut by {self.section}.max_tokens (finish_reason length)" if self.finish_reason == "length" else ""
        return f"does not parse: {self.reason}" + (f" ({self.detail})" if self.detail else "") + cut


def served_models(chat: ChatClient, section: str) -> Optional[list[str]]:
    """The names GET /v1/models lists (None when the server has no such listing). PreflightFailed naming the URL
    when nothing answers, or when the server refuses the credentials (401, 403)."""
    http = chat.http
    try:
        status, body = http.run_sync(http.probe("/v1/models", min(PROBE_TIMEOUT_S, http.retry.timeout_s)))
    except RequestFailed as error:
        raise PreflightFailed(f"{section}.url {http.base_url} does not answer ({error.reason}: {error.detail}): "
                              "start the server or correct the URL") from None
    if status in (401, 403):
        raise PreflightFailed(f"{section}.url {http.base_url} refused the credentials (HTTP {status}): set "
                              f"{section}.api_key_env to the environment variable holding the key, or "
                              f"{section}.headers")
    if status != 200:
        return None
    try:
        return [str(entry["id"]) for entry in json.loads(body)["data"]]
    except (ValueError, KeyError, TypeError):
        return None


def preflight(chat: ChatClient, section: str, asked: str, messages: Messages, schema: Optional[Mapping[str, Any]],
              parse: Callable[[str], Any], seed: Optional[int] = None) -> PreflightAnswer:
    """One request (module docstring, steps 1-3; `asked` describes it) and its answer, whether or not it parsed;
    PreflightFailed when the server does not answer, refuses the credentials or refuses the model name. `seed` as
    `ChatClient.reply`."""
    model, url = chat.settings.model, chat.http.base_url
    served = served_models(chat, section)
    unlisted = bool(served) and model not in served
    try:
        reply = chat.http.run_sync(chat.reply(messages, schema, seed=seed))
    except RequestFailed as error:
        if unlisted and error.status is not None and 400 <= error.status < 500:
            raise PreflightFailed(f"{section}.model {model!r} is not among the models {url} serves "
                                  f"({', '.join(served[:10])}) and the server refused it (HTTP {error.status}): set "
                                  f"{section}.model to one of them") from None
        raise PreflightFailed(f"{section}.url {url} did not answer a {section} request ({error.reason}"
                              + (f": {' '.join(error.detail.split())[:RAW_SHOWN_CHARS]}" if error.detail else "")
                              + ")") from None
    if unlisted:
        _LOG.warning("%s.model %r is not among the models %s serves (%s), but the server answered it (it serves any "
                     "name, as SGLang and llama-server do): proceeding", section, model, url, ", ".join(served[:10]))
    result = parse(reply.text)
    return PreflightAnswer(section, asked, reply.text, reply.finish_reason, bool(result.ok), result.reason,
                           result.detail)


def require_parsed(answer: PreflightAnswer) -> PreflightAnswer:
    """`answer`, or PreflightFailed (one line: what was asked, the parser's verdict, the raw answer) when it did
    not parse."""
    if not answer.ok:
        raise PreflightFailed(f"{answer.section}: its answer to {answer.asked} {answer.verdict}; raw answer: "
                              f"{answer.shown}")
    return answer
