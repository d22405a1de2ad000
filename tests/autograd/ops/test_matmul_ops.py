"""matmul_2d and Linear split among the tile threads: the same products as one GEMM."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.autograd import Tensor, ops
from bigdl_py.autograd.ops import conv_tiles
from bigdl_py.autograd.ops import matmul_ops as matmul


@pytest.fixture
def blas_threads_seen(monkeypatch):
    """The BLAS thread limit at each ``np.matmul`` call from now on (the product unchanged)."""
    seen = []
    real_matmul = np.matmul

    def recording_matmul(*args, **kwargs):
        seen.append(conv_tiles.worker_count())
        return real_matmul(*args, **kwargs)

    monkeypatch.setattr(np, "matmul", recording_matmul)
    return seen


@pytest.mark.parametrize(
    "a_shape, b_shape, transposed_b",
    [((40, 6), (6, 9), False), ((5, 6), (6, 33), False), ((7, 6), (31, 6), True)],
    ids=["split_by_rows", "split_by_columns", "columns_of_a_transposed_operand"],
)
def test_split_products_equal_one_gemm(
    monkeypatch, rng, a_shape, b_shape, transposed_b, blas_threads_seen, tiles_shared
):
    # Split even these small products (the threshold is for speed, not for results); each
    # part's GEMM writes its own rows or columns of the result. Products are split only in
    # a process whose ops share tiles among threads.
    tiles_shared(True)
    monkeypatch.setattr(matmul, "_MIN_SPLIT_MULTIPLY_ADDS", 1)
    monkeypatch.setattr(matmul, "_OPENBLAS_SINGLE_THREAD_MULTIPLY_ADDS", 0)
    a = rng.standard_normal(a_shape)
    b = rng.standard_normal(b_shape)
    b = b.T if transposed_b else b
    with backend.blas_threads(2):
        product = matmul.matmul_2d(a, b)
        assert conv_tiles.worker_count() == 2
    np.testing.assert_allclose(product, a @ b, rtol=1e-13, atol=1e-13)
    # Two parts, each computed with BLAS held to one thread.
    assert blas_threads_seen == [1, 1]


@pytest.fixture
def tiles_shared(monkeypatch):
    """Set whether an op shared its tiles among threads within the window (True) or never."""

    def set_shared(recently: bool):
        when = conv_tiles.time.monotonic() if recently else float("-inf")
        monkeypatch.setattr(conv_tiles, "_last_shared", [when])

    return set_shared


def test_a_product_too_small_to_split_runs_with_blas_held_to_one_thread(
    rng, blas_threads_seen, tiles_shared
):
    # Above OpenBLAS's own one-thread bound (2**18 multiply-adds), below the split's, in a
    # process whose ops share tiles among threads.
    tiles_shared(True)
    a, b = rng.standard_normal((64, 64)), rng.standard_normal((64, 128))
    with backend.blas_threads(2):
        matmul.matmul_2d(a, b)
    assert blas_threads_seen == [1]


@pytest.mark.parametrize("split", [False, True], ids=["too_small_to_split", "large"])
def test_without_shared_tiles_a_product_is_left_to_blas(
    monkeypatch, rng, blas_threads_seen, tiles_shared, split
):
    # No op shared tiles in the window (NCF's step, an MLP's): no tile thread for a spinning
    # BLAS thread to slow down, so BLAS's own threads take the product, whatever its size.
    tiles_shared(False)
    if split:
        monkeypatch.setattr(matmul, "_MIN_SPLIT_MULTIPLY_ADDS", 1)
    a, b = rng.standard_normal((64, 64)), rng.standard_normal((64, 128))
    with backend.blas_threads(2):
        product = matmul.matmul_2d(a, b)
    np.testing.assert_array_equal(product, a @ b)
    assert blas_threads_seen == []  # ``a @ b`` at BLAS's own limit, not held
    assert not conv_tiles.tiles_shared_recently()  # and it shared no tiles itself


def test_tiles_shared_among_threads_open_the_window_and_one_tile_does_not(tiles_shared):
    tiles_shared(False)
    with backend.blas_threads(2):
        conv_tiles.for_each_tile(1, 1, lambda start, stop, scratch: None)
        assert not conv_tiles.tiles_shared_recently()  # one tile: the calling thread alone
        conv_tiles.for_each_tile(4, 2, lambda start, stop, scratch: None)
    assert conv_tiles.tiles_shared_recently()


@pytest.mark.parametrize("openblas", [True, False], ids=["openblas", "other_blas"])
def test_a_product_openblas_runs_alone_is_not_held(
    monkeypatch, rng, openblas, blas_threads_seen, tiles_shared
):
    # 4 x 3 x 5 multiply-adds: OpenBLAS takes no second thread for it, so the thread limit
    # is left as it is; another BLAS (its rule unknown) is still held to one thread while
    # ops share tiles among threads.
    tiles_shared(True)
    monkeypatch.setattr(matmul, "blas_is_openblas", lambda: openblas)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((3, 5))
    with backend.blas_threads(2):
        product = matmul.matmul_2d(a, b)
    np.testing.assert_array_equal(product, a @ b)
    # ``a @ b`` does not go through np.matmul's Python name: nothing recorded when not held.
    assert blas_threads_seen == ([] if openblas else [1])


def test_openblas_is_recognised_among_the_loaded_blas():
    apis = {controller.internal_api for controller in conv_tiles._blas()}
    assert matmul._runs_on_one_blas_thread(1) == (bool(apis) and apis == {"openblas"})
    assert not matmul._runs_on_one_blas_thread(matmul._OPENBLAS_SINGLE_THREAD_MULTIPLY_ADDS + 1)


@pytest.mark.parametrize("input_shape", [(6,), (9, 6), (2, 5, 6)], ids=["1d", "2d", "3d"])
def test_linear_split_among_threads_matches_numpy(monkeypatch, rng, input_shape):
    monkeypatch.setattr(matmul, "_MIN_SPLIT_MULTIPLY_ADDS", 1)
    monkeypatch.setattr(matmul, "_OPENBLAS_SINGLE_THREAD_MULTIPLY_ADDS", 0)
    x = Tensor(rng.standard_normal(input_shape), requires_grad=True)
    weight = Tensor(rng.standard_normal((4, 6)), requires_grad=True)
    bias = Tensor(rng.standard_normal(4), requires_grad=True)
    upstream = rng.standard_normal(input_shape[:-1] + (4,))
    with backend.blas_threads(2):
        out = ops.linear(x, weight, bias)
        (out * Tensor(upstream)).sum().backward()
    flat_x, flat_upstream = x.data.reshape(-1, 6), upstream.reshape(-1, 4)
    np.testing.assert_allclose(out.data, x.data @ weight.data.T + bias.data, rtol=1e-13)
    np.testing.assert_allclose(x.grad.data, upstream @ weight.data, rtol=1e-13)
    np.testing.assert_allclose(weight.grad.data, flat_upstream.T @ flat_x, rtol=1e-13)
    np.testing.assert_allclose(bias.grad.data, flat_upstream.sum(axis=0), rtol=1e-13)


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((5, 3, 4), (4, 6)),
        ((3, 4), (5, 4, 2)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((4,), (2, 4, 3)),
        ((2, 3, 4), (4,)),
        ((0, 3, 4), (4, 2)),
        ((2, 3, 0), (0, 4)),
    ],
    ids=[
        "stack_by_matrix",
        "matrix_by_stack",
        "broadcast_stacks",
        "vector_by_stack",
        "stack_by_vector",
        "empty_stack",
        "empty_inner",
    ],
)
def test_stacked_products_split_among_threads_match_numpy(monkeypatch, rng, a_shape, b_shape):
    monkeypatch.setattr(matmul, "_MIN_SPLIT_MULTIPLY_ADDS", 1)
    monkeypatch.setattr(matmul, "_OPENBLAS_SINGLE_THREAD_MULTIPLY_ADDS", 0)
    a = Tensor(rng.standard_normal(a_shape), requires_grad=True)
    b = Tensor(rng.standard_normal(b_shape), requires_grad=True)
    expected = np.matmul(a.data, b.data)
    upstream = rng.standard_normal(expected.shape)
    with backend.blas_threads(2):
        product = ops.matmul(a, b)
        (product * Tensor(upstream)).sum().backward()
    np.testing.assert_allclose(product.data, expected, rtol=1e-13, atol=1e-13)
    # The gradients of the same product taken as one NumPy matmul per operand.
    a_ref = Tensor(a.data, requires_grad=True)
    b_ref = Tensor(b.data, requires_grad=True)
    with backend.blas_threads(1):
        (ops.matmul(a_ref, b_ref) * Tensor(upstream)).sum().backward()
    np.testing.assert_allclose(a.grad.data, a_ref.grad.data, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(b.grad.data, b_ref.grad.data, rtol=1e-13, atol=1e-13)


def test_an_outer_product_is_a_broadcast_multiply(rng):
    # Inner size 1 (a one-output Linear's input gradient) skips the GEMM.
    a, b = rng.standard_normal((7, 1)), rng.standard_normal((1, 5)).astype(np.float32)
    product = matmul.matmul_2d(a, b)
    assert product.dtype == (a @ b).dtype
    np.testing.assert_allclose(product, a @ b, rtol=1e-6)
    linear_input = Tensor(rng.standard_normal((6, 4)), requires_grad=True)
    weight = Tensor(rng.standard_normal((1, 4)), requires_grad=True)
    ops.linear(linear_input, weight).sum().backward()
    np.testing.assert_allclose(linear_input.grad.numpy(), np.ones((6, 1)) @ weight.numpy())


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux thread affinity and two CPUs",
)
def test_a_split_product_keeps_the_pool_threads_off_the_callers_cpu(monkeypatch, rng):
    monkeypatch.setattr(matmul, "_MIN_SPLIT_MULTIPLY_ADDS", 1)
    monkeypatch.setattr(matmul, "_OPENBLAS_SINGLE_THREAD_MULTIPLY_ADDS", 0)
    a, b = rng.standard_normal((64, 8)), rng.standard_normal((8, 16))
    allowed = os.sched_getaffinity(0)
    try:
        with backend.blas_threads(2):
            for _ in range(2):  # the first call starts the pool thread, the second pins it
                product = matmul.matmul_2d(a, b)
            caller_cpu = conv_tiles._workers_kept_off[0]
            workers = list(conv_tiles._worker_ids)
        np.testing.assert_allclose(product, a @ b, rtol=1e-13, atol=1e-13)
        if caller_cpu is None:  # no sched_getcpu here: nothing may have been pinned
            assert all(os.sched_getaffinity(worker) == allowed for worker in workers)
        else:
            assert workers
            for worker in workers:
                assert os.sched_getaffinity(worker) == allowed - {caller_cpu}
    finally:
        for worker in conv_tiles._worker_ids:
            os.sched_setaffinity(worker, allowed)
        conv_tiles._workers_kept_off[0] = None
