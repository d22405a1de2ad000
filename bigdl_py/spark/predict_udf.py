"""``predict_udf``: a bigdl_py model as a Spark column function.

The same Arrow UDF that ``predict`` gives a DataFrame
(:func:`bigdl_py.spark.inference.arrow_predict_udf`), as a function of columns: the model
is broadcast once when the UDF is made, each Python worker rebuilds it at most once (the
worker cache), rows go through the model ``batch_size`` at a time, on the CPU or the GPU
Spark gave the task. So ::

    classify = predict_udf(model, output="class")
    df.withColumn("prediction", classify("features"))

gives the same values, in the same row order, as ``NNModel(model).transform(df)``.

Columns
-------
Numeric columns (decimals read as doubles), array columns and ML ``Vector`` columns (dense
or sparse), in any mix. For a model of one input, the columns given to the UDF are put side
by side per row (as ``VectorAssembler`` would) and reshaped to ``input_shape``; for a model
of several inputs, ``input_shape`` lists one shape per input and the UDF takes one column
per input. The columns travel inside one struct (whose field names are the columns' names,
for messages), so one UDF takes any number of columns of any of these types.

Bad input
---------
A UDF does not see the DataFrame's schema, so its columns are checked on the executors, at
each task's first batch, before the model runs: a timestamp, date, string, map or other
non-numeric column fails naming every such column and its Spark type; a null (a null row or
a null array element) fails naming the row and column. A row with NaN or Inf features fails
naming its row and column, or with ``nonfinite="null"`` gets a null prediction, as in
``predict``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from bigdl_py.data import table_to_arrays
from bigdl_py.nn import Module
from bigdl_py.spark.gpu import check_device_request
from bigdl_py.spark.inference import (
    OUTPUTS,
    PredictionType,
    _BatchPredictor,
    _check_batch_size,
    _final_activation,
    _input_dtype,
    _ShippedModel,
    arrow_predict_udf,
    check_nonfinite_policy,
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


def _model_input(array: np.ndarray, shape: tuple | None, index: int) -> np.ndarray:
    """One input's values, one flat row each, reshaped to ``shape``."""
    matrix = array.reshape(len(array), -1)
    if shape is None:
        return matrix
    try:
        return matrix.reshape((len(matrix), *shape))
    except ValueError:
        raise ValueError(
            f"predict_udf: input {index} has {matrix.shape[1]} values per row, which do not "
            f"make input_shape {shape}; pass the per-row shape of the column(s) as input_shape"
        ) from None


class _ModelInputs:
    """A batch of the UDF's columns -> the model's input arrays (executor side)."""

    def __init__(self, shapes: list[tuple[int, ...] | None], dtype: np.dtype):
        self.shapes = shapes
        self.dtype = dtype

    def __call__(self, batch: pa.RecordBatch) -> tuple[np.ndarray, ...]:
        names = batch.schema.names
        if len(self.shapes) == 1:
            groups = [names]
        elif len(names) == len(self.shapes):
            groups = [[name] for name in names]
        else:
            raise TypeError(
                f"predict_udf: input_shape gives the model {len(self.shapes)} inputs, one "
                f"column each, but the UDF got {len(names)} column(s) {names}"
            )
        arrays, _ = table_to_arrays(batch, groups, None, None, self.dtype)
        return tuple(
            _model_input(array, shape, index)
            for index, (array, shape) in enumerate(zip(arrays, self.shapes, strict=True))
        )


def _result_type(return_type: Any, output: str) -> PredictionType:
    """What the UDF returns for ``return_type`` and ``output``; refuses a type that would
    truncate scores or probabilities."""
    from pyspark.sql import types as T

    if return_type is None:
        return_type = T.DoubleType() if output == "class" else T.ArrayType(T.FloatType())
    elif isinstance(return_type, str):
        return_type = T.DataType.fromDDL(return_type)
    elif not isinstance(return_type, T.DataType):
        raise TypeError(
            "predict_udf: return_type must be a pyspark DataType or a DDL string such as "
            f"'array<float>', got {type(return_type).__name__}"
        )
    is_array = isinstance(return_type, T.ArrayType)
    element = return_type.elementType if is_array else return_type
    floats = {T.FloatType: np.float32, T.DoubleType: np.float64}
    integers = {T.IntegerType: np.int32, T.LongType: np.int64}
    dtype = next(
        (dtype for kind, dtype in {**floats, **integers}.items() if isinstance(element, kind)),
        None,
    )
    name = return_type.simpleString()
    if dtype is None or (is_array and output == "class"):
        raise ValueError(
            f"predict_udf: return_type {name} is not one this UDF returns: use array<float> "
            "or array<double> (outputs 'raw' and 'probabilities'), float or double (one "
            "value per row), or int or long too for output 'class'"
        )
    if output != "class" and np.issubdtype(dtype, np.integer):
        raise ValueError(
            f"predict_udf: return_type {name} would truncate output={output!r}, which gives "
            "fractions (scores, probabilities); use float or double (array<float> or "
            "array<double> for several values per row): integer types are for output='class'"
        )
    return PredictionType(return_type, np.dtype(dtype), scalar=not is_array)


def _column_name(column: Column) -> str:
    """Spark's text of a Column's expression (its repr is ``Column<'text'>``)."""
    shown = re.fullmatch(r"Column<'(.*)'>", repr(column), flags=re.DOTALL)
    return shown.group(1) if shown else repr(column)


class PredictUDF:
    """A model as a column function; made by :func:`predict_udf`.

    Call it with column names or Columns: ``udf("features")``, ``udf("x1", "x2")``.
    """

    def __init__(self, udf, shapes, return_type, batch_size):
        self._udf = udf
        self._shapes = shapes
        self.return_type = return_type
        self.batch_size = batch_size

    def __call__(self, *columns: str | Column) -> Column:
        from pyspark.sql import functions as F

        if not columns:
            raise TypeError("predict_udf: call the UDF with the feature column(s)")
        if len(self._shapes) > 1 and len(columns) != len(self._shapes):
            raise TypeError(
                f"predict_udf: input_shape gives the model {len(self._shapes)} inputs, so the "
                f"UDF takes one column per input, got {len(columns)}"
            )
        # A named column keeps its name; an expression is named by its text (Spark would
        # call it col1, col2, ...), so that messages name what the user wrote.
        struct = F.struct(
            *(
                F.col(column) if isinstance(column, str) else column.alias(_column_name(column))
                for column in columns
            )
        )
        return self._udf(struct)

    def sql_function(self) -> Any:
        """The Spark UDF behind the calls, to register for SQL.

        ``spark.udf.register("classify", udf.sql_function())`` makes
        ``classify(struct(x1, x2))`` in SQL what ``udf("x1", "x2")`` is in Python: the
        columns go inside one struct.
        """
        return self._udf


def predict_udf(
    model: Module,
    return_type: DataType | str | None = None,
    batch_size: int = 256,
    input_shape: Sequence[int] | Sequence[Sequence[int] | None] | None = None,
    output: str = "raw",
    device: str = "cpu",
    spark: SparkSession | None = None,
    nonfinite: str = "error",
) -> PredictUDF:
    """A column function that runs ``model`` on rows, on Spark's Arrow UDFs.

    Parameters
    ----------
    model : bigdl_py.nn.Module
        Broadcast once, now (later changes to it do not reach the UDF); executors run it in
        evaluation mode without recording a graph.
    return_type : pyspark DataType or str, optional
        ``array<float>`` (default) or ``array<double>`` for ``raw``/``probabilities``, or
        ``float``/``double`` for a model with one output per row; ``double`` (default),
        ``float``, ``int`` or ``long`` for ``class``. Integer types are refused for
        ``raw`` and ``probabilities``, whose fractions they would truncate.
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
    nonfinite : {'error', 'null'}
        A row whose features hold NaN or Inf: ``'error'`` fails the query naming its
        partition, row and column(s); ``'null'`` gives it a null prediction. As in
        ``predict``, a null feature (a null row, or a null array element) fails either way.

    Returns
    -------
    PredictUDF
        Call it with the feature column(s) to get a Column.

    Raises
    ------
    ValueError
        For an unknown ``output``, ``device`` or ``nonfinite``, a bad ``batch_size`` or
        ``input_shape``, or a ``return_type`` this UDF does not return (an integer type for
        ``raw`` or ``probabilities``). When the query runs, on the executors: a column that
        is not numeric (a timestamp, date, string, map, ...: a TypeError naming each and
        its Spark type), a null or NaN/Inf feature (naming the row and column), rows the
        model does not take (naming the shapes).
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
    check_nonfinite_policy(nonfinite, "predict_udf")
    batch_size = _check_batch_size(batch_size, "predict_udf")
    device_request = check_device_request(device)
    shapes = _shapes(input_shape)
    kind = _result_type(return_type, output)
    session = spark if spark is not None else SparkSession.getActiveSession()
    if session is None:
        raise RuntimeError("predict_udf: no active SparkSession; start one or pass spark=")
    require_classic_spark(session, "predict_udf", CONNECT_INFERENCE_ALTERNATIVE)
    predictor = _BatchPredictor(
        _ShippedModel(session.sparkContext, model),
        batch_size,
        output,
        device_request,
        _final_activation(model),
        nonfinite,
        where="predict_udf",
    )
    inputs = _ModelInputs(shapes, _input_dtype(model))
    udf = arrow_predict_udf(predictor, inputs, kind)
    return PredictUDF(udf, shapes, kind.spark_type, batch_size)
