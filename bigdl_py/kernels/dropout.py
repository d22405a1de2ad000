"""Dropout on a device from a counter-based generator whose state lives there
(``cuda/dropout.cu``: Philox4x32-10).

A device stream is two words on the device, ``[seed, offset]``. A draw takes it (one tiny
kernel copies it aside and moves the offset past the draw), and the dropout kernel reads
the copy: the host never reads the state, and the backward regenerates the forward's mask
from the same copy instead of keeping one. One stream per device and thread; its seed comes
from the host generator ``ops.manual_seed`` seeds (``misc.default_generator``), spawned
from its seed sequence rather than drawn, so a seeded run draws the same masks every time
and the host's own draws from that generator are not moved. ``ops.manual_seed`` reseeds
the streams in place: a training step captured in a CUDA graph draws from the new seed.
(The host's dropout draws from NumPy's generators, so a device run's masks differ from a
host run's with the same seed.)

The ``*_reference`` functions are the kernels in NumPy, integer for integer: a reference and
its kernel give the same mask bit for bit.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.kernels.compiler import Kernel, elementwise_blocks, run

_STATE = "unsigned long long*"
PHILOX_TAKE = Kernel("dropout", "philox_take", (_STATE, _STATE, "unsigned long long"))
DROPOUT_MASK = Kernel(
    "dropout", "dropout_mask", ("index", "const " + _STATE, "unsigned long long", "bool*")
)
DROPOUT_APPLY = Kernel(
    "dropout",
    "dropout_apply",
    ("index", "const real*", "const " + _STATE, "unsigned long long", "real", "real*"),
)

_MULTIPLIERS = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_KEY_BUMPS = (np.uint32(0x9E3779B9), np.uint32(0xBB67AE85))
_LOW = np.uint64(0xFFFFFFFF)


def philox_words(state: np.ndarray, groups: int) -> np.ndarray:
    """``(groups, 4)`` uint32: the words of blocks 0 .. groups-1 of the stream ``state``."""
    counter = np.uint64(state[1]) + np.arange(groups, dtype=np.uint64)
    c0 = (counter & _LOW).astype(np.uint32)
    c1 = (counter >> np.uint64(32)).astype(np.uint32)
    c2 = np.zeros(groups, np.uint32)
    c3 = np.zeros(groups, np.uint32)
    k0 = np.uint32(int(state[0]) & 0xFFFFFFFF)
    k1 = np.uint32(int(state[0]) >> 32)
    with np.errstate(over="ignore"):
        for _ in range(10):
            p0 = _MULTIPLIERS[0] * c0.astype(np.uint64)
            p1 = _MULTIPLIERS[1] * c2.astype(np.uint64)
            hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), (p0 & _LOW).astype(np.uint32)
            hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), (p1 & _LOW).astype(np.uint32)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
            k0, k1 = k0 + _KEY_BUMPS[0], k1 + _KEY_BUMPS[1]
    return np.stack([c0, c1, c2, c3], axis=1)


def _kept(state, threshold, n) -> np.ndarray:
    words = philox_words(state, -(-n // 4)).reshape(-1)[:n]
    return words.astype(np.uint64) >= np.uint64(threshold)


def philox_take_reference(state, taken, groups):
    taken[...] = state
    state[1] = state[1] + np.uint64(groups)


def dropout_mask_reference(n, state, threshold, keep):
    keep.reshape(-1)[...] = _kept(state, threshold, n)


def dropout_apply_reference(n, x, state, threshold, scale, y):
    kept = _kept(state, threshold, n).astype(x.dtype)
    y.reshape(-1)[...] = x.reshape(-1) * kept * x.dtype.type(scale)


REFERENCES = {
    PHILOX_TAKE: philox_take_reference,
    DROPOUT_MASK: dropout_mask_reference,
    DROPOUT_APPLY: dropout_apply_reference,
}


# --- the device streams ------------------------------------------------------------------------

_streams = threading.local()


def forget_streams() -> None:
    """Start this thread's device streams again from the host generator (``ops.manual_seed``
    calls this, after making a new one): each takes its new seed now and its offset goes
    back to 0, written into the stream's own device memory, so a step captured in a CUDA
    graph draws from the new stream."""
    for device, state in getattr(_streams, "by_device", {}).items():
        state[...] = backend.to_device(_new_state(), device)


def _new_state() -> np.ndarray:
    """``[seed, 0]``: the seed spawned from the seed sequence of the host generator dropout
    uses (the next stream made or reseeded takes the next child), so the generator's own
    draws are not moved."""
    from bigdl_py.autograd.ops.misc import default_generator

    (child,) = default_generator().bit_generator.seed_seq.spawn(1)
    return np.array([child.generate_state(1, np.uint64)[0] >> np.uint64(1), 0], np.uint64)


def _stream(like: Any) -> Any:
    """This thread's ``[seed, offset]`` on ``like``'s device, made on first use."""
    streams = getattr(_streams, "by_device", None)
    if streams is None:
        streams = _streams.by_device = {}
    device = backend.device_of(like)
    state = streams.get(device)
    if state is None:
        state = streams[device] = backend.to_device(_new_state(), device)
    return state


def threshold(p: float) -> int:
    """Words below this are dropped: ``ceil(p * 2**32)`` (2**32 drops everything)."""
    return min(math.ceil(p * 2**32), 2**32)


def take(like: Any, count: int) -> Any:
    """The stream for ``count`` draws (a copy of ``[seed, offset]``, on the device); the
    device's stream moves past them."""
    state = _stream(like)
    taken = backend.array_module(like).empty(2, dtype=np.uint64)
    run(PHILOX_TAKE, philox_take_reference, 1, np.float32, state, taken, -(-count // 4))
    return taken


def keep_mask(shape: tuple, p: float, like: Any) -> Any:
    """A boolean mask of ``shape`` on ``like``'s device, each entry True with probability
    ``1 - p`` (attention's dropout keeps it for its tiles)."""
    count = math.prod(shape)
    keep = backend.array_module(like).empty(shape, dtype=bool)
    taken = take(like, count)
    run(DROPOUT_MASK, dropout_mask_reference, elementwise_blocks(-(-count // 4)), np.float32,
        count, taken, threshold(p), keep)  # fmt: skip
    return keep


def apply(x: Any, taken: Any, p: float, scale: float) -> Any:
    """``x * keep * scale`` with the mask of the stream ``taken`` (a new array)."""
    xp = backend.array_module(x)
    x = xp.ascontiguousarray(x)
    y = xp.empty_like(x)
    run(DROPOUT_APPLY, dropout_apply_reference, elementwise_blocks(-(-x.size // 4)), x.dtype,
        x.size, x, taken, threshold(p), scale, y)  # fmt: skip
    return y
