"""What travels in a Spark training run, as named types.

* :class:`Chain` — what the driver (``training_run.py``) hands a training mode: the
  iterations of one job, their batches and schedules, and how a task reaches the run spec,
  the driver's weights and the data.
* The records between a chain's stages: :class:`GradientRecord` (a partition's gradient,
  or its slice, on its way to the partition that adds it up, with the :class:`Report` of
  the forward-backward that made it) and :class:`Carried` (what one iteration hands the
  next: weights, whether the chain stopped, its history, the running statistics). A mode
  may add record kinds of its own (local SGD's round record).
* :class:`ChainResult` — what partition ``j``'s task in a chain's last stage returns to the
  driver: slice ``j`` of the weights, with partition 0's history and running statistics,
  its :class:`StageTimings` and, where it travels, its optimizer state.
* :class:`Own` — where the executors share no disk, what a partition hands itself from
  one stage of a chain to the next (its optimizer state, its rows of the chain's later
  iterations: :class:`ShareRows`), so that no stage reads a host's files but the first.
  ``modes.stages.stage_task`` sends and reads it; the modes never see the record.

Nothing here runs Spark: the types pickle by reference to this module, so a record costs its
fields in the shuffle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from bigdl_py.spark import collectives
from bigdl_py.spark.collectives import Piece


class HistoryEntry(NamedTuple):
    """One finished iteration of a chain, as the driver reports it."""

    loss_sum: float  # the global batch's summed loss (NaN or inf: the update was skipped)
    count: int  # its samples
    forward_backward: float  # seconds of the slowest partition's forward-backward
    update: float  # seconds of the update


class Report(NamedTuple):
    """What a forward-backward task tells each task that reads its gradient."""

    loss_sum: float
    samples: int
    seconds: float  # the forward-backward's compute
    buffers: dict | None  # partition 0's running statistics after this forward, to owner 0 only
    clock: tuple[float, float]  # wall clock when the task entered and left Python


class ShareRows(NamedTuple):
    """A partition's rows of consecutive iterations of a chain, in share order.

    The chain's first stage runs where the partition's data files are (it reads the cached
    handles) and gathers them; the later stages of the chain, which read a shuffle and may
    run on any host, train on these instead of the files. Iteration ``first + i`` owns rows
    ``stops[i - 1]:stops[i]`` (from 0 for ``i = 0``).
    """

    first: int
    features: tuple  # one array per model input
    labels: np.ndarray
    stops: tuple[int, ...]

    @classmethod
    def gather(cls, features: tuple, labels, shares: list, first: int) -> ShareRows:
        """The rows of ``shares`` (one index array per iteration from ``first``) of a
        partition's ``features`` and ``labels`` (its memory-mapped arrays)."""
        indices = np.concatenate([np.asarray(share, dtype=np.int64) for share in shares])
        stops = tuple(int(stop) for stop in np.cumsum([len(share) for share in shares]))
        return cls(
            first,
            tuple(np.asarray(array[indices]) for array in features),
            np.asarray(labels[indices]),
            stops,
        )

    def holds(self, iteration: int) -> bool:
        return self.first <= iteration < self.first + len(self.stops)

    def bounds(self, iteration: int) -> tuple[int, int]:
        step = iteration - self.first
        if not 0 <= step < len(self.stops):
            raise RuntimeError(
                f"rows of iterations {self.first}-{self.first + len(self.stops) - 1} were "
                f"carried, not of iteration {iteration}"
            )
        return (self.stops[step - 1] if step else 0), self.stops[step]

    def of(self, iteration: int) -> tuple[tuple, np.ndarray]:
        """``(features, labels)`` of iteration ``iteration``'s share, in share order."""
        start, stop = self.bounds(iteration)
        return tuple(array[start:stop] for array in self.features), self.labels[start:stop]

    def after(self, iteration: int) -> ShareRows | None:
        """The rows of the iterations after ``iteration`` (None when none is left); a copy,
        so that the record that carries them pickles only them. All of them before their
        first iteration (the chain's first stage trains on the files)."""
        if iteration < self.first:
            return self
        _, stop = self.bounds(iteration)
        if stop == self.stops[-1]:
            return None
        return ShareRows(
            iteration + 1,
            tuple(np.array(array[stop:]) for array in self.features),
            np.array(self.labels[stop:]),
            tuple(end - stop for end in self.stops[iteration - self.first + 1 :]),
        )


#: Where the executors share no disk, a chain's first stage gathers a partition's rows of the
#: chain's later iterations and they travel with the chain (``ShareRows``): at most this many
#: bytes of them, which bounds the iterations per job (LeNet-5 on Fashion-MNIST at a global
#: batch of 128 on 2 partitions: 200 KB a share, so 81 iterations; ImageNet-sized images
#: chain nothing).
CARRIED_ROWS_LIMIT_BYTES = 16 << 20


def iterations_with_carried_rows(share_bytes: int) -> int:
    """The most iterations a job may chain when every later one's share (``share_bytes`` at
    most, per partition) travels with the chain."""
    return 1 + CARRIED_ROWS_LIMIT_BYTES // max(int(share_bytes), 1)


class Own(NamedTuple):
    """What a partition hands itself from one stage of a chain to the next where the
    executors share no disk (``RunSpec.carry_state``): the next stage's task may run on
    another host, so nothing may wait for it in this host's files. One record to its own
    partition, besides the mode's records."""

    state: dict | None  # its optimizer state after its last update, as the mode keeps it
    rows: ShareRows | None  # its rows of the chain's iterations still to train


class Carried(NamedTuple):
    """What one iteration of a chain hands the next (and the driver hands the first)."""

    weights: np.ndarray  # the whole vector, or the sender's slice of it
    halted: bool  # an iteration of the chain had a non-finite loss: the rest do nothing
    history: list[HistoryEntry] | None  # the chain's finished iterations (where they travel)
    buffers: dict | None  # partition 0's running statistics (BatchNorm's)


def start_of_chain(weights: np.ndarray, buffers: dict | None) -> Carried:
    """What a chain's first iteration starts from: the driver's weights and statistics."""
    return Carried(weights, False, [], buffers)


class GradientRecord(NamedTuple):
    """One partition's gradient (or its slice) on its way to the partition that adds it up."""

    piece: Piece
    report: Report
    halted: bool  # an earlier iteration of the chain had a non-finite loss: do nothing
    history: list[HistoryEntry] | None  # the chain's finished iterations, from partition 0 to 0
    weights: np.ndarray | None  # the weights (or their slice) it was computed on, to itself

    @classmethod
    def addressed(
        cls,
        destination: int,
        partition: int,
        piece: Piece,
        report: Report,
        carried: Carried,
        weights: np.ndarray,
    ) -> GradientRecord:
        """The record ``partition`` sends ``destination``: the loss report to all, the running
        statistics and the history to 0 only, the weights it was computed on (``weights``:
        all of them or the destination's slice) to itself only, so the stage that updates
        them needs no cache and stays a pure function of its input."""
        return cls(
            piece,
            report if destination == 0 else report._replace(buffers=None),
            carried.halted,
            carried.history if destination == 0 and partition == 0 else None,
            weights if destination == partition else None,
        )


class StageTimings(NamedTuple):
    """Wall clocks of a chain's last iteration, as the task that ends it saw them."""

    fb_entered: float  # the first forward-backward task entered Python
    fb_left: float  # the last one left it
    update_entered: float  # the update's task entered Python
    update_left: float  # it handed its result back


class ChainResult(NamedTuple):
    """What partition ``partition``'s task in a chain's last stage returns to the driver."""

    partition: int
    weights: np.ndarray  # slice ``partition`` of the weights after the chain
    history: list[HistoryEntry] | None  # the chain's iterations (partition 0's result only)
    buffers: dict | None  # partition 0's running statistics (its result only)
    timings: StageTimings
    state: dict | None  # its optimizer state as a checkpoint holds it, where it travels


@dataclass
class Chain:
    """What a mode needs to build the stages of iterations ``first .. first + count - 1``.

    ``shares[i][j]`` are partition ``j``'s sample indices (within the partition) in the
    chain's ``i``-th iteration, ``schedules[i]`` the driver's schedule for its update. The
    callables run on the executors: ``load_spec()`` the run spec, ``get_weights()`` the
    driver's weights at the chain's start, ``get_frozen()`` the frozen parameters' values.
    ``data_rdd`` (the cached handles, one per partition) is the chain's first input; a task
    never holds it (:class:`bigdl_py.spark.modes.stages.Stage` is what a task holds).
    """

    first: int
    shares: list
    schedules: list
    stop_after_nonfinite: bool
    num_partitions: int
    bounds: list
    load_spec: Callable
    get_weights: Callable
    get_frozen: Callable
    initial_states: dict | None
    handles: dict
    data_rdd: Any
    # The run's running statistics (BatchNorm's) are partition 0's replica's. They reach its
    # next forward through the chain's records and, between jobs, through the driver: a
    # replica rebuilt after a cache miss (another Python worker, a lost or replaced host)
    # would otherwise restart from the model's initial statistics.
    buffers: dict | None = None
    # The executors share no disk (RunSpec.carry_state): a stage after the chain's first may
    # run on any host, so each partition hands itself its state and rows (Own).
    own_travels: bool = False
    # Whole-executor tasks: the ResourceProfile every stage's tasks run under (None: Spark's
    # default, spark.task.cpus). The cached handles carry it too, so the first stage has it.
    task_profile: Any = None

    @property
    def count(self) -> int:
        return len(self.shares)

    def shuffle(self, rdd: Any) -> Any:
        """``(partition, record)`` pairs to their partitions, for the chain's next stage (its
        tasks under ``task_profile``): ``collectives.shuffle_to_owners``."""
        return collectives.shuffle_to_owners(rdd, self.num_partitions, self.task_profile)

    @property
    def retain_from(self) -> int:
        """State files from here on stay until the job ends (its stages may be recomputed)."""
        return self.first - 1
