"""A mode written against the documented contract alone trains as the exact modes do.

The mode (``parameter_server_mode.py``, beside this file) uses only the building blocks
the contract names — ``Stage``, ``stage_task``, ``chain_end``, the records, the owner step —
and a record kind of its own, and reaches the executors as a user's own mode would, through
``SparkContext.addPyFile``.
"""

from __future__ import annotations

import os

import pytest
from blob_data import BATCH, blobs, classifier, flat, relative_error

from bigdl_py import nn
from bigdl_py.optim import SGD
from bigdl_py.spark import DistriOptimizer
from bigdl_py.train import LocalOptimizer, MaxIteration, SeveralIteration, load_checkpoint

pytestmark = pytest.mark.spark

MODE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parameter_server_mode.py")


def test_a_mode_of_ones_own_trains_as_the_local_loop_on_the_same_batches(spark, tmp_path):
    spark.sparkContext.addPyFile(MODE_FILE)
    from parameter_server_mode import ParameterServer

    features, labels = blobs()
    distributed = DistriOptimizer(
        classifier(),
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1, momentum=0.9),
        batch_size=BATCH,
        end_trigger=MaxIteration(10),
        num_partitions=3,
        iterations_per_job=4,
        update=ParameterServer(),
        progress=False,
    )
    local = LocalOptimizer(
        classifier(),
        distributed.local_reference_dataset(features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1, momentum=0.9),
        batch_size=BATCH,
        end_trigger=MaxIteration(10),
        progress=False,
    )
    for optimizer in (distributed, local):
        optimizer.set_constant_gradient_clipping(-0.5, 0.5)
        optimizer.set_gradient_clipping_by_l2_norm(0.3)
    distributed.set_checkpoint(str(tmp_path), SeveralIteration(5))
    runner, ran = distributed.runner, []
    run_iterations = runner.run_iterations

    def recorded(steps, stop_after_nonfinite):
        results = run_iterations(steps, stop_after_nonfinite)
        ran.append(len(results))
        return results

    runner.run_iterations = recorded
    with distributed:
        result = flat(distributed.optimize())
    assert relative_error(result, flat(local.optimize())) <= 1e-6
    assert sum(ran) == 10 and max(ran) == 4  # chained, as iterations_per_job asked
    # The server's whole state, cut into one entry per partition as every mode's is.
    checkpoint = load_checkpoint(str(tmp_path))
    assert checkpoint.iteration == 10
    assert len(checkpoint.metadata["optim_layout"]["shards"]) == 3
