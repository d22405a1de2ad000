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
far, the running statistics, the history), and keeps the rest in its
:class:`~bigdl_py.spark.modes.pipeline.stage_worker.StageWorker`. The last tick ends the
chain as every mode does (``stages.chain_end``) and adds a :class:`PipelineReport` (when
each tick ran, the stage's memory) for the benchmarks.
"""

from __future__ import annotations

import resource
import time
from typing import NamedTuple

import numpy as np

from bigdl_py.spark import collectives, owner_update, worker
from bigdl_py.spark.modes.pipeline.layout import single_input
from bigdl_py.spark.modes.pipeline.stage_worker import StageFiles, StageWorker
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
    """When one task of one tick ran, and its compute."""

    tick: int
    partition: int
    entered: float  # wall clock when the task entered Python
    seconds: float  # its forward, backward and update
    left: float  # wall clock when it handed its records on


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
    shares of its iteration and the one before (a rebuild replays that one at an update),
    the schedule of the update it makes, the driver's start in the first iterations."""
    first, count = chain.first, chain.count
    now = tick // iteration_ticks  # the chain's iteration (count: the last tick's update)
    shares = {
        relative: chain.shares[relative] for relative in (now - 1, now) if 0 <= relative < count
    }
    schedule = chain.schedules[now - 1] if now >= 1 else None
    # The first iterations' ticks get the driver's slices (a rebuild there reads them).
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
        self.local_tick = tick - self.events.iteration * self.plan.iteration_ticks
        self.files = StageFiles(spec, self.partition)
        self.compute = 0.0

    # --- reading the tick's input ---------------------------------------------------------
    def _sorted_input(self):
        rows = [] if self.tick == 0 else [record for _, record in self.inp.rows]
        kinds: dict[type, list] = {}
        for record in rows:
            kinds.setdefault(type(record), []).append(record)
        carry = (kinds.get(StageCarry) or [None])[0]
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

    # --- the worker of this partition -----------------------------------------------------
    def _version(self, tick: int) -> tuple:
        if tick < 0:
            return ("updated", self.first - 1)
        return ("tick", self.first, tick)

    def _worker(self, carry: StageCarry):
        key = ("pipeline-stage", self.partition)
        stage_worker = worker.lookup(self.spec.run_id, key, version=self._version(self.tick - 1))
        if stage_worker is None and self.tick > 0:
            stage_worker = self._rebuild(carry)
        elif stage_worker is None:
            stage_worker = StageWorker(
                self.spec, self.layout, self.partition, self.driver.stage_modules
            )
        # Until this task stores its new version, no later task may take this object for
        # the state before it (a retry in this worker rebuilds instead).
        worker.store(self.spec.run_id, key, stage_worker, version=("busy", self.tick))
        return stage_worker

    def _keep(self, stage_worker) -> None:
        version = ("updated", self.first + self.count - 1) if self.events.end else None
        worker.store(
            self.spec.run_id,
            ("pipeline-stage", self.partition),
            stage_worker,
            version=version or self._version(self.tick),
        )

    def _rebuild(self, carry: StageCarry):
        """A worker at the state the previous tick left (see ``stage_worker.py``)."""
        stage_worker = StageWorker(
            self.spec, self.layout, self.partition, self.driver.stage_modules
        )
        relative = self.events.iteration - (1 if self.events.update else 0)
        done_before = self.plan.iteration_ticks if self.events.update else self.local_tick
        iteration = self.first + relative
        stage_worker.start_iteration(iteration, self._weights_at_start(relative))
        stage_worker.load_buffers(carry.buffers)
        if carry.halted:
            return stage_worker
        for micro_batch in reversed(range(self.layout.micro_batches)):
            if self.plan.backward_tick(self.stage_index, micro_batch) < done_before:
                gradient = None
                if not stage_worker.last:
                    gradient = self.files.arrival("gradient", iteration, micro_batch)
                stage_worker.backward(
                    micro_batch,
                    self._key(iteration, micro_batch),
                    gradient,
                    lambda m, relative=relative: self._inputs_of(relative, m, stage_worker),
                )
        return stage_worker

    def _weights_at_start(self, relative: int) -> np.ndarray:
        if relative == 0:
            return np.asarray(self.driver.weights[self.stage_index]())
        return self.files.weights_after(self.first + relative - 1)

    # --- data and keys --------------------------------------------------------------------
    def _key(self, iteration: int, micro_batch: int) -> tuple:
        return (self.spec.seed, iteration, self.replica * self.layout.micro_batches + micro_batch)

    def _data(self, relative: int, micro_batch: int, labels: bool):
        """Micro-batch ``micro_batch``'s features (or labels) of the chain's iteration
        ``relative``, read from the data partitions' files."""
        pieces = []
        for data_partition, indices in self.layout.micro_batch_rows(
            self.shares[relative], self.replica, micro_batch
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

    def _inputs_of(self, relative: int, micro_batch: int, stage_worker) -> tuple:
        iteration = self.first + relative
        if stage_worker.first:
            inputs = self._data(relative, micro_batch, labels=False)
        else:
            inputs = self.files.arrival("input", iteration, micro_batch)
        labels = self._data(relative, micro_batch, labels=True) if stage_worker.last else None
        return inputs, labels

    # --- the tick -------------------------------------------------------------------------
    def run(self, schedule):
        carry, kinds = self._sorted_input()
        if carry is None:
            carry = self._start_carry()
        stage_worker = self._worker(carry)
        if self.tick == 0:
            stage_worker.start_iteration(self.first, self._weights_at_start(0))
            stage_worker.load_buffers(carry.buffers)
        out: list = []
        if self.events.update:
            carry = self._update(stage_worker, carry, kinds, schedule)
            if self.events.end:
                yield from self._end(stage_worker, carry)
                self._keep(stage_worker)
                return
        if not carry.halted:
            carry = self._forward_backward(stage_worker, carry, kinds, out)
        if self.events.exchange:
            self._exchange(stage_worker, carry, out)
        if self.events.squares:
            carry = self._squares(stage_worker, carry, kinds, out)
        if self.events.forward is not None or self.events.backward is not None:
            carry = carry._replace(fb_clock=(carry.fb_clock[0], time.time()))
        left = time.time()
        timing = TickTime(self.tick, self.partition, self.inp.entered, self.compute, left)
        carry = carry._replace(
            buffers=stage_worker.buffers() or None, ticks=carry.ticks + (timing,)
        )
        self._keep(stage_worker)
        yield from out
        yield self.partition, carry

    def _forward_backward(self, stage_worker, carry: StageCarry, kinds: dict, out: list):
        started = time.perf_counter()
        relative = self.events.iteration
        iteration = self.first + relative
        next_stage = self.layout.partition_of(self.stage_index + 1, self.replica)
        previous_stage = self.layout.partition_of(self.stage_index - 1, self.replica)
        retain = self.stage.retain_from
        micro_batch = self.events.forward
        if micro_batch is not None:
            if stage_worker.first:
                inputs = self._data(relative, micro_batch, labels=False)
            else:
                (arrived,) = kinds[Activation]
                inputs = arrived.values
                self.files.save_arrival("input", iteration, micro_batch, inputs, retain)
            labels = self._data(relative, micro_batch, labels=True) if stage_worker.last else None
            result = stage_worker.forward(
                micro_batch, self._key(iteration, micro_batch), inputs, labels
            )
            if stage_worker.last:
                carry = carry._replace(
                    loss_sum=carry.loss_sum + result, samples=carry.samples + len(labels)
                )
            else:
                out.append((next_stage, Activation(micro_batch, result)))
        micro_batch = self.events.backward
        if micro_batch is not None:
            gradient = None
            if not stage_worker.last:
                (arrived,) = kinds[InputGradient]
                gradient = arrived.values
                self.files.save_arrival("gradient", iteration, micro_batch, gradient, retain)
            input_gradient = stage_worker.backward(
                micro_batch,
                self._key(iteration, micro_batch),
                gradient,
                lambda m: self._inputs_of(relative, m, stage_worker),
            )
            if input_gradient is not None:
                out.append((previous_stage, InputGradient(micro_batch, input_gradient)))
        seconds = time.perf_counter() - started
        self.compute += seconds
        return carry._replace(seconds=carry.seconds + seconds)

    def _exchange(self, stage_worker, carry: StageCarry, out: list) -> None:
        layout = self.layout
        if layout.replicas > 1:
            piece = collectives.whole_piece(
                self.replica, stage_worker.gradient(), self.spec.wire_dtype
            )
            for replica in range(layout.replicas):
                out.append((layout.partition_of(self.stage_index, replica), ReplicaGradient(piece)))
        buffers = None
        if self.replica == 0:
            names = layout.buffer_names[self.stage_index]
            buffers = {names[own]: value for own, value in stage_worker.buffers().items()}
        report = IterationReport(self.partition, carry.loss_sum, carry.samples, carry.seconds, None)
        for destination in range(layout.partitions):
            sent = report._replace(buffers=buffers) if destination == 0 else report
            out.append((destination, sent))

    def _summed(self, stage_worker, kinds: dict) -> np.ndarray:
        """The stage's gradient summed over its replicas, in replica order."""
        if self.layout.replicas == 1:
            return stage_worker.gradient()
        pieces = [record.piece for record in kinds.get(ReplicaGradient, [])]
        _, summed = collectives.combine_owned_pieces(
            self.partition, pieces, self.layout.replicas, "sum", "the pipeline's AllReduce"
        )
        return summed

    def _squares(self, stage_worker, carry: StageCarry, kinds: dict, out: list) -> StageCarry:
        started = time.perf_counter()
        summed = self._summed(stage_worker, kinds)
        iteration = self.first + self.events.iteration
        stage_worker.summed = summed
        self.files.save_summed(iteration, summed, self.stage.retain_from)
        clipped = clip_summed_slice(self.spec, summed.copy())
        squares = float(self.spec.l2_clipping.sum_of_squares(clipped)) if clipped.size else 0.0
        if self.replica == 0:
            for destination in range(self.layout.partitions):
                out.append((destination, StageSquares(self.stage_index, squares)))
        self.compute += time.perf_counter() - started
        return carry._replace(reports=tuple(kinds.get(IterationReport, ())))

    def _update(self, stage_worker, carry: StageCarry, kinds: dict, schedule) -> StageCarry:
        started = time.perf_counter()
        spec, layout = self.spec, self.layout
        iteration = self.first + self.events.iteration - 1
        reports = carry.reports or tuple(kinds.get(IterationReport, ()))
        if layout.plan.clipping_by_norm:
            summed = stage_worker.summed
            if summed is None:
                summed = self.files.summed(iteration)
            by_stage = {record.stage: record.squares for record in kinds.get(StageSquares, ())}
            squares = sum(by_stage[stage] for stage in sorted(by_stage))
            l2_scale = spec.l2_clipping.scale_for(float(squares))
        else:
            summed, l2_scale = self._summed(stage_worker, kinds), None
        reports = sorted(reports, key=lambda report: report.partition)  # not arrival order
        loss_sum = float(sum(report.loss_sum for report in reports))
        samples = int(sum(report.samples for report in reports))
        weights = update_owned(
            spec,
            self.partition,
            iteration,
            self.stage.resumed_states,
            stage_worker.weights(),
            summed,
            loss_sum,
            schedule,
            start=layout.offsets[self.stage_index],
            l2_scale=l2_scale,
            halted=carry.halted,
            retain_from=self.stage.retain_from,
            background=True,
        )
        self.files.save_weights(iteration, weights, self.stage.retain_from)
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
        if not self.events.end:
            stage_worker.start_iteration(iteration + 1, weights)
        else:
            stage_worker.flat.load(np.asarray(weights, dtype=stage_worker.flat.weights.dtype))
        self.compute += time.perf_counter() - started
        return carry._replace(
            halted=halted,
            history=history,
            loss_sum=0.0,
            samples=0,
            seconds=0.0,
            reports=(),
            model_buffers=model_buffers,
        )

    def _end(self, stage_worker, carry: StageCarry):
        """The chain's result: this partition's piece of the weights, and its report."""
        spec, layout = self.spec, self.layout
        iteration = self.first + self.count - 1
        low, high = layout.sub_slice(self.partition)
        carried = Carried(None, carry.halted, carry.history, carry.model_buffers)
        bounds = layout.partition_bounds()
        state = owner_update.travelling_state(spec, self.partition, iteration, bounds)
        yield chain_end(
            self.partition,
            stage_worker.weights()[low:high],
            carried,
            carry.fb_clock,
            self.inp.entered,
            state,
        )
        left = time.time()
        timing = TickTime(self.tick, self.partition, self.inp.entered, self.compute, left)
        yield PipelineReport(self.partition, carry.ticks + (timing,), _memory(self, stage_worker))


def _memory(task: _TickTask, stage_worker) -> StageMemory:
    spec = task.spec
    method = worker.lookup(
        spec.run_id, state_key(spec, task.partition), version=task.first + task.count - 1
    )
    optimizer = 0
    if method is not None:
        optimizer = sum(
            np.asarray(value).nbytes
            for value in method.state_dict().values()
            if isinstance(value, np.ndarray)
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return StageMemory(
        task.partition,
        task.stage_index,
        int(stage_worker.flat.weights.nbytes),
        int(stage_worker.flat.gradients.nbytes),
        int(optimizer),
        int(peak),
    )
