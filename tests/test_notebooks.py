"""Executes every research notebook under notebooks/ and fails if any cell raises.

The kernel is "python3": jupyter_client starts it with this test process's own interpreter (sys.executable), so
the notebooks see the same environment and the same `rubric_jax` as the tests. Cells run with the repository root
as working directory, on the CPU, with the headless Agg backend for matplotlib.
"""

import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(
    p for p in (REPO_ROOT / "notebooks").glob("**/*.ipynb") if ".ipynb_checkpoints" not in p.parts
)
CELL_TIMEOUT_S = 300


def _kernel_env(monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("JAX_PLATFORMS", os.environ.get("JAX_PLATFORMS", "cpu"))
    # The kernel imports rubric_jax from this checkout even when the package is not installed.
    python_path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO_ROOT)] + ([python_path] if python_path else [])))


def test_notebooks_are_found():
    assert NOTEBOOKS, "no notebooks under notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(REPO_ROOT)) for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch):
    _kernel_env(monkeypatch)
    notebook = nbformat.read(path, as_version=4)
    # One extra cell, in memory only: the kernel must be this interpreter, in this environment.
    notebook.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.prefix)"))
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(REPO_ROOT)}},
    )
    # Raises CellExecutionError (with the failing cell and its traceback) when any cell raises.
    client.execute()
    kernel_prefix = notebook.cells[-1].outputs[0]["text"].strip()
    assert kernel_prefix == sys.prefix, f"kernel runs in {kernel_prefix}, tests in {sys.prefix}"
