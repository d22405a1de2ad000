"""EarlyStopping on DistriOptimizer: the shared loop's stop, restore and resume on Spark."""

from __future__ import annotations

import numpy as np
import pytest
from blob_data import blob_optimizer, blobs, flat

from bigdl_py import nn
from bigdl_py.data import ArrayDataset
from bigdl_py.optim import SGD
from bigdl_py.train import (
    EarlyStopping,
    Loss,
    MaxEpoch,
    SeveralIteration,
    evaluate_batches,
    list_checkpoints,
    load_checkpoint,
    validation_batches,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _validation():
    features, labels = blobs(seed=5, samples=60)
    return features, np.random.default_rng(6).permutation(labels)  # loss soon rises


def _optimizer(spark, update):
    optimizer = blob_optimizer(
        SGD(lr=0.5),
        end_trigger=MaxEpoch(40) | EarlyStopping("Loss", patience=2),
        num_partitions=2,
        update=update,
        spark=spark,
    )
    optimizer.set_validation(SeveralIteration(4), _validation(), [Loss()])
    return optimizer


@pytest.mark.parametrize("update", ["sharded", "replicated"])
def test_stop_restore_and_resume_match_a_straight_run(spark, tmp_path, update):
    straight = _optimizer(spark, update)
    straight.set_checkpoint(tmp_path, SeveralIteration(4), overwrite=False)
    with straight:
        straight_model = straight.optimize()
    state = straight.state
    assert state.epoch < 40 and state.validations_since_best == 2
    (loss,) = evaluate_batches(
        straight_model,
        validation_batches(ArrayDataset(*_validation(), shuffle=False), 30),
        [Loss(nn.NLLLoss())],
    )
    assert loss.value == pytest.approx(state.best_score, rel=1e-5)  # the best weights came back

    # Resume after the best validation: the best weights come from the checkpoint's arrays.
    after_best = state.best_iteration + 4
    manifest = next(
        path for path in list_checkpoints(tmp_path) if load_checkpoint(path).iteration == after_best
    )
    resumed = _optimizer(spark, update).resume_from(manifest)
    with resumed:
        resumed_model = resumed.optimize()
    assert resumed.state == state
    np.testing.assert_allclose(flat(resumed_model), flat(straight_model), rtol=1e-6, atol=1e-7)


def test_restore_best_brings_back_batch_norm_statistics(spark):
    # The best validation's running statistics come back with its weights: evaluation (which
    # normalises with them) gives the best score again.
    from blob_data import BATCH, CLASSES, FEATURES

    from bigdl_py.spark import DistriOptimizer

    with nn.init.seeded(1):
        model = nn.Sequential(
            nn.Linear(FEATURES, 16),
            nn.BatchNorm1d(16),
            nn.Tanh(),
            nn.Linear(16, CLASSES),
            nn.LogSoftmax(),
        )
    optimizer = DistriOptimizer(
        model,
        blobs(),
        nn.NLLLoss(),
        SGD(lr=0.5),
        batch_size=BATCH,
        end_trigger=MaxEpoch(40) | EarlyStopping("Loss", patience=2),
        num_partitions=2,
        update="replicated",
        progress=False,
        spark=spark,
    )
    optimizer.set_validation(SeveralIteration(4), _validation(), [Loss()])
    with optimizer:
        trained = optimizer.optimize()
    assert optimizer.state.validations_since_best == 2
    (loss,) = evaluate_batches(
        trained,
        validation_batches(ArrayDataset(*_validation(), shuffle=False), 30),
        [Loss(nn.NLLLoss())],
    )
    assert loss.value == pytest.approx(optimizer.state.best_score, rel=1e-5)
