"""Run one notebook top to bottom in a fresh kernel; print ``RESULT {json}``.

Started by ``test_notebooks.py`` as a background job (``tests/background_jobs.py``): the
kernel runs in the repository root (as when a user starts Jupyter there), with this
interpreter first on the PATH, so the kernel and any Spark Python workers it starts use the
environment the tests run in. The result says ``skip`` (and why) where Jupyter's pieces are
missing, ``error`` where a cell failed, or how many code cells ran.

    python tests/notebook_job.py NOTEBOOK CELL_TIMEOUT_SECONDS
"""

from __future__ import annotations

import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL = "python3"


def kernel_environment() -> dict[str, str]:
    interpreter_directory = os.path.dirname(sys.executable)
    return dict(
        os.environ,
        PATH=interpreter_directory + os.pathsep + os.environ.get("PATH", ""),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )


def run(path: str, cell_timeout: int) -> dict:
    try:
        import nbclient
        import nbformat
        from jupyter_client import kernelspec
    except ImportError as error:
        return {"skip": f"Jupyter's pieces are not installed: {error}"}
    try:
        kernelspec.KernelSpecManager().get_kernel_spec(KERNEL)
    except kernelspec.NoSuchKernel:
        return {"skip": f"no Jupyter kernel named {KERNEL!r} (pip install ipykernel)"}
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        kernel_name=KERNEL,
        timeout=cell_timeout,
        resources={"metadata": {"path": REPO}},
    )
    try:
        client.execute(env=kernel_environment())
    except nbclient.exceptions.CellExecutionError as error:
        return {"error": str(error)}
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    return {
        "code_cells": len(code_cells),
        "executed": sum(cell.execution_count is not None for cell in code_cells),
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(run(sys.argv[1], int(sys.argv[2]))), flush=True)
