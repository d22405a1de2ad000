"""Training modes: how the partitions' gradients become new weights, one object per mode.

A mode owns its stage builders (what one chained iteration does in Spark), its optimizer
state layout over the partitions, how that state goes into a checkpoint and comes back, and
whether it can chain iterations under global-norm clipping. ChainerMN picks a communicator by
name; ``DistriOptimizer(update=...)`` picks a mode the same way: a registered name, or a mode
object (``LocalSGD(period=4)``).

A new mode is one file in this package — a :class:`TrainingMode` subclass — and one line in
``_MODULES`` below that registers it.
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
    """

    name = ""
    state_name = ""
    chains_with_global_norm_clipping = True

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
        """Run ``chain`` on ``run`` (a ``SparkTrainingRun``); one dict per iteration."""
        return run.collect_chain(self.build_chain(chain), chain, description)

    def build_chain(self, chain: Any) -> Any:
        """The RDD whose partition ``j`` returns ``(j, weight slice j, history, buffers,
        timings)`` after the chain's iterations."""
        raise NotImplementedError

    def resume_states(self, shards: list[dict], flat_size: int, count: int) -> list[dict]:
        """A checkpoint's optimizer state (``shards``) as ``count`` slices of the vector."""
        if len(shards) == count and not (count > 1 and are_whole_states(shards, flat_size)):
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
