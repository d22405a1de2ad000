"""Representative forward/backward runs in float32 on each device against float64 on the CPU.

On the CPU this checks float32 accuracy; with CuPy and a CUDA device the same cases run on the
GPU (marked ``gpu``) and must agree with the CPU's float64 results.
"""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd import Tensor, ops

CASES = {
    "conv2d_padded": (
        lambda x, w, b: ops.conv2d(x, w, b, padding=1),
        [(2, 3, 6, 6), (4, 3, 3, 3), (4,)],
    ),
    "conv2d_strided_grouped": (
        lambda x, w: ops.conv2d(x, w, stride=2, groups=2, dilation=2),
        [(2, 4, 9, 9), (6, 2, 3, 3)],
    ),
    "conv2d_full_width_rows": (
        lambda x, w: ops.conv2d(x, w, padding=1),
        [(2, 3, 4, 12), (4, 3, 3, 3)],
    ),
    "conv_transpose2d": (
        lambda x, w, b: ops.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
        [(2, 4, 3, 3), (4, 3, 3, 3), (3,)],
    ),
    "conv1d": (lambda x, w: ops.conv1d(x, w, padding=1), [(2, 3, 9), (4, 3, 3)]),
    "max_pool2d": (lambda x: ops.max_pool2d(x, 2), [(2, 3, 6, 6)]),
    "avg_pool2d_padded": (lambda x: ops.avg_pool2d(x, 3, 2, 1), [(2, 3, 7, 7)]),
    "batch_norm": (lambda x, w, b: ops.batch_norm(x, None, None, w, b), [(4, 3, 2, 2), (3,), (3,)]),
    "layer_norm": (lambda x, w, b: ops.layer_norm(x, 5, w, b), [(3, 5), (5,), (5,)]),
    "linear_softmax": (
        lambda x, w, b: ops.log_softmax(ops.tanh(ops.linear(x, w, b))),
        [(4, 6), (3, 6), (3,)],
    ),
    "matmul_reductions": (
        lambda a, b: ops.max(ops.matmul(a, b), axis=1) + ops.mean(a),
        [(2, 3, 4), (4, 5)],
    ),
    "gelu_indexing": (lambda a: ops.gelu(a)[np.array([0, 0, 2])], [(3, 4)]),
    "dropout": (lambda a: ops.dropout(a, 0.5, rng=np.random.default_rng(3)), [(5, 4)]),
    "embedding": (lambda w: ops.embedding(np.array([[0, 2], [2, 1]]), w), [(3, 4)]),
}


def _run(function, arrays, dtype, device):
    inputs = [Tensor(a, requires_grad=True, dtype=dtype, device=device) for a in arrays]
    output = function(*inputs)
    upstream = np.random.default_rng(1).standard_normal(output.shape)
    output.backward(Tensor(upstream, dtype=dtype, device=device))
    return output.numpy(), [tensor.grad.numpy() for tensor in inputs]


@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_on_device_matches_float64_on_cpu(device, rng, case):
    function, shapes = CASES[case]
    arrays = [rng.standard_normal(shape) for shape in shapes]
    expected_output, expected_grads = _run(function, arrays, np.float64, "cpu")
    output, grads = _run(function, arrays, np.float32, device)
    assert output.dtype == np.float32
    np.testing.assert_allclose(output, expected_output, rtol=1e-4, atol=1e-5)
    for position, (grad, expected) in enumerate(zip(grads, expected_grads, strict=True)):
        assert grad.dtype == np.float32
        np.testing.assert_allclose(
            grad, expected, rtol=1e-4, atol=1e-4, err_msg=f"gradient of input {position}"
        )
