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
from typing import NamedTuple

import numpy as np

from bigdl_py.spark import collectives, owner_update, worker
from bigdl_py.spark.modes import TrainingMode
from bigdl_py.spark.modes.stages import (
    Stage,
    after_update,
    chain_end,
    partition_gradient,
    receive_gradients,
    stage_task,
    update_received,
)
from bigdl_py.spark.partitioned_data import drain, run_directory, save_npy_atomically
from bigdl_py.spark.records import Carried, ChainResult, GradientRecord


class Sharded(TrainingMode):
    """BigDL's sharded update (ZeRO stage 1): 2 stages per iteration, 1/N of the state each."""

    name = "sharded"
    state_name = "shard"
    chains_with_global_norm_clipping = False

    def build_chain(self, chain):
        rdd = chain.data_rdd
        for step in range(chain.count):
            rdd = chain.shuffle(rdd.mapPartitionsWithIndex(_put_gradients(chain, step)))
            rdd = rdd.mapPartitionsWithIndex(_update_owned_slice(chain, step))
            if step < chain.count - 1:
                rdd = chain.shuffle(rdd)
        return rdd

    def run(self, run, chain, description):
        spec = run.spec
        if spec.l2_clipping is None:
            return super().run(run, chain, description)
        if chain.count != 1:
            raise RuntimeError("the sharded update clips by the global norm one iteration a job")
        return _run_clipped_iteration(run, chain, description)


def _put_gradients(chain, step: int):
    """Stage 1 of iteration ``chain.first + step``: forward-backward on the weights the owners
    sent (the driver's at the chain's start), slice ``k`` of the gradient to owner ``k``."""
    iteration, shares = chain.first + step, chain.shares[step]
    stage = Stage.of(chain, reads_driver=step == 0, trains=[iteration])

    def body(inp):
        carried = inp.carried  # the driver's, at the chain's start; else the owners' slices
        if carried is None:
            carried = _gather_weights(inp.partition, inp.rows, stage.num_partitions)
        gradient, report = partition_gradient(stage, inp, carried, shares[inp.partition], iteration)
        for owner, piece in collectives.pieces_for_owners(
            inp.partition, gradient, stage.num_partitions, inp.spec.wire_dtype
        ):
            yield (
                owner,
                GradientRecord.addressed(
                    owner,
                    inp.partition,
                    piece,
                    report,
                    carried,
                    stage.slice_of(carried.weights, owner),
                ),
            )

    return stage_task(stage, body)


def _gather_weights(partition: int, rows: list, count: int) -> Carried:
    """BigDL's *getWeights*: the whole vector from the slices every owner sent (each a
    :class:`Carried` of its slice; owner 0's brings the history and the statistics)."""
    slices = collectives.payloads_by_rank(partition, rows, count)
    weights = np.concatenate([np.asarray(owned.weights) for owned in slices])
    return slices[0]._replace(weights=weights)


def _update_owned_slice(chain, step: int):
    """Stage 2 of iteration ``chain.first + step``: owners sum, clip and step their slices,
    then send them to every partition (BigDL's *sendWeightPartition*) or, at the chain's
    end, to the driver."""
    iteration, schedule = chain.first + step, chain.schedules[step]
    last = step == chain.count - 1
    stage = Stage.of(
        chain, first_update=step == 0, forward_backward=False, updates=iteration, last=last
    )

    def body(inp):
        owner = inp.partition
        received = receive_gradients(owner, inp.rows, stage.num_partitions)
        # The state file is written while the new slice goes out to the partitions.
        start = stage.bounds[owner][0]
        new_slice = update_received(
            stage, inp, received, iteration, schedule, start=start, background=True
        )
        carried = after_update(received, new_slice, stage, inp.started)
        if last:
            state = owner_update.travelling_state(inp.spec, owner, iteration, stage.bounds)
            yield chain_end(owner, new_slice, carried, received.clock, inp.entered, state)
            return
        # (Owner 0's carries partition 0's running statistics on to its next forward.)
        yield from collectives.payload_for_everyone(owner, carried, stage.num_partitions)

    return stage_task(stage, body)


class _ClippedSum(NamedTuple):
    """An owner's answer to the first job of a clipped iteration."""

    owner: int
    squares: float  # the squared L2 norm of its clipped summed slice
    loss_sum: float
    result: ChainResult  # the chain's result, but for the weights and the state


class _SteppedSlice(NamedTuple):
    """An owner's answer to the second job: its new slice and state."""

    owner: int
    weights: np.ndarray
    state: dict | None


def _run_clipped_iteration(run, chain, description: str) -> list[dict]:
    """One iteration under global-norm clipping: the owners sum their slices and return the
    squares of the clipped sums (job 1); the driver adds them up for the scale; the owners
    step (job 2, no shuffle)."""
    iteration, bounds = chain.first, chain.bounds
    summing = Stage.of(chain, forward_backward=False, last=True)
    load_spec, get_weights = chain.load_spec, chain.get_weights
    initial_states, schedule = chain.initial_states, chain.schedules[0]
    submitted = time.time()

    def aggregate_and_keep(inp):
        owner = inp.partition
        received = receive_gradients(owner, inp.rows, summing.num_partitions)
        # The second job finds the summed slice in this worker, or on the host's disk; its
        # owner step clips it. The norm is that of the clipped slice, as the local loop's.
        worker.store(inp.spec.run_id, ("summed", owner), received.summed, version=iteration)
        directory = run_directory(inp.spec.state_dir, inp.spec.run_id)
        save_npy_atomically(os.path.join(directory, f"summed-{owner}.npy"), received.summed)
        clipped = owner_update.clip_summed_slice(inp.spec, received.summed.copy())
        squares = float(inp.spec.l2_clipping.sum_of_squares(clipped))
        carried = after_update(received, received.weights, summing, inp.started)
        result = chain_end(owner, None, carried, received.clock, inp.entered)
        yield _ClippedSum(owner, squares, received.loss_sum, result)

    gradients = chain.shuffle(chain.data_rdd.mapPartitionsWithIndex(_put_gradients(chain, 0)))
    sums = run.collect(
        gradients.mapPartitionsWithIndex(stage_task(summing, aggregate_and_keep)),
        f"{description}: forward-backward + gradient norm",
        f"iteration {iteration + 1}",
    )
    l2_scale = run.spec.l2_clipping.scale_for(float(sum(answer.squares for answer in sums)))
    loss_by_owner = {answer.owner: answer.loss_sum for answer in sums}

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
            summed,
            loss_by_owner[owner],
            schedule,
            start=start,
            l2_scale=l2_scale,
        )
        state = owner_update.travelling_state(spec, owner, iteration, bounds)
        yield _SteppedSlice(owner, new_slice, state)

    stepped = run.collect(
        run.owner_rdd.mapPartitionsWithIndex(update_kept),
        f"{description}: clipped update",
        f"iteration {iteration + 1}",
    )
    by_owner = {answer.owner: answer for answer in stepped}
    results = [
        answer.result._replace(
            weights=by_owner[answer.owner].weights, state=by_owner[answer.owner].state
        )
        for answer in sums
    ]
    return run.finish_chain(results, chain, submitted, time.time())
