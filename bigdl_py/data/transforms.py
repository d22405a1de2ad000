"""Batch transforms: vectorised over the batch axis, reproducible through an explicit rng.

A transform takes a whole feature batch (``(N, C, H, W)`` for images) and returns a new one;
no Python loop runs over the samples. Random transforms draw their per-sample choices from
a :class:`~bigdl_py.data.seeding.BatchRandom`, which the dataset derives from
``(seed, epoch, batch index)``, so the same batch is augmented the same way every time it
is built, on one machine or split over several partitions.

Transforms marked ``training_only`` (random crops and flips) are skipped when a batch is
built for evaluation (``augment=False``); deterministic ones (``ToFloat``, ``Normalize``)
always run. Every transform works on NumPy and on CuPy batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.data.seeding import BatchRandom, RandomLike, as_batch_random


class Transform:
    """Base class of batch transforms.

    Subclasses implement :meth:`apply`; calling the transform handles the ``rng`` argument
    and the skipping of training-only transforms.
    """

    #: Skipped when a batch is built for evaluation (random augmentation).
    training_only: bool = False

    def __call__(self, batch: Any, rng: RandomLike = None, *, augment: bool = True) -> Any:
        """Transform ``batch``.

        Parameters
        ----------
        batch : array
            Feature batch with the samples along axis 0.
        rng : BatchRandom, numpy.random.Generator, int or None
            Source of the random draws (ignored by deterministic transforms).
        augment : bool
            ``False`` skips training-only transforms (evaluation batches).
        """
        if self.training_only and not augment:
            return batch
        return self.apply(batch, as_batch_random(rng, len(batch)))

    def apply(self, batch: Any, random: BatchRandom) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement apply(batch, random)")

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in vars(self).items())
        return f"{type(self).__name__}({options})"


class Compose(Transform):
    """Apply transforms in order; they share one stream of random draws."""

    def __init__(self, transforms: Sequence[Transform]):
        transforms = list(transforms)
        for position, transform in enumerate(transforms):
            if not isinstance(transform, Transform):
                raise TypeError(
                    f"Compose: item {position} ({type(transform).__name__}) is not a Transform"
                )
        self.transforms = transforms

    def __call__(self, batch: Any, rng: RandomLike = None, *, augment: bool = True) -> Any:
        random = as_batch_random(rng, len(batch))
        for transform in self.transforms:
            batch = transform(batch, random, augment=augment)
        return batch

    def apply(self, batch: Any, random: BatchRandom) -> Any:
        return self(batch, random)

    def __repr__(self) -> str:
        return f"Compose({self.transforms!r})"


class ToFloat(Transform):
    """Convert to a float dtype and multiply by ``scale`` (default: bytes to [0, 1])."""

    def __init__(self, scale: float = 1.0 / 255.0, dtype: Any = np.float32):
        if not backend.is_floating(dtype):
            raise ValueError(f"ToFloat: dtype must be a float dtype, got {np.dtype(dtype)}")
        self.scale = float(scale)
        self.dtype = np.dtype(dtype)

    def apply(self, batch: Any, random: BatchRandom) -> Any:
        xp = backend.array_module(batch)
        return xp.asarray(batch, dtype=self.dtype) * self.dtype.type(self.scale)


class Normalize(Transform):
    """Subtract ``mean`` and divide by ``std``, per channel (axis 1) or for all values.

    Parameters
    ----------
    mean, std : float or sequence of float
        One value, or one per channel of the batch's axis 1.

    Notes
    -----
    The result keeps the batch's float dtype; integer batches become float32.
    """

    def __init__(self, mean: float | Sequence[float], std: float | Sequence[float]):
        mean_values = np.atleast_1d(np.asarray(mean, dtype=np.float64))
        std_values = np.atleast_1d(np.asarray(std, dtype=np.float64))
        if mean_values.ndim != 1 or std_values.ndim != 1:
            raise ValueError("Normalize: mean and std must be scalars or 1-D sequences")
        if len(mean_values) != len(std_values) and 1 not in (len(mean_values), len(std_values)):
            raise ValueError(
                f"Normalize: mean has {len(mean_values)} channels but std has {len(std_values)}"
            )
        if not np.all(std_values > 0):
            raise ValueError(f"Normalize: every std must be > 0, got {std_values.tolist()}")
        self.mean = mean_values
        self.std = std_values

    def apply(self, batch: Any, random: BatchRandom) -> Any:
        xp = backend.array_module(batch)
        dtype = batch.dtype if backend.is_floating(batch.dtype) else np.dtype(np.float32)
        channels = max(len(self.mean), len(self.std))
        if channels > 1 and (batch.ndim < 2 or batch.shape[1] != channels):
            raise ValueError(
                f"Normalize: mean/std have {channels} channels but the batch of shape "
                f"{batch.shape} has {batch.shape[1] if batch.ndim >= 2 else 'no'} channels "
                "on axis 1"
            )
        # Shape (1, C, 1, ...) so the statistics broadcast over samples and positions, and
        # cast to the batch dtype so float32 batches do not promote to float64.
        stats_shape = (1, -1) + (1,) * (batch.ndim - 2) if channels > 1 else (1,)
        mean = xp.asarray(self.mean.reshape(stats_shape), dtype=dtype)
        std = xp.asarray(self.std.reshape(stats_shape), dtype=dtype)
        return (xp.asarray(batch, dtype=dtype) - mean) / std

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean.tolist()}, std={self.std.tolist()})"


def _image_batch_check(name: str, batch: Any) -> None:
    if batch.ndim not in (3, 4):
        raise ValueError(
            f"{name}: expected an image batch of shape (N, C, H, W) or (N, H, W), "
            f"got shape {batch.shape}"
        )


class RandomCrop(Transform):
    """Pad each image with zeros, then cut a random ``size`` window (training only).

    Parameters
    ----------
    size : int or (int, int)
        Height and width of the crop.
    padding : int
        Zeros added on every side before cropping (``RandomCrop(28, padding=4)`` on
        28x28 images shifts each image by up to 4 pixels and keeps its shape).
    """

    training_only = True

    def __init__(self, size: int | tuple[int, int], padding: int = 0):
        height, width = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
        if height < 1 or width < 1:
            raise ValueError(f"RandomCrop: size must be positive, got {size!r}")
        if padding < 0:
            raise ValueError(f"RandomCrop: padding must be >= 0, got {padding}")
        self.size = (int(height), int(width))
        self.padding = int(padding)

    def apply(self, batch: Any, random: BatchRandom) -> Any:
        _image_batch_check("RandomCrop", batch)
        xp = backend.array_module(batch)
        images = batch[:, None] if batch.ndim == 3 else batch
        pad = self.padding
        padded = xp.pad(images, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else images
        height, width = self.size
        spare_rows = padded.shape[2] - height
        spare_cols = padded.shape[3] - width
        if spare_rows < 0 or spare_cols < 0:
            raise ValueError(
                f"RandomCrop: crop {self.size} is larger than the padded images "
                f"{padded.shape[2:]} (batch shape {batch.shape}, padding {pad})"
            )
        top = xp.asarray(random.integers(0, spare_rows + 1))
        left = xp.asarray(random.integers(0, spare_cols + 1))
        rows = top[:, None] + xp.arange(height)[None, :]
        cols = left[:, None] + xp.arange(width)[None, :]
        sample_index = xp.arange(len(images))[:, None, None]
        # One gather: advanced indices on axes 0, 2, 3 (split by the channel slice) put the
        # (N, height, width) index shape first and the channels last.
        crops = padded[sample_index, :, rows[:, :, None], cols[:, None, :]]
        crops = xp.ascontiguousarray(xp.moveaxis(crops, -1, 1))
        return crops[:, 0] if batch.ndim == 3 else crops


class RandomHorizontalFlip(Transform):
    """Mirror each image left-right with probability ``p`` (training only)."""

    training_only = True

    def __init__(self, p: float = 0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip: p must be in [0, 1], got {p}")
        self.p = float(p)

    def apply(self, batch: Any, random: BatchRandom) -> Any:
        if batch.ndim < 2:
            raise ValueError(
                f"RandomHorizontalFlip: expected images with a width axis, got shape {batch.shape}"
            )
        xp = backend.array_module(batch)
        flip = xp.asarray(random.random() < self.p)
        flipped = batch.copy()
        flipped[flip] = batch[flip][..., ::-1]
        return flipped


def as_transform(transforms: Transform | Sequence[Transform] | None) -> Transform | None:
    """``None``, one transform, or a list of them (composed in order) -> one Transform."""
    if transforms is None or isinstance(transforms, Transform):
        return transforms
    if isinstance(transforms, (list, tuple)):
        return Compose(transforms)
    raise TypeError(
        "transforms must be a Transform, a list of Transforms or None, "
        f"got {type(transforms).__name__}"
    )
