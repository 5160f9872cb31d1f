"""The rollout pipeline's figures, each a ratio measured in one process: first the embedded engine's
(`continuous_batching_benchmark.py`: continuous_vs_static, shared_prefill), then the RL step's below.

Step time of the RL loop with pipelined judging (`rollout.pipelined_judging: true`: each group's judge requests
sent the moment the engine finishes the group, while later groups still sample; `algorithms.base.sample_and_judge`)
against the serial step (`false`: sample every group, then judge every row), measured in the same process.

Setup: a small random Qwen3 (`--hidden`, `--layers`) learning the arithmetic task with RaR; generation is the
SGLang client talking to the stand-in server (`tests/inference/standin_server.py`) with the scripted policy of
overlap_benchmark.py, where the prompts' /generate requests finish spread over time: the stand-in here
(`StaggeredStandin`) holds its k-th /generate answer (k counted over the server's life) for
`--gen-latency` x (k mod P + 1) / P seconds, P = `--prompts`, so each step's P requests (sent at once) finish
one every `--gen-latency` / P seconds, the last after `--gen-latency`, as a generation server's prompts of
different lengths do. The judge is an LLM judge over HTTP (`judge.kind: llm`, format "rating": one chat call per
(rollout, criterion), 4 or 5 criteria per arithmetic prompt) against a second stand-in serving
/v1/chat/completions, every answer held `--judge-latency` seconds, with at most `--judge-in-flight` calls on the
wire (`judge.max_in_flight`), so a judge's throughput is bounded as a real one's is. The defaults make serial
judging take about as long as sampling (the serial "time/judging" is about `--gen-latency`) and let one group's
calls go out in one wave of `--judge-latency`, the interval between two groups' ends.

Each configuration runs `--warmup` steps (which compile), `--steps` measured steps, and a last one (which
checkpoints), excluded. Printed as ratios, pipelined / serial, of the means over the measured steps:
- pipelined_vs_serial: "time/step" (the step's wall time).
- judge_tail: "time/judging". Serial, that is every row's judging (`base.judge_requests`); pipelined, it is only
  the wait for the verdicts after the engine's stream has yielded its last group (the judging sampling did not
  hide; the stream itself, with the judging that overlaps it, is "time/generation").
The table also shows "judge/wait_after_sampling_s" (`training.accounting`: end of the last generation phase to the
end of the last judge request) and "overlapped", the share of the run's judge calls (every step's, the launch's
preflight call included) that reached the judge server while a /generate request was in flight: 0 for the serial
step, about (P - 1) / P pipelined, the evidence that the pipelined step sends its judge requests before its stream
ends.
Ideal figures: pipelined_vs_serial = (S + S/P + U) / (2 S + U) with S = `--gen-latency` and U the rest of the step
(logprobs, update, sync), about 0.6 for the defaults; judge_tail = 1/P = 0.125. The last line is one JSON object
with both ratios and the absolute seconds they come from.

    python experiments/benchmarks/rollout_pipeline_benchmark.py               # 2 warm-up + 6 measured steps
    python experiments/benchmarks/rollout_pipeline_benchmark.py --quick       # a smoke run (the test's)
    python experiments/benchmarks/rollout_pipeline_benchmark.py --gen-latency 3 --judge-latency 0.375 --steps 4
"""

import argparse
import asyncio
import bisect
import itertools
import json
import os
import sys
import tempfile
import threading
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import continuous_batching_benchmark  # noqa: E402

from rubric_jax.data.tasks import build_task  # noqa: E402
from rubric_jax.training import policy  # noqa: E402
from rubric_jax.training.metrics import read_metrics  # noqa: E402
from rubric_jax.training.rl import train_rl  # noqa: E402
from rubric_jax.training.run_config import (  # noqa: E402
    CheckpointConfig, JudgeConfig, MetricsConfig, ModelInit, ModelSpec, RLConfig, RolloutConfig)
from tests.inference.standin_server import ScriptedPolicy, StandinServer  # noqa: E402

CONFIGURATIONS = {"serial": False, "pipelined": True}  # name: rollout.pipelined_judging
PHASES = ("step", "generation", "judging", "logprobs", "update", "sync")


class StaggeredStandin(StandinServer):
    """The stand-in whose k-th /generate answer (k = 0, 1, ... over the server's life) is held `latencies[k mod
    len(latencies)]` seconds once computed (on top of `latency_s`, 0 here), so a step's requests, sent at once,
    finish spread over time. The hold comes after the request's generation slot: a weight update does not wait
    for it (the loop here updates only once every answer is in). Each request's (start, end) monotonic times are
    kept in `generate_spans`."""

    def __init__(self, *args, latencies, **kwargs):
        super().__init__(*args, **kwargs)
        self.latencies = tuple(latencies)
        self._served = itertools.count()
        self.generate_spans: list[tuple[float, float]] = []

    async def _generate(self, request):
        started = time.monotonic()
        hold = self.latencies[next(self._served) % len(self.latencies)]
        response = await super()._generate(request)
        await asyncio.sleep(hold)
        self.generate_spans.append((started, time.monotonic()))
        return response


class RecordingResponder:
    """A chat responder for the "rating" format: a rating of 0 or 1 from a hash of the messages (so a group's
    rewards differ and its advantages are not all 0), each call's arrival time kept in `times`."""

    def __init__(self):
        self.times: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, messages) -> str:
        with self._lock:
            self.times.append(time.monotonic())
        rating = zlib.crc32(messages[-1]["content"].encode()) % 2
        return json.dumps({"rating": rating})


def scripted_reply(prompt: str, sample: int) -> str:
    """A short answer whose correctness varies across a group (overlap_benchmark.py's)."""
    del prompt
    return f"### Step 1: add.\nThe answer is \\boxed{{{sample}}}."


def overlapped_share(call_times, spans) -> float:
    """The share of judge calls that arrived while some /generate request was in flight (its span holds the
    call's time)."""
    if not call_times:
        return 0.0
    spans = sorted(spans)
    starts = [start for start, _ in spans]
    inside = 0
    for t in call_times:
        # spans that started before t; one of them still running at t
        inside += any(end > t for _, end in spans[:bisect.bisect_right(starts, t)])
    return inside / len(call_times)


def run_configurations(args, gen_server, judge_server, responder, task, scratch) -> dict[str, dict[str, float]]:
    """{configuration: {phase or metric: mean over the measured steps}}."""
    model = ModelSpec(init=ModelInit(hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                                     num_layers=args.layers, num_heads=4, num_kv_heads=2,
                                     head_dim=args.hidden // 4, max_position_embeddings=512))
    total = args.warmup + args.steps + 1
    results = {}
    for name, pipelined in CONFIGURATIONS.items():
        config = RLConfig(
            output_dir=os.path.join(scratch, name), steps=total, seed=0, model=model,
            rollout=RolloutConfig(engine="sglang", sglang_url=gen_server.base_url, prompts_per_step=args.prompts,
                                  group_size=args.group_size, max_new_tokens=32, pipelined_judging=pipelined),
            judge=JudgeConfig(kind="llm", url=judge_server.base_url, model="judge", format="rating",
                              max_in_flight=args.judge_in_flight, max_attempts=2, timeout_s=60.0),
            checkpoint=CheckpointConfig(every_steps=total, async_save=False),
            metrics=MetricsConfig(console=False, tensorboard=False, plots=False))
        first_call, first_span = len(responder.times), len(gen_server.generate_spans)
        train_rl(config, task)
        lines = read_metrics(os.path.join(config.output_dir, "metrics.jsonl"))[args.warmup:-1]
        result = {phase: float(np.mean([line.get(f"time/{phase}", 0.0) for line in lines])) for phase in PHASES}
        result["wait_after_sampling"] = float(np.mean([line.get("judge/wait_after_sampling_s", 0.0)
                                                       for line in lines]))
        result["judge_calls"] = float(np.mean([line.get("judge/requests", 0.0) for line in lines]))
        result["overlapped"] = overlapped_share(responder.times[first_call:], gen_server.generate_spans[first_span:])
        results[name] = result
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 1 warm-up + 1 measured step, 4 prompts x 4, short latencies")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per configuration (default 6)")
    parser.add_argument("--warmup", type=int, default=None, help="steps excluded (compilation; default 2)")
    parser.add_argument("--gen-latency", type=float, default=None,
                        help="seconds the slowest prompt's /generate takes; the others finish evenly before it "
                             "(default 2.0)")
    parser.add_argument("--judge-latency", type=float, default=None,
                        help="seconds every judge chat answer takes (default: gen-latency / prompts)")
    parser.add_argument("--judge-in-flight", type=int, default=None,
                        help="judge.max_in_flight (default: 5 x group size, one group's calls at most)")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (default 8)")
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args()
    defaults = dict(steps=1, warmup=1, gen_latency=0.4, prompts=4) if args.quick else dict(
        steps=6, warmup=2, gen_latency=2.0, prompts=8)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.judge_latency is None:
        args.judge_latency = args.gen_latency / args.prompts
    if args.judge_in_flight is None:
        args.judge_in_flight = 5 * args.group_size

    engine = continuous_batching_benchmark.engine_figures(
        continuous_batching_benchmark.parse_args(["--quick"] if args.quick else []))
    print(f"continuous_vs_static (response tokens / s) {engine['continuous_vs_static']:.2f} (goal >= 2); "
          f"shared_prefill (prefill time, per sample / shared) {engine['shared_prefill']:.2f} (goal >= 4)")

    task = build_task("arithmetic", {}, 0)
    tokenizer = task.tokenizer()
    eos_ids, _ = policy.eos_and_pad(tokenizer)
    script = ScriptedPolicy(tokenizer, scripted_reply, eos_ids[0])
    latencies = [args.gen_latency * (k + 1) / args.prompts for k in range(args.prompts)]
    responder = RecordingResponder()
    with StaggeredStandin(script, tokenizer=tokenizer, latencies=latencies) as gen_server, \
            StandinServer(responder=responder, latency_s=args.judge_latency) as judge_server, \
            tempfile.TemporaryDirectory() as scratch:
        results = run_configurations(args, gen_server, judge_server, responder, task, scratch)

    serial, pipelined = results["serial"], results["pipelined"]
    figures = {
        **engine,
        "pipelined_vs_serial": pipelined["step"] / serial["step"],
        "judge_tail": pipelined["judging"] / serial["judging"],
        "pipelined_step_s": pipelined["step"], "serial_step_s": serial["step"],
        "pipelined_judging_s": pipelined["judging"], "serial_judging_s": serial["judging"],
        "pipelined_generation_s": pipelined["generation"], "serial_generation_s": serial["generation"],
        "pipelined_wait_after_sampling_s": pipelined["wait_after_sampling"],
        "serial_wait_after_sampling_s": serial["wait_after_sampling"],
        "pipelined_overlapped_calls": pipelined["overlapped"], "serial_overlapped_calls": serial["overlapped"],
    }
    print(f"\nRL step, {args.prompts} prompts x {args.group_size} samples, /generate answers spread evenly up to "
          f"{args.gen_latency} s, an LLM judge ({serial['judge_calls']:.0f} calls per step, {args.judge_latency:.3f} "
          f"s each, {args.judge_in_flight} in flight), a {args.layers}-layer model of width {args.hidden}; mean of "
          f"{args.steps} steps after {args.warmup} warm-up steps (seconds)")
    columns = PHASES + ("wait_after_sampling",)
    print(f"{'configuration':<14}" + "".join(f"{c:>21}" if c == "wait_after_sampling" else f"{c:>12}"
                                            for c in columns) + f"{'overlapped':>12}")
    for name, result in results.items():
        print(f"{name:<14}" + "".join(f"{result[c]:21.3f}" if c == "wait_after_sampling" else f"{result[c]:12.3f}"
                                    for c in columns) + f"{result['overlapped']:12.2f}")
    print(f"pipelined_vs_serial (time/step) {figures['pipelined_vs_serial']:.3f} (goal <= 0.65); "
          f"judge_tail (time/judging) {figures['judge_tail']:.3f} (goal <= 0.2)")
    print("(pipelined: generation times the stream, the judging it overlaps included; judging is the wait after "
          "the last group; overlapped: the share of judge calls sent while a /generate was in flight)")
    print(json.dumps({key: round(value, 4) if isinstance(value, float) else value
                      for key, value in figures.items()}))


if __name__ == "__main__":
    main()
