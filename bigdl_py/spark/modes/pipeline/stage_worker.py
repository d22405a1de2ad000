"""One partition's pipeline stage in one tick's task, and the files that carry it to the next.

Spark runs partition ``p``'s successive ticks in whichever executor and Python worker is
free (bench: two workers an executor, alternating, and partitions moving between executors
from one tick to the next), so nothing a tick needs may live only in a worker. A tick
builds its stage afresh: :class:`StageRun` binds the stage's layers (a module without
weights, unpickled once per worker) to the iteration's weights — the driver's slice in a
chain's first iteration, else the file the last update wrote, memory-mapped, so every
worker on the host reads the same pages — and to a gradient vector of its own. What it
leaves for later ticks goes to the run's directory (:class:`StageFiles`): the gradient
added up over the micro-batches so far, one file per micro-batch (``acc`` after micro-batch
``m`` is ``acc`` after ``m + 1`` plus ``m``'s), the weights after each update, and the
inputs and output gradients as they came (for re-running a micro-batch whose sum is gone:
Spark re-runs ticks of a lost executor). Every file is written whole under a new name, so
a task that Spark runs again finds what the first run found.

The forward's autograd graph is kept in the worker for the backward, which uses it when the
backward's task lands in the same worker; otherwise (and always with ``recompute``:
GPipe's re-materialisation) the backward runs the forward again from the stage's input,
with the running statistics put back after it, so BatchNorm counts each micro-batch once.
Random layers draw from streams keyed by ``(seed, iteration, micro-batch g = r x M + m,
the layer's position in the model)``: a forward run again draws the masks the first one
drew, and the stages draw ``LocalOptimizer(micro_batches=R x M, seed=seed)``'s.
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
from pyspark import cloudpickle

from bigdl_py import backend
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.data import MiniBatch
from bigdl_py.spark import worker
from bigdl_py.spark.modes.pipeline.layout import PipelineLayout
from bigdl_py.spark.owner_update import write_in_background
from bigdl_py.spark.partitioned_data import run_directory, save_npy_atomically
from bigdl_py.train import batches as batch_io
from bigdl_py.train.rng import keyed_random_streams


def pickled_without_weights(module: Any) -> bytes:
    """``module`` cloudpickled with empty arrays for its parameters and no gradients (its
    structure and buffers only: a task binds the weights, :func:`bind`); the module is
    left as it was."""
    parameters = list(module.parameters())
    saved = [(parameter.data, parameter.grad) for parameter in parameters]
    try:
        for parameter, (data, _) in zip(parameters, saved, strict=True):
            parameter.data = np.empty(0, dtype=data.dtype)
            parameter.grad = None
        return cloudpickle.dumps(module)
    finally:
        for parameter, (data, grad) in zip(parameters, saved, strict=True):
            parameter.data, parameter.grad = data, grad


def parameter_shapes(module: Any) -> tuple[tuple[int, ...], ...]:
    """The shapes :func:`bind` gives ``module``'s parameters, in order."""
    return tuple(tuple(parameter.data.shape) for parameter in module.parameters())


def bind(module: Any, shapes, weights: Any, gradients: Any) -> None:
    """Make ``module``'s parameters views of the flat ``weights`` and ``gradients``."""
    offset = 0
    for parameter, shape in zip(module.parameters(), shapes, strict=True):
        stop = offset + math.prod(shape)
        parameter.data = weights[offset:stop].reshape(shape)
        parameter.grad = Tensor(gradients[offset:stop].reshape(shape), _copy=False)
        offset = stop


class StageRun:
    """Partition ``partition``'s stage for one task: its layers on the iteration's weights.

    Parameters
    ----------
    spec : replica.RunSpec
    layout : PipelineLayout
    partition : int
    stage_modules : tuple
        Per stage, a Broadcast of its weightless layers (cloudpickled).
    iteration : int
        The iteration whose micro-batches run.
    weights : numpy.ndarray
        The stage's slice of the weights at the iteration's start (read, never written).
    """

    def __init__(
        self,
        spec: Any,
        layout: PipelineLayout,
        partition: int,
        stage_modules: tuple,
        iteration: int,
        weights: np.ndarray,
    ):
        self.spec = spec
        self.partition = partition
        self.iteration = iteration
        self.stage = layout.stage_of(partition)
        self.first = self.stage == 0
        self.last = self.stage == layout.stages - 1
        self.recompute = layout.recompute
        self.criterion = spec.criterion
        self.scale = layout.micro_batch_size / layout.batch_size
        broadcast = stage_modules[self.stage]
        self.module = worker.fetch(
            spec.run_id,
            ("pipeline-module", self.stage),
            lambda: cloudpickle.loads(broadcast.value),
        )
        self.device = backend.device("cpu")
        if spec.device != "cpu":
            from bigdl_py.spark.gpu import bind_task_device  # reads the task's GPU address

            self.device = bind_task_device(spec.device)
            self.module.to(self.device)  # its buffers (running statistics) there too
        self.module.train()
        self.weights = backend.to_device(weights, self.device)
        xp = self.device.xp
        with self.device.activate():
            self.gradients = xp.zeros(len(weights), dtype=weights.dtype)
        self.shapes = layout.parameter_shapes[self.stage]
        self._bind()
        self.random_modules = [
            (position, module)
            for position, module in zip(
                layout.positions[self.stage], self.module.modules(), strict=True
            )
            if position is not None
        ]
        self.recomputed = 0  # forwards run again in a backward (no graph in this worker)

    def _bind(self) -> None:
        """The worker's layers of this stage on this run's weights and gradients (another
        run of the same stage in the task may have bound them to its own since)."""
        bind(self.module, self.shapes, self.weights, self.gradients)

    # --- running statistics ---------------------------------------------------------------
    def buffers(self) -> dict[str, np.ndarray]:
        """The stage's running statistics by its own names, as host arrays."""
        return {
            name: np.array(backend.as_numpy(buffer.data))
            for name, buffer in self.module.named_buffers()
        }

    def load_buffers(self, buffers: dict[str, np.ndarray] | None) -> None:
        if buffers:
            self.module.load_state_dict(buffers, strict=False)

    # --- one micro-batch ------------------------------------------------------------------
    def forward(
        self, micro_batch: int, key: tuple, inputs: np.ndarray, labels: np.ndarray | None
    ) -> Any:
        """Run ``micro_batch`` forward: the output for the next stage, or, on the last
        stage, the micro-batch's summed loss (a float)."""
        self._bind()
        start, end, result = self._forward(key, inputs, labels)
        if not self.recompute:
            _keep_graph(
                self.spec.run_id, (self.partition, self.iteration), micro_batch, (start, end)
            )
        return result

    def backward(
        self,
        micro_batch: int,
        key: tuple,
        output_gradient: np.ndarray | None,
        inputs_of: Callable[[int], tuple[np.ndarray, np.ndarray | None]],
    ) -> np.ndarray | None:
        """Run ``micro_batch`` backward from ``output_gradient`` (None on the last stage,
        whose loss starts it), adding to :attr:`gradients`: the gradient of the stage's
        input for the stage before (None on stage 0)."""
        self._bind()
        graph = _taken_graph(self.spec.run_id, (self.partition, self.iteration), micro_batch)
        if graph is None:
            inputs, labels = inputs_of(micro_batch)
            statistics = self.buffers()
            start, end, _ = self._forward(key, inputs, labels)
            self.load_buffers(statistics)
            self.recomputed += 1
        else:
            start, end = graph
        if self.last:
            end.backward()
        else:
            end.backward(backend.to_device(output_gradient, self.device))
        if self.first:
            return None
        return np.array(backend.as_numpy(start.grad.data))

    def gradient(self) -> np.ndarray:
        """What this task's backward passes added, on the host."""
        return np.array(backend.as_numpy(self.gradients))

    def _forward(self, key: tuple, inputs: np.ndarray, labels: np.ndarray | None):
        start = Tensor(
            backend.to_device(np.asarray(inputs), self.device),
            requires_grad=not self.first,
            _copy=False,
        )
        with keyed_random_streams(self.random_modules, key):
            output = self.module(start)
        if not self.last:
            return start, output, np.array(backend.as_numpy(output.data))
        batch = MiniBatch((np.asarray(inputs),), labels)
        target = batch_io.criterion_target(self.criterion, batch, self.device)
        loss = self.criterion(output, target)
        return start, loss * self.scale, float(loss.item()) * len(labels)


# --- the graphs a worker keeps between a forward and its backward ------------------------------


def _keep_graph(run_id: str, owner: tuple, micro_batch: int, graph: tuple) -> None:
    """Keep ``graph`` for ``owner`` (partition, iteration); a worker keeps one owner's graphs
    (a stage's activations for its micro-batches in flight), dropping any other's."""
    kept = worker.fetch(run_id, ("pipeline-graphs",), lambda: {"owner": None, "graphs": {}})
    if kept["owner"] != owner:
        kept["owner"], kept["graphs"] = owner, {}
    kept["graphs"][micro_batch] = graph


def _taken_graph(run_id: str, owner: tuple, micro_batch: int) -> tuple | None:
    kept = worker.lookup(run_id, ("pipeline-graphs",))
    if kept is None or kept["owner"] != owner:
        return None
    return kept["graphs"].pop(micro_batch, None)


# --- what a tick leaves on the host's disk for the next ------------------------------------


class StageFiles:
    """Partition ``partition``'s files of a run (see the module docstring). Each is a
    ``.npy`` file written atomically, in the background (the task ends once it is on disk)."""

    def __init__(self, spec: Any, partition: int):
        self.directory = run_directory(spec.state_dir, spec.run_id)
        self.partition = partition

    def _path(self, kind: str, iteration: int, micro_batch: int | None = None) -> str:
        name = f"pipeline-{kind}-{self.partition}-{iteration}"
        if micro_batch is not None:
            name += f"-{micro_batch}"
        return os.path.join(self.directory, name + ".npy")

    def _write(self, path: str, values: np.ndarray) -> None:
        write_in_background(save_npy_atomically, path, np.asarray(values))

    def _read(self, path: str, what: str, mapped: bool = False) -> np.ndarray:
        try:
            return np.load(path, mmap_mode="r" if mapped else None, allow_pickle=False)
        except FileNotFoundError:
            raise RuntimeError(
                f"the pipeline's {what} of partition {self.partition} is not on host "
                f"{os.uname().nodename} ({path}); the pipeline needs executors that share a "
                "disk (BIGDL_PY_STATE_DIR)"
            ) from None

    def save_weights(self, iteration: int, weights: np.ndarray) -> None:
        """The stage's weights after ``iteration``'s update."""
        self._write(self._path("weights", iteration), weights)

    def weights_after(self, iteration: int) -> np.ndarray:
        """The weights after ``iteration``'s update, memory-mapped (read only)."""
        return self._read(self._path("weights", iteration), f"weights after {iteration}", True)

    def save_arrival(self, kind: str, iteration: int, micro_batch: int, values) -> None:
        """What came for ``micro_batch`` of ``iteration`` (``kind``: "input" or "gradient")."""
        self._write(self._path(kind, iteration, micro_batch), values)

    def arrival(self, kind: str, iteration: int, micro_batch: int) -> np.ndarray:
        path = self._path(kind, iteration, micro_batch)
        return self._read(path, f"{kind} of micro-batch {micro_batch}, iteration {iteration}")

    def save_accumulated(self, iteration: int, micro_batch: int, values: np.ndarray) -> None:
        """The gradient added up over micro-batches ``micro_batch .. M - 1``; the sum two
        micro-batches back goes (Spark re-running a tick without it recomputes it)."""
        self._write(self._path("accumulated", iteration, micro_batch), values)
        write_in_background(_remove, self._path("accumulated", iteration, micro_batch + 2))

    def accumulated(self, iteration: int, micro_batch: int) -> np.ndarray | None:
        """:meth:`save_accumulated`'s file, memory-mapped, or None when it is gone."""
        try:
            return np.load(self._path("accumulated", iteration, micro_batch), mmap_mode="r")
        except FileNotFoundError:
            return None

    def save_summed(self, iteration: int, summed: np.ndarray) -> None:
        self._write(self._path("summed", iteration), summed)

    def summed(self, iteration: int) -> np.ndarray:
        return self._read(self._path("summed", iteration), f"summed gradient of {iteration}")

    def forget_before(self, iteration: int) -> None:
        """Remove this partition's files of the iterations before ``iteration`` (a job's
        ticks read none from before its first iteration)."""
        pattern = os.path.join(self.directory, f"pipeline-*-{self.partition}-*.npy")
        for path in glob.glob(pattern):
            fields = os.path.basename(path)[: -len(".npy")].split("-")
            if int(fields[2]) == self.partition and int(fields[3]) < iteration:
                write_in_background(_remove, path)

    def forget_sums(self, iteration: int) -> None:
        """Remove the gradient sums of ``iteration`` once its update has read them (a tick
        Spark runs again recomputes them from the inputs and gradients)."""
        for kind in ("accumulated", "summed"):
            name = f"pipeline-{kind}-{self.partition}-{iteration}"
            for pattern in (name + ".npy", name + "-*.npy"):
                for path in glob.glob(os.path.join(self.directory, pattern)):
                    write_in_background(_remove, path)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
