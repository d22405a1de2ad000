"""adaptive_avg_pool2d, adaptive_max_pool2d and interpolate: gradients, PyTorch parity, errors."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd import Tensor, gradcheck, ops

# (id, input shape, interpolate settings): up and down, integer and fractional scales.
INTERPOLATE_CASES = [
    # Whole factors take the block-copy path; the others the interpolation matrices.
    ("nearest_double", (2, 2, 3, 4), {"scale_factor": 2}),
    ("nearest_whole_factors_per_axis", (1, 2, 3, 4), {"scale_factor": (3, 1)}),
    ("nearest_whole_factors_by_size", (1, 2, 3, 4), {"size": (6, 12)}),
    ("nearest_fractional_down", (1, 2, 7, 6), {"scale_factor": 0.45}),
    ("nearest_size_per_axis", (1, 1, 4, 5), {"size": (9, 3)}),
    ("bilinear_double", (2, 2, 3, 4), {"scale_factor": 2, "mode": "bilinear"}),
    ("bilinear_fractional", (1, 2, 4, 5), {"scale_factor": (1.7, 0.8), "mode": "bilinear"}),
    (
        "bilinear_align_corners",
        (1, 2, 4, 3),
        {"size": (7, 5), "mode": "bilinear", "align_corners": True},
    ),
    ("bilinear_to_one_pixel", (1, 1, 4, 4), {"size": 1, "mode": "bilinear"}),
    (
        "nearest_recomputed_scale",
        (1, 2, 3, 7),
        {"scale_factor": 1.7, "recompute_scale_factor": True},
    ),
    ("bilinear_from_one_pixel", (1, 1, 1, 2), {"size": (3, 5), "mode": "bilinear"}),
]
INTERPOLATE_PARAMS = [pytest.param(*case[1:], id=case[0]) for case in INTERPOLATE_CASES]
ADAPTIVE_SIZES = [1, (2, 3), (None, 2), (5, 4), (9, 8)]


@pytest.mark.parametrize("shape, settings", INTERPOLATE_PARAMS)
def test_interpolate_gradient(make_tensor, shape, settings):
    x = make_tensor(*shape)
    assert gradcheck(lambda a: ops.interpolate(a, **settings), [x])


@pytest.mark.parametrize("shape, settings", INTERPOLATE_PARAMS)
def test_interpolate_matches_torch(torch, compare_with_torch, rng, shape, settings):
    compare_with_torch(
        lambda a: ops.interpolate(a, **settings),
        lambda a: torch.nn.functional.interpolate(a, **settings),
        [rng.standard_normal(shape)],
    )


@pytest.mark.parametrize("output_size", ADAPTIVE_SIZES, ids=str)
def test_adaptive_pools_match_torch_and_finite_differences(
    torch, compare_with_torch, rng, output_size
):
    # Values rounded to one decimal make ties common: the gradient must go to the first max.
    values = np.round(rng.standard_normal((2, 2, 5, 4)), 1)
    functional = torch.nn.functional
    compare_with_torch(
        lambda a: ops.adaptive_avg_pool2d(a, output_size),
        lambda a: functional.adaptive_avg_pool2d(a, output_size),
        [values],
    )
    compare_with_torch(
        lambda a: ops.adaptive_max_pool2d(a, output_size),
        lambda a: functional.adaptive_max_pool2d(a, output_size),
        [values],
    )
    distinct = rng.permutation(values.size).reshape(values.shape) * 1e-2
    x = Tensor(distinct, requires_grad=True, dtype=np.float64)
    assert gradcheck(lambda a: ops.adaptive_max_pool2d(a, output_size), [x])
    assert gradcheck(lambda a: ops.adaptive_avg_pool2d(a, output_size), [x])


def test_resampling_keeps_float32():
    x = Tensor(np.ones((1, 2, 4, 4)), requires_grad=True, dtype=np.float32)
    for output in (
        ops.interpolate(x, scale_factor=2, mode="bilinear"),
        ops.adaptive_avg_pool2d(x, 3),
        ops.adaptive_avg_pool2d(x, 1),
        ops.adaptive_max_pool2d(x, 3),
    ):
        assert output.dtype == np.float32
        output.sum().backward()
        assert x.grad.dtype == np.float32


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda x: ops.interpolate(x[0], scale_factor=2), ValueError, r"interpolate: input must"),
        (lambda x: ops.interpolate(x, size=3, mode="area"), ValueError, r"mode must be 'nearest'"),
        (lambda x: ops.interpolate(x), ValueError, r"give exactly one of size and scale_factor"),
        (
            lambda x: ops.interpolate(x, size=2, align_corners=False),
            ValueError,
            r"align_corners applies to mode='bilinear' only",
        ),
        (lambda x: ops.adaptive_avg_pool2d(x, (1, 2, 3)), ValueError, r"output_size must be"),
        (lambda x: ops.adaptive_max_pool2d(x, 0), ValueError, r"output_size must be >= 1"),
        (
            lambda x: ops.interpolate(x, scale_factor=1e12),
            ValueError,
            r"interpolate: the requested output size \(4000000000000, 4000000000000\)",
        ),
        (
            lambda x: ops.adaptive_avg_pool2d(Tensor(np.zeros((1, 1, 2, 2), np.int64)), 1),
            TypeError,
            r"adaptive_avg_pool2d: input must be floating point",
        ),
    ],
)
def test_errors_name_the_op_and_the_setting(call, error, message):
    with pytest.raises(error, match=message):
        call(Tensor(np.zeros((1, 1, 4, 4))))


def test_adaptive_max_pool_breaks_ties_in_row_major_order():
    # The maximum 1 sits at (0, 2) and (1, 0): PyTorch's scan, row by row, meets (0, 2) first.
    values = np.zeros((1, 1, 2, 3))
    values[0, 0, 0, 2] = values[0, 0, 1, 0] = 1.0
    x = Tensor(values, requires_grad=True)
    ops.adaptive_max_pool2d(x, 1).sum().backward()
    expected = np.zeros((2, 3))
    expected[0, 2] = 1.0
    np.testing.assert_array_equal(x.grad.numpy()[0, 0], expected)
