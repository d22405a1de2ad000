"""A NaN loss from a batch with no counted target says so (issue 16, item 18)."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.optim import SGD
from bigdl_py.train import LocalOptimizer, MaxIteration
from bigdl_py.train.loop import NonFiniteLossError
from bigdl_py.train.loss_hints import DEFAULT_ADVICE, nonfinite_loss_advice


def test_every_target_ignored_is_named_not_the_learning_rate(rng):
    features = rng.normal(size=(8, 4)).astype(np.float32)
    labels = np.full(8, -100)
    optimizer = LocalOptimizer(
        nn.Sequential(nn.Linear(4, 3), nn.LogSoftmax()),
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1),
        batch_size=4,
        end_trigger=MaxIteration(2),
        progress=False,
    )
    with pytest.raises(NonFiniteLossError, match="No target of this batch counted") as error:
        optimizer.optimize()
    assert "ignore_index=-100" in str(error.value) and "learning rate is not" in str(error.value)


def test_other_nonfinite_losses_keep_the_usual_advice():
    labels = np.array([1, -100, 2])
    assert nonfinite_loss_advice(nn.NLLLoss(), labels) == DEFAULT_ADVICE
    assert nonfinite_loss_advice(nn.MSELoss(), None) == DEFAULT_ADVICE
    assert nonfinite_loss_advice(nn.NLLLoss(reduction="sum"), np.full(3, -100)) == DEFAULT_ADVICE
