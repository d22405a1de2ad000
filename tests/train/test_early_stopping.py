"""EarlyStopping: the rule, the stop, restore_best, checkpoints and resume, clear errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from train_models import make_blobs, make_classifier

from bigdl_py import nn
from bigdl_py.optim import SGD
from bigdl_py.train import (
    EarlyStopping,
    LocalOptimizer,
    Loss,
    MaxEpoch,
    SeveralIteration,
    Top1Accuracy,
    TrainingCallback,
    TrainingState,
    ValidationResult,
    list_checkpoints,
    load_checkpoint,
)

PATIENCE = 2


def result(name: str, value: float) -> ValidationResult:
    return ValidationResult(name, value, 1)


class History(TrainingCallback):
    """Every validation's iteration, its Loss, and the model's weights at that moment."""

    def __init__(self, model):
        self.model = model
        self.records: list[tuple[int, float, dict]] = []

    def on_validation_end(self, state, results):
        loss = next(r.value for r in results if r.name == "Loss")
        weights = {k: np.array(v, copy=True) for k, v in self.model.state_dict().items()}
        self.records.append((state.iteration, loss, weights))


def expected_stop(losses: list[float], patience: int, min_delta: float = 0.0):
    """(index of the best validation, index of the stopping one or None), by the rule."""
    best, best_index, since = None, None, 0
    for index, value in enumerate(losses):
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
