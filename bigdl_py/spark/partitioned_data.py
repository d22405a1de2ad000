"""The training data on the executors: cut into partitions, written once to each host's disk.

:class:`PartitionedData` is what every Spark training run (``DistriOptimizer``,
``DistriTrainer``) reads: the training data split into ``num_partitions`` partitions, each
stacked into arrays and saved as ``.npy`` files on the host that holds it, behind a cached RDD
of small handles (one per partition). A replica memory-maps its partition's files; a chained
stage, which reads a shuffle instead of the cached handles, finds them through the handle.

:func:`prepare_training` is the set-up both trainers share: the input (RDD, DataFrame or
arrays) as an RDD, the partitions cached, and the batch plan over their sizes.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from typing import Any

import numpy as np

from bigdl_py.data import ArrayDataset, MiniBatch
from bigdl_py.data.records import labelled_record
from bigdl_py.data.sample import Sample
from bigdl_py.data.spark_types import is_dataframe, is_rdd
from bigdl_py.nn.serialization import atomic_write
from bigdl_py.optim.sharding import all_slice_bounds
from bigdl_py.spark import worker
from bigdl_py.spark.batch_plan import PartitionedBatchPlan
from bigdl_py.spark.session import job_description


class DistributedTrainingError(RuntimeError):
    """A Spark job of the run failed; the message is the Python error a task raised."""


def drain(rows) -> list:
    """Read a task's input to its end, returning it.

    A PySpark task that leaves input unread makes its Python worker exit instead of going
    back to the pool (worker.py cannot reuse a half-read stream): the next task then forks a
    fresh worker that re-imports everything and finds the worker cache empty — seconds per
    iteration. Every task here reads its input fully for that reason.
    """
    return list(rows)


#: The exit code Spark gives an executor whose JVM ran out of memory (``SparkExitCode.OOM``).
JVM_OUT_OF_MEMORY_EXIT_CODE = 52


def python_error_text(error: Exception) -> str:
    """What went wrong inside a Py4J/Spark error, in one line: the last Python exception
    line; else, where an executor was lost, Spark's reason (an out-of-memory exit said in
    words); else Spark's own message (a job aborted, an application removed); else the
    first line (Py4J's "An error occurred while calling ..." says nothing more)."""
    text = str(error)
    python_lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip().split(":", 1)[0].endswith(("Error", "Exception"))
        and not line.strip().startswith(("org.", "java.", "py4j", "Caused by", "scala.", "at "))
    ]
    if python_lines:
        return python_lines[-1]
    lost = re.search(r"ExecutorLostFailure.*?Reason: ([^\n]+)", text)
    if lost:
        reason = lost.group(1).strip()
        if re.search(rf"exited with code {JVM_OUT_OF_MEMORY_EXIT_CODE}\b", reason):
            return (
                f"an executor ran out of memory (Spark: {reason}, its out-of-memory exit): "
                "give executors more memory (spark.executor.memory, "
                "spark.executor.pyspark.memory) or split the model over executors "
                "(update=Pipeline(stages=K))"
            )
        return f"an executor was lost: {reason}"
    spark_failure = re.search(r"SparkException: ([^\n]+)", text)  # what Spark itself says
    if spark_failure:
        return spark_failure.group(1).strip()
    return text.strip().splitlines()[0]


def run_directory(state_dir: str | None, run_id: str) -> str:
    """This run's directory on the host (data files, optimizer state files); ``state_dir``
    None is the host's own default (:func:`default_state_dir`, read where the task runs)."""
    path = os.path.join(state_dir or default_state_dir(), f"bigdl_py-run-{run_id}")
    os.makedirs(path, exist_ok=True)
    return path


def default_state_dir() -> str:
    # Not ".../bigdl_py": a directory of the package's own name in the temp directory would
    # shadow the package (as a namespace package) for anyone whose working directory it is.
    default = os.path.join(tempfile.gettempdir(), "bigdl_py-state")
    return os.environ.get("BIGDL_PY_STATE_DIR") or default


def save_npy_atomically(path: str, array: np.ndarray) -> None:
    """``array`` as a ``.npy`` file that no reader sees half written (a run's scratch file)."""
    atomic_write(path, lambda handle: np.save(handle, array, allow_pickle=False), durable=False)


# --- a partition's training data on its host --------------------------------------------------
def write_partition_data(
    directory: str, partition: int, features: tuple, labels: np.ndarray
) -> dict:
    """Save one partition's arrays as .npy files (memory-mapped on read); returns a handle.

    The cached RDD then holds only this small handle: reading it each iteration unpickles a
    few hundred bytes instead of the partition's data.
    """
    paths = []
    for position, array in enumerate(features):
        path = os.path.join(directory, f"data-{partition}-x{position}.npy")
        save_npy_atomically(path, np.ascontiguousarray(array))
        paths.append(path)
    label_path = os.path.join(directory, f"data-{partition}-y.npy")
    save_npy_atomically(label_path, np.ascontiguousarray(labels))
    return {
        "partition": partition,
        "size": int(len(labels)),
        # A sample's bytes (its features and label): what a share of it weighs where the
        # chain's rows travel with its stages (records.ShareRows).
        "sample_bytes": int(
            sum(array.dtype.itemsize * int(np.prod(array.shape[1:])) for array in features)
            + labels.dtype.itemsize * int(np.prod(labels.shape[1:]))
        ),
        "feature_paths": paths,
        "label_path": label_path,
        "host": os.uname().nodename,
    }


def load_partition_data(handle: dict) -> tuple[tuple, np.ndarray]:
    """Memory-map a partition's arrays; a clear error if this host does not have them."""
    try:
        features = tuple(
            np.load(path, mmap_mode="r", allow_pickle=False) for path in handle["feature_paths"]
        )
        labels = np.load(handle["label_path"], mmap_mode="r", allow_pickle=False)
    except FileNotFoundError as error:
        raise RuntimeError(
            f"training data of partition {handle['partition']} was written on host "
            f"{handle['host']} but is not on {os.uname().nodename} ({error.filename}); the "
            "task ran away from its cached data. Set BIGDL_PY_STATE_DIR to a directory shared "
            "by the executors, or keep spark.locality.wait above 0"
        ) from None
    return features, labels


def training_rdd(
    data, sc, num_partitions, feature_cols="features", label_col="label", feature_shape=None
):
    """The training data as an RDD, and the broadcasts it reads (to destroy at the end).

    RDDs come as they are, DataFrames are read through Arrow into one MiniBatch per
    partition, and arrays are cut into ``num_partitions`` contiguous blocks, each shipped
    as a broadcast of its own behind a one-partition RDD. (``sc.parallelize(blocks)`` would
    keep each block inside its partition object, and Spark serialises that object into
    every task that reads the cached data: the whole block, every iteration.)
    """
    if is_rdd(data):
        return data, []
    if is_dataframe(data):
        from bigdl_py.spark.dataframe import dataframe_to_partition_arrays

        if data.rdd.getNumPartitions() != num_partitions:
            # Rows, not whole partition blocks, must be spread over the partitions.
            data = data.repartition(num_partitions)

        blocks = dataframe_to_partition_arrays(data, feature_cols, label_col, feature_shape)
        return blocks.map(lambda block: MiniBatch(block[0], block[1])), []
    if isinstance(data, tuple) and len(data) == 2:
        data = ArrayDataset(data[0], data[1])
    if isinstance(data, ArrayDataset):
        features, labels = data.features, data.labels
        size = len(data)
        if size < num_partitions:
            raise ValueError(
                f"the training data has {size} samples, fewer than the {num_partitions} "
                "partitions; use fewer partitions (num_partitions=)"
            )
        blocks = [
            MiniBatch(tuple(np.asarray(f[start:stop]) for f in features), labels[start:stop])
            for start, stop in all_slice_bounds(size, num_partitions)
        ]
        broadcasts = [sc.broadcast(block) for block in blocks]
        parts = [sc.parallelize([0], 1).map(lambda _, b=b: b.value) for b in broadcasts]
        return sc.union(parts), broadcasts
    raise TypeError(
        "training_set must be a PySpark RDD (of Samples, (features, label) pairs or "
        "MiniBatches), a DataFrame, an ArrayDataset or (features, labels) arrays; got "
        f"{type(data).__name__}"
    )


def stack_partition(partition: int, rows) -> tuple[tuple, np.ndarray]:
    """Stack a partition's Samples, (features, label) pairs or MiniBatches into arrays."""
    feature_blocks: list[list[np.ndarray]] = []
    label_blocks: list[np.ndarray] = []
    pending: list[Sample] = []

    def flush():
        if pending:
            batch = MiniBatch.from_samples(pending)
            feature_blocks.append(list(batch.features))
            label_blocks.append(np.asarray(batch.labels))
            pending.clear()

    for position, row in enumerate(rows):
        record = labelled_record(row, f"partition {partition}, record {position}", "training")
        if isinstance(record, MiniBatch):
            flush()
            feature_blocks.append(list(record.features))
            label_blocks.append(np.asarray(record.labels))
        else:
            pending.append(record)
    flush()
    if not feature_blocks:
        return (), np.zeros(0, dtype=np.int64)
    shapes = {tuple(tuple(a.shape[1:]) for a in block) for block in feature_blocks}
    if len(shapes) > 1:
        raise ValueError(
            f"partition {partition}: samples have different feature shapes {sorted(shapes)}"
        )
    features = tuple(
        np.concatenate([block[i] for block in feature_blocks])
        for i in range(len(feature_blocks[0]))
    )
    labels = np.concatenate(label_blocks)
    for position, array in enumerate(features):
        if np.issubdtype(array.dtype, np.floating):
            finite = np.isfinite(array.reshape(len(array), -1)).all(axis=1)
            if not finite.all():
                bad = int(np.flatnonzero(~finite)[0])
                raise ValueError(
                    f"partition {partition}: feature array {position} of sample {bad} (within "
                    "the partition) holds NaN or Inf"
                )
    return features, labels


class PartitionedData:
    """The training data split into ``num_partitions`` partitions, written once to each
    executor's disk, with a cached RDD of small handles (one per partition).

    Raises
    ------
    ValueError
        On the driver, naming the partitions: empty partitions, fewer samples than
        partitions, NaN/Inf features, ragged shapes.
    """

    def __init__(
        self,
        sc,
        rdd,
        num_partitions: int,
        state_dir: str | None = None,
        sources: list = (),
        task_cpus: int | None = None,
    ):
        self.sc = sc
        # Whole-executor tasks (``task_cpus`` CPUs each): the handles are cached one per
        # executor by tasks of that profile, and every training stage runs under it.
        self.task_cpus = task_cpus
        self.task_profile = None
        if task_cpus is not None:
            from bigdl_py.spark.session import task_profile

            self.task_profile = task_profile(task_cpus)
        # Broadcasts ``rdd`` reads from: kept while the data lives (an executor lost later
        # rebuilds its partitions from them), destroyed by close().
        self.sources = list(sources)
        self.num_partitions = int(num_partitions)
        self.data_id = "data-" + uuid.uuid4().hex[:12]
        # None: each host's own default directory, resolved where the task runs (hosts that
        # share no disk each keep their files in their own temporary directory).
        self.state_dir = state_dir
        if rdd.getNumPartitions() != self.num_partitions:
            rdd = rdd.repartition(self.num_partitions)
        data_id, state_dir = self.data_id, self.state_dir

        def write(partition, rows):
            features, labels = stack_partition(partition, rows)
            directory = run_directory(state_dir, data_id)
            yield write_partition_data(directory, partition, features, labels)

        handles = rdd.mapPartitionsWithIndex(write)
        if self.task_profile is not None:
            handles = handles.withResources(self.task_profile)
        self.handles = handles.cache()
        try:
            with job_description(sc, "bigdl_py: cache the training data on the executors"):
                infos = sorted(self.handles.collect(), key=lambda handle: handle["partition"])
        except Exception as error:
            self.close()
            raise ValueError(
                f"preparing the training data failed: {python_error_text(error)}"
            ) from None
        self.sizes = [info["size"] for info in infos]
        # One small dict per partition (where its arrays lie): a chained iteration's
        # forward-backward stage reads a shuffle, not the cached handles, and finds its data
        # through these.
        self.partition_handles = infos
        total = sum(self.sizes)
        if total < self.num_partitions:
            self.close()
            raise ValueError(
                f"the training data has {total} samples, fewer than the {self.num_partitions} "
                "partitions; use fewer partitions (num_partitions=)"
            )
        empty = [partition for partition, size in enumerate(self.sizes) if size == 0]
        if empty:
            self.close()
            raise ValueError(
                f"partitions {empty} of the training data are empty after splitting it into "
                f"{self.num_partitions} partitions; repartition the data so none is empty"
            )

    def close(self) -> None:
        """Unpersist the handles and delete the data files on every executor and here."""
        self.handles.unpersist()
        remove_run_everywhere(self.sc, self.state_dir, self.data_id, self.num_partitions)
        for broadcast in self.sources:
            broadcast.destroy()
        self.sources = []


def remove_run_everywhere(sc, state_dir: str | None, run_id: str, count: int) -> None:
    """Drop run ``run_id``'s worker caches and delete its files on every executor and here."""

    def clean(_, rows):
        drain(rows)
        worker.release_run(run_id)
        shutil.rmtree(run_directory(state_dir, run_id), ignore_errors=True)
        yield 0

    try:
        with job_description(sc, f"bigdl_py: clean up {run_id}"):
            sc.parallelize(range(count), count).mapPartitionsWithIndex(clean).collect()
    except Exception:  # clean-up is best effort; a dead executor's files went with it
        pass
    finally:
        shutil.rmtree(run_directory(state_dir, run_id), ignore_errors=True)


def prepare_training(
    training_set: Any,
    batch_size: int,
    *,
    num_partitions: int | None,
    feature_cols: Any,
    label_col: str,
    feature_shape: Any,
    seed: int,
    shuffle: bool,
    spark: Any,
    check_input: Any = None,
    whole_executor_cpus: Any = None,
) -> tuple[Any, PartitionedData, PartitionedBatchPlan]:
    """The set-up ``DistriOptimizer`` and ``DistriTrainer`` share: ``(sc, data, plan)``.

    The input is read into an RDD (:func:`training_rdd`), cut into ``num_partitions``
    partitions (default: the cluster's task slots) and cached on the executors, and the
    batch plan laid over the partitions' sizes. ``check_input(data, sc, num_partitions)``,
    when given, checks (and may convert) the input first. On a bad input nothing stays
    cached. ``whole_executor_cpus(sc)``, when given and no partition count is, says whether
    to train in whole-executor tasks: their CPUs (then one partition per executor), or None.
    """
    from bigdl_py.spark.session import (
        CONNECT_TRAINING_ALTERNATIVE,
        get_spark,
        partition_count,
        require_classic_spark,
    )

    for given in (training_set, spark):  # before anything reaches for the RDD API
        require_classic_spark(
            given, "DistriOptimizer and DistriTrainer", CONNECT_TRAINING_ALTERNATIVE
        )
    spark = spark or get_spark()
    sc = spark.sparkContext
    task_cpus = None
    if num_partitions is None and whole_executor_cpus is not None:
        task_cpus = whole_executor_cpus(sc)
        if task_cpus is not None:
            from bigdl_py.spark.session import executor_layout

            num_partitions = executor_layout(sc)[0]
    num_partitions = partition_count(sc, num_partitions)
    if check_input is not None:
        training_set = check_input(training_set, sc, num_partitions)
    rdd, sources = training_rdd(
        training_set, sc, num_partitions, feature_cols, label_col, feature_shape
    )
    data = PartitionedData(sc, rdd, num_partitions, sources=sources, task_cpus=task_cpus)
    try:
        plan = PartitionedBatchPlan(data.sizes, batch_size, seed=seed, shuffle=shuffle)
    except ValueError:
        data.close()
        raise
    return sc, data, plan
