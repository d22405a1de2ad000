"""A partition's model replica and its forward-backward: BigDL's *putGradients* side.

Nothing here imports Spark: each function takes arrays and small objects and returns the
same, so every step runs, and is tested, in one process. What every task of a run needs and
does not change between iterations travels once per run, by broadcast, as a :class:`RunSpec`.

Partition ``j``'s replica (model + memory-mapped data) lives in its Python worker's cache
(``bigdl_py.spark.worker``) between tasks; a miss rebuilds it from the run spec and the
host-local data files, so it is only slower, never wrong. A stage that brings its rows with
it (:class:`~bigdl_py.spark.records.ShareRows`: executors without a shared disk) trains on
those, and its replica never opens the files, which may be on another host.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bigdl_py import backend, device_waits
from bigdl_py.autograd.ops import misc as op_randomness
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.optim.flat_parameters import FlatParameters, flat_layout
from bigdl_py.spark import replica_graph, worker
from bigdl_py.spark.partitioned_data import load_partition_data
from bigdl_py.spark.records import Report, ShareRows


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
    state_dir: str | None  # None: each host's own default (partitioned_data.run_directory)
    seed: int = 0
    wire_dtype: str | None = None
    constant_clipping: Any = None  # a ConstantClipping
    l2_clipping: Any = None  # an L2NormClipping
    gradient_accumulation: int = 1
    device: str = "cpu"  # "cpu", "gpu" or "auto" (bigdl_py.spark.gpu.task_device)
    # The training mode (bigdl_py.spark.modes): how the summed gradient becomes new weights,
    # and how the optimizer state is laid out over the partitions.
    mode: Any = None
    # Where the executors share no disk, a host-local state file cannot be found by a task
    # on another host: the optimizer state then travels with the jobs, through the driver.
    carry_state: bool = False
    # Replicas a stage task trains its partition's share on (a whole-executor task: one per
    # core of the executor, all but one in forked helper processes); 1: the task's own.
    replicas_per_task: int = 1
    extras: dict = field(default_factory=dict)
    # Custom training steps (bigdl_py.spark.distri_trainer): the dotted name of the submodule
    # whose parameters this run trains (None: the whole model; the others are frozen and
    # shipped every iteration), the step function and its random stream.
    trainable: str | None = None
    training_step: Any = None  # training_step(model, StepBatch) -> mean loss Tensor
    stream: int = 0


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
        self.handle = handle
        self._host_data: tuple | None = None
        self.features: Any = None
        self.labels: Any = None
        self.partition = handle["partition"]
        self.seed = spec.seed
        self.buffer_names = [name for name, _ in self.model.named_buffers()]

    def use_host_data(self) -> None:
        """Train on the partition's files on this host (memory-mapped once, then kept)."""
        if self._host_data is None:
            self._host_data = load_partition_data(self.handle)
        self.features, self.labels = self._host_data

    def use_rows(self, features: tuple, labels: np.ndarray) -> None:
        """Train on these rows (a share that came with the stage's input)."""
        self.features, self.labels = features, labels

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

    def load_buffers(self, buffers: dict[str, np.ndarray]) -> None:
        """Copy running statistics (by dotted name) into the replica's buffers, in place."""
        self.model.load_state_dict(buffers, strict=False)

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

    On a device no piece waits for it: checks of device data are read after the last
    backward is queued, and so is the summed loss, once (every piece back-propagates; a
    non-finite sum makes the driver skip the update all the same). Each piece's
    forward-backward is captured in a CUDA graph there and replayed (``replica_graph``: the
    labels go to the device with the features, checked there), unless graphs are off or a
    custom training step runs, when the package's losses take host labels.
    """
    if replica.features is None:  # nothing chosen yet: the partition's files on this host
        replica.use_host_data()
    replica.flat.load(weights)  # moved to the replica's device by FlatParameters
    replica.load_frozen(frozen_weights)
    replica.flat.zero_grad()
    replica.reseed(iteration)
    count = len(local_indices)
    loss_sum = 0.0
    on_device = backend.is_device_array(replica.flat.weights)
    device_loss_sum = None
    host_labels = replica.training_step is None and getattr(
        replica.criterion, "checks_host_targets", False
    )
    pieces = np.array_split(np.asarray(local_indices), max(1, micro_batches))
    for piece_number, piece in enumerate(pieces):
        if len(piece) == 0:
            continue
        labels = np.asarray(replica.labels[piece])
        if on_device and replica_graph.captures(replica):  # in a CUDA graph, replayed
            with _rejected_data(replica, iteration, labels):
                piece_sum = replica_graph.piece_loss_sum(
                    replica, piece, labels, len(piece) / batch_size
                )
            device_loss_sum = piece_sum if device_loss_sum is None else device_loss_sum + piece_sum
            continue
        inputs = [
            Tensor(backend.to_device(np.asarray(array[piece]), replica.device), _copy=False)
            for array in replica.features
        ]
        if not host_labels:
            labels = backend.to_device(labels, replica.device)
        with _rejected_data(replica, iteration, labels), _no_waits_on(on_device):
            if replica.training_step is not None:
                batch = replica.step_batch(inputs, labels, iteration, piece_number)
                loss = replica.training_step(replica.model, batch)
            else:
                loss = replica.criterion(replica.model(*inputs), labels)
        if on_device:
            with _no_waits_on(on_device):
                piece_sum = loss.data * len(piece)
                device_loss_sum = (
                    piece_sum if device_loss_sum is None else device_loss_sum + piece_sum
                )
                (loss * (len(piece) / batch_size)).backward()
            continue
        piece_loss = float(loss.item())
        loss_sum += piece_loss * len(piece)
        if not np.isfinite(piece_loss):
            break  # the update is skipped; no use back-propagating the rest
        (loss * (len(piece) / batch_size)).backward()
    if device_loss_sum is not None:
        with _rejected_data(replica, iteration, labels):
            device_waits.raise_deferred_checks()
        loss_sum = float(device_loss_sum)
    return replica.flat.gradients, loss_sum, count


def _no_waits_on(on_device: bool):
    """No device waits inside, on a device (``device_waits``); nothing on the host."""
    return device_waits.no_device_waits() if on_device else contextlib.nullcontext()


@contextlib.contextmanager
def _rejected_data(replica: Replica, iteration: int, labels: Any):
    """Errors of the model or criterion about the data, with the partition named."""
    try:
        yield
    except (ValueError, TypeError, IndexError) as error:
        shapes = [tuple(array.shape[1:]) for array in replica.features]
        raise ValueError(
            f"partition {replica.partition}, iteration {iteration}: the model or criterion "
            f"rejected the partition's data (sample shapes {shapes}, labels of dtype "
            f"{labels.dtype}): {error}"
        ) from error


class ShareOf(enum.Enum):
    """Whose mean loss a partition's gradient is the gradient of (:func:`replica_gradient`)."""

    #: The exact modes: ``(share / global batch) x`` the share's mean loss, so the partitions'
    #: gradients sum to the global batch's; partition 0 reports its running statistics after
    #: the forward (the run's, which travel with the chain).
    GLOBAL_BATCH = "global batch"
    #: Local SGD: the share's own mean loss (each replica steps on its own mini-batch and
    #: keeps its own running statistics until they are averaged).
    OWN_BATCH = "own batch"


def replica_gradient(
    spec,
    *,
    partition: int,
    handle: dict,
    weights: np.ndarray,
    share: np.ndarray,
    iteration: int,
    entered: float,
    share_of: ShareOf = ShareOf.GLOBAL_BATCH,
    halted: bool = False,
    frozen_weights: np.ndarray | None = None,
    start_buffers: dict | None = None,
    rows: ShareRows | None = None,
    train=forward_backward,
) -> tuple[np.ndarray, Report]:
    """Forward-backward of ``partition`` (its data: ``handle``) on its ``share`` of iteration
    ``iteration``: its gradient and report (whose clock starts at ``entered``, when the task
    entered Python). With ``rows`` (the share's rows, carried to this stage) the files are
    not read: the rows are the share, in its order. ``train`` is the forward-backward
    (:func:`forward_backward`'s signature; a whole-executor task's trains on several
    replicas).

    ``share_of`` says whose mean loss the gradient is of (:class:`ShareOf`). A ``halted``
    chain (stopped by an earlier non-finite loss) gets zeros and runs nothing.
    ``start_buffers``, when given, are loaded first: the exact modes hand partition 0's
    statistics from each iteration to the next, so a replica rebuilt in another Python
    worker or on another host continues them.
    """
    started = time.perf_counter()
    replica = worker.fetch(spec.run_id, ("replica", partition), lambda: Replica(spec, handle))
    if rows is not None:
        replica.use_rows(*rows.of(iteration))
        share = np.arange(len(replica.labels))
    else:
        replica.use_host_data()
    if start_buffers:
        replica.load_buffers(start_buffers)
    if halted:
        gradient, loss_sum, samples = np.zeros(weights.size, weights.dtype), 0.0, 0
    else:
        batch_size = spec.batch_size if share_of is ShareOf.GLOBAL_BATCH else max(len(share), 1)
        gradient, loss_sum, samples = train(
            replica,
            weights,
            share,
            batch_size,
            iteration,
            spec.gradient_accumulation,
            frozen_weights,
        )
    buffers = None
    if share_of is ShareOf.GLOBAL_BATCH and partition == 0 and replica.buffer_names:
        buffers = replica.buffers()
    seconds = time.perf_counter() - started
    return gradient, Report(loss_sum, samples, seconds, buffers, (entered, time.time()))
