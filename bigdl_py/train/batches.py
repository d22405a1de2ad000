"""Batches in and out of a model: training batches, validation batches, forward, evaluation.

Plain functions over a model and ``MiniBatch``es, so the local runner and a distributed
runner's per-partition code share them (a partition evaluates its part with
:func:`evaluate_batches` and the driver merges the partial results).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from bigdl_py import backend, device_waits
from bigdl_py.autograd.grad_mode import no_grad
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.data import ArrayDataset, BatchRandom, MiniBatch
from bigdl_py.train.metrics import ValidationMethod, ValidationResult


def as_array_dataset(data: Any, what: str, **options: Any) -> ArrayDataset:
    """An ArrayDataset from an ArrayDataset or a ``(features, labels)`` pair of arrays."""
    if isinstance(data, ArrayDataset):
        return data
    if isinstance(data, tuple) and len(data) == 2:
        features, labels = data
        return ArrayDataset(features, labels, **options)
    raise TypeError(
        f"{what} must be an ArrayDataset or a (features, labels) tuple of arrays, got "
        f"{type(data).__name__}"
    )


def training_batch(
    dataset: ArrayDataset, epoch: int, batch_index: int, indices: np.ndarray
) -> MiniBatch:
    """Global batch ``batch_index`` of ``epoch`` given its sample ``indices``.

    Equals ``dataset.batch(epoch, batch_index)`` (same samples, same augmentation draws)
    without recomputing the epoch's shuffle on every call.
    """
    random = None
    if dataset.transform is not None:
        random = BatchRandom.for_batch(dataset.seed, epoch, batch_index, len(indices))
    return dataset.take(indices, random, augment=dataset.train)


def validation_batches(dataset: ArrayDataset, batch_size: int) -> Iterator[MiniBatch]:
    """The dataset in stored order, ``batch_size`` at a time, without training augmentation."""
    for start in range(0, len(dataset), batch_size):
        indices = np.arange(start, min(start + batch_size, len(dataset)), dtype=np.int64)
        yield dataset.take(indices, None, augment=False)


def forward(model: Any, batch: MiniBatch, device: backend.Device) -> Any:
    """Run ``model`` on a batch's features moved to ``device`` (one positional input each)."""
    inputs = [Tensor(backend.to_device(array, device), _copy=False) for array in batch.features]
    return model(*inputs)


def host_labels(batch: MiniBatch) -> np.ndarray:
    """The batch's labels (a clear error for unlabelled data)."""
    if batch.labels is None:
        raise ValueError("training and validation batches need labels; this dataset has none")
    return batch.labels


def labels_on(batch: MiniBatch, device: backend.Device) -> Tensor:
    """The batch's labels as a Tensor on ``device`` (a clear error for unlabelled data)."""
    return Tensor(backend.to_device(host_labels(batch), device), _copy=False)


def criterion_target(criterion: Any, batch: MiniBatch, device: backend.Device) -> Tensor:
    """The batch's labels as ``criterion`` takes them: host arrays for a criterion that
    checks them on the host and copies them to its input's device itself (the package's
    losses: ``checks_host_targets``), so no check reads the device; on ``device`` for any
    other criterion."""
    host = getattr(criterion, "checks_host_targets", False)
    return labels_on(batch, backend.CPU if host else device)


def evaluate_batches(
    model: Any,
    batches: Iterable[MiniBatch],
    methods: Sequence[ValidationMethod],
    device: backend.Device | str = "cpu",
) -> list[ValidationResult]:
    """Partial validation results of ``methods`` over ``batches`` (mergeable with others).

    The model runs in evaluation mode without recording a graph; its mode is restored after.
    On a device the batches are queued without waiting for it: the totals stay there and
    the checks of device data are read once, at the end.
    """
    device = backend.device(device)
    results = [method.empty_result() for method in methods]
    was_training = model.training
    model.eval()
    try:
        with no_grad(), device_waits.no_device_waits():
            for batch in batches:
                output = forward(model, batch, device)
                target = labels_on(batch, device)
                results = [
                    total + method.batch_result(output, target)
                    for total, method in zip(results, methods, strict=True)
                ]
    finally:
        model.train(was_training)
    device_waits.raise_deferred_checks()
    return [result.on_host() for result in results]
