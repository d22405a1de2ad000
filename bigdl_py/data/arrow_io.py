"""Parquet and Arrow IPC files <-> feature and label arrays (through ``arrow_tables``).

Readers load only the columns asked for. Arrow IPC files are memory-mapped, so a
fixed-size-list column of the target dtype becomes a NumPy view of the mapped file with no
copy. Results feed ``ArrayDataset(features, labels)`` directly.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa

from bigdl_py.data.arrow_tables import (
    ColumnSpec,
    ShapeSpec,
    arrays_to_table,
    feature_column_groups,
    table_to_arrays,
)

_ARROW_FILE_MAGIC = b"ARROW1"


def _default_feature_columns(
    available: list[str], feature_columns: ColumnSpec | None, label_column: str | None
) -> ColumnSpec:
    """``None`` means every column but the label, in file order."""
    if feature_columns is not None:
        return feature_columns
    columns = [name for name in available if name != label_column]
    if not columns:
        raise ValueError(f"no feature columns: the only column is the label {label_column!r}")
    return columns


def _needed_columns(feature_columns: ColumnSpec, label_column: str | None) -> list[str]:
    names = [name for group in feature_column_groups(feature_columns) for name in group]
    if label_column is not None:
        names.append(label_column)
    return list(dict.fromkeys(names))


def _check_columns(path: str | os.PathLike, available: list[str], needed: list[str]) -> None:
    missing = [name for name in needed if name not in available]
    if missing:
        raise KeyError(
            f"{os.fspath(path)!r} has no column(s) {missing}; its columns are {available}"
        )


def read_parquet(
    path: str | os.PathLike,
    feature_columns: ColumnSpec | None = None,
    label_column: str | None = None,
    feature_shape: ShapeSpec = None,
    dtype: Any = np.float32,
    label_dtype: Any = None,
) -> tuple[Any, np.ndarray | None]:
    """Read features and labels from a Parquet file or a directory of Parquet files.

    Parameters are those of :func:`~bigdl_py.data.arrow_tables.table_to_arrays`; only the
    named columns are read. ``feature_columns=None`` takes every column but the label (one
    column keeps its row shape; several are concatenated into one vector per row).

    Returns
    -------
    features, labels
        Ready for ``ArrayDataset(features, labels)``.

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    KeyError
        When a column is missing (listing the columns the files have).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"no Parquet file or directory at {os.fspath(path)!r}")
    # Imported here: pyarrow.dataset brings pandas, half a second that every process
    # importing bigdl_py (each Spark Python worker among them) would otherwise pay.
    import pyarrow.dataset as pa_dataset

    dataset = pa_dataset.dataset(os.fspath(path), format="parquet")
    feature_columns = _default_feature_columns(dataset.schema.names, feature_columns, label_column)
    needed = _needed_columns(feature_columns, label_column)
    _check_columns(path, dataset.schema.names, needed)
    table = dataset.to_table(columns=needed)
    return table_to_arrays(table, feature_columns, label_column, feature_shape, dtype, label_dtype)


def read_arrow_table(path: str | os.PathLike) -> pa.Table:
    """A memory-mapped Arrow IPC file (``.arrow``/Feather v2) or stream as a Table.

    The file format is recognised by its ``ARROW1`` magic; anything else is read as a
    stream.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no Arrow IPC file at {os.fspath(path)!r}")
    source = pa.memory_map(os.fspath(path), "r")
    try:
        is_file_format = source.read(len(_ARROW_FILE_MAGIC)) == _ARROW_FILE_MAGIC
        source.seek(0)
        if is_file_format:
            return pa.ipc.open_file(source).read_all()
        return pa.ipc.open_stream(source).read_all()
    except pa.ArrowInvalid as error:
        raise ValueError(
            f"{os.fspath(path)!r} is not an Arrow IPC file or stream: {error}"
        ) from error


def read_arrow(
    path: str | os.PathLike,
    feature_columns: ColumnSpec | None = None,
    label_column: str | None = None,
    feature_shape: ShapeSpec = None,
    dtype: Any = np.float32,
    label_dtype: Any = None,
) -> tuple[Any, np.ndarray | None]:
    """Read features and labels from an Arrow IPC file or stream (memory-mapped).

    Parameters are those of :func:`read_parquet`.
    """
    table = read_arrow_table(path)
    feature_columns = _default_feature_columns(table.schema.names, feature_columns, label_column)
    _check_columns(path, table.schema.names, _needed_columns(feature_columns, label_column))
    return table_to_arrays(table, feature_columns, label_column, feature_shape, dtype, label_dtype)


def write_parquet(
    path: str | os.PathLike,
    features: Any,
    labels: Any = None,
    feature_columns: str | list[str] | None = None,
    label_column: str = "label",
    row_group_size: int | None = None,
) -> None:
    """Write arrays to one Parquet file (column layout of
    :func:`~bigdl_py.data.arrow_tables.arrays_to_table`)."""
    import pyarrow.parquet as pq  # (as pyarrow.dataset above)

    table = arrays_to_table(features, labels, feature_columns, label_column)
    pq.write_table(table, os.fspath(path), row_group_size=row_group_size)


def write_arrow(
    path: str | os.PathLike,
    features: Any,
    labels: Any = None,
    feature_columns: str | list[str] | None = None,
    label_column: str = "label",
    stream: bool = False,
) -> None:
    """Write arrays to an Arrow IPC file (or, with ``stream=True``, an IPC stream)."""
    table = arrays_to_table(features, labels, feature_columns, label_column)
    with pa.OSFile(os.fspath(path), "wb") as sink:
        open_writer = pa.ipc.new_stream if stream else pa.ipc.new_file
        with open_writer(sink, table.schema) as writer:
            writer.write_table(table)
