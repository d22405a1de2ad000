"""Fused activations (their NumPy references, on the strict device) against the composed
ops on the host, forward and backward."""

from __future__ import annotations

import numpy as np
import pytest
from same_on_both import compare

from bigdl_py import kernels
from bigdl_py.autograd import ops

ACTIVATIONS = {
    "relu": ops.relu,
    "leaky_relu": lambda x: ops.leaky_relu(x, 0.2),
    "tanh": ops.tanh,
    "sigmoid": ops.sigmoid,
    "gelu": ops.gelu,
    "gelu_tanh": lambda x: ops.gelu(x, approximate="tanh"),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation(name, dtype):
    values = np.random.default_rng(0).standard_normal((5, 7, 11)) * 4
    values[0, 0, :3] = [0.0, 40.0, -40.0]  # a kink and both saturated tails
    rtol = 3e-6 if dtype == np.float32 else 1e-12
    compare(ACTIVATIONS[name], [values.astype(dtype)], [True], rtol=rtol, atol=rtol)


def test_integers_and_half_precision_keep_the_composed_route():
    from bigdl_py import backend

    assert kernels.route(backend.to_device(np.arange(3), "strict")) is None
    assert kernels.route(backend.to_device(np.ones(3, np.float16), "strict")) is None
    assert kernels.route(backend.to_device(np.ones(3, np.float32), "strict")) == "reference"
    assert kernels.route(np.ones(3, np.float32)) is None  # the host never takes it


def test_the_switch_turns_the_kernels_off(monkeypatch):
    from bigdl_py import backend

    monkeypatch.setenv(kernels.SWITCH_VARIABLE, "0")
    assert kernels.route(backend.to_device(np.ones(3, np.float32), "strict")) is None
    values = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    compare(ops.sigmoid, [values], [True])  # the composed ops on the strict device
