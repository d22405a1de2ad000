"""Activation layers: thin modules over the element-wise and softmax ops."""

from __future__ import annotations

from bigdl_py.autograd import ops
from bigdl_py.nn.layers._base import label, shape_of
from bigdl_py.nn.module import Module

__all__ = ["GELU", "LeakyReLU", "LogSoftmax", "ReLU", "Sigmoid", "Softmax", "Tanh"]


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
        self.negative_slope = float(negative_slope)

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
        self.dim = int(dim)

    def forward(self, x):
        _check_dim(self, x)
        return ops.softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Module):
    """``log(softmax(x))`` along ``dim``, computed stably (default the last axis)."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = int(dim)

    def forward(self, x):
        _check_dim(self, x)
        return ops.log_softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
