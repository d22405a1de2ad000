"""Resume is exact across processes: 2 epochs straight == checkpoint, fresh process, resume."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resume_worker.py")


def run_worker(*args: str) -> None:
    completed = subprocess.run(
        [sys.executable, WORKER, *args], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr[-3000:]


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_resume_in_a_fresh_process_is_bit_exact(tmp_path, kind):
    checkpoints = tmp_path / "checkpoints"
    run_worker("first", kind, str(checkpoints), str(tmp_path))
    # 240 samples in batches of 30: 8 iterations per epoch, checkpoints after 4 and 8.
    manifests = sorted(name for name in os.listdir(checkpoints) if name.endswith(".json"))
    assert manifests == ["checkpoint-00000004.json", "checkpoint-00000008.json"]
    straight = np.load(tmp_path / "straight.npz")
    for manifest, where in zip(manifests, ["mid-epoch", "epoch end"], strict=True):
        output = tmp_path / f"resumed-{manifest}.npz"
        run_worker("resume", kind, str(checkpoints / manifest), str(output))
        resumed = np.load(output)
        assert sorted(resumed.files) == sorted(straight.files)
        for name in straight.files:
            np.testing.assert_array_equal(
                resumed[name], straight[name], err_msg=f"{kind}, resumed at {where}: {name}"
            )
