"""NNClassifier.setEndWhen(EarlyStopping) on DistriOptimizer, and quiet per-iteration logs."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

import bigdl_py.nn as nn
from bigdl_py.data import ArrayDataset
from bigdl_py.optim import SGD
from bigdl_py.spark.dataframe import arrays_to_dataframe
from bigdl_py.spark.ml import NNClassifier
from bigdl_py.train import (
    EarlyStopping,
    EveryEpoch,
    Loss,
    MaxEpoch,
    MaxScore,
    Top1Accuracy,
    ValidationSummary,
    evaluate_batches,
    read_scalars,
    validation_batches,
)

pytestmark = pytest.mark.spark

MAX_EPOCH = 25
PER_ITERATION = re.compile(r"\[Epoch \d+ \d+/\d+\]\[Iteration \d+\] loss")


def _blobs(rows: int, seed: int):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=2.0, size=(3, 4))
    labels = rng.integers(0, 3, size=rows)
    features = (centres[labels] + rng.normal(size=(rows, 4))).astype(np.float32)
    return features, labels


@pytest.mark.parametrize("update", ["sharded", pytest.param("replicated", marks=pytest.mark.slow)])
def test_fit_stops_early_restores_the_best_and_logs_iterations_at_debug(
    spark, tmp_path, caplog, update
):
    features, labels = _blobs(64, seed=0)
    # Random validation labels: the validation loss rises once the model fits the training set.
    validation = (features[:32], np.random.default_rng(1).permutation(labels[:32]))
    with nn.init.seeded(2):
        model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))
    summary = ValidationSummary(str(tmp_path), "early")
    classifier = (
        NNClassifier(model)
        .setBatchSize(16)
        .setNumPartitions(2)
        .setOptimMethod(SGD(lr=0.5))
        .setUpdateMode(update)
        .setEndWhen(MaxEpoch(MAX_EPOCH) | EarlyStopping("Loss", patience=2))
        .setValidation(EveryEpoch(), arrays_to_dataframe(spark, *validation), [Loss()])
        .setValidationSummary(summary)
    )
    caplog.set_level(logging.DEBUG, logger="bigdl_py")
    fitted = classifier.fit(arrays_to_dataframe(spark, features, labels))

    losses = [value for _, value, _ in sorted(read_scalars(summary.directory)["Loss"])]
    best = int(np.argmin(losses))
    assert len(losses) < MAX_EPOCH, f"no early stop: {losses}"
    assert len(losses) - 1 - best == 2  # stopped after two validations without improvement
    # restore_best: the fitted model's validation loss is the best one seen.
    dataset = ArrayDataset(*validation, shuffle=False)
    batches = validation_batches(dataset, 16)
    (result,) = evaluate_batches(fitted.model, batches, [Loss(nn.CrossEntropyLoss())])
    assert result.value == pytest.approx(losses[best], rel=1e-5)

    iteration_lines = [r for r in caplog.records if PER_ITERATION.match(r.getMessage())]
    assert iteration_lines and {r.levelno for r in iteration_lines} == {logging.DEBUG}
    epoch_lines = [r for r in caplog.records if "finished:" in r.getMessage()]
    assert epoch_lines and {r.levelno for r in epoch_lines} == {logging.INFO}
    stop_lines = [r for r in caplog.records if r.getMessage().startswith("early stopping")]
    assert stop_lines and {r.levelno for r in stop_lines} == {logging.INFO}


def test_set_progress_gives_iteration_lines_at_info(spark, caplog):
    features, labels = _blobs(32, seed=3)
    classifier = (
        NNClassifier(nn.Sequential(nn.Linear(4, 3)))
        .setBatchSize(16)
        .setNumPartitions(2)
        .setMaxEpoch(1)
        .setProgress(True)
    )
    caplog.set_level(logging.INFO, logger="bigdl_py")
    classifier.fit(arrays_to_dataframe(spark, features, labels))
    assert any(
        PER_ITERATION.match(r.getMessage()) and r.levelno == logging.INFO for r in caplog.records
    )


def test_early_stopping_survives_the_stage_params(spark, tmp_path):
    del spark  # the stage's writer needs an active session, which the fixture gives
    classifier = NNClassifier(nn.Sequential(nn.Linear(4, 3))).setEndWhen(
        MaxEpoch(9) | EarlyStopping("Top1Accuracy", mode="max", patience=4, min_delta=0.01)
    )
    classifier.save(str(tmp_path / "stage"))
    loaded = NNClassifier.load(str(tmp_path / "stage"))
    assert repr(loaded.getEndWhen()) == repr(classifier.getEndWhen())
    assert "EarlyStopping(metric='Top1Accuracy', mode='max', patience=4" in repr(
        loaded.copy().getEndWhen()
    )


def test_early_stopping_as_a_validation_or_checkpoint_trigger_is_refused_at_once(tmp_path):
    # It can only end training; in these places it would never fire (no Spark needed).
    classifier = NNClassifier(nn.Sequential(nn.Linear(4, 3)))
    with pytest.raises(ValueError, match=r"validation trigger holds EarlyStopping.*set_end_when"):
        classifier.setValidation(EveryEpoch() | EarlyStopping(), None, [Loss()])
    with pytest.raises(ValueError, match=r"checkpoint trigger holds EarlyStopping.*set_end_when"):
        classifier.setCheckpoint(str(tmp_path), EarlyStopping())
    with pytest.raises(ValueError, match="checkpoint trigger holds EarlyStopping"):
        NNClassifier(nn.Sequential(nn.Linear(4, 3)), checkpointTrigger=EarlyStopping("Loss"))
    with pytest.raises(ValueError, match="contradicts the metric 'Top1Accuracy'"):
        classifier.setEndWhen(EarlyStopping("Top1Accuracy", mode="min"))


def test_max_score_as_a_validation_trigger_is_refused_at_once():
    # It fires on validation results, so it could never start the first validation.
    classifier = NNClassifier(nn.Sequential(nn.Linear(4, 3)))
    with pytest.raises(ValueError, match=r"validation trigger holds MaxScore\(0.8\)"):
        classifier.setValidation(EveryEpoch() | MaxScore(0.8), None, [Top1Accuracy()])
