"""Distributed inference: ``predict`` and ``evaluate`` a model over an RDD or a DataFrame.

How the model travels
---------------------
Once per call: the driver cloudpickles the model (without gradients, on the host) into one
``bytes`` object and broadcasts it; each executor fetches the broadcast once, and each
Python worker rebuilds the model from it at most once per device, keeping it in the worker
cache (:mod:`bigdl_py.spark.worker`) under a key made for this call. Every batch of every
later task on that worker reuses it.

Why cloudpickle and not the safe format of :mod:`bigdl_py.nn.serialization`: the bytes
exist only in flight, inside one Spark application (Spark cloudpickles every task closure
the same way), and are never a file a user loads; cloudpickle also carries model classes
defined in a notebook or a job's ``__main__``, which the safe format can only rebuild when
registered. It is also the faster of the two: NumPy arrays pickle as raw buffers.

Order
-----
An RDD's partitions are mapped in place (``mapPartitions``) and each partition's records
are batched in order, so prediction ``i`` belongs to record ``i``. A DataFrame gets its
prediction column from a scalar Arrow UDF — a projection, which keeps every row, every
other column and the order.
"""

from __future__ import annotations

import copy
import itertools
import pickle
import uuid
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa

from bigdl_py import backend
from bigdl_py.autograd import ops
from bigdl_py.autograd.grad_mode import no_grad
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.data import MiniBatch, Sample, table_to_arrays
from bigdl_py.data.arrow_tables import ColumnSpec, ShapeSpec
from bigdl_py.data.records import labelled_batches
from bigdl_py.data.spark_types import is_dataframe, is_rdd
from bigdl_py.nn import LogSoftmax, Module, Sequential, Sigmoid, Softmax
from bigdl_py.spark import worker
from bigdl_py.spark.arrow_features import feature_batch, first_null, nonfinite_columns
from bigdl_py.spark.dataframe import (
    array_to_list_column,
    arrow_ready_columns,
    dataframe_to_partition_arrays,
    require_arrow_udf,
)
from bigdl_py.spark.gpu import bind_task_device, check_device_request
from bigdl_py.spark.session import CONNECT_INFERENCE_ALTERNATIVE, require_classic_spark
from bigdl_py.train.batches import evaluate_batches, forward
from bigdl_py.train.metrics import Loss, ValidationMethod, ValidationResult, check_methods

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext
    from pyspark.sql import DataFrame

OUTPUTS = ("probabilities", "class", "raw")
NONFINITE_POLICIES = ("error", "null")


# --- shipping the model --------------------------------------------------------------------


def _model_payload(model: Module) -> bytes:
    """The model as bytes for the executors: host arrays, no gradients, the caller's model
    untouched (a copy is made only when there are gradients or device arrays to leave out)."""
    from pyspark import cloudpickle

    tensors = [*model.parameters(), *model.buffers()]
    # deepcopy's memo maps an object's id to its copy: mapping each gradient to None drops
    # it from the copy without touching the original.
    without_gradients = {id(t.grad): None for t in tensors if t.grad is not None}
    on_device = any(backend.is_cupy_array(t.data) for t in tensors)
    if without_gradients or on_device:
        model = copy.deepcopy(model, without_gradients)
        if on_device:
            model.to("cpu")
    return cloudpickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL)


class _ShippedModel:
    """A broadcast model and the key under which workers cache their rebuilt copy."""

    def __init__(self, sc: SparkContext, model: Module):
        if not isinstance(model, Module):
            raise TypeError(f"model must be a bigdl_py.nn.Module, got {type(model).__name__}")
        self.key = ("bigdl_py.spark.inference", uuid.uuid4().hex)
        self.broadcast = sc.broadcast(_model_payload(model))

    def on(self, device: backend.Device) -> Module:
        """The model in evaluation mode on ``device``, rebuilt at most once per worker."""
        return worker.fetch(self.key, str(device), lambda: self._rebuild(device))

    def _rebuild(self, device: backend.Device) -> Module:
        model = pickle.loads(self.broadcast.value)
        model.eval()
        if device.type != "cpu":
            model.to(device)
        return model


def _prepare_task(shipped: _ShippedModel, device_request: str) -> tuple[Module, backend.Device]:
    """What every task does first: BLAS threads, its device, the worker's copy of the model."""
    worker.configure_worker_threads()
    device = bind_task_device(device_request)
    return shipped.on(device), device


# --- from model output to predictions ------------------------------------------------------


def _final_activation(model: Module) -> str | None:
    """``'softmax'``, ``'log_softmax'`` or ``'sigmoid'`` when a Sequential ends with one."""
    module = model
    while isinstance(module, Sequential):
        children = list(module.children())
        if not children:
            break
        module = children[-1]
    if isinstance(module, Softmax):
        return "softmax"
    if isinstance(module, LogSoftmax):
        return "log_softmax"
    if isinstance(module, Sigmoid):
        return "sigmoid"
    return None


def _predictions(scores, output: str, final_activation: str | None) -> np.ndarray:
    """Model output (a Tensor) -> host array: ``(n, k)`` float32, or ``(n,)`` class indices."""
    rows = scores.shape[0]
    if output == "raw":
        return backend.as_numpy(scores.data).reshape(rows, -1).astype(np.float32, copy=False)
    if scores.ndim == 1:
        scores = scores.reshape(rows, 1)
    if scores.ndim != 2:
        raise ValueError(
            f"output={output!r} needs model outputs of shape (n, classes), got "
            f"{tuple(scores.shape)}; use output='raw' for other shapes"
        )
    binary = scores.shape[1] == 1
    if final_activation == "log_softmax":
        probabilities = ops.exp(scores)
    elif final_activation in ("softmax", "sigmoid"):
        probabilities = scores
    else:  # logits
        probabilities = ops.sigmoid(scores) if binary else ops.softmax(scores, -1)
    if output == "probabilities":
        return backend.as_numpy(probabilities.data).astype(np.float32, copy=False)
    xp = backend.array_module(probabilities.data)
    if binary:
        classes = (probabilities.data[:, 0] >= 0.5).astype(np.int64)
    else:
        classes = xp.argmax(probabilities.data, axis=1)
    return backend.as_numpy(classes).astype(np.int64, copy=False)


def check_nonfinite_policy(nonfinite: str, where: str) -> str:
    """``nonfinite`` if it is one of :data:`NONFINITE_POLICIES`, else a ValueError."""
    if nonfinite not in NONFINITE_POLICIES:
        raise ValueError(
            f"{where}: nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}"
        )
    return nonfinite


class _BatchPredictor:
    """Runs the model over feature arrays, ``batch_size`` rows at a time (executor side).

    ``where`` (``"predict"``, ``"predict_udf"``) begins its messages.
    """

    def __init__(
        self,
        shipped,
        batch_size,
        output,
        device_request,
        final_activation,
        nonfinite="error",
        where="predict",
    ):
        self.shipped = shipped
        self.batch_size = batch_size
        self.output = output
        self.device_request = device_request
        self.final_activation = final_activation
        self.nonfinite = nonfinite
        self.where = where
        self.model = None
        self.device = None
        self.rows_seen = 0  # rows of this task's partition before the current call

    def row_name(self, row: int) -> str:
        """Row ``row`` of the current batch, as a message names it."""
        return (
            f"partition {worker.task_partition_id()}, row {self.rows_seen + row} (counted from the "
            "partition's first row)"
        )

    def predict_rows(
        self, features: tuple, columns_at: Callable[[int], list[str]] | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Predictions of every row, and a mask of rows with NaN/Inf features (None if
        none): with ``nonfinite="null"`` their predictions are placeholders to null out;
        with ``"error"`` such a row raises, naming it (and, given ``columns_at``, which
        maps a row of the batch to the names of its non-finite columns, its columns)."""
        bad = nonfinite_rows(features)
        if bad is not None and self.nonfinite == "error":
            row = int(np.flatnonzero(bad)[0])
            columns = ""
            if columns_at is not None:
                names = columns_at(row)
                columns = (
                    " in column(s) " + ", ".join(repr(name) for name in names)
                    if names
                    else " (values too large for the model's dtype)"
                )
            raise ValueError(
                f"{self.where}: {self.row_name(row)} has NaN or Inf features{columns} "
                f"({int(bad.sum())} such rows in its batch); clean the data, or pass "
                "nonfinite='null' to get null predictions for such rows"
            )
        self.rows_seen += features[0].shape[0]
        if bad is None:
            return self(features), None
        results = np.zeros((len(bad), *self(tuple(a[:1] for a in features)).shape[1:]))
        if not bad.all():
            good = self(tuple(array[~bad] for array in features))
            results = results.astype(good.dtype)
            results[~bad] = good
        return results, bad

    def __call__(self, features: tuple) -> np.ndarray:
        if self.model is None:
            self.model, self.device = _prepare_task(self.shipped, self.device_request)
        rows = features[0].shape[0]
        parts = []
        with no_grad():
            for start in range(0, rows, self.batch_size):
                batch = MiniBatch(
                    tuple(array[start : start + self.batch_size] for array in features)
                )
                try:
                    scores = forward(self.model, batch, self.device)
                except (ValueError, TypeError, IndexError) as error:
                    shapes = ", ".join(str(tuple(array.shape)) for array in features)
                    raise ValueError(
                        f"{self.where}: {type(self.model).__name__} does not accept input(s) "
                        f"of shape {shapes} (rows, values...): {error}"
                    ) from error
                if not isinstance(scores, Tensor):
                    raise TypeError(
                        "predict needs a model that returns one Tensor; "
                        f"{type(self.model).__name__} returned {type(scores).__name__}"
                    )
                parts.append(_predictions(scores, self.output, self.final_activation))
        return np.concatenate(parts) if len(parts) != 1 else parts[0]


# --- RDD records -----------------------------------------------------------------------------


def _record_features(record: Any) -> tuple:
    """A record's feature arrays: a Sample's, one array, or a tuple of arrays (one per input)."""
    if isinstance(record, Sample):
        return record.features
    if isinstance(record, (tuple, list)):
        return tuple(np.asarray(array) for array in record)
    if isinstance(record, np.ndarray) or np.isscalar(record):
        return (np.asarray(record),)
    raise TypeError(
        "predict: RDD records must be Samples, NumPy arrays, or tuples of arrays (one per "
        f"model input), got {type(record).__name__}"
    )


def _stack(records: list) -> tuple:
    features = [_record_features(record) for record in records]
    try:
        return tuple(np.stack(arrays) for arrays in zip(*features, strict=True))
    except ValueError as error:
        shapes = sorted({tuple(array.shape for array in item) for item in features})
        raise ValueError(
            f"predict: records in one batch must have equal feature shapes, found {shapes}"
        ) from error


def nonfinite_rows(features: tuple) -> np.ndarray | None:
    """Mask of the rows whose float features hold NaN or Inf; None when every row is finite."""
    bad = None
    for array in features:
        if np.issubdtype(array.dtype, np.floating) and array.size:
            rows = ~np.isfinite(array.reshape(array.shape[0], -1)).all(axis=1)
            bad = rows if bad is None else bad | rows
    return bad if bad is not None and bad.any() else None


def _predict_records(records: Iterator, predictor: _BatchPredictor, chunk: int) -> Iterator:
    as_ints = predictor.output == "class"
    while True:
        records_chunk = list(itertools.islice(records, chunk))
        if not records_chunk:
            return
        results, bad = predictor.predict_rows(_stack(records_chunk))
        for position, value in enumerate(results):
            if bad is not None and bad[position]:
                yield None
            else:
                yield int(value) if as_ints else value


# --- DataFrame rows --------------------------------------------------------------------------


class PredictionType(NamedTuple):
    """What a prediction column holds: its Spark type, and each value's NumPy dtype; one
    value per row (``scalar``) or a list of them."""

    spark_type: Any  # a pyspark DataType or its DDL string
    dtype: np.dtype
    scalar: bool

    def arrow_type(self) -> pa.DataType:
        value = pa.from_numpy_dtype(self.dtype)
        return value if self.scalar else pa.list_(value)


def _prediction_column(
    results: np.ndarray, bad: np.ndarray | None, kind: PredictionType, where: str
) -> pa.Array:
    """A batch's predictions as the UDF's Arrow column; rows where ``bad`` is True are null."""
    if kind.scalar and results.ndim == 2:
        if results.shape[1] != 1:
            raise ValueError(
                f"{where}: the return type holds one value per row, but the model gives "
                f"{results.shape[1]} values per row; use an array return type"
            )
        results = results[:, 0]
    return array_to_list_column(results.astype(kind.dtype, copy=False), mask=bad)


def arrow_predict_udf(
    predictor: _BatchPredictor,
    model_inputs: Callable[[pa.RecordBatch], tuple[np.ndarray, ...]],
    kind: PredictionType,
):
    """A scalar-iterator Arrow UDF: one struct of feature columns -> the predictions.

    Serves ``predict`` on DataFrames and ``predict_udf``. Each batch's columns are checked
    (:func:`bigdl_py.spark.arrow_features.feature_batch`), a null anywhere fails naming the
    row and column(s), ``model_inputs`` makes the model's input arrays from the columns,
    and rows with NaN/Inf features fail or get null predictions (``predictor.nonfinite``).
    """
    where = predictor.where

    def predict_batches(columns: Iterator[pa.Array]) -> Iterator[pa.Array]:
        for struct_array in columns:
            batch = feature_batch(struct_array, where)
            null = first_null(batch)
            if null is not None:
                row, names = null
                raise ValueError(
                    f"{where}: {predictor.row_name(row)} has a null in column(s) "
                    f"{', '.join(repr(name) for name in names)}; drop or fill such rows first "
                    "(nonfinite='null' is for NaN and Inf, which a null is not)"
                )
            if batch.num_rows == 0:
                yield pa.array([], type=kind.arrow_type())
                continue
            features = model_inputs(batch)
            results, bad = predictor.predict_rows(features, partial(nonfinite_columns, batch))
            yield _prediction_column(results, bad, kind, where)

    predict_batches.__name__ = where  # Spark names the UDF's column after it: predict_udf(...)
    return require_arrow_udf()(predict_batches, kind.spark_type)


class _TableInputs:
    """A batch of ``predict``'s feature columns -> the model's input arrays."""

    def __init__(self, feature_cols: ColumnSpec, feature_shape: ShapeSpec, dtype: Any):
        self.feature_cols = feature_cols
        self.feature_shape = feature_shape
        self.dtype = dtype

    def __call__(self, batch: pa.RecordBatch) -> tuple[np.ndarray, ...]:
        features, _ = table_to_arrays(
            batch, self.feature_cols, None, self.feature_shape, self.dtype
        )
        return features if isinstance(features, tuple) else (features,)


def _predict_dataframe(df, predictor, feature_cols, feature_shape, prediction_col, dtype):
    from pyspark.sql import functions as F

    if prediction_col in df.columns:
        raise ValueError(
            f"prediction_col {prediction_col!r} is already a column of the DataFrame; choose "
            "another name or drop it first"
        )
    columns = arrow_ready_columns(df, feature_cols, None, dtype)
    if predictor.output == "class":  # doubles, as Spark ML's evaluators expect
        kind = PredictionType("double", np.dtype(np.float64), scalar=True)
    else:
        kind = PredictionType("array<float>", np.dtype(np.float32), scalar=False)
    inputs = _TableInputs(feature_cols, feature_shape, dtype)
    return df.withColumn(
        prediction_col, arrow_predict_udf(predictor, inputs, kind)(F.struct(*columns))
    )


# --- the public entry points ---------------------------------------------------------------


def _spark_context(data: Any) -> SparkContext:
    require_classic_spark(data, "predict and evaluate", CONNECT_INFERENCE_ALTERNATIVE)
    if is_dataframe(data):
        return data.sparkSession.sparkContext
    if is_rdd(data):
        return data.context
    raise TypeError(
        f"data must be a pyspark RDD or DataFrame, got {type(data).__name__}; for local "
        "arrays call the model directly"
    )


def _input_dtype(model: Module) -> np.dtype:
    """Features are converted to the dtype of the model's first floating parameter."""
    for parameter in model.parameters():
        if backend.is_floating(parameter.dtype):
            return np.dtype(parameter.dtype)
    return backend.DEFAULT_DTYPE


def _check_batch_size(batch_size: int, where: str) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(f"{where}: batch_size must be an integer, got {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"{where}: batch_size must be >= 1, got {batch_size}")
    return int(batch_size)


def predict(
    model: Module,
    data: RDD | DataFrame,
    batch_size: int = 256,
    feature_cols: ColumnSpec = "features",
    prediction_col: str = "prediction",
    output: str = "probabilities",
    device: str = "cpu",
    feature_shape: ShapeSpec = None,
    nonfinite: str = "error",
) -> RDD | DataFrame:
    """Run ``model`` over every record of ``data`` on the executors, keeping the input order.

    Parameters
    ----------
    model : bigdl_py.nn.Module
        Sent to the executors once for this call (see the module docstring); the caller's
        model is not changed. The executors run it in evaluation mode without recording
        a graph.
    data : pyspark.RDD or pyspark.sql.DataFrame
        An RDD of :class:`~bigdl_py.data.Sample`, of NumPy arrays (one record's features),
        or of tuples of arrays (one per model input); or a DataFrame with the feature
        column(s).
    batch_size : int
        Records per forward pass on an executor.
    feature_cols : str, list of str, or list of list of str
        DataFrame only: the feature column(s) (array, Vector, or numeric scalar columns;
        decimals are read as doubles), as in
        :func:`bigdl_py.spark.dataframe.dataframe_to_partition_arrays`.
    prediction_col : str
        DataFrame only: the name of the new column.
    output : {'probabilities', 'class', 'raw'}
        ``'raw'``: the model's output, flattened per record. ``'probabilities'``: class
        probabilities — the output itself when the model ends with ``Softmax`` or
        ``Sigmoid``, ``exp`` of it after ``LogSoftmax``, else the output is taken as logits
        (softmax over classes; a one-column output is a binary logit, through a sigmoid).
        ``'class'``: the most probable class index (``p >= 0.5`` for one column).
    device : {'cpu', 'auto', 'gpu', 'cuda:<n>'}
        Where each task computes; ``'gpu'`` uses the GPU Spark assigned to the task
        (``spark.task.resource.gpu.amount``, see ``conf/spark-gpu.conf``) and fails clearly
        when CuPy or CUDA is missing on the executor. See :mod:`bigdl_py.spark.gpu`.
    feature_shape : tuple of int, optional
        DataFrame only: per-row shape of the features, e.g. ``(1, 28, 28)``.
    nonfinite : {'error', 'null'}
        A record whose features hold NaN or Inf: ``'error'`` fails the job naming its
        partition and row (and, for a DataFrame, column) — a model's output for it means
        nothing, and class 0 would look like an answer; ``'null'`` gives it a null
        prediction (``None`` in an RDD). A null feature in a DataFrame fails either way,
        naming its row and column.

    Returns
    -------
    pyspark.RDD or pyspark.sql.DataFrame
        For an RDD: an RDD with the same partitions, record ``i`` mapped to its prediction
        (a float32 array for probabilities and raw outputs, an ``int`` for classes). For a
        DataFrame: the same rows and columns, in the same order, plus ``prediction_col``
        (``array<float>``, or ``double`` for classes as Spark ML's evaluators expect).
        Both are lazy: the work runs when an action reads them.

    Raises
    ------
    ValueError
        For an unknown ``output``, ``device`` or ``nonfinite``, a bad ``batch_size``, or a
        ``prediction_col`` that already exists. When the job runs: for a null or NaN/Inf
        feature (see ``nonfinite``), or a model that does not take the features' shape; a
        TypeError for DataFrame columns that are not numbers, arrays of numbers or Vectors
        (a timestamp, date, string, ...), naming each and its Spark type.
    """
    if output not in OUTPUTS:
        raise ValueError(f"predict: output must be one of {OUTPUTS}, got {output!r}")
    check_nonfinite_policy(nonfinite, "predict")
    batch_size = _check_batch_size(batch_size, "predict")
    device_request = check_device_request(device)
    sc = _spark_context(data)
    predictor = _BatchPredictor(
        _ShippedModel(sc, model),
        batch_size,
        output,
        device_request,
        _final_activation(model),
        nonfinite,
    )
    if is_dataframe(data):
        dtype = _input_dtype(model)
        return _predict_dataframe(
            data, predictor, feature_cols, feature_shape, prediction_col, dtype
        )
    return data.mapPartitions(
        lambda records: _predict_records(iter(records), predictor, batch_size),
        preservesPartitioning=True,
    )


# --- evaluate --------------------------------------------------------------------------------


def _as_methods(methods: Any, criterion: Module | None) -> list[ValidationMethod]:
    """Validation methods from a method, a list of them, or a bare criterion (-> Loss)."""
    if isinstance(methods, Module):
        methods = [Loss(methods)]
    elif isinstance(methods, (list, tuple)):
        methods = [Loss(item) if isinstance(item, Module) else item for item in methods]
    methods = check_methods(methods)
    if criterion is not None:
        methods = [method.with_default_criterion(criterion) for method in methods]
    return methods


def _evaluate_partition(shipped, device_request, methods, batches: Iterable[MiniBatch]):
    model, device = _prepare_task(shipped, device_request)
    yield evaluate_batches(model, _finite_batches(batches), methods, device)


def _finite_batches(batches: Iterable[MiniBatch]) -> Iterator[MiniBatch]:
    """The batches, failing on the first row with NaN/Inf features, named by its position
    in the partition (a NaN row would make the Loss NaN and count as a miss or a hit)."""
    first_row = 0
    for batch in batches:
        bad = nonfinite_rows(batch.features)
        if bad is not None:
            row = first_row + int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"evaluate: partition {worker.task_partition_id()}, row {row} "
                f"(counted from the partition's first row) has NaN or Inf features "
                f"({int(bad.sum())} such rows in its batch); clean or filter the data"
            )
        first_row += batch.size
        yield batch


def _record_batches(records: Iterator, batch_size: int) -> Iterator[MiniBatch]:
    """An RDD partition's records, of every kind training takes, as batches."""
    return labelled_batches(
        records, batch_size, f"partition {worker.task_partition_id()}", "validation"
    )


def _block_batches(blocks: Iterator, batch_size: int) -> Iterator[MiniBatch]:
    for features, labels in blocks:
        block = MiniBatch(features, labels)
        for start in range(0, block.size, batch_size):
            yield block.slice(start, min(start + batch_size, block.size))


def evaluate(
    model: Module,
    data: RDD | DataFrame,
    methods: Any,
    batch_size: int = 256,
    feature_cols: ColumnSpec = "features",
    label_col: str = "label",
    feature_shape: ShapeSpec = None,
    device: str = "cpu",
    criterion: Module | None = None,
) -> list[ValidationResult]:
    """Evaluate ``model`` on labelled data on the executors; BigDL's ``model.evaluate``.

    Each partition computes partial results (a sum and a count per method) with
    :func:`bigdl_py.train.evaluate_batches`; the driver merges them, so the result equals
    one pass over all of the data.

    Parameters
    ----------
    model : bigdl_py.nn.Module
    data : pyspark.RDD or pyspark.sql.DataFrame
        An RDD of what training takes (Samples, ``(features, label)`` pairs or
        MiniBatches), with labels; a DataFrame needs ``feature_cols`` and ``label_col``.
    methods : ValidationMethod, criterion Module, or a list of them
        E.g. ``[Top1Accuracy(), Loss(nn.CrossEntropyLoss())]``; a bare criterion means
        ``Loss(criterion)``.
    batch_size : int
        Records per forward pass on an executor.
    feature_cols, label_col, feature_shape
        DataFrame only, as in :func:`predict`.
    device : {'cpu', 'auto', 'gpu', 'cuda:<n>'}
        As in :func:`predict`.
    criterion : Module, optional
        The criterion of any ``Loss()`` given without one.

    Returns
    -------
    list of ValidationResult
        One merged result per method, in the order given.
    """
    methods = _as_methods(methods, criterion)
    batch_size = _check_batch_size(batch_size, "evaluate")
    device_request = check_device_request(device)
    sc = _spark_context(data)
    if is_dataframe(data):
        source = dataframe_to_partition_arrays(
            data, feature_cols, label_col, feature_shape, _input_dtype(model)
        )
        to_batches = _block_batches
    else:
        source, to_batches = data, _record_batches
    shipped = _ShippedModel(sc, model)

    def partition_results(items):
        batches = to_batches(iter(items), batch_size)
        return _evaluate_partition(shipped, device_request, methods, batches)

    try:
        partials = source.mapPartitions(partition_results).collect()
    finally:
        # evaluate is eager: nothing reads the model after this job.
        shipped.broadcast.destroy()
    return [
        ValidationResult.merge(partial[position] for partial in partials)
        for position in range(len(methods))
    ]
