"""``LocalSGD(period=k, warmup_iterations=w)``: post-local SGD, periodic model averaging.

Lin et al., "Don't Use Large Mini-Batches, Use Local SGD" (ICLR 2020); PyTorch offers it as
``PostLocalSGDOptimizer`` with a ``PeriodicModelAverager``. The first ``w`` iterations are
exact synchronous SGD (the replicated update: one stage per iteration). After them, each
*round* of ``k`` iterations is ONE Spark stage: partition ``j`` steps its own replica
``k`` times on its own share of each global batch, with its own optimizer state, without any
shuffle; then every partition sends its weights and running statistics to every partition
(one shuffle) and each one averages them, weighted by its share of the global batch, before
the next round. Spark's fixed cost of a stage is paid once per ``k`` iterations instead of
once per iteration.

What the mathematics is:

* **The local step.** Partition ``j``'s gradient is that of the mean loss of its share
  ``b_j`` (not of ``b_j / B`` of it, as in the exact modes): each replica is plain SGD on
  its own mini-batch of ``b_j`` samples. The average weighs replica ``j`` by ``b_j / B``.
  For an update that is linear in the gradient (SGD, with or without momentum and weight
  decay) ``period=1`` therefore gives exactly the synchronous weights; for Adam and other
  non-linear rules it gives something close but not equal.
* **Clipping** (constant or by L2 norm) applies to each partition's own gradient.
* **The optimizer state stays per partition** and is never averaged (PyTorch's
  ``PostLocalSGDOptimizer`` does the same): momentum or Adam moments describe the
  trajectory of the replica that built them, and averaging them would cost another
  all-reduce of the state's size (two or three times the weights') every round for no
  measured gain. During warm-up every partition holds the same state (the replicated
  update's); after it the states drift apart. Checkpoints keep every partition's whole
  state, so a resume continues each one exactly; resuming with another partition count (or
  in an exact mode) averages them into one.
* **The learning-rate schedule** is the driver's, as in every mode: every partition steps
  its schedule with the global iteration number, epoch and validation metric, so the
  schedule advances once per iteration, not once per round.
* **Where the model is averaged.** After every ``k``-th iteration from the end of warm-up,
  and wherever the driver needs one model before a round ends — at the end of an epoch,
  where validation or a checkpoint fires, at the end of training. Checkpoints are
  therefore always taken at averaging boundaries. Pick ``k`` dividing the iterations per
  epoch (and the validation/checkpoint intervals) to average strictly every ``k``.
* **A non-finite loss** on a partition leaves that replica as it was for that iteration
  (its schedule advances). With ``skip_nonfinite_batches=True`` the replica goes on with
  the next batch. Otherwise training stops at that iteration, as in the exact modes, with
  the weights from before it: the average of the replicas after the iteration before. The
  partitions learn of the loss only at the round's end, when the others have trained past
  it, so the driver then trains the job's iterations before it again, from the job's start
  (the same weights, states, running statistics and batches give the same bytes), and
  keeps that average.
* **Running statistics** (BatchNorm's) are averaged with the weights at the end of every
  round, and every job of local rounds starts from the driver's copy of the last average:
  a replica rebuilt on another host has no other.
"""

from __future__ import annotations

import dataclasses
import numbers
import time
from typing import Any, NamedTuple

from bigdl_py.spark import collectives, owner_update, worker
from bigdl_py.spark.modes import TrainingMode, are_whole_states, whole_state
from bigdl_py.spark.modes.replicated import one_stage_per_iteration
from bigdl_py.spark.modes.stages import Stage, chain_end, own_rows, replica_trainer, stage_task
from bigdl_py.spark.records import Carried, HistoryEntry
from bigdl_py.spark.replica import Replica, ShareOf, replica_gradient


class LocalSGD(TrainingMode):
    """Post-local SGD: ``warmup_iterations`` synchronous, then model averaging every ``period``.

    Parameters
    ----------
    period : int
        Iterations each partition trains on its own between two averagings (``k`` >= 1).
    warmup_iterations : int
        Iterations of exact synchronous SGD first (``w`` >= 0).

    Raises
    ------
    ValueError
        If ``period`` is not a positive integer or ``warmup_iterations`` a non-negative one.

    Examples
    --------
    >>> from bigdl_py.spark import DistriOptimizer, LocalSGD
    >>> optimizer = DistriOptimizer(model, data, nn.NLLLoss(), SGD(lr=0.05, momentum=0.9),
    ...                             batch_size=128, end_trigger=MaxEpoch(3),
    ...                             update=LocalSGD(period=8, warmup_iterations=100))
    """

    name = "local-sgd"
    # The whole state on every partition, as the replicated update keeps it: warm-up's state
    # continues into the local rounds.
    state_name = "replicated"

    def __init__(self, period: int = 8, warmup_iterations: int = 0):
        if isinstance(period, bool) or not isinstance(period, numbers.Integral) or period < 1:
            raise ValueError(f"LocalSGD: period must be a positive integer, got {period!r}")
        if (
            isinstance(warmup_iterations, bool)
            or not isinstance(warmup_iterations, numbers.Integral)
            or warmup_iterations < 0
        ):
            raise ValueError(
                "LocalSGD: warmup_iterations must be a non-negative integer, got "
                f"{warmup_iterations!r}"
            )
        self.period = int(period)
        self.warmup_iterations = int(warmup_iterations)
        self._warmup_per_job = 1

    def __repr__(self) -> str:
        return f"LocalSGD(period={self.period}, warmup_iterations={self.warmup_iterations})"

    # --- the driver's side ------------------------------------------------------------
    def iterations_per_call(self, requested: int, spec: Any) -> int:
        # Warm-up chains as the replicated update does; a local job holds whole rounds (a
        # round is one stage whatever its length, so a job of one round needs no shared disk).
        self._warmup_per_job = requested
        return max(requested, self.period * max(1, requested // self.period))

    def steps_to_run(self, first: int, count: int) -> int:
        if first < self.warmup_iterations:  # warm-up and local rounds never share a job
            return min(count, self._warmup_per_job, self.warmup_iterations - first)
        if self._warmup_per_job <= 1:
            # No chaining (executors without a shared disk): a job starting mid-round (after
            # one that ended at an epoch, a validation or a checkpoint) stops at the round's
            # end. A second round would be a second stage, whose task may run on another host
            # than the state the first one left.
            return min(count, self.period - (first - self.warmup_iterations) % self.period)
        return count

    def run(self, run, chain, description):
        start = (run.weights, run.buffers, run.initial_optim_states)
        outcomes = super().run(run, chain, description)
        # Warm-up is exact: its stages stop at a non-finite loss themselves.
        if chain.first < self.warmup_iterations or not chain.stop_after_nonfinite:
            return outcomes
        stop = next((step for step, done in enumerate(outcomes) if not done["finite"]), None)
        if stop is None:
            return outcomes
        # The replicas whose losses were finite went on past ``stop`` until the round's end:
        # the weights before it come from training the steps before it again.
        run.weights, run.buffers, run.initial_optim_states = start
        before = []
        if stop > 0:
            again = dataclasses.replace(
                chain,
                shares=chain.shares[:stop],
                schedules=chain.schedules[:stop],
                # The first job's copy is released. (Its frozen weights are None: DistriOptimizer
                # trains the whole model.)
                get_weights=run.ship(run.weights),
            )
            before = super().run(run, again, f"{description}, up to the non-finite loss")
        return before + outcomes[stop : stop + 1]

    def build_chain(self, chain):
        """The chain's stages; a job of local rounds loads ``chain.buffers`` (the running
        statistics the last job averaged) into every replica first. A replica keeps its own
        between jobs otherwise, and one rebuilt after a cache miss (a lost host, another
        Python worker) the model's initial ones: both differ from the averaged ones."""
        if chain.first < self.warmup_iterations:
            return one_stage_per_iteration(chain)
        rounds = self.rounds(chain.first, chain.count)
        fractions = _share_fractions([len(share) for share in chain.shares[0]])
        rdd = chain.data_rdd
        for index in range(len(rounds) + 1):
            rdd = rdd.mapPartitionsWithIndex(_round_stage(chain, rounds, index, fractions))
            if index < len(rounds):
                rdd = chain.shuffle(rdd)
        return rdd

    def rounds(self, first: int, count: int) -> list[tuple[int, int]]:
        """The chain's rounds as ``(start, stop)`` steps: each ends after an iteration ``t``
        with ``(t + 1 - warmup_iterations) % period == 0``, or at the chain's end."""
        rounds, start = [], 0
        for step in range(count):
            iteration = first + step
            if (iteration + 1 - self.warmup_iterations) % self.period == 0 or step == count - 1:
                rounds.append((start, step + 1))
                start = step + 1
        return rounds

    def resume_states(self, shards, flat_size, count):
        if len(shards) == count and are_whole_states(shards, flat_size):
            return [dict(shard) for shard in shards]  # every partition's own state
        return [whole_state(shards, flat_size) for _ in range(count)]

    # --- the executors' side ------------------------------------------------------------
    def initial_state(self, shards, partition, flat_size):
        return dict(shards[partition])

    def checkpoint_state(self, state, partition, bounds):
        return state  # the whole state of each partition: they differ after warm-up

    def __deepcopy__(self, memo):
        clone = LocalSGD(self.period, self.warmup_iterations)
        clone._warmup_per_job = self._warmup_per_job
        return clone


def _share_fractions(share_sizes: list[int]) -> list[float]:
    """Each partition's weight in the average: its share of the global batch."""
    total = sum(share_sizes)
    return [size / total for size in share_sizes]


class _RoundRecord(NamedTuple):
    """What a partition sends every partition at the end of a local round."""

    piece: collectives.Piece  # its weights x its share fraction
    buffers: dict | None  # its running statistics x its share fraction
    losses: list[HistoryEntry]  # its own part of each of the round's iterations
    halted: bool
    history: list[HistoryEntry] | None  # the chain's finished iterations, from 0 to 0 only
    clock: tuple[float, float]  # when it entered Python and left it
    state: dict | None  # its optimizer state, to itself only, where the state travels


class _Averaged(NamedTuple):
    """A round's records, read: what the next round starts from, and what came with it."""

    carried: Carried  # the averaged weights and statistics, the merged history
    clock: tuple[float, float]  # the round's first entry into Python and last exit
    state: dict | None  # this partition's own optimizer state, where it travels


def _average(partition: int, rows: list, count: int) -> _Averaged:
    """Average the weights and buffers of every partition's record; merge the losses."""
    records = sorted((record for _, record in rows), key=lambda record: record.piece.rank)
    _, weights = collectives.combine_owned_pieces(
        partition, (record.piece for record in records), count, "sum", "LocalSGD average"
    )
    buffers = None
    if records[0].buffers:
        buffers = {
            name: collectives.combine([record.buffers[name] for record in records], "sum")
            for name in records[0].buffers
        }
    history = next((record.history for record in records if record.history is not None), None)
    if history is not None:
        for position in range(len(records[0].losses)):
            parts = [record.losses[position] for record in records]
            history = history + [
                HistoryEntry(
                    float(sum(part.loss_sum for part in parts)),
                    int(sum(part.count for part in parts)),
                    max(part.forward_backward for part in parts),
                    max(part.update for part in parts),
                )
            ]
    halted = any(record.halted for record in records)
    clock = (min(r.clock[0] for r in records), max(r.clock[1] for r in records))
    return _Averaged(Carried(weights, halted, history, buffers), clock, records[partition].state)


def _round_stage(chain, rounds: list, index: int, fractions: list[float]):
    """Stage ``index``: average the previous round's replicas (when index > 0), then train
    round ``index`` locally (when index < len(rounds)) and send the result to everyone. The
    first stage starts from the driver's weights and running statistics."""
    steps = range(*rounds[index]) if index < len(rounds) else range(0)
    stage = Stage.of(
        chain,
        reads_driver=index == 0,
        first_update=index == 0,
        trains=[chain.first + step for step in steps],
        updates=chain.first + steps[-1] if steps else None,
        last=index == len(rounds),
    )
    shares = [chain.shares[step] for step in steps]
    schedules = [chain.schedules[step] for step in steps]
    first, final = chain.first, index == len(rounds)

    def body(inp):
        spec, partition = inp.spec, inp.partition
        carried = inp.carried
        if carried is None:
            averaged = _average(partition, inp.rows, stage.num_partitions)
            carried = averaged.carried
            if final:  # slice j of the averaged weights to the driver
                weight_slice = stage.slice_of(carried.weights, partition)
                yield chain_end(
                    partition, weight_slice, carried, averaged.clock, inp.entered, averaged.state
                )
                return
        replica = worker.fetch(
            spec.run_id, ("replica", partition), lambda: Replica(spec, inp.handle)
        )
        if carried.buffers:
            replica.load_buffers(carried.buffers)
        weights, halted = carried.weights, carried.halted
        losses = []
        iteration = first + steps.start - 1  # the state's version before the round
        for step, iteration in enumerate(first + s for s in steps):
            # A halted partition still records its (unchanged) state: the next iteration,
            # a retry or the next job finds every version.
            gradient, report = replica_gradient(
                spec,
                partition=partition,
                handle=inp.handle,
                weights=weights,
                share=shares[step][partition],
                iteration=iteration,
                entered=inp.entered,
                share_of=ShareOf.OWN_BATCH,
                halted=halted,
                frozen_weights=stage.get_frozen(),
                rows=own_rows(inp, iteration),
                train=replica_trainer(spec),
            )
            update_started = time.perf_counter()
            weights = owner_update.update_owned(
                spec,
                partition,
                iteration,
                stage.resumed_states,
                weights,
                gradient,
                report.loss_sum,
                schedules[step],
                halted=halted,
                retain_from=stage.retain_from,
                # The state before the round, where it came with the input.
                carried_state=inp.own.state if inp.own is not None and step == 0 else None,
            )
            seconds = time.perf_counter() - update_started
            losses.append(HistoryEntry(report.loss_sum, report.samples, report.seconds, seconds))
            halted = halted or owner_update.stops_chain(report.loss_sum, stage.stop_after_nonfinite)
        fraction = fractions[partition]
        piece = collectives.whole_piece(partition, weights * weights.dtype.type(fraction))
        own_buffers = None
        if replica.buffer_names:
            own_buffers = {name: value * fraction for name, value in replica.buffers().items()}
        clock = (inp.entered, time.time())
        state = owner_update.travelling_state(spec, partition, iteration, stage.bounds)
        for destination in range(stage.num_partitions):
            to_zero = destination == 0 and partition == 0
            own = destination == partition
            yield (
                destination,
                _RoundRecord(
                    piece,
                    own_buffers,
                    losses,
                    halted,
                    carried.history if to_zero else None,
                    clock,
                    state if own else None,
                ),
            )

    return stage_task(stage, body)
