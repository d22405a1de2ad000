"""2-d max and average pooling over NCHW input.

Both ops loop over the ``KH*KW`` kernel offsets only: each offset is one strided view of the
(padded) input with the output's shape, and every step is one vectorised array operation.
For the common stride == kernel without padding this is the reshape ``(N, C, OH, KH, OW,
KW)`` fast path without building that view: the offset views are its slices, the input is
not copied, and the backward writes each view once instead of adding. (Reducing the 6-d
reshape over its two kernel axes with ``max(axis=(3, 5))`` was measured 30x slower with
NumPy 2.4, which reduces small non-adjacent axes element by element.)

On the CPU both run tile by tile over the batch on the BLAS thread count's worth of threads
(``conv_tiles.for_each_tile``, as convolutions do), every step writing into preallocated
tiles with ``out=`` instead of allocating temporaries.
"""

from __future__ import annotations

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.function import Function
from bigdl_py.autograd.ops.conv import offset_slices, output_size, pad_spatial, pair
from bigdl_py.autograd.ops.conv_tiles import for_each_tile, scratch_array, tile_size, worker_count


def _pool_geometry(x, kernel_size, stride, padding, op_name: str):
    """Validate settings; return kernel, stride, padding and output height/width."""
    if x.ndim != 4:
        raise ValueError(f"{op_name}: input must be 4-d (N, C, H, W), got shape {tuple(x.shape)}")
    kernel = pair(kernel_size, "kernel_size", op_name)
    stride = kernel if stride is None else pair(stride, "stride", op_name)
    padding = pair(padding, "padding", op_name)
    if min(kernel) < 1 or min(stride) < 1:
        raise ValueError(
            f"{op_name}: kernel_size and stride must be >= 1, got {kernel} and {stride}"
        )
    if any(padding[a] < 0 or 2 * padding[a] > kernel[a] for a in (0, 1)):
        raise ValueError(
            f"{op_name}: padding must be between 0 and half the kernel size, got padding "
            f"{padding} for kernel_size {kernel}"
        )
    out_hw = tuple(output_size(x.shape[2 + a], kernel[a], stride[a], padding[a]) for a in (0, 1))
    if min(out_hw) < 1:
        raise ValueError(
            f"{op_name}: kernel_size {kernel} is larger than the padded input (input shape "
            f"{tuple(x.shape)}, padding {padding})"
        )
    return kernel, stride, padding, out_hw


def _kernel_offsets(kernel):
    return [(row, col) for row in range(kernel[0]) for col in range(kernel[1])]


def _for_tiles(array, work, bytes_per_sample: int | None = None) -> None:
    """Run ``work(start, stop, scratch)`` over batch tiles of ``array`` (see conv_tiles),
    sized by ``bytes_per_sample`` (by default, of ``array``'s samples)."""
    on_gpu = backend.is_device_array(array)
    if bytes_per_sample is None:
        bytes_per_sample = array[0].size * array.itemsize
    size = tile_size(array.shape[0], bytes_per_sample, worker_count(), on_gpu)
    for_each_tile(array.shape[0], size, work, on_gpu)


def _unpad(grad_padded, padding, input_shape):
    height, width = input_shape[2:]
    return grad_padded[:, :, padding[0] : padding[0] + height, padding[1] : padding[1] + width]


class _Pool2d(Function):
    """Shared geometry and backward scatter of both pools."""

    def _setup(self, x, kernel_size, stride, padding, op_name):
        kernel, stride, padding, out_hw = _pool_geometry(x, kernel_size, stride, padding, op_name)
        self.kernel, self.stride, self.padding, self.out_hw = kernel, stride, padding, out_hw
        self.input_shape = x.shape
        # Windows never overlap: each input element gets at most one contribution.
        self.disjoint = stride[0] >= kernel[0] and stride[1] >= kernel[1]
        # ... and they cover the whole input: every element gets exactly one.
        self.tiling = (
            stride == kernel
            and padding == (0, 0)
            and all(out_hw[a] * kernel[a] == x.shape[2 + a] for a in (0, 1))
        )

    def _scatter(self, grad, contribute):
        """Sum per-offset gradients into the (padded) input's shape and crop the padding.

        ``contribute(start, stop, position, scratch, out)`` writes the gradient that kernel
        offset number ``position`` sends back from output tile ``[start, stop)`` into ``out``.
        """
        xp = backend.array_module(grad)
        batch, channels, height, width = self.input_shape
        padded_shape = (batch, channels, height + 2 * self.padding[0], width + 2 * self.padding[1])
        # When the windows tile the input every element is written below: skip the zeroing.
        allocate = xp.empty if self.tiling else xp.zeros
        grad_padded = allocate(padded_shape, dtype=grad.dtype)
        offsets = _kernel_offsets(self.kernel)

        def work(start, stop, scratch):
            target = grad_padded[start:stop]
            for position, offset in enumerate(offsets):
                window = target[
                    (slice(None), slice(None)) + offset_slices(offset, self.stride, self.out_hw)
                ]
                if self.disjoint:
                    contribute(start, stop, position, scratch, window)
                else:
                    shape = (stop - start,) + grad.shape[1:]
                    contribution = scratch_array(scratch, "contribution", shape, grad.dtype, xp)
                    contribute(start, stop, position, scratch, contribution)
                    window += contribution

        # Tiles sized by what they write, the input's gradient (4x the output's for 2x2
        # windows): sized by the output's, the CIFAR CNN's second max-pool (1 MB of output
        # gradient) ran as one tile, 0.85 ms at two threads against 0.57 in four tiles, and
        # LeNet-5's first 0.44 against 0.33-0.36 (medians of 300).
        _for_tiles(grad, work, grad_padded[0].size * grad_padded.itemsize)
        return _unpad(grad_padded, self.padding, self.input_shape)

    def _views(self, padded, start, stop):
        """The strided view each kernel offset reads, for the output tile ``[start, stop)``."""
        tile = padded[start:stop]
        return [
            tile[(slice(None), slice(None)) + offset_slices(offset, self.stride, self.out_hw)]
            for offset in _kernel_offsets(self.kernel)
        ]


class MaxPool2d(_Pool2d):
    """Max over each window; the gradient goes to the first maximum (like PyTorch)."""

    def forward(self, x, kernel_size=2, stride=None, padding=0):
        self._setup(x, kernel_size, stride, padding, "max_pool2d")
        xp = backend.array_module(x)
        # Padding with -inf (or the lowest integer) never wins the max, as in PyTorch.
        fill = -np.inf if backend.is_floating(x.dtype) else np.iinfo(x.dtype).min
        padded = pad_spatial(x, self.padding, fill)
        out_shape = x.shape[:2] + self.out_hw
        best = xp.empty(out_shape, dtype=x.dtype)
        # The winning offset as a small integer: 1 byte per output, where PyTorch keeps int64.
        index_dtype = np.uint8 if self.kernel[0] * self.kernel[1] <= 255 else np.int32
        winner = xp.empty(out_shape, dtype=index_dtype)

        def work(start, stop, scratch):
            views = self._views(padded, start, stop)
            tile_best, tile_winner = best[start:stop], winner[start:stop]
            tile_best[...] = views[0]
            tile_winner[...] = 0
            better = scratch_array(scratch, "better", tile_best.shape, bool, xp)
            step = scratch_array(scratch, "step", tile_best.shape, index_dtype, xp)
            for position, view in enumerate(views[1:], start=1):
                # Strictly greater: on ties the earlier offset keeps the gradient. winner +=
                # better * (position - winner): arithmetic is ~50x faster than a boolean-mask
                # assignment in NumPy, and position > winner so nothing wraps around.
                xp.greater(view, tile_best, out=better)
                xp.subtract(index_dtype(position), tile_winner, out=step)
                xp.multiply(step, better, out=step)
                xp.add(tile_winner, step, out=tile_winner)
                xp.maximum(tile_best, view, out=tile_best)

        _for_tiles(x, work)
        self.save_for_backward(winner)
        return best

    def backward(self, grad):
        (winner,) = self.saved
        xp = backend.array_module(grad)

        def contribute(start, stop, position, scratch, out):
            mask = scratch_array(scratch, "mask", out.shape, bool, xp)
            xp.equal(winner[start:stop], position, out=mask)
            xp.multiply(grad[start:stop], mask, out=out)

        return self._scatter(grad, contribute)


class AvgPool2d(_Pool2d):
    """Mean over each window; padding counts in the divisor (``count_include_pad=True``)."""

    def forward(self, x, kernel_size=2, stride=None, padding=0):
        self._setup(x, kernel_size, stride, padding, "avg_pool2d")
        backend.check_floating(x.dtype, "avg_pool2d")
        xp = backend.array_module(x)
        padded = pad_spatial(x, self.padding)
        total = xp.empty(x.shape[:2] + self.out_hw, dtype=x.dtype)
        scale = x.dtype.type(1.0 / (self.kernel[0] * self.kernel[1]))

        def work(start, stop, scratch):
            views = self._views(padded, start, stop)
            tile = total[start:stop]
            tile[...] = views[0]
            for view in views[1:]:
                tile += view
            tile *= scale

        _for_tiles(x, work)
        return total

    def backward(self, grad):
        xp = backend.array_module(grad)
        scale = grad.dtype.type(1.0 / (self.kernel[0] * self.kernel[1]))

        def contribute(start, stop, position, scratch, out):
            xp.multiply(grad[start:stop], scale, out=out)

        return self._scatter(grad, contribute)
