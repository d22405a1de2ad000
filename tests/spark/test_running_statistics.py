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
from bigdl_py.train import MaxIteration

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


def trained_state(sc, update, forget_before=None) -> dict[str, np.ndarray]:
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


def test_one_tasks_running_statistics_are_the_replicated_updates(spark):
    """A replica per thread, each normalising its partition's share; partition 0's replica
    keeps the run's running statistics, as in the exact modes — though the second job (from
    iteration 7, an epoch's end; the mode runs 64 a job) starts in workers with empty
    caches. Batch statistics over a share differ from those over the whole batch, so the
    replicated update is the reference, not LocalOptimizer."""
    state = trained_state(spark.sparkContext, "one-task", forget_before=7)
    expected = trained_state(spark.sparkContext, "replicated")
    for name, value in expected.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    assert int(state["1.num_batches_tracked"]) == 8
