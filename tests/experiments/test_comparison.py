"""The comparison harness end to end in smoke mode: an SFT cold start, two variants over two seeds, the table,
results.json and plots; a repeated command reuses the cold start and the finished runs."""

import json

from experiments.comparison import Variant, comparison_parser, run_comparison
from rubric_jax.training.run_config import (
    AlgorithmSpec, CheckpointConfig, MetricsConfig, ModelInit, ModelSpec, RLConfig, RolloutConfig, SFTConfig)
from tests.training.toy_task import toy_task

TINY = ModelInit(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                 max_position_embeddings=96)


def test_smoke_comparison_writes_table_results_and_plots(tmp_path):
    sft = SFTConfig(output_dir="unused", steps=50, batch_size=4, model=ModelSpec(init=TINY),
                    max_response_tokens=64, metrics=MetricsConfig(console=False))
    rl = RLConfig(output_dir="unused", steps=50, model=ModelSpec(path="unused"),
                  rollout=RolloutConfig(prompts_per_step=2, group_size=4, max_new_tokens=16),
                  metrics=MetricsConfig(console=False, plots=False), checkpoint=CheckpointConfig(every_steps=10))
    clipped = RLConfig(**{**rl.__dict__, "algorithm": AlgorithmSpec(name="rar", params={"policy_loss": {"eps_high": 0.28}})})
    args = comparison_parser("test").parse_args(["--out", str(tmp_path), "--smoke", "--seeds", "0", "1"])
    variants = [Variant("rar", rl), Variant("rar_clip_higher", clipped)]
    keys = ["eval/accuracy", "reward/mean"]
    results = run_comparison(str(tmp_path), args=args, task=toy_task(), sft=sft, variants=variants,
                             table_keys=keys, curve_keys=["reward/mean"], title="smoke")
    assert set(results) == {"sft", "rar", "rar_clip_higher"}
    assert all(len(results[name][key]) == 2 for name in ("rar", "rar_clip_higher") for key in keys)
    assert all(0 <= v <= 1 for name in ("rar", "rar_clip_higher") for v in results[name]["reward/mean"])
    table = (tmp_path / "table.md").read_text()
    assert "| rar_clip_higher |" in table and "±" in table
    assert json.loads((tmp_path / "results.json").read_text())["rar"]["reward/mean"] == results["rar"]["reward/mean"]
    assert (tmp_path / "plots" / "reward_mean.png").stat().st_size > 0
    assert (tmp_path / "rar" / "seed1" / "model").is_dir() and (tmp_path / "sft" / "model").is_dir()
