"""Learning-rate schedules: the learning rate as a function of training progress.

Protocol
--------
A schedule maps ``(base_lr, iteration, epoch)`` to the learning rate of the next update,
where ``iteration`` is the number of iterations completed so far and ``epoch`` the number of
epochs completed so far (both 0 before training starts). The OptimMethod owns the two
counters; the training loop advances them (see :meth:`OptimMethod.on_iteration_end`), so the
first update uses ``learning_rate(base_lr, 0, 0)`` and the update after ``k`` completed
iterations uses ``learning_rate(base_lr, k, epoch)``. This equals PyTorch's habit of calling
``scheduler.step()`` once after every ``optimizer.step()``.

Most schedules are pure functions of the counters (``factor(iteration, epoch)`` times the base
rate) and have empty state. :class:`Plateau` is the exception: it watches a validation metric
(fed through :meth:`Schedule.observe`) and keeps what it has seen in its state dict, so a
resumed run continues exactly.

Schedules that count steps take ``unit="iteration"`` (BigDL's default) or ``unit="epoch"``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Any

_UNITS = ("iteration", "epoch")


class Schedule:
    """Base class: a learning rate from the base rate and the progress counters."""

    def learning_rate(self, base_lr: float, iteration: int, epoch: int) -> float:
        """The learning rate for the update after ``iteration`` iterations, ``epoch`` epochs."""
        return base_lr * self.factor(iteration, epoch)

    def factor(self, iteration: int, epoch: int) -> float:
        """The multiplier of the base rate (pure schedules implement this)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement factor()")

    def observe(self, metric: float, base_lr: float | None = None) -> None:
        """Take a validation metric into account (only metric-driven schedules use it).

        ``base_lr`` is the optimizer's base rate, for schedules whose decisions depend on it.
        """

    def metric_schedules(self) -> list[Schedule]:
        """The schedules in this one that watch a validation metric (``Plateau``): the
        training loop gives each the metric's direction before training."""
        return []

    def state_dict(self) -> dict:
        """What the schedule learned while training (empty for pure schedules)."""
        return {}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`; refuses keys this schedule does not have."""
        if state:
            raise ValueError(
                f"{type(self).__name__} keeps no state, but load_state_dict got keys "
                f"{sorted(state)}; was the state saved with another schedule?"
            )

    def config(self) -> dict:
        """Constructor arguments plus ``name``, enough for :func:`schedule_from_config`."""
        return {"name": type(self).__name__, **self._arguments()}

    def _arguments(self) -> dict:
        return {}

    def __repr__(self) -> str:
        arguments = ", ".join(f"{key}={value!r}" for key, value in self._arguments().items())
        return f"{type(self).__name__}({arguments})"


def _check_unit(unit: str) -> str:
    if unit not in _UNITS:
        raise ValueError(f"schedule unit must be 'iteration' or 'epoch', got {unit!r}")
    return unit


def _check_positive_int(owner: str, name: str, value: int) -> int:
    if int(value) != value or value < 1:
        raise ValueError(f"{owner}: {name} must be an integer >= 1, got {value!r}")
    return int(value)


def _check_gamma(owner: str, value: float) -> float:
    if not 0.0 < value:
        raise ValueError(f"{owner}: gamma must be > 0, got {value!r}")
    return float(value)


class _CountedSchedule(Schedule):
    """A schedule of one counter: iterations or epochs, chosen by ``unit``."""

    def __init__(self, unit: str):
        self.unit = _check_unit(unit)

    def _count(self, iteration: int, epoch: int) -> int:
        return iteration if self.unit == "iteration" else epoch


class Constant(Schedule):
    """The base learning rate, unchanged (the default schedule)."""

    def factor(self, iteration: int, epoch: int) -> float:
        return 1.0


class Step(_CountedSchedule):
    """``lr = base_lr * gamma ** floor(count / step_size)`` (BigDL Step, torch StepLR)."""

    def __init__(self, step_size: int, gamma: float = 0.1, unit: str = "iteration"):
        super().__init__(unit)
        self.step_size = _check_positive_int("Step", "step_size", step_size)
        self.gamma = _check_gamma("Step", gamma)

    def factor(self, iteration: int, epoch: int) -> float:
        return self.gamma ** (self._count(iteration, epoch) // self.step_size)

    def _arguments(self) -> dict:
        return {"step_size": self.step_size, "gamma": self.gamma, "unit": self.unit}


class EpochStep(Step):
    """BigDL's EpochStep: :class:`Step` counted in epochs."""

    def __init__(self, step_size: int, gamma: float = 0.1):
        super().__init__(step_size, gamma, unit="epoch")

    def _arguments(self) -> dict:
        return {"step_size": self.step_size, "gamma": self.gamma}


class MultiStep(_CountedSchedule):
    """``lr = base_lr * gamma ** (number of milestones <= count)`` (torch MultiStepLR)."""

    def __init__(self, milestones: Sequence[int], gamma: float = 0.1, unit: str = "iteration"):
        super().__init__(unit)
        milestones = [int(m) for m in milestones]
        if milestones != sorted(set(milestones)):
            raise ValueError(f"MultiStep: milestones must be increasing, got {milestones}")
        if milestones and milestones[0] < 0:
            raise ValueError(f"MultiStep: milestones must be >= 0, got {milestones}")
        self.milestones = milestones
        self.gamma = _check_gamma("MultiStep", gamma)

    def factor(self, iteration: int, epoch: int) -> float:
        return self.gamma ** bisect.bisect_right(self.milestones, self._count(iteration, epoch))

    def _arguments(self) -> dict:
        return {"milestones": list(self.milestones), "gamma": self.gamma, "unit": self.unit}


class Exponential(_CountedSchedule):
    """``lr = base_lr * decay_rate ** (count / decay_step)``, floored when ``staircase``.

    BigDL's Exponential; with ``decay_step=1`` it is torch's ExponentialLR(gamma=decay_rate).
    """

    def __init__(
        self, decay_step: int, decay_rate: float, staircase: bool = False, unit: str = "iteration"
    ):
        super().__init__(unit)
        self.decay_step = _check_positive_int("Exponential", "decay_step", decay_step)
        if not decay_rate > 0:
            raise ValueError(f"Exponential: decay_rate must be > 0, got {decay_rate!r}")
        self.decay_rate = float(decay_rate)
        self.staircase = bool(staircase)

    def factor(self, iteration: int, epoch: int) -> float:
        exponent = self._count(iteration, epoch) / self.decay_step
        if self.staircase:
            exponent = math.floor(exponent)
        return self.decay_rate**exponent

    def _arguments(self) -> dict:
        return {
            "decay_step": self.decay_step,
            "decay_rate": self.decay_rate,
            "staircase": self.staircase,
            "unit": self.unit,
        }


class InverseTimeDecay(_CountedSchedule):
    """``lr = base_lr / (1 + decay * count)`` (BigDL's default SGD ``learningRateDecay``)."""

    def __init__(self, decay: float, unit: str = "iteration"):
        super().__init__(unit)
        if not decay >= 0:
            raise ValueError(f"InverseTimeDecay: decay must be >= 0, got {decay!r}")
        self.decay = float(decay)

    def factor(self, iteration: int, epoch: int) -> float:
        return 1.0 / (1.0 + self.decay * self._count(iteration, epoch))

    def _arguments(self) -> dict:
        return {"decay": self.decay, "unit": self.unit}


class Poly(_CountedSchedule):
    """``lr = base_lr * (1 - min(count, max_iteration) / max_iteration) ** power``.

    BigDL's Poly, torch's PolynomialLR(total_iters=max_iteration, power); 0 after the end.
    """

    def __init__(self, power: float, max_iteration: int, unit: str = "iteration"):
        super().__init__(unit)
        if not power >= 0:
            raise ValueError(f"Poly: power must be >= 0, got {power!r}")
        self.power = float(power)
        self.max_iteration = _check_positive_int("Poly", "max_iteration", max_iteration)

    def factor(self, iteration: int, epoch: int) -> float:
        progress = min(self._count(iteration, epoch), self.max_iteration) / self.max_iteration
        return (1.0 - progress) ** self.power

    def _arguments(self) -> dict:
        return {"power": self.power, "max_iteration": self.max_iteration, "unit": self.unit}


class Cosine(_CountedSchedule):
    """Cosine annealing: ``eta_min + (base_lr - eta_min) * (1 + cos(pi * count / T_max)) / 2``.

    torch's CosineAnnealingLR (its closed form): past ``T_max`` the cosine goes on, rising
    back to ``base_lr`` at ``2 * T_max``. ``eta_min`` is an absolute learning rate.
    """

    def __init__(self, T_max: int, eta_min: float = 0.0, unit: str = "iteration"):  # noqa: N803
        super().__init__(unit)
        self.T_max = _check_positive_int("Cosine", "T_max", T_max)
        if not eta_min >= 0:
            raise ValueError(f"Cosine: eta_min must be >= 0, got {eta_min!r}")
        self.eta_min = float(eta_min)

    def learning_rate(self, base_lr: float, iteration: int, epoch: int) -> float:
        phase = math.pi * self._count(iteration, epoch) / self.T_max
        return self.eta_min + (base_lr - self.eta_min) * (1.0 + math.cos(phase)) / 2.0

    def _arguments(self) -> dict:
        return {"T_max": self.T_max, "eta_min": self.eta_min, "unit": self.unit}


CosineAnnealing = Cosine


class Warmup(Schedule):
    """Linear warm-up for ``warmup_iterations`` iterations, then another schedule.

    During warm-up ``lr = base_lr * (start_factor + (1 - start_factor) * iteration /
    warmup_iterations)``; afterwards ``lr = then.learning_rate(base_lr, iteration -
    warmup_iterations, epoch)``, so ``then`` starts from its own iteration 0 (torch's
    ``SequentialLR([LinearLR(start_factor, total_iters=W), then], milestones=[W])``). An
    epoch-based ``then`` sees the epoch counter unchanged.

    Parameters
    ----------
    warmup_iterations : int
        Length of the warm-up, >= 1.
    then : Schedule, optional
        The schedule after warm-up (default :class:`Constant`).
    start_factor : float
        Fraction of ``base_lr`` at iteration 0, in ``(0, 1]``.
    """

    def __init__(
        self, warmup_iterations: int, then: Schedule | None = None, start_factor: float = 0.1
    ):
        self.warmup_iterations = _check_positive_int(
            "Warmup", "warmup_iterations", warmup_iterations
        )
        if not 0.0 < start_factor <= 1.0:
            raise ValueError(f"Warmup: start_factor must be in (0, 1], got {start_factor!r}")
        self.start_factor = float(start_factor)
        self.then = Constant() if then is None else then

    def learning_rate(self, base_lr: float, iteration: int, epoch: int) -> float:
        if iteration < self.warmup_iterations:
            progress = iteration / self.warmup_iterations
            return base_lr * (self.start_factor + (1.0 - self.start_factor) * progress)
        return self.then.learning_rate(base_lr, iteration - self.warmup_iterations, epoch)

    def observe(self, metric: float, base_lr: float | None = None) -> None:
        self.then.observe(metric, base_lr)

    def metric_schedules(self) -> list[Schedule]:
        return self.then.metric_schedules()

    def state_dict(self) -> dict:
        return {f"then.{key}": value for key, value in self.then.state_dict().items()}

    def load_state_dict(self, state: Mapping) -> None:
        foreign = [key for key in state if not key.startswith("then.")]
        if foreign:
            raise ValueError(f"Warmup.load_state_dict: unexpected keys {sorted(foreign)}")
        self.then.load_state_dict({key[len("then.") :]: value for key, value in state.items()})

    def config(self) -> dict:
        return {
            "name": "Warmup",
            "warmup_iterations": self.warmup_iterations,
            "then": self.then.config(),
            "start_factor": self.start_factor,
        }

    def _arguments(self) -> dict:
        return {
            "warmup_iterations": self.warmup_iterations,
            "then": self.then,
            "start_factor": self.start_factor,
        }


def schedule_from_config(config: Mapping[str, Any]) -> Schedule:
    """Rebuild a schedule from :meth:`Schedule.config` (no code is stored or run)."""
    from bigdl_py.optim.plateau import Plateau

    known = {
        cls.__name__: cls
        for cls in (
            Constant, Step, EpochStep, MultiStep, Exponential, InverseTimeDecay, Poly,
            Cosine, Warmup, Plateau,
        )
    }  # fmt: skip
    arguments = dict(config)
    name = arguments.pop("name", None)
    if name not in known:
        raise ValueError(f"unknown schedule {name!r}; known schedules: {sorted(known)}")
    if name == "Warmup":
        arguments["then"] = schedule_from_config(arguments["then"])
    return known[name](**arguments)
