"""A pipeline job's Spark stages: one per tick of GPipe's schedule (``schedule.py``).

Every tick is ``rdd.mapPartitionsWithIndex(stage_task(stage, body))`` and a shuffle to the
next; partition ``p`` (stage ``k``, replica ``r``: ``layout.py``) does in its task what the
schedule says stage ``k`` does at that tick, in this order:

1. the **update** of the previous iteration (``owner_update.update_owned``: clip, scale,
   step the stage's slice with the optimizer state only this partition keeps), on the
   replicas' summed gradient and the iteration's loss from the reports;
2. the **forward** of a micro-batch: stage 0 reads its samples from the data partitions'
   files, a later stage the :class:`Activation` the stage before sent; the last stage
   reads the labels and adds up the loss; the output goes to the next stage;
3. the **backward** of a micro-batch: the last stage from its loss, the others from the
   :class:`InputGradient` the stage after sent; the input's gradient goes to the stage
   before, the parameters' gradients add up in the stage's flat gradient;
4. at the **exchange**: the gradient to each replica of the stage (all of them sum the
   same ``R`` pieces in replica order, so they step alike: the collectives' all-to-all), an
   :class:`IterationReport` to everyone (the last stages' losses; the running statistics
   to partition 0, which returns them for the whole model); at the **squares** tick
   (global-norm clipping) the stage's squared norm to everyone.

Each task also sends itself a :class:`StageCarry` (the small state that travels: losses so
far, the running statistics, the history); what is large (weights, the gradient so far)
goes through the run's files (``stage_worker.py``): any worker on the host continues a
partition. The last tick ends the chain as every mode does (``stages.chain_end``) and adds
a :class:`PipelineReport` (when and where each tick ran, the stage's memory) for the
benchmarks.
"""

from __future__ import annotations

import os
import resource
import time
from typing import NamedTuple

import numpy as np

from bigdl_py.spark import collectives, owner_update, worker
from bigdl_py.spark.modes.pipeline.layout import single_input
from bigdl_py.spark.modes.pipeline.stage_worker import StageFiles, StageRun
from bigdl_py.spark.modes.stages import Stage, chain_end, stage_task
from bigdl_py.spark.owner_update import clip_summed_slice, state_key, stops_chain, update_owned
from bigdl_py.spark.partitioned_data import load_partition_data
from bigdl_py.spark.records import Carried, HistoryEntry


class Activation(NamedTuple):
    """A micro-batch's output of stage ``k``, to stage ``k + 1`` of the same replica."""

    micro_batch: int
    values: np.ndarray


class InputGradient(NamedTuple):
    """The gradient of a micro-batch's input to stage ``k``, to stage ``k - 1``."""

    micro_batch: int
    values: np.ndarray


class IterationReport(NamedTuple):
    """What every partition tells every partition at the exchange."""

    partition: int
    loss_sum: float  # the last stages' summed loss of the iteration (0 elsewhere)
    samples: int  # their samples
    seconds: float  # the partition's compute in the iteration
    buffers: dict | None  # replica 0's running statistics (the model's names), to 0 only


class ReplicaGradient(NamedTuple):
    """A stage's gradient of one replica, to every replica of the stage."""

    piece: collectives.Piece


class StageSquares(NamedTuple):
    """A stage's squared norm of its (clipped, summed) gradient, to everyone."""

    stage: int
    squares: float


class TickTime(NamedTuple):
    """When and where one task of one tick ran, and its compute."""

    tick: int
    partition: int
    entered: float  # wall clock when the task entered Python
    seconds: float  # its forward, backward and update
    left: float  # wall clock when it handed its records on
    worker: int  # the Python worker's process id
    recomputed: int  # forwards run again in a backward (the graph was in another worker)


class StageMemory(NamedTuple):
    """What a partition's stage holds (bytes) at a chain's end."""

    partition: int
    stage: int
    parameters: int
    gradients: int
    optimizer: int
    peak_rss: int  # the Python worker's peak resident memory


class PipelineReport(NamedTuple):
    """A partition's timings and memory, besides its ``ChainResult``."""

    partition: int
    ticks: tuple[TickTime, ...]
    memory: StageMemory


class StageCarry(NamedTuple):
    """What a partition hands itself from one tick to the next."""

    halted: bool
    history: list[HistoryEntry] | None  # partition 0's record of the chain's iterations
    buffers: dict | None  # the stage's running statistics (its own names)
    loss_sum: float  # this iteration's, on a last stage
    samples: int
    seconds: float  # this iteration's compute
    reports: tuple  # the exchange's reports, kept from the squares tick to the update
    model_buffers: dict | None  # partition 0: every stage's statistics, the model's names
    fb_clock: tuple[float, float]  # the chain's first task entry, its last forward-backward
    ticks: tuple[TickTime, ...]


class DriverStart(NamedTuple):
    """What a chain's tasks get from the driver: the first iteration's slices and running
    statistics, and the stages' layers."""

    weights: tuple  # per stage, a zero-argument function returning its slice
    buffers: dict | None  # the model's running statistics (its names), or None
    # Per stage, a Broadcast of its cloudpickled layers: in every tick's closure, because a
    # task can read only the broadcasts its closure names (each reads its own stage's).
    stage_modules: tuple


def build_ticks(chain, plan, start: DriverStart):
    """The chain's job: ``plan.chain_ticks(chain.count)`` Spark stages."""
    total = plan.chain_ticks(chain.count)
    rdd = chain.data_rdd
    for tick in range(total):
        stage = Stage.of(chain, first_update=tick == plan.iteration_ticks, forward_backward=False)
        body = _tick(chain, stage, tick, start, plan.iteration_ticks)
        rdd = rdd.mapPartitionsWithIndex(stage_task(stage, body))
        if tick < total - 1:
            rdd = collectives.shuffle_to_owners(rdd, chain.num_partitions)
    return rdd


def _tick(chain, stage: Stage, tick: int, start: DriverStart, iteration_ticks: int):
    """The body of tick ``tick``'s tasks; its closure holds only what the tick may read: the
    shares of its iteration and the one before (an update may replay that one's backward),
    the schedule of the update it makes, the driver's start in the first iterations."""
    first, count = chain.first, chain.count
    now = tick // iteration_ticks  # the chain's iteration (count: the last tick's update)
    shares = {
        relative: chain.shares[relative] for relative in (now - 1, now) if 0 <= relative < count
    }
    schedule = chain.schedules[now - 1] if now >= 1 else None
    # The chain's first iteration, and its update, start from the driver's slices.
    driver = start if now <= 1 else start._replace(weights=None, buffers=None)

    def body(inp):
        task = _TickTask(inp.spec, stage, inp, tick, first, count, shares, driver)
        yield from task.run(schedule)

    return body


class _TickTask:
    """One partition's task of one tick (see the module docstring)."""

    def __init__(self, spec, stage, inp, tick, first, count, shares, driver):
        layout = spec.mode.layout
        self.spec, self.layout, self.stage, self.inp = spec, layout, stage, inp
        self.tick, self.first, self.count = tick, first, count
        self.shares, self.driver = shares, driver
        self.plan = layout.plan
        self.partition = inp.partition
        self.stage_index = layout.stage_of(self.partition)
        self.replica = layout.replica_of(self.partition)
        self.events = self.plan.events(self.stage_index, tick, count)
        self.files = StageFiles(spec, self.partition)
        self.compute = 0.0
        self.recomputed = 0
        self.kinds: dict = {}
        self.latest_sum: np.ndarray | None = None  # the gradient sum this task wrote
        self.optimizer_bytes = 0

    # --- the tick -------------------------------------------------------------------------
    def run(self, schedule):
        carry, kinds = self._sorted_input()
        self.kinds = kinds
        out: list = []
        weights = None
        if self.events.update:
            carry, weights = self._update(carry, kinds, schedule)
            if self.events.end:
                yield from self._end(carry, weights)
                return
        if not carry.halted and (
            self.events.forward is not None or self.events.backward is not None
        ):
            carry = self._forward_backward(carry, kinds, out, weights)
        if self.events.exchange:
            self._exchange(carry, out)
        if self.events.squares:
            carry = self._squares(carry, kinds, out)
        carry = carry._replace(ticks=carry.ticks + (self._timing(time.time()),))
        yield from out
        yield self.partition, carry

    def _timing(self, left: float) -> TickTime:
        return TickTime(
            self.tick,
            self.partition,
            self.inp.entered,
            self.compute,
            left,
            os.getpid(),
            self.recomputed,
        )

    # --- reading the tick's input ---------------------------------------------------------
    def _sorted_input(self):
        rows = [] if self.tick == 0 else [record for _, record in self.inp.rows]
        kinds: dict[type, list] = {}
        for record in rows:
            kinds.setdefault(type(record), []).append(record)
        (carry,) = kinds.get(StageCarry) or [self._start_carry()]
        return carry, kinds

    def _start_carry(self) -> StageCarry:
        buffers = None
        if self.driver.buffers:
            names = self.layout.buffer_names[self.stage_index]
            buffers = {
                own: self.driver.buffers[model]
                for own, model in names.items()
                if model in self.driver.buffers
            }
        entered = self.inp.entered
        history = [] if self.partition == 0 else None
        return StageCarry(False, history, buffers, 0.0, 0, 0.0, (), None, (entered, entered), ())

    # --- weights, data and keys -----------------------------------------------------------
    def _weights(self, iteration: int) -> np.ndarray:
        """The stage's weights at ``iteration``'s start."""
        if iteration == self.first:
            return np.asarray(self.driver.weights[self.stage_index]())
        return self.files.weights_after(iteration - 1)

    def _stage_run(self, iteration: int, weights=None) -> StageRun:
        run = StageRun(
            self.spec,
            self.layout,
            self.partition,
            self.driver.stage_modules,
            iteration,
            self._weights(iteration) if weights is None else weights,
        )
        return run

    def _key(self, iteration: int, micro_batch: int) -> tuple:
        return (self.spec.seed, iteration, self.replica * self.layout.micro_batches + micro_batch)

    def _data(self, iteration: int, micro_batch: int, labels: bool):
        """Micro-batch ``micro_batch``'s features (or labels) of ``iteration``, read from
        the data partitions' files."""
        pieces = []
        for data_partition, indices in self.layout.micro_batch_rows(
            self.shares[iteration - self.first], self.replica, micro_batch
        ):
            handle = self.stage.handles[data_partition]
            features, targets = worker.fetch(
                self.spec.run_id,
                ("pipeline-data", data_partition),
                lambda handle=handle: load_partition_data(handle),
            )
            array = targets if labels else single_input(features)
            pieces.append(np.asarray(array[indices]))
        return np.concatenate(pieces)

    def _inputs_of(self, iteration: int, micro_batch: int) -> tuple:
        """What micro-batch ``micro_batch``'s forward took: its input, and its labels on the
        last stage (for a backward that runs the forward again)."""
        last = self.stage_index == self.layout.stages - 1
        if self.stage_index == 0:
            inputs = self._data(iteration, micro_batch, labels=False)
        elif micro_batch == self.events.forward:  # came in this tick (its file is on its way)
            (arrived,) = self.kinds[Activation]
            inputs = arrived.values
        else:
            inputs = self.files.arrival("input", iteration, micro_batch)
        return inputs, self._data(iteration, micro_batch, labels=True) if last else None

    # --- forward and backward -------------------------------------------------------------
    def _forward_backward(self, carry: StageCarry, kinds: dict, out: list, weights):
        started = time.perf_counter()
        iteration = self.first + self.events.iteration
        run = self._stage_run(iteration, weights)
        run.load_buffers(carry.buffers)
        first, last = run.first, run.last
        micro_batch = self.events.forward
        if micro_batch is not None:
            if first:
                inputs = self._data(iteration, micro_batch, labels=False)
            else:
                (arrived,) = kinds[Activation]
                inputs = arrived.values
                self.files.save_arrival("input", iteration, micro_batch, inputs)
            labels = self._data(iteration, micro_batch, labels=True) if last else None
            result = run.forward(micro_batch, self._key(iteration, micro_batch), inputs, labels)
            if last:
                carry = carry._replace(
                    loss_sum=carry.loss_sum + result, samples=carry.samples + len(labels)
                )
            else:
                following = self.layout.partition_of(self.stage_index + 1, self.replica)
                out.append((following, Activation(micro_batch, result)))
        micro_batch = self.events.backward
        if micro_batch is not None:
            gradient = None
            if not last:
                (arrived,) = kinds[InputGradient]
                gradient = arrived.values
                self.files.save_arrival("gradient", iteration, micro_batch, gradient)
            input_gradient = run.backward(
                micro_batch,
                self._key(iteration, micro_batch),
                gradient,
                lambda m: self._inputs_of(iteration, m),
            )
            if input_gradient is not None:
                previous = self.layout.partition_of(self.stage_index - 1, self.replica)
                out.append((previous, InputGradient(micro_batch, input_gradient)))
            self._accumulate(iteration, micro_batch, run.gradient())
        self.recomputed += run.recomputed
        seconds = time.perf_counter() - started
        self.compute += seconds
        return carry._replace(
            seconds=carry.seconds + seconds,
            buffers=run.buffers() or None,
            fb_clock=(carry.fb_clock[0], time.time()),
        )

    def _accumulate(self, iteration: int, micro_batch: int, gradient: np.ndarray) -> None:
        """The gradient over micro-batches ``micro_batch .. M - 1``, to its file."""
        if micro_batch < self.layout.micro_batches - 1:
            gradient = self._accumulated(iteration, micro_batch + 1) + gradient
        self.files.save_accumulated(iteration, micro_batch, gradient)
        self.latest_sum = gradient

    def _accumulated(self, iteration: int, micro_batch: int) -> np.ndarray:
        """The gradient over micro-batches ``micro_batch .. M - 1``: its file, or, where it
        is gone (a tick Spark runs again), their backward passes run again in order."""
        saved = self.files.accumulated(iteration, micro_batch)
        if saved is not None:
            return np.asarray(saved)
        run = self._stage_run(iteration)
        for replayed in reversed(range(micro_batch, self.layout.micro_batches)):
            gradient = None
            if self.stage_index < self.layout.stages - 1:
                gradient = self.files.arrival("gradient", iteration, replayed)
            run.backward(
                replayed,
                self._key(iteration, replayed),
                gradient,
                lambda m: self._inputs_of(iteration, m),
            )
        self.recomputed += run.recomputed
        return run.gradient()

    # --- the exchange, the squares, the update --------------------------------------------
    def _exchange(self, carry: StageCarry, out: list) -> None:
        layout = self.layout
        if layout.replicas > 1:
            iteration = self.first + self.events.iteration
            gradient = self.latest_sum  # stage 0's, of this tick
            if gradient is None:
                gradient = self._accumulated(iteration, 0)
            piece = collectives.whole_piece(self.replica, gradient, self.spec.wire_dtype)
            for replica in range(layout.replicas):
                out.append((layout.partition_of(self.stage_index, replica), ReplicaGradient(piece)))
        buffers = None
        if self.replica == 0 and carry.buffers:
            names = layout.buffer_names[self.stage_index]
            buffers = {names[own]: value for own, value in carry.buffers.items()}
        report = IterationReport(self.partition, carry.loss_sum, carry.samples, carry.seconds, None)
        for destination in range(layout.partitions):
            sent = report._replace(buffers=buffers) if destination == 0 else report
            out.append((destination, sent))

    def _summed(self, iteration: int, kinds: dict, halted: bool) -> np.ndarray:
        """The stage's gradient of ``iteration`` summed over its replicas, in replica order."""
        if halted:
            start, stop = self.layout.stage_bounds(self.stage_index)
            return np.zeros(stop - start, dtype=np.dtype(self.layout.dtype))
        if self.layout.replicas == 1:
            return self._accumulated(iteration, 0)
        pieces = [record.piece for record in kinds.get(ReplicaGradient, [])]
        _, summed = collectives.combine_owned_pieces(
            self.partition, pieces, self.layout.replicas, "sum", "the pipeline's AllReduce"
        )
        return summed

    def _squares(self, carry: StageCarry, kinds: dict, out: list) -> StageCarry:
        started = time.perf_counter()
        iteration = self.first + self.events.iteration
        summed = self._summed(iteration, kinds, carry.halted)
        self.files.save_summed(iteration, summed)
        clipped = clip_summed_slice(self.spec, np.array(summed))
        squares = float(self.spec.l2_clipping.sum_of_squares(clipped)) if clipped.size else 0.0
        if self.replica == 0:
            for destination in range(self.layout.partitions):
                out.append((destination, StageSquares(self.stage_index, squares)))
        self.compute += time.perf_counter() - started
        return carry._replace(reports=tuple(kinds.get(IterationReport, ())))

    def _update(self, carry: StageCarry, kinds: dict, schedule):
        """Step iteration ``first + events.iteration - 1``: the carry for the next one, and
        the new weights."""
        started = time.perf_counter()
        spec, layout = self.spec, self.layout
        iteration = self.first + self.events.iteration - 1
        reports = carry.reports or tuple(kinds.get(IterationReport, ()))
        reports = sorted(reports, key=lambda report: report.partition)  # not arrival order
        if layout.plan.clipping_by_norm:
            summed = self.files.summed(iteration)
            by_stage = {record.stage: record.squares for record in kinds.get(StageSquares, ())}
            squares = sum(by_stage[stage] for stage in sorted(by_stage))
            l2_scale = spec.l2_clipping.scale_for(float(squares))
        else:
            summed, l2_scale = self._summed(iteration, kinds, carry.halted), None
        loss_sum = float(sum(report.loss_sum for report in reports))
        samples = int(sum(report.samples for report in reports))
        weights = update_owned(
            spec,
            self.partition,
            iteration,
            self.stage.resumed_states,
            np.array(self._weights(iteration)),
            np.array(summed),
            loss_sum,
            schedule,
            start=layout.offsets[self.stage_index],
            l2_scale=l2_scale,
            halted=carry.halted,
            retain_from=self.stage.retain_from,
            background=True,
        )
        self.files.save_weights(iteration, weights)
        self.optimizer_bytes = _state_bytes(spec, self.partition, iteration)
        # Another partition's task may come to this worker next: its state is on disk.
        worker.forget(spec.run_id, state_key(spec, self.partition))
        self.files.forget_sums(iteration)
        self.files.forget_before(self.first)
        history, halted = carry.history, carry.halted
        if not halted:
            if history is not None:
                fb = max((report.seconds for report in reports), default=0.0)
                update = time.perf_counter() - started
                history = history + [HistoryEntry(loss_sum, samples, fb, update)]
            halted = stops_chain(loss_sum, self.stage.stop_after_nonfinite)
        model_buffers = carry.model_buffers
        if self.partition == 0:
            merged = dict(model_buffers or {})
            for report in reports:
                merged.update(report.buffers or {})
            model_buffers = merged or None
        self.compute += time.perf_counter() - started
        carry = carry._replace(
            halted=halted,
            history=history,
            loss_sum=0.0,
            samples=0,
            seconds=0.0,
            reports=(),
            model_buffers=model_buffers,
        )
        return carry, weights

    def _end(self, carry: StageCarry, weights: np.ndarray):
        """The chain's result: this partition's piece of the weights, and its report."""
        low, high = self.layout.sub_slice(self.partition)
        carried = Carried(None, carry.halted, carry.history, carry.model_buffers)
        bounds = self.layout.partition_bounds()
        iteration = self.first + self.count - 1
        state = owner_update.travelling_state(self.spec, self.partition, iteration, bounds)
        yield chain_end(
            self.partition, weights[low:high], carried, carry.fb_clock, self.inp.entered, state
        )
        ticks = carry.ticks + (self._timing(time.time()),)
        yield PipelineReport(self.partition, ticks, self._memory(weights))

    def _memory(self, weights: np.ndarray) -> StageMemory:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        return StageMemory(
            self.partition,
            self.stage_index,
            int(weights.nbytes),
            int(weights.nbytes),  # the gradient: one value a weight
            int(self.optimizer_bytes),
            int(peak),
        )


def _state_bytes(spec, partition: int, iteration: int) -> int:
    """Bytes of the per-weight arrays of ``partition``'s optimizer state after ``iteration``."""
    method = worker.lookup(spec.run_id, state_key(spec, partition), version=iteration)
    if method is None:
        return 0
    return int(
        sum(
            np.asarray(value).nbytes
            for value in method.state_dict().values()
            if isinstance(value, np.ndarray)
        )
    )
