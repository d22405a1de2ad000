"""Functional forms of the layer ops: conv2d, pooling, normalisation, dropout, embedding.

Each function validates its settings and applies one fused ``Function`` (see conv.py,
pool.py, norm.py, misc.py); ``bigdl_py.nn`` layers own the parameters and call these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bigdl_py.autograd.ops import conv, misc, norm, pool
from bigdl_py.autograd.ops.misc import manual_seed

__all__ = [
    "avg_pool2d",
    "batch_norm",
    "conv2d",
    "dropout",
    "embedding",
    "layer_norm",
    "manual_seed",
    "max_pool2d",
]

IntOrPair = int | tuple[int, int]


def conv2d(
    x,
    weight,
    bias=None,
    stride: IntOrPair = 1,
    padding: IntOrPair = 0,
    dilation: IntOrPair = 1,
    groups: int = 1,
):
    """2-d cross-correlation (what deep-learning libraries call convolution).

    Parameters
    ----------
    x : Tensor
        Input of shape ``(N, C, H, W)``.
    weight : Tensor
        Kernels of shape ``(O, C / groups, KH, KW)``.
    bias : Tensor, optional
        Shape ``(O,)``.
    stride, padding, dilation : int or (int, int)
        Per-axis settings; padding is zeros on both sides.
    groups : int
        Split the channels into ``groups`` independent convolutions.

    Returns
    -------
    Tensor
        Shape ``(N, O, OH, OW)`` with ``OH = (H + 2*pad - dilation*(KH-1) - 1) // stride + 1``.

    Raises
    ------
    ValueError
        On channel mismatch, ``groups`` not dividing the channels, or a (dilated) kernel
        larger than the padded input.
    """
    inputs = (x, weight) if bias is None else (x, weight, bias)
    return conv.Conv2d.apply(
        *inputs, stride=stride, padding=padding, dilation=dilation, groups=groups
    )


def max_pool2d(x, kernel_size: IntOrPair, stride: IntOrPair | None = None, padding: IntOrPair = 0):
    """Maximum over ``kernel_size`` windows of an ``(N, C, H, W)`` input.

    ``stride`` defaults to ``kernel_size``; padding (at most half the kernel) never wins the
    max. The gradient of each window goes to its first maximum, as in PyTorch.
    """
    return pool.MaxPool2d.apply(x, kernel_size=kernel_size, stride=stride, padding=padding)


def avg_pool2d(x, kernel_size: IntOrPair, stride: IntOrPair | None = None, padding: IntOrPair = 0):
    """Mean over ``kernel_size`` windows of an ``(N, C, H, W)`` input.

    ``stride`` defaults to ``kernel_size``. Zero padding counts in the divisor, like
    PyTorch's ``count_include_pad=True``.
    """
    return pool.AvgPool2d.apply(x, kernel_size=kernel_size, stride=stride, padding=padding)


def dropout(x, p: float = 0.5, training: bool = True, rng: np.random.Generator | None = None):
    """Inverted dropout: zero elements with probability ``p``, scale the rest by 1/(1-p).

    Parameters
    ----------
    x : Tensor
    p : float
        Drop probability in ``[0, 1]``.
    training : bool
        When False (or ``p == 0``) ``x`` is returned unchanged.
    rng : numpy.random.Generator, optional
        Source of the mask; ``None`` uses a module-level generator (see ``manual_seed``).
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    return misc.Dropout.apply(x, p=float(p), rng=rng)


def batch_norm(
    x,
    running_mean: Any,
    running_var: Any,
    weight=None,
    bias=None,
    training: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
):
    """Batch normalisation over axis 1 of ``(N, C)``, ``(N, C, L)`` or ``(N, C, H, W)`` input.

    In training the batch statistics normalise (biased variance) and the running buffers are
    updated IN PLACE: ``running = (1 - momentum) * running + momentum * batch_statistic``,
    with the unbiased variance, as in PyTorch. In evaluation the running statistics are used.

    Parameters
    ----------
    x : Tensor
    running_mean, running_var : Tensor or array of shape (C,), or None
        Buffers; may be None in training (no running statistics are kept).
    weight, bias : Tensor of shape (C,), optional
        Per-channel scale and shift.
    training : bool
    momentum : float
    eps : float
        Added to the variance before the square root.
    """
    affine_inputs = [value for value in (weight, bias) if value is not None]
    return norm.BatchNorm.apply(
        x,
        *affine_inputs,
        affine=(weight is not None, bias is not None),
        running_mean=norm.buffer_array(running_mean),
        running_var=norm.buffer_array(running_var),
        training=training,
        momentum=momentum,
        eps=eps,
    )


def layer_norm(x, normalized_shape: int | Sequence[int], weight=None, bias=None, eps: float = 1e-5):
    """Normalise over the trailing ``normalized_shape`` axes of each sample.

    ``weight`` and ``bias`` (optional) have shape ``normalized_shape``.
    """
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    affine_inputs = [value for value in (weight, bias) if value is not None]
    return norm.LayerNorm.apply(
        x,
        *affine_inputs,
        affine=(weight is not None, bias is not None),
        normalized_shape=tuple(int(s) for s in normalized_shape),
        eps=eps,
    )


def embedding(indices, weight, padding_idx: int | None = None):
    """Rows of ``weight (V, D)`` for integer ``indices`` of any shape; output ``(*shape, D)``.

    The gradient of repeated indices adds up; the row ``padding_idx`` (negative counts from
    the end) gets no gradient.

    Raises
    ------
    IndexError
        When an index is negative or not below ``V``, naming the largest index and ``V``.
    """
    vocabulary = weight.shape[0]
    if padding_idx is not None:
        if not -vocabulary <= padding_idx < vocabulary:
            raise ValueError(
                f"embedding: padding_idx {padding_idx} is outside a vocabulary of {vocabulary}"
            )
        padding_idx %= vocabulary
    return misc.Embedding.apply(indices, weight, padding_idx=padding_idx)
