"""group_norm and instance_norm: gradients of input, weight and bias, PyTorch parity, running
statistics, errors."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd import Tensor, gradcheck, ops


@pytest.mark.parametrize(
    "shape, groups", [((2, 4, 3, 3), 2), ((3, 6, 5), 3), ((2, 3), 1), ((2, 4, 2, 2), 4)]
)
def test_group_norm_matches_torch_and_finite_differences(
    torch, compare_with_torch, rng, shape, groups
):
    channels = shape[1]
    values = rng.standard_normal(shape)
    weight, bias = rng.standard_normal(channels), rng.standard_normal(channels)
    compare_with_torch(
        lambda a, w, b: ops.group_norm(a, groups, w, b),
        lambda a, w, b: torch.nn.functional.group_norm(a, groups, w, b),
        [values, weight, bias],
    )
    inputs = [Tensor(a, requires_grad=True) for a in (values, weight, bias)]
    assert gradcheck(lambda a, w, b: ops.group_norm(a, groups, w, b), inputs)


def test_instance_norm_updates_running_stats_in_place_like_torch(torch, rng):
    values = rng.standard_normal((4, 3, 5, 2))
    our_mean, our_var = np.zeros(3), np.ones(3)
    their_mean, their_var = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    for _ in range(2):
        output = ops.instance_norm(Tensor(values), our_mean, our_var, momentum=0.2)
        expected = torch.nn.functional.instance_norm(
            torch.from_numpy(values), their_mean, their_var, momentum=0.2
        )
    np.testing.assert_allclose(output.numpy(), expected.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(our_mean, their_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(our_var, their_var.numpy(), rtol=1e-12)
    # Evaluation normalises with the running statistics instead.
    fixed = ops.instance_norm(Tensor(values), our_mean, our_var, use_input_stats=False)
    their_fixed = torch.nn.functional.instance_norm(
        torch.from_numpy(values), their_mean, their_var, use_input_stats=False
    )
    np.testing.assert_allclose(fixed.numpy(), their_fixed.numpy(), rtol=1e-10, atol=1e-12)


def test_group_norm_keeps_float32():
    values = np.random.default_rng(0).standard_normal((2, 4, 3))
    x = Tensor(values, requires_grad=True, dtype=np.float32)
    output = ops.group_norm(x, 2)
    output.sum().backward()
    assert output.dtype == np.float32 and x.grad.dtype == np.float32


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x: ops.group_norm(x, 3), r"group_norm: num_groups 3 must divide the 4 channels"),
        (
            lambda x: ops.group_norm(x, 2, Tensor(np.ones(3))),
            r"group_norm: weight must have shape \(4,\)",
        ),
        (lambda x: ops.group_norm(Tensor(np.zeros(4)), 1), r"group_norm: input must be at least"),
        (lambda x: ops.instance_norm(Tensor(np.zeros((2, 4)))), r"instance_norm: input must be"),
        (
            lambda x: ops.instance_norm(Tensor(np.zeros((2, 4, 1))), np.zeros(4), np.ones(4)),
            r"instance_norm: training needs more than one spatial value",
        ),
    ],
)
def test_errors_name_the_op_and_the_shape(call, message):
    with pytest.raises(ValueError, match=message):
        call(Tensor(np.zeros((2, 4, 3, 3))))
