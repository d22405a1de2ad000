"""The define-by-run engine: graph recording, the backward walk, accumulation, errors."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.autograd import Tensor, enable_grad, no_grad, ops
from bigdl_py.autograd.tensor import check_same_device


def test_leaves_have_no_grad_fn_and_results_record_their_op():
    leaf = Tensor([1.0, 2.0], requires_grad=True)
    constant = Tensor([3.0, 4.0])
    result = leaf * constant
    assert leaf.is_leaf and leaf.grad_fn is None
    assert result.requires_grad and not result.is_leaf
    assert result.grad_fn.name == "Mul"
    assert result.grad_fn.inputs[0].node is leaf


def test_requires_grad_propagates_only_from_inputs_that_require_it():
    a = Tensor([1.0], requires_grad=True)
    b = Tensor([2.0])
    assert (a + b).requires_grad
    assert (b * 2).requires_grad is False
    assert (b * 2).grad_fn is None


def test_no_grad_records_nothing_and_enable_grad_turns_it_back_on():
    a = Tensor([1.0, 2.0], requires_grad=True)
    with no_grad():
        inside = ops.exp(a) * 3
        with enable_grad():
            re_enabled = a * 2
    assert inside.grad_fn is None and not inside.requires_grad
    assert re_enabled.grad_fn is not None
    after = a * 2
    assert after.grad_fn is not None


def test_no_grad_as_decorator():
    @no_grad()
    def double(x):
        return x * 2

    assert double(Tensor([1.0], requires_grad=True)).grad_fn is None


def test_backward_from_a_scalar(rng):
    values = rng.standard_normal(5)
    x = Tensor(values, requires_grad=True, dtype=np.float64)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * values)


def test_backward_with_an_explicit_gradient(rng):
    values, seed = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    x = Tensor(values, requires_grad=True, dtype=np.float64)
    ops.exp(x).backward(seed)
    np.testing.assert_allclose(x.grad.numpy(), seed * np.exp(values))


def test_backward_of_a_non_scalar_needs_a_gradient_of_its_shape():
    y = Tensor(np.ones((2, 2)), requires_grad=True) * 2
    with pytest.raises(RuntimeError, match=r"single-value tensor, got shape \(2, 2\)"):
        y.backward()
    with pytest.raises(ValueError, match=r"gradient shape \(3,\) does not match .* \(2, 2\)"):
        y.backward(np.ones(3))


def test_backward_on_a_tensor_without_grad_raises():
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor([1.0]).sum().backward()


def test_a_chain_of_ten_thousand_ops_backpropagates_without_recursion():
    x = Tensor([1.0], requires_grad=True, dtype=np.float64)
    y = x
    for _ in range(10_000):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0001**10_000], rtol=1e-9)


def test_gradients_accumulate_across_backward_calls():
    x = Tensor([1.0, -2.0], requires_grad=True, dtype=np.float64)
    (3 * x).sum().backward()
    grad_array = x.grad.data
    (3 * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0, 6.0])
    assert x.grad.data is grad_array  # accumulated in place, so views stay valid


def test_a_value_used_twice_gets_both_contributions(rng):
    values = rng.standard_normal(4)
    x = Tensor(values, requires_grad=True, dtype=np.float64)
    y = ops.tanh(x)
    (y * y + y).sum().backward()
    tanh = np.tanh(values)
    np.testing.assert_allclose(x.grad.numpy(), (2 * tanh + 1) * (1 - tanh**2))


def test_broadcast_gradients_reduce_to_each_operand_shape(rng):
    column = Tensor(rng.standard_normal((3, 1)), requires_grad=True, dtype=np.float64)
    row = Tensor(rng.standard_normal((4,)), requires_grad=True, dtype=np.float64)
    batch = Tensor(rng.standard_normal((2, 3, 4)), requires_grad=True, dtype=np.float64)
    (column * row + batch).sum().backward()
    assert column.grad.shape == (3, 1) and row.grad.shape == (4,)
    np.testing.assert_allclose(column.grad.numpy(), 2 * row.numpy().sum() * np.ones((3, 1)))
    np.testing.assert_allclose(row.grad.numpy(), 2 * column.numpy().sum() * np.ones(4))
    np.testing.assert_allclose(batch.grad.numpy(), np.ones((2, 3, 4)))


def test_retain_graph_allows_a_second_backward():
    x = Tensor([2.0], requires_grad=True, dtype=np.float64)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [8.0])


def test_second_backward_through_a_freed_graph_raises_a_clear_error():
    x = Tensor([2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="a second time.*retain_graph=True"):
        y.backward()


def test_backward_frees_saved_buffers():
    x = Tensor([2.0], requires_grad=True)
    product = x * x
    function = product.grad_fn
    product.sum().backward()
    assert function.released and function.saved == () and function.inputs == ()


def test_retain_grad_keeps_the_gradient_of_an_intermediate():
    x = Tensor([1.0, 2.0], requires_grad=True, dtype=np.float64)
    middle = (x * 3).retain_grad()
    (middle * middle).sum().backward()
    np.testing.assert_allclose(middle.grad.numpy(), 2 * middle.numpy())
    np.testing.assert_allclose(x.grad.numpy(), 18 * x.numpy())


def test_detach_cuts_the_graph():
    x = Tensor([1.0], requires_grad=True)
    detached = (x * 2).detach()
    assert detached.grad_fn is None and not detached.requires_grad


def test_shape_mismatch_error_names_the_op_and_shapes():
    a, b = Tensor(np.ones((2, 3))), Tensor(np.ones(4))
    with pytest.raises(ValueError, match=r"add: shapes \(2, 3\) and \(4,\)"):
        ops.add(a, b)
    with pytest.raises(ValueError, match=r"matmul: shapes \(2, 3\) and \(4,\)"):
        ops.matmul(a, b)


def test_dtype_mismatch_error_names_the_op_and_dtypes():
    a = Tensor(np.ones(2), dtype=np.float32)
    b = Tensor(np.ones(2), dtype=np.float64)
    with pytest.raises(
        TypeError, match="Mul: input 0 has dtype float32 but input 1 has dtype float64"
    ):
        ops.mul(a, b)


def test_device_mismatch_error_names_the_op_and_devices():
    on_cpu = SimpleNamespace(device=backend.CPU)
    on_gpu = SimpleNamespace(device=backend.device("cuda:0"))
    with pytest.raises(RuntimeError, match="Conv2d: input 0 is on cpu but input 1 is on cuda:0"):
        check_same_device([on_cpu, on_gpu], "Conv2d")


@pytest.mark.gpu
@pytest.mark.skipif(not backend.cuda_available(), reason="needs CuPy and a CUDA device")
def test_device_mismatch_between_real_tensors_raises():
    with pytest.raises(RuntimeError, match="Add: input 0 is on cpu but input 1 is on cuda:0"):
        ops.add(Tensor([1.0]), Tensor([1.0], device="cuda"))


def test_constants_take_the_tensor_dtype():
    x = Tensor([1.0, 2.0], requires_grad=True, dtype=np.float32)
    assert (x * 2.5).dtype == np.float32
    assert (np.float64(2.0) + x).dtype == np.float32
