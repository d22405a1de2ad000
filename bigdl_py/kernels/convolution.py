"""2-d convolution's data movement on a device: one im2col kernel, one col2im kernel, and
the two layout changes around the GEMMs (``cuda/convolution.cu``).

The host route builds columns with strided copies and adds col2im back one kernel tap at a
time (KH*KW array operations); here each is one kernel. ``geometry`` is the 13 ints
``(C, H, W, KH, KW, pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w, OH, OW)``.
The ``*_reference`` functions are the kernels in NumPy (inputs as the arrays the ops pass).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bigdl_py.kernels.compiler import Kernel, elementwise_blocks, run

_GEOMETRY = ("int",) * 13
IM2COL = Kernel(
    "convolution", "im2col", ("index", "const real*", "index", "index") + _GEOMETRY + ("real*",)
)
COL2IM = Kernel(
    "convolution", "col2im", ("index", "const real*", "index", "index") + _GEOMETRY + ("real*",)
)
STORE = Kernel(
    "convolution",
    "conv_store",
    ("index", "const real*", "const real*", "int", "index", "index", "index", "index", "real*"),
)
GATHER = Kernel(
    "convolution",
    "conv_gather",
    ("index", "const real*", "index", "index", "index", "index", "real*"),
)


def _tap_view(padded, kh, kw, geometry):
    """The ``(T, C, OH, OW)`` values kernel tap ``(kh, kw)`` reads of a padded tile."""
    _, _, _, _, _, _, _, sh, sw, dh, dw, oh, ow = geometry
    return padded[
        :, :, kh * dh : kh * dh + sh * (oh - 1) + 1 : sh, kw * dw : kw * dw + sw * (ow - 1) + 1 : sw
    ]


def im2col_reference(total, x, first, samples, *arguments):
    *geometry, columns = arguments
    c, h, w, kh_count, kw_count, ph, pw = geometry[:7]
    oh, ow = geometry[11:]
    tile = x.reshape(-1, c, h, w)[first : first + samples]
    padded = np.pad(tile, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    taps = columns.reshape(c, kh_count, kw_count, samples, oh, ow)
    for kh in range(kh_count):
        for kw in range(kw_count):
            taps[:, kh, kw] = np.swapaxes(_tap_view(padded, kh, kw, geometry), 0, 1)


def col2im_reference(total, columns, first, samples, *arguments):
    *geometry, x_grad = arguments
    c, h, w, kh_count, kw_count, ph, pw = geometry[:7]
    oh, ow = geometry[11:]
    padded = np.zeros((samples, c, h + 2 * ph, w + 2 * pw), dtype=columns.dtype)
    taps = columns.reshape(c, kh_count, kw_count, samples, oh, ow)
    for kh in range(kh_count):
        for kw in range(kw_count):
            _tap_view(padded, kh, kw, geometry)[...] += np.swapaxes(taps[:, kh, kw], 0, 1)
    x_grad.reshape(-1, c, h, w)[first : first + samples] = padded[:, :, ph : ph + h, pw : pw + w]


def store_reference(total, product, bias, has_bias, first, samples, out_channels, area, out):
    values = np.swapaxes(product.reshape(out_channels, samples, area), 0, 1)
    if has_bias:
        values = values + bias.reshape(1, out_channels, 1)
    out.reshape(-1, out_channels, area)[first : first + samples] = values


def gather_reference(total, grad, first, samples, out_channels, area, matrix):
    tile = grad.reshape(-1, out_channels, area)[first : first + samples]
    matrix.reshape(out_channels, samples, area)[...] = np.swapaxes(tile, 0, 1)


REFERENCES = {
    IM2COL: im2col_reference,
    COL2IM: col2im_reference,
    STORE: store_reference,
    GATHER: gather_reference,
}


def im2col(x: Any, first: int, samples: int, geometry: tuple, columns: Any) -> None:
    """Write the tile's columns ``(C*KH*KW, samples*OH*OW)`` into ``columns``."""
    run(IM2COL, im2col_reference, elementwise_blocks(columns.size), x.dtype, columns.size, x,
        first, samples, *geometry, columns)  # fmt: skip


def col2im(columns: Any, first: int, samples: int, geometry: tuple, x_grad: Any) -> None:
    """Write the tile's input gradient ``x_grad[first:first + samples]`` from ``columns``."""
    c, h, w = geometry[:3]
    total = samples * c * h * w
    run(COL2IM, col2im_reference, elementwise_blocks(total), columns.dtype, total, columns,
        first, samples, *geometry, x_grad)  # fmt: skip


def store(product: Any, bias: Any, first: int, samples: int, out: Any) -> None:
    """``out[first:first + samples]`` (NCHW) from the tile's ``(O, samples*OH*OW)`` product."""
    out_channels = out.shape[1]
    area = out.size // (out.shape[0] * out_channels)
    total = samples * out_channels * area
    run(STORE, store_reference, elementwise_blocks(total), out.dtype, total, product,
        product if bias is None else bias, int(bias is not None), first, samples, out_channels,
        area, out)  # fmt: skip


def gather(grad: Any, first: int, samples: int, matrix: Any) -> None:
    """The tile ``grad[first:first + samples]`` (NCHW) as ``(O, samples*OH*OW)``."""
    out_channels = grad.shape[1]
    area = grad.size // (grad.shape[0] * out_channels)
    run(GATHER, gather_reference, elementwise_blocks(matrix.size), grad.dtype, matrix.size, grad,
        first, samples, out_channels, area, matrix)  # fmt: skip
