"""The checks on feature columns as a Python worker receives them (no Spark needed)."""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow as pa
import pytest

from bigdl_py.spark.arrow_features import feature_batch, first_null, nonfinite_columns

VECTOR = pa.struct(
    [
        ("type", pa.int8()),
        ("size", pa.int32()),
        ("indices", pa.list_(pa.int32())),
        ("values", pa.list_(pa.float64())),
    ]
)


def _dense(values):
    return {"type": 1, "size": None, "indices": None, "values": values}


def _sparse(size, indices, values):
    return {"type": 0, "size": size, "indices": indices, "values": values}


def _struct(**columns) -> pa.StructArray:
    return pa.StructArray.from_arrays(list(columns.values()), names=list(columns))


def test_vectors_become_dense_rows_and_a_null_vector_stays_null():
    vectors = pa.array(
        [_dense([1.0, 2.0, 3.0]), _sparse(3, [2, 0], [5.0, 7.0]), None, _sparse(3, [], [])],
        VECTOR,
    )
    batch = feature_batch(_struct(v=vectors, x=pa.array([1.0, 2.0, 3.0, 4.0])), "t")
    assert batch.column(0).to_pylist() == [[1, 2, 3], [7, 0, 5], None, [0, 0, 0]]
    assert batch.column(1).to_pylist() == [1, 2, 3, 4]


def test_vectors_of_different_sizes_are_named():
    vectors = pa.array([_dense([1.0, 2.0]), _sparse(3, [0], [1.0])], VECTOR)
    with pytest.raises(ValueError, match=r"column 'v' holds Vectors of sizes \[2, 3\]"):
        feature_batch(_struct(v=vectors), "t")


def test_columns_that_are_not_numbers_are_named_with_their_spark_types():
    columns = _struct(
        ts=pa.array([datetime.datetime(2026, 1, 1)], pa.timestamp("us", tz="UTC")),
        local=pa.array([datetime.datetime(2026, 1, 1)], pa.timestamp("us")),
        day=pa.array([datetime.date(2026, 1, 1)]),
        m=pa.array([[("a", 1.0)]], pa.map_(pa.string(), pa.float64())),
        vectors=pa.array([[_dense([1.0])]], pa.list_(VECTOR)),
        x=pa.array([1.0]),
        d=pa.array([1], pa.decimal128(5, 2)),
    )
    with pytest.raises(TypeError) as error:
        feature_batch(columns, "predict_udf")
    message = str(error.value)
    assert message.startswith(
        "predict_udf: columns 'ts' (timestamp), 'local' (timestamp_ntz), 'day' (date), "
        "'m' (map<string,double>), 'vectors' (array<vector>) cannot be model features"
    )
    assert "unix_micros" in message and "'x'" not in message and "'d'" not in message
    with pytest.raises(TypeError, match="takes its columns in one struct.*one vector column"):
        feature_batch(pa.array([_dense([1.0])], VECTOR), "predict_udf")


def test_repeated_names_are_told_apart():
    batch = feature_batch(
        _struct(x=pa.array([1.0]), y=pa.array([2.0])).cast(
            pa.struct([("x", pa.float64()), ("x", pa.float64())])
        ),
        "t",
    )
    assert batch.schema.names == ["x", "x (2)"]


def test_the_first_null_row_is_found_at_any_depth_with_its_columns():
    nested = pa.array([[[1.0]], [[2.0]], [[3.0], [None]], None])
    batch = pa.RecordBatch.from_arrays(
        [nested, pa.array([1.0, 2.0, None, 4.0]), pa.array([1.0, 2.0, 3.0, 4.0])],
        names=["nested", "scalar", "clean"],
    )
    assert first_null(batch) == (2, ["nested", "scalar"])
    assert first_null(batch.slice(3)) == (0, ["nested"])
    assert first_null(batch.slice(0, 2)) is None


def test_nonfinite_columns_names_the_columns_of_one_row():
    batch = pa.RecordBatch.from_arrays(
        [pa.array([[1.0, np.nan], [1.0, 2.0]]), pa.array([np.inf, 1.0]), pa.array([1, 2])],
        names=["a", "b", "c"],
    )
    assert nonfinite_columns(batch, 0) == ["a", "b"]
    assert nonfinite_columns(batch, 1) == []
