"""Channel dropout (PyTorch's ``dropout2d``): zero whole feature maps, scale the rest.

Neighbouring positions of a convolutional feature map are strongly correlated, so dropping
single elements hardly regularises; dropping whole channels does (Tompson et al., 2015).
The mask has one draw per (sample, channel), broadcast over the spatial axes.
"""

from __future__ import annotations

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.function import Function
from bigdl_py.autograd.ops.misc import _uniform

__all__ = ["dropout2d"]


class ChannelDropout(Function):
    """Zero each ``(sample, channel)`` map with probability ``p``; scale the rest by 1/(1-p)."""

    def forward(self, x, p=0.5, rng=None):
        backend.check_floating(x.dtype, "dropout2d")
        # Drawn by the same generator, in the same float32 way, as element dropout's masks.
        mask_shape = x.shape[:2] + (1,) * (x.ndim - 2)
        keep = _uniform(mask_shape, x, rng) >= p
        scale = x.dtype.type(1.0 / (1.0 - p)) if p < 1 else x.dtype.type(0)
        self.scaled_keep = keep * scale  # (N, C, 1, 1): small, so keep it scaled
        return x * self.scaled_keep

    def backward(self, grad):
        return grad * self.scaled_keep

    def _release_extra(self) -> None:
        self.scaled_keep = None


def dropout2d(x, p: float = 0.5, training: bool = True, rng: np.random.Generator | None = None):
    """Zero whole channels of ``(N, C, H, W)`` (or ``(N, C, L)``) input with probability ``p``.

    Parameters
    ----------
    x : Tensor
    p : float
        Drop probability in ``[0, 1]``.
    training : bool
        When False (or ``p == 0``) ``x`` is returned unchanged.
    rng : numpy.random.Generator, optional
        Source of the mask; ``None`` uses the generator shared with ``dropout`` (see
        ``manual_seed``).
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout2d: p must be in [0, 1], got {p}")
    if x.ndim not in (3, 4):
        raise ValueError(
            f"dropout2d: input must be (N, C, H, W) or (N, C, L), got shape {tuple(x.shape)}"
        )
    if not training or p == 0.0:
        return x
    return ChannelDropout.apply(x, p=float(p), rng=rng)
