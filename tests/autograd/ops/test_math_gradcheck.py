"""Finite-difference checks of element-wise, activation, reduction and matmul gradients."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd import gradcheck, ops

# (id, function, input shapes, lowest input value or None for standard normal)
ELEMENTWISE_CASES = [
    ("add", ops.add, [(2, 3), (2, 3)], None),
    ("add_broadcast", ops.add, [(2, 3), (3,)], None),
    ("sub", ops.sub, [(2, 1), (1, 3)], None),
    ("mul", ops.mul, [(2, 3), (2, 3)], None),
    ("mul_broadcast", ops.mul, [(4, 1, 3), (2, 1)], None),
    ("div", ops.div, [(2, 3), (2, 3)], 0.5),
    ("neg", ops.neg, [(3, 2)], None),
    ("pow_tensor_exponent", ops.pow, [(2, 3), (2, 3)], 0.5),
    ("pow_scalar_exponent", lambda a: ops.pow(a, 3.0), [(2, 3)], None),
    ("exp", ops.exp, [(2, 3)], None),
    ("log", ops.log, [(2, 3)], 0.5),
    ("sqrt", ops.sqrt, [(2, 3)], 0.5),
    ("abs", ops.abs, [(2, 3)], None),
    ("maximum", ops.maximum, [(2, 3), (2, 3)], None),
    ("tanh", ops.tanh, [(2, 3)], None),
    ("sigmoid", ops.sigmoid, [(2, 3)], None),
    ("relu", ops.relu, [(3, 4)], None),
    ("leaky_relu", lambda a: ops.leaky_relu(a, 0.2), [(3, 4)], None),
    ("gelu_exact", ops.gelu, [(3, 4)], None),
    ("gelu_tanh", lambda a: ops.gelu(a, approximate="tanh"), [(3, 4)], None),
    ("softmax", lambda a: ops.softmax(a, axis=1), [(3, 4)], None),
    ("softmax_axis0", lambda a: ops.softmax(a, axis=0), [(3, 4)], None),
    ("log_softmax", lambda a: ops.log_softmax(a, axis=-1), [(3, 4)], None),
    ("clip", lambda a: ops.clip(a, -0.5, 0.5), [(3, 4)], None),
    ("clip_low_only", lambda a: ops.clip(a, min_value=0.1), [(3, 4)], None),
]

REDUCTION_CASES = [
    ("sum_all", lambda a: ops.sum(a), [(2, 3, 4)]),
    ("sum_axis", lambda a: ops.sum(a, axis=1), [(2, 3, 4)]),
    ("sum_axes_keepdims", lambda a: ops.sum(a, axis=(0, 2), keepdims=True), [(2, 3, 4)]),
    ("mean_all", lambda a: ops.mean(a), [(2, 3, 4)]),
    ("mean_negative_axis", lambda a: ops.mean(a, axis=-1), [(2, 3, 4)]),
    ("mean_axes_keepdims", lambda a: ops.mean(a, axis=(1, 2), keepdims=True), [(2, 3, 4)]),
    ("max_all", lambda a: ops.max(a), [(2, 3, 4)]),
    ("max_axis", lambda a: ops.max(a, axis=1), [(2, 3, 4)]),
    ("max_axes_keepdims", lambda a: ops.max(a, axis=(0, 2), keepdims=True), [(2, 3, 4)]),
    ("min_axis", lambda a: ops.min(a, axis=0), [(2, 3, 4)]),
    ("min_keepdims", lambda a: ops.min(a, axis=2, keepdims=True), [(2, 3, 4)]),
    ("var", lambda a: ops.var(a, axis=1), [(2, 3, 4)]),
    ("var_unbiased", lambda a: ops.var(a, axis=(0, 2), unbiased=True), [(2, 3, 4)]),
]

MATMUL_CASES = [
    ("vector_vector", ops.matmul, [(4,), (4,)]),
    ("matrix_vector", ops.matmul, [(3, 4), (4,)]),
    ("vector_matrix", ops.matmul, [(4,), (4, 2)]),
    ("matrix_matrix", ops.matmul, [(3, 4), (4, 2)]),
    ("batched", ops.matmul, [(2, 3, 4), (2, 4, 5)]),
    ("broadcast_batch", ops.matmul, [(2, 1, 3, 4), (3, 4, 2)]),
    ("batched_times_matrix", ops.matmul, [(2, 3, 4), (4, 2)]),
    ("linear", ops.linear, [(3, 4), (2, 4), (2,)]),
    ("linear_no_bias", ops.linear, [(3, 4), (2, 4)]),
    ("linear_3d_input", ops.linear, [(2, 3, 4), (5, 4), (5,)]),
]


def _inputs(make_tensor, shapes, low=None):
    return [make_tensor(*shape, low=low) for shape in shapes]


@pytest.mark.parametrize(
    "function, shapes, low",
    [case[1:] for case in ELEMENTWISE_CASES],
    ids=[case[0] for case in ELEMENTWISE_CASES],
)
def test_elementwise_and_activation_gradients(make_tensor, function, shapes, low):
    assert gradcheck(function, _inputs(make_tensor, shapes, low))


@pytest.mark.parametrize(
    "function, shapes",
    [case[1:] for case in REDUCTION_CASES],
    ids=[case[0] for case in REDUCTION_CASES],
)
def test_reduction_gradients(make_tensor, function, shapes):
    assert gradcheck(function, _inputs(make_tensor, shapes))


@pytest.mark.parametrize(
    "function, shapes",
    [case[1:] for case in MATMUL_CASES],
    ids=[case[0] for case in MATMUL_CASES],
)
def test_matmul_and_linear_gradients(make_tensor, function, shapes):
    assert gradcheck(function, _inputs(make_tensor, shapes))


def test_max_splits_the_gradient_between_ties():
    from bigdl_py.autograd import Tensor

    x = Tensor([1.0, 3.0, 3.0], requires_grad=True, dtype=np.float64)
    ops.max(x).backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 0.5, 0.5])


def test_gradcheck_catches_a_wrong_gradient(make_tensor):
    from bigdl_py.autograd import Function

    class WrongSquare(Function):
        def forward(self, a):
            self.save_for_backward(a)
            return a * a

        def backward(self, grad):
            (a,) = self.saved
            return grad * a  # should be 2 * a

    with pytest.raises(AssertionError, match="gradient mismatch"):
        gradcheck(WrongSquare.apply, [make_tensor(3)])
