"""One process of `test_rollout_layout.py`'s two-process check: the learner's FSDP model over both processes'
8 devices, handed to the embedded engine in its decode layout (`policy.rollout_model`: each process's 4 devices,
tensor 2 x data 2, `tensor=2`), which samples this process's share of the prompts; the samples go to
OUT/samples_<process index>.json.

    python -m tests.training.multihost_rollout_worker OUT
"""

import json
import sys
from pathlib import Path

import jax

from rubric_jax.inference.embedded import EmbeddedEngine
from rubric_jax.models import sharding
from rubric_jax.training import multihost, policy
from rubric_jax.training.run_config import DistributedConfig
from tests.training.test_rollout_layout import PARAMS, PROMPTS, learner_params


def main(out: Path) -> None:
    multihost.initialize(DistributedConfig())
    graphdef, _, placed = learner_params(sharding.make_mesh(1, 8, 1))
    model = policy.rollout_model(graphdef, placed, "embedded", tensor=2)
    kernel = model.layers[0].mlp.up_proj.kernel[...]
    layout = {"mesh": dict(kernel.sharding.mesh.shape), "devices": len(kernel.sharding.device_set),
              "local": all(device.process_index == jax.process_index() for device in kernel.sharding.device_set)}
    share = PROMPTS[jax.process_index()::2]
    samples = EmbeddedEngine(model, eos_token_ids=(), decode_slots=8).generate(share, PARAMS)
    (out / f"samples_{jax.process_index()}.json").write_text(json.dumps({
        "layout": layout, "samples": [[s.prompt_index, list(s.output_ids), list(s.logprobs)] for s in samples]}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
