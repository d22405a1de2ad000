"""Reproducible randomness for data pipelines: shuffles and per-batch augmentation draws.

Every random choice the data pipeline makes is a pure function of a few integers, so that a
resumed run, or a distributed run that builds each global batch on several partitions,
repeats the same choices exactly:

* the shuffle of epoch ``e`` depends only on ``(seed, e)``;
* the augmentation draws of global batch ``b`` of epoch ``e`` depend only on
  ``(seed, e, b)`` and on the global batch size.

Augmentation draws are dealt out *per sample of the global batch* (:class:`BatchRandom`):
a transform always draws values for the whole global batch and keeps the rows of its share,
so a partition that transforms samples ``start:stop`` of a global batch gets exactly the rows
the local trainer would have used for them. Draws are made on the host with NumPy's
``Generator`` (streams are stable for a given NumPy version; NEP 19 allows them to change
between versions, so exact resumes assume the same NumPy).
"""

from __future__ import annotations

import numpy as np

# Separate streams so that the shuffle and the augmentation draws never share a seed.
_SHUFFLE_STREAM = 0
_AUGMENT_STREAM = 1


def check_seed(seed: int, what: str = "seed") -> int:
    """Return ``seed`` as an int, or raise when it is not a non-negative integer."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {seed!r}")
    return int(seed)


def shuffle_generator(seed: int, epoch: int) -> np.random.Generator:
    """The generator that shuffles epoch ``epoch``; a pure function of ``(seed, epoch)``."""
    return np.random.default_rng([check_seed(seed), check_seed(epoch, "epoch"), _SHUFFLE_STREAM])


def augment_generator(seed: int, epoch: int, batch_index: int) -> np.random.Generator:
    """The generator of global batch ``batch_index`` of epoch ``epoch``."""
    return np.random.default_rng(
        [
            check_seed(seed),
            check_seed(epoch, "epoch"),
            check_seed(batch_index, "batch_index"),
            _AUGMENT_STREAM,
        ]
    )


class BatchRandom:
    """Per-sample random draws for one global batch, restricted to a share of its samples.

    Each draw method draws values for all ``batch_size`` samples of the global batch from
    ``generator`` and returns the rows ``start:stop``. Two shares of the same global batch,
    each with a fresh generator from the same seed, therefore see the same values as the
    whole batch would, as long as they make the same sequence of draws.

    Parameters
    ----------
    generator : numpy.random.Generator
        The source of randomness (see :func:`augment_generator`).
    batch_size : int
        Number of samples in the global batch.
    start, stop : int, optional
        The share of the global batch being transformed (default: all of it).
    """

    def __init__(
        self,
        generator: np.random.Generator,
        batch_size: int,
        start: int = 0,
        stop: int | None = None,
    ):
        stop = batch_size if stop is None else stop
        if not 0 <= start <= stop <= batch_size:
            raise ValueError(
                f"share [{start}, {stop}) is not inside a global batch of {batch_size} samples"
            )
        self.generator = generator
        self.batch_size = int(batch_size)
        self.start = int(start)
        self.stop = int(stop)

    @classmethod
    def for_batch(
        cls,
        seed: int,
        epoch: int,
        batch_index: int,
        batch_size: int,
        start: int = 0,
        stop: int | None = None,
    ) -> BatchRandom:
        """The draws of global batch ``batch_index`` of ``epoch`` (or of its share)."""
        return cls(augment_generator(seed, epoch, batch_index), batch_size, start, stop)

    @property
    def share_size(self) -> int:
        """Number of samples in the share these draws are for."""
        return self.stop - self.start

    def random(self, *per_sample_shape: int) -> np.ndarray:
        """Floats in [0, 1) of shape ``(share_size, *per_sample_shape)``."""
        values = self.generator.random((self.batch_size, *per_sample_shape))
        return values[self.start : self.stop]

    def integers(self, low: int, high: int, *per_sample_shape: int) -> np.ndarray:
        """Integers in [low, high) of shape ``(share_size, *per_sample_shape)``."""
        values = self.generator.integers(low, high, (self.batch_size, *per_sample_shape))
        return values[self.start : self.stop]


RandomLike = BatchRandom | np.random.Generator | int | None


def as_batch_random(rng: RandomLike, batch_size: int) -> BatchRandom:
    """Turn what a user passes as ``rng`` into a :class:`BatchRandom` for ``batch_size`` rows.

    A :class:`BatchRandom` is used as is (its share must have ``batch_size`` rows); a
    ``Generator`` or an integer seed draws for exactly this batch; ``None`` draws fresh,
    non-reproducible randomness.
    """
    if isinstance(rng, BatchRandom):
        if rng.share_size != batch_size:
            raise ValueError(
                f"the random draws are for a share of {rng.share_size} samples "
                f"(rows {rng.start}:{rng.stop} of a global batch of {rng.batch_size}), "
                f"but the batch has {batch_size} samples"
            )
        return rng
    if isinstance(rng, np.random.Generator):
        return BatchRandom(rng, batch_size)
    if rng is None or isinstance(rng, (int, np.integer)):
        return BatchRandom(np.random.default_rng(rng), batch_size)
    raise TypeError(
        "rng must be a BatchRandom, a numpy.random.Generator, an integer seed or None, "
        f"got {type(rng).__name__}"
    )
