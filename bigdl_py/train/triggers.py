"""Triggers: when to stop, validate, checkpoint or write a summary (BigDL's ``Trigger``).

A trigger is a pure function of a :class:`TrainingState`: it keeps no memory of its own.
That is what makes a resumed run behave exactly like an uninterrupted one — the state is in
the checkpoint, and nothing else is needed to decide what fires next.

The training loop builds the state after every iteration (and once before the first, so an
end trigger that is already met ends training before any work). Counters count what is
*completed*: after the first iteration of a run ``iteration == 1``; after the first epoch
``epoch == 1``.

Triggers combine with ``And``/``Or`` or with the ``&``/``|`` operators::

    end = MaxEpoch(10) | MinLoss(0.05)
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass


@dataclass
class TrainingState:
    """Where training stands; what every trigger looks at.

    Attributes
    ----------
    epoch : int
        Epochs completed.
    iteration : int
        Iterations completed over the whole run (a skipped non-finite batch counts).
    iteration_in_epoch : int
        Iterations completed in the current (unfinished) epoch; the position in its batches.
    epoch_finished : bool
        True right after the iteration that completed an epoch.
    loss : float or None
        Training loss of the last iteration (None before the first).
    score : float or None
        Value of the first validation method at the last validation (None before one ran).
    epoch_score : float or None
        The last validation score obtained during the current epoch; given to the learning-rate
        schedule at the epoch's end (e.g. ``Plateau``) and then cleared.
    skipped_batches : int
        Batches skipped because their loss was NaN or infinite (``skip_nonfinite_batches``).
    best_score : float or None
        The best value so far of an ``EarlyStopping`` trigger's metric (None: none yet).
    best_iteration : int or None
        The iteration of the validation that gave ``best_score``.
    validations_since_best : int
        Validations since ``best_score`` without an improvement (``EarlyStopping``).
    """

    epoch: int = 0
    iteration: int = 0
    iteration_in_epoch: int = 0
    epoch_finished: bool = False
    loss: float | None = None
    score: float | None = None
    epoch_score: float | None = None
    skipped_batches: int = 0
    best_score: float | None = None
    best_iteration: int | None = None
    validations_since_best: int = 0

    def advance(self, batches_in_epoch: int) -> None:
        """Count one finished iteration of an epoch of ``batches_in_epoch`` batches."""
        self.iteration += 1
        self.iteration_in_epoch += 1
        self.epoch_finished = self.iteration_in_epoch >= batches_in_epoch
        if self.epoch_finished:
            self.epoch += 1
            self.iteration_in_epoch = 0

    def to_dict(self) -> dict:
        """Plain JSON values (non-finite floats as strings, since JSON has none)."""
        return {key: _encode_float(value) for key, value in vars(self).items()}

    @classmethod
    def from_dict(cls, values: dict) -> TrainingState:
        return cls(**{key: _decode_float(value) for key, value in values.items()})


def _encode_float(value):
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # 'nan', 'inf', '-inf'
    return value


def _decode_float(value):
    return float(value) if isinstance(value, str) else value


class Trigger:
    """Base class: ``trigger(state)`` says whether to act now.

    ``predictable`` says that the trigger reads only the iteration and epoch counts (and the
    validation score, which changes only when validation runs): the loop may then work out
    ahead of time where it fires and run the iterations before it in one go. A subclass
    that reads the training loss, or anything else, keeps the default False.

    ``end_only`` marks a trigger that means something only as (part of) the end trigger
    (``EarlyStopping``); :func:`check_trigger` refuses it anywhere else.

    ``reads_validation`` marks a trigger that fires on validation results (``MaxScore``,
    ``EarlyStopping``): it cannot start a validation (before one it never fires, so none
    would run), so :func:`check_trigger` refuses it in a validation trigger, and the training
    loop refuses it elsewhere when no validation is set.
    """

    predictable: bool = False
    end_only: bool = False
    reads_validation: bool = False

    def __call__(self, state: TrainingState) -> bool:
        raise NotImplementedError(f"{type(self).__name__} does not implement __call__")

    def __and__(self, other: Trigger) -> And:
        return And(self, other)

    def __or__(self, other: Trigger) -> Or:
        return Or(self, other)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _check_count(owner: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{owner}: expected an integer >= 1, got {value!r}")
    return int(value)


class MaxEpoch(Trigger):
    """Fires once ``max_epoch`` epochs are completed (an end trigger)."""

    predictable = True

    def __init__(self, max_epoch: int):
        self.max_epoch = _check_count("MaxEpoch", max_epoch)

    def __call__(self, state: TrainingState) -> bool:
        return state.epoch >= self.max_epoch

    def __repr__(self) -> str:
        return f"MaxEpoch({self.max_epoch})"


class MaxIteration(Trigger):
    """Fires once ``max_iteration`` iterations are completed (an end trigger)."""

    predictable = True

    def __init__(self, max_iteration: int):
        self.max_iteration = _check_count("MaxIteration", max_iteration)

    def __call__(self, state: TrainingState) -> bool:
        return state.iteration >= self.max_iteration

    def __repr__(self) -> str:
        return f"MaxIteration({self.max_iteration})"


class EveryEpoch(Trigger):
    """Fires right after each epoch ends (for validation, checkpoints, summaries)."""

    predictable = True

    def __call__(self, state: TrainingState) -> bool:
        return state.epoch_finished


class SeveralIteration(Trigger):
    """Fires after every ``interval``-th iteration (iterations counted over the whole run)."""

    predictable = True

    def __init__(self, interval: int):
        self.interval = _check_count("SeveralIteration", interval)

    def __call__(self, state: TrainingState) -> bool:
        return state.iteration > 0 and state.iteration % self.interval == 0

    def __repr__(self) -> str:
        return f"SeveralIteration({self.interval})"


class MinLoss(Trigger):
    """Fires once the last training loss is below ``min_loss`` (an end trigger)."""

    def __init__(self, min_loss: float):
        self.min_loss = float(min_loss)

    def __call__(self, state: TrainingState) -> bool:
        return state.loss is not None and state.loss < self.min_loss

    def __repr__(self) -> str:
        return f"MinLoss({self.min_loss!r})"


class MaxScore(Trigger):
    """Fires once the last validation score (first validation method) exceeds ``max_score``.

    An end (or checkpoint, or summary) trigger: it needs ``set_validation``, whose first
    method must be one where higher is better (an accuracy); as a validation trigger it is
    refused, since it could never fire before the first validation.
    """

    predictable = True
    reads_validation = True

    def __init__(self, max_score: float):
        self.max_score = float(max_score)

    def __call__(self, state: TrainingState) -> bool:
        return state.score is not None and state.score > self.max_score

    def __repr__(self) -> str:
        return f"MaxScore({self.max_score!r})"


class _Combination(Trigger):
    def __init__(self, *triggers: Trigger):
        if not triggers:
            raise ValueError(f"{type(self).__name__} needs at least one trigger")
        for trigger in triggers:
            if not isinstance(trigger, Trigger):
                raise TypeError(
                    f"{type(self).__name__} combines Triggers, got {type(trigger).__name__}"
                )
        self.triggers = tuple(triggers)
        self.predictable = all(trigger.predictable for trigger in self.triggers)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(t) for t in self.triggers)})"


class And(_Combination):
    """Fires when every one of its triggers fires."""

    def __call__(self, state: TrainingState) -> bool:
        return all(trigger(state) for trigger in self.triggers)


class Or(_Combination):
    """Fires when any of its triggers fires."""

    def __call__(self, state: TrainingState) -> bool:
        return any(trigger(state) for trigger in self.triggers)


def leaf_triggers(trigger: Trigger) -> list[Trigger]:
    """The triggers inside ``trigger`` through any nesting of And/Or (itself if none)."""
    leaves, pending = [], [trigger]
    while pending:
        current = pending.pop()
        if isinstance(current, _Combination):
            pending.extend(reversed(current.triggers))
        else:
            leaves.append(current)
    return leaves


def check_trigger(
    trigger, what: str, *, end: bool = False, starts_validation: bool = False
) -> Trigger:
    """Return ``trigger``, or raise an error naming the setting it was given for.

    ``end`` says it is the end trigger; ``starts_validation`` that it is a validation
    trigger.

    Raises
    ------
    TypeError
        When ``trigger`` is not a Trigger.
    ValueError
        When it holds an end-only trigger (``EarlyStopping``) and ``end`` is False, or a
        trigger that reads validation results (``MaxScore``) and ``starts_validation``.
    """
    if not isinstance(trigger, Trigger):
        raise TypeError(
            f"{what} must be a Trigger (MaxEpoch, MaxIteration, EveryEpoch, SeveralIteration, "
            f"MinLoss, MaxScore, EarlyStopping, And, Or), got {type(trigger).__name__}: {trigger!r}"
        )
    if not end:
        for leaf in leaf_triggers(trigger):
            if leaf.end_only:
                raise ValueError(
                    f"{what} holds {leaf!r}, which can only end training (it would never "
                    f"fire here): pass it to set_end_when, e.g. MaxEpoch(50) | {leaf!r}, and "
                    f"use a trigger such as EveryEpoch() or SeveralIteration(n) as the {what}"
                )
    if starts_validation:
        for leaf in leaf_triggers(trigger):
            if leaf.reads_validation:
                raise ValueError(
                    f"{what} holds {leaf!r}, which fires on validation results, so it cannot "
                    "start a validation (before the first one it never fires): use EveryEpoch() "
                    f"or SeveralIteration(n) as the {what}, and {leaf!r} in set_end_when"
                )
    return trigger
