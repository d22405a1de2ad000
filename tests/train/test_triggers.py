"""Triggers are pure functions of the training state."""

from __future__ import annotations

import math

import pytest

from bigdl_py.train import (
    And,
    EveryEpoch,
    MaxEpoch,
    MaxIteration,
    MaxScore,
    MinLoss,
    Or,
    SeveralIteration,
    TrainingState,
)
from bigdl_py.train.triggers import check_trigger


def state(**fields) -> TrainingState:
    return TrainingState(**fields)


def test_max_epoch_fires_once_that_many_epochs_are_complete():
    trigger = MaxEpoch(2)
    assert not trigger(state(epoch=0))
    assert not trigger(state(epoch=1, iteration=50))
    assert trigger(state(epoch=2))
    assert trigger(state(epoch=3))


def test_max_iteration_counts_iterations_over_the_whole_run():
    trigger = MaxIteration(10)
    assert not trigger(state(iteration=9, epoch=5))
    assert trigger(state(iteration=10))


def test_every_epoch_fires_only_right_after_an_epoch_ends():
    trigger = EveryEpoch()
    assert trigger(state(epoch=1, iteration=8, epoch_finished=True))
    assert not trigger(state(epoch=1, iteration=9, iteration_in_epoch=1))


def test_several_iteration_fires_on_multiples_and_never_before_the_first_iteration():
    trigger = SeveralIteration(3)
    fired = [i for i in range(0, 10) if trigger(state(iteration=i))]
    assert fired == [3, 6, 9]


def test_min_loss_needs_a_loss_below_the_threshold():
    trigger = MinLoss(0.1)
    assert not trigger(state())  # no loss yet
    assert not trigger(state(loss=0.1))
    assert trigger(state(loss=0.099))
    assert not trigger(state(loss=math.nan))


def test_max_score_needs_a_validation_score_above_the_threshold():
    trigger = MaxScore(0.9)
    assert not trigger(state())
    assert not trigger(state(score=0.9))
    assert trigger(state(score=0.95))


def test_and_or_combine_and_the_operators_build_them():
    after_two_epochs_and_low_loss = And(MaxEpoch(2), MinLoss(0.5))
    assert not after_two_epochs_and_low_loss(state(epoch=2, loss=0.6))
    assert after_two_epochs_and_low_loss(state(epoch=2, loss=0.4))
    either = Or(MaxIteration(100), MinLoss(0.5))
    assert either(state(iteration=100, loss=1.0))
    assert either(state(iteration=1, loss=0.4))
    assert not either(state(iteration=1, loss=1.0))
    combined = MaxEpoch(3) | (MaxIteration(5) & MinLoss(1.0))
    assert isinstance(combined, Or)
    assert combined(state(iteration=5, loss=0.5))
    assert not combined(state(iteration=5, loss=2.0))


def test_triggers_keep_no_memory_between_calls():
    trigger = Or(EveryEpoch(), SeveralIteration(4))
    checkpoint_state = state(epoch=1, iteration=8, epoch_finished=True)
    assert [trigger(checkpoint_state) for _ in range(3)] == [True, True, True]


@pytest.mark.parametrize("make", [MaxEpoch, MaxIteration, SeveralIteration])
@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3"])
def test_counting_triggers_refuse_non_positive_or_non_integer_counts(make, bad):
    with pytest.raises(ValueError, match="integer >= 1"):
        make(bad)


def test_combinations_refuse_non_triggers_and_nothing():
    with pytest.raises(TypeError, match="combines Triggers"):
        And(MaxEpoch(1), 3)
    with pytest.raises(ValueError, match="at least one"):
        Or()


def test_check_trigger_names_the_setting():
    with pytest.raises(TypeError, match="end_trigger must be a Trigger"):
        check_trigger(10, "end_trigger")


def test_state_round_trips_through_json_values_including_non_finite_floats():
    original = state(epoch=2, iteration=17, iteration_in_epoch=1, loss=math.inf, score=0.5)
    restored = TrainingState.from_dict(original.to_dict())
    assert restored == original
    assert all(not isinstance(v, float) or math.isfinite(v) for v in original.to_dict().values())


def test_reprs_read_like_the_constructor_calls():
    assert repr(MaxEpoch(3) | MinLoss(0.5)) == "Or(MaxEpoch(3), MinLoss(0.5))"
