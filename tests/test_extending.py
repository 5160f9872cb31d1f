"""docs/extending.md works as written: its code blocks run in order in a fresh directory, as a researcher would
run them. A block whose first line is a comment naming a file (`# critz.py`, `# critz.yaml`) is that file; every
other Python block runs as `python -c` there, and the shell block's `rubric-jax` is the installed command (its
recipe module found from the current directory, as `algorithm.imports` promises)."""

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
BLOCK = re.compile(r"```(python|yaml|bash)\n(.*?)```", re.DOTALL)
FILE_NAME = re.compile(r"# ([\w.-]+\.(?:py|yaml))\n")


def blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(DOC.read_text(encoding="utf-8"))


def rubric_jax_command() -> list[str]:
    installed = Path(sys.executable).parent / "rubric-jax"
    return [str(installed)] if installed.exists() else [sys.executable, "-m", "rubric_jax.cli"]


def run(command: list[str], directory: Path) -> None:
    done = subprocess.run(command, cwd=directory, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{command[:3]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_the_page_defines_a_recipe_outside_the_package_and_trains_it_from_the_cli_and_from_python(tmp_path):
    kinds = [kind for kind, _ in blocks()]
    assert kinds.count("bash") == 1 and kinds.count("yaml") == 1 and kinds.count("python") >= 4
    written = []
    for kind, code in blocks():
        if (name := FILE_NAME.match(code)) is not None:
            (tmp_path / name.group(1)).write_text(code, encoding="utf-8")
            written.append(name.group(1))
        elif kind == "bash":
            program, *arguments = code.split()
            assert program == "rubric-jax"
            run([*rubric_jax_command(), *arguments], tmp_path)
        else:
            run([sys.executable, "-c", code], tmp_path)
    assert written == ["critz.py", "critz.yaml"]
    assert (tmp_path / "runs" / "critz" / "model" / "config.json").is_file()
    assert (tmp_path / "runs" / "critz_from_python" / "metrics.jsonl").is_file()
