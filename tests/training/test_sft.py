"""SFT: only the assistant's solution and its end-of-turn token are scored; the update optimises the masked
cross-entropy on a repeated batch; a run writes its metrics, checkpoints and a Hugging Face model that loads
back with the trained weights."""

import jax
import numpy as np
import optax
from flax import nnx

from rubric_jax.data.tasks import build_task
from rubric_jax.models import sharding, train_step
from rubric_jax.models.safetensors_io import load_hf_checkpoint
from rubric_jax.models.tokenizer import load_tokenizer
from rubric_jax.training import policy
from rubric_jax.training.checkpoint import Checkpointer
from rubric_jax.training.metrics import read_metrics
from rubric_jax.training.run_config import CheckpointConfig, MeshConfig, MetricsConfig, ModelInit, ModelSpec, SFTConfig
from rubric_jax.training.sft import sft_batch, train_sft
from tests.data.dataset_fixtures import fixture_path
from tests.tiny_checkpoints import EMPTY_THINK_BLOCK

TINY = ModelInit(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                 max_position_embeddings=128)


def test_sft_batch_scores_the_solution_and_its_end_of_turn_token_only():
    task = build_task("arithmetic", {}, 0)
    tokenizer = task.tokenizer()
    examples = task.train_stream(0).next_batch(3)
    batch, width, _ = sft_batch(task, tokenizer, examples, max_response_tokens=64)
    assert width % 16 == 0
    for row, example in enumerate(examples):
        scored = batch["tokens_bt"][row][batch["response_mask_bt"][row]]
        assert tokenizer.decode(scored[:-1]) == task.solution(example)
        assert scored[-1] == tokenizer.eos_token_id
        assert not batch["response_mask_bt"][row, :width].any()


def test_sft_prompts_are_rendered_with_the_chat_template_kwargs(tiny_qwen3_dir):
    """The fixture's Qwen3-style template with enable_thinking false adds the empty think block to every prompt,
    and the scored solution tokens are the same either way."""
    task = build_task("arithmetic", {}, 0)
    tokenizer = load_tokenizer(tiny_qwen3_dir)
    examples = task.train_stream(0).next_batch(3)
    plain, _, _ = sft_batch(task, tokenizer, examples, max_response_tokens=128)
    thinking_off, _, _ = sft_batch(task, tokenizer, examples, 128, {"enable_thinking": False})
    block = len(tokenizer.encode(EMPTY_THINK_BLOCK, add_special_tokens=False))

    def prompt_lengths(batch):
        return (batch["tokens_bt"] != tokenizer.pad_token_id).sum(1) - batch["response_mask_bt"].sum(1)

    np.testing.assert_array_equal(prompt_lengths(thinking_off), prompt_lengths(plain) + block)
    for row in range(len(examples)):
        np.testing.assert_array_equal(plain["tokens_bt"][row][plain["response_mask_bt"][row]],
                                      thinking_off["tokens_bt"][row][thinking_off["response_mask_bt"][row]])


def test_a_solution_over_the_response_width_is_cut_and_counted():
    """MATH500's reference solutions, byte-tokenized, run past 64 tokens: cut to 64 (no end-of-turn token),
    counted; a short one keeps its end-of-turn token."""
    task = build_task("dataset", {"preset": "math500", "path": str(fixture_path("math500"))}, 0)
    tokenizer = task.tokenizer()
    examples = sorted(task.train_stream(0).next_batch(3), key=lambda r: r.row)
    lengths = [len(tokenizer.encode(e.reference, add_special_tokens=False)) + 1 for e in examples]
    width = max(lengths) - 1
    batch, _, truncated = sft_batch(task, tokenizer, examples, max_response_tokens=width)
    assert truncated == sum(n > width for n in lengths) >= 1
    scored = batch["response_mask_bt"].sum(axis=1)
    np.testing.assert_array_equal(scored, [min(n, width) for n in lengths])


def test_the_sft_update_optimises_the_masked_cross_entropy_on_a_repeated_batch():
    task = build_task("arithmetic", {}, 0)
    mesh = policy.make_mesh(MeshConfig())
    model, tokenizer = policy.build_policy(ModelSpec(init=TINY), task, mesh)
    batch, width, _ = sft_batch(task, tokenizer, task.train_stream(0).next_batch(8), max_response_tokens=64)
    graphdef, params = nnx.split(model)
    optimizer = optax.adam(1e-2)
    step = train_step.make_train_step(graphdef, optimizer, train_step.confidence_penalized_nll(0.0), mesh=mesh,
                                      abstract_params=params, rules=sharding.partition_rules(model.config),
                                      first_scored=width)
    params, opt_state = policy.copy_params(params), optimizer.init(params)
    losses = []
    for _ in range(20):
        params, opt_state, metrics = step(params, opt_state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[0] > np.log(100)  # untrained: about uniform over the ~101 tokens of the vocabulary
    assert losses[-1] < 0.5 * losses[0], losses
    assert all(b < a for a, b in zip(losses[:5], losses[1:6])), losses


def test_train_sft_writes_metrics_checkpoints_and_a_loadable_model(tmp_path):
    config = SFTConfig(output_dir=str(tmp_path / "sft"), steps=4, model=ModelSpec(init=TINY), batch_size=4,
                       micro_batches=2, max_response_tokens=64, checkpoint=CheckpointConfig(every_steps=2),
                       metrics=MetricsConfig(console=False))
    last = train_sft(config, build_task("arithmetic", {}, 0))
    run = tmp_path / "sft"
    lines = read_metrics(run / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2, 3, 4] and lines[-1] == {"step": 4, **last}
    assert lines[-1]["train/loss"] < lines[0]["train/loss"]
    checkpoints = Checkpointer(run / "checkpoints")
    assert checkpoints.all_steps() == [2, 4]
    state, meta = checkpoints.restore(None, None)
    assert meta["data_position"] == 16
    saved = load_hf_checkpoint(run / "model")
    saved_leaves, trained_leaves = jax.tree.leaves(nnx.state(saved)), jax.tree.leaves(state["params"])
    assert len(saved_leaves) == len(trained_leaves)
    for saved_leaf, trained_leaf in zip(saved_leaves, trained_leaves):
        np.testing.assert_array_equal(saved_leaf, trained_leaf)
    assert load_tokenizer(run / "model").eos_token_id == 2
    assert (run / "plots" / "sft_loss.png").exists()
