"""Layers that merge several inputs into one: Add, Multiply, Concat.

They are the joins of a graph ``Model`` (BigDL's ``CAddTable``, ``CMulTable``,
``JoinTable``) and also work when called directly: ``Add()(a, b)`` or ``Add()([a, b])``.
"""

from __future__ import annotations

import functools

from bigdl_py.autograd import ops
from bigdl_py.nn.layers._arguments import check_int
from bigdl_py.nn.layers._base import label, shape_of
from bigdl_py.nn.module import Module

__all__ = ["Add", "Concat", "Multiply"]


def _gather_inputs(layer: Module, inputs: tuple) -> list:
    """Accept ``layer(a, b, ...)`` and ``layer([a, b, ...])``; at least one input."""
    if len(inputs) == 1 and isinstance(inputs[0], (list, tuple)):
        inputs = tuple(inputs[0])
    if not inputs:
        raise ValueError(f"{label(layer)}: needs at least one input")
    return list(inputs)


def _check_same_shapes(layer: Module, inputs: list) -> None:
    """Element-wise merges take equal shapes: silent broadcasting hides wiring mistakes."""
    first = shape_of(inputs[0])
    for position, value in enumerate(inputs[1:], start=1):
        if shape_of(value) != first:
            raise ValueError(
                f"{label(layer)}: input {position} has shape {shape_of(value)} but input 0 "
                f"has shape {first}"
            )


class Add(Module):
    """Element-wise sum of inputs of one shape (BigDL's ``CAddTable``)."""

    def forward(self, *inputs):
        inputs = _gather_inputs(self, inputs)
        _check_same_shapes(self, inputs)
        return functools.reduce(ops.add, inputs)


class Multiply(Module):
    """Element-wise product of inputs of one shape (BigDL's ``CMulTable``)."""

    def forward(self, *inputs):
        inputs = _gather_inputs(self, inputs)
        _check_same_shapes(self, inputs)
        return functools.reduce(ops.mul, inputs)


class Concat(Module):
    """Join inputs along ``axis`` (BigDL's ``JoinTable``, Keras' ``Concatenate``).

    Parameters
    ----------
    axis : int
        The axis to join along, counting the batch axis as 0 (default 1: features of
        ``(N, F)`` input, channels of ``(N, C, H, W)`` input). Negative counts from the end.
    """

    def __init__(self, axis: int = 1):
        super().__init__()
        self.axis = check_int(axis, "axis", "Concat")

    def forward(self, *inputs):
        inputs = _gather_inputs(self, inputs)
        shapes = [shape_of(value) for value in inputs]
        rank = len(shapes[0])
        if not -rank <= self.axis < rank:
            raise ValueError(f"{label(self)}: axis out of range for input shape {shapes[0]}")
        axis = self.axis % rank
        for position, shape in enumerate(shapes[1:], start=1):
            if len(shape) != rank or any(
                shape[a] != shapes[0][a] for a in range(rank) if a != axis
            ):
                raise ValueError(
                    f"{label(self)}: input {position} has shape {shape} but input 0 has shape "
                    f"{shapes[0]}; they may differ only along axis {self.axis}"
                )
        if len(inputs) == 1:
            return inputs[0]
        return ops.concatenate(inputs, axis=axis)

    def extra_repr(self) -> str:
        return f"axis={self.axis}"
