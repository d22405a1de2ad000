"""Validation methods check labels as training does (issue 16, item 7)."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor
from bigdl_py.train import Loss, Top1Accuracy, Top5Accuracy


@pytest.fixture
def scores(rng):
    return np.log(rng.dirichlet(np.ones(6), size=8)).astype(np.float32)


@pytest.mark.parametrize("method", [Top1Accuracy(), Top5Accuracy()])
def test_whole_number_float_labels_score_as_their_integers(scores, rng, method):
    labels = rng.integers(0, 6, len(scores))
    as_floats = method.batch_result(Tensor(scores), labels.astype(np.float64))
    assert as_floats == method.batch_result(Tensor(scores), labels)


@pytest.mark.parametrize("method", [Top1Accuracy(), Top5Accuracy()])
@pytest.mark.parametrize("bad", [2.5, np.nan])
def test_fractional_labels_are_refused_not_truncated(scores, method, bad):
    labels = np.zeros(len(scores))
    labels[3] = bad
    with pytest.raises(ValueError, match=r"target .* at index 3 is not a class index"):
        method.batch_result(Tensor(scores), labels)


@pytest.mark.parametrize("method", [Top1Accuracy(), Top5Accuracy()])
@pytest.mark.parametrize("bad", [6, -1])
def test_out_of_range_labels_are_refused_not_scored_as_misses(scores, method, bad):
    labels = np.zeros(len(scores), dtype=np.int64)
    labels[5] = bad
    with pytest.raises(ValueError, match=rf"target {bad} at index 5 is outside the 6 classes"):
        method.batch_result(Tensor(scores), labels)


def test_loss_takes_whole_number_floats_and_refuses_fractions(scores, rng):
    labels = rng.integers(0, 6, len(scores))
    loss = Loss(nn.NLLLoss())
    assert loss.batch_result(Tensor(scores), labels.astype(np.float64)) == loss.batch_result(
        Tensor(scores), labels
    )
    fractional = labels.astype(np.float64)
    fractional[1] = 0.5
    with pytest.raises(ValueError, match="0.5 at index 1 is not a class index"):
        loss.batch_result(Tensor(scores), fractional)


def test_loss_keeps_soft_labels_for_cross_entropy(scores, rng):
    soft = rng.dirichlet(np.ones(6), size=len(scores)).astype(np.float32)
    result = Loss(nn.CrossEntropyLoss()).batch_result(Tensor(scores), soft)
    assert result.count == len(scores) and np.isfinite(result.value)
