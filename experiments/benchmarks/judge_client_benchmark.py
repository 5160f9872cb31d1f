"""Throughput of the judge's HTTP client (`rubric_jax.inference.http.JsonHttpClient`) against the stand-in server.

The stand-in (tests/inference/standin_server.py, `serve_chat`) answers `/v1/chat/completions` with a fixed verdict
(no model) after a fixed latency of 100 ms per request. The client, bounded to 64 requests in flight, sends 1280
chat requests at once (20 latencies' worth) and validates every answer's shape, as the LLM judge does. The ideal
is 64 requests per 0.1 s = 640 req/s; the ratio printed is the achieved req/s over that ideal (target >= 0.9),
the median over several rounds after a warm-up round that opens the connections.

The server runs in a child process, as a judge server runs apart from the trainer: in one process the client's
and the server's event-loop threads would take turns on Python's GIL, and the benchmark would time that.
What keeps the ratio below 1 is the CPU time per request of both sides (about 0.1-0.15 ms each here, mostly
loopback socket calls): the 64 answers of a latency period arrive together and are handled one after another.

    python experiments/benchmarks/judge_client_benchmark.py
    python experiments/benchmarks/judge_client_benchmark.py --requests 3200 --rounds 7
"""

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)

from rubric_jax.inference.http import JsonHttpClient, MalformedResponse  # noqa: E402

VERDICT = '{"rating": 1}'
PAYLOAD = {
    "model": "judge",
    "messages": [{"role": "user", "content": "Does the response satisfy the criterion? Answer in JSON."}],
    "temperature": 0.0,
    "max_tokens": 16,
}


def chat_content(body) -> str:
    """The first choice's message content (the judge's validator, trimmed down)."""
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise MalformedResponse("no choices[0].message.content") from None
    if not isinstance(content, str):
        raise MalformedResponse("content is not a string")
    return content


async def send_all(client: JsonHttpClient, requests: int) -> list[str]:
    return await asyncio.gather(*(client.post_json("/v1/chat/completions", PAYLOAD, chat_content)
                                  for _ in range(requests)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds per request at the server")
    parser.add_argument("--requests", type=int, default=1280)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    ideal = args.in_flight / args.latency
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.inference.standin_server", "--latency-s", str(args.latency), "--reply", VERDICT],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        base_url = server.stdout.readline().strip()
        with JsonHttpClient(base_url, max_in_flight=args.in_flight) as client:
            print(f"stand-in at {base_url} (child process): latency {args.latency * 1e3:.0f} ms per request; "
                  f"client max_in_flight {args.in_flight}; {args.requests} requests per round; ideal {ideal:.0f} req/s")
            client.run_sync(send_all(client, args.in_flight))  # warm-up: open the connections
            ratios = []
            for round_index in range(args.rounds):
                start = time.perf_counter()
                answers = client.run_sync(send_all(client, args.requests))
                elapsed = time.perf_counter() - start
                assert answers == [VERDICT] * args.requests
                rate = args.requests / elapsed
                ratios.append(rate / ideal)
                print(f"  round {round_index + 1}: {elapsed:.3f} s, {rate:6.1f} req/s, ratio {rate / ideal:.3f}")
            stats = client.stats
            print(f"  client: {stats.requests} requests, {stats.attempts} attempts, {stats.retries} retries, "
                  f"{stats.failures} failures")
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    print(f"judge client throughput / ideal ({ideal:.0f} req/s): {statistics.median(ratios):.3f}   "
          f"(target >= 0.9; median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
