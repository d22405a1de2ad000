"""Feature columns as a Python worker receives them from Spark: a struct of Arrow arrays.

Both ways of scoring a DataFrame on the executors — ``predict`` and ``predict_udf`` — hand
their UDF the feature columns inside one struct. What arrives is checked here before any
model work, the same way for both:

- every column must be a number (integer, float, double, decimal, boolean), an array of
  numbers (nested too) or an ML Vector; any other column is refused at the first batch,
  naming each such column and its Spark type. Timestamps and dates are refused, not read
  as microseconds or days: a model was trained on some number made from them, and only the
  user knows which. Decimals are numbers, read as doubles, as Spark ML's
  ``VectorAssembler`` and its estimators' label columns read them;
- a Vector (its storage struct: ``type``, ``size``, ``indices``, ``values``; dense or sparse
  rows) becomes an array of its dense values, so the converters see only numbers and lists;
- nulls, at any depth (a null row, or a null element of an array), are found by column and
  row, for a message that names both.

Only pyarrow and NumPy: this runs on the executors, on Spark's Arrow batches.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bigdl_py.spark.dataframe import array_to_list_column

_VECTOR_FIELDS = ("type", "size", "indices", "values")

_SCALAR_NAMES = {
    pa.bool_(): "boolean",
    pa.int8(): "tinyint",
    pa.int16(): "smallint",
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.null(): "void",
    pa.binary(): "binary",
    pa.large_binary(): "binary",
}


def _is_list_like(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    )


def is_vector_storage(arrow_type: pa.DataType) -> bool:
    """Whether ``arrow_type`` is how Spark sends an ML Vector: its UDT's storage struct."""
    return (
        pa.types.is_struct(arrow_type)
        and tuple(arrow_type.field(index).name for index in range(arrow_type.num_fields))
        == _VECTOR_FIELDS
    )


def spark_type_name(arrow_type: pa.DataType) -> str:
    """The Spark SQL name of the type that reached Python as ``arrow_type`` (for messages)."""
    if is_vector_storage(arrow_type):
        return "vector"
    if pa.types.is_timestamp(arrow_type):
        return "timestamp" if arrow_type.tz else "timestamp_ntz"
    if pa.types.is_date(arrow_type):
        return "date"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "string"
    if pa.types.is_decimal(arrow_type):
        return f"decimal({arrow_type.precision},{arrow_type.scale})"
    if _is_list_like(arrow_type):
        return f"array<{spark_type_name(arrow_type.value_type)}>"
    if pa.types.is_map(arrow_type):
        key, item = spark_type_name(arrow_type.key_type), spark_type_name(arrow_type.item_type)
        return f"map<{key},{item}>"
    if pa.types.is_struct(arrow_type):
        fields = (arrow_type.field(index) for index in range(arrow_type.num_fields))
        return "struct<" + ",".join(f"{f.name}:{spark_type_name(f.type)}" for f in fields) + ">"
    if pa.types.is_duration(arrow_type):
        return "interval day to second"
    if pa.types.is_interval(arrow_type):
        return "interval"
    return _SCALAR_NAMES.get(arrow_type, str(arrow_type))


def _is_number(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
        or pa.types.is_decimal(arrow_type)
    )


def _is_feature_type(arrow_type: pa.DataType, top_level: bool = True) -> bool:
    if _is_number(arrow_type):
        return True
    if _is_list_like(arrow_type):
        return _is_feature_type(arrow_type.value_type, top_level=False)
    return top_level and is_vector_storage(arrow_type)


def check_feature_fields(schema: pa.Schema, where: str) -> None:
    """Refuse, naming each, the columns of ``schema`` that cannot be model features."""
    refused = [field for field in schema if not _is_feature_type(field.type)]
    if not refused:
        return
    names = ", ".join(f"{field.name!r} ({spark_type_name(field.type)})" for field in refused)
    hints = ""
    kinds = {spark_type_name(field.type) for field in refused}
    if kinds & {"timestamp", "timestamp_ntz", "date"}:
        hints += (
            "; a timestamp or date has no unit a model could assume: turn it into the number "
            "the model was trained on first (e.g. unix_micros(ts), unix_date(d), datediff)"
        )
    if "string" in kinds:
        hints += "; index strings first (e.g. StringIndexer)"
    raise TypeError(
        f"{where}: {'column' if len(refused) == 1 else 'columns'} {names} cannot be model "
        "features: features are numbers (tinyint to bigint, float, double, decimal, "
        f"boolean), arrays of numbers or ML Vectors{hints}"
    )


def _unique(names: list[str]) -> list[str]:
    """Names with repeats told apart (``x``, ``x (2)``), so that each column is found by name."""
    counts: dict[str, int] = {}
    unique = []
    for name in names:
        counts[name] = counts.get(name, 0) + 1
        unique.append(name if counts[name] == 1 else f"{name} ({counts[name]})")
    return unique


def _vector_values(vectors: pa.StructArray, column: str) -> pa.Array:
    """Vector storage (dense and sparse rows) -> ``list<double>`` of each row's dense values;
    a null Vector stays null."""
    fields = dict(zip(_VECTOR_FIELDS, vectors.flatten(), strict=True))  # nulls of the parent kept
    valid = vectors.is_valid().to_numpy(zero_copy_only=False)
    dense_rows = pc.fill_null(fields["type"], 1).to_numpy(zero_copy_only=False) == 1
    value_counts = pc.fill_null(pc.list_value_length(fields["values"]), 0)
    value_counts = value_counts.to_numpy(zero_copy_only=False).astype(np.int64)
    sparse_sizes = pc.fill_null(fields["size"], 0).to_numpy(zero_copy_only=False)
    sizes = np.where(dense_rows, value_counts, sparse_sizes)
    widths = np.unique(sizes[valid])
    if len(widths) > 1:
        raise ValueError(
            f"column {column!r} holds Vectors of sizes {widths.tolist()}; every row of a "
            "feature column must have the same size"
        )
    width = int(widths[0]) if len(widths) else 0
    values = pc.list_flatten(fields["values"]).to_numpy(zero_copy_only=False)
    value_rows = pc.list_parent_indices(fields["values"]).to_numpy(zero_copy_only=False)
    # A value's place in its row: its position among the row's values (dense rows), or the
    # index stored beside it (sparse rows).
    row_starts = np.cumsum(value_counts) - value_counts
    places = np.arange(len(values)) - row_starts[value_rows]
    places[~dense_rows[value_rows]] = pc.list_flatten(fields["indices"]).to_numpy(
        zero_copy_only=False
    )
    dense = np.zeros((len(vectors), width), dtype=np.float64)
    dense[value_rows, places] = values
    return array_to_list_column(dense, mask=~valid)


def feature_batch(columns: pa.Array, where: str) -> pa.RecordBatch:
    """The UDF's struct of feature columns as a record batch the converters take.

    The columns' types are checked first (see the module docstring), repeated names are
    told apart, and Vectors become arrays of their dense values.
    """
    if not pa.types.is_struct(columns.type) or is_vector_storage(columns.type):
        raise TypeError(
            f"{where}: the UDF takes its columns in one struct, e.g. struct(x1, x2); got "
            f"one {spark_type_name(columns.type)} column"
        )
    schema = pa.schema(columns.type)
    check_feature_fields(schema, where)
    names = _unique(schema.names)
    arrays = [
        _vector_values(array, name) if is_vector_storage(array.type) else array
        for array, name in zip(columns.flatten(), names, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _first_null_row(array: pa.Array) -> int | None:
    """The first row of ``array`` that is null or holds a null at any depth; None if none."""
    rows = []
    if array.null_count:
        rows.append(int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0]))
    if _is_list_like(array.type):
        inner = _first_null_row(array.flatten())  # the values of the non-null rows
        if inner is not None:
            rows.append(int(pc.list_parent_indices(array)[inner].as_py()))
    return min(rows, default=None)


def first_null(batch: pa.RecordBatch) -> tuple[int, list[str]] | None:
    """The first row of ``batch`` with a null anywhere, and the columns that hold one there."""
    rows = {
        name: _first_null_row(array)
        for name, array in zip(batch.schema.names, batch.columns, strict=True)
    }
    found = [row for row in rows.values() if row is not None]
    if not found:
        return None
    row = min(found)
    return row, [name for name, first in rows.items() if first == row]


def nonfinite_columns(batch: pa.RecordBatch, row: int) -> list[str]:
    """The columns of ``batch`` holding NaN or Inf in row ``row``."""
    names = []
    for name, array in zip(batch.schema.names, batch.columns, strict=True):
        values = array.slice(row, 1)
        while _is_list_like(values.type):
            values = values.flatten()
        if pa.types.is_floating(values.type):
            if not np.isfinite(values.to_numpy(zero_copy_only=False)).all():
                names.append(name)
    return names
