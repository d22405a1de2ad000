"""max_pool2d and avg_pool2d: gradients, tie handling, PyTorch parity, errors."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.autograd import Tensor, gradcheck, ops
from bigdl_py.autograd.ops import pool as pool_ops

# (id, input shape, kernel_size, stride, padding)
POOL_CASES = [
    ("fast_path", (2, 3, 4, 6), 2, None, 0),
    ("fast_path_cropped", (1, 2, 5, 7), 2, None, 0),
    ("overlapping", (1, 2, 5, 5), 3, 1, 0),
    ("stride_and_padding", (2, 2, 5, 6), 3, 2, 1),
    ("rectangular", (1, 2, 6, 7), (3, 2), (2, 1), (1, 1)),
    ("gaps_between_windows", (1, 1, 7, 7), 2, 3, 0),
]
POOL_PARAMS = [case[1:] for case in POOL_CASES]
POOL_IDS = [case[0] for case in POOL_CASES]


def _distinct_values(rng, shape):
    """Values at least 1e-2 apart, so a 1e-6 perturbation never changes which is largest."""
    size = int(np.prod(shape))
    return Tensor(rng.permutation(size).reshape(shape) * 1e-2, requires_grad=True, dtype=np.float64)


@pytest.mark.parametrize("shape, kernel, stride, padding", POOL_PARAMS, ids=POOL_IDS)
def test_max_pool2d_gradient(rng, shape, kernel, stride, padding):
    x = _distinct_values(rng, shape)
    assert gradcheck(lambda a: ops.max_pool2d(a, kernel, stride, padding), [x])


@pytest.mark.parametrize("shape, kernel, stride, padding", POOL_PARAMS, ids=POOL_IDS)
def test_avg_pool2d_gradient(make_tensor, shape, kernel, stride, padding):
    x = make_tensor(*shape)
    assert gradcheck(lambda a: ops.avg_pool2d(a, kernel, stride, padding), [x])


@pytest.mark.parametrize("shape, kernel, stride, padding", POOL_PARAMS, ids=POOL_IDS)
def test_pools_match_torch(torch, compare_with_torch, rng, shape, kernel, stride, padding):
    # Values rounded to one decimal make ties common: the gradient must go to the first max.
    values = np.round(rng.standard_normal(shape), 1)
    functional = torch.nn.functional
    compare_with_torch(
        lambda a: ops.max_pool2d(a, kernel, stride, padding),
        lambda a: functional.max_pool2d(a, kernel, stride, padding),
        [values],
    )
    compare_with_torch(
        lambda a: ops.avg_pool2d(a, kernel, stride, padding),
        lambda a: functional.avg_pool2d(a, kernel, stride, padding, count_include_pad=True),
        [values],
    )


def test_max_pool2d_sends_the_gradient_of_a_tie_to_the_first_maximum():
    x = Tensor(np.zeros((1, 1, 2, 2)), requires_grad=True)
    ops.max_pool2d(x, 2).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy()[0, 0], [[1.0, 0.0], [0.0, 0.0]])


def test_avg_pool2d_counts_padding_in_the_divisor():
    x = Tensor(np.ones((1, 1, 2, 2)))
    output = ops.avg_pool2d(x, 2, stride=2, padding=1)
    np.testing.assert_allclose(output.numpy()[0, 0], np.full((2, 2), 0.25))


def test_pools_keep_float32():
    x = Tensor(np.ones((1, 2, 4, 4)), requires_grad=True, dtype=np.float32)
    for pooled in (ops.max_pool2d(x, 2), ops.avg_pool2d(x, 3, 1, 1)):
        assert pooled.dtype == np.float32
        pooled.sum().backward()
        assert x.grad.dtype == np.float32


@pytest.mark.parametrize("pool", [ops.max_pool2d, ops.avg_pool2d])
@pytest.mark.parametrize(
    "shape, settings, message",
    [
        ((1, 1, 4, 4), {"kernel_size": 3, "padding": 2}, r"padding must be between 0 and half"),
        ((1, 1, 2, 2), {"kernel_size": 3}, r"kernel_size \(3, 3\) is larger than the padded"),
        ((1, 4, 4), {"kernel_size": 2}, r"input must be 4-d"),
        ((1, 1, 4, 4), {"kernel_size": 2, "stride": 0}, r"kernel_size and stride must be >= 1"),
    ],
)
def test_pool_errors_name_the_op(pool, shape, settings, message):
    with pytest.raises(ValueError, match=f"{pool.__name__}: {message}"):
        pool(Tensor(np.zeros(shape)), **settings)


@pytest.mark.parametrize("shape, kernel, stride, padding", POOL_PARAMS, ids=POOL_IDS)
@pytest.mark.parametrize("pool", [ops.max_pool2d, ops.avg_pool2d])
def test_tiles_shared_among_threads_give_the_one_tile_result(
    monkeypatch, rng, pool, shape, kernel, stride, padding
):
    # A batch of 7 in tiles of 3 + 3 + 1, taken by two threads in any order.
    values = rng.standard_normal((7,) + shape[1:])
    upstream = None

    def run():
        nonlocal upstream
        x = Tensor(values, requires_grad=True, dtype=np.float64)
        output = pool(x, kernel, stride, padding)
        if upstream is None:
            upstream = np.random.default_rng(3).standard_normal(output.shape)
        output.backward(upstream)
        return output.numpy(), x.grad.numpy()

    with backend.blas_threads(1):
        expected = run()
    monkeypatch.setattr(pool_ops, "tile_size", lambda *args: 3)
    with backend.blas_threads(2):
        tiled = run()
    for got, want in zip(tiled, expected, strict=True):
        np.testing.assert_array_equal(got, want)
