"""Throughput of the LLM judge's chat client (`rubric_jax.judges.llm.ChatClient` on the `JsonHttpClient`) against
the stand-in server.

The stand-in (tests/inference/standin_server.py, `serve_chat`) answers `/v1/chat/completions` with a fixed verdict
(no model) after a fixed latency of 100 ms per request. The client, bounded to 64 requests in flight, sends 1280
chat requests at once (20 latencies' worth) through `ChatClient.complete`, which validates every answer's shape. The ideal
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

from rubric_jax.inference.http import JsonHttpClient  # noqa: E402
from rubric_jax.judges.llm import ChatClient, ChatSettings  # noqa: E402

VERDICT = '{"rating": 1}'
MESSAGES = [{"role": "user", "content": "Does the response satisfy the criterion? Answer in JSON."}]


async def send_all(chat: ChatClient, requests: int) -> list[str]:
    return await asyncio.gather(*(chat.complete(MESSAGES) for _ in range(requests)))


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
            chat = ChatClient(client, ChatSettings(model="judge", max_tokens=16))
            print(f"stand-in at {base_url} (child process): latency {args.latency * 1e3:.0f} ms per request; "
                  f"client max_in_flight {args.in_flight}; {args.requests} requests per round; ideal {ideal:.0f} req/s")
            client.run_sync(send_all(chat, args.in_flight))  # warm-up: open the connections
            ratios = []
            for round_index in range(args.rounds):
                start = time.perf_counter()
                answers = client.run_sync(send_all(chat, args.requests))
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
