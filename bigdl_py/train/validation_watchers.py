"""What watches validation results, checked once before training starts.

Triggers that fire on validation results (``MaxScore``, ``EarlyStopping``: their
``reads_validation``) and learning-rate schedules that follow a validation metric
(``Plateau``) read the *score*, the first validation method's value, or a named metric.
Without validation they would never act, silently; with the score of a metric read the
wrong way round they act on the worst results. Both are refused here, before any work, and a
``Plateau`` left to follow its metric is given the metric's direction by the same rule as
``EarlyStopping`` (:func:`~bigdl_py.train.metrics.watching_mode`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bigdl_py.optim.schedules import Schedule
from bigdl_py.train.metrics import ValidationMethod, describe_method, watching_mode
from bigdl_py.train.triggers import MaxScore, Trigger, leaf_triggers

_SET_VALIDATION = "call set_validation(EveryEpoch(), validation_set, [Top1Accuracy(), Loss()])"


def check_validation_watchers(
    triggers: Mapping[str, Trigger | None],
    schedule: Schedule,
    methods: Sequence[ValidationMethod] | None,
) -> None:
    """Refuse what could never see validation results or would read the score the wrong way
    round; give each ``Plateau`` that follows its metric the score's direction.

    Parameters
    ----------
    triggers : mapping
        The triggers the loop evaluates, by the setting they were given for (``"end
        trigger"``, ``"checkpoint trigger"``, ...); None for a setting not used.
    schedule : Schedule
        The optim method's learning-rate schedule.
    methods : sequence of ValidationMethod, or None
        The validation methods (the first one's value is the score); None without validation.

    Raises
    ------
    ValueError
        When a trigger or schedule watches validation and none is set; when ``MaxScore``
        watches a score where lower is better; when a ``Plateau``'s mode contradicts the
        score's method, or neither says which way is better.
    """
    readers = [
        (what, leaf)
        for what, trigger in triggers.items()
        if trigger is not None
        for leaf in leaf_triggers(trigger)
        if leaf.reads_validation
    ]
    plateaus = schedule.metric_schedules()
    if methods is None:
        if readers:
            what, leaf = readers[0]
            raise ValueError(
                f"the {what} holds {leaf!r}, which needs validation results, but no validation "
                f"is set: {_SET_VALIDATION}"
            )
        if plateaus:
            raise ValueError(
                f"the learning-rate schedule {plateaus[0]!r} follows the validation score, but "
                f"no validation is set, so it would never change the rate: {_SET_VALIDATION}"
            )
        return
    score_method = methods[0]
    for what, leaf in readers:
        if isinstance(leaf, MaxScore) and score_method.higher_is_better is False:
            raise ValueError(
                f"the {what} holds {leaf!r}, which fires when the score exceeds "
                f"{leaf.max_score!r}, but the score is {describe_method(score_method)}, where "
                "lower is better: put a method where higher is better (an accuracy) first in "
                "set_validation, or use EarlyStopping"
            )
    for plateau in plateaus:
        plateau.follow_mode(
            watching_mode(
                f"{plateau!r} (it follows the score, the first validation method)",
                plateau.mode,
                score_method.name,
                score_method.higher_is_better,
                describe_method(score_method),
            )
        )
