"""Gradients and errors of the ops that move values: reshape, permute, indexing, concat..."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd import Tensor, gradcheck, ops

BOOLEAN_MASK = np.array(
    [[True, False, True, True], [False, False, True, False], [True, True, False, False]]
)

SHAPE_CASES = [
    ("reshape", lambda a: ops.reshape(a, (4, 3)), [(2, 6)]),
    ("reshape_infer", lambda a: a.reshape(-1, 2), [(2, 3, 2)]),
    ("permute", lambda a: ops.permute(a, (2, 0, 1)), [(2, 3, 4)]),
    ("transpose_reverse", lambda a: ops.transpose(a), [(2, 3, 4)]),
    ("transpose_two_axes", lambda a: a.transpose(0, 2), [(2, 3, 4)]),
    ("flatten_unsqueeze_squeeze", lambda a: a.flatten(1).unsqueeze(0).squeeze(0), [(2, 3, 2)]),
    ("getitem_basic_slices", lambda a: a[1:, ::2, None, -1], [(3, 4, 2)]),
    ("getitem_int_and_ellipsis", lambda a: a[..., 1], [(3, 4, 2)]),
    ("getitem_int_array_repeats", lambda a: a[np.array([0, 2, 0, 0])], [(3, 4)]),
    ("getitem_paired_int_arrays", lambda a: a[np.array([0, 1, 1]), np.array([3, 0, 0])], [(3, 4)]),
    ("getitem_boolean_mask", lambda a: a[BOOLEAN_MASK], [(3, 4)]),
    ("getitem_boolean_rows", lambda a: a[np.array([True, False, True])], [(3, 4)]),
    ("concatenate", lambda a, b: ops.concatenate([a, b, a], axis=1), [(2, 3), (2, 1)]),
    ("concatenate_last_axis", lambda a, b: ops.concatenate([b, a], axis=-1), [(2, 3), (2, 1)]),
    ("concatenate_first", lambda a, b: ops.concatenate([a, b], axis=0), [(1, 3), (2, 3)]),
    ("stack", lambda a, b: ops.stack([a, b], axis=1), [(2, 3), (2, 3)]),
    ("stack_last_axis", lambda a, b: ops.stack([a, b], axis=-1), [(2, 3), (2, 3)]),
    ("where", lambda a, b: ops.where(BOOLEAN_MASK, a, b), [(3, 4), (3, 4)]),
    ("where_broadcast", lambda a, b: ops.where(BOOLEAN_MASK, a, b), [(3, 4), (4,)]),
    ("broadcast_to", lambda a: ops.broadcast_to(a, (2, 3, 4)), [(3, 1)]),
]


@pytest.mark.parametrize(
    "function, shapes", [case[1:] for case in SHAPE_CASES], ids=[case[0] for case in SHAPE_CASES]
)
def test_shape_op_gradients(make_tensor, function, shapes):
    assert gradcheck(function, [make_tensor(*shape) for shape in shapes])


def test_astype_gradient_round_trips_through_float32(make_tensor):
    # A larger step: float32 rounding (~1e-7 relative) would swamp a 1e-6 difference.
    def through_float32(a):
        return ops.astype(ops.astype(a, np.float32) * 3, np.float64)

    assert gradcheck(through_float32, [make_tensor(2, 3)], eps=1e-3)


def test_astype_gradient_comes_back_in_the_input_dtype():
    x = Tensor([1.0, 2.0], requires_grad=True, dtype=np.float64)
    x.to(dtype=np.float32).sum().backward()
    assert x.grad.dtype == np.float64
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])


def test_where_accepts_a_boolean_tensor_condition(make_tensor):
    a, b = make_tensor(3, 4), make_tensor(3, 4)
    result = ops.where(a > b, a, b)
    np.testing.assert_array_equal(result.numpy(), np.maximum(a.numpy(), b.numpy()))


def test_shape_errors_name_the_op_and_shapes():
    x = Tensor(np.zeros((2, 3)))
    with pytest.raises(
        ValueError,
        match=r"reshape: .*shape \(2, 3\) \(6 elements\) into shape "
        r"\(4, 2\)",
    ):
        ops.reshape(x, (4, 2))
    with pytest.raises(ValueError, match=r"permute: axes \(0, 0\)"):
        ops.permute(x, (0, 0))
    with pytest.raises(ValueError, match=r"concatenate: input 1 has shape \(3, 3\)"):
        ops.concatenate([x, Tensor(np.zeros((3, 3)))], axis=1)
    with pytest.raises(ValueError, match=r"stack: input 1 has shape \(2, 2\)"):
        ops.stack([x, Tensor(np.zeros((2, 2)))])
    with pytest.raises(IndexError, match=r"getitem: .*tensor shape \(2, 3\)"):
        ops.getitem(x, (0, 5))
