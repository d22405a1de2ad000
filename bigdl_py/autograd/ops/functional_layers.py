"""Functional forms of the layer ops: conv2d, pooling, normalisation, dropout, embedding.

Each function validates its settings and applies one fused ``Function`` (see conv.py,
pool.py, norm.py, misc.py); ``bigdl_py.nn`` layers own the parameters and call these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bigdl_py.autograd.ops import conv, conv_transpose, misc, norm, pool
from bigdl_py.autograd.ops.misc import manual_seed

__all__ = [
    "avg_pool2d",
    "batch_norm",
    "conv1d",
    "conv2d",
    "conv_transpose2d",
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


def conv1d(x, weight, bias=None, stride: int = 1, padding: int = 0, dilation: int = 1, groups=1):
    """1-d cross-correlation of an ``(N, C, L)`` input with ``weight (O, C / groups, K)``.

    Runs as conv2d on a height-1 image (``(N, C, 1, L)`` with a ``(O, C/g, 1, K)`` kernel), so
    it shares conv2d's gradients and speed. Returns ``(N, O, OL)`` with
    ``OL = (L + 2*padding - dilation*(K-1) - 1) // stride + 1``.

    Raises
    ------
    ValueError
        When ``x`` is not 3-d or ``weight`` not 3-d (naming conv1d and the shape), and for
        the errors of conv2d.
    """
    for name, value in (("input", x), ("weight", weight)):
        if value.ndim != 3:
            layout = "(N, C, L)" if name == "input" else "(out_channels, in_channels/groups, K)"
            raise ValueError(f"conv1d: {name} must be 3-d {layout}, got shape {tuple(value.shape)}")
    settings = {}
    for name, value in (("stride", stride), ("padding", padding), ("dilation", dilation)):
        if isinstance(value, (tuple, list)):
            if len(value) != 1:
                raise ValueError(f"conv1d: {name} must be an int or a 1-tuple, got {value!r}")
            value = value[0]
        settings[name] = (1 if name != "padding" else 0, value)
    image = x.reshape(x.shape[0], x.shape[1], 1, x.shape[2])
    kernel = weight.reshape(weight.shape[0], weight.shape[1], 1, weight.shape[2])
    output = conv2d(image, kernel, bias, groups=groups, **settings)
    return output.reshape(output.shape[0], output.shape[1], output.shape[3])


def conv_transpose2d(
    x,
    weight,
    bias=None,
    stride: IntOrPair = 1,
    padding: IntOrPair = 0,
    output_padding: IntOrPair = 0,
    groups: int = 1,
    dilation: IntOrPair = 1,
):
    """2-d transposed convolution (the adjoint of conv2d in its input), PyTorch's argument order.

    Parameters
    ----------
    x : Tensor
        Input of shape ``(N, C_in, H, W)``.
    weight : Tensor
        Kernels of shape ``(C_in, C_out / groups, KH, KW)``.
    bias : Tensor, optional
        Shape ``(C_out,)``.
    stride, padding, output_padding, dilation : int or (int, int)
        ``output_padding`` (smaller than the stride or the dilation) adds rows and columns at
        the bottom and right of the output.
    groups : int

    Returns
    -------
    Tensor
        Shape ``(N, C_out, OH, OW)`` with
        ``OH = (H - 1)*stride - 2*padding + dilation*(KH - 1) + output_padding + 1``.

    Raises
    ------
    ValueError
        On channel mismatch, ``groups`` not dividing the channels, an ``output_padding`` not
        smaller than the stride or the dilation, or a padding that leaves no output.
    """
    inputs = (x, weight) if bias is None else (x, weight, bias)
    return conv_transpose.ConvTranspose2d.apply(
        *inputs,
        stride=stride,
        padding=padding,
        output_padding=output_padding,
        dilation=dilation,
        groups=groups,
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
