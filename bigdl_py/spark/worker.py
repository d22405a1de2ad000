"""The executor side: what a task running in a PySpark Python worker may keep and set.

PySpark reuses a Python worker process for many tasks (``spark.python.worker.reuse``), so
module-level state here outlives a task. Two things use that:

- **BLAS threads** (:func:`configure_worker_threads`): set once per worker, not per task.
- **The worker cache** (:func:`fetch`, :func:`lookup`, :func:`store`): state that is costly
  to rebuild — a model replica, a partition's data as arrays, an optimizer shard — stays in
  the worker between jobs. A cached PySpark RDD holds *pickled bytes* in the JVM, so reading
  it every iteration unpickles all of it; the RDD stays the source of truth, and the cache
  saves the unpickling when the same worker gets the same partition again.

Spark does not promise that partition ``p`` runs on the same worker next time: idle workers
wait in a queue and the next task takes whichever is free. So every lookup may miss, a miss
must rebuild (correct, only slower), and an entry carries a *version* (say, the iteration it
is at) so that a worker never returns state another worker has moved past. The counters
(:func:`stats`) measure the hit rate.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from bigdl_py import backend

T = TypeVar("T")

THREADS_ENV_VAR = "BIGDL_PY_WORKER_THREADS"

# Entries of at most this many runs stay in a worker; storing for a new run evicts the run
# used least recently. A long-lived worker must not keep every finished run's replicas.
MAX_RUNS = 4

_configured_threads: int | None = None
_runs: OrderedDict[Hashable, dict[Hashable, tuple[Any, Any]]] = OrderedDict()
_hits = 0
_misses = 0


def _task_context():
    """The running Spark task's ``TaskContext``, or None outside a task (or without pyspark)."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return None
    return TaskContext.get()


def _threads_from_task_context() -> int | None:
    """``spark.task.cpus`` of the running task, or None outside a Spark task."""
    context = _task_context()
    return context.cpus() if context is not None else None


def task_partition_id() -> int | None:
    """The partition the running Spark task reads, or None outside a task (for messages)."""
    context = _task_context()
    return context.partitionId() if context is not None else None


def configure_worker_threads(count: int | None = None) -> int:
    """Set this worker's BLAS thread count, once per worker and again only when it changes.

    Parameters
    ----------
    count : int, optional
        Threads to use. By default: the ``BIGDL_PY_WORKER_THREADS`` environment variable
        (set it with ``spark.executorEnv.BIGDL_PY_WORKER_THREADS``), else the task's
        ``spark.task.cpus`` (one task per executor using all its cores is BigDL's layout:
        set ``spark.task.cpus`` to ``spark.executor.cores``), else 1.

    Returns
    -------
    int
        The thread count now in effect.

    Raises
    ------
    ValueError
        If the count (given or from the environment) is not an integer >= 1.
    """
    global _configured_threads
    if count is None:
        text = os.environ.get(THREADS_ENV_VAR)
        if text is not None:
            try:
                count = int(text)
            except ValueError:
                raise ValueError(
                    f"{THREADS_ENV_VAR}={text!r} is not an integer thread count"
                ) from None
        else:
            count = _threads_from_task_context() or 1
    if count < 1:
        raise ValueError(f"configure_worker_threads: thread count must be >= 1, got {count}")
    if count != _configured_threads:
        # threadpoolctl inspects every loaded library: worth ~1 ms, so not on every task.
        backend.set_blas_threads(count)
        _configured_threads = count
    return count


@dataclass(frozen=True)
class CacheStats:
    """Counters of this worker's cache since the worker started (or ``reset_stats``)."""

    hits: int
    misses: int
    entries: int
    pid: int

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0


def lookup(run_id: Hashable, partition: Hashable, version: Any = None) -> Any | None:
    """The value stored for ``(run_id, partition)`` at ``version``, or None (a miss).

    A stored value with another version counts as a miss: another worker may have moved the
    partition's state on since this one stored it.
    """
    global _hits, _misses
    entry = _runs.get(run_id, {}).get(partition)
    if entry is None or entry[0] != version:
        _misses += 1
        return None
    _hits += 1
    _runs.move_to_end(run_id)
    return entry[1]


def store(run_id: Hashable, partition: Hashable, value: Any, version: Any = None) -> None:
    """Keep ``value`` for ``(run_id, partition)`` at ``version`` in this worker."""
    if value is None:
        raise ValueError("worker cache: cannot store None (lookup returns None for a miss)")
    entries = _runs.get(run_id)
    if entries is None:
        entries = _runs[run_id] = {}
        while len(_runs) > MAX_RUNS:
            _runs.popitem(last=False)
    _runs.move_to_end(run_id)
    entries[partition] = (version, value)


def fetch(run_id: Hashable, partition: Hashable, build: Callable[[], T], version: Any = None) -> T:
    """The cached value for ``(run_id, partition)`` at ``version``; on a miss, ``build()`` it.

    ``build`` rebuilds from the source of truth (typically the RDD partition the task is
    reading); its result is stored for the next task of this worker.
    """
    value = lookup(run_id, partition, version)
    if value is None:
        value = build()
        store(run_id, partition, value, version)
    return value


def forget(run_id: Hashable, partition: Hashable) -> None:
    """Drop the entry for ``(run_id, partition)`` from this worker, if there is one (state a
    worker must not keep once its task is done: another partition's may come next)."""
    _runs.get(run_id, {}).pop(partition, None)


def release_run(run_id: Hashable) -> int:
    """Drop every entry of ``run_id`` from this worker; returns how many there were."""
    return len(_runs.pop(run_id, {}))


def stats() -> CacheStats:
    """This worker's hit and miss counters, its number of entries, and its process id."""
    entries = sum(len(partitions) for partitions in _runs.values())
    return CacheStats(_hits, _misses, entries, os.getpid())


def reset_stats() -> None:
    """Zero the hit and miss counters (the entries stay)."""
    global _hits, _misses
    _hits = _misses = 0


def clear() -> None:
    """Drop every entry and zero the counters (tests use it; so can a job's clean-up)."""
    _runs.clear()
    reset_stats()
