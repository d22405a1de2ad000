"""Recognising Spark's RDDs and DataFrames without importing pyspark."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.data import ArrayDataset
from bigdl_py.data.spark_types import is_dataframe, is_rdd, is_spark_data


def _stand_in(module: str, name: str):
    """An instance of a class named ``name`` defined in ``module`` (as pyspark's are)."""
    return type(name, (), {"__module__": module})()


def test_classes_are_recognised_by_their_module_and_name():
    rdd = _stand_in("pyspark.rdd", "RDD")
    frame = _stand_in("pyspark.sql.dataframe", "DataFrame")
    connect_frame = _stand_in("pyspark.sql.connect.dataframe", "DataFrame")
    assert is_rdd(rdd) and not is_dataframe(rdd)
    assert is_dataframe(frame) and is_dataframe(connect_frame) and not is_rdd(frame)
    assert all(is_spark_data(value) for value in (rdd, frame, connect_frame))


def test_a_subclass_of_an_rdd_is_an_rdd():
    rdd_class = type("RDD", (), {"__module__": "pyspark.rdd"})
    pipelined = type("PipelinedRDD", (rdd_class,), {"__module__": "pyspark.rdd"})()
    assert is_rdd(pipelined) and is_spark_data(pipelined)


@pytest.mark.parametrize(
    "value",
    [
        np.zeros(3),
        ArrayDataset(np.zeros((4, 2)), np.zeros(4)),
        (np.zeros((4, 2)), np.zeros(4)),
        _stand_in("mypackage.rdd", "RDD"),
        _stand_in("pyspark.sql.session", "SparkSession"),
    ],
    ids=["array", "array-dataset", "arrays", "another-packages-rdd", "a-session"],
)
def test_local_data_and_other_spark_objects_are_not_spark_data(value):
    assert not is_spark_data(value)


@pytest.mark.spark
def test_real_rdds_and_dataframes(spark):
    rdd = spark.sparkContext.parallelize([1, 2], 2)
    mapped = rdd.map(lambda value: value + 1)
    frame = spark.range(2)
    assert is_rdd(rdd) and is_rdd(mapped) and not is_dataframe(rdd)
    assert is_dataframe(frame) and not is_rdd(frame)
