"""The per-partition work of one DistriOptimizer iteration, as plain functions.

Nothing here imports Spark: each function takes arrays and small objects and returns the
same, so every step runs, and is tested, in one process (or on a GPU machine without Spark).
``distri_optimizer_run.py`` wires them into Spark jobs:

1. ``forward_backward``  partition j: its share of the global batch through its replica,
   gradient of (share size / global batch size) x mean share loss; the run cuts it into N
   slices and sums slice k on owner k with ``bigdl_py.spark.collectives``' reduce-scatter
   building blocks (``pieces_for_owners``, ``combine_owned_pieces``).
2. ``update_owned_slice``  owner k: clipping and its OptimMethod on slice k of the weights,
   with optimizer state it keeps between iterations (``owned_shard``, ``ShardStateStore``).

What a Python worker keeps between tasks (``bigdl_py.spark.worker``'s cache): per run, the
replica of each partition it served (model + memory-mapped data) and the OptimMethod of each
shard it owned. Spark may run partition j on another worker next time; a miss rebuilds from
the source of truth (the broadcast run spec, the host-local data files, the host-local state
file), so it is only slower, never wrong.
"""

from __future__ import annotations

import copy
import glob
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.ops import misc as op_randomness
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.optim.flat_parameters import FlatParameters, flat_layout
from bigdl_py.optim.sharding import concatenate_state_dicts
from bigdl_py.spark import worker


# --- what every task of a run needs (shipped once per run, by broadcast) -------------------
@dataclass
class RunSpec:
    """Everything a task needs that does not change between iterations.

    ``batch_size`` is the global batch of one update (``gradient_accumulation`` micro-batches
    of ``batch_size / gradient_accumulation`` samples each, run one after the other).
    """

    run_id: str
    model: Any  # a bigdl_py.nn.Module; its weights are irrelevant (each iteration ships them)
    criterion: Any
    optim_method: Any  # a fresh OptimMethod; owners deep-copy it for their shard
    num_partitions: int
    flat_size: int
    batch_size: int
    state_dir: str
    seed: int = 0
    wire_dtype: str | None = None
    constant_clipping: Any = None  # a ConstantClipping
    l2_clipping: Any = None  # an L2NormClipping
    gradient_accumulation: int = 1
    device: str = "cpu"  # "cpu", "gpu" or "auto" (bigdl_py.spark.gpu.task_device)
    # "sharded" (BigDL: partition j steps slice j with the state it alone keeps) or
    # "replicated" (DDP: every partition steps the whole vector with its own full state).
    update: str = "sharded"
    extras: dict = field(default_factory=dict)
    # Custom training steps (bigdl_py.spark.distri_trainer): the dotted name of the submodule
    # whose parameters this run trains (None: the whole model; the others are frozen and
    # shipped every iteration), the step function and its random stream.
    trainable: str | None = None
    training_step: Any = None  # training_step(model, StepBatch) -> mean loss Tensor
    stream: int = 0


def run_directory(state_dir: str, run_id: str) -> str:
    """This run's directory on the host (data files, optimizer state files)."""
    path = os.path.join(state_dir, f"bigdl_py-run-{run_id}")
    os.makedirs(path, exist_ok=True)
    return path


def default_state_dir() -> str:
    # Not ".../bigdl_py": a directory of the package's own name in the temp directory would
    # shadow the package (as a namespace package) for anyone whose working directory it is.
    default = os.path.join(tempfile.gettempdir(), "bigdl_py-state")
    return os.environ.get("BIGDL_PY_STATE_DIR") or default


def save_npy_atomically(path: str, array: np.ndarray) -> None:
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as handle:
        np.save(handle, array, allow_pickle=False)
    os.replace(temporary, path)


# --- a partition's training data on its host --------------------------------------------------
def write_partition_data(
    directory: str, partition: int, features: tuple, labels: np.ndarray
) -> dict:
    """Save one partition's arrays as .npy files (memory-mapped on read); returns a handle.

    The cached RDD then holds only this small handle: reading it each iteration unpickles a
    few hundred bytes instead of the partition's data.
    """
    paths = []
    for position, array in enumerate(features):
        path = os.path.join(directory, f"data-{partition}-x{position}.npy")
        save_npy_atomically(path, np.ascontiguousarray(array))
        paths.append(path)
    label_path = os.path.join(directory, f"data-{partition}-y.npy")
    save_npy_atomically(label_path, np.ascontiguousarray(labels))
    return {
        "partition": partition,
        "size": int(len(labels)),
        "feature_paths": paths,
        "label_path": label_path,
        "host": os.uname().nodename,
    }


def load_partition_data(handle: dict) -> tuple[tuple, np.ndarray]:
    """Memory-map a partition's arrays; a clear error if this host does not have them."""
    try:
        features = tuple(
            np.load(path, mmap_mode="r", allow_pickle=False) for path in handle["feature_paths"]
        )
        labels = np.load(handle["label_path"], mmap_mode="r", allow_pickle=False)
    except FileNotFoundError as error:
        raise RuntimeError(
            f"training data of partition {handle['partition']} was written on host "
            f"{handle['host']} but is not on {os.uname().nodename} ({error.filename}); the "
            "task ran away from its cached data. Set BIGDL_PY_STATE_DIR to a directory shared "
            "by the executors, or keep spark.locality.wait above 0"
        ) from None
    return features, labels


# --- 1. forward-backward on one partition ---------------------------------------------------
class Replica:
    """A partition's model replica over one flat parameter vector, and its training data."""

    def __init__(self, spec: RunSpec, handle: dict):
        self.model = copy.deepcopy(spec.model)
        self.device = backend.device("cpu")
        if spec.device != "cpu":
            from bigdl_py.spark.gpu import bind_task_device  # reads the task's GPU address

            self.device = bind_task_device(spec.device)
            self.model.to(self.device)
        self.model.train()
        self.trained_module = trained_submodule(self.model, spec.trainable)
        self.flat = FlatParameters(self.trained_module)
        trained = {id(parameter) for parameter in self.trained_module.parameters()}
        # Frozen parameters take their values from the driver every iteration and get no
        # gradient: backward stops at them instead of filling buffers nobody reads.
        self.frozen = [p for p in self.model.parameters() if id(p) not in trained]
        for parameter in self.frozen:
            parameter.requires_grad_(False)
        self.frozen_layout = flat_layout((str(i), p) for i, p in enumerate(self.frozen))
        self.training_step = spec.training_step
        self.stream = spec.stream
        if self.flat.size != spec.flat_size:
            raise RuntimeError(
                f"replica has {self.flat.size} parameters but the run expects {spec.flat_size}"
            )
        self.criterion = spec.criterion
        self.features, self.labels = load_partition_data(handle)
        self.partition = handle["partition"]
        self.seed = spec.seed
        self.buffer_names = [name for name, _ in self.model.named_buffers()]

    def reseed(self, iteration: int) -> None:
        """Random layers (dropout) draw from streams fixed by (seed, partition, iteration):
        replicas draw different masks, and a retried task or a resumed run the same ones."""
        op_randomness.manual_seed(
            np.random.SeedSequence([self.seed, self.partition, iteration]).generate_state(1)[0]
        )
        for index, module in enumerate(self.model.modules()):
            for attribute, value in list(vars(module).items()):
                if isinstance(value, np.random.Generator):
                    stream = [self.seed, self.partition, iteration, index]
                    setattr(module, attribute, np.random.default_rng(stream))

    def load_frozen(self, frozen_weights: np.ndarray | None) -> None:
        """Copy the frozen parameters' values (in ``named_parameters`` order) into place."""
        if not self.frozen:
            return
        expected = self.frozen_layout[-1].stop
        if frozen_weights is None or len(frozen_weights) != expected:
            got = "none" if frozen_weights is None else len(frozen_weights)
            raise RuntimeError(f"{got} frozen weights came for {expected} frozen parameters")
        for parameter, entry in zip(self.frozen, self.frozen_layout, strict=True):
            values = np.asarray(frozen_weights[entry.offset : entry.stop]).reshape(entry.shape)
            parameter.data[...] = backend.to_device(values, self.device)

    def step_batch(self, inputs: list, labels, iteration: int, piece: int) -> StepBatch:
        """What a custom training step sees: the piece's data and a random stream fixed by
        (seed, partition, iteration, step stream, piece), so retries repeat it exactly."""
        rng = np.random.default_rng([self.seed, self.partition, iteration, self.stream, piece])
        return StepBatch(inputs, labels, rng, self.device, self.partition, iteration)

    def buffers(self) -> dict[str, np.ndarray]:
        """Running statistics (BatchNorm) by dotted name, as host arrays."""
        state = self.model.state_dict()
        return {name: np.asarray(backend.as_numpy(state[name])) for name in self.buffer_names}


def trained_submodule(model: Any, trainable: str | None) -> Any:
    """``model`` itself, or its submodule named ``trainable`` (dotted, as in
    ``named_modules``); a clear error naming the choices otherwise."""
    if trainable is None:
        return model
    modules = dict(model.named_modules())
    if trainable not in modules or trainable == "":
        names = sorted(name for name in modules if name)
        raise ValueError(f"the model has no submodule {trainable!r}; its submodules: {names}")
    return modules[trainable]


@dataclass
class StepBatch:
    """One piece of a partition's share, as a custom training step receives it.

    ``inputs`` are Tensors on the replica's device, ``labels`` an array there; ``rng`` is a
    NumPy Generator for the step's own randomness (a GAN's noise); ``normal`` draws from it
    straight to a Tensor on the device.
    """

    inputs: list
    labels: Any
    rng: np.random.Generator
    device: Any
    partition: int
    iteration: int

    def __len__(self) -> int:
        return int(len(self.labels))

    def normal(self, *shape: int) -> Tensor:
        values = self.rng.standard_normal(shape).astype(np.float32)
        return Tensor(backend.to_device(values, self.device), _copy=False)


def forward_backward(
    replica: Replica,
    weights: np.ndarray,
    local_indices: np.ndarray,
    batch_size: int,
    iteration: int,
    micro_batches: int = 1,
    frozen_weights: np.ndarray | None = None,
) -> tuple[np.ndarray, float, int]:
    """Load ``weights``, run the share ``local_indices`` forward and backward.

    Returns the flat gradient of ``(share / batch_size) * mean share loss`` — so summing the
    replicas' gradients gives the gradient of the global batch's mean loss, each share
    weighted by its real sample count — the share's summed loss, and the share size. With
    ``micro_batches`` > 1 the share runs in that many pieces whose gradients accumulate:
    the same gradient, with the activations of one piece in memory at a time.
    """
    replica.flat.load(weights)  # moved to the replica's device by FlatParameters
    replica.load_frozen(frozen_weights)
    replica.flat.zero_grad()
    replica.reseed(iteration)
    count = len(local_indices)
    loss_sum = 0.0
    pieces = np.array_split(np.asarray(local_indices), max(1, micro_batches))
    for piece_number, piece in enumerate(pieces):
        if len(piece) == 0:
            continue
        inputs = [
            Tensor(backend.to_device(np.asarray(array[piece]), replica.device), _copy=False)
            for array in replica.features
        ]
        labels = backend.to_device(np.asarray(replica.labels[piece]), replica.device)
        try:
            if replica.training_step is not None:
                batch = replica.step_batch(inputs, labels, iteration, piece_number)
                loss = replica.training_step(replica.model, batch)
            else:
                loss = replica.criterion(replica.model(*inputs), labels)
        except (ValueError, TypeError, IndexError) as error:
            shapes = [tuple(array.shape[1:]) for array in replica.features]
            raise ValueError(
                f"partition {replica.partition}, iteration {iteration}: the model or criterion "
                f"rejected the partition's data (sample shapes {shapes}, labels of dtype "
                f"{labels.dtype}): {error}"
            ) from error
        piece_loss = float(loss.item())
        loss_sum += piece_loss * len(piece)
        if not np.isfinite(piece_loss):
            break  # the update is skipped; no use back-propagating the rest
        (loss * (len(piece) / batch_size)).backward()
    return replica.flat.gradients, loss_sum, count


# --- 3. update on the owner -------------------------------------------------------------------
class ShardStateStore:
    """Optimizer state of one shard, one file per completed iteration, on the host's disk.

    Iteration ``t`` reads the state after ``t - 1`` and writes the state after ``t`` to a
    new file (atomically), deleting those before ``t - 1``. A retried task of iteration
    ``t`` therefore finds ``t - 1`` intact, and any Python worker on the host can pick up a
    shard another worker updated last.
    """

    def __init__(self, directory: str, shard: int | str):
        self.directory = directory
        self.shard = shard

    def path(self, iteration: int) -> str:
        return os.path.join(self.directory, f"optim-{self.shard}-after-{iteration}.npz")

    def save(self, iteration: int, state: dict, retain_from: int | None = None) -> None:
        arrays = {key: np.asarray(backend.as_numpy(value)) for key, value in state.items()}
        temporary = self.path(iteration) + f".tmp-{os.getpid()}.npz"
        with open(temporary, "wb") as handle:
            np.savez(handle, **arrays)
        os.replace(temporary, self.path(iteration))
        for old in glob.glob(os.path.join(self.directory, f"optim-{self.shard}-after-*.npz")):
            done = int(old.rsplit("-", 1)[1].split(".")[0])
            if done < min(iteration - 1, iteration if retain_from is None else retain_from):
                _remove_quietly(old)

    def load(self, iteration: int) -> dict | None:
        try:
            with np.load(self.path(iteration), allow_pickle=False) as stored:
                return {key: _scalar_or_array(stored[key]) for key in stored.files}
        except FileNotFoundError:
            return None


def _scalar_or_array(value: np.ndarray):
    return value.item() if value.ndim == 0 else value


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def state_key(shard: int, whole: bool) -> tuple:
    return ("replicated" if whole else "shard", shard)


def _state_store(spec: RunSpec, shard: int, whole: bool) -> ShardStateStore:
    name = f"replicated-{shard}" if whole else shard
    return ShardStateStore(run_directory(spec.state_dir, spec.run_id), name)


def owned_shard(
    spec: RunSpec, shard: int, iteration: int, initial_states: dict | None, whole: bool = False
):
    """Shard ``shard``'s OptimMethod with its state after iteration ``iteration - 1``.

    Looked up in this worker's cache first, then in the host's state file, then (for the
    first iteration of a run or of a resume) in ``initial_states`` or fresh. With ``whole``
    (the replicated update), partition ``shard`` keeps the state of the whole vector, and
    a resume joins every shard of ``initial_states`` into it.
    """
    key = state_key(shard, whole)
    method = worker.lookup(spec.run_id, key, version=iteration - 1)
    if method is not None:
        # The caller is about to change it: until keep_shard records the new state, nobody
        # may take this object for the state after ``iteration - 1`` (a retry would).
        worker.store(spec.run_id, key, method, version=("updating", iteration))
        return method
    store = _state_store(spec, shard, whole)
    method = copy.deepcopy(spec.optim_method)
    stored = store.load(iteration - 1)
    if stored is not None:
        method.load_state_dict(stored)
    elif initial_states is not None and initial_states.get("iteration") == iteration:
        shards = initial_states["shards"]
        method.load_state_dict(concatenate_state_dicts(shards) if whole else shards[shard])
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
    whole: bool = False,
) -> None:
    """Record that ``method`` now holds the state after ``iteration``: in this worker's cache
    and in the host's state file (for other workers and retries).

    The files of earlier iterations are deleted, except those from ``retain_from`` on: a job
    that chains several iterations keeps every state since its start, because Spark may
    recompute any of its stages after losing an executor.
    """
    worker.store(spec.run_id, state_key(shard, whole), method, version=iteration)
    _state_store(spec, shard, whole).save(iteration, method.state_dict(), retain_from)


def clip_summed_slice(spec: RunSpec, summed: np.ndarray) -> np.ndarray:
    """Constant clipping, in place, as the local loop applies it (before the L2 norm)."""
    if spec.constant_clipping is not None:
        spec.constant_clipping.clip_(summed)
    return summed


def update_owned_slice(
    method: Any,
    weight_slice: np.ndarray,
    gradient_slice: np.ndarray,
    start: int,
    schedule: dict,
    l2_scale: float = 1.0,
) -> np.ndarray:
    """Scale (global-norm clipping) and step slice k; returns the updated slice (a new array).

    ``schedule`` holds the driver's ``iteration`` and ``epoch`` and, after an epoch with a
    validation score, its ``metric``: the shard's schedule takes the same steps as the
    driver's, so its learning rate is the one the local loop would use.
    """
    method.schedule_step(
        iteration=schedule["iteration"], epoch=schedule["epoch"], metric=schedule.get("metric")
    )
    weight = np.array(weight_slice, dtype=np.float32, copy=True)
    if l2_scale != 1.0:
        gradient_slice = gradient_slice * np.float32(l2_scale)
    method.step_slice(weight, gradient_slice, start)
    return weight


def follow_schedule_only(method: Any, schedule: dict) -> None:
    """A skipped (non-finite) iteration: the schedule advances, weights and state do not."""
    method.schedule_step(
        iteration=schedule["iteration"], epoch=schedule["epoch"], metric=schedule.get("metric")
    )
