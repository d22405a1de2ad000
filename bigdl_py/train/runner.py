"""How ONE training iteration runs: the only part local and distributed training do differently.

The training loop (:class:`bigdl_py.train.loop.BaseOptimizer`) owns everything around an
iteration — which batch comes next, triggers, validation scheduling, checkpoints, summaries,
progress, non-finite losses. It hands the work itself to an :class:`IterationRunner`:

* :class:`LocalRunner` (this file) trains the model in this process on a flat parameter
  vector: zero the gradient vector, forward, loss, backward, clip, ``optim_method.step``.
* The Spark runner of ``DistriOptimizer`` does the same iteration across partitions: model
  replicas, gradient slices through a shuffle, sharded optimizer state, weights broadcast.

The runner contract
-------------------
``prepare(setup)``
    Called once per ``optimize()`` before any other method, with a :class:`TrainingSetup`.
``run_iteration(epoch, iteration, batch_index, indices) -> IterationResult``
    Train on the samples ``indices`` of ``setup.training_set`` (global batch ``batch_index``
    of epoch ``epoch``, 0-based; ``iteration`` = iterations completed before this one). It
    must (1) compute the mean loss of the batch; (2) if the loss is finite, back-propagate,
    apply ``setup.clippings`` in order (an ``L2NormClipping`` needs the norm of the WHOLE
    gradient: sum ``sum_of_squares`` over the slices, then ``clip_slice_``) and apply
    ``setup.optim_method``'s rule; if the loss is NaN or infinite, change neither the
    weights nor the optimizer state; (3) in both cases advance the learning-rate schedule
    as ``optim_method.on_iteration_end(iteration + 1)`` does. A runner that trains on a
    device returns the loss as a :class:`DeviceLoss` instead of a float, so the step never
    waits for the device (see "Losses on a device" below).
``run_iterations(steps, stop_after_nonfinite) -> list[IterationResult]`` (optional)
    Several consecutive iterations at once (``steps``: :class:`IterationStep` tuples), for a
    runner whose fixed cost per call dominates (one Spark job). The loop calls it only with
    at most ``iterations_per_call`` steps, all of one epoch, ending where a trigger may fire,
    so validation, checkpoints and the end of training see the same states as iteration by
    iteration. Each result carries the learning rate its iteration used. With
    ``stop_after_nonfinite``, the iterations after a non-finite loss do nothing and the list
    ends with that one. The default calls ``run_iteration`` in turn.
``end_epoch(epoch, validation_score)``
    ``epoch`` epochs are complete: forward to ``optim_method.on_epoch_end``.
``learning_rate() -> float``
    The learning rate the next update will use (for summaries and progress).
``evaluate(dataset, methods, batch_size) -> list[ValidationResult]``
    Merged validation results of the current weights (training mode restored after).
``model_state_dict()`` / ``load_model_state_dict(state)``
    Host arrays of every parameter and buffer by dotted name (``Module.state_dict``).
``optim_state_dict()`` / ``load_optim_state_dict(state)``
    The optimizer state: one dict, or a list of per-shard dicts for sharded state (each a
    ``str -> numpy array or Python scalar`` mapping as ``OptimMethod.state_dict`` gives).
``rng_state()`` / ``load_rng_state(state)``
    JSON values of the random streams the model draws from (dropout), for exact resumes.
``sync_model()``
    Make ``setup.model`` hold the trained weights (a no-op when it already does).
``close()``
    Release resources; called when ``optimize()`` ends, normally or not.

Losses on a device
------------------
Reading a loss computed on a GPU makes the host wait until the device has run the step, so
it cannot queue the next one meanwhile. A device runner therefore decides on the device
whether a step updates (``isfinite(loss)``, passed to ``OptimMethod.step`` as
``apply_if``) and returns a :class:`DeviceLoss`, whose copy to the host is queued behind
the step. The loop reads it ONE STEP LATE, after it has queued the next iteration (or at
once where a sync point follows: validation, the end of an epoch, a checkpoint, the end of
training, or a trigger that reads the loss). Then it handles a NaN/Inf loss as for a float:
skipped (``setup.skip_nonfinite``: the device already left weights and optimizer state as
they were) or stopping training; for that, a stopping runner keeps updating off on the
device from the first non-finite loss on, so the weights are those before that batch
although the next iteration ran.

The base class implements everything but ``run_iteration`` and ``evaluate`` on
``setup.model`` and ``setup.optim_method`` in this process; a runner whose state lives
elsewhere (model replicas and optimizer shards on executors) overrides those methods, or
keeps the driver's copies in step (e.g. calls ``optim_method.on_iteration_end`` on the
driver's instance too, so ``learning_rate()`` stays right).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.data import MiniBatch
from bigdl_py.optim import FlatParameters
from bigdl_py.step_graph import StepGraph
from bigdl_py.train import batches as batch_io
from bigdl_py.train.metrics import ValidationMethod, ValidationResult
from bigdl_py.train.rng import keyed_random_streams, load_model_rng_state, model_rng_state
from bigdl_py.train.route_settings import route_settings


@dataclass
class TrainingSetup:
    """What a runner trains: handed to :meth:`IterationRunner.prepare`.

    Attributes
    ----------
    model, criterion, optim_method
        The module, the loss module, the OptimMethod (whole-vector instance; a sharding
        runner clones it per shard with ``copy.deepcopy`` or its ``config()``).
    training_set
        The training data (an ``ArrayDataset`` locally; whatever the runner understands).
    batch_size : int
        The global batch size.
    clippings : tuple
        Gradient clippings to apply in order: a ``ConstantClipping`` and/or an
        ``L2NormClipping`` (empty: none).
    skip_nonfinite : bool
        Whether the loop skips NaN/Inf-loss batches (True) or stops at the first (False);
        a device runner needs it to gate its updates (see "Losses on a device").
    """

    model: Any
    criterion: Any
    optim_method: Any
    training_set: Any
    batch_size: int
    clippings: tuple = ()
    skip_nonfinite: bool = False


class DeviceLoss:
    """A loss still on the device; its copy to the host is queued behind its step.

    ``value()`` gives the float: the loop calls it one step later (see the module's
    "Losses on a device"), when waiting for the copy no longer stalls the device.
    """

    __slots__ = ("_copy",)

    def __init__(self, array: Any):
        self._copy = backend.HostCopy(array)

    def value(self) -> float:
        return float(self._copy.wait())

    def __repr__(self) -> str:
        return "DeviceLoss(pending)"


class IterationResult(NamedTuple):
    """The outcome of one iteration: its mean loss (a float, or a :class:`DeviceLoss`), its
    sample count, whether it updated (known later for a DeviceLoss), and (from
    ``run_iterations``) the learning rate it used."""

    loss: float | DeviceLoss
    samples: int
    applied: bool = True
    learning_rate: float | None = None


class IterationStep(NamedTuple):
    """What ``run_iteration`` takes, for one of the iterations of ``run_iterations``."""

    epoch: int
    iteration: int
    batch_index: int
    indices: np.ndarray


class IterationRunner:
    """Base class of runners; see the module docstring for the contract."""

    setup: TrainingSetup
    #: The most steps one ``run_iterations`` call takes (1: the loop calls run_iteration).
    iterations_per_call: int = 1

    def prepare(self, setup: TrainingSetup) -> None:
        self.setup = setup

    def run_iterations(
        self, steps: Sequence[IterationStep], stop_after_nonfinite: bool
    ) -> list[IterationResult]:
        results = []
        for step in steps:
            learning_rate = self.learning_rate()
            result = self.run_iteration(*step)._replace(learning_rate=learning_rate)
            results.append(result)
            if (
                stop_after_nonfinite
                and not isinstance(result.loss, DeviceLoss)
                and not np.isfinite(result.loss)
            ):
                break  # (a DeviceLoss's updates stop on the device)
        return results

    def run_iteration(
        self, epoch: int, iteration: int, batch_index: int, indices: np.ndarray
    ) -> IterationResult:
        raise NotImplementedError(f"{type(self).__name__} does not implement run_iteration()")

    def end_epoch(self, epoch: int, validation_score: float | None = None) -> None:
        self.setup.optim_method.on_epoch_end(epoch, validation_score)

    def learning_rate(self) -> float:
        return float(self.setup.optim_method.current_learning_rate())

    def evaluate(
        self, dataset: Any, methods: Sequence[ValidationMethod], batch_size: int
    ) -> list[ValidationResult]:
        raise NotImplementedError(f"{type(self).__name__} does not implement evaluate()")

    def model_state_dict(self) -> dict[str, np.ndarray]:
        return dict(self.setup.model.state_dict())

    def load_model_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.setup.model.load_state_dict(state)

    def optim_state_dict(self) -> dict[str, Any] | list[dict[str, Any]]:
        return self.setup.optim_method.state_dict()

    def load_optim_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        if isinstance(state, list):
            raise ValueError(
                f"{type(self).__name__} keeps one optimizer state but the checkpoint holds "
                f"{len(state)} shards; resume it with the optimizer that wrote it"
            )
        self.setup.optim_method.load_state_dict(state)

    def rng_state(self) -> dict[str, Any]:
        return model_rng_state(self.setup.model)

    def load_rng_state(self, state: dict[str, Any]) -> None:
        load_model_rng_state(self.setup.model, state)

    def sync_model(self) -> None:
        """The local model is the trained one; runners with replicas copy weights back."""

    def close(self) -> None:
        """Nothing to release locally."""


class LocalRunner(IterationRunner):
    """Trains in this process, on the model's device, over one flat parameter vector.

    The parameters are flattened once (:class:`FlatParameters`), so an iteration makes no
    copy of the weights: backward accumulates into the flat gradient vector, and the optim
    method updates the flat weight vector the layers view. On a device an iteration reads
    nothing back (see "Losses on a device"); the labels go to the criterion as host arrays
    when it checks them there (``batch_io.criterion_target``).

    On a device the whole iteration (zeroing the gradient, forward, loss, backward,
    clipping, update) is one step function run by a :class:`~bigdl_py.step_graph.StepGraph`:
    captured in a CUDA graph after a warm-up and replayed, its batch copied into the
    graph's input buffers (the labels too: the criterion then checks them on the device).
    ``cuda_graphs=False`` (or ``BIGDL_PY_CUDA_GRAPHS=0``) runs it as before, eagerly.

    ``micro_batches`` > 1 runs each batch as that many contiguous micro-batches in turn
    (``numpy.array_split``), their gradients added up: BatchNorm normalises each by its own
    statistics and updates its running statistics once per micro-batch, as a GPipe
    pipeline does. With a ``seed``, each micro-batch's random layers draw from streams keyed
    by ``(seed, iteration, micro-batch, layer)`` (:func:`~bigdl_py.train.rng.keyed_random_streams`).
    Either runs the iteration eagerly (no CUDA graph).
    """

    def __init__(
        self, cuda_graphs: bool | None = None, micro_batches: int = 1, seed: int | None = None
    ):
        self.cuda_graphs = cuda_graphs
        self.micro_batches = micro_batches
        self.seed = seed

    def prepare(self, setup: TrainingSetup) -> None:
        super().prepare(setup)
        setup.model.train()
        self.flat = FlatParameters(setup.model)
        self.device = self.flat.device
        self.on_device = backend.is_device_array(self.flat.weights)
        # On the device, in stop mode: no non-finite loss so far (updates stay off after one).
        self._healthy = None
        if self.on_device and not setup.skip_nonfinite:
            self._healthy = self.device.xp.ones((), dtype=bool)
        self._modules = list(setup.model.modules())
        self._parameters = list(setup.model.parameters())
        self.step_graph = StepGraph(
            self.device, enabled=self.cuda_graphs, host_state=self._host_state
        )

    def run_iteration(
        self, epoch: int, iteration: int, batch_index: int, indices: np.ndarray
    ) -> IterationResult:
        setup = self.setup
        batch = batch_io.training_batch(setup.training_set, epoch, batch_index, indices)
        if self.micro_batches > 1 or self.seed is not None:
            return self._micro_batch_iteration(batch, iteration)
        if self.on_device and self.step_graph.enabled:
            inputs = [*batch.features, batch_io.host_labels(batch)]
            loss = self.step_graph.run(self._device_step, inputs, self._step_key())
            setup.optim_method.on_iteration_end(iteration + 1)
            return IterationResult(DeviceLoss(loss), batch.size, applied=None)
        self.flat.zero_grad()
        output = batch_io.forward(setup.model, batch, self.device)
        loss = setup.criterion(
            output, batch_io.criterion_target(setup.criterion, batch, self.device)
        )
        if self.on_device:
            return self._device_iteration(loss, iteration, batch.size)
        loss_value = float(loss.item())
        applied = bool(np.isfinite(loss_value))
        if applied:
            loss.backward()
            for clipping in setup.clippings:  # each clips the whole vector in place
                clipping.clip_(self.flat.gradients)
            setup.optim_method.step(self.flat.weights, self.flat.gradients)
        setup.optim_method.on_iteration_end(iteration + 1)
        return IterationResult(loss_value, batch.size, applied)

    def _micro_batch_iteration(self, batch: MiniBatch, iteration: int) -> IterationResult:
        """One iteration as ``micro_batches`` forward-backward passes whose gradients add up
        to the batch's mean loss's (see the class docstring)."""
        setup = self.setup
        self.flat.zero_grad()
        losses = []
        pieces = np.array_split(np.arange(batch.size), self.micro_batches)
        for number, piece in enumerate(pieces):
            if len(piece) == 0:
                continue
            labels = batch_io.host_labels(batch)[piece]
            part = MiniBatch(tuple(array[piece] for array in batch.features), labels)
            streams = contextlib.nullcontext()
            if self.seed is not None:
                key = (self.seed, iteration, number)
                streams = keyed_random_streams(enumerate(self._modules), key)
            with streams:
                output = batch_io.forward(setup.model, part, self.device)
            loss = setup.criterion(
                output, batch_io.criterion_target(setup.criterion, part, self.device)
            )
            losses.append(loss.data * len(piece))
            (loss * (len(piece) / batch.size)).backward()
        if self.on_device:
            mean = sum(losses[1:], losses[0]) / batch.size
            self._update_if_finite(mean)
            setup.optim_method.on_iteration_end(iteration + 1)
            return IterationResult(DeviceLoss(mean), batch.size, applied=None)
        loss_value = float(sum(float(piece_loss) for piece_loss in losses) / batch.size)
        applied = bool(np.isfinite(loss_value))
        if applied:
            for clipping in setup.clippings:
                clipping.clip_(self.flat.gradients)
            setup.optim_method.step(self.flat.weights, self.flat.gradients)
        setup.optim_method.on_iteration_end(iteration + 1)
        return IterationResult(loss_value, batch.size, applied)

    def _device_iteration(self, loss: Any, iteration: int, samples: int) -> IterationResult:
        """Backward and update with the finite-loss decision kept on the device."""
        self._backward_and_update(loss)
        self.setup.optim_method.on_iteration_end(iteration + 1)
        return IterationResult(DeviceLoss(loss.data), samples, applied=None)

    def _device_step(self, *arrays: Any) -> Any:
        """One whole iteration on device arrays (the features, then the labels): what a
        CUDA graph captures. Returns the loss (a 0-d device array)."""
        setup = self.setup
        self.flat.zero_grad()
        output = setup.model(*(Tensor(array, _copy=False) for array in arrays[:-1]))
        loss = setup.criterion(output, Tensor(arrays[-1], _copy=False))
        self._backward_and_update(loss)
        return loss.data

    def _backward_and_update(self, loss: Any) -> None:
        """Backward, clipping and the update, gated on the device by a finite loss (in stop
        mode, by every loss so far being finite)."""
        loss.backward()
        self._update_if_finite(loss.data)

    def _update_if_finite(self, loss: Any) -> None:
        """Clipping and the update of the gradients backward left, gated on the device by a
        finite ``loss`` (a 0-d device array; in stop mode, by every loss so far being finite)."""
        setup = self.setup
        xp = backend.array_module(loss)
        apply = xp.isfinite(loss)
        if self._healthy is not None:  # stopping: nothing updates after the first NaN/Inf
            xp.logical_and(self._healthy, apply, out=self._healthy)
            apply = self._healthy
        for clipping in setup.clippings:
            clipping.clip_(self.flat.gradients)
        setup.optim_method.step(self.flat.weights, self.flat.gradients, apply_if=apply)

    def _step_key(self) -> tuple:
        """What a captured step depends on besides its inputs' shapes: which modules train,
        which parameters learn, the optimizer and its hyperparameters, the clippings, the
        settings that pick the kernels and libraries it launches (``route_settings``). A
        change makes (or reuses) another graph."""
        setup = self.setup
        return (
            tuple(module.training for module in self._modules),
            tuple(parameter.requires_grad for parameter in self._parameters),
            id(setup.optim_method),
            repr(setup.optim_method),
            tuple(repr(clipping) for clipping in setup.clippings),
            route_settings(),
        )

    def _host_state(self):
        """The model's host random generators now, and how to put them back (a capture that
        fails has drawn from them)."""
        model = self.setup.model
        saved = model_rng_state(model)
        return lambda: load_model_rng_state(model, saved)

    def load_optim_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        super().load_optim_state_dict(state)
        self.step_graph.reset()  # the optimizer's device state is made anew

    def close(self) -> None:
        graph = getattr(self, "step_graph", None)
        if graph is not None:
            graph.reset()  # the graphs' memory goes back

    def evaluate(
        self, dataset: Any, methods: Sequence[ValidationMethod], batch_size: int
    ) -> list[ValidationResult]:
        return batch_io.evaluate_batches(
            self.setup.model, batch_io.validation_batches(dataset, batch_size), methods, self.device
        )
