"""A replica's forward-backward on a device queues every piece without waiting for it.

Run without Spark on the ``strict`` test device (host memory posing as a GPU, whose arrays
raise ``DeviceSyncError`` on any read back inside a step): the gradient and the summed loss
are those of the same replica on the CPU, and the one read comes after the last backward.
"""

from __future__ import annotations

import numpy as np
import pytest
from blob_data import blobs, classifier

from bigdl_py import backend, nn
from bigdl_py.optim import SGD
from bigdl_py.optim.flat_parameters import FlatParameters
from bigdl_py.spark.partitioned_data import write_partition_data
from bigdl_py.spark.replica import Replica, RunSpec, forward_backward

BATCH = 30


def replica(tmp_path, criterion, labels=None, device="cpu") -> Replica:
    features, blob_labels = blobs()
    model = classifier()
    size = sum(parameter.data.size for parameter in model.parameters())
    spec = RunSpec("device-waits-test", model, criterion, SGD(lr=0.1), 1, size, BATCH, None)
    data = (features,), blob_labels if labels is None else labels
    folder = tmp_path / device
    folder.mkdir()
    made = Replica(spec, write_partition_data(str(folder), 0, *data))
    if device != "cpu":  # as bind_task_device would, for a device no Spark task names
        made.device = backend.device(device)
        made.model.to(made.device)
        made.trained_module = made.model
        made.flat = FlatParameters(made.model)
    return made


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_a_device_replica_gives_the_cpu_replicas_gradient_without_waiting(tmp_path, micro_batches):
    weights = np.concatenate([p.data.reshape(-1) for p in classifier().parameters()])
    weights = weights + np.random.default_rng(5).normal(0, 0.1, weights.shape).astype(np.float32)
    results = []
    for device in ("cpu", "strict"):
        made = replica(tmp_path, nn.NLLLoss(), device=device)
        gradient, loss_sum, count = forward_backward(
            made, weights, np.arange(BATCH), BATCH, 1, micro_batches
        )
        results.append((backend.as_numpy(gradient), loss_sum, count))
    (cpu_gradient, cpu_loss, cpu_count), (gradient, loss, count) = results
    np.testing.assert_allclose(gradient, cpu_gradient, rtol=1e-5, atol=1e-7)
    assert loss == pytest.approx(cpu_loss, rel=1e-6) and count == cpu_count == BATCH


class _DeviceTargets(nn.Module):
    """A criterion that takes its labels on the device (checked there, not on the host)."""

    def __init__(self):
        super().__init__()
        self.loss = nn.NLLLoss()

    def forward(self, output, target):
        return self.loss(output, target)


def test_a_bad_label_checked_on_the_device_is_reported_naming_the_partition(tmp_path):
    _, labels = blobs()
    labels = labels.copy()
    labels[4] = 7
    made = replica(tmp_path, _DeviceTargets(), labels=labels, device="strict")
    weights = backend.as_numpy(made.flat.weights).copy()
    with pytest.raises(ValueError, match=r"partition 0, iteration 2: .*target\[4\] = 7"):
        forward_backward(made, weights, np.arange(BATCH), BATCH, 2, 2)
