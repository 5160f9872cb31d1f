"""The RL loop's data parallelism over processes (`docs/multihost.md`): in a multi-process run every process runs
the host side of a step (rollouts, judging, the recipe's advantages) on its own share of the step's examples, and
the learner trains on the union of the shares as one global batch (`sharding.global_batch`).

Conventions:
- Share (`process_share`): process k of P takes the examples [k::P] of each step's `prompts_per_step`, which P
  must divide. Every process advances the task's stream by the whole step, so the data position a checkpoint
  holds is the same on all of them, and a resumed run continues every process's share.
- A prompt's group of rollouts never spans processes, so group-relative math (GRPO, leave-one-out baselines,
  rubric validity per prompt) is that of one process; statistics over the whole batch (a critic's advantage
  whitening) are over a process's share. A recipe with state across steps (a memory pool) is refused
  (`check_recipe`): each process would grow its own.
- Alignment (`align_batch`): `jax.make_array_from_process_local_data` needs the same local shape everywhere, so the
  shares are brought to the widest prompt region, the longest response region (`algorithms.base.concat_batches`'
  re-padding) and the most rows (`pad_rows`), agreed on with one all-gather of three ints. The added columns and
  rows are masked out of attention and of every loss: they change no result.
- One process: the share is the whole step and alignment only pads rows to the multiple, as before.
- Dynamic sampling's re-sampling (`algorithms.base.dynamic_groups`) draws further generation batches within a
  step through `StepStream`: every process draws each batch whole and keeps its share, and the decision to draw
  another is taken on the smallest informative-group count over the processes (`fewest_over_processes`, one
  all-gather of an int), so every process decides alike and the streams stay at one position. Each process
  trains exactly its quota, prompts_per_step / P groups, so the global batch keeps its shape. The all-gather is a
  collective, which the overlap thread (`rollout.overlap`) must not issue while the learner's step runs its own:
  `check_overlap` refuses that combination in a multi-process run.
"""

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils

from rubric_jax.algorithms.base import concat_batches

Example = TypeVar("Example")


def process_share(examples: Sequence[Example]) -> list[Example]:
    """This process's share of one step's examples, [process_index::process_count]; ValueError unless the number
    of processes divides their number."""
    count = jax.process_count()
    if len(examples) % count:
        raise ValueError(f"{len(examples)} examples per step cannot be shared among {count} processes: make "
                         "rollout.prompts_per_step a multiple of the number of processes")
    return list(examples[jax.process_index()::count])


def check_recipe(algorithm: Any) -> None:
    """ValueError in a multi-process run when the recipe keeps state across steps (a non-empty `state_dict`):
    each process would update its own copy from its share, and a checkpoint holds one."""
    if jax.process_count() > 1 and algorithm.state_dict():
        raise ValueError(f"{type(algorithm).__name__} keeps state across steps ({sorted(algorithm.state_dict())}), "
                         "which multi-process runs do not share among processes: run it in one process")


def pad_rows(batch: Mapping[str, np.ndarray], multiple: int, rows: int = 0) -> Mapping[str, np.ndarray]:
    """`batch` with rows appended up to the first multiple of `multiple` that is at least `rows` and the batch's
    own: copies of row 0 (finite inputs for every layer) whose response mask is off, so they add nothing to any
    loss sum or denominator. `batch` itself when it needs none."""
    own = batch["response_mask_bt"].shape[0]
    extra = -(-max(own, rows) // multiple) * multiple - own
    if not extra:
        return batch
    padded = {key: np.concatenate([value, np.repeat(value[:1], extra, axis=0)]) for key, value in batch.items()}
    padded["response_mask_bt"][own:] = False
    return padded


def _max_over_processes(values: Sequence[int]) -> list[int]:
    """Each of `values` (ints, the same count on every process) maximised over the processes."""
    if jax.process_count() == 1:
        return list(values)
    return multihost_utils.process_allgather(np.asarray(values, np.int32)).max(axis=0).tolist()


def any_process(flag: bool) -> bool:
    """Whether `flag` is true on any process (an all-gather when there are several; every process must call)."""
    return bool(_max_over_processes((int(flag),))[0])


def fewest_over_processes(count: int) -> int:
    """The smallest `count` over the processes (an all-gather when there are several; every process must call)."""
    if jax.process_count() == 1:
        return count
    return int(multihost_utils.process_allgather(np.asarray([count], np.int32)).min())


class StepStream:
    """The task's train stream as the processes of a run draw from it (`algorithms.base.ExampleStream`): each
    process draws the same examples and keeps its share, [process_index::process_count] (`process_share`)."""

    def __init__(self, dataset: Any, prompts_per_step: int):
        self.dataset, self.prompts_per_step = dataset, prompts_per_step

    @property
    def quota(self) -> int:
        return self.prompts_per_step // jax.process_count()

    def next_share(self, n: int) -> list:
        return process_share(self.dataset.next_batch(n))

    def fewest(self, count: int) -> int:
        return fewest_over_processes(count)


def check_overlap(algorithm: Any, overlap: bool) -> None:
    """ValueError in a multi-process run whose recipe re-samples (`Algorithm.resamples`) with `rollout.overlap`:
    the processes agree on each generation batch with an all-gather, which the background sampling thread would
    issue while the learner's step runs its own collectives, in an order the processes need not share."""
    if jax.process_count() > 1 and overlap and algorithm.resamples:
        raise ValueError("dynamic_sampling resample with rollout.overlap is not supported in a multi-process run "
                         "(the processes agree on every generation batch with a collective, which the overlap "
                         "thread cannot issue while the learner's step runs): turn rollout.overlap off")


def align_batch(batch: Mapping[str, np.ndarray], prompt_width: int, pad_id: int, rows_multiple: int
                ) -> tuple[dict[str, np.ndarray], int]:
    """(this process's share of the step's batch in the shape every process agrees on, the common prompt width),
    module docstring. `rows_multiple` is what the global batch's rows must be a multiple of
    (`run_config.LearnerConfig.row_multiple`); the number of processes must divide it. Every process must call it
    (an all-gather)."""
    count = jax.process_count()
    if rows_multiple % count:
        raise ValueError(f"the batch's row multiple {rows_multiple} does not split among {count} processes")
    rows, length = batch["tokens_bt"].shape
    most_rows, widest, longest_response = _max_over_processes((rows, prompt_width, length - prompt_width))
    # A part with no rows at the agreed widths: concat_batches re-pads the share to them.
    template = {key: np.zeros((0, widest + longest_response, *np.shape(value)[2:]) if key.endswith("_bt")
                              else (0, *np.shape(value)[1:]), np.asarray(value).dtype)
                for key, value in batch.items()}
    aligned, width = concat_batches([(batch, prompt_width), (template, widest)], pad_id)
    return dict(pad_rows(aligned, rows_multiple // count, most_rows)), width
