"""Ops of the remaining layers: inverted dropout and embedding lookup."""

from __future__ import annotations

import math
import threading

import numpy as np

from bigdl_py import backend, device_waits, kernels
from bigdl_py.autograd.engine import RowGradient
from bigdl_py.autograd.function import Function
from bigdl_py.kernels import dropout as fused_dropout

# Dropout draws from this generator when the caller passes none; ``manual_seed`` resets it.
# A thread that called ``manual_seed`` itself draws from its own: Spark's one-task mode
# trains a replica per thread, each reseeded with its partition's stream, and one shared
# generator would hand them each other's draws in whatever order the threads ran.
_default_generator = np.random.default_rng()
_thread_generators = threading.local()


def manual_seed(seed: int) -> None:
    """Reseed the generator that ``dropout`` uses when it is given no ``rng``: the process's
    (from the main thread) or, from another thread, that thread's own from now on.

    On device arrays without an ``rng``, dropout draws on the device from a Philox stream
    whose seed comes from this generator (``bigdl_py.kernels.dropout``); this restarts it.
    CuPy's global generator is seeded too when CuPy is in use.
    """
    global _default_generator
    generator = np.random.default_rng(seed)
    if threading.current_thread() is threading.main_thread():
        _default_generator = generator
    _thread_generators.generator = generator
    fused_dropout.forget_streams()  # device streams restart from the new generator
    if backend.cuda_available():
        backend.cupy_module().random.seed(seed)


def default_generator() -> np.random.Generator:
    """The generator dropout uses without an ``rng`` in this thread (see ``manual_seed``)."""
    return getattr(_thread_generators, "generator", None) or _default_generator


def _uniform(shape, like, rng):
    """Uniform [0, 1) float32 draws of ``shape`` on ``like``'s device.

    Always float32 (24 random bits are plenty for a keep/drop decision): a generator seeded
    alike then gives the same mask to float32 and float64 models.
    """
    draw_dtype = np.float32
    if rng is None and backend.is_device_array(like):
        # cuRAND keeps its position on the host: a replayed draw would repeat itself.
        backend.refuse_in_capture("a draw of CuPy's random generator (cuRAND)")
        return backend.array_module(like).random.random(shape, dtype=draw_dtype)
    generator = default_generator() if rng is None else rng
    if not isinstance(generator, np.random.Generator):
        raise TypeError(
            f"dropout: rng must be a numpy.random.Generator or None, got {type(generator)!r}"
        )
    draws = generator.random(shape, dtype=draw_dtype)
    return backend.to_device(draws, backend.device_of(like))


# Bit generators whose ``random_raw`` words are 64 random bits (MT19937's are 32 bits).
_RAW_64_BIT_GENERATORS = (np.random.PCG64, np.random.PCG64DXSM, np.random.Philox, np.random.SFC64)


def _keep_mask(shape, p: float, like, rng):
    """A boolean mask of ``shape`` on ``like``'s device: each entry True with probability
    ``1 - p``, independently.

    On the host with one of NumPy's 64-bit bit generators, each entry compares 32 raw
    random bits with ``p * 2**32`` (two entries per 64-bit word): 1.6x faster than drawing
    float32 uniforms (2M entries: 2.6 ms against 4.1 ms) and a finer resolution of ``p``.
    Otherwise ``_uniform(...) >= p``. Either way the mask depends on the generator only, not
    on the dtype of ``like``.
    """
    if rng is None and kernels.route(like) is not None:
        return fused_dropout.keep_mask(shape, p, like)  # drawn on the device
    generator = default_generator() if rng is None else rng
    raw_bits = (
        not (rng is None and backend.is_device_array(like))
        and isinstance(generator, np.random.Generator)
        and type(generator.bit_generator) in _RAW_64_BIT_GENERATORS
    )
    if not raw_bits:
        return _uniform(shape, like, rng) >= p
    count = math.prod(shape)
    threshold = math.ceil(p * 2**32)
    if threshold >= 2**32:
        keep = np.zeros(shape, dtype=bool)
    else:
        words = generator.bit_generator.random_raw((count + 1) // 2)
        keep = (words.view(np.uint32)[:count] >= np.uint32(threshold)).reshape(shape)
    return backend.to_device(keep, backend.device_of(like))


class Dropout(Function):
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``."""

    def forward(self, x, p=0.5, rng=None):
        backend.check_floating(x.dtype, "dropout")
        self.scale = x.dtype.type(1.0 / (1.0 - p)) if p < 1 else x.dtype.type(0)
        self.p = p
        self.fused = rng is None and kernels.route(x) is not None
        if self.fused:
            # One kernel, no mask kept: the backward regenerates it from the stream's copy.
            taken = fused_dropout.take(x, x.size)
            self.save_for_backward(taken)
            return fused_dropout.apply(x, taken, p, self.scale)
        # A boolean mask costs 1 byte per element; the scale is applied as a separate step.
        keep = _keep_mask(x.shape, p, x, rng)
        self.save_for_backward(keep)
        output = x * keep
        output *= self.scale
        return output

    def backward(self, grad):
        if self.fused:
            (taken,) = self.saved
            return fused_dropout.apply(grad, taken, self.p, self.scale)
        (keep,) = self.saved
        grad_x = grad * keep
        grad_x *= self.scale
        return grad_x


class Embedding(Function):
    """Rows of ``weight`` picked by integer ``indices`` of any shape."""

    differentiable_inputs = (1,)

    def forward(self, indices, weight, padding_idx=None):
        xp = backend.array_module(weight)
        if indices.dtype.kind not in "iu":
            raise TypeError(f"embedding: indices must be integers, got dtype {indices.dtype}")
        if weight.ndim != 2:
            raise ValueError(
                f"embedding: weight must be 2-d (num_embeddings, embedding_dim), got shape "
                f"{tuple(weight.shape)}"
            )
        if indices.size:
            check_indices(indices, weight.shape[0], "embedding")
        self.padding_idx = padding_idx
        self.weight_shape = weight.shape
        self.save_for_backward(indices)
        return xp.take(weight, indices, axis=0)

    def backward(self, grad):
        (indices,) = self.saved
        indices = indices.reshape(-1)
        rows = grad.reshape(-1, self.weight_shape[1])
        if self.padding_idx is not None:
            kept = indices != self.padding_idx
            if backend.is_device_array(rows):
                # Zero rows instead of a boolean selection, which sizes its result on the
                # host (a device wait); the padding row then gets zeros added.
                rows = rows * kept[:, None].astype(rows.dtype)
            else:
                indices, rows = indices[kept], rows[kept]
        # Only the looked-up rows: the engine adds them into the weight's .grad in place.
        return None, RowGradient(indices, rows, self.weight_shape)


def check_indices(indices, count: int, name: str) -> None:
    """Raise IndexError, naming ``name``, when an index lies outside ``[0, count)``.

    Device indices are checked on the device: inside a training step the answer is read at
    the next sync point (``device_waits``), and until then the lookups wrap around as
    CuPy's do, so nothing reads outside the table.
    """
    low, high = indices.min(), indices.max()

    def error(low, high) -> IndexError:
        return IndexError(
            f"{name}: indices must be in [0, {count - 1}] for a vocabulary of {count} rows, "
            f"got min {int(low)} and max {int(high)}"
        )

    if backend.is_device_array(indices):
        device_waits.check((low < 0) | (high >= count), error, low, high)
    elif low < 0 or high >= count:
        raise error(low, high)


def row_sums(index, rows, count: int):
    """A new ``(count, *rows.shape[1:])`` array whose row ``i`` is the sum of the ``rows[k]``
    with ``index[k] == i`` (zero where no index points): embedding gradients."""
    xp = backend.array_module(rows)
    result = xp.zeros((count, *rows.shape[1:]), dtype=rows.dtype)
    add_rows(result, index, rows, zeroed=True)
    return result


def add_rows(target, index, rows, zeroed: bool = False) -> None:
    """``target[index[k]] += rows[k]`` for every ``k`` in place, repeated indices adding up.

    ``zeroed=True`` says ``target`` is all zeros, so rows may be assigned instead of added.
    CUDA arrays go to ``backend.scatter_add``. On the CPU the rows go in rounds. In a round
    each index first claims one of its rows: ``claimant[index] = k`` keeps one ``k`` per
    index, whichever NumPy wrote last, and reading ``claimant[index]`` back tells every row
    which row won. Every index then gets its winner's row (added to its old value) in one
    fancy assignment (duplicates write the same bytes, so their order does not matter), with
    each row viewed as one opaque element: NumPy copies those twice as fast as 2-d rows
    (1024 rows of 32 float32: 6.4 us against 12.8). The rows that lost (repeats) make the
    next round, and each round has fewer: an index repeated r times takes r rounds.

    Rounds beat sorting while repeats are a minority, as in a batch of ids from a large
    vocabulary: 4096 rows of 32 into 6,040 (NCF's users at batch 4096) took 154 us against
    802 for the sorted sums below, which this function ran whenever over a quarter of the
    rows were repeats, and 1024 rows of 64 into 2,000 67 us against 81 (one thread, medians
    of 500). A round in which over three quarters of the rows lose (a small vocabulary: 4096
    rows into 100 would take ~50 rounds) sorts those rows by index instead and sums each run
    with one ``add.reduceat``.
    """
    if index.size == 0:
        return
    if backend.is_device_array(target):
        backend.scatter_add(target, index, rows)
        return
    count = target.shape[0]
    rows = rows.reshape(index.size, -1)  # may stay strided: ``take`` gives contiguous rows
    width = rows.shape[1]
    # A 2-d view: every target here is a table or a fresh array, contiguous.
    table = target.reshape(count, width)
    opaque_rows = table.view(np.dtype((np.void, width * rows.itemsize))).reshape(count)
    claimant = np.empty(count, dtype=np.intp)
    while True:
        positions = np.arange(index.size)
        claimant[index] = positions
        winner = claimant[index]
        repeats = np.flatnonzero(winner != positions)
        if 4 * repeats.size > 3 * index.size:
            _add_sorted_rows(table, index, rows, zeroed)
            return
        firsts = rows.take(winner, axis=0)
        if not zeroed:
            firsts += table.take(index, axis=0)
        opaque_rows[index] = firsts.view(opaque_rows.dtype).reshape(index.size)
        if not repeats.size:
            return
        index, rows, zeroed = index[repeats], rows[repeats], False


def _add_sorted_rows(table, index, rows, zeroed: bool) -> None:
    """``add_rows`` for rows with many repeats: sorted by index, each run summed at once."""
    order = np.argsort(index, kind="stable")
    sorted_index = index[order]
    starts_run = np.empty(index.size, dtype=bool)
    starts_run[0] = True
    np.not_equal(sorted_index[1:], sorted_index[:-1], out=starts_run[1:])
    starts = np.flatnonzero(starts_run)
    sums = np.add.reduceat(rows[order], starts, axis=0)
    if not zeroed:
        sums += table[sorted_index[starts]]
    table[sorted_index[starts]] = sums
