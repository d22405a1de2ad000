"""Activations and their gradients, one kernel each way (``cuda/activations.cu``).

A device's composed ReLU backward was two kernels and a temporary mask, a sigmoid's
forward six; each is one here. The ``*_reference`` functions are the kernels in NumPy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.kernels.compiler import Kernel, elementwise_blocks, run

RELU, LEAKY_RELU, TANH, SIGMOID, GELU, GELU_TANH = range(6)
#: Whether the backward of each kind reads the forward's output (else its input).
SAVES_OUTPUT = {RELU: True, LEAKY_RELU: False, TANH: True, SIGMOID: True, GELU: False,
                GELU_TANH: False}  # fmt: skip

FORWARD = Kernel(
    "activations", "activation_forward", ("index", "int", "real", "const real*", "real*")
)
BACKWARD = Kernel(
    "activations",
    "activation_backward",
    ("index", "int", "real", "const real*", "const real*", "real*"),
)

_ERFC_COEFFICIENTS = (
    1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418, 0.37409196, 1.00002368,
    -1.26551223,
)  # fmt: skip


def _normal_cdf(x):
    real = x.dtype.type
    z = np.abs(x) * real(1 / math.sqrt(2))
    t = real(1) / (z * real(0.5) + real(1))
    polynomial = t * real(0.17087277) + real(-0.82215223)
    for coefficient in _ERFC_COEFFICIENTS:
        polynomial = polynomial * t + real(coefficient)
    polynomial = polynomial - z * z
    half_erfc = np.exp(polynomial) * t * real(0.5)
    return np.where(x >= 0, real(1) - half_erfc, half_erfc)


def _tanh_gelu_inner(x):
    real = x.dtype.type
    return real(math.sqrt(2 / math.pi)) * (x + real(0.044715) * (x * x * x))


def forward_reference(n, kind, parameter, x, y):
    real = x.dtype.type
    if kind == RELU:
        y[...] = np.where((x > 0) | np.isnan(x), x, real(0))
    elif kind == LEAKY_RELU:
        y[...] = x * np.where(x > 0, real(1), real(parameter))
    elif kind == TANH:
        y[...] = np.tanh(x)
    elif kind == SIGMOID:
        e = np.exp(-np.abs(x))
        y[...] = np.where(x >= 0, real(1) / (real(1) + e), e / (real(1) + e))
    elif kind == GELU:
        y[...] = x * _normal_cdf(x)
    else:
        y[...] = real(0.5) * x * (real(1) + np.tanh(_tanh_gelu_inner(x)))


def backward_reference(n, kind, parameter, grad, saved, grad_x):
    real = grad.dtype.type
    s = saved
    if kind == RELU:
        grad_x[...] = grad * (s > 0).astype(grad.dtype)
    elif kind == LEAKY_RELU:
        grad_x[...] = grad * np.where(s > 0, real(1), real(parameter))
    elif kind == TANH:
        grad_x[...] = (real(1) - s * s) * grad
    elif kind == SIGMOID:
        grad_x[...] = grad * s * (real(1) - s)
    elif kind == GELU:
        pdf = np.exp(real(-0.5) * s * s) / real(math.sqrt(2 * math.pi))
        grad_x[...] = grad * (_normal_cdf(s) + s * pdf)
    else:
        t = np.tanh(_tanh_gelu_inner(s))
        inner_slope = real(math.sqrt(2 / math.pi)) * (real(1) + real(3 * 0.044715) * s * s)
        grad_x[...] = grad * (
            real(0.5) * (real(1) + t) + real(0.5) * s * (real(1) - t * t) * inner_slope
        )


REFERENCES = {FORWARD: forward_reference, BACKWARD: backward_reference}


def applies(*arrays: Any) -> bool:
    """Whether the kernels take these device arrays: all C-contiguous (rows of any shape)."""
    return all(array.flags.c_contiguous for array in arrays)


def forward(kind: int, x: Any, parameter: float = 0.0) -> Any:
    """The activation ``kind`` of ``x`` (a new array)."""
    y = backend.array_module(x).empty_like(x)
    run(FORWARD, forward_reference, elementwise_blocks(x.size), x.dtype, x.size, kind,
        parameter, x, y)  # fmt: skip
    return y


def backward(kind: int, grad: Any, saved: Any, parameter: float = 0.0) -> Any:
    """The input's gradient; ``saved`` is the forward's output or input (``SAVES_OUTPUT``)."""
    xp = backend.array_module(grad)
    grad = xp.ascontiguousarray(grad)
    grad_x = xp.empty_like(saved)
    run(BACKWARD, backward_reference, elementwise_blocks(saved.size), saved.dtype, saved.size,
        kind, parameter, grad, saved, grad_x)  # fmt: skip
    return grad_x
