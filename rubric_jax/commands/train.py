"""`rubric-jax train`: an RL run from a YAML config, checked through the same function as `rubric_jax.train`
(`training.launch.checked_rl_launch`), then `training.rl.train_rl`."""

import argparse

from rubric_jax import arguments

NAME = "train"
SUMMARY = "an RL run from a config (algorithm, rollouts, learner, optimizer, checkpoints, metrics)"
PARSER_ORDER = SUMMARY_ORDER = 1


def add_parser(subparsers) -> argparse.ArgumentParser:
    return arguments.config_command(subparsers, NAME, "RL training from a YAML config (see configs/); resumes from "
                                                      "the output directory's latest checkpoint unless "
                                                      "checkpoint.resume=false")


def check(args):
    """The run's config, model directory, task, benchmarks, output directory and rubric width checked
    (`training.launch.checked_rl_launch`)."""
    from rubric_jax.training import supervisor  # noqa: PLC0415
    from rubric_jax.training.launch import checked_rl_launch  # noqa: PLC0415  (imports the model stack)

    supervisor.enter_child()  # a supervised child's runtime output goes to its log from here on
    return checked_rl_launch(args.config, args.overrides)


def run(inputs, args) -> int:
    """The run; in a multi-process job, in a supervised child, whose end the runtime or a signal caused is one
    line (`training.supervisor`)."""
    from rubric_jax.training import multihost, rl, supervisor  # noqa: PLC0415

    if supervisor.wanted():
        status, line = supervisor.supervise(args.argv, inputs.config.output_dir,
                                            inputs.config.distributed.heartbeat_timeout_s)
        if line is not None:
            raise multihost.failure(line, status)
        return status
    rl.train_rl(inputs.config, inputs.task, benchmarks=inputs.benchmarks)
    return 0
