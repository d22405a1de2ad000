"""LSTM and GRU layers on cuDNN's RNN API (``bigdl_py.nn._rnn_cudnn``, its weight layout
``_rnn_weight_space``).

Without a GPU: the mapping of PyTorch's parameters (gate blocks in PyTorch's order) to
cuDNN's weight space on layouts cuDNN may report, the packed output and its gradient, the
route choice and fallback, and the whole route's plumbing (parameters in, gradients out in
the Function's order, states, bias or none, both layouts) on a stand-in layer that runs
the NumPy recurrence on the weights it unpacks from a weight space.

With a GPU (``gpu``): the route against the CuPy recurrence (``BIGDL_PY_CUDNN=0``) and
NumPy float64, checked to have run, in training and inference.
"""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend, nn
from bigdl_py.autograd import Tensor, no_grad
from bigdl_py.autograd.ops import cudnn
from bigdl_py.autograd.ops.cudnn import CudnnError
from bigdl_py.nn import _recurrent_functions, _rnn_cudnn, _rnn_weight_space
from bigdl_py.nn._rnn_cudnn import Geometry
from bigdl_py.nn._rnn_weight_space import GATES, copy_runs, pack, unpack

# --- where PyTorch's gate blocks go --------------------------------------------------------------


def cudnn_like_layout(cell, directions, features, size, with_bias):
    """``locate`` of the layout cuDNN's standard algorithm uses: per direction, the input
    matrices of linear layers 0..G-1, the hidden ones, then every bias; and its size."""
    gates = GATES[cell]
    matrices = gates * size * (features + size)
    per_direction = matrices + (2 * gates * size if with_bias else 0)

    def locate(pseudo_layer, layer_id, is_bias):
        start = pseudo_layer * per_direction
        if is_bias:
            return start + matrices + layer_id * size, size
        if layer_id < gates:
            return start + layer_id * size * features, size * features
        return start + gates * size * features + (layer_id - gates) * size * size, size * size

    return locate, directions * per_direction


def scrambled_layout(cell, directions, features, size, with_bias):
    """Blocks in reverse order with a gap after each: nothing merges."""
    blocks = list(_rnn_weight_space.pytorch_blocks(cell, directions, features, size, with_bias))
    offsets, position = {}, 0
    for pseudo_layer, layer_id, is_bias, _, _, length in reversed(blocks):
        offsets[pseudo_layer, layer_id, is_bias] = (position, length)
        position += length + 3

    def locate(pseudo_layer, layer_id, is_bias):
        return offsets[pseudo_layer, layer_id, is_bias]

    return locate, position


def pytorch_parameters(rng, cell, directions, features, size, with_bias):
    rows = GATES[cell] * size
    shapes = [(directions, rows, features), (directions, rows, size)]
    shapes += [(directions, rows)] * (2 if with_bias else 0)
    return [rng.standard_normal(shape) for shape in shapes]


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("directions", [1, 2])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("layout", [cudnn_like_layout, scrambled_layout])
def test_each_gate_block_lands_where_cudnn_says(cell, directions, with_bias, layout):
    features, size = 5, 3
    locate, space_size = layout(cell, directions, features, size, with_bias)
    runs = copy_runs(cell, directions, features, size, with_bias, locate)
    parameters = pytorch_parameters(
        np.random.default_rng(0), cell, directions, features, size, with_bias
    )
    space = np.full(space_size, np.nan)
    pack(space, parameters, runs)
    ids = _rnn_weight_space.LINEAR_LAYERS[cell]
    for direction in range(directions):
        for gate in range(GATES[cell]):
            rows = slice(gate * size, (gate + 1) * size)
            expected = [(ids["input"][gate], False, parameters[0][direction, rows])]
            expected.append((ids["hidden"][gate], False, parameters[1][direction, rows]))
            if with_bias:
                expected.append((ids["input"][gate], True, parameters[2][direction, rows]))
                expected.append((ids["hidden"][gate], True, parameters[3][direction, rows]))
            for layer_id, is_bias, block in expected:
                offset, length = locate(direction, layer_id, is_bias)
                np.testing.assert_array_equal(space[offset : offset + length], block.ravel())
    back = [np.empty_like(p) for p in parameters]
    unpack(space, back, runs)
    for got, want in zip(back, parameters, strict=True):
        np.testing.assert_array_equal(got, want)


def test_runs_merge_where_both_sides_continue():
    locate, _ = cudnn_like_layout("lstm", 2, 5, 3, True)
    runs = copy_runs("lstm", 2, 5, 3, True, locate)
    # each parameter's direction is one run: its four gates lie in order in both places
    assert len(runs) == 8
    assert sorted((run.source, run.length) for run in runs) == sorted(
        [(0, 4 * 3 * 5)] * 2 + [(1, 4 * 3 * 3)] * 2 + [(2, 12)] * 2 + [(3, 12)] * 2
    )


def test_a_block_of_another_size_declines():
    def locate(pseudo_layer, layer_id, is_bias):
        return 0, 7

    with pytest.raises(CudnnError, match="PyTorch's weight_ih block 15"):
        copy_runs("gru", 1, 5, 3, True, locate)


# --- the packed output and its gradient -----------------------------------------------------------


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("state_count", [1, 2])
def test_the_packed_output_is_the_recurrences(batch_first, state_count):
    rng = np.random.default_rng(1)
    steps, batch, directions, size = 4, 3, 2, 5
    shape = (batch, steps) if batch_first else (steps, batch)
    sequence = rng.standard_normal(shape + (directions * size,))
    states = [rng.standard_normal((directions, batch, size)) for _ in range(state_count)]
    output = _rnn_cudnn.layer_output(np, sequence, states, batch_first)
    assert output.shape[1 if batch_first else 0] == steps + state_count
    time_major = _recurrent_functions._time_major_blocks(output, directions, batch_first)
    np.testing.assert_array_equal(
        time_major[:steps].reshape(steps, batch, -1),
        sequence if not batch_first else sequence.swapaxes(0, 1),
    )
    for index, state in enumerate(states):  # as nn.LSTM/GRU read the final states
        np.testing.assert_array_equal(time_major[steps + index].transpose(1, 0, 2), state)
    sequence_back, states_back = _rnn_cudnn.split_gradient(
        np, output, steps, directions, state_count, batch_first
    )
    np.testing.assert_array_equal(sequence_back, sequence)
    assert sequence_back.flags.c_contiguous
    for got, want in zip(states_back, states, strict=True):
        np.testing.assert_array_equal(got, want)
        assert got.flags.c_contiguous


def test_geometry_settings():
    geometry = Geometry("lstm", 7, 3, 5, 4, 2, True, True, "<f4", True, False)
    assert geometry.data_layout() == cudnn.CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED
    assert geometry.state_shape() == (2, 3, 4)
    assert geometry.math_precision() == cudnn.CUDNN_DATA_FLOAT
    time_major = Geometry("gru", 7, 3, 5, 4, 1, False, False, "<f8", False, False)
    assert time_major.data_layout() == cudnn.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED
    assert time_major.math_precision() == cudnn.CUDNN_DATA_DOUBLE


# --- the route, on a stand-in layer ---------------------------------------------------------------


class ReferenceLayer:
    """A :class:`_rnn_cudnn._Layer` stand-in: a cuDNN-like weight space, and the NumPy
    recurrence run on the parameters unpacked from it."""

    made: list = []
    inside = [False]

    def __init__(self, geometry: Geometry):
        self.geometry = geometry
        g = geometry
        locate, self.space_size = scrambled_layout(
            g.cell, g.directions, g.features, g.size, g.with_bias
        )
        self.runs = copy_runs(g.cell, g.directions, g.features, g.size, g.with_bias, locate)
        ReferenceLayer.made.append(geometry)

    def _parameters(self, space):
        shapes = _rnn_cudnn._parameter_shapes(self.geometry)[: 4 if self.geometry.with_bias else 2]
        parameters = [np.empty(shape) for shape in shapes]
        unpack(space, parameters, self.runs)
        return parameters + [None] * (4 - len(parameters))

    def weight_space(self, parameters):
        space = np.zeros(self.space_size)
        pack(space, parameters, self.runs)
        return space

    def forward(self, x, space, states):
        weight_ih, weight_hh, bias_ih, bias_hh = self._parameters(space)
        sequence_class = (
            _recurrent_functions.LSTMSequence
            if self.geometry.cell == "lstm"
            else _recurrent_functions.GRUSequence
        )
        function = sequence_class()
        ReferenceLayer.inside[0] = True
        try:
            packed = function.forward(
                x, weight_ih, weight_hh, *states, bias_ih, bias_hh, self.geometry.batch_first
            )
        finally:
            ReferenceLayer.inside[0] = False
        function.needs_input_grad = (True,) * 7
        sequence, finals = _rnn_cudnn.split_gradient(
            np, packed, self.geometry.steps, self.geometry.directions, len(states),
            self.geometry.batch_first,
        )  # fmt: skip
        return sequence, finals, function

    def backward(self, saved, grad_sequence, grad_finals, weights_needed):
        x, space, sequence, function, *states = saved
        grad_packed = _rnn_cudnn.layer_output(
            np, grad_sequence, grad_finals, self.geometry.batch_first
        )
        grads = function.backward(grad_packed)
        grad_x, grad_states = grads[0], list(grads[3 : 3 + len(states)])
        grad_space = None
        if weights_needed:
            weight_grads = [grads[1], grads[2], *grads[3 + len(states) :]]
            grad_space = self.weight_space(weight_grads[: 4 if self.geometry.with_bias else 2])
        return grad_x, grad_states, grad_space


@pytest.fixture
def reference_route(monkeypatch):
    """Recurrent layers on NumPy operands take the cuDNN route, run by ReferenceLayer."""
    ReferenceLayer.made = []
    monkeypatch.setattr(cudnn, "applies_to", lambda *arrays: not ReferenceLayer.inside[0])
    monkeypatch.setattr(_rnn_cudnn, "_layer", ReferenceLayer)
    return ReferenceLayer.made


def _like(values, tensor):
    """Host ``values`` as a constant Tensor on ``tensor``'s device, in its dtype."""
    return Tensor(backend.to_device(values.astype(tensor.dtype), tensor.device))


def _run_layer(layer, x, states):
    x = Tensor(x, requires_grad=True)
    hx = None
    if states is not None:
        hx = tuple(Tensor(s, requires_grad=True) for s in states)
        hx = hx if isinstance(layer, nn.LSTM) else hx[0]
    output, final = layer(x, hx)
    finals = final if isinstance(final, tuple) else (final,)
    rng = np.random.default_rng(9)
    loss = (output * _like(rng.standard_normal(output.shape), output)).sum()
    for state in finals:
        loss = loss + (state * _like(rng.standard_normal(state.shape), state)).sum()
    loss.backward()
    results = [output.numpy(), *(s.numpy() for s in finals), x.grad.numpy()]
    if hx is not None:
        results += [s.grad.numpy() for s in (hx if isinstance(hx, tuple) else (hx,))]
    return results + [p.grad.numpy() for p in layer.parameters()]


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
@pytest.mark.parametrize(
    ("bidirectional", "batch_first", "bias", "with_states"),
    [(True, True, True, False), (False, False, True, True), (True, False, False, True)],
)
def test_the_route_gives_the_recurrences_results(
    monkeypatch, reference_route, kind, bidirectional, batch_first, bias, with_states
):
    layer = kind(4, 3, num_layers=2, bias=bias, batch_first=batch_first,
                 bidirectional=bidirectional, dtype=np.float64)  # fmt: skip
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 5, 4) if batch_first else (5, 2, 4))
    count = 2 if kind is nn.LSTM else 1
    states = [rng.standard_normal((2 * layer.directions, 2, 3)) for _ in range(count)]
    states = states if with_states else None
    through_route = _run_layer(layer, x, states)
    assert len(reference_route) == 2  # both layers ran on the route
    assert {g.cell for g in reference_route} == {"lstm" if kind is nn.LSTM else "gru"}
    assert all(g.training and g.with_bias is bias for g in reference_route)
    monkeypatch.setattr(cudnn, "applies_to", lambda *arrays: False)
    for parameter in layer.parameters():
        parameter.grad = None
    for got, want in zip(through_route, _run_layer(layer, x, states), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_an_inference_forward_asks_for_an_inference_geometry(reference_route):
    layer = nn.LSTM(4, 3, dtype=np.float64)
    with no_grad():
        layer(Tensor(np.ones((2, 5, 4))))
    assert [g.training for g in reference_route] == [False]


def test_a_declined_geometry_runs_the_recurrence(monkeypatch):
    monkeypatch.setattr(cudnn, "applies_to", lambda *arrays: True)
    monkeypatch.setattr(_rnn_cudnn, "_layer", lambda geometry: None)
    layer = nn.GRU(4, 3, bidirectional=True, dtype=np.float64)
    x = np.random.default_rng(3).standard_normal((2, 5, 4))
    declined = _run_layer(layer, x, None)
    monkeypatch.setattr(cudnn, "applies_to", lambda *arrays: False)
    for parameter in layer.parameters():
        parameter.grad = None
    for got, want in zip(declined, _run_layer(layer, x, None), strict=True):
        np.testing.assert_array_equal(got, want)


# --- on a GPU -------------------------------------------------------------------------------------

requires_gpu = pytest.mark.skipif(
    not backend.cuda_available(), reason="needs CuPy and a CUDA device"
)


@pytest.fixture
def cudnn_layers(monkeypatch):
    """Every real cuDNN layer forward (a GPU machine without cuDNN 9 fails here)."""
    monkeypatch.delenv(cudnn.SWITCH_VARIABLE, raising=False)
    if cudnn.loaded() is None:
        pytest.fail("cuDNN 9 does not load: install the 'gpu' or 'gpu-cuda13' extra")
    runs = []
    real = _rnn_cudnn._Layer.forward

    def counted(self, *args):
        runs.append(self.geometry)
        return real(self, *args)

    monkeypatch.setattr(_rnn_cudnn._Layer, "forward", counted)
    return runs


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(
    ("bidirectional", "batch_first", "bias", "with_states"),
    [(True, True, True, False), (False, False, True, True), (True, False, False, True)],
)
def test_gpu_cudnn_matches_the_cupy_recurrence_and_numpy(
    monkeypatch, cudnn_layers, kind, dtype, bidirectional, batch_first, bias, with_states
):
    monkeypatch.setattr(backend, "_tf32", {"matmul": False, "cudnn": False})  # exact float32
    layer = kind(4, 3, num_layers=2, bias=bias, batch_first=batch_first,
                 bidirectional=bidirectional, dtype=np.float64)  # fmt: skip
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 5, 4) if batch_first else (5, 2, 4))
    count = 2 if kind is nn.LSTM else 1
    states = [rng.standard_normal((2 * layer.directions, 2, 3)) for _ in range(count)]
    states = states if with_states else None
    reference = _run_layer(layer, x, states)
    cupy = backend.cupy_module()
    on_device = layer.to(device="cuda", dtype=dtype)

    def device_run():
        for parameter in on_device.parameters():
            parameter.grad = None
        device_states = None if states is None else [cupy.asarray(s, dtype=dtype) for s in states]
        return _run_layer(on_device, cupy.asarray(x, dtype=dtype), device_states)

    through_cudnn = device_run()
    assert len(cudnn_layers) == 2, f"declined: {_rnn_cudnn.declined()}"
    monkeypatch.setenv(cudnn.SWITCH_VARIABLE, "0")
    cupy_route = device_run()
    assert len(cudnn_layers) == 2
    tolerance = 1e-10 if dtype == "float64" else 1e-4
    for got, cupy_got, want in zip(through_cudnn, cupy_route, reference, strict=True):
        got, cupy_got = backend.as_numpy(got), backend.as_numpy(cupy_got)
        np.testing.assert_allclose(got, cupy_got, rtol=tolerance, atol=tolerance)
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU])
def test_gpu_inference_equals_the_training_forward(cudnn_layers, kind):
    layer = kind(6, 5, bidirectional=True).to(device="cuda", dtype=np.float64)
    x = Tensor(backend.cupy_module().asarray(np.random.default_rng(4).standard_normal((3, 7, 6))))
    trained, _ = layer(x)
    with no_grad():
        inferred, _ = layer(x)
    assert [g.training for g in cudnn_layers] == [True, False]
    np.testing.assert_allclose(inferred.numpy(), trained.numpy(), rtol=1e-12, atol=1e-12)
