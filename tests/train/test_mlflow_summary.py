"""MLflowSummary logs params, curves, validation metrics and the model to an MLflow store;
every way training can end gives the run a status; a store that does not answer costs
bounded time and says so."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading

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
    TrainingCallback,
)

# SQLAlchemy 2.1 warns about a loader option that MLflow's SQLite store still uses.
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory):
    """One SQLite store for the module (MLflow's recommended local store; creating its
    tables takes seconds, so the tests share it and each logs into its own experiment)."""
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy", reason="MLflow's SQLite store needs the mlflow extra")
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture
def experiment(tracking_uri, tmp_path, request):
    """A fresh experiment whose artifacts go under tmp_path (not into ./mlruns)."""
    import mlflow

    name = f"bigdl_py-{request.node.name}"
    mlflow.MlflowClient(tracking_uri).create_experiment(
        name, artifact_location=(tmp_path / "artifacts").as_uri()
    )
    return name


def test_importing_train_does_not_import_mlflow():
    script = "import sys, bigdl_py.train; print('mlflow' in sys.modules)"
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert completed.stdout.strip() == "False"


def test_a_run_is_logged_to_a_sqlite_store(tmp_path, tracking_uri, experiment):
    import mlflow

    uri = tracking_uri
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
        experiment=experiment,
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


def end_status(tracking_uri, summary):
    """The run's status, its ``bigdl_py.error`` tag and its top-level artifact paths."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    run = client.get_run(summary.last_run_id)
    artifacts = [item.path for item in client.list_artifacts(summary.last_run_id)]
    return run.info.status, run.data.tags.get("bigdl_py.error"), artifacts


def blob_optimizer(lr=0.1, epochs=2, model=None):
    features, labels = make_blobs()
    return LocalOptimizer(
        model or make_classifier(),
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=lr),
        batch_size=30,
        end_trigger=MaxEpoch(epochs),
        progress=False,
    )


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_a_nonfinite_loss_marks_the_run_failed(tracking_uri, experiment):
    optimizer = blob_optimizer(lr=1e38, epochs=5)  # the weights overflow: a NaN loss
    summary = MLflowSummary(experiment=experiment, tracking_uri=tracking_uri)
    optimizer.add_callback(summary)
    with pytest.raises(FloatingPointError):
        optimizer.optimize()
    status, error, artifacts = end_status(tracking_uri, summary)
    assert status == "FAILED" and error.startswith("NonFiniteLossError: training loss is")
    assert "model" not in artifacts


def test_any_training_error_marks_the_run_failed_with_the_curves_so_far(tracking_uri, experiment):
    # Validation refuses a label outside the model's classes, at iteration 4: not a NaN
    # loss, which was once the only error that ended the run (the others left it RUNNING).
    import mlflow

    features, labels = make_blobs()
    bad = labels.copy()
    bad[3] = 9
    optimizer = blob_optimizer()
    optimizer.set_validation(SeveralIteration(4), (features, bad), [Top1Accuracy()])
    summary = MLflowSummary(experiment=experiment, tracking_uri=tracking_uri, flush_every=100)
    optimizer.add_callback(summary)
    with pytest.raises(ValueError, match="outside the 3 classes"):
        optimizer.optimize()
    status, error, artifacts = end_status(tracking_uri, summary)
    assert status == "FAILED" and "ValueError" in error and "outside the 3 classes" in error
    assert "model" not in artifacts
    losses = mlflow.MlflowClient(tracking_uri).get_metric_history(summary.last_run_id, "Loss")
    assert sorted(metric.step for metric in losses) == [1, 2, 3, 4]  # flushed at the end


def test_an_interrupt_marks_the_run_killed(tracking_uri, experiment):
    class Interrupter(TrainingCallback):
        def on_iteration_end(self, state, loss, throughput, learning_rate):
            if state.iteration == 2:
                raise KeyboardInterrupt

    summary = MLflowSummary(experiment=experiment, tracking_uri=tracking_uri)
    optimizer = blob_optimizer().add_callback(summary).add_callback(Interrupter())
    with pytest.raises(KeyboardInterrupt):
        optimizer.optimize()
    assert end_status(tracking_uri, summary)[:2] == ("KILLED", "KeyboardInterrupt")


class Doubler(nn.Module):
    """A layer of the user's own, which bigdl_py's safe format cannot save."""

    def forward(self, x):
        return x * 2.0


def test_a_model_that_cannot_be_saved_ends_the_run_failed_and_keeps_the_trained_model(
    tracking_uri, experiment
):
    model = make_classifier()
    model.add(Doubler())
    optimizer = blob_optimizer(model=model)
    summary = MLflowSummary(experiment=experiment, tracking_uri=tracking_uri)
    optimizer.add_callback(summary)
    with pytest.warns(RuntimeWarning, match=r"training succeeded.*Doubler.*ends FAILED"):
        trained = optimizer.optimize()
    assert trained is model and optimizer.state.epoch == 2
    status, error, artifacts = end_status(tracking_uri, summary)
    assert status == "FAILED" and "Doubler" in error
    assert "model" not in artifacts


_BOUNDS = (
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
)


@pytest.fixture
def no_user_bounds(monkeypatch):
    for name in _BOUNDS:
        monkeypatch.delenv(name, raising=False)


def test_a_logging_failure_during_training_is_bounded_named_and_fails_the_run(
    tracking_uri, experiment, no_user_bounds
):
    seen = []

    class LosesTheServer(MLflowSummary):
        def on_train_begin(self, optimizer):
            super().on_train_begin(optimizer)

            def refuse(*args, **kwargs):
                seen.append({name: os.environ.get(name) for name in _BOUNDS})
                raise ConnectionError("the server went away")

            self._client.log_batch = refuse

    summary = LosesTheServer(experiment=experiment, tracking_uri=tracking_uri, flush_every=2)
    optimizer = blob_optimizer().add_callback(summary)
    with pytest.raises(RuntimeError, match=r"could not log 6 metric values to run \w+ at "):
        optimizer.optimize()
    assert optimizer.state.iteration == 2
    assert seen == [
        {
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
            "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        }
    ]  # and no second try at the end: that store has just failed
    assert not any(name in os.environ for name in _BOUNDS)  # set only around the calls
    status, error, _ = end_status(tracking_uri, summary)
    assert status == "FAILED" and "the server went away" in error


def test_a_run_that_cannot_take_its_params_is_ended_not_left_running(tracking_uri, experiment):
    import mlflow

    summary = MLflowSummary(
        experiment=experiment, tracking_uri=tracking_uri, params={"what?": 1}
    )  # MLflow refuses a "?" in a param's name
    optimizer = blob_optimizer().add_callback(summary)
    with pytest.raises(RuntimeError, match=r"could not start logging .*Training has not"):
        optimizer.optimize()
    assert optimizer.state.iteration == 0
    client = mlflow.MlflowClient(tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert run.info.status == "FAILED" and "what?" in run.data.tags["bigdl_py.error"]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_server_is_an_error_naming_it_before_training():
    pytest.importorskip("mlflow")
    uri = f"http://127.0.0.1:{closed_port()}"
    optimizer = blob_optimizer().add_callback(MLflowSummary(tracking_uri=uri))
    with pytest.raises(RuntimeError, match=rf"could not start logging .* URI '{uri}'.*has not"):
        optimizer.optimize()
    assert optimizer.state.iteration == 0


class Unavailable(http.server.BaseHTTPRequestHandler):
    """An MLflow server that answers every request 503 (a status MLflow retries)."""

    requests = 0

    def do_GET(self):
        type(self).requests += 1
        self.send_response(503)
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def unavailable_server():
    Unavailable.requests = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("user_retries, requests", [(None, 1), ("1", 2)])
def test_the_first_contact_is_tried_once_unless_the_user_says_otherwise(
    unavailable_server, no_user_bounds, monkeypatch, user_retries, requests
):
    # MLflow's own default is 7 retries with backoff: about four silent minutes.
    pytest.importorskip("mlflow")
    if user_retries is not None:
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", user_retries)
    optimizer = blob_optimizer().add_callback(MLflowSummary(tracking_uri=unavailable_server))
    with pytest.raises(RuntimeError, match=f"URI '{unavailable_server}'"):
        optimizer.optimize()
    assert Unavailable.requests == requests
    assert os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES") == user_retries


def test_add_callback_refuses_other_objects():
    features, labels = make_blobs()
    optimizer = LocalOptimizer(
        make_classifier(), (features, labels), nn.NLLLoss(), SGD(lr=0.1), batch_size=30
    )
    with pytest.raises(TypeError, match="TrainingCallback"):
        optimizer.add_callback(print)
