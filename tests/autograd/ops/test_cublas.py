"""Device products through one route, our cuBLAS handle (``bigdl_py.autograd.ops.cublas``).

Without a GPU: the call worked out from shapes and strides (transposes as flags, leading
dimensions, one strided-batched call for stacks and broadcasts) is run by a NumPy rendering
of cuBLAS's documented column-major GEMM on the operands' own memory, and must give
``a @ b`` for every layout the ops pass; the layouts no call describes; the TF32 compute
type; the workspace size. On the strict device every device product runs the package's
model of that same call: checked to read memory as the call's arguments say (and to refuse
a call reaching past an operand), into ``out`` buffers, on vectors, on copies of operands
no call describes, left to the device's ``matmul`` where the GPU route leaves it (empty,
integer, mismatched), recorded in an emulated graph, and carrying the products of
``matmul``, ``Linear`` and attention to the host's results.

With a GPU (``gpu``): against CuPy's matmul and NumPy, the route checked to have run, into
``out``, the layers' and attention's products on it, and a product captured in a CUDA graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import pytest

from bigdl_py import backend, device_waits, strict_device
from bigdl_py.autograd import Tensor, ops
from bigdl_py.autograd.ops import cublas, cudnn
from bigdl_py.autograd.ops.cublas import CUBLAS_OP_N, CUBLAS_OP_T, ColumnMajorOperand
from bigdl_py.nn._recurrent_functions import GRUSequence, LSTMSequence, RNNSequence
from bigdl_py.step_graph import StepGraph


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
    """cuBLAS's strided-batched GEMM as its documentation states it (column-major,
    ``C = op(A) @ op(B)``, our ``b`` as its A, our ``a`` as its B), element by element on
    flat memory, returned as our row-major result. Written apart from the package's own
    model (``cublas.run_model``), so that the two check each other."""

    def matrix(memory, start, operation, leading, rows, columns):
        # element (r, c) of op(X), X stored column-major with leading dimension `leading`
        r, c = np.meshgrid(np.arange(rows), np.arange(columns), indexing="ij")
        index = start + (r + c * leading if operation == CUBLAS_OP_N else c + r * leading)
        return memory[index]

    out = np.empty((call.batch, call.n, call.m), dtype=a_memory.dtype)
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


A_MEMORY, B_MEMORY = 300, 400  # elements: enough for every case below


def _memory(size, dtype=np.float64):
    return np.random.default_rng(size).standard_normal(size).astype(dtype)


def _stack(memory, shape, layout):
    """A view of ``memory`` of ``shape`` from its first element: ``"c"`` row-major, ``"t"``
    each matrix column-major (a swapaxes view), ``"b"`` one matrix broadcast over the
    leading axes, ``"p"`` row-major with padded rows (a slice of wider rows)."""
    *lead, rows, columns = shape
    count = math.prod(lead)
    if layout == "c":
        return memory[: count * rows * columns].reshape(shape)
    if layout == "t":
        return memory[: count * rows * columns].reshape(*lead, columns, rows).swapaxes(-1, -2)
    if layout == "b":
        return backend.array_module(memory).broadcast_to(
            memory[: rows * columns].reshape(rows, columns), shape
        )
    return memory[: count * rows * (columns + 3)].reshape(*lead, rows, columns + 3)[..., :columns]


def _layout_case(lead, layout_a, layout_b):
    return (
        lambda m: _stack(m, (*lead, 5, 4), layout_a),
        lambda m: _stack(m, (*lead, 4, 6), layout_b),
    )


# Every pair of layouts, as 2-d matrices and as stacks with one and two batch axes (what
# matmul, Linear and attention pass: transposed views, broadcast keys, padded slices) ...
OPERAND_CASES = {
    f"{'x'.join(map(str, lead)) or 'matrix'}-{layout_a}{layout_b}": _layout_case(
        lead, layout_a, layout_b
    )
    for lead in ((), (3,), (2, 4))
    for layout_a in ("ctp" if not lead else "ctbp")
    for layout_b in ("ctp" if not lead else "ctbp")
}
# ... and operands of different ranks, size-one batch axes, single rows and columns.
OPERAND_CASES.update(
    {
        "broadcast_left": (lambda m: m[:12].reshape(3, 4), lambda m: m[:120].reshape(2, 3, 4, 5)),
        "broadcast_right": (lambda m: m[:72].reshape(2, 3, 3, 4), lambda m: m[:20].reshape(4, 5)),
        "size_one_batch": (
            lambda m: m[:24].reshape(1, 2, 3, 4),
            lambda m: m[:40].reshape(2, 4, 5),
        ),
        "one_row": (lambda m: m[:4].reshape(1, 4), lambda m: m[:20].reshape(4, 5)),
        "one_column": (lambda m: m[:12].reshape(3, 4), lambda m: m[:4].reshape(4, 1)),
        # views that start past their memory's first element (attention's tiles do)
        "offset_padded": (
            lambda m: m[:21].reshape(3, 7)[:, 2:6],
            lambda m: m[5:29].reshape(4, 6)[:, :5],
        ),
        "offset_stacks": (
            lambda m: m[7:55].reshape(4, 3, 4)[2:],
            lambda m: m[3:83].reshape(2, 4, 10)[..., 4:9],
        ),
    }
)


@pytest.mark.parametrize("case", OPERAND_CASES)
def test_the_call_computes_the_product_in_place(case):
    make_a, make_b = OPERAND_CASES[case]
    a_memory, b_memory = _memory(A_MEMORY), _memory(B_MEMORY)
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


def _values(xp, *shape):
    """Distinct values of ``shape`` on ``xp``'s device (a wrong read shows)."""
    return xp.asarray(np.random.default_rng(sum(shape)).standard_normal(shape))


# Layouts no call describes, made with an array module (NumPy's or the strict device's) so
# that the device's operands have the same layout: the route copies them first.
UNDESCRIBED = {
    # a vector of every other element: no leading dimension describes it as a matrix
    "strided_vector": lambda xp: (_values(xp, 8)[::2], _values(xp, 4, 3)),
    "every_other": lambda xp: (_values(xp, 6, 8)[::2, ::2], _values(xp, 4, 3)),  # no major order
    "every_other_stack": lambda xp: (_values(xp, 3, 8, 4)[:, ::2, ::2], _values(xp, 3, 2, 5)),
    "reversed": lambda xp: (_values(xp, 2, 3, 4)[:, ::-1], _values(xp, 4, 3)),
    "inner_broadcast": lambda xp: (_values(xp, 2, 1, 3, 4), _values(xp, 1, 3, 4, 5)),
    "inner_broadcast_view": lambda xp: (
        xp.broadcast_to(_values(xp, 2, 1, 4, 5), (2, 3, 4, 5)),
        _values(xp, 2, 3, 5, 6),
    ),
    # attention's heads: (N, H, L, D) views of (N, L, H * D) projections, batch strides
    # (L * H * D, D) that no one stride gives
    "split_heads": lambda xp: (
        xp.swapaxes(_values(xp, 2, 5, 12).reshape(2, 5, 3, 4), 1, 2),
        xp.swapaxes(_values(xp, 2, 6, 12).reshape(2, 6, 3, 4), 1, 2).swapaxes(-1, -2),
    ),
}
EMPTY = {"empty": lambda xp: (xp.ones((0, 4)), xp.ones((4, 3)))}  # nothing to multiply
MISMATCHED = {  # no product at all: the device's matmul raises its error
    "inner_sizes_differ": lambda xp: (xp.ones((3, 4)), xp.ones((5, 3))),
    "batches_do_not_broadcast": lambda xp: (xp.ones((2, 3, 4)), xp.ones((5, 4, 2))),
}
NO_CALL = {**UNDESCRIBED, **EMPTY, **MISMATCHED}


@pytest.mark.parametrize("case", NO_CALL)
def test_layouts_no_call_describes(case):
    a, b = NO_CALL[case](np)
    assert cublas.product_call(a.shape, a.strides, b.shape, b.strides, 8) is None


# Vectors, which the route takes as the one-row (left) or one-column (right) matrices NumPy
# makes of them, dropping that axis from the result.
VECTOR_CASES = {
    "matrix_vector": ((5, 4), (4,)),
    "vector_matrix": ((4,), (4, 6)),
    "vector_vector": ((4,), (4,)),
    "stack_vector": ((2, 3, 5, 4), (4,)),  # norm's per-channel sums
    "vector_stack": ((4,), (3, 4, 6)),
}


def _vector_operands(case):
    a_shape, b_shape = VECTOR_CASES[case]
    rng = np.random.default_rng(len(a_shape) * 10 + len(b_shape))
    return rng.standard_normal(a_shape), rng.standard_normal(b_shape)


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


# --- on the strict device: the model of the call ----------------------------------------------


def _calls_of(monkeypatch, runner: str) -> list:
    """The calls ``cublas.<runner>`` runs from now on, the route switched on."""
    monkeypatch.delenv(cublas.SWITCH_VARIABLE, raising=False)
    runs = []
    real = getattr(cublas, runner)

    def counted(call, *arrays):
        runs.append(call)
        return real(call, *arrays)

    monkeypatch.setattr(cublas, runner, counted)
    return runs


@pytest.fixture
def model_runs(monkeypatch):
    """Every call the strict device's model ran."""
    return _calls_of(monkeypatch, "run_model")


TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-2}


@pytest.mark.parametrize("case", OPERAND_CASES)
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_the_strict_device_runs_the_model_of_the_call(model_runs, case, dtype):
    make_a, make_b = OPERAND_CASES[case]
    a_memory, b_memory = _memory(A_MEMORY, dtype), _memory(B_MEMORY, dtype)
    a = make_a(backend.to_device(a_memory, "strict"))
    b = make_b(backend.to_device(b_memory, "strict"))
    with device_waits.no_device_waits():
        got = cublas.matmul(a, b)
    assert len(model_runs) == 1
    want = make_a(a_memory).astype(np.float64) @ make_b(b_memory).astype(np.float64)
    assert got.dtype == dtype and got.flags.c_contiguous
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(backend.as_numpy(got), want, rtol=tolerance, atol=tolerance)


def test_the_model_reads_memory_as_the_call_says():
    """A wrong argument gives a wrong product (the model does not just multiply the arrays
    it is given), and one that would read past an operand's memory is refused."""
    a = _memory(A_MEMORY)[:12].reshape(3, 4)
    b = _memory(B_MEMORY)[:20].reshape(5, 4).T  # read transposed, in place
    call = cublas.product_call(a.shape, a.strides, b.shape, b.strides, 8)
    out = np.empty((3, 5))
    cublas.run_model(call, a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)
    flag_lost = dataclasses.replace(call, b_operation=CUBLAS_OP_N, b_leading=5)
    cublas.run_model(flag_lost, a, b, out)
    assert not np.allclose(out, a @ b)
    with pytest.raises(cublas.CublasError, match=r"reads b .* past the last one of b"):
        cublas.run_model(dataclasses.replace(call, b_leading=5), a, b, out)
    with pytest.raises(cublas.CublasError, match="past the last one of a"):
        cublas.run_model(dataclasses.replace(call, batch=2, a_stride=12), a, b, out)


def test_a_product_is_written_into_out(model_runs):
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))
    a_strict, b_strict = backend.to_device(a, "strict"), backend.to_device(b, "strict")
    out = backend.to_device(np.zeros((2, 3, 5)), "strict")
    assert cublas.matmul(a_strict, b_strict, out=out) is out
    assert len(model_runs) == 1
    np.testing.assert_allclose(out.get(), a @ b, rtol=1e-12)
    # a C-contiguous part of a larger buffer (attention's tiles): only that part is written
    buffer = backend.to_device(np.zeros((4, 3, 5)), "strict")
    assert cublas.matmul(a_strict, b_strict, out=buffer[1:3]) is not None
    assert len(model_runs) == 2
    np.testing.assert_allclose(buffer.get()[1:3], a @ b, rtol=1e-12)
    assert not buffer.get()[[0, 3]].any()
    # an out cuBLAS cannot write (not C-contiguous; empty_like of a transposed view gives
    # them): the product goes to a buffer of its own, copied into out
    transposed_out = backend.to_device(np.zeros((2, 5, 3)), "strict").swapaxes(-1, -2)
    assert cublas.matmul(a_strict, b_strict, out=transposed_out) is transposed_out
    assert len(model_runs) == 3
    np.testing.assert_allclose(transposed_out.get(), a @ b, rtol=1e-12)
    # an out of another shape or dtype: the device's matmul and its error
    with pytest.raises(ValueError):
        cublas.matmul(a_strict, b_strict, out=backend.to_device(np.zeros((2, 3, 4)), "strict"))
    assert len(model_runs) == 3


@pytest.mark.parametrize("case", VECTOR_CASES)
def test_vectors_run_as_one_row_or_one_column_matrices(model_runs, case):
    a, b = _vector_operands(case)
    a_strict, b_strict = backend.to_device(a, "strict"), backend.to_device(b, "strict")
    want = np.matmul(a, b)
    with device_waits.no_device_waits():
        got = cublas.matmul(a_strict, b_strict)
    assert len(model_runs) == 1
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got.get(), want, rtol=1e-12, atol=1e-12)
    out = backend.to_device(np.zeros(np.shape(want)), "strict")
    assert cublas.matmul(a_strict, b_strict, out=out) is out
    assert len(model_runs) == 2
    np.testing.assert_allclose(out.get(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", UNDESCRIBED)
def test_operands_no_call_describes_are_copied_and_multiplied_on_the_route(model_runs, case):
    """As CuPy's matmul copies them, but then the product stays on the route (a CUDA graph
    could not capture it on CuPy's handle). The model reads the memory as the call says:
    the right product shows that it read the copies, not the operands' own layout."""
    a, b = UNDESCRIBED[case](backend.STRICT.xp)
    a_before, b_before = a.get(), b.get()
    with device_waits.no_device_waits():
        got = cublas.matmul(a, b)
    assert len(model_runs) == 1
    np.testing.assert_allclose(got.get(), a_before @ b_before, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(a.get(), a_before)  # the operands themselves untouched
    np.testing.assert_array_equal(b.get(), b_before)


def test_an_empty_product_is_left_to_the_devices_matmul(model_runs):
    a, b = EMPTY["empty"](backend.STRICT.xp)
    got = cublas.matmul(a, b)
    assert got.shape == (0, 3)
    assert not model_runs


@pytest.mark.parametrize("case", MISMATCHED)
def test_a_product_that_does_not_exist_gets_the_devices_error(model_runs, case):
    with pytest.raises(ValueError):
        cublas.matmul(*MISMATCHED[case](backend.STRICT.xp))
    assert not model_runs


@pytest.mark.parametrize(
    ("a_dtype", "b_dtype"), [(np.int64, np.int64), (np.float32, np.float64)], ids=str
)
def test_dtypes_cublas_does_not_take_run_on_the_devices_matmul(model_runs, a_dtype, b_dtype):
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((3, 4)).astype(a_dtype), rng.standard_normal((4, 5)).astype(b_dtype)
    got = cublas.matmul(backend.to_device(a, "strict"), backend.to_device(b, "strict"))
    assert got.dtype == (a @ b).dtype
    np.testing.assert_allclose(got.get(), a @ b, rtol=1e-6)
    assert not model_runs


def test_the_switch_turns_the_route_off_on_the_strict_device_too(model_runs, monkeypatch):
    monkeypatch.setenv(cublas.SWITCH_VARIABLE, "0")
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    got = cublas.matmul(backend.to_device(a, "strict"), backend.to_device(b, "strict"))
    np.testing.assert_allclose(got.get(), a @ b, rtol=1e-12)
    assert not model_runs
    assert not cublas.available()


def test_ops_pick_numpys_own_matmul_on_the_host_and_the_route_on_a_device():
    """What an op serving both devices calls: on the host NumPy's matmul itself, so that
    the host's code path does not change."""
    assert cublas.matmul_for(np.ones((2, 2))) is np.matmul
    assert cublas.matmul_for(backend.to_device(np.ones((2, 2)), "strict")) is cublas.matmul


def test_host_arrays_multiply_on_numpy(model_runs):
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))
    np.testing.assert_array_equal(cublas.matmul(a, b), a @ b)
    out = np.empty((2, 3, 5))
    assert cublas.matmul(a, b, out=out) is out
    np.testing.assert_array_equal(out, a @ b)
    assert not model_runs


def test_a_product_captured_in_an_emulated_graph_reads_its_buffers_anew(model_runs):
    """The model runs as a kernel of the strict device: recorded during a capture and run
    again, on the same memory, by each replay."""
    weight = backend.to_device(np.random.default_rng(10).standard_normal((5, 4)), "strict")
    out = backend.to_device(np.zeros((2, 3, 5)), "strict")

    def step(batch):
        return cublas.matmul(batch, weight.T, out=out)

    graph = StepGraph("strict", enabled=True)
    batches = [np.random.default_rng(seed).standard_normal((2, 3, 4)) for seed in range(4)]
    for batch in batches:
        np.testing.assert_allclose(graph.run(step, [batch]).get(), batch @ weight.get().T)
    assert graph.counts == {"captured": 1, "replayed": 2, "eager": 1}
    # the eager step, the capture (whose run is the first launch), then each replay reruns
    # the recorded call
    assert len(model_runs) == 4


def _forward_backward(compute, arrays, device):
    """``compute(*tensors)`` and the gradients of every input, as host arrays."""
    tensors = [Tensor(array, requires_grad=True, device=device) for array in arrays]
    waits = device_waits.no_device_waits() if device == "strict" else contextlib.nullcontext()
    with waits:
        output = compute(*tensors)
        output.backward(Tensor(np.ones(output.shape), device=device))
    return [output.numpy()] + [tensor.grad.numpy() for tensor in tensors]


# -inf forbids a pair; every row attends to its first key at least
ATTENTION_MASK = np.where(np.random.default_rng(12).random((7, 7)) < 0.2, -np.inf, 0.0)
ATTENTION_MASK[:, 0] = 0.0

OP_CASES = {
    # name: (compute, input shapes, products run forward and backward)
    "matmul_stacks": (ops.matmul, [(2, 3, 5, 4), (4, 6)], 3),
    # b broadcast over the outer batch axis only: no one batch stride, so b is copied over
    # the batch for the forward and a's gradient; all three products on the route
    "matmul_stacks_broadcast_inside": (ops.matmul, [(2, 3, 5, 4), (3, 4, 6)], 3),
    # attention's heads split by permuting (N, L, H, D) projections (nn.MultiheadAttention)
    "matmul_split_heads": (
        lambda q, k: ops.matmul(
            ops.permute(ops.reshape(q, (2, 5, 3, 4)), (0, 2, 1, 3)),
            ops.permute(ops.reshape(k, (2, 6, 3, 4)), (0, 2, 3, 1)),
        ),
        [(2, 5, 12), (2, 6, 12)],
        3,
    ),
    "matmul_2d": (ops.matmul, [(5, 4), (4, 6)], 3),
    # a's gradient is an outer product, (5, 1) @ (1, 4): a broadcast multiply, no GEMM
    "matmul_matrix_vector": (ops.matmul, [(5, 4), (4,)], 2),
    "matmul_vector_stack": (ops.matmul, [(4,), (2, 4, 3)], 3),
    "linear": (lambda x, w, b: ops.linear(x, w, b), [(2, 5, 4), (6, 4), (6,)], 3),
    "attention": (ops.scaled_dot_product_attention, [(2, 3, 7, 4)] * 3, 6),
    "attention_masked": (
        lambda q, k, v: ops.scaled_dot_product_attention(
            q, k, v, mask=backend.to_device(ATTENTION_MASK, q.device)
        ),
        [(2, 3, 7, 4)] * 3,
        6,
    ),
    # conv_device (no cuDNN): per tile one GEMM for all groups forward, two backward
    "conv2d_groups": (
        lambda x, w, b: ops.conv2d(x, w, b, padding=1, groups=2),
        [(2, 4, 5, 5), (6, 2, 3, 3), (6,)],
        3,
    ),
    # conv.py's im2col route (ConvTranspose2d on a device without cuDNN): gemm_pieces'
    # products, one forward (col2im), one each for the input and weight gradients
    "conv_transpose2d": (
        lambda x, w, b: ops.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
        [(2, 4, 3, 3), (4, 3, 3, 3), (3,)],
        3,
    ),
    # an input that is not C-contiguous takes batch norm's unfused route: the channels'
    # sums are products with a vector of ones, one forward, one backward
    "batch_norm_unfused": (
        lambda x, w, b: ops.batch_norm(ops.permute(x, (0, 3, 1, 2)), None, None, w, b),
        [(4, 2, 5, 3), (3,), (3,)],
        2,
    ),
    # the groups' dot products (variance forward, projection backward), the weight's
    "group_norm": (
        lambda x, w, b: ops.group_norm(x, 2, w, b),
        [(3, 4, 2, 3), (4,), (4,)],
        3,
    ),
    # rows @ x @ columns^T forward, its transpose backward
    "adaptive_avg_pool2d": (lambda x: ops.adaptive_avg_pool2d(x, (2, 3)), [(2, 3, 5, 7)], 4),
    "interpolate_bilinear": (
        lambda x: ops.interpolate(x, size=(5, 7), mode="bilinear"),
        [(2, 3, 4, 3)],
        4,
    ),
    # The recurrences where cuDNN does not run, two directions of 4 steps: the LSTM's one
    # product a step each way, then its weights' and input's gradients; the GRU and the RNN
    # project the input first, and have three gradients' products (input, two weights).
    "lstm_sequence": (
        lambda *arrays: LSTMSequence.apply(*arrays, batch_first=True),
        [(3, 4, 5), (2, 8, 5), (2, 8, 2), (2, 3, 2), (2, 3, 2), (2, 8), (2, 8)],
        2 * 4 + 2,
    ),
    "gru_sequence": (
        lambda *arrays: GRUSequence.apply(*arrays, batch_first=False),
        [(4, 3, 5), (2, 6, 5), (2, 6, 2), (2, 3, 2), (2, 6), (2, 6)],
        1 + 4 + 4 + 3,
    ),
    "rnn_sequence": (
        lambda *arrays: RNNSequence.apply(*arrays, batch_first=True, nonlinearity="tanh"),
        [(3, 4, 5), (2, 2, 5), (2, 2, 2), (2, 3, 2), (2, 2), (2, 2)],
        1 + 4 + 4 + 3,
    ),
}


@pytest.fixture
def cupy_handle_products(monkeypatch):
    """The products the strict device ran as CuPy would on its own cuBLAS handle (which
    no CUDA graph captures): its ``matmul``, ``dot``, ``einsum``... of float arrays."""
    products = []
    real = strict_device._refuse_cupy_cublas_in_capture

    def recorded(name, operands):
        if strict_device.on_cupys_cublas(name, operands):
            products.append(name)
        real(name, operands)

    monkeypatch.setattr(strict_device, "_refuse_cupy_cublas_in_capture", recorded)
    return products


def _check_the_ops_products(case, device, runs, tolerance, off_route=None):
    """Run ``OP_CASES[case]`` on the host and on ``device``: the route (whose calls ``runs``
    lists) ran the case's products, none ran elsewhere (``off_route``, where known), and
    every output and gradient is the host's."""
    compute, shapes, products = OP_CASES[case]
    rng = np.random.default_rng(11)
    arrays = [rng.standard_normal(shape) for shape in shapes]
    on_host = _forward_backward(compute, arrays, "cpu")
    assert not runs
    on_device = _forward_backward(compute, arrays, device)
    assert len(runs) == products
    if off_route is not None:
        assert not off_route, off_route
    for host, got in zip(on_host, on_device, strict=True):
        np.testing.assert_allclose(got, host, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("case", OP_CASES)
def test_the_ops_products_run_on_the_model_and_give_the_hosts_results(
    model_runs, cupy_handle_products, case
):
    _check_the_ops_products(case, "strict", model_runs, 1e-12, cupy_handle_products)


# --- on a GPU ----------------------------------------------------------------------------------

requires_gpu = pytest.mark.skipif(
    not backend.cuda_available(), reason="needs CuPy and a CUDA device"
)


@pytest.fixture
def cublas_runs(monkeypatch):
    """Every product our handle ran (a GPU machine where libcublas does not load fails)."""
    if cublas.loaded() is None:
        pytest.fail("libcublas for CuPy's CUDA does not load: install the gpu extra")
    return _calls_of(monkeypatch, "run")


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("case", OPERAND_CASES)
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_gpu_products_match_cupy_and_numpy(monkeypatch, cublas_runs, case, dtype):
    monkeypatch.setattr(backend, "_tf32", {"matmul": False, "cudnn": True})
    cupy = backend.cupy_module()
    make_a, make_b = OPERAND_CASES[case]
    a_memory = cupy.asarray(_memory(A_MEMORY), dtype=dtype)
    b_memory = cupy.asarray(_memory(B_MEMORY), dtype=dtype)
    a, b = make_a(a_memory), make_b(b_memory)
    got = cublas.matmul(a, b)
    assert len(cublas_runs) == 1
    tolerance = TOLERANCE[dtype]
    want = a.get().astype(np.float64) @ b.get().astype(np.float64)
    np.testing.assert_allclose(got.get(), want, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(got.get(), cupy.matmul(a, b).get(), rtol=tolerance, atol=tolerance)


@pytest.mark.gpu
@requires_gpu
def test_gpu_a_product_is_written_into_out(cublas_runs):
    cupy = backend.cupy_module()
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((5, 4))
    out = cupy.zeros((2, 3, 5))
    assert cublas.matmul(cupy.asarray(a), cupy.asarray(b).T, out=out) is out
    assert len(cublas_runs) == 1
    np.testing.assert_allclose(out.get(), a @ b.T, rtol=1e-12)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("case", VECTOR_CASES)
def test_gpu_vectors_run_as_one_row_or_one_column_matrices(cublas_runs, case):
    cupy = backend.cupy_module()
    a, b = _vector_operands(case)
    got = cublas.matmul(cupy.asarray(a), cupy.asarray(b))
    assert len(cublas_runs) == 1
    want = np.matmul(a, b)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got.get(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("case", UNDESCRIBED)
def test_gpu_operands_no_call_describes_are_copied_and_multiplied_on_the_handle(cublas_runs, case):
    a, b = UNDESCRIBED[case](backend.cupy_module())
    got = cublas.matmul(a, b)
    assert len(cublas_runs) == 1
    np.testing.assert_allclose(got.get(), a.get() @ b.get(), rtol=1e-12, atol=1e-12)


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
@pytest.mark.parametrize("case", OP_CASES)
def test_gpu_the_ops_products_run_on_the_handle(monkeypatch, cublas_runs, case):
    monkeypatch.setenv(cudnn.SWITCH_VARIABLE, "0")  # the routes cuDNN would take otherwise
    _check_the_ops_products(case, "cuda", cublas_runs, 1e-10)


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
