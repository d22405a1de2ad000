"""Inference names rows with NaN/Inf features instead of answering for them (issue 16, item 6)."""

from __future__ import annotations

import numpy as np
import pytest

import bigdl_py.nn as nn
from bigdl_py.autograd import Tensor, no_grad
from bigdl_py.data import Sample
from bigdl_py.spark.dataframe import arrays_to_dataframe
from bigdl_py.spark.inference import evaluate, nonfinite_rows, predict
from bigdl_py.train import Loss, Top1Accuracy

pytestmark = pytest.mark.spark

ROWS, INPUTS, CLASSES, BAD_ROW = 12, 4, 3, 7


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    features = rng.normal(size=(ROWS, INPUTS)).astype(np.float32)
    features[BAD_ROW, 2] = np.nan
    return features, rng.integers(0, CLASSES, size=ROWS)


@pytest.fixture(scope="module")
def model():
    return nn.Sequential(nn.Linear(INPUTS, CLASSES), nn.LogSoftmax())


def test_nonfinite_rows_finds_nan_and_inf_in_any_input():
    first = np.zeros((4, 2), dtype=np.float32)
    second = np.zeros((4, 3), dtype=np.float64)
    assert nonfinite_rows((first, second)) is None
    first[1, 0], second[3, 2] = np.nan, -np.inf
    np.testing.assert_array_equal(nonfinite_rows((first, second)), [False, True, False, True])
    assert nonfinite_rows((np.zeros((2, 2), dtype=np.int64),)) is None


def test_predict_dataframe_names_the_nan_row(spark, model, data):
    features, labels = data
    frame = arrays_to_dataframe(spark, features, labels, num_partitions=1)
    scored = predict(model, frame, output="class", batch_size=5)
    with pytest.raises(Exception, match=rf"partition 0, row {BAD_ROW} .*NaN or Inf features"):
        scored.collect()


def test_predict_rdd_names_the_nan_row(sc, model, data):
    features, _ = data
    rdd = sc.parallelize(list(features), 1)
    with pytest.raises(Exception, match=rf"partition 0, row {BAD_ROW} .*NaN or Inf"):
        predict(model, rdd, output="class", batch_size=5).collect()


def test_null_policy_gives_null_for_the_bad_row_only(spark, sc, model, data):
    features, labels = data
    with no_grad():
        clean = np.nan_to_num(features)
        expected = np.argmax(model(Tensor(clean)).numpy(), axis=1)
    frame = arrays_to_dataframe(spark, features, labels, num_partitions=2)
    rows = predict(model, frame, output="class", nonfinite="null").collect()
    predictions = [row["prediction"] for row in rows]
    assert predictions[BAD_ROW] is None
    good = [i for i in range(ROWS) if i != BAD_ROW]
    assert [predictions[i] for i in good] == [float(expected[i]) for i in good]
    probabilities = predict(model, frame, output="probabilities", nonfinite="null").collect()
    assert probabilities[BAD_ROW]["prediction"] is None
    assert len(probabilities[0]["prediction"]) == CLASSES
    records = predict(model, sc.parallelize(list(features), 2), output="class", nonfinite="null")
    assert records.collect()[BAD_ROW] is None


def test_unknown_policy_is_refused(sc, model, data):
    with pytest.raises(ValueError, match="nonfinite must be one of"):
        predict(model, sc.parallelize(list(data[0])), nonfinite="skip")


def test_evaluate_names_the_nan_row(sc, model, data):
    features, labels = data
    samples = sc.parallelize([Sample(f, int(y)) for f, y in zip(features, labels, strict=True)], 1)
    with pytest.raises(Exception, match=rf"evaluate: partition 0, row {BAD_ROW} .*NaN or Inf"):
        evaluate(model, samples, [Top1Accuracy(), Loss(nn.NLLLoss())], batch_size=5)
