"""The trainer (issue 5, being built): the RL loop, SFT, checkpoints, configs and metrics.

optim.py   `OptimizerConfig` and `make_optimizer`: AdamW with decoupled weight decay on matrices, linear warmup,
           a constant or cosine schedule with a floor, and global-norm clipping.
"""
