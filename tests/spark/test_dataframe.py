"""DataFrame -> NumPy through Arrow (per partition and on the driver), and back."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.spark.dataframe import (
    arrays_to_dataframe,
    arrow_batch_rdd,
    dataframe_to_arrays,
    dataframe_to_partition_arrays,
    select_for_arrow,
)

pytestmark = pytest.mark.spark

WIDTH = 6


def _expected_features(ids: np.ndarray) -> np.ndarray:
    """What the test DataFrames hold: row ``id`` has values ``id * 10 + j``, j < WIDTH."""
    return (ids[:, None] * 10.0 + np.arange(WIDTH)).astype(np.float32)


@pytest.fixture(scope="module")
def numbers(spark):
    """23 rows in 3 partitions (8, 8, 7 — contiguous, as spark.range splits): an id, an
    ``array<double>`` column, the same values as scalar columns, and a long label."""
    from pyspark.sql import functions as F

    values = [(F.col("id") * 10 + j).cast("double") for j in range(WIDTH)]
    return spark.range(0, 23, 1, 3).select(
        "id",
        F.array(*values).alias("x"),
        *[value.alias(f"c{j}") for j, value in enumerate(values)],
        (F.col("id") % 3).alias("y"),
    )


def _ids_per_partition(df) -> list[list[int]]:
    """The ids each partition holds, read through Spark's own (row by row) path."""
    return df.select("id").rdd.glom().map(lambda rows: [row.id for row in rows]).collect()


def test_array_column_partition_by_partition_in_order(numbers):
    blocks = dataframe_to_partition_arrays(numbers, "x", "y").collect()
    expected_ids = _ids_per_partition(numbers)
    assert len(blocks) == numbers.rdd.getNumPartitions() == 3
    for (features, labels), ids in zip(blocks, expected_ids, strict=True):
        ids = np.asarray(ids)
        assert features.dtype == np.float32
        np.testing.assert_array_equal(features, _expected_features(ids))
        np.testing.assert_array_equal(labels, ids % 3)
        assert labels.dtype == np.int64


def test_vector_column_from_vector_assembler(numbers):
    from pyspark.ml.feature import VectorAssembler

    assembled = VectorAssembler(
        inputCols=[f"c{j}" for j in range(WIDTH)], outputCol="vector"
    ).transform(numbers)
    features, labels = dataframe_to_arrays(assembled, "vector", "y")
    ids = np.arange(23)
    np.testing.assert_array_equal(features, _expected_features(ids))
    np.testing.assert_array_equal(labels, ids % 3)
    float64, _ = dataframe_to_arrays(assembled, "vector", None, dtype=np.float64)
    assert float64.dtype == np.float64


def test_scalar_columns_become_one_vector_per_row(numbers):
    [(features, labels)] = dataframe_to_partition_arrays(
        numbers.coalesce(1), [f"c{j}" for j in range(WIDTH)], None
    ).collect()
    np.testing.assert_array_equal(features, _expected_features(np.arange(23)))
    assert labels is None


def test_several_inputs_and_feature_shape(numbers):
    (images, scalars), labels = dataframe_to_arrays(
        numbers, [["x"], ["c0", "c5"]], "y", feature_shape=[(2, 3), None]
    )
    expected = _expected_features(np.arange(23))
    np.testing.assert_array_equal(images, expected.reshape(23, 2, 3))
    np.testing.assert_array_equal(scalars, expected[:, [0, 5]])
    np.testing.assert_array_equal(labels, np.arange(23) % 3)


def test_driver_arrays_equal_the_partition_blocks(numbers):
    features, labels = dataframe_to_arrays(numbers, "x", "y")
    blocks = dataframe_to_partition_arrays(numbers, "x", "y").collect()
    np.testing.assert_array_equal(features, np.concatenate([block[0] for block in blocks]))
    np.testing.assert_array_equal(labels, np.concatenate([block[1] for block in blocks]))


def test_empty_partitions_give_empty_blocks(numbers):
    # Rows 0..7 are partition 0, so the filter leaves partitions 1 and 2 empty.
    blocks = dataframe_to_partition_arrays(
        numbers.where("id < 5"), "x", "y", feature_shape=(2, 3)
    ).collect()
    assert [block[0].shape for block in blocks] == [(5, 2, 3), (0, 2, 3), (0, 2, 3)]
    assert [block[1].dtype for block in blocks] == [np.int64] * 3
    features, labels = dataframe_to_arrays(numbers.where("id < 0"), "x", "y", feature_shape=(6,))
    assert features.shape == (0, 6) and labels.shape == (0,)
    features, _ = dataframe_to_arrays(numbers.where("id < 0"), ["c0", "c1", "x"], None)
    assert features.shape == (0, 2)  # an array column's width is unknown without rows


def test_arrow_batches_keep_partitions_and_rows(spark, numbers):
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "3")
    try:
        batches = arrow_batch_rdd(select_for_arrow(numbers, "x", "y")).glom().collect()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert [len(partition) for partition in batches] == [3, 3, 3]  # 8, 8, 7 rows by 3
    labels = [batch.column("y").to_numpy() for partition in batches for batch in partition]
    np.testing.assert_array_equal(np.concatenate(labels), np.arange(23) % 3)


def test_ragged_array_rows_fail_naming_partition_column_and_row(spark):
    from pyspark.sql import functions as F

    ragged = spark.range(0, 4, 1, 2).select(
        F.when(F.col("id") == 3, F.array(F.lit(1.0)))
        .otherwise(F.array(F.lit(1.0), F.lit(2.0)))
        .alias("x")
    )
    with pytest.raises(Exception, match=r"partition 1: column 'x' is ragged: row 1 has 1"):
        dataframe_to_partition_arrays(ragged, "x", None).collect()


def test_null_features_fail_with_the_row(spark):
    df = spark.createDataFrame([([1.0, 2.0],), (None,)], "x array<double>")
    with pytest.raises(ValueError, match="column 'x' has a null at row 1"):
        dataframe_to_arrays(df, "x", None)


def test_missing_column_fails_on_the_driver(numbers):
    with pytest.raises(KeyError, match=r"no column 'pixels'.*\['id', 'x'"):
        dataframe_to_partition_arrays(numbers, "pixels", "y")


def test_vector_label_is_rejected(numbers):
    from pyspark.ml.feature import VectorAssembler

    assembled = VectorAssembler(inputCols=["c0"], outputCol="v").transform(numbers)
    with pytest.raises(TypeError, match="label column 'v' is a Vector"):
        dataframe_to_arrays(assembled, "x", "v")


def test_arrays_to_dataframe_round_trip_in_order(spark, rng):
    images = rng.normal(size=(10, 2, 3)).astype(np.float32)
    labels = rng.integers(0, 5, size=10)
    df = arrays_to_dataframe(spark, images, labels, num_partitions=3)
    assert df.rdd.getNumPartitions() == 3
    blocks = dataframe_to_partition_arrays(df, "features", "label", feature_shape=(2, 3)).collect()
    assert all(len(block[1]) > 0 for block in blocks)  # contiguous, non-empty ranges
    np.testing.assert_array_equal(np.concatenate([block[0] for block in blocks]), images)
    np.testing.assert_array_equal(np.concatenate([block[1] for block in blocks]), labels)
    features, _ = dataframe_to_arrays(arrays_to_dataframe(spark, images), "features", None)
    np.testing.assert_array_equal(features, images.reshape(10, 6))


def test_arrays_to_dataframe_checks_its_arguments(spark):
    with pytest.raises(ValueError, match="2 feature arrays but 1 column names"):
        arrays_to_dataframe(spark, [np.zeros((2, 2)), np.zeros((2, 1))], feature_cols="a")
    with pytest.raises(ValueError, match="differ in row count"):
        arrays_to_dataframe(spark, np.zeros((2, 2)), np.zeros(3))
    with pytest.raises(ValueError, match="clashes"):
        arrays_to_dataframe(spark, np.zeros((2, 2)), np.zeros(2), "label", "label")
