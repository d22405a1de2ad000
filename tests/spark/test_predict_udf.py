"""predict_udf: the values and row order of NNModel.transform, from any column kind."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import bigdl_py.nn as nn
from bigdl_py.autograd import Tensor, no_grad
from bigdl_py.spark.dataframe import arrays_to_dataframe
from bigdl_py.spark.ml import NNClassifierModel, NNModel
from bigdl_py.spark.predict_udf import predict_udf

pytestmark = pytest.mark.spark

ROWS, INPUTS, CLASSES = 37, 4, 3


@pytest.fixture(scope="module")
def features():
    return np.random.default_rng(3).normal(size=(ROWS, INPUTS)).astype(np.float32)


@pytest.fixture(scope="module")
def model():
    with nn.init.seeded(4):
        return nn.Sequential(nn.Linear(INPUTS, 8), nn.Tanh(), nn.Linear(8, CLASSES))


@pytest.fixture(scope="module")
def frame(spark, features):
    """Array, Vector and scalar columns of the same features, an id, 3 partitions."""
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    labels = np.arange(ROWS)
    df = arrays_to_dataframe(spark, features, labels).withColumnRenamed("label", "id")
    df = df.repartition(3, "id").sortWithinPartitions("id")
    df = df.select(
        "id",
        "features",
        array_to_vector("features").alias("vector"),
        *[F.col("features")[j].alias(f"x{j}") for j in range(INPUTS)],
    )
    return df.cache()


def _local(model, *arrays) -> np.ndarray:
    with no_grad():
        return model(*(Tensor(array) for array in arrays)).numpy()


def test_raw_outputs_equal_nnmodel_transform_in_order(frame, model):
    udf = predict_udf(model, batch_size=5)
    scored = frame.withColumn("udf", udf("features"))
    expected = NNModel(model, batchSize=5).transform(frame)
    got = scored.select("id", "udf").toArrow()
    want = expected.select("id", "prediction").toArrow()
    assert got.column("id").to_pylist() == want.column("id").to_pylist()  # row order
    np.testing.assert_array_equal(
        np.stack(got.column("udf").to_numpy(zero_copy_only=False)),
        np.stack(want.column("prediction").to_numpy(zero_copy_only=False)),
    )


def test_vector_and_scalar_columns_give_the_same_values(frame, model, features):
    udf = predict_udf(model)
    rows = frame.select(
        "id", udf("vector").alias("vector"), udf(*[f"x{j}" for j in range(INPUTS)]).alias("x")
    ).toArrow()
    order = np.asarray(rows.column("id").to_pylist())
    expected = _local(model, features[order])
    for name in ("vector", "x"):
        values = np.stack(rows.column(name).to_numpy(zero_copy_only=False))
        np.testing.assert_allclose(values, expected, rtol=1e-6, atol=1e-7, err_msg=name)


def test_sparse_vectors_are_densified(spark, model, features):
    from pyspark.ml.linalg import Vectors

    rows = [(Vectors.sparse(INPUTS, {1: float(features[0, 1])}),), (Vectors.dense(features[1]),)]
    df = spark.createDataFrame(rows, ["v"])
    values = np.asarray(df.select(predict_udf(model)("v").alias("p")).toPandas()["p"].tolist())
    dense = np.zeros((2, INPUTS), dtype=np.float32)
    dense[0, 1] = features[0, 1]
    dense[1] = features[1]
    np.testing.assert_allclose(values, _local(model, dense), rtol=1e-6, atol=1e-7)


def test_classes_equal_nnclassifiermodel_transform(frame, model):
    udf = predict_udf(model, output="class")
    got = frame.withColumn("udf", udf("features")).select("id", "udf").toPandas()
    want = (
        NNClassifierModel(model, probabilityCol="")
        .transform(frame)
        .select("id", "prediction")
        .toPandas()
    )
    assert got["id"].tolist() == want["id"].tolist()
    assert got["udf"].tolist() == want["prediction"].tolist()
    assert got["udf"].dtype == np.float64


class TwoInputs(nn.Module):
    """``linear(a) + linear(b)`` for an image-shaped ``a``: two inputs, one of them 3-D."""

    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.left = nn.Linear(INPUTS, 2)
        self.right = nn.Linear(3, 2)

    def forward(self, a, b):
        return self.left(self.flatten(a)) + self.right(b)


@pytest.fixture
def classes_by_value():
    """Ship this module's classes by value (the Python workers cannot import a test module)."""
    from pyspark import cloudpickle

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    yield
    cloudpickle.unregister_pickle_by_value(module)


def test_several_inputs_take_one_column_each_with_their_shapes(spark, features, classes_by_value):
    second = np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3) / 10
    df = spark.createDataFrame(
        [(i, features[i].tolist(), second[i].tolist()) for i in range(ROWS)], ["id", "a", "b"]
    )
    model = TwoInputs()
    udf = predict_udf(model, input_shape=[(1, 2, 2), None], batch_size=8)
    rows = df.select("id", udf("a", "b").alias("p")).toPandas()
    order = rows["id"].to_numpy()
    expected = _local(model, features[order].reshape(-1, 1, 2, 2), second[order])
    np.testing.assert_allclose(np.stack(rows["p"]), expected, rtol=1e-6, atol=1e-7)
    with pytest.raises(TypeError, match="one column per input"):
        udf("a")


def test_a_model_that_does_not_fit_the_column_gets_a_clear_error(frame):
    wrong = nn.Sequential(nn.Linear(INPUTS + 1, 2))
    with pytest.raises(
        Exception, match=r"predict_udf: Sequential does not accept input.*\(\d+, 4\)"
    ):
        frame.select(predict_udf(wrong)("features")).collect()


def test_an_input_shape_the_rows_cannot_take_is_named(frame, model):
    udf = predict_udf(model, input_shape=(3, 2))
    with pytest.raises(Exception, match=r"4 values per row.*input_shape \(3, 2\)"):
        frame.select(udf("features")).collect()


def test_a_scalar_return_type_needs_one_value_per_row(frame, model):
    with pytest.raises(Exception, match="3 values per row"):
        frame.select(predict_udf(model, return_type="double")("features")).collect()
    single = nn.Sequential(nn.Linear(INPUTS, 1))
    values = frame.select(predict_udf(single, return_type="double")("features")).toPandas()
    assert values.iloc[:, 0].dtype == np.float64 and len(values) == ROWS


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"output": "labels"}, ValueError, "output"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"input_shape": (0, 4)}, ValueError, "input_shape"),
        ({"return_type": "string"}, ValueError, "return_type string"),
        ({"output": "class", "return_type": "array<float>"}, ValueError, "return_type"),
        ({"nonfinite": "skip"}, ValueError, "nonfinite must be one of"),
        ({"return_type": 5}, TypeError, "return_type must be a pyspark DataType"),
        # Integers would truncate scores and probabilities (issue 27, item 8).
        ({"return_type": "int"}, ValueError, r"return_type int would truncate output='raw'"),
        (
            {"output": "probabilities", "return_type": "array<bigint>"},
            ValueError,
            r"return_type array<bigint> would truncate output='probabilities'",
        ),
    ],
)
def test_bad_settings_raise_naming_them(spark, model, kwargs, error, match):
    with pytest.raises(error, match=match):
        predict_udf(model, **kwargs)


def test_class_outputs_keep_their_integer_return_types(spark, model):
    from pyspark.sql import types as T

    for name in ("int", "long", "float", "double"):
        udf = predict_udf(model, output="class", return_type=name)
        assert udf.return_type == T.DataType.fromDDL(name)


# --- bad input on the executors (issue 27, items 7, 8 and 16) --------------------------------
# One job per test: each DataFrame holds several bad inputs, and the error names each.

BAD_ROW = 9  # in the third Arrow batch of four rows: row numbers count across batches


@pytest.fixture
def small_arrow_batches(spark):
    """Arrow batches of four rows, so that a bad row's number must count across batches."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    spark.conf.set(key, "4")
    yield
    spark.conf.unset(key)


def _one_partition(spark, rows, schema):
    return spark.createDataFrame(rows, schema).coalesce(1)  # no shuffle: rows stay in order


def test_nan_and_inf_features_fail_naming_row_and_columns(spark, model, small_arrow_batches):
    values = np.arange(12 * 3, dtype=np.float64).reshape(12, 3) / 10
    weights = np.ones(12)
    values[BAD_ROW, 1], weights[BAD_ROW] = np.nan, np.inf
    weights[BAD_ROW + 1] = -np.inf  # a second bad row: the first is named
    rows = [(v.tolist(), float(w)) for v, w in zip(values, weights, strict=True)]
    df = _one_partition(spark, rows, "features array<double>, w double")
    with pytest.raises(
        Exception,
        match=rf"predict_udf: partition 0, row {BAD_ROW} \(counted from the partition's first "
        r"row\) has NaN or Inf features in column\(s\) 'features', 'w' \(2 such rows",
    ):
        df.select(predict_udf(model, output="class")("features", "w")).collect()


def test_nonfinite_null_gives_null_predictions_and_decimals_are_numbers(spark, model, features):
    from decimal import Decimal

    from pyspark.sql import functions as F

    data = features[:12].astype(np.float64)
    data[BAD_ROW, 2] = np.nan
    rounded = np.round(np.nan_to_num(data), 4)
    rows = [
        (row.tolist(), *(Decimal(f"{value:.4f}") for value in decimals))
        for row, decimals in zip(data, rounded, strict=True)
    ]
    decimal_columns = [f"d{j}" for j in range(INPUTS)]
    schema = "features array<double>, " + ", ".join(f"{c} decimal(8,4)" for c in decimal_columns)
    df = _one_partition(spark, rows, schema)
    classes = predict_udf(model, output="class", return_type="long", nonfinite="null")
    raw = predict_udf(model, nonfinite="null")
    got = df.select(
        classes("features").alias("class"),
        raw("features").alias("raw"),
        predict_udf(model)(*decimal_columns).alias("decimal"),
        F.col("d0"),
    ).collect()
    expected = _local(model, np.nan_to_num(data).astype(np.float32))
    good = [row for row in range(12) if row != BAD_ROW]
    assert got[BAD_ROW]["class"] is None and got[BAD_ROW]["raw"] is None
    assert [got[row]["class"] for row in good] == np.argmax(expected[good], axis=1).tolist()
    np.testing.assert_allclose([got[row]["raw"] for row in good], expected[good], rtol=1e-6)
    np.testing.assert_allclose(
        [row["decimal"] for row in got], _local(model, rounded.astype(np.float32)), rtol=1e-6
    )


def test_columns_that_are_not_numbers_fail_naming_each_and_its_spark_type(spark, model):
    import datetime

    row = (
        datetime.datetime(2026, 11, 28, 12),
        datetime.date(2026, 11, 28),
        {"a": 1.0},
        "text",
        (1.0,),
        1.0,
    )
    schema = "ts timestamp, day date, m map<string,double>, s string, st struct<a:double>, x double"
    df = spark.createDataFrame([row], schema)
    with pytest.raises(
        Exception,
        match=r"predict_udf: columns 'ts' \(timestamp\), 'day' \(date\), 'm' "
        r"\(map<string,double>\), 's' \(string\), 'st' \(struct<a:double>\) cannot be "
        r"model features.*unix_micros",
    ):
        df.select(predict_udf(model)(*df.columns)).collect()


def test_null_rows_and_elements_fail_naming_row_and_columns(spark, model):
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import types as T

    good = (Vectors.dense([1.0]), [1.0], [1.0, 1.0], 1)
    bad = (None, None, [1.0, None], None)  # a null Vector, array, element and number
    schema = T.StructType(
        [
            T.StructField("v", VectorUDT()),
            T.StructField("a", T.ArrayType(T.DoubleType())),
            T.StructField("e", T.ArrayType(T.DoubleType())),
            T.StructField("n", T.IntegerType()),
        ]
    )
    df = _one_partition(spark, [good, good, bad, good], schema)
    with pytest.raises(
        Exception,
        match=r"predict_udf: partition 0, row 2 .*has a null in column\(s\) 'v', 'a', 'e', 'n'",
    ):
        df.select(predict_udf(model)("v", "a", "e", "n")).collect()


def test_sql_through_udf_register(spark, frame, model):
    spark.udf.register("bigdl_py_test_predict", predict_udf(model).sql_function())
    frame.createOrReplaceTempView("bigdl_py_test_frame")
    rows = spark.sql(
        "SELECT id, bigdl_py_test_predict(struct(features)) AS p FROM bigdl_py_test_frame"
    ).toPandas()
    want = NNModel(model).transform(frame).select("id", "prediction").toPandas()
    want = want.set_index("id").loc[rows["id"]]
    np.testing.assert_array_equal(np.stack(rows["p"]), np.stack(want["prediction"]))
