"""Which samples form each global batch when the training data is split into partitions.

BigDL's way, kept here: every partition samples its share of the global batch from the
samples it holds, so no data moves between partitions during training. The plan is a pure
function of ``(seed, iteration)``, which is what makes a distributed run reproducible, a
resumed run exact, and a failed task's retry compute the same gradient.

Partition ``j`` holding ``n_j`` samples reads its share ``b_j`` of each global batch from an
endless stream: the concatenation of its own per-epoch permutations ``perm(seed, e, j)`` of
``range(n_j)``. Iteration ``t`` takes stream positions ``[t*b_j, (t+1)*b_j)``. Shares come
from ``all_slice_bounds(batch_size, N)``: they differ by at most one sample, so any batch size
works with any number of partitions (BigDL refused sizes that were not multiples of the core
count). An epoch is ``ceil(total / batch_size)`` iterations, BigDL's count.

``PlannedDataset`` replays the same global batches on one process, so a ``LocalOptimizer``
trained on it is the reference a ``DistriOptimizer`` must equal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bigdl_py.data import ArrayDataset
from bigdl_py.optim.sharding import all_slice_bounds

_PARTITION_STREAM = 2  # a stream id distinct from the dataset's shuffle and augment streams


class PartitionedBatchPlan:
    """The global batches of a run over ``len(partition_sizes)`` partitions.

    Parameters
    ----------
    partition_sizes : sequence of int
        Number of samples in each partition, in partition order.
    batch_size : int
        The global batch size; partition ``j`` takes ``share_sizes[j]`` samples of it.
    seed : int
        Seeds every partition's per-epoch permutation.
    shuffle : bool
        Without shuffling each partition reads its samples in stored order, cyclically.

    Raises
    ------
    ValueError
        When a partition that must contribute to every batch holds no sample, or the batch
        size is smaller than 1.
    """

    def __init__(
        self, partition_sizes: Sequence[int], batch_size: int, seed: int = 0, shuffle: bool = True
    ):
        self.partition_sizes = [int(n) for n in partition_sizes]
        if not self.partition_sizes:
            raise ValueError("PartitionedBatchPlan: no partitions")
        if batch_size < 1:
            raise ValueError(f"PartitionedBatchPlan: batch_size must be >= 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        count = len(self.partition_sizes)
        self.share_sizes = [
            stop - start for start, stop in all_slice_bounds(self.batch_size, count)
        ]
        self.total = sum(self.partition_sizes)
        if self.total < count:
            raise ValueError(
                f"the training data has {self.total} samples but is split into {count} "
                "partitions; use fewer partitions (num_partitions=) than samples"
            )
        if self.batch_size < count:
            raise ValueError(
                f"global batch size {self.batch_size} is smaller than the number of partitions "
                f"{count}: every partition needs at least one sample per batch; raise "
                "batch_size or lower num_partitions"
            )
        for partition, (size, share) in enumerate(
            zip(self.partition_sizes, self.share_sizes, strict=True)
        ):
            if share > 0 and size == 0:
                raise ValueError(
                    f"partition {partition} of the training data is empty but must supply "
                    f"{share} samples to every batch; repartition the data "
                    "(e.g. rdd.repartition(n)) so that no partition is empty"
                )
        self.offsets = np.concatenate([[0], np.cumsum(self.partition_sizes)]).astype(np.int64)
        self.iterations_per_epoch = math.ceil(self.total / self.batch_size)
        self._permutations: dict[tuple[int, int], np.ndarray] = {}

    @property
    def num_partitions(self) -> int:
        return len(self.partition_sizes)

    def epoch_of(self, iteration: int) -> int:
        """The epoch (0-based) that iteration ``iteration`` (0-based) belongs to."""
        return iteration // self.iterations_per_epoch

    def _permutation(self, partition: int, epoch: int) -> np.ndarray:
        # Every iteration asks for the current epoch's permutations: keep the last few
        # (a batch can straddle two epochs) instead of redrawing them each time.
        key = (partition, epoch)
        permutation = self._permutations.get(key)
        if permutation is None:
            size = self.partition_sizes[partition]
            if not self.shuffle:
                permutation = np.arange(size, dtype=np.int64)
            else:
                stream = [self.seed, epoch, partition, _PARTITION_STREAM]
                permutation = np.random.default_rng(stream).permutation(size).astype(np.int64)
            self._permutations[key] = permutation
            while len(self._permutations) > 3 * len(self.partition_sizes):
                self._permutations.pop(next(iter(self._permutations)))
        return permutation

    def local_indices(self, partition: int, iteration: int) -> np.ndarray:
        """Indices, within partition ``partition``, of its share of batch ``iteration``."""
        size = self.partition_sizes[partition]
        share = self.share_sizes[partition]
        if share == 0:
            return np.zeros(0, dtype=np.int64)
        first = iteration * share
        pieces = []
        position = first
        while position < first + share:
            epoch, offset = divmod(position, size)
            take = min(size - offset, first + share - position)
            pieces.append(self._permutation(partition, epoch)[offset : offset + take])
            position += take
        return np.concatenate(pieces)

    def shares(self, iteration: int) -> list[np.ndarray]:
        """Every partition's :meth:`local_indices` of batch ``iteration``, in partition order:
        what the partitions train on in that iteration."""
        return [
            self.local_indices(partition, iteration) for partition in range(self.num_partitions)
        ]

    def epoch_global_indices(self, epoch: int) -> list[np.ndarray]:
        """One entry per iteration of ``epoch``: the :meth:`global_indices` of its batch."""
        first = epoch * self.iterations_per_epoch
        return [self.global_indices(t) for t in range(first, first + self.iterations_per_epoch)]

    def global_indices(self, iteration: int) -> np.ndarray:
        """Indices into the concatenation of all partitions of batch ``iteration``'s samples,
        partition 0's share first."""
        return np.concatenate(
            [
                self.offsets[partition] + self.local_indices(partition, iteration)
                for partition in range(self.num_partitions)
            ]
        )


class PlannedDataset(ArrayDataset):
    """An ArrayDataset whose batches follow a :class:`PartitionedBatchPlan`.

    ``features``/``labels`` must be the concatenation of the partitions in partition order.
    Training a ``LocalOptimizer`` on it reproduces a distributed run's global batches.
    """

    def __init__(self, features, labels, plan: PartitionedBatchPlan, **options):
        super().__init__(features, labels, batch_size=plan.batch_size, shuffle=False, **options)
        if len(self) != plan.total:
            raise ValueError(
                f"PlannedDataset: {len(self)} samples but the plan covers {plan.total}"
            )
        self.plan = plan

    def num_batches(self, batch_size: int | None = None) -> int:
        return self.plan.iterations_per_epoch

    def global_batch_indices(self, epoch: int, batch_size: int | None = None) -> list[np.ndarray]:
        return self.plan.epoch_global_indices(epoch)
