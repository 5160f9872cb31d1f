"""A JSON-over-HTTP client with bounded concurrency and retries, shared by the SGLang rollout engine (`/generate`,
`/update_weights_from_disk`) and the LLM judges (`/v1/chat/completions` of any OpenAI-compatible server).

Conventions:
- Retried, with exponential backoff and full jitter (`RetryPolicy`), up to `max_attempts` attempts in all: HTTP
  5xx, timeouts (per attempt), dropped or refused connections, and malformed bodies (not JSON, or rejected by the
  caller's `validate` with `MalformedResponse`). Never retried: 4xx (a bad request stays bad) and any other
  non-2xx status. A request that does not succeed raises `RequestFailed` naming the reason of its last attempt.
- Reasons, as counted in `ClientStats.errors_by_reason` (one count per failed attempt) and carried by
  `RequestFailed.reason`: "http_<status>", "timeout", "connection", "malformed".
- At most `max_in_flight` attempts are on the wire at once (an `asyncio.Semaphore`); a request waiting out its
  backoff holds no slot.
- The client owns its event loop (uvloop's where installed, else asyncio's), run by a daemon thread: every
  request runs there, whichever thread or loop asks, so one connection pool and one in-flight bound serve sync
  and async callers alike. `await client.post_json(...)` works from any event loop (the coroutine is handed to
  the client's loop and awaited), and `client.run_sync(coroutine)` blocks the calling thread until a coroutine
  finishes on the client's loop. `run_sync` works with no loop running; called from inside a running loop (a
  notebook, an async test), it still works but blocks that loop until it returns, so async code should await
  instead. Calling it from the client's own loop would deadlock and raises RuntimeError.
- Payloads are encoded as strict JSON (NaN or infinity in a payload is a ValueError at once), and bodies are
  decoded as strict JSON too (NaN/Infinity literals are malformed).
- Every failed attempt is logged at WARNING with its reason.
- Timing (`ClientStats.timing`, what a run's per-step judge accounting reads): a POST's latency is that of its
  successful attempt alone, on the wire: from taking its in-flight slot to the whole body read (a retry is its own
  request: the failed attempts and the backoff before it are not in it, nor is the wait for a slot, which is the
  client's queue, not the server's answer); its end is `time.monotonic()` when it succeeded or failed for good.
"""

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import math
import random
import threading
import time
from typing import Any, Callable, Coroutine, Iterator, Mapping, Optional, TypeVar

import aiohttp

try:  # a faster event loop, installed with orbax-checkpoint (except on Windows)
    import uvloop
except ImportError:
    uvloop = None

T = TypeVar("T")

_LOG = logging.getLogger(__name__)
_DETAIL_CHARS = 300  # how much of an error body RequestFailed quotes
_HEALTH_FIRST_POLL_S, _HEALTH_POLL_S = 0.05, 1.0  # wait_healthy's first and longest probe intervals


def _identity(value: T) -> T:
    return value


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's where it is installed, else asyncio's default."""
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a request is tried.

    max_attempts:      attempts in all, the first included (>= 1).
    initial_backoff_s: the backoff cap after the first failed attempt (>= 0).
    max_backoff_s:     the largest backoff cap (>= initial_backoff_s).
    multiplier:        the cap's growth per failed attempt (>= 1).
    timeout_s:         the limit of one attempt, connecting and reading the whole body included (> 0).
    """

    max_attempts: int = 5
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    multiplier: float = 2.0
    timeout_s: float = 600.0

    def __post_init__(self):
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be an int >= 1, got {self.max_attempts!r}")
        if not self.initial_backoff_s >= 0:
            raise ValueError(f"RetryPolicy.initial_backoff_s must be >= 0, got {self.initial_backoff_s!r}")
        if not self.max_backoff_s >= self.initial_backoff_s:
            raise ValueError(
                f"RetryPolicy.max_backoff_s must be >= initial_backoff_s ({self.initial_backoff_s}), got "
                f"{self.max_backoff_s!r}"
            )
        if not self.multiplier >= 1:
            raise ValueError(f"RetryPolicy.multiplier must be >= 1, got {self.multiplier!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"RetryPolicy.timeout_s must be > 0, got {self.timeout_s!r}")

    def backoff_cap_s(self, attempt: int) -> float:
        """min(max_backoff_s, initial_backoff_s * multiplier ** (attempt - 1)): the cap after the `attempt`-th
        failed attempt (1-based). Computed by repeated multiplication, so a huge attempt number cannot
        overflow."""
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt}")
        cap = self.initial_backoff_s
        for _ in range(attempt - 1):
            if cap >= self.max_backoff_s:
                break
            cap *= self.multiplier
        return min(cap, self.max_backoff_s)

    def backoff_s(self, attempt: int, rng: random.Random) -> float:
        """The wait after the `attempt`-th failed attempt: exponential backoff with "full jitter" (uniform in
        [0, backoff_cap_s(attempt)]; M. Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog,
        2015), which spreads out clients that failed together."""
        return rng.uniform(0.0, self.backoff_cap_s(attempt))


class MalformedResponse(Exception):
    """A response body that is not what the endpoint promises. Raised by response validators; the client
    retries it like a 5xx."""


class RequestFailed(Exception):
    """A request that did not succeed: not retried (4xx) or out of attempts.

    path:     the request's path.
    attempts: the attempts made.
    reason:   the last attempt's failure: "http_<status>", "timeout", "connection" or "malformed".
    status:   the last HTTP status received, None when no response came.
    detail:   the start of the last error body, or the transport error's text.
    """

    def __init__(self, path: str, attempts: int, reason: str, status: Optional[int] = None, detail: str = ""):
        super().__init__(f"{path} failed after {attempts} attempt(s): {reason}" + (f": {detail}" if detail else ""))
        self.path = path
        self.attempts = attempts
        self.reason = reason
        self.status = status
        self.detail = detail


@dataclasses.dataclass
class RequestTimes:
    """The POSTs a client finished while this record was open (`ClientStats.timing`; module docstring):
    latencies_s, each successful one's latency in seconds, in the order they ended; last_ended_at, the
    `time.monotonic()` end of the latest one, failed ones included (None before any ended)."""

    latencies_s: list[float] = dataclasses.field(default_factory=list)
    last_ended_at: Optional[float] = None


@dataclasses.dataclass
class ClientStats:
    """Counters of a client since its creation (mutable; read by metrics).

    requests:          requests made (post_json and get calls).
    attempts:          attempts sent, retries included.
    retries:           attempts that were retries of a failed one.
    failures:          requests that raised RequestFailed.
    errors_by_reason:  failed attempts by reason (module docstring), retried or final.
    Per-request times are kept only while someone times a stretch of work (`timing`), so a long run's client
    holds no growing list.
    """

    requests: int = 0
    attempts: int = 0
    retries: int = 0
    failures: int = 0
    errors_by_reason: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    _timings: list[RequestTimes] = dataclasses.field(default_factory=list, init=False, repr=False, compare=False)

    @contextlib.contextmanager
    def timing(self) -> Iterator[RequestTimes]:
        """The times of the POSTs that end inside the block (several blocks may be open at once)."""
        times = RequestTimes()
        self._timings.append(times)
        try:
            yield times
        finally:
            self._timings.remove(times)

    def record_end(self, latency_s: Optional[float]) -> None:
        """A POST ended now: successful after `latency_s` seconds, or failed for good (None)."""
        ended_at = time.monotonic()
        for times in tuple(self._timings):  # a copy: a block may close from another thread meanwhile
            if latency_s is not None:
                times.latencies_s.append(latency_s)
            times.last_ended_at = ended_at


class _AttemptError(Exception):
    """One failed attempt: its reason, whether it may be retried, the status if any, and a detail."""

    def __init__(self, reason: str, retryable: bool, status: Optional[int] = None, detail: str = ""):
        super().__init__(reason)
        self.reason, self.retryable, self.status, self.detail = reason, retryable, status, detail


def _reject_constant(name: str) -> Any:
    raise MalformedResponse(f"non-standard JSON constant {name}")


def decode_json(body: bytes) -> Any:
    """`body` parsed as strict JSON (UTF-8, no NaN/Infinity); MalformedResponse otherwise."""
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MalformedResponse(f"body is not JSON: {error}") from None


def _detail(body: bytes) -> str:
    return body[:_DETAIL_CHARS].decode("utf-8", errors="replace")


class LoopThread:
    """An event loop (uvloop's where installed) running on a daemon thread named `name`, until `stop`."""

    def __init__(self, name: str):
        self.loop = _new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def on_this_loop(self) -> bool:
        """Whether the caller runs on this loop."""
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> "concurrent.futures.Future[T]":
        """Schedules `coroutine` on the loop (from any thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def stop(self) -> None:
        """Stops the loop, joins the thread and closes the loop (not from the loop itself)."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def collapsed_level(count: int) -> int:
    """The log level of the `count`-th (from 1) occurrence of a repeated failure: WARNING for the 1st, 10th,
    100th, ..., DEBUG for the rest, so a failure that repeats every call shows with its count, not every time."""
    return logging.WARNING if count == 10 ** int(math.log10(count)) else logging.DEBUG


class JsonHttpClient:
    """JSON requests to one server (`base_url`, e.g. "http://127.0.0.1:30000"), retried by `retry`, at most
    `max_in_flight` at once, with `headers` on every request (e.g. an Authorization header) and a jitter RNG
    seeded by `seed`. See the module docstring for the retry, concurrency and event-loop conventions. Close it
    (`close`, `aclose`, or a `with` / `async with` block) to release the connections and the loop thread.
    """

    def __init__(
        self,
        base_url: str,
        *,
        max_in_flight: int = 64,
        retry: RetryPolicy = RetryPolicy(),
        headers: Optional[Mapping[str, str]] = None,
        seed: Optional[int] = None,
    ):
        if not isinstance(max_in_flight, int) or isinstance(max_in_flight, bool) or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be an int >= 1, got {max_in_flight!r}")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.max_in_flight = max_in_flight
        self.retry = retry
        self.stats = ClientStats()
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        self._rng = random.Random(seed)
        self._failures_seen: collections.Counter = collections.Counter()
        self._runner: Optional[LoopThread] = LoopThread(f"JsonHttpClient({self.base_url})")
        self._session: Optional[aiohttp.ClientSession] = None
        self._semaphore: Optional[asyncio.Semaphore] = None

    # ------------------------------------------------------------------------------------------ event loop

    def _loop_thread(self, coroutine: Coroutine) -> LoopThread:
        """The loop thread that is to run `coroutine`; RuntimeError (the coroutine closed) once closed."""
        if self._runner is None:
            coroutine.close()
            raise RuntimeError(f"JsonHttpClient({self.base_url}) is closed")
        return self._runner

    async def _on_client_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Awaits `coroutine` run on the client's loop, from whichever loop this is awaited on."""
        runner = self._loop_thread(coroutine)
        if runner.on_this_loop():
            return await coroutine
        return await asyncio.wrap_future(runner.submit(coroutine))

    def run_sync(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Runs `coroutine` on the client's loop and blocks this thread until it returns (module docstring:
        from inside another running loop this blocks that loop; from the client's own loop it raises
        RuntimeError)."""
        runner = self._loop_thread(coroutine)
        if runner.on_this_loop():
            coroutine.close()
            raise RuntimeError("run_sync called from the client's own event loop would deadlock: await instead")
        return runner.submit(coroutine).result()

    def _connection(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        """The session and the in-flight semaphore, created on first use on the client's loop."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.max_in_flight)
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
            self._semaphore = asyncio.Semaphore(self.max_in_flight)
        return self._session, self._semaphore

    # ------------------------------------------------------------------------------------------- attempts

    async def _attempt(self, method: str, path: str, body: Optional[bytes], timeout_s: float) -> tuple[int, bytes]:
        """One exchange under the in-flight bound: (status, body); _AttemptError on a transport failure."""
        status, data, _ = await self._timed_attempt(method, path, body, timeout_s)
        return status, data

    async def _timed_attempt(self, method: str, path: str, body: Optional[bytes], timeout_s: float
                             ) -> tuple[int, bytes, float]:
        """`_attempt` with its seconds on the wire (module docstring: timing)."""
        session, semaphore = self._connection()
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with semaphore:
            started = time.monotonic()
            try:
                async with session.request(method, self.base_url + path, data=body, timeout=timeout) as response:
                    data = await response.read()
                    return response.status, data, time.monotonic() - started
            except asyncio.TimeoutError as error:  # aiohttp's timeouts subclass it; test it before OSError
                raise _AttemptError("timeout", True, detail=f"no complete answer within {timeout_s} s") from error
            except aiohttp.ClientResponseError as error:  # an answer that is not valid HTTP
                raise _AttemptError("malformed", True, detail=f"{type(error).__name__}: {error}") from error
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as error:
                raise _AttemptError("connection", True, detail=f"{type(error).__name__}: {error}") from error

    def _count_error(self, path: str, error: _AttemptError, attempt: int, max_attempts: int) -> None:
        self.stats.errors_by_reason[error.reason] += 1
        # Collapsed: a dead server fails every attempt of every request, so only the 1st, 10th, 100th, ...
        # failure of each (path, reason) is a warning, with the count; the rest are debug lines.
        self._failures_seen[path, error.reason] += 1
        count = self._failures_seen[path, error.reason]
        _LOG.log(collapsed_level(count), "%s%s attempt %d/%d failed: %s %s (failure %d of this kind)", self.base_url,
                 path, attempt, max_attempts, error.reason, error.detail, count)

    async def _post_json(self, path: str, body: bytes, validate: Callable[[Any], T], retry: RetryPolicy) -> T:
        self.stats.requests += 1
        for attempt in range(1, retry.max_attempts + 1):
            if attempt > 1:
                self.stats.retries += 1
            self.stats.attempts += 1
            try:
                status, data, seconds = await self._timed_attempt("POST", path, body, retry.timeout_s)
                if not 200 <= status < 300:
                    raise _AttemptError(f"http_{status}", status >= 500, status, _detail(data))
                try:
                    answer = validate(decode_json(data))
                except MalformedResponse as error:
                    raise _AttemptError("malformed", True, status, str(error)) from error
                self.stats.record_end(seconds)
                return answer
            except _AttemptError as error:
                self._count_error(path, error, attempt, retry.max_attempts)
                if not error.retryable or attempt == retry.max_attempts:
                    self.stats.failures += 1
                    self.stats.record_end(None)
                    raise RequestFailed(path, attempt, error.reason, error.status, error.detail) from None
                await asyncio.sleep(retry.backoff_s(attempt, self._rng))
        raise AssertionError("unreachable: the loop returns or raises")

    async def _get(self, path: str) -> tuple[int, bytes]:
        self.stats.requests += 1
        self.stats.attempts += 1
        try:
            return await self._attempt("GET", path, None, self.retry.timeout_s)
        except _AttemptError as error:
            self._count_error(path, error, 1, 1)
            self.stats.failures += 1
            raise RequestFailed(path, 1, error.reason, detail=error.detail) from None

    async def _wait_healthy(self, path: str, timeout_s: float, poll_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = "no attempt"
        interval = min(_HEALTH_FIRST_POLL_S, poll_s)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self.base_url}{path} not healthy after {timeout_s} s (last: {last})")
            probe_timeout_s = min(self.retry.timeout_s, remaining)
            try:
                status, _ = await self._attempt("GET", path, None, probe_timeout_s)
                if status == 200:
                    return
                last = f"http_{status}"
            except _AttemptError as error:
                cut_by_deadline = error.reason == "timeout" and probe_timeout_s < self.retry.timeout_s
                if not cut_by_deadline or last == "no attempt":  # a cut probe says nothing new
                    last = error.reason
            await asyncio.sleep(max(0.0, min(interval, deadline - time.monotonic())))
            interval = min(2 * interval, poll_s)

    async def _aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------------------------------ public API

    async def post_json(self, path: str, payload: Any, validate: Callable[[Any], T] = _identity, *,
                        retry: Optional[RetryPolicy] = None) -> T:
        """POSTs `payload` as JSON to `path` and returns `validate(body)` of the parsed answer. `validate` runs
        on the client's loop; it raises MalformedResponse for a wrong shape (retried) and must not block.
        `retry` replaces the client's policy for this request (e.g. one attempt for a request that must not be
        sent twice). RequestFailed when the request does not succeed; ValueError at once for a payload that is
        not JSON."""
        body = json.dumps(payload, allow_nan=False).encode()
        return await self._on_client_loop(self._post_json(path, body, validate, retry or self.retry))

    async def get(self, path: str) -> tuple[int, bytes]:
        """One GET of `path` (a probe: not retried by this client): the status and body, whatever the status.
        RequestFailed ("timeout" or "connection") when no answer comes. (aiohttp itself resends a GET once when
        the server drops the connection, as RFC 9112 section 9.3.1 allows for idempotent methods.)"""
        return await self._on_client_loop(self._get(path))

    async def probe(self, path: str, timeout_s: float) -> tuple[int, bytes]:
        """One GET of `path` that `stats` does not count (a check before work starts): the status and body,
        whatever the status. RequestFailed ("timeout" or "connection") when no answer comes within `timeout_s`."""
        return await self._on_client_loop(self._probe(path, timeout_s))

    async def _probe(self, path: str, timeout_s: float) -> tuple[int, bytes]:
        try:
            return await self._attempt("GET", path, None, timeout_s)
        except _AttemptError as error:
            raise RequestFailed(path, 1, error.reason, detail=error.detail) from None

    async def wait_healthy(self, path: str = "/health", timeout_s: float = 600.0, *, poll_s: float = _HEALTH_POLL_S
                           ) -> None:
        """Returns once GET `path` answers 200, probing at intervals doubling from 50 ms up to `poll_s` seconds
        (refused connections, timeouts and other statuses just mean "not yet"; probes are not counted in
        `stats`). TimeoutError naming the last outcome after `timeout_s`."""
        await self._on_client_loop(self._wait_healthy(path, timeout_s, poll_s))

    async def aclose(self) -> None:
        """Closes the connections and stops the loop thread (idempotent; not from the client's own loop)."""
        if self._runner is None:
            return
        if self._runner.on_this_loop():
            raise RuntimeError("a JsonHttpClient cannot be closed from its own event loop")
        await asyncio.wrap_future(self._runner.submit(self._aclose()))
        runner, self._runner = self._runner, None
        await asyncio.get_running_loop().run_in_executor(None, runner.stop)

    def close(self) -> None:
        """`aclose` for sync code."""
        if self._runner is None:
            return
        self.run_sync(self._aclose())
        runner, self._runner = self._runner, None
        runner.stop()

    def __enter__(self) -> "JsonHttpClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    async def __aenter__(self) -> "JsonHttpClient":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()
