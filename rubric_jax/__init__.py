"""rubric_jax: a pure-JAX framework for rubric-based reinforcement learning of LLMs.

Importing the package silences two start-up messages meant for other set-ups than the one at hand: libtpu's TPU
initialisation errors on a host without an accelerator (`use_cpu_without_accelerator`) and transformers' notice that
PyTorch is missing (`drop_torch_missing_notice`), which it never needs.
"""

import glob
import logging
import os

import jax

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


use_cpu_without_accelerator()
drop_torch_missing_notice()
