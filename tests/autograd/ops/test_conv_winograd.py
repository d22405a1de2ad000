"""conv2d's Winograd route (``conv_winograd``): the same results as the im2col GEMMs."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.autograd import Tensor, gradcheck, ops
from bigdl_py.autograd.ops import conv, conv_tiles, conv_winograd


def results(op, arrays, **settings):
    """Output and the gradients of every input, in float64."""
    tensors = [Tensor(a, requires_grad=True, dtype=np.float64) for a in arrays]
    output = op(*tensors, **settings)
    output.backward(np.random.default_rng(5).standard_normal(output.shape))
    return [output.numpy()] + [t.grad.numpy() for t in tensors]


@pytest.fixture
def winograd_calls(monkeypatch):
    """Every convolution of >= 1 channel may take the Winograd route; count the calls."""
    calls = []
    real = conv_winograd.convolve
    monkeypatch.setattr(conv_winograd, "MIN_CHANNELS", 1)
    monkeypatch.setattr(
        conv_winograd, "convolve", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs)
    )
    return calls


@pytest.mark.parametrize(
    "input_shape, settings",
    [
        ((3, 4, 6, 6), {"padding": 1}),  # even output: whole 2x2 blocks
        ((2, 3, 5, 7), {"padding": 1}),  # odd height and width: blocks cut at the edge
        ((2, 3, 6, 5), {}),  # no padding: 4x3 output
        ((2, 3, 4, 4), {"padding": 2}),  # padding wider than the kernel's reach
        ((1, 2, 3, 3), {"padding": (0, 1)}),  # a 1x3 output
        ((2, 5, 1, 1), {"padding": 1}),  # one pixel
    ],
)
def test_winograd_route_gives_the_direct_results(
    monkeypatch, rng, winograd_calls, input_shape, settings
):
    arrays = [
        rng.standard_normal(input_shape),
        rng.standard_normal((4, input_shape[1], 3, 3)),
        rng.standard_normal(4),
    ]
    winograd = results(ops.conv2d, arrays, **settings)
    # The forward, and the input gradient where it takes the flipped kernel.
    calls = len(winograd_calls)
    assert calls >= 1
    monkeypatch.setattr(conv_winograd, "MIN_CHANNELS", 10**9)
    direct = results(ops.conv2d, arrays, **settings)
    assert len(winograd_calls) == calls
    for got, want in zip(winograd, direct, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_winograd_route_passes_gradcheck(make_tensor, winograd_calls):
    x, weight, bias = make_tensor(2, 3, 5, 4), make_tensor(2, 3, 3, 3), make_tensor(2)
    assert gradcheck(lambda a, w, b: ops.conv2d(a, w, b, padding=1), [x, weight, bias])
    assert winograd_calls


@pytest.mark.parametrize(
    "settings",
    [{}, {"padding": 1}, {"padding": 1, "output_padding": 0}, {"padding": 2}],
)
def test_conv_transpose2d_forward_on_the_winograd_route(monkeypatch, rng, winograd_calls, settings):
    # ConvTranspose2d's forward is conv2d's input gradient: a convolution of the
    # zero-padded input with the flipped kernel, whose frame drops what no window reaches.
    arrays = [rng.standard_normal((2, 3, 5, 6)), rng.standard_normal((3, 4, 3, 3))]
    winograd = results(ops.conv_transpose2d, arrays, **settings)
    assert winograd_calls
    monkeypatch.setattr(conv_winograd, "MIN_CHANNELS", 10**9)
    for got, want in zip(winograd, results(ops.conv_transpose2d, arrays, **settings), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("samples_per_tile", [1, 3])
def test_winograd_tiles_shared_among_threads_give_the_one_tile_result(
    monkeypatch, rng, winograd_calls, samples_per_tile
):
    arrays = [rng.standard_normal((7, 3, 6, 5)), rng.standard_normal((2, 3, 3, 3))]
    with backend.blas_threads(1):
        expected = results(ops.conv2d, arrays, padding=1)
    monkeypatch.setattr(conv_winograd, "tile_size", lambda *args: samples_per_tile)
    with backend.blas_threads(2):
        tiled = results(ops.conv2d, arrays, padding=1)
        assert conv_tiles.worker_count() == 2
    for got, want in zip(tiled, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_float32_winograd_error_is_that_of_the_direct_sum(rng, monkeypatch):
    # Additions only (and exact halvings of the kernel): the rounding error stays of the
    # direct GEMMs' order. (float32 takes oneDNN's route where installed: switched off.)
    monkeypatch.setenv("BIGDL_PY_ONEDNN", "0")
    x = rng.standard_normal((4, 128, 8, 8)).astype(np.float32)
    weight = rng.standard_normal((128, 128, 3, 3)).astype(np.float32)
    assert conv_winograd.applies(weight.shape, (1, 1), (1, 1), 1, False, np.float32)
    exact = ops.conv2d(Tensor(x, dtype=np.float64), Tensor(weight, dtype=np.float64), padding=1)
    got = ops.conv2d(Tensor(x), Tensor(weight), padding=1).numpy()
    scale = np.abs(exact.numpy()).max()
    assert np.abs(got - exact.numpy()).max() / scale < 2e-6


@pytest.mark.parametrize(
    "weight_shape, stride, dilation, groups",
    [
        ((128, 128, 3, 3), (1, 1), (1, 1), 1),
        ((128, 128, 3, 3), (2, 2), (1, 1), 1),
        ((128, 128, 3, 3), (1, 1), (2, 2), 1),
        ((128, 64, 3, 3), (1, 1), (1, 1), 2),
        ((128, 128, 1, 1), (1, 1), (1, 1), 1),
        ((64, 64, 3, 3), (1, 1), (1, 1), 1),
    ],
)
def test_only_wide_3x3_stride_one_convolutions_take_the_winograd_route(
    weight_shape, stride, dilation, groups
):
    expected = weight_shape == (128, 128, 3, 3) and stride == dilation == (1, 1)
    settings = (weight_shape, stride, dilation, groups)
    assert conv_winograd.applies(*settings, False, np.float32) == expected
    assert conv_winograd.applies(*settings, False, np.float64) == expected
    assert not conv_winograd.applies(*settings, True, np.float32)  # on a GPU
    assert not conv_winograd.applies(*settings, False, np.int64)  # the transform halves


def test_an_integer_convolution_keeps_the_direct_route(rng, monkeypatch):
    monkeypatch.setattr(conv_winograd, "MIN_CHANNELS", 1)
    x = rng.integers(-3, 4, size=(2, 3, 5, 5))
    weight = rng.integers(-3, 4, size=(4, 3, 3, 3))
    got = ops.conv2d(Tensor(x), Tensor(weight), padding=1).numpy()
    exact = ops.conv2d(Tensor(x, dtype=np.float64), Tensor(weight, dtype=np.float64), padding=1)
    np.testing.assert_array_equal(got, exact.numpy())


@pytest.mark.parametrize(
    "min_channels, dtype",
    [(1, np.float64), (10**9, np.float64), (10**9, np.float32)],
    ids=["winograd", "direct", "float32"],  # float32: past oneDNN's route, which declines it
)
def test_an_empty_batch_gives_zero_weight_and_bias_gradients(monkeypatch, min_channels, dtype):
    monkeypatch.setattr(conv_winograd, "MIN_CHANNELS", min_channels)
    x = Tensor(np.zeros((0, 3, 5, 5), dtype=dtype), requires_grad=True)
    weight = Tensor(np.ones((4, 3, 3, 3), dtype=dtype), requires_grad=True)
    bias = Tensor(np.ones(4, dtype=dtype), requires_grad=True)
    output = ops.conv2d(x, weight, bias, padding=1)
    assert output.shape == (0, 4, 5, 5)
    output.sum().backward()
    assert x.grad.shape == (0, 3, 5, 5)
    np.testing.assert_array_equal(weight.grad.numpy(), np.zeros((4, 3, 3, 3)))
    np.testing.assert_array_equal(bias.grad.numpy(), np.zeros(4))


def test_kernel_transform_is_g_g_gt(rng):
    weight = rng.standard_normal((3, 2, 3, 3))
    g = conv_winograd._G
    expected = np.einsum("ai,ocij,bj->aboc", g, weight, g).reshape(16, 3, 2)
    np.testing.assert_allclose(conv_winograd.kernel_transform(weight), expected, rtol=1e-14)


def test_direct_route_untouched_below_the_channel_threshold(rng, tile_calls):
    seen = tile_calls(conv, "threaded")
    x = Tensor(rng.standard_normal((2, 3, 6, 6)))
    ops.conv2d(x, Tensor(rng.standard_normal((4, 3, 3, 3))), padding=1)
    assert seen  # conv.py's own tiles ran


def test_winograd_route_matches_pytorch(torch, rng, winograd_calls):
    arrays = [
        rng.standard_normal((3, 4, 7, 6)),
        rng.standard_normal((5, 4, 3, 3)),
        rng.standard_normal(5),
    ]
    ours = results(ops.conv2d, arrays, padding=1)
    assert winograd_calls
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    output = torch.nn.functional.conv2d(*tensors, padding=1)
    output.backward(torch.tensor(np.random.default_rng(5).standard_normal(tuple(output.shape))))
    theirs = [output.detach().numpy()] + [t.grad.numpy() for t in tensors]
    for got, want in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
