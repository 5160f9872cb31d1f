"""The trainer (issue 5, being built): the RL loop, SFT, checkpoints, configs and metrics.

config.py  YAML configs onto frozen dataclasses: `load_config(cls, path, overrides)` with strict validation
           (unknown keys, wrong types, impossible combinations name the key), `key.sub=value` overrides,
           `save_config` of the fully resolved config.
optim.py   `OptimizerConfig` and `make_optimizer`: AdamW with decoupled weight decay on matrices, linear warmup,
           a constant or cosine schedule with a floor, and global-norm clipping.
"""
