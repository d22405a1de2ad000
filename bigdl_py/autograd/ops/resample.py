"""Resampling a 2-d grid: adaptive pooling and up-sampling of ``(N, C, H, W)`` input.

Adaptive average pooling, nearest and bilinear up-sampling are all *separable linear maps*:
each output is a weighted sum of the inputs whose weights factor into a row weight times a
column weight. So one op serves the three: ``y = R @ x @ C^T`` with a small ``(OH, H)`` row
matrix ``R`` and ``(OW, W)`` column matrix ``C`` built per call, and the backward is the
transposed map ``R^T @ grad @ C``. That is two batched matrix products each way, exact,
branch-free, and the same code on NumPy and CuPy. (Its cost grows with ``H*W*OW``, not
``OH*OW``; for the small feature maps these layers see that is cheaper than an index
gather with a scatter-add backward.)

Nearest-neighbour up-sampling by whole factors (PyTorch's sources then repeat every input
``k`` times) takes a shortcut: a block copy forward and strided sums backward.

Adaptive max pooling is not linear; it takes the maximum over the columns of each window,
then over its rows, keeping the first maximum as PyTorch does.

Window and index rules are PyTorch's:

* adaptive window ``i`` of ``out`` over ``size`` inputs: ``[floor(i*size/out),
  ceil((i+1)*size/out))``;
* nearest: source ``min(floor(i * scale), size - 1)`` with ``scale = 1/scale_factor`` when a
  scale factor was given, else ``size / out`` (computed in float32, like PyTorch's kernel);
* bilinear: source ``i * (size-1)/(out-1)`` with ``align_corners``, else
  ``max((i + 0.5) * scale - 0.5, 0)``, between its two neighbours.
"""

from __future__ import annotations

import math

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.function import Function
from bigdl_py.autograd.ops import cublas, reduce


# --- the per-axis weight matrices (built on the host, then moved next to the input) -------
def adaptive_windows(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """Start (inclusive) and end (exclusive) of each of ``out`` adaptive windows over ``size``."""
    index = np.arange(out)
    starts = (index * size) // out
    ends = -((-(index + 1) * size) // out)  # ceil division in integers: no float rounding
    return starts, ends


def adaptive_average_matrix(size: int, out: int) -> np.ndarray:
    """``(out, size)``: row ``i`` averages adaptive window ``i``."""
    starts, ends = adaptive_windows(size, out)
    positions = np.arange(size)
    inside = (positions >= starts[:, None]) & (positions < ends[:, None])
    return inside / (ends - starts)[:, None]


def nearest_sources(size: int, out: int, scale_factor: float | None) -> np.ndarray:
    """The input index each of ``out`` nearest-neighbour outputs copies."""
    scale = np.float32(1.0 / scale_factor if scale_factor else size / out)
    sources = np.minimum(np.floor(np.arange(out, dtype=np.float32) * scale), size - 1)
    return sources.astype(np.int64)


def nearest_matrix(size: int, out: int, scale_factor: float | None) -> np.ndarray:
    """``(out, size)``: row ``i`` picks the nearest-neighbour source of output ``i``."""
    matrix = np.zeros((out, size))
    matrix[np.arange(out), nearest_sources(size, out, scale_factor)] = 1.0
    return matrix


def repeat_factor(size: int, out: int, scale_factor: float | None) -> int | None:
    """``k`` when nearest-neighbour resizing repeats every input exactly ``k`` times, else None."""
    if out % size:
        return None
    factor = out // size
    sources = nearest_sources(size, out, scale_factor)
    return factor if np.array_equal(sources, np.arange(out) // factor) else None


def bilinear_matrix(
    size: int, out: int, scale_factor: float | None, align_corners: bool
) -> np.ndarray:
    """``(out, size)``: row ``i`` weighs the two neighbours of output ``i``'s source point."""
    index = np.arange(out, dtype=np.float64)
    if align_corners:
        sources = index * ((size - 1) / (out - 1)) if out > 1 else np.zeros(out)
    else:
        scale = 1.0 / scale_factor if scale_factor else size / out
        sources = np.maximum((index + 0.5) * scale - 0.5, 0.0)
    lower = np.minimum(np.floor(sources).astype(np.int64), size - 1)
    upper = np.minimum(lower + 1, size - 1)
    upper_weight = np.clip(sources - lower, 0.0, 1.0)
    matrix = np.zeros((out, size))
    rows = np.arange(out)
    # Added, not assigned: at the last input both neighbours are the same element.
    np.add.at(matrix, (rows, lower), 1.0 - upper_weight)
    np.add.at(matrix, (rows, upper), upper_weight)
    return matrix


def _check_4d(x, op_name: str) -> None:
    if x.ndim != 4:
        raise ValueError(f"{op_name}: input must be 4-d (N, C, H, W), got shape {tuple(x.shape)}")
    backend.check_floating(x.dtype, op_name)


class SeparableResample(Function):
    """``y[n, c] = rows @ x[n, c] @ columns^T`` for host weight matrices ``rows``, ``columns``."""

    def forward(self, x, rows=None, columns=None, op_name="resample"):
        _check_4d(x, op_name)
        xp = backend.array_module(x)
        device = backend.device_of(x)
        self.rows = backend.to_device(rows.astype(x.dtype), device)
        self.columns = backend.to_device(columns.astype(x.dtype), device)
        self.input_shape = x.shape
        return self._apply(xp, x, self.rows, self.columns)

    def backward(self, grad):
        xp = backend.array_module(grad)
        return self._apply(xp, grad, self.rows.T, self.columns.T)

    def _release_extra(self) -> None:
        self.rows = self.columns = None

    @staticmethod
    def _apply(xp, x, rows, columns):
        """``rows @ x @ columns^T`` over the last two axes, the smaller product first.

        Each step is ONE matrix product over the whole batch: ``tensordot`` moves the
        contracted axis to the front (a copy) and calls BLAS once. A stacked ``matmul`` of
        ``N*C`` tiny matrices instead makes ``N*C`` calls: 7x slower for ResNet's global
        pool, ``(64, 512, 8, 8)`` to ``(1, 1)``. On a device the stacked product is one
        strided-batched GEMM instead (``_apply_on_device``).
        """
        if type(x) is not np.ndarray:
            return SeparableResample._apply_on_device(x, rows, columns)
        batch, channels, height, width = x.shape
        out_height, out_width = rows.shape[0], columns.shape[0]
        maps = x.reshape(batch * channels, height, width)
        if out_width * height <= out_height * width:
            # Columns first: (N*C*H, W) @ (W, OW); then rows: (OH, H) . (N*C, H, OW).
            partial = (maps.reshape(-1, width) @ columns.T).reshape(batch * channels, height, -1)
            by_row = xp.tensordot(rows, partial, axes=([1], [1]))  # (OH, N*C, OW)
        else:
            # Rows first: (OH, H) . (N*C, H, W); then columns: (OH*N*C, W) @ (W, OW).
            partial = xp.tensordot(rows, maps, axes=([1], [1]))  # (OH, N*C, W)
            by_row = (partial.reshape(-1, width) @ columns.T).reshape(out_height, -1, out_width)
        result = xp.ascontiguousarray(by_row.transpose(1, 0, 2))
        return result.reshape(batch, channels, out_height, out_width)

    @staticmethod
    def _apply_on_device(x, rows, columns):
        """``_apply`` on device arrays: two products on the package's cuBLAS handle (which a
        CUDA graph can capture; CuPy's ``tensordot`` and ``matmul`` it cannot), ``rows``
        broadcast over the maps as one strided-batched call, so that no transpose copy is
        made; the smaller product first, as on the host."""
        batch, channels, height, width = x.shape
        out_height, out_width = rows.shape[0], columns.shape[0]
        maps = x.reshape(batch * channels, height, width)
        if out_width * height <= out_height * width:
            partial = cublas.matmul(maps.reshape(-1, width), columns.T)  # (N*C*H, OW)
            result = cublas.matmul(rows, partial.reshape(batch * channels, height, out_width))
        else:
            partial = cublas.matmul(rows, maps)  # (N*C, OH, W)
            result = cublas.matmul(partial.reshape(-1, width), columns.T)  # (N*C*OH, OW)
        return result.reshape(batch, channels, out_height, out_width)


class NearestRepeat(Function):
    """Nearest-neighbour up-sampling by whole factors: each input pixel becomes a block.

    The general ``SeparableResample`` costs ``H*W*OW`` multiply-adds for this; a copy into
    the blocks costs one pass. The backward sums each block with one strided slice per
    offset in the block (as 2-d pooling does), not a reduction over small inner axes.
    """

    def forward(self, x, factors=(2, 2)):
        _check_4d(x, "interpolate")
        xp = backend.array_module(x)
        self.factors = factors
        # Two repeats, not a copy of a broadcast 6-d view: NumPy copies that view with an
        # inner loop of length factors[1], 10x slower here.
        return xp.repeat(xp.repeat(x, factors[1], axis=3), factors[0], axis=2)

    def backward(self, grad):
        rows, columns = self.factors
        grad_x = grad[:, :, ::rows, ::columns].copy()
        for row in range(rows):
            for column in range(columns):
                if row or column:
                    grad_x += grad[:, :, row::rows, column::columns]
        return grad_x


class AdaptiveMaxPool2d(Function):
    """Maximum over adaptive windows; the gradient goes to each window's first maximum.

    A window is a rectangle of rows times columns, so its maximum is separable: first the
    maximum over each row's column window (``(N, C, H, OW)``), then over the row window.
    That reads ``KW*H*OW + KH*OH*OW`` values per channel instead of ``KH*KW*OH*OW`` for a
    gather of every window. Columns go first so that ties resolve as PyTorch's row-major
    scan does: the first row holding the maximum, and in it the first column.
    """

    def forward(self, x, output_size=(1, 1)):
        _check_4d(x, "adaptive_max_pool2d")
        xp = backend.array_module(x)
        height, width = x.shape[2:]
        device = backend.device_of(x)
        column_index = backend.to_device(_window_indices(width, output_size[1]), device)
        row_index = backend.to_device(_window_indices(height, output_size[0]), device)
        row_maxima, column_winner = _running_max(xp, x, column_index, axis=3)
        output, row_winner = _running_max(xp, row_maxima, row_index, axis=2)
        winner_column = xp.take_along_axis(column_winner, row_winner, axis=2)
        self.source = row_winner * width + winner_column  # flat index into each (H, W) map
        self.input_shape = x.shape
        return output

    def backward(self, grad):
        xp = backend.array_module(grad)
        batch, channels, height, width = self.input_shape
        rows = batch * channels
        grad_x = xp.zeros((rows * height * width,), dtype=grad.dtype)
        # Windows may overlap, so one input can be the maximum of several: add, never assign.
        offsets = (xp.arange(rows) * (height * width)).reshape(batch, channels, 1, 1)
        backend.scatter_add(grad_x, (self.source + offsets).reshape(-1), grad.reshape(-1))
        return grad_x.reshape(self.input_shape)

    def _release_extra(self) -> None:
        self.source = None


def _running_max(xp, values, window_index, axis: int):
    """Maximum of ``values`` over each window along ``axis``, and the index of its first maximum.

    ``window_index`` is ``(windows, longest)``: column ``k`` holds each window's ``k``-th
    input index. Windows shorter than the longest repeat their last element; a repeat never
    changes the maximum and, coming after the original, never wins a tie.
    """
    broadcast_shape = [1] * values.ndim
    broadcast_shape[axis] = window_index.shape[0]
    best = xp.take(values, window_index[:, 0], axis=axis)
    winner = xp.empty(best.shape, dtype=window_index.dtype)
    winner[...] = window_index[:, 0].reshape(broadcast_shape)
    for offset in range(1, window_index.shape[1]):
        candidates = xp.take(values, window_index[:, offset], axis=axis)
        # Strictly greater, so the earlier index keeps a tie. Arithmetic, not ``where``, on
        # a data-dependent mask (see rectifier.py).
        better = candidates > best
        winner += better * (window_index[:, offset].reshape(broadcast_shape) - winner)
        xp.maximum(best, candidates, out=best)
    return best, winner


def _window_indices(size: int, out: int) -> np.ndarray:
    """``(out, longest window)`` input indices of each adaptive window, last one repeated."""
    starts, ends = adaptive_windows(size, out)
    longest = int((ends - starts).max())
    return np.minimum(starts[:, None] + np.arange(longest), ends[:, None] - 1)


# --- functional API -----------------------------------------------------------------------
__all__ = [
    "adaptive_avg_pool2d",
    "adaptive_max_pool2d",
    "interpolate",
    "resolve_resize",
]


def _output_pair(output_size, height: int, width: int, op_name: str) -> tuple[int, int]:
    """PyTorch's ``output_size``: an int, or a pair whose ``None`` keeps the input's size."""
    if isinstance(output_size, (int, np.integer)) and not isinstance(output_size, bool):
        pair = (output_size, output_size)
    elif isinstance(output_size, (tuple, list)) and len(output_size) == 2:
        pair = tuple(output_size)
    else:
        raise ValueError(
            f"{op_name}: output_size must be an int or a pair (None keeps that axis), "
            f"got {output_size!r}"
        )
    resolved = tuple(
        int(value) if value is not None else size
        for value, size in zip(pair, (height, width), strict=True)
    )
    if min(resolved) < 1:
        raise ValueError(f"{op_name}: output_size must be >= 1, got {output_size!r}")
    return resolved


def adaptive_avg_pool2d(x, output_size):
    """Average ``(N, C, H, W)`` input over adaptive windows to ``output_size``.

    Parameters
    ----------
    x : Tensor
        Input of shape ``(N, C, H, W)``.
    output_size : int or (int or None, int or None)
        ``(OH, OW)``; ``None`` keeps that axis's input size. Window ``i`` of an axis covers
        ``[floor(i*H/OH), ceil((i+1)*H/OH))``, as in PyTorch.

    Returns
    -------
    Tensor
        Shape ``(N, C, OH, OW)``.
    """
    _check_4d(x, "adaptive_avg_pool2d")
    height, width = x.shape[2:]
    out_height, out_width = _output_pair(output_size, height, width, "adaptive_avg_pool2d")
    if (out_height, out_width) == (1, 1):
        # Global pooling (the end of every residual network) is a plain mean: 2-5x faster
        # than the two matrix products on ResNet-sized maps.
        return reduce.Mean.apply(x, axis=(2, 3), keepdims=True)
    return SeparableResample.apply(
        x,
        rows=adaptive_average_matrix(height, out_height),
        columns=adaptive_average_matrix(width, out_width),
        op_name="adaptive_avg_pool2d",
    )


def adaptive_max_pool2d(x, output_size):
    """Maximum of ``(N, C, H, W)`` input over adaptive windows (see ``adaptive_avg_pool2d``).

    The gradient of each window goes to its first maximum in row-major order, as in PyTorch.
    """
    _check_4d(x, "adaptive_max_pool2d")
    height, width = x.shape[2:]
    pair = _output_pair(output_size, height, width, "adaptive_max_pool2d")
    return AdaptiveMaxPool2d.apply(x, output_size=pair)


def interpolate(
    x,
    size=None,
    scale_factor=None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
):
    """Resize ``(N, C, H, W)`` input to ``size`` or by ``scale_factor`` (PyTorch's rules).

    Parameters
    ----------
    x : Tensor
        Input of shape ``(N, C, H, W)``.
    size : int or (int, int), optional
        Output ``(OH, OW)``. Give exactly one of ``size`` and ``scale_factor``.
    scale_factor : float or (float, float), optional
        Output size ``floor(H * scale_factor)``; the source of each output is computed from
        ``1 / scale_factor`` unless ``recompute_scale_factor``.
    mode : {'nearest', 'bilinear'}
    align_corners : bool, optional
        Bilinear only (default False): map the corner pixels' centres onto each other.
    recompute_scale_factor : bool, optional
        With ``scale_factor``: True places sources by ``H / OH`` of the computed size.

    Raises
    ------
    ValueError
        Naming the bad setting or shape.
    """
    _check_4d(x, "interpolate")
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"interpolate: mode must be 'nearest' or 'bilinear', got {mode!r}")
    if mode == "nearest" and align_corners is not None:
        raise ValueError("interpolate: align_corners applies to mode='bilinear' only")
    height, width = x.shape[2:]
    out_size, scales = resolve_resize(size, scale_factor, (height, width), "interpolate")
    _check_fits(x, out_size, 0, "interpolate")
    if recompute_scale_factor:
        if size is not None:
            raise ValueError(
                "interpolate: recompute_scale_factor is meaningful with scale_factor only"
            )
        scales = (None, None)  # place the sources as for an explicit size
    if mode == "nearest":
        factors = tuple(
            repeat_factor(size, out, scale)
            for size, out, scale in zip((height, width), out_size, scales, strict=True)
        )
        if None not in factors:
            return NearestRepeat.apply(x, factors=factors)
        _check_fits(x, out_size, _matrix_bytes((height, width), out_size), "interpolate")
        rows = nearest_matrix(height, out_size[0], scales[0])
        columns = nearest_matrix(width, out_size[1], scales[1])
    else:
        _check_fits(x, out_size, _matrix_bytes((height, width), out_size), "interpolate")
        corners = bool(align_corners)
        rows = bilinear_matrix(height, out_size[0], scales[0], corners)
        columns = bilinear_matrix(width, out_size[1], scales[1], corners)
    return SeparableResample.apply(x, rows=rows, columns=columns, op_name="interpolate")


def _matrix_bytes(input_hw, out_size) -> int:
    """Bytes of the ``(OH, H)`` and ``(OW, W)`` float64 resampling matrices."""
    return 8 * (out_size[0] * input_hw[0] + out_size[1] * input_hw[1])


def _check_fits(x, out_size, extra_bytes: int, op_name: str) -> None:
    """Refuse a resize whose output (plus ``extra_bytes`` of work arrays) is larger than the
    memory of the input's device: it could never be allocated (PyTorch refuses sizes that
    overflow; a size this large is a typo in ``scale_factor`` or ``size``), and trying
    would page for minutes or be killed. Sizes are Python ints, so nothing overflows."""
    batch, channels = (int(n) for n in x.shape[:2])
    needed = batch * channels * out_size[0] * out_size[1] * np.dtype(x.dtype).itemsize
    needed += extra_bytes
    where = x.device if isinstance(x.device, backend.Device) else backend.device_of(x)
    available = backend.memory_bytes(where)
    # Without a known memory size, NumPy's own limit: an array's bytes fit an intp.
    limit = np.iinfo(np.intp).max if available is None else available
    if needed > limit:
        with_work = " with its resampling matrices" if extra_bytes else ""
        raise ValueError(
            f"{op_name}: the requested output size {tuple(out_size)} makes an output of "
            f"{(batch, channels, *out_size)} ({needed:,} bytes{with_work}), more than the "
            f"{limit:,} bytes of memory of device {where}; check size and scale_factor"
        )


def resolve_resize(size, scale_factor, input_hw, op_name: str):
    """``((OH, OW), (scale_h or None, scale_w or None))`` from exactly one of the two settings."""
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{op_name}: give exactly one of size and scale_factor")
    if size is not None:
        pair = _number_pair(size, "size", op_name, integer=True)
        return pair, (None, None)
    scales = _number_pair(scale_factor, "scale_factor", op_name, integer=False)
    out_size = tuple(math.floor(s * f) for s, f in zip(input_hw, scales, strict=True))
    if min(out_size) < 1:
        raise ValueError(
            f"{op_name}: scale_factor {scale_factor!r} makes an empty output from input size "
            f"{tuple(input_hw)}"
        )
    return out_size, scales


def _number_pair(value, name: str, op_name: str, integer: bool) -> tuple:
    """A positive number or a pair of them (ints only when ``integer``); NaN and infinity
    are refused (``nan <= 0`` is False, so they would pass a bare range test)."""
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    items = value if isinstance(value, (tuple, list)) else (value, value)
    if len(items) != 2 or any(
        isinstance(item, bool)
        or not isinstance(item, kinds)
        or not math.isfinite(item)
        or item <= 0
        for item in items
    ):
        kind = "integer" if integer else "finite number"
        raise ValueError(
            f"{op_name}: {name} must be a positive {kind} or a pair of them, got {value!r}"
        )
    return tuple(int(item) if integer else float(item) for item in items)
