"""A pipeline's ticks run in this process, partition after partition, each tick's records
handed to the next as Spark's shuffle hands them (not a test module).

It runs the tasks of every tick of ``modes/pipeline/ticks.py`` exactly as the executors do
(``stage_task`` and all), without Spark: the schedule, the stage workers and their
rebuilds can be checked on many settings in seconds, and with ``forget=True`` every task
finds an empty worker cache, as one that another Python worker ran before would (the
path where a forward's graph is in another worker), and with ``lose_sums=True`` every
tick finds the gradient sums of the ticks before it gone (the path of a tick Spark runs
again after losing an executor). The Spark runs of ``test_pipeline_training.py`` check the
rest.
"""

from __future__ import annotations

import copy
import glob
import os
import uuid
from typing import Any, NamedTuple

import numpy as np

from bigdl_py.optim import FlatParameters
from bigdl_py.optim.sharding import all_slice_bounds
from bigdl_py.spark import worker
from bigdl_py.spark.batch_plan import PartitionedBatchPlan, PlannedDataset
from bigdl_py.spark.modes.pipeline.cut import (
    UnitCost,
    balanced_bounds,
    check_cut,
    forbidden_cuts,
    model_units,
)
from bigdl_py.spark.modes.pipeline.stage_worker import pickled_without_weights
from bigdl_py.spark.modes.pipeline.ticks import DriverStart, PipelineReport, _tick
from bigdl_py.spark.modes.stages import Stage, stage_task
from bigdl_py.spark.partitioned_data import run_directory, write_partition_data
from bigdl_py.spark.records import Chain, ChainResult
from bigdl_py.spark.replica import RunSpec


class _Broadcast(NamedTuple):
    """What a task reads of a Broadcast: its value."""

    value: Any


class Emulated(NamedTuple):
    weights: np.ndarray
    buffers: dict | None
    losses: list[float]
    reports: list[PipelineReport]
    plan: PartitionedBatchPlan


def run_ticks(
    model,
    features,
    labels,
    criterion,
    optim_method,
    pipeline,
    *,
    batch_size: int,
    iterations: int,
    state_dir: str,
    iterations_per_job: int = 4,
    seed: int = 0,
    constant_clipping=None,
    l2_clipping=None,
    wire_dtype=None,
    forget: bool = False,
    lose_sums: bool = False,
    device: str = "cpu",
) -> Emulated:
    """Train ``model`` (left untouched) for ``iterations`` with ``pipeline``'s ticks."""
    model = copy.deepcopy(model)
    units = model_units(model)
    bounds = check_cut(units, pipeline.stages, pipeline.split)
    if not bounds:  # balanced by bytes alone: a deterministic cut
        costs = [UnitCost(sum(p.data.nbytes for p in u.parameters()), 0.0) for u in units]
        bounds = balanced_bounds(costs, pipeline.stages, forbidden_cuts(units))
    stages = pipeline.plan(model, batch_size, l2_clipping is not None, bounds)
    count = pipeline.partitions
    directory = run_directory(state_dir, "data-" + uuid.uuid4().hex[:8])
    handles = {
        partition: write_partition_data(
            directory, partition, (features[start:stop],), labels[start:stop]
        )
        for partition, (start, stop) in enumerate(all_slice_bounds(len(labels), count))
    }
    plan = PartitionedBatchPlan([h["size"] for h in handles.values()], batch_size, seed=seed)
    weights = np.array(FlatParameters(model).weights)
    spec = RunSpec(
        run_id="emulated-" + uuid.uuid4().hex[:8],
        model=None,
        criterion=criterion,
        optim_method=copy.deepcopy(optim_method),
        num_partitions=count,
        flat_size=weights.size,
        batch_size=batch_size,
        state_dir=state_dir,
        seed=seed,
        wire_dtype=wire_dtype,
        constant_clipping=constant_clipping,
        l2_clipping=l2_clipping,
        mode=pipeline,
        device=device,
    )
    modules = tuple(_Broadcast(pickled_without_weights(stage)) for stage in stages)
    buffers, losses, reports = None, [], []
    per_job = pipeline.iterations_per_call(iterations_per_job, spec)
    for first in range(0, iterations, per_job):
        chain = Chain(
            first=first,
            shares=[plan.shares(i) for i in range(first, min(first + per_job, iterations))],
            schedules=[
                {"iteration": i, "epoch": plan.epoch_of(i)}
                for i in range(first, min(first + per_job, iterations))
            ],
            stop_after_nonfinite=False,
            num_partitions=count,
            bounds=pipeline.layout.partition_bounds(),
            load_spec=lambda: spec,
            get_weights=None,
            get_frozen=lambda: None,
            initial_states=None,
            handles=handles,
            data_rdd=None,
            buffers=buffers,
        )
        slices = tuple(
            _returning(weights[a:b].copy())
            for a, b in zip(pipeline.layout.offsets, pipeline.layout.offsets[1:], strict=False)
        )
        rows = _run_chain(
            chain, DriverStart(slices, buffers, modules), pipeline, forget, lose_sums, spec
        )
        results = sorted(
            (row for row in rows if isinstance(row, ChainResult)), key=lambda r: r.partition
        )
        reports = sorted(
            (row for row in rows if isinstance(row, PipelineReport)), key=lambda r: r.partition
        )
        weights = np.concatenate([np.asarray(result.weights) for result in results])
        buffers = results[0].buffers if results[0].buffers is not None else buffers
        losses += [entry.loss_sum / entry.count for entry in results[0].history]
    worker.release_run(spec.run_id)
    return Emulated(weights, buffers, losses, reports, plan)


def _returning(value):
    return lambda: value


def _run_chain(chain, start: DriverStart, pipeline, forget: bool, lose_sums: bool, spec) -> list:
    """Every tick's tasks in turn; the last tick's output."""
    plan = pipeline.layout.plan
    total = plan.chain_ticks(chain.count)
    inputs = {partition: [chain.handles[partition]] for partition in range(chain.num_partitions)}
    for tick in range(total):
        stage = Stage.of(chain, first_update=tick == plan.iteration_ticks, forward_backward=False)
        task = stage_task(stage, _tick(chain, stage, tick, start, plan.iteration_ticks))
        outputs = {partition: [] for partition in range(chain.num_partitions)}
        last = []
        for partition in range(chain.num_partitions):
            for item in task(partition, iter(inputs[partition])):
                if tick == total - 1:
                    last.append(item)
                else:
                    destination, _ = item
                    outputs[destination].append(item)
            if forget:  # the next task of any partition finds this worker empty
                worker.clear()
        if lose_sums:
            directory = run_directory(spec.state_dir, spec.run_id)
            for path in glob.glob(os.path.join(directory, "pipeline-accumulated-*")):
                os.remove(path)
        inputs = outputs
    return last


def local_reference(model, features, labels, criterion, optim_method, emulated, pipeline, **kw):
    """``LocalOptimizer(micro_batches=R x M, seed=0)`` on the same global batches."""
    from bigdl_py.train import LocalOptimizer, MaxIteration

    optimizer = LocalOptimizer(
        copy.deepcopy(model),
        PlannedDataset(features, labels, emulated.plan),
        criterion,
        copy.deepcopy(optim_method),
        batch_size=emulated.plan.batch_size,
        end_trigger=MaxIteration(kw.pop("iterations")),
        progress=False,
        micro_batches=pipeline.replicas * pipeline.micro_batches,
        seed=kw.pop("seed", 0),
    )
    for clipping in kw.pop("clippings", ()):
        clipping(optimizer)
    return optimizer.optimize()
