"""No training step waits for the device: proven without a GPU on the strict device.

``LocalOptimizer`` trains the bench's models (``bench/engine_models.py``) on the ``strict``
test device, whose arrays raise ``DeviceSyncError`` on any read back to the host inside a
step: forward, loss, backward, update and the loop's per-iteration bookkeeping. Reads are
allowed only at the loop's sync points (validation, the end of an epoch, a checkpoint, the
end of training). So these tests fail on any device wait a step would make on a GPU,
today's or one written later (``test_the_check_catches_a_wait_written_into_a_model``
shows it does).
"""

from __future__ import annotations

import copy
import importlib
import os
import sys

import numpy as np
import pytest
from train_models import make_blobs, make_classifier

from bigdl_py import backend, device_waits, nn
from bigdl_py.data import ArrayDataset
from bigdl_py.optim import SGD, Adam
from bigdl_py.train import (
    EveryEpoch,
    LocalOptimizer,
    MaxEpoch,
    MaxIteration,
    NonFiniteLossError,
    SeveralIteration,
    Top1Accuracy,
)
from bigdl_py.train.callbacks import TrainingCallback

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "bench")


@pytest.fixture(scope="module")
def engine_models():
    sys.path.insert(0, BENCH)  # bench/ is not a package
    try:
        yield importlib.import_module("engine_models")
    finally:
        sys.path.remove(BENCH)


def small_batch(engine_models, key: str, samples: int):
    """``samples`` samples of the spec's batch, shortened where the bench's are long."""
    features, labels = engine_models.MODELS[key].batch(0)
    features, labels = features[:samples], labels[:samples]
    if key in ("transformer", "bilstm"):
        features = np.maximum(features[:, :16], 1)  # short sequences, no all-padding one
    return features, labels


@pytest.mark.parametrize(
    ("key", "samples", "optim_method"),
    [
        ("lenet", 24, SGD(lr=0.05, momentum=0.9)),
        ("transformer", 12, Adam(lr=1e-3)),
        ("bilstm", 12, SGD(lr=0.1, momentum=0.9, nesterov=True)),
        ("resnet18", 6, SGD(lr=0.05, momentum=0.9, weight_decay=5e-4)),
    ],
)
def test_a_training_step_of_each_bench_model_reads_nothing_back(
    engine_models, key, samples, optim_method, tmp_path
):
    spec = engine_models.MODELS[key]
    features, labels = small_batch(engine_models, key, samples)
    model = spec.build().to("strict")
    criterion = nn.NLLLoss() if spec.loss == "nll" else nn.CrossEntropyLoss()
    dataset = ArrayDataset(features, labels, shuffle=True, seed=3)
    optimizer = LocalOptimizer(
        model,
        dataset,
        criterion,
        copy.deepcopy(optim_method),
        batch_size=samples // 3,
        end_trigger=MaxIteration(5),  # ends inside the second epoch
        progress=False,
    )
    optimizer.set_gradient_clipping_by_l2_norm(5.0)
    optimizer.set_validation(EveryEpoch(), (features, labels), [Top1Accuracy()])
    optimizer.set_checkpoint(tmp_path, EveryEpoch())
    optimizer.optimize()  # any read back inside a step raises DeviceSyncError
    state = optimizer.state
    assert state.iteration == 5 and state.epoch == 1
    assert np.isfinite(state.loss) and optimizer.last_validation
    assert backend.device_of(next(model.parameters()).data) == backend.STRICT


class _ReadsBack(nn.Module):
    """A layer that asks the device a question: a wait on a GPU."""

    def forward(self, x):
        if float(x.data.sum()) > 1e30:  # the kind of check that stalls a GPU every step
            raise ValueError("unreachable")
        return x


def test_the_check_catches_a_wait_written_into_a_model():
    features, labels = make_blobs(samples=40)
    model = nn.Sequential(_ReadsBack(), make_classifier()).to("strict")
    optimizer = LocalOptimizer(
        model, (features, labels), nn.NLLLoss(), SGD(lr=0.1), 20, MaxEpoch(1), progress=False
    )
    with pytest.raises(device_waits.DeviceSyncError, match=r"float\(\).*iteration 1 \(epoch 1"):
        optimizer.optimize()


def train_both(features, labels, epochs=1, batch=20, criterion=None, **options):
    """The same training on the CPU and on the strict device: (cpu, strict) optimizers."""
    runs = []
    for device in ("cpu", "strict"):
        optimizer = LocalOptimizer(
            make_classifier().to(device),
            ArrayDataset(features, labels, batch_size=batch, shuffle=False, check_finite=False),
            criterion or nn.NLLLoss(),
            Adam(lr=0.05),
            end_trigger=MaxEpoch(epochs),
            progress=False,
            **options,
        )
        runs.append(optimizer)
    return runs


def assert_same_weights(first, second):
    for name, value in first.model.state_dict().items():
        np.testing.assert_allclose(second.model.state_dict()[name], value, rtol=1e-5, atol=1e-6)


def test_losses_read_one_step_late_are_those_of_the_cpu_run():
    features, labels = make_blobs(samples=100)
    cpu, strict = train_both(features, labels, epochs=2)

    class Record(TrainingCallback):
        def __init__(self):
            self.losses = []

        def on_iteration_end(self, state, loss, throughput, learning_rate):
            assert state.loss == loss  # the state as right after that iteration
            self.losses.append((state.iteration, loss))

    records = [Record(), Record()]
    for optimizer, record in zip((cpu, strict), records, strict=True):
        optimizer.add_callback(record)
        optimizer.optimize()
    cpu_losses, strict_losses = records[0].losses, records[1].losses
    assert [i for i, _ in strict_losses] == list(range(1, 11))
    np.testing.assert_allclose([v for _, v in strict_losses], [v for _, v in cpu_losses], 1e-5)
    assert_same_weights(cpu, strict)


def test_a_nan_loss_on_the_device_stops_with_the_weights_before_its_batch():
    features, labels = make_blobs(samples=100)
    features[45, 2] = np.nan  # batch 3 of 5
    stopped = train_both(features, labels)[1]
    with pytest.raises(NonFiniteLossError, match=r"iteration 3 \(epoch 1, batch 3 of 5\)"):
        stopped.optimize()
    # The next batch ran on the device before the loss was read; it changed nothing.
    clean = train_both(features[:40], labels[:40])[0]
    clean.optimize()
    assert_same_weights(clean, stopped)


def test_a_nan_loss_on_the_device_is_skipped_as_on_the_cpu():
    features, labels = make_blobs(samples=100)
    features[45, 2] = np.nan
    cpu, strict = train_both(features, labels, epochs=2, skip_nonfinite_batches=True)
    cpu.optimize()
    strict.optimize()
    assert strict.state.skipped_batches == cpu.state.skipped_batches == 2
    assert_same_weights(cpu, strict)


class _DeviceTargets(nn.Module):
    """A criterion that takes its labels on the device (not checked on the host)."""

    def __init__(self):
        super().__init__()
        self.loss = nn.NLLLoss()

    def forward(self, output, target):
        return self.loss(output, target)


def test_a_bad_label_on_the_device_is_reported_at_the_next_sync_point_naming_its_batch():
    features, labels = make_blobs(samples=100)
    labels[47] = 3  # 3 classes: batch 3 of 5
    cpu, strict = train_both(features, labels, criterion=_DeviceTargets())
    with pytest.raises(IndexError, match=r"target\[7\] = 3 .*\[in iteration 3 \(epoch 1, batch"):
        strict.optimize()
    with pytest.raises(IndexError, match=r"target\[7\] = 3"):
        cpu.optimize()  # on the host it is raised at once


def test_an_id_outside_the_embedding_is_reported_at_the_next_sync_point(engine_models):
    features, labels = small_batch(engine_models, "bilstm", 12)
    features[5, 3] = engine_models.TEXT_VOCABULARY  # batch 2 of 3
    optimizer = LocalOptimizer(
        engine_models.BiLSTMClassifier(vocabulary=engine_models.TEXT_VOCABULARY).to("strict"),
        ArrayDataset(features, labels, batch_size=4, shuffle=False),
        nn.CrossEntropyLoss(),
        SGD(lr=0.1),
        end_trigger=MaxIteration(3),
        progress=False,
    )
    with pytest.raises(IndexError, match=r"embedding: .*max 10000 \[in iteration 2 \(epoch 1"):
        optimizer.optimize()


def test_a_loss_reading_trigger_reads_each_loss_at_once_and_still_never_waits_in_a_step():
    features, labels = make_blobs(samples=100)
    cpu, strict = train_both(features, labels, epochs=3)
    from bigdl_py.train import MinLoss

    for optimizer in (cpu, strict):
        optimizer.set_end_when(MaxEpoch(3) | MinLoss(1e9))  # MinLoss fires after iteration 1
        optimizer.optimize()
    assert strict.state.iteration == cpu.state.iteration == 1
    assert_same_weights(cpu, strict)


def test_checkpoints_on_the_device_hold_the_state_of_their_iteration(tmp_path):
    features, labels = make_blobs(samples=100)
    cpu, strict = train_both(features, labels, epochs=1)
    for optimizer, folder in ((cpu, "cpu"), (strict, "strict")):
        optimizer.set_checkpoint(tmp_path / folder, SeveralIteration(2))
        optimizer.optimize()
    from bigdl_py.train import load_checkpoint

    written = [load_checkpoint(tmp_path / folder) for folder in ("cpu", "strict")]
    assert written[0].iteration == written[1].iteration == 4
    for name, value in written[0].arrays.items():
        np.testing.assert_allclose(written[1].arrays[name], value, rtol=1e-5, atol=1e-6)


def test_validation_on_the_device_reads_once_and_scores_as_on_the_host():
    from bigdl_py.train import MAE, Loss, Top5Accuracy
    from bigdl_py.train.batches import evaluate_batches, validation_batches

    features, labels = make_blobs(samples=90)
    dataset = ArrayDataset(features, labels, shuffle=False, train=False)
    methods = [Top1Accuracy(), Top5Accuracy(), Loss(nn.NLLLoss())]
    scores = []
    for device in ("cpu", "strict"):
        model = make_classifier().to(device)
        scores.append(evaluate_batches(model, validation_batches(dataset, 20), methods, device))
    for host, device in zip(*scores, strict=True):
        assert isinstance(device.total, float) and device.count == host.count
        assert device.value == pytest.approx(host.value, rel=1e-6)
    regression = ArrayDataset(features, features[:, :3], shuffle=False, train=False)
    model = nn.Linear(8, 3).to("strict")
    (mae,) = evaluate_batches(model, validation_batches(regression, 32), [MAE()], "strict")
    assert np.isfinite(mae.value)


def test_a_bad_validation_label_on_the_device_is_reported_after_the_batches():
    from bigdl_py.train.batches import evaluate_batches, validation_batches

    features, labels = make_blobs(samples=60)
    labels[33] = 5
    dataset = ArrayDataset(features, labels, shuffle=False, train=False)
    model = make_classifier().to("strict")
    with pytest.raises(ValueError, match=r"target 5 at index 13 is outside the 3 classes"):
        evaluate_batches(model, validation_batches(dataset, 20), [Top1Accuracy()], "strict")


def test_the_train_summary_on_the_device_has_each_iterations_loss_as_on_the_host(tmp_path):
    from bigdl_py.train import TrainSummary

    features, labels = make_blobs(samples=100)
    written = []
    for optimizer, name in zip(train_both(features, labels, epochs=2), ("cpu", "strict"),
                               strict=True):  # fmt: skip
        summary = TrainSummary(tmp_path, name)
        optimizer.set_train_summary(summary)
        optimizer.optimize()
        written.append(summary.read_scalar("Loss"))
    cpu, strict = written
    assert [step for step, _, _ in strict] == [step for step, _, _ in cpu] == list(range(1, 11))
    np.testing.assert_allclose([v for _, v, _ in strict], [v for _, v, _ in cpu], rtol=1e-5)
