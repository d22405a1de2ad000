"""A chain's stages: the one way a stage reads its input, and the one way a chain ends.

A mode builds a job (:meth:`TrainingMode.build_chain`) as Spark stages joined by shuffles
(``chain.shuffle``: ``collectives.shuffle_to_owners``). Each stage is
``rdd.mapPartitionsWithIndex(stage_task(stage, body))``, and every stage task

1. **opens** the same way (:func:`stage_task`): it loads the run spec, reads its input to the
   end, finds its partition's data handle and, in the chain's first stage (whose input is
   the cached handles RDD, so Spark runs it where the partition's files are), starts from
   the driver's weights and running statistics (:attr:`StageInput.carried`); a later
   stage's input is the records the stage before sent to its partition
   (:attr:`StageInput.rows`), which the mode reads with the reader of their kind:
   :func:`receive_gradients` for :class:`~bigdl_py.spark.records.GradientRecord`\\ s, or its
   own;
2. runs the mode's ``body(inp)``, which yields ``(destination partition, record)`` pairs
   for the next shuffle;
3. in the chain's last stage, **ends** the same way: partition ``j`` yields one
   :func:`chain_end` result — slice ``j`` of the weights, partition 0's history and running
   statistics, the timings, its optimizer state where it travels — and nothing else.

**Where the executors share no disk** (``chain.own_travels``) a stage that reads a shuffle
may run on any host, away from its partition's files. So the chain's first stage also
gathers the partition's rows of the chain's later iterations, and every stage but the
last hands the next one, in a record to its own partition, what the partition keeps
(:class:`~bigdl_py.spark.records.Own`: its optimizer state after the stage's update, the
rows still to train). :func:`stage_task` sends and reads that record; the mode sees it as
:attr:`StageInput.own`, which the exact pieces below read, and says what each stage does
(``Stage.of(..., trains=..., updates=..., last=...)``) so that it can be handed on.

:class:`Stage` is what a stage's tasks know of their chain (never the chain's RDD; the
driver's weights and a resume's optimizer state only in the stage that reads them).
The exact modes' pieces sit here too: :func:`partition_gradient` (a forward-backward on the
share of the global batch) and, on the updating side, :func:`receive_gradients`,
:func:`update_received` (the owner step on them) and :func:`after_update`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from bigdl_py.spark import collectives
from bigdl_py.spark.modes.replica_process import (
    forward_backward_on_replicas,
    processes_available,
)
from bigdl_py.spark.owner_update import (
    finishing_state_writes,
    own_state,
    stops_chain,
    update_owned,
)
from bigdl_py.spark.partitioned_data import drain, load_partition_data
from bigdl_py.spark.records import (
    Carried,
    Chain,
    ChainResult,
    HistoryEntry,
    Own,
    Report,
    ShareRows,
    StageTimings,
    start_of_chain,
)
from bigdl_py.spark.replica import forward_backward, replica_gradient


@dataclass(frozen=True)
class Stage:
    """What the tasks of one stage of a chain know: plain values and small callables.

    A task's closure is pickled into every task of its stage, so it holds no RDD, and the
    driver's weights (``driver_weights``) and a resume's optimizer state
    (``resumed_states``) only in the stage that reads them.
    """

    first: int  # the chain's first iteration
    count: int  # its iterations
    num_partitions: int
    bounds: list  # slice j of the flat vector: bounds[j] = (start, stop)
    load_spec: Callable
    handles: dict  # partition -> its data handle
    get_frozen: Callable  # the frozen parameters' values (None when the whole model trains)
    stop_after_nonfinite: bool
    retain_from: int  # the state files from here on stay until the job ends
    driver_weights: Callable | None = None  # the chain's first stage only
    driver_buffers: dict | None = None  # (the driver's running statistics, with them)
    resumed_states: dict | None = None  # the chain's first update only
    # What the stage does, for what it hands on where the executors share no disk: the
    # iterations it runs forward-backward for, the one it updates, whether it ends the chain.
    trains: tuple[int, ...] = ()
    updates: int | None = None
    last: bool = False
    # The chain's first stage, where rows travel: the shares (of every partition) of the
    # iterations after those it trains, from iteration ``later_first`` on.
    later_shares: tuple = ()
    later_first: int = 0

    @classmethod
    def of(
        cls,
        chain: Chain,
        *,
        reads_driver: bool = False,
        first_update: bool = False,
        forward_backward: bool = True,
        trains: Iterable[int] = (),
        updates: int | None = None,
        last: bool = False,
    ) -> Stage:
        """A stage of ``chain``: the one that starts from the driver's weights
        (``reads_driver``: its input is the cached handles RDD) and/or makes the chain's
        first update (which alone reads a resume's optimizer state); it runs the
        forward-backward of iterations ``trains``, makes the update of iteration
        ``updates``, and, when ``last``, ends the chain. A stage that runs no
        forward-backward is not handed the frozen parameters' values (up to a couple of MB
        in each task's closure)."""
        trains = tuple(trains)
        later_first = trains[-1] + 1 if trains else chain.first
        travelling = reads_driver and chain.own_travels
        return cls(
            first=chain.first,
            count=chain.count,
            num_partitions=chain.num_partitions,
            bounds=chain.bounds,
            load_spec=chain.load_spec,
            handles=chain.handles,
            get_frozen=chain.get_frozen if forward_backward else _no_frozen_weights,
            stop_after_nonfinite=chain.stop_after_nonfinite,
            retain_from=chain.retain_from,
            driver_weights=chain.get_weights if reads_driver else None,
            driver_buffers=chain.buffers if reads_driver else None,
            resumed_states=chain.initial_states if first_update else None,
            trains=trains,
            updates=updates,
            last=last,
            later_shares=tuple(chain.shares[later_first - chain.first :]) if travelling else (),
            later_first=later_first,
        )

    def start(self) -> Carried:
        """What the chain starts from: the driver's weights and running statistics."""
        if self.driver_weights is None:
            raise RuntimeError("only the chain's first stage reads the driver's weights")
        return start_of_chain(self.driver_weights(), self.driver_buffers)

    def gathered_rows(self, partition: int, handle: dict) -> Own | None:
        """In the chain's first stage, where rows travel: partition ``partition``'s rows of
        the chain's later iterations, from its files (this stage runs where they are)."""
        if not self.later_shares:
            return None
        features, labels = load_partition_data(handle)
        shares = [shares[partition] for shares in self.later_shares]
        return Own(None, ShareRows.gather(features, labels, shares, self.later_first))

    def handed_on(self, inp: StageInput) -> Own:
        """What partition ``inp.partition`` hands its next stage: its optimizer state after
        this stage's update (or the one it came with) and the rows it has not trained."""
        own = inp.own or Own(None, None)
        state = own.state
        if self.updates is not None:
            kept = own_state(inp.spec, inp.partition, self.updates)
            state = kept if kept is not None else state
        rows = own.rows
        if rows is not None and self.trains:
            rows = rows.after(self.trains[-1])
        return Own(state, rows)

    def slice_of(self, weights: np.ndarray, partition: int) -> np.ndarray:
        """Slice ``partition`` of the whole vector ``weights``."""
        start, stop = self.bounds[partition]
        return weights[start:stop]


def _no_frozen_weights() -> None:
    return None


class StageInput(NamedTuple):
    """A stage task's input, read the same way in every mode (see the module docstring)."""

    spec: Any  # the run spec (replica.RunSpec)
    partition: int
    handle: dict  # where the partition's data lies on its host
    rows: list  # what the previous stage sent this partition ([] in the chain's first stage)
    entered: float  # wall clock when the task entered Python
    started: float  # perf_counter at the same moment, for the update's seconds
    carried: Carried | None  # the driver's start, in the chain's first stage; else None
    own: Own | None  # what the partition handed itself, where the executors share no disk


def stage_task(
    stage: Stage, body: Callable[[StageInput], Iterable]
) -> Callable[[int, Iterator], Iterator]:
    """The function to map over a chain stage's partitions (``mapPartitionsWithIndex``).

    It opens the task (see the module docstring), hands ``body`` the :class:`StageInput`,
    yields what ``body`` yields and, where the executors share no disk and the chain goes
    on, what the partition hands itself (:meth:`Stage.handed_on`, to its own partition). It
    ends only once the optimizer-state files the body wrote in the background are on disk
    (``owner_update.finishing_state_writes``).
    """

    def task(partition: int, rows: Iterator) -> Iterator:
        entered, started = time.time(), time.perf_counter()
        spec = stage.load_spec()
        rows = drain(rows)
        carried = own = None
        if stage.driver_weights is not None:  # the cached handles RDD, and the driver's weights
            (handle,) = rows
            rows, carried = [], stage.start()
            own = stage.gathered_rows(partition, handle)
        else:  # the records the stage before sent this partition
            handle = stage.handles[partition]
            if spec.carry_state:  # only then does a stage hand itself an Own record
                own = next((record for _, record in rows if isinstance(record, Own)), None)
                rows = [row for row in rows if not isinstance(row[1], Own)]
        inp = StageInput(spec, partition, handle, rows, entered, started, carried, own)
        yield from body(inp)
        if spec.carry_state and not stage.last:
            yield partition, stage.handed_on(inp)

    return finishing_state_writes(task)


def chain_end(
    partition: int,
    weight_slice: np.ndarray,
    carried: Carried,
    clock: tuple[float, float],
    entered: float,
    state: dict | None = None,
) -> ChainResult:
    """Partition ``partition``'s result of the chain, for the driver: slice ``partition`` of
    the weights, the history and running statistics where ``partition`` is 0, the wall
    ``clock`` of the last forward-backward (first entry, last exit) and of this task (from
    ``entered`` to now), and ``state`` (where the optimizer state travels)."""
    first = partition == 0
    return ChainResult(
        partition,
        weight_slice,
        carried.history if first else None,
        carried.buffers if first else None,
        StageTimings(clock[0], clock[1], entered, time.time()),
        state,
    )


# --- the exact modes' pieces: a gradient of the global batch, and reading the gradients ---


def partition_gradient(
    stage: Stage, inp: StageInput, carried: Carried, share: np.ndarray, iteration: int
) -> tuple[np.ndarray, Report]:
    """The partition's gradient of its ``share`` of iteration ``iteration``'s global batch,
    on ``carried``'s weights (and the share's rows, where they came with the input:
    ``inp.own``); partition 0 loads the run's running statistics first."""
    return replica_gradient(
        inp.spec,
        partition=inp.partition,
        handle=inp.handle,
        weights=carried.weights,
        share=share,
        iteration=iteration,
        entered=inp.entered,
        halted=carried.halted,
        frozen_weights=stage.get_frozen(),
        start_buffers=carried.buffers if inp.partition == 0 else None,
        rows=own_rows(inp, iteration),
        train=replica_trainer(inp.spec),
    )


def replica_trainer(spec: Any) -> Callable:
    """The forward-backward of a stage task: on its one replica, or, in a whole-executor
    task (``spec.replicas_per_task`` > 1), on that many at once
    (:func:`~bigdl_py.spark.modes.replica_process.forward_backward_on_replicas`)."""
    if spec.replicas_per_task > 1 and processes_available(spec.device):
        return forward_backward_on_replicas(spec, spec.replicas_per_task)
    return forward_backward


def own_rows(inp: StageInput, iteration: int) -> ShareRows | None:
    """The rows of iteration ``iteration`` that came with the stage's input, if they did
    (else the replica reads its files on this host)."""
    rows = inp.own.rows if inp.own is not None else None
    return rows if rows is not None and rows.holds(iteration) else None


class Received(NamedTuple):
    """The gradient records a partition received, read: their sum and what came with it."""

    summed: np.ndarray  # the partitions' gradients (or this partition's slice of them), added
    reports: list[Report]
    halted: bool
    history: list[HistoryEntry] | None
    weights: np.ndarray  # the weights (or the slice) the gradients were computed on
    loss_sum: float
    samples: int

    @property
    def clock(self) -> tuple[float, float]:
        """When the first forward-backward task entered Python and the last one left it."""
        return (
            min(report.clock[0] for report in self.reports),
            max(report.clock[1] for report in self.reports),
        )

    @property
    def buffers(self) -> dict | None:
        """Partition 0's running statistics, where they came with the gradients (to 0 only)."""
        return next((report.buffers for report in self.reports if report.buffers), None)


def receive_gradients(destination: int, rows: list, count: int, op: str = "sum") -> Received:
    """BigDL's *aggregateGradientPartition*: combine the pieces ``destination`` received from
    all ``count`` partitions (in partition order) and read the reports beside them."""
    records = [record for _, record in rows]
    _, summed = collectives.combine_owned_pieces(
        destination, (record.piece for record in records), count, op, "AllReduce"
    )
    reports = [record.report for record in records]
    return Received(
        summed,
        reports,
        records[0].halted,
        next((record.history for record in records if record.history is not None), None),
        next(record.weights for record in records if record.weights is not None),
        float(sum(report.loss_sum for report in reports)),
        int(sum(report.samples for report in reports)),
    )


def update_received(
    stage: Stage,
    inp: StageInput,
    received: Received,
    iteration: int,
    schedule: dict,
    *,
    start: int = 0,
    background: bool = False,
) -> np.ndarray:
    """Partition ``inp.partition``'s owner step of iteration ``iteration`` on the gradients it
    received (the whole vector, or its slice from flat offset ``start``): its new weights.
    ``background`` writes the state file on a thread while the task goes on
    (``owner_update.keep_shard``)."""
    return update_owned(
        inp.spec,
        inp.partition,
        iteration,
        stage.resumed_states,
        received.weights,
        received.summed,
        received.loss_sum,
        schedule,
        start=start,
        halted=received.halted,
        retain_from=stage.retain_from,
        background=background,
        carried_state=inp.own.state if inp.own is not None else None,
    )


def after_update(received: Received, weights: np.ndarray, stage: Stage, started: float) -> Carried:
    """What an exact update hands the next iteration: its new ``weights``, the history with
    this iteration (where it travels; the update took from ``started`` to now), whether the
    chain stops here, and partition 0's running statistics."""
    history, halted = received.history, received.halted
    if not halted:
        if history is not None:
            history = history + [
                HistoryEntry(
                    received.loss_sum,
                    received.samples,
                    max(report.seconds for report in received.reports),
                    time.perf_counter() - started,
                )
            ]
        halted = stops_chain(received.loss_sum, stage.stop_after_nonfinite)
    return Carried(weights, halted, history, received.buffers)
