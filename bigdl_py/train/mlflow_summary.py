"""``MLflowSummary``: a training run's params, curves and final model in an MLflow run.

Install the extra (``pip install "bigdl_py[mlflow]"``) and add the summary to an optimizer::

    optimizer.add_callback(MLflowSummary(experiment="lenet", tracking_uri="sqlite:///mlflow.db"))
    trained = optimizer.optimize()

(MLflow 3 keeps the ``file:`` store behind ``MLFLOW_ALLOW_FILE_STORE=true`` and recommends a
database such as SQLite, or a tracking server, ``http://host:5000``.)

It logs, on the driver, for local and distributed training alike:

* params: the optimizer class, batch size, end trigger, the OptimMethod and its
  hyperparameters, the model and criterion classes, the parameter count, and any ``params``
  of the user's own;
* per iteration: ``Loss``, ``LearningRate`` and ``Throughput`` (samples/s), step = the
  iteration count;
* per validation: ``validation/<method name>`` (``validation/Top1Accuracy``, ...);
* at the end: the trained model in bigdl_py's safe format (JSON + npz, no pickle) as the
  artifact ``model/model.bigdl``, and the run's status: FINISHED; FAILED when training
  raised (any error) or the model could not be logged; KILLED on a KeyboardInterrupt. The
  error is kept in the run's tag ``bigdl_py.error``.

A tracking server that does not answer costs bounded time, not MLflow's default of seven
retries (about four minutes per request): the first contact, when training starts, is tried
once with a 10 s timeout and fails with an error naming the URI before any work; later
requests are retried twice with a 20 s timeout. An ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``,
``MLFLOW_HTTP_REQUEST_TIMEOUT`` or ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR`` that you set in the
environment wins over these bounds.

mlflow is imported only when training starts, so without the extra nothing changes, and
importing ``bigdl_py.train`` does not pay mlflow's import time (seconds).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from bigdl_py.train.callbacks import TrainingCallback
from bigdl_py.train.metrics import ValidationResult
from bigdl_py.train.triggers import TrainingState

_MODEL_ARTIFACT = "model"
_MODEL_FILE = "model.bigdl"
_BATCH_LIMIT = 1000  # MLflow's most metrics per log_batch call
_ERROR_TAG = "bigdl_py.error"
_TAG_LIMIT = 5000  # well inside MLflow's limit on a tag's value

# MLflow's HTTP settings, read from the environment at each request. MLflow's defaults (7
# retries with exponential backoff, 120 s timeout) are made for rate limits and can stall
# training for minutes on a server that is down. The first contact fails fast (nothing has
# been trained yet); later requests ride out a short hiccup.
_FIRST_CONTACT = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
_DURING_TRAINING = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}


@contextlib.contextmanager
def _http_bounds(bounds: Mapping[str, str]) -> Iterator[None]:
    """Set each of MLflow's HTTP settings in ``bounds`` that the user has not set, for the
    calls inside the block; the environment is as it was afterwards."""
    added = [name for name in bounds if name not in os.environ]
    for name in added:
        os.environ[name] = bounds[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


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


def _end_status(error: BaseException | None) -> str:
    """MLflow's run status for training that ended with ``error``."""
    if error is None:
        return "FINISHED"
    return "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"


class MLflowSummary(TrainingCallback):
    """Log a training run to MLflow (a callback for ``optimizer.add_callback``).

    Parameters
    ----------
    experiment : str, optional
        The experiment's name, created when missing (default: MLflow's default experiment).
    run_name : str, optional
        Name of the MLflow run that each ``optimize()`` creates.
    tracking_uri : str, optional
        Where to log (``"sqlite:///path/mlflow.db"``, a tracking server
        ``"http://host:5000"``, ...); default: MLflow's own (``MLFLOW_TRACKING_URI``). Only
        this summary's client uses it; MLflow's global setting is left alone.
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

    Notes
    -----
    Errors. When training starts, a tracking store that cannot be reached (or refuses the
    run) raises a RuntimeError naming the URI, before any training. A failure to log during
    training raises one too, after two retries at most: training stops there (its last
    checkpoint is intact) and the run ends FAILED. Once training has succeeded, a failure to
    log the model or the last metrics does not take the trained model from the caller: the
    run ends FAILED (MLflow's status for a run that did not do all it was meant to, so
    nothing picks it up as a finished run with a model), the reason goes into the tag
    ``bigdl_py.error``, and a RuntimeWarning says so.
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
        self._logging_failed = False
        #: The MLflow run id of the last ``optimize()`` (None before one).
        self.last_run_id: str | None = None

    # --- hooks ----------------------------------------------------------------------------
    def on_train_begin(self, optimizer: Any) -> None:
        mlflow = _import_mlflow()
        self._client = None
        self._pending, self._pending_steps, self._logging_failed = [], 0, False
        run_id = self.run_id
        active = mlflow.active_run() if run_id is None and self.tracking_uri is None else None
        if run_id is None and active is not None:
            run_id = active.info.run_id
        self._own_run = run_id is None
        self.last_run_id = None
        params = self._run_params(optimizer)
        _flatten("", self.params, params)
        try:
            with _http_bounds(_FIRST_CONTACT):
                self._client = mlflow.MlflowClient(tracking_uri=self.tracking_uri)
                if self._own_run:
                    run_id = self._client.create_run(
                        self._experiment_id(), run_name=self.run_name
                    ).info.run_id
                else:
                    self._client.get_run(run_id)  # it exists, and the store answers
            self.last_run_id = run_id
            self._log_params(params)
        except Exception as error:
            if self.last_run_id is not None:  # created: it must not stay RUNNING
                with contextlib.suppress(Exception):
                    self._terminate(error)
            raise RuntimeError(
                f"MLflowSummary could not start logging to the MLflow tracking URI "
                f"{self._uri()!r}: {type(error).__name__}: {error}. Training has not started. "
                "(Unreachable? Check that the server runs and the URI, tracking_uri= or "
                "MLFLOW_TRACKING_URI.)"
            ) from error
        optimizer.progress.message(f"MLflow: logging to run {run_id} at {self._uri()}")

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
        if error is not None:
            try:
                if not self._logging_failed:  # a store that just failed would only fail again
                    self.flush()  # the curves up to the error
            finally:
                self._terminate(error)
            return
        problem = None
        try:
            self.flush()
            if self.log_model:
                self._log_model(model)
        except Exception as failure:
            problem = failure
        if problem is not None:
            warnings.warn(
                f"MLflowSummary: training succeeded, but logging it to run {self.last_run_id} at "
                f"{self._uri()!r} failed ({type(problem).__name__}: {problem}); "
                + ("the run ends FAILED. " if self._own_run else "")
                + "optimize() returns the trained model: save it with bigdl_py.nn.save",
                RuntimeWarning,
                stacklevel=2,
            )
        try:
            self._terminate(problem)
        except Exception as failure:
            warnings.warn(
                f"MLflowSummary: could not end run {self.last_run_id} at {self._uri()!r} "
                f"({type(failure).__name__}: {failure}); it may show as RUNNING",
                RuntimeWarning,
                stacklevel=2,
            )

    # --- MLflow calls ---------------------------------------------------------------------
    def flush(self) -> None:
        """Send the buffered metrics.

        Raises
        ------
        RuntimeError
            When the tracking store does not take them (they stay buffered).
        """
        if not self._pending:
            return
        pending = self._pending
        try:
            with _http_bounds(_DURING_TRAINING):
                for start in range(0, len(pending), _BATCH_LIMIT):
                    self._client.log_batch(
                        self.last_run_id, metrics=pending[start : start + _BATCH_LIMIT]
                    )
        except Exception as error:
            self._logging_failed = True
            raise RuntimeError(
                f"MLflowSummary could not log {len(pending)} metric values to run "
                f"{self.last_run_id} at {self._uri()!r}: {type(error).__name__}: {error}"
            ) from error
        self._pending, self._pending_steps = [], 0

    def _terminate(self, reason: BaseException | None) -> None:
        """End the run this summary created: its status, and why when it is not FINISHED."""
        if not self._own_run:
            return  # the user's run: left open for them
        with _http_bounds(_DURING_TRAINING):
            if reason is not None:
                text = type(reason).__name__ + (f": {reason}" if str(reason) else "")
                with contextlib.suppress(Exception):  # the status matters more than the note
                    self._client.set_tag(self.last_run_id, _ERROR_TAG, text[:_TAG_LIMIT])
            self._client.set_terminated(self.last_run_id, _end_status(reason))

    def _uri(self) -> str:
        """The tracking URI this summary logs to (MLflow's default resolved)."""
        resolved = getattr(self._client, "tracking_uri", None) or self.tracking_uri
        return str(resolved or _import_mlflow().get_tracking_uri())

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
        with _http_bounds(_DURING_TRAINING):
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
            with _http_bounds(_DURING_TRAINING):
                self._client.log_artifact(self.last_run_id, path, artifact_path=_MODEL_ARTIFACT)
