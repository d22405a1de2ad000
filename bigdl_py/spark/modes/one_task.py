"""``update="one-task"``: every partition's share of a global batch trains in ONE Spark task.

Where every partition lies on one machine (Spark's local mode), a Spark stage per iteration
(tens of milliseconds; the exact modes cannot chain iterations without one) buys nothing
that one process does not. This mode runs the same exact synchronous SGD in a
single task per job: the task reads every partition's cached data (``coalesce(1)``, no
shuffle) and, for each iteration, trains the partitions' shares of the global batch on ``R``
model replicas at once (``R`` = the run's partitions, at most the machine's cores): the
task's thread trains replica 0, and each other replica lives in a child process forked from
the task's worker (``bigdl_py.spark.modes.replica_process``: weights and gradients through shared
memory, so the replicas do not take turns at the GIL), or on a thread of the task where the
platform cannot fork or the replicas are on a GPU. It adds their gradients in partition
order and steps the whole vector with the whole optimizer state. With ``R``
equal to the partitions it is the replicated update's arithmetic without the shuffle: each
replica normalises its own share (BatchNorm), draws partition ``j``'s dropout stream, and
partition 0's replica keeps the run's running statistics. With fewer replicas one
trains several neighbouring shares at once; with one, the whole batch.

In local mode it runs within a few per cent of a LocalOptimizer in the same process and
several times faster than either exact mode (``bench/RESULTS.md``), so ``update="auto"``
picks it there.

Everything else holds as in the exact modes: checkpoints have their layout (slice ``j`` of
the state in entry ``j``) and resume exactly, in this mode or another; the state is written
once per job, at its end (a retried task starts again from the job's first iteration, whose
state file stays until the next job); a non-finite loss stops at that iteration. It needs
executors that share a disk (the one task reads every partition's files), and refuses
others.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bigdl_py import backend
from bigdl_py.optim.sharding import all_slice_bounds, concatenate_state_dicts, split_state_dict
from bigdl_py.spark import collectives, owner_update, worker
from bigdl_py.spark.modes import TrainingMode
from bigdl_py.spark.modes.replica_process import (
    ReplicaProcess,
    processes_available,
    train_with_helpers,
)
from bigdl_py.spark.modes.stages import Stage, chain_end
from bigdl_py.spark.partitioned_data import drain, load_partition_data
from bigdl_py.spark.records import HistoryEntry
from bigdl_py.spark.replica import Replica, forward_backward

#: A job is one task however many iterations it holds: the Spark job's fixed cost (tens of
#: milliseconds, more with other work on the cores) is paid once per this many iterations at
#: least (a trigger, an epoch's end still end a job early). Progress and summaries arrive a
#: job at a time, so a model whose iterations take seconds runs short jobs (ResNet-18's
#: iterations take seconds each: 64 of them would leave the progress bar still for minutes).
MIN_ITERATIONS_PER_JOB = 64
# Models of at most this many bytes of parameters run SMALL_MODEL_ITERATIONS_PER_JOB at
# least: their iterations take milliseconds, where the job's cost weighs most; 128 of them
# still report progress every second or two, and a validation every 117 iterations
# (bench/time_to_accuracy.py) then ends one job, not two.
SMALL_MODEL_BYTES = 1 << 20
SMALL_MODEL_ITERATIONS_PER_JOB = 128
# Above this many bytes of parameters, a job runs LARGE_MODEL_ITERATIONS_PER_JOB at least.
LARGE_MODEL_BYTES = 16 << 20
LARGE_MODEL_ITERATIONS_PER_JOB = 4


def iterations_per_job(parameter_bytes: int) -> int:
    """The fewest iterations a one-task job runs for a model of ``parameter_bytes``."""
    if parameter_bytes > LARGE_MODEL_BYTES:
        return LARGE_MODEL_ITERATIONS_PER_JOB
    if parameter_bytes <= SMALL_MODEL_BYTES:
        return SMALL_MODEL_ITERATIONS_PER_JOB
    return MIN_ITERATIONS_PER_JOB


class OneTask(TrainingMode):
    """Exact synchronous SGD in one task per job, a replica per thread (see the module)."""

    name = "one-task"
    state_name = "one-task"

    # --- the driver's side ------------------------------------------------------------
    def iterations_per_call(self, requested: int, spec) -> int:
        if spec is not None and spec.carry_state:
            raise ValueError(
                "update='one-task' needs executors that share a disk (local mode, one "
                "host, or BIGDL_PY_STATE_DIR on a shared file system): its single task reads "
                "every partition's data files. Use update='auto', 'sharded' or 'replicated'"
            )
        if spec is None:
            return max(requested, MIN_ITERATIONS_PER_JOB)
        parameters = list(spec.model.parameters()) if spec.model is not None else []
        itemsize = parameters[0].data.dtype.itemsize if parameters else 4
        return max(requested, iterations_per_job(spec.flat_size * itemsize))

    def build_chain(self, chain):
        """One stage, one task: every partition's handle comes to it through ``coalesce``."""
        return chain.data_rdd.coalesce(1).mapPartitions(_train_chain(chain))

    def state_owner(self, partition: int) -> int:
        return 0  # the one task keeps the whole state

    def initial_state(self, shards, partition, flat_size):
        return concatenate_state_dicts(shards) if len(shards) > 1 else dict(shards[0])

    def checkpoint_state(self, state, partition, bounds):
        # Entry j is slice j: checkpoints have one layout whichever mode wrote them.
        return split_state_dict(state, bounds)[partition]


class PartitionsInOrder:
    """The memory-mapped arrays of every partition, read as their concatenation in partition
    order: ``joined[indices]`` gathers the rows from the partitions that hold them, so the
    data is never copied whole into the worker's memory."""

    def __init__(self, parts: list):
        self.parts = parts
        self.offsets = np.cumsum([0] + [len(part) for part in parts])
        self.shape = (int(self.offsets[-1]), *parts[0].shape[1:])
        self.dtype = parts[0].dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, indices) -> np.ndarray:
        indices = np.asarray(indices, dtype=np.int64)
        owners = np.searchsorted(self.offsets, indices, side="right") - 1
        rows = np.empty((len(indices), *self.shape[1:]), dtype=self.dtype)
        for owner in np.unique(owners):
            chosen = owners == owner
            rows[chosen] = self.parts[owner][indices[chosen] - self.offsets[owner]]
        return rows


def _all_partitions_data(handles: list[dict]) -> tuple[tuple, PartitionsInOrder]:
    """``(features, labels)`` of every partition, memory-mapped, in partition order."""
    parts = [load_partition_data(handle) for handle in handles]
    features = tuple(
        PartitionsInOrder([arrays[index] for arrays, _ in parts])
        for index in range(len(parts[0][0]))
    )
    return features, PartitionsInOrder([labels for _, labels in parts])


def _replicas(spec, handles: list[dict], groups: list[tuple[int, int]]) -> list:
    """One replica per group of partitions (this worker's, kept between jobs), all reading
    every partition's data; replica ``r`` draws the random streams of its group's first
    partition. The first is the task's own; the others are :class:`ReplicaProcess`\\ es
    where the platform forks host replicas, otherwise replicas for threads of this process."""

    def build(first: int) -> Replica:
        features, labels = worker.fetch(
            spec.run_id, ("one-task", "data"), lambda: _all_partitions_data(handles)
        )
        replica = Replica(spec, handles[first])  # partition = the handle's: its streams
        replica.use_rows(features, labels)
        return replica

    in_processes = processes_available(spec.device)
    replicas = []
    for number, (first, _) in enumerate(groups):
        if number == 0 or not in_processes:
            key = ("one-task", first, len(groups))
            replicas.append(worker.fetch(spec.run_id, key, lambda f=first: build(f)))
            continue
        key = ("one-task process", first, len(groups))
        helper = worker.lookup(spec.run_id, key)
        if helper is None or not helper.alive():  # a helper that died is forked again
            helper = ReplicaProcess(build(first))
            worker.store(spec.run_id, key, helper)
        replicas.append(helper)
    return replicas


_pool_lock = threading.Lock()
_pool: tuple[tuple[int, int], ThreadPoolExecutor] | None = None


def _thread_pool(threads: int) -> ThreadPoolExecutor:
    """This worker's pool of ``threads`` threads (a forked worker makes its own)."""
    global _pool
    key = (os.getpid(), threads)
    with _pool_lock:
        if _pool is None or _pool[0] != key:
            _pool = (key, ThreadPoolExecutor(threads, thread_name_prefix="bigdl_py-replica"))
        return _pool[1]


def _train_chain(chain):
    """The task: the chain's iterations one after another, then slice ``j`` of the weights
    for each partition ``j`` (the driver joins them as it does every mode's)."""
    stage = Stage.of(chain, reads_driver=True, first_update=True)
    shares, schedules = chain.shares, chain.schedules
    # Fixed on the driver: which shares a replica trains (and so its batch statistics and
    # the order of the gradients' sum) must not depend on the host a retried task runs on.
    threads = max(1, min(stage.num_partitions, os.cpu_count() or 1))
    groups = all_slice_bounds(stage.num_partitions, threads)  # partitions [a, b) per thread

    def task(rows):
        entered = time.time()
        spec = stage.load_spec()
        handles = sorted(drain(rows), key=lambda handle: handle["partition"])
        offsets = np.cumsum([0] + [int(handle["size"]) for handle in handles])
        # Each replica's ops run on its own thread: BLAS (and the convolutions' tiles) get one.
        with backend.blas_threads(1):
            replicas = _replicas(spec, handles, groups)
            carried = stage.start()
            if carried.buffers:
                replicas[0].load_buffers(carried.buffers)
            method = owner_update.owned_shard(spec, 0, stage.first, stage.resumed_states)
            weights, halted, history, frozen = carried.weights, False, [], stage.get_frozen()
            for step, share in enumerate(shares):
                iteration = stage.first + step
                if halted:  # stopped by a non-finite loss: nothing changes any more
                    continue
                pieces = [
                    np.concatenate(
                        [offsets[j] + np.asarray(share[j], dtype=np.int64) for j in range(a, b)]
                    )
                    for a, b in groups
                ]

                def train_piece(index, weights=weights, pieces=pieces, iteration=iteration):
                    # The gradient is a view of the replica's own buffer, untouched until its
                    # next forward-backward: the sum below reads it without a copy.
                    return forward_backward(
                        replicas[index],
                        weights,
                        pieces[index],
                        spec.batch_size,
                        iteration,
                        spec.gradient_accumulation,
                        frozen,
                    )

                started = time.perf_counter()
                if len(groups) == 1:
                    results = [train_piece(0)]
                elif isinstance(replicas[1], ReplicaProcess):
                    results = train_with_helpers(
                        replicas[1:],
                        pieces[1:],
                        train_piece,
                        weights,
                        spec.batch_size,
                        iteration,
                        spec.gradient_accumulation,
                        frozen,
                    )
                else:
                    results = list(_thread_pool(len(groups)).map(train_piece, range(len(groups))))
                # In partition order, as the exact modes add the partitions' gradients.
                gradient = collectives.combine([result[0] for result in results], "sum")
                loss_sum = float(sum(result[1] for result in results))
                samples = int(sum(result[2] for result in results))
                update_started = time.perf_counter()
                weights = owner_update.owner_step(
                    spec, method, weights, gradient, loss_sum, schedules[step]
                )
                halted = owner_update.stops_chain(loss_sum, stage.stop_after_nonfinite)
                history.append(
                    HistoryEntry(
                        loss_sum,
                        samples,
                        update_started - started,
                        time.perf_counter() - update_started,
                    )
                )
            # One state file per job: a retry of this task starts from the job's first
            # iteration, whose file stays (``retain_from``) until the next job ends.
            last = stage.first + len(history) - 1  # the driver counts the iterations that ran
            owner_update.keep_shard(spec, 0, method, last, stage.retain_from)
            buffers = replicas[0].buffers() if replicas[0].buffer_names else None
        ended = carried._replace(weights=weights, halted=halted, history=history, buffers=buffers)
        clock = (entered, time.time())
        for partition in range(stage.num_partitions):
            yield chain_end(partition, stage.slice_of(weights, partition), ended, clock, clock[0])

    return task
