"""Fully connected layer (BigDL's ``Linear``)."""

from __future__ import annotations

import math
from typing import Any

from bigdl_py.autograd import ops
from bigdl_py.nn import init
from bigdl_py.nn.layers._arguments import check_flag, check_positive_int
from bigdl_py.nn.layers._base import (
    check_floating_input,
    empty_parameter,
    parameter_dtype,
    shape_of,
)
from bigdl_py.nn.module import Module

__all__ = ["Linear"]


class Linear(Module):
    """``y = x @ weight.T + bias`` over the last axis of ``x``.

    Parameters
    ----------
    in_features, out_features : int
        Sizes of each input and output sample.
    bias : bool
        Learn an additive bias (default True).
    dtype : dtype or str, optional
        Parameter dtype (default float32).

    Notes
    -----
    Input ``(*, in_features)``, output ``(*, out_features)``. ``weight`` has shape
    ``(out_features, in_features)``. Both are initialised as PyTorch does:
    ``U(-1/sqrt(in_features), 1/sqrt(in_features))``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: Any = None):
        super().__init__()
        self.in_features = check_positive_int(in_features, "in_features", "Linear")
        self.out_features = check_positive_int(out_features, "out_features", "Linear")
        has_bias = check_flag(bias, "bias", "Linear")
        dtype = parameter_dtype(dtype, "Linear")
        self.weight = empty_parameter((self.out_features, self.in_features), dtype)
        if has_bias:
            self.bias = empty_parameter((self.out_features,), dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: kaiming-uniform with a=sqrt(5), i.e. bound 1/sqrt(fan_in)."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        shape = shape_of(x)
        if not shape or shape[-1] != self.in_features:
            features = shape[-1] if shape else "no"
            raise ValueError(
                f"Linear({self.in_features} -> {self.out_features}): input has {features} "
                f"features (shape {shape}); expected (..., {self.in_features})"
            )
        # Integer input would be promoted (to float64 with float32 weights), not refused.
        check_floating_input(self, x)
        return ops.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )
