"""The `rubric-jax` commands, one module each (its name the command's, '-' as '_'); `rubric_jax.cli` finds them
here, builds the parser from them and runs the one given.

A command module declares:
- NAME: the command; SUMMARY: its lines in `rubric-jax --help`'s list of commands (wrapped by hand, the CLI
  indents them); PARSER_ORDER and SUMMARY_ORDER: its place in the usage line's choices and in that list (two
  orders, both kept as the help has always shown them);
- `add_parser(subparsers)`: adds its parser and returns it;
- `check(args)`: everything checked before the work starts, returning what `run` needs; a problem of the input
  is a ValueError or an OSError, which the CLI prints as one line and exits 2;
- `run(checked, args)`: the work; returns the exit status.

A command imports nothing from another command (what they share is in `rubric_jax.arguments` or the layers below),
and at its top nothing that `rubric-jax --help` did not import already (the run configs and what they import): the
parser is built from every command module on each call; the model stack is imported inside `check` and `run`.
"""
