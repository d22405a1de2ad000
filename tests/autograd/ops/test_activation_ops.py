"""Activations and (log-)softmax against PyTorch, and their numerical stability."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd import Tensor, ops


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_torch(torch, compare_with_torch, rng, approximate):
    compare_with_torch(
        lambda a: ops.gelu(a, approximate=approximate),
        lambda a: torch.nn.functional.gelu(a, approximate=approximate),
        [3 * rng.standard_normal((4, 6))],
    )


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_and_log_softmax_match_torch(torch, compare_with_torch, rng, axis):
    values = [rng.standard_normal((3, 4, 5))]
    compare_with_torch(
        lambda a: ops.softmax(a, axis=axis), lambda a: torch.softmax(a, dim=axis), values
    )
    compare_with_torch(
        lambda a: ops.log_softmax(a, axis=axis), lambda a: torch.log_softmax(a, dim=axis), values
    )


def test_softmax_family_is_stable_for_large_inputs():
    x = Tensor([[1000.0, 0.0, -1000.0]], requires_grad=True, dtype=np.float32)
    probabilities = ops.softmax(x)
    log_probabilities = ops.log_softmax(x)
    assert np.all(np.isfinite(probabilities.numpy()))
    np.testing.assert_allclose(log_probabilities.numpy(), [[0.0, -1000.0, -2000.0]])
    np.testing.assert_allclose(ops.sigmoid(x).numpy(), [[1.0, 0.5, 0.0]])


def test_gelu_rejects_an_unknown_approximation():
    with pytest.raises(ValueError, match="gelu: approximate must be 'none' or 'tanh'"):
        ops.gelu(Tensor([1.0]), approximate="fast")


@pytest.mark.parametrize("name", ["relu", "tanh"])
def test_relu_and_tanh_split_over_threads_match_the_whole_array(monkeypatch, rng, name):
    # Above MIN_ELEMENTWISE_SPLIT_BYTES both directions run one part of the batch per BLAS
    # thread; element-wise results cannot depend on the split.
    from bigdl_py import backend
    from bigdl_py.autograd.ops import conv_tiles

    values = rng.standard_normal((5, 3, 4)).astype(np.float32)
    upstream = rng.standard_normal((5, 3, 4)).astype(np.float32)

    def run():
        x = Tensor(values, requires_grad=True)
        output = getattr(ops, name)(x)
        (output * Tensor(upstream)).sum().backward()
        return output.numpy(), x.grad.numpy()

    with backend.blas_threads(2):
        whole = run()
        monkeypatch.setattr(conv_tiles, "MIN_ELEMENTWISE_SPLIT_BYTES", 0)
        parts = []
        real_for_each_tile = conv_tiles.for_each_tile
        monkeypatch.setattr(
            conv_tiles,
            "for_each_tile",
            lambda length, size, work: parts.append(size) or real_for_each_tile(length, size, work),
        )
        split = run()
    # 5 samples as 3 + 2, forward and backward; ReLU's forward splits its 60 values 30 + 30
    # (it runs on the flattened array, against a row of zeros).
    assert parts == ([30, 3] if name == "relu" else [3, 3])
    for got, want in zip(split, whole, strict=True):
        np.testing.assert_array_equal(got, want)


def test_relu_and_tanh_of_a_zero_dimensional_tensor():
    x = Tensor(np.float32(-0.5), requires_grad=True)
    ops.relu(x).backward()
    assert x.grad.numpy() == 0
    y = Tensor(np.float32(0.5), requires_grad=True)
    ops.tanh(y).backward()
    np.testing.assert_allclose(y.grad.numpy(), 1 - np.tanh(0.5) ** 2, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "strided"])
def test_relu_forward_equals_numpy_maximum_across_its_pieces(rng, dtype, contiguous):
    # Contiguous float arrays are compared with a row of zeros in pieces of 64K values: an
    # input of two pieces and a remainder, with NaN and both zeros, against np.maximum.
    values = rng.standard_normal((3, 2 * 43_691 + 2)).astype(dtype)
    values[0, :3] = [np.nan, -0.0, 0.0]
    if not contiguous:
        values = values[:, ::2]
    got = ops.relu(Tensor(values, _copy=False)).numpy()
    np.testing.assert_array_equal(got, np.maximum(values, 0))


@pytest.mark.parametrize(
    "apply, name",
    [(ops.sigmoid, "sigmoid"), (ops.gelu, "gelu"), (ops.leaky_relu, "leaky_relu")],
)
def test_integer_input_is_refused_not_truncated(apply, name):
    # The results were cast back to int64: sigmoid and gelu of [-2, 0, 3] gave [0, 0, 0] and
    # leaky_relu zeroed the negatives (int64(0.01) is 0).
    with pytest.raises(TypeError, match=f"{name}: input must be floating point, got dtype int64"):
        apply(Tensor(np.array([-2, 0, 3])))


@pytest.mark.parametrize("apply", [ops.softmax, ops.log_softmax])
def test_softmax_over_an_empty_axis_is_empty_as_pytorchs(torch, apply):
    x = Tensor(np.zeros((2, 3, 0)), requires_grad=True)
    output = apply(x, axis=-1)
    assert output.shape == (2, 3, 0) == tuple(torch.softmax(torch.zeros(2, 3, 0), -1).shape)
    output.sum().backward()
    assert x.grad.shape == (2, 3, 0)
