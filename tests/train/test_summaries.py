"""TensorBoard summaries: written by the loop, read back, plotted; tensorboardX without torch."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from train_models import make_classifier

from bigdl_py import nn
from bigdl_py.optim import SGD, Step
from bigdl_py.train import (
    EveryEpoch,
    LocalOptimizer,
    Loss,
    MaxEpoch,
    SeveralIteration,
    Top1Accuracy,
    TrainSummary,
    ValidationSummary,
    plot_curves,
    read_scalars,
)


def test_a_summary_reads_back_what_it_wrote(tmp_path):
    summary = TrainSummary(tmp_path, "run")
    for step in range(1, 121):  # more than one buffer's worth
        summary.add_scalars({"Loss": 1.0 / step, "Throughput": 100.0 * step}, step, wall_time=step)
    loss = summary.read_scalar("Loss")
    assert [step for step, _, _ in loss] == list(range(1, 121))
    assert loss[9] == (10, pytest.approx(0.1), pytest.approx(10.0))
    assert summary.tags() == ["Loss", "Throughput"]
    assert summary.read_scalar("Missing") == []
    summary.close()
    assert summary.directory == os.path.join(str(tmp_path), "run", "train")


def test_a_partly_written_record_at_the_end_is_ignored(tmp_path):
    summary = ValidationSummary(tmp_path, "run")
    summary.add_scalar("Top1Accuracy", 0.5, 1)
    summary.add_scalar("Top1Accuracy", 0.6, 2)
    summary.close()
    (path,) = [os.path.join(summary.directory, n) for n in os.listdir(summary.directory)]
    with open(path, "ab") as file:
        file.write(b"\x30\x00\x00\x00\x00\x00\x00\x00\x01\x02")  # a record cut short
    assert [value for _, value, _ in read_scalars(summary.directory)["Top1Accuracy"]] == [
        pytest.approx(0.5),
        pytest.approx(0.6),
    ]


def test_training_writes_loss_throughput_learning_rate_and_validation(tmp_path, blobs):
    features, labels = blobs
    sgd = SGD(lr=0.1, momentum=0.9, schedule=Step(4, gamma=0.5))
    optimizer = LocalOptimizer(
        make_classifier(),
        (features, labels),
        nn.NLLLoss(),
        sgd,
        batch_size=40,
        end_trigger=MaxEpoch(2),
        progress=False,
    )
    train, validation = TrainSummary(tmp_path, "lenet"), ValidationSummary(tmp_path, "lenet")
    train.set_summary_trigger("LearningRate", SeveralIteration(2))
    train.set_summary_trigger("Parameters", EveryEpoch())
    optimizer.set_train_summary(train).set_validation_summary(validation)
    optimizer.set_validation(EveryEpoch(), (features, labels), [Top1Accuracy(), Loss()])
    optimizer.optimize()

    loss = train.read_scalar("Loss")
    assert [step for step, _, _ in loss] == list(range(1, 13))  # 6 iterations per epoch
    assert loss[-1][1] == pytest.approx(optimizer.state.loss)
    assert all(value > 0 for _, value, _ in train.read_scalar("Throughput"))
    rates = train.read_scalar("LearningRate")
    assert [step for step, _, _ in rates] == [2, 4, 6, 8, 10, 12]
    # The rate recorded at step k is the one that step k used: 0.1 * 0.5 ** ((k - 1) // 4).
    assert [value for _, value, _ in rates] == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
    accuracy = validation.read_scalar("Top1Accuracy")
    assert [step for step, _, _ in accuracy] == [6, 12]
    assert accuracy[-1][1] == pytest.approx(optimizer.last_validation[0].value)
    assert [step for step, _, _ in validation.read_scalar("Loss")] == [6, 12]
    assert validation.tags() == ["Loss", "Top1Accuracy"]


def test_parameter_histograms_are_written_on_their_trigger(tmp_path, blob_dataset):
    from tensorboardX.proto.event_pb2 import Event

    from bigdl_py.train.summary import _records, event_files

    train = TrainSummary(tmp_path, "hist").set_summary_trigger("Parameters", EveryEpoch())
    optimizer = LocalOptimizer(
        make_classifier(),
        blob_dataset,
        nn.NLLLoss(),
        SGD(lr=0.1),
        batch_size=120,
        end_trigger=MaxEpoch(2),
        progress=False,
    ).set_train_summary(train)
    optimizer.optimize()
    train.close()
    histograms = [
        (event.step, value.tag)
        for path in event_files(train.directory)
        for record in _records(path)
        for event in [Event.FromString(record)]
        for value in event.summary.value
        if value.WhichOneof("value") == "histo"
    ]
    names = list(optimizer.model.state_dict())
    assert histograms == [(2, name) for name in names] + [(4, name) for name in names]


def test_curves_are_drawn_to_a_png(tmp_path):
    train, validation = TrainSummary(tmp_path, "app"), ValidationSummary(tmp_path, "app")
    for step in range(1, 31):
        train.add_scalars({"Loss": np.exp(-step / 10), "Throughput": 1000.0}, step)
        if step % 10 == 0:
            validation.add_scalars({"Top1Accuracy": step / 30, "Loss": np.exp(-step / 9)}, step)
    from_objects = plot_curves([train, validation], tmp_path / "objects.png", title="app")
    from_run_dir = plot_curves(tmp_path / "app", tmp_path / "run.png")
    for path in (from_objects, from_run_dir):
        with open(path, "rb") as file:
            assert file.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(FileNotFoundError, match="no TensorBoard event files"):
        plot_curves(tmp_path / "nothing-here", tmp_path / "x.png")


def test_summaries_never_import_torch():
    """tensorboardX imports torch when it can; bigdl_py stops that (seconds, and no use)."""
    code = (
        "import sys, tempfile\n"
        "from bigdl_py.train import TrainSummary\n"
        "s = TrainSummary(tempfile.mkdtemp(), 'a'); s.add_scalar('Loss', 1.0, 1)\n"
        "assert s.read_scalar('Loss')[0][1] == 1.0\n"
        "assert 'torch' not in sys.modules, 'torch was imported, or left blocked'\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr


def test_a_bad_app_name_and_a_bad_summary_name_are_refused(tmp_path):
    with pytest.raises(ValueError, match="app_name must be a non-empty name"):
        TrainSummary(tmp_path, "a/b")
    with pytest.raises(ValueError, match="unknown summary 'Gradients'"):
        TrainSummary(tmp_path, "a").set_summary_trigger("Gradients", EveryEpoch())
