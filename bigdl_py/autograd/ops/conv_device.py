"""2-d convolution on a device: per tile of samples one im2col kernel, one GEMM for every
group (strided-batched when there are several) and one kernel into NCHW; the gradients
alike, with col2im as one kernel.

The host's route (``conv.py``) is built for CPU caches and threads: strided copies, per-op
scratch zeroed anew, col2im one kernel tap at a time, 3-d products that copy their operands.
On a GPU each of those is a launch or an allocation, and the step is bound by them. Here the
columns come from one kernel that writes the padding's zeros itself, every product is a 2-d
GEMM on contiguous operands or their transposes (cuBLAS takes a transpose as a flag: no copy)
on the package's own cuBLAS handle (``cublas.matmul``: a CUDA graph can capture it, CuPy's
``matmul`` it cannot), and the buffers come from ``kernels.scratch``, kept from one op to
the next.

A tile holds as many samples as fit ``TILE_BYTES`` of columns: one tile for the bench's
layers at their batches, a few for the largest.
"""

from __future__ import annotations

from bigdl_py import backend
from bigdl_py.autograd.ops import cublas
from bigdl_py.kernels import convolution as kernels_convolution
from bigdl_py.kernels.scratch import scratch

# Bytes of columns a tile may take (the GEMM's right operand).
TILE_BYTES = 256 << 20


def _geometry(x_shape, weight_shape, stride, padding, dilation, out_hw) -> tuple:
    _, channels, height, width = x_shape
    return (
        channels, height, width, weight_shape[2], weight_shape[3], padding[0], padding[1],
        stride[0], stride[1], dilation[0], dilation[1], out_hw[0], out_hw[1],
    )  # fmt: skip


def _tiles(batch: int, rows: int, area: int, itemsize: int):
    """``(first, samples)`` of each tile of the batch."""
    per_sample = max(rows * area * itemsize, 1)
    size = max(1, min(batch, TILE_BYTES // per_sample))
    for first in range(0, batch, size):
        yield first, min(size, batch - first)


def convolve(x, weight, bias, stride, padding, dilation, groups, out_hw):
    """``conv2d`` forward: ``(N, O, OH, OW)``."""
    xp = backend.array_module(x)
    x = xp.ascontiguousarray(x)
    batch = x.shape[0]
    out_channels = weight.shape[0]
    geometry = _geometry(x.shape, weight.shape, stride, padding, dilation, out_hw)
    area = out_hw[0] * out_hw[1]
    rows = weight[0].size * groups  # C * KH * KW
    grouped_weight = xp.ascontiguousarray(weight).reshape(groups, out_channels // groups, -1)
    out = xp.empty((batch, out_channels) + tuple(out_hw), dtype=x.dtype)
    for first, samples in _tiles(batch, rows, area, x.itemsize):
        width = samples * area
        columns = scratch("conv columns", (groups, rows // groups, width), x.dtype, x)
        kernels_convolution.im2col(x, first, samples, geometry, columns)
        product = scratch("conv product", (groups, out_channels // groups, width), x.dtype, x)
        cublas.matmul(grouped_weight, columns, out=product)
        kernels_convolution.store(product, bias, first, samples, out)
    return out


def gradients(x, weight, grad, stride, padding, dilation, groups, needs):
    """``(grad_x, grad_weight, grad_bias)`` of ``convolve``; ``needs`` says which (each
    None where not needed)."""
    xp = backend.array_module(x)
    x = xp.ascontiguousarray(x)
    grad = xp.ascontiguousarray(grad)
    need_x, need_weight, need_bias = needs
    batch, out_channels = x.shape[0], weight.shape[0]
    out_hw = grad.shape[2:]
    geometry = _geometry(x.shape, weight.shape, stride, padding, dilation, out_hw)
    area = out_hw[0] * out_hw[1]
    rows = weight[0].size * groups
    per_group = (out_channels // groups, rows // groups)
    grouped_weight = xp.ascontiguousarray(weight).reshape(groups, *per_group)
    grad_x = xp.empty_like(x) if need_x else None
    grad_weight = xp.empty((groups, *per_group), dtype=x.dtype) if need_weight else None
    grad_bias = None
    for first, samples in _tiles(batch, rows, area, x.itemsize):
        width = samples * area
        grad_matrix = scratch("conv gradient", (groups, per_group[0], width), x.dtype, x)
        kernels_convolution.gather(grad, first, samples, grad_matrix)
        if need_bias:
            sums = grad_matrix.reshape(out_channels, width).sum(axis=1)
            grad_bias = sums if grad_bias is None else grad_bias + sums
        if need_weight:
            columns = scratch("conv columns", (groups, per_group[1], width), x.dtype, x)
            kernels_convolution.im2col(x, first, samples, geometry, columns)
            # The first tile's product is the gradient; later tiles' are added to it.
            partial = grad_weight
            if first:
                partial = scratch("conv weight part", (groups, *per_group), x.dtype, x)
            cublas.matmul(grad_matrix, xp.swapaxes(columns, 1, 2), out=partial)
            if first:
                grad_weight += partial
        if need_x:
            column_grad = scratch("conv column gradient", (groups, per_group[1], width), x.dtype, x)
            cublas.matmul(xp.swapaxes(grouped_weight, 1, 2), grad_matrix, out=column_grad)
            kernels_convolution.col2im(column_grad, first, samples, geometry, grad_x)
    if grad_weight is not None:
        grad_weight = grad_weight.reshape(weight.shape)
    return grad_x, grad_weight, grad_bias
