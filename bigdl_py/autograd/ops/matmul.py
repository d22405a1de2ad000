"""Matrix product, with NumPy's rules for 1-d operands and batch broadcasting.

On the CPU, when BLAS may use several threads, every product here runs on the
convolutions' threads (``conv_tiles.for_each_tile``), each GEMM on one BLAS thread, instead
of being handed to BLAS's own threads: a woken OpenBLAS thread spins for ~0.1 s after its
GEMM and takes a core from the tiles of the ops that come next (``conv_tiles`` gives the
numbers). 2-d products (``Linear``'s three, a 2-d ``matmul``) are split along the longer
side of the result, stacks of matrices along their leading axis.

On a device every product here goes to ``cublas.matmul``: on the GPU a cuBLAS handle of our
own that a CUDA graph can capture, transposed operands passed as flags instead of copies,
stacks as one strided-batched call; on the strict test device the NumPy model of the same
call; the device's ``matmul`` where that route declines.

One exception: in a process whose ops have shared no tiles among threads for a second
(``conv_tiles.tiles_shared_recently``), a 2-d product goes to BLAS at its own thread limit,
whatever its size: a spinning BLAS thread then has no tile thread to slow down, and
OpenBLAS's own threads start and meet faster than ours (our hand-off costs 100-235 us a
split product). Models made of products and element-wise ops (NCF, an MLP) stay there,
since their products then share no tiles either; models with convolutions, attention or
large element-wise ops share tiles every step and keep the hold. Measured at two threads
(``bench/engine.py``'s pattern): NCF's (1024, 64) @ (64, 32) took 26 us on OpenBLAS's two
threads against 48-54 held to one (NCF's step 1.6 -> 1.4 ms, when only the products too
small to split went to BLAS); the MLP's step with its split products left to BLAS too
6.30 ms against 6.97 held (PyTorch 5.84; medians of 200 steps, the two rules alternated in
blocks in one process, 2026-11-27).
"""

from __future__ import annotations

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.function import Function
from bigdl_py.autograd.ops import cublas
from bigdl_py.autograd.ops.conv_tiles import (
    blas_is_openblas,
    for_each_tile,
    tiles_shared_recently,
    worker_count,
)

# Multiply-adds below which a product runs whole on the calling thread: handing out its
# parts costs ~0.1 ms, about what one thread takes for a product of this size.
_MIN_SPLIT_MULTIPLY_ADDS = 1 << 22
# OpenBLAS runs a GEMM of at most this many multiply-adds on the calling thread whatever its
# thread limit (its SMP_THRESHOLD_MIN, 65536, times GEMM_MULTITHREAD_THRESHOLD, 4 unless
# built otherwise; on the bench machine no OpenBLAS thread woke up below 2**20). Such a
# product needs no hold on BLAS's threads, which costs ~8 us a product at two threads
# (two thread-limit changes and a one-tile for_each_tile): NCF's step has five of them.
_OPENBLAS_SINGLE_THREAD_MULTIPLY_ADDS = 1 << 18


def _runs_on_one_blas_thread(multiply_adds: int) -> bool:
    """Whether every loaded BLAS is OpenBLAS and runs a GEMM this small on one thread."""
    return multiply_adds <= _OPENBLAS_SINGLE_THREAD_MULTIPLY_ADDS and blas_is_openblas()


def matmul_2d(a, b):
    """``a (M, K) @ b (K, N)``, on the CPU split among the tile threads (see the module)."""
    rows, inner = a.shape
    columns = b.shape[1]
    if inner == 1:
        # An outer product, as a one-output Linear's input gradient is: OpenBLAS's GEMM
        # takes 38 us for (1024, 1) @ (1, 32), the broadcast product 15 us (one thread).
        return a * b
    if backend.is_device_array(a):
        return cublas.matmul(a, b)  # our cuBLAS handle, or the device's matmul where it declines
    workers = worker_count()
    if workers == 1 or rows == 0 or columns == 0:
        return a @ b
    if _runs_on_one_blas_thread(rows * columns * inner) or not tiles_shared_recently():
        # No op of this model shares tiles among threads (NCF's, an MLP's): BLAS's own
        # threads take the product, whatever its size (see the module).
        return a @ b
    split = rows * columns * inner >= _MIN_SPLIT_MULTIPLY_ADDS
    xp = backend.array_module(a)
    out = xp.empty((rows, columns), dtype=xp.result_type(a, b))
    by_rows = rows >= columns
    extent = rows if by_rows else columns
    size = -(-extent // workers) if split else extent

    def work(start, stop, _scratch):
        if by_rows:
            xp.matmul(a[start:stop], b, out=out[start:stop])
        else:
            xp.matmul(a, b[:, start:stop], out=out[:, start:stop])

    for_each_tile(extent, size, work, workers_off_caller_cpu=True)
    return out


def matmul_any(a, b):
    """``a @ b`` with NumPy's rules, on the CPU on the tile threads (see the module)."""
    if a.ndim == 2 and b.ndim == 2:
        return matmul_2d(a, b)
    if backend.is_device_array(a):
        return cublas.matmul(a, b)  # stacks as one strided-batched call where it can
    xp = backend.array_module(a)
    workers = worker_count()
    if workers == 1 or a.size == 0 or b.size == 0:
        return xp.matmul(a, b)
    if a.ndim == 1 or b.ndim == 1:  # a matrix-vector product: one tile, BLAS held to one thread
        results = []
        for_each_tile(1, 1, lambda start, stop, scratch: results.append(xp.matmul(a, b)))
        return results[0]
    # Broadcast views (no copies) of both stacks over the batch axes, split along the first.
    batch_shape = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    a_stack = xp.broadcast_to(a, batch_shape + a.shape[-2:])
    b_stack = xp.broadcast_to(b, batch_shape + b.shape[-2:])
    out = xp.empty(batch_shape + (a.shape[-2], b.shape[-1]), dtype=xp.result_type(a, b))
    items = batch_shape[0]
    size = items
    if out.size * a.shape[-1] >= _MIN_SPLIT_MULTIPLY_ADDS:
        size = -(-items // (2 * workers))  # two parts per thread: a stack's parts may be small

    def work(start, stop, _scratch):
        xp.matmul(a_stack[start:stop], b_stack[start:stop], out=out[start:stop])

    for_each_tile(items, size, work)
    return out


class MatMul(Function):
    def forward(self, a, b):
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError(
                f"matmul: operands must be at least 1-d, got shapes {tuple(a.shape)} and "
                f"{tuple(b.shape)}"
            )
        inner_a = a.shape[-1]
        inner_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
        if inner_a != inner_b:
            raise ValueError(
                f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not align "
                f"(inner sizes {inner_a} != {inner_b})"
            )
        self.save_for_backward(a, b)
        return matmul_any(a, b)

    def backward(self, grad):
        a, b = self.saved
        xp = backend.array_module(a)
        # Promote 1-d operands to matrices so one rule serves every case, then undo it.
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        # Restore the axes the 1-d operands dropped from the output: b's column axis first,
        # then a's row axis (both for a 0-d vector-vector result).
        g2 = grad
        if b.ndim == 1:
            g2 = g2[..., None]
        if a.ndim == 1:
            g2 = g2[..., None, :]
        grad_a = grad_b = None
        if self.needs_input_grad[0]:
            grad_a = matmul_any(g2, xp.swapaxes(b2, -1, -2))
            if a.ndim == 1:
                grad_a = grad_a.reshape(grad_a.shape[:-2] + (a.shape[0],))
        if self.needs_input_grad[1]:
            grad_b = matmul_any(xp.swapaxes(a2, -1, -2), g2)
            if b.ndim == 1:
                grad_b = grad_b.reshape(grad_b.shape[:-2] + (b.shape[0],))
        return grad_a, grad_b


class Linear(Function):
    """``x @ weight.T + bias`` in one op: one GEMM forward, two backward, no extra transposes.

    Layers call this rather than composing matmul/transpose/add because it is the hot path
    of every MLP and saves two graph nodes and a broadcast-reduce per step.
    """

    def forward(self, x, weight, bias=None):
        if x.shape[-1] != weight.shape[1]:
            raise ValueError(
                f"linear: input of shape {tuple(x.shape)} has {x.shape[-1]} features but the "
                f"weight of shape {tuple(weight.shape)} expects {weight.shape[1]}"
            )
        self.save_for_backward(x, weight)
        self.has_bias = bias is not None
        # Leading axes flattened: one GEMM, not one per leading index.
        out = matmul_2d(x.reshape(-1, x.shape[-1]), weight.T)
        if bias is not None:
            out += bias
        return out.reshape(x.shape[:-1] + (weight.shape[0],))

    def backward(self, grad):
        x, weight = self.saved
        grad2 = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_weight = grad_bias = None
        if self.needs_input_grad[0]:
            grad_x = matmul_2d(grad2, weight).reshape(x.shape)
        if self.needs_input_grad[1]:
            grad_weight = matmul_2d(grad2.T, x.reshape(-1, x.shape[-1]))
        if self.has_bias and self.needs_input_grad[2]:
            grad_bias = grad2.sum(axis=0)
        return grad_x, grad_weight, grad_bias
