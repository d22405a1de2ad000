"""Thin GEMMs in pieces that OpenBLAS's small-matrix kernels take.

OpenBLAS built for SkylakeX-class cores (the AVX-512 kernels NumPy's wheel runs on the bench
machine; ``threadpoolctl`` reports the core) hands a GEMM of at most ``100**3``
multiply-adds to its "small matrix" kernels, which read the operands where they lie instead
of packing them first. Measured there, one thread, float32: a (25, K) @ (K, 6) product ran at
84 GFLOP/s with K = 6,600 and at 29 with K = 6,700, its multiply-adds just past the limit;
(27, 1,157) @ (1,157, 32) at 98 against 47 one column later.

Thin products are common in convolutions: a layer with few output channels multiplies a
weight of few rows by a wide column matrix (LeNet-5's (6, 25) @ (25, 28,672) ran at 23
GFLOP/s whole, 56 in pieces; the CIFAR CNN's (32, 288) @ (288, 8,704) at 75-77 whole, 87 in
pieces of 96 columns), and a layer with few input and output channels sums its weight
gradient over a long inner axis. So a product whose pieces can stay under the limit is cut:

* ``matmul_into``: ``a (M, K) @ b (K, N)`` in pieces of columns of ``b`` (and ``out``), the
  widest multiple of ``PIECE_ALIGN`` columns that fits, when that is wide enough (see
  ``MIN_COLUMN_PIECE``; pieces of a width not a multiple of 32 often ran at half speed), and
  only when no other thread of this process runs products beside it.
* ``matmul_summed``: ``a (M, K) @ b (K, N)`` in pieces of the inner axis, summed, when the
  pieces keep at least ``MIN_INNER_PIECE`` of it ((27, K) @ (K, 32) over K = 8,704: 47
  GFLOP/s whole, 86 in pieces of 1,157; (150, K) @ (K, 12) in pieces of 555: 45 against 48).

Anything else (other BLAS libraries or cores, other dtypes, GPU arrays, products the rules
leave whole) is one ``matmul`` as before: NumPy's on the host, the package's cuBLAS route
(``cublas.matmul``, which a CUDA graph can capture) on a device. Cutting the inner axis
changes the order of the sums, so the result differs from the whole product only in
rounding.
"""

from __future__ import annotations

import functools

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.ops import cublas

# OpenBLAS's limit for its small-matrix kernels (M * N * K <= 100**3, measured to the column).
SMALL_KERNEL_MULTIPLY_ADDS = 100**3
# OpenBLAS cores whose single-precision small-matrix kernels these rules were measured on
# (SkylakeX's kernels; Cooperlake and SapphireRapids build on them).
SMALL_KERNEL_CORES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})
PIECE_ALIGN = 32
# Column pieces: at least this wide, or at least MIN_THIN_COLUMN_PIECE for products of at
# most THIN_ROWS rows. Timed inside the training steps at one thread: (32, 288) in pieces of
# 96 won (0.63 ms against 0.70 a tile), (64, 27) in pieces of 576 and (6, 25), (12, 150),
# (150, 12) in pieces of 544-6,656 won, but ResNet-18's 1x1 shortcuts, (128, 64) and
# (64, 128) in pieces of 96, lost (3.81 against 3.26 ms, 3.34 against 3.14) though they won
# alone on cached operands.
MIN_COLUMN_PIECE = 256
MIN_THIN_COLUMN_PIECE = 96
THIN_ROWS = 32
MIN_INNER_PIECE = 1024


@functools.cache
def _small_kernels_available() -> bool:
    """Whether every loaded BLAS is OpenBLAS running SkylakeX-class kernels."""
    try:
        from threadpoolctl import ThreadpoolController

        controllers = ThreadpoolController().select(user_api="blas").lib_controllers
    except Exception:  # threadpoolctl missing or unable to inspect: leave products whole
        return False
    return bool(controllers) and all(
        controller.internal_api == "openblas"
        and str(controller.architecture or "").lower() in SMALL_KERNEL_CORES
        for controller in controllers
    )


def _applies(a, b) -> bool:
    return (
        a.dtype == np.float32
        and b.dtype == np.float32
        and not backend.is_device_array(a)
        and _small_kernels_available()
    )


def piece_width(fixed_multiply_adds: int, extent: int, minimum: int) -> int:
    """Widest multiple of ``PIECE_ALIGN`` (at most ``extent``) whose product with
    ``fixed_multiply_adds`` stays within the small kernels' limit; 0 when that is below
    ``minimum`` or the whole product fits anyway (no cut needed)."""
    if fixed_multiply_adds <= 0 or fixed_multiply_adds * extent <= SMALL_KERNEL_MULTIPLY_ADDS:
        return 0
    width = SMALL_KERNEL_MULTIPLY_ADDS // fixed_multiply_adds // PIECE_ALIGN * PIECE_ALIGN
    return width if width >= minimum else 0


def matmul_into(a, b, out, threads_share_tiles: bool = False) -> None:
    """``out[...] = a @ b`` for ``a (..., M, K)``, ``b (..., K, N)``, ``out (..., M, N)``
    with the same leading axes (none, or one: a convolution's groups).

    ``threads_share_tiles``: other threads of this process run products beside this one
    (``conv_tiles.for_each_tile`` with several workers). Then the product stays whole:
    pieces of ~100 columns are ~20 us calls, and two threads each making dozens of them lost
    more than the kernels saved (the CIFAR CNN's (32, 288) @ (288, 3264) tiles, timed in
    the training step: 0.87 ms in pieces against 0.75 whole at two threads, 0.63 against
    0.70 at one, and 0.61 against 0.67 with another process's step on the other core).
    """
    xp = backend.array_module(a)
    rows, inner = a.shape[-2:]
    columns = b.shape[-1]
    width = 0
    if not threads_share_tiles and _applies(a, b):
        minimum = MIN_THIN_COLUMN_PIECE if rows <= THIN_ROWS else MIN_COLUMN_PIECE
        width = piece_width(rows * inner, columns, minimum)
    if not width:  # on a device always: our cuBLAS handle (NumPy's matmul on the host)
        cublas.matmul_for(a)(a, b, out=out)
        return
    if a.ndim == 2:
        a, b, out = a[None], b[None], out[None]
    for group in range(a.shape[0]):
        for start in range(0, columns, width):
            stop = min(start + width, columns)
            xp.matmul(a[group], b[group, :, start:stop], out=out[group, :, start:stop])


def matmul_summed(a, b):
    """``a @ b`` for ``a (..., M, K)`` and ``b (..., K, N)`` (leading axes as in
    ``matmul_into``), the inner axis ``K`` cut into pieces whose products are summed."""
    xp = backend.array_module(a)
    rows, inner = a.shape[-2:]
    columns = b.shape[-1]
    width = piece_width(rows * columns, inner, MIN_INNER_PIECE) if _applies(a, b) else 0
    if not width:  # on a device always: our cuBLAS handle (NumPy's matmul on the host)
        return cublas.matmul_for(a)(a, b)
    out = xp.matmul(a[..., :width], b[..., :width, :])
    piece = xp.empty_like(out)
    for start in range(width, inner, width):
        stop = min(start + width, inner)
        xp.matmul(a[..., start:stop], b[..., start:stop, :], out=piece)
        out += piece
    return out
