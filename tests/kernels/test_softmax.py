"""Fused (log-)softmax, NLL and softmax cross-entropy (their NumPy references, on the
strict device) against the composed ops on the host, forward and backward."""

from __future__ import annotations

import numpy as np
import pytest
from same_on_both import compare

from bigdl_py import nn
from bigdl_py.autograd import ops

DTYPES = pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])


@DTYPES
@pytest.mark.parametrize("shape", [(7, 10), (3, 4, 300), (1, 1)])
@pytest.mark.parametrize("op", [ops.softmax, ops.log_softmax], ids=["softmax", "log_softmax"])
def test_row_softmax(op, shape, dtype):
    values = np.random.default_rng(0).standard_normal(shape).astype(dtype) * 4
    compare(lambda x: op(x, axis=-1), [values], [True])


@DTYPES
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll(reduction, weighted, dtype):
    rng = np.random.default_rng(1)
    scores = rng.standard_normal((9, 5)).astype(dtype)
    labels = np.array([0, 4, -100, 2, 2, 1, 3, -100, 0])
    weight = rng.random(5) + 0.5 if weighted else None
    loss = nn.NLLLoss(weight=weight, reduction=reduction).to(dtype=dtype)
    compare(lambda x, t: loss(ops.log_softmax(x, axis=1), t), [scores, labels], [True, False])


@DTYPES
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy(reduction, weighted, smoothing, dtype):
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((11, 7)).astype(dtype) * 3
    labels = np.array([0, 6, -100, 2, 2, 1, 3, 5, 4, -100, 6])
    weight = rng.random(7) + 0.5 if weighted else None
    loss = nn.CrossEntropyLoss(weight=weight, reduction=reduction, label_smoothing=smoothing)
    compare(lambda x, t: loss(x, t), [logits, labels], [True, False])


def test_every_target_ignored_gives_nan_as_on_the_host():
    logits = np.zeros((3, 4), np.float32)
    labels = np.full(3, -100)
    with np.errstate(invalid="ignore", divide="ignore"):
        result = compare(lambda x, t: nn.CrossEntropyLoss()(x, t), [logits, labels], [True, False])
    assert np.isnan(result)
