"""How a ``DistriOptimizer`` trains on Spark, as typed and checked values.

* :class:`SparkTrainingSettings` — what the caller chose (``update``, ``wire_dtype``,
  ``gradient_accumulation``, ``iterations_per_job``, ``device``: ``DistriOptimizer``'s
  parameters of those names say what each does). Frozen and checked when made, so a bad
  value fails before any data is cached, with a message that names the setting.
* :class:`Executors` — what the cluster is, as far as a run's plan depends on it: whether
  the executors share a disk, whether Spark runs in one process. Measured once the data is
  on the executors.
* :func:`plan_run` — what a run does with both: the training mode and the iterations per
  job (``update="auto"``'s rule, :mod:`bigdl_py.spark.modes.auto`, or the caller's mode with
  the default iterations per job for these executors).
"""

from __future__ import annotations

import copy
import numbers
from dataclasses import dataclass
from typing import Any, NamedTuple

from bigdl_py.spark import wire
from bigdl_py.spark.gpu import check_device_request
from bigdl_py.spark.modes import TrainingMode, resolve_mode
from bigdl_py.spark.records import iterations_with_carried_rows

#: Iterations per Spark job where the caller gave none (bench/RESULTS.md: chaining them pays
#: the job's fixed cost once); fewer where no disk is shared and large shares would travel
#: with the chain (records.iterations_with_carried_rows).
DEFAULT_ITERATIONS_PER_JOB = 8
#: The upper bound keeps a job's lineage (two shuffles per iteration) well inside the driver
#: JVM's stack: Spark walks it recursively and overflowed at 100 iterations.
MAX_ITERATIONS_PER_JOB = 32


@dataclass(frozen=True)
class SparkTrainingSettings:
    """The caller's Spark training settings, checked and normalised when made.

    Raises
    ------
    ValueError
        Naming the setting: ``gradient_accumulation`` not a positive integer,
        ``iterations_per_job`` not an integer from 1 to ``MAX_ITERATIONS_PER_JOB``, an
        unknown ``update`` name (the message lists the known ones), a ``wire_dtype`` other
        than None, ``"float32"``, ``"float16"`` or ``"bfloat16"``, an unknown ``device``.
    """

    update: str | TrainingMode = "auto"
    wire_dtype: str | None = None
    gradient_accumulation: int = 1
    iterations_per_job: int | None = None  # None: as ``auto`` or the executors decide
    device: str = "cpu"

    def __post_init__(self) -> None:
        accumulation = self.gradient_accumulation
        if isinstance(accumulation, bool) or int(accumulation) < 1:
            raise ValueError(
                f"gradient_accumulation must be a positive integer, got {accumulation!r}"
            )
        per_job = self.iterations_per_job
        if per_job is not None and (
            isinstance(per_job, bool)
            or not isinstance(per_job, numbers.Integral)
            or not 1 <= per_job <= MAX_ITERATIONS_PER_JOB
        ):
            raise ValueError(
                f"iterations_per_job must be an integer from 1 to {MAX_ITERATIONS_PER_JOB}, "
                f"got {per_job!r}"
            )
        if self.update != "auto" and not isinstance(self.update, TrainingMode):
            resolve_mode(self.update)  # an unknown name fails here, before any data is cached
        # Normalised values (a frozen dataclass sets them through object.__setattr__).
        object.__setattr__(self, "gradient_accumulation", int(accumulation))
        object.__setattr__(self, "wire_dtype", wire.check_wire_dtype(self.wire_dtype))
        object.__setattr__(self, "device", check_device_request(self.device))


@dataclass(frozen=True)
class Executors:
    """What the cluster is, as a run's plan needs it."""

    shared_disk: bool  # every executor reads the files another wrote (local modes, one host,
    # or a shared BIGDL_PY_STATE_DIR): a chained stage may run away from its partition's files
    local_mode: bool  # Spark runs in this one process (``local[n]``)
    # Whole-executor tasks the run's data was laid out for (their CPUs), else None.
    whole_executor_cpus: int | None = None

    @classmethod
    def of(cls, sc: Any, whole_executor_cpus: int | None = None) -> Executors:
        """The executors of SparkContext ``sc`` (ask once the data is on them)."""
        from bigdl_py.spark.session import executors_share_a_disk, is_local_mode

        return cls(
            shared_disk=executors_share_a_disk(sc),
            local_mode=is_local_mode(sc),
            whole_executor_cpus=whole_executor_cpus,
        )


class RunPlan(NamedTuple):
    """What one run does: its training mode (its own copy), iterations per job, and the
    replicas each stage task trains on (a whole-executor task's: one per core)."""

    mode: TrainingMode
    iterations_per_job: int
    reason: str | None  # ``update="auto"``'s choice, in words, for the log; None otherwise
    replicas_per_task: int = 1


def plan_run(
    settings: SparkTrainingSettings,
    executors: Executors,
    *,
    parameter_bytes: int,
    num_partitions: int,
    global_norm_clipping: bool,
    share_bytes: int = 0,
) -> RunPlan:
    """The mode and iterations per job of a run of ``parameter_bytes`` of trained parameters
    over ``num_partitions`` partitions on ``executors``, whose largest share of a global
    batch is ``share_bytes``.

    ``update="auto"`` follows :func:`bigdl_py.spark.modes.auto.choose_mode`. A named mode or
    mode object runs the caller's ``iterations_per_job``, by default
    ``DEFAULT_ITERATIONS_PER_JOB`` (where the executors share no disk, at most
    :func:`~bigdl_py.spark.records.iterations_with_carried_rows`). The mode is the run's own
    copy: a mode object may record per-run settings.
    """
    if settings.update == "auto":
        from bigdl_py.spark.modes.auto import choose_mode

        choice = choose_mode(
            parameter_bytes=parameter_bytes,
            num_partitions=num_partitions,
            shared_disk=executors.shared_disk,
            global_norm_clipping=global_norm_clipping,
            iterations_per_job=settings.iterations_per_job,
            local_mode=executors.local_mode,
            share_bytes=share_bytes,
        )
        replicas = executors.whole_executor_cpus or 1
        reason = choice.reason
        if replicas > 1:
            reason += f"; one task per executor, on {replicas} replicas (one per core)"
        return RunPlan(resolve_mode(choice.update), choice.iterations_per_job, reason, replicas)
    mode = copy.deepcopy(resolve_mode(settings.update))
    # The data's layout decides: whole-executor tasks train on a replica per core (the
    # one-task mode has its own replicas).
    replicas = executors.whole_executor_cpus or 1 if mode.name != "one-task" else 1
    per_job = settings.iterations_per_job
    if per_job is None:
        per_job = DEFAULT_ITERATIONS_PER_JOB
        if not executors.shared_disk:
            per_job = min(per_job, iterations_with_carried_rows(share_bytes))
    return RunPlan(mode, int(per_job), None, replicas)
