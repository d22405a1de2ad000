"""The small classification problem DistriOptimizer's tests train on (not a test module).

203 samples (no partition count divides it) of 3 Gaussian blobs in 10 dimensions, a
10-16-3 classifier with fixed initial weights, and the helpers that compare two runs.
"""

from __future__ import annotations

import numpy as np

from bigdl_py import nn

SAMPLES, FEATURES, CLASSES = 203, 10, 3
BATCH = 30  # shares 8/8/7/7 for 4 partitions, 10/10/10 for 3


def blobs(seed=0):
    generator = np.random.default_rng(seed)
    centres = generator.normal(scale=2.0, size=(CLASSES, FEATURES))
    labels = generator.integers(0, CLASSES, SAMPLES)
    features = centres[labels] + generator.normal(size=(SAMPLES, FEATURES))
    return features.astype(np.float32), labels.astype(np.int64)


def classifier():
    with nn.init.seeded(1):
        return nn.Sequential(
            nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, CLASSES), nn.LogSoftmax()
        )


def flat(model) -> np.ndarray:
    return np.concatenate([p.data.ravel() for p in model.parameters()])


def relative_error(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def shuffle_files(sc) -> set[str]:
    """The shuffle data and index files under this machine's Spark block-manager folders."""
    import glob
    import os
    import tempfile

    local_dir = sc.getConf().get("spark.local.dir", tempfile.gettempdir())
    pattern = os.path.join(local_dir, "blockmgr-*", "*", "shuffle_*")
    return set(glob.glob(pattern))


def wait_until_deleted(paths: set[str], timeout: float = 20.0) -> set[str]:
    """Poll until none of ``paths`` exists (Spark deletes in the background); the rest."""
    import os
    import time

    deadline = time.monotonic() + timeout
    left = {path for path in paths if os.path.exists(path)}
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {path for path in left if os.path.exists(path)}
    return left
