"""Convolutions: ``Conv1d`` (BigDL's ``TemporalConvolution``), ``Conv2d``
(``SpatialConvolution``) and ``ConvTranspose2d`` (``SpatialFullConvolution``)."""

from __future__ import annotations

import math
from typing import Any

from bigdl_py.autograd import ops
from bigdl_py.nn import init
from bigdl_py.nn.layers._arguments import check_flag, check_positive_int, int_pair, is_integer
from bigdl_py.nn.layers._base import (
    check_floating_input,
    check_ndim,
    empty_parameter,
    label,
    parameter_dtype,
)
from bigdl_py.nn.module import Module

__all__ = ["Conv1d", "Conv2d", "ConvTranspose2d"]


def _reset_convolution(weight, bias) -> None:
    """PyTorch's default for every convolution: weight and bias ``U(-1/sqrt(fan_in), ...)``.

    ``fan_in`` is ``weight.shape[1] * kernel size``: ``in_channels/groups*K`` for a
    convolution, ``out_channels/groups*K`` for a transposed one (PyTorch's too).
    """
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = init.fan_in_and_fan_out(weight)
        bound = 1.0 / math.sqrt(fan_in)
        init.uniform_(bias, -bound, bound)


def _int_single(value: Any, name: str, layer_name: str, minimum: int = 1) -> int:
    """A 1-d setting: an int or a 1-tuple (PyTorch's ``Conv1d`` takes both)."""
    if isinstance(value, (tuple, list)) and len(value) == 1:
        value = value[0]
    if not is_integer(value):
        raise ValueError(f"{layer_name}: {name} must be an int or a 1-tuple, got {value!r}")
    if value < minimum:
        raise ValueError(f"{layer_name}: {name} must be >= {minimum}, got {value!r}")
    return int(value)


def _check_groups(layer_name: str, groups: Any, in_channels: int, out_channels: int) -> int:
    groups = check_positive_int(groups, "groups", layer_name)
    if in_channels % groups or out_channels % groups:
        raise ValueError(
            f"{layer_name}: groups={groups} must divide in_channels={in_channels} and "
            f"out_channels={out_channels}"
        )
    return groups


def _check_input(layer: Module, x: Any, ndim: int, layout: str, in_channels: int) -> None:
    """The input's rank, dtype and channel count, with errors naming the layer."""
    check_ndim(layer, x, (ndim,), layout)
    check_floating_input(layer, x)
    if x.shape[1] != in_channels:
        raise ValueError(
            f"{label(layer)}: input has {x.shape[1]} channels (shape {tuple(x.shape)}); "
            f"expected {in_channels}"
        )


class _Convolution(Module):
    """What every convolution layer shares: its parameters, their initialisation, its repr."""

    def _create_parameters(self, weight_shape: tuple, bias: bool, dtype: Any) -> None:
        has_bias = check_flag(bias, "bias", type(self).__name__)
        self.weight = empty_parameter(weight_shape, dtype)
        if has_bias:
            self.bias = empty_parameter((self.out_channels,), dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: kaiming-uniform with a=sqrt(5), i.e. bound 1/sqrt(fan_in)."""
        _reset_convolution(self.weight, self.bias)

    def extra_repr(self) -> str:
        text = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}"
        )
        # Settings at their defaults are left out, as PyTorch does (ints or pairs alike).
        for name, default in (("padding", 0), ("output_padding", 0), ("dilation", 1)):
            value = getattr(self, name, default)
            if value not in (default, (default, default)):
                text += f", {name}={value}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        return text


class Conv1d(_Convolution):
    """1-d cross-correlation over an ``(N, C, L)`` input, as ``torch.nn.Conv1d``.

    Parameters
    ----------
    in_channels, out_channels : int
    kernel_size : int
    stride : int
        Default 1.
    padding : int
        Zeros added on both ends (default 0).
    dilation : int
        Spacing between kernel taps (default 1).
    groups : int
        Split channels into independent groups; must divide both channel counts.
    bias : bool
        Learn a per-output-channel bias (default True).
    dtype : dtype or str, optional
        Parameter dtype (default float32).

    Notes
    -----
    ``weight`` has shape ``(out_channels, in_channels // groups, K)`` and starts, like the
    bias, as ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` with ``fan_in = in_channels/groups*K``.
    Output length is ``(L + 2*padding - dilation*(K-1) - 1) // stride + 1``. Each setting
    may also be a 1-tuple, as PyTorch allows.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = 0,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
        dtype: Any = None,
    ):
        super().__init__()
        self.in_channels = check_positive_int(in_channels, "in_channels", "Conv1d")
        self.out_channels = check_positive_int(out_channels, "out_channels", "Conv1d")
        self.kernel_size = _int_single(kernel_size, "kernel_size", "Conv1d")
        self.stride = _int_single(stride, "stride", "Conv1d")
        self.padding = _int_single(padding, "padding", "Conv1d", minimum=0)
        self.dilation = _int_single(dilation, "dilation", "Conv1d")
        self.groups = _check_groups("Conv1d", groups, self.in_channels, self.out_channels)
        dtype = parameter_dtype(dtype, "Conv1d")
        self._create_parameters(
            (self.out_channels, self.in_channels // self.groups, self.kernel_size), bias, dtype
        )

    def forward(self, x):
        _check_input(self, x, 3, "(N, C, L)", self.in_channels)
        extent = self.dilation * (self.kernel_size - 1) + 1
        if extent > x.shape[2] + 2 * self.padding:
            raise ValueError(
                f"{label(self)}: input of shape {tuple(x.shape)} is shorter than the (dilated) "
                f"kernel extent {extent} even with padding {self.padding}"
            )
        return ops.conv1d(
            x,
            self.weight,
            self.bias,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
        )


class Conv2d(_Convolution):
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
        self.groups = _check_groups("Conv2d", groups, self.in_channels, self.out_channels)
        dtype = parameter_dtype(dtype, "Conv2d")
        self._create_parameters(
            (self.out_channels, self.in_channels // self.groups, *self.kernel_size), bias, dtype
        )

    def forward(self, x):
        _check_input(self, x, 4, "(N, C, H, W)", self.in_channels)
        return ops.conv2d(
            x,
            self.weight,
            self.bias,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
        )


class ConvTranspose2d(_Convolution):
    """2-d transposed convolution over an ``(N, C, H, W)`` input, as ``torch.nn.ConvTranspose2d``.

    The adjoint of a ``Conv2d`` in its input: it maps a conv2d's output shape back to its
    input shape, which makes it the up-sampling layer of generators and decoders.

    Parameters
    ----------
    in_channels, out_channels : int
    kernel_size : int or (int, int)
    stride : int or (int, int)
        Default 1.
    padding : int or (int, int)
        ``dilation * (kernel_size - 1) - padding`` zeros are, in effect, added to each side of
        the input (default 0).
    output_padding : int or (int, int)
        Rows and columns added at the bottom and right of the output (default 0); must be
        smaller than the stride or the dilation.
    groups : int
        Split channels into independent groups; must divide both channel counts.
    bias : bool
        Learn a per-output-channel bias (default True).
    dilation : int or (int, int)
        Spacing between kernel taps (default 1).
    dtype : dtype or str, optional
        Parameter dtype (default float32).

    Notes
    -----
    The arguments come in PyTorch's order (``groups`` and ``bias`` before ``dilation``).
    ``weight`` has shape ``(in_channels, out_channels // groups, KH, KW)`` and starts, like
    the bias, as ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` with
    ``fan_in = out_channels/groups*KH*KW`` (PyTorch's default). Output height is
    ``(H - 1)*stride - 2*padding + dilation*(KH - 1) + output_padding + 1``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        output_padding: int | tuple[int, int] = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: int | tuple[int, int] = 1,
        dtype: Any = None,
    ):
        super().__init__()
        name = "ConvTranspose2d"
        self.in_channels = check_positive_int(in_channels, "in_channels", name)
        self.out_channels = check_positive_int(out_channels, "out_channels", name)
        self.kernel_size = int_pair(kernel_size, "kernel_size", name)
        self.stride = int_pair(stride, "stride", name)
        self.padding = int_pair(padding, "padding", name, minimum=0)
        self.output_padding = int_pair(output_padding, "output_padding", name, minimum=0)
        self.dilation = int_pair(dilation, "dilation", name)
        self.groups = _check_groups(name, groups, self.in_channels, self.out_channels)
        for axis in (0, 1):
            if self.output_padding[axis] >= max(self.stride[axis], self.dilation[axis]):
                raise ValueError(
                    f"{name}: output_padding {self.output_padding} must be smaller than either "
                    f"the stride {self.stride} or the dilation {self.dilation} on each axis"
                )
        dtype = parameter_dtype(dtype, name)
        self._create_parameters(
            (self.in_channels, self.out_channels // self.groups, *self.kernel_size), bias, dtype
        )

    def forward(self, x):
        _check_input(self, x, 4, "(N, C, H, W)", self.in_channels)
        return ops.conv_transpose2d(
            x,
            self.weight,
            self.bias,
            stride=self.stride,
            padding=self.padding,
            output_padding=self.output_padding,
            groups=self.groups,
            dilation=self.dilation,
        )
