"""The LSTM's oneDNN route (float32, ``bigdl_py.nn._lstm_onednn``) against the NumPy
recurrence in float64, against PyTorch, and its fallbacks.

Each case runs the same layer twice: in float32 (oneDNN's route, checked to have been
taken) and in float64 (the NumPy recurrence, which ``test_recurrent.py`` checks against
finite differences and PyTorch); outputs, final states and the gradients of the input, the
initial states and every parameter agree to float32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend, nn
from bigdl_py.autograd import Tensor, no_grad, ops
from bigdl_py.autograd.ops import onednn
from bigdl_py.nn import _lstm_onednn

needs_onednn = pytest.mark.skipif(
    not onednn.available(), reason="oneDNN's library (onednn-cpu-gomp) is not installed"
)


@pytest.fixture
def onednn_calls(monkeypatch):
    """The ``(method, reverse)`` of every call of the route's forward and backward."""
    calls = []
    for method in ("forward", "backward"):
        real = getattr(_lstm_onednn._Direction, method)

        def counted(self, *args, _real=real, _method=method):
            calls.append((_method, self.direction == onednn.UNIDIRECTIONAL_RIGHT2LEFT))
            return _real(self, *args)

        monkeypatch.setattr(_lstm_onednn._Direction, method, counted)
    return calls


def run_layer(layer, x, states, dtype):
    """Outputs and gradients of a layer copy in ``dtype``: everything as float64 arrays."""
    layer = layer.to(dtype=dtype)
    layer.zero_grad()
    our_x = Tensor(x, dtype=dtype, requires_grad=True)
    hx = None
    if states is not None:
        hx = tuple(Tensor(s, dtype=dtype, requires_grad=True) for s in states)
    output, (hidden, cell) = layer(our_x, hx)
    weights = np.random.default_rng(7).standard_normal(output.shape)
    loss = (output * Tensor(weights, dtype=dtype)).sum() + (hidden * hidden).sum()
    (loss + 0.5 * (cell * cell).sum()).backward()
    results = [output.numpy(), hidden.numpy(), cell.numpy(), our_x.grad.numpy()]
    if hx is not None:
        results += [state.grad.numpy() for state in hx]
    results += [parameter.grad.numpy() for parameter in layer.parameters()]
    return [np.asarray(result, dtype=np.float64) for result in results]


def assert_close_to_float64(got, want):
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5 * max(1.0, np.abs(w).max()))


CASES = [
    pytest.param({}, True, id="one_direction"),
    pytest.param({"bidirectional": True}, True, id="bidirectional"),
    pytest.param({"bidirectional": True, "batch_first": False}, False, id="time_major_zero_state"),
    pytest.param({"num_layers": 2, "bidirectional": True}, True, id="two_layers"),
    pytest.param({"bias": False, "bidirectional": True}, True, id="no_bias"),
]


@needs_onednn
@pytest.mark.parametrize("kwargs, with_state", CASES)
@pytest.mark.parametrize("threads", [1, 2])
def test_onednn_route_matches_the_float64_recurrence(kwargs, with_state, threads, onednn_calls):
    kwargs = {"batch_first": True, **kwargs}
    batch_first = kwargs["batch_first"]
    steps, batch, features, hidden = 7, 3, 5, 4
    layer = nn.LSTM(features, hidden, **kwargs)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, steps, features) if batch_first else (steps, batch, features))
    rows = layer.num_layers * (2 if layer.bidirectional else 1)
    states = None
    if with_state:
        states = tuple(rng.standard_normal((rows, batch, hidden)) for _ in range(2))
    with backend.blas_threads(threads):
        got = run_layer(layer, x, states, np.float32)
        assert sorted(set(onednn_calls)) == sorted(
            {
                (m, r)
                for m in ("forward", "backward")
                for r in (False, True)[: rows // layer.num_layers]
            }
        )
        onednn_calls.clear()
        want = run_layer(layer, x, states, np.float64)
    assert not onednn_calls  # float64 keeps to the NumPy recurrence
    assert_close_to_float64(got, want)


@needs_onednn
def test_onednn_route_matches_pytorch(onednn_calls):
    torch = pytest.importorskip("torch")
    layer = nn.LSTM(6, 5, batch_first=True, bidirectional=True)
    x = np.random.default_rng(1).standard_normal((4, 9, 6)).astype(np.float32)
    our_x = Tensor(x, requires_grad=True)
    output, (hidden, cell) = layer(our_x)
    (output.sum() + (hidden * cell).sum()).backward()
    assert onednn_calls
    reference = torch.nn.LSTM(6, 5, batch_first=True, bidirectional=True)
    state = {name: torch.from_numpy(array) for name, array in layer.state_dict().items()}
    reference.load_state_dict(state, strict=True)
    torch_x = torch.from_numpy(x).requires_grad_()
    torch_output, (torch_hidden, torch_cell) = reference(torch_x)
    (torch_output.sum() + (torch_hidden * torch_cell).sum()).backward()
    pairs = [(output, torch_output), (hidden, torch_hidden), (cell, torch_cell)]
    pairs += [(our_x.grad, torch_x.grad)]
    pairs += [
        (p.grad, q.grad) for p, q in zip(layer.parameters(), reference.parameters(), strict=True)
    ]
    for ours, theirs in pairs:
        np.testing.assert_allclose(
            np.asarray(ours.numpy()), theirs.detach().numpy(), rtol=1e-4, atol=1e-5
        )


@needs_onednn
def test_inference_keeps_no_workspace_and_gives_the_training_output(onednn_calls):
    layer = nn.LSTM(3, 4, bidirectional=True, batch_first=True)
    x = Tensor(np.random.default_rng(2).standard_normal((2, 5, 3)), dtype=np.float32)
    with no_grad():
        inferred = layer(x)[0].numpy()
    direction = _lstm_onednn.direction(5, 2, 3, 4, False, True, training=False)
    assert direction is not None and direction.workspace_bytes == 0
    trained = layer(x)[0].numpy()
    # Two primitives (inference keeps no workspace), so two kernels: the same values to
    # float32 rounding, not bit for bit (they differed by 3.7e-8 on a busy machine).
    np.testing.assert_allclose(inferred, trained, rtol=1e-5, atol=1e-6)
    assert [method for method, _ in onednn_calls] == ["forward"] * 4


@needs_onednn
def test_weight_gradients_are_overwritten_not_added(onednn_calls):
    # oneDNN's RNN backward adds to its weight-gradient buffers unless told otherwise; ours
    # are new each backward, so two backwards must give the same gradient.
    layer = nn.LSTM(3, 4, batch_first=True)
    x = Tensor(np.random.default_rng(3).standard_normal((2, 5, 3)), dtype=np.float32)
    grads = []
    for _ in range(2):
        layer.zero_grad()
        layer(x)[0].sum().backward()
        grads.append([np.array(p.grad.numpy()) for p in layer.parameters()])
    for first, second in zip(*grads, strict=True):
        # Added gradients would be twice the first; rounding of a re-run is far below that.
        np.testing.assert_allclose(second, first, rtol=1e-5, atol=1e-6)


@needs_onednn
def test_the_switch_and_a_declined_geometry_take_the_numpy_recurrence(onednn_calls, monkeypatch):
    layer = nn.LSTM(3, 4, bidirectional=True, batch_first=True)
    x = np.random.default_rng(4).standard_normal((2, 5, 3))
    want = run_layer(layer, x, None, np.float64)
    monkeypatch.setenv(onednn.SWITCH_VARIABLE, "0")
    assert_close_to_float64(run_layer(layer, x, None, np.float32), want)
    assert not onednn_calls
    monkeypatch.delenv(onednn.SWITCH_VARIABLE)
    monkeypatch.setattr(_lstm_onednn, "direction", lambda *args: None)
    assert_close_to_float64(run_layer(layer, x, None, np.float32), want)
    assert not onednn_calls


@needs_onednn
def test_empty_batch_takes_the_numpy_recurrence(onednn_calls):
    layer = nn.LSTM(3, 4, bidirectional=True, batch_first=True)
    output, (hidden, _) = layer(Tensor(np.zeros((0, 5, 3)), dtype=np.float32))
    assert output.shape == (0, 5, 8) and hidden.shape == (2, 0, 4)
    assert not onednn_calls


@needs_onednn
def test_a_non_contiguous_input_takes_the_route(onednn_calls):
    layer = nn.LSTM(3, 4, bidirectional=True, batch_first=True)
    x = np.random.default_rng(5).standard_normal((5, 2, 3)).astype(np.float32)
    strided = Tensor(x, requires_grad=True)
    output = layer(ops.permute(strided, (1, 0, 2)))[0]
    output.sum().backward()
    reference = layer(Tensor(np.ascontiguousarray(x.transpose(1, 0, 2))))[0]
    np.testing.assert_allclose(output.numpy(), reference.numpy(), rtol=1e-5, atol=1e-6)
    assert strided.grad.shape == x.shape and onednn_calls
