"""What every layer file shares: parameter and buffer creation, error labels, input checks.

Constructor argument checks are in ``_arguments.py``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.nn import _build_budget
from bigdl_py.nn.module import Module, Parameter


def parameter_dtype(dtype: Any, layer_name: str) -> np.dtype:
    """Resolve a layer's ``dtype`` argument (default float32); it must be floating point."""
    resolved = backend.resolve_dtype(dtype)
    if not backend.is_floating(resolved):
        raise TypeError(
            f"{layer_name}: dtype must be a floating-point type (parameters are trained), "
            f"got {resolved}"
        )
    return resolved


def empty_parameter(shape: tuple[int, ...], dtype: np.dtype) -> Parameter:
    """An uninitialised host parameter; the layer's ``reset_parameters`` fills it."""
    _build_budget.reserve(shape)  # nn.load: refuse a declared size before allocating it
    return Parameter(np.empty(shape, dtype=dtype))


def filled_buffer(shape: tuple[int, ...], value: float, dtype: Any) -> Tensor:
    """A host buffer (running statistics, counters) of ``shape`` filled with ``value``."""
    _build_budget.reserve(shape)
    return Tensor(np.full(shape, value, dtype=dtype), _copy=False)


def deep_copies(module: Module, count: int) -> Iterator[Module]:
    """``count`` independent deep copies of ``module`` (stacks of identical layers)."""
    state = sum(
        math.prod(value.shape)
        for _, child in module.named_modules()
        for registry in (child._parameters, child._buffers)
        for value in registry.values()
        if value is not None
    )
    _build_budget.reserve(count * state)  # nn.load: refuse a declared stack before copying
    return (copy.deepcopy(module) for _ in range(count))


def label(layer: Module) -> str:
    """How errors name a layer: its class and settings, e.g. ``Conv2d(3, 16, kernel_size=...)``."""
    return f"{type(layer).__name__}({layer.extra_repr()})"


def shape_of(x: Any) -> tuple[int, ...]:
    """The shape of a Tensor, an array, or nested lists."""
    return tuple(x.shape) if hasattr(x, "shape") else tuple(np.shape(x))


def check_ndim(layer: Module, x: Any, allowed: tuple[int, ...], layout: str) -> None:
    """Raise naming the layer when ``x`` has a rank the layer does not take."""
    shape = shape_of(x)
    if len(shape) not in allowed:
        raise ValueError(f"{label(layer)}: expects {layout} input, got shape {shape}")


def check_floating_input(layer: Module, x: Any) -> None:
    """Raise ``TypeError`` naming the layer when ``x`` is not floating point (integer images,
    say), before its arithmetic fails deep inside NumPy."""
    backend.check_floating(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype, label(layer))
