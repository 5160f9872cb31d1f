import json


def run_smoke(main, out_dir, variants) -> dict:
    """Runs a comparison script's `main` with --smoke into `out_dir`, checks that it returned and saved the cold
    start's row and one row per variant, in order, and returns results.json's content."""
    results = main(["--smoke", "--out", str(out_dir)])
    assert list(results) == ["sft", *variants]
    saved = json.loads((out_dir / "results.json").read_text())
    assert saved.keys() == results.keys()
    return saved
