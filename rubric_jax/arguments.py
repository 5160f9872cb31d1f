"""What the `rubric-jax` commands (`rubric_jax.commands`) share: argparse types, the parser of a command that
reads a config file with its overrides, the check of an --output file, and the one-line form of an error that the
command line prints.

Imported when the parser is built (`rubric-jax --help`): it imports nothing heavier than the run configs at the
top, and the file-system checks of the layers below only inside the functions that use them.
"""

import argparse
import typing
from pathlib import Path
from typing import Optional, Union

from rubric_jax.training.run_config import JudgeConfig

# The ways to ask an LLM judge (`JudgeConfig.format`): the choices of every command's judge-format flag.
JUDGE_FORMATS = typing.get_args(typing.get_type_hints(JudgeConfig)["format"])


def int_at_least(minimum: int):
    """An argparse type: an integer >= `minimum`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def config_command(subparsers, name: str, help_text: str, default: Optional[str] = None) -> argparse.ArgumentParser:
    """Adds the parser of a command that reads a YAML config file (`default`: the built-in config it reads when
    none is given) followed by `key.sub=value` overrides."""
    parser = subparsers.add_parser(name, help=help_text, description=help_text,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs=None if default is None else "?", default=default,
                        help="YAML config file" + (f" (default: the built-in {default})" if default else ""))
    parser.add_argument("overrides", nargs="*", default=[], metavar="key.sub=value",
                        help="config overrides, each value read as YAML (e.g. optimizer.learning_rate=3e-6)")
    return parser


def check_output_file(path: str) -> None:
    """ValueError unless `path` names a file that --output can write: not a directory, in an existing directory
    that a file can be written to."""
    from rubric_jax.training.runs import check_writable_directory  # noqa: PLC0415  (imports jax and orbax)

    if Path(path).is_dir():
        raise ValueError(f"--output {path} is a directory")
    parent = Path(path).parent
    if not parent.is_dir():
        raise ValueError(f"--output {path}: the directory {parent} does not exist")
    check_writable_directory(str(parent), "--output file's directory")


def one_line(error: Union[Exception, str]) -> str:
    """An error's message (or any text) on one line, its runs of white space one space each; an OSError with a
    file as "<file>: <reason>", the form a shell user knows."""
    if isinstance(error, OSError) and error.strerror and error.filename:
        return f"{error.filename}: {error.strerror}"
    return " ".join(str(error).split())
