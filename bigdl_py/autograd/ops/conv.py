"""2-d convolution as im2col plus GEMMs, tile by tile over the batch; the window helpers
pooling shares.

float32 NumPy convolutions go to oneDNN's kernels first, where its library is installed
(``conv_onednn.py``: 1.4-1.7x faster on the CIFAR CNN's layers), CuPy convolutions to
cuDNN's where it loads (``conv_cudnn.py``; ``conv_routes.py`` picks), and device
convolutions it does not take to ``conv_device.py`` (one im2col kernel, 2-d GEMMs, reused
scratch); everything below is the route for the rest (float64 on the host, no library,
ConvTranspose2d and pooling on a device) and the reference the tests hold them to.

A tile is a few samples (``conv_tiles.py`` says why and how they are shared out among
threads). For each tile the columns are ``(C*KH*KW, T*L)``, the tile's samples side by side
(``_columns_tile``; "full-width" rows on wide stride-1 layers) or interleaved, the samples
innermost (narrow stride-1 layers, ``_samples_last``), so each product is one
GEMM per group of a size OpenBLAS runs well, on data still in cache from the im2col copy
that wrote it.

* Forward: ``out = weight (O, C*KH*KW) @ columns``, stored into NCHW with the bias added in
  the same pass (``convolve``).
* Weight gradient: ``grad (O, T*L) @ columns^T``, summed over the tiles. The columns are
  recomputed from the input rather than kept from the forward: keeping them for the whole
  batch was 9x the input (75 MB for the CIFAR CNN's second layer, 8x PyTorch's peak memory
  for the step), and recomputing a tile's columns costs one in-cache copy.
* Input gradient (``transposed_convolution``, also ConvTranspose2d's forward): for stride 1,
  a convolution of the zero-padded output gradient with the flipped, channel-swapped kernel;
  otherwise (or when it moves less memory) ``weight^T @ grad`` scattered back by ``col2im``,
  which loops only over the ``KH*KW`` kernel offsets.

3x3 stride-1 convolutions of 128 or more channels each way (ResNet-18's 16x16, 8x8 and 4x4
layers) take Winograd's F(2x2, 3x3) instead, forward and weight gradient alike
(``conv_winograd.py``): 16 multiplications per 2x2 block and input channel instead of 36.
"""

from __future__ import annotations

from bigdl_py import backend, kernels
from bigdl_py.autograd.function import Function
from bigdl_py.autograd.ops import conv_device, conv_routes, conv_winograd, gemm_pieces
from bigdl_py.autograd.ops.conv_tiles import (
    MIN_THREADED_MULTIPLY_ADDS,
    for_each_tile,
    scratch_array,
    scratch_matrix,
    tile_size,
    worker_count,
)


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


def output_shape(x_shape, weight_shape, stride, padding, dilation) -> tuple[int, int, int, int]:
    """``(N, O, OH, OW)`` of a conv2d of an NCHW input with an OIHW-shaped weight."""
    spatial = (
        output_size(
            x_shape[2 + axis], weight_shape[2 + axis], stride[axis], padding[axis], dilation[axis]
        )
        for axis in (0, 1)
    )
    return (x_shape[0], weight_shape[0], *spatial)


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


def _padded_tile(source, start, stop, before, padded_hw, scratch, name, full_width=False):
    """``source[start:stop]`` placed ``before`` rows/columns into a zero ``padded_hw`` frame.

    Rows and columns of the source that fall beyond the frame are dropped (a transposed
    convolution's backward uses that to skip rows no window reaches). The frame is a
    per-thread buffer zeroed once per op: every tile writes the same interior, so the border
    stays zero. For ``full_width`` columns the frame is always a copy, contiguous, with one
    row of slack after it (the last windows read up to a row past the frame's end).
    """
    if not full_width and before == (0, 0) and tuple(source.shape[2:]) == tuple(padded_hw):
        return source[start:stop]
    xp = backend.array_module(source)
    channels, height, width = source.shape[1:]
    shape = (stop - start, channels) + tuple(padded_hw)
    size = shape[0] * channels * padded_hw[0] * padded_hw[1]
    flat = scratch_array(scratch, name, (size + padded_hw[1],), source.dtype, xp, zeroed=True)
    frame = flat[:size].reshape(shape)
    height = min(height, padded_hw[0] - before[0])
    width = min(width, padded_hw[1] - before[1])
    frame[:, :, before[0] : before[0] + height, before[1] : before[1] + width] = source[
        start:stop, :, :height, :width
    ]
    return frame


def _columns_tile(padded, kernel, stride, dilation, out_hw, groups, scratch, name):
    """Copy the windows of ``padded (T, C, Hp, Wp)`` to columns ``(groups, C/g*KH*KW, T*L)``.

    The strided view is ``(C, KH, KW, T, OH, OW)``: the copy reads whole output rows of the
    input (contiguous for stride 1) and writes the columns in order.

    For stride 1 the columns are "full width": ``L = OH * Wp``, each output row computed at
    all ``Wp`` positions of the padded row, the last ``Wp - OW`` of them garbage that
    ``_store_tile`` drops (and that ``_channels_first_tile`` meets with zero gradients). Then
    each ``(c, kh, kw, sample)`` window is ONE contiguous run of ``OH * Wp`` elements of the
    frame, copied 2-4x faster than ``OH`` runs of ``OW``, for 6-12 % more GEMM work on the
    CIFAR CNN's 32x32 and 16x16 layers. ``padded`` must then come from ``_padded_tile(...,
    full_width=True)`` (the last windows run into its slack).
    """
    xp = backend.array_module(padded)
    tile, channels = padded.shape[:2]
    stride_n, stride_c, stride_h, stride_w = padded.strides
    if _full_width(stride, padded.shape[3], out_hw[1], channels):
        shape = (channels, kernel[0], kernel[1], tile, out_hw[0] * padded.shape[3])
        last_axis = (stride_w,)
    else:
        shape = (channels, kernel[0], kernel[1], tile, out_hw[0], out_hw[1])
        last_axis = (stride_h * stride[0], stride_w * stride[1])
    windows = xp.lib.stride_tricks.as_strided(
        padded,
        shape=shape,
        strides=(stride_c, stride_h * dilation[0], stride_w * dilation[1], stride_n) + last_axis,
    )
    width = tile * windows[0, 0, 0, 0].size
    columns = scratch_matrix(
        scratch, name, (groups, channels * kernel[0] * kernel[1] // groups, width), padded.dtype, xp
    )
    columns.reshape(windows.shape)[...] = windows  # a view: only the rows' distance differs
    return columns


def _full_width(stride, padded_width: int, out_width: int, channels: int) -> bool:
    """Full-width columns (see ``_columns_tile``) for stride 1 when the garbage columns add at
    most a tenth to the GEMMs (6 % on 32x32 layers with a 3x3 kernel), or at most a fifth
    for inputs of few channels, whose copies weigh more than their GEMMs (17 % on LeNet's
    first). On ResNet-18's 8x8 and 4x4 layers they would add a quarter and a half, more
    than the strided im2col copy costs (its step took 3.3-3.4 s of CPU without them on
    those layers, 4.1 s with them and narrower tiles). On 16x16 layers (12.5 %) with 32 or
    more channels samples-last columns won: forward plus both gradients at one thread,
    CPU ms, medians of 8 alternated rounds, batch 64, 3x3 kernels: 64->64 53.9 -> 49.7,
    32->64 31.5 -> 28.7, 128->128 187.7 -> 172.7; the CIFAR CNN's 3->32 32x32 layer lost
    (10.6 -> 15.7) and LeNet-5's first layer (1->6, 28x28) was within noise."""
    if tuple(stride) != (1, 1):
        return False
    garbage = padded_width - out_width
    return 10 * garbage <= out_width or (channels < 16 and 5 * garbage <= out_width)


def _channels_first_tile(array, start, stop, groups, scratch, name, row_width=None):
    """``array[start:stop] (T, O, H, W) -> (g, O/g, T*H*row_width)``, as the columns lay
    samples out; columns past ``W`` (full-width rows) are zeros."""
    xp = backend.array_module(array)
    tile = array[start:stop]
    channels, samples, (height, width) = tile.shape[1], tile.shape[0], tile.shape[2:]
    row_width = width if row_width is None else row_width
    matrix = scratch_matrix(
        scratch, name, (groups, channels // groups, samples * height * row_width), tile.dtype, xp
    )
    buffer = matrix.reshape(channels, samples, height, row_width)
    if row_width > width:
        buffer[..., width:] = 0  # every tile: a smaller last tile lays the buffer out anew
    buffer[..., :width] = xp.swapaxes(tile, 0, 1)
    return matrix


def _store_tile(product, out, start, stop, bias=None, samples_last=False) -> None:
    """Write a tile's ``(g, O/g, T*L)`` product into ``out[start:stop]`` (NCHW), plus ``bias``.

    ``L`` may be ``OH`` full-width rows (see ``_columns_tile``): their tails are dropped.
    With ``samples_last`` the product is ``(g, O/g, L*T)`` (see ``_samples_last_columns``).
    """
    xp = backend.array_module(out)
    channels, (height, width) = out.shape[1], out.shape[2:]
    if samples_last:
        samples = xp.moveaxis(product.reshape(channels, height, width, stop - start), -1, 0)
    else:
        rows = product.reshape(channels, stop - start, height, -1)[..., :width]
        samples = rows.transpose(1, 0, 2, 3)
    if bias is None:
        out[start:stop] = samples
    else:
        xp.add(samples, bias.reshape(1, -1, 1, 1), out=out[start:stop])


def _samples_last(stride, padded_width: int, out_width: int, channels: int) -> bool:
    """Samples-last columns for stride-1 convolutions too narrow for full-width rows
    (ResNet-18's 16x16, 8x8 and 4x4 layers, the CIFAR CNN's 16x16 ones, LeNet-5's second).

    There a window row of one sample is only ``OW`` = 4-8 floats; with the samples innermost
    each window copies runs of ``T`` floats instead. Forward and weight gradient, CPU ms at
    one thread (medians of 6-30 alternated with the sample-major layout): LeNet-5's second
    layer at batch 128 1.41/1.58 -> 0.85/1.03, ResNet-18's 256x8x8 57.8/59.9 -> 56.1/57.7,
    512x4x4 55.2/56.2 -> 53.9/55.8. Strided convolutions keep the sample-major layout: the
    frame would copy every input pixel to read a quarter of them (ResNet-18's 1x1 stride-2
    shortcut: 6.3 -> 21.8 ms forward with samples last; its 3x3 stride-2 convolution on
    32x32, 34.8 -> 41.0).
    """
    return tuple(stride) == (1, 1) and not _full_width(stride, padded_width, out_width, channels)


def _samples_last_columns(source, start, stop, before, padded_hw, geometry, scratch):
    """Columns ``(groups, C/g*KH*KW, OH*OW*T)`` of ``source[start:stop]`` with the samples
    innermost, through a zero-bordered ``(C, Hp, Wp, T)`` frame (see ``_samples_last``).

    ``geometry`` is ``(kernel, stride, dilation, out_hw, groups)``. Rows and columns of
    the source beyond the frame are dropped, as in ``_padded_tile``.
    """
    kernel, stride, dilation, out_hw, groups = geometry
    xp = backend.array_module(source)
    tile, (channels, height, width) = stop - start, source.shape[1:]
    # One frame per tile length (a smaller last tile lays the frame out anew): zeroed once
    # per op, every tile of that length then writes the same interior.
    frame = scratch_array(
        scratch,
        f"frame-{tile}",
        (channels,) + tuple(padded_hw) + (tile,),
        source.dtype,
        xp,
        zeroed=True,
    )
    height = min(height, padded_hw[0] - before[0])
    width = min(width, padded_hw[1] - before[1])
    frame[:, before[0] : before[0] + height, before[1] : before[1] + width] = xp.moveaxis(
        source[start:stop, :, :height, :width], 0, -1
    )
    stride_c, stride_h, stride_w, stride_n = frame.strides
    windows = xp.lib.stride_tricks.as_strided(
        frame,
        shape=(channels, kernel[0], kernel[1], out_hw[0], out_hw[1], tile),
        strides=(
            stride_c,
            stride_h * dilation[0],
            stride_w * dilation[1],
            stride_h * stride[0],
            stride_w * stride[1],
            stride_n,
        ),
    )
    rows = channels * kernel[0] * kernel[1] // groups
    columns = scratch_matrix(
        scratch, "columns", (groups, rows, out_hw[0] * out_hw[1] * tile), source.dtype, xp
    )
    columns.reshape(windows.shape)[...] = windows  # a view: only the rows' distance differs
    return columns


def _samples_last_gradient(grad, start, stop, groups, scratch):
    """``grad[start:stop] (T, O, OH, OW) -> (g, O/g, OH*OW*T)``, as samples-last columns."""
    xp = backend.array_module(grad)
    tile = grad[start:stop]
    matrix = scratch_matrix(
        scratch,
        "grad",
        (groups, grad.shape[1] // groups, tile.size // grad.shape[1]),
        grad.dtype,
        xp,
    )
    matrix.reshape(grad.shape[1:] + (stop - start,))[...] = xp.moveaxis(tile, 0, -1)
    return matrix


def _tiles(batch, rows, columns_per_sample, array, products, samples_last=False):
    """Samples per tile for columns of ``rows`` x ``columns_per_sample`` per sample, whether
    the arrays live on a GPU, and whether the tiles are worth sharing among threads (each
    column enters ``products`` dot products of length ``rows``).

    Samples-last tiles skip ``MIN_COLUMNS``: their copies slow down with the tile (ResNet-18's
    4x4 layer, 64 samples: 3.5 ms against 4 x 0.4 for tiles of 16), and the GEMMs of 256
    columns ran as fast as those of 1024 (95-97 against 96-103 GFLOP/s)."""
    on_gpu = backend.is_device_array(array)
    threaded = batch * columns_per_sample * rows * products >= MIN_THREADED_MULTIPLY_ADDS
    workers = worker_count() if threaded else 1
    bytes_per_sample = rows * columns_per_sample * array.itemsize
    narrowest = 0 if samples_last else columns_per_sample
    size = tile_size(batch, bytes_per_sample, workers, on_gpu, narrowest)
    return size, on_gpu, threaded


def _threads_share_tiles(threaded: bool, on_gpu: bool) -> bool:
    """Whether ``for_each_tile`` will run this op's tiles on several threads at once."""
    return threaded and not on_gpu and worker_count() > 1


def convolve(x, weight, stride, before, padded_hw, dilation, groups: int, bias=None):
    """Cross-correlate ``x (N, C, H, W)``, zero-padded into a ``padded_hw`` frame ``before``
    rows/columns in, with ``weight (O, C/g, KH, KW)``; add ``bias``. Returns NCHW."""
    xp = backend.array_module(x)
    on_gpu = backend.is_device_array(x)
    if conv_winograd.applies(weight.shape, stride, dilation, groups, on_gpu, x.dtype):
        return conv_winograd.convolve(x, weight, before, padded_hw, bias)
    batch = x.shape[0]
    out_channels, _, kernel_h, kernel_w = weight.shape
    out_hw = (
        output_size(padded_hw[0], kernel_h, stride[0], 0, dilation[0]),
        output_size(padded_hw[1], kernel_w, stride[1], 0, dilation[1]),
    )
    output = xp.empty((batch, out_channels) + out_hw, dtype=x.dtype)
    grouped_weight = weight.reshape(groups, out_channels // groups, -1)
    rows = grouped_weight.shape[2] * groups
    samples_last = _samples_last(stride, padded_hw[1], out_hw[1], x.shape[1])
    size, on_gpu, threaded = _tiles(
        batch, rows, out_hw[0] * out_hw[1], x, out_channels // groups, samples_last
    )
    full_width = _full_width(stride, padded_hw[1], out_hw[1], x.shape[1])
    geometry = ((kernel_h, kernel_w), stride, dilation, out_hw, groups)
    shared = _threads_share_tiles(threaded, on_gpu)

    def work(start, stop, scratch):
        if samples_last:
            columns = _samples_last_columns(x, start, stop, before, padded_hw, geometry, scratch)
        else:
            padded = _padded_tile(x, start, stop, before, padded_hw, scratch, "input", full_width)
            columns = _columns_tile(padded, *geometry[:4], groups, scratch, "columns")
        product = scratch_matrix(
            scratch, "product", (groups, out_channels // groups, columns.shape[2]), x.dtype, xp
        )
        # (g, O/g, T*L): one GEMM per group, or thin ones in pieces (gemm_pieces.py)
        gemm_pieces.matmul_into(grouped_weight, columns, product, shared)
        _store_tile(product, output, start, stop, bias, samples_last)

    for_each_tile(batch, size, work, on_gpu, threaded)
    return output


def _weight_gradient(columns, grouped_grad):
    """``grad (g, O/g, T*L) @ columns^T (g, T*L, K)``, computed with the taller side as rows.

    A long reduction into a small ``(O/g, K)`` result; OpenBLAS ran it faster (and, when it
    was multi-threaded, with far fewer waits between its threads) with the taller of the
    two sides as the result's rows.
    """
    xp = backend.array_module(columns)
    # Summed over the long axis in pieces when the product is thin (gemm_pieces.py).
    if columns.shape[1] >= grouped_grad.shape[1]:
        transposed = gemm_pieces.matmul_summed(columns, xp.swapaxes(grouped_grad, -1, -2))
        return xp.swapaxes(transposed, -1, -2)  # (g, O/g, K) from (g, K, O/g)
    return gemm_pieces.matmul_summed(grouped_grad, xp.swapaxes(columns, -1, -2))  # (g, O/g, K)


def convolution_weight_gradient(
    x, grad, weight_shape, stride, before, padded_hw, dilation, groups: int, with_bias=False
):
    """Gradient of ``convolve``'s weight (and bias when ``with_bias``) given the output's
    gradient ``grad (N, O, OH, OW)``: ``(weight_grad, bias_grad or None)``."""
    xp = backend.array_module(x)
    on_gpu = backend.is_device_array(x)
    if conv_winograd.applies(weight_shape, stride, dilation, groups, on_gpu, x.dtype):
        return conv_winograd.weight_gradient(x, grad, weight_shape, before, padded_hw, with_bias)
    batch = x.shape[0]
    out_channels, in_per_group, kernel_h, kernel_w = weight_shape
    out_hw = grad.shape[2:]
    rows = in_per_group * groups * kernel_h * kernel_w
    samples_last = _samples_last(stride, padded_hw[1], out_hw[1], x.shape[1])
    size, on_gpu, threaded = _tiles(
        batch, rows, out_hw[0] * out_hw[1], x, out_channels // groups, samples_last
    )
    full_width = _full_width(stride, padded_hw[1], out_hw[1], x.shape[1])
    geometry = ((kernel_h, kernel_w), stride, dilation, out_hw, groups)

    def work(start, stop, scratch):
        if samples_last:
            grouped_grad = _samples_last_gradient(grad, start, stop, groups, scratch)
            columns = _samples_last_columns(x, start, stop, before, padded_hw, geometry, scratch)
        else:
            row_width = padded_hw[1] if full_width else None
            grouped_grad = _channels_first_tile(
                grad, start, stop, groups, scratch, "grad", row_width
            )
            padded = _padded_tile(x, start, stop, before, padded_hw, scratch, "input", full_width)
            columns = _columns_tile(padded, *geometry[:4], groups, scratch, "columns")
        partial = _weight_gradient(columns, grouped_grad)
        if "weight" in scratch:
            scratch["weight"] += partial
        else:
            scratch["weight"] = xp.array(partial)  # a copy: partial may be a view
        if with_bias:
            sums = grouped_grad.sum(axis=-1)
            if "bias" in scratch:
                scratch["bias"] += sums
            else:
                scratch["bias"] = sums

    # A thread that found no tile left has an empty scratch.
    parts = [scratch for scratch in for_each_tile(batch, size, work, on_gpu, threaded) if scratch]
    if not parts:  # an empty batch: no tile ran
        bias_grad = xp.zeros(out_channels, dtype=x.dtype) if with_bias else None
        return xp.zeros(weight_shape, dtype=x.dtype), bias_grad
    weight_grad = parts[0]["weight"]
    bias_grad = parts[0].get("bias")
    for part in parts[1:]:
        weight_grad += part["weight"]
        if with_bias:
            bias_grad += part["bias"]
    if bias_grad is not None:
        bias_grad = bias_grad.reshape(-1)
    return weight_grad.reshape(weight_shape), bias_grad


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


def transposed_convolution(grad, weight, geometry, input_hw):
    """The adjoint of conv2d in its input: ``grad (N, O, OH, OW)`` -> ``(N, C, *input_hw)``.

    This is conv2d's input gradient and ConvTranspose2d's forward. ``geometry`` is conv2d's
    ``(stride, padding, dilation, groups)``; ``weight`` is conv2d's ``(O, C/g, KH, KW)``.
    """
    if _flipped_kernel_is_cheaper(grad.shape, weight.shape, geometry, input_hw):
        return _by_flipped_kernel(grad, weight, geometry, input_hw)
    return _by_col2im(grad, weight, geometry, input_hw)


def _flipped_kernel_is_cheaper(grad_shape, weight_shape, geometry, input_hw) -> bool:
    """Stride-1 only; compare the elements each route writes and reads again."""
    stride, padding, dilation, groups = geometry
    kernel = weight_shape[2:]
    if stride != (1, 1):
        return False
    if any(dilation[a] * (kernel[a] - 1) < padding[a] for a in (0, 1)):
        return False  # padding wider than the kernel: the result would need cropping
    in_channels = weight_shape[1] * groups
    out_channels, out_h, out_w = grad_shape[1:]
    # Flipped kernel: columns of O*KH*KW x H*W, written once and read once by the GEMM.
    # col2im: columns of C*KH*KW x OH*OW, written, read, and added into dx (read+write).
    return out_channels * input_hw[0] * input_hw[1] * 2 <= in_channels * out_h * out_w * 4


def _by_flipped_kernel(grad, weight, geometry, input_hw):
    """dx = (zero-padded grad) correlated with the flipped kernel, channels swapped.

    The frame is ``input_hw`` plus the kernel's reach, so the output is exactly
    ``input_hw`` (a transposed convolution's output_padding rows come out of the zeros).
    """
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
    reach = (dilation[0] * (kernel_h - 1), dilation[1] * (kernel_w - 1))
    before = (reach[0] - padding[0], reach[1] - padding[1])
    padded_hw = (input_hw[0] + reach[0], input_hw[1] + reach[1])
    return convolve(grad, swapped, (1, 1), before, padded_hw, dilation, groups)


def _by_col2im(grad, weight, geometry, input_hw):
    """dx = weight^T @ grad (one GEMM per group), added back window by window (col2im)."""
    stride, padding, dilation, groups = geometry
    xp = backend.array_module(weight)
    batch, out_hw, (height, width) = grad.shape[0], grad.shape[2:], input_hw
    out_channels, in_per_group, kernel_h, kernel_w = weight.shape
    in_channels = in_per_group * groups
    grouped_weight_t = xp.ascontiguousarray(
        xp.swapaxes(weight.reshape(groups, out_channels // groups, -1), 1, 2)
    )
    padded_h, padded_w = height + 2 * padding[0], width + 2 * padding[1]
    output = xp.empty((batch, in_channels, height, width), dtype=grad.dtype)
    rows = in_channels * kernel_h * kernel_w
    size, on_gpu, threaded = _tiles(
        batch, rows, out_hw[0] * out_hw[1], grad, out_channels // groups
    )

    # For stride 1 the gradient's rows are laid out full width (``padded_w`` positions, the
    # last ``padded_w - OW`` of them zeros): then a kernel offset's contribution to one
    # sample's channel is ONE contiguous run of the frame, ``OH * padded_w`` long, instead
    # of ``OH`` runs of ``OW``. A run's tail spills into the next row's first columns (or the
    # frame's slack row) only from the zero positions. LeNet's second layer's input gradient
    # (8x8 rows): 1.9 ms CPU with the short runs at batch 64.
    full_width = tuple(stride) == (1, 1)
    row_width = padded_w if full_width else out_hw[1]
    shared = _threads_share_tiles(threaded, on_gpu)

    def work(start, stop, scratch):
        tile = stop - start
        grouped_grad = _channels_first_tile(grad, start, stop, groups, scratch, "grad", row_width)
        grad_columns = scratch_matrix(
            scratch, "columns", (groups, rows // groups, grouped_grad.shape[2]), grad.dtype, xp
        )
        gemm_pieces.matmul_into(grouped_weight_t, grouped_grad, grad_columns, shared)
        # Summed channel-major, like the columns, so each add reads a contiguous block
        # (1.4x faster on LeNet's second layer); one transpose copy gives NCHW at the end.
        frame_rows = padded_h + 1 if full_width else padded_h  # one slack row for the spill
        frame = scratch_array(
            scratch, "frame", (in_channels, tile, frame_rows, padded_w), grad.dtype, xp
        )
        frame[...] = 0
        if full_width:
            runs = grad_columns.reshape(in_channels, kernel_h, kernel_w, tile, -1)
            flat_frame = frame.reshape(in_channels, tile, -1)
            length = runs.shape[-1]
        else:
            windows = grad_columns.reshape(
                in_channels, kernel_h, kernel_w, tile, out_hw[0], out_hw[1]
            )
        for row in range(kernel_h):
            for col in range(kernel_w):
                offset = (row * dilation[0], col * dilation[1])
                if full_width:
                    first = offset[0] * padded_w + offset[1]
                    flat_frame[:, :, first : first + length] += runs[:, row, col]
                else:
                    rows_, cols = offset_slices(offset, stride, out_hw)
                    frame[:, :, rows_, cols] += windows[:, row, col]
        inside = frame[:, :, padding[0] : padding[0] + height, padding[1] : padding[1] + width]
        output[start:stop] = xp.swapaxes(inside, 0, 1)

    for_each_tile(batch, size, work, on_gpu, threaded)
    return output


class Conv2d(Function):
    """2-d cross-correlation over NCHW input, with groups, stride, padding and dilation.

    Keeps only its input and weight for backward (both alive anyway as the op's inputs).
    """

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
        self.geometry = (stride, padding, dilation, groups)
        self.has_bias = bias is not None
        self.save_for_backward(x, weight)
        self.on_device = kernels.route(x, weight, bias) is not None
        route = conv_routes.library_route(x, weight, bias)  # oneDNN, cuDNN or None
        if route is not None:
            out_shape = output_shape(x.shape, weight.shape, stride, padding, dilation)
            out = route.forward(x, weight, bias, stride, padding, dilation, groups, out_shape)
            if out is not None:
                return out
        if self.on_device:  # no library, or it declined: one im2col kernel, 2-d GEMMs
            out_hw = output_shape(x.shape, weight.shape, stride, padding, dilation)[2:]
            return conv_device.convolve(x, weight, bias, stride, padding, dilation, groups, out_hw)
        return convolve(x, weight, stride, padding, _padded_hw(x, padding), dilation, groups, bias)

    def backward(self, grad):
        x, weight = self.saved
        stride, padding, dilation, groups = self.geometry
        needs = (
            self.needs_input_grad[0],
            self.needs_input_grad[1],
            self.has_bias and self.needs_input_grad[2],
        )
        route = conv_routes.library_route(x, weight, grad)
        if route is not None:
            grads = route.backward(x, weight, grad, self.geometry, self.has_bias, needs)
            if grads is not None:
                return grads
        if self.on_device:
            return conv_device.gradients(x, weight, grad, stride, padding, dilation, groups, needs)
        grad_x = grad_weight = grad_bias = None
        if self.needs_input_grad[1] or (self.has_bias and self.needs_input_grad[2]):
            grad_weight, grad_bias = convolution_weight_gradient(
                x,
                grad,
                weight.shape,
                stride,
                padding,
                _padded_hw(x, padding),
                dilation,
                groups,
                with_bias=self.has_bias and self.needs_input_grad[2],
            )
            if not self.needs_input_grad[1]:
                grad_weight = None
        if self.needs_input_grad[0]:
            grad_x = transposed_convolution(grad, weight, self.geometry, x.shape[2:])
        return grad_x, grad_weight, grad_bias


def _padded_hw(x, padding) -> tuple[int, int]:
    return (x.shape[2] + 2 * padding[0], x.shape[3] + 2 * padding[1])
