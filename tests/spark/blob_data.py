"""The small classification problem DistriOptimizer's tests train on (not a test module;
the local-cluster job scripts, run beside it, import it too).

203 samples (no partition count divides it) of 3 Gaussian blobs in 10 dimensions, a
10-16-3 classifier with fixed initial weights, the helpers that compare two runs, and
two that watch Spark's shuffle files come and go.
"""

from __future__ import annotations

import glob
import os
import time

import numpy as np

from bigdl_py import nn
from bigdl_py.optim import DistriOptimizer

SAMPLES, FEATURES, CLASSES = 203, 10, 3
BATCH = 30  # shares 8/8/7/7 for 4 partitions, 10/10/10 for 3


def blobs(seed=0, samples=SAMPLES):
    generator = np.random.default_rng(seed)
    centres = generator.normal(scale=2.0, size=(CLASSES, FEATURES))
    labels = generator.integers(0, CLASSES, samples)
    features = centres[labels] + generator.normal(size=(samples, FEATURES))
    return features.astype(np.float32), labels.astype(np.int64)


def classifier():
    with nn.init.seeded(1):
        return nn.Sequential(
            nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, CLASSES), nn.LogSoftmax()
        )


def blob_optimizer(method, **options):
    """A DistriOptimizer of :func:`classifier` on :func:`blobs`: NLL loss, ``method``, the
    global batch ``BATCH``, no progress bar; ``options`` add or override."""
    options = {"batch_size": BATCH, "progress": False, **options}
    return DistriOptimizer(classifier(), blobs(), nn.NLLLoss(), method, **options)


def flat(model) -> np.ndarray:
    return np.concatenate([p.data.ravel() for p in model.parameters()])


def local_reference_weights(distributed, features, labels, iterations, batch_size=64):
    """The exact modes' reference: LocalOptimizer's flat weights after ``iterations`` on the
    global batches ``distributed`` (a DistriOptimizer of :func:`classifier`, NLL loss,
    SGD lr 0.1 momentum 0.9) trains on. The local-cluster job scripts use it."""
    from bigdl_py.optim import SGD
    from bigdl_py.train import LocalOptimizer, MaxIteration

    reference = LocalOptimizer(
        classifier(),
        distributed.local_reference_dataset(features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1, momentum=0.9),
        batch_size=batch_size,
        end_trigger=MaxIteration(iterations),
        progress=False,
    )
    return flat(reference.optimize())


def relative_error(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def shuffle_files(sc) -> set[str]:
    """The shuffle data and index files in the driver's block-manager folders, where Spark
    puts them: spark.local.dir, else SPARK_LOCAL_DIRS, else the JVM's java.io.tmpdir, which
    a TMPDIR set for Python does not move (looking in Python's temporary folder found none)."""
    local_dirs = (
        sc.getConf().get("spark.local.dir", None)
        or os.environ.get("SPARK_LOCAL_DIRS")
        or sc._jvm.java.lang.System.getProperty("java.io.tmpdir")
    )
    return {
        path
        for folder in local_dirs.split(",")
        for path in glob.glob(os.path.join(folder, "blockmgr-*", "*", "shuffle_*"))
    }


def first_iterations(optimizer) -> list[int]:
    """The 0-based first iteration of each call the optimizer's runner takes, as it trains
    (a resumed run's first is the checkpoint's iteration)."""
    firsts: list[int] = []
    runner = optimizer.runner
    run_iterations = runner.run_iterations

    def recorded(steps, stop_after_nonfinite):
        firsts.append(steps[0].iteration)
        return run_iterations(steps, stop_after_nonfinite)

    runner.run_iterations = recorded
    return firsts


def wait_until_deleted(paths: set[str], timeout: float = 120.0) -> set[str]:
    """Poll until none of ``paths`` exists (Spark deletes in the background); the rest.

    The wait ends as soon as the files are gone (well under a second on an idle machine); the
    long bound is for a loaded one, where 20 s once left a checksum file behind.
    """
    deadline = time.monotonic() + timeout
    left = {path for path in paths if os.path.exists(path)}
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {path for path in left if os.path.exists(path)}
    return left


def pipeline_network(dtype=np.float32):
    """The pipeline tests' model, 8 layers: BatchNorm and dropout in the first half, so any
    cut splits them off. (No bias before BatchNorm: its gradient is zero but for rounding,
    which Adam would scale up to steps of the learning rate's size, different in every
    summation order.)"""
    with nn.init.seeded(1):
        model = nn.Sequential(
            nn.Linear(10, 16, bias=False),
            nn.BatchNorm1d(16),
            nn.Tanh(),
            nn.Dropout(0.3),
            nn.Linear(16, 16),
            nn.Tanh(),
            nn.Linear(16, 3),
            nn.LogSoftmax(),
        )
    return model.double() if dtype == np.float64 else model
