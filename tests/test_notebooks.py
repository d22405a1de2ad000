"""Every notebook in notebooks/ runs top to bottom, so none of them rots.

Notebooks are found by globbing, so a new one is tested without touching this file. Each runs
in a fresh ``python3`` kernel whose working directory is the repository root (as when a user
starts Jupyter there), with this interpreter first on the PATH, so the kernel and any Spark
Python workers it starts use the environment the tests run in.
"""

from __future__ import annotations

import glob
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "notebooks", "*.ipynb")))
KERNEL = "python3"
CELL_TIMEOUT_SECONDS = 900  # notebooks that train on Spark take minutes on a busy machine


def _read(path: str):
    nbformat = pytest.importorskip("nbformat")
    return nbformat.read(path, as_version=4)


def _kernel_environment() -> dict[str, str]:
    interpreter_directory = os.path.dirname(sys.executable)
    return dict(
        os.environ,
        PATH=interpreter_directory + os.pathsep + os.environ.get("PATH", ""),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )


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
    nbclient = pytest.importorskip("nbclient")
    kernelspec = pytest.importorskip("jupyter_client.kernelspec")
    try:
        kernelspec.KernelSpecManager().get_kernel_spec(KERNEL)
    except kernelspec.NoSuchKernel:
        pytest.skip(f"no Jupyter kernel named {KERNEL!r} (pip install ipykernel)")
    notebook = _read(path)
    client = nbclient.NotebookClient(
        notebook,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT_SECONDS,
        resources={"metadata": {"path": REPO}},
    )
    try:
        client.execute(env=_kernel_environment())
    except nbclient.exceptions.CellExecutionError as error:
        pytest.fail(f"{os.path.basename(path)} failed:\n{error}", pytrace=False)
    executed = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in executed)
