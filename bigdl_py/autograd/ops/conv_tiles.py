"""Run a convolution tile by tile over the batch, one tile per BLAS thread at a time.

Why tiles: a whole-batch im2col matrix is 9x the input (75 MB for the second layer of
``bench/engine.py``'s CIFAR CNN) and every pass over it goes to main memory. A tile of a
few samples keeps its columns (a few MB) in cache from the im2col copy to the GEMM that
reads them, so nothing large is ever allocated, the backward pass recomputes the columns
instead of keeping them, and OpenBLAS runs these GEMMs faster than the wide whole-batch
one (on the bench machine, at one thread: 21-25 ms against 39 ms for that layer's forward).

Why our own threads: with two BLAS threads each GEMM ends in a barrier between them, and
on a shared machine a barrier often waits for a descheduled thread (see conv.py). So when
BLAS may use ``n > 1`` threads, the tiles are shared out among ``n`` Python threads (the
caller's included) that take the next tile when they finish one, with BLAS held to one
thread meanwhile: the threads meet once per op, not once per GEMM, and NumPy releases the
GIL in its copies and GEMMs. The BLAS limit is restored afterwards.

Why BLAS stays at one thread even for an op that makes a single tile: once woken, an
OpenBLAS worker thread spins (``sched_yield`` in a loop) for 2**28 clock ticks, about 0.1 s,
before it sleeps. On the two-core bench machine a spinning worker takes a core's share from
the tile threads of the ops that follow: after one two-thread 512x512 GEMM it burned 25-30 ms
of CPU while the main thread did other work, 5 ms with ``OPENBLAS_THREAD_TIMEOUT=4``. So the
engine's CPU ops (this module's tiles, and the GEMMs ``matmul.py`` splits the same way) never
hand work to BLAS's own threads while ops share tiles among threads (``matmul.py`` says
when a product may).

On a GPU (CuPy arrays) the whole batch is one tile and nothing is threaded.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# Largest scratch buffer (the columns of one tile) we aim for. At one thread the CIFAR CNN's
# step took the same CPU time (within the machine's noise) with 0.75 to 6 MB, and the second
# layer's forward alone 25 ms with 1.2 MB tiles, 21 ms with 2.4-4.7 MB, 39 ms for the whole
# batch. Small models pay for every extra tile, though: LeNet-5's forward-backward at batch 64
# (the share of a partition at global batch 128) took 10.3-11.6 ms CPU at one thread with 1 MB
# tiles against 8.1-8.8 with 4 MB (its first layer's columns, 3.7 MB, then make one tile) and
# 7.5-8.0 before tiling. 4 MB: a few MB more per thread in the step's peak memory.
TILE_BYTES = 4 << 20
# Below this many bytes of columns for the whole batch an op runs as one tile on the calling
# thread: handing out tiles costs ~0.2 ms, more than such an op takes.
MIN_SPLIT_BYTES = 1 << 20
# Fewest columns (output positions) a tile's GEMMs get, whatever that costs in buffer size.
MIN_COLUMNS = 1024
# Fewest multiply-adds of a convolution whose tiles are shared among threads; smaller ones
# (LeNet-5's at batch 64, 5.5M and 7.4M) run their tiles on the calling thread. With another
# process on the second core (load 4 on the 2-core machine) LeNet-5's step at batch 64 took
# 9.3-10.7 ms at two threads with them shared, 7.3-7.6 ms at one thread. At batch 128 (11M
# and 15M) sharing them won once each tile's buffers were kept between ops (before, tiles of
# 32 samples page-faulted): step 10.6 -> 8.9 and 10.2 -> 8.9 ms at two threads, medians of
# 90 alternated in one process, load 2; it still lost at load 4-5 (9.8 -> 10.5).
MIN_THREADED_MULTIPLY_ADDS = 1 << 23

_state_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_key: tuple[int, int] | None = None  # (process id, threads): a forked child makes its own
_blas_controllers: list | None = None


def _blas() -> list:
    """threadpoolctl's controllers of the loaded BLAS libraries (found once; empty if none)."""
    global _blas_controllers
    if _blas_controllers is None:
        try:
            from threadpoolctl import ThreadpoolController

            controllers = ThreadpoolController().select(user_api="blas").lib_controllers
        except Exception:  # threadpoolctl missing or unable to inspect: run single-threaded
            controllers = []
        _blas_controllers = list(controllers)
    return _blas_controllers


def blas_is_openblas() -> bool:
    """Whether BLAS libraries are loaded and every one of them is OpenBLAS."""
    controllers = _blas()
    return bool(controllers) and all(c.internal_api == "openblas" for c in controllers)


def worker_count() -> int:
    """How many threads a tiled op uses: the current BLAS thread limit (1 if unknown)."""
    return max([controller.num_threads for controller in _blas()] + [1])


def _executor(threads: int) -> ThreadPoolExecutor:
    global _pool, _pool_key
    key = (os.getpid(), threads)
    with _state_lock:
        if _pool_key != key:
            if _pool is not None and _pool_key[0] == key[0]:
                _pool.shutdown(wait=False)  # idle threads of another count: let them go
            _worker_ids.clear()
            _pool = ThreadPoolExecutor(
                threads, thread_name_prefix="bigdl_py-conv", initializer=_register_worker
            )
            _pool_key = key
        return _pool


# Native ids of the pool's threads, and the CPU they were last kept off (see
# _keep_workers_off_this_cpu).
_worker_ids: list[int] = []
_workers_kept_off: list = [None]


def _register_worker() -> None:
    with _state_lock:
        _worker_ids.append(threading.get_native_id())
        _workers_kept_off[0] = None


@functools.cache
def _libc_sched_getcpu():
    """glibc's ``sched_getcpu``, or None where the C library has none."""
    try:
        import ctypes

        return ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):  # not glibc: no affinity for the workers
        return None


def _calling_cpu() -> int | None:
    """The CPU this thread runs on, or None where unknown."""
    function = _libc_sched_getcpu()
    if function is None:
        return None
    cpu = function()
    return cpu if cpu >= 0 else None


def _keep_workers_off_this_cpu() -> None:
    """Let the pool's threads run anywhere but on the calling thread's current CPU.

    Why: a woken pool thread is often queued on the CPU of the thread that woke it, where it
    preempts that thread for its whole tile instead of running beside it, so the split runs
    serially. On the two-core bench machine with another process's load on it, 140 of 200
    split 256x784x512 products had the worker start on the caller's CPU (none ran in
    parallel); kept off that CPU, 44 of 200 ran in parallel. The MLP's two-thread step
    (medians, 60 steps each, alternated in one process, load 0.8-2.7): 9.45-10.90 ms ->
    8.61-8.93 ms, its 75th percentile 12.3-12.9 -> 8.8-9.3 ms (no longer bimodal).
    One ``sched_setaffinity`` per pool thread, only when the caller has changed CPU.
    """
    if not hasattr(os, "sched_setaffinity"):
        return
    cpu = _calling_cpu()
    if cpu is None or cpu == _workers_kept_off[0]:
        return
    allowed = os.sched_getaffinity(0) - {cpu}
    if not allowed:  # one CPU for this process: nowhere else to go
        return
    for worker in list(_worker_ids):
        try:
            os.sched_setaffinity(worker, allowed)
        except OSError:  # the thread has exited (a pool of another size replaced it)
            pass
    _workers_kept_off[0] = cpu


def tile_size(
    batch: int, bytes_per_sample: int, workers: int, on_gpu: bool, columns_per_sample: int = 0
) -> int:
    """Samples per tile: about ``TILE_BYTES`` of columns, yet at least ``MIN_COLUMNS``
    columns (GEMMs on narrower tiles run slowly: ResNet-18's 4x4 layers have 16 columns a
    sample), and at least two tiles per worker."""
    if on_gpu or batch * bytes_per_sample <= MIN_SPLIT_BYTES:
        return batch
    size = max(1, TILE_BYTES // max(1, bytes_per_sample))
    if columns_per_sample:
        size = max(size, -(-MIN_COLUMNS // columns_per_sample))
    if workers > 1:
        size = min(size, max(1, batch // (2 * workers)))
    return min(size, batch)


def for_each_tile(
    batch: int,
    size: int,
    work: Callable[[int, int, dict], None],
    on_gpu: bool = False,
    threaded: bool = True,
    workers_off_caller_cpu: bool = False,
) -> list[dict]:
    """Call ``work(start, stop, scratch)`` for each tile ``[start, stop)`` of the batch.

    Each thread passes its own ``scratch`` dict to every tile it takes (buffers to reuse,
    sums to accumulate); the dicts are returned, one per thread that ran, for the caller to
    combine. ``work`` must write only to its own tile's part of shared outputs. With
    ``threaded=False`` the calling thread takes every tile (BLAS still held to one thread).
    ``workers_off_caller_cpu=True`` keeps the pool's threads off the caller's current CPU
    (see ``_keep_workers_off_this_cpu``; ``matmul.py``'s split products ask for it).
    """
    workers = 1 if on_gpu else worker_count()
    tiles = _even_tiles(batch, size, workers if threaded else 1)
    if workers <= 1 or len(tiles) <= 1 or not threaded:
        scratch: dict = {}
        with _blas_held_to_one(workers > 1):
            for start, stop in tiles:
                work(start, stop, scratch)
        return [scratch]
    threads = min(workers, len(tiles))
    _last_shared[0] = time.monotonic()
    remaining = iter(tiles)
    take_lock = threading.Lock()

    def run() -> dict:
        scratch: dict = {}
        while True:
            with take_lock:
                tile = next(remaining, None)
            if tile is None:
                return scratch
            work(tile[0], tile[1], scratch)

    futures = []
    with _blas_held_to_one():
        try:
            pool = _executor(threads - 1)
            if workers_off_caller_cpu:
                _keep_workers_off_this_cpu()
            futures = [pool.submit(run) for _ in range(threads - 1)]
            scratches = [run()]  # the calling thread takes tiles too
            scratches += [future.result() for future in futures]
        finally:
            # On an error in this thread, let the others finish the tiles left before BLAS
            # gets its threads back (their errors, if any, are dropped for this one).
            for future in futures:
                future.exception()
    return scratches


# When this process last shared an op's tiles among threads (time.monotonic()).
_last_shared = [float("-inf")]
# How long after that BLAS's own threads stay off limits: an OpenBLAS thread spins ~0.1 s
# after its GEMM (the module says why that hurts the tiles), so ten times that.
SHARED_TILES_WINDOW_SECONDS = 1.0


def tiles_shared_recently() -> bool:
    """Whether an op of this process shared its tiles among threads in the last
    ``SHARED_TILES_WINDOW_SECONDS``: if none did, a spinning BLAS thread has no tile threads
    to take a core from."""
    return time.monotonic() - _last_shared[0] < SHARED_TILES_WINDOW_SECONDS


def _even_tiles(batch: int, size: int, workers: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of tiles of at most ``size`` samples, as equal as they can be, and
    (when there are several tiles and ``workers`` threads) a multiple of ``workers`` of them.

    Tiles of ``size`` with a remainder split ResNet-18's 4x4 layers at batch 64 (14 samples
    a tile) 14 + 14 + 14 + 14 + 8: one thread took three tiles, the other two, and waited
    a third of the op for the first.
    """
    count = -(-batch // max(1, size))
    if workers > 1 and count > 1:
        count = min(batch, -(-count // workers) * workers)
    # The larger tiles first: a thread's first tile then is its largest, which the buffers
    # it lays out for that tile (and zeroes once per op) must hold.
    small, larger = divmod(batch, max(1, count))
    bounds = [0]
    for index in range(count):
        bounds.append(bounds[-1] + small + (index < larger))
    return list(zip(bounds[:-1], bounds[1:], strict=True))


@contextlib.contextmanager
def _blas_held_to_one(hold: bool = True):
    """Limit BLAS to one thread inside the block (when ``hold``), then restore its limits."""
    controllers = _blas() if hold else []
    limits = [controller.num_threads for controller in controllers]
    for controller in controllers:
        controller.set_num_threads(1)
    try:
        yield
    finally:
        for controller, limit in zip(controllers, limits, strict=True):
            controller.set_num_threads(limit)


def scratch_array(scratch: dict, name: str, shape: tuple, dtype, xp=np, zeroed: bool = False):
    """A reusable buffer of ``shape`` from ``scratch`` (a prefix of one allocated per name).

    A smaller last tile gets the first elements of the same buffer, so a zeroed border laid
    out for the full tile stays where the smaller tile's layout expects it only when the
    leading axis is the tile's; callers that rely on zeros say ``zeroed=True`` and re-zero
    what they do not overwrite.
    """
    size = 1
    for extent in shape:
        size *= extent
    key = (name, np.dtype(dtype).str)
    buffer = scratch.get(key)
    if buffer is None or buffer.size < size:
        if xp is np:
            buffer = _kept_buffer(key, size, dtype)
            if zeroed:
                buffer[:size] = 0
        else:
            buffer = (xp.zeros if zeroed else xp.empty)(size, dtype=dtype)
        scratch[key] = buffer
        scratch[key + ("zeroed",)] = size if zeroed else 0
    elif zeroed and scratch.get(key + ("zeroed",), 0) < size:
        # A larger tile than the first this op: zero the part the first one did not use.
        buffer[scratch[key + ("zeroed",)] : size] = 0
        scratch[key + ("zeroed",)] = size
    return buffer[:size].reshape(shape)


# Each thread keeps its scratch buffers from one op to the next, up to this many bytes.
# Allocated afresh per op, multi-MB buffers often came from the OS page by page: LeNet-5's
# first convolution in tiles of 32 samples (the two-thread split) took 1074 minor page
# faults a call and 3.3 ms of CPU against 1.0 ms for tiles of 40 or 64 (no faults), the
# sizes of its buffers happening to defeat glibc's mmap threshold. ResNet-18's step keeps
# 92 MB in the calling thread at one thread (the Winograd route's buffers beside the im2col
# ones): with 64 MB the buffers were dropped and made again four times a step, 2432 ms of
# CPU against 2347 with 128 MB (medians of 6 alternated), and its traced peak 367 MB
# against 322.
KEPT_BYTES_PER_THREAD = 128 << 20
_kept = threading.local()


def _kept_buffer(key: tuple, size: int, dtype) -> np.ndarray:
    """This thread's kept NumPy buffer for ``key`` with at least ``size`` elements."""
    buffers = getattr(_kept, "buffers", None)
    if buffers is None:
        buffers = _kept.buffers = {}
    buffer = buffers.get(key)
    if buffer is None or buffer.size < size:
        buffer = np.empty(size, dtype=dtype)
        if buffer.nbytes + sum(kept.nbytes for kept in buffers.values()) > KEPT_BYTES_PER_THREAD:
            buffers.clear()
        if buffer.nbytes <= KEPT_BYTES_PER_THREAD:
            buffers[key] = buffer
    return buffer


# GEMM operands whose rows lie a multiple of 4 KiB apart map every row to the same L1/L2
# cache sets, so the BLAS kernel's packing evicts its own rows. LeNet-5's tiles hit that
# (columns of 25 x 21504 or 150 x 2048 floats): at one thread its forward GEMMs ran at 25 and
# 38 GFLOP/s with those rows, 47 and 76 with 64 bytes of padding after each row; ResNet-18's
# shapes were within noise either way (CPU time, medians of 30).
CACHE_LINE_BYTES = 64


def scratch_matrix(scratch: dict, name: str, shape: tuple, dtype, xp=np):
    """A reusable ``shape`` buffer (as ``scratch_array``) whose last axis is padded so that
    consecutive rows start an odd number of cache lines apart; returns a view of ``shape``.

    The rows stay contiguous (BLAS reads the view through its leading dimension); only the
    distance between them changes. On a GPU the buffer is not padded.
    """
    *leading, width = shape
    itemsize = np.dtype(dtype).itemsize
    padded_width = width
    if xp is np and width > 1:
        lines = -(-width * itemsize // CACHE_LINE_BYTES)
        lines += 1 - lines % 2  # an odd number of lines
        padded_width = max(width, lines * CACHE_LINE_BYTES // itemsize)
    buffer = scratch_array(scratch, name, tuple(leading) + (padded_width,), dtype, xp)
    return buffer[..., :width]


# Element-wise ops (ReLU, Tanh) on arrays above this many bytes are split over the leading
# axis, one part per BLAS thread; below it handing out a part costs more than it saves
# (about 0.15 ms of CPU for a split ReLU or Tanh in both directions at two threads, on a
# ReLU of 0.4 ms: medians of 40, CPU time).
MIN_ELEMENTWISE_SPLIT_BYTES = 2 << 20


def for_each_part(array, work: Callable[[int, int], None]) -> None:
    """Call ``work(start, stop)`` over ``array``'s leading axis: one part per BLAS thread
    for a large NumPy array, the whole array (``start, stop = 0, len``) otherwise."""
    length = array.shape[0] if array.ndim else 1
    parts = 1
    if isinstance(array, np.ndarray) and array.nbytes > MIN_ELEMENTWISE_SPLIT_BYTES:
        parts = min(worker_count(), length)
    if parts <= 1:
        work(0, length)
        return
    for_each_tile(length, -(-length // parts), lambda start, stop, _scratch: work(start, stop))
