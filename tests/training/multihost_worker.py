"""One process of the multi-host learner test (`test_multihost.py`): a tiny decoder trained for a few steps on a
fixed batch per step over a (data 2, fsdp 2, tensor 2) mesh, through the library's own pieces: the learner state,
the train step and the logprob function, checkpoints (restoring the latest one first), the metrics log, the
final safetensors save and plots.

    python -m tests.training.multihost_worker OUT STEPS [STOP_AFTER]

Multi-process when the environment names a coordinator (`multihost.initialize`). Each process
takes rows [process_index::process_count] of every step's batch. Writes OUT/process_<index>.json: per step, the
old logprobs of this process's rows (keyed by their row in the step's batch) and the step's metrics. With
STOP_AFTER, it writes that file once step STOP_AFTER's checkpoint has committed and then waits to be killed.
"""

import json
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
from flax import nnx

from rubric_jax.core.losses import ppo_clip_loss
from rubric_jax.data.arithmetic import build_tokenizer
from rubric_jax.models import sharding, train_step
from rubric_jax.models.config import ModelConfig
from rubric_jax.models.decoder import Decoder
from rubric_jax.training import multihost, policy, runs
from rubric_jax.training.run_config import CheckpointConfig, DistributedConfig, MetricsConfig

CONFIG = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                     num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=32, tie_word_embeddings=False)
MESH = (2, 2, 2)
ROWS, LENGTH, PROMPT = 8, 12, 4
SEED = 3
CHECKPOINTS = CheckpointConfig(every_steps=1, keep=2, async_save=True, resume=True)
PLOTS = {"train": ("loss", "grad_norm")}


def step_batch(step: int) -> dict[str, np.ndarray]:
    """Step `step`'s batch: prompts of PROMPT tokens, responses of ragged lengths, advantages of both signs."""
    rng = np.random.default_rng((SEED, step))
    lengths = rng.integers(1, LENGTH - PROMPT + 1, ROWS)
    columns = np.arange(LENGTH)[None, :]
    response_mask = (columns >= PROMPT) & (columns - PROMPT < lengths[:, None])
    return {
        "tokens_bt": rng.integers(0, CONFIG.vocab_size, (ROWS, LENGTH)).astype(np.int32),
        "positions_bt": np.broadcast_to(np.arange(LENGTH, dtype=np.int32), (ROWS, LENGTH)).copy(),
        "attention_mask_bt": (columns < PROMPT) | response_mask,
        "response_mask_bt": response_mask,
        "advantages_bt": np.where(response_mask, rng.normal(size=(ROWS, 1)), 0).astype(np.float32),
    }


def main(out: Path, steps: int, stop_after: int | None) -> None:
    multihost.initialize(DistributedConfig())
    index, count = jax.process_index(), jax.process_count()
    mesh = sharding.make_mesh(*MESH)
    rules = sharding.partition_rules(CONFIG)
    optimizer = optax.adam(1e-2)
    model = Decoder(CONFIG, rngs=nnx.Rngs(0), shard_activations=sharding.shard_activations)
    graphdef, state = policy.init_learner_state(model, optimizer, mesh, with_reference=False)
    common = dict(mesh=mesh, abstract_params=state.params, rules=rules, chunk_size=4, first_scored=PROMPT)
    logprobs = train_step.make_logprobs_fn(graphdef, **common)
    loss_fn = train_step.ratio_loss(ppo_clip_loss)
    update = train_step.make_train_step(graphdef, optimizer, loss_fn, micro_batches=2, **common)

    checkpointer = runs.open_checkpoints(out, CHECKPOINTS)
    state, meta = runs.restore_latest(checkpointer, state, CHECKPOINTS, SEED)
    writer = runs.open_metrics(out, MetricsConfig(tensorboard=False, console=False), steps, meta)
    results: dict[str, dict] = {"logp": {}, "metrics": {}}
    with writer, checkpointer:
        for step in range(meta["step"] if meta else 0, steps):
            local = {key: value[index::count] for key, value in step_batch(step).items()}
            batch = sharding.global_batch(local, mesh)
            old_logp_bt = sharding.process_rows(logprobs(state.params, batch), mesh)
            batch = sharding.global_batch({**local, "old_logp_bt": old_logp_bt}, mesh)
            state.params, state.opt_state, metrics = update(state.params, state.opt_state, batch)
            metrics = {name: float(value) for name, value in jax.device_get(metrics).items()}
            rows = range(index, ROWS, count)
            results["logp"][step] = {row: logp.tolist() for row, logp in zip(rows, old_logp_bt)}
            results["metrics"][step] = metrics
            checkpointer.save(step + 1, state.tree(), {"step": step + 1, "seed": SEED, "data_position": 0,
                                                      "metrics": metrics})
            writer.write(step + 1, metrics)
            if step + 1 == stop_after:
                checkpointer.wait()
                (out / f"process_{index}.json").write_text(json.dumps(results))
                print("waiting to be killed", flush=True)
                time.sleep(600)
    runs.save_outputs(out, graphdef, state.params, build_tokenizer(), PLOTS)
    (out / f"process_{index}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
