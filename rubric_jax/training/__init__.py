"""The trainer: the RL loop, SFT, checkpoints, configs and metrics.

rl.py          `train_rl(config, task)`: rollouts -> judges -> a recipe's advantages -> PPO-style updates (epochs,
               mini-batches, exact micro-batch accumulation, optional KL to a frozen reference) -> weight sync ->
               metrics -> checkpoints; resumes exactly.
assembly.py    how a config becomes a run's parts (task, engines, judge, meta-verifier, chat clients, benchmarks,
               a saved model's engine); nothing else builds them.
launch.py      what a launch checks and refuses before anything is written (`checked_rl_launch`, the one path of
               `rubric-jax train` and `rubric_jax.train`; prompt lengths, preflight requests to the LLM roles).
learner.py     the learner: jitted steps per prompt width, a step's epochs x mini-batches, PPO's critic and GAE.
experience.py  a step's experience sampled and judged by the recipe, with its judge's and engine's call counts.
run_files.py   the run's rollout logs, samples and an overlapped run's pending experience (arrays and JSON).
failure_budget.py  the judge's failure budget: a judge that keeps failing stops the run.
sft.py         `train_sft(config, task)`: masked cross-entropy on chat-formatted solutions; saves an HF directory.
evaluate.py    held-out avg@k, pass@k and rubric satisfaction of the policy an engine serves.
run_config.py  `RLConfig`, `SFTConfig`, `QuickstartConfig` and their sections, validated before any compute
               (read from YAML by `rubric_jax.yaml_config`, which the data layer shares).
optim.py       `OptimizerConfig` and `make_optimizer`: AdamW with decoupled weight decay on matrices, linear warmup,
               a constant or cosine schedule with a floor, and global-norm clipping.
checkpoint.py  `Checkpointer`: orbax checkpoints of the learner state and JSON metadata; async, keep N, never a
               half-written latest.
metrics.py     `MetricsWriter` (JSONL, TensorBoard, console), `PhaseTimer`, `plot_metrics`.
policy.py      the policy from a `ModelSpec`, the learner state a checkpoint holds, saving the policy.
multihost.py   a multi-process run's launch: joining with the run's timeouts, the hosts' configs and code compared,
               the run directory checked as shared, a process that fails alone leaving at once.
supervisor.py  `rubric-jax train` in a multi-process job: the training in a child whose end (the runtime's aborts
               included) becomes one line and an exit status.
"""
