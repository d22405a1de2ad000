"""The run/chain driver: one ``optimize()`` on Spark, as jobs of chained iterations.

A job runs ``count`` consecutive iterations (a *chain*; one iteration is a chain of length
1: there is one code path). :class:`SparkTrainingRun` is the driver's side only: it ships
the weights and the run spec, describes the job as a :class:`~bigdl_py.spark.records.Chain`
and hands it to the run's training mode (``spec.mode``, :mod:`bigdl_py.spark.modes`), which
builds the stages and says which records go where. It submits the job, reads what the
chain's last stage returns — one :class:`~bigdl_py.spark.records.ChainResult` per partition
— and keeps the weights (slice ``j`` from partition ``j``: one copy reaches the driver), the
running statistics, the optimizer state where it travels, and the timings.

Every chained stage is a pure function of its shuffle input and the state files on its
host's disk (kept from the chain's start), so Spark can recompute any of them after losing
an executor and get the same bytes.

PySpark has no ``zipPartitions``; the replicas live in the Python workers' caches, keyed by
partition, next to the data they train on (the cached handle RDD), which is what BigDL's
zipped model and data RDDs achieve. A chained stage after the first reads a shuffle, not the
cached handles, and Spark may run it on any executor. Where the executors share a disk
(local and local-cluster modes, one host, a shared ``BIGDL_PY_STATE_DIR``) it finds its data
through the partition's handle and its optimizer state in the host's files; where they do
not, the chain's first stage — which reads the cached handles, so it runs where the files
are — gathers the partition's rows of the later iterations, and they travel with the
optimizer state from stage to stage (``records.Own``): a chained stage then reads no file,
and is a pure function of its shuffle input on any host.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from pyspark import cloudpickle

from bigdl_py.optim.sharding import all_slice_bounds
from bigdl_py.spark import collectives, worker
from bigdl_py.spark.partitioned_data import (
    DistributedTrainingError,
    PartitionedData,
    drain,
    python_error_text,
    remove_run_everywhere,
)
from bigdl_py.spark.records import Chain, ChainResult, HistoryEntry
from bigdl_py.spark.session import job_description

# Weights up to this size travel inside the task closure (one pickle per task, no broadcast
# bookkeeping); bigger ones by broadcast, which each executor fetches once.
CLOSURE_WEIGHTS_LIMIT_BYTES = 2 << 20


class SparkTrainingRun:
    """One ``optimize()`` on Spark: replicas and optimizer state of a run on the executors.

    Parameters
    ----------
    data : PartitionedData
    spec : replica.RunSpec
        Model, criterion, optim method, clipping, wire dtype, mode; shipped once by broadcast.
    weights : np.ndarray
        The initial flat weights (the model's dtype, float32 or float64).
    initial_optim_states : dict, optional
        ``{"iteration": t, "shards": [state dict per shard]}`` to resume from.
    """

    def __init__(self, data: PartitionedData, spec, weights: np.ndarray, initial_optim_states=None):
        self.sc = data.sc
        self.data = data
        self.spec = spec
        self.mode = spec.mode
        self.num_partitions = data.num_partitions
        self.weights = np.array(weights)
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
    def ship(self, values: np.ndarray):
        """A zero-argument function that returns ``values`` on the executor: in the task
        closure when small, else by a broadcast destroyed after the job."""
        if values.nbytes <= CLOSURE_WEIGHTS_LIMIT_BYTES:
            return lambda: values
        broadcast = self.sc.broadcast(values)
        self._broadcasts.append(broadcast)
        return lambda: broadcast.value

    def spec_loader(self):
        """A zero-argument function that returns the run spec on the executor (cached)."""
        spec_broadcast, run_id = self.spec_broadcast, self.spec.run_id

        def load_spec():
            return worker.fetch(run_id, "spec", lambda: cloudpickle.loads(spec_broadcast.value))

        return load_spec

    # --- iterations -----------------------------------------------------------------------
    def run_chain(
        self,
        first: int,
        shares: list,
        schedules: list[dict],
        description: str,
        stop_after_nonfinite: bool = False,
        frozen_weights: np.ndarray | None = None,
    ) -> list[dict[str, Any]]:
        """Run iterations ``first .. first + len(shares) - 1`` (0-based) as the mode's job(s).

        The weights advance unless a loss was not finite: with ``stop_after_nonfinite`` the
        iterations after it do nothing; otherwise each non-finite iteration only advances
        the schedule. ``frozen_weights`` are the values of the parameters outside
        ``spec.trainable``, when the run trains a part. Returns one ``{"loss", "count",
        "finite"}`` dict per iteration that ran.
        """
        get_frozen = (lambda: None) if frozen_weights is None else self.ship(frozen_weights)
        chain = Chain(
            first=first,
            shares=shares,
            schedules=schedules,
            stop_after_nonfinite=stop_after_nonfinite,
            num_partitions=self.num_partitions,
            bounds=self.slice_bounds,
            load_spec=self.spec_loader(),
            # (A mode that ships the weights its own way makes no whole-vector broadcast.)
            get_weights=self.ship(self.weights) if self.mode.reads_driver_weights else None,
            get_frozen=get_frozen,
            initial_states=self.initial_optim_states,
            handles={handle["partition"]: handle for handle in self.data.partition_handles},
            data_rdd=self.data.handles,
            buffers=self.buffers,
            own_travels=self.spec.carry_state,
            task_profile=self.data.task_profile,
        )
        return self.mode.run(self, chain, description)

    def collect(self, rdd, description: str, what: str) -> list:
        """Run ``rdd``'s job under ``description``; a failure names ``what`` failed and the
        Python error a task raised. The job's broadcasts and shuffle files go afterwards."""
        try:
            self._last_rdd = rdd
            with job_description(self.sc, description):
                return rdd.collect()
        except Exception as error:
            raise DistributedTrainingError(f"{what} failed: {python_error_text(error)}") from None
        finally:
            self._release_job()

    def collect_chain(self, rdd, chain: Chain, description: str) -> list[dict]:
        """Run a chain's job; keep the weights (slice j from partition j), buffers and
        timings; return ``{"loss", "count", "finite"}`` per iteration that ran."""
        first, count = chain.first, chain.count
        submitted = time.time()
        what = f"iteration {first + 1}" if count == 1 else f"iterations {first + 1}-{first + count}"
        results = self.collect(rdd, description, what)
        return self.finish_chain(results, chain, submitted, time.time())

    def finish_chain(
        self, results: list[ChainResult], chain: Chain, submitted: float, returned: float
    ) -> list[dict]:
        """Keep what a chain's last stage returned (see :meth:`collect_chain`)."""
        results = sorted(results, key=lambda result: result.partition)
        self.weights = np.concatenate([np.asarray(result.weights) for result in results])
        # The partitions now keep their own state; where it travels (no shared disk), the
        # next job's first update reads the state the chain's last one returned.
        self.initial_optim_states = None
        if all(result.state is not None for result in results):
            shards = [result.state for result in results]
            self.initial_optim_states = {"iteration": chain.first + chain.count, "shards": shards}
        history = results[0].history
        if results[0].buffers is not None:
            self.buffers = results[0].buffers
        self.last_timings = _timings(submitted, returned, chain.count, history, results)
        return [
            {
                "loss": entry.loss_sum / max(entry.count, 1),
                "count": entry.count,
                "finite": bool(np.isfinite(entry.loss_sum)),
            }
            for entry in history
        ]

    @property
    def last_lineage_depth(self) -> int:
        """Lines of the last job's RDD lineage: constant when nothing chains up."""
        if self._last_rdd is None:
            return 0
        debug = self._last_rdd.toDebugString()
        return len((debug.decode() if isinstance(debug, bytes) else debug).splitlines())

    # --- optimizer state for checkpoints -----------------------------------------------
    def gather_optim_states(self, completed: int) -> list[dict]:
        """Every partition's optimizer state after iteration ``completed - 1``, as the mode
        lays it out in a checkpoint (one small job)."""
        from bigdl_py.spark.owner_update import owned_shard, state_key

        load_spec = self.spec_loader()
        initial_states = self.initial_optim_states
        bounds = self.slice_bounds

        def read_state(owner, rows):
            drain(rows)
            spec = load_spec()
            keeper = spec.mode.state_owner(owner)
            key = state_key(spec, keeper)
            method = worker.lookup(spec.run_id, key, version=completed - 1)
            if method is None:
                method = owned_shard(spec, keeper, completed, initial_states)
                worker.store(spec.run_id, key, method, version=completed - 1)
            yield owner, spec.mode.checkpoint_state(method.state_dict(), owner, bounds)

        states = self.collect(
            self.owner_rdd.mapPartitionsWithIndex(read_state),
            f"bigdl_py: gather optimizer shards after {completed}",
            "gathering the optimizer state",
        )
        return [state for _, state in sorted(states, key=lambda record: record[0])]

    # --- clean-up -----------------------------------------------------------------------
    def _release_job(self) -> None:
        """After a job: its weight broadcasts and shuffle files are no longer needed (the
        next job starts from the weights on the driver and the state files)."""
        self._destroy_broadcasts()
        if self._last_rdd is not None:
            collectives.delete_shuffle_files(self._last_rdd)

    def _destroy_broadcasts(self) -> None:
        for broadcast in self._broadcasts:
            broadcast.destroy()
        self._broadcasts.clear()

    def close(self) -> None:
        """Destroy broadcasts, drop the replicas and shards, delete this run's files."""
        self._destroy_broadcasts()
        self.spec_broadcast.destroy()
        remove_run_everywhere(self.sc, self.spec.state_dir, self.spec.run_id, self.num_partitions)


def _timings(
    submitted: float,
    returned: float,
    count: int,
    history: list[HistoryEntry],
    results: list[ChainResult],
) -> dict:
    """Seconds of the last job and, per iteration, of its phases (driver and task clocks).

    ``forward_backward`` and ``update`` are the slowest partition's compute (mean over the
    chain's iterations); ``to_first_task`` is job submission, scheduling and the Python
    worker hand-off until the first forward-backward runs Python code; ``to_driver`` from
    the last update leaving Python to collect() returning.
    """
    clocks = [result.timings for result in results]
    ran = max(len(history), 1)
    job = returned - submitted
    return {
        "job": job,
        "iterations_per_job": float(count),
        "iteration": job / ran,
        "forward_backward": float(np.mean([entry.forward_backward for entry in history] or [0])),
        "update": float(np.mean([entry.update for entry in history] or [0])),
        "to_first_task": min(clock.fb_entered for clock in clocks) - submitted,
        "to_driver": returned - max(clock.update_left for clock in clocks),
    }
