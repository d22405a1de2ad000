"""Training modes: how the partitions' gradients become new weights, one object per mode.

A mode owns the stages of a job (what its chained iterations do in Spark, and which records
go where), its optimizer state's layout over the partitions, how that state goes into a
checkpoint and comes back, and whether it can chain iterations under global-norm clipping.
ChainerMN picks a communicator by name; ``DistriOptimizer(update=...)`` picks a mode the same
way: a registered name, or a mode object (``LocalSGD(period=4)``).

A new mode is one file in this package — a :class:`TrainingMode` subclass — and one line in
``_MODULES`` below that registers it.

The mode contract
-----------------
The driver (:class:`bigdl_py.spark.training_run.SparkTrainingRun`) runs ``chain.count``
consecutive iterations as one job: it hands the run's mode a
:class:`~bigdl_py.spark.records.Chain` (the iterations' shares of the global batches and
their schedules, how a task reaches the run spec, the driver's weights and the data) and
reads back one :class:`~bigdl_py.spark.records.ChainResult` per partition. On the driver:

``build_chain(chain) -> RDD``
    The job, not yet run, built on ``chain.data_rdd`` (the cached data handles, one per
    partition). Its ``collect()`` gives one ``ChainResult`` for each partition ``j``: slice
    ``j`` (``chain.bounds[j]``) of the weights after the chain's last iteration, the
    running statistics and the history — one :class:`~bigdl_py.spark.records.HistoryEntry`
    per iteration that ran, in order — in partition 0's result, the timings, and the
    optimizer state as ``checkpoint_state`` lays it out where it travels
    (``spec.carry_state``: executors without a shared disk), else None. The mathematics of
    an exact mode is the local loop's on the global batch (``train/runner.py``'s contract:
    clip in order, step, a non-finite loss changes neither weights nor state but advances
    the schedule). With ``chain.stop_after_nonfinite`` the iterations after a non-finite
    loss do nothing and the history ends with that one. Every stage must be a pure function
    of its input and the state files kept since the chain's start
    (``chain.retain_from``): Spark recomputes the stages a lost executor held. Where the
    executors share no disk (``chain.own_travels``) there are no state files and a stage
    may run on any host: each stage says what it does — ``Stage.of(chain, trains=[the
    iterations it runs forward-backward for], updates=the iteration it updates, last=it
    ends the chain)`` — and ``stage_task`` hands each partition's optimizer state and rows
    (``records.Own``) on to its next stage, where ``inp.own`` holds them.
``run(run, chain, description) -> list[dict]`` (optional)
    One ``{"loss", "count", "finite"}`` dict per iteration that ran. The default collects
    ``build_chain(chain)`` (``run.collect_chain``); a mode that needs several jobs for a
    chain overrides it with ``run.collect(rdd, description, what)`` and
    ``run.finish_chain(results, chain, submitted, returned)`` (the sharded update under
    global-norm clipping; local SGD replaying up to a non-finite loss).
``iterations_per_call(requested, spec) -> int``, ``steps_to_run(first, count) -> int``
    How many iterations one call, and one job of it, may take.
``resume_states(shards, flat_size, count) -> list[dict]``
    A checkpoint's optimizer state (any mode's layout, any partition count) as this
    mode's ``count`` entries.
``check_training(model, batch_size, num_partitions) -> int | None``, ``prepare(spec, setup)
-> spec``, ``release()`` (optional)
    For a mode that depends on the model (the pipeline cuts it into stages): what it can
    check before any data is cached, and the partition count it trains on; its plan, made
    once per ``optimize()`` with the data on the executors, and the run spec the executors
    get; what it frees when ``optimize()`` ends.

On the executors (inside the stages):

``state_owner(partition)``, ``initial_state(shards, partition, flat_size)``,
``checkpoint_state(state, partition, bounds)``
    Which task keeps the state a checkpoint entry is cut from, what partition
    ``partition`` starts from at a resume, and what it gives a checkpoint (entry ``j`` is
    slice ``j`` of the state in the exact modes, whichever wrote it).

The building blocks, so that a mode says only which records go where:

* :mod:`bigdl_py.spark.modes.stages` — a stage is
  ``rdd.mapPartitionsWithIndex(stage_task(Stage.of(chain, ...), body))`` and a shuffle
  between two stages is ``chain.shuffle(rdd)`` (``collectives.shuffle_to_owners``, the next
  stage's tasks under the run's task profile: whole-executor tasks).
  ``stage_task`` opens every task one way (the driver's weights in the chain's first stage,
  the previous stage's records later, and ``own``: what the partition handed itself, where
  no disk is shared: :class:`~bigdl_py.spark.modes.stages.StageInput`);
  ``body(inp)`` yields ``(destination, record)`` pairs, or, in the last stage, one
  ``chain_end(...)``. The exact modes' pieces: ``partition_gradient``,
  ``receive_gradients``, ``update_received``, ``after_update``.
* :mod:`bigdl_py.spark.records` — the record kinds every mode shares:
  ``GradientRecord.addressed`` (a gradient or its slice, to the partition that adds it up),
  ``Carried`` (what one iteration hands the next). A mode's own kinds are NamedTuples in
  its file, read by its own reader (local SGD's ``_RoundRecord`` and ``_average``).
* :mod:`bigdl_py.spark.owner_update` — the one owner step (``owner_step``; with the state
  kept between iterations, ``update_owned``) and ``stops_chain``: every mode updates
  through them.
* :func:`bigdl_py.spark.replica.replica_gradient` — a partition's forward-backward, of its
  share of the global batch or of its own batch (``ShareOf``).
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from bigdl_py.optim.sharding import all_slice_bounds, concatenate_state_dicts, split_state_dict

# name -> "module:Class" (imported on first use, so naming a mode costs nothing).
_MODULES = {
    "sharded": "bigdl_py.spark.modes.sharded:Sharded",
    "replicated": "bigdl_py.spark.modes.replicated:Replicated",
    "local-sgd": "bigdl_py.spark.modes.local_sgd:LocalSGD",
    "one-task": "bigdl_py.spark.modes.one_task:OneTask",
    "pipeline": "bigdl_py.spark.modes.pipeline:Pipeline",
}


class TrainingMode:
    """Base class of the training modes.

    Attributes
    ----------
    name : str
        The registered name (``DistriOptimizer(update=name)``).
    state_name : str
        Names the optimizer state's files and cache entries; modes that share it (replicated
        and local SGD: the whole state on every partition) continue each other's state.
    chains_with_global_norm_clipping : bool
        False when an iteration under ``L2NormClipping`` needs a job of its own.
    reads_driver_weights : bool
        False for a mode that ships the driver's weights its own way (the pipeline: each
        stage its slice); its chains then have no ``get_weights``.
    """

    name = ""
    state_name = ""
    chains_with_global_norm_clipping = True
    reads_driver_weights = True

    # --- the driver's side ------------------------------------------------------------
    def iterations_per_call(self, requested: int, spec: Any) -> int:
        """Iterations the runner may take in one call, from ``iterations_per_job``."""
        if spec.l2_clipping is not None and not self.chains_with_global_norm_clipping:
            return 1
        return requested

    def steps_to_run(self, first: int, count: int) -> int:
        """How many of the ``count`` iterations offered from ``first`` one job runs (a mode
        may end a job earlier, e.g. where it changes how it trains)."""
        return count

    def run(self, run: Any, chain: Any, description: str) -> list[dict]:
        """Run ``chain`` on ``run`` (a ``SparkTrainingRun``); one dict per iteration that ran."""
        return run.collect_chain(self.build_chain(chain), chain, description)

    def build_chain(self, chain: Any) -> Any:
        """The job's RDD: its ``collect()`` gives one ``ChainResult`` per partition (see the
        module docstring)."""
        raise NotImplementedError

    def check_training(self, model: Any, batch_size: int, num_partitions: int | None):
        """Before any data is cached: check what the mode can of ``model`` and the batch,
        and give the partition count it trains on (None: the caller's, or the cluster's
        task slots)."""
        return num_partitions

    def prepare(self, spec: Any, setup: Any) -> Any:
        """On the driver, once per ``optimize()`` (``setup``: the loop's ``TrainingSetup``,
        the data on the executors): plan what depends on the model, and return the run spec
        the executors get."""
        return spec

    def release(self) -> None:
        """Free what :meth:`prepare` made (``optimize()`` has ended)."""

    def resume_states(self, shards: list[dict], flat_size: int, count: int) -> list[dict]:
        """A checkpoint's optimizer state (``shards``) as ``count`` slices of the vector."""
        if (
            len(shards) == count
            and not (count > 1 and are_whole_states(shards, flat_size))
            and _balanced_slices(shards, flat_size)
        ):
            return shards
        whole = whole_state(shards, flat_size)
        if any(_is_per_element(value) for value in whole.values()):
            return split_state_dict(whole, all_slice_bounds(flat_size, count))
        return [dict(whole) for _ in range(count)]

    # --- the executors' side ------------------------------------------------------------
    def state_owner(self, partition: int) -> int:
        """Which partition's task keeps the optimizer state checkpoint entry ``partition``
        is cut from (one-task's single task keeps all of it in one place)."""
        return partition

    def initial_state(self, shards: list[dict], partition: int, flat_size: int) -> dict:
        """Partition ``partition``'s optimizer state at a resume, from ``resume_states``."""
        return shards[partition]

    def checkpoint_state(self, state: dict, partition: int, bounds: list) -> dict:
        """What partition ``partition`` gives a checkpoint from its optimizer ``state``."""
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _is_per_element(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.ndim == 1


def _balanced_slices(shards: list[dict], flat_size: int) -> bool:
    """Whether shard ``j`` holds slice ``j`` of the balanced split (the exact modes' layout;
    a pipeline's shards follow its stages instead)."""
    bounds = all_slice_bounds(flat_size, len(shards))
    return all(
        value.size == stop - start
        for shard, (start, stop) in zip(shards, bounds, strict=True)
        for value in shard.values()
        if _is_per_element(value)
    )


def are_whole_states(shards: list[dict], flat_size: int) -> bool:
    """Whether every shard holds the state of the whole vector (local SGD's checkpoints)."""
    sizes = [v.size for shard in shards for v in shard.values() if _is_per_element(v)]
    return bool(sizes) and all(size == flat_size for size in sizes)


def whole_state(shards: list[dict], flat_size: int) -> dict:
    """One state of the whole vector from a checkpoint's shards: slices are joined; whole
    states (one per partition, local SGD's) are averaged element-wise."""
    if len(shards) == 1:
        return dict(shards[0])
    if not are_whole_states(shards, flat_size):
        return concatenate_state_dicts(shards)
    whole = dict(shards[0])
    for key, value in whole.items():
        if _is_per_element(value):
            whole[key] = np.mean([shard[key] for shard in shards], axis=0).astype(value.dtype)
    return whole


def mode_names() -> list[str]:
    """The registered mode names, and ``"auto"``."""
    return ["auto", *_MODULES]


def resolve_mode(update: Any) -> TrainingMode:
    """The mode object for ``update``: a registered name or a :class:`TrainingMode`.

    A name may carry the mode's integer settings after colons, in the order of its
    constructor's arguments: ``"local-sgd:8"`` is ``LocalSGD(period=8)``, ``"local-sgd:8:100"``
    ``LocalSGD(period=8, warmup_iterations=100)`` (how Spark ML's ``updateMode`` param and
    the command line name a mode).

    Raises
    ------
    ValueError
        For an unknown name (the message lists the known ones) or bad settings.
    """
    if isinstance(update, TrainingMode):
        return update
    name, *settings = update.split(":") if isinstance(update, str) else ("", None)
    if name not in _MODULES:
        raise ValueError(
            f"update must be one of {mode_names()} or a training mode object such as "
            f"LocalSGD(period=4), got {update!r}"
        )
    module, _, cls = _MODULES[name].partition(":")
    try:
        arguments = [int(setting) for setting in settings]
    except ValueError:
        raise ValueError(
            f"update {update!r}: the settings after {name!r} must be integers"
        ) from None
    try:
        return getattr(importlib.import_module(module), cls)(*arguments)
    except TypeError:
        raise ValueError(f"update {update!r}: mode {name!r} takes no such settings") from None
