"""Client throughput of the SGLang engine's requests: one request per prompt holding the prompt once per sample,
each copy with its own seed (what `SGLangEngine.agenerate` sends, so that a group's samples differ on any server),
against the one batched request with `n` per prompt and one seed that the engine sent before (baseline: its
samples are identical on a server with deterministic inference), both measured in this process against the same
stand-in server (`tests/inference/standin_server.py`).

The stand-in answers from a scripted policy (`ScriptedPolicy`: no model, each answer ready at once) after
`--latency` seconds per request, so what is measured is the client and the wire (requests, JSON bodies, parsing)
and how concurrent requests overlap the server's latency, not a GPU server's batching (a real SGLang server batches
the requests of every prompt together either way, and its radix cache prefills a prompt's copies once). Each
shape is timed `--repeats` times, alternating, after one warm-up call each; the figures are the medians.
A ratio above 1 is the per-prompt requests' throughput over the batched one's.

    python experiments/benchmarks/sglang_requests_benchmark.py
    python experiments/benchmarks/sglang_requests_benchmark.py --prompts 128 --group-size 16 --latency 0.2
"""

import argparse
import functools
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from rubric_jax.data.tasks import build_task  # noqa: E402
from rubric_jax.inference.engine import SamplingParams, prompt_token_ids  # noqa: E402
from rubric_jax.inference.sglang import SGLangEngine, parse_sample  # noqa: E402
from rubric_jax.training import policy  # noqa: E402
from tests.inference.standin_server import ScriptedPolicy, StandinServer  # noqa: E402


def scripted_reply(prompt: str, sample: int) -> str:
    del prompt
    return f"### Step 1: add the numbers.\nThe answer is \\boxed{{{sample}}}."


def batched_request(engine: SGLangEngine, prompt_ids: list[list[int]], params: SamplingParams):
    """The baseline: every prompt in one /generate with n samples each and one seed, parsed as the engine does."""
    payload = {"input_ids": prompt_ids, "sampling_params": params.to_sglang(), "return_logprob": True,
               "logprob_start_len": -1}

    def parse(body):
        return [parse_sample(value, i // params.n, params) for i, value in enumerate(body)]

    return engine.client.run_sync(engine.client.post_json("/generate", payload, parse))


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds every /generate answer takes")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    task = build_task("arithmetic", {}, 0)
    tokenizer = task.tokenizer()
    eos_ids, _ = policy.eos_and_pad(tokenizer)
    examples = task.train_stream(0).next_batch(args.prompts)
    prompt_ids = [prompt_token_ids(task.prompt(e), tokenizer) for e in examples]
    params = SamplingParams(max_new_tokens=64, n=args.group_size, seed=1)
    script = ScriptedPolicy(tokenizer, scripted_reply, eos_ids[0])
    with StandinServer(script, tokenizer=tokenizer, latency_s=args.latency, deterministic_inference=True) as server, \
            SGLangEngine(server.base_url, eos_token_ids=eos_ids) as engine:
        shapes = {"batched (n per prompt, one seed)": functools.partial(batched_request, engine, prompt_ids, params),
                  "per prompt (a seed per sample)": functools.partial(engine.generate, prompt_ids, params)}
        for call in shapes.values():
            call()
        seconds = {name: [] for name in shapes}
        for _ in range(args.repeats):
            for name, call in shapes.items():
                seconds[name].append(timed(call))
    samples = args.prompts * args.group_size
    median = {name: statistics.median(values) for name, values in seconds.items()}
    baseline, candidate = median.values()
    print(f"\n{args.prompts} prompts x {args.group_size} samples, {args.latency} s per answer, median of "
          f"{args.repeats} calls")
    for name, value in median.items():
        print(f"{name:<36}{value:10.3f} s{samples / value:12.0f} samples/s")
    ratio = baseline / candidate
    print(f"per-prompt throughput / batched: {ratio:.2f}")
    print(json.dumps({"prompts": args.prompts, "group_size": args.group_size, "latency_s": args.latency,
                      "batched_s": baseline, "per_prompt_s": candidate, "throughput_ratio": ratio}))


if __name__ == "__main__":
    main()
