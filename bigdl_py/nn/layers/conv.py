"""2-d convolution (BigDL's ``SpatialConvolution``)."""

from __future__ import annotations

import math
from typing import Any

from bigdl_py.autograd import ops
from bigdl_py.nn import init
from bigdl_py.nn.layers._base import (
    check_ndim,
    check_positive_int,
    empty_parameter,
    int_pair,
    label,
    parameter_dtype,
)
from bigdl_py.nn.module import Module

__all__ = ["Conv2d"]


class Conv2d(Module):
    """2-d cross-correlation over an ``(N, C, H, W)`` input, as ``torch.nn.Conv2d``.

    Parameters
    ----------
    in_channels, out_channels : int
    kernel_size : int or (int, int)
    stride : int or (int, int)
        Default 1.
    padding : int or (int, int)
        Zeros added on both sides of each spatial axis (default 0).
    dilation : int or (int, int)
        Spacing between kernel taps (default 1).
    groups : int
        Split channels into independent groups; must divide both channel counts.
    bias : bool
        Learn a per-output-channel bias (default True).
    dtype : dtype or str, optional
        Parameter dtype (default float32).

    Notes
    -----
    ``weight`` has shape ``(out_channels, in_channels // groups, KH, KW)``; weight and bias
    start as ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` with ``fan_in = in_channels/groups*KH*KW``,
    PyTorch's default. Output height is ``(H + 2*padding - dilation*(KH-1) - 1) // stride + 1``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        dtype: Any = None,
    ):
        super().__init__()
        self.in_channels = check_positive_int(in_channels, "in_channels", "Conv2d")
        self.out_channels = check_positive_int(out_channels, "out_channels", "Conv2d")
        self.kernel_size = int_pair(kernel_size, "kernel_size", "Conv2d")
        self.stride = int_pair(stride, "stride", "Conv2d")
        self.padding = int_pair(padding, "padding", "Conv2d", minimum=0)
        self.dilation = int_pair(dilation, "dilation", "Conv2d")
        self.groups = check_positive_int(groups, "groups", "Conv2d")
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(
                f"Conv2d: groups={self.groups} must divide in_channels={self.in_channels} and "
                f"out_channels={self.out_channels}"
            )
        dtype = parameter_dtype(dtype, "Conv2d")
        weight_shape = (self.out_channels, self.in_channels // self.groups, *self.kernel_size)
        self.weight = empty_parameter(weight_shape, dtype)
        if bias:
            self.bias = empty_parameter((self.out_channels,), dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: kaiming-uniform with a=sqrt(5), i.e. bound 1/sqrt(fan_in)."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init.fan_in_and_fan_out(self.weight)
            bound = 1.0 / math.sqrt(fan_in)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        check_ndim(self, x, (4,), "(N, C, H, W)")
        if x.shape[1] != self.in_channels:
            raise ValueError(
                f"{label(self)}: input has {x.shape[1]} channels (shape {tuple(x.shape)}); "
                f"expected {self.in_channels}"
            )
        return ops.conv2d(
            x,
            self.weight,
            self.bias,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
        )

    def extra_repr(self) -> str:
        text = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}"
        )
        if self.padding != (0, 0):
            text += f", padding={self.padding}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        return text
