"""3x3 stride-1 convolutions by Winograd's minimal filtering F(2x2, 3x3), tile by tile.

Each 2x2 block of outputs is computed from the 4x4 block of input around it with 16
multiplications per input channel instead of 36 (Lavin and Gray, "Fast Algorithms for
Convolutional Neural Networks", 2016):

    Y = A^T [ (G g G^T) * (B^T d B) ] A

where ``d`` is the 4x4 input block, ``g`` the 3x3 kernel and ``*`` the element-wise product.
Summed over the input channels, the element-wise products become 16 matrix products, one
per position of the 4x4 transformed block: ``M[p] (O, P) = U[p] (O, C) @ V[p] (C, P)`` for
``P`` blocks. The transforms are additions only (and halvings of the kernel, exact in
binary), so the result differs from the direct sum only in rounding: in float32 the
largest error relative to the largest output was 3-7e-7 on ResNet-18's layers, as the
im2col GEMMs' 5-6e-7.

``convolve`` (``conv.py``) takes this route where it pays: 3x3 kernels, stride and
dilation 1, one group, and enough channels that the 16 products run near the GEMM's peak.
"""

from __future__ import annotations

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.ops.conv_tiles import (
    for_each_tile,
    scratch_array,
    tile_size,
    worker_count,
)

# Fewest input and output channels for the Winograd route: the 16 products are
# (O, C) @ (C, P) GEMMs, which OpenBLAS ran at 56-73 GFLOP/s with C = O = 32-64 against
# 95-103 with 128-512, and the transforms weigh more against thin GEMMs. Forward, batch 64,
# CPU ms at one thread against the im2col GEMMs: 512x4x4 52.7 -> 33.9, 256x8x8 52.6 ->
# 33.8, 128x16x16 57.2 -> 42.9, but 64x16x16 16.5 -> 17.4 and 64x32x32 61.8 -> 73.1.
MIN_CHANNELS = 128

# G, the kernel transform: U = G g G^T.
_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
# kron(G, G): row 4 a + b, column 3 i + j is G[a, i] G[b, j] (products of 0, 1/2, 1: exact).
_GG = np.kron(_G, _G)


def applies(weight_shape, stride, dilation, groups, on_gpu, dtype) -> bool:
    """Whether ``convolve`` of these shapes takes the Winograd route (floating point only:
    the kernel transform halves values)."""
    out_channels, in_per_group, kernel_h, kernel_w = weight_shape
    return (
        not on_gpu
        and np.dtype(dtype).kind == "f"
        and (kernel_h, kernel_w) == (3, 3)
        and tuple(stride) == (1, 1)
        and tuple(dilation) == (1, 1)
        and groups == 1
        and min(in_per_group, out_channels) >= MIN_CHANNELS
    )


def kernel_transform(weight):
    """``U = G g G^T`` for every (output, input) channel pair: ``(16, O, C)``, the position
    ``4 * a + b`` of the 4x4 block first; ``G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2],
    [0, 0, 1]]``.

    One GEMM, ``kron(G, G) (16, 9) @ g^T (9, O*C)``, reading the kernel where it lies (the
    taps of one channel pair are its 9 contiguous values): transposing it first to ``(3, 3,
    O, C)`` took 9 ms for ResNet-18's 512x512 kernel, this 1-2.
    """
    xp = backend.array_module(weight)
    out_channels, channels = weight.shape[:2]
    both = xp.asarray(_GG, dtype=weight.dtype)
    transformed = xp.empty((16, out_channels, channels), dtype=weight.dtype)

    def work(first, stop, _scratch):
        taps = weight[first:stop].reshape((stop - first) * channels, 9)
        xp.matmul(both, taps.T, out=transformed[:, first:stop].reshape(16, -1))

    # Split over the output channels among the threads when it is worth it (ResNet-18's
    # 512x512 kernel: 2-4 ms at one thread).
    size = out_channels
    if out_channels * channels >= 1 << 16:
        size = -(-out_channels // worker_count())
    for_each_tile(out_channels, size, work)
    return transformed


def convolve(x, weight, before, padded_hw, bias=None):
    """``conv.convolve`` for a 3x3 kernel, stride and dilation 1, one group (see module).

    A tile's input is laid out ``(C, Hf, 2, Wf/2, T)``: the frame's columns split into even
    and odd ones, the samples innermost, so every slice the transforms read and write is a
    contiguous run of ``blocks * T`` values rather than every other one.
    """
    xp = backend.array_module(x)
    batch, channels = x.shape[:2]
    out_channels = weight.shape[0]
    out_hw = (padded_hw[0] - 2, padded_hw[1] - 2)
    blocks, per_sample, size = _block_layout(x, out_hw)
    output = xp.empty((batch, out_channels) + out_hw, dtype=x.dtype)
    transformed_kernel = kernel_transform(weight)

    def work(start, stop, scratch):
        points = (stop - start) * per_sample
        transformed = _transformed_input(x, start, stop, before, padded_hw, blocks, scratch)
        product = scratch_array(scratch, "M", (16, out_channels, points), x.dtype)
        xp.matmul(transformed_kernel, transformed.reshape(16, channels, points), out=product)
        _output_transform(
            product.reshape((4, 4, out_channels) + blocks + (stop - start,)),
            output,
            start,
            stop,
            bias,
            scratch,
        )

    for_each_tile(batch, size, work)
    return output


def _block_layout(x, out_hw):
    """``(blocks, blocks per sample, samples per tile)`` for an output of ``out_hw``: the
    2x2 output blocks along each axis (an odd extent takes one more, half outside)."""
    blocks = ((out_hw[0] + 1) // 2, (out_hw[1] + 1) // 2)
    per_sample = blocks[0] * blocks[1]
    size = tile_size(x.shape[0], 16 * x.shape[1] * per_sample * x.itemsize, worker_count(), False)
    return blocks, per_sample, size


def _transformed_input(x, start, stop, before, padded_hw, blocks, scratch):
    """``V = B^T d B`` for every 4x4 input block of samples ``[start, stop)``: ``(4, 4, C,
    blocks_h, blocks_w, T)`` in the tile's scratch."""
    # The frame holds every block's 4x4 input: a row or column of zeros more when the
    # output has an odd extent.
    frame_hw = (2 * blocks[0] + 2, 2 * blocks[1] + 2)
    frame = _frame(x, start, stop, before, padded_hw, frame_hw, scratch)
    shape = (4, 4, x.shape[1]) + blocks + (stop - start,)
    transformed = scratch_array(scratch, "V", shape, x.dtype)
    _input_transform(frame, blocks, transformed, scratch)
    return transformed


def _frame(x, start, stop, before, padded_hw, frame_hw, scratch):
    """``x[start:stop]`` zero-bordered ``before`` in, as ``(C, Hf, 2, Wf/2, T)``: column
    ``2 j + parity`` of the frame at ``[:, :, parity, j]``.

    Rows and columns of ``x`` beyond ``padded_hw`` are dropped (a transposed convolution's
    input gradient reaches no further); the frame may be a row and a column larger.
    """
    tile = stop - start
    channels, height, width = x.shape[1:]
    shape = (channels, frame_hw[0], 2, frame_hw[1] // 2, tile)
    frame = scratch_array(scratch, f"winograd-frame-{tile}", shape, x.dtype, zeroed=True)
    height = min(height, padded_hw[0] - before[0])
    width = min(width, padded_hw[1] - before[1])
    source = np.moveaxis(x[start:stop, :, :height, :width], 0, -1)  # (C, H, W, T)
    rows = frame[:, before[0] : before[0] + height]
    for parity in range(2):
        first = (before[1] + parity) % 2  # the source's first column of this parity
        column = (before[1] + first) // 2  # where it lands
        count = len(range(first, width, 2))
        rows[:, :, parity, column : column + count] = source[:, :, first::2]
    return frame


def _input_transform(frame, blocks, out, scratch) -> None:
    """``V = B^T d B`` of every 4x4 block of ``frame (C, Hf, 2, Wf/2, T)`` into ``out (4, 4,
    C, bh, bw, T)``; ``B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]``."""
    rows_h = 2 * blocks[0] - 1
    rows = [frame[:, k : k + rows_h : 2] for k in range(4)]  # (C, bh, 2, Wf/2, T) each
    mixed = scratch_array(scratch, "rows", (4,) + rows[0].shape, frame.dtype)
    np.subtract(rows[0], rows[2], out=mixed[0])
    np.add(rows[1], rows[2], out=mixed[1])
    np.subtract(rows[2], rows[1], out=mixed[2])
    np.subtract(rows[1], rows[3], out=mixed[3])
    width = blocks[1]
    # Frame column 2 j + k is [parity k % 2, j + k // 2].
    cols = [mixed[:, :, :, k % 2, k // 2 : k // 2 + width] for k in range(4)]
    np.subtract(cols[0], cols[2], out=out[:, 0])
    np.add(cols[1], cols[2], out=out[:, 1])
    np.subtract(cols[2], cols[1], out=out[:, 2])
    np.subtract(cols[1], cols[3], out=out[:, 3])


def _output_transform(product, output, start, stop, bias, scratch) -> None:
    """``Y = A^T M A`` of ``product (4, 4, O, bh, bw, T)`` into ``output[start:stop]``
    (cropped to its height and width), plus ``bias``; ``A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]``.
    """
    out_channels, block_h, block_w, tile = product.shape[2:]
    half = scratch_array(scratch, "half", (2,) + product.shape[1:], product.dtype)
    np.add(product[0], product[1], out=half[0])
    half[0] += product[2]
    np.subtract(product[1], product[2], out=half[1])
    half[1] -= product[3]
    blocks = scratch_array(
        scratch, "Y", (out_channels, block_h, 2, block_w, 2, tile), product.dtype
    )
    for row in range(2):
        first, second = blocks[:, :, row, :, 0], blocks[:, :, row, :, 1]
        np.add(half[row, 0], half[row, 1], out=first)
        first += half[row, 2]
        np.subtract(half[row, 1], half[row, 2], out=second)
        second -= half[row, 3]
    height, width = output.shape[2:]
    values = blocks.reshape(out_channels, 2 * block_h, 2 * block_w, tile)[:, :height, :width]
    samples = np.moveaxis(values, -1, 0)
    if bias is None:
        output[start:stop] = samples
    else:
        np.add(samples, bias.reshape(1, -1, 1, 1), out=output[start:stop])


def weight_gradient(x, grad, weight_shape, before, padded_hw, with_bias=False):
    """``conv.convolution_weight_gradient`` on the Winograd route: ``(weight_grad, bias_grad
    or None)`` given the output's gradient ``grad (N, O, OH, OW)``.

    The forward is linear in ``U = G g G^T``, so ``dL/dU = sum over blocks of (A dY A^T) *
    V`` (``*`` element-wise): 16 GEMMs ``(O, P) @ (P, C)`` summed over the tiles, then
    ``dL/dg = G^T (dL/dU) G``, one GEMM with ``kron(G, G)``.
    """
    xp = backend.array_module(x)
    batch, channels = x.shape[:2]
    out_channels = weight_shape[0]
    blocks, per_sample, size = _block_layout(x, grad.shape[2:])

    def work(start, stop, scratch):
        points = (stop - start) * per_sample
        transformed = _transformed_input(x, start, stop, before, padded_hw, blocks, scratch)
        spread = _gradient_transform(grad, start, stop, blocks, scratch, with_bias)
        # (16, O, P) @ (16, P, C): the transformed gradient against the transformed input.
        columns = xp.swapaxes(transformed.reshape(16, channels, points), 1, 2)
        if "dU" in scratch:
            partial = scratch_array(scratch, "dU-part", (16, out_channels, channels), x.dtype)
            xp.matmul(spread.reshape(16, out_channels, points), columns, out=partial)
            scratch["dU"] += partial
        else:
            # A buffer of its own (not a kept one): it is summed across threads after.
            scratch["dU"] = xp.matmul(spread.reshape(16, out_channels, points), columns)

    parts = [part for part in for_each_tile(batch, size, work) if "dU" in part]
    if not parts:  # an empty batch
        bias_grad = xp.zeros(out_channels, dtype=x.dtype) if with_bias else None
        return xp.zeros(weight_shape, dtype=x.dtype), bias_grad
    both = xp.asarray(_GG, dtype=x.dtype)
    weight_grad = xp.empty(weight_shape, dtype=x.dtype)
    rows = weight_grad.reshape(out_channels * channels, 9)

    def finish(first, stop, _scratch):
        # The threads' sums for output channels [first, stop), then (O*C, 16) @ (16, 9):
        # the kernel's layout (O, C, 3, 3) directly.
        block = parts[0]["dU"][:, first:stop]
        for part in parts[1:]:
            block += part["dU"][:, first:stop]
        xp.matmul(block.reshape(16, -1).T, both, out=rows[first * channels : stop * channels])

    # Split over the output channels like the kernel transform (ResNet-18's 512x512: two
    # 17 MB sums and a GEMM reading them, 2-3 ms at one thread).
    size = out_channels
    if out_channels * channels >= 1 << 16:
        size = -(-out_channels // worker_count())
    for_each_tile(out_channels, size, finish)
    bias_grad = None
    if with_bias:
        bias_grad = parts[0]["bias"]
        for part in parts[1:]:
            bias_grad += part["bias"]
    return weight_grad, bias_grad


def _gradient_transform(grad, start, stop, blocks, scratch, with_bias):
    """``A dY A^T`` of every 2x2 block of ``grad[start:stop]`` as ``(4, 4, O, bh, bw, T)``;
    ``A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]``. Outputs past the gradient's height or width
    (a cut block) count as zeros. With ``with_bias`` adds the tile's per-channel sums of
    ``grad`` into ``scratch["bias"]``.

    The tile is first laid out ``(O, bh, 2, 2, bw, T)``, the block's row and column ahead
    of the blocks, so that each pass reads and writes runs of ``bw * T`` values.
    """
    tile = stop - start
    out_channels, height, width = grad.shape[1:]
    values = scratch_array(
        scratch,
        f"grad-{tile}",
        (out_channels, blocks[0], 2, 2, blocks[1], tile),
        grad.dtype,
        zeroed=bool(height % 2 or width % 2),
    )
    for row in range(2):
        for col in range(2):
            part = grad[start:stop, :, row::2, col::2]  # (T, O, h, w)
            values[:, : part.shape[2], row, col, : part.shape[3]] = np.moveaxis(part, 0, -1)
    if with_bias:
        sums = values.reshape(out_channels, -1).sum(axis=1)
        if "bias" in scratch:
            scratch["bias"] += sums
        else:
            scratch["bias"] = sums
    first, second = values[:, :, 0], values[:, :, 1]  # (O, bh, 2, bw, T)
    rows = scratch_array(scratch, "grad-rows", (2,) + first.shape, grad.dtype)
    np.add(first, second, out=rows[0])
    np.subtract(first, second, out=rows[1])
    spread = scratch_array(
        scratch, "grad-spread", (4, 4, out_channels) + tuple(blocks) + (tile,), grad.dtype
    )
    # Rows of A dY: y0, y0 + y1, y0 - y1 and -y1, the last one's sign folded into its
    # columns below.
    for a, mixed in enumerate((first, rows[0], rows[1], second)):
        left, right = mixed[:, :, 0], mixed[:, :, 1]  # (O, bh, bw, T)
        out = spread[a]
        if a == 3:  # the columns of -y1
            np.negative(left, out=out[0])
            np.add(left, right, out=out[1])
            np.negative(out[1], out=out[1])
            np.subtract(right, left, out=out[2])
            out[3] = right
        else:
            out[0] = left
            np.add(left, right, out=out[1])
            np.subtract(left, right, out=out[2])
            np.negative(right, out=out[3])
    return spread
