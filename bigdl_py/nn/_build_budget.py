"""A bound on the arrays that building a module may create, for architectures read from files.

``nn.load`` builds the architecture a file declares before it loads the file's weights, so a
file of a few hundred bytes could declare ``GroupNorm(1, 200_000_000)`` and cost gigabytes
before its weights are found not to fit. Inside :func:`limit`, building is held to a number
of array values:

* **Counted where state is kept.** Every array a module keeps is counted once, when it
  becomes part of a module: a parameter or buffer set on a module (``Module.__setattr__``,
  ``register_buffer``), or the arrays of a module attached as a child (a deep copy's
  arrays reach the tree that way). No layer can keep state without passing there, so the
  count needs no list of layers.
* **Asked before allocating.** The shared allocators (``layers._base.empty_parameter`` and
  ``filled_buffer``, and the random draws of ``nn.init`` while loading) call
  :func:`reserve` first, so a declared layer too large is refused before its memory is
  touched; arrays made another way are refused right after, when they are kept.

Outside :func:`limit` both calls cost one context-variable read.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

__all__ = ["count_array", "count_module", "limit", "reserve"]


class _Budget:
    """How many values building may create, and which arrays are already counted."""

    def __init__(self, values: int, source: str):
        self.values = values
        self.source = source
        self.used = 0
        # id -> the array itself: holding it keeps the id from naming another array later.
        self.counted: dict[int, Any] = {}
        self.walked: dict[int, Any] = {}  # modules whose arrays were counted, likewise held

    def check(self, more: int) -> None:
        if self.used + more > self.values:
            raise ValueError(
                f"{self.source}: the stored architecture declares more weights than the file "
                f"holds (building it needs over {self.used + more:,} values; the file's "
                f"weights allow {self.values:,}); refusing to allocate them"
            )

    def count(self, array: Any) -> None:
        if array is None or id(array) in self.counted:
            return
        self.counted[id(array)] = array
        size = int(math.prod(array.shape))
        self.check(size)
        self.used += size


_active: ContextVar[_Budget | None] = ContextVar("bigdl_py_build_budget", default=None)


@contextlib.contextmanager
def limit(values: int, source: str) -> Iterator[None]:
    """Within the block, refuse to build modules holding more than ``values`` array values.

    ``source`` (the file) starts the error message, a ``ValueError``.
    """
    token = _active.set(_Budget(int(values), source))
    try:
        yield
    finally:
        _active.reset(token)


def reserve(shape_or_count: tuple | int) -> None:
    """Raise unless an array of this shape (or this many values) still fits; allocate after."""
    budget = _active.get()
    if budget is not None:
        count = shape_or_count
        if not isinstance(count, int):
            count = math.prod(int(extent) for extent in shape_or_count)
        budget.check(count)


def count_array(array: Any) -> None:
    """Count an array (a Tensor, or None) that a module now keeps."""
    budget = _active.get()
    if budget is not None:
        budget.count(array)


def count_module(module: Any) -> None:
    """Count the arrays of a module attached as a child, and of its children."""
    budget = _active.get()
    if budget is None:
        return
    stack = [module]
    while stack:
        current = stack.pop()
        if current is None or id(current) in budget.walked:
            continue
        budget.walked[id(current)] = current
        for registry in (current._parameters, current._buffers):
            for array in registry.values():
                budget.count(array)
        stack.extend(current._modules.values())
