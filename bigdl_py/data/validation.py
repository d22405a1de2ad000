"""Checks run once when a dataset is built, so that bad data fails early with a clear error."""

from __future__ import annotations

import numpy as np


def check_numeric(array: np.ndarray, what: str) -> None:
    """Refuse arrays that are not bool, integer or float (strings, objects, complex)."""
    if not (
        np.issubdtype(array.dtype, np.integer)
        or np.issubdtype(array.dtype, np.floating)
        or array.dtype == np.bool_
    ):
        raise TypeError(
            f"{what} must be a numeric (integer or float) array, got dtype {array.dtype}"
        )


def check_same_length(arrays: dict[str, np.ndarray]) -> int:
    """Every array has at least one axis and the same first-axis length; return it."""
    lengths = {}
    for name, array in arrays.items():
        if array.ndim == 0:
            raise ValueError(f"{name} must have a leading samples axis, got a scalar")
        lengths[name] = array.shape[0]
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{name} has {length}" for name, length in lengths.items())
        raise ValueError(f"features and labels must have the same number of samples: {detail}")
    return next(iter(lengths.values()))


# Rows checked at a time: bounds the temporary boolean mask for large (memory-mapped) data.
_FINITE_CHECK_VALUES = 1 << 24


def check_finite(array: np.ndarray, what: str) -> None:
    """Refuse NaN or infinity in a float array, naming the first bad sample."""
    if not np.issubdtype(array.dtype, np.floating) or len(array) == 0:
        return
    values_per_sample = max(1, array.size // len(array))
    rows_per_block = max(1, _FINITE_CHECK_VALUES // values_per_sample)
    for block_start in range(0, len(array), rows_per_block):
        block = array[block_start : block_start + rows_per_block].reshape(-1, values_per_sample)
        bad_per_sample = ~np.isfinite(block).all(axis=1)
        if bad_per_sample.any():
            sample = block_start + int(np.flatnonzero(bad_per_sample)[0])
            values = array[sample].reshape(-1)
            bad_value = values[~np.isfinite(values)][0]
            raise ValueError(
                f"{what} holds non-finite values: sample {sample} contains {bad_value}; "
                "clean the data or pass check_finite=False"
            )


def check_label_range(labels: np.ndarray, num_classes: int) -> None:
    """Class labels must be whole numbers in [0, num_classes); name the first bad one."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)):
        raise TypeError(f"num_classes must be an integer, got {num_classes!r}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    flat = labels.reshape(-1)
    bad = (flat < 0) | (flat >= num_classes)
    if np.issubdtype(flat.dtype, np.floating):
        bad |= ~np.isfinite(flat) | (flat != np.floor(flat))
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        index = np.unravel_index(position, labels.shape)
        where = int(index[0]) if labels.ndim == 1 else tuple(int(i) for i in index)
        raise ValueError(
            f"label {flat[position].item()!r} at index {where} is outside the classes "
            f"[0, {num_classes}) ({int(bad.sum())} bad label(s) in all)"
        )


def class_indices(
    labels: np.ndarray,
    what: str = "labels",
    num_classes: int | None = None,
    ignore_index: int | None = None,
) -> np.ndarray:
    """Class labels as int64, one rule for every input: whole-number floats are converted.

    Spark ML stores class labels as doubles (``StringIndexer``), NumPy users often hold them
    as floats: ``3.0`` becomes ``3``; ``2.5``, NaN or infinity are refused rather than
    truncated. With ``num_classes``, labels outside ``[0, num_classes)`` (other than
    ``ignore_index``) are refused too.

    Raises
    ------
    ValueError
        Naming the first bad label, its index and how many are bad.
    TypeError
        For labels that are not numbers.
    """
    labels = np.asarray(labels)
    check_numeric(labels, what)
    flat = labels.reshape(-1)
    if np.issubdtype(flat.dtype, np.floating):
        bad = ~np.isfinite(flat)
        bad[~bad] = flat[~bad] != np.floor(flat[~bad])
        if bad.any():
            position = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"{what}: {flat[position].item()!r} at index {position} is not a class index "
                f"(class labels must be whole numbers 0, 1, ...; {int(bad.sum())} bad in all)"
            )
    indices = labels.astype(np.int64, copy=False)
    if num_classes is not None and indices.size:
        flat = indices.reshape(-1)
        outside = (flat < 0) | (flat >= num_classes)
        if ignore_index is not None:
            outside &= flat != ignore_index
        if outside.any():
            position = int(np.flatnonzero(outside)[0])
            ignored = "" if ignore_index is None else f", other than ignore_index={ignore_index}"
            raise ValueError(
                f"{what}: label {flat[position].item()} at index {position} is outside the "
                f"model's {num_classes} classes [0, {num_classes}){ignored} "
                f"({int(outside.sum())} bad in all)"
            )
    return indices


def uneven_partitions(sizes: list[int]) -> bool:
    """Whether partition sizes differ by more than a quarter of their mean (and one sample).

    Every partition supplies an equal share of each global batch, so in an epoch a small
    partition's samples are read several times and a large one's only in part.
    """
    if not sizes:
        return False
    mean = sum(sizes) / len(sizes)
    return any(abs(size - mean) > max(1.0, mean / 4) for size in sizes)
