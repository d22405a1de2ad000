"""Progress: log lines when not on a terminal, a tqdm bar on one, nothing when disabled."""

from __future__ import annotations

import io
import logging
import re

from train_models import make_classifier

from bigdl_py import nn
from bigdl_py.optim import SGD
from bigdl_py.train import EveryEpoch, LocalOptimizer, MaxEpoch, Progress, Top1Accuracy


def run(dataset, progress, epochs=2):
    optimizer = LocalOptimizer(
        make_classifier(),
        dataset,
        nn.NLLLoss(),
        SGD(lr=0.1),
        batch_size=40,
        end_trigger=MaxEpoch(epochs),
        progress=progress,
    )
    optimizer.set_validation(EveryEpoch(), dataset, Top1Accuracy())
    optimizer.optimize()
    return optimizer


class NotATerminal(io.StringIO):
    def isatty(self) -> bool:
        return False


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_without_a_terminal_progress_is_plain_log_lines(blob_dataset, caplog):
    stream = NotATerminal()
    with caplog.at_level(logging.INFO, logger="bigdl_py.train"):
        run(blob_dataset, Progress(stream=stream, log_interval=3))
    assert stream.getvalue() == ""  # no bar drawn
    lines = [record.getMessage() for record in caplog.records]
    iteration_lines = [line for line in lines if line.startswith("[Epoch")]
    # 240 samples / 40 = 6 iterations per epoch: the first, every third, and each epoch's last.
    numbers = [
        int(re.search(r"\[Iteration (\d+)\]", line).group(1))
        for line in iteration_lines
        if "validation" not in line
    ]
    assert numbers == [1, 3, 6, 9, 12]
    assert re.match(
        r"\[Epoch 1 40/240\]\[Iteration 1\] loss \d+\.\d{4}, \d+\.\d samples/s, lr 0\.1$",
        iteration_lines[0],
    )
    validation = re.compile(r"\[Epoch 1\]\[Iteration 6\] validation: Top1Accuracy: ")
    assert any(validation.match(line) for line in lines)
    assert any(line.startswith("Epoch 2 finished: 240 samples in") for line in lines)


def test_on_a_terminal_progress_is_a_tqdm_bar(blob_dataset, caplog):
    stream = Terminal()
    with caplog.at_level(logging.INFO, logger="bigdl_py.train"):
        run(blob_dataset, Progress(stream=stream), epochs=1)
    text = stream.getvalue()
    assert "Epoch 1" in text and "6/6" in text and "loss=" in text
    assert "validation: Top1Accuracy" in text  # news goes through the bar, not the log
    assert not [r for r in caplog.records if r.getMessage().startswith("[Epoch")]


def test_disabled_progress_reports_nothing(blob_dataset, caplog):
    with caplog.at_level(logging.INFO, logger="bigdl_py.train"):
        run(blob_dataset, False)
    assert caplog.records == []


def test_set_progress_replaces_the_reporter(blob_dataset):
    optimizer = LocalOptimizer(make_classifier(), blob_dataset, nn.NLLLoss(), SGD(lr=0.1))
    optimizer.set_progress(enabled=True, bar=False, log_interval=5)
    assert not optimizer.progress.uses_bar() and optimizer.progress.log_interval == 5
