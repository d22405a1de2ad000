"""Progress(iteration_level=DEBUG): what library code uses to keep per-iteration lines quiet."""

from __future__ import annotations

import logging
import re

import pytest
from train_models import make_classifier

from bigdl_py import nn
from bigdl_py.optim import SGD
from bigdl_py.train import EveryEpoch, LocalOptimizer, MaxEpoch, Progress, Top1Accuracy

PER_ITERATION = re.compile(r"\[Epoch \d+ \d+/\d+\]\[Iteration \d+\] loss")


class Terminal:
    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise AssertionError(f"nothing may be drawn, got {text!r}")

    def flush(self) -> None:
        pass


def test_iteration_lines_go_to_debug_and_epoch_lines_stay_at_info(blob_dataset, caplog):
    caplog.set_level(logging.DEBUG, logger="bigdl_py")
    optimizer = LocalOptimizer(
        make_classifier(),
        blob_dataset,
        nn.NLLLoss(),
        SGD(lr=0.1),
        batch_size=40,
        end_trigger=MaxEpoch(2),
    )
    optimizer.set_progress(iteration_level=logging.DEBUG)
    optimizer.set_validation(EveryEpoch(), blob_dataset, Top1Accuracy())
    optimizer.optimize()
    levels = {}
    for record in caplog.records:
        kind = "iteration" if PER_ITERATION.match(record.getMessage()) else "other"
        levels.setdefault(kind, set()).add(record.levelno)
    assert levels == {"iteration": {logging.DEBUG}, "other": {logging.INFO}}


def test_no_bar_is_drawn_on_a_terminal_unless_asked():
    assert not Progress(stream=Terminal(), iteration_level=logging.DEBUG).uses_bar()
    assert Progress(stream=Terminal(), bar=True, iteration_level=logging.DEBUG).uses_bar()


def test_a_level_that_is_not_a_number_is_refused():
    with pytest.raises(TypeError, match="iteration_level"):
        Progress(iteration_level="DEBUG")
