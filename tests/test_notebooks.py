"""Every notebook in notebooks/ runs top to bottom, so none of them rots.

Notebooks are found by globbing, so a new one is tested without touching this file. Each runs
in a fresh ``python3`` kernel, started by ``notebook_job.py`` (which says how).
"""

from __future__ import annotations

import glob
import os

import pytest
from background_jobs import BackgroundJob

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "notebooks", "*.ipynb")))
CELL_TIMEOUT_SECONDS = 900  # notebooks that train on Spark take minutes on a busy machine


def _read(path: str):
    nbformat = pytest.importorskip("nbformat")
    return nbformat.read(path, as_version=4)


# Each notebook runs in its own process beside the rest of the suite, in this order
# (tests/background_jobs.py, tests/notebook_job.py).
RUNS = {
    path: BackgroundJob(
        os.path.basename(path),
        os.path.join(REPO, "tests", "notebook_job.py"),
        [path, str(CELL_TIMEOUT_SECONDS)],
        CELL_TIMEOUT_SECONDS * 4,
    )
    for path in NOTEBOOKS
}


def background_jobs(item) -> list[BackgroundJob]:
    """The run a selected test reads (tests/conftest.py queues it)."""
    if item.originalname != "test_notebook_runs_top_to_bottom":
        return []
    return [RUNS[item.callspec.params["path"]]]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_is_saved_without_outputs(path):
    code_cells = [cell for cell in _read(path).cells if cell.cell_type == "code"]
    with_outputs = [
        number
        for number, cell in enumerate(code_cells, start=1)
        if cell.get("outputs") or cell.get("execution_count") is not None
    ]
    assert not with_outputs, (
        f"{os.path.basename(path)}: code cells {with_outputs} were saved with outputs; clear "
        "them (jupyter nbconvert --clear-output --inplace)"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_top_to_bottom(path):
    result = RUNS[path].result()
    if "skip" in result:
        pytest.skip(result["skip"])
    if "error" in result:
        pytest.fail(f"{os.path.basename(path)} failed:\n{result['error']}", pytrace=False)
    assert result["executed"] == result["code_cells"] > 0
