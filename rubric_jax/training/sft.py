"""SFT (`rubric-jax sft`): the cold start that teaches a policy a response format (RLCER's and SRaR-style step
formats need one) with masked cross-entropy on chat-formatted examples, through the same model, sharding and
train-step code as RL.

Each example is the task's prompt rendered by the chat template with the assistant header (as the rollout
engine renders it) followed by the task's `solution(example)` and the end-of-turn token; only the solution and
that token are scored (`train_step.confidence_penalized_nll`, token-mean over the batch; with an optional
confidence penalty), so the model learns to answer and to stop, not to produce prompts. The step's
`first_scored` skips the prompt region; a solution over `max_response_tokens` is cut and counted
("train/truncated_responses"). Batches come from
the task's train stream in order; checkpoints (params, optimizer state, data position, last metrics) resume
exactly as in RL. At the end the model is saved as a Hugging Face directory `output_dir/model` with its
tokenizer, which `ModelSpec(path=...)`, transformers and SGLang load.
"""

import logging
from pathlib import Path
from typing import Any, Mapping, Optional

import jax
import numpy as np

from rubric_jax.algorithms.base import padded_prompt_width
from rubric_jax.models import sharding, train_step
from rubric_jax.models.tokenizer import apply_chat_template
from rubric_jax.training import policy, runs
from rubric_jax.training.metrics import PhaseTimer
from rubric_jax.training.optim import learning_rate_schedule, make_optimizer, schedule_mismatch
from rubric_jax.training.run_config import SFTConfig
from rubric_jax.yaml_config import save_config

SFT_PLOTS = {"sft_loss": ("train/loss",), "sft_entropy": ("train/entropy",), "sft_grad_norm": ("train/grad_norm",)}


def sft_batch(task: Any, tokenizer: Any, examples, max_response_tokens: int,
              chat_template_kwargs: Optional[Mapping[str, Any]] = None) -> tuple[dict[str, np.ndarray], int, int]:
    """(the packed batch, its prompt width, how many responses were cut) of `examples` (module docstring): a
    solution longer than `max_response_tokens` with its end-of-turn token is cut to its first tokens (a real
    dataset's long reference solutions), which drops that token: the cut example does not teach stopping."""
    eos_ids, pad_id = policy.eos_and_pad(tokenizer)
    prompts = [apply_chat_template(tokenizer, task.prompt(e), template_kwargs=chat_template_kwargs) for e in examples]
    responses = [tokenizer.encode(task.solution(e), add_special_tokens=False) + eos_ids[:1] for e in examples]
    truncated = sum(len(r) > max_response_tokens for r in responses)
    width = padded_prompt_width(prompts)
    return train_step.pack_sequences(prompts, [r[:max_response_tokens] for r in responses], pad_id=pad_id,
                                     prompt_width=width, response_width=max_response_tokens), width, truncated


def train_sft(config: SFTConfig, task: Any, *, model=None, tokenizer=None) -> dict[str, float]:
    """Runs (or resumes) the SFT run `config` on `task`; returns the last step's metrics (module docstring). A launch
    that fails before its first step completes leaves output_dir as it found it (`runs.undo_failed_launch`)."""
    with runs.undo_failed_launch(Path(config.output_dir)):
        return _train_sft(config, task, model=model, tokenizer=tokenizer)


def _train_sft(config: SFTConfig, task: Any, *, model, tokenizer) -> dict[str, float]:
    out = Path(config.output_dir)
    runs.check_relaunch(out, config)
    mesh = policy.make_mesh(config.mesh)
    if model is None:
        model, tokenizer = policy.build_policy(config.model, task, mesh)
    out.mkdir(parents=True, exist_ok=True)  # after the checks and the model: a failed launch writes nothing
    save_config(config, out / "config.yaml")
    optimizer = make_optimizer(config.optimizer)
    schedule = learning_rate_schedule(config.optimizer)
    if (warning := schedule_mismatch(config.optimizer, config.steps)) is not None:
        logging.getLogger(__name__).warning(warning)
    graphdef, state = policy.init_learner_state(model, optimizer, mesh, with_reference=False)
    rules = sharding.partition_rules(model.config)

    checkpointer = runs.open_checkpoints(out, config.checkpoint)
    state, meta = runs.restore_latest(checkpointer, state, config.checkpoint, config.seed)
    position = meta["data_position"] if meta else 0
    dataset = task.train_stream(position)
    steps: dict[int, Any] = {}
    timer = PhaseTimer()
    writer = runs.open_metrics(out, config.metrics, config.steps, meta,
                                 console_keys=("train/loss", "train/grad_norm"))
    metrics: dict[str, float] = {}
    with writer, checkpointer, runs.StopRequests() as stop:
        for step in range(meta["step"] if meta else 0, config.steps):
            timer.reset()
            batch, width, truncated = sft_batch(task, tokenizer, dataset.next_batch(config.batch_size),
                                                config.max_response_tokens, config.model.chat_template_kwargs)
            if width not in steps:
                steps[width] = train_step.make_train_step(
                    graphdef, optimizer, train_step.confidence_penalized_nll(config.confidence_penalty), mesh=mesh,
                    abstract_params=state.params, rules=rules, micro_batches=config.micro_batches,
                    chunk_size=config.chunk_size, first_scored=width)
            with timer.phase("update"):
                state.params, state.opt_state, step_metrics = steps[width](state.params, state.opt_state, batch)
                step_metrics = jax.device_get(step_metrics)
            metrics = {f"train/{k}": float(v) for k, v in step_metrics.items()}
            metrics["train/tokens"] = float(batch["response_mask_bt"].sum())
            metrics["train/truncated_responses"] = float(truncated)
            metrics["train/learning_rate"] = float(schedule(step))
            stopping = stop.stops_after(step, config.steps)
            if (step + 1) % config.checkpoint.every_steps == 0 or step + 1 == config.steps or stopping:
                with timer.phase("checkpoint"):
                    checkpointer.save(step + 1, state.tree(), {
                        "step": step + 1, "seed": config.seed, "data_position": dataset.position,
                        "metrics": {**metrics, **timer.metrics()}})
            metrics.update(timer.metrics())
            writer.write(step + 1, metrics)
            if stopping:
                checkpointer.wait()
                raise stop.interruption(step, config.steps, out / "checkpoints")
    runs.save_outputs(out, graphdef, state.params, tokenizer, SFT_PLOTS if config.metrics.plots else None)
    return metrics
