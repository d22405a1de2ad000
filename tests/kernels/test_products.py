"""Stacks of products as one strided-batched GEMM: the arguments worked out for cuBLAS,
run through a NumPy model of cuBLAS's documented column-major semantics, give ``a @ b`` for
every layout the attention and matmul ops pass (transposed views, broadcast stacks); the
strict device's route gives the host's product."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.kernels import products


def cublas_gemm_strided_batched(arguments, first, second, out_flat):
    """``C = op(A) op(B)`` per batch entry, column-major, as cuBLAS documents it; ``first``
    is its A, ``second`` its B (flat element buffers)."""
    g = arguments
    i = np.arange(g.m)[:, None, None]
    j = np.arange(g.n)[None, :, None]
    inner = np.arange(g.k)[None, None, :]
    for entry in range(g.batch):
        if g.transa == products.NO_TRANSPOSE:
            op_a = first[entry * g.stride_a + i + inner * g.lda]  # (m, 1, k)
        else:
            op_a = first[entry * g.stride_a + inner + i * g.lda]
        if g.transb == products.NO_TRANSPOSE:
            op_b = second[entry * g.stride_b + inner + j * g.ldb]  # (1, n, k)
        else:
            op_b = second[entry * g.stride_b + j + inner * g.ldb]
        c = (op_a * op_b).sum(axis=2)  # (m, n)
        out_flat[entry * g.stride_c + i[:, :, 0] + j[:, :, 0] * g.ldc] = c


def stack(rng, shape, layout):
    """A view of ``shape`` into a flat buffer starting at the view's first element:
    ``"c"`` row-major, ``"t"`` each matrix column-major (a swapaxes view), ``"b"`` one
    matrix broadcast over the leading axes, ``"p"`` row-major with padded rows."""
    *lead, rows, columns = shape
    count = int(np.prod(lead, dtype=np.int64))
    if layout == "c":
        flat = rng.standard_normal(count * rows * columns)
        return flat, flat.reshape(shape)
    if layout == "t":
        flat = rng.standard_normal(count * rows * columns)
        return flat, np.swapaxes(flat.reshape(*lead, columns, rows), -1, -2)
    if layout == "b":
        flat = rng.standard_normal(rows * columns)
        return flat, np.broadcast_to(flat.reshape(rows, columns), shape)
    flat = rng.standard_normal(count * rows * (columns + 3))
    return flat, flat.reshape(*lead, rows, columns + 3)[..., :columns]


@pytest.mark.parametrize("layout_b", ["c", "t", "b", "p"])
@pytest.mark.parametrize("layout_a", ["c", "t", "b", "p"])
@pytest.mark.parametrize("lead", [(), (3,), (2, 4)])
def test_the_cublas_arguments_compute_the_product(lead, layout_a, layout_b):
    rng = np.random.default_rng(0)
    a_flat, a = stack(rng, (*lead, 5, 4), layout_a)
    b_flat, b = stack(rng, (*lead, 4, 6), layout_b)
    arguments = products.gemm_arguments(a, b)
    assert arguments is not None
    out = np.empty((*lead, 5, 6))
    cublas_gemm_strided_batched(arguments, b_flat, a_flat, out.reshape(-1))
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)


def test_a_layout_cublas_cannot_read_is_refused():
    rng = np.random.default_rng(1)
    every_other = rng.standard_normal((3, 8, 4))[:, ::2, ::2]  # neither row- nor column-major
    assert products.gemm_arguments(every_other, rng.standard_normal((3, 2, 5))) is None
    uneven = np.broadcast_to(rng.standard_normal((2, 1, 4, 5)), (2, 3, 4, 5))
    assert products.gemm_arguments(uneven, rng.standard_normal((2, 3, 5, 6))) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_strict_device_route_gives_the_hosts_product(dtype):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 3, 5, 4)).astype(dtype)
    b = rng.standard_normal((3, 6, 4)).astype(dtype)
    device_b = np.swapaxes(backend.to_device(b, "strict"), -1, -2)  # a view, broadcast too
    result = products.matmul(backend.to_device(a, "strict"), device_b)
    np.testing.assert_allclose(backend.as_numpy(result), a @ np.swapaxes(b, -1, -2), rtol=1e-6)


def test_matmul_and_attention_on_the_device_match_the_host():
    from same_on_both import compare

    from bigdl_py.autograd import ops

    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((3, 4, 6))
    compare(lambda x, y: ops.matmul(x, y), [a, b], [True, True])
    q, k, v = (rng.standard_normal((2, 3, 7, 4)) for _ in range(3))
    mask = np.where(rng.random((7, 7)) < 0.2, -np.inf, 0.0)
    mask[:, 0] = 0.0  # every row attends somewhere
    compare(
        lambda q, k, v, m: ops.scaled_dot_product_attention(q, k, v, mask=m.data),
        [q, k, v, mask],
        [True, True, True, False],
    )
