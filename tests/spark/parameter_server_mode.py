"""A training mode written only against the mode contract (``bigdl_py.spark.modes``), the
way a user or the next mode of the project writes one: not a test module. The test ships
it to the executors with ``SparkContext.addPyFile``, as a user ships a mode of their own
with ``--py-files``.

``ParameterServer``: every partition sends its whole gradient to partition 0, which adds
them up, steps the whole vector with the whole optimizer state and sends the new weights
back to every partition — two stages an iteration, a record kind of its own
(:class:`ServerWeights`), exact synchronous SGD.
"""

from __future__ import annotations

from typing import NamedTuple

from bigdl_py.optim.sharding import concatenate_state_dicts, split_state_dict
from bigdl_py.spark import collectives
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
from bigdl_py.spark.records import Carried, GradientRecord

SERVER = 0


class ServerWeights(NamedTuple):
    """The server's new weights, to every partition."""

    carried: Carried
    clock: tuple[float, float]  # of the forward-backward that led to them


class ParameterServer(TrainingMode):
    """Partition 0 updates; the others only compute gradients."""

    name = "parameter-server"
    state_name = "parameter-server"

    def build_chain(self, chain):
        rdd = chain.data_rdd
        for step in range(chain.count):
            pushing = Stage.of(chain, reads_driver=step == 0)
            rdd = rdd.mapPartitionsWithIndex(stage_task(pushing, _push(chain, pushing, step)))
            rdd = collectives.shuffle_to_owners(rdd, chain.num_partitions)
            serving = Stage.of(chain, first_update=step == 0, forward_backward=False)
            rdd = rdd.mapPartitionsWithIndex(stage_task(serving, _serve(chain, serving, step)))
            if step < chain.count - 1:
                rdd = collectives.shuffle_to_owners(rdd, chain.num_partitions)
        return rdd

    def state_owner(self, partition):
        return SERVER  # the server keeps the whole state

    def initial_state(self, shards, partition, flat_size):
        return concatenate_state_dicts(shards) if len(shards) > 1 else dict(shards[0])

    def checkpoint_state(self, state, partition, bounds):
        return split_state_dict(state, bounds)[partition]


def _push(chain, stage, step):
    """Forward-backward on the server's last weights; the whole gradient to the server."""
    share, iteration = chain.shares[step], chain.first + step

    def body(inp):
        carried = inp.carried
        if carried is None:
            ((_, sent),) = inp.rows
            carried = sent.carried
        gradient, report = partition_gradient(stage, inp, carried, share[inp.partition], iteration)
        piece = collectives.whole_piece(inp.partition, gradient)
        record = GradientRecord.addressed(
            SERVER, inp.partition, piece, report, carried, carried.weights
        )
        yield SERVER, record

    return body


def _serve(chain, stage, step):
    """The server adds the gradients up and steps; the others wait for its weights."""
    iteration, schedule = chain.first + step, chain.schedules[step]
    last = step == chain.count - 1

    def body(inp):
        if inp.partition != SERVER:
            return
        received = receive_gradients(SERVER, inp.rows, stage.num_partitions)
        weights = update_received(stage, inp, received, iteration, schedule)
        carried = after_update(received, weights, stage, inp.started)
        if last:  # the server holds every slice: one result per partition
            for partition in range(stage.num_partitions):
                weight_slice = stage.slice_of(weights, partition)
                yield chain_end(partition, weight_slice, carried, received.clock, inp.entered)
            return
        for destination in range(stage.num_partitions):
            yield destination, ServerWeights(carried, received.clock)

    return body
