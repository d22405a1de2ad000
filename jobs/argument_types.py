"""argparse types that check a value's range as the command line is read.

A bad value is then a usage error naming the argument and the allowed range
(``argument --batch-size: must be an integer >= 1, got '0'``) before Spark starts or any
data is read, instead of a failure deep inside the run after its start-up costs are paid.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def whole_number(minimum: int = 1, maximum: int | None = None) -> Callable[[str], int]:
    """An integer from ``minimum`` to ``maximum`` (inclusive; no upper bound when None)."""
    allowed = (
        f"an integer >= {minimum}"
        if maximum is None
        else (f"an integer from {minimum} to {maximum}")
    )

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}")
        return value

    parse.__name__ = "whole_number"
    return parse


def real_number(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> Callable[[str], float]:
    """A finite number in the interval from ``low`` to ``high`` (None: unbounded there);
    ``low_open``/``high_open`` leave that end out. NaN and infinities are always refused:
    no rate, decay or fraction of these jobs means anything at them."""
    opening = "(" if low is None or low_open else "["
    closing = ")" if high is None or high_open else "]"
    left = "-inf" if low is None else f"{low:g}"
    right = "inf" if high is None else f"{high:g}"
    allowed = f"a finite number in {opening}{left}, {right}{closing}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}") from None
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if not math.isfinite(value) or too_low or too_high:
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}")
        return value

    parse.__name__ = "real_number"
    return parse


def positive_integers(text: str) -> tuple[int, ...]:
    """Comma-separated integers >= 1, e.g. a shape ``1,28,28``."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"must be integers >= 1 separated by commas (e.g. 1,28,28), got {text!r}"
        )
    return values


def column_names(text: str) -> str | list[str]:
    """One column name, or several separated by commas (a list then)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"names no column, got {text!r}")
    return names[0] if len(names) == 1 else names


def device_request(text: str) -> str:
    """A device the inference functions accept: cpu, auto, gpu, cuda or cuda:<n>."""
    from bigdl_py.spark.gpu import check_device_request

    try:
        return check_device_request(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
