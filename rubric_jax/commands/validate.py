"""`rubric-jax validate`: a run config checked against its dataset, its first prompts rendered, without training.

The report (`validation_report`): rows used and skipped, the rubrics' negative-weight criteria and what the
configured reward does with them, each role's longest prompt (the recipe's `role_prompts`: SRaR's step format,
RLCER's rubricator, ...), each LLM role's answer to one real request (the launch's preflight), the first rows'
prompts as each role and the judge receive them; and what `rubric-jax train` would refuse at launch (a prompt
longer than the model's context, by dataset row; a judge whose answer does not parse; ...).
"""

import argparse
import collections
import sys
from typing import Any, Mapping, Optional

from rubric_jax import arguments
from rubric_jax.algorithms.registry import algorithm_class
from rubric_jax.judges import llm
from rubric_jax.judges.base import Judge, JudgeRequest
from rubric_jax.judges.preflight import PreflightFailed, require_parsed
from rubric_jax.models.tokenizer import apply_chat_template
from rubric_jax.training.run_config import RLConfig, resolve_algorithm

NAME = "validate"
SUMMARY = """check a run config and its dataset without training: rows used and skipped, what train would refuse
at launch (a prompt longer than the model's context, by dataset row), one real request to each LLM
judge and meta-verifier (its raw answer and whether it parses), the first prompts"""
PARSER_ORDER, SUMMARY_ORDER = 3, 4


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = arguments.config_command(subparsers, NAME, "check an RL config and its dataset without training: the "
                                                        "config, every row of the dataset, the recipe's max_items, "
                                                        "every prompt against the model's context, one real request "
                                                        "to each LLM judge and meta-verifier (the raw answer and "
                                                        "whether it parses); prints the first rows' policy and judge "
                                                        "prompts; exits 1 when train would refuse to start")
    parser.add_argument("--rows", type=arguments.positive_int, default=2,
                        help="rows whose prompts are shown (default 2)")
    parser.add_argument("--offline", action="store_true",
                        help="send the LLM judge and meta-verifier nothing (check the config and the data only)")
    return parser


def check(args) -> tuple[str, list[str]]:
    """The config's inputs checked as train checks them (`training.launch.rl_inputs`), then the validation
    itself, which is this command's check: (`validation_report`'s report, what train would refuse). A problem of
    the input, here or in the report (a rubric wider than max_items, a judge that cannot judge the task), is a
    ValueError; a judge's API key that is not set stops it (RunStopped)."""
    from rubric_jax.training.assembly import run_tokenizer  # noqa: PLC0415  (imports the model stack)
    from rubric_jax.training.launch import rl_inputs  # noqa: PLC0415

    inputs = rl_inputs(args.config, args.overrides)
    tokenizer = run_tokenizer(inputs.config.model, inputs.task)
    return validation_report(inputs.config, inputs.task, tokenizer, args.rows, ask_servers=not args.offline)


def run(checked: tuple[str, list[str]], args) -> int:
    """Prints the report; what train would refuse at launch, a line each on stderr, exits 1."""
    report, refusals = checked
    print(report, end="")
    for refusal in refusals:
        print(f"rubric-jax {NAME}: {arguments.one_line(refusal)}", file=sys.stderr)
    return 1 if refusals else 0


def validation_report(config: RLConfig, task: Any, tokenizer: Any, rows: int, *, ask_servers: bool = True
                      ) -> tuple[str, list[str]]:
    """What `rubric-jax validate` prints (module docstring), and what `rubric-jax train` would refuse at launch
    (a line each, naming what to fix; empty when it would start): the task's rows in use and skipped, the longest
    rubric against the recipe's max_items (ValueError when it does not fit), the judge (ValueError when it
    cannot judge the task's rubrics), a prompt the model cannot sample (`launch.prompt_refusal`, naming the dataset
    row), the recipe's frozen-engine server (`launch.check_frozen_engine`), and, with `ask_servers`, each LLM role's
    preflight (`launch.llm_preflights`: the raw answer and whether it parsed; a server that does not answer,
    refuses the credentials or the model name, or answers what does not parse is refused); then the first `rows`
    training rows' policy and judge prompts."""
    from rubric_jax.training.assembly import make_judge, make_meta_verifier  # noqa: PLC0415
    from rubric_jax.training.launch import check_frozen_engine, check_rubric_width  # noqa: PLC0415

    algorithm_config, config = resolve_algorithm(config)
    check_rubric_width(algorithm_config, task)
    algorithm = algorithm_class(config.algorithm.name)(algorithm_config)
    refusals = []
    try:
        check_frozen_engine(algorithm, config)
    except ValueError as error:
        refusals.append(str(error))
    judge = meta_verifier = None
    try:
        judge = make_judge(config.judge, task, config.seed)
        meta_verifier = make_meta_verifier(config.meta_verifier, config.seed)
        lines = _validation_lines(config, algorithm, task, tokenizer, rows, judge, meta_verifier, ask_servers,
                                  refusals)
    finally:
        for client in (judge, meta_verifier):
            if client is not None:
                client.close()
    return lines, refusals


def _validation_lines(config: RLConfig, algorithm: Any, task: Any, tokenizer: Any, rows: int, judge: Judge,
                      meta_verifier: Any, ask_servers: bool, refusals: list[str]) -> str:
    from rubric_jax.training.launch import PLACEHOLDER_RESPONSE, prompt_refusal  # noqa: PLC0415

    lines = [f"config: algorithm {config.algorithm.name}, task {config.task.name}, judge {config.judge.kind}"
             + (f" ({config.judge.format} at {config.judge.url}, model {config.judge.model})"
                if config.judge.kind == "llm" else "")]
    kwargs = config.model.chat_template_kwargs
    if hasattr(task, "data_metrics"):
        data = task.data_metrics()
        skipped = {k[len("data/skipped/"):]: int(v) for k, v in data.items() if k.startswith("data/skipped/")}
        lines.append(f"data: {int(data['data/train_rows'])} training rows, {int(data['data/eval_rows'])} held out"
                     + (", skipped " + ", ".join(f"{k} {v}" for k, v in skipped.items()) if skipped else
                        ", none skipped")
                     + f"; longest rubric {task.longest_rubric} items")
        lines += _penalty_lines(algorithm, task)
        lines += _prompt_lengths(algorithm, task, tokenizer, kwargs, config.rollout.max_prompt_tokens)
        if (refusal := prompt_refusal(algorithm, task, config)) is not None:
            refusals.append(refusal)
    if ask_servers:
        lines += _server_checks(judge, meta_verifier, task, config, refusals)
    for example in task.train_stream(0).next_batch(rows):
        where = f"{example.source} row {example.row}" if hasattr(example, "source") else "example"
        for role, messages in algorithm.role_prompts(task, example, PLACEHOLDER_RESPONSE).items():
            text, count = _rendered_prompt(tokenizer, messages, kwargs)
            lines += ["", f"--- {where}: {role} prompt ({count} tokens) ---", text]
        request = JudgeRequest(task.question(example), PLACEHOLDER_RESPONSE, task.rubric(example),
                               task.reference(example), None, tuple(task.prompt(example)))
        messages = _judge_prompt(judge, request)
        lines += ["", f"--- {where}: judge prompt ---"]
        lines += ([f"[{m['role']}]\n{m['content']}" for m in messages] if messages is not None else
                  ["(no prompt: the task's own judge" + (", an empty rubric" if not request.rubric.criteria
                                                         else "") + ")"])
    return "\n".join(lines) + "\n"


def _penalty_lines(algorithm: Any, task: Any) -> list[str]:
    """A line on the training rows' negative-weight criteria and what the configured reward does with them
    (`Algorithm.negative_weights`), and one on the rows whose rubric has no positive weight (a weighted score
    gives them 0 whatever the response: no signal); nothing when there are none."""
    penalties = without_positive = 0
    for example in task.train_records():
        weights = [c.weight for c in task.rubric(example).criteria]
        penalties += sum(w < 0 for w in weights)
        without_positive += bool(weights) and max(weights) <= 0
    lines = [f"rubrics: {penalties} criteria with a negative weight: {algorithm.negative_weights}"] if penalties else []
    if without_positive:
        lines.append(f"rubrics: {without_positive} rows with no positive weight: a weighted score (positive points, "
                     "weighted fraction) gives them 0 whatever the response")
    return lines


def _server_checks(judge: Judge, meta_verifier: Any, task: Any, config: RLConfig, refusals: list[str]) -> list[str]:
    """A line per LLM role's preflight (`launch.llm_preflights`): what was asked, whether the answer parsed, the
    raw answer; each failure is also added to `refusals`."""
    from rubric_jax.training.launch import llm_preflights  # noqa: PLC0415

    try:
        answers = llm_preflights(judge, meta_verifier, task, config.judge.format)
    except PreflightFailed as error:
        refusals.append(str(error))
        return [f"server check: {error}"]
    lines = []
    for answer in answers:
        lines.append(f"{answer.section} check: {answer.asked}: {answer.verdict}; raw answer: {answer.shown}")
        try:
            require_parsed(answer)
        except PreflightFailed as error:
            refusals.append(str(error))
    return lines


def _prompt_lengths(algorithm: Any, task: Any, tokenizer: Any, chat_template_kwargs: Mapping[str, Any],
                    cap: Optional[int]) -> list[str]:
    """A line per role on its prompts' token lengths over the training rows: the longest (and where), and how
    many exceed the rollout's cap, which truncates them (`rollout.max_prompt_tokens`)."""
    from rubric_jax.training.launch import prompt_lengths  # noqa: PLC0415

    longest: dict[str, tuple[int, str]] = {}
    over: collections.Counter = collections.Counter()
    for role, length, example in prompt_lengths(algorithm, task, tokenizer, chat_template_kwargs):
        if length > longest.get(role, (0, ""))[0]:
            longest[role] = length, f"{example.source} row {example.row}"
        over[role] += cap is not None and length > cap
    capped = "; {} over rollout.max_prompt_tokens ({}), which cuts them"
    return [f"{role} prompts: the longest has {length} tokens ({where})"
            + (capped.format(over[role], cap) if cap is not None else "") for role, (length, where) in longest.items()]


def _rendered_prompt(tokenizer: Any, messages, chat_template_kwargs: Mapping[str, Any]) -> tuple[str, int]:
    ids = apply_chat_template(tokenizer, messages, template_kwargs=chat_template_kwargs)
    return tokenizer.decode(ids), len(ids)


def _judge_prompt(judge: Judge, request: JudgeRequest) -> Optional[list]:
    """The first call an LLM judge would make for `request`; None for a judge that sends none (programmatic)."""
    if not isinstance(judge, (llm.RolloutLLMJudge, llm.CriterionLLMJudge)) or not request.rubric.criteria:
        return None
    if isinstance(judge, llm.CriterionLLMJudge):
        return judge.fmt.messages(request, 0)
    return judge.fmt.messages(request)
