"""The owner's side of an iteration: BigDL's *aggregateGradientPartition* and the update.

Owner ``k`` sums slice ``k`` of every replica's gradient, clips it, and steps weight slice
``k`` with the OptimMethod state it alone keeps (sharded N ways: :class:`ShardStateStore` on
the host's disk and the Python worker's cache). A mode that keeps the whole state on every
partition (replicated, local SGD) uses the same functions with the whole vector as the slice.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import struct
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.nn.serialization import atomic_write
from bigdl_py.spark import worker
from bigdl_py.spark.partitioned_data import run_directory
from bigdl_py.spark.replica import RunSpec


class ShardStateStore:
    """Optimizer state of one shard, one file per completed iteration, on the host's disk.

    Iteration ``t`` reads the state after ``t - 1`` and writes the state after ``t`` to a
    new file (atomically), deleting those before ``t - 1``. A retried task of iteration
    ``t`` therefore finds ``t - 1`` intact, and any Python worker on the host can pick up a
    shard another worker updated last.

    A file is a JSON header naming each array's key, dtype and shape, then the arrays' raw
    bytes, each written straight from the array: NumPy's ``.npz`` (a zip file) computes a
    CRC-32 of every byte and copies it through the zip writer, which made saving 3-4x
    slower (``bench/RESULTS.md``).
    """

    def __init__(self, directory: str, shard: int | str):
        self.directory = directory
        self.shard = shard

    def path(self, iteration: int) -> str:
        return os.path.join(self.directory, f"optim-{self.shard}-after-{iteration}.state")

    def save(self, iteration: int, state: dict, retain_from: int | None = None) -> None:
        """Write the state after ``iteration`` and delete the files no retry can need.

        Raises
        ------
        ValueError
            If a value is not numeric, boolean or text (the file holds raw bytes only).
        """
        arrays = {key: np.asarray(backend.as_numpy(value)) for key, value in state.items()}
        for key, array in arrays.items():
            if array.dtype.hasobject:
                raise ValueError(
                    f"optimizer state {key!r} holds Python objects ({type(state[key]).__name__}); "
                    "the state store keeps numeric, boolean and text values only"
                )
        header = json.dumps(
            [[key, array.dtype.str, list(array.shape)] for key, array in arrays.items()]
        ).encode()

        def write(handle) -> None:
            handle.write(_HEADER_LENGTH.pack(len(header)))
            handle.write(header)
            for array in arrays.values():
                handle.write(memoryview(np.ascontiguousarray(array)).cast("B"))

        # A scratch file (a lost host's state is recomputed, not recovered): no disk flush.
        atomic_write(self.path(iteration), write, durable=False)
        for old in glob.glob(os.path.join(self.directory, f"optim-{self.shard}-after-*.state")):
            done = int(old.rsplit("-", 1)[1].split(".")[0])
            if done < min(iteration - 1, iteration if retain_from is None else retain_from):
                _remove_quietly(old)

    def load(self, iteration: int) -> dict | None:
        """The state after ``iteration``, or None if no file holds it."""
        try:
            handle = open(self.path(iteration), "rb")
        except FileNotFoundError:
            return None
        with handle:
            (length,) = _HEADER_LENGTH.unpack(handle.read(_HEADER_LENGTH.size))
            state = {}
            for key, dtype, shape in json.loads(handle.read(length)):
                array = np.empty(shape, dtype=dtype)
                view = memoryview(array.reshape(-1)).cast("B")
                if handle.readinto(view) != len(view):
                    raise RuntimeError(f"{self.path(iteration)} is cut short at {key!r}")
                state[key] = _scalar_or_array(array)
            return state


_HEADER_LENGTH = struct.Struct("<I")


def _scalar_or_array(value: np.ndarray):
    return value.item() if value.ndim == 0 else value


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


# --- writes in the background, finished before the task ends --------------------------------

_pending_writes: list[Future] = []
_writer: ThreadPoolExecutor | None = None


def save_in_background(store: ShardStateStore, iteration, state, retain_from) -> None:
    """``store.save(iteration, state, retain_from)`` on this worker's writer thread; the task
    must be wrapped in :func:`finishing_state_writes`."""
    write_in_background(store.save, iteration, state, retain_from)


def write_in_background(write: Callable, *arguments: Any) -> None:
    """``write(*arguments)`` on this worker's writer thread, in the order submitted; the task
    must be wrapped in :func:`finishing_state_writes`."""
    global _writer
    if _writer is None:  # made in the Python worker, after its fork from the daemon
        _writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bigdl-state-writer")
    _pending_writes.append(_writer.submit(write, *arguments))


def wait_for_state_writes() -> None:
    """Block until the state files this worker started writing are on disk (re-raising a
    failed write's error)."""
    while _pending_writes:
        _pending_writes.pop(0).result()


def finishing_state_writes(task: Callable) -> Callable:
    """``task`` (a ``mapPartitionsWithIndex`` function) that ends only once the state files
    it wrote in the background are on disk.

    The write overlaps what the task does after its update (sending the new weights, the
    next forward-backward), yet a task that Spark counts as finished has left its state
    file behind, so a retry or a recomputation after a lost executor finds it as before.
    """

    def run(partition, rows):
        try:
            yield from task(partition, rows)
        finally:
            wait_for_state_writes()

    return run


def state_key(spec: RunSpec, shard: int) -> tuple:
    """The worker-cache key of partition ``shard``'s optimizer state in this run's mode."""
    return (spec.mode.state_name, shard)


def _state_store(spec: RunSpec, shard: int) -> ShardStateStore:
    name = f"{spec.mode.state_name}-{shard}"
    return ShardStateStore(run_directory(spec.state_dir, spec.run_id), name)


def owned_shard(
    spec: RunSpec,
    shard: int,
    iteration: int,
    initial_states: dict | None,
    carried_state: dict | None = None,
):
    """Shard ``shard``'s OptimMethod with its state after iteration ``iteration - 1``.

    ``carried_state`` is that state where it came with the stage's input (executors
    without a shared disk: :class:`~bigdl_py.spark.records.Own`); it is taken as it is, so
    that the stage stays a pure function of its input on any host. Otherwise the state is
    looked up in this worker's cache first, then in the host's state file, then (for the
    first iteration of a run, of a resume, or of a job where the state travels through the
    driver) in ``initial_states`` (as the run's mode reads a checkpoint's shards:
    ``spec.mode.initial_state``) or fresh.
    """
    key = state_key(spec, shard)
    if carried_state is not None:
        method = copy.deepcopy(spec.optim_method)
        method.load_state_dict(carried_state)
        worker.store(spec.run_id, key, method, version=("updating", iteration))
        return method
    method = worker.lookup(spec.run_id, key, version=iteration - 1)
    if method is not None:
        # The caller is about to change it: until keep_shard records the new state, nobody
        # may take this object for the state after ``iteration - 1`` (a retry would).
        worker.store(spec.run_id, key, method, version=("updating", iteration))
        return method
    store = _state_store(spec, shard)
    method = copy.deepcopy(spec.optim_method)
    stored = store.load(iteration - 1)
    if stored is not None:
        method.load_state_dict(stored)
    elif initial_states is not None and initial_states.get("iteration") == iteration:
        shards = initial_states["shards"]
        method.load_state_dict(spec.mode.initial_state(shards, shard, spec.flat_size))
    elif iteration != (initial_states or {}).get("iteration", 0):
        raise RuntimeError(
            f"optimizer state of shard {shard} after iteration {iteration - 1} is not on host "
            f"{os.uname().nodename} (looked in {store.directory}); the task that owns it ran "
            "on another host. Set BIGDL_PY_STATE_DIR to a directory shared by the executors, "
            "or resume from the last checkpoint"
        )
    worker.store(spec.run_id, key, method, version=("updating", iteration))
    return method


def keep_shard(
    spec: RunSpec,
    shard: int,
    method: Any,
    iteration: int,
    retain_from: int | None = None,
    background: bool = False,
) -> None:
    """Record that ``method`` now holds the state after ``iteration``: in this worker's cache
    and, where the executors share a disk, in the host's state file (for other workers and
    retries; without a shared disk the state travels with the stages' records instead:
    :func:`own_state`).

    The files of earlier iterations are deleted, except those from ``retain_from`` on: a job
    that chains several iterations keeps every state since its start, because Spark may
    recompute any of its stages after losing an executor. With ``background`` the file is
    written by a thread; the task must be wrapped in :func:`finishing_state_writes`, and
    must not change ``method`` again before it ends.
    """
    worker.store(spec.run_id, state_key(spec, shard), method, version=iteration)
    if spec.carry_state:
        return
    store = _state_store(spec, shard)
    if background:
        save_in_background(store, iteration, method.state_dict(), retain_from)
    else:
        store.save(iteration, method.state_dict(), retain_from)


def own_state(spec: RunSpec, shard: int, iteration: int) -> dict | None:
    """Partition ``shard``'s optimizer state after ``iteration`` as the mode keeps it (recorded
    by :func:`keep_shard` in this task), for its next stage where the state travels with the
    records (``spec.carry_state``); None where it does not, or where this partition keeps
    no state (a mode whose owners are some partitions only)."""
    if not spec.carry_state:
        return None
    method = worker.lookup(spec.run_id, state_key(spec, shard), version=iteration)
    return method.state_dict() if method is not None else None


def travelling_state(spec: RunSpec, shard: int, iteration: int, bounds: list) -> dict | None:
    """Partition ``shard``'s optimizer state after ``iteration`` as a checkpoint holds it, for
    the driver to ship to the next job (``spec.carry_state``); None where hosts share a disk."""
    if not spec.carry_state:
        return None
    state = own_state(spec, shard, iteration)
    if state is None:  # recorded by keep_shard in this task just before
        raise RuntimeError(f"the optimizer state of partition {shard} after {iteration} is lost")
    return spec.mode.checkpoint_state(state, shard, bounds)


# --- the owner step: every mode's update goes through owner_step ----------------------------


def clip_summed_slice(spec: RunSpec, summed: np.ndarray) -> np.ndarray:
    """Constant clipping, in place, as the local loop applies it (before the L2 norm)."""
    if spec.constant_clipping is not None:
        spec.constant_clipping.clip_(summed)
    return summed


def global_norm_scale(spec: RunSpec, summed: np.ndarray) -> float:
    """The L2-norm clipping factor of a whole summed gradient (1.0 without that clipping)."""
    if spec.l2_clipping is None:
        return 1.0
    return spec.l2_clipping.scale_for(float(spec.l2_clipping.sum_of_squares(summed)))


def owner_step(
    spec: RunSpec,
    method: Any,
    weights: np.ndarray,
    summed: np.ndarray,
    loss_sum: float,
    schedule: dict,
    *,
    start: int = 0,
    l2_scale: float | None = None,
    halted: bool = False,
) -> np.ndarray:
    """One owner's step of one iteration, the same in every mode: its new weights.

    ``weights`` is the owner's slice (starting at flat offset ``start``; the whole vector, at
    0, where the mode keeps whole states) and ``summed`` its summed gradient, which is
    clipped in place. In order, as the local loop does it:

    1. a ``halted`` chain (stopped by an earlier non-finite loss) changes nothing: not the
       gradient, the weights, the state nor the schedule;
    2. constant clipping of ``summed``;
    3. the global-norm scale: ``l2_scale`` where the driver computed it from every owner's
       squares (an owner of a slice), else from ``summed`` itself (an owner of the whole
       vector; 1.0 without ``L2NormClipping``);
    4. a finite loss and scale: ``method`` steps the weights (its state changes); otherwise
       the weights and state stay and only the schedule advances (the driver decides what
       to do about the loss).

    ``schedule`` holds the driver's ``iteration``, ``epoch`` and, after a validated epoch,
    ``metric``, so the learning rate is the one the local loop would use.

    Raises
    ------
    ValueError
        If an owner of a slice is given no ``l2_scale`` under global-norm clipping (the norm
        of a slice is not the gradient's).
    """
    if halted:
        return np.array(weights)
    clip_summed_slice(spec, summed)
    if l2_scale is None:
        if spec.l2_clipping is not None and summed.size != spec.flat_size:
            raise ValueError(
                f"the owner of {summed.size} of {spec.flat_size} weights needs the driver's "
                "global-norm scale: the norm of a slice is not the gradient's"
            )
        l2_scale = global_norm_scale(spec, summed)
    if np.isfinite(loss_sum) and np.isfinite(l2_scale):
        return update_owned_slice(method, weights, summed, start, schedule, l2_scale)
    follow_schedule_only(method, schedule)
    return np.array(weights)


def stops_chain(loss_sum: float, stop_after_nonfinite: bool) -> bool:
    """Whether an iteration whose summed loss is ``loss_sum`` halts the rest of its chain.

    Only a non-finite loss does, and only with ``stop_after_nonfinite``: the driver judges
    an iteration by its loss, so a chain that stopped on anything else (an update skipped
    for a non-finite global norm) would end its job early without telling it why.
    """
    return stop_after_nonfinite and not np.isfinite(loss_sum)


def update_owned_slice(
    method: Any,
    weight_slice: np.ndarray,
    gradient_slice: np.ndarray,
    start: int,
    schedule: dict,
    l2_scale: float = 1.0,
) -> np.ndarray:
    """Scale (global-norm clipping) and step a slice; returns the updated slice (a new array
    of the weights' dtype: float32 or float64 models alike)."""
    follow_schedule_only(method, schedule)
    weight = np.array(weight_slice, copy=True)
    gradient_slice = np.asarray(gradient_slice, dtype=weight.dtype)
    if l2_scale != 1.0:
        gradient_slice = gradient_slice * weight.dtype.type(l2_scale)
    method.step_slice(weight, gradient_slice, start)
    return weight


def follow_schedule_only(method: Any, schedule: dict) -> None:
    """A skipped (non-finite) iteration: the schedule advances, weights and state do not."""
    method.schedule_step(
        iteration=schedule["iteration"], epoch=schedule["epoch"], metric=schedule.get("metric")
    )


def update_owned(
    spec: RunSpec,
    owner: int,
    iteration: int,
    initial_states: dict | None,
    weights: np.ndarray,
    summed: np.ndarray,
    loss_sum: float,
    schedule: dict,
    *,
    start: int = 0,
    l2_scale: float | None = None,
    halted: bool = False,
    retain_from: int | None = None,
    background: bool = False,
    carried_state: dict | None = None,
) -> np.ndarray:
    """Owner ``owner``'s :func:`owner_step` of iteration ``iteration`` with the state it keeps
    between iterations: BigDL's "update the owned slice".

    The state comes from :func:`owned_shard` (``carried_state`` where it came with the
    stage's input) and is recorded under ``iteration`` in every case, halted or not, for the
    next step to find (its file written by a thread with ``background``: see
    :func:`keep_shard`).
    """
    method = owned_shard(spec, owner, iteration, initial_states, carried_state)
    new_weights = owner_step(
        spec,
        method,
        weights,
        summed,
        loss_sum,
        schedule,
        start=start,
        l2_scale=l2_scale,
        halted=halted,
    )
    keep_shard(spec, owner, method, iteration, retain_from, background)
    return new_weights
