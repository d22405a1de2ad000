"""Chains of iterations where the executors share no disk: the optimizer state and the
partitions' rows of the chain's later iterations travel with the stages' records.

Run in local mode with the executors declared as hosts without a shared disk (as
``Executors.of`` finds a multi-host cluster): the arithmetic must be the shared-disk
run's, and no optimizer state may wait in a host's files. (The separate-hosts test in
``test_local_cluster.py`` runs the same chains on two hosts that really share nothing.)
"""

from __future__ import annotations

import dataclasses
import glob
import os

import numpy as np
import pytest
from blob_data import BATCH, blobs, classifier, first_iterations, flat, local_reference_weights

from bigdl_py import nn
from bigdl_py.optim import SGD
from bigdl_py.spark import DistriOptimizer, LocalSGD
from bigdl_py.spark.partitioned_data import run_directory
from bigdl_py.spark.records import ShareRows
from bigdl_py.train import MaxIteration, SeveralIteration, load_checkpoint

pytestmark = pytest.mark.spark

ITERATIONS = 20  # jobs of 8, 8 and 4 iterations


def optimizer(update, shared_disk: bool, iterations_per_job=8):
    features, labels = blobs()
    made = DistriOptimizer(
        classifier(),
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1, momentum=0.9),
        batch_size=BATCH,
        end_trigger=MaxIteration(ITERATIONS),
        num_partitions=2,
        iterations_per_job=iterations_per_job,
        update=update,
        progress=False,
    )
    executors = made.training_set.executors
    made.training_set.executors = dataclasses.replace(executors, shared_disk=shared_disk)
    return made


def train(made) -> tuple[np.ndarray, set[str], int]:
    """The trained weights, the optimizer-state files the run had on this host after each of
    its jobs, and the iterations one call took."""
    files: set[str] = set()
    runner = made.runner
    run_iterations = runner.run_iterations

    def watched(steps, stop_after_nonfinite):
        results = run_iterations(steps, stop_after_nonfinite)
        directory = run_directory(runner.spec.state_dir, runner.spec.run_id)
        files.update(glob.glob(os.path.join(directory, "optim-*")))
        return results

    runner.run_iterations = watched
    with made:
        weights = flat(made.optimize())
    return weights, files, runner.iterations_per_call


@pytest.mark.parametrize("update", ["sharded", "replicated"])
def test_exact_chains_without_a_shared_disk_train_as_the_local_loop(spark, update):
    made = optimizer(update, shared_disk=False)
    weights, files, per_call = train(made)
    features, labels = blobs()
    local = local_reference_weights(made, features, labels, ITERATIONS, batch_size=BATCH)
    np.testing.assert_allclose(weights, local, rtol=1e-5, atol=1e-6)
    assert per_call == 8  # chained, as on a disk the executors share
    assert not files  # the state travelled with the records, not through files


def test_local_sgd_chains_without_a_shared_disk_as_with_one(spark):
    mode = LocalSGD(period=4, warmup_iterations=2)
    apart, files, per_call = train(optimizer(mode, shared_disk=False))
    together, files_together, _ = train(optimizer(mode, shared_disk=True))
    np.testing.assert_allclose(apart, together, rtol=1e-6, atol=1e-7)
    assert per_call == 8 and not files
    assert files_together  # where a disk is shared, the state files are kept as before


@pytest.mark.parametrize("update", ["sharded", LocalSGD(period=4, warmup_iterations=2)])
def test_a_checkpoint_without_a_shared_disk_resumes_exactly(spark, tmp_path, update):
    """The state a checkpoint gathers mid-run comes from the driver (it travelled there at
    each job's end) and resumes to the uninterrupted run's weights."""
    # (Local SGD averages where a checkpoint is taken: the straight run takes one too.)
    straight_run = optimizer(update, shared_disk=False)
    straight_run.set_checkpoint(str(tmp_path), SeveralIteration(12))
    straight, _, _ = train(straight_run)
    assert load_checkpoint(str(tmp_path)).iteration == 12
    resumed = optimizer(update, shared_disk=False)
    resumed.resume_from(str(tmp_path))
    firsts = first_iterations(resumed)
    weights, files, _ = train(resumed)
    assert firsts[0] == 12  # it went on from the checkpoint
    np.testing.assert_allclose(weights, straight, rtol=1e-6, atol=1e-7)
    assert not files


def test_share_rows_hand_each_iteration_its_share_in_order():
    features = (np.arange(40, dtype=np.float32).reshape(20, 2),)
    labels = np.arange(20) * 10
    shares = [np.array([3, 1]), np.array([7]), np.array([0, 19, 5])]
    rows = ShareRows.gather(features, labels, shares, first=4)
    assert [rows.holds(iteration) for iteration in (3, 4, 6, 7)] == [False, True, True, False]
    (block,), block_labels = rows.of(6)
    np.testing.assert_array_equal(block, features[0][[0, 19, 5]])
    np.testing.assert_array_equal(block_labels, [0, 190, 50])
    assert rows.after(3) is rows  # before its first iteration: all of them
    later = rows.after(4)
    assert (later.first, later.stops) == (5, (1, 4))
    np.testing.assert_array_equal(later.of(5)[1], [70])
    assert later.labels.base is None  # a copy: the record carries the later rows only
    assert rows.after(6) is None
    with pytest.raises(RuntimeError, match="not of iteration 9"):
        rows.of(9)
