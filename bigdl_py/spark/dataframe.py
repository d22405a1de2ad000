"""Spark DataFrames <-> NumPy feature and label arrays, through Arrow, per partition.

No Python object per row is made on the way: the JVM writes the selected columns as Arrow
record batches for a Python worker, the worker serialises each batch whole (Arrow IPC) into
one binary value, and the task on the other side turns a partition's batches into arrays
column by column with :func:`bigdl_py.data.table_to_arrays` (the same conversion Parquet
and Arrow files go through).

Feature columns may be ``array<float|double>`` columns (nested arrays too), Spark ML
``Vector`` columns (``VectorAssembler`` output; converted with
``pyspark.ml.functions.vector_to_array`` in the JVM first), or several numeric scalar
columns (each row's values side by side, as ``VectorAssembler`` would put them). With the
default ``dtype=float32``, ``double`` arrays and vectors are narrowed to ``float`` in the JVM,
which halves what crosses into Python.

Partitions and order
--------------------
:func:`arrow_batch_rdd` (and so :func:`dataframe_to_partition_arrays`) applies only narrow,
order-keeping steps to the DataFrame's physical plan — a projection, an Arrow UDF, a filter
on its result — so partition ``i`` of the result holds exactly the rows of partition ``i`` of
the DataFrame, in their order, and the partition count is the DataFrame's. (The DataFrame's
own partitioning is whatever its plan gives: after a shuffle, adaptive query execution may
coalesce partitions; ``df.rdd.getNumPartitions()`` tells.)

Needs PySpark >= 4.1 for ``pyspark.sql.functions.arrow_udf``. ``DataFrame.mapInArrow`` would
do the same job, but PySpark builds its UDF through ``pandas_udf`` and refuses to run it
without pandas, which bigdl_py does not otherwise need.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from bigdl_py.data.arrow_tables import ColumnSpec, ShapeSpec, feature_column_groups, table_to_arrays
from bigdl_py.data.spark_types import is_dataframe, is_rdd
from bigdl_py.data.validation import uneven_partitions
from bigdl_py.spark.worker import task_partition_id

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import Column, DataFrame, SparkSession

BATCH_COLUMN = "arrow_ipc_batch"

# Arrow's binary type addresses its bytes with int32 offsets.
_MAX_BINARY_BYTES = 2**31 - 1


# --- the executor side ---------------------------------------------------------------------


def _to_ipc(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def _first_row_only(blob: pa.Buffer, rows: int) -> pa.Array:
    """A binary column of ``rows`` entries: ``blob`` in the first, nulls in the others.

    A scalar Arrow UDF must return one value per input row; built from buffers, the nulls
    cost a few bytes per row and no Python object.
    """
    if blob.size > _MAX_BINARY_BYTES:
        raise ValueError(
            f"one Arrow batch of {rows} rows takes {blob.size} bytes, more than Arrow's binary "
            "limit of 2 GiB; lower spark.sql.execution.arrow.maxRecordsPerBatch"
        )
    validity = np.zeros((rows + 7) // 8, dtype=np.uint8)
    validity[0] = 1
    offsets = np.full(rows + 1, blob.size, dtype=np.int32)
    offsets[0] = 0
    return pa.Array.from_buffers(
        pa.binary(),
        rows,
        [pa.py_buffer(validity), pa.py_buffer(offsets), blob],
        null_count=rows - 1,
    )


def _encode_batches(columns: Iterator[pa.Array]) -> Iterator[pa.Array]:
    """Arrow UDF body: each incoming batch (a struct of the selected columns) -> one IPC blob."""
    for struct_array in columns:
        rows = len(struct_array)
        if rows == 0:
            yield pa.array([], type=pa.binary())
            continue
        batch = pa.RecordBatch.from_struct_array(struct_array)
        yield _first_row_only(_to_ipc(batch), rows)


def _decode_batches(rows: Iterator[Any]) -> Iterator[pa.RecordBatch]:
    """The blobs of one partition (Rows of one binary field) back into record batches."""
    for row in rows:
        reader = pa.ipc.open_stream(pa.py_buffer(row[0]))
        yield from reader


class _PartitionConverter:
    """One partition's record batches -> one ``(features, labels)`` block (a task's function).

    A class rather than a closure so that what each task receives is plain data.
    """

    def __init__(self, feature_cols, label_col, feature_shape, dtype, label_dtype, empty_block):
        self.feature_cols = feature_cols
        self.label_col = label_col
        self.feature_shape = feature_shape
        self.dtype = dtype
        self.label_dtype = label_dtype
        self.empty_block = empty_block

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[Any, Any]]:
        batches = list(batches)
        if not batches or sum(batch.num_rows for batch in batches) == 0:
            yield self.empty_block
            return
        table = pa.Table.from_batches(batches)
        try:
            yield table_to_arrays(
                table,
                self.feature_cols,
                self.label_col,
                self.feature_shape,
                self.dtype,
                self.label_dtype,
            )
        except (ValueError, TypeError, KeyError) as error:
            # Rows in the message count from the start of this partition; say which one.
            raise type(error)(f"partition {task_partition_id()}: {error}") from error


# --- the driver side -----------------------------------------------------------------------


def _is_vector_type(data_type: Any) -> bool:
    from pyspark.ml.linalg import VectorUDT
    from pyspark.mllib.linalg import VectorUDT as OldVectorUDT

    return isinstance(data_type, (VectorUDT, OldVectorUDT))


def _column_names(feature_cols: ColumnSpec, label_col: str | None) -> list[str]:
    names = [name for group in feature_column_groups(feature_cols) for name in group]
    if label_col is not None:
        names.append(label_col)
    return list(dict.fromkeys(names))  # a column named twice is shipped once


def _prepared_column(df: DataFrame, name: str, dtype: Any, is_feature: bool) -> Column:
    """Column ``name`` as it should cross into Python: vectors as arrays, doubles narrowed."""
    from pyspark.sql import types as T

    if name not in df.columns:
        raise KeyError(f"DataFrame has no column {name!r}; its columns are {df.columns}")
    data_type = df.schema[name].dataType
    float32 = dtype is not None and np.dtype(dtype) == np.float32
    if _is_vector_type(data_type):
        if not is_feature:
            raise TypeError(f"label column {name!r} is a Vector; labels must be numbers")
        from pyspark.ml.functions import vector_to_array

        return vector_to_array(df[name], "float32" if float32 else "float64").alias(name)
    if (
        is_feature
        and float32
        and isinstance(data_type, T.ArrayType)
        and isinstance(data_type.elementType, T.DoubleType)
    ):
        return df[name].cast(T.ArrayType(T.FloatType())).alias(name)
    return df[name]


def arrow_ready_columns(
    df: DataFrame,
    feature_cols: ColumnSpec,
    label_col: str | None = None,
    dtype: Any = np.float32,
) -> list[Column]:
    """The feature and label columns of ``df`` in the form Arrow conversion takes.

    Vector columns become arrays (``vector_to_array``); with ``dtype=float32``,
    ``array<double>`` feature columns are cast to ``array<float>`` in the JVM. Each column
    keeps its name.

    Raises
    ------
    KeyError
        For a missing column (listing the columns there are).
    """
    feature_names = {name for group in feature_column_groups(feature_cols) for name in group}
    return [
        _prepared_column(df, name, dtype, is_feature=name in feature_names)
        for name in _column_names(feature_cols, label_col)
    ]


def select_for_arrow(
    df: DataFrame,
    feature_cols: ColumnSpec,
    label_col: str | None = None,
    dtype: Any = np.float32,
) -> DataFrame:
    """``df`` reduced to its :func:`arrow_ready_columns`."""
    return df.select(*arrow_ready_columns(df, feature_cols, label_col, dtype))


def require_arrow_udf():
    """``pyspark.sql.functions.arrow_udf``, or a clear error on PySpark 4.0 (which lacks it)."""
    try:
        from pyspark.sql.functions import arrow_udf
    except ImportError as error:  # PySpark 4.0
        import pyspark

        raise RuntimeError(
            "DataFrame -> Arrow conversion needs pyspark.sql.functions.arrow_udf (PySpark >= "
            f"4.1); this is PySpark {pyspark.__version__}"
        ) from error
    return arrow_udf


def arrow_batch_rdd(df: DataFrame) -> RDD:
    """An RDD of ``pyarrow.RecordBatch`` holding all of ``df``'s columns, partition by partition.

    Partition ``i`` of the RDD holds the rows of partition ``i`` of ``df`` in order, as the
    batches Spark's Arrow writer cut them into (``spark.sql.execution.arrow.maxRecordsPerBatch``
    rows at most). Select only the columns you need first (:func:`select_for_arrow`): every
    column is converted.
    """
    from pyspark.sql import functions as F

    encode = require_arrow_udf()(_encode_batches, "binary").asNondeterministic()
    # Nondeterministic: the optimiser must not push the null filter below the UDF (which
    # would evaluate the UDF twice, once for the filter and once for the value).
    blob = encode(F.struct(*[df[name] for name in df.columns])).alias(BATCH_COLUMN)
    blobs = df.select(blob).where(F.col(BATCH_COLUMN).isNotNull())
    return blobs.rdd.mapPartitions(_decode_batches, preservesPartitioning=True)


def _empty_block(
    empty: pa.Table,
    feature_cols: ColumnSpec,
    label_col: str | None,
    feature_shape: ShapeSpec,
    dtype: Any,
    label_dtype: Any,
) -> tuple[Any, Any]:
    """Zero-row arrays with the DataFrame's dtypes and (where known) per-row shapes.

    Made once on the driver from an empty table with the selection's Arrow schema, for
    partitions with no row. An ``array`` column's width is not in its schema: without
    ``feature_shape`` its empty block has width 0.
    """
    features, labels = table_to_arrays(empty, feature_cols, label_col, None, dtype, label_dtype)
    if feature_shape is not None:
        groups = feature_column_groups(feature_cols)
        arrays = features if isinstance(features, tuple) else (features,)
        shapes = [feature_shape] if len(groups) == 1 else list(feature_shape)
        arrays = tuple(
            array if shape is None else array.reshape((0, *shape))
            for array, shape in zip(arrays, shapes, strict=True)
        )
        features = arrays if isinstance(features, tuple) else arrays[0]
    return features, labels


def dataframe_to_partition_arrays(
    df: DataFrame,
    feature_cols: ColumnSpec = "features",
    label_col: str | None = "label",
    feature_shape: ShapeSpec = None,
    dtype: Any = np.float32,
    label_dtype: Any = None,
) -> RDD:
    """An RDD with one ``(features, labels)`` block of NumPy arrays per partition of ``df``.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
    feature_cols : str, list of str, or list of list of str
        One column (array or Vector; its per-row shape is kept), several scalar or array
        columns (concatenated per row), or one list per model input (features is then a
        tuple of arrays). See :func:`bigdl_py.data.table_to_arrays`.
    label_col : str or None
        The label column; ``None`` for unlabelled data (labels are then ``None``).
    feature_shape : tuple of int, or one per input, optional
        Per-row shape, e.g. ``(1, 28, 28)`` for a flat ``array<float>`` image column.
    dtype : dtype or None
        Feature dtype (default float32; ``None`` keeps the columns' own).
    label_dtype : dtype, optional
        Label dtype (default: the column's own; int64 for Spark ``long``).

    Returns
    -------
    pyspark.RDD
        ``df.rdd.getNumPartitions()`` partitions; partition ``i`` holds exactly one element,
        the arrays of ``df``'s partition ``i`` in row order (zero rows for an empty
        partition). Arrays converted without a copy are read-only views of the Arrow data.
        Cache the RDD (or the arrays in a worker cache) when it is read repeatedly.

    Raises
    ------
    KeyError
        On the driver, for a missing column.
    ValueError, TypeError
        When the RDD is computed: a null value, a ragged array column, or a non-numeric
        column — naming the partition, the column and the row within the partition.
    """
    selected = select_for_arrow(df, feature_cols, label_col, dtype)
    converter = _PartitionConverter(
        feature_cols,
        label_col,
        feature_shape,
        dtype,
        label_dtype,
        _empty_block(
            selected.limit(0).toArrow(), feature_cols, label_col, feature_shape, dtype, label_dtype
        ),
    )
    return arrow_batch_rdd(selected).mapPartitions(converter, preservesPartitioning=True)


def dataframe_to_arrays(
    df: DataFrame,
    feature_cols: ColumnSpec = "features",
    label_col: str | None = "label",
    feature_shape: ShapeSpec = None,
    dtype: Any = np.float32,
    label_dtype: Any = None,
) -> tuple[Any, Any]:
    """All of ``df`` as ``(features, labels)`` arrays on the driver, in row order.

    Collects through ``DataFrame.toArrow()`` (Arrow end to end, no Row objects); the whole
    selection must fit in the driver's memory. Parameters as
    :func:`dataframe_to_partition_arrays`.
    """
    table = select_for_arrow(df, feature_cols, label_col, dtype).toArrow()
    if table.num_rows == 0:
        return _empty_block(table, feature_cols, label_col, feature_shape, dtype, label_dtype)
    return table_to_arrays(table, feature_cols, label_col, feature_shape, dtype, label_dtype)


def array_to_list_column(array: np.ndarray, mask: np.ndarray | None = None) -> pa.Array:
    """(rows,) -> a scalar column; (rows, ...) -> ``list<...>`` of each row's values, flat.

    Rows where ``mask`` is True are null.
    """
    array = np.ascontiguousarray(array)
    if mask is not None and not mask.any():
        mask = None
    if array.ndim == 1:
        return pa.array(array, mask=mask)
    rows = array.shape[0]
    width = int(np.prod(array.shape[1:], dtype=np.int64))
    offsets = pa.array(np.arange(rows + 1, dtype=np.int64) * width)
    values = pa.array(array.reshape(-1))
    nulls = None if mask is None else pa.array(mask)
    if rows * width < 2**31:
        return pa.ListArray.from_arrays(offsets.cast(pa.int32()), values, mask=nulls)
    return pa.LargeListArray.from_arrays(offsets, values, mask=nulls)


def arrays_to_dataframe(
    spark: SparkSession,
    features: Any,
    labels: Any = None,
    feature_cols: str | Sequence[str] = "features",
    label_col: str = "label",
    num_partitions: int | None = None,
) -> DataFrame:
    """A DataFrame from NumPy arrays (for tests, notebooks and small data), through Arrow.

    Each feature array becomes one ``array<...>`` column holding each row's values flattened
    (read it back with ``feature_shape=array.shape[1:]``); a 1-D array becomes a scalar
    column. Labels become a scalar (or array) column.

    Parameters
    ----------
    spark : SparkSession
    features : array or sequence of arrays
        One array ``(rows, ...)``, or one per input (named by ``feature_cols``).
    labels : array, optional
    feature_cols : str or list of str
        Column names of the feature arrays.
    label_col : str
    num_partitions : int, optional
        Cut the rows into this many partitions, contiguous and in order (through a range
        repartition on the row number, then a sort within each partition). By default the
        DataFrame has Spark's default parallelism, also contiguous and in order.

    Returns
    -------
    pyspark.sql.DataFrame
    """
    arrays = list(features) if isinstance(features, (tuple, list)) else [features]
    names = [feature_cols] if isinstance(feature_cols, str) else list(feature_cols)
    if len(names) != len(arrays):
        raise ValueError(f"{len(arrays)} feature arrays but {len(names)} column names {names}")
    columns = {
        name: array_to_list_column(np.asarray(array))
        for name, array in zip(names, arrays, strict=True)
    }
    if labels is not None:
        if label_col in columns:
            raise ValueError(f"label column {label_col!r} clashes with a feature column")
        columns[label_col] = array_to_list_column(np.asarray(labels))
    rows = {name: len(column) for name, column in columns.items()}
    if len(set(rows.values())) > 1:
        raise ValueError(f"arrays_to_dataframe: columns differ in row count {rows}")
    if num_partitions is None:
        return spark.createDataFrame(pa.table(columns))
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    row_number = "__bigdl_py_row_number"
    count = next(iter(rows.values()))
    columns[row_number] = pa.array(np.arange(count, dtype=np.int64))
    df = spark.createDataFrame(pa.table(columns))
    return (
        df.repartitionByRange(num_partitions, row_number)
        .sortWithinPartitions(row_number)
        .drop(row_number)
    )


# --- the training input of DistriOptimizer -------------------------------------------------


def _python_error(error: Exception) -> Exception:
    """A failed job's Python error (its last ``TypeError: ...`` line), re-raised alone."""
    kinds = {"TypeError": TypeError, "ValueError": ValueError}
    for line in reversed(str(error).splitlines()):
        kind, _, message = line.strip().partition(": ")
        if kind in kinds and message:
            return kinds[kind](message)
    return error


def _class_count(model: Any, features: tuple) -> int | None:
    """The model's number of classes: its output width on one sample (None if unknown).

    Runs one sample in evaluation mode without a graph, so neither the weights, the
    running statistics nor the training mode change.
    """
    from bigdl_py.autograd.grad_mode import no_grad
    from bigdl_py.autograd.tensor import Tensor

    was_training = model.training
    model.eval()
    try:
        with no_grad():
            output = model(*[Tensor(np.asarray(array)[None]) for array in features])
    except Exception:  # the run itself will report a model that rejects its input
        return None
    finally:
        model.train(was_training)
    shape = getattr(output, "shape", ())
    return int(shape[1]) if len(shape) >= 2 else None


class _LabelRule:
    """Applies :func:`bigdl_py.data.validation.class_indices` to records on the executors."""

    def __init__(self, class_loss: bool, num_classes: int | None, ignore_index: int | None):
        self.class_loss = class_loss
        self.num_classes = num_classes
        self.ignore_index = ignore_index

    def labels(self, labels: Any, partition: int | None) -> np.ndarray:
        from bigdl_py.data.validation import class_indices

        if not self.class_loss:  # regression targets pass as they are
            return labels
        return class_indices(
            labels, f"partition {partition} labels", self.num_classes, self.ignore_index
        )

    def blocks(self, partition: int, blocks: Iterator[tuple]) -> Iterator[Any]:
        """DataFrame blocks -> MiniBatches; an empty partition yields none (a zero-row block
        has no shape to stack, and the caller names empty partitions itself)."""
        from bigdl_py.data import MiniBatch

        for features, labels in blocks:
            if len(labels):
                yield MiniBatch(features, self.labels(labels, partition))

    def records(self, partition: int, rows: Iterator[Any]) -> Iterator[Any]:
        """RDD records with their labels as class indices (MiniBatches stay MiniBatches,
        the others become Samples)."""
        from bigdl_py.data import MiniBatch, Sample
        from bigdl_py.data.records import labelled_record

        for position, row in enumerate(rows):
            record = labelled_record(row, f"partition {partition}, record {position}")
            if isinstance(record, MiniBatch):
                yield MiniBatch(record.features, self.labels(record.labels, partition))
            else:
                yield Sample(record.features, self.labels(record.label, partition))


def _survey(partition: int, rows: Iterator[Any]) -> Iterator[tuple[int, Any]]:
    """One partition's sample count and first sample's features; refuses unknown records."""
    from bigdl_py.data import MiniBatch
    from bigdl_py.data.records import labelled_record

    size, first = 0, None
    for position, row in enumerate(rows):
        record = labelled_record(row, f"partition {partition}, record {position}", "training")
        if isinstance(record, MiniBatch):
            count, features = record.size, tuple(array[0] for array in record.features)
        else:
            count, features = 1, record.features
        if first is None and count:
            first = features
        size += count
    yield size, first


def _warn_uneven(sizes: list[int], num_partitions: int, kind: str) -> None:
    import warnings

    warnings.warn(
        f"the training {kind}'s partitions hold {sizes} samples: every partition supplies an "
        "equal share of each batch, so small ones would be read many times an epoch and "
        f"large ones only in part; repartitioned into {num_partitions} even partitions "
        f"(repartition the {kind} yourself to choose how)",
        stacklevel=4,
    )


def _dataframe_partition_sizes(df: DataFrame, num_partitions: int) -> list[int]:
    """Rows per partition, counted in the JVM (one job; no column is read into Python)."""
    from pyspark.sql import functions as F

    counts = df.groupBy(F.spark_partition_id().alias("partition")).count().collect()
    sizes = [0] * num_partitions
    for row in counts:
        sizes[row["partition"]] = int(row["count"])
    return sizes


def _rebalanced(rdd: Any, sizes: list[int], num_partitions: int) -> Any:
    """``rdd`` cut into ``num_partitions`` contiguous runs of (nearly) equal sample counts.

    ``rdd.repartition`` would not do: PySpark shuffles its pickled batches of records, not
    the records, so a small RDD keeps its uneven sizes.
    """
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    total = offsets[-1]

    def keyed(partition, rows):
        from bigdl_py.data import MiniBatch

        position = offsets[partition]
        for row in rows:
            yield position, row
            position += len(row.labels) if isinstance(row, MiniBatch) else 1

    return (
        rdd.mapPartitionsWithIndex(keyed)
        .partitionBy(num_partitions, lambda position: position * num_partitions // total)
        .values()
    )


def prepare_training_input(
    data: Any,
    sc: Any,
    num_partitions: int,
    model: Any,
    criterion: Any,
    feature_cols: ColumnSpec = "features",
    label_col: str = "label",
    feature_shape: ShapeSpec = None,
) -> Any:
    """``DistriOptimizer``'s training input, checked before anything is cached or trained.

    One rule for every source: with a class loss (``NLLLoss``, ``CrossEntropyLoss``) labels
    that are whole-number floats (Spark ML's doubles) become int64 class indices, fractional
    ones are refused, and labels outside the model's classes (its output width on one
    sample) are refused up front, not when the sample is first drawn.

    Parameters
    ----------
    data
        An RDD of Samples, ``(features, label)`` pairs or MiniBatches; a DataFrame;
        ``(features, labels)`` arrays or an ``ArrayDataset``. Anything else is returned as
        it is (the caller refuses it).
    sc : SparkContext
    num_partitions : int
    model, criterion
        The model and loss of the run.
    feature_cols, label_col, feature_shape
        How to read a DataFrame.

    Returns
    -------
    ArrayDataset, RDD or the input
        Arrays as an ``ArrayDataset``; a DataFrame as an RDD of one MiniBatch per non-empty
        partition. An RDD with ``num_partitions`` partitions of uneven sizes is repartitioned
        with a warning naming the sizes: every partition supplies an equal share of each
        batch, so it would read a small partition's samples many times an epoch and leave
        much of a large one unread. Counting the partitions reads an RDD once more.

    Raises
    ------
    ValueError
        For empty input, fractional or out-of-range labels (naming the first).
    TypeError
        For RDD records of another kind, or a list of numbers as a sample's features.
    """
    from bigdl_py.data import ArrayDataset
    from bigdl_py.data.validation import class_indices
    from bigdl_py.nn.loss import _ClassLoss

    class_loss = isinstance(criterion, _ClassLoss)
    ignore_index = criterion.ignore_index if class_loss else None
    if isinstance(data, tuple) and len(data) == 2:
        data = ArrayDataset(data[0], data[1])
    if isinstance(data, ArrayDataset):
        if not class_loss or data.labels is None or len(data) == 0:
            return data
        first = tuple(array[0] for array in data.features)
        labels = class_indices(data.labels, "labels", _class_count(model, first), ignore_index)
        return ArrayDataset(data.features, labels, check_finite=False)  # checked once above
    if is_dataframe(data):
        first_row = dataframe_to_arrays(data.limit(1), feature_cols, label_col, feature_shape)
        features = first_row[0] if isinstance(first_row[0], tuple) else (first_row[0],)
        if len(first_row[1]) == 0:
            raise ValueError("the training DataFrame has no rows")
        if data.rdd.getNumPartitions() != num_partitions:
            data = data.repartition(num_partitions)  # rows, not whole blocks, are spread
        else:
            sizes = _dataframe_partition_sizes(data, num_partitions)
            if uneven_partitions(sizes):
                _warn_uneven(sizes, num_partitions, "DataFrame")
                data = data.repartition(num_partitions)
        num_classes = _class_count(model, tuple(array[0] for array in features))
        rule = _LabelRule(class_loss, num_classes, ignore_index)
        blocks = dataframe_to_partition_arrays(data, feature_cols, label_col, feature_shape)
        return blocks.mapPartitionsWithIndex(rule.blocks)
    if not is_rdd(data):
        return data
    sc.setJobDescription("bigdl_py: count and check the training records")
    try:
        survey = data.mapPartitionsWithIndex(_survey).collect()
    except Exception as error:
        raise _python_error(error) from None  # not the JVM's pages about it
    finally:
        sc.setJobDescription(None)
    sizes = [size for size, _ in survey]
    first = next((features for _, features in survey if features is not None), None)
    if first is None:
        raise ValueError(f"the training RDD holds no samples (in {len(sizes)} partitions)")
    if len(sizes) == num_partitions and uneven_partitions(sizes):
        _warn_uneven(sizes, num_partitions, "RDD")
    if len(sizes) != num_partitions or uneven_partitions(sizes):
        data = _rebalanced(data, sizes, num_partitions)
    if class_loss:
        rule = _LabelRule(True, _class_count(model, first), ignore_index)
        data = data.mapPartitionsWithIndex(rule.records)
    return data
