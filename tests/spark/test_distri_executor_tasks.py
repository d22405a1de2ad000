"""Whole-executor tasks: a task of several CPUs trains its partition's share on a replica
per CPU (its own and forked helpers), and one gradient per task enters the AllReduce.

In local mode, with the data declared laid out for tasks of 2 CPUs (as ``update="auto"``
lays it out on executors of 2 cores): the arithmetic stays the local loop's on the same
global batches, for every mode that trains on replicas, chained, with or without a shared
disk.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from blob_data import BATCH, blobs, classifier, flat, local_reference_weights

from bigdl_py import nn
from bigdl_py.optim import SGD
from bigdl_py.spark import DistriOptimizer, LocalSGD
from bigdl_py.spark.modes.auto import whole_executor_cpus
from bigdl_py.train import MaxIteration

pytestmark = pytest.mark.spark

ITERATIONS = 12


def optimizer(update, shared_disk=True):
    features, labels = blobs()
    made = DistriOptimizer(
        classifier(),
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1, momentum=0.9),
        batch_size=BATCH,
        end_trigger=MaxIteration(ITERATIONS),
        num_partitions=2,
        iterations_per_job=4,
        update=update,
        progress=False,
    )
    executors = dataclasses.replace(
        made.training_set.executors, shared_disk=shared_disk, whole_executor_cpus=2
    )
    made.training_set.executors = executors
    return made


@pytest.mark.parametrize(
    "update, shared_disk", [("replicated", True), ("sharded", False), ("replicated", False)]
)
def test_whole_executor_tasks_train_as_the_local_loop(spark, update, shared_disk):
    made = optimizer(update, shared_disk)
    with made:
        weights = flat(made.optimize())
        assert made.runner.spec.replicas_per_task == 2
    features, labels = blobs()
    local = local_reference_weights(made, features, labels, ITERATIONS, batch_size=BATCH)
    np.testing.assert_allclose(weights, local, rtol=1e-5, atol=1e-6)


def test_local_sgd_on_whole_executor_tasks_as_on_one_replica(spark):
    mode = LocalSGD(period=4)
    with optimizer(mode, shared_disk=False) as split:
        on_two = flat(split.optimize())
    with optimizer(mode, shared_disk=False) as single:
        single.training_set.executors = dataclasses.replace(
            single.training_set.executors, whole_executor_cpus=None
        )
        on_one = flat(single.optimize())
    np.testing.assert_allclose(on_two, on_one, rtol=1e-5, atol=1e-6)


def test_auto_asks_for_whole_executor_tasks_on_executors_of_several_cores():
    assert whole_executor_cpus(2, 4, task_cpus=1, local_mode=False) == 4
    assert whole_executor_cpus(2, 1, task_cpus=1, local_mode=False) is None
    assert whole_executor_cpus(1, 8, task_cpus=1, local_mode=True) is None  # one-task there
    assert whole_executor_cpus(2, 4, task_cpus=4, local_mode=False) is None  # the user's
    assert whole_executor_cpus(2, 4, task_cpus=1, local_mode=False, device="gpu") is None
