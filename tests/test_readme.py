"""README's "Train on your own data" example, as a newcomer would copy it: its JSONL line and its config pass
`rubric-jax validate` (the model replaced by a random one and the path by the copied rows, since neither the
checkpoint nor the data is in the repository)."""

import re
import shlex
from pathlib import Path

from rubric_jax import cli

README = Path(__file__).resolve().parents[1] / "README.md"


def section_blocks(title: str) -> dict[str, list[str]]:
    """The fenced code blocks of the README section `title`, by language, in order."""
    text = README.read_text(encoding="utf-8")
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    blocks: dict[str, list[str]] = {}
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", section, re.DOTALL):
        blocks.setdefault(lang, []).append(body)
    return blocks


def test_the_own_data_example_validates(tmp_path, capsys):
    blocks = section_blocks("Train on your own data")
    rows = tmp_path / "train.jsonl"
    rows.write_text(blocks["json"][0] * 3, encoding="utf-8")
    config = tmp_path / "my_data.yaml"
    config.write_text(blocks["yaml"][0], encoding="utf-8")
    assert cli.main(["validate", str(config), f"task.params.path={rows}", "task.params.eval_size=1",
                     "model={init: {max_position_embeddings: 4096}}", "--rows", "1"]) == 0
    out = capsys.readouterr().out
    assert "data: 2 training rows, 1 held out, none skipped; longest rubric 2 items" in out
    assert "My knee hurts after running." in out and "[user]\n" in out  # the policy's and the judge's prompts
    assert "rubric-jax validate configs/my_data.yaml && rubric-jax train configs/my_data.yaml" in blocks["bash"][0]


def test_the_own_data_eval_commands_parse():
    [_, evals] = section_blocks("Train on your own data")["bash"]
    commands = [shlex.split(line) for line in evals.replace("\\\n", " ").splitlines() if line.strip()]
    assert len(commands) == 2
    for command in commands:
        args = cli.build_parser().parse_args(command[1:])
        assert command[0] == "rubric-jax" and args.command == "eval" and args.dataset in ("aime25", "healthbench")
