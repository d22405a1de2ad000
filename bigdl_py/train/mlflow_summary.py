"""``MLflowSummary``: a training run's params, curves and final model in an MLflow run.

Install the extra (``pip install "bigdl_py[mlflow]"``) and add the summary to an optimizer::

    optimizer.add_callback(MLflowSummary(experiment="lenet", tracking_uri="file:/tmp/mlruns"))
    trained = optimizer.optimize()

It logs, on the driver, for local and distributed training alike:

* params: the optimizer class, batch size, end trigger, the OptimMethod and its
  hyperparameters, the model and criterion classes, the parameter count, and any ``params``
  of the user's own;
* per iteration: ``Loss``, ``LearningRate`` and ``Throughput`` (samples/s), step = the
  iteration count;
* per validation: ``validation/<method name>`` (``validation/Top1Accuracy``, ...);
* at the end: the trained model in bigdl_py's safe format (JSON + npz, no pickle) as the
  artifact ``model/model.bigdl``, and the run's status (FINISHED, or FAILED on an error).

mlflow is imported only when training starts, so without the extra nothing changes, and
importing ``bigdl_py.train`` does not pay mlflow's import time (seconds).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from bigdl_py.train.callbacks import TrainingCallback
from bigdl_py.train.metrics import ValidationResult
from bigdl_py.train.triggers import TrainingState

_MODEL_ARTIFACT = "model"
_MODEL_FILE = "model.bigdl"
_BATCH_LIMIT = 1000  # MLflow's most metrics per log_batch call


def _import_mlflow() -> Any:
    try:
        import mlflow
    except ImportError as error:
        raise ImportError(
            "MLflowSummary needs mlflow: pip install 'bigdl_py[mlflow]' (or mlflow / "
            f"mlflow-skinny); {error}"
        ) from error
    return mlflow


def _flatten(prefix: str, value: Any, into: dict[str, str]) -> None:
    """Nested dicts as dotted param names, every value as text (MLflow params are strings)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), item, into)
    else:
        into[prefix] = str(value)


class MLflowSummary(TrainingCallback):
    """Log a training run to MLflow (a callback for ``optimizer.add_callback``).

    Parameters
    ----------
    experiment : str, optional
        The experiment's name, created when missing (default: MLflow's default experiment).
    run_name : str, optional
        Name of the MLflow run that each ``optimize()`` creates.
    tracking_uri : str, optional
        Where to log (``"file:/path/mlruns"``, an HTTP server, ...); default: MLflow's own
        (``MLFLOW_TRACKING_URI``). Only this summary's client uses it; MLflow's global
        setting is left alone.
    run_id : str, optional
        Log into this existing run instead of creating one (it is left open). Without it, a
        run active in this process (``with mlflow.start_run():``) is used the same way.
    params : dict, optional
        More params to log (nested dicts become dotted names).
    log_model : bool
        Log the trained model as an artifact at the end.
    flush_every : int
        Send iteration metrics in groups of this many iterations (each call writes files or
        makes a request; per-iteration calls would slow small models down).
    """

    def __init__(
        self,
        experiment: str | None = None,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        run_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        log_model: bool = True,
        flush_every: int = 50,
    ):
        if int(flush_every) < 1:
            raise ValueError(f"flush_every must be >= 1, got {flush_every!r}")
        self.experiment = experiment
        self.run_name = run_name
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.params = dict(params or {})
        self.log_model = bool(log_model)
        self.flush_every = int(flush_every)
        self._client: Any = None
        self._own_run = False
        self._pending: list = []
        self._pending_steps = 0
        #: The MLflow run id of the last ``optimize()`` (None before one).
        self.last_run_id: str | None = None

    # --- hooks ----------------------------------------------------------------------------
    def on_train_begin(self, optimizer: Any) -> None:
        mlflow = _import_mlflow()
        self._client = mlflow.MlflowClient(tracking_uri=self.tracking_uri)
        run_id = self.run_id
        active = mlflow.active_run() if run_id is None and self.tracking_uri is None else None
        if run_id is None and active is not None:
            run_id = active.info.run_id
        self._own_run = run_id is None
        if self._own_run:
            run_id = self._client.create_run(
                self._experiment_id(), run_name=self.run_name
            ).info.run_id
        self.last_run_id = run_id
        self._pending, self._pending_steps = [], 0
        params = self._run_params(optimizer)
        _flatten("", self.params, params)
        self._log_params(params)

    def on_iteration_end(
        self, state: TrainingState, loss: float, throughput: float, learning_rate: float | None
    ) -> None:
        values = {"Loss": loss, "Throughput": throughput}
        if learning_rate is not None:
            values["LearningRate"] = learning_rate
        self._add(values, state.iteration)
        self._pending_steps += 1
        if self._pending_steps >= self.flush_every:
            self.flush()

    def on_validation_end(self, state: TrainingState, results: Sequence[ValidationResult]) -> None:
        self._add(
            {f"validation/{result.name}": result.value for result in results}, state.iteration
        )
        self.flush()  # few and worth seeing at once

    def on_train_end(self, optimizer: Any, model: Any, error: BaseException | None) -> None:
        try:
            self.flush()
            if self.log_model and error is None:
                self._log_model(model)
        finally:
            if self._own_run:
                status = "FINISHED" if error is None else "FAILED"
                self._client.set_terminated(self.last_run_id, status)

    # --- MLflow calls ---------------------------------------------------------------------
    def flush(self) -> None:
        """Send the buffered metrics."""
        if not self._pending:
            return
        pending, self._pending, self._pending_steps = self._pending, [], 0
        for start in range(0, len(pending), _BATCH_LIMIT):
            self._client.log_batch(self.last_run_id, metrics=pending[start : start + _BATCH_LIMIT])

    def _add(self, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        timestamp = int(time.time() * 1000)
        self._pending.extend(
            Metric(name, float(value), timestamp, int(step)) for name, value in values.items()
        )

    def _experiment_id(self) -> str:
        if self.experiment is None:
            return "0"  # MLflow's Default experiment
        found = self._client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        return self._client.create_experiment(self.experiment)

    def _log_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(name, value[:6000]) for name, value in params.items()]  # MLflow's cap
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per call
            self._client.log_batch(self.last_run_id, params=items[start : start + 100])

    def _run_params(self, optimizer: Any) -> dict[str, str]:
        params = {
            "optimizer": type(optimizer).__name__,
            "batch_size": str(optimizer.batch_size),
            "end_trigger": repr(optimizer.end_trigger),
            "model": type(optimizer.model).__name__,
            "criterion": type(optimizer.criterion).__name__,
            "parameter_count": str(sum(int(p.data.size) for p in optimizer.model.parameters())),
        }
        config = getattr(optimizer.optim_method, "config", None)
        if callable(config):
            _flatten("optim_method", config(), params)
        else:
            params["optim_method"] = repr(optimizer.optim_method)
        return params

    def _log_model(self, model: Any) -> None:
        from bigdl_py.nn.serialization import save

        with tempfile.TemporaryDirectory(prefix="bigdl_py-mlflow-") as directory:
            path = os.path.join(directory, _MODEL_FILE)
            save(model, path)
            self._client.log_artifact(self.last_run_id, path, artifact_path=_MODEL_ARTIFACT)
