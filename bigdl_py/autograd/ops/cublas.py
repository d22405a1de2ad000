"""Matrix products on the GPU through a cuBLAS handle of our own (``ctypes``): the one route
of every product the package runs on a device (``matmul``, ``Linear``, attention, the
convolutions' GEMMs, the recurrences' steps, normalisation's sums, resampling).

Why: CuPy's ``matmul`` (and ``dot``, ``tensordot``, ``einsum``) goes through CuPy's cuBLAS
wrappers, which bind their handle to the current stream on every call and refuse to run
while a stream is captured (``NotImplementedError``: "calling cuBLAS API during stream
capture is currently unsupported"); ``cublasSetStream`` also drops the handle's workspace
back to cuBLAS's own pool, whose allocations a CUDA-graph capture does not allow.
Our handle (one per device and thread, ``cuda_libraries.StreamHandles``) is given its
workspace explicitly (``cublasSetWorkspace``) from CuPy's pool and is bound to a stream only
when the stream changes, so once a warm-up step has run on the capture stream every product
in the step can be captured. Products also skip CuPy's operand copies: a transposed operand
(``weight.T`` in ``Linear``, the ``swapaxes`` of the gradients) is passed as a transpose
flag with its leading dimension, and a stack of matrices (``matmul`` of 3-d and broadcast
operands, attention's heads) is one strided-batched call, a broadcast operand having batch
stride 0; a result can be written into a given C-contiguous ``out``; a vector operand is
the one-row or one-column matrix NumPy makes of it (a view).

cuBLAS is column-major and our arrays row-major, so ``C = A @ B`` runs as cuBLAS's
``C^T = B^T @ A^T``: the row-major ``(R, C)`` matrix is the column-major ``(C, R)`` one
with the same leading dimension. One function works the call out from the operands'
shapes and strides alone, :func:`product_call`; :func:`matmul` runs it on our handle
(:func:`run`) or, on the strict test device (``bigdl_py.strict_device``), through its NumPy
model (:func:`run_model`), which reads the operands' memory as the call's arguments say. So
the tests without a GPU run every device product through the arguments a GPU would get, and
a layout the route declines is declined there too.

TF32: float32 products take ``CUBLAS_COMPUTE_32F_FAST_TF32`` when
``backend.allow_tf32(matmul=True)`` (off by default, as PyTorch's
``torch.backends.cuda.matmul.allow_tf32``), ``CUBLAS_COMPUTE_32F`` otherwise; the compute
type is given per call, so the handle's math mode stays ``CUBLAS_DEFAULT_MATH`` and a change
of the setting applies at the next product. float16 products accumulate in float32, float64
in float64.

The library (``cuda_libraries``): ``BIGDL_PY_CUBLAS_LIBRARY``, then ``nvidia-cublas-cu12``
(``nvidia/cublas/lib/libcublas.so.12``) or CUDA 13's ``nvidia-cublas``
(``nvidia/cu13/lib/libcublas.so.13``), then the system or the copy CuPy loaded; its major
version is CuPy's CUDA's. ``BIGDL_PY_CUBLAS=0`` turns the route off (on the strict device
too). Products it does not take (no library, host arrays, integer or mixed dtypes, empty
or int32-overflowing sizes, an ``out`` that is not an array of the result's shape and
dtype on the operands' device) run on the arrays' own ``matmul`` (CuPy's, the strict
device's, NumPy's); on a device such a product makes a step run eagerly (the strict device
refuses CuPy's products in a capture as CuPy does). Operands no leading dimension or
single batch stride describes (attention's heads split from one projection, a broadcast
inside the batch axes, every other element) are copied C-contiguous first, as CuPy's
``matmul`` copies them, and an ``out`` that is not C-contiguous receives a copy of the
result: each one copy kernel, which a graph captures. Ops whose code serves both devices
pick their product once with :func:`matmul_for`: NumPy's own ``matmul`` on the host, whose
paths stay as they were.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
from dataclasses import dataclass

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.ops import cuda_libraries

SWITCH_VARIABLE = "BIGDL_PY_CUBLAS"
LIBRARY_VARIABLE = "BIGDL_PY_CUBLAS_LIBRARY"

# --- constants, named as in cuBLAS's and CUDA's headers (checked against them by the tests) --
CUBLAS_STATUS_SUCCESS = 0
CUBLAS_OP_N = 0
CUBLAS_OP_T = 1
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_DEFAULT_MATH = 0
CUBLAS_COMPUTE_32F = 68
CUBLAS_COMPUTE_32F_FAST_TF32 = 77
CUBLAS_COMPUTE_64F = 70
CUDA_R_16F = 2
CUDA_R_32F = 0
CUDA_R_64F = 1

Pointer = ctypes.c_void_p
_int = ctypes.c_int
_long = ctypes.c_longlong

# name -> (result type, argument types); the CPU tests check each against cublas_api.h.
SIGNATURES: dict[str, tuple] = {
    "cublasCreate_v2": (_int, [Pointer]),
    "cublasGetVersion_v2": (_int, [Pointer, Pointer]),
    "cublasGetStatusString": (ctypes.c_char_p, [_int]),
    "cublasSetStream_v2": (_int, [Pointer, Pointer]),
    "cublasSetWorkspace_v2": (_int, [Pointer, Pointer, ctypes.c_size_t]),
    "cublasSetMathMode": (_int, [Pointer, _int]),
    "cublasGemmEx": (
        _int,
        [Pointer, _int, _int, _int, _int, _int, Pointer]
        + [Pointer, _int, _int] * 2
        + [Pointer, Pointer, _int, _int, _int, _int],
    ),
    "cublasGemmStridedBatchedEx": (
        _int,
        [Pointer, _int, _int, _int, _int, _int, Pointer]
        + [Pointer, _int, _int, _long] * 2
        + [Pointer, Pointer, _int, _int, _long, _int, _int, _int],
    ),
}

INT32_MAX = 2**31 - 1
# (data type, compute type, scaling type) by operand dtype; float32's compute type is
# decided per call by the TF32 setting.
_TYPES = {
    np.dtype(np.float16): (CUDA_R_16F, CUBLAS_COMPUTE_32F, ctypes.c_float),
    np.dtype(np.float32): (CUDA_R_32F, CUBLAS_COMPUTE_32F, ctypes.c_float),
    np.dtype(np.float64): (CUDA_R_64F, CUBLAS_COMPUTE_64F, ctypes.c_double),
}


class CublasError(RuntimeError):
    """A cuBLAS call returned an error status."""


def workspace_bytes(compute_capability_major: int) -> int:
    """cuBLAS's recommended workspace: 32 MiB on Hopper and later, 4 MiB before (what its
    own default pool gives each handle)."""
    return (32 if compute_capability_major >= 9 else 4) << 20


class _Library:
    """libcublas with the argument types of the calls we make, and its handles."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.cublas = ctypes.CDLL(path)
        for name, (result, arguments) in SIGNATURES.items():
            function = getattr(self.cublas, name)  # AttributeError: not this library's
            function.restype = result
            function.argtypes = arguments
        self.handles = cuda_libraries.StreamHandles(self._create_handle, self._bind)

    def call(self, name: str, *args) -> None:
        status = getattr(self.cublas, name)(*args)
        if status != CUBLAS_STATUS_SUCCESS:
            meaning = self.cublas.cublasGetStatusString(status) or b"unknown status"
            raise CublasError(f"cuBLAS: {name} failed: {meaning.decode()} ({status})")

    def _create_handle(self) -> Pointer:
        handle = Pointer()
        self.call("cublasCreate_v2", ctypes.byref(handle))
        self.call("cublasSetMathMode", handle, CUBLAS_DEFAULT_MATH)
        return handle

    def _bind(self, bound: cuda_libraries.BoundHandle, stream: int) -> None:
        """Bind to ``stream`` and give back our workspace, which ``cublasSetStream`` drops;
        one workspace per stream, so that work queued on two streams never shares one."""
        self.call("cublasSetStream_v2", bound.handle, Pointer(stream))
        workspace = bound.buffers.get(stream)
        if workspace is None:
            cupy = backend.cupy_module()
            major = int(cupy.cuda.Device().compute_capability) // 10
            workspace = bound.buffers[stream] = cuda_libraries.device_buffer(workspace_bytes(major))
        self.call(
            "cublasSetWorkspace_v2",
            bound.handle,
            cuda_libraries.pointer(workspace),
            workspace.nbytes,
        )

    def handle(self) -> Pointer:
        return self.handles.current().handle


@functools.cache
def loaded() -> _Library | None:
    """The library for CuPy's CUDA, loaded once; None where it does not load."""
    try:
        major = cuda_libraries.cuda_runtime_major()
    except RuntimeError:  # no CuPy: nothing for the route to run on
        return None
    wheel_paths = (f"nvidia/cu{major}/lib/libcublas.so.{major}",)
    if major == 12:
        wheel_paths += ("nvidia/cublas/lib/libcublas.so.12",)
    paths = cuda_libraries.candidate_paths(
        LIBRARY_VARIABLE, wheel_paths, f"libcublas.so.{major}", cuda_libraries.site_directories()
    )
    library, _ = cuda_libraries.load_first(paths, _Library)
    return library  # without it CuPy's matmul (which needs cuBLAS too) runs every product


def enabled() -> bool:
    """Whether ``BIGDL_PY_CUBLAS`` leaves the route on (anything but 0/false/no/off)."""
    return os.environ.get(SWITCH_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


def available() -> bool:
    """Whether the route may run on a GPU: it is enabled and the library loads."""
    return enabled() and loaded() is not None


# --- the call, worked out on shapes and strides alone ------------------------------------------


@dataclass(frozen=True)
class ColumnMajorOperand:
    """How cuBLAS reads a row-major matrix: as the column-major transpose (``CUBLAS_OP_N``
    in the swapped product) or, for a transposed view, with ``CUBLAS_OP_T``; ``leading``
    is the leading dimension in elements."""

    operation: int
    leading: int


def column_major_operand(shape, strides) -> ColumnMajorOperand | None:
    """The operand of a ``(rows, columns)`` matrix with element ``strides``, or None when
    no leading dimension describes it (a broadcast or a strided slice of both axes)."""
    rows, columns = shape
    row_stride, column_stride = strides
    if rows == 1:  # a single row's row stride is never used: any valid one will do
        row_stride = max(columns, 1) if column_stride == 1 else row_stride
    if columns == 1:
        column_stride = max(rows, 1) if row_stride == 1 else column_stride
    if column_stride == 1 and row_stride >= max(columns, 1):
        return ColumnMajorOperand(CUBLAS_OP_N, row_stride)
    if row_stride == 1 and column_stride >= max(rows, 1):
        return ColumnMajorOperand(CUBLAS_OP_T, column_stride)
    return None


def batch_stride(shape, strides) -> int | None:
    """The one element stride between consecutive matrices of a stack whose batch axes
    have ``shape`` and ``strides`` (0 for a broadcast), or None when there is none."""
    axes = [(size, stride) for size, stride in zip(shape, strides, strict=True) if size != 1]
    if not axes:
        return 0
    if any(stride < 0 for _, stride in axes):
        return None
    for (_, outer), (inner_size, inner) in zip(axes, axes[1:], strict=False):
        if outer != inner * inner_size:
            return None
    return axes[-1][1]


@dataclass(frozen=True)
class ProductCall:
    """One GEMM (``batch`` 1 and strides unused) or strided-batched GEMM, in cuBLAS's
    terms: its ``A`` is our right operand ``b``, its ``B`` our left operand ``a``."""

    b_operation: int
    a_operation: int
    m: int  # columns of the result
    n: int  # rows of the result
    k: int
    b_leading: int
    a_leading: int
    result_leading: int
    b_stride: int
    a_stride: int
    result_stride: int
    batch: int


def product_call(a_shape, a_strides, b_shape, b_strides, itemsize: int) -> ProductCall | None:
    """The cuBLAS call computing ``a @ b`` into a new C-contiguous result, from the
    operands' shapes and byte strides (2-d, or stacks with broadcastable batch axes), or
    None when the route cannot take it."""
    if len(a_shape) < 2 or len(b_shape) < 2:
        return None
    rows, inner = a_shape[-2:]
    inner_b, columns = b_shape[-2:]
    if inner != inner_b or 0 in (rows, inner, columns):
        return None
    try:
        batch_shape = tuple(np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2])))
    except ValueError:
        return None
    elements = [s // itemsize for s in a_strides], [s // itemsize for s in b_strides]
    if any(s % itemsize for s in (*a_strides, *b_strides)):
        return None
    strides_by_operand = []
    for shape, strides in ((a_shape, elements[0]), (b_shape, elements[1])):
        padding = len(batch_shape) - (len(shape) - 2)
        batch_strides = [0] * padding + [
            stride if size != 1 else 0
            for size, stride in zip(shape[:-2], strides[:-2], strict=True)
        ]
        stride = batch_stride(batch_shape, batch_strides)
        operand = column_major_operand(shape[-2:], strides[-2:])
        if stride is None or operand is None:
            return None
        strides_by_operand.append((operand, stride))
    (a_operand, a_stride), (b_operand, b_stride) = strides_by_operand
    batch = math.prod(batch_shape)
    sizes = (rows, inner, columns, batch, a_operand.leading, b_operand.leading)
    if max(sizes) > INT32_MAX or batch == 0:
        return None
    return ProductCall(
        b_operand.operation,
        a_operand.operation,
        columns,
        rows,
        inner,
        b_operand.leading,
        a_operand.leading,
        columns,
        b_stride,
        a_stride,
        rows * columns,
        batch,
    )


# --- running it ---------------------------------------------------------------------------------


def compute_type(dtype) -> int:
    """cuBLAS's compute type for ``dtype`` under the TF32 setting (see the module)."""
    dtype = np.dtype(dtype)
    if dtype == np.float32 and backend.tf32_settings()["matmul"]:
        return CUBLAS_COMPUTE_32F_FAST_TF32
    return _TYPES[dtype][1]


def matmul(a, b, out=None):
    """``a @ b`` with NumPy's rules: one cuBLAS call on our handle for CuPy arrays, its NumPy
    model on the strict device, the arrays' own ``matmul`` for host arrays and where the
    route declines the product (see the module).

    Parameters
    ----------
    a, b : array
        The operands, on one device: matrices or stacks of them (batch axes broadcast), or
        vectors (``a`` a row, ``b`` a column, as NumPy promotes them; the axis is dropped
        from the result). An operand whose layout no call describes is copied first.
    out : array, optional
        Where to write the result: an array of the result's shape and dtype on the
        operands' device, which cuBLAS writes when it is C-contiguous (the result is
        copied into any other). It must not overlap ``a`` or ``b`` (cuBLAS reads and
        writes at once).

    Returns
    -------
    array
        ``out`` when given, otherwise a new C-contiguous array.
    """
    runner = _runner(a, b)
    xp = backend.array_module(a)
    call = None
    if runner is not None:
        # Vectors as one-row / one-column matrices (views): a matrix-vector product is a
        # GEMM of one column, a vector-vector one of one element.
        matrix_a = a[None, :] if a.ndim == 1 else a
        matrix_b = b[:, None] if b.ndim == 1 else b
        call, matrix_a, matrix_b = _call_copying_if_needed(xp, matrix_a, matrix_b)
    if call is not None:
        batch = tuple(np.broadcast_shapes(matrix_a.shape[:-2], matrix_b.shape[:-2]))
        matrix_shape = batch + (matrix_a.shape[-2], matrix_b.shape[-1])
        # NumPy's result: the vectors' added axes dropped (a.shape[-2:-1] is () for a vector)
        shape = batch + tuple(a.shape[-2:-1]) + (tuple(b.shape[-1:]) if b.ndim > 1 else ())
        if out is None or _is_result_buffer(out, a, shape):
            direct = out is not None and out.flags.c_contiguous
            result = out if direct else xp.empty(shape, dtype=a.dtype)
            runner(call, matrix_a, matrix_b, result.reshape(matrix_shape))  # a view
            if out is None or direct:
                return result
            xp.copyto(out, result)  # cuBLAS writes C-contiguous rows only
            return out
    return xp.matmul(a, b) if out is None else xp.matmul(a, b, out=out)


def _call_copying_if_needed(xp, a, b) -> tuple:
    """``(call, a, b)``: the call for ``a @ b`` on the operands as they lie, or else with
    the operands no call describes (a batch of no single stride, a broadcast inside the
    batch axes, every other element) copied C-contiguous over the product's batch shape: a
    copy kernel, as CuPy's ``matmul`` makes one, keeps the product on the route (a product
    left to CuPy's handle could not be captured in a CUDA graph). ``(None, a, b)`` when
    no layout gives a call (mismatched, empty or too large operands)."""
    itemsize = a.dtype.itemsize
    call = product_call(a.shape, a.strides, b.shape, b.strides, itemsize)
    if call is not None:
        return call, a, b
    try:
        batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    except ValueError:  # no product at all: the device's matmul raises its error
        return None, a, b
    shapes = (batch + tuple(a.shape[-2:]), batch + tuple(b.shape[-2:]))
    as_they_lie = ((a.shape, a.strides), (b.shape, b.strides))
    copied = tuple((shape, _contiguous_strides(shape, itemsize)) for shape in shapes)
    for copies in ((False, True), (True, False), (True, True)):  # the fewest copies first
        a_layout, b_layout = (copied[i] if copies[i] else as_they_lie[i] for i in (0, 1))
        call = product_call(*a_layout, *b_layout, itemsize)
        if call is not None:
            a, b = (
                xp.ascontiguousarray(xp.broadcast_to(operand, shape)) if copy else operand
                for operand, shape, copy in zip((a, b), shapes, copies, strict=True)
            )
            return call, a, b
    return None, a, b


def _contiguous_strides(shape, itemsize: int) -> tuple:
    """The byte strides of a C-contiguous array of ``shape``."""
    strides, step = [], itemsize
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def matmul_for(like):
    """The product to call on arrays like ``like``: NumPy's own ``matmul`` for host arrays,
    so that host code paths stay exactly as they were, :func:`matmul` for device arrays
    (what an op whose code serves both devices picks once, before its products)."""
    return np.matmul if type(like) is np.ndarray else matmul


def _runner(a, b):
    """What runs a product of ``a`` and ``b`` on the route: :func:`run` for CuPy arrays,
    the strict device's model for its arrays; None where the route does not apply."""
    if type(a) is not type(b) or not backend.is_device_array(a):
        return None
    if a.dtype not in _TYPES or b.dtype != a.dtype or not enabled():
        return None
    if backend.is_cupy_array(a):
        return run if loaded() is not None else None
    return _run_on_strict_device


def _is_result_buffer(out, a, shape) -> bool:
    """Whether the result of ``a @ b`` can go into ``out``: an array of ``a``'s kind on
    ``a``'s device, of ``shape`` and ``a``'s dtype (cuBLAS writes it directly when it is
    C-contiguous, the call's result leading dimension and stride being the C-contiguous
    ones; otherwise it is copied in)."""
    return (
        type(out) is type(a)
        and out.shape == shape
        and out.dtype == a.dtype
        and backend.device_of(out) == backend.device_of(a)
    )


def run(call: ProductCall, a, b, out) -> None:
    """Queue ``call`` on the current stream: ``out`` (C-contiguous) = ``a @ b``."""
    library = loaded()
    data_type, _, scaling = _TYPES[np.dtype(out.dtype)]
    one, zero = scaling(1.0), scaling(0.0)
    common = (library.handle(), call.b_operation, call.a_operation, call.m, call.n, call.k)
    if call.batch == 1:
        library.call(
            "cublasGemmEx",
            *common,
            ctypes.byref(one),
            int(b.data.ptr),
            data_type,
            call.b_leading,
            int(a.data.ptr),
            data_type,
            call.a_leading,
            ctypes.byref(zero),
            int(out.data.ptr),
            data_type,
            call.result_leading,
            compute_type(out.dtype),
            CUBLAS_GEMM_DEFAULT,
        )
        return
    library.call(
        "cublasGemmStridedBatchedEx",
        *common,
        ctypes.byref(one),
        int(b.data.ptr),
        data_type,
        call.b_leading,
        call.b_stride,
        int(a.data.ptr),
        data_type,
        call.a_leading,
        call.a_stride,
        ctypes.byref(zero),
        int(out.data.ptr),
        data_type,
        call.result_leading,
        call.result_stride,
        call.batch,
        compute_type(out.dtype),
        CUBLAS_GEMM_DEFAULT,
    )


# --- the strict device's model of the call ------------------------------------------------------


def _run_on_strict_device(call: ProductCall, a, b, out) -> None:
    """:func:`run_model` on the memory behind strict-device arrays, as the device would run
    the call (recorded like any kernel while a step graph is captured)."""
    from bigdl_py.strict_device import run_on_device  # the test device: loaded only when used

    run_on_device(functools.partial(run_model, call), a, b, out)


def run_model(call: ProductCall, a, b, out) -> None:
    """What cuBLAS computes for ``call``, with NumPy, on host arrays standing for the device
    memory at ``a``, ``b`` and ``out`` (the strict device's stand-in for :func:`run`).

    Each operand is read from its first element as the call's arguments describe it
    (transpose flag, leading dimension, batch stride), not as the array's own shape and
    strides do: an argument a GPU would misread gives a wrong product here too. A call that
    would reach past an operand's memory raises :class:`CublasError` instead of reading it.
    """
    # cuBLAS's column-major C (m x n) = op(A) op(B) is our row-major (n x m) result, with
    # A our b and B our a; each operand is read as our row-major matrices, op(X) transposed.
    batch = call.batch
    left = _matrices(
        a, "a", call.a_operation, call.a_leading, call.a_stride, (batch, call.n, call.k)
    )
    right = _matrices(
        b, "b", call.b_operation, call.b_leading, call.b_stride, (batch, call.k, call.m)
    )
    result_steps = (call.result_stride, call.result_leading, 1)
    result = _strided_view(out, "out", (batch, call.n, call.m), result_steps, writeable=True)
    np.matmul(left, right, out=result)


def _matrices(memory, name: str, operation: int, leading: int, stride: int, shape: tuple):
    """The row-major matrices ``(batch, rows, columns)`` that cuBLAS reads at ``memory``
    as the transpose of its column-major operand ``op(X)``: element ``(i, l)`` of ``op(X)``
    is ``X[i + l * leading]`` without a transpose, ``X[l + i * leading]`` with one."""
    steps = (stride, leading, 1) if operation == CUBLAS_OP_N else (stride, 1, leading)
    return _strided_view(memory, name, shape, steps)


def _strided_view(memory, name: str, shape: tuple, steps: tuple, writeable: bool = False):
    """``memory`` read from its first element with element ``steps`` along ``shape``;
    CublasError when that reaches past the last element ``memory`` holds."""
    own_reach = 0
    for size, stride in zip(memory.shape, memory.strides, strict=True):
        if stride < 0:
            raise CublasError(f"cuBLAS model: {name} has a negative stride {memory.strides}")
        own_reach += (size - 1) * stride // memory.itemsize
    reach = sum((size - 1) * step for size, step in zip(shape, steps, strict=True))
    if min(steps) < 0 or reach > own_reach:
        raise CublasError(
            f"cuBLAS model: the call reads {name} {shape} with element steps {steps}, up to "
            f"element {reach}, past the last one of {name} {memory.shape} (element {own_reach})"
        )
    byte_steps = tuple(step * memory.itemsize for step in steps)
    return np.lib.stride_tricks.as_strided(memory, shape, byte_steps, writeable=writeable)
