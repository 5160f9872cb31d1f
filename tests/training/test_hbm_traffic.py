"""`training.hbm_traffic`: the HBM bytes of small programs compiled for a TPU chip on this CPU host (libtpu, no
TPU), against what each must move, worked out by hand. Arrays are shaped to TPU tiles ((8, 128) float32), so
logical bytes are the bytes moved."""

import jax
import jax.numpy as jnp
import pytest

from rubric_jax.training.hbm_traffic import hbm_traffic
from rubric_jax.training.plan import topology_devices

pytest.importorskip("libtpu")

ROWS, COLS = 8192, 4096
BYTES = ROWS * COLS * 4  # 128 MiB of float32: more than a chip's VMEM, so it stays in HBM


def _traffic(function, *shapes, donate=()):
    _, devices = topology_devices("v5e:2x2")
    sharding = jax.sharding.SingleDeviceSharding(devices[0])
    args = [jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding) for shape in shapes]
    compiled = jax.jit(function, donate_argnums=donate).lower(*args).compile()
    return hbm_traffic(compiled.as_text())


def test_an_elementwise_op_reads_its_input_and_writes_its_output_once():
    traffic = _traffic(lambda x: jnp.tanh(x) * 2, (ROWS, COLS))
    assert (traffic.read_bytes, traffic.written_bytes) == (BYTES, BYTES)


def test_a_static_slice_reads_the_slice_alone():
    traffic = _traffic(lambda x: jnp.tanh(x[:, :COLS // 4]), (ROWS, COLS))
    assert traffic.read_bytes == BYTES // 4


def test_an_in_place_update_of_a_donated_buffer_moves_the_update_alone():
    row = COLS * 4

    def write_row(buffer, update, index):
        return jax.lax.dynamic_update_slice(buffer, update, (index.astype(jnp.int32)[0], 0))

    _, devices = topology_devices("v5e:2x2")
    sharding = jax.sharding.SingleDeviceSharding(devices[0])
    args = (jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32, sharding=sharding),
            jax.ShapeDtypeStruct((1, COLS), jnp.float32, sharding=sharding),
            jax.ShapeDtypeStruct((1,), jnp.float32, sharding=sharding))
    traffic = hbm_traffic(jax.jit(write_row, donate_argnums=(0,)).lower(*args).compile().as_text())
    assert traffic.read_bytes <= 2 * row + 512 and traffic.written_bytes <= row + 512  # update and index only
    assert traffic.read_bytes >= row


def test_a_counted_loop_counts_its_body_once_per_trip():
    """Three more trips read the array three more times (XLA copies the input into the loop's buffer before
    either loop: the same bytes in both); each trip also reads its counter, a few bytes."""
    def repeated(trips):
        return lambda x: jax.lax.fori_loop(0, trips, lambda i, y: jnp.tanh(y), x)

    once = _traffic(jnp.tanh, (ROWS, COLS))
    five, two = _traffic(repeated(5), (ROWS, COLS)), _traffic(repeated(2), (ROWS, COLS))
    assert 0 <= five.read_bytes - two.read_bytes - 3 * once.read_bytes <= 3 * 16
