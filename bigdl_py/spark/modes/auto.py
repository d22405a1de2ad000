"""``update="auto"`` (the default): pick the exact mode and the iterations per job.

The rule below; the runs it comes from are in ``bench/RESULTS.md`` (the section "Moved
from the code's docstrings" quotes the numbers this docstring used to carry, with their
dates).

* **Local mode: one task.** Where Spark runs in one process (``local[n]``), every
  partition is on one machine, and a Spark stage per iteration buys no parallelism that
  one task and the processes it forks do not. So auto picks ``one-task``
  (:mod:`bigdl_py.spark.modes.one_task`: the same exact SGD on the same global batches,
  one task per job of at least 128 iterations (64 above 1 MB of parameters, 4 above 16 MB:
  their iterations take seconds, and progress comes a job at a time), the shares trained on
  a replica per task slot, in the task and in child processes); it ran LeNet-5, the CIFAR
  CNN and ResNet-18 faster than either exact mode. ``local-cluster`` and real clusters get
  the data-parallel rule below.

On a cluster:

* **The mode.** An iteration of the sharded update is two Spark stages, one of the
  replicated update is one stage whose shuffle carries N whole gradients to every partition
  (N x N x M bytes in all, against about 2 x N x M). A stage's fixed cost is the larger part
  while the bytes one partition receives stay below a few MB; past 16 MB moving them costs
  more than the stage saved, and each partition would also keep the whole optimizer state.
  So: **replicated while N x parameter bytes <= 16 MB** (what one partition receives per
  iteration), **sharded above**.
* **Iterations per job.** Replicated: **16** (faster than 8); sharded: **1** (chaining did
  not pay for its second shuffle). Where the executors share no disk a chained stage may
  run on another host than its partition's files, so each partition's rows of the chain's
  later iterations travel with the chain (:class:`~bigdl_py.spark.records.ShareRows`): at
  most ``records.CARRIED_ROWS_LIMIT_BYTES`` of them, which caps the chain for large
  samples (:func:`~bigdl_py.spark.records.iterations_with_carried_rows`). An
  ``iterations_per_job`` the caller gives is kept.
* **Whole-executor tasks.** On a cluster whose executors have several cores (and
  ``spark.task.cpus`` left at 1), one partition per executor, trained in one task of all
  its cores (stage-level scheduling: a task ResourceProfile) on a replica per core — the
  task's own and forked helpers, as the one-task mode's — so that one gradient per
  executor, not per core, enters the AllReduce: :func:`whole_executor_cpus`.
* **Global-norm clipping** costs the sharded update a second job per iteration and nothing
  to the replicated one; the rule above already picks replicated wherever it is cheap, and
  the sharded update then runs one iteration per job (as without ``auto``).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from bigdl_py.spark.records import iterations_with_carried_rows

logger = logging.getLogger("bigdl_py.spark")

#: Replicated while N x parameter bytes stays at or below this (bytes one partition receives).
REPLICATED_MAX_RECEIVED_BYTES = 16 << 20
REPLICATED_ITERATIONS_PER_JOB = 16
SHARDED_ITERATIONS_PER_JOB = 1


def whole_executor_cpus(
    executors: int, cores: int, task_cpus: int, local_mode: bool, device: str = "cpu"
) -> int | None:
    """The CPUs of auto's whole-executor tasks on ``executors`` executors of ``cores`` cores
    each (tasks of ``task_cpus`` CPUs by Spark's setting), or None for a task per core.

    None in local mode (the one-task mode trains there), on one-core executors (nothing to
    gain), on GPU replicas (a child process cannot share the task's GPU context), and
    where ``spark.task.cpus`` already gives each task several CPUs (the user's layout:
    BigDL's, a task per executor with BLAS threads).
    """
    if local_mode or cores <= 1 or task_cpus > 1 or device != "cpu" or executors < 1:
        return None
    return cores


class AutoChoice(NamedTuple):
    """What ``update="auto"`` chose, and the sentence it logs."""

    update: str
    iterations_per_job: int
    reason: str


def choose_mode(
    parameter_bytes: int,
    num_partitions: int,
    shared_disk: bool,
    global_norm_clipping: bool,
    iterations_per_job: int | None = None,
    local_mode: bool = False,
    share_bytes: int = 0,
) -> AutoChoice:
    """The exact mode and iterations per job for a run (see the module docstring).

    Parameters
    ----------
    parameter_bytes : int
        Bytes of the trained parameters (their count x the dtype's size).
    num_partitions : int
    shared_disk : bool
        Whether the executors share a disk (``session.executors_share_a_disk``).
    global_norm_clipping : bool
        Whether an ``L2NormClipping`` is set.
    iterations_per_job : int, optional
        The caller's choice, kept when given.
    local_mode : bool
        Whether Spark runs in one process (``local[n]``): then one task trains.
    share_bytes : int
        Bytes of the largest partition's share of a global batch (its rows travel with a
        chain where no disk is shared).

    Returns
    -------
    AutoChoice
    """
    if local_mode:
        from bigdl_py.spark.modes import one_task

        per_job = max(iterations_per_job or 1, one_task.iterations_per_job(parameter_bytes))
        reason = (
            f"update: one-task, {per_job} iterations per job: local mode, "
            f"{num_partitions} partitions on one machine train in one task "
            f"({parameter_bytes / 1e6:.2f} MB of parameters)"
        )
        return AutoChoice("one-task", per_job, reason)
    received = parameter_bytes * num_partitions
    replicated = received <= REPLICATED_MAX_RECEIVED_BYTES
    update = "replicated" if replicated else "sharded"
    if iterations_per_job is None:
        chained = REPLICATED_ITERATIONS_PER_JOB if replicated else SHARDED_ITERATIONS_PER_JOB
        iterations_per_job = chained
        if not shared_disk:
            iterations_per_job = min(chained, iterations_with_carried_rows(share_bytes))
    if global_norm_clipping and not replicated:
        iterations_per_job = 1
    per_job = "iteration" if iterations_per_job == 1 else "iterations"
    reason = (
        f"update: {update}, {iterations_per_job} {per_job} per job: "
        f"{parameter_bytes / 1e6:.2f} MB of parameters, {num_partitions} partitions"
        + ("" if shared_disk else ", executors without a shared disk")
        + (", global-norm clipping" if global_norm_clipping else "")
    )
    return AutoChoice(update, int(iterations_per_job), reason)
