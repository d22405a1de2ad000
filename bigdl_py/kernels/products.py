"""Stacks of matrix products on a device as ONE strided-batched cuBLAS GEMM, with the
operands as they are: transposed views and broadcast stacks need no copy.

CuPy's ``matmul`` makes its 3-d operands contiguous first, so attention's products and their
gradients (``swapaxes`` views, keys broadcast over heads) each copied both operands. cuBLAS
takes any operand whose matrices are row- or column-major with one distance between
consecutive matrices (0 for a broadcast one): :func:`gemm_arguments` works out the flags,
leading dimensions and strides from the arrays' strides, and :func:`matmul` makes the call
on the package's own cuBLAS handle (``autograd.ops.cublas``, which a CUDA graph can
capture), or through CuPy's binding on CuPy's handle where that route is off. Any other
layout goes to CuPy's ``matmul``.

cuBLAS is column-major: the row-major product ``C = A @ B`` is computed as the column-major
``C^T = B^T @ A^T``; a row-major matrix is its column-major transpose at no cost.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from bigdl_py import backend
from bigdl_py.kernels import CUDA, route

NO_TRANSPOSE, TRANSPOSE = 0, 1  # cublasOperation_t's CUBLAS_OP_N and CUBLAS_OP_T


class Operand(NamedTuple):
    """A stack of matrices as cuBLAS takes it: a transpose flag, the leading dimension and
    the distance between consecutive matrices (elements)."""

    operation: int
    leading: int
    stride: int


class GemmArguments(NamedTuple):
    """``gemmStridedBatched``'s arguments for ``out = a @ b`` (row-major), but pointers."""

    transa: int
    transb: int
    m: int
    n: int
    k: int
    lda: int
    stride_a: int
    ldb: int
    stride_b: int
    ldc: int
    stride_c: int
    batch: int


def _batch_stride(shape: tuple, strides: tuple) -> int | None:
    """The one distance (elements) between consecutive matrices of the leading axes, in C
    order; 0 when they are all one matrix broadcast; None when there is no such distance."""
    stride, count = None, 1  # count: matrices per step along the axis
    for size, step in zip(reversed(shape), reversed(strides), strict=True):
        if size != 1:
            if step < 0 or step % count:
                return None
            if stride is None:
                stride = step // count
            elif step // count != stride:
                return None
        count *= size
    return 0 if stride is None else stride


def operand(shape: tuple, strides: tuple, itemsize: int) -> Operand | None:
    """How cuBLAS reads the row-major stack ``(..., rows, columns)``: as the column-major
    transpose of each matrix, which ``C^T = B^T A^T`` wants (row-major matrices as they
    are, column-major ones transposed by cuBLAS). None when it cannot."""
    rows, columns = shape[-2:]
    row_stride, column_stride = strides[-2] // itemsize, strides[-1] // itemsize
    batch = _batch_stride(tuple(shape[:-2]), tuple(step // itemsize for step in strides[:-2]))
    if batch is None:
        return None
    if column_stride == 1 and (rows == 1 or row_stride >= columns):
        return Operand(NO_TRANSPOSE, max(row_stride if rows > 1 else columns, columns, 1), batch)
    if row_stride == 1 and (columns == 1 or column_stride >= rows):
        return Operand(TRANSPOSE, max(column_stride if columns > 1 else rows, rows, 1), batch)
    return None


def gemm_arguments(a: Any, b: Any) -> GemmArguments | None:
    """cuBLAS's arguments for ``a @ b`` of stacks broadcast to one batch shape (``a``
    ``(..., M, K)``, ``b`` ``(..., K, N)``, the result ``(..., M, N)`` C-contiguous), or
    None when an operand's layout is not one cuBLAS reads."""
    batch_shape = tuple(a.shape[:-2])
    rows, inner = a.shape[-2:]
    columns = b.shape[-1]
    # C^T (N x M) = B^T (N x K) @ A^T (K x M), column-major: b is cuBLAS's first operand.
    first = operand(b.shape, b.strides, b.itemsize)
    second = operand(a.shape, a.strides, a.itemsize)
    if first is None or second is None:
        return None
    return GemmArguments(
        first.operation,
        second.operation,
        columns,
        rows,
        inner,
        first.leading,
        first.stride,
        second.leading,
        second.stride,
        max(columns, 1),
        rows * columns,
        int(np.prod(batch_shape, dtype=np.int64)),
    )


def matmul(a: Any, b: Any, out: Any = None) -> Any:
    """``a @ b`` for device stacks of matrices (2 or more axes each, batch axes broadcast),
    into ``out`` when given (C-contiguous, of the result's shape)."""
    xp = backend.array_module(a)
    batch_shape = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    a_stack = xp.broadcast_to(a, batch_shape + a.shape[-2:])
    b_stack = xp.broadcast_to(b, batch_shape + b.shape[-2:])
    arguments = gemm_arguments(a_stack, b_stack)
    usable = out is None or out.flags.c_contiguous
    if arguments is None or not usable or a.dtype != b.dtype or route(a, b) is None:
        return xp.matmul(a, b, out=out)
    if out is None:
        out = xp.empty(batch_shape + (a.shape[-2], b.shape[-1]), dtype=a.dtype)
    if 0 in out.shape:
        return out
    if a.shape[-1] == 0:
        out[...] = 0
        return out
    if route(a, b) == CUDA:
        if not _on_our_handle(a_stack, b_stack, out):
            _cublas(arguments, a_stack, b_stack, out)
    else:
        from bigdl_py.strict_device import run_on_device

        run_on_device(_matmul_into, a_stack, b_stack, out)
    return out


def _matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.matmul(a, b, out=out)


def _on_our_handle(a: Any, b: Any, out: Any) -> bool:
    """The product on the package's own cuBLAS handle (``autograd.ops.cublas``), which a
    CUDA graph can capture; False where that route is off or declines the layout."""
    from bigdl_py.autograd.ops import cublas  # noqa: PLC0415 - autograd imports this module

    if not cublas.available():
        return False
    call = cublas.product_call(a.shape, a.strides, b.shape, b.strides, a.dtype.itemsize)
    if call is None:
        return False
    cublas.run(call, a, b, out)
    return True


def _cublas(arguments: GemmArguments, a: Any, b: Any, out: Any) -> None:
    """One ``gemmStridedBatched`` call on CuPy's handle, in the current stream (rebinding
    it to the stream on every call: a CUDA graph cannot capture it)."""
    cupy = backend.cupy_module()
    cublas = cupy.cuda.cublas
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    single = a.dtype == np.float32
    one = np.array(1, dtype=a.dtype)
    zero = np.array(0, dtype=a.dtype)
    call = cublas.sgemmStridedBatched if single else cublas.dgemmStridedBatched
    call(
        handle,
        arguments.transa,
        arguments.transb,
        arguments.m,
        arguments.n,
        arguments.k,
        one.ctypes.data,
        b.data.ptr,
        arguments.lda,
        arguments.stride_a,
        a.data.ptr,
        arguments.ldb,
        arguments.stride_b,
        zero.ctypes.data,
        out.data.ptr,
        arguments.ldc,
        arguments.stride_c,
        arguments.batch,
    )
