"""Small models for the optim tests (the layer library is not needed to test flat vectors)."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.nn.module import Module, Parameter


class TinyMLP(Module):
    """Two dense layers written with raw parameters: 4 -> 3 -> 2."""

    def __init__(self, rng: np.random.Generator, dtype=np.float64):
        super().__init__()
        self.hidden = Dense(4, 3, rng, dtype)
        self.output = Dense(3, 2, rng, dtype)

    def forward(self, inputs):
        return self.output(self.hidden(inputs).tanh())


class Dense(Module):
    def __init__(self, inputs: int, outputs: int, rng: np.random.Generator, dtype):
        super().__init__()
        self.weight = Parameter(rng.standard_normal((inputs, outputs)).astype(dtype))
        self.bias = Parameter(rng.standard_normal(outputs).astype(dtype))

    def forward(self, inputs):
        return inputs @ self.weight + self.bias


@pytest.fixture
def make_mlp():
    """``make_mlp(rng_or_seed, dtype=np.float64)`` builds a fresh TinyMLP."""

    def make(rng_or_seed, dtype=np.float64):
        return TinyMLP(np.random.default_rng(rng_or_seed), dtype)

    return make
