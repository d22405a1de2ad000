"""Layers that only rearrange values: Flatten, Reshape (BigDL's ``Reshape``/``View``), Identity."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bigdl_py.autograd import ops
from bigdl_py.nn.layers._arguments import check_int, is_integer
from bigdl_py.nn.layers._base import label
from bigdl_py.nn.module import Module

__all__ = ["Flatten", "Identity", "Reshape"]


class Identity(Module):
    """Returns its input; takes and ignores any constructor arguments, as PyTorch's does."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class Flatten(Module):
    """Collapse axes ``start_dim`` to ``end_dim`` (inclusive) into one.

    Parameters
    ----------
    start_dim : int
        First axis to collapse (default 1, keeping the batch axis).
    end_dim : int
        Last axis to collapse (default -1, the last).
    """

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim = check_int(start_dim, "start_dim", "Flatten")
        self.end_dim = check_int(end_dim, "end_dim", "Flatten")

    def forward(self, x):
        shape = tuple(x.shape)
        rank = max(len(shape), 1)
        start, end = self.start_dim, self.end_dim
        if not (-rank <= start < rank and -rank <= end < rank):
            raise ValueError(
                f"{label(self)}: dims out of range for input of shape {shape} ({rank} axes)"
            )
        start, end = start % rank, end % rank
        if start > end:
            raise ValueError(
                f"{label(self)}: start_dim comes after end_dim for input of shape {shape}"
            )
        if not shape:
            return ops.reshape(x, (1,))
        collapsed = math.prod(shape[start : end + 1])
        return ops.reshape(x, shape[:start] + (collapsed,) + shape[end + 1 :])

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Reshape(Module):
    """Reshape each sample to ``shape``, keeping the batch axis (BigDL's ``Reshape``).

    Parameters
    ----------
    shape : sequence of int
        The per-sample shape; one entry may be -1 (inferred). The output has shape
        ``(N, *shape)``.

    Notes
    -----
    BigDL's ``Reshape(size, batch_mode=None)`` guesses whether the first axis is a batch;
    ours always keeps it. Use ``Flatten`` for ``(N, ...) -> (N, -1)``.
    """

    def __init__(self, shape: Sequence[int]):
        super().__init__()
        if is_integer(shape):
            shape = (shape,)
        sizes = tuple(shape) if isinstance(shape, (tuple, list, np.ndarray)) else None
        if sizes is None or not all(map(is_integer, sizes)):
            raise ValueError(f"Reshape: shape must be a sequence of integers, got {shape!r}")
        self.shape = tuple(int(size) for size in sizes)
        if self.shape.count(-1) > 1 or any(size < -1 or size == 0 for size in self.shape):
            raise ValueError(
                f"Reshape: shape must hold positive sizes and at most one -1, got {shape!r}"
            )

    def forward(self, x):
        shape = tuple(x.shape)
        if not shape:
            raise ValueError(f"{label(self)}: expects a batch (N, ...) input, got a scalar")
        per_sample = math.prod(shape[1:])
        known = math.prod(size for size in self.shape if size != -1)
        fits = per_sample % known == 0 if -1 in self.shape else per_sample == known
        if not fits:
            raise ValueError(
                f"{label(self)}: cannot reshape input of shape {shape} ({per_sample} values "
                f"per sample) to per-sample shape {self.shape}"
            )
        return ops.reshape(x, (shape[0], *self.shape))

    def extra_repr(self) -> str:
        return f"shape={self.shape}"
