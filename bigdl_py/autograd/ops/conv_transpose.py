"""2-d transposed convolution: conv2d's input gradient run forwards.

``conv_transpose2d(x, weight)`` with ``weight (C_in, C_out/g, KH, KW)`` is the adjoint, in its
input, of a conv2d from ``C_out`` to ``C_in`` channels with the same weight and settings.
So both directions reuse conv2d's machinery (``conv.py``) with the roles swapped:

* forward: ``conv.transposed_convolution`` (col2im, or for stride 1 the flipped-kernel
  convolution, whichever moves less memory);
* input gradient: a plain conv2d of the output gradient;
* weight gradient: conv2d's weight gradient with the output gradient as the input and ``x``
  as the output's gradient, ``x @ columns(output gradient)^T``, tile by tile.

float32 NumPy operands take the same three through oneDNN's kernels (``conv_onednn``) where
its library is installed, CuPy operands through cuDNN's (``conv_cudnn``), as conv2d does.

``output_padding`` adds rows and columns at the bottom and right of the output (so that a
strided transposed convolution can reach every size a conv2d's input could have had); it
must be smaller than the stride or the dilation, as in PyTorch.
"""

from __future__ import annotations

from bigdl_py.autograd.function import Function
from bigdl_py.autograd.ops import conv_routes
from bigdl_py.autograd.ops.conv import (
    convolution_weight_gradient,
    convolve,
    pair,
    transposed_convolution,
)

OP_NAME = "conv_transpose2d"


def output_size(
    size: int, kernel: int, stride: int, padding: int, output_padding: int, dilation: int
) -> int:
    """Output length along one axis: ``(size-1)*stride - 2*padding + dilation*(kernel-1) +
    output_padding + 1``, as in PyTorch."""
    return (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1


def _check_settings(x, weight, bias, stride, padding, output_padding, dilation, groups):
    """Raise errors that name conv_transpose2d, the shapes and the offending setting."""
    if x.ndim != 4:
        raise ValueError(f"{OP_NAME}: input must be 4-d (N, C, H, W), got shape {tuple(x.shape)}")
    if weight.ndim != 4:
        raise ValueError(
            f"{OP_NAME}: weight must be 4-d (in_channels, out_channels/groups, KH, KW), got "
            f"shape {tuple(weight.shape)}"
        )
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or min(output_padding) < 0:
        raise ValueError(
            f"{OP_NAME}: stride and dilation must be >= 1, padding and output_padding >= 0, got "
            f"stride {stride}, dilation {dilation}, padding {padding}, output_padding "
            f"{output_padding}"
        )
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{OP_NAME}: groups must be a positive int, got {groups!r}")
    for axis in (0, 1):
        if output_padding[axis] >= max(stride[axis], dilation[axis]):
            raise ValueError(
                f"{OP_NAME}: output_padding {output_padding} must be smaller than either the "
                f"stride {stride} or the dilation {dilation} on each axis"
            )
    in_channels = x.shape[1]
    if weight.shape[0] != in_channels:
        raise ValueError(
            f"{OP_NAME}: input of shape {tuple(x.shape)} has {in_channels} channels but the "
            f"weight of shape {tuple(weight.shape)} expects {weight.shape[0]}"
        )
    if in_channels % groups:
        raise ValueError(
            f"{OP_NAME}: groups={groups} must divide the input channels ({in_channels})"
        )
    out_channels = weight.shape[1] * groups
    if bias is not None and tuple(bias.shape) != (out_channels,):
        raise ValueError(
            f"{OP_NAME}: bias must have shape ({out_channels},), got {tuple(bias.shape)}"
        )


class ConvTranspose2d(Function):
    """2-d transposed convolution over NCHW input (PyTorch's ``conv_transpose2d``)."""

    def forward(
        self,
        x,
        weight,
        bias=None,
        stride=1,
        padding=0,
        output_padding=0,
        dilation=1,
        groups=1,
    ):
        stride = pair(stride, "stride", OP_NAME)
        padding = pair(padding, "padding", OP_NAME)
        output_padding = pair(output_padding, "output_padding", OP_NAME)
        dilation = pair(dilation, "dilation", OP_NAME)
        _check_settings(x, weight, bias, stride, padding, output_padding, dilation, groups)
        out_hw = tuple(
            output_size(
                x.shape[2 + a],
                weight.shape[2 + a],
                stride[a],
                padding[a],
                output_padding[a],
                dilation[a],
            )
            for a in (0, 1)
        )
        if min(out_hw) < 1:
            raise ValueError(
                f"{OP_NAME}: padding {padding} leaves no output for input shape "
                f"{tuple(x.shape)} and kernel {tuple(weight.shape[2:])} (output would be "
                f"{out_hw})"
            )
        self.geometry = (stride, padding, dilation, groups)
        self.has_bias = bias is not None
        self.save_for_backward(x, weight)
        output = None
        route = conv_routes.library_route(x, weight, bias)  # oneDNN, cuDNN or None
        if route is not None:
            # conv2d's input gradient, of a conv2d whose input has this op's output shape
            out_shape = (x.shape[0], weight.shape[1] * groups) + out_hw
            gradients = route.backward(
                None, weight, x, self.geometry, False, (True, False, False), out_shape
            )
            output = None if gradients is None else gradients[0]
        if output is None:
            output = transposed_convolution(x, weight, self.geometry, out_hw)
        if bias is not None:
            output += bias.reshape(1, -1, 1, 1)
        return output

    def backward(self, grad):
        x, weight = self.saved
        stride, padding, dilation, groups = self.geometry
        # The rows output_padding added, and any beyond the last full window, reach no input:
        # the frame drops them so the conv2d below gives exactly the input's height and width.
        reach = tuple(
            (x.shape[2 + a] - 1) * stride[a] + dilation[a] * (weight.shape[2 + a] - 1) + 1
            for a in (0, 1)
        )
        grad_x = grad_weight = grad_bias = None
        if self.has_bias and self.needs_input_grad[2]:
            grad_bias = grad.sum(axis=(0, 2, 3))
        route = conv_routes.library_route(x, weight, grad)
        if route is not None:
            # The conv2d above: grad is its input, x its output's gradient. What the
            # library declines (None) takes the im2col route below.
            if self.needs_input_grad[0]:
                grad_x = route.forward(
                    grad, weight, None, stride, padding, dilation, groups, tuple(x.shape)
                )
            if self.needs_input_grad[1]:
                gradients = route.backward(
                    grad, weight, x, self.geometry, False, (False, True, False)
                )
                grad_weight = None if gradients is None else gradients[1]
        if self.needs_input_grad[0] and grad_x is None:
            grad_x = convolve(grad, weight, stride, padding, reach, dilation, groups)
        if self.needs_input_grad[1] and grad_weight is None:
            # conv2d's weight gradient with the roles swapped: grad is the input, x the
            # output's gradient, so the result is (C_in, C_out/g, KH, KW), this op's layout.
            grad_weight, _ = convolution_weight_gradient(
                grad, x, weight.shape, stride, padding, reach, dilation, groups
            )
        return grad_x, grad_weight, grad_bias
