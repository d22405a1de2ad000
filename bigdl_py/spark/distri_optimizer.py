"""``DistriOptimizer``: synchronous data-parallel training on Spark, BigDL's way.

It is the training loop of :class:`~bigdl_py.train.loop.BaseOptimizer` — the same triggers,
validation, checkpoints, summaries, clipping and progress as ``LocalOptimizer`` — with a
runner that does each iteration on the executors (``distri_optimizer_run.py``): N model
replicas next to N data partitions, the gradient AllReduce through Spark's shuffle, and the
optimizer state sharded N ways, each owner updating its slice of the weights.

The mathematics is single-process SGD on the global batch: iteration ``t``'s global batch is
partition ``j``'s share ``b_j`` (``batch_size`` split N ways, shares differing by at most one)
drawn from partition ``j``'s own per-epoch permutation (:class:`PartitionedBatchPlan`); the
gradient is that of the batch's mean loss, each share weighted by its real sample count. A
``LocalOptimizer`` over :meth:`DistriOptimizer.local_reference_dataset` sees the same
batches, and the tests hold the two to float tolerance.
"""

from __future__ import annotations

import copy
import numbers
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from bigdl_py.data import ArrayDataset, MiniBatch
from bigdl_py.data.sample import split_bounds
from bigdl_py.nn.module import Module
from bigdl_py.optim import ConstantClipping, L2NormClipping, OptimMethod
from bigdl_py.optim.flat_parameters import FlatParameters
from bigdl_py.optim.sharding import all_slice_bounds, concatenate_state_dicts, split_state_dict
from bigdl_py.spark import distri_optimizer_tasks as tasks
from bigdl_py.spark.batch_plan import PartitionedBatchPlan, PlannedDataset
from bigdl_py.spark.distri_optimizer_run import (
    DistributedTrainingError,
    PartitionedData,
    SparkTrainingRun,
)
from bigdl_py.train import batches as batch_io
from bigdl_py.train.loop import BaseOptimizer
from bigdl_py.train.metrics import ValidationMethod, ValidationResult
from bigdl_py.train.progress import Progress
from bigdl_py.train.runner import IterationResult, IterationRunner, IterationStep, TrainingSetup
from bigdl_py.train.triggers import Trigger

__all__ = ["DistriOptimizer", "DistributedTrainingError", "SparkTrainingSet", "SparkValidationSet"]

_SCHEDULE_KEYS = ("iteration", "epoch", "step")

# Iterations per Spark job (bench/RESULTS.md: chaining them pays the job's fixed cost once).
# The upper bound keeps the job's lineage (two shuffles per iteration) well inside the
# driver JVM's stack: Spark walks it recursively and overflowed at 100 iterations.
DEFAULT_ITERATIONS_PER_JOB = 8
MAX_ITERATIONS_PER_JOB = 32


def _is_rdd(data: Any) -> bool:
    return any(
        cls.__module__.startswith("pyspark") and cls.__name__ == "RDD" for cls in type(data).__mro__
    )


def _is_dataframe(data: Any) -> bool:
    return any(
        cls.__module__.startswith("pyspark.sql") and cls.__name__ == "DataFrame"
        for cls in type(data).__mro__
    )


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
    if _is_rdd(data):
        return data, []
    if _is_dataframe(data):
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
            for start, stop in split_bounds(size, num_partitions)
        ]
        broadcasts = [sc.broadcast(block) for block in blocks]
        parts = [sc.parallelize([0], 1).map(lambda _, b=b: b.value) for b in broadcasts]
        return sc.union(parts), broadcasts
    raise TypeError(
        "training_set must be a PySpark RDD (of Samples, (features, label) pairs or "
        "MiniBatches), a DataFrame, an ArrayDataset or (features, labels) arrays; got "
        f"{type(data).__name__}"
    )


class SparkTrainingSet:
    """The training data as the loop sees it: ``len()`` and every epoch's global batches.

    Wraps :class:`PartitionedData` (the partitions cached on the executors) and the
    :class:`PartitionedBatchPlan` over their sizes.
    """

    def __init__(self, data: PartitionedData, batch_size: int, seed: int, shuffle: bool = True):
        self.data = data
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.num_partitions = data.num_partitions
        self.plan = PartitionedBatchPlan(data.sizes, batch_size, seed=seed, shuffle=shuffle)

    def __len__(self) -> int:
        return self.plan.total

    def global_batch_indices(self, epoch: int, batch_size: int | None = None) -> list[np.ndarray]:
        """One entry per iteration of ``epoch``: the global sample indices of its batch."""
        first = epoch * self.plan.iterations_per_epoch
        return [
            self.plan.global_indices(iteration)
            for iteration in range(first, first + self.plan.iterations_per_epoch)
        ]


class SparkValidationSet:
    """An RDD or DataFrame to validate on, evaluated on the executors."""

    def __init__(self, data: Any, reading: dict):
        self.data = data
        self.reading = reading  # feature_cols, label_col, feature_shape (DataFrames)
        self._size: int | None = None

    def __len__(self) -> int:
        if self._size is None:
            self._size = int(self.data.count())
        return self._size


class SparkRunner(IterationRunner):
    """Runs each iteration on Spark; the driver keeps the weights between iterations."""

    def __init__(self, options: dict):
        self.options = options
        self.run: SparkTrainingRun | None = None
        self._pending_metric: float | None = None
        self._resume_states: dict | None = None

    def prepare(self, setup: TrainingSetup) -> None:
        super().prepare(setup)
        training_set: SparkTrainingSet = setup.training_set
        setup.model.train()
        self.flat = FlatParameters(setup.model)
        self.plan = training_set.plan
        constant = next((c for c in setup.clippings if isinstance(c, ConstantClipping)), None)
        l2 = next((c for c in setup.clippings if isinstance(c, L2NormClipping)), None)
        self.spec = tasks.RunSpec(
            run_id="run-" + uuid.uuid4().hex[:12],
            model=setup.model,
            criterion=setup.criterion,
            optim_method=copy.deepcopy(setup.optim_method),
            num_partitions=training_set.num_partitions,
            flat_size=int(self.flat.size),
            batch_size=setup.batch_size,
            state_dir=training_set.data.state_dir,
            seed=training_set.seed,
            wire_dtype=self.options["wire_dtype"],
            constant_clipping=constant,
            l2_clipping=l2,
            gradient_accumulation=self.options["gradient_accumulation"],
            device=self.options["device"],
            update=self.options["update"],
        )
        self._resume_states = None
        self._pending_metric = None
        # With the sharded update, global-norm clipping needs the norm of the whole summed
        # gradient before any owner steps: a small job of its own each iteration (see
        # SparkTrainingRun.run_iteration). Replicated partitions hold the whole gradient.
        sharded = self.spec.update == "sharded"
        chainable = l2 is None or not sharded
        self.iterations_per_call = self.options["iterations_per_job"] if chainable else 1

    def _ensure_run(self, iteration: int) -> SparkTrainingRun:
        if self.run is None:
            initial = None
            if self._resume_states is not None:
                initial = {"iteration": iteration, "shards": self._resume_states}
            self.run = SparkTrainingRun(
                self.setup.training_set.data,
                self.spec,
                np.asarray(self.flat.weights, dtype=np.float32),
                initial,
            )
        return self.run

    def _shares(self, epoch: int, batch_index: int) -> list:
        """Each partition's sample indices (within the partition) of a global batch."""
        plan_iteration = epoch * self.plan.iterations_per_epoch + batch_index
        return [
            self.plan.local_indices(partition, plan_iteration)
            for partition in range(self.plan.num_partitions)
        ]

    def _schedule(self, epoch: int, iteration: int) -> dict:
        schedule = {"iteration": iteration, "epoch": epoch}
        if self._pending_metric is not None:  # the first update after a validated epoch
            schedule["metric"] = self._pending_metric
            self._pending_metric = None
        return schedule

    def run_iteration(
        self, epoch: int, iteration: int, batch_index: int, indices: np.ndarray
    ) -> IterationResult:
        if self.spec.update == "replicated":  # its state lives only in chains' partitions
            step = IterationStep(epoch, iteration, batch_index, indices)
            (result,) = self.run_iterations([step], stop_after_nonfinite=False)
            return result
        run = self._ensure_run(iteration)
        result = run.run_iteration(
            iteration,
            self._shares(epoch, batch_index),
            self._schedule(epoch, iteration),
            f"bigdl_py iteration {iteration + 1}",
        )
        # The driver's copy of the optim method only keeps the schedule (learning rate for
        # summaries and progress); the shards hold the per-element state.
        self.setup.optim_method.on_iteration_end(iteration + 1)
        return IterationResult(float(result["loss"]), int(result["count"]), bool(result["finite"]))

    def run_iterations(
        self, steps: Sequence[IterationStep], stop_after_nonfinite: bool
    ) -> list[IterationResult]:
        replicated = self.spec.update == "replicated"
        if len(steps) == 1 and not replicated:
            return super().run_iterations(steps, stop_after_nonfinite)
        first = steps[0].iteration
        run = self._ensure_run(first)
        chain = run.run_replicated_chain if replicated else run.run_chain
        last = first + len(steps)
        outcomes = chain(
            first,
            [self._shares(step.epoch, step.batch_index) for step in steps],
            [self._schedule(step.epoch, step.iteration) for step in steps],
            f"bigdl_py iterations {first + 1}-{last}: forward-backward + {self.spec.update} update",
            stop_after_nonfinite,
        )
        results = []
        for step, outcome in zip(steps, outcomes, strict=False):
            learning_rate = self.learning_rate()
            self.setup.optim_method.on_iteration_end(step.iteration + 1)
            results.append(
                IterationResult(
                    float(outcome["loss"]),
                    int(outcome["count"]),
                    bool(outcome["finite"]),
                    learning_rate,
                )
            )
        return results

    def end_epoch(self, epoch: int, validation_score: float | None = None) -> None:
        super().end_epoch(epoch, validation_score)
        self._pending_metric = validation_score

    # --- weights on the driver ---------------------------------------------------------
    def sync_model(self) -> None:
        if self.run is not None:
            self.flat.load(self.run.weights)
            if self.run.buffers:
                buffers = dict(self.setup.model.state_dict())
                buffers.update(self.run.buffers)
                self.setup.model.load_state_dict(buffers)

    def model_state_dict(self) -> dict[str, np.ndarray]:
        self.sync_model()
        return super().model_state_dict()

    def load_model_state_dict(self, state: dict[str, np.ndarray]) -> None:
        super().load_model_state_dict(state)
        if self.run is not None:
            self.run.weights = np.asarray(self.flat.weights, dtype=np.float32).copy()

    # --- optimizer state: one dict per shard --------------------------------------------
    def optim_state_dict(self) -> list[dict[str, Any]]:
        if self.run is None:  # nothing trained yet: fresh shards
            return self._fresh_shard_states()
        completed = self.setup.optim_method.state_dict()
        shards = self.run.gather_optim_states(int(completed["iteration"]))
        # The driver's schedule is the reference (shards step theirs to match it).
        for shard in shards:
            shard.update({k: v for k, v in completed.items() if _is_schedule_key(k)})
        return shards

    def _fresh_shard_states(self) -> list[dict[str, Any]]:
        driver = self.setup.optim_method.state_dict()
        return [
            {k: v for k, v in driver.items() if _is_schedule_key(k) or k == "step"}
            for _ in range(self.spec.num_partitions)
        ]

    def load_optim_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        shards = state if isinstance(state, list) else [state]
        count = self.spec.num_partitions
        if len(shards) != count:  # another partition count: re-shard the whole state
            whole = concatenate_state_dicts(shards) if len(shards) > 1 else dict(shards[0])
            has_arrays = any(isinstance(v, np.ndarray) and v.ndim == 1 for v in whole.values())
            if has_arrays:
                shards = split_state_dict(whole, all_slice_bounds(self.flat.size, count))
            else:
                shards = [dict(whole) for _ in range(count)]
        self._resume_states = shards
        driver = {k: v for k, v in shards[0].items() if _is_schedule_key(k) or k == "step"}
        self.setup.optim_method.load_state_dict(driver)
        if self.run is not None:  # a resume after training in this process: start a new run
            self.run.close()
            self.run = None

    def rng_state(self) -> dict[str, Any]:
        return {}  # replicas reseed from (seed, partition, iteration): nothing to save

    def load_rng_state(self, state: dict[str, Any]) -> None:
        pass

    # --- validation -------------------------------------------------------------------
    def evaluate(
        self, dataset: Any, methods: Sequence[ValidationMethod], batch_size: int
    ) -> list[ValidationResult]:
        self.sync_model()
        if isinstance(dataset, SparkValidationSet):
            from bigdl_py.spark.inference import evaluate

            return evaluate(
                self.setup.model,
                dataset.data,
                list(methods),
                batch_size=batch_size,
                device=self.options["device"],
                **dataset.reading,
            )
        return batch_io.evaluate_batches(
            self.setup.model, batch_io.validation_batches(dataset, batch_size), methods
        )

    @property
    def last_timings(self) -> dict[str, float]:
        """Seconds of the last iteration: whole job, slowest forward-backward, slowest update."""
        return dict(self.run.last_timings) if self.run is not None else {}

    def close(self) -> None:
        if self.run is not None:
            self.sync_model()
            self.run.close()
            self.run = None


def _is_schedule_key(key: str) -> bool:
    return key in ("iteration", "epoch") or key.startswith("schedule.")


class DistriOptimizer(BaseOptimizer):
    """Train ``model`` on the active SparkSession's executors (synchronous data parallel).

    Parameters
    ----------
    model : Module
    training_set
        An RDD of :class:`~bigdl_py.data.Sample`, ``(features, label)`` pairs or
        :class:`~bigdl_py.data.MiniBatch`; a Spark DataFrame (``feature_cols``,
        ``label_col``, ``feature_shape`` say how to read it, through Arrow); or in-memory
        ``(features, labels)`` arrays / an ``ArrayDataset``, cut into ``num_partitions``
        contiguous blocks.
    criterion, optim_method, batch_size, end_trigger
        As for ``LocalOptimizer``; ``batch_size`` is the *global* batch of one update.
    num_partitions : int, optional
        Data partitions = model replicas = optimizer shards (default: the cluster's task
        slots, ``bigdl_py.spark.task_slots``).
    feature_cols, label_col, feature_shape
        For a DataFrame (see ``bigdl_py.spark.dataframe.dataframe_to_partition_arrays``).
    wire_dtype : None, "float16" or "bfloat16"
        Gradient slices travel through the shuffle in this precision (summed in float32).
    gradient_accumulation : int
        Each update runs ``batch_size`` in this many micro-batches per partition whose
        gradients add up: the same update as one batch of ``batch_size``, with the memory of
        a ``batch_size / gradient_accumulation`` batch.
    iterations_per_job : int, optional
        Iterations chained into one Spark job (1 to ``MAX_ITERATIONS_PER_JOB``; default
        ``DEFAULT_ITERATIONS_PER_JOB`` where the executors share a disk — local modes, one
        host, or a shared ``BIGDL_PY_STATE_DIR`` — else 1, because a chained stage may run
        away from its partition's files; see ``session.executors_share_a_disk``): each
        iteration stays two stages with the same AllReduce, but the weights pass from one
        iteration's owners to the next iteration's replicas through a shuffle instead of
        the driver, and Spark's fixed cost of a job is paid once per chain. A chain ends
        early at the end of an epoch and wherever a trigger (end, validation, checkpoint)
        fires; it is one iteration long with global-norm clipping or a trigger that reads the
        training loss (``MinLoss``). Progress and summaries arrive a chain at a time.
    update : {"sharded", "replicated"}
        How the summed gradient becomes new weights. ``"sharded"`` (BigDL's AllReduce, the
        default): partition ``j`` receives slice ``j`` of every gradient, steps that slice
        with the optimizer state it alone keeps (1/N of it) and sends it back to every
        replica — two stages per iteration. ``"replicated"`` (PyTorch DDP's way): every
        partition receives every whole gradient and steps the whole vector with its own
        copy of the optimizer state — one stage per iteration, N times the shuffle bytes
        and the optimizer state; for small models, where Spark's per-stage cost dominates
        (bench/RESULTS.md). Both give the same weights; checkpoints have the same layout.
    seed : int
        Fixes every partition's per-epoch permutation and the replicas' dropout streams.
    shuffle : bool
        Shuffle each partition per epoch (default) or read it in order.
    device : {"cpu", "gpu", "auto"}
        Where the replicas run: ``"gpu"`` binds each task to the GPU Spark assigned it
        (``TaskContext.resources()["gpu"]``, see ``conf/spark-gpu.conf``) and fails clearly
        without one; ``"auto"`` uses it when there is one. Updates run on the owners' CPUs.
    skip_nonfinite_batches, progress
        As for ``LocalOptimizer``.
    spark : SparkSession, optional
        Default: ``bigdl_py.spark.get_spark()`` (the active session, or a new local one).

    Examples
    --------
    >>> rdd = sc.parallelize(samples)                       # Samples, on the cluster
    >>> optimizer = DistriOptimizer(model, rdd, nn.NLLLoss(), SGD(lr=0.05, momentum=0.9),
    ...                             batch_size=128, end_trigger=MaxEpoch(3))
    >>> optimizer.set_validation(EveryEpoch(), test_set, [Top1Accuracy()])
    >>> trained = optimizer.optimize()
    """

    def __init__(
        self,
        model: Module,
        training_set: Any,
        criterion: Any,
        optim_method: OptimMethod,
        batch_size: int | None = None,
        end_trigger: Trigger | None = None,
        *,
        num_partitions: int | None = None,
        feature_cols: Any = "features",
        label_col: str = "label",
        feature_shape: Any = None,
        wire_dtype: str | None = None,
        gradient_accumulation: int = 1,
        iterations_per_job: int | None = None,
        update: str = "sharded",
        seed: int = 0,
        shuffle: bool = True,
        device: str = "cpu",
        skip_nonfinite_batches: bool = False,
        progress: bool | Progress = True,
        spark: Any = None,
    ):
        from bigdl_py.spark import wire
        from bigdl_py.spark.session import get_spark, partition_count

        if batch_size is None:
            batch_size = getattr(training_set, "batch_size", None)
        if isinstance(gradient_accumulation, bool) or int(gradient_accumulation) < 1:
            raise ValueError(
                f"gradient_accumulation must be a positive integer, got {gradient_accumulation!r}"
            )
        if iterations_per_job is not None and (
            isinstance(iterations_per_job, bool)
            or not isinstance(iterations_per_job, numbers.Integral)
            or not 1 <= iterations_per_job <= MAX_ITERATIONS_PER_JOB
        ):
            raise ValueError(
                f"iterations_per_job must be an integer from 1 to {MAX_ITERATIONS_PER_JOB}, "
                f"got {iterations_per_job!r}"
            )
        if update not in ("sharded", "replicated"):
            raise ValueError(f'update must be "sharded" or "replicated", got {update!r}')
        wire_dtype = wire.check_wire_dtype(wire_dtype)
        from bigdl_py.spark.gpu import check_device_request

        device = check_device_request(device)
        spark = spark or get_spark()
        sc = spark.sparkContext
        num_partitions = partition_count(sc, num_partitions)
        self._sc = sc
        self._dataframe_reading = {
            "feature_cols": feature_cols,
            "label_col": label_col,
            "feature_shape": feature_shape,
        }
        rdd, sources = training_rdd(
            training_set, sc, num_partitions, feature_cols, label_col, feature_shape
        )
        super().__init__(
            model,
            None,
            criterion,
            optim_method,
            end_trigger,
            batch_size,
            SparkRunner(
                {
                    "wire_dtype": wire_dtype,
                    "gradient_accumulation": int(gradient_accumulation),
                    "device": device,
                    "iterations_per_job": iterations_per_job,
                    "update": update,
                }
            ),
            skip_nonfinite_batches=skip_nonfinite_batches,
            progress=progress,
        )
        self.data = PartitionedData(sc, rdd, num_partitions, sources=sources)
        if iterations_per_job is None:  # the executors are known now (the data is on them)
            from bigdl_py.spark.session import executors_share_a_disk

            shared = executors_share_a_disk(sc)
            self.runner.options["iterations_per_job"] = DEFAULT_ITERATIONS_PER_JOB if shared else 1
        try:
            self.training_set = SparkTrainingSet(self.data, self.batch_size, seed, shuffle)
        except ValueError:
            self.data.close()
            raise
        self.num_partitions = num_partitions

    def _check_batch_size(self, batch_size: Any) -> int:
        if batch_size is None:
            raise ValueError("batch_size is required for distributed training (the global batch)")
        return super()._check_batch_size(batch_size)

    def _as_validation_set(self, dataset: Any) -> Any:
        if _is_rdd(dataset) or _is_dataframe(dataset):
            reading = self._dataframe_reading if _is_dataframe(dataset) else {}
            return SparkValidationSet(dataset, reading)
        return batch_io.as_array_dataset(dataset, "validation dataset", shuffle=False, train=False)

    def _dataset_fingerprint(self) -> dict:
        return {
            "size": len(self.training_set),
            "batch_size": self.batch_size,
            "seed": self.training_set.seed,
            "shuffle": self.training_set.shuffle,
            "partition_sizes": list(self.data.sizes),
        }

    def local_reference_dataset(self, features, labels) -> PlannedDataset:
        """An ArrayDataset that gives a ``LocalOptimizer`` this run's global batches.

        ``features``/``labels`` must be the training data in partition order (partition 0's
        samples first), as ``rdd.glom().collect()`` would list them.
        """
        return PlannedDataset(features, labels, self.training_set.plan)

    @property
    def last_iteration_timings(self) -> dict[str, float]:
        """Where the last iteration's time went (seconds), for benchmarks and logs."""
        return self.runner.last_timings

    def close(self) -> None:
        """Unpersist the cached training data and delete its files on the executors."""
        self.data.close()

    def __enter__(self) -> DistriOptimizer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
