"""2-d convolution as im2col plus one GEMM per group, and the window helpers pooling shares.

Layout: the columns are ``(C*KH*KW, N*OH*OW)``, the whole batch side by side, so each of
the forward, the weight gradient and the input gradient is ONE matrix product per group
(one for an ungrouped convolution) however large the batch. The price is a transpose copy
of the output and of its gradient between ``(N, O, ...)`` and ``(O, N, ...)``, small next
to the columns (``O`` rows against ``C*KH*KW``).

Why not one product per sample, ``weight (O, K) @ columns (N, K, L)``, which needs no
transposes? NumPy runs a stacked matmul as N separate BLAS calls, and with two BLAS threads
each call ends in a barrier between the threads. On the shared 2-core bench machine a
barrier often waits for a descheduled thread: the CIFAR CNN of ``bench/engine.py`` took
14x longer per step at 2 threads than at 1 with 64 per-sample calls per product, against
about 2x with one call (``bench/RESULTS.md``). At one thread the two layouts ran alike.

Backward:

* ``dW = grad (O, N*L) @ columns^T``, a long reduction into a small result, computed with
  the taller of its two sides as rows (see ``_weight_gradient``).
* ``dx`` for stride 1: a convolution of the zero-padded output gradient with the flipped,
  channel-swapped kernel (the transposed convolution), again im2col plus one GEMM whose
  inner dimension is ``O*KH*KW``. When it would move more memory than ``col2im`` (large
  kernels on small outputs, as in LeNet's second layer), or for strides > 1, ``dx`` is
  ``weight^T @ grad`` scattered back by ``col2im``, which loops only over the ``KH*KW``
  kernel offsets.

The forward columns are kept for ``dW`` (as Chainer's im2col convolution does): recomputing
them would cost another im2col per layer per step. Their buffers are reused from step to
step (``column_buffers``), which halves the cost of im2col on the CPU.
"""

from __future__ import annotations

import threading

from bigdl_py import backend
from bigdl_py.autograd.function import Function


class _ColumnBuffers:
    """Reuse the large im2col buffers of one step in the next, on the CPU.

    A fresh array of tens of MB costs about as much in page faults as the im2col copy into
    it (the C allocator returns large blocks to the OS when they are freed, so every step
    faults them in again): 6 ms of the 12 ms im2col of a 75 MB column matrix on the bench
    machine. Buffers come back when the op that took them is done with them (the forward
    columns after backward, the input-gradient columns at once). CuPy has its own pool.
    """

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes = max_bytes
        self._free: dict[tuple, list] = {}
        self._cached_bytes = 0
        self._lock = threading.Lock()

    def take(self, xp, shape: tuple, dtype):
        """An uninitialised array of ``shape``: a cached one when available."""
        if xp.__name__ != "numpy":
            return xp.empty(shape, dtype=dtype)
        size = 1
        for extent in shape:
            size *= extent
        with self._lock:
            cached = self._free.get((size, xp.dtype(dtype).str))
            if cached:
                array = cached.pop()
                self._cached_bytes -= array.nbytes
                return array.reshape(shape)
        return xp.empty(shape, dtype=dtype)

    def give_back(self, array) -> None:
        """Keep ``array`` for reuse; the caller must hold no other reference to it."""
        if backend.is_cupy_array(array):
            return
        with self._lock:
            if self._cached_bytes + array.nbytes > self.max_bytes:
                return
            self._free.setdefault((array.size, array.dtype.str), []).append(array)
            self._cached_bytes += array.nbytes

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._cached_bytes = 0


column_buffers = _ColumnBuffers()


def pair(value, name: str, op_name: str) -> tuple[int, int]:
    """Accept an int or a pair of ints for a 2-d setting (kernel, stride, padding, dilation)."""
    if isinstance(value, int):
        return (value, value)
    try:
        first, second = value
        return (int(first), int(second))
    except (TypeError, ValueError):
        raise ValueError(
            f"{op_name}: {name} must be an int or a pair of ints, got {value!r}"
        ) from None


def output_size(size: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> int:
    """Number of window positions along one axis (floor mode, like PyTorch's default)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def pad_spatial(x, padding: tuple[int, int], value: float = 0.0):
    """Pad the last two axes of ``x`` by ``padding`` on each side with ``value`` (one copy)."""
    pad_h, pad_w = padding
    if pad_h == 0 and pad_w == 0:
        return x
    xp = backend.array_module(x)
    height, width = x.shape[-2:]
    padded = xp.empty(x.shape[:-2] + (height + 2 * pad_h, width + 2 * pad_w), x.dtype)
    padded[..., pad_h : pad_h + height, pad_w : pad_w + width] = x
    # Fill only the border: filling the whole array first would write every element twice.
    padded[..., :pad_h, :] = value
    padded[..., pad_h + height :, :] = value
    padded[..., pad_h : pad_h + height, :pad_w] = value
    padded[..., pad_h : pad_h + height, pad_w + width :] = value
    return padded


def offset_slices(
    offset: tuple[int, int], stride: tuple[int, int], out_hw: tuple[int, int]
) -> tuple[slice, slice]:
    """Slices of a padded input that kernel tap ``offset`` (already dilated) reads."""
    (row, col), (stride_h, stride_w), (out_h, out_w) = offset, stride, out_hw
    return (
        slice(row, row + stride_h * (out_h - 1) + 1, stride_h),
        slice(col, col + stride_w * (out_w - 1) + 1, stride_w),
    )


def _im2col(padded, kernel, stride, dilation, out_hw, groups: int):
    """Copy the windows of ``padded (N, C, Hp, Wp)`` to columns ``(groups, C/g*KH*KW, N*L)``.

    The strided view is ``(C, KH, KW, N, OH, OW)``: the copy reads whole output rows of the
    input (contiguous for stride 1) and writes the columns in order.
    """
    xp = backend.array_module(padded)
    batch, channels = padded.shape[:2]
    stride_n, stride_c, stride_h, stride_w = padded.strides
    windows = xp.lib.stride_tricks.as_strided(
        padded,
        shape=(channels, kernel[0], kernel[1], batch, out_hw[0], out_hw[1]),
        strides=(
            stride_c,
            stride_h * dilation[0],
            stride_w * dilation[1],
            stride_n,
            stride_h * stride[0],
            stride_w * stride[1],
        ),
    )
    columns = column_buffers.take(xp, windows.shape, padded.dtype)
    columns[...] = windows
    return columns.reshape(groups, -1, batch * out_hw[0] * out_hw[1])


def _convolve(padded, weight, stride, dilation, groups: int, bias=None):
    """Cross-correlate a padded input with ``weight`` (plus ``bias``).

    Returns ``(output, columns)``: the output contiguous in ``(N, O, OH, OW)``, the
    columns ``(groups, C/g*KH*KW, N*OH*OW)``.
    """
    xp = backend.array_module(padded)
    batch = padded.shape[0]
    out_channels, _, kernel_h, kernel_w = weight.shape
    out_hw = (
        output_size(padded.shape[2], kernel_h, stride[0], 0, dilation[0]),
        output_size(padded.shape[3], kernel_w, stride[1], 0, dilation[1]),
    )
    columns = _im2col(padded, (kernel_h, kernel_w), stride, dilation, out_hw, groups)
    grouped_weight = weight.reshape(groups, out_channels // groups, -1)
    product = xp.matmul(grouped_weight, columns)  # (g, O/g, N*L): one GEMM per group
    channels_first = product.reshape(out_channels, batch, out_hw[0], out_hw[1])
    output = xp.empty((batch, out_channels) + out_hw, dtype=product.dtype)
    # The transpose to NCHW is one copy; adding the bias in that same pass saves another.
    if bias is None:
        output[...] = channels_first.transpose(1, 0, 2, 3)
    else:
        xp.add(channels_first.transpose(1, 0, 2, 3), bias.reshape(1, -1, 1, 1), out=output)
    return output, columns


def _weight_gradient(columns, grouped_grad):
    """``grad (g, O/g, N*L) @ columns^T (g, N*L, K)``, computed with the taller side as rows.

    The reduction runs over the whole batch (N*L is tens of thousands) into a small
    ``(O/g, K)`` result. Multi-threaded OpenBLAS synchronises its threads once per block of
    that reduction, and on a loaded machine these waits grew 100-400x when the result's
    row count was the smaller side: 1.6 s instead of 4 ms for the CIFAR CNN's first layer
    (27 x 32 result) at 2 threads, 420 ms instead of 24 ms for its last (576 x 64).
    """
    xp = backend.array_module(columns)
    if columns.shape[1] >= grouped_grad.shape[1]:
        transposed = xp.matmul(columns, xp.swapaxes(grouped_grad, -1, -2))  # (g, K, O/g)
        return xp.swapaxes(transposed, -1, -2)
    return xp.matmul(grouped_grad, xp.swapaxes(columns, -1, -2))  # (g, O/g, K)


def _check_conv_shapes(x, weight, bias, padding, dilation, groups: int) -> None:
    """Raise errors that name conv2d, the shapes and the offending setting."""
    if x.ndim != 4:
        raise ValueError(f"conv2d: input must be 4-d (N, C, H, W), got shape {tuple(x.shape)}")
    if weight.ndim != 4:
        raise ValueError(
            f"conv2d: weight must be 4-d (out_channels, in_channels/groups, KH, KW), got "
            f"shape {tuple(weight.shape)}"
        )
    if groups < 1:
        raise ValueError(f"conv2d: groups must be >= 1, got {groups}")
    in_channels, out_channels = x.shape[1], weight.shape[0]
    if in_channels % groups or out_channels % groups:
        raise ValueError(
            f"conv2d: groups={groups} must divide both the input channels ({in_channels}) and "
            f"the output channels ({out_channels})"
        )
    if weight.shape[1] * groups != in_channels:
        raise ValueError(
            f"conv2d: input of shape {tuple(x.shape)} has {in_channels} channels but the "
            f"weight of shape {tuple(weight.shape)} with groups={groups} expects "
            f"{weight.shape[1] * groups}"
        )
    for axis, name in ((0, "height"), (1, "width")):
        padded = x.shape[2 + axis] + 2 * padding[axis]
        extent = dilation[axis] * (weight.shape[2 + axis] - 1) + 1
        if extent > padded:
            raise ValueError(
                f"conv2d: kernel {name} {weight.shape[2 + axis]} (dilated extent {extent}) is "
                f"larger than the padded input {name} {padded} (input shape "
                f"{tuple(x.shape)}, padding {padding})"
            )
    if bias is not None and tuple(bias.shape) != (out_channels,):
        raise ValueError(f"conv2d: bias must have shape ({out_channels},), got {tuple(bias.shape)}")


class Conv2d(Function):
    """2-d cross-correlation over NCHW input, with groups, stride, padding and dilation."""

    _columns = None  # the forward's column buffer, handed back to column_buffers on release

    def forward(self, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        stride = pair(stride, "stride", "conv2d")
        padding = pair(padding, "padding", "conv2d")
        dilation = pair(dilation, "dilation", "conv2d")
        if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
            raise ValueError(
                f"conv2d: stride and dilation must be >= 1 and padding >= 0, got stride "
                f"{stride}, dilation {dilation}, padding {padding}"
            )
        _check_conv_shapes(x, weight, bias, padding, dilation, groups)
        padded = pad_spatial(x, padding)
        output, columns = _convolve(padded, weight, stride, dilation, groups, bias)
        self.settings = (stride, padding, dilation, groups)
        self.input_shape = x.shape
        self.has_bias = bias is not None
        self.save_for_backward(columns, weight)
        self._columns = columns
        return output

    def _release_extra(self) -> None:
        # Called once backward is done with the saved columns (or the graph is freed).
        if self._columns is not None:
            column_buffers.give_back(self._columns)
            self._columns = None

    def backward(self, grad):
        columns, weight = self.saved
        stride, padding, dilation, groups = self.settings
        grouped_grad = channels_first(grad, groups)
        grad_x = grad_weight = grad_bias = None
        if self.needs_input_grad[1]:
            grad_weight = _weight_gradient(columns, grouped_grad).reshape(weight.shape)
        if self.has_bias and self.needs_input_grad[2]:
            grad_bias = grouped_grad.sum(axis=-1).reshape(grad.shape[1])
        if self.needs_input_grad[0]:
            geometry = (stride, padding, dilation, groups)
            grad_x = transposed_convolution(
                grad, weight, geometry, self.input_shape[2:], grouped_grad
            )
        return grad_x, grad_weight, grad_bias


def channels_first(array, groups: int):
    """``(N, O, H, W) -> (g, O/g, N*H*W)``: the batch side by side, as in the columns."""
    xp = backend.array_module(array)
    grouped = xp.ascontiguousarray(xp.swapaxes(array, 0, 1))
    return grouped.reshape(groups, array.shape[1] // groups, -1)


def transposed_convolution(grad, weight, geometry, input_hw, grouped_grad=None):
    """The adjoint of conv2d in its input: ``grad (N, O, OH, OW)`` -> ``(N, C, *input_hw)``.

    This is conv2d's input gradient and ConvTranspose2d's forward. ``geometry`` is conv2d's
    ``(stride, padding, dilation, groups)``; ``weight`` is conv2d's ``(O, C/g, KH, KW)``;
    ``grouped_grad`` is ``channels_first(grad, groups)`` when the caller has it already.
    """
    if _flipped_kernel_is_cheaper(grad.shape, weight.shape, geometry, input_hw):
        return _by_flipped_kernel(grad, weight, geometry)
    if grouped_grad is None:
        grouped_grad = channels_first(grad, geometry[3])
    return _by_col2im(grouped_grad, weight, geometry, grad.shape, input_hw)


def _flipped_kernel_is_cheaper(grad_shape, weight_shape, geometry, input_hw) -> bool:
    """Stride-1 only; compare the elements each route writes and reads again."""
    stride, padding, dilation, groups = geometry
    kernel = weight_shape[2:]
    if stride != (1, 1):
        return False
    for axis in (0, 1):
        reach = dilation[axis] * (kernel[axis] - 1)
        if reach < padding[axis]:
            return False  # padding wider than the kernel: the result would need cropping
        if grad_shape[2 + axis] + reach - 2 * padding[axis] != input_hw[axis]:
            return False  # a transposed convolution's output_padding: rows the route misses
    in_channels = weight_shape[1] * groups
    out_channels, out_h, out_w = grad_shape[1:]
    # Flipped kernel: columns of O*KH*KW x H*W, written once and read once by the GEMM.
    # col2im: columns of C*KH*KW x OH*OW, written, read, and added into dx (read+write).
    return out_channels * input_hw[0] * input_hw[1] * 2 <= in_channels * out_h * out_w * 4


def _by_flipped_kernel(grad, weight, geometry):
    """dx = (zero-padded grad) correlated with the flipped kernel, channels swapped."""
    _, padding, dilation, groups = geometry
    out_channels, in_per_group, kernel_h, kernel_w = weight.shape
    xp = backend.array_module(weight)
    # (g, O/g, C/g, KH, KW) -> (g, C/g, O/g, KH, KW): input and output channels swap.
    flipped = weight[:, :, ::-1, ::-1].reshape(
        groups, out_channels // groups, in_per_group, kernel_h, kernel_w
    )
    swapped = xp.ascontiguousarray(xp.swapaxes(flipped, 1, 2)).reshape(
        groups * in_per_group, out_channels // groups, kernel_h, kernel_w
    )
    full_padding = (
        dilation[0] * (kernel_h - 1) - padding[0],
        dilation[1] * (kernel_w - 1) - padding[1],
    )
    grad_x, columns = _convolve(pad_spatial(grad, full_padding), swapped, (1, 1), dilation, groups)
    column_buffers.give_back(columns)
    return grad_x


def _by_col2im(grouped_grad, weight, geometry, grad_shape, input_hw):
    """dx = weight^T @ grad (one GEMM per group), added back window by window (col2im)."""
    stride, padding, dilation, groups = geometry
    xp = backend.array_module(weight)
    batch, out_hw, (height, width) = grad_shape[0], grad_shape[2:], input_hw
    out_channels, in_per_group, kernel_h, kernel_w = weight.shape
    in_channels = in_per_group * groups
    grouped_weight_t = xp.swapaxes(weight.reshape(groups, out_channels // groups, -1), 1, 2)
    grad_columns = xp.matmul(grouped_weight_t, grouped_grad).reshape(
        in_channels, kernel_h, kernel_w, batch, out_hw[0], out_hw[1]
    )
    padded_h, padded_w = height + 2 * padding[0], width + 2 * padding[1]
    # Summed channel-major, like the columns, so each add reads a contiguous block
    # (1.4x faster on LeNet's second layer); one transpose copy gives NCHW at the end.
    grad_padded = xp.zeros((in_channels, batch, padded_h, padded_w), dtype=weight.dtype)
    for row in range(kernel_h):
        for col in range(kernel_w):
            rows, cols = offset_slices((row * dilation[0], col * dilation[1]), stride, out_hw)
            grad_padded[:, :, rows, cols] += grad_columns[:, row, col]
    rows = slice(padding[0], padding[0] + height)
    cols = slice(padding[1], padding[1] + width)
    return xp.ascontiguousarray(xp.swapaxes(grad_padded[:, :, rows, cols], 0, 1))
