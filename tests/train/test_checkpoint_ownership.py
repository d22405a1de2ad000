"""A fresh run never replaces another run's checkpoints (issue 16, items 2 and 3)."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.optim import SGD
from bigdl_py.train import CheckpointError, LocalOptimizer, MaxIteration, SeveralIteration
from bigdl_py.train.checkpoint import list_checkpoints, load_checkpoint


def _optimizer(rng, iterations=2):
    features = rng.normal(size=(16, 4)).astype(np.float32)
    labels = rng.integers(0, 3, 16)
    return LocalOptimizer(
        nn.Sequential(nn.Linear(4, 3), nn.LogSoftmax()),
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1),
        batch_size=8,
        end_trigger=MaxIteration(iterations),
        progress=False,
    )


def test_a_fresh_run_refuses_another_runs_directory_before_training(tmp_path, rng):
    first = _optimizer(rng).set_checkpoint(tmp_path, SeveralIteration(1))
    first.optimize()
    written = list_checkpoints(tmp_path)
    second = _optimizer(rng).set_checkpoint(tmp_path, SeveralIteration(1))
    with pytest.raises(CheckpointError, match=r"holds 2 checkpoint\(s\) of another run \(run-"):
        second.optimize()
    assert second.state.iteration == 0  # refused before any work
    assert list_checkpoints(tmp_path) == written


def test_resuming_continues_the_same_run_and_its_directory(tmp_path, rng):
    _optimizer(rng).set_checkpoint(tmp_path, SeveralIteration(1)).optimize()
    run_id = load_checkpoint(tmp_path).run_id
    resumed = _optimizer(rng, iterations=4).set_checkpoint(tmp_path, SeveralIteration(1))
    resumed.resume_from(tmp_path).optimize()
    assert resumed.state.iteration == 4
    assert load_checkpoint(tmp_path).run_id == run_id


def test_replace_other_runs_lets_a_new_run_take_the_directory(tmp_path, rng):
    _optimizer(rng).set_checkpoint(tmp_path, SeveralIteration(1)).optimize()
    old = load_checkpoint(tmp_path).run_id
    fresh = _optimizer(rng).set_checkpoint(tmp_path, SeveralIteration(1), replace_other_runs=True)
    fresh.optimize()
    assert load_checkpoint(tmp_path).run_id not in (None, old)


def test_a_checkpoint_path_that_is_a_file_is_refused_before_training(tmp_path, rng):
    path = tmp_path / "file"
    path.write_text("mine")
    optimizer = _optimizer(rng).set_checkpoint(path, SeveralIteration(1))
    with pytest.raises(CheckpointError, match="is a file, not a directory"):
        optimizer.optimize()
    assert path.read_text() == "mine"
