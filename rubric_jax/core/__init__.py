"""The functional core: pure, jit-able, vmap-friendly JAX functions over fixed-shape arrays.

Nothing here imports from the rest of rubric_jax, performs I/O, or loops over the batch in Python.
Batches are fixed-shape arrays with masks and integer ids: rewards [B], group_ids [B], response_mask [B, T],
step_ids [B, T], rubric verdicts [B, K] with item masks, types, points and steps.
"""
