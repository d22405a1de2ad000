"""Distributed predict and evaluate: equal to a local forward pass, in order, model sent once."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest

import bigdl_py.nn as nn
from bigdl_py import backend
from bigdl_py.autograd import Tensor, no_grad
from bigdl_py.data import MiniBatch, Sample
from bigdl_py.spark.dataframe import arrays_to_dataframe
from bigdl_py.spark.inference import _model_payload, evaluate, predict
from bigdl_py.train import Loss, Top1Accuracy, evaluate_batches

pytestmark = pytest.mark.spark

ROWS, INPUTS, CLASSES = 30, 4, 3


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    features = rng.normal(size=(ROWS, INPUTS)).astype(np.float32)
    labels = rng.integers(0, CLASSES, size=ROWS)
    return features, labels


@pytest.fixture(scope="module")
def model():
    return nn.Sequential(nn.Linear(INPUTS, 8), nn.Tanh(), nn.Linear(8, CLASSES))


def _local(model, *features) -> np.ndarray:
    with no_grad():
        return model(*(Tensor(array) for array in features)).numpy()


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


@pytest.fixture
def test_classes_by_value():
    """Ship this module's classes by value, as cloudpickle does for a notebook's classes
    (the Python workers cannot import a test module)."""
    from pyspark import cloudpickle

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    yield
    cloudpickle.unregister_pickle_by_value(module)


def test_predict_rdd_keeps_order_and_equals_the_local_forward(sc, model, data):
    features, _ = data
    records = sc.parallelize(list(features), 3)
    # batch_size 4 does not divide the partitions' 10 records: the last batch is short.
    raw = predict(model, records, batch_size=4, output="raw")
    assert raw.getNumPartitions() == 3
    np.testing.assert_allclose(np.stack(raw.collect()), _local(model, features), rtol=1e-6)


def test_predict_rdd_probabilities_and_classes(sc, model, data):
    features, _ = data
    records = sc.parallelize([Sample(row) for row in features], 4)
    logits = _local(model, features)
    probabilities = np.stack(predict(model, records, batch_size=5).collect())
    np.testing.assert_allclose(probabilities, _softmax(logits), rtol=1e-5, atol=1e-7)
    classes = predict(model, records, batch_size=5, output="class").collect()
    assert all(type(value) is int for value in classes)
    np.testing.assert_array_equal(classes, logits.argmax(axis=1))


def test_final_log_softmax_and_sigmoid_are_recognised(sc, data):
    features, _ = data
    records = sc.parallelize(list(features), 2)
    log_probabilities = nn.Sequential(nn.Linear(INPUTS, CLASSES), nn.LogSoftmax())
    probabilities = np.stack(predict(log_probabilities, records).collect())
    np.testing.assert_allclose(probabilities, np.exp(_local(log_probabilities, features)), 1e-5)
    binary = nn.Sequential(nn.Linear(INPUTS, 1), nn.Sigmoid())
    classes = predict(binary, records, output="class").collect()
    np.testing.assert_array_equal(classes, (_local(binary, features)[:, 0] >= 0.5).astype(int))


class TwoInputs(nn.Module):
    """A model with two inputs: ``linear(a) + linear(b)``."""

    def __init__(self):
        super().__init__()
        self.left = nn.Linear(INPUTS, 2)
        self.right = nn.Linear(3, 2)

    def forward(self, a, b):
        return self.left(a) + self.right(b)


def test_predict_samples_with_two_inputs(sc, data, test_classes_by_value):
    features, _ = data
    second = np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3) / 10
    model = TwoInputs()
    records = sc.parallelize([Sample((a, b)) for a, b in zip(features, second, strict=True)], 3)
    raw = np.stack(predict(model, records, batch_size=7, output="raw").collect())
    np.testing.assert_allclose(raw, _local(model, features, second), rtol=1e-5, atol=1e-6)


def test_predict_dataframe_adds_a_column_and_keeps_rows(spark, model, data):
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    features, labels = data
    columns = [f"f{j}" for j in range(INPUTS)]
    df = arrays_to_dataframe(spark, features, labels).select(
        *[F.col("features")[j].alias(name) for j, name in enumerate(columns)], "label"
    )
    df = VectorAssembler(inputCols=columns, outputCol="vector").transform(df).cache()
    try:
        scored = predict(model, df, batch_size=4, feature_cols="vector")
        assert scored.schema.names == [*df.schema.names, "prediction"]
        assert scored.schema["prediction"].dataType == T.ArrayType(T.FloatType())
        table = scored.drop("vector").toArrow()
        # Every row, with its own columns, in the input order, next to its prediction.
        for j, name in enumerate(columns):
            np.testing.assert_array_equal(table.column(name).to_numpy(), features[:, j])
        np.testing.assert_array_equal(table.column("label").to_numpy(), labels)
        predicted = np.stack(table.column("prediction").to_numpy(zero_copy_only=False))
        expected = _softmax(_local(model, features))
        np.testing.assert_allclose(predicted, expected, rtol=1e-5, atol=1e-7)

        classes = predict(model, df, feature_cols=columns, prediction_col="class", output="class")
        assert classes.schema["class"].dataType == T.DoubleType()
        column = classes.select("class").toArrow().column("class").to_numpy()
        np.testing.assert_array_equal(column, expected.argmax(axis=1))
    finally:
        df.unpersist()


class CountingModel(nn.Module):
    """Wraps a model and adds 1 to a Spark accumulator each time it is unpickled."""

    def __init__(self, inner, loads):
        super().__init__()
        self.inner = inner
        self.loads = loads

    def forward(self, x):
        return self.inner(x)

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.loads.add(1)


def test_model_is_rebuilt_once_per_worker_not_per_batch(sc, model, data, test_classes_by_value):
    features, _ = data
    partitions, batch_size = 3, 2
    loads = sc.accumulator(0)
    counting = CountingModel(model, loads)
    records = sc.parallelize(list(features), partitions)
    predictions = predict(counting, records, batch_size=batch_size, output="raw").collect()
    assert len(predictions) == ROWS
    batches = ROWS // batch_size
    # Each task reuses its worker's copy for all its batches; a worker that runs several
    # tasks of the call rebuilds once. Spark does not promise that tasks share workers, so
    # the bound is one load per task.
    assert 1 <= loads.value <= partitions < batches


def test_model_payload_leaves_gradients_out_and_the_model_alone(model, data):
    features, labels = data
    loss = nn.CrossEntropyLoss()(model(Tensor(features)), Tensor(labels))
    loss.backward()
    shipped = pickle.loads(_model_payload(model))
    assert all(parameter.grad is None for parameter in shipped.parameters())
    assert all(parameter.grad is not None for parameter in model.parameters())
    for ours, theirs in zip(model.parameters(), shipped.parameters(), strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    model.zero_grad(set_to_none=True)


def test_predict_rejects_bad_arguments(spark, sc, model, data):
    features, labels = data
    records = sc.parallelize(list(features), 2)
    with pytest.raises(ValueError, match="output must be one of"):
        predict(model, records, output="logits")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        predict(model, records, batch_size=0)
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        predict(model, records, device="gpu0")
    with pytest.raises(TypeError, match="must be a pyspark RDD or DataFrame"):
        predict(model, features)
    df = arrays_to_dataframe(spark, features, labels)
    with pytest.raises(ValueError, match="prediction_col 'label' is already a column"):
        predict(model, df, prediction_col="label")


@pytest.mark.skipif(backend.cuda_available(), reason="this machine has a usable GPU")
def test_predict_on_gpu_without_cupy_fails_naming_the_setting(sc, model, data):
    records = sc.parallelize(list(data[0]), 2)
    with pytest.raises(Exception, match=r"device='gpu' was requested.*CuPy"):
        predict(model, records, device="gpu").collect()


def test_evaluate_matches_one_local_pass(spark, sc, model, data):
    features, labels = data
    criterion = nn.CrossEntropyLoss()
    methods = [Top1Accuracy(), Loss(criterion)]
    expected = evaluate_batches(model, [MiniBatch(features, labels)], methods)
    samples = sc.parallelize([Sample(x, y) for x, y in zip(features, labels, strict=True)], 3)
    df = arrays_to_dataframe(spark, features, labels)
    for distributed in (
        evaluate(model, samples, methods, batch_size=4),
        evaluate(model, df, [Top1Accuracy(), Loss()], batch_size=7, criterion=criterion),
    ):
        assert [result.name for result in distributed] == ["Top1Accuracy", "Loss"]
        assert distributed[0] == expected[0]
        assert distributed[1].count == ROWS
        assert distributed[1].value == pytest.approx(expected[1].value, rel=1e-5)
    [loss_only] = evaluate(model, samples, criterion)
    assert loss_only.value == pytest.approx(expected[1].value, rel=1e-5)


def test_evaluate_takes_every_record_kind_training_takes(sc, model, data):
    """Pairs and MiniBatches, as training takes them, not only Samples (issue 27 follow-up:
    pairs failed on the executors with "'tuple' object has no attribute 'label'")."""
    features, labels = data
    methods = [Top1Accuracy(), Loss(nn.CrossEntropyLoss())]
    expected = evaluate_batches(model, [MiniBatch(features, labels)], methods)
    pairs = list(zip(features, labels, strict=True))
    mixed = [
        MiniBatch(features[:9], labels[:9]),  # cut into pieces of the batch size
        *[Sample(x, y) for x, y in pairs[9:20]],
        *pairs[20:],
    ]
    for records in (
        pairs,
        [MiniBatch(features[k : k + 5], labels[k : k + 5]) for k in range(0, ROWS, 5)],
        mixed,
    ):
        distributed = evaluate(model, sc.parallelize(records, 2), methods, batch_size=4)
        assert distributed[0] == expected[0]
        assert distributed[1].count == ROWS
        assert distributed[1].value == pytest.approx(expected[1].value, rel=1e-5)


def test_evaluate_refuses_records_training_refuses_naming_them(sc, data):
    features, labels = data
    model = nn.Sequential(nn.Linear(INPUTS, CLASSES))
    with pytest.raises(Exception, match=r"record 1: validation records must be Samples, \(featu"):
        evaluate(model, sc.parallelize([(features[0], labels[0]), "row"], 1), Top1Accuracy())
    with pytest.raises(Exception, match="record 0: a validation Sample has no label"):
        evaluate(model, sc.parallelize([Sample(features[0])], 1), Top1Accuracy())
