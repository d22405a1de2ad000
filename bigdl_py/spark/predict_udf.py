"""``predict_udf``: a bigdl_py model as a Spark column function, in Spark's own style.

Built on :func:`pyspark.ml.functions.predict_batch_udf`, with the pieces ``predict`` uses
(:mod:`bigdl_py.spark.inference`): the model is broadcast once when the UDF is made, each
Python worker rebuilds it at most once (the worker cache, and Spark's ``ModelCache`` of the
predict function), rows go through the model ``batch_size`` at a time, on the CPU or the GPU
Spark gave the task. So ::

    classify = predict_udf(model, output="class")
    df.withColumn("prediction", classify("features"))

gives the same values, in the same row order, as ``NNModel(model).transform(df)``.

Columns
-------
Numeric columns, array columns and ML ``Vector`` columns (dense or sparse), in any mix. For a
model of one input, the columns given to the UDF are put side by side per row (as
``VectorAssembler`` would) and reshaped to ``input_shape``; for a model of several inputs,
``input_shape`` lists one shape per input and the UDF takes one column per input.

How the columns reach the model: ``predict_batch_udf`` reads array columns only with fixed
tensor shapes, and splits a Vector into the four fields of its storage type. So the UDF hands
it the columns inside one struct (plus a constant column, which makes it pass every column
as it is), and the rows become arrays here, whatever the column types.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bigdl_py.nn import Module
from bigdl_py.spark.gpu import check_device_request
from bigdl_py.spark.inference import (
    OUTPUTS,
    _BatchPredictor,
    _check_batch_size,
    _final_activation,
    _input_dtype,
    _ShippedModel,
)
from bigdl_py.spark.session import CONNECT_INFERENCE_ALTERNATIVE, require_classic_spark

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession
    from pyspark.sql.types import DataType

__all__ = ["PredictUDF", "predict_udf"]


def _shapes(input_shape: Any) -> list[tuple[int, ...] | None]:
    """One per-row shape (or None) per model input, from ``input_shape``."""
    if input_shape is None:
        return [None]
    items = list(input_shape)
    if items and all(isinstance(item, (list, tuple)) or item is None for item in items):
        return [None if item is None else _shape(item) for item in items]
    return [_shape(items)]


def _shape(values: Sequence[Any]) -> tuple[int, ...]:
    shape = tuple(int(value) for value in values)
    if any(size < 1 and size != -1 for size in shape) or shape.count(-1) > 1:
        raise ValueError(
            f"predict_udf: input_shape {tuple(values)} must hold positive sizes (and at most "
            "one -1)"
        )
    return shape


def _row_values(value: Any) -> np.ndarray:
    """One cell as a flat array: a number, an array (nested too) or a Vector's storage dict."""
    if isinstance(value, dict):  # an ml.linalg Vector: type 1 dense, 0 sparse
        if value["type"] == 1:
            return np.asarray(value["values"], dtype=np.float64)
        dense = np.zeros(int(value["size"]), dtype=np.float64)
        dense[np.asarray(value["indices"], dtype=np.int64)] = value["values"]
        return dense
    array = np.asarray(value)
    if array.dtype == object:
        array = np.stack([_row_values(item) for item in array])
    return array.reshape(-1)


def _column_matrix(column: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """One column of a batch as ``(rows, values per row)``."""
    if column.dtype != object:  # a numeric column
        return column.astype(dtype, copy=False).reshape(len(column), 1)
    rows = [_row_values(value) for value in column]
    sizes = {row.size for row in rows}
    if len(sizes) > 1:
        raise ValueError(
            f"predict_udf: the rows of one column hold {sorted(sizes)} values; every row of "
            "a model input must have the same size"
        )
    return np.stack(rows).astype(dtype, copy=False)


def _model_input(columns: list[np.ndarray], shape: tuple | None, index: int, dtype) -> np.ndarray:
    """The columns of one model input, side by side per row, reshaped to ``shape``."""
    matrix = np.concatenate([_column_matrix(column, dtype) for column in columns], axis=1)
    if shape is None:
        return matrix
    try:
        return matrix.reshape((len(matrix), *shape))
    except ValueError:
        raise ValueError(
            f"predict_udf: input {index} has {matrix.shape[1]} values per row, which do not "
            f"make input_shape {shape}; pass the per-row shape of the column(s) as input_shape"
        ) from None


class _PredictFunction:
    """What ``make_predict_fn`` returns on an executor: columns in, predictions out."""

    def __init__(self, predictor: _BatchPredictor, shapes, dtype, model_name: str, result):
        self.predictor = predictor
        self.shapes = shapes
        self.dtype = dtype
        self.model_name = model_name
        self.result = result  # (numpy dtype, scalar?) of what Spark expects back

    def __call__(self, *columns: np.ndarray) -> np.ndarray:
        columns = list(columns[:-1])  # the last one is the constant column
        if len(self.shapes) == 1:
            inputs = (_model_input(columns, self.shapes[0], 0, self.dtype),)
        else:
            inputs = tuple(
                _model_input([column], shape, index, self.dtype)
                for index, (column, shape) in enumerate(zip(columns, self.shapes, strict=True))
            )
        try:
            predictions = self.predictor(inputs)
        except (ValueError, TypeError, IndexError) as error:
            shapes = ", ".join(str(tuple(array.shape)) for array in inputs)
            raise ValueError(
                f"predict_udf: {self.model_name} does not accept input(s) of shape {shapes} "
                f"(rows, values...) made from the UDF's column(s): {error}. Check the "
                "column(s) and input_shape"
            ) from error
        dtype, scalar = self.result
        if scalar:
            if predictions.ndim == 2 and predictions.shape[1] != 1:
                raise ValueError(
                    f"predict_udf: the return type is a number, but {self.model_name} gives "
                    f"{predictions.shape[1]} values per row; use an array return type"
                )
            predictions = predictions.reshape(len(predictions))
        return predictions.astype(dtype, copy=False)


def _result_type(return_type: Any, output: str) -> tuple[Any, tuple[np.dtype, bool]]:
    """The Spark return type and what the predictions become for it."""
    from pyspark.sql import types as T

    if return_type is None:
        return_type = T.DoubleType() if output == "class" else T.ArrayType(T.FloatType())
    elif isinstance(return_type, str):
        return_type = T.DataType.fromDDL(return_type)
    element = return_type.elementType if isinstance(return_type, T.ArrayType) else return_type
    dtypes = {
        T.FloatType: np.float32,
        T.DoubleType: np.float64,
        T.IntegerType: np.int32,
        T.LongType: np.int64,
    }
    dtype = next((dtypes[kind] for kind in dtypes if isinstance(element, kind)), None)
    if dtype is None or (isinstance(return_type, T.ArrayType) and output == "class"):
        raise ValueError(
            f"predict_udf: return_type {return_type.simpleString()} is not one this UDF "
            "returns: use array<float> or array<double> (outputs 'raw' and 'probabilities'), "
            "or float, double, int or long (one value per row; output 'class')"
        )
    return return_type, (np.dtype(dtype), not isinstance(return_type, T.ArrayType))


class PredictUDF:
    """A model as a column function; made by :func:`predict_udf`.

    Call it with column names or Columns: ``udf("features")``, ``udf("x1", "x2")``.
    """

    def __init__(self, make_predict_fn, shapes, return_type, batch_size):
        self._make_predict_fn = make_predict_fn
        self._shapes = shapes
        self.return_type = return_type
        self.batch_size = batch_size
        self._udfs: dict[int, Any] = {}

    def __call__(self, *columns: str | Column) -> Column:
        from pyspark.sql import functions as F

        if not columns:
            raise TypeError("predict_udf: call the UDF with the feature column(s)")
        if len(self._shapes) > 1 and len(columns) != len(self._shapes):
            raise TypeError(
                f"predict_udf: input_shape gives the model {len(self._shapes)} inputs, so the "
                f"UDF takes one column per input, got {len(columns)}"
            )
        count = len(columns)
        names = [f"c{index}" for index in range(count)]
        struct = F.struct(
            *(
                (F.col(column) if isinstance(column, str) else column).alias(name)
                for column, name in zip(columns, names, strict=True)
            )
        )
        return self.sql_function(count)(struct, F.lit(0))

    def sql_function(self, columns: int = 1) -> Any:
        """The Spark UDF behind a call with ``columns`` columns, to register for SQL.

        ``spark.udf.register("classify", udf.sql_function(2))`` makes
        ``classify(struct(x1, x2), 0)`` in SQL what ``udf("x1", "x2")`` is in Python: the
        columns go inside one struct, followed by a constant (see the module docstring).
        """
        from pyspark.ml.functions import predict_batch_udf

        if columns not in self._udfs:
            self._udfs[columns] = predict_batch_udf(
                _with_parameters(self._make_predict_fn, columns + 1),
                return_type=self.return_type,
                batch_size=self.batch_size,
                input_tensor_shapes={},  # take every column as it is (see the module doc)
            )
        return self._udfs[columns]


def _with_parameters(make_predict_fn, count: int):
    """``make_predict_fn`` whose predict function shows ``count`` parameters: that is how
    ``predict_batch_udf`` decides to pass each column separately."""

    def make() -> Any:
        predict = make_predict_fn()

        def call(*columns):
            return predict(*columns)

        call.__signature__ = inspect.Signature(
            [
                inspect.Parameter(f"column_{index}", inspect.Parameter.POSITIONAL_ONLY)
                for index in range(count)
            ]
        )
        return call

    return make


def predict_udf(
    model: Module,
    return_type: DataType | str | None = None,
    batch_size: int = 256,
    input_shape: Sequence[int] | Sequence[Sequence[int] | None] | None = None,
    output: str = "raw",
    device: str = "cpu",
    spark: SparkSession | None = None,
) -> PredictUDF:
    """A column function that runs ``model`` on rows, built on ``predict_batch_udf``.

    Parameters
    ----------
    model : bigdl_py.nn.Module
        Broadcast once, now (later changes to it do not reach the UDF); executors run it in
        evaluation mode without recording a graph.
    return_type : pyspark DataType or str, optional
        ``array<float>`` (default) or ``array<double>`` for ``raw``/``probabilities``;
        ``double`` (default for ``class``), ``float``, ``int`` or ``long`` for one value per
        row (``class``, or a model with one output per row).
    batch_size : int
        Rows per forward pass.
    input_shape : tuple of int, or list of them, optional
        The per-row shape of the model's input, e.g. ``(1, 28, 28)`` (default: the values
        of the columns side by side, ``(values,)``); for a model of several inputs, one
        shape (or None) per input, and one column per input.
    output : {'raw', 'probabilities', 'class'}
        As in :func:`bigdl_py.spark.inference.predict`.
    device : {'cpu', 'auto', 'gpu', 'cuda:<n>'}
        Where each task computes, as in ``predict``.
    spark : SparkSession, optional
        The session whose executors run it (default: the active one).

    Returns
    -------
    PredictUDF
        Call it with the feature column(s) to get a Column.

    Raises
    ------
    ValueError
        For an unknown ``output`` or ``device``, a bad ``batch_size``, ``input_shape`` or
        ``return_type``; on the executors, naming the shapes, when the model does not take
        the columns' rows.
    SparkConnectNotSupportedError
        For a Spark Connect session (no broadcast variables); the message says what to do.
    """
    from pyspark.sql import SparkSession

    if not isinstance(model, Module):
        raise TypeError(
            f"predict_udf: model must be a bigdl_py.nn.Module, got {type(model).__name__}"
        )
    if output not in OUTPUTS:
        raise ValueError(f"predict_udf: output must be one of {OUTPUTS}, got {output!r}")
    batch_size = _check_batch_size(batch_size, "predict_udf")
    device_request = check_device_request(device)
    shapes = _shapes(input_shape)
    session = spark if spark is not None else SparkSession.getActiveSession()
    if session is None:
        raise RuntimeError("predict_udf: no active SparkSession; start one or pass spark=")
    require_classic_spark(session, "predict_udf", CONNECT_INFERENCE_ALTERNATIVE)
    spark_type, result = _result_type(return_type, output)
    predictor = _BatchPredictor(
        _ShippedModel(session.sparkContext, model),
        batch_size,
        output,
        device_request,
        _final_activation(model),
    )
    dtype, model_name = _input_dtype(model), type(model).__name__

    def make_predict_fn():
        return _PredictFunction(predictor, shapes, dtype, model_name, result)

    return PredictUDF(make_predict_fn, shapes, spark_type, batch_size)
