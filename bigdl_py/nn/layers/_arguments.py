"""Checks of layer constructor arguments, shared by every layer so each kind of setting is
refused alike: at construction, with a ``ValueError`` naming the layer, the argument and
the value.

Python's loose types make three mistakes silent unless refused: a bool is an int
(``padding_idx=True`` is row 1), ``int(1.5)`` is 1, and any non-empty string is true
(``batch_first="False"``); and a NaN passes every ``<`` and ``>`` test (``eps=nan`` gave an
all-NaN output). Each check below refuses all four where they do not belong.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_INTEGERS = (int, np.integer)
_REALS = (int, float, np.integer, np.floating)


def is_integer(value: Any) -> bool:
    """An int or NumPy integer, not a bool (``True`` is an int to Python, a mistake here)."""
    return isinstance(value, _INTEGERS) and not isinstance(value, (bool, np.bool_))


def check_int(value: Any, name: str, layer_name: str, minimum: int | None = None) -> int:
    """An integer setting (a dim, an index, a seed); at least ``minimum`` when given."""
    if not is_integer(value) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(f"{layer_name}: {name} must be an integer{bound}, got {value!r}")
    return int(value)


def check_positive_int(value: Any, name: str, layer_name: str) -> int:
    """A size argument: a positive integer."""
    if not is_integer(value) or value < 1:
        raise ValueError(f"{layer_name}: {name} must be a positive integer, got {value!r}")
    return int(value)


def check_real(
    value: Any,
    name: str,
    layer_name: str,
    *,
    above: float | None = None,
    at_least: float | None = None,
) -> float:
    """A finite real setting (a slope, a scale, an ``eps``): NaN and infinity are refused,
    and so are values not ``> above`` or not ``>= at_least`` when those are given."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, _REALS):
        raise ValueError(f"{layer_name}: {name} must be a finite number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{layer_name}: {name} must be a finite number, got {value!r}")
    if above is not None and not value > above:
        raise ValueError(f"{layer_name}: {name} must be > {above:g}, got {value!r}")
    if at_least is not None and not value >= at_least:
        raise ValueError(f"{layer_name}: {name} must be >= {at_least:g}, got {value!r}")
    return float(value)


def check_probability(
    value: Any, name: str, layer_name: str, *, none_allowed: bool = False
) -> float | None:
    """A number in ``[0, 1]`` (a dropout rate, a momentum); None too when allowed."""
    if value is None and none_allowed:
        return None
    valid = not isinstance(value, (bool, np.bool_)) and isinstance(value, _REALS)
    if not (valid and 0.0 <= value <= 1.0):
        alternative = " or None" if none_allowed else ""
        raise ValueError(
            f"{layer_name}: {name} must be a number in [0, 1]{alternative}, got {value!r}"
        )
    return float(value)


def check_flag(value: Any, name: str, layer_name: str, *, none_allowed: bool = False) -> Any:
    """A switch: True or False (or 1 and 0); None too when allowed. A string such as
    ``"False"`` is a mistake, not True."""
    if value is None and none_allowed:
        return None
    if isinstance(value, (bool, np.bool_)) or (is_integer(value) and value in (0, 1)):
        return bool(value)
    alternative = ", False or None" if none_allowed else " or False"
    raise ValueError(f"{layer_name}: {name} must be True{alternative}, got {value!r}")


def int_pair(value: Any, name: str, layer_name: str, minimum: int = 1) -> tuple[int, int]:
    """An int or a pair of ints (a list from a JSON config too), each at least ``minimum``."""
    if is_integer(value):
        pair = (int(value), int(value))
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(map(is_integer, value)):
        pair = (int(value[0]), int(value[1]))
    else:
        raise ValueError(f"{layer_name}: {name} must be an int or a pair of ints, got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{layer_name}: {name} must be >= {minimum}, got {value!r}")
    return pair
