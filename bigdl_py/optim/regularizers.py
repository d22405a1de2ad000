"""L1 and L2 weight regularisers, applied to a gradient slice from its weight slice.

BigDL attaches these to layers; on the flat vector they are element-wise, so each partition
applies them to its own slice. The penalty is ``l1 * sum|w| + l2 / 2 * sum w**2``, whose
gradient ``l1 * sign(w) + l2 * w`` is added to the gradient (BigDL's ``L1L2Regularizer``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bigdl_py import backend


class L1L2Regularizer:
    """Add ``l1 * sign(w) + l2 * w`` to the gradient.

    Parameters
    ----------
    l1 : float
        Weight of the L1 penalty ``sum |w|``, >= 0.
    l2 : float
        Weight of the L2 penalty ``sum w**2 / 2``, >= 0.
    """

    def __init__(self, l1: float = 0.0, l2: float = 0.0):
        for name, value in (("l1", l1), ("l2", l2)):
            if not float(value) >= 0:
                raise ValueError(f"{type(self).__name__}: {name} must be >= 0, got {value!r}")
        self.l1 = float(l1)
        self.l2 = float(l2)

    def add_gradient_(self, weight: Any, gradient: Any) -> Any:
        """Add the penalty's gradient at ``weight`` to ``gradient`` in place; return it."""
        if tuple(weight.shape) != tuple(gradient.shape):
            raise ValueError(
                f"{type(self).__name__}: weight shape {tuple(weight.shape)} does not match "
                f"gradient shape {tuple(gradient.shape)}"
            )
        xp = backend.array_module(weight)
        if self.l1 != 0:
            gradient += self.l1 * xp.sign(weight)
        if self.l2 != 0:
            gradient += self.l2 * weight
        return gradient

    def penalty(self, weight: Any) -> float:
        """The penalty's value at ``weight`` (sums over slices add up to the whole)."""
        xp = backend.array_module(weight)
        total = 0.0
        if self.l1 != 0:
            total += self.l1 * float(xp.sum(xp.abs(weight), dtype=np.float64))
        if self.l2 != 0:
            total += 0.5 * self.l2 * float(xp.sum(xp.square(weight), dtype=np.float64))
        return total

    def __repr__(self) -> str:
        return f"{type(self).__name__}(l1={self.l1!r}, l2={self.l2!r})"


class L1Regularizer(L1L2Regularizer):
    """Add ``l1 * sign(w)`` to the gradient (penalty ``l1 * sum |w|``)."""

    def __init__(self, l1: float):
        super().__init__(l1=l1)

    def __repr__(self) -> str:
        return f"L1Regularizer(l1={self.l1!r})"


class L2Regularizer(L1L2Regularizer):
    """Add ``l2 * w`` to the gradient (penalty ``l2 / 2 * sum w**2``)."""

    def __init__(self, l2: float):
        super().__init__(l2=l2)

    def __repr__(self) -> str:
        return f"L2Regularizer(l2={self.l2!r})"
