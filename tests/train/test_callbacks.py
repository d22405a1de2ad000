"""The loop tells every started callback how training ended, whatever ended it."""

from __future__ import annotations

import logging

import pytest
from train_models import make_blobs, make_classifier

from bigdl_py import nn
from bigdl_py.optim import SGD
from bigdl_py.train import (
    LocalOptimizer,
    MaxEpoch,
    SeveralIteration,
    Top1Accuracy,
    TrainingCallback,
)


class Recorder(TrainingCallback):
    """Records the hooks it hears; fails in the ones named in ``fail_in``."""

    def __init__(self, fail_in=()):
        self.fail_in = set(fail_in)
        self.heard: list[tuple[str, object]] = []

    def _hear(self, hook, detail=None):
        self.heard.append((hook, detail))
        if hook in self.fail_in:
            raise RuntimeError(f"{hook} failed on purpose")

    def on_train_begin(self, optimizer):
        self._hear("begin")

    def on_iteration_end(self, state, loss, throughput, learning_rate):
        if "iteration" in self.fail_in and state.iteration == 3:
            self._hear("iteration", state.iteration)

    def on_train_end(self, optimizer, model, error):
        self._hear("end", error)


def optimizer(*callbacks, validation_labels=None):
    features, labels = make_blobs()
    trainer = LocalOptimizer(
        make_classifier(),
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1),
        batch_size=30,
        end_trigger=MaxEpoch(2),
        progress=False,
    )
    if validation_labels is not None:
        trainer.set_validation(SeveralIteration(4), (features, validation_labels), [Top1Accuracy()])
    for callback in callbacks:
        trainer.add_callback(callback)
    return trainer


def test_any_training_error_reaches_every_callbacks_end_hook():
    # Not only a NaN loss: here validation refuses a label outside the model's 3 classes.
    first, second = Recorder(), Recorder()
    _, labels = make_blobs()
    labels = labels.copy()
    labels[7] = 5
    trainer = optimizer(first, second, validation_labels=labels)
    with pytest.raises(ValueError, match="outside the 3 classes") as raised:
        trainer.optimize()
    for recorder in (first, second):
        assert recorder.heard == [("begin", None), ("end", raised.value)]


def test_an_interrupt_reaches_the_end_hooks_and_still_propagates():
    class Interrupter(TrainingCallback):
        def on_iteration_end(self, state, loss, throughput, learning_rate):
            raise KeyboardInterrupt

    recorder = Recorder()
    with pytest.raises(KeyboardInterrupt):
        optimizer(recorder, Interrupter()).optimize()
    assert recorder.heard[-1][0] == "end"
    assert isinstance(recorder.heard[-1][1], KeyboardInterrupt)


def test_a_failing_end_hook_neither_hides_the_training_error_nor_skips_the_others(caplog):
    failing, after = Recorder(fail_in={"end"}), Recorder()
    trainer = optimizer(failing, after, Recorder(fail_in={"iteration"}))
    with pytest.raises(RuntimeError, match="iteration failed on purpose") as raised:
        trainer.optimize()
    assert failing.heard[-1] == ("end", raised.value)
    assert after.heard[-1] == ("end", raised.value)
    logged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any("Recorder.on_train_end failed" in r.getMessage() for r in logged)


def test_a_callback_that_fails_to_begin_ends_those_begun_before_it():
    begun, refusing, never = Recorder(), Recorder(fail_in={"begin"}), Recorder()
    trainer = optimizer(begun, refusing, never)
    with pytest.raises(RuntimeError, match="begin failed on purpose") as raised:
        trainer.optimize()
    assert begun.heard == [("begin", None), ("end", raised.value)]
    assert refusing.heard == [("begin", None)]  # its own begin failed: it cleans up itself
    assert never.heard == []
    assert trainer.state.iteration == 0


def test_after_a_successful_run_an_end_hook_failure_is_raised_once_all_have_heard():
    failing, after = Recorder(fail_in={"end"}), Recorder()
    trainer = optimizer(failing, after)
    with pytest.raises(RuntimeError, match="end failed on purpose"):
        trainer.optimize()
    assert after.heard == [("begin", None), ("end", None)]
    assert trainer.state.epoch == 2
