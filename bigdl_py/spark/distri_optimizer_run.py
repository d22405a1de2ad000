"""The Spark side of a DistriOptimizer: cached partition data, and the jobs of the iterations.

One iteration (BigDL's AllReduceParameter, with Spark's public APIs only), as
:meth:`SparkTrainingRun.run_iteration` runs it in ONE job:

* the driver ships the current flat weights (in the task closure when small, else by a
  broadcast that is destroyed after the job);
* **forward-backward stage** over the cached RDD of partition handles: partition ``j``
  runs its share through its worker-resident replica and emits gradient slice ``k`` keyed
  by ``k`` (optionally float16/bfloat16 on the wire);
* **shuffle** (``partitionBy(N, identity)``): slice ``k`` of every replica reaches owner
  ``k`` — a reduce-scatter; the driver never sees or sums a gradient;
* **update stage** on owner ``k``: sum, clip, OptimMethod step on weight slice ``k`` with the
  optimizer state it owns (sharded N ways, kept by the worker between iterations and on the
  host's disk); it returns its updated weight slice;
* the driver concatenates the N updated slices — the one copy of the weights that passes
  through it — and ships them to the next iteration (the all-gather half of the AllReduce).

With global L2-norm clipping the update needs the norm of the *summed* gradient, known only
after every owner has summed its slice: owners then return their squared norms in the first
job and step in a second, small job over ``owner_rdd``.

Spark's fixed cost per job and per stage dominates a small model's iteration
(bench/RESULTS.md), so several iterations can share one job:

* :meth:`SparkTrainingRun.run_chain` (sharded update): the same two stages per iteration,
  but the owners send their updated slices to every partition through a second shuffle (an
  all-gather) that the next iteration's forward-backward stage reads; only the last
  iteration's slices reach the driver.
* :meth:`SparkTrainingRun.run_replicated_chain` (replicated update, PyTorch DDP's way):
  every partition sends its whole gradient to every partition, and each one sums them and
  steps the whole vector with its own full optimizer state before its next
  forward-backward — ONE stage per iteration, N times the shuffle bytes.

Every chained stage is a pure function of its shuffle input and the state files on its
host's disk (kept from the chain's start), so Spark can recompute any of them after losing
an executor and get the same bytes.

PySpark has no ``zipPartitions``; the replicas live in the Python workers' caches, keyed by
partition, next to the data they train on (the cached handle RDD), which is what BigDL's
zipped model and data RDDs achieve: partition ``j``'s replica trains on partition ``j``'s data
on the executor that holds it, and is rebuilt from the run spec wherever that moves. A
chained stage after the first reads a shuffle, not the cached handles: it finds its data
through the partition's handle on its host (local and local-cluster modes share one disk;
on a multi-host cluster without a shared ``BIGDL_PY_STATE_DIR``, a task that lands away
from its data fails with a message that says so — use ``iterations_per_job=1`` there).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from typing import Any, NamedTuple

import numpy as np
from pyspark import cloudpickle

from bigdl_py import backend
from bigdl_py.data.sample import MiniBatch, Sample
from bigdl_py.optim.sharding import all_slice_bounds, split_state_dict
from bigdl_py.spark import collectives, wire, worker
from bigdl_py.spark import distri_optimizer_tasks as tasks

# Weights up to this size travel inside the task closure (one pickle per task, no broadcast
# bookkeeping); bigger ones by broadcast, which each executor fetches once.
CLOSURE_WEIGHTS_LIMIT_BYTES = 2 << 20


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


def python_error_text(error: Exception) -> str:
    """The last Python exception line inside a Py4J/Spark error, or the first line."""
    text = str(error)
    python_lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip().split(":", 1)[0].endswith(("Error", "Exception"))
        and not line.strip().startswith(("org.", "java.", "py4j", "Caused by", "scala."))
    ]
    return python_lines[-1] if python_lines else text.strip().splitlines()[0]


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

    for row in rows:
        if isinstance(row, MiniBatch):
            flush()
            if row.labels is None:
                raise ValueError(f"partition {partition}: a training MiniBatch has no labels")
            feature_blocks.append(list(row.features))
            label_blocks.append(np.asarray(row.labels))
        elif isinstance(row, Sample):
            pending.append(row)
        elif isinstance(row, tuple) and len(row) == 2:
            pending.append(Sample(row[0], row[1]))
        else:
            raise TypeError(
                f"partition {partition}: training data rows must be Samples, (features, label) "
                f"pairs or MiniBatches, got {type(row).__name__}"
            )
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
        self, sc, rdd, num_partitions: int, state_dir: str | None = None, sources: list = ()
    ):
        self.sc = sc
        # Broadcasts ``rdd`` reads from: kept while the data lives (an executor lost later
        # rebuilds its partitions from them), destroyed by close().
        self.sources = list(sources)
        self.num_partitions = int(num_partitions)
        self.data_id = "data-" + uuid.uuid4().hex[:12]
        self.state_dir = state_dir or tasks.default_state_dir()
        if rdd.getNumPartitions() != self.num_partitions:
            rdd = rdd.repartition(self.num_partitions)
        data_id, state_dir = self.data_id, self.state_dir

        def write(partition, rows):
            features, labels = stack_partition(partition, rows)
            directory = tasks.run_directory(state_dir, data_id)
            yield tasks.write_partition_data(directory, partition, features, labels)

        self.handles = rdd.mapPartitionsWithIndex(write).cache()
        self.sc.setJobDescription("bigdl_py: cache the training data on the executors")
        try:
            infos = sorted(self.handles.collect(), key=lambda handle: handle["partition"])
        except Exception as error:
            self.close()
            raise ValueError(
                f"preparing the training data failed: {python_error_text(error)}"
            ) from None
        finally:
            self.sc.setJobDescription(None)
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
        _remove_run_everywhere(self.sc, self.state_dir, self.data_id, self.num_partitions)
        for broadcast in self.sources:
            broadcast.destroy()
        self.sources = []


def _remove_run_everywhere(sc, state_dir: str, run_id: str, count: int) -> None:
    def clean(_, rows):
        drain(rows)
        worker.release_run(run_id)
        shutil.rmtree(os.path.join(state_dir, f"bigdl_py-run-{run_id}"), ignore_errors=True)
        yield 0

    try:
        sc.setJobDescription(f"bigdl_py: clean up {run_id}")
        sc.parallelize(range(count), count).mapPartitionsWithIndex(clean).collect()
    except Exception:  # clean-up is best effort; a dead executor's files went with it
        pass
    finally:
        sc.setJobDescription(None)
        shutil.rmtree(os.path.join(state_dir, f"bigdl_py-run-{run_id}"), ignore_errors=True)


def _task_timings(fb: tuple, entered: float, started: float) -> dict:
    """What an owner task reports about its iteration (wall clocks of one host or NTP)."""
    fb_seconds, (fb_entered, fb_left) = fb
    return {
        "forward_backward": fb_seconds,
        "fb_entered": fb_entered,
        "fb_left": fb_left,
        "update_entered": entered,
        "update": time.perf_counter() - started,
        "update_left": time.time(),
    }


def _iteration_breakdown(submitted: float, returned: float, timings: list[dict]) -> dict:
    """Seconds of one iteration by phase, from the driver's and the tasks' clocks.

    ``to_first_task``: job submission, scheduling, task deserialisation and the Python
    worker hand-off until the first forward-backward task runs Python code;
    ``forward_backward``: the slowest partition's compute; ``shuffle``: from the last
    forward-backward task leaving Python to the first owner task entering it (shuffle write,
    stage boundary, fetch, worker hand-off); ``update``: the slowest owner's sum + step;
    ``to_driver``: from the last owner leaving Python to collect() returning.
    """
    fb_entered = min(t["fb_entered"] for t in timings)
    fb_left = max(t["fb_left"] for t in timings)
    update_entered = min(t["update_entered"] for t in timings)
    update_left = max(t["update_left"] for t in timings)
    return {
        "job": returned - submitted,
        "to_first_task": fb_entered - submitted,
        "forward_backward": max(t["forward_backward"] for t in timings),
        "shuffle": update_entered - fb_left,
        "update": max(t["update"] for t in timings),
        "to_driver": returned - update_left,
    }


def _step_owner(
    spec,
    owner: int,
    iteration: int,
    initial_states,
    weight_slice: np.ndarray,
    start: int,
    summed: np.ndarray,
    loss_sum: float,
    schedule: dict,
    l2_scale: float = 1.0,
    *,
    retain_from: int | None = None,
    whole: bool = False,
    halted: bool = False,
) -> np.ndarray:
    """Owner ``owner``'s step of iteration ``iteration`` on ``weight_slice`` (which starts at
    flat offset ``start``; the whole vector, at 0, with ``whole``): its updated weights.

    A non-finite loss (or clipping scale) leaves the slice and the optimizer state as they
    were and only advances the schedule: the driver decides what to do about it. A
    ``halted`` chain (stopped by an earlier non-finite loss) changes nothing at all. The
    state is recorded under ``iteration`` in every case, for the next step to find.
    """
    method = tasks.owned_shard(spec, owner, iteration, initial_states, whole)
    if halted:
        new_slice = np.array(weight_slice, dtype=np.float32)
    elif np.isfinite(loss_sum) and np.isfinite(l2_scale):
        new_slice = tasks.update_owned_slice(
            method, weight_slice, summed, start, schedule, l2_scale
        )
    else:
        tasks.follow_schedule_only(method, schedule)
        new_slice = np.array(weight_slice, dtype=np.float32)
    tasks.keep_shard(spec, owner, method, iteration, retain_from, whole)
    return new_slice


# --- chained iterations: what travels between their stages -----------------------------------
class _Report(NamedTuple):
    """What a chained forward-backward task tells each task that reads its gradient."""

    loss_sum: float
    samples: int
    seconds: float  # the forward-backward's compute
    buffers: dict | None  # partition 0's running statistics, last iteration, to owner 0 only
    clock: tuple[float, float]  # wall clock when the task entered and left Python


class _GradientRecord(NamedTuple):
    """One partition's gradient (or its slice) on its way to one destination partition."""

    piece: collectives.Piece
    report: _Report
    halted: bool  # an earlier iteration of the chain had a non-finite loss: do nothing
    history: list | None  # the chain's finished iterations, from partition 0 to 0 only
    weights: np.ndarray | None  # the weights it was computed on, to its own number only


def _gradient_record(destination, partition, piece, report, halted, history, weights):
    """The record ``partition`` sends ``destination``: the loss report to all, the running
    statistics and the history to 0 only, the weights (or their slice) to itself only, so
    the stage that updates them needs no cache and stays a pure function of its input."""
    return _GradientRecord(
        piece,
        report if destination == 0 else report._replace(buffers=None),
        halted,
        history if destination == 0 and partition == 0 else None,
        weights if destination == partition else None,
    )


class _Received(NamedTuple):
    """A chained update's input, read: the summed gradient (slice) and what came with it."""

    summed: np.ndarray
    reports: list[_Report]
    halted: bool
    history: list | None
    weights: np.ndarray
    loss_sum: float
    samples: int


def _receive_gradients(destination: int, rows: list, count: int) -> _Received:
    records = [record for _, record in rows]
    _, summed = collectives.combine_owned_pieces(
        destination, (record.piece for record in records), count, "sum", "AllReduce"
    )
    reports = [record.report for record in records]
    return _Received(
        summed,
        reports,
        records[0].halted,
        next((record.history for record in records if record.history is not None), None),
        next(record.weights for record in records if record.weights is not None),
        float(sum(report.loss_sum for report in reports)),
        int(sum(report.samples for report in reports)),
    )


def _history_with(received: _Received, started: float) -> list | None:
    """The chain's history with this iteration appended (None where it does not travel)."""
    if received.history is None:
        return None
    entry = {
        "loss_sum": received.loss_sum,
        "count": received.samples,
        "forward_backward": max(report.seconds for report in received.reports),
        "update": time.perf_counter() - started,
    }
    return received.history + [entry]


def _chain_end(received: _Received, entered: float, started: float) -> tuple:
    """The last update's ``(buffers, timings)`` for the driver."""
    reports = received.reports
    buffers = next((report.buffers for report in reports if report.buffers is not None), None)
    clock = (min(r.clock[0] for r in reports), max(r.clock[1] for r in reports))
    fb_seconds = max(report.seconds for report in reports)
    return buffers, _task_timings((fb_seconds, clock), entered, started)


def _chained_forward_backward(
    spec,
    partition: int,
    handle: dict,
    weights,
    halted: bool,
    local_indices: list,
    iteration: int,
    last: bool,
    entered: float,
) -> tuple[np.ndarray, _Report]:
    """Forward-backward of ``partition`` in a chained stage: its gradient and report; zeros
    once an earlier iteration of the chain stopped it (non-finite loss)."""
    started = time.perf_counter()
    replica = worker.fetch(spec.run_id, ("replica", partition), lambda: tasks.Replica(spec, handle))
    if halted:
        gradient, loss_sum, samples = np.zeros(weights.size, np.float32), 0.0, 0
    else:
        gradient, loss_sum, samples = tasks.forward_backward(
            replica,
            weights,
            local_indices[partition],
            spec.batch_size,
            iteration,
            spec.gradient_accumulation,
        )
    buffers = None
    if last and partition == 0 and replica.buffer_names:
        buffers = replica.buffers()
    seconds = time.perf_counter() - started
    return gradient, _Report(loss_sum, samples, seconds, buffers, (entered, time.time()))


class SparkTrainingRun:
    """One ``optimize()`` on Spark: replicas and optimizer shards of a run on the executors.

    Parameters
    ----------
    data : PartitionedData
    spec : tasks.RunSpec
        Model, criterion, optim method, clipping, wire dtype; shipped once by broadcast.
    weights : np.ndarray
        The initial flat weights (float32).
    initial_optim_states : dict, optional
        ``{"iteration": t, "shards": [state dict per shard]}`` to resume from.
    """

    def __init__(self, data: PartitionedData, spec, weights: np.ndarray, initial_optim_states=None):
        self.sc = data.sc
        self.data = data
        self.spec = spec
        self.num_partitions = data.num_partitions
        self.weights = np.array(weights, dtype=np.float32)
        self.slice_bounds = all_slice_bounds(self.weights.size, self.num_partitions)
        self.initial_optim_states = initial_optim_states
        self.buffers: dict[str, np.ndarray] | None = None
        self.last_timings: dict[str, float] = {}
        self._broadcasts: list = []
        self._last_rdd = None
        # cloudpickle, not the broadcast's plain pickle: models and criteria defined in a
        # notebook or a job's __main__ must reach the executors by value.
        self.spec_broadcast = self.sc.broadcast(cloudpickle.dumps(spec))
        self.owner_rdd = self.sc.parallelize(range(self.num_partitions), self.num_partitions)

    # --- shipping -----------------------------------------------------------------------
    def _ship_weights(self, weights: np.ndarray | None = None):
        """A zero-argument function that returns ``weights`` (default: the run's weights)
        on the executor: in the task closure when small, else by a one-iteration broadcast."""
        weights = self.weights if weights is None else weights
        if weights.nbytes <= CLOSURE_WEIGHTS_LIMIT_BYTES:
            return lambda: weights
        broadcast = self.sc.broadcast(weights)
        self._broadcasts.append(broadcast)
        return lambda: broadcast.value

    def _spec_loader(self):
        spec_broadcast, run_id = self.spec_broadcast, self.spec.run_id

        def load_spec():
            return worker.fetch(run_id, "spec", lambda: cloudpickle.loads(spec_broadcast.value))

        return load_spec

    # --- one iteration ------------------------------------------------------------------
    def run_iteration(
        self,
        iteration: int,
        local_indices: list,
        schedule: dict,
        description: str,
        frozen_weights: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """Run global iteration ``iteration`` (0-based) on the shares ``local_indices``.

        The weights advance in place unless the loss was not finite (then every shard
        skips its update and ``finite`` is False in the result). ``frozen_weights`` are the
        values of the parameters outside ``spec.trainable``, when the run trains a part.
        """
        load_spec = self._spec_loader()
        num_partitions = self.num_partitions
        get_weights = self._ship_weights()
        get_frozen = (
            self._ship_weights(np.asarray(frozen_weights, dtype=np.float32))
            if frozen_weights is not None
            else (lambda: None)
        )
        bounds = self.slice_bounds
        initial_states = self.initial_optim_states
        two_phase = self.spec.l2_clipping is not None

        def forward_backward(partition, handles):
            entered = time.time()
            started = time.perf_counter()
            spec = load_spec()
            (handle,) = drain(handles)
            replica = worker.fetch(
                spec.run_id, ("replica", partition), lambda: tasks.Replica(spec, handle)
            )
            gradient, loss_sum, count = tasks.forward_backward(
                replica,
                get_weights(),
                local_indices[partition],
                spec.batch_size,
                iteration,
                spec.gradient_accumulation,
                get_frozen(),
            )
            buffers = replica.buffers() if partition == 0 and replica.buffer_names else None
            seconds = time.perf_counter() - started
            report = (loss_sum, count, seconds, buffers, (entered, time.time()))
            for owner, piece in collectives.pieces_for_owners(
                partition, gradient, num_partitions, spec.wire_dtype
            ):
                yield owner, (piece, report if owner == 0 else report[:3] + (None, report[4]))

        def gather(owner, records):
            """Owner ``owner``: the sum of gradient slice ``owner`` over the replicas (in
            partition order, float32), and the replicas' reports."""
            records = list(records)
            _, summed = collectives.combine_owned_pieces(
                owner, (piece for _, (piece, _) in records), num_partitions, "sum", "AllReduce"
            )
            reports = [report for _, (_, report) in records]
            loss_sum = float(sum(report[0] for report in reports))
            count = int(sum(report[1] for report in reports))
            fb_seconds = max(report[2] for report in reports)
            buffers = next((report[3] for report in reports if report[3] is not None), None)
            clock = (min(r[4][0] for r in reports), max(r[4][1] for r in reports))
            return summed, loss_sum, count, (fb_seconds, clock), buffers

        def reduce_and_update(owner, records):
            entered = time.time()
            started = time.perf_counter()
            spec = load_spec()
            summed, loss_sum, count, fb, buffers = gather(owner, records)
            tasks.clip_summed_slice(spec, summed)
            start, stop = bounds[owner]
            new_slice = _step_owner(
                spec,
                owner,
                iteration,
                initial_states,
                get_weights()[start:stop],
                start,
                summed,
                loss_sum,
                schedule,
                1.0,
            )
            timings = _task_timings(fb, entered, started)
            yield owner, new_slice, loss_sum, count, buffers, timings

        def reduce_and_keep(owner, records):
            entered = time.time()
            started = time.perf_counter()
            spec = load_spec()
            summed, loss_sum, count, fb, buffers = gather(owner, records)
            tasks.clip_summed_slice(spec, summed)
            worker.store(spec.run_id, ("summed", owner), summed, version=iteration)
            directory = tasks.run_directory(spec.state_dir, spec.run_id)
            tasks.save_npy_atomically(os.path.join(directory, f"summed-{owner}.npy"), summed)
            squares = spec.l2_clipping.sum_of_squares(summed)
            timings = _task_timings(fb, entered, started)
            yield owner, squares, loss_sum, count, buffers, timings

        gradients = self.data.handles.mapPartitionsWithIndex(forward_backward).partitionBy(
            num_partitions, collectives.owner_partition
        )
        submitted = time.time()
        try:
            if not two_phase:
                self.sc.setJobDescription(f"{description}: forward-backward + update")
                updated = gradients.mapPartitionsWithIndex(reduce_and_update)
                self._last_rdd = updated
                results = updated.collect()
            else:
                self.sc.setJobDescription(f"{description}: forward-backward + gradient norm")
                kept = gradients.mapPartitionsWithIndex(reduce_and_keep)
                self._last_rdd = kept
                norms = kept.collect()
                total_squares = float(sum(record[1] for record in norms))
                l2_scale = self.spec.l2_clipping.scale_for(total_squares)
                loss_by_owner = {record[0]: record[2] for record in norms}

                def update_kept(owner, rows):
                    drain(rows)
                    spec = load_spec()
                    summed = worker.lookup(spec.run_id, ("summed", owner), version=iteration)
                    if summed is None:
                        directory = tasks.run_directory(spec.state_dir, spec.run_id)
                        summed = np.load(
                            os.path.join(directory, f"summed-{owner}.npy"), allow_pickle=False
                        )
                    start, stop = bounds[owner]
                    new_slice = _step_owner(
                        spec,
                        owner,
                        iteration,
                        initial_states,
                        get_weights()[start:stop],
                        start,
                        summed,
                        loss_by_owner[owner],
                        schedule,
                        l2_scale,
                    )
                    yield owner, new_slice

                self.sc.setJobDescription(f"{description}: clipped update")
                slices = dict(self.owner_rdd.mapPartitionsWithIndex(update_kept).collect())
                results = [
                    (owner, slices[owner], loss, count, buffers, timings)
                    for owner, _, loss, count, buffers, timings in norms
                ]
        except Exception as error:
            raise DistributedTrainingError(
                f"iteration {iteration + 1} failed: {python_error_text(error)}"
            ) from None
        finally:
            self.sc.setJobDescription(None)
            self._release_job()
        returned = time.time()
        results.sort(key=lambda record: record[0])
        self.weights = np.concatenate([np.asarray(record[1]) for record in results])
        self.initial_optim_states = None  # the shards now keep their own state
        _, _, loss_sum, count, buffers, timings = results[0]
        if buffers is not None:
            self.buffers = buffers
        self.last_timings = _iteration_breakdown(
            submitted, returned, [record[5] for record in results]
        )
        return {"loss": loss_sum / max(count, 1), "count": count, "finite": np.isfinite(loss_sum)}

    # --- several iterations in one job ----------------------------------------------------
    def run_chain(
        self,
        first: int,
        shares: list[list],
        schedules: list[dict],
        description: str,
        stop_after_nonfinite: bool,
    ) -> list[dict[str, Any]]:
        """Run iterations ``first .. first + len(shares) - 1`` as ONE Spark job.

        Each iteration is two stages, as in :meth:`run_iteration`: forward-backward with a
        reduce-scatter shuffle of the gradient slices, then the owners' update. Here the
        owners do not return their slices to the driver: they send them to every partition
        through a second shuffle (an all-gather), and the next iteration's forward-backward
        stage reads them there. Only the last iteration's slices reach the driver. The job
        thus pays Spark's job overhead once per ``len(shares)`` iterations, and the driver
        builds the whole lineage before submitting it.

        Every stage is a pure function of its inputs and the shard states on the hosts'
        disks, which are all kept from the chain's start: Spark can recompute any stage after
        losing an executor and get the same bytes.

        With ``stop_after_nonfinite``, an iteration whose loss is not finite leaves weights
        and state unchanged and every later iteration of the chain does nothing; the result
        lists the iterations up to that one.

        Returns one ``{"loss", "count", "finite"}`` dict per iteration that ran.
        """
        count = len(shares)
        load_spec = self._spec_loader()
        num_partitions = self.num_partitions
        bounds = self.slice_bounds
        get_weights = self._ship_weights()
        initial_states = self.initial_optim_states
        handles = {handle["partition"]: handle for handle in self.data.partition_handles}
        retain_from = first - 1

        def forward_backward_stage(step: int):
            iteration, local_indices = first + step, shares[step]
            last = step == count - 1
            # Only the first stage reads the driver's weights: the closure of every other
            # stage must not drag them (pickled into each stage's tasks) along.
            driver_weights = get_weights if step == 0 else None

            def forward_backward(partition, rows):
                entered = time.time()
                spec = load_spec()
                rows = drain(rows)
                if step == 0:  # the cached handles RDD, and the driver's weights
                    (handle,) = rows
                    weights, halted, history = driver_weights(), False, []
                else:  # the all-gather: (partition, (owner, slice, halted, history))
                    handle = handles[partition]
                    received = sorted((record[1] for record in rows), key=lambda r: r[0])
                    weights = np.concatenate([np.asarray(r[1]) for r in received])
                    halted, history = received[0][2], received[0][3]
                gradient, report = _chained_forward_backward(
                    spec,
                    partition,
                    handle,
                    weights,
                    halted,
                    local_indices,
                    iteration,
                    last,
                    entered,
                )
                for owner, piece in collectives.pieces_for_owners(
                    partition, gradient, num_partitions, spec.wire_dtype
                ):
                    start, stop = bounds[owner]
                    yield (
                        owner,
                        _gradient_record(
                            owner, partition, piece, report, halted, history, weights[start:stop]
                        ),
                    )

            return forward_backward

        def owner_stage(step: int):
            iteration, schedule = first + step, schedules[step]
            last = step == count - 1
            # A resume's shard states serve the first update only (later ones find the state
            # their predecessor kept); they stay out of the other stages' closures.
            resumed_states = initial_states if step == 0 else None

            def update(owner, rows):
                entered = time.time()
                started = time.perf_counter()
                spec = load_spec()
                received = _receive_gradients(owner, drain(rows), num_partitions)
                if not received.halted:
                    tasks.clip_summed_slice(spec, received.summed)
                new_slice = _step_owner(
                    spec,
                    owner,
                    iteration,
                    resumed_states,
                    received.weights,
                    bounds[owner][0],
                    received.summed,
                    received.loss_sum,
                    schedule,
                    retain_from=retain_from,
                    halted=received.halted,
                )
                history, halted = received.history, received.halted
                if not halted:
                    history = _history_with(received, started)
                    halted = stop_after_nonfinite and not np.isfinite(received.loss_sum)
                if last:
                    yield owner, new_slice, history, *_chain_end(received, entered, started)
                    return
                for partition in range(num_partitions):
                    to_zero = owner == 0 and partition == 0
                    yield partition, (owner, new_slice, halted, history if to_zero else None)

            return update

        rdd = self.data.handles
        for step in range(count):
            rdd = rdd.mapPartitionsWithIndex(forward_backward_stage(step)).partitionBy(
                num_partitions, collectives.owner_partition
            )
            rdd = rdd.mapPartitionsWithIndex(owner_stage(step))
            if step < count - 1:
                rdd = rdd.partitionBy(num_partitions, collectives.owner_partition)
        return self._collect_chain(rdd, first, count, description)

    def run_replicated_chain(
        self,
        first: int,
        shares: list[list],
        schedules: list[dict],
        description: str,
        stop_after_nonfinite: bool,
    ) -> list[dict[str, Any]]:
        """Like :meth:`run_chain`, with the replicated update: ONE stage per iteration.

        Each partition sends its whole gradient to every partition (one shuffle, an
        all-to-all); every partition sums the N gradients in partition order, clips, and
        steps the whole weight vector with its own copy of the optimizer state, so all
        replicas compute the same new weights, then runs the next forward-backward in the
        same task. It is PyTorch DDP's arrangement rather than BigDL's sharded one: the
        shuffle carries N times more bytes (N x N gradients instead of 2 x N slices) and
        every partition keeps the whole optimizer state, but an iteration costs one Spark
        stage instead of two. Global-norm clipping needs no extra job here: every
        partition holds the whole summed gradient. ``len(shares)`` iterations take
        ``len(shares) + 1`` stages; the last one only updates and returns slice ``j`` of the
        weights from partition ``j`` (one copy of the weights reaches the driver).
        """
        count = len(shares)
        load_spec = self._spec_loader()
        num_partitions = self.num_partitions
        bounds = self.slice_bounds
        get_weights = self._ship_weights()
        initial_states = self.initial_optim_states
        handles = {handle["partition"]: handle for handle in self.data.partition_handles}
        retain_from = first - 1

        def stage(step: int):
            """Stage ``step``: the update of iteration ``first + step - 1`` (when step > 0)
            and the forward-backward of iteration ``first + step`` (when step < count)."""
            driver_weights = get_weights if step == 0 else None
            resumed_states = initial_states if step == 1 else None
            updated = first + step - 1
            schedule = schedules[step - 1] if step > 0 else None
            local_indices = shares[step] if step < count else None

            def task(partition, rows):
                entered = time.time()
                started = time.perf_counter()
                spec = load_spec()
                rows = drain(rows)
                if step == 0:
                    (handle,) = rows
                    weights, halted, history = driver_weights(), False, []
                else:
                    handle = handles[partition]
                    received = _receive_gradients(partition, rows, num_partitions)
                    summed, halted = received.summed, received.halted
                    l2_scale = 1.0
                    if not halted:
                        tasks.clip_summed_slice(spec, summed)
                        if spec.l2_clipping is not None:
                            squares = float(spec.l2_clipping.sum_of_squares(summed))
                            l2_scale = spec.l2_clipping.scale_for(squares)
                    weights = _step_owner(
                        spec,
                        partition,
                        updated,
                        resumed_states,
                        received.weights,
                        0,
                        summed,
                        received.loss_sum,
                        schedule,
                        l2_scale,
                        retain_from=retain_from,
                        whole=True,
                        halted=halted,
                    )
                    history = received.history
                    if not halted:
                        history = _history_with(received, started)
                        halted = stop_after_nonfinite and not np.isfinite(received.loss_sum)
                    if step == count:  # the end of the chain: slice j to the driver
                        start, stop = bounds[partition]
                        end = _chain_end(received, entered, started)
                        yield partition, weights[start:stop], history, *end
                        return
                gradient, report = _chained_forward_backward(
                    spec,
                    partition,
                    handle,
                    weights,
                    halted,
                    local_indices,
                    first + step,
                    step == count - 1,
                    entered,
                )
                host = np.asarray(backend.as_numpy(gradient)).reshape(-1)
                piece = collectives.Piece(
                    partition, host.shape, host.dtype.str, wire.encode(host, spec.wire_dtype)
                )
                for destination in range(num_partitions):
                    yield (
                        destination,
                        _gradient_record(
                            destination, partition, piece, report, halted, history, weights
                        ),
                    )

            return task

        rdd = self.data.handles
        for step in range(count + 1):
            rdd = rdd.mapPartitionsWithIndex(stage(step))
            if step < count:
                rdd = rdd.partitionBy(num_partitions, collectives.owner_partition)
        return self._collect_chain(rdd, first, count, description)

    def _collect_chain(self, rdd, first: int, count: int, description: str) -> list[dict]:
        """Run a chain's job; keep the weights (the owners' slices, in order), buffers and
        timings; return ``{"loss", "count", "finite"}`` per iteration that ran."""
        submitted = time.time()
        self.sc.setJobDescription(description)
        try:
            self._last_rdd = rdd
            results = rdd.collect()
        except Exception as error:
            raise DistributedTrainingError(
                f"iterations {first + 1}-{first + count} failed: {python_error_text(error)}"
            ) from None
        finally:
            self.sc.setJobDescription(None)
            self._release_job()
        returned = time.time()
        results.sort(key=lambda record: record[0])
        self.weights = np.concatenate([np.asarray(record[1]) for record in results])
        self.initial_optim_states = None
        history, buffers = results[0][2], results[0][3]
        if buffers is not None:
            self.buffers = buffers
        breakdown = _iteration_breakdown(submitted, returned, [record[4] for record in results])
        ran = max(len(history), 1)
        self.last_timings = {
            "job": breakdown["job"],
            "iterations_per_job": float(count),
            "iteration": breakdown["job"] / ran,
            "forward_backward": float(np.mean([h["forward_backward"] for h in history] or [0])),
            "update": float(np.mean([h["update"] for h in history] or [0])),
        }
        return [
            {
                "loss": entry["loss_sum"] / max(entry["count"], 1),
                "count": entry["count"],
                "finite": bool(np.isfinite(entry["loss_sum"])),
            }
            for entry in history
        ]

    @property
    def last_lineage_depth(self) -> int:
        """Lines of the last iteration's RDD lineage: constant when nothing chains up."""
        if self._last_rdd is None:
            return 0
        debug = self._last_rdd.toDebugString()
        return len((debug.decode() if isinstance(debug, bytes) else debug).splitlines())

    # --- optimizer state for checkpoints -----------------------------------------------
    def gather_optim_states(self, completed: int) -> list[dict]:
        """Every shard's optimizer state after iteration ``completed - 1`` (one small job)."""
        load_spec = self._spec_loader()
        initial_states = self.initial_optim_states

        whole = self.spec.update == "replicated"
        bounds = self.slice_bounds

        def read_state(owner, rows):
            drain(rows)
            spec = load_spec()
            key = tasks.state_key(owner, whole)
            method = worker.lookup(spec.run_id, key, version=completed - 1)
            if method is None:
                method = tasks.owned_shard(spec, owner, completed, initial_states, whole)
                worker.store(spec.run_id, key, method, version=completed - 1)
            state = method.state_dict()
            # A replicated run keeps the whole state on every partition: partition j gives
            # slice j, so checkpoints have one layout whichever update wrote them.
            yield owner, split_state_dict(state, bounds)[owner] if whole else state

        self.sc.setJobDescription(f"bigdl_py: gather optimizer shards after {completed}")
        try:
            states = self.owner_rdd.mapPartitionsWithIndex(read_state).collect()
        except Exception as error:
            raise DistributedTrainingError(
                f"gathering the optimizer state failed: {python_error_text(error)}"
            ) from None
        finally:
            self.sc.setJobDescription(None)
        return [state for _, state in sorted(states, key=lambda record: record[0])]

    # --- clean-up -----------------------------------------------------------------------
    def _release_job(self) -> None:
        """After a job: its weight broadcasts and shuffle files are no longer needed (the
        next job starts from the weights on the driver and the state files)."""
        self._release_broadcasts()
        if self._last_rdd is not None:
            collectives.delete_shuffle_files(self._last_rdd)

    def _release_broadcasts(self) -> None:
        for broadcast in self._broadcasts:
            broadcast.destroy()
        self._broadcasts.clear()

    def close(self) -> None:
        """Destroy broadcasts, drop the replicas and shards, delete this run's files."""
        self._release_broadcasts()
        self.spec_broadcast.destroy()
        _remove_run_everywhere(self.sc, self.spec.state_dir, self.spec.run_id, self.num_partitions)
