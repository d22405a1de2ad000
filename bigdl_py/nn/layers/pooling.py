"""2-d max and average pooling (BigDL's ``SpatialMaxPooling``, ``SpatialAveragePooling``)."""

from __future__ import annotations

from bigdl_py.autograd import ops
from bigdl_py.nn.layers._base import check_ndim, int_pair
from bigdl_py.nn.module import Module

__all__ = ["AvgPool2d", "MaxPool2d"]


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
