"""The trainer's checkpoints: a pytree of arrays (the state) and a JSON dict (the meta) per step, written with
orbax-checkpoint's CheckpointManager, asynchronously by default, keeping the last `max_to_keep` steps.

Conventions:
- Layout: `<directory>/<step>/state` (orbax's PyTree format, keyed by the state's pytree key paths; an
  nnx.Variable adds a trailing "value") and `<directory>/<step>/meta` (JSON). The state is any pytree of
  jax arrays, in practice {"params": nnx.State, "opt_state": optax state, "rng": jax.random.key_data(key)}.
  It is saved as is: restore rebuilds it on the caller's `abstract_state` (an nnx.State, optax namedtuples...)
  with the caller's shardings and dtypes, so a model saved on one mesh restores onto another.
- Meta holds what is not an array: step counters, the data-iterator position, algorithm state (a rubric
  memory pool), the RNG seed. JSON types only (dicts with str keys, lists, str, int, float, bool, None),
  checked before anything is written, so that restore gives back exactly what was saved: json would turn
  a tuple into a list and an int key into a str, and fails on numpy scalars.
- Atomicity: orbax writes a step into `<step>.orbax-checkpoint-tmp` and renames it to `<step>` on commit, so
  a process killed mid-write leaves only that temporary directory. `all_steps` and `latest_step` list the
  committed directories on disk, never orbax's in-memory list, which already holds a step whose write is in
  flight. A leftover temporary directory is removed when that step is saved again (resuming from an earlier
  step does so); it is not swept on start-up, since another process may be writing it.
- Async save: `save` returns once every array has been copied to host memory (orbax awaits the device-to-host
  transfer, `np.asarray` of each shard, before handing the write to a background thread), so the caller may
  donate or overwrite the saved device buffers right away; the copy costs host memory the size of the
  state until the write ends. A second save, `restore`, `wait` and `close` wait for the write and raise its
  error, if any. Old steps are deleted only after the new one has committed.
- Steps increase: saving a step at or below the latest committed one raises ValueError (orbax would either
  skip it silently or overwrite it).
- Multi-process (`jax.distributed`, docs/multihost.md): every process constructs the Checkpointer on the same
  directory, on a filesystem all of them see (gs://, NFS), and calls `save`, `restore`, `wait` and `close`
  together, in the same order: orbax writes each array's shards from the process that holds them, the meta and
  the commit from process 0, and synchronises the processes around each step's commit; `restore` reads each
  process's shards of `abstract_state`'s global layout.
"""

from collections.abc import Mapping
from typing import Any, Optional

import orbax.checkpoint as ocp
from etils import epath

_JSON_SCALARS = (str, int, float, bool, type(None))


def check_json_meta(value: Any, path: str = "meta") -> None:
    """TypeError naming the key path (meta['pool'][3]) of the first value that would not survive a JSON round
    trip unchanged (module docstring)."""
    if isinstance(value, _JSON_SCALARS):
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            check_json_meta(item, f"{path}[{index}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{path} has the key {key!r} ({type(key).__name__}): JSON keys must be str")
            check_json_meta(item, f"{path}[{key!r}]")
        return
    raise TypeError(
        f"{path} is a {type(value).__name__}, not a JSON value (dict with str keys, list, str, int, float, "
        "bool or None; a tuple comes back as a list, a numpy scalar needs int() or float())"
    )


def _absolute(directory: str | epath.PathLike) -> epath.Path:
    # orbax's array writer rejects relative paths, only once the write has started; gs:// paths are absolute.
    path = epath.Path(directory)
    return path if path.is_absolute() else path.absolute()


class Checkpointer:
    """Saves and restores (state, meta) per step in `directory` (module docstring); a context manager that
    closes on exit. `async_save=False` makes `save` return only once the step has committed."""

    def __init__(self, directory: str | epath.PathLike, *, max_to_keep: int = 3, async_save: bool = True):
        if not (isinstance(max_to_keep, int) and max_to_keep >= 1):
            raise ValueError(f"max_to_keep must be an int >= 1, got {max_to_keep!r}")
        self.directory = _absolute(directory)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=async_save),
        )

    def all_steps(self) -> list[int]:
        """The committed steps on disk, ascending (a write in flight or cut off is not one)."""
        return sorted(ocp.path.step.checkpoint_steps(self.directory))

    def latest_step(self) -> Optional[int]:
        """The highest committed step, None if there is none (or no directory)."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def save(self, step: int, state: Any, meta: Mapping[str, Any]) -> None:
        """Starts writing `state` (a pytree of jax arrays) and `meta` (a JSON dict) as `step`, after the previous
        write has committed; returns once the arrays are on the host (async) or once committed (sync).
        ValueError if `step` is not above the latest committed step, TypeError if meta is not JSON."""
        if not (isinstance(step, int) and not isinstance(step, bool) and step >= 0):
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        if not isinstance(meta, Mapping):
            raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
        check_json_meta(meta)
        # A write still in flight may be this very step: let it commit before comparing with the disk.
        self.wait()
        latest = self.latest_step()
        if latest is not None and step <= latest:
            raise ValueError(
                f"cannot save step {step} in {self.directory}: steps must increase and step {latest} is already "
                f"committed (steps {self.all_steps()}); use a new directory to branch off an earlier step"
            )
        # force: orbax's own check would consult its in-memory step list, which the disk check above replaces.
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(dict(meta))),
            force=True,
        )

    def restore(self, step: Optional[int], abstract_state: Any) -> tuple[Any, dict]:
        """(state, meta) of `step` (None: the latest), the state rebuilt on `abstract_state`: a pytree of the same
        structure whose leaves are `jax.ShapeDtypeStruct`s with `.sharding`, or arrays, whose shardings and
        dtypes the restored arrays take. FileNotFoundError naming the directory and its committed steps if
        `step` is not one of them; ValueError from orbax if the structure or a shape does not match."""
        self.wait()
        steps = self.all_steps()
        if step is None and steps:
            step = steps[-1]
        if step not in steps:
            wanted = "any checkpoint" if step is None else f"a checkpoint for step {step}"
            raise FileNotFoundError(f"no {wanted} in {self.directory}; committed steps: {steps}")
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()),
        )
        return restored["state"], dict(restored["meta"])

    def reload(self) -> None:
        """Re-reads the committed steps from disk, after a step directory was moved aside by hand or by
        `runs.restore_latest` (orbax keeps its own list, which it prunes from)."""
        self._manager.reload()

    def wait(self) -> None:
        """Blocks until the write in flight, if any, has committed (and old steps are pruned); raises its error."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for the write in flight (raising its error), then releases orbax's threads."""
        try:
            self.wait()
        finally:
            self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
