"""``ArrayDataset``: an in-memory dataset over NumPy arrays that yields ``MiniBatch``es.

Batch composition has one source of truth, :meth:`ArrayDataset.global_batch_indices`: the
shuffle of epoch ``e`` is a pure function of ``(seed, e)``, so a run resumed from a
checkpoint, or a distributed run that cuts every global batch across partitions, sees
exactly the batches a single uninterrupted local run sees.

Last-batch policy: when the number of samples is not a multiple of the batch size, the last
batch of an epoch is smaller (``drop_last=False``, the default) or left out
(``drop_last=True``). With ``drop_last=True`` and fewer samples than one batch, an epoch has
no batches.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.data import validation
from bigdl_py.data.sample import MiniBatch, Sample
from bigdl_py.data.seeding import BatchRandom, check_seed, shuffle_generator
from bigdl_py.data.transforms import Transform, as_transform

_OPTION_NAMES = ("batch_size", "shuffle", "seed", "drop_last", "transforms", "train")


def _check_batch_size(batch_size: Any) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(f"batch_size must be an integer, got {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return int(batch_size)


class ArrayDataset:
    """Samples held in memory as arrays whose first axis indexes the samples.

    Parameters
    ----------
    features : array_like or sequence of arrays
        One array of shape ``(n, ...)``, or a tuple (or list) of such arrays for a model
        with several inputs.
    labels : array_like, optional
        Shape ``(n,)`` or ``(n, ...)``; integer (class indices) or float (regression), kept
        in the dtype given. ``None`` for inference data.
    batch_size : int
        Default batch size of :meth:`batches`.
    shuffle : bool
        Shuffle the samples each epoch (a pure function of ``(seed, epoch)``).
    seed : int
        Seed of the shuffles and of the random transforms.
    drop_last : bool
        Leave out the last batch of an epoch when it is smaller than ``batch_size``.
    transforms : Transform or list of Transform, optional
        Applied to the first feature array of every batch (a list is composed in order).
    train : bool
        Default of ``augment`` in :meth:`batches`: when ``False``, training-only
        transforms (random crops, flips) are skipped.
    check_finite : bool
        Refuse NaN or infinity in float features and labels.
    num_classes : int, optional
        Refuse labels outside ``[0, num_classes)``.

    Raises
    ------
    ValueError
        On mismatched lengths, non-finite values, labels out of range or bad options,
        naming the array and the sample.
    TypeError
        On non-numeric arrays.
    """

    def __init__(
        self,
        features: Any,
        labels: Any = None,
        batch_size: int = 32,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        transforms: Transform | Sequence[Transform] | None = None,
        *,
        train: bool = True,
        check_finite: bool = True,
        num_classes: int | None = None,
    ):
        arrays = features if isinstance(features, (tuple, list)) else (features,)
        if not arrays:
            raise ValueError("ArrayDataset needs at least one feature array")
        if isinstance(features, list) and not all(hasattr(a, "shape") for a in features):
            # A nested Python list is far more likely one array than several inputs.
            raise TypeError(
                "features is a list of non-arrays; pass one array (np.asarray(features)) or "
                "a tuple of arrays, one per model input"
            )
        self.features = tuple(np.asarray(backend.as_numpy(array)) for array in arrays)
        self.labels = None if labels is None else np.asarray(backend.as_numpy(labels))
        named = {self._feature_name(i): array for i, array in enumerate(self.features)}
        if self.labels is not None:
            named["labels"] = self.labels
        for name, array in named.items():
            validation.check_numeric(array, name)
        self._length = validation.check_same_length(named)
        if check_finite:
            for name, array in named.items():
                validation.check_finite(array, name)
        if num_classes is not None:
            if self.labels is None:
                raise ValueError("num_classes was given but the dataset has no labels")
            validation.check_label_range(self.labels, num_classes)
        self.num_classes = num_classes
        self._set_options(
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            transforms=transforms,
            train=train,
        )

    def _set_options(self, **options: Any) -> None:
        for name, value in options.items():
            if name == "batch_size":
                value = _check_batch_size(value)
            elif name == "seed":
                value = check_seed(value)
            elif name == "transforms":
                name, value = "transform", as_transform(value)
            elif name in ("shuffle", "drop_last", "train"):
                value = bool(value)
            else:
                raise TypeError(f"unknown ArrayDataset option {name!r}; options: {_OPTION_NAMES}")
            setattr(self, name, value)

    def _feature_name(self, index: int) -> str:
        return "features" if len(self.features) == 1 else f"features[{index}]"

    # --- size and shape -----------------------------------------------------------------
    def __len__(self) -> int:
        return self._length

    @property
    def num_inputs(self) -> int:
        """Number of feature arrays (model inputs)."""
        return len(self.features)

    @property
    def feature_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Shape of one sample of each feature array (without the samples axis)."""
        return tuple(array.shape[1:] for array in self.features)

    def num_batches(self, batch_size: int | None = None) -> int:
        """Batches per epoch, following the last-batch policy (``drop_last``)."""
        batch_size = self.batch_size if batch_size is None else _check_batch_size(batch_size)
        full, remainder = divmod(len(self), batch_size)
        return full + (1 if remainder and not self.drop_last else 0)

    # --- batch composition --------------------------------------------------------------
    def permutation(self, epoch: int) -> np.ndarray:
        """Sample order of ``epoch``: a pure function of ``(seed, epoch)`` (identity when
        ``shuffle`` is off)."""
        check_seed(epoch, "epoch")
        if not self.shuffle:
            return np.arange(len(self), dtype=np.int64)
        return shuffle_generator(self.seed, epoch).permutation(len(self)).astype(np.int64)

    def global_batch_indices(self, epoch: int, batch_size: int | None = None) -> list[np.ndarray]:
        """Sample indices of every batch of ``epoch``, in order.

        This is the single definition of batch composition: :meth:`batches` uses it, and a
        distributed trainer cuts each of these index arrays across its partitions.
        """
        batch_size = self.batch_size if batch_size is None else _check_batch_size(batch_size)
        order = self.permutation(epoch)
        batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
        if self.drop_last and batches and len(batches[-1]) < batch_size:
            batches.pop()
        return batches

    def batches(
        self, epoch: int = 0, batch_size: int | None = None, augment: bool | None = None
    ) -> Iterator[MiniBatch]:
        """Yield the batches of ``epoch`` in order.

        Parameters
        ----------
        epoch : int
            Selects the shuffle and the random-transform draws.
        batch_size : int, optional
            Overrides the dataset's ``batch_size``.
        augment : bool, optional
            Run training-only transforms; defaults to the dataset's ``train`` flag.
        """
        augment = self.train if augment is None else augment
        for batch_index, indices in enumerate(self.global_batch_indices(epoch, batch_size)):
            random = BatchRandom.for_batch(self.seed, epoch, batch_index, len(indices))
            yield self.take(indices, random, augment)

    def __iter__(self) -> Iterator[Sample]:
        """The samples in stored order (no shuffle, no transforms)."""
        for index in range(len(self)):
            yield self.sample(index)

    def batch(
        self,
        epoch: int,
        batch_index: int,
        batch_size: int | None = None,
        *,
        augment: bool | None = None,
        start: int = 0,
        stop: int | None = None,
    ) -> MiniBatch:
        """Global batch ``batch_index`` of ``epoch``, or its samples ``start:stop``.

        A share built this way equals the same rows of the whole batch, random transforms
        included, so partitions that each build their share reproduce the local batch.
        """
        all_indices = self.global_batch_indices(epoch, batch_size)
        if not 0 <= batch_index < len(all_indices):
            raise IndexError(
                f"batch_index {batch_index} is out of range: epoch {epoch} has "
                f"{len(all_indices)} batches"
            )
        indices = all_indices[batch_index]
        random = BatchRandom.for_batch(self.seed, epoch, batch_index, len(indices), start, stop)
        augment = self.train if augment is None else augment
        return self.take(indices[random.start : random.stop], random, augment)

    def take(
        self, indices: Any, random: BatchRandom | None = None, augment: bool = False
    ) -> MiniBatch:
        """The samples at ``indices`` as a MiniBatch, with the dataset's transforms applied.

        Parameters
        ----------
        indices : array_like of int
            Sample indices, in batch order.
        random : BatchRandom, optional
            The random draws for these rows (see :meth:`BatchRandom.for_batch`); without
            it, random transforms draw fresh, non-reproducible values.
        augment : bool
            Run training-only transforms.
        """
        indices = np.asarray(indices, dtype=np.int64)
        features = [array[indices] for array in self.features]
        if self.transform is not None:
            features[0] = self.transform(features[0], random, augment=augment)
        labels = None if self.labels is None else self.labels[indices]
        return MiniBatch(tuple(features), labels)

    # --- samples and subsets ------------------------------------------------------------
    def sample(self, index: int) -> Sample:
        """Sample ``index`` as stored (no transforms)."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"sample index {index} is out of range for {len(self)} samples")
        label = None if self.labels is None else self.labels[index]
        return Sample(tuple(array[index] for array in self.features), label)

    def to_samples(self) -> list[Sample]:
        """Every sample, in stored order."""
        return list(self)

    @classmethod
    def from_samples(cls, samples: Sequence[Sample], **options: Any) -> ArrayDataset:
        """Stack ``Sample``s into a dataset; ``options`` go to the constructor."""
        stacked = MiniBatch.from_samples(samples)
        return cls(stacked.features, stacked.labels, **options)

    def with_options(self, **options: Any) -> ArrayDataset:
        """A copy sharing the arrays, with some of ``batch_size``, ``shuffle``, ``seed``,
        ``drop_last``, ``transforms``, ``train`` changed."""
        changed = copy.copy(self)
        changed._set_options(**options)
        return changed

    def subset(self, indices: Any) -> ArrayDataset:
        """The samples at ``indices`` (copied), with this dataset's options."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.ndim != 1:
            raise ValueError(f"subset indices must be 1-D, got shape {indices.shape}")
        if len(indices) and (indices.min() < -len(self) or indices.max() >= len(self)):
            raise IndexError(f"subset indices out of range for {len(self)} samples")
        subset = copy.copy(self)
        subset.features = tuple(array[indices] for array in self.features)
        subset.labels = None if self.labels is None else self.labels[indices]
        subset._length = len(indices)
        return subset

    def split(self, fraction: float, seed: int = 0) -> tuple[ArrayDataset, ArrayDataset]:
        """Randomly split into ``(train, validation)``.

        Parameters
        ----------
        fraction : float
            Share of the samples in the first (training) part, in (0, 1); the count is
            rounded to the nearest integer.
        seed : int
            Seed of the split (independent of the shuffle seed).

        Returns
        -------
        (ArrayDataset, ArrayDataset)
            The training part keeps this dataset's options; the validation part has
            ``train=False`` and ``shuffle=False`` (no augmentation, stable order).
        """
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"split fraction must be in (0, 1), got {fraction}")
        order = np.random.default_rng(check_seed(seed)).permutation(len(self))
        first_count = int(round(fraction * len(self)))
        if not 0 < first_count < len(self):
            raise ValueError(
                f"split({fraction}) of {len(self)} samples leaves an empty part "
                f"({first_count} and {len(self) - first_count} samples)"
            )
        train = self.subset(np.sort(order[:first_count]))
        validation_part = self.subset(np.sort(order[first_count:]))
        return train, validation_part.with_options(train=False, shuffle=False)

    def __repr__(self) -> str:
        return (
            f"ArrayDataset({len(self)} samples, feature_shapes={self.feature_shapes}, "
            f"labels={'None' if self.labels is None else self.labels.dtype}, "
            f"batch_size={self.batch_size}, shuffle={self.shuffle}, seed={self.seed}, "
            f"drop_last={self.drop_last}, train={self.train}, transforms={self.transform!r})"
        )
