"""Checkpoints: exact round trips of an nnx.State, an AdamW state and meta, restored onto another mesh layout;
pruning; async saves; a writer SIGKILLed mid-save leaves the previous step as the latest; errors."""

import inspect
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rubric_jax.models import sharding
from rubric_jax.training.checkpoint import Checkpointer

REPO_ROOT = Path(__file__).resolve().parents[2]
TMP_SUFFIX = ".orbax-checkpoint-tmp"


class _Mlp(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.up_proj = nnx.Linear(8, 16, rngs=rngs)
        self.down_proj = nnx.Linear(16, 8, use_bias=False, rngs=rngs)


class _Tiny(nnx.Module):
    """Named like the decoder, so `sharding.partition_rules()` splits its kernels over fsdp and tensor."""

    def __init__(self, rngs: nnx.Rngs):
        self.mlp = _Mlp(rngs)
        self.norm = nnx.RMSNorm(8, rngs=rngs)


def train_state(mesh) -> dict:
    """Params and an AdamW state two updates in (count 2, nonzero moments), and RNG key data, on `mesh`."""
    params = nnx.split(_Tiny(nnx.Rngs(0)))[1]
    optimizer = optax.adamw(1e-2)
    opt_state = optimizer.init(params)
    for scale in (1.0, -0.5):
        grads = jax.tree.map(lambda p: jnp.full_like(p, scale), params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    state = {"params": params, "opt_state": opt_state, "rng": jax.random.key_data(jax.random.key(7))}
    return jax.device_put(state, sharding.param_shardings(state, mesh))


def abstract_on(state, mesh):
    """`state`'s ShapeDtypeStructs with the layout `sharding.param_shardings` gives them on `mesh`."""
    return jax.tree.map(
        lambda leaf, target: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=target),
        jax.eval_shape(lambda: state),
        sharding.param_shardings(state, mesh),
    )


def assert_same_arrays(restored, expected):
    assert jax.tree.structure(restored) == jax.tree.structure(expected)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(expected)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


META = {"step": 2, "data": {"epoch": 0, "position": 96}, "pool": [{"rubric": "cites a source", "w": 0.5}], "seed": 7}


@pytest.mark.parametrize("async_save", [True, False])
def test_round_trip_is_exact_and_restores_onto_another_mesh_layout(tmp_path, async_save):
    state = train_state(sharding.make_mesh(fsdp=4, tensor=2))
    with Checkpointer(tmp_path, async_save=async_save) as ckpt:
        ckpt.save(2, state, META)
        other_mesh = sharding.make_mesh(fsdp=2, tensor=4)
        restored, meta = ckpt.restore(2, abstract_on(state, other_mesh))
        assert meta == META
        assert_same_arrays(restored, state)
        assert isinstance(restored["params"], nnx.State)
        assert int(restored["opt_state"][0].count) == 2
        for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(abstract_on(state, other_mesh))):
            assert got.sharding == want.sharding
        assert not restored["params"]["mlp"]["up_proj"]["kernel"][...].sharding.is_fully_replicated

        # Concrete arrays serve as the abstract state too, lending their shardings; None means the latest.
        restored, meta = ckpt.restore(None, state)
        assert_same_arrays(restored, state)
        assert all(got.sharding == want.sharding for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state)))


def test_keeps_the_last_max_to_keep_steps(tmp_path):
    with Checkpointer(tmp_path, max_to_keep=2) as ckpt:
        for step in range(1, 5):
            ckpt.save(step, {"w": jnp.full((4,), step)}, {"step": step})
    # close() waited for the last write and its pruning.
    assert sorted(os.listdir(tmp_path)) == ["3", "4"]
    with Checkpointer(tmp_path, max_to_keep=2) as ckpt:
        assert ckpt.all_steps() == [3, 4]
        restored, meta = ckpt.restore(3, {"w": jax.ShapeDtypeStruct((4,), jnp.int32)})
        assert meta == {"step": 3}
        np.testing.assert_array_equal(restored["w"], np.full((4,), 3))


def test_async_save_lists_the_step_only_once_committed(tmp_path):
    big = {"w": jnp.arange(8 * 2**20, dtype=jnp.uint32)}  # 32 MiB: the write outlasts the next statement
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, big, {})
        assert ckpt.latest_step() is None  # orbax's own list would already say 1
        ckpt.wait()
        assert ckpt.all_steps() == [1]


def test_saved_buffers_may_be_donated_right_after_an_async_save(tmp_path):
    state = {"w": jnp.arange(2**16, dtype=jnp.float32), "b": jnp.ones((3, 5), jnp.bfloat16)}
    expected = jax.tree.map(np.asarray, state)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state, {})
        overwrite = jax.jit(lambda tree: jax.tree.map(lambda x: x * 0 - 1, tree), donate_argnums=0)
        jax.block_until_ready(overwrite(state))
        restored, _ = ckpt.restore(1, jax.eval_shape(lambda: expected))
    assert_same_arrays(restored, expected)


def writer_state(step: int, size: int) -> dict:
    """The killed writer's state: `size` uint32 that do not compress, so writing 128 MiB takes a while."""
    return {
        "w": jnp.arange(8, dtype=jnp.float32) + step,
        "noise": jnp.arange(size, dtype=jnp.uint32) * jnp.uint32(2654435761) + jnp.uint32(step),
    }


SMALL, LARGE = 16, 32 * 2**20
WRITER = f"""
import sys
import jax.numpy as jnp
from rubric_jax.training.checkpoint import Checkpointer

{inspect.getsource(writer_state)}
ckpt = Checkpointer(sys.argv[1])
ckpt.save(1, writer_state(1, {SMALL}), {{"step": 1}})
ckpt.wait()
ckpt.save(2, writer_state(2, {LARGE}), {{"step": 2}})
print("saving", flush=True)
ckpt.wait()
print("committed", flush=True)
"""


def test_a_writer_killed_mid_save_leaves_the_previous_step_as_the_latest(tmp_path):
    directory = tmp_path / "ckpt"
    with open(tmp_path / "writer.log", "w") as log:
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(directory)], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=log, text=True
        )
        line = writer.stdout.readline()
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    assert line == "saving\n", (tmp_path / "writer.log").read_text()

    with Checkpointer(directory) as ckpt:
        latest = ckpt.latest_step()
        cut_off = latest == 1
        print(f"SIGKILL landed {'mid-write: step 2 uncommitted' if cut_off else 'after step 2 committed'}")
        assert latest in (1, 2)
        expected = writer_state(latest, SMALL if cut_off else LARGE)
        restored, meta = ckpt.restore(None, jax.eval_shape(lambda: expected))
        assert_same_arrays(restored, expected)
        assert meta == {"step": latest}
        if cut_off:
            assert (directory / f"2{TMP_SUFFIX}").is_dir()
            # The next writer saves step 2 over the leftover of the killed one.
            ckpt.save(2, writer_state(2, SMALL), {"step": 2})
            ckpt.wait()
            assert ckpt.all_steps() == [1, 2]
            assert sorted(os.listdir(directory)) == ["1", "2"]
            restored, meta = ckpt.restore(2, jax.eval_shape(lambda: writer_state(2, SMALL)))
            assert_same_arrays(restored, writer_state(2, SMALL))
            assert meta == {"step": 2}


def test_a_leftover_temporary_directory_is_not_a_step_and_is_replaced(tmp_path):
    leftover = tmp_path / f"5{TMP_SUFFIX}"
    (leftover / "state").mkdir(parents=True)
    (leftover / "state" / "half_written").write_bytes(b"\0" * 100)
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.latest_step() is None
        ckpt.save(5, {"w": jnp.ones(3)}, {"step": 5})
        ckpt.wait()
        assert ckpt.all_steps() == [5]
        assert not leftover.exists()
        restored, meta = ckpt.restore(5, {"w": jax.ShapeDtypeStruct((3,), jnp.float32)})
        np.testing.assert_array_equal(restored["w"], np.ones(3))
        assert meta == {"step": 5}


def test_empty_or_missing_directories_and_missing_steps(tmp_path):
    with Checkpointer(tmp_path / "not" / "there") as ckpt:
        assert ckpt.latest_step() is None and ckpt.all_steps() == []
        with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "not" / "there"))):
            ckpt.restore(None, {})
    with Checkpointer(tmp_path / "run") as ckpt:
        for step in (1, 2):
            ckpt.save(step, {"w": jnp.zeros(2)}, {})
        with pytest.raises(FileNotFoundError, match=r"step 5 in .*run; committed steps: \[1, 2\]"):
            ckpt.restore(5, {"w": jax.ShapeDtypeStruct((2,), jnp.float32)})


def test_steps_must_increase(tmp_path):
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(2, {"w": jnp.zeros(2)}, {"v": "first"})
        for step in (2, 1):
            with pytest.raises(ValueError, match=rf"cannot save step {step} .* step 2 is already committed"):
                ckpt.save(step, {"w": jnp.ones(2)}, {"v": "second"})
        with pytest.raises(ValueError, match="int >= 0"):
            ckpt.save(-1, {"w": jnp.ones(2)}, {})
        assert ckpt.restore(2, {"w": jax.ShapeDtypeStruct((2,), jnp.float32)})[1] == {"v": "first"}


@pytest.mark.parametrize(
    "meta, path",
    [
        ({"data": {"position": np.int64(3)}}, "meta['data']['position']"),
        ({"pool": [{"ok": 1}, {"ids": (1, 2)}]}, "meta['pool'][1]['ids']"),
        ({"counts": {1: 4}}, "meta['counts'] has the key 1"),
    ],
)
def test_meta_must_round_trip_through_json_before_anything_is_written(tmp_path, meta, path):
    with Checkpointer(tmp_path) as ckpt:
        with pytest.raises(TypeError, match=re.escape(path)):
            ckpt.save(1, {"w": jnp.zeros(2)}, meta)
        with pytest.raises(TypeError, match="meta must be a dict"):
            ckpt.save(1, {"w": jnp.zeros(2)}, [1])
    assert os.listdir(tmp_path) == []
