"""A graph Model cut into a chain of sub-models where one value alone flows on."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor
from bigdl_py.nn.graph_chain import chain_segments


def residual_model():
    with nn.init.seeded(2):
        x = nn.Input(shape=(4,))
        h = nn.Linear(4, 6)(x)
        block = nn.Add()(h, nn.Linear(6, 6)(nn.Tanh()(h)))  # a skip: no cut inside
        y = nn.Linear(6, 3)(nn.ReLU()(block))
        return nn.Model(x, y)


def test_segments_cut_between_blocks_and_compose_to_the_model():
    model = residual_model()
    segments = chain_segments(model)
    layers = [[type(m).__name__ for m in segment.children()] for segment in segments]
    assert layers == [["Linear"], ["Tanh", "Linear", "Add"], ["ReLU"], ["Linear"]]
    x = Tensor(np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32))
    value = x
    for segment in segments:
        value = segment(value)
    np.testing.assert_array_equal(value.numpy(), model(x).numpy())
    chained = [p for segment in segments for p in segment.parameters()]
    assert [id(p) for p in chained] == [id(p) for p in model.parameters()]


def test_a_layer_called_on_both_sides_of_a_step_is_not_cut_there():
    shared = nn.Linear(4, 4)
    x = nn.Input(shape=(4,))
    y = shared(nn.Tanh()(shared(x)))
    segments = chain_segments(nn.Model(x, y))
    assert len(segments) == 1


def test_a_skip_from_input_to_output_leaves_one_segment():
    x = nn.Input(shape=(4,))
    y = nn.Add()(x, nn.Linear(4, 4)(nn.Tanh()(x)))
    assert len(chain_segments(nn.Model(x, y))) == 1


def test_two_inputs_are_no_chain():
    a, b = nn.Input(shape=(2,)), nn.Input(shape=(2,))
    with pytest.raises(ValueError, match="one input and one output"):
        chain_segments(nn.Model([a, b], nn.Add()(a, b)))
