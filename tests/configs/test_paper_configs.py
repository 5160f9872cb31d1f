"""Each paper-scale config carries its paper's hyperparameters: the "Config values" table of
docs/fidelity/<paper>.md lists them (hyperparameter, where the paper states it, the config key, the paper's value),
and this test reads configs/<paper>_paper.yaml, resolved as the trainer resolves it (recipe defaults filled in),
and checks every row that names a key.

A row whose config key is "-" records a value the config cannot hold as the paper states it (its verdict column
says why); it is read but not checked.
"""

import math
import re
from pathlib import Path

import pytest
import yaml

from rubric_jax.training.run_config import RLConfig, resolve_algorithm
from rubric_jax.yaml_config import config_to_dict, load_config

ROOT = Path(__file__).resolve().parents[2]
PAPERS = ("srar", "rlcer", "evorubric", "rgr_grpo", "rubric_grounded", "dapo")
COLUMNS = ("hyperparameter", "paper", "config key", "value")
MIN_CHECKED_ROWS = 6


def config_rows(markdown: str) -> list[dict[str, str]]:
    """The rows of the first table under the "## Config values" heading, as {column: cell} with backticks
    stripped. ValueError when the section or its table is missing or the columns are not COLUMNS."""
    section = re.search(r"^## Config values\s*$(.*?)(?=^## |\Z)", markdown, re.MULTILINE | re.DOTALL)
    if section is None:
        raise ValueError('no "## Config values" section')
    lines = [line.strip() for line in section.group(1).splitlines() if line.strip().startswith("|")]
    if len(lines) < 3:
        raise ValueError('the "## Config values" section has no table')

    def cells(line: str) -> list[str]:
        return [cell.strip().strip("`").strip() for cell in line.strip("|").split("|")]

    header = tuple(cell.lower() for cell in cells(lines[0]))
    if header[: len(COLUMNS)] != COLUMNS:
        raise ValueError(f"config table columns must start with {COLUMNS}, got {header}")
    return [dict(zip(COLUMNS, cells(line))) for line in lines[2:]]


def resolved_config(paper: str) -> dict:
    algorithm_config, config = resolve_algorithm(load_config(RLConfig, ROOT / "configs" / f"{paper}_paper.yaml"))
    resolved = config_to_dict(config)
    resolved["algorithm"]["params"] = config_to_dict(algorithm_config)
    return resolved


def lookup(config: dict, dotted_key: str):
    value = config
    for name in dotted_key.split("."):
        if not isinstance(value, dict) or name not in value:
            raise KeyError(f"{dotted_key}: no key {name!r}")
        value = value[name]
    return value


def paper_value(cell: str):
    """A table cell as YAML, with scientific notation such as `1e-6` read as a number (YAML 1.1, which PyYAML
    reads, makes it a string)."""
    value = yaml.safe_load(cell)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def same_value(actual, expected) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):
        return actual is expected
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        return math.isclose(actual, expected, rel_tol=1e-12, abs_tol=0.0)
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        return len(actual) == len(expected) and all(map(same_value, actual, expected))
    return actual == expected


def test_config_rows_parses_the_table_and_rejects_a_missing_one():
    doc = ("# x\n\n## Config values\n\n| Hyperparameter | Paper | Config key | Value |\n|---|---|---|---|\n"
           "| lr | Table 3 | `optimizer.learning_rate` | `1e-6` |\n| batch | sec 5 | - | 64 |\n\n## Next\n| a |\n")
    assert config_rows(doc) == [
        {"hyperparameter": "lr", "paper": "Table 3", "config key": "optimizer.learning_rate", "value": "1e-6"},
        {"hyperparameter": "batch", "paper": "sec 5", "config key": "-", "value": "64"},
    ]
    with pytest.raises(ValueError, match="no .*Config values"):
        config_rows("# x\n| a | b |\n")


def test_paper_value_reads_scientific_notation_as_a_number():
    assert paper_value("1e-6") == 1e-6 and paper_value("1.0e-6") == 1e-6 and paper_value("8") == 8
    assert paper_value("token_mean") == "token_mean" and paper_value("null") is None


def test_same_value_is_strict_about_types_and_values():
    assert same_value(1e-6, 1e-6) and same_value(8, 8.0) and same_value([1, 2], (1, 2))
    assert not same_value(1e-6, 1e-5) and not same_value(True, 1) and not same_value("grpo", "ppo")


@pytest.mark.parametrize("paper", PAPERS)
def test_paper_config_holds_the_papers_values(paper):
    doc = ROOT / "docs" / "fidelity" / f"{paper}.md"
    assert doc.is_file(), f"{doc} is missing"
    rows = config_rows(doc.read_text(encoding="utf-8"))
    checked = [row for row in rows if row["config key"] not in ("-", "")]
    assert len(checked) >= MIN_CHECKED_ROWS, f"{doc.name} checks only {len(checked)} config values"
    config = resolved_config(paper)
    mismatches = []
    for row in checked:
        expected = paper_value(row["value"])
        actual = lookup(config, row["config key"])
        if not same_value(actual, expected):
            mismatches.append(f"{row['hyperparameter']} ({row['paper']}): {row['config key']} = {actual!r}, "
                              f"the paper's value is {expected!r}")
    assert not mismatches, "\n".join(mismatches)
