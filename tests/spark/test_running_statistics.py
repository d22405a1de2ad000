"""Running statistics (BatchNorm's) do not depend on which Python worker, or host, holds a
replica, in any training mode: LocalSGD's jobs start from the driver's average; in the exact
modes partition 0's statistics (the run's) travel from each iteration to the next."""

from __future__ import annotations

import numpy as np
import pytest
from blob_data import BATCH, blobs

from bigdl_py import nn
from bigdl_py.optim import SGD
from bigdl_py.spark import DistriOptimizer, LocalSGD, worker
from bigdl_py.train import LocalOptimizer, MaxIteration

pytestmark = pytest.mark.spark


def batch_norm_classifier():
    with nn.init.seeded(1):
        return nn.Sequential(
            nn.Linear(10, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 3), nn.LogSoftmax()
        )


UPDATES = {
    "local-sgd": lambda: LocalSGD(period=2),
    "replicated": lambda: "replicated",
    "sharded": lambda: "sharded",
}


def trained_state(sc, update, forget_before=None, reference=None) -> dict[str, np.ndarray]:
    """Parameters and buffers after 8 iterations, two a job (LocalSGD(period=2): a round);
    before the job of iteration ``forget_before`` every Python worker drops its cache, as a
    replaced host starts empty (the optimizer state is still on the shared disk)."""
    optimizer = DistriOptimizer(
        batch_norm_classifier(),
        blobs(),
        nn.NLLLoss(),
        SGD(lr=0.1, momentum=0.9),
        batch_size=BATCH,
        end_trigger=MaxIteration(8),
        num_partitions=2,
        iterations_per_job=2,
        update=UPDATES.get(update, lambda: update)(),
        progress=False,
    )
    run_iterations = optimizer.runner.run_iterations
    starts = []

    def forgetting(steps, stop_after_nonfinite):
        starts.append(steps[0].iteration)
        if steps[0].iteration == forget_before:
            sc.parallelize(range(16), 16).foreach(lambda _: worker.clear())
        return run_iterations(steps, stop_after_nonfinite)

    optimizer.runner.run_iterations = forgetting
    with optimizer:
        model = optimizer.optimize()
        if reference is not None:
            reference.append(optimizer.local_reference_dataset(*blobs()))
    assert forget_before is None or forget_before in starts  # a job started there
    return {name: np.array(value) for name, value in model.state_dict().items()}


@pytest.mark.parametrize("update", sorted(UPDATES))
def test_running_statistics_survive_rebuilt_replicas(spark, update):
    uninterrupted = trained_state(spark.sparkContext, update)
    rebuilt = trained_state(spark.sparkContext, update, forget_before=4)
    assert uninterrupted.keys() == rebuilt.keys()
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(rebuilt[name], value, err_msg=name)
    initial = batch_norm_classifier().state_dict()
    assert np.abs(uninterrupted["1.running_mean"] - np.array(initial["1.running_mean"])).max() > 0


def test_one_replicas_running_statistics_are_those_of_local_training(spark):
    """One replica normalises the whole global batch, as LocalOptimizer does over the same
    planned batches: its running statistics equal the local ones exactly, though the second
    job (from iteration 7, an epoch's end; the mode runs 64 a job) starts in workers with
    empty caches."""
    planned = []
    state = trained_state(spark.sparkContext, "one-replica", forget_before=7, reference=planned)
    local = LocalOptimizer(
        batch_norm_classifier(),
        planned[0],
        nn.NLLLoss(),
        SGD(lr=0.1, momentum=0.9),
        batch_size=BATCH,
        end_trigger=MaxIteration(8),
        progress=False,
    ).optimize()
    for name, value in local.state_dict().items():
        np.testing.assert_array_equal(state[name], np.array(value), err_msg=name)
    assert int(state["1.num_batches_tracked"]) == 8
