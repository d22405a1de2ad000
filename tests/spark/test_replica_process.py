"""One-task's replicas in forked child processes, without Spark: the child's gradient is
``forward_backward``'s on the same replica (to float32 rounding: a forked child may split
BLAS's work otherwise than its parent), its errors reach the caller, and a
child that died is reported (and rebuilt by the task) instead of hanging it."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from blob_data import blobs, classifier

from bigdl_py import nn
from bigdl_py.optim import SGD
from bigdl_py.spark.modes.replica_process import ReplicaProcess, processes_available
from bigdl_py.spark.partitioned_data import write_partition_data
from bigdl_py.spark.replica import Replica, RunSpec, forward_backward

pytestmark = pytest.mark.skipif(
    not processes_available("cpu"), reason="this platform does not fork"
)

BATCH = 30


def replica(tmp_path) -> Replica:
    features, labels = blobs()
    model = classifier()
    size = sum(parameter.data.size for parameter in model.parameters())
    spec = RunSpec("replica-process-test", model, nn.NLLLoss(), SGD(lr=0.1), 1, size, BATCH, None)
    return Replica(spec, write_partition_data(str(tmp_path), 0, (features,), labels))


def test_the_childs_gradient_is_forward_backwards_on_the_same_replica(tmp_path):
    local = replica(tmp_path)
    helper = ReplicaProcess(replica(tmp_path))
    weights = local.flat.weights.copy()
    try:
        for iteration, indices in enumerate([np.arange(3, 18), np.arange(40, 52)]):
            weights = weights * np.float32(0.9)  # a new vector each iteration
            helper.start(weights, indices, BATCH, iteration, 2, None)
            gradient, loss_sum, count = forward_backward(
                local, weights, indices, BATCH, iteration, 2
            )
            child_gradient, child_loss_sum, child_count = helper.finish()
            np.testing.assert_allclose(child_gradient, gradient, rtol=1e-5, atol=1e-7)
            assert child_loss_sum == pytest.approx(loss_sum, rel=1e-6)
            assert child_count == count == len(indices)
            assert np.any(gradient != 0)
    finally:
        helper.close()
    assert not helper.alive()


def test_an_error_in_the_child_is_returned_and_the_child_serves_on(tmp_path):
    helper = ReplicaProcess(replica(tmp_path))
    weights = helper.weights.copy()
    try:
        helper.start(weights, np.array([10_000]), BATCH, 0, 1, None)  # no such sample
        error = helper.finish()
        assert isinstance(error, IndexError)
        helper.start(weights, np.arange(5), BATCH, 1, 1, None)
        _, _, count = helper.finish()
        assert count == 5 and helper.alive()
    finally:
        helper.close()


def test_a_reply_left_unread_is_skipped(tmp_path):
    """A task that stopped between start and finish leaves a reply in the pipe; the next
    request's finish reads past it to its own."""
    local = replica(tmp_path)
    helper = ReplicaProcess(replica(tmp_path))
    weights = local.flat.weights.copy()
    try:
        helper.start(weights, np.arange(7), BATCH, 0, 1, None)  # never finished
        helper.start(weights, np.arange(9, 20), BATCH, 1, 1, None)
        gradient, _, count = forward_backward(local, weights, np.arange(9, 20), BATCH, 1)
        child_gradient, _, child_count = helper.finish()
        np.testing.assert_allclose(child_gradient, gradient, rtol=1e-5, atol=1e-7)
        assert child_count == count == 11
    finally:
        helper.close()


def test_a_child_that_died_is_reported_not_waited_for(tmp_path):
    helper = ReplicaProcess(replica(tmp_path))
    os.kill(helper.process.pid, signal.SIGKILL)
    helper.process.join()
    assert not helper.alive()
    error = None
    try:
        helper.start(helper.weights.copy(), np.arange(5), BATCH, 0, 1, None)
        error = helper.finish()
    except RuntimeError as raised:  # the pipe may already be broken when it sends
        error = raised
    assert isinstance(error, RuntimeError)
    assert "partition 0's replica died" in str(error)


class NeedsTwoArguments(Exception):
    def __init__(self, first, second):  # pickles, but cannot be rebuilt from its args
        super().__init__(f"{first} and {second}")


def test_an_error_that_cannot_travel_comes_back_as_its_text(tmp_path):
    def failing_step(model, batch):
        raise NeedsTwoArguments("left", "right")

    rebuilt = replica(tmp_path)
    rebuilt.training_step = failing_step
    helper = ReplicaProcess(rebuilt)
    try:
        helper.start(helper.weights.copy(), np.arange(5), BATCH, 0, 1, None)
        error = helper.finish()
    finally:
        helper.close()
    assert isinstance(error, RuntimeError)
    assert "NeedsTwoArguments: left and right" in str(error)
