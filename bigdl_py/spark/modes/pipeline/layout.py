"""Where a pipeline run's pieces are: stages, replicas, partitions, slices, micro-batches.

Partition ``p`` runs stage ``k = p // R`` of replica ``r = p % R`` (``R`` pipelines side by
side; ``N = K x R`` partitions). Stage ``k`` holds the flat slice ``offsets[k] ..
offsets[k + 1]`` of the model's parameters; each of its ``R`` partitions returns sub-slice
``r`` of it at a chain's end and in a checkpoint, so the partitions' pieces, in partition
order, are the whole vector in order — the layout every mode's checkpoints have.

Micro-batch ``g = r x M + m`` of an iteration is positions ``g x b .. (g + 1) x b`` of the
global batch (the partitions' shares, partition 0's first), ``b = B / (R x M)``: replica
``r`` runs the ``r``-th ``1 / R`` of the batch, ``M`` micro-batches of it in order, which is
how ``LocalOptimizer(micro_batches=R x M)`` cuts the same batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bigdl_py.optim.sharding import all_slice_bounds
from bigdl_py.spark.modes.pipeline.schedule import TickPlan


@dataclass(frozen=True)
class PipelineLayout:
    """A pipeline run's plan, as the driver made it and every task reads it."""

    stages: int
    replicas: int
    micro_batches: int
    batch_size: int
    dtype: str  # the model's parameters' (a stage without parameters has empty vectors of it)
    offsets: tuple[int, ...]  # stage k's slice: offsets[k] .. offsets[k + 1]
    unit_bounds: tuple[int, ...]  # stage k runs units unit_bounds[k] .. unit_bounds[k + 1] - 1
    recompute: bool
    plan: TickPlan
    # Per stage: its parameters' shapes, each of its modules' position in the model (keys
    # the random streams), and its buffers' names in the model.
    parameter_shapes: tuple[tuple[tuple[int, ...], ...], ...]
    positions: tuple[tuple[int | None, ...], ...]
    buffer_names: tuple[dict, ...]

    @property
    def partitions(self) -> int:
        return self.stages * self.replicas

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // (self.replicas * self.micro_batches)

    def stage_of(self, partition: int) -> int:
        return partition // self.replicas

    def replica_of(self, partition: int) -> int:
        return partition % self.replicas

    def partition_of(self, stage: int, replica: int) -> int:
        return stage * self.replicas + replica

    def stage_bounds(self, stage: int) -> tuple[int, int]:
        return self.offsets[stage], self.offsets[stage + 1]

    def sub_slice(self, partition: int) -> tuple[int, int]:
        """Partition ``partition``'s piece of its stage's slice, relative to the slice."""
        start, stop = self.stage_bounds(self.stage_of(partition))
        return all_slice_bounds(stop - start, self.replicas)[self.replica_of(partition)]

    def partition_bounds(self) -> list[tuple[int, int]]:
        """Every partition's piece of the flat vector, in partition order."""
        bounds = []
        for partition in range(self.partitions):
            start = self.offsets[self.stage_of(partition)]
            low, high = self.sub_slice(partition)
            bounds.append((start + low, start + high))
        return bounds

    def micro_batch_rows(self, shares: list[np.ndarray], replica: int, micro_batch: int) -> list:
        """``[(data partition j, its local indices)]`` of micro-batch ``micro_batch`` of
        replica ``replica``, given the iteration's shares (partition order)."""
        size = self.micro_batch_size
        first = (replica * self.micro_batches + micro_batch) * size
        rows, position = [], 0
        for partition, share in enumerate(shares):
            low, high = max(first, position), min(first + size, position + len(share))
            if low < high:
                rows.append((partition, share[low - position : high - position]))
            position += len(share)
        return rows


def single_input(features: tuple) -> np.ndarray:
    """The one feature array a pipeline's first stage takes.

    Raises
    ------
    ValueError
        When the data has several feature arrays (a chain of stages passes one tensor).
    """
    if len(features) != 1:
        raise ValueError(
            f"a Pipeline's first stage takes one input; the data has {len(features)} feature arrays"
        )
    return features[0]
