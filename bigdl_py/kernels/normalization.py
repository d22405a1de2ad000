"""Batch norm and layer norm in two kernels a direction (``cuda/normalization.cu``).

Batch norm's forward: the channels' statistics (and the running ones' update), then the
normalised, scaled output; its backward: the channels' gradient sums, then the input's
gradient. Layer norm's forward is one kernel, its backward two (the input's gradient per
row, the affine parameters' per column). The backward kernels recompute the normalised
input from ``x``, the mean and ``1/std``: nothing of the input's size is kept but ``x``.
The ``*_reference`` functions are the kernels in NumPy, with the kernels' parameters.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.kernels.compiler import Kernel, elementwise_blocks, row_blocks, row_threads, run

_SHAPE = ("index", "index", "index")
BATCH_NORM_STATISTICS = Kernel(
    "normalization",
    "batch_norm_statistics",
    _SHAPE + ("const real*",) + ("real*",) * 4 + ("int", "real", "real", "real", "real"),
)
BATCH_NORM_FORWARD = Kernel(
    "normalization",
    "batch_norm_forward",
    _SHAPE + ("const real*",) * 5 + ("int", "int", "real*"),
)
BATCH_NORM_BACKWARD_REDUCE = Kernel(
    "normalization",
    "batch_norm_backward_reduce",
    _SHAPE + ("const real*",) * 4 + ("real*", "real*"),
)
BATCH_NORM_BACKWARD_INPUT = Kernel(
    "normalization",
    "batch_norm_backward_input",
    _SHAPE + ("const real*",) * 5 + ("int", "const real*", "const real*", "real", "int", "real*"),
)
LAYER_NORM_FORWARD = Kernel(
    "normalization",
    "layer_norm_forward",
    ("index", "index") + ("const real*",) * 3 + ("int", "int", "real") + ("real*",) * 3,
)
LAYER_NORM_BACKWARD_INPUT = Kernel(
    "normalization",
    "layer_norm_backward_input",
    ("index", "index") + ("const real*",) * 5 + ("int", "real*"),
)
LAYER_NORM_BACKWARD_AFFINE = Kernel(
    "normalization",
    "layer_norm_backward_affine",
    ("index", "index") + ("const real*",) * 4 + ("real*", "real*", "int", "int"),
)


# --- the references ----------------------------------------------------------------------------


def _channels(array, batch, channels, inner):
    return array.reshape(batch, channels, inner)


def _per_channel(vector):
    return vector.reshape(1, -1, 1)


def batch_norm_statistics_reference(
    batch, channels, inner, x, mean, inv_std, running_mean, running_var, update_running, eps,
    momentum, one_minus_momentum, unbias,
):  # fmt: skip
    real = x.dtype.type
    values = _channels(x, batch, channels, inner)
    count = real(batch * inner)
    average = values.sum(axis=(0, 2)) / count
    centered = values - _per_channel(average)
    variance = (centered * centered).sum(axis=(0, 2)) / count
    mean[...] = average
    inv_std[...] = real(1) / np.sqrt(variance + real(eps))
    if update_running:
        momentum, one_minus_momentum, unbias = (
            real(momentum),
            real(one_minus_momentum),
            real(unbias),
        )
        running_mean[...] = running_mean * one_minus_momentum + momentum * average
        running_var[...] = running_var * one_minus_momentum + momentum * (variance * unbias)


def batch_norm_forward_reference(
    total, channels, inner, x, mean, inv_std, weight, bias, has_weight, has_bias, out
):
    batch = total // (channels * inner)
    value = (_channels(x, batch, channels, inner) - _per_channel(mean)) * _per_channel(inv_std)
    if has_weight:
        value = value * _per_channel(weight)
    if has_bias:
        value = value + _per_channel(bias)
    _channels(out, batch, channels, inner)[...] = value


def batch_norm_backward_reduce_reference(
    batch, channels, inner, grad, x, mean, inv_std, grad_sum, grad_dot
):
    g = _channels(grad, batch, channels, inner)
    normalized = (_channels(x, batch, channels, inner) - _per_channel(mean)) * _per_channel(inv_std)
    grad_sum[...] = g.sum(axis=(0, 2))
    grad_dot[...] = (g * normalized).sum(axis=(0, 2))


def batch_norm_backward_input_reference(
    total, channels, inner, grad, x, mean, inv_std, weight, has_weight, grad_sum, grad_dot,
    count, training, grad_x,
):  # fmt: skip
    batch = total // (channels * inner)
    g = _channels(grad, batch, channels, inner)
    scale = _per_channel(inv_std * weight if has_weight else inv_std)
    if training:
        count = x.dtype.type(count)
        normalized = (_channels(x, batch, channels, inner) - _per_channel(mean)) * _per_channel(
            inv_std
        )
        value = normalized * _per_channel(-grad_dot / count)
        value = value + g
        value = value - _per_channel(grad_sum / count)
        _channels(grad_x, batch, channels, inner)[...] = value * scale
    else:
        _channels(grad_x, batch, channels, inner)[...] = g * scale


def layer_norm_forward_reference(
    rows, width, x, weight, bias, has_weight, has_bias, eps, out, mean, inv_std
):
    real = x.dtype.type
    values = x.reshape(rows, width)
    average = values.sum(axis=1, keepdims=True) / real(width)
    centered = values - average
    scale = real(1) / np.sqrt(
        (centered * centered).sum(axis=1, keepdims=True) / real(width) + real(eps)
    )
    value = centered * scale
    if has_weight:
        value = value * weight.reshape(width)
    if has_bias:
        value = value + bias.reshape(width)
    out.reshape(rows, width)[...] = value
    mean[...] = average.reshape(rows)
    inv_std[...] = scale.reshape(rows)


def _normalized_rows(x, mean, inv_std, rows, width):
    return (x.reshape(rows, width) - mean[:, None]) * inv_std[:, None]


def layer_norm_backward_input_reference(
    rows, width, grad, x, mean, inv_std, weight, has_weight, grad_x
):
    real = x.dtype.type
    g = grad.reshape(rows, width)
    scaled = g * weight.reshape(width) if has_weight else g
    normalized = _normalized_rows(x, mean, inv_std, rows, width)
    average = scaled.sum(axis=1, keepdims=True) / real(width)
    projection = (scaled * normalized).sum(axis=1, keepdims=True) / real(width)
    grad_x.reshape(rows, width)[...] = ((scaled - average) - normalized * projection) * inv_std[
        :, None
    ]


def layer_norm_backward_affine_reference(
    rows, width, grad, x, mean, inv_std, grad_weight, grad_bias, has_weight, has_bias
):
    g = grad.reshape(rows, width)
    if has_weight:
        grad_weight.reshape(width)[...] = (g * _normalized_rows(x, mean, inv_std, rows, width)).sum(
            axis=0
        )
    if has_bias:
        grad_bias.reshape(width)[...] = g.sum(axis=0)


REFERENCES = {
    BATCH_NORM_STATISTICS: batch_norm_statistics_reference,
    BATCH_NORM_FORWARD: batch_norm_forward_reference,
    BATCH_NORM_BACKWARD_REDUCE: batch_norm_backward_reduce_reference,
    BATCH_NORM_BACKWARD_INPUT: batch_norm_backward_input_reference,
    LAYER_NORM_FORWARD: layer_norm_forward_reference,
    LAYER_NORM_BACKWARD_INPUT: layer_norm_backward_input_reference,
    LAYER_NORM_BACKWARD_AFFINE: layer_norm_backward_affine_reference,
}


# --- what the ops call -------------------------------------------------------------------------


def _launch(kernel: Kernel, blocks: int, dtype, *arguments, threads: int | None = None) -> None:
    options = {} if threads is None else {"threads": threads}
    run(kernel, REFERENCES[kernel], blocks, dtype, *arguments, **options)


def _geometry(x: Any) -> tuple[int, int, int]:
    batch, channels = x.shape[0], x.shape[1]
    return batch, channels, x.size // max(batch * channels, 1)


def _or(array: Any, stand_in: Any) -> Any:
    """``array``, or a stand-in the kernel will not read (it takes a pointer either way)."""
    return stand_in if array is None else array


def batch_norm_statistics(
    x: Any, running_mean: Any, running_var: Any, eps: float, momentum: float
) -> tuple[Any, Any]:
    """The channels' mean and 1/std of ``x (N, C, ...)``, contiguous; updates the running
    statistics in place when they are given."""
    xp = backend.array_module(x)
    batch, channels, inner = _geometry(x)
    mean = xp.empty(channels, dtype=x.dtype)
    inv_std = xp.empty(channels, dtype=x.dtype)
    update = running_mean is not None and running_var is not None
    count = batch * inner
    _launch(
        BATCH_NORM_STATISTICS,
        row_blocks(channels),
        x.dtype,
        batch,
        channels,
        inner,
        x,
        mean,
        inv_std,
        _or(running_mean, mean),
        _or(running_var, inv_std),
        int(update),
        eps,
        momentum,
        1 - momentum,
        count / (count - 1) if count > 1 else 1.0,
        threads=row_threads(count),
    )
    return mean, inv_std


def batch_norm_forward(x: Any, mean: Any, inv_std: Any, weight: Any, bias: Any) -> Any:
    xp = backend.array_module(x)
    batch, channels, inner = _geometry(x)
    out = xp.empty_like(x)
    _launch(
        BATCH_NORM_FORWARD,
        elementwise_blocks(x.size),
        x.dtype,
        x.size,
        channels,
        inner,
        x,
        mean,
        inv_std,
        _or(weight, mean),
        _or(bias, mean),
        int(weight is not None),
        int(bias is not None),
        out,
    )
    return out


def batch_norm_backward(
    grad: Any, x: Any, mean: Any, inv_std: Any, weight: Any, training: bool, needs: tuple
) -> tuple[Any, Any, Any]:
    """``(grad_x, grad_sum, grad_dot)``: each None where ``needs`` (x, sums, dots) says so."""
    xp = backend.array_module(x)
    grad = xp.ascontiguousarray(grad)
    batch, channels, inner = _geometry(x)
    want_x, want_sums, want_dots = needs
    grad_sum = grad_dot = grad_x = None
    if want_sums or want_dots or (want_x and training):
        grad_sum = xp.empty(channels, dtype=x.dtype)
        grad_dot = xp.empty(channels, dtype=x.dtype)
        _launch(
            BATCH_NORM_BACKWARD_REDUCE,
            row_blocks(channels),
            x.dtype,
            batch,
            channels,
            inner,
            grad,
            x,
            mean,
            inv_std,
            grad_sum,
            grad_dot,
            threads=row_threads(batch * inner),
        )
    if want_x:
        grad_x = xp.empty_like(x)
        _launch(
            BATCH_NORM_BACKWARD_INPUT,
            elementwise_blocks(x.size),
            x.dtype,
            x.size,
            channels,
            inner,
            grad,
            x,
            mean,
            inv_std,
            _or(weight, mean),
            int(weight is not None),
            _or(grad_sum, mean),
            _or(grad_dot, mean),
            batch * inner,
            int(training),
            grad_x,
        )
    return grad_x, grad_sum if want_sums else None, grad_dot if want_dots else None


def layer_norm_forward(x: Any, width: int, weight: Any, bias: Any, eps: float):
    """``(out, mean, inv_std)`` of ``x`` normalised over its last ``width`` values."""
    xp = backend.array_module(x)
    rows = x.size // width
    out = xp.empty_like(x)
    mean = xp.empty(rows, dtype=x.dtype)
    inv_std = xp.empty(rows, dtype=x.dtype)
    _launch(
        LAYER_NORM_FORWARD,
        row_blocks(rows),
        x.dtype,
        rows,
        width,
        x,
        _or(weight, x),
        _or(bias, x),
        int(weight is not None),
        int(bias is not None),
        eps,
        out,
        mean,
        inv_std,
        threads=row_threads(width),
    )
    return out, mean, inv_std


def layer_norm_backward(
    grad: Any, x: Any, mean: Any, inv_std: Any, weight: Any, width: int, needs: tuple
) -> tuple[Any, Any, Any]:
    """``(grad_x, grad_weight, grad_bias)``, each None where ``needs`` says so."""
    xp = backend.array_module(x)
    grad = xp.ascontiguousarray(grad)
    rows = x.size // width
    want_x, want_weight, want_bias = needs
    grad_x = grad_weight = grad_bias = None
    if want_x:
        grad_x = xp.empty_like(x)
        _launch(
            LAYER_NORM_BACKWARD_INPUT,
            row_blocks(rows),
            x.dtype,
            rows,
            width,
            grad,
            x,
            mean,
            inv_std,
            _or(weight, x),
            int(weight is not None),
            grad_x,
            threads=row_threads(width),
        )
    if want_weight or want_bias:
        grad_weight = xp.empty(width, dtype=x.dtype) if want_weight else None
        grad_bias = xp.empty(width, dtype=x.dtype) if want_bias else None
        _launch(
            LAYER_NORM_BACKWARD_AFFINE,
            row_blocks(width),
            x.dtype,
            rows,
            width,
            grad,
            x,
            mean,
            inv_std,
            _or(grad_weight, mean),
            _or(grad_bias, mean),
            int(want_weight),
            int(want_bias),
            threads=row_threads(rows),
        )
    return grad_x, grad_weight, grad_bias
