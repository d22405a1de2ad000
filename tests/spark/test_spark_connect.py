"""A Spark Connect session is refused up front, with the limitation and what to do instead."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import bigdl_py.nn as nn
from bigdl_py.optim import SGD
from bigdl_py.spark import DistriOptimizer
from bigdl_py.spark.inference import evaluate, predict
from bigdl_py.spark.ml import NNClassifier
from bigdl_py.spark.predict_udf import predict_udf
from bigdl_py.spark.session import (
    SparkConnectNotSupportedError,
    is_spark_connect,
    require_classic_spark,
)
from bigdl_py.train import MaxEpoch, Optimizer, Top1Accuracy

pytestmark = pytest.mark.spark


class _ConnectDataFrame:
    """Stands in for pyspark.sql.connect.dataframe.DataFrame (recognised by its module)."""

    sparkSession = None
    columns = ["features", "label"]


_ConnectDataFrame.__module__ = "pyspark.sql.connect.dataframe"
_ConnectDataFrame.__qualname__ = _ConnectDataFrame.__name__ = "DataFrame"


class _ConnectSession:
    """Stands in for pyspark.sql.connect.session.SparkSession."""


_ConnectSession.__module__ = "pyspark.sql.connect.session"


def _model():
    return nn.Sequential(nn.Linear(2, 2))


def test_connect_objects_are_recognised_and_classic_ones_pass(spark):
    assert is_spark_connect(_ConnectDataFrame()) and is_spark_connect(_ConnectSession())
    assert not is_spark_connect(spark) and not is_spark_connect(spark.range(1))
    require_classic_spark(spark.range(1), "x", "y")  # no error


@pytest.mark.parametrize(
    "call, what",
    [
        (lambda: predict(_model(), _ConnectDataFrame()), "predict and evaluate"),
        (lambda: evaluate(_model(), _ConnectDataFrame(), [Top1Accuracy()]), "predict and"),
        (lambda: predict_udf(_model(), spark=_ConnectSession()), "predict_udf"),
        (lambda: NNClassifier(_model()).fit(_ConnectDataFrame()), "NNClassifier.fit"),
        (
            lambda: Optimizer(
                _model(), _ConnectDataFrame(), nn.CrossEntropyLoss(), SGD(lr=0.1), MaxEpoch(1)
            ),
            "DistriOptimizer",
        ),
        (
            lambda: DistriOptimizer(
                _model(), _ConnectDataFrame(), nn.CrossEntropyLoss(), SGD(lr=0.1), batch_size=4
            ),
            "DistriOptimizer",
        ),
        (
            lambda: DistriOptimizer(
                _model(),
                (np.zeros((8, 2), np.float32), np.zeros(8, np.int64)),
                nn.CrossEntropyLoss(),
                SGD(lr=0.1),
                batch_size=4,
                spark=_ConnectSession(),
            ),
            "DistriOptimizer",
        ),
    ],
)
def test_each_entry_point_refuses_connect_naming_what_to_do(call, what):
    with pytest.raises(SparkConnectNotSupportedError) as caught:
        call()
    message = str(caught.value)
    assert message.startswith(what)
    assert "RDD API" in message and "Spark Connect" in message
    assert "classic session" in message  # what to use instead


_REAL_CONNECT = textwrap.dedent(
    """
    import bigdl_py.nn as nn
    from pyspark.sql import SparkSession
    from bigdl_py.spark.ml import NNClassifier
    from bigdl_py.spark.inference import predict
    from bigdl_py.spark.predict_udf import predict_udf
    from bigdl_py.spark.session import SparkConnectNotSupportedError

    spark = (SparkSession.builder.remote("local[1]").config("spark.ui.enabled", "false")
             .getOrCreate())
    df = spark.createDataFrame([([0.0, 1.0], 0), ([1.0, 0.0], 1)], ["features", "label"])
    model = nn.Sequential(nn.Linear(2, 2))
    for name, call in [
        ("fit", lambda: NNClassifier(model).fit(df)),
        ("predict", lambda: predict(model, df)),
        ("predict_udf", lambda: predict_udf(model, spark=spark)),
    ]:
        try:
            call()
        except SparkConnectNotSupportedError:
            print("refused", name)
    spark.stop()
    """
)


@pytest.mark.slow
def test_a_real_local_connect_session_is_refused():
    pytest.importorskip("grpc")
    completed = subprocess.run(
        [sys.executable, "-c", _REAL_CONNECT], capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    refused = [line for line in completed.stdout.splitlines() if line.startswith("refused")]
    assert refused == ["refused fit", "refused predict", "refused predict_udf"]
