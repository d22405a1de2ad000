"""What watches validation results (MaxScore, EarlyStopping, the Plateau schedule): refused
where it could never see them or would read the score the wrong way round, and Plateau's mode
taken from the score's validation method."""

from __future__ import annotations

import itertools

import pytest
from train_models import make_blobs, make_classifier

from bigdl_py import nn
from bigdl_py.optim import SGD, Plateau, Warmup
from bigdl_py.train import (
    EarlyStopping,
    EveryEpoch,
    LocalOptimizer,
    Loss,
    MaxEpoch,
    MaxScore,
    SeveralIteration,
    Top1Accuracy,
    TrainSummary,
    ValidationMethod,
    ValidationResult,
)

EPOCHS = 4


FEATURES, LABELS = make_blobs(samples=150)


def optimizer_for(end_trigger=None, schedule=None):
    return LocalOptimizer(
        make_classifier(),
        (FEATURES[:120], LABELS[:120]),
        nn.NLLLoss(),
        SGD(lr=0.1, schedule=schedule),
        batch_size=30,
        end_trigger=MaxEpoch(EPOCHS) if end_trigger is None else end_trigger,
        progress=False,
    )


class Rising(ValidationMethod):
    """A metric that grows at every validation (one batch each), better when higher."""

    higher_is_better = True
    calls = itertools.count(1)

    def batch_result(self, output, target):
        return ValidationResult(self.name, float(next(self.calls)), 1)


class Undeclared(Rising):
    higher_is_better = None


def validation_set():
    return FEATURES[120:], LABELS[120:]  # one batch of 30: one batch_result per validation


# --- Plateau follows the score's method ------------------------------------------------------
@pytest.mark.parametrize(
    "wrap", [lambda p: p, lambda p: Warmup(2, then=p)], ids=["plain", "warmup"]
)
def test_plateau_follows_a_score_where_higher_is_better(wrap):
    # With the old default (mode='min') every rise was a bad epoch: patience=0 cut the rate
    # at each of them.
    plateau = Plateau(patience=0, factor=0.5)
    optimizer = optimizer_for(schedule=wrap(plateau))
    optimizer.set_validation(EveryEpoch(), validation_set(), [Rising(), Loss()], batch_size=30)
    optimizer.optimize()
    assert plateau.mode == "max" and optimizer.state.epoch == EPOCHS
    assert optimizer.optim_method.current_learning_rate() == pytest.approx(0.1)


def test_plateau_follows_a_loss_score_downwards():
    plateau = Plateau(patience=0, factor=0.5)
    optimizer = optimizer_for(schedule=plateau)
    optimizer.set_validation(EveryEpoch(), validation_set(), [Loss(), Rising()])
    optimizer.optimize()
    assert plateau.mode == "min"


def test_a_plateau_mode_that_contradicts_the_score_is_refused_before_any_work():
    optimizer = optimizer_for(schedule=Plateau(mode="min"))
    optimizer.set_validation(EveryEpoch(), validation_set(), [Top1Accuracy(), Loss()])
    with pytest.raises(
        ValueError, match=r"Plateau.*mode='min' contradicts the metric 'Top1Accuracy'.*'max'"
    ):
        optimizer.optimize()
    assert optimizer.state.iteration == 0


def test_a_plateau_on_a_score_of_no_declared_direction_needs_a_mode():
    optimizer = optimizer_for(schedule=Plateau())
    optimizer.set_validation(EveryEpoch(), validation_set(), [Undeclared()])
    with pytest.raises(ValueError, match=r"Undeclared\(\).*declares no direction.*mode="):
        optimizer.optimize()
    optimizer.set_optim_method(SGD(lr=0.1, schedule=Plateau(mode="max")))
    optimizer.optimize()  # a given mode is taken as is


def test_a_plateau_without_validation_is_refused():
    optimizer = optimizer_for(schedule=Plateau(mode="min"))
    with pytest.raises(ValueError, match=r"Plateau.*follows the validation score.*set_validation"):
        optimizer.optimize()


# --- MaxScore -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "trigger", [MaxScore(0.5), EveryEpoch() | MaxScore(0.5), MaxScore(0.5) & EveryEpoch()]
)
def test_max_score_cannot_start_a_validation(trigger):
    # Before the first validation there is no score, so it never fires and none would run.
    optimizer = optimizer_for()
    with pytest.raises(
        ValueError, match=r"validation trigger holds MaxScore\(0.5\), which fires on validation"
    ):
        optimizer.set_validation(trigger, validation_set(), [Top1Accuracy()])


@pytest.mark.parametrize(
    "where, reader",
    [
        ("end trigger", MaxScore(0.9)),
        ("end trigger", EarlyStopping()),
        ("checkpoint trigger", MaxScore(0.9)),  # EarlyStopping: refused there when set
        ("summary trigger", MaxScore(0.9)),
    ],
)
def test_a_validation_reader_without_validation_is_refused_before_any_work(where, reader, tmp_path):
    if where == "end trigger":
        optimizer = optimizer_for(end_trigger=MaxEpoch(EPOCHS) | reader)
    elif where == "checkpoint trigger":
        optimizer = optimizer_for().set_checkpoint(tmp_path / "checkpoints", reader)
    else:
        summary = TrainSummary(str(tmp_path), "run").set_summary_trigger("Loss", reader)
        optimizer = optimizer_for().set_train_summary(summary)
    with pytest.raises(ValueError, match=rf"the {where}.* holds .*needs validation results"):
        optimizer.optimize()
    assert optimizer.state.iteration == 0


def test_max_score_on_a_score_where_lower_is_better_is_refused():
    # MaxScore(0.9) on a loss fires as soon as the loss is above 0.9: at once, not at the end.
    optimizer = optimizer_for(end_trigger=MaxEpoch(EPOCHS) | MaxScore(0.9))
    optimizer.set_validation(EveryEpoch(), validation_set(), [Loss(), Top1Accuracy()])
    with pytest.raises(ValueError, match=r"MaxScore\(0.9\).*the score is Loss\(.*lower is better"):
        optimizer.optimize()
    assert optimizer.state.iteration == 0


def test_max_score_with_validation_ends_training():
    optimizer = optimizer_for(end_trigger=MaxEpoch(50) | MaxScore(0.9))
    optimizer.set_validation(SeveralIteration(2), validation_set(), [Top1Accuracy()])
    optimizer.optimize()
    assert optimizer.state.score > 0.9 and optimizer.state.epoch < 50
