"""The public surface of bigdl_py.optim, and its lazy BigDL-style re-exports from train."""

from __future__ import annotations

import subprocess
import sys

import pytest

import bigdl_py.optim as optim


def test_everything_in_all_is_importable():
    for name in optim.__all__:
        assert getattr(optim, name) is not None, name


def test_importing_optim_does_not_import_train():
    script = (
        "import sys, bigdl_py; before = set(sys.modules); import bigdl_py.optim; "
        "print(sorted(m for m in set(sys.modules) - before if m.startswith('bigdl_py.train')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_training_names_resolve_lazily_from_train(monkeypatch):
    import bigdl_py.train as train

    sentinel = object()
    optim.__dict__.pop("MaxEpoch", None)  # forget a real one cached by an earlier test
    monkeypatch.setattr(train, "MaxEpoch", sentinel, raising=False)
    try:
        from bigdl_py.optim import MaxEpoch

        assert MaxEpoch is sentinel
    finally:
        optim.__dict__.pop("MaxEpoch", None)
    assert "LocalOptimizer" in dir(optim)


def test_unknown_names_raise_attribute_error(monkeypatch):
    import bigdl_py.train as train

    optim.__dict__.pop("TrainSummary", None)
    monkeypatch.delattr(train, "TrainSummary", raising=False)
    with pytest.raises(AttributeError, match="does not define 'TrainSummary'"):
        optim.TrainSummary  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        optim.Nope  # noqa: B018
