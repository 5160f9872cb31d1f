"""The `rubric-jax` command end to end on a tiny model: `sft` from a YAML config with overrides, then `eval` of
the saved model, whose JSON holds the held-out metrics; a second `sft` with the same output resumes."""

import json

import yaml

from rubric_jax import cli


def test_sft_then_eval_from_the_command_line(tmp_path, capsys):
    config = {
        "output_dir": str(tmp_path / "sft"), "steps": 2,
        "model": {"init": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2,
                           "num_kv_heads": 1, "head_dim": 16, "max_position_embeddings": 128}},
        "batch_size": 4, "max_response_tokens": 64, "metrics": {"console": False, "plots": False},
    }
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli.main(["sft", str(path), "checkpoint.every_steps=1", "optimizer.learning_rate=1e-3"]) == 0
    assert yaml.safe_load((tmp_path / "sft" / "config.yaml").read_text())["optimizer"]["learning_rate"] == 1e-3

    assert cli.main(["sft", str(path), "steps=3", "checkpoint.every_steps=1"]) == 0
    assert "resuming" in capsys.readouterr().out
    lines = (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]

    output = tmp_path / "eval.json"
    assert cli.main(["eval", str(tmp_path / "sft" / "model"), "--examples", "4", "--samples", "2",
                     "--temperature", "1.0", "--max-new-tokens", "16", "--output", str(output)]) == 0
    metrics = json.loads(output.read_text())
    assert json.loads(capsys.readouterr().out) == metrics
    assert {"eval/accuracy", "eval/pass@2", "eval/rubric_score", "eval/rubric/arithmetic.step1"} <= metrics.keys()
    assert all(0 <= metrics[key] <= 1 for key in ("eval/accuracy", "eval/pass@2", "eval/rubric_score"))
