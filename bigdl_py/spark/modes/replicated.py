"""``update="replicated"``: PyTorch DDP's arrangement, ONE stage per iteration.

Each partition **puts** its whole gradient to every partition (one shuffle, an all-to-all);
every partition **aggregates** the N gradients in partition order, clips, and **updates** the
whole weight vector with its own copy of the whole optimizer state, so all replicas compute
the same new weights, then runs the next forward-backward in the same task. The shuffle
carries N times the bytes of the sharded update's two and every partition keeps the whole
optimizer state, but an iteration costs one Spark stage instead of two — the better trade
for small models, whose iteration Spark's per-stage cost dominates (bench/RESULTS.md).
Global-norm clipping needs no extra job: every partition holds the whole summed gradient.

``count`` iterations take ``count + 1`` stages; the last one only updates and returns slice
``j`` of the weights from partition ``j`` (one copy of the weights reaches the driver).
Checkpoints hold slice ``j`` of partition ``j``'s state: the sharded update's layout.
"""

from __future__ import annotations

import time

import numpy as np

from bigdl_py.optim.sharding import concatenate_state_dicts, split_state_dict
from bigdl_py.spark import collectives, owner_update
from bigdl_py.spark.modes import TrainingMode
from bigdl_py.spark.partitioned_data import drain
from bigdl_py.spark.replica import replica_gradient
from bigdl_py.spark.training_run import (
    chain_end,
    gradient_record,
    history_with,
    receive_gradients,
    received_buffers,
)


class Replicated(TrainingMode):
    """DDP's update: 1 stage per iteration, the whole optimizer state on every partition."""

    name = "replicated"
    state_name = "replicated"

    def build_chain(self, chain):
        return one_stage_per_iteration(chain, exact_update)

    def initial_state(self, shards, partition, flat_size):
        return concatenate_state_dicts(shards) if len(shards) > 1 else dict(shards[0])

    def checkpoint_state(self, state, partition, bounds):
        # Partition j gives slice j: checkpoints have one layout whichever mode wrote them.
        return split_state_dict(state, bounds)[partition]


def one_stage_per_iteration(chain, update):
    """The chain's ``count + 1`` stages, each updating with ``update`` (see :func:`stage`)."""
    rdd = chain.data_rdd
    for step in range(chain.count + 1):
        rdd = rdd.mapPartitionsWithIndex(stage(chain, step, update))
        if step < chain.count:
            rdd = collectives.shuffle_to_owners(rdd, chain.num_partitions)
    return rdd


def exact_update(spec, partition, received, schedule, iteration, resumed_states, retain_from):
    """Synchronous SGD's update of the whole vector from the summed gradient."""
    summed, halted = received.summed, received.halted
    l2_scale = 1.0
    if not halted:
        owner_update.clip_summed_slice(spec, summed)
        l2_scale = owner_update.global_norm_scale(spec, summed)
    return owner_update.update_owned(
        spec,
        partition,
        iteration,
        resumed_states,
        received.weights,
        0,
        summed,
        received.loss_sum,
        schedule,
        l2_scale,
        retain_from=retain_from,
        halted=halted,
        background=True,
    )


def stage(chain, step: int, update):
    """Stage ``step`` of a one-stage-per-iteration chain: the update of iteration
    ``first + step - 1`` (when step > 0, by ``update``) and the forward-backward of
    iteration ``first + step`` (when step < count), whose whole gradient goes to every
    partition. ``update(spec, partition, received, schedule, iteration, resumed_states,
    retain_from)`` returns the partition's new weights."""
    count, num_partitions, bounds = chain.count, chain.num_partitions, chain.bounds
    load_spec, handles, first = chain.load_spec, chain.handles, chain.first
    driver_weights = chain.get_weights if step == 0 else None
    driver_buffers = chain.buffers if step == 0 else None
    resumed_states = chain.initial_states if step == 1 else None
    updated = first + step - 1
    schedule = chain.schedules[step - 1] if step > 0 else None
    shares = chain.shares[step] if step < count else None
    stop_after_nonfinite, get_frozen = chain.stop_after_nonfinite, chain.get_frozen
    retain_from = chain.retain_from  # the task's closure must not hold ``chain`` (an RDD)

    def task(partition, rows):
        entered = time.time()
        started = time.perf_counter()
        spec = load_spec()
        rows = drain(rows)
        if step == 0:
            (handle,) = rows
            weights, halted, history = driver_weights(), False, []
            buffers = driver_buffers
        else:
            handle = handles[partition]
            received = receive_gradients(partition, rows, num_partitions)
            buffers = received_buffers(received)
            weights = update(
                spec, partition, received, schedule, updated, resumed_states, retain_from
            )
            history, halted = received.history, received.halted
            if not halted:
                history = history_with(received, started)
                halted = stop_after_nonfinite and not np.isfinite(received.loss_sum)
            if step == count:  # the end of the chain: slice j to the driver
                start, stop = bounds[partition]
                end = chain_end(received, entered, started)
                state = owner_update.travelling_state(spec, partition, updated, bounds)
                yield partition, weights[start:stop], history, *end, state
                return
        gradient, report = replica_gradient(
            spec,
            partition,
            handle,
            weights,
            halted,
            shares[partition],
            first + step,
            True,
            entered,
            get_frozen(),
            start_buffers=buffers if partition == 0 else None,
        )
        piece = collectives.whole_piece(partition, gradient, spec.wire_dtype)
        for destination in range(num_partitions):
            yield (
                destination,
                gradient_record(destination, partition, piece, report, halted, history, weights),
            )

    # An update's state file is written during the next forward-backward.
    return owner_update.finishing_state_writes(task)
