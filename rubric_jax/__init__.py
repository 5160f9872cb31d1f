"""rubric_jax: a pure-JAX framework for rubric-based reinforcement learning of LLMs.

`rubric_jax.train(config, overrides)` runs what `rubric-jax train` runs, from Python.

Importing the package silences two start-up messages meant for other set-ups than the one at hand: libtpu's TPU
initialisation errors on a host without an accelerator (`use_cpu_without_accelerator`) and transformers' notice that
PyTorch is missing (`drop_torch_missing_notice`), which it never needs.
"""

import glob
import logging
import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union

import jax

if TYPE_CHECKING:
    from rubric_jax.training.run_config import RLConfig

# How an attached accelerator shows in /dev: TPU chips (/dev/accel* on v2-v5e, numbered VFIO groups on v5p and
# later), NVIDIA GPUs (jax's own check) and AMD GPUs.
ACCELERATOR_DEVICES = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia*", "/dev/dxg", "/dev/kfd")

TORCH_MISSING_NOTICE = "PyTorch was not found."


def accelerator_attached() -> bool:
    """Whether a TPU chip or a GPU shows in /dev (`ACCELERATOR_DEVICES`)."""
    return any(glob.glob(pattern) for pattern in ACCELERATOR_DEVICES)


def use_cpu_without_accelerator() -> None:
    """Sets `jax_platforms` to "cpu" when no accelerator is attached and nothing chose the platforms.

    With libtpu installed (the `test` and `tpu` extras) JAX tries the TPU backend on every host; without a TPU,
    libtpu prints initialisation errors ("Failed to find host bounds", "unexpected worker hostname") before JAX falls
    back to the CPU, the platform this picks at once. A TPU or GPU host, or a JAX_PLATFORMS of the user's (even
    empty), is left alone; `rubric-jax plan` loads libtpu through `jax.experimental.topologies`, not as a backend.
    """
    if "JAX_PLATFORMS" not in os.environ and not jax.config.jax_platforms and not accelerator_attached():
        jax.config.update("jax_platforms", "cpu")


def drop_torch_missing_notice() -> None:
    """Drops transformers' "PyTorch was not found" notice, logged when transformers is imported without torch:
    rubric_jax uses transformers for tokenizers and configs only. Its other warnings still show."""
    logging.getLogger("transformers").addFilter(
        lambda record: not record.getMessage().startswith(TORCH_MISSING_NOTICE))


def train(config: Union[str, os.PathLike, "RLConfig", Mapping[str, Any]], overrides: Sequence[str] = ()
          ) -> dict[str, float]:
    """An RL run, exactly as `rubric-jax train` runs it: `config` (a YAML file's path, an `RLConfig`, or its plain
    data as YAML reads it) with the `key.sub=value` `overrides` applied, every input checked through the command's
    own function (`training.launch.checked_rl_launch`: the config resolved, the model directory, the task and the
    evaluation benchmarks built, the output directory, the rubric width), then `training.rl.train_rl`. Returns the
    last step's metrics. A problem of the input is the ValueError (or OSError) the command reports; a run that
    stops is the RunStopped it reports."""
    # imported here: importing rubric_jax (and so `rubric-jax --help`) must not build the model stack
    from rubric_jax.training import launch, rl  # noqa: PLC0415

    inputs = launch.checked_rl_launch(config, overrides)
    return rl.train_rl(inputs.config, inputs.task, benchmarks=inputs.benchmarks)


use_cpu_without_accelerator()
drop_torch_missing_notice()
