"""`rubric-jax sft`: supervised fine-tuning on a task's reference solutions from a YAML config
(`training.sft.train_sft`)."""

import argparse

from rubric_jax import arguments
from rubric_jax.training.run_config import SFTConfig
from rubric_jax.yaml_config import load_config

NAME = "sft"
SUMMARY = "supervised fine-tuning on a task's reference solutions (the cold start of step-format recipes)"
PARSER_ORDER = SUMMARY_ORDER = 2


def add_parser(subparsers) -> argparse.ArgumentParser:
    return arguments.config_command(subparsers, NAME, "SFT on a task's reference solutions from a YAML config; saves "
                                                      "the model as a Hugging Face directory output_dir/model")


def check(args):
    """The config, its model directory (`model.path`), its task and its output directory checked; (config,
    task)."""
    from rubric_jax.models.safetensors_io import check_model_directory  # noqa: PLC0415  (imports the model stack)
    from rubric_jax.training.assembly import make_task  # noqa: PLC0415
    from rubric_jax.training.runs import check_writable_directory  # noqa: PLC0415

    config = load_config(SFTConfig, args.config, args.overrides)
    if config.model.path is not None:
        check_model_directory(config.model.path, "model.path")
    task = make_task(config.task)
    check_writable_directory(config.output_dir, "output_dir")
    return config, task


def run(checked, args) -> int:
    from rubric_jax.training.sft import train_sft  # noqa: PLC0415

    train_sft(*checked)
    return 0
