"""The rectifier ops (elu, silu, softplus, mish, hardtanh, hardswish, prelu) against PyTorch's
functional forms and finite differences, with their errors."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd import Tensor, gradcheck, ops

# -6 .. 6 without a value on any kink (0, +-1, +-3), where finite differences are undefined.
WIDE_RANGE = np.linspace(-6.0, 6.0, 30).reshape(5, 6)

# (id, ours, PyTorch's functional form given torch)
UNARY_CASES = [
    ("elu", lambda a: ops.elu(a, 0.7), lambda t: lambda a: t.nn.functional.elu(a, 0.7)),
    ("silu", ops.silu, lambda t: t.nn.functional.silu),
    (
        "softplus",
        lambda a: ops.softplus(a, beta=1.5, threshold=4.0),
        lambda t: lambda a: t.nn.functional.softplus(a, beta=1.5, threshold=4.0),
    ),
    ("mish", ops.mish, lambda t: t.nn.functional.mish),
    (
        "hardtanh",
        lambda a: ops.hardtanh(a, -2.0, 2.5),
        lambda t: lambda a: t.nn.functional.hardtanh(a, -2.0, 2.5),
    ),
    ("hardswish", ops.hardswish, lambda t: t.nn.functional.hardswish),
]
UNARY_PARAMS = [pytest.param(*case[1:], id=case[0]) for case in UNARY_CASES]


@pytest.mark.parametrize("ours, theirs", UNARY_PARAMS)
def test_unary_rectifiers_match_torch(torch, compare_with_torch, ours, theirs):
    compare_with_torch(ours, theirs(torch), [WIDE_RANGE])


@pytest.mark.parametrize("ours, theirs", UNARY_PARAMS)
def test_unary_rectifier_gradients(ours, theirs):
    assert gradcheck(ours, [Tensor(WIDE_RANGE, requires_grad=True)])


@pytest.mark.parametrize(
    "input_shape, weight_shape", [((4, 3), (1,)), ((2, 3, 4), (3,)), ((5,), (1,))]
)
def test_prelu_input_and_weight_gradients(
    torch, compare_with_torch, rng, input_shape, weight_shape
):
    values = rng.standard_normal(input_shape)
    weight = rng.random(weight_shape)
    compare_with_torch(ops.prelu, torch.nn.functional.prelu, [values, weight])
    x = Tensor(values, requires_grad=True)
    w = Tensor(weight, requires_grad=True)
    assert gradcheck(ops.prelu, [x, w])


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda x: ops.softplus(x, beta=0.0), ValueError, r"softplus: beta must be > 0"),
        (lambda x: ops.hardtanh(x, 1.0, 1.0), ValueError, r"hardtanh: max_val \(1.0\) must be"),
        (
            lambda x: ops.prelu(x, Tensor(np.ones(3))),
            ValueError,
            r"prelu: weight has 3 values but the input of shape \(2, 4\) has 4 channels",
        ),
        (lambda x: ops.mish(Tensor(np.arange(3))), TypeError, r"mish: input must be floating"),
    ],
)
def test_errors_name_the_op_and_the_setting(call, error, message):
    with pytest.raises(error, match=message):
        call(Tensor(np.zeros((2, 4))))
