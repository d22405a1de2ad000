"""``EarlyStopping``: end training when a validation metric stops improving.

The trigger keeps the rule of :mod:`bigdl_py.train.triggers` that a trigger is a pure
function of the :class:`~bigdl_py.train.triggers.TrainingState`: the best score so far, the
iteration it was seen at and the count of validations since then are fields of the state,
which the training loop updates after each validation through :meth:`EarlyStopping.observe`.
So they go into every checkpoint's JSON with the rest of the state, and a resumed run stops
exactly where an uninterrupted one would. The weights of the best validation (for
``restore_best``) are kept by the loop and stored in the checkpoint's array file.

Example::

    optimizer.set_validation(EveryEpoch(), validation_set, [Loss(), Top1Accuracy()])
    optimizer.set_end_when(MaxEpoch(50) | EarlyStopping("Top1Accuracy", patience=3))

The mode (``"max"`` for an accuracy, ``"min"`` for a loss) follows the metric.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

from bigdl_py.train.metrics import (
    ValidationMethod,
    ValidationResult,
    describe_method,
    own_method_class,
    watching_mode,
)
from bigdl_py.train.triggers import TrainingState, Trigger, leaf_triggers

_MODES = ("min", "max")


class EarlyStopping(Trigger):
    """Fires once the validation ``metric`` has not improved for ``patience`` validations.

    Use it as (part of) the end trigger, with validation set on the optimizer
    (``set_validation``); as a validation, checkpoint or summary trigger it is refused (it
    counts validations, so it could never start one, and it fires only as training ends). A
    validation improves on the best so far when its value is lower than ``best - min_delta``
    (``mode="min"``) or higher than ``best + min_delta`` (``mode="max"``); the first
    validation always does. A NaN value never improves.

    Parameters
    ----------
    metric : str
        Name of a validation method given to ``set_validation`` (``"Loss"``,
        ``"Top1Accuracy"``, ``"MAE"``, ...).
    mode : {"min", "max"}, optional
        Whether lower or higher values are better. By default it follows the metric's
        declared direction (``ValidationMethod.higher_is_better``): ``"max"`` for the
        accuracies, ``"min"`` for ``Loss`` and ``MAE``. A mode that contradicts that direction
        is refused. A validation method of your own that declares no direction needs an
        explicit mode (checked when training starts): guessing one would stop training on
        the wrong side and restore the worst model.
    patience : int
        Validations without improvement after which training ends (>= 1).
    min_delta : float
        The least change that counts as an improvement (>= 0).
    restore_best : bool
        When training ends (by this trigger or another), give the model the weights it had
        at the best validation.

    Raises
    ------
    ValueError
        For a mode other than "min"/"max" or one that contradicts bigdl_py's own metric of
        that name, a patience below 1 or a negative ``min_delta``.
    """

    predictable = True  # it reads only what validation changes
    end_only = True  # its record of validations is kept for the end trigger alone
    reads_validation = True

    def __init__(
        self,
        metric: str = "Loss",
        mode: str | None = None,
        patience: int = 3,
        min_delta: float = 0.0,
        restore_best: bool = True,
    ):
        if not isinstance(metric, str) or not metric:
            raise ValueError(
                f"EarlyStopping: metric must be a validation method's name, got {metric!r}"
            )
        if mode is not None and mode not in _MODES:
            raise ValueError(f"EarlyStopping: mode must be 'min', 'max' or None, got {mode!r}")
        if isinstance(patience, bool) or not isinstance(patience, numbers.Integral) or patience < 1:
            raise ValueError(f"EarlyStopping: patience must be an integer >= 1, got {patience!r}")
        min_delta = float(min_delta)
        if not math.isfinite(min_delta) or min_delta < 0:
            raise ValueError(
                f"EarlyStopping: min_delta must be a finite number >= 0, got {min_delta!r}"
            )
        self.metric = metric
        self.mode = mode
        self.patience = int(patience)
        self.min_delta = min_delta
        self.restore_best = bool(restore_best)
        own = own_method_class(metric)
        if own is not None:
            self.mode = watching_mode(
                "EarlyStopping", mode, metric, own.higher_is_better, f"bigdl_py's {metric}"
            )

    def check_direction(self, method: ValidationMethod) -> None:
        """Take the mode from ``method`` (the one computing :attr:`metric`), or check it.

        Raises
        ------
        ValueError
            When the mode contradicts the method's declared direction, or when neither
            the mode nor the method's ``higher_is_better`` says which way is better.
        """
        self.mode = watching_mode(
            "EarlyStopping",
            self.mode,
            self.metric,
            method.higher_is_better,
            describe_method(method),
        )

    def __call__(self, state: TrainingState) -> bool:
        return state.validations_since_best >= self.patience

    def improves(self, value: float, best: float | None) -> bool:
        """Whether ``value`` is an improvement on ``best`` (None: nothing seen yet)."""
        if math.isnan(value):
            return False
        if best is None:
            return True
        if self.mode is None:
            raise ValueError(
                f"{self!r}: the direction of {self.metric!r} is not known yet; pass mode= "
                "(or let the training loop take it from the validation method)"
            )
        if self.mode == "min":
            return value < best - self.min_delta
        return value > best + self.min_delta

    def metric_value(self, results: Sequence[ValidationResult]) -> float:
        """This trigger's metric among one validation's results.

        Raises
        ------
        ValueError
            When no validation method of that name ran, naming those that did.
        """
        for result in results:
            if result.name == self.metric:
                return float(result.value)
        raise ValueError(
            f"{self!r} watches the validation metric {self.metric!r}, but validation computes "
            f"{[result.name for result in results]}; pass metric= one of those, or add that "
            "validation method to set_validation"
        )

    def observe(self, state: TrainingState, results: Sequence[ValidationResult]) -> bool:
        """Record one validation in ``state``; return whether it is the new best."""
        value = self.metric_value(results)
        if self.improves(value, state.best_score):
            state.best_score = value
            state.best_iteration = state.iteration
            state.validations_since_best = 0
            return True
        state.validations_since_best += 1
        return False

    def __repr__(self) -> str:
        return (
            f"EarlyStopping(metric={self.metric!r}, mode={self.mode!r}, patience={self.patience}, "
            f"min_delta={self.min_delta!r}, restore_best={self.restore_best})"
        )


def find_early_stopping(trigger: Trigger | None) -> EarlyStopping | None:
    """The one :class:`EarlyStopping` inside ``trigger`` (through And/Or), or None.

    Raises
    ------
    ValueError
        When there are several: they would share one best-so-far record.
    """
    if trigger is None:
        return None
    found = [leaf for leaf in leaf_triggers(trigger) if isinstance(leaf, EarlyStopping)]
    if len(found) > 1:
        raise ValueError(
            f"the end trigger holds {len(found)} EarlyStopping triggers ({found}); use one"
        )
    return found[0] if found else None
