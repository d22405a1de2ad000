"""Activation layers: thin modules over the element-wise, rectifier and softmax ops."""

from __future__ import annotations

from typing import Any

from bigdl_py.autograd import ops
from bigdl_py.nn import init as nn_init
from bigdl_py.nn.layers._arguments import check_int, check_positive_int, check_real
from bigdl_py.nn.layers._base import (
    check_floating_input,
    empty_parameter,
    label,
    parameter_dtype,
    shape_of,
)
from bigdl_py.nn.module import Module

__all__ = [
    "ELU",
    "GELU",
    "Hardswish",
    "Hardtanh",
    "LeakyReLU",
    "LogSoftmax",
    "Mish",
    "PReLU",
    "ReLU",
    "Sigmoid",
    "SiLU",
    "Softmax",
    "Softplus",
    "Tanh",
]


def _check_dim(layer: Module, x) -> None:
    shape = shape_of(x)
    if not -len(shape) <= layer.dim < len(shape):
        raise ValueError(f"{label(layer)}: dim out of range for input of shape {shape}")


class ReLU(Module):
    """``max(x, 0)`` element-wise."""

    def forward(self, x):
        return ops.relu(x)


class LeakyReLU(Module):
    """``x`` where positive, ``negative_slope * x`` elsewhere.

    Parameters
    ----------
    negative_slope : float
        Slope for negative inputs (default 0.01).
    """

    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = check_real(negative_slope, "negative_slope", "LeakyReLU")

    def forward(self, x):
        return ops.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class Tanh(Module):
    """Hyperbolic tangent element-wise."""

    def forward(self, x):
        return ops.tanh(x)


class Sigmoid(Module):
    """Logistic function ``1 / (1 + exp(-x))`` element-wise."""

    def forward(self, x):
        return ops.sigmoid(x)


class GELU(Module):
    """Gaussian error linear unit.

    Parameters
    ----------
    approximate : {'none', 'tanh'}
        ``'none'`` uses the exact erf form; ``'tanh'`` the tanh approximation.
    """

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return ops.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Softmax(Module):
    """Softmax along ``dim`` (default the last axis, BigDL's ``SoftMax`` over features)."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = check_int(dim, "dim", type(self).__name__)

    def forward(self, x):
        _check_dim(self, x)
        return ops.softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Module):
    """``log(softmax(x))`` along ``dim``, computed stably (default the last axis)."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = check_int(dim, "dim", type(self).__name__)

    def forward(self, x):
        _check_dim(self, x)
        return ops.log_softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class ELU(Module):
    """``x`` where positive, ``alpha * (exp(x) - 1)`` elsewhere.

    Parameters
    ----------
    alpha : float
        The value the output tends to for very negative input is ``-alpha`` (default 1).
    """

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = check_real(alpha, "alpha", "ELU")

    def forward(self, x):
        return ops.elu(x, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"


class SiLU(Module):
    """``x * sigmoid(x)`` element-wise (the "swish" activation)."""

    def forward(self, x):
        return ops.silu(x)


class Softplus(Module):
    """``log(1 + exp(beta * x)) / beta``, a smooth ReLU.

    Parameters
    ----------
    beta : float
        Sharpness, > 0 (default 1).
    threshold : float
        Where ``beta * x > threshold`` the output is ``x`` itself (default 20), as in
        PyTorch; there the two differ by less than ``exp(-threshold)``.
    """

    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta = check_real(beta, "beta", "Softplus", above=0)
        self.threshold = check_real(threshold, "threshold", "Softplus")

    def forward(self, x):
        return ops.softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class Mish(Module):
    """``x * tanh(softplus(x))`` element-wise."""

    def forward(self, x):
        return ops.mish(x)


class Hardtanh(Module):
    """``clip(x, min_val, max_val)`` element-wise.

    Parameters
    ----------
    min_val, max_val : float
        The range (default -1 and 1); ``max_val`` must be above ``min_val``.
    """

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0):
        super().__init__()
        self.min_val = check_real(min_val, "min_val", "Hardtanh")
        self.max_val = check_real(max_val, "max_val", "Hardtanh")
        if not self.max_val > self.min_val:
            raise ValueError(
                f"Hardtanh: max_val ({max_val}) must be greater than min_val ({min_val})"
            )

    def forward(self, x):
        return ops.hardtanh(x, self.min_val, self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}"


class Hardswish(Module):
    """``x * relu6(x + 3) / 6`` element-wise: 0 below -3, ``x`` above 3."""

    def forward(self, x):
        return ops.hardswish(x)


class PReLU(Module):
    """``x`` where positive, ``weight * x`` elsewhere, with a learned slope ``weight``.

    Parameters
    ----------
    num_parameters : int
        1 (one slope shared by every channel, the default) or the number of channels ``C``
        of the input (axis 1).
    init : float
        Initial slope (default 0.25).
    dtype : dtype or str, optional
        Parameter dtype (default float32).
    """

    def __init__(self, num_parameters: int = 1, init: float = 0.25, dtype: Any = None):
        super().__init__()
        self.num_parameters = check_positive_int(num_parameters, "num_parameters", "PReLU")
        self.init = check_real(init, "init", "PReLU")
        self.weight = empty_parameter((self.num_parameters,), parameter_dtype(dtype, "PReLU"))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every slope back to ``init``."""
        nn_init.constant_(self.weight, self.init)

    def forward(self, x):
        shape = shape_of(x)
        # As in PyTorch, input of fewer than 2 axes has a single channel.
        channels = shape[1] if len(shape) >= 2 else 1
        if self.num_parameters not in (1, channels):
            raise ValueError(
                f"{label(self)}: expects {self.num_parameters} channels on axis 1, got input "
                f"of shape {shape}"
            )
        check_floating_input(self, x)  # names the layer, where the op names only itself
        return ops.prelu(x, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"
