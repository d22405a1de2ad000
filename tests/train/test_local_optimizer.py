"""LocalOptimizer end to end: convergence, validation, clipping, the front door, errors."""

from __future__ import annotations

import numpy as np
import pytest
from train_models import make_blobs, make_classifier

from bigdl_py import nn
from bigdl_py.autograd import Tensor
from bigdl_py.data import ArrayDataset
from bigdl_py.optim import SGD, Adam, FlatParameters, Plateau
from bigdl_py.train import (
    BaseOptimizer,
    EveryEpoch,
    LocalOptimizer,
    Loss,
    MaxEpoch,
    MaxIteration,
    MaxScore,
    MinLoss,
    Optimizer,
    SeveralIteration,
    Top1Accuracy,
    Top5Accuracy,
)


def accuracy(model, features, labels) -> float:
    model.eval()
    predicted = np.argmax(model(Tensor(features)).numpy(), axis=1)
    model.train()
    return float(np.mean(predicted == labels))


def local(model, data, optim_method=None, **options):
    options.setdefault("batch_size", 32)
    options.setdefault("progress", False)
    return LocalOptimizer(
        model, data, nn.NLLLoss(), optim_method or SGD(lr=0.1, momentum=0.9), **options
    )


@pytest.mark.parametrize("optim_method", [SGD(lr=0.1, momentum=0.9), Adam(lr=0.01)])
def test_training_converges_on_separable_blobs(blobs, optim_method):
    features, labels = blobs
    model = make_classifier()
    before = accuracy(model, features, labels)
    trained = local(model, (features, labels), optim_method, end_trigger=MaxEpoch(5)).optimize()
    assert trained is model
    assert accuracy(model, features, labels) > max(0.95, before)


def test_the_loop_does_what_a_bare_step_loop_does(blob_dataset):
    """Same batches, same updates: the loop adds bookkeeping, never different math."""
    looped = make_classifier()
    local(looped, blob_dataset, SGD(lr=0.1, momentum=0.9), end_trigger=MaxEpoch(2)).optimize()
    bare = make_classifier()
    flat, criterion, sgd = FlatParameters(bare), nn.NLLLoss(), SGD(lr=0.1, momentum=0.9)
    iteration = 0
    for epoch in range(2):
        for batch in blob_dataset.batches(epoch, 32):
            flat.zero_grad()
            criterion(bare(Tensor(batch.features[0])), Tensor(batch.labels)).backward()
            sgd.step(flat.weights, flat.gradients)
            iteration += 1
            sgd.on_iteration_end(iteration)
    looped_state = looped.state_dict()
    for name, expected in bare.state_dict().items():
        np.testing.assert_array_equal(looped_state[name], expected, err_msg=name)


def test_state_counts_epochs_and_iterations(blob_dataset):
    optimizer = local(make_classifier(), blob_dataset, end_trigger=MaxIteration(10))
    optimizer.optimize()
    batches = blob_dataset.num_batches(32)  # 240 samples: 8 batches
    assert (optimizer.state.iteration, optimizer.state.epoch) == (10, 10 // batches)
    assert optimizer.state.iteration_in_epoch == 10 % batches
    optimizer.set_end_when(MaxEpoch(2)).optimize()  # optimize() again continues the run
    assert (optimizer.state.iteration, optimizer.state.epoch) == (2 * batches, 2)


def test_validation_runs_on_its_trigger_and_feeds_score_triggers(blobs):
    features, labels = blobs
    end = MaxEpoch(20) | MaxScore(0.9)
    optimizer = local(make_classifier(), (features, labels), end_trigger=end)
    optimizer.set_validation(SeveralIteration(4), (features, labels), [Top1Accuracy(), Loss()])
    optimizer.optimize()
    top1, loss = optimizer.last_validation
    assert top1.name == "Top1Accuracy" and loss.name == "Loss"
    assert top1.count == len(labels)
    assert top1.value > 0.9 and optimizer.state.score == top1.value
    assert optimizer.state.iteration % 4 == 0  # it stopped right after a validation
    assert optimizer.state.epoch < 20
    assert loss.value == pytest.approx(
        float(nn.NLLLoss()(optimizer.model.eval()(Tensor(features)), Tensor(labels)).item()),
        rel=1e-5,
    )


def test_min_loss_ends_training(blob_dataset):
    optimizer = local(make_classifier(), blob_dataset, end_trigger=MinLoss(0.3) | MaxEpoch(50))
    optimizer.optimize()
    assert optimizer.state.loss < 0.3 and optimizer.state.epoch < 50


def test_plateau_schedule_hears_the_epoch_validation_score(blobs):
    features, labels = blobs
    schedule = Plateau(mode="max", factor=0.5, patience=0)
    sgd = SGD(lr=0.1, schedule=schedule)
    optimizer = local(make_classifier(), (features, labels), sgd, end_trigger=MaxEpoch(4))
    # A validation set the model cannot learn (random labels) keeps the score from improving.
    noise = np.random.default_rng(3).integers(0, 3, len(labels))
    optimizer.set_validation(EveryEpoch(), (features, noise), Top1Accuracy())
    optimizer.optimize()
    assert sgd.epoch == 4
    assert sgd.current_learning_rate() < 0.1


def test_l2_norm_clipping_limits_every_update(blob_dataset):
    model = make_classifier()
    max_norm, lr = 0.01, 1.0
    before = FlatParameters(model).weights.copy()
    optimizer = local(model, blob_dataset, SGD(lr=lr), end_trigger=MaxIteration(1))
    optimizer.set_gradient_clipping_by_l2_norm(max_norm).optimize()
    step = optimizer.runner.flat.weights - before
    assert np.linalg.norm(step) == pytest.approx(lr * max_norm, rel=1e-3)


def test_constant_clipping_bounds_every_gradient_element(blob_dataset):
    model = make_classifier()
    before = FlatParameters(model).weights.copy()
    optimizer = local(model, blob_dataset, SGD(lr=1.0), end_trigger=MaxIteration(1))
    optimizer.set_constant_gradient_clipping(-1e-3, 1e-3).optimize()
    assert np.max(np.abs(optimizer.runner.flat.weights - before)) <= 1e-3 + 1e-7
    assert optimizer.clippings and not optimizer.disable_gradient_clipping().clippings


def test_optimizer_front_door_picks_local_training_for_arrays(blobs):
    features, labels = blobs
    optimizer = Optimizer(
        make_classifier(),
        (features, labels),
        nn.NLLLoss(),
        Adam(lr=0.01),
        MaxEpoch(1),
        32,
        progress=False,
    )
    assert isinstance(optimizer, LocalOptimizer) and isinstance(optimizer, BaseOptimizer)
    assert optimizer.batch_size == 32
    optimizer.optimize()
    assert optimizer.state.epoch == 1


def test_optimizer_front_door_explains_a_missing_distributed_optimizer(monkeypatch, blobs):
    import bigdl_py.train.optimizer as front_door

    class RDD:  # stands in for pyspark.RDD without starting Spark
        pass

    RDD.__module__ = "pyspark.core.rdd"
    monkeypatch.setattr(front_door, "_DISTRIBUTED_MODULE", "bigdl_py.spark.not_written_yet")
    with pytest.raises(ImportError, match="needs the distributed optimizer"):
        Optimizer(make_classifier(), RDD(), nn.NLLLoss(), SGD(lr=0.1), MaxEpoch(1), 32)


def test_swapped_batch_size_and_end_trigger_are_reported(blobs):
    with pytest.raises(TypeError, match="batch_size got a Trigger"):
        LocalOptimizer(make_classifier(), blobs, nn.NLLLoss(), SGD(lr=0.1), MaxEpoch(1), 32)
    with pytest.raises(TypeError, match="end_trigger, batch_size"):
        Optimizer(make_classifier(), blobs, nn.NLLLoss(), SGD(lr=0.1), 32, MaxEpoch(1))


def test_configuration_errors_name_the_setting(blob_dataset):
    model = make_classifier()
    with pytest.raises(TypeError, match="optim_method must be a bigdl_py.optim OptimMethod"):
        LocalOptimizer(model, blob_dataset, nn.NLLLoss(), "sgd")
    with pytest.raises(TypeError, match="training_set must be an ArrayDataset"):
        LocalOptimizer(model, [1, 2, 3], nn.NLLLoss(), SGD())
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        LocalOptimizer(model, blob_dataset, nn.NLLLoss(), SGD(), batch_size=0)
    optimizer = local(model, blob_dataset)
    with pytest.raises(ValueError, match="no end trigger"):
        optimizer.optimize()
    with pytest.raises(TypeError, match="validation trigger must be a Trigger"):
        optimizer.set_validation(5, blob_dataset, Top1Accuracy())
    with pytest.raises(TypeError, match="validation methods must be ValidationMethod"):
        optimizer.set_validation(EveryEpoch(), blob_dataset, ["accuracy"])
    with pytest.raises(TypeError, match="expected a TrainSummary"):
        optimizer.set_train_summary("logs")


def test_an_epoch_without_batches_is_reported(blobs):
    features, labels = blobs
    dataset = ArrayDataset(features[:10], labels[:10], batch_size=32, drop_last=True)
    optimizer = local(make_classifier(), dataset, end_trigger=MaxEpoch(1))
    with pytest.raises(ValueError, match="epoch 1 has no batches: 10 samples with batch_size 32"):
        optimizer.optimize()


def test_top5_on_few_classes_and_the_training_criterion_for_loss():
    features, labels = make_blobs(samples=64, classes=3)
    optimizer = local(make_classifier(), (features, labels), end_trigger=MaxIteration(2))
    optimizer.set_validation(MaxIteration(2), (features, labels), [Top5Accuracy(), Loss()])
    optimizer.optimize()
    top5, loss = optimizer.last_validation
    assert top5.value == 1.0  # three classes: the target is always among the top five
    assert np.isfinite(loss.value)
