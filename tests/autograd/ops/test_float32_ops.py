"""Every op keeps float32 in float32, forward and backward: no silent upcast to float64."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd import Tensor, ops

MASK = np.array([True, False, True, True])

# (id, function, input shapes); positive inputs are used throughout so log/sqrt/pow work.
FLOAT32_CASES = [
    ("add", lambda a, b: a + b, [(3, 4), (4,)]),
    ("sub_scalar", lambda a: 1.5 - a, [(3, 4)]),
    ("mul", lambda a, b: a * b, [(3, 4), (3, 4)]),
    ("div_python_float", lambda a: a / 3.0, [(3, 4)]),
    ("pow", lambda a: a**2.5, [(3, 4)]),
    ("exp_log_sqrt_abs", lambda a: ops.abs(ops.sqrt(ops.log(ops.exp(a)))), [(3, 4)]),
    (
        "activations",
        lambda a: (
            ops.tanh(a)
            + ops.sigmoid(a)
            + ops.relu(a)
            + ops.leaky_relu(a)
            + ops.gelu(a)
            + ops.gelu(a, "tanh")
        ),
        [(3, 4)],
    ),
    ("softmax_family", lambda a: ops.softmax(a) + ops.log_softmax(a, axis=0), [(3, 4)]),
    (
        "reductions",
        lambda a: (
            ops.sum(a, 0)
            + ops.mean(a, 0)
            + ops.max(a, 0)
            + ops.min(a, 0)
            + ops.var(a, 0, unbiased=True)
        ),
        [(3, 4)],
    ),
    ("matmul_linear", lambda a, w: ops.matmul(a, w.T) + ops.linear(a, w), [(3, 4), (2, 4)]),
    (
        "shape_ops",
        lambda a: ops.concatenate(
            [a[:, MASK], a[np.array([0, 0, 2])].T[1:3].T, a.reshape(4, 3).T], axis=1
        ),
        [(3, 4)],
    ),
    (
        "stack_where_clip",
        lambda a, b: ops.stack([ops.where(a > b, a, b), ops.clip(a, 0.2, 0.8)]),
        [(3, 4), (3, 4)],
    ),
    ("conv2d", lambda x, w: ops.conv2d(x, w, padding=1), [(2, 3, 5, 5), (4, 3, 3, 3)]),
    ("conv2d_col2im", lambda x, w: ops.conv2d(x, w, stride=2), [(2, 3, 5, 5), (4, 3, 3, 3)]),
    ("pools", lambda x: ops.max_pool2d(x, 2) + ops.avg_pool2d(x, 2), [(2, 3, 4, 4)]),
    (
        "overlapping_pools",
        lambda x: ops.max_pool2d(x, 3, 1, 1) + ops.avg_pool2d(x, 3, 1, 1),
        [(2, 3, 4, 4)],
    ),
    (
        "batch_norm_train",
        lambda x, w: ops.batch_norm(x, np.zeros(3, np.float32), np.ones(3, np.float32), w, w),
        [(4, 3, 2, 2), (3,)],
    ),
    (
        "batch_norm_eval_float64_buffers",
        lambda x: ops.batch_norm(x, np.zeros(3), np.ones(3), training=False),
        [(4, 3)],
    ),
    ("layer_norm", lambda x, w: ops.layer_norm(x, 4, w, w), [(3, 4), (4,)]),
    ("dropout", lambda x: ops.dropout(x, 0.5, rng=np.random.default_rng(0)), [(3, 4)]),
    ("embedding", lambda w: ops.embedding(np.array([[0, 1], [1, 2]]), w), [(3, 4)]),
]


@pytest.mark.parametrize(
    "function, shapes",
    [case[1:] for case in FLOAT32_CASES],
    ids=[case[0] for case in FLOAT32_CASES],
)
def test_op_keeps_float32_forward_and_backward(rng, function, shapes, monkeypatch):
    inputs = [
        Tensor(0.1 + rng.random(shape), requires_grad=True, dtype=np.float32) for shape in shapes
    ]
    output = function(*inputs)
    assert output.data.dtype == np.float32
    # The upstream gradient comes in float32 too; a backward that upcasts would return float64
    # arrays, which the engine would silently cast back, so check the raw backward outputs.
    upstream = np.ones(output.shape, dtype=np.float32)
    _assert_backward_stays_float32(output, upstream, monkeypatch)
    for tensor in inputs:
        assert tensor.grad is None or tensor.grad.dtype == np.float32


def _assert_backward_stays_float32(output, upstream, monkeypatch):
    """Run the engine's backward, checking the raw gradients every op's backward returns."""
    from bigdl_py.autograd import engine

    real_step = engine.backward_step
    checked = []

    def checked_step(function, gradient):
        checked.append(function.name)
        results = real_step(function, gradient)
        for result in results:
            assert result is None or result.dtype == np.float32, (
                f"{function.name}.backward returned a {result.dtype} gradient"
            )
        return results

    monkeypatch.setattr(engine, "backward_step", checked_step)
    output.backward(upstream)
    assert checked, "the backward walk ran no op's backward"
