"""Cutting a flat vector into balanced contiguous slices, and moving optimizer state between cuts.

Distributed training gives partition ``j`` of ``n`` the slice ``slice_bounds(size, j, n)`` of
the flat parameter vector; its OptimMethod keeps state for that slice only (BigDL's sharded
optimizer state, ZeRO stage 1). A checkpoint joins the shards' state dicts into the state of
the whole vector (``concatenate_state_dicts``), and a resume with another partition count cuts
it again (``split_state_dict``).

State dict convention (every OptimMethod follows it): each 1-D array value has one entry per
element of the slice the method serves; every other value (Python scalar, 0-d array) is the
same in every shard.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def slice_bounds(size: int, index: int, count: int) -> tuple[int, int]:
    """The ``[start, stop)`` of slice ``index`` when ``size`` elements are cut into ``count``.

    The package's one balanced split (:func:`all_slice_bounds` lists every slice; the data
    layer names it ``bigdl_py.data.split_bounds``): a global batch across partitions, a flat
    vector into owned slices and the training data into partitions are all cut by it. The
    first ``size % count`` slices hold one element more than the others, so sizes differ by
    at most one and ``count`` need not divide ``size``. With ``count > size`` the last slices
    are empty.

    Parameters
    ----------
    size : int
        Length of the vector, >= 0.
    index : int
        Which slice, ``0 <= index < count``.
    count : int
        How many slices, >= 1.

    Returns
    -------
    (start, stop) : tuple of int

    Raises
    ------
    ValueError
        If ``size < 0``, ``count < 1`` or ``index`` is out of range.
    """
    _check_split(size, count)
    if not 0 <= index < count:
        raise ValueError(f"slice_bounds: slice index must be in [0, {count}), got {index}")
    base, extra = divmod(size, count)
    start = index * base + min(index, extra)
    stop = start + base + (1 if index < extra else 0)
    return start, stop


def all_slice_bounds(size: int, count: int) -> list[tuple[int, int]]:
    """Every ``slice_bounds(size, j, count)`` for ``j`` in ``range(count)``, in order.

    Returns
    -------
    list of (start, stop)

    Raises
    ------
    ValueError
        If ``size < 0`` or ``count`` is not a positive integer.
    """
    _check_split(size, count)
    return [slice_bounds(size, index, count) for index in range(count)]


def _check_split(size: int, count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise ValueError(f"the number of shares must be a positive integer, got {count!r}")
    if size < 0:
        raise ValueError(f"the size to split must be >= 0, got {size}")


def _is_per_element(value) -> bool:
    return isinstance(value, np.ndarray) and value.ndim == 1


def concatenate_state_dicts(states: Sequence[Mapping]) -> dict:
    """Join the state dicts of consecutive slices into the state dict of the whole vector.

    1-D arrays are concatenated in the given order; every other value must be equal in all
    states and is kept once.

    Raises
    ------
    ValueError
        If the states have different keys, or a shared (scalar) value differs between them.
    """
    if not states:
        raise ValueError("concatenate_state_dicts needs at least one state dict")
    keys = list(states[0])
    for position, state in enumerate(states[1:], start=1):
        if set(state) != set(keys):
            raise ValueError(
                f"concatenate_state_dicts: state {position} has keys {sorted(state)} but "
                f"state 0 has {sorted(keys)}; all shards must come from the same OptimMethod"
            )
    whole = {}
    for key in keys:
        values = [state[key] for state in states]
        if _is_per_element(values[0]):
            whole[key] = np.concatenate([np.asarray(value) for value in values])
            continue
        for position, value in enumerate(values[1:], start=1):
            if not np.array_equal(np.asarray(value), np.asarray(values[0])):
                raise ValueError(
                    f"concatenate_state_dicts: shared value {key!r} differs between shards "
                    f"(state 0 has {values[0]!r}, state {position} has {value!r})"
                )
        whole[key] = values[0]
    return whole


def split_state_dict(state: Mapping, bounds: Sequence[tuple[int, int]]) -> list[dict]:
    """Cut the state dict of a whole vector into one state dict per ``[start, stop)`` bound.

    The inverse of :func:`concatenate_state_dicts`: 1-D arrays are sliced (copied, so the
    shards do not alias the input), other values are shared.
    """
    shards = []
    for start, stop in bounds:
        shard = {}
        for key, value in state.items():
            if _is_per_element(value):
                if stop > len(value):
                    raise ValueError(
                        f"split_state_dict: bound [{start}, {stop}) is past the end of "
                        f"{key!r}, which has {len(value)} elements"
                    )
                shard[key] = value[start:stop].copy()
            else:
                shard[key] = value
        shards.append(shard)
    return shards
