"""MLflowSummary logs params, curves, validation metrics and the model to a local file store."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from train_models import make_blobs, make_classifier

from bigdl_py import nn
from bigdl_py.optim import SGD
from bigdl_py.train import (
    LocalOptimizer,
    Loss,
    MaxEpoch,
    MLflowSummary,
    SeveralIteration,
    Top1Accuracy,
)


@pytest.fixture
def file_store(tmp_path, monkeypatch):
    """A local file store URI (MLflow 3 keeps that backend behind an opt-in)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return (tmp_path / "mlruns").as_uri()


def test_importing_train_does_not_import_mlflow():
    script = "import sys, bigdl_py.train; print('mlflow' in sys.modules)"
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert completed.stdout.strip() == "False"


def test_a_run_is_logged_to_a_file_store(tmp_path, file_store):
    mlflow = pytest.importorskip("mlflow")
    uri = file_store
    features, labels = make_blobs()
    optimizer = LocalOptimizer(
        make_classifier(),
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1, momentum=0.9),
        batch_size=30,
        end_trigger=MaxEpoch(2),
        progress=False,
    )
    optimizer.set_validation(SeveralIteration(4), (features, labels), [Top1Accuracy(), Loss()])
    summary = MLflowSummary(
        experiment="bigdl_py-test",
        tracking_uri=uri,
        params={"data": {"name": "blobs"}},
        flush_every=3,
    )
    trained = optimizer.add_callback(summary).optimize()

    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.get_run(summary.last_run_id)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["optim_method.name"] == "SGD"
    assert float(params["optim_method.hyper_parameters.momentum"]) == 0.9
    assert params["batch_size"] == "30" and params["data.name"] == "blobs"
    iterations = optimizer.state.iteration
    losses = client.get_metric_history(run.info.run_id, "Loss")
    assert sorted(metric.step for metric in losses) == list(range(1, iterations + 1))
    rates = client.get_metric_history(run.info.run_id, "LearningRate")
    assert {metric.value for metric in rates} == {0.1}
    accuracy = client.get_metric_history(run.info.run_id, "validation/Top1Accuracy")
    assert sorted(metric.step for metric in accuracy) == list(range(4, iterations + 1, 4))
    assert accuracy[-1].value == pytest.approx(optimizer.last_validation[0].value)

    directory = client.download_artifacts(run.info.run_id, "model", str(tmp_path / "download"))
    logged = nn.load(os.path.join(directory, "model.bigdl"))
    for name, value in trained.state_dict().items():
        np.testing.assert_array_equal(logged.state_dict()[name], value, err_msg=name)


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_a_failed_training_marks_the_run_failed(file_store):
    mlflow = pytest.importorskip("mlflow")
    uri = file_store
    features, labels = make_blobs()
    optimizer = LocalOptimizer(
        make_classifier(),
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=1e38),
        batch_size=30,
        end_trigger=MaxEpoch(5),
        progress=False,
    )  # the weights overflow: a NaN loss, NonFiniteLossError
    summary = MLflowSummary(tracking_uri=uri)
    optimizer.add_callback(summary)
    with pytest.raises(FloatingPointError):
        optimizer.optimize()
    run = mlflow.MlflowClient(tracking_uri=uri).get_run(summary.last_run_id)
    assert run.info.status == "FAILED"
    assert "model" not in [
        item.path for item in mlflow.MlflowClient(uri).list_artifacts(run.info.run_id)
    ]


def test_add_callback_refuses_other_objects():
    features, labels = make_blobs()
    optimizer = LocalOptimizer(
        make_classifier(), (features, labels), nn.NLLLoss(), SGD(lr=0.1), batch_size=30
    )
    with pytest.raises(TypeError, match="TrainingCallback"):
        optimizer.add_callback(print)
