"""GPU products through our cuBLAS handle (``bigdl_py.autograd.ops.cublas``).

Without a GPU: the call worked out from shapes and strides (transposes as flags, leading
dimensions, one strided-batched call for stacks and broadcasts) is run by a NumPy model of
cuBLAS's column-major GEMM on the operands' own memory, and must give ``a @ b``; the
products it must leave to CuPy; the TF32 compute type; the workspace size.

With a GPU (``gpu``): against CuPy's matmul and NumPy, the route checked to have run, the
layers' products on it, and a product captured in a CUDA graph.
"""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend
from bigdl_py.autograd.ops import cublas
from bigdl_py.autograd.ops.cublas import CUBLAS_OP_N, CUBLAS_OP_T, ColumnMajorOperand


def test_column_major_operands():
    assert cublas.column_major_operand((3, 4), (4, 1)) == ColumnMajorOperand(CUBLAS_OP_N, 4)
    assert cublas.column_major_operand((3, 4), (1, 3)) == ColumnMajorOperand(CUBLAS_OP_T, 3)
    assert cublas.column_major_operand((3, 4), (7, 1)) == ColumnMajorOperand(CUBLAS_OP_N, 7)
    assert cublas.column_major_operand((1, 4), (1, 1)) == ColumnMajorOperand(CUBLAS_OP_N, 4)
    assert cublas.column_major_operand((3, 1), (1, 1)) == ColumnMajorOperand(CUBLAS_OP_T, 3)
    assert cublas.column_major_operand((3, 4), (8, 2)) is None  # every other column
    assert cublas.column_major_operand((3, 4), (0, 1)) is None  # a broadcast row
    assert cublas.column_major_operand((3, 4), (2, 1)) is None  # rows overlap


def test_batch_strides():
    assert cublas.batch_stride((2, 3), (36, 12)) == 12
    assert cublas.batch_stride((2, 1, 3), (36, 99, 12)) == 12  # a size-1 axis never steps
    assert cublas.batch_stride((4,), (0,)) == 0  # a broadcast operand
    assert cublas.batch_stride((2, 3), (0, 0)) == 0
    assert cublas.batch_stride((), ()) == 0
    assert cublas.batch_stride((2, 3), (12, 0)) is None  # broadcast inside, not outside
    assert cublas.batch_stride((2, 3), (40, 12)) is None
    assert cublas.batch_stride((3,), (-12,)) is None


def simulate(call, a_memory, a_start, b_memory, b_start, out_shape):
    """cuBLAS's strided-batched GEMM (column-major, ``C = op(A) @ op(B)``, our ``b`` as
    its A, our ``a`` as its B) on flat memory, returned as our row-major result."""

    def matrix(memory, start, operation, leading, rows, columns):
        # element (r, c) of op(X), X stored column-major with leading dimension `leading`
        r, c = np.meshgrid(np.arange(rows), np.arange(columns), indexing="ij")
        index = start + (r + c * leading if operation == CUBLAS_OP_N else c + r * leading)
        return memory[index]

    out = np.empty((call.batch, call.n, call.m))
    for item in range(call.batch):
        first = matrix(
            b_memory, b_start + item * call.b_stride, call.b_operation, call.b_leading,
            call.m, call.k,
        )  # fmt: skip
        second = matrix(
            a_memory, a_start + item * call.a_stride, call.a_operation, call.a_leading,
            call.k, call.n,
        )  # fmt: skip
        column_major_result = first @ second  # (m, n): our (n, m) row-major, ldc = m
        assert call.result_leading == call.m and call.result_stride == call.m * call.n
        out[item] = column_major_result.T
    return out.reshape(out_shape)


def _view(memory, make):
    """``make(memory)`` (a view of ``memory``) and the element offset where it starts."""
    view = make(memory)
    return view, (view.__array_interface__["data"][0] - memory.ctypes.data) // memory.itemsize


def _memory(size):
    return np.random.default_rng(size).standard_normal(size)


OPERAND_CASES = {
    "plain": (lambda m: m[:12].reshape(3, 4), lambda m: m[:20].reshape(4, 5)),
    "transposed": (lambda m: m[:12].reshape(4, 3).T, lambda m: m[:20].reshape(5, 4).T),
    "row_padded": (lambda m: m[:21].reshape(3, 7)[:, 2:6], lambda m: m[5:29].reshape(4, 6)[:, :5]),
    "batched": (lambda m: m[:24].reshape(2, 3, 4), lambda m: m[:40].reshape(2, 4, 5)),
    "batched_transposed": (
        lambda m: m[:24].reshape(2, 4, 3).swapaxes(1, 2),
        lambda m: m[:40].reshape(2, 5, 4).swapaxes(1, 2),
    ),
    "broadcast_left": (lambda m: m[:12].reshape(3, 4), lambda m: m[:120].reshape(2, 3, 4, 5)),
    "broadcast_right": (lambda m: m[:72].reshape(2, 3, 3, 4), lambda m: m[:20].reshape(4, 5)),
    "size_one_batch": (lambda m: m[:24].reshape(1, 2, 3, 4), lambda m: m[:40].reshape(2, 4, 5)),
    "one_row": (lambda m: m[:4].reshape(1, 4), lambda m: m[:20].reshape(4, 5)),
}


@pytest.mark.parametrize("case", OPERAND_CASES)
def test_the_call_computes_the_product_in_place(case):
    make_a, make_b = OPERAND_CASES[case]
    a_memory, b_memory = _memory(200), _memory(300)
    a, a_start = _view(a_memory, make_a)
    b, b_start = _view(b_memory, make_b)
    call = cublas.product_call(a.shape, a.strides, b.shape, b.strides, 8)
    assert call is not None
    want = a @ b
    got = simulate(call, a_memory, a_start, b_memory, b_start, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_transposes_are_flags_not_copies():
    x = np.ones((6, 4))
    weight = np.ones((5, 4))
    call = cublas.product_call(x.shape, x.strides, weight.T.shape, weight.T.strides, 8)
    # Linear's x @ weight.T: weight read in place, transposed by cuBLAS
    assert (call.a_operation, call.b_operation) == (CUBLAS_OP_N, CUBLAS_OP_T)
    assert (call.m, call.n, call.k, call.batch) == (5, 6, 4, 1)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (np.ones(4), np.ones((4, 3))),  # 1-d: CuPy's rules for vectors
        (np.ones((0, 4)), np.ones((4, 3))),
        (np.ones((3, 4)), np.ones((5, 3))),  # inner sizes differ: CuPy raises its error
        (np.ones((6, 8))[::2, ::2], np.ones((4, 3))),
        (np.ones((2, 3, 4))[:, ::-1], np.ones((4, 3))),
        (np.ones((2, 1, 3, 4)), np.ones((1, 3, 4, 5))),  # broadcast inside the batch
        (np.ones((2, 3, 4)), np.ones((5, 4, 2))),  # batch shapes do not broadcast
    ],
)
def test_products_left_to_cupy(a, b):
    assert cublas.product_call(a.shape, a.strides, b.shape, b.strides, 8) is None


def test_tf32_compute_type_follows_the_setting(monkeypatch):
    monkeypatch.setattr(backend, "_tf32", {"matmul": False, "cudnn": True})
    assert cublas.compute_type(np.float32) == cublas.CUBLAS_COMPUTE_32F
    assert cublas.compute_type(np.float16) == cublas.CUBLAS_COMPUTE_32F
    assert cublas.compute_type(np.float64) == cublas.CUBLAS_COMPUTE_64F
    backend.allow_tf32(matmul=True)
    assert cublas.compute_type(np.float32) == cublas.CUBLAS_COMPUTE_32F_FAST_TF32
    assert cublas.compute_type(np.float64) == cublas.CUBLAS_COMPUTE_64F


def test_workspace_is_cublas_recommended_size():
    assert cublas.workspace_bytes(9) == cublas.workspace_bytes(10) == 32 << 20
    assert cublas.workspace_bytes(8) == 4 << 20


@pytest.mark.parametrize("case", ["batched", "broadcast_left", "plain"])
def test_matmul_allocates_the_result_and_falls_back(monkeypatch, case):
    """``cublas.matmul``'s own work (dtype checks, the result's shape) on host arrays, its
    call run by the NumPy model; and CuPy's (here NumPy's) matmul when unavailable."""
    make_a, make_b = OPERAND_CASES[case]
    a_memory, b_memory = _memory(200), _memory(300)
    a, a_start = _view(a_memory, make_a)
    b, b_start = _view(b_memory, make_b)

    def run(call, left, right, out):
        assert left is a and right is b and out.flags.c_contiguous
        out[...] = simulate(call, a_memory, a_start, b_memory, b_start, out.shape)

    monkeypatch.setattr(cublas, "available", lambda: True)
    monkeypatch.setattr(cublas, "run", run)
    np.testing.assert_allclose(cublas.matmul(a, b), a @ b, rtol=1e-12)
    monkeypatch.setattr(cublas, "run", lambda *args: pytest.fail("the route ran"))
    integers = a.astype(np.int64), b.astype(np.int64)
    np.testing.assert_array_equal(cublas.matmul(*integers), integers[0] @ integers[1])
    monkeypatch.setattr(cublas, "available", lambda: False)
    np.testing.assert_allclose(cublas.matmul(a, b), a @ b, rtol=1e-12)


# --- on a GPU ----------------------------------------------------------------------------------

requires_gpu = pytest.mark.skipif(
    not backend.cuda_available(), reason="needs CuPy and a CUDA device"
)


@pytest.fixture
def cublas_runs(monkeypatch):
    """Every product our handle ran (a GPU machine where libcublas does not load fails)."""
    monkeypatch.delenv(cublas.SWITCH_VARIABLE, raising=False)
    if cublas.loaded() is None:
        pytest.fail("libcublas for CuPy's CUDA does not load: install the gpu extra")
    runs = []
    real = cublas.run

    def counted(call, *arrays):
        runs.append(call)
        return real(call, *arrays)

    monkeypatch.setattr(cublas, "run", counted)
    return runs


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("case", OPERAND_CASES)
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_gpu_products_match_cupy_and_numpy(monkeypatch, cublas_runs, case, dtype):
    monkeypatch.setattr(backend, "_tf32", {"matmul": False, "cudnn": True})
    cupy = backend.cupy_module()
    make_a, make_b = OPERAND_CASES[case]
    a_memory = cupy.asarray(_memory(200), dtype=dtype)
    b_memory = cupy.asarray(_memory(300), dtype=dtype)
    a, b = make_a(a_memory), make_b(b_memory)
    got = cublas.matmul(a, b)
    assert len(cublas_runs) == 1
    tolerance = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-2}[dtype]
    want = a.get().astype(np.float64) @ b.get().astype(np.float64)
    np.testing.assert_allclose(got.get(), want, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(got.get(), cupy.matmul(a, b).get(), rtol=tolerance, atol=tolerance)


@pytest.mark.gpu
@requires_gpu
def test_gpu_tf32_products_stay_close(monkeypatch, cublas_runs):
    monkeypatch.setattr(backend, "_tf32", {"matmul": True, "cudnn": True})
    cupy = backend.cupy_module()
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((256, 512)), rng.standard_normal((512, 128))
    got = cublas.matmul(cupy.asarray(a, np.float32), cupy.asarray(b, np.float32)).get()
    want = a @ b
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-3 * np.abs(want).max())


@pytest.mark.gpu
@requires_gpu
def test_gpu_linear_layers_run_on_the_handle(cublas_runs):
    from bigdl_py import nn
    from bigdl_py.autograd import Tensor

    layer = nn.Linear(8, 5).to(device="cuda", dtype=np.float64)
    values = np.random.default_rng(6).standard_normal((4, 8))
    x = Tensor(backend.cupy_module().asarray(values), requires_grad=True)
    layer(x).sum().backward()
    assert len(cublas_runs) == 3  # forward, input gradient, weight gradient
    weight = layer.weight.numpy()
    np.testing.assert_allclose(x.grad.numpy(), np.ones((4, 5)) @ weight, rtol=1e-12)


@pytest.mark.gpu
@requires_gpu
def test_gpu_a_product_replays_in_a_cuda_graph(cublas_runs):
    """After one call on the capture stream (which binds the handle and its workspace),
    the same call is captured, and replaying the graph reads the buffers anew."""
    cupy = backend.cupy_module()
    rng = np.random.default_rng(7)
    a = cupy.asarray(rng.standard_normal((2, 64, 32)))
    b = cupy.asarray(rng.standard_normal((32, 48)))
    out = cupy.empty((2, 64, 48))
    cupy.cuda.runtime.deviceSynchronize()  # the inputs, written on the default stream
    call = cublas.product_call(a.shape, a.strides, b.shape, b.strides, 8)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        cublas.run(call, a, b, out)  # warm-up: binds our handle to this stream
        stream.begin_capture()
        cublas.run(call, a, b, out)
        graph = stream.end_capture()
        # new input on the same stream (a non-blocking stream does not wait for others)
        a[...] = cupy.asarray(rng.standard_normal(a.shape))
        out[...] = 0
        graph.launch(stream)
    stream.synchronize()
    np.testing.assert_allclose(out.get(), a.get() @ b.get(), rtol=1e-12, atol=1e-12)
