"""`rubric-jax`: the parser assembled from the command modules of `rubric_jax.commands`, and the dispatcher.

Configs are YAML files (configs/) read onto frozen dataclasses and validated before anything is computed; any
key can be overridden after the file, `key.sub=value` (the value read as YAML).

Everything the user gives a command is checked before any model is built (the command's `check`): the arguments,
the config file and its overrides (keys, types, values, the algorithm's and the task's parameters), the model
directory (a Hugging Face directory: config.json of a supported architecture, safetensors weights, tokenizer
files) and the places the command will write. A problem exits with status 2 and one line on stderr,
`rubric-jax <command>: ...`. Those checks raise ValueError (the configs' own convention) or OSError (a path), the
two types caught, and only around the checks: an error once the work has started is a bug or an accident of the
run, one line and status 1 (its traceback with --debug). A run stopped for a reason it gives (RunStopped) is that
line and its exit code, a generator's server that cannot do the work (PreflightFailed) that line and 1, Ctrl-C
130. This module is the one place that prints them; a command adds one module to `rubric_jax.commands` and
nothing here.
"""

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType
from typing import NoReturn, Optional, Sequence

from rubric_jax import commands
from rubric_jax.arguments import one_line
from rubric_jax.judges.preflight import PreflightFailed

DESCRIPTION = """Rubric-based RL of LLMs in JAX.

commands:
"""
# The commands' list in the description: the name in a column this wide, then the summary's lines.
NAME_COLUMN = 10


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors in the commands' one-line form (argparse prints the usage first), an
    unknown argument reported by the command it was given to (`commands`: name -> that command's parser)."""

    commands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.commands[parsed.command].error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def command_modules() -> dict[str, ModuleType]:
    """name -> module of every command in `rubric_jax.commands`, in the order their parsers are added."""
    modules = [importlib.import_module(f"{commands.__name__}.{info.name}")
               for info in pkgutil.iter_modules(commands.__path__)]
    return {module.NAME: module for module in sorted(modules, key=lambda module: module.PARSER_ORDER)}


def _summary(module: ModuleType) -> str:
    """A command's entry in the description: its name, then its summary's lines indented past the name column
    (a longer name on a line of its own)."""
    indent = " " * (2 + NAME_COLUMN + 2)
    first, *rest = module.SUMMARY.splitlines()
    if len(module.NAME) > NAME_COLUMN:
        lines = [f"  {module.NAME}", indent + first]
    else:
        lines = [f"  {module.NAME:<{NAME_COLUMN}}  {first}"]
    return "\n".join(lines + [indent + line for line in rest]) + "\n"


def build_parser(modules: Optional[dict[str, ModuleType]] = None) -> argparse.ArgumentParser:
    """The `rubric-jax` parser: a subparser per command module (`command_modules` unless given)."""
    modules = command_modules() if modules is None else modules
    listed = sorted(modules.values(), key=lambda module: module.SUMMARY_ORDER)
    parser = _Parser(prog="rubric-jax", description=DESCRIPTION + "".join(_summary(module) for module in listed),
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a runtime error instead of its one-line summary")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in modules.values():
        module.add_parser(subparsers)
    parser.commands = subparsers.choices
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs a command; a runtime error it does not report itself is one line and exit 1, Ctrl-C one line and 130
    (`--debug` lets both through with their tracebacks)."""
    modules = command_modules()
    args = build_parser(modules).parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what a command that re-runs itself runs again
    command = modules[args.command]
    if args.debug:
        return _dispatch(command, args)
    try:
        return _dispatch(command, args)
    except KeyboardInterrupt:
        print(f"rubric-jax {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # a bug or an environment problem: one line, the traceback behind --debug
        print(f"rubric-jax {args.command}: {type(error).__name__}: {one_line(error)} (rerun with --debug for the "
              "traceback)", file=sys.stderr)
        return 1


def _dispatch(command: ModuleType, args) -> int:
    """The command's checks, then its work (module docstring): the exit status."""
    from rubric_jax.training.runs import RunStopped  # noqa: PLC0415  (imports jax: once a command runs)

    try:
        try:
            checked = command.check(args)
        except (ValueError, OSError) as error:
            return _report(args, error, 2)
        except PreflightFailed as error:  # the synthesis generator's server cannot do the work
            return _report(args, error, 1)
        return command.run(checked, args)
    except RunStopped as error:
        return _report(args, error, error.exit_code)


def _report(args, error: Exception, status: int) -> int:
    print(f"rubric-jax {args.command}: {one_line(error)}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
