"""``OptimMethod``: an update rule on a flat weight vector, or on one slice of it.

BigDL's contract: ``method.step(weight, gradient)`` updates the 1-D ``weight`` in place from a
gradient of the same shape, with state the instance owns (step count, moment buffers). Every
rule here is element-wise, so N instances that each step one slice of a vector give exactly
the result of one instance stepping the whole vector. That is what lets distributed training
shard the optimizer state N ways. Anything that needs the whole vector (the global gradient
norm) is done outside, by the trainer: see :mod:`bigdl_py.optim.clipping`.

Learning-rate protocol
----------------------
The instance keeps two progress counters for its schedule: ``iteration`` and ``epoch``, the
numbers of iterations and epochs completed so far. The training loop calls

* :meth:`OptimMethod.on_iteration_end` once after each iteration's update, with the number of
  iterations completed (1 after the first), and
* :meth:`OptimMethod.on_epoch_end` once after each epoch, with the number of epochs completed
  (1 after the first) and, when validation ran, the validation score (for :class:`Plateau`).

:meth:`OptimMethod.step` uses ``current_learning_rate()``, which is
``schedule.learning_rate(learning_rate, iteration, epoch)``. So the first update uses the
schedule at ``(0, 0)``, like PyTorch's ``optimizer.step(); scheduler.step()`` loop.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from bigdl_py import backend, kernels, step_graph
from bigdl_py.kernels import optimizers as fused_optimizers
from bigdl_py.optim.schedules import Constant, Schedule

_COUNTER_KEYS = ("step", "iteration", "epoch")
_SCHEDULE_PREFIX = "schedule."


def check_hyper_parameter(
    owner: str,
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Return ``float(value)``, or raise ValueError naming the method, the value and the range."""
    number = float(value)
    too_low = low is not None and (number <= low if low_open else number < low)
    too_high = high is not None and (number >= high if high_open else number > high)
    if math.isnan(number) or too_low or too_high:
        left = "-inf" if low is None else f"{low:g}"
        right = "inf" if high is None else f"{high:g}"
        opening = "(" if low is None or low_open else "["
        closing = ")" if high is None or high_open else "]"
        raise ValueError(
            f"{owner}: invalid {name} {value!r}; it must be in {opening}{left}, {right}{closing}"
        )
    return number


class OptimMethod:
    """Base class of the update rules; subclasses implement only ``_update``.

    Parameters
    ----------
    lr : float
        The base learning rate, >= 0 (the attribute :attr:`learning_rate`).
    schedule : Schedule, optional
        How the learning rate changes with progress (default: constant).

    Attributes
    ----------
    learning_rate : float
        The base learning rate; the schedule scales it (:meth:`current_learning_rate`).
    step_count : int
        Updates done by this instance (PyTorch's per-parameter ``step``).
    iteration, epoch : int
        Progress counters for the schedule (see the module docstring).
    """

    #: Constructor argument names returned by :meth:`hyper_parameters`, in order.
    hyper_parameter_names: tuple[str, ...] = ("lr",)

    def __init__(self, lr: float, schedule: Schedule | None = None):
        self.learning_rate = check_hyper_parameter(type(self).__name__, "learning rate", lr, 0)
        if schedule is not None and not isinstance(schedule, Schedule):
            raise TypeError(
                f"{type(self).__name__}: schedule must be a bigdl_py.optim Schedule, got "
                f"{type(schedule).__name__}"
            )
        self.schedule = Constant() if schedule is None else schedule
        self.step_count = 0
        self.iteration = 0
        self.epoch = 0
        self._state: dict[str, Any] = {}
        # On a device with a fused kernel: the count of applied updates and the learning
        # rate of the step, kept there.
        self._applied_steps = None
        self._always = None
        self._device_learning_rate = None

    # --- the update rule (subclasses) ---------------------------------------------------
    def _state_names(self) -> tuple[str, ...]:
        """Names of the per-element state arrays this configuration keeps."""
        return ()

    def _initial_state(self, weight: Any) -> dict[str, Any]:
        """Fresh state arrays for ``weight`` (default: zeros for every state name)."""
        xp = backend.array_module(weight)
        return {name: xp.zeros_like(weight) for name in self._state_names()}

    def _update(self, weight: Any, gradient: Any, learning_rate: float) -> None:
        """Update ``weight`` in place; ``self.step_count`` already counts this update."""
        raise NotImplementedError(f"{type(self).__name__} does not implement _update()")

    # --- stepping -----------------------------------------------------------------------
    def step(self, weight: Any, gradient: Any, apply_if: Any = None) -> Any:
        """Update ``weight`` in place from ``gradient`` with the scheduled learning rate.

        Parameters
        ----------
        weight : numpy or cupy array, 1-D, floating
            The vector (or the slice of it) this instance is responsible for.
        gradient : array of the same shape and array library
            Not modified. A gradient of another float dtype (fp16 off the wire) is cast to the
            weight's dtype first, so the update and the state keep the weight's precision.
        apply_if : 0-d boolean device array, optional
            Device arrays only: update only if it holds True, decided on the device without
            reading it back (a training step on a GPU gates its update on a finite loss so).
            Where it is False, the weight and the per-element state keep their values;
            ``step_count`` still counts the call (the host cannot know).

        Returns
        -------
        The same ``weight`` array.

        Notes
        -----
        On a device a rule with a fused kernel reads its learning rate and step count there,
        so a training step captured in a CUDA graph (``bigdl_py.step_graph``) replays it
        with each step's schedule; a rule without one cannot be captured.
        """
        self._check_arrays(weight, gradient)
        if gradient.dtype != weight.dtype:
            gradient = gradient.astype(weight.dtype)
        self._ensure_state(weight)
        fused = self._fused_kernel is not None and kernels.route(weight, gradient) is not None
        if not fused and backend.is_device_array(weight):
            backend.refuse_in_capture(
                f"{type(self).__name__}'s update without a fused kernel (it takes the "
                "learning rate and step count from the host)"
            )
        step_graph.each_step(self._count_step)
        if fused:
            self._fused_step(weight, gradient, apply_if)
        elif apply_if is None:
            self._update(weight, gradient, self.current_learning_rate())
        else:
            self._gated_update(weight, gradient, apply_if)
        return weight

    #: The fused kernel of this rule on a device (``bigdl_py.kernels.optimizers``), or None.
    _fused_kernel = None

    def _count_step(self) -> None:
        self.step_count += 1

    def _fused_arguments(self, weight: Any, learning_rate: Any) -> tuple:
        """The kernel's arguments between the gradient and ``steps`` (rules with a kernel);
        ``learning_rate`` is the 0-d float64 device array the kernel reads it from."""
        raise NotImplementedError

    def _fused_step(self, weight: Any, gradient: Any, apply_if: Any) -> None:
        """The update as one kernel, the step count kept on the device: where ``apply_if``
        is False nothing changes, and the count of applied updates (bias corrections,
        SGD's first step) does not grow either. The learning rate goes to the device
        before each step (``step_graph.fill_each_step``)."""
        xp = backend.array_module(weight)
        applied_steps = getattr(self, "_applied_steps", None)
        if applied_steps is None or backend.device_of(applied_steps) != backend.device_of(weight):
            # Created once per device from the host's count (this call already counted).
            self._applied_steps = xp.asarray(self.step_count - 1, dtype=np.int64)
            self._always = xp.asarray(True)
            self._device_learning_rate = xp.zeros((), dtype=np.float64)
        applied = self._always if apply_if is None else apply_if
        self._applied_steps += applied
        step_graph.fill_each_step(self._device_learning_rate, self.current_learning_rate)
        arguments = self._fused_arguments(weight, self._device_learning_rate)
        kernel = self._fused_kernel
        fused_optimizers.update(
            kernel,
            fused_optimizers.REFERENCES[kernel],
            weight,
            gradient,
            *arguments,
            self._applied_steps,
            applied,
        )

    def applied_step_count(self) -> int:
        """Updates applied so far: ``step_count`` less the updates a device skipped
        (``apply_if`` False); reading a device's count waits for it."""
        applied = getattr(self, "_applied_steps", None)  # None too for an old pickled one
        return self.step_count if applied is None else int(applied)

    def _gated_update(self, weight: Any, gradient: Any, apply_if: Any) -> None:
        """``_update`` where ``apply_if`` holds, decided on the device: the weight and the
        state are copied first and copied back where it does not hold."""
        if not backend.is_device_array(weight):
            raise ValueError(
                f"{type(self).__name__}.step: apply_if is for device arrays; on the host "
                "decide before calling step"
            )
        xp = backend.array_module(weight)
        targets = [weight, *self._state.values()]
        before = [array.copy() for array in targets]
        self._update(weight, gradient, self.current_learning_rate())
        skipped = ~apply_if
        for target, kept in zip(targets, before, strict=True):
            xp.copyto(target, kept, where=skipped)

    def step_slice(self, weight_slice: Any, gradient_slice: Any, start: int) -> Any:
        """Step one slice starting at global offset ``start`` (the offset matters only to
        :class:`GroupedOptimMethod`; a plain method treats the slice as its whole vector)."""
        return self.step(weight_slice, gradient_slice)

    def _check_arrays(self, weight: Any, gradient: Any) -> None:
        owner = type(self).__name__
        if getattr(weight, "ndim", None) != 1:
            raise ValueError(
                f"{owner}.step: weight must be a 1-D array (a flat vector or a slice of one), "
                f"got shape {getattr(weight, 'shape', type(weight).__name__)}"
            )
        if tuple(gradient.shape) != tuple(weight.shape):
            raise ValueError(
                f"{owner}.step: gradient shape {tuple(gradient.shape)} does not match weight "
                f"shape {tuple(weight.shape)}"
            )
        if backend.device_of(weight) != backend.device_of(gradient):
            raise ValueError(
                f"{owner}.step: weight is on {backend.device_of(weight)} but gradient is on "
                f"{backend.device_of(gradient)}"
            )
        if not backend.is_floating(weight.dtype):
            raise ValueError(f"{owner}.step: weight must be floating point, got {weight.dtype}")

    def _ensure_state(self, weight: Any) -> None:
        """Create the state on the first step; after a load, move it to ``weight``'s device."""
        if not self._state:
            self._state = self._initial_state(weight)
            return
        target = backend.device_of(weight)
        for name, value in self._state.items():
            if value.shape != weight.shape:
                raise ValueError(
                    f"{type(self).__name__}.step: state {name!r} holds {value.shape[0]} "
                    f"elements but the weight has {weight.shape[0]}; one instance serves one "
                    "vector or slice, always the same one"
                )
            if backend.device_of(value) != target or value.dtype != weight.dtype:
                moved = backend.to_device(value, target)
                self._state[name] = moved.astype(weight.dtype, copy=False)

    # --- learning rate and its schedule -------------------------------------------------
    def current_learning_rate(self) -> float:
        """The learning rate the next :meth:`step` will use (the schedule applied)."""
        return self.schedule.learning_rate(self.learning_rate, self.iteration, self.epoch)

    def on_iteration_end(self, iteration: int | None = None) -> None:
        """Tell the schedule an iteration finished; ``iteration`` = iterations completed.

        ``None`` counts one more iteration.
        """
        self.schedule_step(iteration=self.iteration + 1 if iteration is None else iteration)

    def on_epoch_end(self, epoch: int | None = None, validation_score: float | None = None) -> None:
        """Tell the schedule an epoch finished; ``epoch`` = epochs completed (``None``: +1).

        ``validation_score``, when given, is passed to the schedule's ``observe``.
        """
        epoch = self.epoch + 1 if epoch is None else epoch
        self.schedule_step(epoch=epoch, metric=validation_score)

    def schedule_step(
        self, iteration: int | None = None, epoch: int | None = None, metric: float | None = None
    ) -> None:
        """Set the progress counters that are given and feed ``metric`` to the schedule."""
        if iteration is not None:
            self.iteration = int(iteration)
        if epoch is not None:
            self.epoch = int(epoch)
        if metric is not None:
            self.schedule.observe(metric, base_lr=self.learning_rate)

    # --- hyperparameters ----------------------------------------------------------------
    def hyper_parameters(self) -> dict[str, Any]:
        """Constructor arguments (without ``schedule``), e.g. ``{'lr': 0.1, 'momentum': 0.9}``."""
        return {
            name: self.learning_rate if name == "lr" else getattr(self, name)
            for name in self.hyper_parameter_names
        }

    def with_hyper_parameters(self, **overrides: Any) -> OptimMethod:
        """A new instance of this class with some hyperparameters changed and fresh state.

        The schedule is copied and the progress counters carried over, so the new instance
        follows the same learning-rate curve (scaled to its own ``lr``).
        """
        unknown = sorted(set(overrides) - set(self.hyper_parameter_names))
        if unknown:
            raise ValueError(
                f"{type(self).__name__} has no hyperparameters {unknown}; it has "
                f"{list(self.hyper_parameter_names)}"
            )
        arguments = {**self.hyper_parameters(), **overrides}
        clone = type(self)(**arguments, schedule=copy.deepcopy(self.schedule))
        clone.iteration, clone.epoch = self.iteration, self.epoch
        return clone

    def config(self) -> dict[str, Any]:
        """Name, hyperparameters and schedule config (see ``optim_method_from_config``)."""
        hyper_parameters = {
            name: list(value) if isinstance(value, tuple) else value
            for name, value in self.hyper_parameters().items()
        }
        return {
            "name": type(self).__name__,
            "hyper_parameters": hyper_parameters,
            "schedule": self.schedule.config(),
        }

    # --- state --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Counters, per-element state (NumPy copies) and the schedule's state.

        Keys: ``step``, ``iteration``, ``epoch`` (ints); one 1-D array per state buffer (absent
        before the first step); ``schedule.<key>`` for the schedule's own state. Shards of one
        vector concatenate into the whole vector's state (``concatenate_state_dicts``).
        """
        state: dict[str, Any] = {
            "step": self.applied_step_count(),
            "iteration": self.iteration,
            "epoch": self.epoch,
        }
        for name, value in self._state.items():
            state[name] = np.array(backend.as_numpy(value), copy=True)
        for key, value in self.schedule.state_dict().items():
            state[_SCHEDULE_PREFIX + key] = value
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` exactly (arrays are copied; moved to the weights' device
        on the next step).

        Raises
        ------
        ValueError
            On missing counters, unknown keys, or state buffers of another configuration.
        """
        owner = type(self).__name__
        missing = [key for key in _COUNTER_KEYS if key not in state]
        if missing:
            raise ValueError(f"{owner}.load_state_dict: missing keys {missing}")
        array_keys = [k for k in state if k not in _COUNTER_KEYS and not k.startswith("schedule.")]
        expected = set(self._state_names())
        if array_keys and set(array_keys) != expected:
            raise ValueError(
                f"{owner}.load_state_dict: state buffers {sorted(array_keys)} do not match this "
                f"configuration's {sorted(expected)} (hyperparameters {self.hyper_parameters()})"
            )
        lengths = {np.shape(state[key]) for key in array_keys}
        if len(lengths) > 1 or any(len(shape) != 1 for shape in lengths):
            raise ValueError(
                f"{owner}.load_state_dict: state buffers must be 1-D and of one length, got "
                f"shapes { {key: np.shape(state[key]) for key in array_keys} }"
            )
        self.schedule.load_state_dict(
            {
                key[len(_SCHEDULE_PREFIX) :]: value
                for key, value in state.items()
                if key.startswith(_SCHEDULE_PREFIX)
            }
        )
        self.step_count = int(state["step"])
        self._applied_steps = None  # made again from step_count on the next device step
        self.iteration = int(state["iteration"])
        self.epoch = int(state["epoch"])
        self._state = {
            name: np.array(backend.as_numpy(state[name]), copy=True)
            for name in self._state_names()
            if array_keys
        }

    def __repr__(self) -> str:
        arguments = ", ".join(f"{key}={value!r}" for key, value in self.hyper_parameters().items())
        if not isinstance(self.schedule, Constant):
            arguments += f", schedule={self.schedule!r}"
        return f"{type(self).__name__}({arguments})"
