"""``update="sharded"``: BigDL's AllReduceParameter, the optimizer state sharded N ways.

One iteration is two stages:

1. **put gradients** — partition ``j`` runs its share through its replica and sends slice
   ``k`` of its gradient to owner ``k`` (a reduce-scatter through Spark's shuffle,
   optionally float16/bfloat16 on the wire);
2. **aggregate the gradient partition** and **update the owned slice** — owner ``k`` sums
   slice ``k`` of every gradient (in partition order), clips it and steps weight slice ``k``
   with the 1/N of the optimizer state it alone keeps; then it **sends the weight
   partition** to every partition (an all-gather through a second shuffle) for the next
   iteration's forward-backward — or, at the chain's end, to the driver.

With global L2-norm clipping an owner needs the norm of the whole summed gradient, known
only after every owner has summed its slice: the owners return their squared norms in a
first job and step in a second, small one, so such iterations do not chain.
"""

from __future__ import annotations

import os
import time

import numpy as np

from bigdl_py.spark import collectives, owner_update, worker
from bigdl_py.spark.modes import TrainingMode
from bigdl_py.spark.partitioned_data import drain, run_directory, save_npy_atomically
from bigdl_py.spark.replica import replica_gradient
from bigdl_py.spark.training_run import (
    chain_end,
    gradient_record,
    history_with,
    receive_gradients,
    received_buffers,
)


class Sharded(TrainingMode):
    """BigDL's sharded update (ZeRO stage 1): 2 stages per iteration, 1/N of the state each."""

    name = "sharded"
    state_name = "shard"
    chains_with_global_norm_clipping = False

    def build_chain(self, chain):
        rdd = chain.data_rdd
        for step in range(chain.count):
            rdd = collectives.shuffle_to_owners(
                rdd.mapPartitionsWithIndex(_put_gradients(chain, step)), chain.num_partitions
            )
            rdd = rdd.mapPartitionsWithIndex(_update_owned_slice(chain, step))
            if step < chain.count - 1:
                rdd = collectives.shuffle_to_owners(rdd, chain.num_partitions)
        return rdd

    def run(self, run, chain, description):
        spec = run.spec
        if spec.l2_clipping is None:
            return super().run(run, chain, description)
        if chain.count != 1:
            raise RuntimeError("the sharded update clips by the global norm one iteration a job")
        return _run_clipped_iteration(run, chain, description)


def _run_clipped_iteration(run, chain, description: str) -> list[dict]:
    """One iteration under global-norm clipping: the owners sum and clip their slices and
    return the squares (job 1); the driver scales; the owners step (job 2, no shuffle)."""
    num_partitions, bounds, iteration = chain.num_partitions, chain.bounds, chain.first
    load_spec, get_weights = chain.load_spec, chain.get_weights
    initial_states, schedule = chain.initial_states, chain.schedules[0]
    submitted = time.time()

    def aggregate_and_keep(owner, rows):
        entered = time.time()
        started = time.perf_counter()
        spec = load_spec()
        received = receive_gradients(owner, drain(rows), num_partitions)
        summed = owner_update.clip_summed_slice(spec, received.summed)
        # The second job finds the summed slice in this worker, or on the host's disk.
        worker.store(spec.run_id, ("summed", owner), summed, version=iteration)
        directory = run_directory(spec.state_dir, spec.run_id)
        save_npy_atomically(os.path.join(directory, f"summed-{owner}.npy"), summed)
        squares = float(spec.l2_clipping.sum_of_squares(summed))
        yield (
            owner,
            squares,
            history_with(received, started),
            received.loss_sum,
            *chain_end(received, entered, started),
        )

    gradients = collectives.shuffle_to_owners(
        chain.data_rdd.mapPartitionsWithIndex(_put_gradients(chain, 0)), num_partitions
    )
    norms = run.collect(
        gradients.mapPartitionsWithIndex(aggregate_and_keep),
        f"{description}: forward-backward + gradient norm",
        f"iteration {iteration + 1}",
    )
    l2_scale = run.spec.l2_clipping.scale_for(float(sum(record[1] for record in norms)))
    loss_by_owner = {record[0]: record[3] for record in norms}

    def update_kept(owner, rows):
        drain(rows)
        spec = load_spec()
        summed = worker.lookup(spec.run_id, ("summed", owner), version=iteration)
        if summed is None:
            directory = run_directory(spec.state_dir, spec.run_id)
            summed = np.load(os.path.join(directory, f"summed-{owner}.npy"), allow_pickle=False)
        start, stop = bounds[owner]
        new_slice = owner_update.update_owned(
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
        yield owner, (new_slice, owner_update.travelling_state(spec, owner, iteration, bounds))

    slices = dict(
        run.collect(
            run.owner_rdd.mapPartitionsWithIndex(update_kept),
            f"{description}: clipped update",
            f"iteration {iteration + 1}",
        )
    )
    results = [
        (owner, slices[owner][0], history, buffers, timings, slices[owner][1])
        for owner, _, history, _, buffers, timings in norms
    ]
    return run.finish_chain(results, chain, submitted, time.time())


def _put_gradients(chain, step: int):
    """Stage 1 of iteration ``chain.first + step``: forward-backward, gradient slices to owners."""
    num_partitions, bounds = chain.num_partitions, chain.bounds
    load_spec, handles = chain.load_spec, chain.handles
    iteration, shares = chain.first + step, chain.shares[step]
    # Only the first stage reads the driver's weights: the closure of every other
    # stage must not drag them (pickled into each stage's tasks) along.
    driver_weights = chain.get_weights if step == 0 else None
    driver_buffers = chain.buffers if step == 0 else None
    get_frozen = chain.get_frozen

    def forward_backward(partition, rows):
        entered = time.time()
        spec = load_spec()
        rows = drain(rows)
        if step == 0:  # the cached handles RDD, and the driver's weights
            (handle,) = rows
            weights, halted, history = driver_weights(), False, []
            buffers = driver_buffers
        else:  # the weight partitions every owner sent
            handle = handles[partition]
            received = collectives.payloads_by_rank(partition, rows, num_partitions)
            weights = np.concatenate([np.asarray(payload[0]) for payload in received])
            halted, history, buffers = received[0][1], received[0][2], received[0][3]
        gradient, report = replica_gradient(
            spec,
            partition,
            handle,
            weights,
            halted,
            shares[partition],
            iteration,
            True,
            entered,
            get_frozen(),
            start_buffers=buffers if partition == 0 else None,
        )
        for owner, piece in collectives.pieces_for_owners(
            partition, gradient, num_partitions, spec.wire_dtype
        ):
            start, stop = bounds[owner]
            yield (
                owner,
                gradient_record(
                    owner, partition, piece, report, halted, history, weights[start:stop]
                ),
            )

    return forward_backward


def _update_owned_slice(chain, step: int):
    """Stage 2 of iteration ``chain.first + step``: owners sum, clip and step their slices."""
    count, num_partitions, bounds = chain.count, chain.num_partitions, chain.bounds
    load_spec = chain.load_spec
    iteration, schedule, last = chain.first + step, chain.schedules[step], step == count - 1
    # A resume's shard states serve the first update only (later ones find the state
    # their predecessor kept); they stay out of the other stages' closures.
    resumed_states = chain.initial_states if step == 0 else None
    stop_after_nonfinite, retain_from = chain.stop_after_nonfinite, chain.retain_from

    def update(owner, rows):
        entered = time.time()
        started = time.perf_counter()
        spec = load_spec()
        received = receive_gradients(owner, drain(rows), num_partitions)
        if not received.halted:
            owner_update.clip_summed_slice(spec, received.summed)
        new_slice = owner_update.update_owned(
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
            background=True,
        )
        history, halted = received.history, received.halted
        if not halted:
            history = history_with(received, started)
            halted = stop_after_nonfinite and not np.isfinite(received.loss_sum)
        if last:
            state = owner_update.travelling_state(spec, owner, iteration, bounds)
            yield owner, new_slice, history, *chain_end(received, entered, started), state
            return
        # Owner 0 passes partition 0's running statistics on to its next forward.
        buffers = received_buffers(received) if owner == 0 else None
        yield from collectives.payload_for_everyone(
            owner, (new_slice, halted, history, buffers), num_partitions
        )

    # The state file is written while the new slice goes out to the partitions.
    return owner_update.finishing_state_writes(update)
