import gc
import os
from pathlib import Path
from typing import Optional

import pytest

# Tests run on the CPU. Eight simulated host devices let the sharding tests build FSDP, TP and mixed meshes;
# it must be set before any test module initialises the JAX backend, hence here. Single-device code is unaffected.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

from hypothesis import HealthCheck, settings

# JIT compilation makes the first example slow: no deadline. The budget keeps the suite inside CI's time on
# 2 cores; run with HYPOTHESIS_PROFILE=thorough for a longer search.
settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The tiny Hugging Face checkpoints every model, inference and judge test loads (built once per session).
from tests.tiny_checkpoints import (  # noqa: E402,F401
    tiny_gemma3_dir,
    tiny_gemma3_multimodal_dir,
    tiny_llama_dir,
    tiny_qwen2_dir,
    tiny_qwen2_untied_dir,
    tiny_qwen3_dir,
    tiny_qwen3_moe_dir,
    tiny_qwen3_untied_dir,
)


# The longest files (minutes each on a 2-core machine), collected first: the README's test command hands whole files
# to two workers in collection order (pytest-xdist's loadfile, with its reordering by test count off in pytest.ini),
# and a long file handed out last leaves one worker idle while the other finishes it.
LONGEST_FILES = ("tests/test_quickstart.py", "tests/experiments/test_comparison.py", "tests/training/test_plan.py",
                 "tests/training/test_resume.py", "tests/training/test_dataset_runs.py", "tests/test_extending.py",
                 "tests/algorithms/test_evorubric.py", "tests/models/test_train_step.py", "tests/training/test_critic.py",
                 "tests/training/test_overlap.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_collection_finish(session):
    """Starts building llama.cpp's server in the background when a collected test needs it
    (tests/judges/llama_cpp.py), so the build overlaps the tests that run before it."""
    if any({"llama_server", "llama_gguf"} & set(getattr(item, "fixturenames", ())) for item in session.items):
        from tests.judges import llama_cpp  # noqa: PLC0415

        llama_cpp.start_building()


# XLA:CPU loads each compiled kernel into memory mappings of its own (about three: code, constants, data), and
# JAX keeps every executable of a jitted function for as long as the function lives, i.e. the whole session for
# the project's module-level jitted functions. The serial suite's one process thus gathers tens of thousands of
# mappings; past the kernel's limit (vm.max_map_count, 65530 by default) LLVM cannot allocate the next kernel's
# memory and XLA crashes in that compile (SIGSEGV in backend_compile_and_load) instead of raising. So between two
# test files, once the process holds more than half the limit, JAX's caches are cleared (which unmaps the
# executables; later calls compile again). Half the limit leaves room for several times the largest file's own
# growth (about 9000 mappings, tests/core/test_advantages.py).
def _memory_maps() -> Optional[int]:
    try:
        with open("/proc/self/maps", "rb") as maps:
            return maps.read().count(b"\n")
    except OSError:  # not Linux
        return None


def _max_map_count() -> int:
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return 65530


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if nextitem is not None and nextitem.path == item.path:
        return
    maps = _memory_maps()
    if maps is not None and maps > _max_map_count() // 2:
        import jax  # noqa: PLC0415 (the backend is configured above, before any test imported jax)

        jax.clear_caches()
        gc.collect()
