"""FlatParameters: one weight vector and one gradient vector that the parameters view."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.nn.module import Module, Parameter
from bigdl_py.optim import FlatParameters, flatten_parameters


def _inputs(rng, dtype=np.float64):
    from bigdl_py.autograd import Tensor

    return Tensor(rng.standard_normal((5, 4)).astype(dtype))


def test_parameters_become_views_of_the_weight_vector_with_their_values(rng, make_mlp):
    model = make_mlp(rng)
    before = {name: p.numpy().copy() for name, p in model.named_parameters()}
    flat = FlatParameters(model)

    assert flat.size == sum(value.size for value in before.values())
    assert [entry.name for entry in flat.entries] == list(before)
    for (name, parameter), entry in zip(model.named_parameters(), flat.entries, strict=True):
        assert np.shares_memory(parameter.data, flat.weights)
        assert np.shares_memory(parameter.grad.data, flat.gradients)
        np.testing.assert_array_equal(parameter.data, before[name])
        np.testing.assert_array_equal(flat.weights[entry.offset : entry.stop], before[name].ravel())
    assert not flat.gradients.any()


def test_writing_the_vector_changes_the_module(rng, make_mlp):
    model = make_mlp(rng)
    flat = flatten_parameters(model)
    flat.weights[...] = np.arange(flat.size)
    np.testing.assert_array_equal(
        np.concatenate([p.numpy().ravel() for p in model.parameters()]), np.arange(flat.size)
    )


def test_backward_accumulates_into_the_flat_gradient(rng, make_mlp):
    model, twin = make_mlp(7), make_mlp(7)
    flat = FlatParameters(model)
    inputs = _inputs(rng)
    for _ in range(2):  # twice: the second backward must add to the first, in place
        model(inputs).sum().backward()
        twin(inputs).sum().backward()
    expected = np.concatenate([p.grad.numpy().ravel() for p in twin.parameters()])
    np.testing.assert_allclose(flat.gradients, expected, rtol=1e-12)
    assert flat.is_attached()

    flat.zero_grad()
    assert not flat.gradients.any()
    model.zero_grad()  # the module's own zero_grad keeps the views too
    assert flat.is_attached()


def test_slice_views_match_bounds(rng, make_mlp):
    flat = FlatParameters(make_mlp(rng))
    pieces = [flat.slice(j, 4) for j in range(4)]
    np.testing.assert_array_equal(np.concatenate([w for w, _ in pieces]), flat.weights)
    for j, (weights, gradients) in enumerate(pieces):
        start, stop = flat.slice_bounds(j, 4)
        assert weights.shape == gradients.shape == (stop - start,)
        assert np.shares_memory(weights, flat.weights)
        assert np.shares_memory(gradients, flat.gradients)


def test_load_round_trip_keeps_the_same_vector(rng, make_mlp):
    model = make_mlp(rng)
    flat = FlatParameters(model)
    weights = flat.weights
    values = rng.standard_normal(flat.size)
    flat.load(values)
    assert flat.weights is weights and flat.is_attached()
    np.testing.assert_array_equal(flat.weights, values)
    reloaded = np.concatenate([v.ravel() for v in model.state_dict().values()])
    np.testing.assert_array_equal(reloaded, values)


def test_load_refuses_wrong_shape_and_dtype(rng, make_mlp):
    flat = FlatParameters(make_mlp(rng))
    with pytest.raises(ValueError, match=rf"shape \({flat.size},\)"):
        flat.load(np.zeros(flat.size + 1))
    with pytest.raises(ValueError, match="dtype float32"):
        flat.load(np.zeros(flat.size, dtype=np.float32))


def test_unravel_and_named_views(rng, make_mlp):
    model = make_mlp(rng)
    flat = FlatParameters(model)
    vector = np.arange(flat.size, dtype=np.float64)
    shaped = flat.unravel(vector)
    for name, parameter in model.named_parameters():
        assert shaped[name].shape == parameter.shape
        assert np.shares_memory(shaped[name], vector)
    for (name, weight_view, gradient_view), (parameter_name, parameter) in zip(
        flat.named_views(), model.named_parameters(), strict=True
    ):
        assert name == parameter_name
        assert weight_view is parameter.data and gradient_view is parameter.grad.data
    with pytest.raises(ValueError, match="expected shape"):
        flat.unravel(vector[1:])


def test_group_mask_and_ranges_select_parameters(rng, make_mlp):
    flat = FlatParameters(make_mlp(rng))
    ranges = flat.ranges_where(lambda name, p: name.endswith("bias"))
    biases = [entry for entry in flat.entries if entry.name.endswith("bias")]
    assert ranges == [(entry.offset, entry.stop) for entry in biases]
    mask = flat.group_mask(lambda name, p: p.ndim == 1)
    assert mask.sum() == sum(entry.size for entry in biases)
    # Adjacent selected parameters merge into one range.
    assert flat.ranges_where(lambda name, p: name.startswith("output")) == [
        (flat.entries[2].offset, flat.size)
    ]


def test_float32_stays_float32(rng, make_mlp):
    flat = FlatParameters(make_mlp(rng, np.float32))
    assert flat.weights.dtype == flat.gradients.dtype == np.float32


def test_flattening_twice_rebinds_and_detaches_the_old_one(rng, make_mlp):
    model = make_mlp(rng)
    first = FlatParameters(model)
    first.weights[...] = 3.0
    second = FlatParameters(model)
    np.testing.assert_array_equal(second.weights, 3.0)
    assert second.is_attached() and not first.is_attached()
    with pytest.raises(RuntimeError, match="no longer view"):
        first.load(np.zeros(first.size))
    second.load(np.ones(second.size))
    assert all((p.numpy() == 1).all() for p in model.parameters())


def test_moving_the_module_detaches(rng, make_mlp):
    model = make_mlp(rng)
    flat = FlatParameters(model)
    model.to(dtype=np.float32)
    assert not flat.is_attached()


class _Mixed(Module):
    def __init__(self, first, second, trainable=True):
        super().__init__()
        self.first = Parameter(first, requires_grad=trainable)
        self.second = Parameter(second, requires_grad=False)


def test_refuses_mixed_dtypes_non_float_and_empty_modules():
    with pytest.raises(ValueError, match=r"'first' is float32 and 'second' is float64"):
        FlatParameters(_Mixed(np.zeros(2, np.float32), np.zeros(3, np.float64)))
    with pytest.raises(ValueError, match="int64"):
        FlatParameters(_Mixed(np.zeros(2, np.int64), np.zeros(3, np.int64), trainable=False))
    with pytest.raises(ValueError, match="has no parameters"):
        FlatParameters(Module())


def test_repr_names_size_and_dtype(rng, make_mlp):
    text = repr(FlatParameters(make_mlp(rng)))
    assert "size=23" in text and "float64" in text


@pytest.mark.gpu
def test_flat_parameters_on_gpu(rng, make_mlp):
    if not backend.cuda_available():
        pytest.skip("needs CuPy and a CUDA device")
    model = make_mlp(rng).to("cuda")
    flat = FlatParameters(model)
    assert backend.is_cupy_array(flat.weights) and backend.is_cupy_array(flat.gradients)
    host = rng.standard_normal(flat.size)
    flat.load(host)
    np.testing.assert_array_equal(backend.as_numpy(flat.weights), host)
    model(_inputs(rng).to("cuda")).sum().backward()
    assert float(abs(flat.gradients).sum()) > 0
    assert flat.is_attached()
