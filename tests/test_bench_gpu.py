"""``bench/gpu.py --dry-run`` runs every part of the GPU bench once, tiny, on the strict
device (and PyTorch on the CPU): CI's check that the script a GPU session runs by hand has
not rotted. Its numbers are not measurements."""

from __future__ import annotations

import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
ROOT = os.path.dirname(BENCH)


def test_the_dry_run_runs_a_step_of_each_kind_and_the_fashion_loop():
    environment = {**os.environ, "PYTHONPATH": ROOT}
    completed = subprocess.run(
        [sys.executable, os.path.join(BENCH, "gpu.py"), "--dry-run", "--models", "lenet", "ncf"],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = completed.stdout.splitlines()
    assert lines[0] == "## strict test device (dry run: not a measurement)"
    rows = [line for line in lines if line.startswith("| LeNet-5 | 4 |")]
    rows += [line for line in lines if line.startswith("| NCF | 4 |")]
    assert len(rows) == 2
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert all(float(cells[index]) > 0 for index in (2, 3))  # eager and captured ms
        assert cells[7].endswith("; 0 / 0")  # no read of device data in a step, either way
    assert "ran eagerly in the captured runs" not in completed.stdout  # both captured
    assert any(line.startswith("| bigdl_py LocalOptimizer (captured) |") for line in lines)
