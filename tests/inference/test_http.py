"""The JSON HTTP client against the stand-in server: retries on each injected fault within the attempt budget,
no retry on 4xx, failures reported by reason, the in-flight bound, health waits, and sync/async use."""

import asyncio
import math
import random
import socket
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubric_jax.inference.http import JsonHttpClient, MalformedResponse, RequestFailed, RetryPolicy, decode_json
from tests.inference import standin_server
from tests.inference.standin_server import drop_connection, http_error, malformed, slow

chat_standin = standin_server.chat_standin  # the fixture this module uses

CHAT = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "hello"}], "temperature": 0.0}
FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.001, max_backoff_s=0.002, timeout_s=2.0)


def content(body):
    """A validator: the first choice's content, MalformedResponse when the shape is wrong."""
    try:
        return body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise MalformedResponse("no choices[0].message.content") from None


@pytest.fixture
def client(chat_standin):
    with JsonHttpClient(chat_standin.base_url, retry=FAST, seed=0) as client:
        yield client


def post(client, payload=BODY, validate=content, path=CHAT):
    return client.run_sync(client.post_json(path, payload, validate))


# ------------------------------------------------------------------------------------------- RetryPolicy


@given(attempt=st.integers(1, 10_000), initial=st.floats(0, 10), extra=st.floats(0, 100), multiplier=st.floats(1, 1e6),
       seed=st.integers(0, 2**32))
def test_backoff_is_full_jitter_below_the_capped_exponential(attempt, initial, extra, multiplier, seed):
    policy = RetryPolicy(initial_backoff_s=initial, max_backoff_s=initial + extra, multiplier=multiplier)
    cap = policy.backoff_cap_s(attempt)
    if initial == 0:
        expected = 0.0
    elif math.log(initial) + (attempt - 1) * math.log(multiplier) >= math.log(initial + extra):
        expected = initial + extra
    else:
        expected = initial * multiplier ** (attempt - 1)
    assert cap == pytest.approx(expected, rel=1e-9)
    assert 0.0 <= policy.backoff_s(attempt, random.Random(seed)) <= cap


def test_backoff_caps_hand_computed():
    policy = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=3.0, multiplier=2.0)
    assert [policy.backoff_cap_s(k) for k in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    draws = [policy.backoff_s(3, random.Random(k)) for k in range(2000)]
    assert min(draws) >= 0 and max(draws) <= 2.0
    assert 0.9 < sum(draws) / len(draws) < 1.1  # uniform on [0, 2]: mean 1
    assert policy.backoff_s(2, random.Random(7)) == policy.backoff_s(2, random.Random(7))


@pytest.mark.parametrize("field, value", [("max_attempts", 0), ("max_attempts", 1.5), ("initial_backoff_s", -1.0),
                                          ("max_backoff_s", 0.1), ("multiplier", 0.5), ("timeout_s", 0.0),
                                          ("timeout_s", math.nan)])
def test_retry_policy_rejects_bad_fields_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        RetryPolicy(**{field: value})


def test_decode_json_is_strict():
    assert decode_json(b'{"a": [1, 2.5]}') == {"a": [1, 2.5]}
    for body in (b"", b"{", b'{"a": NaN}', b"[Infinity]", b"\xff\xfe"):
        with pytest.raises(MalformedResponse):
            decode_json(body)


# ---------------------------------------------------------------------------------------- faults, retries


def test_round_trip_counts_one_attempt(chat_standin, client):
    assert post(client) == "hello"
    assert (client.stats.requests, client.stats.attempts, client.stats.retries, client.stats.failures) == (1, 1, 0, 0)
    assert chat_standin.chat_requests == [BODY]


@pytest.mark.parametrize("fault, reason", [
    (http_error(500), "http_500"),
    (http_error(503), "http_503"),
    (slow(5.0), "timeout"),
    (drop_connection(), "connection"),
    (malformed(b"<html>bad gateway</html>"), "malformed"),
    (malformed(b'{"choices": []}'), "malformed"),  # JSON, but the validator rejects its shape
])
def test_client_survives_each_fault_with_one_retry(chat_standin, fault, reason):
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.001, max_backoff_s=0.002, timeout_s=0.5)
    chat_standin.inject(fault)
    with JsonHttpClient(chat_standin.base_url, retry=policy) as client:
        assert post(client) == "hello"
        assert client.stats.errors_by_reason == {reason: 1}
        assert (client.stats.attempts, client.stats.retries, client.stats.failures) == (2, 1, 0)
    assert chat_standin.requests[CHAT] == 2
    assert chat_standin.faults_served == [(CHAT, fault.kind)]


def test_gives_up_after_max_attempts_with_the_last_reason(chat_standin, client):
    chat_standin.inject(http_error(502), drop_connection(), http_error(503), http_error(500))
    with pytest.raises(RequestFailed) as failure:
        post(client)
    assert (failure.value.path, failure.value.attempts, failure.value.reason, failure.value.status) == (
        CHAT, 3, "http_503", 503)
    assert "injected fault" in failure.value.detail
    assert chat_standin.requests[CHAT] == 3  # the budget: three attempts, no more
    assert chat_standin.pending_faults == 1
    assert client.stats.errors_by_reason == {"http_502": 1, "connection": 1, "http_503": 1}
    assert (client.stats.requests, client.stats.attempts, client.stats.retries, client.stats.failures) == (1, 3, 2, 1)


@pytest.mark.parametrize("status", [400, 404, 422, 429])
def test_4xx_is_never_retried(chat_standin, client, status):
    chat_standin.inject(http_error(status))
    with pytest.raises(RequestFailed) as failure:
        post(client)
    assert (failure.value.attempts, failure.value.reason, failure.value.status) == (1, f"http_{status}", status)
    assert chat_standin.requests[CHAT] == 1
    assert client.stats.failures == 1 and client.stats.retries == 0


def test_a_real_400_carries_the_servers_message(client):
    with pytest.raises(RequestFailed, match="messages must be a non-empty list") as failure:
        post(client, {"messages": []})
    assert failure.value.reason == "http_400"


def test_connection_refused_is_retried_then_reported():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with JsonHttpClient(f"http://127.0.0.1:{port}", retry=FAST) as client:
        with pytest.raises(RequestFailed) as failure:
            post(client)
        assert (failure.value.reason, failure.value.attempts, failure.value.status) == ("connection", 3, None)
        assert client.stats.errors_by_reason == {"connection": 3}


def test_bad_payload_raises_at_once(client):
    with pytest.raises(ValueError):
        post(client, {"messages": [{"role": "user", "content": "x"}], "temperature": math.nan})
    assert client.stats.requests == 0


def test_a_validator_bug_is_not_retried(chat_standin, client):
    def buggy(body):
        raise KeyError("programming error")

    with pytest.raises(KeyError):
        post(client, validate=buggy)
    assert chat_standin.requests[CHAT] == 1


# ------------------------------------------------------------------------------------------- concurrency


def test_in_flight_requests_are_bounded(chat_standin):
    chat_standin.latency_s = 0.2
    with JsonHttpClient(chat_standin.base_url, max_in_flight=4, retry=FAST) as client:

        async def many():
            return await asyncio.gather(*(client.post_json(CHAT, BODY, content) for _ in range(12)))

        assert client.run_sync(many()) == ["hello"] * 12
    assert chat_standin.max_concurrent == 4  # reached, never exceeded


def test_backoff_does_not_hold_an_in_flight_slot(chat_standin):
    chat_standin.inject(http_error(500))
    # A seed whose first jitter draw is over 90% of the cap: the first request backs off for >= 0.54 s.
    seed = next(s for s in range(100) if random.Random(s).random() > 0.9)
    policy = RetryPolicy(max_attempts=2, initial_backoff_s=0.6, max_backoff_s=0.6)
    with JsonHttpClient(chat_standin.base_url, max_in_flight=1, retry=policy, seed=seed) as client:

        async def both():
            first = asyncio.ensure_future(client.post_json(CHAT, BODY, content))
            await asyncio.sleep(0.05)
            second = await client.post_json(CHAT, {"messages": [{"role": "user", "content": "second"}]}, content)
            return await first, second

        assert client.run_sync(both()) == ("hello", "second")
    # The server saw: the first request (500), the second one while the first backed off, the first's retry.
    assert [m[-1]["content"] for m in (r["messages"] for r in chat_standin.chat_requests)] == ["second", "hello"]
    assert chat_standin.faults_served == [(CHAT, "status")]


# ------------------------------------------------------------------------------------------------- health


def test_wait_healthy_waits_through_failing_probes(chat_standin, client):
    chat_standin.inject(http_error(503, path="/health"), drop_connection(path="/health"), http_error(500, "/health"))
    client.run_sync(client.wait_healthy(timeout_s=5.0, poll_s=0.001))
    assert chat_standin.requests["/health"] == 4
    assert client.stats.requests == 0  # probes are not counted


def test_wait_healthy_times_out_naming_the_last_outcome(chat_standin, client):
    chat_standin.inject(*[http_error(503, path="/health")] * 1000)
    with pytest.raises(TimeoutError, match="http_503"):
        client.run_sync(client.wait_healthy(timeout_s=0.2, poll_s=0.01))


def test_wait_healthy_before_the_server_listens():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with JsonHttpClient(f"http://127.0.0.1:{port}", retry=FAST) as client:
        with pytest.raises(TimeoutError, match="not healthy after 0.5 s"):
            client.run_sync(client.wait_healthy(timeout_s=0.5, poll_s=0.01))


def test_get_returns_any_status(chat_standin, client):
    assert client.run_sync(client.get("/health")) == (200, b"")
    assert client.run_sync(client.get("/nowhere"))[0] == 404
    chat_standin.inject(drop_connection("/health"), drop_connection("/health"))  # aiohttp resends a GET once
    with pytest.raises(RequestFailed, match="connection"):
        client.run_sync(client.get("/health"))
    assert client.stats.errors_by_reason == {"connection": 1}
    assert chat_standin.pending_faults == 0


# ------------------------------------------------------------------------------------------ sync and async


def test_await_from_a_foreign_event_loop(client):
    async def from_my_loop():
        return await asyncio.gather(*(client.post_json(CHAT, BODY, content) for _ in range(3)))

    assert asyncio.run(from_my_loop()) == ["hello"] * 3
    assert asyncio.run(from_my_loop()) == ["hello"] * 3  # a second loop: the same client still works


def test_run_sync_inside_a_running_loop_blocks_but_works(client):
    async def caller():
        return post(client)

    assert asyncio.run(caller()) == "hello"


def test_run_sync_on_the_clients_own_loop_raises(client):
    async def nested():
        return client.run_sync(client.post_json(CHAT, BODY, content))

    with pytest.raises(RuntimeError, match="deadlock"):
        client.run_sync(nested())


def test_closed_client_refuses_requests(chat_standin):
    client = JsonHttpClient(chat_standin.base_url, retry=FAST)
    assert post(client) == "hello"
    client.close()
    client.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        client.run_sync(asyncio.sleep(0))


def test_async_close(chat_standin):
    async def use():
        async with JsonHttpClient(chat_standin.base_url, retry=FAST) as client:
            return await client.post_json(CHAT, BODY, content), client

    answer, client = asyncio.run(use())
    assert answer == "hello"
    with pytest.raises(RuntimeError, match="closed"):
        client.run_sync(asyncio.sleep(0))


@pytest.mark.parametrize("kwargs", [dict(max_in_flight=0), dict(base_url="127.0.0.1:80")])
def test_client_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        JsonHttpClient(**{"base_url": "http://127.0.0.1:1", **kwargs})


def test_standin_responder_failure_is_a_retried_500(chat_standin, client):
    calls = []

    def flaky(messages):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("model crashed")
        return "recovered"

    chat_standin.responder = flaky
    assert post(client) == "recovered"
    assert client.stats.errors_by_reason == {"http_500": 1}


def test_standin_validates_response_format(chat_standin, client):
    schema = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": {"type": "object"}}}
    assert post(client, {**BODY, "response_format": schema}) == "hello"
    with pytest.raises(RequestFailed, match="response_format"):
        post(client, {**BODY, "response_format": {"type": "xml"}})


def test_repeated_failures_are_collapsed_into_counted_warnings(caplog):
    """A dead server fails every request: the 1st, 10th and 100th failure of a kind are warnings (with the count),
    the others debug lines, so a run's log does not fill with one line per attempt."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    caplog.set_level("DEBUG", logger="rubric_jax.inference.http")
    with JsonHttpClient(f"http://127.0.0.1:{port}", retry=RetryPolicy(max_attempts=1)) as client:
        for _ in range(12):
            with pytest.raises(RequestFailed):
                client.run_sync(client.post_json("/v1/chat/completions", {}))
    records = [r for r in caplog.records if r.name == "rubric_jax.inference.http"]
    assert len(records) == 12
    warnings = [r.getMessage() for r in records if r.levelname == "WARNING"]
    assert len(warnings) == 2
    assert warnings[0].endswith("(failure 1 of this kind)") and warnings[1].endswith("(failure 10 of this kind)")
    assert f"http://127.0.0.1:{port}/v1/chat/completions attempt 1/1 failed: connection" in warnings[0]


def test_timing_keeps_each_successful_requests_wire_time_and_every_requests_end(chat_standin, client):
    """Inside `stats.timing()`: one latency per successful request, a retried one timed by its successful attempt
    alone (its timed-out attempt and the backoff are not in it); a request that fails for good ends without a
    latency; requests before the block, or after it, are not in it."""
    post(client)
    with client.stats.timing() as times:
        post(client)
        slow_policy = RetryPolicy(max_attempts=2, initial_backoff_s=0.001, max_backoff_s=0.002, timeout_s=0.3)
        chat_standin.inject(slow(5.0))
        started = time.monotonic()
        client.run_sync(client.post_json(CHAT, BODY, content, retry=slow_policy))
        elapsed = time.monotonic() - started
        assert len(times.latencies_s) == 2 and times.latencies_s[1] <= elapsed - 0.3  # the first attempt: >= 0.3 s
        ended = times.last_ended_at
        chat_standin.inject(*[http_error(500)] * FAST.max_attempts)
        with pytest.raises(RequestFailed):
            post(client)
        assert len(times.latencies_s) == 2 and times.last_ended_at > ended
    post(client)
    assert len(times.latencies_s) == 2 and client.stats.requests == 5
    assert all(latency > 0 for latency in times.latencies_s)
