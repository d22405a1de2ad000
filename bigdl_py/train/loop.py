"""The training loop shared by every optimizer: ``BaseOptimizer``.

It decides which batch comes next, and around each iteration it evaluates the triggers,
runs validation, writes summaries and checkpoints, reports progress and handles NaN/Inf
losses. The iteration itself is delegated to an :class:`~bigdl_py.train.runner.IterationRunner`
(local or Spark), so ``LocalOptimizer`` and ``DistriOptimizer`` are this loop with different
runners and the same behaviour everywhere else.

Order of events after each iteration: counters advance; the train summary and progress are
written; validation runs when its trigger fires; at an epoch's end the learning-rate
schedule hears about it (with that epoch's validation score, for ``Plateau``); a checkpoint
is written when its trigger fires; then the end trigger decides whether to go on.

An :class:`~bigdl_py.train.early_stopping.EarlyStopping` in the end trigger hears each
validation (the best score is kept in the state); with ``restore_best`` the loop keeps a host
copy of the weights of the best validation, writes it into every checkpoint (``best_model/``
arrays) and gives it to the model when training ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from bigdl_py import device_waits
from bigdl_py.nn.module import Module
from bigdl_py.optim import ConstantClipping, L2NormClipping, OptimMethod
from bigdl_py.train import checkpoint as checkpoints
from bigdl_py.train import loss_hints, resume
from bigdl_py.train.callbacks import TrainingCallback
from bigdl_py.train.early_stopping import EarlyStopping, find_early_stopping
from bigdl_py.train.metrics import ValidationMethod, ValidationResult, check_methods
from bigdl_py.train.progress import Progress
from bigdl_py.train.runner import (
    DeviceLoss,
    IterationResult,
    IterationRunner,
    IterationStep,
    TrainingSetup,
)
from bigdl_py.train.summary import TrainSummary, ValidationSummary
from bigdl_py.train.triggers import TrainingState, Trigger, check_trigger
from bigdl_py.train.validation_watchers import check_validation_watchers

logger = logging.getLogger("bigdl_py.train")


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; training stopped before updating on it."""


class _IterationName(NamedTuple):
    """Which iteration: ``str()`` gives ``iteration 12 (epoch 2, batch 3 of 10)``."""

    iteration: int
    epoch: int
    batch: int
    batches: int

    def __str__(self) -> str:
        return (
            f"iteration {self.iteration} (epoch {self.epoch}, batch {self.batch} of {self.batches})"
        )


class _LossReport(NamedTuple):
    """What reporting a device loss one step late needs of its iteration."""

    loss: DeviceLoss
    where: _IterationName
    indices: Any  # the batch's sample indices
    state: TrainingState  # a copy, as right after the iteration
    throughput: float
    learning_rate: float


@dataclass
class _ValidationPlan:
    trigger: Trigger
    dataset: Any
    methods: list[ValidationMethod]
    batch_size: int


@dataclass
class _CheckpointPlan:
    path: str
    trigger: Trigger
    overwrite: bool
    replace_other_runs: bool = False


class BaseOptimizer:
    """The BigDL training API over a pluggable :class:`IterationRunner`.

    Subclasses (``LocalOptimizer``, ``DistriOptimizer``) choose the runner and convert the
    data they accept; everything else is here.

    Parameters
    ----------
    model : Module
    training_set
        Anything with ``len()`` and ``global_batch_indices(epoch, batch_size)`` (an
        ``ArrayDataset``), which defines every epoch's batches, and that the runner reads.
    criterion : Module
        The loss, called as ``criterion(output, target)``; returns the batch mean.
    optim_method : OptimMethod
        The update rule (with its learning-rate schedule).
    end_trigger : Trigger, optional
        When to stop; can be set later with :meth:`set_end_when`.
    batch_size : int, optional
        The global batch size (default: the training set's ``batch_size``).
    runner : IterationRunner
    skip_nonfinite_batches : bool
        On a NaN/Inf loss, skip the batch (weights unchanged) and count it in
        ``state.skipped_batches``, instead of stopping with :class:`NonFiniteLossError`.
    progress : bool or Progress
        Report progress (a bar on a terminal, log lines otherwise).
    """

    def __init__(
        self,
        model: Module,
        training_set: Any,
        criterion: Any,
        optim_method: OptimMethod,
        end_trigger: Trigger | None,
        batch_size: int | None,
        runner: IterationRunner,
        *,
        skip_nonfinite_batches: bool = False,
        progress: bool | Progress = True,
    ):
        if not isinstance(model, Module):
            raise TypeError(f"model must be a bigdl_py Module, got {type(model).__name__}")
        if not callable(criterion):
            raise TypeError(f"criterion must be a loss module, got {type(criterion).__name__}")
        self.model = model
        self.training_set = training_set
        self.criterion = criterion
        self.set_optim_method(optim_method)
        self.batch_size = self._check_batch_size(batch_size)  # first: it names swapped args
        self.end_trigger = None
        if end_trigger is not None:
            self.set_end_when(end_trigger)
        self.runner = runner
        self.skip_nonfinite_batches = bool(skip_nonfinite_batches)
        self.progress = progress if isinstance(progress, Progress) else Progress(bool(progress))
        self.state = TrainingState()
        self.last_validation: list[ValidationResult] = []
        self.last_checkpoint: str | None = None
        self.train_summary: TrainSummary | None = None
        self.validation_summary: ValidationSummary | None = None
        self._validation: _ValidationPlan | None = None
        self._checkpoint: _CheckpointPlan | None = None
        self._constant_clipping: ConstantClipping | None = None
        self._l2_clipping: L2NormClipping | None = None
        self._resume_path: str | None = None
        # Names this run's checkpoints; a fresh run refuses a directory of another run's.
        self._run_id = "run-" + uuid.uuid4().hex[:12]
        self.callbacks: list[TrainingCallback] = []
        # Host copy of the weights at the best validation, for EarlyStopping(restore_best).
        self._best_weights: dict[str, np.ndarray] | None = None
        # A device loss not read yet: its iteration's report waits for the next one.
        self._unreported: _LossReport | None = None

    def _check_batch_size(self, batch_size: Any) -> int:
        if batch_size is None:
            batch_size = getattr(self.training_set, "batch_size", None)
            if batch_size is None:
                raise ValueError("batch_size is required: the training set does not define one")
        if isinstance(batch_size, Trigger):
            raise TypeError(
                f"batch_size got a Trigger ({batch_size!r}); pass end_trigger= and batch_size= "
                "by keyword"
            )
        if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        return int(batch_size)

    # --- BigDL's setters (each returns self) --------------------------------------------
    def set_optim_method(self, optim_method: OptimMethod) -> BaseOptimizer:
        if not isinstance(optim_method, OptimMethod):
            raise TypeError(
                "optim_method must be a bigdl_py.optim OptimMethod (SGD, Adam, ...), got "
                f"{type(optim_method).__name__}"
            )
        self.optim_method = optim_method
        return self

    def set_end_when(self, end_trigger: Trigger) -> BaseOptimizer:
        """Stop training when ``end_trigger`` fires (e.g. ``MaxEpoch(10)``)."""
        self.end_trigger = check_trigger(end_trigger, "end_trigger", end=True)
        return self

    def set_validation(
        self,
        trigger: Trigger,
        dataset: Any,
        methods: ValidationMethod | list[ValidationMethod],
        batch_size: int | None = None,
    ) -> BaseOptimizer:
        """Evaluate ``methods`` on ``dataset`` whenever ``trigger`` fires.

        The first method's value is the *score* (``MaxScore``, ``Plateau``). ``Loss()``
        without a criterion uses the training criterion. ``batch_size`` defaults to the
        training batch size.
        """
        trigger = check_trigger(trigger, "validation trigger", starts_validation=True)
        dataset = self._as_validation_set(dataset)
        if len(dataset) == 0:
            raise ValueError("the validation set is empty")
        bound = [method.with_default_criterion(self.criterion) for method in check_methods(methods)]
        self._validation = _ValidationPlan(
            trigger,
            dataset,
            bound,
            self.batch_size if batch_size is None else self._check_batch_size(batch_size),
        )
        return self

    def _as_validation_set(self, dataset: Any) -> Any:
        """Subclasses convert what they accept (arrays, RDDs) into what their runner reads."""
        return dataset

    def set_checkpoint(
        self, path: Any, trigger: Any, overwrite: bool = True, replace_other_runs: bool = False
    ) -> BaseOptimizer:
        """Write a checkpoint into directory ``path`` whenever ``trigger`` fires.

        BigDL's argument order ``set_checkpoint(trigger, path)`` is accepted too.
        ``overwrite=True`` keeps the two newest checkpoints; ``False`` keeps all of them
        and refuses to replace one. Resume with :meth:`resume_from`. A run that does not
        resume refuses, before training, a directory holding another run's checkpoints
        (they would be replaced) unless ``replace_other_runs``.
        """
        if isinstance(path, Trigger):
            path, trigger = trigger, path
        self._checkpoint = _CheckpointPlan(
            str(path),
            check_trigger(trigger, "checkpoint trigger"),
            bool(overwrite),
            bool(replace_other_runs),
        )
        return self

    def set_train_summary(self, summary: TrainSummary | None) -> BaseOptimizer:
        if summary is not None and not isinstance(summary, TrainSummary):
            raise TypeError(f"expected a TrainSummary, got {type(summary).__name__}")
        self.train_summary = summary
        return self

    def set_validation_summary(self, summary: ValidationSummary | None) -> BaseOptimizer:
        if summary is not None and not isinstance(summary, ValidationSummary):
            raise TypeError(f"expected a ValidationSummary, got {type(summary).__name__}")
        self.validation_summary = summary
        return self

    def set_gradient_clipping_by_l2_norm(self, max_norm: float) -> BaseOptimizer:
        """Scale each gradient so its global L2 norm is at most ``max_norm``."""
        self._l2_clipping = L2NormClipping(max_norm)
        return self

    def set_constant_gradient_clipping(self, min_value: float, max_value: float) -> BaseOptimizer:
        """Clamp every gradient element into ``[min_value, max_value]`` (before L2 clipping)."""
        self._constant_clipping = ConstantClipping(min_value, max_value)
        return self

    def disable_gradient_clipping(self) -> BaseOptimizer:
        self._constant_clipping = self._l2_clipping = None
        return self

    def set_progress(
        self,
        enabled: bool = True,
        bar: bool | None = None,
        log_interval: int | None = None,
        iteration_level: int = logging.INFO,
    ) -> BaseOptimizer:
        """Progress reporting: on/off, bar forced on/off, iterations between log lines, and
        the logging level of those lines (``logging.DEBUG`` keeps them out of INFO logs)."""
        self.progress = Progress(enabled, bar, log_interval, iteration_level=iteration_level)
        return self

    def add_callback(self, callback: TrainingCallback) -> BaseOptimizer:
        """Tell ``callback`` (e.g. an ``MLflowSummary``) about every iteration, validation
        and the end of training."""
        if not isinstance(callback, TrainingCallback):
            raise TypeError(
                f"expected a TrainingCallback (e.g. MLflowSummary), got {type(callback).__name__}"
            )
        self.callbacks.append(callback)
        return self

    def resume_from(self, path: str) -> BaseOptimizer:
        """Start the next :meth:`optimize` from a checkpoint (a directory or a manifest).

        Weights, optimizer state, learning-rate schedule, epoch/iteration, the position in
        the epoch and the model's random streams are restored, so the run continues exactly
        as if it had not stopped.
        """
        self._resume_path = str(path)
        return self

    @property
    def clippings(self) -> tuple:
        """Active gradient clippings, in the order they apply."""
        return tuple(c for c in (self._constant_clipping, self._l2_clipping) if c is not None)

    # --- training -----------------------------------------------------------------------
    def optimize(self) -> Module:
        """Train until the end trigger fires; return the trained model.

        Raises
        ------
        NonFiniteLossError
            When a loss is NaN/Inf and ``skip_nonfinite_batches`` is off; the weights are
            those before that batch and the last checkpoint is untouched.
        """
        if self.end_trigger is None:
            raise ValueError("no end trigger: pass end_trigger= or call set_end_when(MaxEpoch(n))")
        self._check_validation_watchers()
        setup = TrainingSetup(
            self.model,
            self.criterion,
            self.optim_method,
            self.training_set,
            self.batch_size,
            self.clippings,
            self.skip_nonfinite_batches,
        )
        self._check_checkpoint_directory()
        self.runner.prepare(setup)
        started: list[TrainingCallback] = []
        try:
            if self._resume_path is not None:
                self._restore(checkpoints.load_checkpoint(self._resume_path))
                self._resume_path = None
            for callback in self.callbacks:
                callback.on_train_begin(self)
                started.append(callback)
            try:
                with device_waits.no_device_waits():
                    self._train()
                    with self._sync_point("the end of training"):
                        pass
            except NonFiniteLossError:
                self.runner.sync_model()  # the model then holds the weights the error speaks of
                raise
            self._restore_best()
            self.runner.sync_model()
        except BaseException as error:
            # Every started callback hears of any error (an executor's, a bad batch's, an
            # interrupt), so an MLflow run ends FAILED instead of staying RUNNING.
            self._end_callbacks(started, error)
            raise
        else:
            self._end_callbacks(started, None)
        finally:
            self._unreported = None
            device_waits.discard_deferred_checks()
            self.progress.close()
            for summary in (self.train_summary, self.validation_summary):
                if summary is not None:
                    summary.flush()
            self.runner.close()
        return self.model

    def _end_callbacks(self, callbacks: list[TrainingCallback], error: BaseException | None):
        """Call every callback's ``on_train_end``, each even when one before it fails.

        On a training error, a callback's own failure is logged and the training error is
        the one raised; after a successful run, the first callback failure is raised.
        """
        first_failure = None
        for callback in callbacks:
            try:
                callback.on_train_end(self, self.model, error)
            except Exception as failure:
                if error is not None:
                    logger.error(
                        "%s.on_train_end failed while training was ending with %s: %s",
                        type(callback).__name__,
                        type(error).__name__,
                        failure,
                        exc_info=failure,
                    )
                elif first_failure is None:
                    first_failure = failure
        if first_failure is not None:
            raise first_failure

    # --- early stopping -----------------------------------------------------------------
    def _early_stopping(self) -> EarlyStopping | None:
        return find_early_stopping(self.end_trigger)

    def _check_validation_watchers(self) -> None:
        """Refuse, before any work, a trigger or schedule that watches validation results
        it could never see or would read the wrong way round (``validation_watchers``)."""
        triggers = {"end trigger": self.end_trigger}
        if self._checkpoint is not None:
            triggers["checkpoint trigger"] = self._checkpoint.trigger
        if self.train_summary is not None:
            for name, trigger in self.train_summary.summary_triggers().items():
                triggers[f"summary trigger of {name!r}"] = trigger
        methods = None if self._validation is None else self._validation.methods
        check_validation_watchers(triggers, self.optim_method.schedule, methods)
        stopper = self._early_stopping()
        if stopper is None:
            return
        names = [method.name for method in self._validation.methods]
        if stopper.metric not in names:
            raise ValueError(
                f"{stopper!r} watches the validation metric {stopper.metric!r}, but "
                f"set_validation computes {names}; pass metric= one of those"
            )
        stopper.check_direction(self._validation.methods[names.index(stopper.metric)])

    def _observe_validation(self, results: list[ValidationResult]) -> None:
        stopper = self._early_stopping()
        if stopper is None:
            return
        state = self.state
        if stopper.observe(state, results):
            if stopper.restore_best:
                self._best_weights = {
                    name: np.array(value, copy=True)
                    for name, value in self.runner.model_state_dict().items()
                }
            return
        if state.best_score is None:  # every validation so far gave NaN: nothing to quote
            best = "is NaN and has no best value yet"
        else:
            best = f"has not improved on {state.best_score:.6g} (iteration {state.best_iteration})"
        message = (
            f"early stopping: {stopper.metric} {best}; {state.validations_since_best} of "
            f"{stopper.patience} validations without improvement"
        )
        if stopper(state):
            message += "; training stops"
        self.progress.message(message)

    def _restore_best(self) -> None:
        """With ``restore_best``, give the model the weights of the best validation."""
        stopper, state = self._early_stopping(), self.state
        if stopper is None or not stopper.restore_best or self._best_weights is None:
            return
        if state.best_iteration == state.iteration:
            return  # the weights are the best ones already
        self.runner.load_model_state_dict(self._best_weights)
        self.progress.message(
            f"early stopping: restored the weights of iteration {state.best_iteration} "
            f"({stopper.metric} {state.best_score:.6g})"
        )

    def _batch_plan(self, epoch: int) -> list:
        """Sample indices of every batch of ``epoch`` (the training set defines them)."""
        return self.training_set.global_batch_indices(epoch, self.batch_size)

    def _train(self) -> None:
        state = self.state
        plan, plan_epoch = [], None
        while not self.end_trigger(state):
            if plan_epoch != state.epoch:
                plan, plan_epoch = self._batch_plan(state.epoch), state.epoch
                self._start_epoch(plan)
            count = self._iterations_for_next_call(len(plan))
            first = state.iteration_in_epoch
            steps = [
                IterationStep(state.epoch, state.iteration + i, first + i, plan[first + i])
                for i in range(count)
            ]
            started = time.perf_counter()
            device_waits.begin_step(self._next_iteration(len(plan)))
            results = self.runner.run_iterations(
                steps, stop_after_nonfinite=not self.skip_nonfinite_batches
            )
            seconds = (time.perf_counter() - started) / max(len(results), 1)
            for result in results:
                self._after_iteration(result, seconds, result.learning_rate, plan)

    def _iterations_for_next_call(self, batches_in_epoch: int) -> int:
        """How many iterations the runner may take at once from here: up to its
        ``iterations_per_call``, to the end of the epoch, and to the first iteration after
        which a trigger (end, validation, checkpoint, parameter histograms) fires — 1 when
        one of them cannot be predicted (it reads the training loss)."""
        limit = int(getattr(self.runner, "iterations_per_call", 1))
        if limit <= 1:
            return 1
        triggers = [self.end_trigger]
        if self._validation is not None:
            triggers.append(self._validation.trigger)
        if self._checkpoint is not None:
            triggers.append(self._checkpoint.trigger)
        if self.train_summary is not None:
            triggers.append(self.train_summary.get_summary_trigger("Parameters"))
        triggers = [trigger for trigger in triggers if trigger is not None]
        if not all(trigger.predictable for trigger in triggers):
            return 1
        ahead = dataclasses.replace(self.state)
        for count in range(1, limit + 1):
            ahead.advance(batches_in_epoch)
            if ahead.epoch_finished or any(trigger(ahead) for trigger in triggers):
                return count
        return limit

    def _start_epoch(self, plan: list) -> None:
        state = self.state
        if not plan:
            raise ValueError(
                f"epoch {state.epoch + 1} has no batches: {len(self.training_set)} samples with "
                f"batch_size {self.batch_size} (and drop_last) make no full batch"
            )
        if state.iteration_in_epoch >= len(plan):
            raise ValueError(
                f"the resume position (batch {state.iteration_in_epoch + 1} of epoch "
                f"{state.epoch + 1}) is past the epoch's {len(plan)} batches; was the checkpoint "
                "written with another training set or batch size?"
            )
        self._epoch_started = time.perf_counter()
        self._epoch_samples = sum(len(batch) for batch in plan)
        self._samples_done = sum(len(batch) for batch in plan[: state.iteration_in_epoch])
        self.progress.start_epoch(state.epoch + 1, state.iteration_in_epoch, len(plan))

    def _next_iteration(self, batches: int) -> _IterationName:
        """The name of the next iteration (formatted only when someone prints it)."""
        state = self.state
        return _IterationName(
            state.iteration + 1, state.epoch + 1, state.iteration_in_epoch + 1, batches
        )

    def _after_iteration(
        self, result: IterationResult, seconds: float, learning_rate: float, plan: list
    ) -> None:
        state = self.state
        where = self._next_iteration(len(plan))
        indices = plan[state.iteration_in_epoch]
        late = isinstance(result.loss, DeviceLoss)
        if not late:
            self._check_loss(result.loss, where, indices)
        epoch = state.epoch + 1  # 1-based, for people
        state.advance(len(plan))
        self._samples_done += result.samples
        throughput = result.samples / max(seconds, 1e-9)
        if late:
            # Read one step late: the previous iteration's loss now, this one's after the
            # next iteration is queued (or at the next sync point); see runner.py.
            report = _LossReport(
                result.loss, where, indices, dataclasses.replace(state), throughput, learning_rate
            )
            previous, self._unreported = self._unreported, report
            if previous is not None:
                self._report_late(previous)
            if not self._losses_read_late:
                with self._sync_point("a trigger that reads the loss"):
                    pass
        elif math.isfinite(result.loss):
            self._report_loss(result.loss, state, throughput, learning_rate)
        if (late or math.isfinite(result.loss)) and self._parameters_trigger_fires():
            with self._sync_point("parameter histograms"):
                for name, array in self.runner.model_state_dict().items():
                    self.train_summary.add_histogram(name, array, state.iteration)
        self.progress.iteration(
            epoch,
            state.iteration,
            self._samples_done,
            self._epoch_samples,
            state.loss if state.loss is not None else math.nan,
            throughput,
            learning_rate,
        )
        if self._validation is not None and self._validation.trigger(state):
            with self._sync_point("validation"):
                self._validate()
        if state.epoch_finished:
            with self._sync_point("the end of an epoch"):
                self.runner.end_epoch(state.epoch, state.epoch_score)
            state.epoch_score = None
            self.progress.end_epoch(
                state.epoch, time.perf_counter() - self._epoch_started, self._epoch_samples
            )
        if self._checkpoint is not None and self._checkpoint.trigger(state):
            with self._sync_point("a checkpoint"):
                self._save_checkpoint()

    def _check_loss(self, loss: float, where: _IterationName, indices: Any) -> None:
        """A finite loss becomes ``state.loss``; a NaN/Inf one is skipped or stops training."""
        if math.isfinite(loss):
            self.state.loss = loss
        else:
            self._nonfinite_loss(loss, where, indices)

    def _report_loss(
        self, loss: float, state: TrainingState, throughput: float, learning_rate: float
    ) -> None:
        """The summary scalars and the callbacks of an iteration with a finite loss; ``state``
        is the training state right after that iteration."""
        if self.train_summary is not None:
            self._write_train_summary(loss, throughput, learning_rate, state)
        for callback in self.callbacks:
            callback.on_iteration_end(state, loss, throughput, learning_rate)

    def _report_late(self, report: _LossReport) -> None:
        """Read a device loss (its step is done or nearly: it was queued a step ago) and
        report it as :meth:`_after_iteration` reports a float loss."""
        loss = report.loss.value()
        self._check_loss(loss, report.where, report.indices)
        if math.isfinite(loss):
            report.state.loss = loss  # the copy was taken before the loss was known
            self._report_loss(loss, report.state, report.throughput, report.learning_rate)

    @contextlib.contextmanager
    def _sync_point(self, reason: str) -> Iterator[None]:
        """Where the host may wait for the device (in the block): first report the loss not
        yet read and raise the first failed check the device kept (``device_waits``)."""
        with device_waits.device_sync_point(reason):
            report, self._unreported = self._unreported, None
            if report is not None:
                self._report_late(report)
            device_waits.raise_deferred_checks()
            yield

    @property
    def _losses_read_late(self) -> bool:
        """Whether device losses may be read one step late: no end, validation or
        checkpoint trigger reads the loss (``MinLoss`` does: then each is read at once)."""
        triggers = [self.end_trigger]
        for plan in (self._validation, self._checkpoint):
            if plan is not None:
                triggers.append(plan.trigger)
        return all(trigger.predictable for trigger in triggers)

    def _parameters_trigger_fires(self) -> bool:
        summary = self.train_summary
        if summary is None:
            return False
        trigger = summary.get_summary_trigger("Parameters")
        return trigger is not None and trigger(self.state)

    def _nonfinite_loss(self, loss: float, where: _IterationName, indices: Any = None) -> None:
        state = self.state
        if self.skip_nonfinite_batches:
            state.skipped_batches += 1
            logger.warning("loss is %s at %s: batch skipped, weights unchanged", loss, where)
            return
        last = ""
        if self.last_checkpoint:
            last = f"; the last checkpoint, {self.last_checkpoint}, is intact"
        raise NonFiniteLossError(
            f"training loss is {loss} at {where}; training stopped and the weights are those "
            f"before this batch{last}. "
            + loss_hints.nonfinite_loss_advice(
                self.criterion, loss_hints.batch_labels(self.training_set, indices)
            )
        )

    def _write_train_summary(
        self, loss: float, throughput: float, learning_rate: float, state: TrainingState
    ) -> None:
        summary = self.train_summary
        candidates = {"Loss": loss, "Throughput": throughput, "LearningRate": learning_rate}
        values = {}
        for tag, value in candidates.items():
            trigger = summary.get_summary_trigger(tag)
            if trigger is not None and trigger(state):
                values[tag] = value
        if values:
            summary.add_scalars(values, state.iteration)

    def _validate(self) -> None:
        plan, state = self._validation, self.state
        results = self.runner.evaluate(plan.dataset, plan.methods, plan.batch_size)
        self.last_validation = results
        state.score = results[0].value
        state.epoch_score = state.score
        if self.validation_summary is not None:
            self.validation_summary.add_scalars(
                {result.name: result.value for result in results}, state.iteration
            )
        self.progress.message(
            f"[Epoch {state.epoch}][Iteration {state.iteration}] validation: "
            + ", ".join(repr(result) for result in results)
        )
        self._observe_validation(results)
        for callback in self.callbacks:
            callback.on_validation_end(state, results)

    # --- checkpoints --------------------------------------------------------------------
    def _dataset_fingerprint(self) -> dict:
        """What must match for a resume to see the same batches (subclasses may extend it)."""
        return resume.dataset_fingerprint(self.training_set, self.batch_size)

    def _save_checkpoint(self) -> None:
        for summary in (self.train_summary, self.validation_summary):
            if summary is not None:
                summary.flush()  # the curves on disk reach at least the checkpoint
        arrays, metadata = resume.capture(
            self.runner,
            self.state,
            self._dataset_fingerprint(),
            self.optim_method,
            self.last_validation,
        )
        arrays.update(resume.pack_best_weights(self._best_weights))
        plan = self._checkpoint
        self.last_checkpoint = checkpoints.save_checkpoint(
            plan.path,
            self.state.iteration,
            arrays,
            metadata,
            overwrite=plan.overwrite,
            run_id=self._run_id,
        )
        self.progress.message(f"checkpoint written: {self.last_checkpoint}")

    def _check_checkpoint_directory(self) -> None:
        """Refuse, before any work, a checkpoint directory this run would damage."""
        plan = self._checkpoint
        if plan is None or self._resume_path is not None or plan.replace_other_runs:
            return
        problem = checkpoints.other_run_checkpoints(plan.path, self._run_id)
        if problem is not None:
            raise checkpoints.CheckpointError(problem)

    def _restore(self, checkpoint: checkpoints.Checkpoint) -> None:
        self._run_id = checkpoint.run_id or self._run_id  # continuing that run
        self.state, self.last_validation = resume.restore(
            self.runner, checkpoint, self._dataset_fingerprint()
        )
        self._best_weights = resume.unpack_best_weights(checkpoint.arrays)
        self.last_checkpoint = checkpoint.path
        self.progress.message(
            f"resumed from {checkpoint.path}: {self.state.epoch} epochs and "
            f"{self.state.iteration} iterations done"
        )
