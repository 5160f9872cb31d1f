"""The embedded engine's decode step against the memory roofline, compiled ahead of time for a TPU topology on this
host (libtpu, no TPU; `training.rollout_plan`): HBM bytes read per chip, from the compiled program.

Setup (the issue's): srar_paper.yaml's rollouts with a Qwen3-8B-shaped model (bfloat16 activations, weights held
in bfloat16 by the engine), 256 decode slots of 2048 prompt + 2048 response positions (a 4096-slot cache), on
v5p:2x2x2 in the decode layout (data 2 x tensor 4).
- read_ratio: bytes a decode step reads per chip with every row half full / (weight bytes + the KV cache in use)
  per chip. Goal <= 1.25.
- windowed_vs_whole: the same step's bytes read / those of the step attending to the whole cache (what every
  decode step read before the engine's attention windows), in the same process.
- tokens_per_s_bound: rows x HBM bandwidth / bytes read, for the half-full step.
Bytes are deterministic (a compiled program, no timing). The last line printed is one JSON object of the figures.

    python experiments/benchmarks/decode_bytes_benchmark.py            # the setup above (minutes: two compiles)
    python experiments/benchmarks/decode_bytes_benchmark.py --quick    # a tiny model on v5e:2x2, 512 + 512
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from rubric_jax.models.config import ModelConfig, preset_config  # noqa: E402
from rubric_jax.training import rollout_plan  # noqa: E402
from rubric_jax.training.run_config import RLConfig  # noqa: E402
from rubric_jax.yaml_config import load_config  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
QUICK_MODEL = ModelConfig(model_type="qwen3", vocab_size=512, hidden_size=512, intermediate_size=1024, num_layers=2,
                          num_heads=4, num_kv_heads=2, head_dim=128, max_position_embeddings=4096)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model on v5e:2x2, 64 slots of 512 + 512 positions")
    args = parser.parse_args(argv)
    slots, tokens, topology, model = (64, 512, "v5e:2x2", QUICK_MODEL) if args.quick else \
        (256, 2048, "v5p:2x2x2", preset_config("Qwen3-8B"))
    config = load_config(RLConfig, os.path.join(ROOT, "configs", "srar_paper.yaml"),
                         [f"rollout.max_new_tokens={tokens}", f"rollout.decode_slots={slots}"])
    half, whole = (rollout_plan.plan_rollouts(config, model, topology, prompt_tokens=tokens, fill=fill)
                   for fill in (0.5, 1.0))
    print(half.report())
    print(f"the step attending to the whole cache reads {whole.decode_read_bytes / 2**30:.2f} GiB per chip")
    figures = {
        "read_ratio": half.read_ratio,
        "windowed_vs_whole": half.decode_read_bytes / whole.decode_read_bytes,
        "tokens_per_s_bound": half.tokens_per_s_bound,
        "read_gib": half.decode_read_bytes / 2**30, "least_read_gib": half.least_read_bytes / 2**30,
        "whole_cache_read_gib": whole.decode_read_bytes / 2**30, "weight_gib": half.weight_bytes / 2**30,
        "mesh": half.mesh, "slots": half.slots, "cache_slots": half.cache_slots,
        "attended_slots": half.attended_slots, "topology": topology,
    }
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
