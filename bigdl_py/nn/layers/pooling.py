"""Pooling (2-d, 1-d, adaptive) and up-sampling (BigDL's ``SpatialMaxPooling``,
``SpatialAveragePooling``, ``TemporalMaxPooling``, ``SpatialAdaptiveMaxPooling``, ...)."""

from __future__ import annotations

from bigdl_py.autograd import ops
from bigdl_py.nn.layers._arguments import (
    check_flag,
    check_int,
    check_positive_int,
    int_pair,
    is_integer,
)
from bigdl_py.nn.layers._base import check_ndim, label
from bigdl_py.nn.module import Module

__all__ = [
    "AdaptiveAvgPool2d",
    "AdaptiveMaxPool2d",
    "AvgPool1d",
    "AvgPool2d",
    "MaxPool1d",
    "MaxPool2d",
    "Upsample",
]


class _Pool2d(Module):
    """Settings and checks shared by the two pooling layers."""

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] | None = None,
        padding: int | tuple[int, int] = 0,
    ):
        super().__init__()
        name = type(self).__name__
        self.kernel_size = int_pair(kernel_size, "kernel_size", name)
        self.stride = self.kernel_size if stride is None else int_pair(stride, "stride", name)
        self.padding = int_pair(padding, "padding", name, minimum=0)
        if any(2 * p > k for p, k in zip(self.padding, self.kernel_size, strict=True)):
            raise ValueError(
                f"{name}: padding {self.padding} must be at most half of kernel_size "
                f"{self.kernel_size}"
            )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxPool2d(_Pool2d):
    """Maximum over ``kernel_size`` windows of an ``(N, C, H, W)`` input.

    Parameters
    ----------
    kernel_size : int or (int, int)
    stride : int or (int, int), optional
        Default: ``kernel_size`` (non-overlapping windows).
    padding : int or (int, int)
        Implicit padding that never wins the max; at most half the kernel.

    Notes
    -----
    Output sizes round down, like PyTorch's default ``ceil_mode=False``.
    """

    def forward(self, x):
        check_ndim(self, x, (4,), "(N, C, H, W)")
        return ops.max_pool2d(x, self.kernel_size, self.stride, self.padding)


class AvgPool2d(_Pool2d):
    """Mean over ``kernel_size`` windows of an ``(N, C, H, W)`` input.

    Parameters
    ----------
    kernel_size : int or (int, int)
    stride : int or (int, int), optional
        Default: ``kernel_size``.
    padding : int or (int, int)
        Zero padding, counted in each window's divisor (PyTorch's ``count_include_pad=True``).
    """

    def forward(self, x):
        check_ndim(self, x, (4,), "(N, C, H, W)")
        return ops.avg_pool2d(x, self.kernel_size, self.stride, self.padding)


class _Pool1d(Module):
    """1-d pooling of ``(N, C, L)`` input as 2-d pooling of ``(N, C, 1, L)`` with a 1-row kernel."""

    def __init__(self, kernel_size: int, stride: int | None = None, padding: int = 0):
        super().__init__()
        name = type(self).__name__
        self.kernel_size = check_positive_int(kernel_size, "kernel_size", name)
        self.stride = (
            self.kernel_size if stride is None else check_positive_int(stride, "stride", name)
        )
        self.padding = check_int(padding, "padding", name, minimum=0)
        if 2 * self.padding > self.kernel_size:
            raise ValueError(
                f"{name}: padding {self.padding} must be at most half of kernel_size "
                f"{self.kernel_size}"
            )

    def _pool(self, x, pool_2d):
        check_ndim(self, x, (3,), "(N, C, L)")
        batch, channels, length = x.shape
        if length + 2 * self.padding < self.kernel_size:
            raise ValueError(
                f"{label(self)}: input length {length} (shape {tuple(x.shape)}) with padding "
                f"{self.padding} is shorter than kernel_size {self.kernel_size}"
            )
        pooled = pool_2d(
            ops.reshape(x, (batch, channels, 1, length)),
            (1, self.kernel_size),
            (1, self.stride),
            (0, self.padding),
        )
        return ops.reshape(pooled, (batch, channels, pooled.shape[3]))

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxPool1d(_Pool1d):
    """Maximum over ``kernel_size`` windows of an ``(N, C, L)`` input (BigDL's
    ``TemporalMaxPooling`` on ``(N, L, C)``).

    Parameters
    ----------
    kernel_size : int
    stride : int, optional
        Default: ``kernel_size``.
    padding : int
        Implicit padding on both ends that never wins the max; at most half the kernel.

    dilation, return_indices, ceil_mode
        Accepted for PyTorch's signature; only their defaults (1, False, False) are
        supported: output lengths round down.

    Notes
    -----
    A tie sends the gradient to the first maximum, as in PyTorch.
    """

    def __init__(
        self,
        kernel_size: int,
        stride: int | None = None,
        padding: int = 0,
        dilation: int = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ):
        _refuse_unsupported(
            "MaxPool1d",
            dilation=(dilation, 1),
            return_indices=(return_indices, False),
            ceil_mode=(ceil_mode, False),
        )
        super().__init__(kernel_size, stride, padding)

    def forward(self, x):
        return self._pool(x, ops.max_pool2d)


class AvgPool1d(_Pool1d):
    """Mean over ``kernel_size`` windows of an ``(N, C, L)`` input.

    Parameters
    ----------
    kernel_size : int
    stride : int, optional
        Default: ``kernel_size``.
    padding : int
        Zero padding on both ends, counted in each window's divisor; at most half the kernel.
    ceil_mode, count_include_pad
        Accepted for PyTorch's signature; only their defaults (False, True) are supported.
    """

    def __init__(
        self,
        kernel_size: int,
        stride: int | None = None,
        padding: int = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ):
        _refuse_unsupported(
            "AvgPool1d",
            ceil_mode=(ceil_mode, False),
            count_include_pad=(count_include_pad, True),
        )
        super().__init__(kernel_size, stride, padding)

    def forward(self, x):
        return self._pool(x, ops.avg_pool2d)


def _refuse_unsupported(layer_name: str, **settings) -> None:
    """Raise naming the first PyTorch setting given a value other than the supported one."""
    for name, (value, supported) in settings.items():
        # ``True == 1``: a bool given for an int setting (or the reverse) is a mistake too.
        if value != supported or isinstance(value, bool) != isinstance(supported, bool):
            raise ValueError(
                f"{layer_name}: {name}={value!r} is not supported (only {name}={supported!r})"
            )


class _AdaptivePool2d(Module):
    """The ``output_size`` setting shared by the adaptive pools."""

    def __init__(self, output_size: int | tuple[int | None, int | None]):
        super().__init__()
        self.output_size = _adaptive_output_size(output_size, type(self).__name__)

    def _check_input(self, x) -> None:
        check_ndim(self, x, (4,), "(N, C, H, W)")
        if min(x.shape[2:]) < 1:
            raise ValueError(f"{label(self)}: input has an empty spatial axis, shape {x.shape}")

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


def _adaptive_output_size(value, layer_name: str):
    """An int or a pair of (int or None), kept as given (a list from JSON becomes a tuple)."""
    if is_integer(value) and value >= 1:
        return int(value)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        if all(v is None or (is_integer(v) and v >= 1) for v in value):
            return tuple(None if v is None else int(v) for v in value)
    raise ValueError(
        f"{layer_name}: output_size must be a positive int or a pair of positive ints "
        f"(None keeps that axis), got {value!r}"
    )


class AdaptiveAvgPool2d(_AdaptivePool2d):
    """Average ``(N, C, H, W)`` input over windows sized to give ``output_size``.

    Parameters
    ----------
    output_size : int or (int or None, int or None)
        ``(OH, OW)`` (an int means square); ``None`` keeps that axis's input size. Window
        ``i`` covers ``[floor(i*H/OH), ceil((i+1)*H/OH))``, as in PyTorch, so windows may
        differ in size and overlap when ``OH`` does not divide ``H``.

    Notes
    -----
    ``AdaptiveAvgPool2d(1)`` is the global average pooling at the end of residual networks.
    """

    def forward(self, x):
        self._check_input(x)
        return ops.adaptive_avg_pool2d(x, self.output_size)


class AdaptiveMaxPool2d(_AdaptivePool2d):
    """Maximum of ``(N, C, H, W)`` input over windows sized to give ``output_size``.

    Parameters
    ----------
    output_size : int or (int or None, int or None)
        As for :class:`AdaptiveAvgPool2d`.
    return_indices : bool
        Must be False: returning the positions of the maxima is not supported.

    Notes
    -----
    The gradient of a window goes to its first maximum in row-major order, like PyTorch.
    """

    def __init__(
        self, output_size: int | tuple[int | None, int | None], return_indices: bool = False
    ):
        if check_flag(return_indices, "return_indices", "AdaptiveMaxPool2d"):
            raise ValueError("AdaptiveMaxPool2d: return_indices=True is not supported")
        super().__init__(output_size)

    def forward(self, x):
        self._check_input(x)
        return ops.adaptive_max_pool2d(x, self.output_size)


class Upsample(Module):
    """Resize ``(N, C, H, W)`` input by nearest-neighbour or bilinear interpolation.

    Parameters
    ----------
    size : int or (int, int), optional
        Output ``(OH, OW)``.
    scale_factor : float or (float, float), optional
        Output ``floor(H * scale_factor)``. Give exactly one of ``size`` and ``scale_factor``.
    mode : {'nearest', 'bilinear'}
        Default ``'nearest'``.
    align_corners : bool, optional
        Bilinear only (default False): with True the corner pixels of input and output are
        aligned and the scale is ``(H - 1) / (OH - 1)``; with False pixels are squares and
        the scale is ``H / OH`` (or ``1 / scale_factor``).
    recompute_scale_factor : bool, optional
        With a ``scale_factor``: True places the source pixels by ``H / OH`` of the
        computed output size instead of ``1 / scale_factor`` (they differ when
        ``H * scale_factor`` is not whole), as in PyTorch.

    Notes
    -----
    Source positions follow PyTorch's ``interpolate``, so outputs match PyTorch's for
    fractional scale factors too. BigDL's
    ``UpSampling2D(size)`` is ``Upsample(scale_factor=size)`` and its ``ResizeBilinear``
    is ``Upsample(size=..., mode="bilinear")``.
    """

    def __init__(
        self,
        size: int | tuple[int, int] | None = None,
        scale_factor: float | tuple[float, float] | None = None,
        mode: str = "nearest",
        align_corners: bool | None = None,
        recompute_scale_factor: bool | None = None,
    ):
        super().__init__()
        if mode not in ("nearest", "bilinear"):
            raise ValueError(f"Upsample: mode must be 'nearest' or 'bilinear', got {mode!r}")
        align_corners = check_flag(align_corners, "align_corners", "Upsample", none_allowed=True)
        recompute_scale_factor = check_flag(
            recompute_scale_factor, "recompute_scale_factor", "Upsample", none_allowed=True
        )
        if mode == "nearest" and align_corners is not None:
            raise ValueError(
                "Upsample: align_corners applies to mode='bilinear' only, got "
                f"align_corners={align_corners!r} with mode='nearest'"
            )
        # The checks of ``interpolate``, run now so a bad setting fails at construction.
        ops.resolve_resize(size, scale_factor, (1 << 20, 1 << 20), "Upsample")
        if recompute_scale_factor and size is not None:
            raise ValueError(
                "Upsample: recompute_scale_factor is meaningful with scale_factor only"
            )
        self.recompute_scale_factor = recompute_scale_factor
        self.size = tuple(size) if isinstance(size, list) else size
        self.scale_factor = tuple(scale_factor) if isinstance(scale_factor, list) else scale_factor
        self.mode = mode
        self.align_corners = align_corners

    def forward(self, x):
        check_ndim(self, x, (4,), "(N, C, H, W)")
        try:
            return ops.interpolate(
                x,
                self.size,
                self.scale_factor,
                self.mode,
                self.align_corners,
                self.recompute_scale_factor,
            )
        except ValueError as error:
            raise ValueError(f"{label(self)}: {error} (input shape {tuple(x.shape)})") from None

    def extra_repr(self) -> str:
        if self.size is not None:
            setting = f"size={self.size}"
        else:
            setting = f"scale_factor={self.scale_factor}"
        corners = "" if self.align_corners is None else f", align_corners={self.align_corners}"
        if self.recompute_scale_factor is not None:
            corners += f", recompute_scale_factor={self.recompute_scale_factor}"
        return f"{setting}, mode={self.mode!r}{corners}"
