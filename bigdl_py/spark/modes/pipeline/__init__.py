"""``update=Pipeline(stages=K, micro_batches=M)``: pipeline (model) parallelism over Spark
stages, GPipe's synchronous schedule, exact.

Every other mode is data-parallel: each partition holds the whole model, so the largest
model is one executor's memory. A pipeline cuts an ``nn.Sequential`` (or a graph ``Model``
with a single chain of cut points) into ``K`` contiguous stages (``cut.py``); partition ``k``
holds stage ``k``'s layers, their slice of the weights and its optimizer state only (on its
GPU where the executor has one). One iteration is ONE Spark job of GPipe's ticks
(``schedule.py``): the global batch runs as ``M`` micro-batches, each stage's outputs and
their gradients cross to the neighbouring stage through Spark's shuffle, gradients add up
over the micro-batches, and each stage steps its own slice with the one owner step every
mode uses (``ticks.py``). ``replicas=R`` runs ``R`` pipelines side by side (``N = K x R``
partitions: ``layout.py``) whose stages' gradients are summed across the replicas.

The arithmetic is ``LocalOptimizer(micro_batches=R x M, seed=seed)`` on the same global
batches (``DistriOptimizer.local_reference_dataset``): BatchNorm normalises each
micro-batch by its own statistics and updates its running statistics once per micro-batch,
as GPipe does (a whole-batch BatchNorm would need every micro-batch's statistics before any
could go on; with ``replicas`` > 1 the running statistics are replica 0's, as the
data-parallel modes keep partition 0's), and dropout draws the local run's masks: every
random layer draws a micro-batch's masks from a stream keyed by the seed, the iteration,
the micro-batch and its position in the model, wherever it runs
(``bigdl_py.train.rng.keyed_random_streams``).

Spark gives a partition's successive ticks to whichever Python worker is free, so a tick
keeps nothing in its worker that a later one needs: the weights after each update and the
gradient summed over the micro-batches so far are files in the run's directory, which every
worker on the host maps (``stage_worker.py``). The pipeline therefore needs executors that
share a disk (local, local-cluster, one host, or ``BIGDL_PY_STATE_DIR`` on a shared file
system), as the one-task mode does.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.spark.modes import TrainingMode, whole_state
from bigdl_py.spark.modes.pipeline.cut import (
    balanced_bounds,
    buffer_names,
    check_cut,
    check_flat_order,
    forbidden_cuts,
    measure_unit_costs,
    model_units,
    module_positions,
    stage_modules,
)
from bigdl_py.spark.modes.pipeline.layout import PipelineLayout, single_input
from bigdl_py.spark.modes.pipeline.schedule import TickPlan
from bigdl_py.spark.modes.pipeline.stage_worker import parameter_shapes, pickled_without_weights
from bigdl_py.spark.modes.pipeline.ticks import DriverStart, PipelineReport, build_ticks
from bigdl_py.spark.records import ChainResult

__all__ = ["MAX_TICKS_PER_JOB", "Pipeline"]

logger = logging.getLogger("bigdl_py.spark")

#: A job's Spark stages (ticks) at most: the driver JVM walks a job's lineage recursively,
#: and the other modes keep to 64 stages (32 iterations of two) for that reason.
MAX_TICKS_PER_JOB = 64


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Pipeline: {name} must be a positive integer, got {value!r}")
    return value


class Pipeline(TrainingMode):
    """GPipe over Spark: ``stages`` stages of the model, ``micro_batches`` per batch.

    Parameters
    ----------
    stages : int
        ``K``: contiguous pieces of the model, one per partition of a pipeline.
    micro_batches : int
        ``M``: the pieces each pipeline's share of the global batch runs as; ``R x M`` must
        divide ``batch_size``. GPipe's idle share of a stage's time is
        ``(K - 1) / (M + K - 1)``.
    replicas : int
        ``R``: pipelines side by side, each on ``1 / R`` of every global batch (``K x R``
        partitions: ``num_partitions`` must be that or None).
    split : sequence of int, optional
        The cut points: the positions (among the ``nn.Sequential``'s children, or a graph
        model's chain segments) where stages ``1 .. K - 1`` start. Default: balanced by
        the layers' parameter bytes and their forward-backward time measured on a
        micro-batch of the training data (the largest stage share of either is made as
        small as it can be).
    recompute : bool
        GPipe's re-materialisation: keep only each stage's input per micro-batch and run
        its forward again in the backward — a micro-batch's activations in memory at a time
        instead of ``M``, for one more forward; the same results. Without it a forward's
        graph waits in its Python worker and serves the backward that lands in that worker;
        a backward in another worker runs the forward again all the same.

    Examples
    --------
    >>> DistriOptimizer(model, data, nn.CrossEntropyLoss(), Adam(1e-3), batch_size=256,
    ...                 update=Pipeline(stages=4, micro_batches=8))
    """

    name = "pipeline"
    state_name = "pipeline"
    reads_driver_weights = False  # each stage is shipped its slice (run())

    def __init__(
        self,
        stages: int = 2,
        micro_batches: int = 1,
        replicas: int = 1,
        split: Sequence[int] | None = None,
        recompute: bool = False,
    ):
        self.stages = _positive_int(stages, "stages")
        self.micro_batches = _positive_int(micro_batches, "micro_batches")
        self.replicas = _positive_int(replicas, "replicas")
        if split is not None:
            split = tuple(_positive_int(point, "every split point") for point in split)
        self.split = split
        if not isinstance(recompute, bool):
            raise ValueError(f"Pipeline: recompute must be True or False, got {recompute!r}")
        self.recompute = recompute
        self.layout: PipelineLayout | None = None  # made by prepare()
        self._driver_only()

    def _driver_only(self) -> None:
        """What stays on the driver: the executors get the mode inside the run spec."""
        self.last_reports: list[PipelineReport] = []  # the last job's, for benchmarks
        self._broadcasts: list = []
        self._model = None  # the driver's model, whose statistics a run's first job reads

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in ("last_reports", "_broadcasts", "_model"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._driver_only()

    @property
    def partitions(self) -> int:
        return self.stages * self.replicas

    # --- before any data is cached ----------------------------------------------------------
    def check_training(self, model: Any, batch_size: int, num_partitions: int | None) -> int:
        """The model can be cut into ``stages``, ``R x M`` divides the batch, and the
        partitions are ``K x R``: that count.

        Raises
        ------
        ValueError
            Naming the problem: a model that is no chain, fewer layers than stages, a bad
            ``split``, a batch the micro-batches do not divide, another partition count.
        """
        check_cut(model_units(model), self.stages, self.split)
        pieces = self.replicas * self.micro_batches
        if batch_size % pieces:
            raise ValueError(
                f"Pipeline: batch_size {batch_size} is not a multiple of replicas x "
                f"micro_batches = {self.replicas} x {self.micro_batches}: every replica runs "
                f"batch_size / {self.replicas} samples as {self.micro_batches} equal micro-batches"
            )
        if num_partitions is not None and num_partitions != self.partitions:
            raise ValueError(
                f"Pipeline(stages={self.stages}, replicas={self.replicas}) trains on "
                f"{self.partitions} partitions (one a stage of each replica), got "
                f"num_partitions={num_partitions}; leave num_partitions out"
            )
        return self.partitions

    # --- on the driver, once per optimize() --------------------------------------------------
    def prepare(self, spec: Any, setup: Any) -> Any:
        """Cut the model (measuring its layers when no ``split`` is given), ship each stage's
        layers to its partitions only, and return the run spec without the whole model.

        Raises
        ------
        ValueError
            When the executors share no disk, there are more partitions than task slots on
            a cluster, or ``gradient_accumulation`` is set (the micro-batches are that).
        """
        from bigdl_py.spark.session import task_slots

        data = setup.training_set.data
        executors = setup.training_set.executors
        sc = data.sc
        if not executors.shared_disk:
            raise ValueError(
                "Pipeline needs executors that share a disk (the stages keep what a rebuilt "
                "task reads in the run's directory): set BIGDL_PY_STATE_DIR, in "
                "spark.executorEnv.BIGDL_PY_STATE_DIR and the driver's environment, to a "
                "directory every executor shares"
            )
        if spec.gradient_accumulation != 1:
            raise ValueError(
                "Pipeline runs each batch as micro_batches already; leave "
                f"gradient_accumulation at 1 (got {spec.gradient_accumulation})"
            )
        slots = task_slots(sc)
        if self.partitions > slots:
            message = (
                f"Pipeline(stages={self.stages}, replicas={self.replicas}) needs "
                f"{self.partitions} task slots, one a stage, and the cluster has {slots}"
            )
            if not executors.local_mode:
                raise ValueError(message + "; add executors or use fewer stages or replicas")
            # One process: the stages share its memory whatever runs when; their ticks run
            # in turns instead of side by side.
            logger.warning("%s: the stages' tasks take turns (local mode)", message)
        model = self._model = setup.model
        units = model_units(model)
        bounds = check_cut(units, self.stages, self.split)
        if not bounds:
            bounds = self._balanced(units, data, setup.batch_size)
        stages = self.plan(model, setup.batch_size, spec.l2_clipping is not None, bounds)
        self.release()
        # Each stage's layers without their weights: the tasks bind them to the slices.
        self._broadcasts = [sc.broadcast(pickled_without_weights(stage)) for stage in stages]
        offsets = self.layout.offsets
        sizes = [offsets[k + 1] - offsets[k] for k in range(self.stages)]
        logger.info(
            "Pipeline: %d stages of layers %s, %s parameters; %d micro-batches of %d samples",
            self.stages,
            [f"{a}-{b - 1}" for a, b in zip(bounds, bounds[1:], strict=False)],
            sizes,
            self.micro_batches,
            self.layout.micro_batch_size,
        )
        return dataclasses.replace(spec, model=None)

    def plan(
        self, model: Any, batch_size: int, clipping_by_norm: bool, bounds: Sequence[int]
    ) -> list:
        """Lay the run out for ``model`` cut at unit ``bounds``: :attr:`layout`; returns the
        stages' modules (made of the model's own layers) for the driver to ship."""
        stages = stage_modules(model_units(model), bounds)
        offsets = check_flat_order(model, stages)
        self.layout = PipelineLayout(
            stages=self.stages,
            replicas=self.replicas,
            micro_batches=self.micro_batches,
            batch_size=batch_size,
            dtype=str(next(model.parameters()).data.dtype),
            offsets=tuple(offsets),
            unit_bounds=tuple(bounds),
            recompute=self.recompute,
            plan=TickPlan(self.stages, self.micro_batches, clipping_by_norm),
            parameter_shapes=tuple(parameter_shapes(stage) for stage in stages),
            positions=tuple(tuple(module_positions(model, stage)) for stage in stages),
            buffer_names=tuple(buffer_names(model, stage) for stage in stages),
        )
        return stages

    def _balanced(self, units: list, data: Any, batch_size: int) -> list[int]:
        """Bounds balanced by bytes and time measured on a micro-batch of partition 0."""
        if self.stages == 1:
            return [0, len(units)]
        rows = batch_size // (self.replicas * self.micro_batches)
        sample = _first_rows(data, rows)
        costs = measure_unit_costs(units, sample)
        return balanced_bounds(costs, self.stages, forbidden_cuts(units))

    def release(self) -> None:
        for broadcast in self._broadcasts:
            broadcast.destroy()
        self._broadcasts = []

    # --- the driver's side of the contract -----------------------------------------------------
    def iterations_per_call(self, requested: int, spec: Any) -> int:
        per_iteration = self.layout.plan.iteration_ticks
        return max(1, min(requested, (MAX_TICKS_PER_JOB - 1) // per_iteration))

    def build_chain(self, chain: Any) -> Any:
        """The chain's job; the stages' slices come from ``chain.get_weights``. (:meth:`run`
        ships each stage its own slice instead, and the driver none of the whole.)"""
        if chain.get_weights is None:
            raise RuntimeError(
                "a Pipeline ships its stages' slices itself: run its chains with run()"
            )
        get = chain.get_weights
        weights = tuple(
            (lambda start=start, stop=stop: get()[start:stop])
            for start, stop in zip(self.layout.offsets, self.layout.offsets[1:], strict=False)
        )
        return build_ticks(chain, self.layout.plan, self._start(weights, chain))

    def run(self, run: Any, chain: Any, description: str) -> list[dict]:
        """The chain's job, each stage shipped only its slice of the driver's weights."""
        offsets = self.layout.offsets
        weights = tuple(
            run.ship(run.weights[start:stop])
            for start, stop in zip(offsets, offsets[1:], strict=False)
        )
        rdd = build_ticks(chain, self.layout.plan, self._start(weights, chain))
        first, count = chain.first, chain.count
        what = f"iteration {first + 1}" if count == 1 else f"iterations {first + 1}-{first + count}"
        submitted = time.time()
        rows = run.collect(rdd, description, what)
        self.last_reports = sorted(
            (row for row in rows if isinstance(row, PipelineReport)), key=lambda r: r.partition
        )
        results = [row for row in rows if isinstance(row, ChainResult)]
        return run.finish_chain(results, chain, submitted, time.time())

    def _start(self, weights: tuple, chain: Any) -> DriverStart:
        buffers = chain.buffers
        if buffers is None and self._model is not None:
            # A run's first job: the model's own statistics (a resume has just loaded them;
            # the stages' shipped layers hold those of when the model was cut).
            buffers = {
                name: np.array(backend.as_numpy(value.data))
                for name, value in self._model.named_buffers()
            }
        return DriverStart(weights, buffers or None, tuple(self._broadcasts))

    # --- optimizer state: stage k's slice, each partition of the stage a piece of it ------------
    def resume_states(self, shards: list[dict], flat_size: int, count: int) -> list[dict]:
        whole = whole_state(shards, flat_size)
        return [self._stage_state(whole, partition) for partition in range(count)]

    def _stage_state(self, whole: dict, partition: int) -> dict:
        start, stop = self.layout.stage_bounds(self.layout.stage_of(partition))
        return {key: _cut(value, start, stop) for key, value in whole.items()}

    def checkpoint_state(self, state: dict, partition: int, bounds: list) -> dict:
        low, high = self.layout.sub_slice(partition)
        return {key: _cut(value, low, high) for key, value in state.items()}

    def __repr__(self) -> str:
        return (
            f"Pipeline(stages={self.stages}, micro_batches={self.micro_batches}, "
            f"replicas={self.replicas}, split={self.split}, recompute={self.recompute})"
        )

    def settings_name(self) -> str:
        """The name with settings that ``resolve_mode`` turns back into this pipeline (how
        the Spark ML ``updateMode`` param keeps it).

        Raises
        ------
        ValueError
            With ``split`` or ``recompute`` set: a name carries the three counts only.
        """
        if self.split is not None or self.recompute:
            raise ValueError(
                "a Pipeline with split= or recompute= has no name with settings; its name "
                "keeps stages, micro_batches and replicas only"
            )
        return f"pipeline:{self.stages}:{self.micro_batches}:{self.replicas}"


def _cut(value: Any, start: int, stop: int) -> Any:
    """A per-element state array's ``[start:stop]``; scalars (step counts) as they are."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return np.array(value[start:stop])
    return value


def _first_rows(data: Any, count: int):
    """Up to ``count`` rows of partition 0's features, from its executor (one small job)."""
    from bigdl_py.spark.partitioned_data import load_partition_data

    def read(rows):
        for handle in rows:
            features, _ = load_partition_data(handle)
            yield single_input(features)[:count].copy()

    (sample,) = data.sc.runJob(data.handles, read, [0])
    return sample
