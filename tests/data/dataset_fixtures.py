"""The hand-written dataset fixtures (tests/fixtures/datasets/), one file in each preset's layout."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "datasets"
# Presets whose file is not <preset>.jsonl: other formats, and presets reading another preset's file.
FILES = {"gpqa": "gpqa.csv", "researchqa": "researchqa.json", "dapo_math_question": "dapo_math.jsonl"}


def fixture_path(preset: str) -> Path:
    """The fixture file of `preset`."""
    return FIXTURES / FILES.get(preset, f"{preset}.jsonl")
