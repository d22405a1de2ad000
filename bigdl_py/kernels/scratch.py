"""Temporary device buffers kept from one op to the next instead of allocated each time.

A convolution's columns and GEMM results are as large as the op's input many times over;
on a device they come from here: one flat buffer per name, dtype and device, grown when a
larger one is asked for and reused by every later op. Reuse is safe on a GPU because a
stream runs its kernels in order: the next op's kernels write a buffer only after the
previous op's have read it. Per thread (Spark's one-task mode trains a replica a thread).
The caller must not keep a buffer past its op (never return one or save it for backward).
A step captured in a CUDA graph keeps the buffers it used (``step_graph.keep_alive``): a
later, larger request replaces a buffer here, but the graph's kernels still use the old one.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from bigdl_py import backend, step_graph

_buffers = threading.local()


def scratch(name: str, shape: tuple, dtype: Any, like: Any) -> Any:
    """A ``shape`` array on ``like``'s device, the memory of the buffer ``name`` (its
    contents are whatever the last user left)."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64))
    kept = getattr(_buffers, "by_key", None)
    if kept is None:
        kept = _buffers.by_key = {}
    key = (name, dtype.str, backend.device_of(like))
    buffer = kept.get(key)
    if buffer is None or buffer.size < size:
        buffer = kept[key] = backend.array_module(like).empty(max(size, 1), dtype=dtype)
    step_graph.keep_alive(buffer)
    return buffer[:size].reshape(shape)


def release() -> None:
    """Let this thread's buffers go (the next op allocates anew)."""
    _buffers.by_key = {}
