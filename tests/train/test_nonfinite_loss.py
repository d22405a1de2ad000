"""A NaN/Inf loss stops training with an error naming where, or skips the batch if asked."""

from __future__ import annotations

import numpy as np
import pytest
from train_models import make_blobs, make_classifier

from bigdl_py import nn
from bigdl_py.data import ArrayDataset
from bigdl_py.optim import SGD
from bigdl_py.train import (
    LocalOptimizer,
    MaxEpoch,
    MaxIteration,
    NonFiniteLossError,
    SeveralIteration,
    load_checkpoint,
)

BATCH = 20


@pytest.fixture
def poisoned():
    """120 samples in stored order; sample 45 (batch 3 of every epoch) holds a NaN."""
    features, labels = make_blobs(samples=120)
    features[45, 2] = np.nan
    return ArrayDataset(features, labels, batch_size=BATCH, shuffle=False, check_finite=False)


def optimizer(dataset, end_trigger, **options):
    return LocalOptimizer(
        make_classifier(),
        dataset,
        nn.NLLLoss(),
        SGD(lr=0.1, momentum=0.9),
        batch_size=BATCH,
        end_trigger=end_trigger,
        progress=False,
        **options,
    )


def test_a_nan_loss_stops_training_naming_iteration_and_epoch(poisoned, tmp_path):
    stopped = optimizer(poisoned, MaxEpoch(2))
    stopped.set_checkpoint(tmp_path, SeveralIteration(1))
    where = r"loss is nan at iteration 3 \(epoch 1, batch 3 of 6\)"
    with pytest.raises(NonFiniteLossError, match=where):
        stopped.optimize()
    assert stopped.state.iteration == 2
    # The weights are those before the bad batch, and so is the last checkpoint.
    clean = optimizer(poisoned, MaxIteration(2))
    clean.optimize()
    for name, value in clean.model.state_dict().items():
        np.testing.assert_array_equal(stopped.model.state_dict()[name], value)
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.iteration == 2
    np.testing.assert_array_equal(
        checkpoint.arrays["model/0.weight"], clean.model.state_dict()["0.weight"]
    )


def test_the_error_mentions_the_intact_checkpoint_and_the_remedies(poisoned, tmp_path):
    stopped = optimizer(poisoned, MaxEpoch(1)).set_checkpoint(tmp_path, SeveralIteration(2))
    with pytest.raises(NonFiniteLossError) as raised:
        stopped.optimize()
    message = str(raised.value)
    assert "checkpoint-00000002.json, is intact" in message
    assert "skip_nonfinite_batches=True" in message and "lower the learning rate" in message.lower()


def test_skipping_leaves_the_weights_unchanged_and_counts_the_batches(poisoned):
    skipping = optimizer(poisoned, MaxIteration(3), skip_nonfinite_batches=True)
    skipping.optimize()
    clean = optimizer(poisoned, MaxIteration(2))
    clean.optimize()
    for name, value in clean.model.state_dict().items():
        np.testing.assert_array_equal(skipping.model.state_dict()[name], value)
    assert skipping.state.skipped_batches == 1
    for key, value in clean.optim_method.state_dict().items():
        if key != "iteration":  # the schedule still counts the skipped iteration
            np.testing.assert_array_equal(skipping.optim_method.state_dict()[key], value)


def test_skipping_carries_on_to_the_end(poisoned, caplog):
    skipping = optimizer(poisoned, MaxEpoch(3), skip_nonfinite_batches=True)
    with caplog.at_level("WARNING", logger="bigdl_py.train"):
        skipping.optimize()
    assert skipping.state.epoch == 3 and skipping.state.skipped_batches == 3
    assert np.isfinite(skipping.state.loss)
    assert "loss is nan at iteration 3 (epoch 1, batch 3 of 6): batch skipped" in caplog.text


def test_an_infinite_loss_is_caught_too():
    features, _ = make_blobs(samples=40)
    targets = np.zeros((40, 1), dtype=np.float32)
    targets[0] = 1e30  # its squared error overflows float32 to inf
    dataset = ArrayDataset(features, targets, batch_size=BATCH, shuffle=False)
    regression = LocalOptimizer(
        nn.Linear(8, 1),
        dataset,
        nn.MSELoss(),
        SGD(lr=0.1),
        end_trigger=MaxEpoch(1),
        progress=False,
    )
    with np.errstate(over="ignore"), pytest.raises(NonFiniteLossError, match="inf at iteration 1 "):
        regression.optimize()
