"""Validation methods: values against NumPy, and partial results that merge exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor
from bigdl_py.data import ArrayDataset
from bigdl_py.train import (
    MAE,
    Loss,
    Top1Accuracy,
    Top5Accuracy,
    TopKAccuracy,
    ValidationResult,
    evaluate_batches,
    validation_batches,
)


@pytest.fixture
def scores_and_labels(rng):
    scores = rng.normal(size=(50, 10)).astype(np.float32)
    labels = rng.integers(0, 10, size=50)
    return scores, labels


def test_top1_counts_argmax_hits(scores_and_labels):
    scores, labels = scores_and_labels
    result = Top1Accuracy()(Tensor(scores), labels)
    assert result.count == 50
    assert result.total == np.sum(np.argmax(scores, axis=1) == labels)
    assert result.value == pytest.approx(result.total / 50)


@pytest.mark.parametrize("method, k", [(Top5Accuracy(), 5), (TopKAccuracy(3), 3)])
def test_top_k_counts_targets_among_the_k_best(scores_and_labels, method, k):
    scores, labels = scores_and_labels
    best = np.argsort(-scores, axis=1)[:, :k]
    expected = np.sum(np.any(best == labels[:, None], axis=1))
    result = method.batch_result(scores, labels)
    assert (result.total, result.count) == (expected, 50)
    assert result.name == f"Top{k}Accuracy"


def test_top_k_with_k_at_least_the_class_count_is_always_right(rng):
    scores = rng.normal(size=(7, 4))
    assert TopKAccuracy(4)(scores, rng.integers(0, 4, 7)).value == 1.0


def test_one_column_output_is_a_binary_probability():
    probabilities = np.array([[0.9], [0.2], [0.6], [0.4]])
    result = Top1Accuracy()(probabilities, np.array([1, 0, 0, 0]))
    assert (result.total, result.count) == (3, 4)


def test_column_vector_targets_are_accepted(scores_and_labels):
    scores, labels = scores_and_labels
    flat = Top1Accuracy()(scores, labels)
    column = Top1Accuracy()(scores, labels[:, None])
    assert flat == column


def test_accuracy_errors_name_the_method_and_the_shapes(rng):
    with pytest.raises(ValueError, match=r"Top1Accuracy: 5 outputs but 4 targets"):
        Top1Accuracy()(rng.normal(size=(5, 3)), np.zeros(4, dtype=int))
    with pytest.raises(ValueError, match=r"Top5Accuracy: expects outputs of shape \(n, classes\)"):
        Top5Accuracy()(rng.normal(size=(2, 3, 4)), np.zeros(2, dtype=int))
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        TopKAccuracy(0)


def test_loss_is_the_sample_weighted_mean_of_the_criterion(scores_and_labels):
    scores, labels = scores_and_labels
    log_probabilities = scores - np.log(np.sum(np.exp(scores), axis=1, keepdims=True))
    result = Loss(nn.NLLLoss())(Tensor(log_probabilities), labels)
    expected = -np.mean(log_probabilities[np.arange(50), labels])
    assert result.value == pytest.approx(expected, rel=1e-5)
    summed = Loss(nn.NLLLoss(reduction="sum"))(Tensor(log_probabilities), labels)
    assert summed.value == pytest.approx(expected, rel=1e-5)


def test_loss_without_a_criterion_says_how_to_get_one(scores_and_labels):
    scores, labels = scores_and_labels
    with pytest.raises(ValueError, match="Loss\\(\\) has no criterion"):
        Loss()(scores, labels)
    criterion = nn.NLLLoss()
    assert Loss().with_default_criterion(criterion).criterion is criterion
    own = Loss(nn.MSELoss())
    assert own.with_default_criterion(criterion) is own
    with pytest.raises(ValueError, match="reduces its batch to one number"):
        Loss(nn.NLLLoss(reduction="none"))


def test_mae_is_the_mean_absolute_error_per_element(rng):
    output, target = rng.normal(size=(6, 2)), rng.normal(size=(6, 2))
    result = MAE()(Tensor(output), target)
    assert result.count == 12
    assert result.value == pytest.approx(np.mean(np.abs(output - target)))
    with pytest.raises(ValueError, match="MAE: output shape"):
        MAE()(output, target[:5])


@pytest.mark.parametrize("method", [Top1Accuracy(), Top5Accuracy(), Loss(nn.NLLLoss()), MAE()])
def test_partial_results_merge_into_the_whole_result(method, rng):
    scores = rng.normal(size=(37, 10))
    log_probabilities = scores - np.log(np.sum(np.exp(scores), axis=1, keepdims=True))
    labels = rng.integers(0, 10, size=37)
    if isinstance(method, MAE):
        labels = rng.normal(size=(37, 10))
    whole = method(Tensor(log_probabilities), labels)
    parts = [
        method(Tensor(log_probabilities[start:stop]), labels[start:stop])
        for start, stop in [(0, 5), (5, 21), (21, 37)]
    ]
    merged = ValidationResult.merge(parts)
    assert merged.count == whole.count
    assert merged.value == pytest.approx(whole.value, rel=1e-6)
    assert sum(parts, method.empty_result()).value == pytest.approx(whole.value, rel=1e-6)


def test_results_of_different_methods_do_not_merge():
    with pytest.raises(ValueError, match="cannot merge a Top1Accuracy result with a Loss"):
        ValidationResult("Top1Accuracy", 1, 2) + ValidationResult("Loss", 1, 2)
    with pytest.raises(ValueError, match="at least one"):
        ValidationResult.merge([])


def test_an_empty_result_has_a_nan_value_and_a_readable_repr():
    assert math.isnan(Top1Accuracy().empty_result().value)
    readable = "Top1Accuracy: 0.8812 (8812 / 10000)"
    assert repr(ValidationResult("Top1Accuracy", 8812, 10000)) == readable
    assert ValidationResult("Loss", 1.5, 4).to_dict() == {
        "name": "Loss",
        "total": 1.5,
        "count": 4,
        "value": 0.375,
    }


def test_evaluate_batches_runs_in_eval_mode_and_restores_training_mode(rng):
    model = nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.9), nn.LogSoftmax())
    dataset = ArrayDataset(rng.normal(size=(10, 4)).astype(np.float32), rng.integers(0, 3, 10))
    model.train()
    first = evaluate_batches(model, validation_batches(dataset, 3), [Top1Accuracy()])
    second = evaluate_batches(model, validation_batches(dataset, 4), [Top1Accuracy()])
    assert first == second  # dropout was off: batching does not change the result
    assert first[0].count == 10
    assert model.training
