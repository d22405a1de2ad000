"""``DistriOptimizer``: synchronous data-parallel training on Spark, BigDL's way.

It is the training loop of :class:`~bigdl_py.train.loop.BaseOptimizer` — the same triggers,
validation, checkpoints, summaries, clipping and progress as ``LocalOptimizer`` — with a
runner that does the iterations on the executors, a Spark job per chain of them
(``training_run.py``): N model replicas next to N data partitions (``partitioned_data.py``,
``replica.py``), the gradient AllReduce through Spark's shuffle, and the update as the
training mode does it (``modes/``: sharded, replicated, local SGD; ``owner_update.py``).

The mathematics is single-process SGD on the global batch: iteration ``t``'s global batch is
partition ``j``'s share ``b_j`` (``batch_size`` split N ways, shares differing by at most one)
drawn from partition ``j``'s own per-epoch permutation (:class:`PartitionedBatchPlan`); the
gradient is that of the batch's mean loss, each share weighted by its real sample count. A
``LocalOptimizer`` over :meth:`DistriOptimizer.local_reference_dataset` sees the same
batches, and the tests hold the two to float tolerance.
"""

from __future__ import annotations

import copy
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from bigdl_py.data.spark_types import is_dataframe, is_spark_data
from bigdl_py.nn.module import Module
from bigdl_py.optim import ConstantClipping, L2NormClipping, OptimMethod
from bigdl_py.optim.flat_parameters import FlatParameters
from bigdl_py.spark.batch_plan import PartitionedBatchPlan, PlannedDataset
from bigdl_py.spark.dataframe import prepare_training_input
from bigdl_py.spark.modes import TrainingMode, resolve_mode
from bigdl_py.spark.partitioned_data import (
    DistributedTrainingError,
    PartitionedData,
    prepare_training,
)
from bigdl_py.spark.replica import RunSpec
from bigdl_py.spark.settings import Executors, SparkTrainingSettings, plan_run
from bigdl_py.spark.training_run import SparkTrainingRun
from bigdl_py.train import batches as batch_io
from bigdl_py.train.loop import BaseOptimizer
from bigdl_py.train.metrics import ValidationMethod, ValidationResult
from bigdl_py.train.progress import Progress
from bigdl_py.train.runner import IterationResult, IterationRunner, IterationStep, TrainingSetup
from bigdl_py.train.triggers import Trigger

logger = logging.getLogger("bigdl_py.spark")

__all__ = ["DistriOptimizer", "DistributedTrainingError", "SparkTrainingSet", "SparkValidationSet"]

_SCHEDULE_KEYS = ("iteration", "epoch", "step")


class SparkTrainingSet:
    """The training data as the loop sees it: ``len()`` and every epoch's global batches.

    Wraps :class:`PartitionedData` (the partitions cached on the executors), the
    :class:`PartitionedBatchPlan` over their sizes, and what the executors that hold them
    are (:class:`~bigdl_py.spark.settings.Executors`).
    """

    def __init__(self, data: PartitionedData, plan: PartitionedBatchPlan, executors: Executors):
        self.data = data
        self.plan = plan
        self.executors = executors
        self.batch_size = plan.batch_size
        self.seed = plan.seed
        self.shuffle = plan.shuffle
        self.num_partitions = data.num_partitions

    def __len__(self) -> int:
        return self.plan.total

    def global_batch_indices(self, epoch: int, batch_size: int | None = None) -> list[np.ndarray]:
        """One entry per iteration of ``epoch``: the global sample indices of its batch."""
        return self.plan.epoch_global_indices(epoch)


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
    """Runs each iteration on Spark; the driver keeps the weights between iterations.

    ``settings`` are the caller's; what the executors are comes with the training set
    (``SparkTrainingSet.executors``), and :meth:`prepare` plans the run from both.
    """

    def __init__(self, settings: SparkTrainingSettings):
        self.settings = settings
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
        executors = training_set.executors
        run_plan = plan_run(
            self.settings,
            executors,
            parameter_bytes=int(self.flat.size) * self.flat.weights.dtype.itemsize,
            num_partitions=self.plan.num_partitions,
            global_norm_clipping=l2 is not None,
            share_bytes=self._share_bytes(training_set),
        )
        if run_plan.reason is not None:
            logger.info(run_plan.reason)
        self.mode = run_plan.mode
        self.spec = RunSpec(
            run_id="run-" + uuid.uuid4().hex[:12],
            model=setup.model,
            criterion=setup.criterion,
            optim_method=copy.deepcopy(setup.optim_method),
            num_partitions=training_set.num_partitions,
            flat_size=int(self.flat.size),
            batch_size=setup.batch_size,
            state_dir=training_set.data.state_dir,
            seed=training_set.seed,
            wire_dtype=self.settings.wire_dtype,
            constant_clipping=constant,
            l2_clipping=l2,
            gradient_accumulation=self.settings.gradient_accumulation,
            device=self.settings.device,
            mode=self.mode,
            # Where no disk is shared, the optimizer state travels with the jobs.
            carry_state=not executors.shared_disk,
            replicas_per_task=run_plan.replicas_per_task,
        )
        self.spec = self.mode.prepare(self.spec, setup)  # a pipeline cuts the model here
        self._resume_states = None
        self._pending_metric = None
        self.iterations_per_call = self.mode.iterations_per_call(
            run_plan.iterations_per_job, self.spec
        )

    def _share_bytes(self, training_set: SparkTrainingSet) -> int:
        """Bytes of the largest partition's share of a global batch."""
        handles = training_set.data.partition_handles
        sample_bytes = max(int(handle.get("sample_bytes", 0)) for handle in handles)
        return -(-self.plan.batch_size // self.plan.num_partitions) * sample_bytes

    def _ensure_run(self, iteration: int) -> SparkTrainingRun:
        if self.run is None:
            initial = None
            if self._resume_states is not None:
                initial = {"iteration": iteration, "shards": self._resume_states}
            self.run = SparkTrainingRun(
                self.setup.training_set.data, self.spec, np.asarray(self.flat.weights), initial
            )
        return self.run

    def _schedule(self, epoch: int, iteration: int) -> dict:
        schedule = {"iteration": iteration, "epoch": epoch}
        if self._pending_metric is not None:  # the first update after a validated epoch
            schedule["metric"] = self._pending_metric
            self._pending_metric = None
        return schedule

    def run_iteration(
        self, epoch: int, iteration: int, batch_index: int, indices: np.ndarray
    ) -> IterationResult:
        step = IterationStep(epoch, iteration, batch_index, indices)
        (result,) = self.run_iterations([step], stop_after_nonfinite=False)
        return result

    def run_iterations(
        self, steps: Sequence[IterationStep], stop_after_nonfinite: bool
    ) -> list[IterationResult]:
        first = steps[0].iteration
        steps = steps[: self.mode.steps_to_run(first, len(steps))]
        run = self._ensure_run(first)
        last = first + len(steps)
        what = f"iteration {first + 1}" if len(steps) == 1 else f"iterations {first + 1}-{last}"
        outcomes = run.run_chain(
            first,
            [self.plan.shares(self._plan_iteration(step)) for step in steps],
            [self._schedule(step.epoch, step.iteration) for step in steps],
            f"bigdl_py {what}: forward-backward + {self.mode.name} update",
            stop_after_nonfinite,
        )
        results = []
        for step, outcome in zip(steps, outcomes, strict=False):
            # The driver's copy of the optim method only keeps the schedule (learning rate
            # for summaries and progress); the partitions hold the per-element state.
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

    def _plan_iteration(self, step: IterationStep) -> int:
        """The batch plan's iteration of a loop step (its epoch's batch ``batch_index``)."""
        return step.epoch * self.plan.iterations_per_epoch + step.batch_index

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
            self.run.weights = np.array(self.flat.weights)
            # The run's buffers (BatchNorm statistics) go back into the model at sync_model:
            # they must be the loaded ones too (restore_best, resume).
            if self.run.buffers:
                self.run.buffers = {
                    name: np.array(state[name]) if name in state else value
                    for name, value in self.run.buffers.items()
                }

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
        # Another partition count, or another mode's layout: the mode re-cuts the state.
        shards = self.mode.resume_states(shards, int(self.flat.size), self.spec.num_partitions)
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
                device=self.settings.device,
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
        mode = getattr(self, "mode", None)
        if mode is not None:
            mode.release()


def _auto_whole_executor_cpus(settings: SparkTrainingSettings):
    """For ``update="auto"``: ``sc -> CPUs of a whole-executor task, or None`` (its rule:
    :func:`bigdl_py.spark.modes.auto.whole_executor_cpus`); None for a named mode."""
    if settings.update != "auto":
        return None

    def cpus(sc) -> int | None:
        from bigdl_py.spark.modes.auto import whole_executor_cpus
        from bigdl_py.spark.session import executor_layout, is_local_mode

        executors, cores = executor_layout(sc)
        task_cpus = int(sc.getConf().get("spark.task.cpus", "1"))
        return whole_executor_cpus(executors, cores, task_cpus, is_local_mode(sc), settings.device)

    return cpus


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
        slots, ``bigdl_py.spark.task_slots``; with ``update="auto"`` on executors of several
        cores, one per executor: see ``update``).
    feature_cols, label_col, feature_shape
        For a DataFrame (see ``bigdl_py.spark.dataframe.dataframe_to_partition_arrays``).
    wire_dtype : None, "float16" or "bfloat16"
        Gradient slices travel through the shuffle in this precision (summed in float32).
    gradient_accumulation : int
        Each update runs ``batch_size`` in this many micro-batches per partition whose
        gradients add up: the same update as one batch of ``batch_size``, with the memory of
        a ``batch_size / gradient_accumulation`` batch.
    iterations_per_job : int, optional
        Iterations chained into one Spark job (1 to ``MAX_ITERATIONS_PER_JOB``, 32; default: as
        ``update="auto"`` picks it, else ``DEFAULT_ITERATIONS_PER_JOB`` (8)): each
        iteration stays two stages with the same AllReduce, but the weights pass from one
        iteration's owners to the next iteration's replicas through a shuffle instead of
        the driver, and Spark's fixed cost of a job is paid once per chain. A chain ends
        early at the end of an epoch and wherever a trigger (end, validation, checkpoint)
        fires; it is one iteration long with global-norm clipping or a trigger that reads the
        training loss (``MinLoss``). Progress and summaries arrive a chain at a time.
        Where the executors share no disk (hosts of their own, no shared
        ``BIGDL_PY_STATE_DIR``: ``session.executors_share_a_disk``) a chained stage may run
        on another host than its partition's files, so the chain's first stage gathers each
        partition's rows of the later iterations and they travel from stage to stage with
        its optimizer state (``records.Own``); the default chain is then at most what 16 MB
        of rows allow (``records.iterations_with_carried_rows``: 81 iterations of LeNet-5 at
        batch 128 on 2 partitions, 1 for ImageNet-sized images), and each job's last update
        returns the optimizer state, which the driver ships to the next job.
    update : {"auto", "sharded", "replicated", "local-sgd", "one-task", "pipeline"} or a mode object
        How the partitions' gradients become new weights (one file per mode in
        :mod:`bigdl_py.spark.modes`). ``"sharded"`` (BigDL's AllReduce): partition ``j``
        receives slice ``j`` of every gradient, steps that slice with the optimizer state
        it alone keeps (1/N of it) and sends it back to every replica — two stages per
        iteration. ``"replicated"`` (PyTorch DDP's way): every partition receives every
        whole gradient and steps the whole vector with its own copy of the optimizer state
        — one stage per iteration, N times the shuffle bytes and the optimizer state. Both
        give the same weights; checkpoints have the same layout. ``"one-task"``: the
        replicated update's arithmetic in ONE Spark task per job of 128 or more iterations
        (64 above 1 MB of parameters, 4 above 16 MB, whose iterations take seconds),
        which reads every partition's data and trains the shares at once, a replica per
        core, in the task and in child processes it forks (executors sharing a disk
        only). ``"auto"`` (the default) picks one-task in local mode (``local[n]``: one
        machine, where a stage per iteration buys no parallelism that one process and its
        children do not); elsewhere one of sharded and replicated and the
        iterations per job; it logs its choice once at the start (logger
        ``bigdl_py.spark``): **replicated with 16 iterations per job while N x parameter
        bytes <= 16 MB, else sharded with 1** — a given ``iterations_per_job`` is kept —
        and, on executors of several cores, **one task per executor** (one partition each,
        its share trained on a replica per core: the task's own and forked helpers, asked
        for with stage-level scheduling), so one gradient per executor enters the
        AllReduce (``num_partitions`` left to auto). The
        rule comes from bench/RESULTS.md (LeNet-5, 89 KB: replicated 1.6-1.8x faster at
        batch 128; the CIFAR CNN, 4.5 MB: the two within noise; the shuffle's cost grows
        past 16 MB per receiver); :mod:`bigdl_py.spark.modes.auto` gives the numbers.
        ``Pipeline(stages=K, micro_batches=M, replicas=R)`` (``"pipeline:K:M:R"``) is model
        parallelism: the model is cut into ``K`` stages, partition ``k`` holds stage ``k``'s
        layers and their optimizer state only, and each iteration is GPipe's schedule in one
        Spark job (:class:`bigdl_py.spark.Pipeline`; ``num_partitions`` is ``K x R``).
        ``LocalSGD(period=k, warmup_iterations=w)`` (``"local-sgd"``: ``k = 8``, ``w = 0``)
        is not exact: after ``w`` synchronous iterations every partition trains its own
        replica for ``k`` iterations, then the replicas are averaged — one Spark stage per
        ``k`` iterations (:class:`bigdl_py.spark.LocalSGD` says what happens to the
        optimizer state and the learning-rate schedule).
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
        update: str | TrainingMode = "auto",
        seed: int = 0,
        shuffle: bool = True,
        device: str = "cpu",
        skip_nonfinite_batches: bool = False,
        progress: bool | Progress = True,
        spark: Any = None,
    ):
        if batch_size is None:
            batch_size = getattr(training_set, "batch_size", None)
        settings = SparkTrainingSettings(
            update=update,
            wire_dtype=wire_dtype,
            gradient_accumulation=gradient_accumulation,
            iterations_per_job=iterations_per_job,
            device=device,
        )
        self._dataframe_reading = {
            "feature_cols": feature_cols,
            "label_col": label_col,
            "feature_shape": feature_shape,
        }
        runner = SparkRunner(settings)
        super().__init__(
            model,
            None,
            criterion,
            optim_method,
            end_trigger,
            batch_size,
            runner,
            skip_nonfinite_batches=skip_nonfinite_batches,
            progress=progress,
        )

        if not (isinstance(update, str) and update == "auto"):
            # A mode that depends on the model (the pipeline) checks it before data is cached.
            num_partitions = resolve_mode(update).check_training(
                model, self.batch_size, num_partitions
            )

        def check_input(data, sc, num_partitions):
            return prepare_training_input(
                data, sc, num_partitions, model, criterion, **self._dataframe_reading
            )

        sc, self.data, plan = prepare_training(
            training_set,
            self.batch_size,
            num_partitions=num_partitions,
            seed=seed,
            shuffle=shuffle,
            spark=spark,
            check_input=check_input,
            whole_executor_cpus=_auto_whole_executor_cpus(settings),
            **self._dataframe_reading,
        )
        self._sc = sc
        # What the executors are is known now (the data is on them).
        executors = Executors.of(sc, whole_executor_cpus=self.data.task_cpus)
        self.training_set = SparkTrainingSet(self.data, plan, executors)
        self.num_partitions = self.data.num_partitions

    def _check_batch_size(self, batch_size: Any) -> int:
        if batch_size is None:
            raise ValueError("batch_size is required for distributed training (the global batch)")
        return super()._check_batch_size(batch_size)

    def _as_validation_set(self, dataset: Any) -> Any:
        if is_spark_data(dataset):
            reading = self._dataframe_reading if is_dataframe(dataset) else {}
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
