"""``update="one-replica"``: one replica trains every global batch, in one task per job.

Where every partition lies on one machine (Spark's local mode), data parallelism buys
nothing that threads inside one process do not, and it costs a Spark stage per iteration
(about 35-45 ms on the bench machine; the exact modes cannot chain iterations without one).
This mode runs the same exact synchronous SGD with ONE model replica: a job is a single task
that reads every partition's cached data (``coalesce(1)``, no shuffle), and for each of its
iterations trains the whole global batch — partition 0's share first, as the batch plan
lists it (``PartitionedBatchPlan.global_indices``) — then steps the whole vector with the
whole optimizer state. So it computes what a ``LocalOptimizer`` over
``DistriOptimizer.local_reference_dataset`` computes, as the exact modes do, and the same
weights as they do to float rounding wherever the model has no batch statistics (BatchNorm
normalises over the whole batch here, over each partition's share there) and no dropout
(the random streams are partition 0's). The task uses as many BLAS/tile threads as the run
has partitions (at most the machine's cores): the other task slots sit idle meanwhile.

Measured on the bench machine (``bench/RESULTS.md``): LocalOptimizer in one process trained
LeNet-5 at 10,669 samples/s and the CIFAR CNN at 602, against 1,715 and 421 for the faster
exact mode on two partitions of ``local[2]``. ``update="auto"`` picks this mode in local mode.

Everything else holds as in the exact modes: checkpoints have their layout (slice ``j`` of
the state in entry ``j``) and resume exactly, in this mode or another; the state is written
once per job, at its end (a retried task starts again from the job's first iteration, whose
state file stays until the next job); a non-finite loss stops at that iteration. It needs
executors that share a disk (the one task reads every partition's files), and refuses
others.
"""

from __future__ import annotations

import os
import time

import numpy as np

from bigdl_py import backend
from bigdl_py.optim.sharding import concatenate_state_dicts, split_state_dict
from bigdl_py.spark import owner_update, worker
from bigdl_py.spark.modes import TrainingMode
from bigdl_py.spark.partitioned_data import drain, load_partition_data
from bigdl_py.spark.replica import Replica, forward_backward

#: A job is one task however many iterations it holds: the Spark job's fixed cost is paid
#: once per this many iterations at least (a trigger, an epoch's end still end a job early).
MIN_ITERATIONS_PER_JOB = 64


class OneReplica(TrainingMode):
    """Exact synchronous SGD by one replica over all partitions' data (see the module)."""

    name = "one-replica"
    state_name = "one-replica"

    # --- the driver's side ------------------------------------------------------------
    def iterations_per_call(self, requested: int, spec) -> int:
        if spec is not None and spec.carry_state:
            raise ValueError(
                "update='one-replica' needs executors that share a disk (local mode, one "
                "host, or BIGDL_PY_STATE_DIR on a shared file system): its single task reads "
                "every partition's data files. Use update='auto', 'sharded' or 'replicated'"
            )
        return max(requested, MIN_ITERATIONS_PER_JOB)

    def build_chain(self, chain):
        """One stage, one task: every partition's handle comes to it through ``coalesce``."""
        return chain.data_rdd.coalesce(1).mapPartitions(_train_chain(chain))

    def state_owner(self, partition: int) -> int:
        return 0  # the one replica's task keeps the whole state

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


def _replica_over_all_partitions(spec, handles: list[dict]) -> Replica:
    """A replica whose data is every partition's, in partition order."""
    replica = Replica(spec, handles[0])
    parts = [load_partition_data(handle) for handle in handles]
    replica.features = tuple(
        PartitionsInOrder([features[index] for features, _ in parts])
        for index in range(len(parts[0][0]))
    )
    replica.labels = PartitionsInOrder([labels for _, labels in parts])
    return replica


def _train_chain(chain):
    """The task: the chain's iterations one after another, then slice ``j`` of the weights
    for each partition ``j`` (the driver joins them as it does every mode's)."""
    num_partitions, bounds, first = chain.num_partitions, chain.bounds, chain.first
    load_spec, get_weights, get_frozen = chain.load_spec, chain.get_weights, chain.get_frozen
    driver_buffers, resumed_states = chain.buffers, chain.initial_states
    shares, schedules = chain.shares, chain.schedules
    stop_after_nonfinite, retain_from = chain.stop_after_nonfinite, chain.retain_from
    threads = max(1, min(num_partitions, os.cpu_count() or 1))

    def task(rows):
        entered = time.time()
        spec = load_spec()
        handles = sorted(drain(rows), key=lambda handle: handle["partition"])
        offsets = np.cumsum([0] + [int(handle["size"]) for handle in handles])
        with backend.blas_threads(threads):
            replica = worker.fetch(
                spec.run_id, ("one-replica",), lambda: _replica_over_all_partitions(spec, handles)
            )
            if driver_buffers:
                replica.load_buffers(driver_buffers)
            method = owner_update.owned_shard(spec, 0, first, resumed_states)
            weights = get_weights()
            halted, history, frozen = False, [], get_frozen()
            for step, share in enumerate(shares):
                iteration = first + step
                if halted:  # stopped by a non-finite loss: nothing changes any more
                    continue
                indices = np.concatenate(
                    [offsets[j] + np.asarray(share[j], dtype=np.int64) for j in range(len(share))]
                )
                started = time.perf_counter()
                gradient, loss_sum, samples = forward_backward(
                    replica,
                    weights,
                    indices,
                    spec.batch_size,
                    iteration,
                    spec.gradient_accumulation,
                    frozen,
                )
                update_started = time.perf_counter()
                schedule = schedules[step]
                owner_update.clip_summed_slice(spec, gradient)
                l2_scale = owner_update.global_norm_scale(spec, gradient)
                if np.isfinite(loss_sum) and np.isfinite(l2_scale):
                    weights = owner_update.update_owned_slice(
                        method, weights, gradient, 0, schedule, l2_scale
                    )
                else:
                    owner_update.follow_schedule_only(method, schedule)
                    halted = stop_after_nonfinite
                history.append(
                    {
                        "loss_sum": float(loss_sum),
                        "count": int(samples),
                        "forward_backward": update_started - started,
                        "update": time.perf_counter() - update_started,
                    }
                )
            # One state file per job: a retry of this task starts from the job's first
            # iteration, whose file stays (``retain_from``) until the next job ends.
            last = first + len(history) - 1  # the driver counts the iterations that ran
            owner_update.keep_shard(spec, 0, method, last, retain_from)
            buffers = replica.buffers() if replica.buffer_names else None
        left = time.time()
        timings = {
            "fb_entered": entered,
            "fb_left": left,
            "update_entered": entered,
            "update_left": left,
        }
        for partition in range(num_partitions):
            start, stop = bounds[partition]
            yield (
                partition,
                weights[start:stop],
                history if partition == 0 else None,
                buffers if partition == 0 else None,
                timings,
                None,
            )

    return task
