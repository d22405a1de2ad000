"""Pooling, resizing, normalisation and regularisation layers of the second wave.

The numerical checks are the ones every layer gets (``test_layers_parity.py``): float64
finite differences, and PyTorch parity of the output, input and parameter gradients and
buffers to 1e-5 relative. Here each layer also round-trips through ``nn.save``/``nn.load``
and its errors are checked to name the layer and the bad setting or shape.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_layers_parity as parity
from layer_checks import check_save_load_round_trip

from bigdl_py import nn
from bigdl_py.autograd import Tensor

F64 = np.float64


# (id, our layer in float64, the PyTorch layer, input specs)
CASES = [
    (
        "adaptive_avg_pool2d_global",
        lambda: nn.AdaptiveAvgPool2d(1),
        lambda t: t.nn.AdaptiveAvgPool2d(1),
        [(2, 3, 4, 5)],
    ),
    (
        "adaptive_avg_pool2d_uneven_windows",
        lambda: nn.AdaptiveAvgPool2d((3, 2)),
        lambda t: t.nn.AdaptiveAvgPool2d((3, 2)),
        [(2, 2, 7, 5)],
    ),
    (
        "adaptive_avg_pool2d_keep_height_upsample_width",
        lambda: nn.AdaptiveAvgPool2d((None, 7)),
        lambda t: t.nn.AdaptiveAvgPool2d((None, 7)),
        [(1, 2, 3, 5)],
    ),
    (
        "adaptive_max_pool2d_global",
        lambda: nn.AdaptiveMaxPool2d(1),
        lambda t: t.nn.AdaptiveMaxPool2d(1),
        [(2, 3, 4, 5)],
    ),
    (
        "adaptive_max_pool2d_overlapping_windows",
        lambda: nn.AdaptiveMaxPool2d((4, 3)),
        lambda t: t.nn.AdaptiveMaxPool2d((4, 3)),
        [(2, 2, 7, 5)],
    ),
    ("max_pool1d", lambda: nn.MaxPool1d(2), lambda t: t.nn.MaxPool1d(2), [(2, 3, 7)]),
    (
        "max_pool1d_overlapping_padded",
        lambda: nn.MaxPool1d(3, stride=2, padding=1),
        lambda t: t.nn.MaxPool1d(3, stride=2, padding=1),
        [(2, 2, 8)],
    ),
    ("avg_pool1d", lambda: nn.AvgPool1d(3), lambda t: t.nn.AvgPool1d(3), [(2, 3, 7)]),
    (
        "avg_pool1d_overlapping_padded",
        lambda: nn.AvgPool1d(4, stride=1, padding=2),
        lambda t: t.nn.AvgPool1d(4, stride=1, padding=2),
        [(1, 2, 6)],
    ),
    (
        "upsample_nearest_scale_factor",
        lambda: nn.Upsample(scale_factor=2),
        lambda t: t.nn.Upsample(scale_factor=2),
        [(2, 2, 3, 4)],
    ),
    (
        "upsample_nearest_fractional_scale_per_axis",
        lambda: nn.Upsample(scale_factor=(1.5, 0.6)),
        lambda t: t.nn.Upsample(scale_factor=(1.5, 0.6)),
        [(1, 2, 3, 5)],
    ),
    (
        "upsample_nearest_size",
        lambda: nn.Upsample(size=(5, 7)),
        lambda t: t.nn.Upsample(size=(5, 7)),
        [(1, 2, 3, 4)],
    ),
    (
        "upsample_bilinear_scale_factor",
        lambda: nn.Upsample(scale_factor=2, mode="bilinear"),
        lambda t: t.nn.Upsample(scale_factor=2, mode="bilinear"),
        [(2, 2, 3, 4)],
    ),
    (
        "upsample_bilinear_align_corners_size",
        lambda: nn.Upsample(size=(5, 6), mode="bilinear", align_corners=True),
        lambda t: t.nn.Upsample(size=(5, 6), mode="bilinear", align_corners=True),
        [(1, 2, 3, 4)],
    ),
    (
        "upsample_bilinear_fractional_scale_down_and_up",
        lambda: nn.Upsample(scale_factor=(0.7, 2.5), mode="bilinear", align_corners=False),
        lambda t: t.nn.Upsample(scale_factor=(0.7, 2.5), mode="bilinear", align_corners=False),
        [(1, 2, 5, 3)],
    ),
]
CASE_PARAMS = [pytest.param(*case[1:], id=case[0]) for case in CASES]


@pytest.mark.parametrize("make_ours, make_theirs, specs", CASE_PARAMS)
def test_layer_gradients_match_finite_differences(make_ours, make_theirs, specs):
    parity.test_layer_gradients_match_finite_differences(make_ours, make_theirs, specs)


@pytest.mark.parametrize("make_ours, make_theirs, specs", CASE_PARAMS)
def test_layer_matches_pytorch(torch, make_ours, make_theirs, specs):
    parity.test_layer_matches_pytorch(torch, make_ours, make_theirs, specs)


@pytest.mark.parametrize("make_ours, make_theirs, specs", CASE_PARAMS)
def test_layer_round_trips_through_save_and_load(tmp_path, make_ours, make_theirs, specs):
    check_save_load_round_trip(tmp_path, make_ours, specs)


def test_adaptive_max_pool_sends_the_gradient_of_a_tie_to_the_first_maximum():
    x = Tensor(np.zeros((1, 1, 3, 3)), requires_grad=True)
    nn.AdaptiveMaxPool2d(1)(x).sum().backward()
    expected = np.zeros((3, 3))
    expected[0, 0] = 1.0
    np.testing.assert_array_equal(x.grad.numpy()[0, 0], expected)


def test_adaptive_pools_keep_float32():
    x = Tensor(np.ones((1, 2, 5, 5)), requires_grad=True, dtype=np.float32)
    for layer in (nn.AdaptiveAvgPool2d(2), nn.AdaptiveMaxPool2d(3)):
        output = layer(x)
        assert output.dtype == np.float32
        output.sum().backward()
        assert x.grad.dtype == np.float32


@pytest.mark.parametrize(
    "layer, shape, message",
    [
        (nn.AdaptiveAvgPool2d(2), (3, 4, 4), r"AdaptiveAvgPool2d\(output_size=2\).*\(3, 4, 4\)"),
        (nn.AdaptiveMaxPool2d((2, 1)), (4, 4), r"AdaptiveMaxPool2d\(output_size=\(2, 1\)\)"),
        (nn.MaxPool1d(2), (2, 3, 4, 4), r"MaxPool1d\(kernel_size=2.*\(N, C, L\).*\(2, 3, 4, 4\)"),
        (nn.AvgPool1d(5), (2, 3, 4), r"AvgPool1d\(kernel_size=5.*length 4.*shorter than"),
        (nn.Upsample(scale_factor=2), (2, 3, 4), r"Upsample\(scale_factor=2.*\(2, 3, 4\)"),
        (
            nn.Upsample(scale_factor=0.1),
            (1, 1, 4, 4),
            r"Upsample\(scale_factor=0.1.*empty output.*\(1, 1, 4, 4\)",
        ),
    ],
)
def test_shape_errors_name_the_layer_and_the_shape(layer, shape, message):
    with pytest.raises(ValueError, match=message):
        layer(Tensor(np.zeros(shape)))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: nn.AdaptiveAvgPool2d(0), r"AdaptiveAvgPool2d: output_size must be a positive"),
        (lambda: nn.AdaptiveMaxPool2d((2, 2, 2)), r"AdaptiveMaxPool2d: output_size must be"),
        (lambda: nn.AdaptiveMaxPool2d(2, return_indices=True), r"return_indices=True is not"),
        (lambda: nn.MaxPool1d(0), r"MaxPool1d: kernel_size must be a positive integer, got 0"),
        (lambda: nn.AvgPool1d(2, padding=2), r"AvgPool1d: padding 2 must be at most half"),
        (lambda: nn.Upsample(), r"Upsample: give exactly one of size and scale_factor"),
        (lambda: nn.Upsample(size=2, scale_factor=2), r"Upsample: give exactly one of size"),
        (lambda: nn.Upsample(size=(2, 0)), r"Upsample: size must be a positive integer"),
        (lambda: nn.Upsample(scale_factor=-1.0), r"Upsample: scale_factor must be a positive"),
        (lambda: nn.Upsample(scale_factor=2, mode="cubic"), r"Upsample: mode must be 'nearest'"),
        (
            lambda: nn.Upsample(scale_factor=2, align_corners=True),
            r"Upsample: align_corners applies to mode='bilinear' only",
        ),
    ],
)
def test_bad_settings_raise_naming_the_layer_and_the_setting(build, message):
    with pytest.raises(ValueError, match=message):
        build()
