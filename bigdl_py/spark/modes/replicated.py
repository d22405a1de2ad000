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

from bigdl_py.optim.sharding import concatenate_state_dicts, split_state_dict
from bigdl_py.spark import collectives, owner_update
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
from bigdl_py.spark.records import GradientRecord


class Replicated(TrainingMode):
    """DDP's update: 1 stage per iteration, the whole optimizer state on every partition."""

    name = "replicated"
    state_name = "replicated"

    def build_chain(self, chain):
        return one_stage_per_iteration(chain)

    def initial_state(self, shards, partition, flat_size):
        return concatenate_state_dicts(shards) if len(shards) > 1 else dict(shards[0])

    def checkpoint_state(self, state, partition, bounds):
        # Partition j gives slice j: checkpoints have one layout whichever mode wrote them.
        return split_state_dict(state, bounds)[partition]


def one_stage_per_iteration(chain):
    """The chain's ``count + 1`` stages: stage ``s`` updates with iteration ``first + s - 1``'s
    gradients (when s > 0) and runs iteration ``first + s``'s forward-backward (when
    s < count), whose whole gradient goes to every partition."""
    rdd = chain.data_rdd
    for step in range(chain.count + 1):
        stage = Stage.of(
            chain,
            reads_driver=step == 0,
            first_update=step == 1,
            trains=[chain.first + step] if step < chain.count else [],
            updates=chain.first + step - 1 if step > 0 else None,
            last=step == chain.count,
        )
        rdd = rdd.mapPartitionsWithIndex(stage_task(stage, _iteration(chain, stage, step)))
        if step < chain.count:
            rdd = chain.shuffle(rdd)
    return rdd


def _iteration(chain, stage: Stage, step: int):
    """Stage ``step``'s body (see :func:`one_stage_per_iteration`)."""
    first, count = chain.first, chain.count
    shares = chain.shares[step] if step < count else None
    schedule = chain.schedules[step - 1] if step > 0 else None  # the closure holds no chain

    def body(inp):
        carried = inp.carried
        if carried is None:  # iteration first + step - 1's gradients: update every replica
            received = receive_gradients(inp.partition, inp.rows, stage.num_partitions)
            # The state file is written during the next forward-backward.
            weights = update_received(
                stage, inp, received, first + step - 1, schedule, background=True
            )
            carried = after_update(received, weights, stage, inp.started)
            if step == count:  # the end of the chain: slice j to the driver
                state = owner_update.travelling_state(
                    inp.spec, inp.partition, first + step - 1, stage.bounds
                )
                yield chain_end(
                    inp.partition,
                    stage.slice_of(weights, inp.partition),
                    carried,
                    received.clock,
                    inp.entered,
                    state,
                )
                return
        gradient, report = partition_gradient(
            stage, inp, carried, shares[inp.partition], first + step
        )
        piece = collectives.whole_piece(inp.partition, gradient, inp.spec.wire_dtype)
        for destination in range(stage.num_partitions):
            yield (
                destination,
                GradientRecord.addressed(
                    destination, inp.partition, piece, report, carried, carried.weights
                ),
            )

    return body
