"""`rubric-jax plan`: an RL config's learner and rollouts compiled ahead of time for a TPU topology on any host
(`training.plan`: HBM per chip, FLOPs, a step-time bound and the MFU ceiling; `training.rollout_plan`: the
embedded engine's prefill and decode step, its HBM bytes and throughput bound; docs/scale.md)."""

import argparse
import sys

from rubric_jax import arguments
from rubric_jax.training.run_config import RLConfig
from rubric_jax.yaml_config import load_config

NAME = "plan"
SUMMARY = """compile a run's learner and rollouts ahead of time for a TPU topology (e.g. v5p:4x4x4) on any host: HBM
per chip, FLOPs, a step-time bound and the MFU ceiling, and the decode step's HBM bytes and throughput bound; exits
1 when the step or the rollouts do not fit (docs/scale.md)"""
PARSER_ORDER = SUMMARY_ORDER = 7


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = arguments.config_command(subparsers, NAME, "compile an RL config's learner (train step and logprobs) "
                                                        "ahead of time for a TPU topology and report its memory per "
                                                        "chip, FLOPs and MFU ceiling; needs libtpu (pip install -e "
                                                        "'.[tpu]'), no TPU")
    parser.add_argument("--topology", required=True, help="<generation>:<shape>, e.g. v5e:2x2, v4:2x2x1, v5p:4x4x4")
    parser.add_argument("--model-preset", help="a published architecture (e.g. Qwen3-8B) instead of model.path's "
                                               "config.json")
    parser.add_argument("--prompt-tokens", type=arguments.positive_int,
                        help="prompt width of the step (default: rollout.max_prompt_tokens)")
    parser.add_argument("--hbm-gib", type=arguments.positive_float,
                        help="the memory budget per chip in GiB (default: the chip's HBM), to leave headroom")
    parser.add_argument("--search", action="store_true",
                        help="if the learner does not fit, double learner.micro_batches (then with model.remat=true) "
                             "and learner.forward_micro_batches until it does, and print the overrides")
    return parser


def check(args):
    """The learner compiled for the topology (with --search, each setting tried until one fits): (the plan's
    result, the overrides that made it fit). A config, model or topology that does not plan is a ValueError."""
    from rubric_jax.training import plan, rollout_plan  # noqa: PLC0415  (imports the model stack)

    config = load_config(RLConfig, args.config, args.overrides)
    prompt_tokens = args.prompt_tokens or config.rollout.max_prompt_tokens
    if prompt_tokens is None:
        raise ValueError("the config has no rollout.max_prompt_tokens: give --prompt-tokens")
    model = plan.model_config(config, args.model_preset)
    hbm_bytes = None if args.hbm_gib is None else int(args.hbm_gib * plan.GIB)
    options = dict(prompt_tokens=prompt_tokens, hbm_bytes=hbm_bytes)
    rollouts = rollout_plan.plan_rollouts(config, model, args.topology, **options)
    if args.search:
        return (*plan.search_learner(config, model, args.topology, **options,
                                     log=lambda line: print(f"tried: {line}", file=sys.stderr)), rollouts)
    return plan.plan_learner(config, model, args.topology, **options), [], rollouts


def run(planned, args) -> int:
    """Prints the plan's report, the learner's then the rollouts'; status 1 when the learner's step or (for a
    config that samples with the embedded engine) the rollouts do not fit in the chips' HBM."""
    result, overrides, rollouts = planned
    print(result.report())
    print(rollouts.report())
    if not result.fits:
        advice = "no micro-batch count or remat setting fits: plan a larger topology" if args.search else \
            "raise learner.micro_batches, set model.remat=true (or try --search), or plan a larger topology"
        print(f"rubric-jax {NAME}: the learner does not fit in {args.topology}'s HBM: {advice}", file=sys.stderr)
    if rollouts.binding and not rollouts.fits:
        print(f"rubric-jax {NAME}: the rollouts do not fit in {args.topology}'s HBM: lower rollout.decode_slots "
              f"(at most {rollouts.max_slots} fit) or plan a larger topology", file=sys.stderr)
    if not (result.fits and (rollouts.fits or not rollouts.binding)):
        return 1
    if args.search:
        print("fits as configured" if not overrides else f"fits with: {' '.join(overrides)}")
    return 0
