"""``update="auto"`` (the default): pick the exact mode and the iterations per job.

* **Local mode: one task.** Where Spark runs in one process (``local[n]``), every
  partition is on one machine, and a Spark stage per iteration buys no parallelism that
  one task and the processes it forks do not. So auto picks ``one-task``
  (:mod:`bigdl_py.spark.modes.one_task`: the same exact SGD on the same global batches,
  one task per job of at least 128 iterations (64 above 1 MB of parameters, 4 above 16 MB:
  their iterations take seconds, and progress comes a job at a time), the shares trained on
  a replica per task slot, in the task and in child processes). Measured on the bench
  machine (2 cores, ``local[2]``, batch 128,
  bench/RESULTS.md 2026-11-25 07:07): one-task ran LeNet-5 at 11,401-13,129 samples/s
  against 1,837-1,976 for replicated:16, the CIFAR CNN at 653-656 against 347-386,
  ResNet-18 at 39.2 against 32.6 for sharded:1. ``local-cluster`` and
  real clusters get the data-parallel rule below.

On a cluster, the rule, and the measurements it comes from (``bench/RESULTS.md``,
"Everything the issue asks for, in one run", 2026-11-24, local[2], N = 2, warm JVM; and
"AllReduce alone"):

* **The mode.** An iteration of the sharded update is two Spark stages, one of the
  replicated update is one stage whose shuffle carries N whole gradients to every partition
  (N x N x M bytes in all, against about 2 x N x M). A stage costs about 36 ms; moving the
  bytes costs little below a few MB per receiver and grows past 16 MB (the AllReduce of N=2
  arrays took 126 ms at 1 MB, 140 at 4 MB, 232 at 16 MB, 776 at 64 MB). Measured:
  LeNet-5 (89 KB of parameters) runs 1.6-1.8x faster replicated at batch 128 (2,164-2,805
  against 1,359-1,661 samples/s) and 1.3-1.5x at 512; the CIFAR CNN (4.5 MB) about the same
  either way (replicated:8 401-415, sharded:1 435-464; replicated ahead on 2026-11-23, 286
  against 229). So: **replicated while N x parameter bytes <= 16 MB** (what one partition
  receives per iteration), **sharded above** — there the extra bytes cost more than the
  stage saved, and each partition would also keep the whole optimizer state.
* **Iterations per job.** Replicated: **16** (median 2,395 samples/s against 2,164 at 8, at
  batch 128; 7,943 against 7,628 at 512). Sharded: **1** — chaining did not pay for it
  (LeNet-5 at 512: 5,760 at 1 against 5,251 at 8; CIFAR CNN 435 against 332). Chaining needs
  executors that share a disk (a chained stage may run away from its partition's files):
  **1 everywhere else**. An ``iterations_per_job`` the caller gives is kept.
* **Global-norm clipping** costs the sharded update a second job per iteration and nothing
  to the replicated one; the rule above already picks replicated wherever it is cheap, and
  the sharded update then runs one iteration per job (as without ``auto``).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

logger = logging.getLogger("bigdl_py.spark")

#: Replicated while N x parameter bytes stays at or below this (bytes one partition receives).
REPLICATED_MAX_RECEIVED_BYTES = 16 << 20
REPLICATED_ITERATIONS_PER_JOB = 16
SHARDED_ITERATIONS_PER_JOB = 1


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
        iterations_per_job = chained if shared_disk else 1
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
