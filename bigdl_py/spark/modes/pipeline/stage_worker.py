"""One partition's pipeline stage on its executor: the stage's layers over their slice of the
flat vector, and the micro-batches of the current iteration in flight.

:class:`StageWorker` lives in the Python worker's cache between the ticks of a job (a tick
is a Spark stage). Per micro-batch it keeps what the backward needs: the autograd graph of
its forward, or, with recomputation (GPipe's re-materialisation), only the stage's input,
from which the backward runs the forward again. Its gradient adds up over the iteration's
micro-batches in the flat gradient vector. A tick that finds no worker at the version it
expects (another Python worker got the partition, or Spark re-runs a lost tick) rebuilds
one with :func:`rebuild`: the weights at the iteration's start, the running statistics the
tick's carry holds, and the backward of every micro-batch done before the tick run again
from the inputs and output gradients written to the host's disk as they came (the same
arithmetic in the same order: the same gradient).

Random layers draw from streams keyed by ``(seed, iteration, micro-batch g = r x M + m,
the layer's position in the model)``, so a recomputed forward draws the masks the first
one drew, and the stages draw the masks ``LocalOptimizer(micro_batches=R x M, seed=seed)``
draws (``bigdl_py.train.rng.keyed_random_streams``). A recomputed forward puts the running
statistics back as they were: BatchNorm counts each micro-batch once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
from pyspark import cloudpickle

from bigdl_py import backend
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.data import MiniBatch
from bigdl_py.optim.flat_parameters import FlatParameters
from bigdl_py.spark.modes.pipeline.layout import PipelineLayout
from bigdl_py.spark.owner_update import ShardStateStore, save_in_background
from bigdl_py.spark.partitioned_data import run_directory
from bigdl_py.train import batches as batch_io
from bigdl_py.train.rng import keyed_random_streams


class _NoParameters:
    """The flat vectors of a stage without parameters (a reshaping or activation stage)."""

    def __init__(self, dtype: np.dtype):
        self.size = 0
        self.weights = np.zeros(0, dtype=dtype)
        self.gradients = np.zeros(0, dtype=dtype)

    def load(self, vector: Any) -> None:
        pass

    def zero_grad(self) -> None:
        pass


class StageWorker:
    """Partition ``partition``'s stage: its module, flat slice and micro-batches in flight."""

    def __init__(self, spec: Any, layout: PipelineLayout, partition: int, stage_modules: tuple):
        self.partition = partition
        self.stage = layout.stage_of(partition)
        self.replica = layout.replica_of(partition)
        self.first = self.stage == 0
        self.last = self.stage == layout.stages - 1
        self.recompute = layout.recompute
        self.module = cloudpickle.loads(stage_modules[self.stage].value)
        self.device = backend.device("cpu")
        if spec.device != "cpu":
            from bigdl_py.spark.gpu import bind_task_device  # reads the task's GPU address

            self.device = bind_task_device(spec.device)
            self.module.to(self.device)
        self.module.train()
        has_parameters = any(True for _ in self.module.parameters())
        self.flat = FlatParameters(self.module) if has_parameters else _NoParameters(layout.dtype)
        self.criterion = spec.criterion
        self.scale = layout.micro_batch_size / layout.batch_size
        self.random_modules = [
            (position, module)
            for position, module in zip(
                layout.positions[self.stage], self.module.modules(), strict=True
            )
            if position is not None
        ]
        self.iteration: int | None = None
        self.graphs: dict[int, tuple[Tensor, Tensor]] = {}  # micro-batch -> (input, end)
        self.inputs: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}  # (input, labels)
        self.summed: np.ndarray | None = None  # the replicas' summed gradient (squares tick)
        self.compute_seconds = 0.0

    # --- the iteration --------------------------------------------------------------------
    def start_iteration(self, iteration: int, weights: np.ndarray) -> None:
        """Begin iteration ``iteration`` on ``weights`` (the stage's slice): no gradient, no
        micro-batch in flight."""
        self.flat.load(np.asarray(weights, dtype=self.flat.weights.dtype))
        self.flat.zero_grad()
        self.iteration = iteration
        self.graphs.clear()
        self.inputs.clear()
        self.summed = None

    def weights(self) -> np.ndarray:
        """The stage's slice of the weights, on the host."""
        return np.array(backend.as_numpy(self.flat.weights))

    def gradient(self) -> np.ndarray:
        """The stage's gradient so far this iteration, on the host."""
        return np.array(backend.as_numpy(self.flat.gradients))

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
        self.inputs[micro_batch] = (inputs, labels)
        start, end, result = self._forward(key, inputs, labels)
        if not self.recompute:
            self.graphs[micro_batch] = (start, end)
        return result

    def backward(
        self,
        micro_batch: int,
        key: tuple,
        output_gradient: np.ndarray | None,
        inputs_of: Callable[[int], tuple[np.ndarray, np.ndarray | None]],
    ) -> np.ndarray | None:
        """Run ``micro_batch`` backward from ``output_gradient`` (None on the last stage,
        whose loss starts it), adding to the stage's gradient: the gradient of the stage's
        input for the stage before (None on stage 0). Without the forward's graph (kept
        only without recomputation, and by this worker) the forward runs again from
        ``inputs_of(micro_batch)``, the running statistics put back after it."""
        if micro_batch in self.graphs:
            start, end = self.graphs.pop(micro_batch)
        else:
            inputs, labels = self.inputs.get(micro_batch) or inputs_of(micro_batch)
            statistics = self.buffers()
            start, end, _ = self._forward(key, inputs, labels)
            self.load_buffers(statistics)
        self.inputs.pop(micro_batch, None)
        if self.last:
            end.backward()
        else:
            end.backward(backend.to_device(output_gradient, self.device))
        if self.first:
            return None
        return np.array(backend.as_numpy(start.grad.data))

    def _forward(self, key: tuple, inputs: np.ndarray, labels: np.ndarray | None):
        start = Tensor(
            backend.to_device(inputs, self.device), requires_grad=not self.first, _copy=False
        )
        with keyed_random_streams(self.random_modules, key):
            output = self.module(start)
        if not self.last:
            return start, output, np.array(backend.as_numpy(output.data))
        batch = MiniBatch((inputs,), labels)
        loss = self.criterion(output, batch_io.criterion_target(self.criterion, batch, self.device))
        loss_sum = float(loss.item()) * len(labels)
        return start, loss * self.scale, loss_sum


# --- what a worker leaves on the host's disk, for a worker that rebuilds it ---------------------


class StageFiles:
    """Partition ``partition``'s files of a run: the weights after each update, and the
    inputs and output gradients of each micro-batch as they came (kept from the job's start
    for a stage Spark runs again; older ones go as new ones are written)."""

    def __init__(self, spec: Any, partition: int):
        self.directory = run_directory(spec.state_dir, spec.run_id)
        self.partition = partition

    def _store(self, kind: str) -> ShardStateStore:
        return ShardStateStore(self.directory, f"pipeline-{kind}-{self.partition}")

    def save_weights(self, iteration: int, weights: np.ndarray, retain_from: int) -> None:
        """The stage's weights after ``iteration``'s update (written in the background)."""
        save_in_background(self._store("weights"), iteration, {"weights": weights}, retain_from)

    def weights_after(self, iteration: int) -> np.ndarray:
        """The weights :meth:`save_weights` wrote after ``iteration``."""
        state = self._store("weights").load(iteration)
        if state is None:
            raise RuntimeError(
                f"the pipeline stage weights of partition {self.partition} after iteration "
                f"{iteration} are not on host {os.uname().nodename} (looked in "
                f"{self.directory}); the pipeline needs executors that share a disk"
            )
        return np.asarray(state["weights"])

    def save_arrival(self, kind: str, iteration: int, micro_batch: int, values, retain_from):
        """What came for ``micro_batch`` of ``iteration`` (``kind``: "input" or "gradient")."""
        store = self._store(f"{kind}-{micro_batch}")
        save_in_background(store, iteration, {"values": values}, retain_from)

    def arrival(self, kind: str, iteration: int, micro_batch: int) -> np.ndarray:
        state = self._store(f"{kind}-{micro_batch}").load(iteration)
        if state is None:
            raise RuntimeError(
                f"the pipeline {kind} of micro-batch {micro_batch}, iteration {iteration}, "
                f"partition {self.partition} is not on host {os.uname().nodename}; the "
                "pipeline needs executors that share a disk"
            )
        return np.asarray(state["values"])

    def save_summed(self, iteration: int, summed: np.ndarray, retain_from: int) -> None:
        save_in_background(self._store("summed"), iteration, {"summed": summed}, retain_from)

    def summed(self, iteration: int) -> np.ndarray:
        state = self._store("summed").load(iteration)
        if state is None:
            raise RuntimeError(
                f"the summed pipeline gradient of partition {self.partition}, iteration "
                f"{iteration}, is not on host {os.uname().nodename}"
            )
        return np.asarray(state["summed"])
