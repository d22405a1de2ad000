"""EarlyStopping: the rule, its direction, the stop, restore_best, checkpoints and resume,
clear errors (misplaced triggers, a NaN validation)."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from train_models import make_blobs, make_classifier

from bigdl_py import nn
from bigdl_py.data import ArrayDataset
from bigdl_py.optim import SGD
from bigdl_py.train import (
    MAE,
    EarlyStopping,
    EveryEpoch,
    LocalOptimizer,
    Loss,
    MaxEpoch,
    SeveralIteration,
    Top1Accuracy,
    Top5Accuracy,
    TopKAccuracy,
    TrainingCallback,
    TrainingState,
    TrainSummary,
    ValidationMethod,
    ValidationResult,
    list_checkpoints,
    load_checkpoint,
)

PATIENCE = 2


def result(name: str, value: float) -> ValidationResult:
    return ValidationResult(name, value, 1)


class History(TrainingCallback):
    """Every validation's iteration, the value of ``metric``, and the model's weights then."""

    def __init__(self, model, metric="Loss"):
        self.model = model
        self.metric = metric
        self.records: list[tuple[int, float, dict]] = []

    def on_validation_end(self, state, results):
        value = next(r.value for r in results if r.name == self.metric)
        weights = {k: np.array(v, copy=True) for k, v in self.model.state_dict().items()}
        self.records.append((state.iteration, value, weights))


def expected_stop(values: list[float], patience: int, min_delta: float = 0.0, higher=False):
    """(index of the best validation, index of the stopping one or None), by the rule."""
    sign = -1.0 if higher else 1.0  # the rule for "max" is the rule for "min" on -value
    best, best_index, since = None, None, 0
    for index, value in enumerate(sign * v for v in values):
        if best is None or value < best - min_delta:
            best, best_index, since = value, index, 0
        else:
            since += 1
            if since >= patience:
                return best_index, index
    return best_index, None


def overfitting_optimizer(model, end_trigger, **options):
    """Validation labels are random: the validation loss soon rises while training improves."""
    features, labels = make_blobs(samples=240)
    rng = np.random.default_rng(5)
    validation = (features[:120], rng.permutation(labels[:120]))
    optimizer = LocalOptimizer(
        model,
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.5),
        batch_size=30,
        end_trigger=end_trigger,
        progress=False,
        **options,
    )
    optimizer.set_validation(SeveralIteration(4), validation, [Loss(), Top1Accuracy()])
    return optimizer


# --- the rule -------------------------------------------------------------------------------


def test_observe_tracks_the_best_and_counts_validations_since():
    stopper = EarlyStopping("Top1Accuracy", mode="max", patience=2, min_delta=0.05)
    state = TrainingState()
    values = [0.5, 0.52, 0.6, 0.61, 0.58]  # +0.02 and +0.01 are below min_delta
    improved = []
    for iteration, value in enumerate(values, start=1):
        state.iteration = iteration
        improved.append(
            stopper.observe(state, [result("Loss", 1.0), result("Top1Accuracy", value)])
        )
    assert improved == [True, False, True, False, False]
    assert state.best_score == 0.6 and state.best_iteration == 3
    assert state.validations_since_best == 2 and stopper(state)


def test_nan_never_improves_and_min_mode_needs_a_lower_value():
    stopper = EarlyStopping(patience=1)
    state = TrainingState()
    assert stopper.observe(state, [result("Loss", 2.0)])
    assert not stopper.observe(state, [result("Loss", math.nan)])
    assert stopper(state)
    assert stopper.observe(state, [result("Loss", 1.5)]) and not stopper(state)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"mode": "lowest"}, "mode"),
        ({"patience": 0}, "patience"),
        ({"patience": 1.5}, "patience"),
        ({"min_delta": -0.1}, "min_delta"),
        ({"metric": ""}, "metric"),
    ],
)
def test_bad_settings_raise_naming_the_setting(kwargs, word):
    with pytest.raises(ValueError, match=word):
        EarlyStopping(**kwargs)


@pytest.mark.parametrize(
    "metric, mode",
    [("Top1Accuracy", "max"), ("Top5Accuracy", "max"), ("Top3Accuracy", "max")]
    + [("Loss", "min"), ("MAE", "min")],
)
def test_the_mode_follows_the_direction_of_bigdl_pys_metrics(metric, mode):
    assert EarlyStopping(metric).mode == mode
    assert EarlyStopping(metric, mode=mode).mode == mode


@pytest.mark.parametrize("metric, wrong", [("Top1Accuracy", "min"), ("Loss", "max")])
def test_a_mode_that_contradicts_the_metric_is_refused_naming_both(metric, wrong):
    with pytest.raises(ValueError, match=rf"mode='{wrong}' contradicts the metric '{metric}'"):
        EarlyStopping(metric, mode=wrong)


def test_bigdl_pys_validation_methods_each_declare_a_direction():
    methods = [Top1Accuracy(), Top5Accuracy(), TopKAccuracy(3), Loss(), MAE()]
    classes = set()
    pending = [ValidationMethod]
    while pending:  # every subclass in bigdl_py.train.metrics, so a new one cannot forget
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__ == "bigdl_py.train.metrics" and cls is not ValidationMethod:
            classes.add(cls)
    assert classes == {type(method) for method in methods} | {TopKAccuracy}
    for method in methods:
        assert isinstance(method.higher_is_better, bool), method
        assert EarlyStopping(method.name).mode == ("max" if method.higher_is_better else "min")
    assert ValidationMethod.higher_is_better is None  # a user's own method: undeclared


def test_the_state_round_trips_through_json():
    state = TrainingState(best_score=0.25, best_iteration=8, validations_since_best=1)
    assert TrainingState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


# --- in the loop ------------------------------------------------------------------------------


def test_training_stops_after_patience_and_returns_the_best_weights():
    model = make_classifier(seed=1)
    history = History(model)
    stopper = EarlyStopping("Loss", patience=PATIENCE)
    optimizer = overfitting_optimizer(model, MaxEpoch(60) | stopper)
    optimizer.add_callback(history)
    trained = optimizer.optimize()
    losses = [loss for _, loss, _ in history.records]
    best_index, stop_index = expected_stop(losses, PATIENCE)
    assert stop_index is not None, f"validation loss kept improving: {losses}"
    assert stop_index == len(losses) - 1  # it stopped right at that validation
    assert optimizer.state.epoch < 60
    assert optimizer.state.best_iteration == history.records[best_index][0]
    assert optimizer.state.best_score == pytest.approx(losses[best_index])
    for name, value in trained.state_dict().items():
        np.testing.assert_array_equal(value, history.records[best_index][2][name], err_msg=name)


def test_without_restore_best_the_last_weights_stay():
    model = make_classifier(seed=1)
    history = History(model)
    optimizer = overfitting_optimizer(
        model, MaxEpoch(60) | EarlyStopping(patience=PATIENCE, restore_best=False)
    )
    optimizer.add_callback(history)
    trained = optimizer.optimize()
    best_index, _ = expected_stop([loss for _, loss, _ in history.records], PATIENCE)
    assert best_index != len(history.records) - 1
    for name, value in trained.state_dict().items():
        np.testing.assert_array_equal(value, history.records[-1][2][name], err_msg=name)


def test_top1_accuracy_stops_on_its_own_direction_and_restores_the_most_accurate_weights():
    # EarlyStopping("Top1Accuracy") once meant mode="min": it stopped while accuracy rose and
    # restore_best gave back the least accurate weights. Here a slowly learning model's
    # accuracy on noisy labels rises for a few validations, then slips.
    features, labels = make_blobs(samples=360)
    validation_labels = labels[240:].copy()
    rng = np.random.default_rng(0)
    noisy = rng.random(120) < 0.3
    validation_labels[noisy] = rng.integers(0, 3, int(noisy.sum()))
    model = make_classifier(seed=1)
    stopper = EarlyStopping("Top1Accuracy", patience=PATIENCE)
    optimizer = LocalOptimizer(
        model,
        (features[:240], labels[:240]),
        nn.NLLLoss(),
        SGD(lr=0.05),
        batch_size=30,
        end_trigger=MaxEpoch(60) | stopper,
        progress=False,
    )
    optimizer.set_validation(
        SeveralIteration(2), (features[240:], validation_labels), [Loss(), Top1Accuracy()]
    )
    history = History(model, "Top1Accuracy")
    trained = optimizer.add_callback(history).optimize()
    assert stopper.mode == "max"
    accuracies = [value for _, value, _ in history.records]
    best_index, stop_index = expected_stop(accuracies, PATIENCE, higher=True)
    assert stop_index == len(accuracies) - 1, accuracies
    assert expected_stop(accuracies, PATIENCE)[1] < stop_index  # "min" stops while it rises
    assert best_index < stop_index and accuracies[best_index] > accuracies[0]
    assert optimizer.state.best_score == max(accuracies)
    for name, value in trained.state_dict().items():
        np.testing.assert_array_equal(value, history.records[best_index][2][name], err_msg=name)


class Agreement(ValidationMethod):
    """A user's own metric: the share of top-1 hits, with no declared direction."""

    def batch_result(self, output, target):
        hits = Top1Accuracy().batch_result(output, target)
        return ValidationResult(self.name, hits.total, hits.count)


class DeclaredAgreement(Agreement):
    higher_is_better = True


def test_a_users_metric_without_a_direction_needs_a_mode():
    model = make_classifier()
    optimizer = overfitting_optimizer(model, MaxEpoch(2) | EarlyStopping("Agreement"))
    optimizer.set_validation(SeveralIteration(4), make_blobs(samples=60), [Agreement()])
    with pytest.raises(ValueError, match=r"Agreement\(\).*declares no direction.*mode='max'"):
        optimizer.optimize()
    assert optimizer.state.iteration == 0  # refused before any work

    history = History(model, "Agreement")
    optimizer.add_callback(history)
    optimizer.set_end_when(MaxEpoch(2) | EarlyStopping("Agreement", mode="max", patience=50))
    optimizer.optimize()
    assert optimizer.state.best_score == max(value for _, value, _ in history.records)


def test_a_users_declared_direction_gives_the_mode_and_refuses_the_other():
    stopper = EarlyStopping("DeclaredAgreement")
    assert stopper.mode is None  # not one of bigdl_py's names: known once validation is
    optimizer = overfitting_optimizer(make_classifier(), MaxEpoch(1) | stopper)
    optimizer.set_validation(SeveralIteration(4), make_blobs(samples=60), [DeclaredAgreement()])
    optimizer.optimize()
    assert stopper.mode == "max"

    contrary = EarlyStopping("DeclaredAgreement", mode="min")
    optimizer = overfitting_optimizer(make_classifier(), MaxEpoch(1) | contrary)
    optimizer.set_validation(SeveralIteration(4), make_blobs(samples=60), [DeclaredAgreement()])
    with pytest.raises(ValueError, match=r"mode='min' contradicts the metric 'DeclaredAgreement'"):
        optimizer.optimize()


def test_no_validation_is_a_clear_error():
    features, labels = make_blobs()
    optimizer = LocalOptimizer(
        make_classifier(),
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1),
        batch_size=30,
        end_trigger=MaxEpoch(3) | EarlyStopping(),
        progress=False,
    )
    with pytest.raises(ValueError, match="set_validation"):
        optimizer.optimize()


def test_a_metric_that_validation_does_not_compute_is_a_clear_error():
    optimizer = overfitting_optimizer(make_classifier(), EarlyStopping("MAE"))
    with pytest.raises(ValueError, match=r"'MAE'.*\['Loss', 'Top1Accuracy'\]"):
        optimizer.optimize()


def test_two_early_stoppings_are_refused():
    optimizer = overfitting_optimizer(make_classifier(), EarlyStopping() | EarlyStopping())
    with pytest.raises(ValueError, match="2 EarlyStopping"):
        optimizer.optimize()


def test_the_best_so_far_survives_a_resume(tmp_path):
    straight_model = make_classifier(seed=2)
    history = History(straight_model)
    optimizer = overfitting_optimizer(straight_model, MaxEpoch(60) | EarlyStopping(patience=3))
    optimizer.add_callback(history)
    optimizer.set_checkpoint(tmp_path, SeveralIteration(4), overwrite=False)
    straight = optimizer.optimize()
    straight_state = optimizer.state
    losses = [loss for _, loss, _ in history.records]
    best_index, stop_index = expected_stop(losses, 3)
    assert stop_index is not None and stop_index - best_index == 3
    # Resume from the checkpoint one validation after the best: the best weights are then
    # only in that checkpoint's arrays, and the count of validations since is 1.
    resume_iteration = history.records[best_index + 1][0]
    manifest = next(
        path
        for path in list_checkpoints(tmp_path)
        if load_checkpoint(path).iteration == resume_iteration
    )
    checkpoint = load_checkpoint(manifest)
    assert checkpoint.metadata["state"]["validations_since_best"] == 1
    assert checkpoint.metadata["state"]["best_iteration"] == history.records[best_index][0]
    assert any(name.startswith("best_model/") for name in checkpoint.arrays)

    resumed_optimizer = overfitting_optimizer(
        make_classifier(seed=9), MaxEpoch(60) | EarlyStopping(patience=3)
    )
    resumed = resumed_optimizer.resume_from(manifest).optimize()
    assert resumed_optimizer.state == straight_state
    for name, value in straight.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[name], value, err_msg=name)


# --- misplaced: it can only end training ------------------------------------------------------


@pytest.mark.parametrize(
    "trigger", [EarlyStopping(), EveryEpoch() | EarlyStopping(), EveryEpoch() & EarlyStopping()]
)
def test_as_a_validation_checkpoint_or_summary_trigger_it_is_refused(trigger, tmp_path):
    # It counts validations, so as the validation trigger it would never start one; as any
    # other trigger it would fire at most once, as training ends: never silently.
    optimizer = overfitting_optimizer(make_classifier(), MaxEpoch(1))
    with pytest.raises(ValueError, match=r"validation trigger holds EarlyStopping.*set_end_when"):
        optimizer.set_validation(trigger, make_blobs(samples=60), [Loss()])
    with pytest.raises(ValueError, match=r"checkpoint trigger holds EarlyStopping.*set_end_when"):
        optimizer.set_checkpoint(tmp_path, trigger)
    with pytest.raises(ValueError, match="checkpoint trigger holds EarlyStopping"):
        optimizer.set_checkpoint(trigger, tmp_path)  # BigDL's argument order
    summary = TrainSummary(str(tmp_path), "run")
    with pytest.raises(ValueError, match=r"summary trigger of 'Loss' holds EarlyStopping"):
        summary.set_summary_trigger("Loss", trigger)
    optimizer.set_end_when(MaxEpoch(1) & EarlyStopping())  # where it belongs, in any nesting


# --- a NaN validation -------------------------------------------------------------------------


def test_nan_validations_before_any_best_are_reported_not_a_format_crash(caplog):
    # A NaN feature row, let through with check_finite=False (the opt-out the data check
    # suggests), makes every validation loss NaN: no best value exists to quote.
    features, labels = make_blobs(samples=60, seed=0)
    features[3, 0] = np.nan
    validation = ArrayDataset(features, labels, shuffle=False, check_finite=False)
    model = make_classifier(seed=1)
    history = History(model)
    optimizer = overfitting_optimizer(model, MaxEpoch(30) | EarlyStopping(patience=PATIENCE))
    optimizer.set_validation(SeveralIteration(4), validation, [Loss()])
    optimizer.add_callback(history).set_progress(True, bar=False)
    caplog.set_level(logging.INFO, logger="bigdl_py.train")
    trained = optimizer.optimize()
    assert all(math.isnan(value) for _, value, _ in history.records)
    assert len(history.records) == PATIENCE and optimizer.state.best_score is None
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("early stop")]
    assert notes[-1] == (
        f"early stopping: Loss is NaN and has no best value yet; {PATIENCE} of {PATIENCE} "
        "validations without improvement; training stops"
    )
    for name, value in trained.state_dict().items():  # no best weights: the last ones stay
        np.testing.assert_array_equal(value, history.records[-1][2][name], err_msg=name)
