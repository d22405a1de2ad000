"""Gradient clipping: element-wise (slice-local) and by the global L2 norm (two-phase).

``ConstantClipping`` works on any slice alone. ``L2NormClipping`` needs the norm of the WHOLE
gradient, so it is split into two phases a distributed trainer can run across partitions:

1. every partition computes ``sum_of_squares(its_gradient_slice)``;
2. the partial sums are added (one small all-reduce), and every partition scales its own slice
   by ``scale_for(total)``.

Locally, :meth:`L2NormClipping.clip_` does both phases on the whole vector. Both phases give
the same result however the vector is cut, because the scale depends only on the total.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from bigdl_py import backend, device_waits


class ConstantClipping:
    """Clamp every gradient element into ``[min_value, max_value]`` (BigDL's constant clipping).

    Parameters
    ----------
    min_value, max_value : float
        The bounds, ``min_value <= max_value``.
    """

    #: Needs the whole gradient? False: it can run on each slice independently.
    is_global = False

    def __init__(self, min_value: float, max_value: float):
        if not float(min_value) <= float(max_value):
            raise ValueError(
                f"ConstantClipping: min_value must be <= max_value, got min_value={min_value!r}, "
                f"max_value={max_value!r}"
            )
        self.min_value = float(min_value)
        self.max_value = float(max_value)

    def clip_(self, gradient: Any) -> Any:
        """Clamp ``gradient`` (a whole vector or any slice) in place and return it."""
        xp = backend.array_module(gradient)
        return xp.clip(gradient, self.min_value, self.max_value, out=gradient)

    def __repr__(self) -> str:
        return f"ConstantClipping(min_value={self.min_value!r}, max_value={self.max_value!r})"


class L2NormClipping:
    """Scale the gradient so its global L2 norm is at most ``max_norm``.

    The scale is PyTorch's ``clip_grad_norm_``: ``min(1, max_norm / (norm + 1e-6))``.

    Parameters
    ----------
    max_norm : float
        The largest allowed norm, > 0.
    error_if_nonfinite : bool
        Raise when the norm is NaN or infinite, instead of scaling by NaN / 0 as PyTorch does.
    """

    is_global = True

    def __init__(self, max_norm: float, error_if_nonfinite: bool = False):
        if not float(max_norm) > 0:
            raise ValueError(f"L2NormClipping: max_norm must be > 0, got {max_norm!r}")
        self.max_norm = float(max_norm)
        self.error_if_nonfinite = bool(error_if_nonfinite)

    @staticmethod
    def sum_of_squares(gradient_slice: Any) -> float:
        """Phase 1: the squared L2 norm of one slice, accumulated in float64."""
        xp = backend.array_module(gradient_slice)
        # Half-precision squares overflow above 256; square in at least float32.
        if gradient_slice.dtype.itemsize < 4:
            gradient_slice = gradient_slice.astype(np.float32)
        return float(xp.sum(xp.square(gradient_slice), dtype=np.float64))

    def scale_for(self, total_squared_norm: float) -> float:
        """Phase 2: the factor every slice is multiplied by, from the summed squared norms."""
        norm = math.sqrt(total_squared_norm) if total_squared_norm >= 0 else math.nan
        if not math.isfinite(norm) and self.error_if_nonfinite:
            raise self._nonfinite_norm(norm)
        return min(1.0, self.max_norm / (norm + 1e-6)) if not math.isnan(norm) else math.nan

    def clip_slice_(self, gradient_slice: Any, total_squared_norm: float) -> Any:
        """Phase 2 on one slice, in place: multiply it by ``scale_for(total_squared_norm)``."""
        scale = self.scale_for(total_squared_norm)
        if scale != 1.0:
            gradient_slice *= scale
        return gradient_slice

    def clip_(self, gradient: Any) -> Any:
        """Clip the whole gradient vector in place; return its norm before clipping.

        On a device the norm stays there (a 0-d array) and so does the scale, so a training
        step never waits for it; ``error_if_nonfinite`` is then checked at the next sync
        point (``device_waits``).
        """
        if backend.is_device_array(gradient):
            return self._clip_on_device(gradient)
        total = self.sum_of_squares(gradient)
        self.clip_slice_(gradient, total)
        return math.sqrt(total)

    def _clip_on_device(self, gradient: Any) -> Any:
        """``clip_`` with the arithmetic of ``scale_for`` on device scalars."""
        xp = backend.array_module(gradient)
        squares = gradient if gradient.dtype.itemsize >= 4 else gradient.astype(np.float32)
        norm = xp.sqrt(xp.sum(xp.square(squares), dtype=np.float64))
        if self.error_if_nonfinite:
            device_waits.check(
                ~xp.isfinite(norm), lambda value: self._nonfinite_norm(float(value)), norm
            )
        # min(1, ...) propagates a NaN norm, as scale_for does.
        scale = xp.minimum(1.0, self.max_norm / (norm + 1e-6))
        gradient *= scale.astype(gradient.dtype)
        return norm

    @staticmethod
    def _nonfinite_norm(norm: float) -> FloatingPointError:
        return FloatingPointError(
            f"L2NormClipping: the gradient norm is {norm} (a NaN or Inf in the gradient); "
            "lower the learning rate or check the loss"
        )

    def __repr__(self) -> str:
        return f"L2NormClipping(max_norm={self.max_norm!r})"
