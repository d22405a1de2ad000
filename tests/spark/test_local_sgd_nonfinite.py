"""LocalSGD stops at a non-finite loss as the exact modes do: at that iteration, with the
weights from before it and the last checkpoint intact — although the partitions whose
losses were finite trained on until their round's end before anyone knew."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from blob_data import BATCH, blobs, flat

from bigdl_py import nn
from bigdl_py.data.sample import split_bounds
from bigdl_py.optim import SGD
from bigdl_py.spark import DistriOptimizer, LocalSGD
from bigdl_py.train import MaxIteration, NonFiniteLossError, SeveralIteration, load_checkpoint

pytestmark = pytest.mark.spark

NONFINITE_AT = 5  # 0-based: the second iteration of the second round of LocalSGD(period=4)


def linear_classifier():
    """No saturating layer: a sample of huge features overflows the logits to inf, and the
    log-softmax of inf is NaN."""
    with nn.init.seeded(1):
        return nn.Sequential(nn.Linear(10, 3), nn.LogSoftmax())


def local_sgd_run(features, labels, end, iterations_per_job, shared_disk=True):
    optimizer = DistriOptimizer(
        linear_classifier(),
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1, momentum=0.9),
        batch_size=BATCH,
        end_trigger=MaxIteration(end),
        num_partitions=2,
        iterations_per_job=iterations_per_job,
        update=LocalSGD(period=4),
        progress=False,
    )
    # As on executors without a shared disk: the optimizer state travels with the jobs.
    executors = optimizer.training_set.executors
    optimizer.training_set.executors = dataclasses.replace(executors, shared_disk=shared_disk)
    return optimizer


def poison_first_sample_of(plan, iteration: int, features: np.ndarray) -> np.ndarray:
    """``features`` with partition 1's first sample of ``iteration`` overflowing the model
    (finite, so the data checks let it through); no earlier iteration uses that sample."""
    local = int(plan.shares(iteration)[1][0])
    earlier = np.concatenate([plan.shares(before)[1] for before in range(iteration)])
    assert local not in earlier
    poisoned = features.copy()
    poisoned[split_bounds(len(features), 2)[1][0] + local] = 3e38
    return poisoned


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(
    "iterations_per_job, shared_disk, checkpoint_every",
    [(8, True, None), (1, False, 4)],
    ids=["two-rounds-a-job", "state-travels-checkpointed"],
)
def test_local_sgd_stops_at_a_nonfinite_loss_with_the_weights_before_it(
    spark, tmp_path, iterations_per_job, shared_disk, checkpoint_every
):
    features, labels = blobs()
    # The reference: the same run stopped before the iteration (its data never reaches the
    # poisoned sample), averaged there as at any end of training.
    with local_sgd_run(features, labels, NONFINITE_AT, iterations_per_job, shared_disk) as clean:
        before = flat(clean.optimize())
        poisoned = poison_first_sample_of(clean.training_set.plan, NONFINITE_AT, features)
    with local_sgd_run(poisoned, labels, 12, iterations_per_job, shared_disk) as optimizer:
        if checkpoint_every:
            optimizer.set_checkpoint(str(tmp_path), SeveralIteration(checkpoint_every))
        message = rf"loss is nan at iteration {NONFINITE_AT + 1} "
        with pytest.raises(NonFiniteLossError, match=message) as stopped:
            optimizer.optimize()
        assert optimizer.state.iteration == NONFINITE_AT
        np.testing.assert_array_equal(flat(optimizer.model), before)
    assert np.abs(before - flat(linear_classifier())).max() > 1e-2  # it trained
    if checkpoint_every:
        assert load_checkpoint(str(tmp_path)).iteration == checkpoint_every
        assert "the last checkpoint" in str(stopped.value)
