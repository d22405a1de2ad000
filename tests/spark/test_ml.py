"""Spark ML stages: params, fit inside a Pipeline, transform order, persistence, errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import bigdl_py.nn as nn
from bigdl_py.autograd import Tensor, no_grad
from bigdl_py.optim import SGD, Adam
from bigdl_py.train import (
    EveryEpoch,
    Loss,
    MaxEpoch,
    MaxIteration,
    MinLoss,
    SeveralIteration,
    Trigger,
    ValidationSummary,
)

pyspark = pytest.importorskip("pyspark")

from pyspark.ml import Pipeline, PipelineModel  # noqa: E402
from pyspark.ml.feature import StandardScaler, VectorAssembler  # noqa: E402

from bigdl_py.spark.ml import NNClassifier, NNClassifierModel, NNEstimator, NNModel  # noqa: E402
from bigdl_py.spark.ml_params import trigger_config, trigger_from_config  # noqa: E402

pytestmark = pytest.mark.spark

ROWS = 240


def _separable(seed: int, rows: int = ROWS):
    """Two classes split by a line, on raw scales far from standardised (StandardScaler matters)."""
    rng = np.random.default_rng(seed)
    x1 = rng.normal(50.0, 10.0, rows)
    x2 = rng.normal(-3.0, 0.2, rows)
    labels = ((x1 - 50.0) / 10.0 + (x2 + 3.0) / 0.2 > 0).astype(float)
    return [
        (i, float(a), float(b), float(c))
        for i, (a, b, c) in enumerate(zip(x1, x2, labels, strict=True))
    ]


def _dataframe(spark, rows, partitions=3):
    """Rows in input order, contiguous across partitions (the same order every time)."""
    data = spark.sparkContext.parallelize(rows, partitions)
    return spark.createDataFrame(data, ["id", "x1", "x2", "label"])


def _classifier_model():
    return nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2), nn.LogSoftmax(dim=1))


def _stages(classifier):
    return [
        VectorAssembler(inputCols=["x1", "x2"], outputCol="raw"),
        StandardScaler(inputCol="raw", outputCol="features", withMean=True),
        classifier,
    ]


@pytest.fixture(scope="module")
def trained(spark):
    """One Pipeline fit shared by the tests below (fitting costs most of this file's time)."""
    train_df = _dataframe(spark, _separable(1))
    test_df = _dataframe(spark, _separable(2, 120))
    model = _classifier_model()
    weights_before = {name: value.copy() for name, value in model.state_dict().items()}
    classifier = (
        NNClassifier(model, nn.NLLLoss())
        .setBatchSize(48)
        .setEndWhen(MaxIteration(8))
        .setOptimMethod(Adam(lr=0.1))
        .setNumPartitions(2)
    )
    fitted = Pipeline(stages=_stages(classifier)).fit(train_df)
    return {
        "fitted": fitted,
        "classifier": classifier,
        "weights_before": weights_before,
        "test_df": test_df,
    }


def test_setters_chain_return_self_and_validate():
    classifier = NNClassifier(_classifier_model())
    chained = (
        classifier.setFeaturesCol("f")
        .setLabelCol("y")
        .setPredictionCol("p")
        .setProbabilityCol("")
        .setBatchSize(64)
        .setMaxEpoch(3)
        .setLearningRate(0.5)
        .setOptimMethod(SGD(lr=0.1, momentum=0.9))
        .setFeatureShape((2,))
        .setNumPartitions(4)
        .setSeed(7)
        .setUpdateMode("replicated")
        .setCheckpoint("/tmp/checkpoints", SeveralIteration(10), isOverWrite=False)
        .setConstantGradientClipping(-1.0, 1.0)
        .setGradientClippingByL2Norm(5.0)
        .setDevice("CPU")
    )
    assert chained is classifier
    assert classifier.getFeaturesCol() == "f" and classifier.getLabelCol() == "y"
    assert classifier.getPredictionCol() == "p" and classifier.getProbabilityCol() == ""
    assert classifier.getBatchSize() == 64 and classifier.getMaxEpoch() == 3
    assert classifier.getFeatureShape() == [2] and classifier.getNumPartitions() == 4
    assert classifier.getDevice() == "cpu" and classifier.getUpdateMode() == "replicated"
    method = classifier.getOptimMethod()
    assert isinstance(method, SGD) and method.momentum == 0.9
    # An explicitly set learning rate replaces the method's own, on a fresh instance.
    assert classifier._optim_method().learning_rate == 0.5
    assert classifier.clearGradientClipping() is classifier
    assert not classifier.isSet(classifier.gradientL2NormClipping)
    copied = classifier.copy({classifier.batchSize: 8})
    assert copied.getBatchSize() == 8 and classifier.getBatchSize() == 64

    with pytest.raises(ValueError, match="batchSize"):
        classifier.setBatchSize(0)
    with pytest.raises(ValueError, match="updateMode"):
        classifier.setUpdateMode("averaged")
    with pytest.raises(TypeError, match="optimMethod"):
        classifier.setOptimMethod("adam")
    with pytest.raises(ValueError, match="positive"):
        classifier.setFeatureShape([1, -28])
    with pytest.raises(ValueError, match="device"):
        classifier.setDevice("tpu")
    with pytest.raises(TypeError, match="criterion"):
        NNEstimator(_classifier_model(), "mse")
    with pytest.raises(TypeError, match=r"no param\(s\) \['batch_size'\]"):
        NNModel(_classifier_model(), batch_size=8)


def test_stages_are_exported_lazily_and_pandas_waits_for_a_parquet_read():
    # Every Spark Python worker imports bigdl_py: pandas (through pyarrow.dataset) cost each
    # half a second.
    code = (
        "import sys, bigdl_py.spark as spark; assert 'pyspark' not in sys.modules; "
        "import bigdl_py.data, bigdl_py.train, bigdl_py.spark.modes.pipeline; "
        "assert 'pandas' not in sys.modules, 'pandas was imported'; "
        "from bigdl_py.spark import NNClassifier; import bigdl_py.spark.ml as ml; "
        "assert NNClassifier is ml.NNClassifier and spark.NNModel is ml.NNModel"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_trigger_params_round_trip_through_json():
    trigger = (MaxEpoch(3) & MinLoss(0.25)) | SeveralIteration(4) | MaxIteration(9) | EveryEpoch()
    rebuilt = trigger_from_config(trigger_config(trigger))
    assert repr(rebuilt) == repr(trigger)

    class Custom(Trigger):
        def __call__(self, state):
            return False

    with pytest.raises(TypeError, match="cannot store trigger"):
        trigger_config(Custom())


def test_pipeline_fit_learns_and_transform_keeps_row_order(trained, capsys):
    test_df = trained["test_df"]
    output = trained["fitted"].transform(test_df)
    output.explain()
    # prediction and probability come from one forward pass, not one each
    assert capsys.readouterr().out.count("ArrowEvalPython") == 1
    assert isinstance(trained["fitted"].stages[-1], NNClassifierModel)
    assert dict(output.dtypes)["prediction"] == "double"
    rows = output.select("id", "label", "prediction", "probability").collect()
    assert [row.id for row in rows] == list(range(test_df.count()))
    accuracy = np.mean([row.label == row.prediction for row in rows])
    assert accuracy >= 0.9, accuracy  # chance is about 0.5
    probabilities = np.array([row.probability.toArray() for row in rows])
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(probabilities.argmax(axis=1), [row.prediction for row in rows])


def test_fit_leaves_the_estimator_model_alone(trained):
    state = trained["classifier"].model.state_dict()
    for name, before in trained["weights_before"].items():
        np.testing.assert_array_equal(state[name], before)


def test_pipeline_model_save_load_gives_identical_predictions(trained, tmp_path):
    fitted, test_df = trained["fitted"], trained["test_df"]
    path = str(tmp_path / "pipeline_model")
    fitted.save(path)
    loaded = PipelineModel.load(path)
    columns = ["id", "prediction", "probability"]
    before = fitted.transform(test_df).select(*columns).collect()
    after = loaded.transform(test_df).select(*columns).collect()
    assert [row.id for row in after] == [row.id for row in before]
    assert [row.prediction for row in after] == [row.prediction for row in before]
    for old, new in zip(before, after, strict=True):
        np.testing.assert_array_equal(old.probability.toArray(), new.probability.toArray())


def test_nn_model_save_load_round_trip_with_raw_outputs(spark, tmp_path):
    rng = np.random.default_rng(3)
    images = rng.normal(size=(20, 2, 2)).astype(np.float32)
    df = spark.createDataFrame(
        [(i, image.reshape(-1).tolist()) for i, image in enumerate(images)], ["id", "pixels"]
    )
    network = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    model = NNModel(network, featuresCol="pixels").setFeatureShape([2, 2]).setBatchSize(7)
    with no_grad():
        expected = network(Tensor(images)).numpy()
    outputs = np.array([row.prediction for row in model.transform(df).collect()])
    np.testing.assert_allclose(outputs, expected, rtol=1e-5, atol=1e-6)

    path = str(tmp_path / "nn_model")
    model.save(path)
    model.setBatchSize(7).write().overwrite().save(path)  # Spark ML's overwrite works too
    loaded = NNModel.load(path)
    assert type(loaded) is NNModel and loaded.uid == model.uid
    assert loaded.getFeatureShape() == [2, 2] and loaded.getBatchSize() == 7
    reloaded = np.array([row.prediction for row in loaded.transform(df).collect()])
    np.testing.assert_array_equal(reloaded, outputs)


def test_unfitted_pipeline_save_load_keeps_estimator_params(spark, tmp_path):
    del spark  # Spark ML's stages and writers need an active session; the fixture gives it
    classifier = (
        NNClassifier(_classifier_model(), nn.CrossEntropyLoss(label_smoothing=0.1))
        .setOptimMethod(Adam(lr=0.01))
        .setEndWhen(MaxEpoch(2) | MinLoss(0.1))
        .setFeatureShape([2])
        .setUpdateMode("replicated")
        .setCheckpoint(str(tmp_path / "checkpoints"))
    )
    path = str(tmp_path / "pipeline")
    Pipeline(stages=_stages(classifier)).save(path)
    loaded = Pipeline.load(path).getStages()[-1]
    assert type(loaded) is NNClassifier and loaded.uid == classifier.uid
    assert isinstance(loaded.getOptimMethod(), Adam)
    assert loaded.getOptimMethod().learning_rate == 0.01
    assert repr(loaded.getEndWhen()) == repr(classifier.getEndWhen())
    assert isinstance(loaded.criterion, nn.CrossEntropyLoss)
    assert loaded.criterion.label_smoothing == 0.1
    assert loaded.getFeatureShape() == [2] and loaded.getUpdateMode() == "replicated"
    for name, value in classifier.model.state_dict().items():
        np.testing.assert_array_equal(loaded.model.state_dict()[name], value)


def test_estimator_fit_validates_and_returns_the_trained_regression_model(spark, tmp_path):
    rng = np.random.default_rng(5)
    inputs = rng.normal(size=(64, 3)).astype(np.float32)
    targets = inputs @ np.array([1.0, -2.0, 0.5], dtype=np.float32)
    df = spark.createDataFrame(
        [(x.tolist(), float(y)) for x, y in zip(inputs, targets, strict=True)],
        ["features", "label"],
    )
    estimator = NNEstimator(nn.Sequential(nn.Linear(3, 1), nn.Flatten(0)), nn.MSELoss())
    summary = ValidationSummary(str(tmp_path), "regression")
    fitted = (
        estimator.setBatchSize(32)
        .setEndWhen(MaxIteration(2))
        .setLearningRate(0.1)
        .setUpdateMode("replicated")
        .setValidation(SeveralIteration(1), df.limit(40), [Loss()])
        .setValidationSummary(summary)
        .fit(df)
    )
    losses = summary.read_scalar("Loss")
    assert [step for step, _, _ in losses] == [1, 2]
    assert type(fitted) is NNModel
    with no_grad():
        expected = fitted.model(Tensor(inputs)).numpy()
    # The last validation ran on the final weights: its loss is theirs on those 40 rows.
    final_loss = np.mean((expected[:40] - targets[:40]) ** 2)
    assert losses[-1][1] == pytest.approx(final_loss, rel=1e-4)
    outputs = [row.prediction for row in fitted.transform(df).collect()]
    np.testing.assert_allclose(np.array(outputs)[:, 0], expected, rtol=1e-5, atol=1e-6)
    with no_grad():
        untrained = estimator.model(Tensor(inputs)).numpy()
    assert not np.allclose(expected, untrained)


def test_missing_columns_and_bad_labels_give_clear_errors(spark, trained):
    df = _dataframe(spark, _separable(4, 20))
    classifier_model = trained["fitted"].stages[-1]
    with pytest.raises(ValueError, match=r"featuresCol 'features'.*\['features'\]"):
        classifier_model.transform(df)
    classifier = NNClassifier(_classifier_model(), featuresCol=["x1", "x2"], labelCol="target")
    with pytest.raises(ValueError, match=r"labelCol 'target'.*\['target'\]"):
        classifier.fit(df)
    halves = df.withColumn("label", df["label"] / 2 + 0.25)
    with pytest.raises(ValueError, match="whole numbers"):
        classifier.setLabelCol("label").fit(halves)
    with pytest.raises(TypeError, match="StringIndexer"):
        classifier.fit(df.withColumn("label", df["label"].cast("string")))
