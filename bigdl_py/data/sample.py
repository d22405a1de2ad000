"""``Sample`` (one record) and ``MiniBatch`` (records stacked along a leading batch axis).

BigDL's vocabulary: a ``Sample`` holds the feature arrays and the label of one record; a
``MiniBatch`` holds the same arrays for many records, each with a leading batch axis. A
model with several inputs gets a tuple of feature arrays; ``features`` is always a tuple so
that code handling one input and several inputs is the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.optim.sharding import all_slice_bounds


def _as_feature_tuple(features: Any, what: str) -> tuple:
    """One array or a tuple/list of arrays -> a tuple of arrays (host or device kept)."""
    if isinstance(features, (tuple, list)):
        if not features:
            raise ValueError(
                f"{what} must hold at least one array, got an empty {type(features).__name__}"
            )
        arrays = tuple(features)
        if all(np.ndim(array) == 0 for array in arrays):
            # A list of numbers is one input's values, not that many scalar inputs: as
            # separate inputs they reach forward() as hundreds of positional arguments.
            raise TypeError(
                f"{what} is a {type(features).__name__} of {len(arrays)} numbers; pass one "
                "input as an array (np.asarray(values)), or a tuple of arrays, one per "
                "model input"
            )
    else:
        arrays = (features,)
    return tuple(array if backend.is_device_array(array) else np.asarray(array) for array in arrays)


#: Cut ``range(size)`` into ``parts`` contiguous shares whose sizes differ by at most one:
#: the package's one balanced split, under the data layer's name (see
#: :func:`bigdl_py.optim.sharding.slice_bounds`).
split_bounds = all_slice_bounds


class Sample:
    """One record: its feature arrays and its label.

    Parameters
    ----------
    features : array_like or sequence of array_like
        One array, or a tuple/list of arrays for a model with several inputs.
    label : scalar or array_like, optional
        The target; ``None`` for inference data.

    Attributes
    ----------
    features : tuple of numpy.ndarray
        Always a tuple, even for one input.
    label : numpy.ndarray or None
    """

    __slots__ = ("features", "label")

    def __init__(self, features: Any, label: Any = None):
        self.features = tuple(
            backend.as_numpy(array) for array in _as_feature_tuple(features, "Sample features")
        )
        self.label = None if label is None else backend.as_numpy(np.asarray(label))

    @classmethod
    def from_ndarray(cls, features: Any, labels: Any = None) -> Sample:
        """BigDL's constructor name: ``Sample.from_ndarray(features, labels)``."""
        return cls(features, labels)

    @property
    def feature_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shape of each feature array."""
        return tuple(array.shape for array in self.features)

    def __repr__(self) -> str:
        label = "None" if self.label is None else f"{self.label.tolist()!r}"
        return f"Sample(feature_shapes={self.feature_shapes}, label={label})"


class MiniBatch:
    """Feature arrays and labels of several samples, stacked along a leading batch axis.

    Parameters
    ----------
    features : array or sequence of arrays
        One array or a tuple of arrays, each of shape ``(size, ...)``.
    labels : array, optional
        Shape ``(size, ...)``; ``None`` for inference.

    Raises
    ------
    ValueError
        When the arrays do not agree on the batch size.
    """

    __slots__ = ("features", "labels")

    def __init__(self, features: Any, labels: Any = None):
        self.features = _as_feature_tuple(features, "MiniBatch features")
        if labels is not None and not backend.is_device_array(labels):
            labels = np.asarray(labels)
        self.labels = labels
        sizes = [array.shape[0] if array.ndim else None for array in self.features]
        if labels is not None:
            sizes.append(labels.shape[0] if labels.ndim else None)
        if None in sizes or len(set(sizes)) != 1:
            shapes = [array.shape for array in self.features]
            label_shape = None if labels is None else labels.shape
            raise ValueError(
                "MiniBatch arrays must share their first (batch) axis: feature shapes "
                f"{shapes}, label shape {label_shape}"
            )

    @classmethod
    def from_samples(cls, samples: Sequence[Sample]) -> MiniBatch:
        """Stack samples into a batch.

        Raises
        ------
        ValueError
            When there are no samples, when the samples differ in their number of inputs
            or in a feature or label shape (naming the first sample that differs from
            sample 0), or when some samples have labels and others do not.
        """
        samples = list(samples)
        if not samples:
            raise ValueError("cannot build a MiniBatch from an empty list of samples")
        first = samples[0]
        first_label_shape = None if first.label is None else first.label.shape
        for position, sample in enumerate(samples):
            if sample.feature_shapes != first.feature_shapes:
                raise ValueError(
                    f"ragged feature shapes: sample {position} has "
                    f"{_shapes_text(sample.feature_shapes)}, sample 0 has "
                    f"{_shapes_text(first.feature_shapes)}"
                )
            label_shape = None if sample.label is None else sample.label.shape
            if label_shape != first_label_shape:
                if None in (label_shape, first_label_shape):
                    raise ValueError(
                        f"sample {position} has label {_label_text(sample.label)} but sample 0 "
                        f"has label {_label_text(first.label)}: either every sample has a "
                        "label or none has"
                    )
                raise ValueError(
                    f"ragged label shapes: sample {position} has {label_shape}, "
                    f"sample 0 has {first_label_shape}"
                )
        features = tuple(
            np.stack([sample.features[i] for sample in samples]) for i in range(len(first.features))
        )
        labels = None if first.label is None else np.stack([s.label for s in samples])
        return cls(features, labels)

    @property
    def size(self) -> int:
        """Number of samples in the batch."""
        return int(self.features[0].shape[0])

    def __len__(self) -> int:
        return self.size

    def get_input(self) -> Any:
        """BigDL's ``getInput``: the feature array, or the tuple of them for several inputs."""
        return self.features[0] if len(self.features) == 1 else self.features

    def get_target(self) -> Any:
        """BigDL's ``getTarget``: the labels (``None`` for inference batches)."""
        return self.labels

    def slice(self, start: int, stop: int) -> MiniBatch:
        """Samples ``start:stop`` of this batch (views, not copies)."""
        if not 0 <= start <= stop <= self.size:
            raise ValueError(
                f"MiniBatch.slice({start}, {stop}) is outside a batch of {self.size} samples"
            )
        labels = None if self.labels is None else self.labels[start:stop]
        return MiniBatch(tuple(array[start:stop] for array in self.features), labels)

    def split(self, parts: int) -> list[MiniBatch]:
        """Cut into ``parts`` consecutive shares whose sizes differ by at most one.

        Used to divide a global batch across partitions (see :func:`split_bounds`); when
        ``parts`` exceeds the batch size, the last shares are empty batches.
        """
        return [self.slice(start, stop) for start, stop in split_bounds(self.size, parts)]

    def to(self, device: backend.Device | str) -> MiniBatch:
        """This batch with every array moved to ``device`` (``'cpu'``, ``'cuda:0'``...)."""
        labels = None if self.labels is None else backend.to_device(self.labels, device)
        features = tuple(backend.to_device(array, device) for array in self.features)
        return MiniBatch(features, labels)

    def to_samples(self) -> list[Sample]:
        """The batch as a list of host ``Sample``s."""
        features = [backend.as_numpy(array) for array in self.features]
        labels = None if self.labels is None else backend.as_numpy(self.labels)
        return [
            Sample(tuple(array[i] for array in features), None if labels is None else labels[i])
            for i in range(self.size)
        ]

    def __repr__(self) -> str:
        shapes = [array.shape for array in self.features]
        label_shape = None if self.labels is None else self.labels.shape
        return f"MiniBatch(size={self.size}, feature_shapes={shapes}, label_shape={label_shape})"


def _shapes_text(shapes: tuple[tuple[int, ...], ...]) -> str:
    """One input's shape as ``(28, 28)``; several as ``[(3,), (5,)]``."""
    return str(shapes[0]) if len(shapes) == 1 else str(list(shapes))


def _label_text(label: np.ndarray | None) -> str:
    return "None" if label is None else f"of shape {label.shape}"
