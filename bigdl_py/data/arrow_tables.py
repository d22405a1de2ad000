"""Arrow tables and record batches <-> NumPy feature and label arrays, column by column.

The conversion never builds a Python object per row: scalar columns go through
``Array.to_numpy``, list columns through their offsets (to check that every row has the
same length) and ``flatten()`` (to get all values as one array), then a reshape. A
single-chunk, null-free, fixed-size-list column of the target dtype is converted without a
copy (the result is then a read-only view of the Arrow buffer).

Supported column types: integer, float, decimal (read as float64) and boolean scalars;
``list``, ``large_list`` and ``fixed_size_list`` of those (nested lists too); and the
``arrow.fixed_shape_tensor`` extension type, which keeps a per-row shape (written by
:func:`arrays_to_table` for images).

The same :func:`table_to_arrays` serves Parquet/Arrow files and Spark's ``mapInArrow``
record batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

ColumnSpec = str | Sequence[str] | Sequence[Sequence[str]]
ShapeSpec = Sequence[int] | Sequence[Sequence[int]] | None


def _is_list_type(arrow_type: pa.DataType) -> bool:
    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)


def _first_true(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _array_to_numpy(array: pa.Array, column: str, rows_per_item: int = 1) -> np.ndarray:
    """One Arrow array -> NumPy of shape ``(len(array), *per_row_shape)``.

    ``rows_per_item`` converts an item index of a nested level back to a table row for
    error messages (an inner list of a fixed-width outer list belongs to row i // width).
    """
    arrow_type = array.type
    if array.null_count:
        row = _first_true(array.is_null().to_numpy(zero_copy_only=False)) // rows_per_item
        raise ValueError(
            f"column {column!r} has a null at row {row} ({array.null_count} null value(s)); "
            "fill or drop nulls before converting"
        )
    if isinstance(arrow_type, pa.FixedShapeTensorType):
        shape = tuple(arrow_type.shape)
        permutation = arrow_type.permutation
        if permutation is not None and list(permutation) != sorted(permutation):
            return np.asarray(array.to_numpy_ndarray())
        storage = _array_to_numpy(array.storage, column, rows_per_item)
        return storage.reshape((len(array), *shape))
    if isinstance(arrow_type, pa.BaseExtensionType):
        return _array_to_numpy(array.storage, column, rows_per_item)
    if pa.types.is_fixed_size_list(arrow_type):
        width = arrow_type.list_size
        values = _array_to_numpy(array.flatten(), column, rows_per_item * width)
        return values.reshape((len(array), width, *values.shape[1:]))
    if _is_list_type(arrow_type):
        offsets = array.offsets.to_numpy()
        lengths = np.diff(offsets)
        if len(lengths) and (lengths != lengths[0]).any():
            item = _first_true(lengths != lengths[0])
            raise ValueError(
                f"column {column!r} is ragged: row {item // rows_per_item} has "
                f"{int(lengths[item])} values, row 0 has {int(lengths[0])}; every row of a "
                "feature column must have the same length (pad or filter the rows first)"
            )
        width = int(lengths[0]) if len(lengths) else 0
        values = _array_to_numpy(array.flatten(), column, rows_per_item * max(width, 1))
        return values.reshape((len(array), width, *values.shape[1:]))
    if pa.types.is_decimal(arrow_type):
        # A decimal is a number: read as a double, as Spark ML's VectorAssembler and its
        # estimators' label columns read it.
        return array.cast(pa.float64()).to_numpy(zero_copy_only=False)
    if (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
    ):
        # Zero-copy for null-free numbers; booleans (bit-packed in Arrow) are unpacked.
        return array.to_numpy(zero_copy_only=False)
    hint = ""
    if pa.types.is_struct(arrow_type):
        hint = (
            " (a Spark ML Vector column is a struct: convert it with "
            "pyspark.ml.functions.vector_to_array first)"
        )
    raise TypeError(
        f"column {column!r} has Arrow type {arrow_type}; feature and label columns must be "
        f"numeric scalars or (fixed-size) lists of numbers{hint}"
    )


def column_to_numpy(data: pa.Table | pa.RecordBatch, name: str) -> np.ndarray:
    """Column ``name`` of a table or record batch as a NumPy array ``(rows, ...)``, in the
    column's own dtype.

    Raises
    ------
    KeyError
        When the column is missing (listing the columns there are).
    ValueError
        For nulls or ragged list rows (naming the row).
    TypeError
        For non-numeric columns.
    """
    names = data.schema.names
    if name not in names:
        raise KeyError(f"no column {name!r}; the columns are {names}")
    column = data.column(names.index(name))
    if isinstance(column, pa.ChunkedArray):
        # One contiguous array: a single chunk is used as is; several are concatenated once.
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return _array_to_numpy(column, name)


def feature_column_groups(feature_columns: ColumnSpec) -> list[list[str]]:
    """``'x'`` -> [['x']]; ``['a', 'b']`` -> [['a', 'b']]; ``[['a'], ['b', 'c']]`` -> as is."""
    if isinstance(feature_columns, str):
        return [[feature_columns]]
    groups = list(feature_columns)
    if not groups:
        raise ValueError("feature_columns is empty")
    if all(isinstance(name, str) for name in groups):
        return [groups]
    if all(isinstance(group, (list, tuple)) and group for group in groups):
        return [list(group) for group in groups]
    raise TypeError(
        "feature_columns must be a column name, a list of names (one input), or a list of "
        f"lists of names (one input each), got {feature_columns!r}"
    )


def _group_shapes(feature_shape: ShapeSpec, groups: int) -> list[tuple[int, ...] | None]:
    if feature_shape is None:
        return [None] * groups
    shapes = list(feature_shape)
    if groups == 1 and all(isinstance(size, (int, np.integer)) for size in shapes):
        return [tuple(int(size) for size in shapes)]
    if len(shapes) != groups:
        raise ValueError(
            f"feature_shape must give one shape per input: {groups} inputs, "
            f"{len(shapes)} shapes ({feature_shape!r})"
        )
    return [None if shape is None else tuple(int(size) for size in shape) for shape in shapes]


def _group_to_array(
    data: pa.Table | pa.RecordBatch,
    names: list[str],
    feature_shape: tuple[int, ...] | None,
    dtype: Any,
) -> np.ndarray:
    """The columns of one input as one array ``(rows, ...)``."""
    blocks = [column_to_numpy(data, name) for name in names]
    rows = data.num_rows
    if len(blocks) == 1 and blocks[0].ndim >= 2:
        array = blocks[0]
    else:
        # Scalar columns, or several columns: one flat vector per row, like Spark ML's
        # VectorAssembler, in the order the columns were named.
        # An explicit width: reshape(rows, -1) cannot infer it when there are no rows.
        widths = [int(np.prod(block.shape[1:], dtype=np.int64)) for block in blocks]
        array = np.concatenate(
            [block.reshape(rows, width) for block, width in zip(blocks, widths, strict=True)],
            axis=1,
        )
    if dtype is not None:
        array = array.astype(dtype, copy=False)
    if feature_shape is not None:
        per_row = int(np.prod(array.shape[1:], dtype=np.int64))
        if int(np.prod(feature_shape, dtype=np.int64)) != per_row:
            raise ValueError(
                f"feature_shape {feature_shape} needs {int(np.prod(feature_shape))} values per "
                f"row, but columns {names} give {per_row} (row shape {array.shape[1:]})"
            )
        array = array.reshape((rows, *feature_shape))
    return array


def table_to_arrays(
    data: pa.Table | pa.RecordBatch,
    feature_columns: ColumnSpec,
    label_column: str | None = None,
    feature_shape: ShapeSpec = None,
    dtype: Any = np.float32,
    label_dtype: Any = None,
) -> tuple[Any, np.ndarray | None]:
    """Convert a table or record batch to feature and label arrays, column-wise.

    Parameters
    ----------
    data : pyarrow.Table or pyarrow.RecordBatch
    feature_columns : str, list of str, or list of list of str
        One column (a list or tensor column keeps its per-row shape; a scalar column gives
        a vector of length 1), several columns (each row's values concatenated into one
        vector, in order), or one list of columns per model input.
    label_column : str, optional
    feature_shape : tuple of int, or one per input, optional
        Reshape each row's features, e.g. ``(1, 28, 28)`` for a flat image column.
    dtype : dtype or None
        Feature dtype (default float32); ``None`` keeps the columns' own dtype.
    label_dtype : dtype, optional
        Label dtype; by default the column's own (int64 for class indices from Spark's
        ``long``, float64 for ``double``).

    Returns
    -------
    features : numpy.ndarray or tuple of numpy.ndarray
        One array, or a tuple with one per input when ``feature_columns`` is a list of lists.
    labels : numpy.ndarray or None

    Notes
    -----
    Arrays converted without a copy are read-only views of the Arrow data.
    """
    if not isinstance(data, (pa.Table, pa.RecordBatch)):
        raise TypeError(f"expected a pyarrow Table or RecordBatch, got {type(data).__name__}")
    groups = feature_column_groups(feature_columns)
    shapes = _group_shapes(feature_shape, len(groups))
    features = tuple(
        _group_to_array(data, names, shape, dtype)
        for names, shape in zip(groups, shapes, strict=True)
    )
    labels = None
    if label_column is not None:
        labels = column_to_numpy(data, label_column)
        if label_dtype is not None:
            labels = labels.astype(label_dtype, copy=False)
    single_input = isinstance(feature_columns, str) or all(
        isinstance(name, str) for name in feature_columns
    )
    return (features[0] if single_input else features), labels


def _array_to_column(array: np.ndarray) -> pa.Array:
    """(rows,) -> scalar column; (rows, d) -> fixed_size_list; (rows, *shape) -> tensor."""
    array = np.ascontiguousarray(array)
    if array.ndim == 1:
        return pa.array(array)
    if array.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(pa.array(array.reshape(-1)), array.shape[1])
    return pa.FixedShapeTensorArray.from_numpy_ndarray(array)


def arrays_to_table(
    features: Any,
    labels: Any = None,
    feature_columns: str | Sequence[str] | None = None,
    label_column: str = "label",
) -> pa.Table:
    """The inverse of :func:`table_to_arrays`: one column per feature array (and labels).

    A 1-D array becomes a scalar column, a 2-D array a ``fixed_size_list`` column, and a
    higher-rank array an ``arrow.fixed_shape_tensor`` column that keeps the per-row shape.
    Default column names: ``features`` (or ``features_0``, ``features_1``, ... for several
    inputs) and ``label``.
    """
    arrays = list(features) if isinstance(features, (tuple, list)) else [features]
    arrays = [np.asarray(array) for array in arrays]
    if feature_columns is None:
        names = ["features"] if len(arrays) == 1 else [f"features_{i}" for i in range(len(arrays))]
    else:
        names = [feature_columns] if isinstance(feature_columns, str) else list(feature_columns)
    if len(names) != len(arrays):
        raise ValueError(f"{len(arrays)} feature arrays but {len(names)} column names {names}")
    columns = {name: _array_to_column(array) for name, array in zip(names, arrays, strict=True)}
    if labels is not None:
        if label_column in columns:
            raise ValueError(f"label column {label_column!r} clashes with a feature column")
        columns[label_column] = _array_to_column(np.asarray(labels))
    lengths = {name: len(column) for name, column in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"columns must have the same number of rows, got {lengths}")
    return pa.table(columns)
