"""conv_transpose2d and conv1d ops: gradients, PyTorch parity, output shapes and errors."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd import Tensor, gradcheck, ops
from bigdl_py.autograd.ops import conv

# (id, input shape, weight shape (C_in, C_out/g, KH, KW), settings)
TRANSPOSE_CASES = [
    ("basic", (2, 3, 4, 4), (3, 2, 3, 3), {}),
    ("stride2_padding1", (2, 2, 3, 4), (2, 3, 4, 4), {"stride": 2, "padding": 1}),
    ("output_padding", (1, 2, 3, 3), (2, 2, 3, 3), {"stride": 2, "output_padding": 1}),
    (
        "pair_settings",
        (1, 2, 3, 4),
        (2, 2, 3, 2),
        {"stride": (2, 3), "padding": (1, 0), "output_padding": (1, 2)},
    ),
    ("dilation", (1, 2, 4, 4), (2, 2, 3, 3), {"dilation": 2, "padding": 1}),
    (
        "output_padding_below_dilation",
        (1, 2, 3, 3),
        (2, 1, 2, 2),
        {"dilation": 2, "output_padding": 1},
    ),
    ("groups", (2, 4, 3, 3), (4, 3, 3, 3), {"groups": 2, "stride": 2}),
    ("depthwise", (1, 3, 4, 4), (3, 1, 3, 3), {"groups": 3, "padding": 1}),
    ("one_by_one", (2, 3, 4, 4), (3, 5, 1, 1), {}),
    ("wide_rows", (1, 2, 3, 12), (2, 3, 3, 3), {"padding": 1}),
]
CASE_PARAMS = [pytest.param(*case[1:], id=case[0]) for case in TRANSPOSE_CASES]


def out_channels(weight_shape, settings) -> int:
    return weight_shape[1] * settings.get("groups", 1)


@pytest.mark.parametrize("input_shape, weight_shape, settings", CASE_PARAMS)
def test_conv_transpose2d_gradients(make_tensor, input_shape, weight_shape, settings):
    x, weight = make_tensor(*input_shape), make_tensor(*weight_shape)
    bias = make_tensor(out_channels(weight_shape, settings))
    assert gradcheck(lambda a, w, b: ops.conv_transpose2d(a, w, b, **settings), [x, weight, bias])


@pytest.mark.parametrize("flipped_kernel", [True, False], ids=["flipped_kernel", "col2im"])
def test_both_forward_routes_agree_with_finite_differences(
    make_tensor, monkeypatch, flipped_kernel
):
    # Stride 1 without output_padding may take either route; force each in turn.
    monkeypatch.setattr(conv, "_flipped_kernel_is_cheaper", lambda *args: flipped_kernel)
    x, weight = make_tensor(2, 4, 4, 4), make_tensor(4, 3, 3, 3)
    assert gradcheck(lambda a, w: ops.conv_transpose2d(a, w, padding=1), [x, weight])


@pytest.mark.parametrize("input_shape, weight_shape, settings", CASE_PARAMS)
def test_conv_transpose2d_matches_torch(
    torch, compare_with_torch, rng, input_shape, weight_shape, settings
):
    arrays = [
        rng.standard_normal(input_shape),
        rng.standard_normal(weight_shape),
        rng.standard_normal(out_channels(weight_shape, settings)),
    ]
    compare_with_torch(
        lambda x, w, b: ops.conv_transpose2d(x, w, b, **settings),
        lambda x, w, b: torch.nn.functional.conv_transpose2d(x, w, b, **settings),
        arrays,
    )


def test_conv_transpose2d_is_the_adjoint_of_conv2d(rng):
    # <conv2d(x), y> == <x, conv_transpose2d(y)> for the same weight and settings.
    settings = {"stride": 2, "padding": 1, "dilation": (1, 2), "groups": 2}
    x = rng.standard_normal((2, 4, 7, 8))
    weight = rng.standard_normal((6, 2, 3, 3))
    forward = ops.conv2d(Tensor(x), Tensor(weight), **settings).numpy()
    y = rng.standard_normal(forward.shape)
    output_padding = tuple(
        x.shape[2 + a] - ((forward.shape[2 + a] - 1) * s - 2 * 1 + d * 2 + 1)
        for a, s, d in ((0, 2, 1), (1, 2, 2))
    )
    adjoint = ops.conv_transpose2d(
        Tensor(y), Tensor(weight), output_padding=output_padding, **settings
    ).numpy()
    assert adjoint.shape == x.shape
    np.testing.assert_allclose(np.vdot(forward, y), np.vdot(x, adjoint), rtol=1e-10)


def test_conv_transpose2d_output_shape_and_dtype(rng):
    x = Tensor(rng.standard_normal((2, 3, 4, 5)), dtype=np.float32)
    weight = Tensor(rng.standard_normal((3, 2, 3, 2)), dtype=np.float32)
    output = ops.conv_transpose2d(x, weight, stride=(2, 3), padding=(1, 0), output_padding=(1, 2))
    # OH = (4-1)*2 - 2 + 2 + 1 + 1 = 8, OW = (5-1)*3 - 0 + 1 + 2 + 1 = 16
    assert output.shape == (2, 2, 8, 16)
    assert output.dtype == np.float32


@pytest.mark.parametrize(
    "input_shape, weight_shape, settings, message",
    [
        ((2, 3, 4, 4), (2, 2, 3, 3), {}, r"conv_transpose2d: input of shape \(2, 3, 4, 4\) has 3"),
        ((1, 3, 4, 4), (3, 2, 3, 3), {"groups": 2}, r"groups=2 must divide the input channels"),
        (
            (1, 2, 4, 4),
            (2, 2, 3, 3),
            {"stride": 2, "output_padding": 2},
            r"output_padding \(2, 2\) must be smaller than either the stride",
        ),
        ((1, 2, 2, 2), (2, 2, 1, 1), {"padding": 1}, r"padding \(1, 1\) leaves no output"),
        ((2, 4, 4), (2, 2, 3, 3), {}, r"conv_transpose2d: input must be 4-d"),
        ((1, 2, 4, 4), (2, 2, 3, 3), {"stride": 0}, r"stride and dilation must be >= 1"),
    ],
)
def test_conv_transpose2d_errors_name_the_op_and_shapes(
    input_shape, weight_shape, settings, message
):
    with pytest.raises(ValueError, match=message):
        ops.conv_transpose2d(
            Tensor(np.zeros(input_shape)), Tensor(np.zeros(weight_shape)), **settings
        )


# (id, input shape, weight shape (O, C/g, K), settings)
CONV1D_CASES = [
    ("basic", (2, 3, 7), (4, 3, 3), {}),
    ("stride_padding_dilation", (2, 2, 9), (3, 2, 3), {"stride": 2, "padding": 2, "dilation": 2}),
    ("groups", (1, 4, 6), (6, 2, 2), {"groups": 2, "padding": 1}),
]


CONV1D_PARAMS = [pytest.param(*case[1:], id=case[0]) for case in CONV1D_CASES]


@pytest.mark.parametrize("input_shape, weight_shape, settings", CONV1D_PARAMS)
def test_conv1d_gradients(make_tensor, input_shape, weight_shape, settings):
    x, weight = make_tensor(*input_shape), make_tensor(*weight_shape)
    bias = make_tensor(weight_shape[0])
    assert gradcheck(lambda a, w, b: ops.conv1d(a, w, b, **settings), [x, weight, bias])


@pytest.mark.parametrize("input_shape, weight_shape, settings", CONV1D_PARAMS)
def test_conv1d_matches_torch(torch, compare_with_torch, rng, input_shape, weight_shape, settings):
    arrays = [
        rng.standard_normal(input_shape),
        rng.standard_normal(weight_shape),
        rng.standard_normal(weight_shape[0]),
    ]
    compare_with_torch(
        lambda a, w, b: ops.conv1d(a, w, b, **settings),
        lambda a, w, b: torch.nn.functional.conv1d(a, w, b, **settings),
        arrays,
    )


def test_conv1d_errors_name_the_op_and_shape():
    with pytest.raises(
        ValueError, match=r"conv1d: input must be 3-d \(N, C, L\), got shape \(2, 3\)"
    ):
        ops.conv1d(Tensor(np.zeros((2, 3))), Tensor(np.zeros((4, 3, 3))))
    with pytest.raises(ValueError, match=r"conv1d: stride must be an int or a 1-tuple"):
        ops.conv1d(Tensor(np.zeros((2, 3, 5))), Tensor(np.zeros((4, 3, 3))), stride=(1, 2))
