"""Large values cross Spark's shuffle as many records of at most ``CHUNK_BYTES`` each.

PySpark's ``partitionBy`` pickles a task's ``(key, value)`` pairs into one JVM record per
bucket: a 64 MB gradient becomes one 64 MB ``byte[]``. On the JVM side, Spark's serialized
shuffle writer grows its record buffer (1 MB at first) by doubling until the record fits,
in every task, and every array of 1 MB or more is a "humongous" allocation for the G1
collector; a JFR profile of a 64 MB ``all_reduce`` put most of the task threads' Java time
in that buffer's writes, with hundreds of humongous-allocation collections a minute.
Records of a few MB avoid both: a 64 MB ``all_reduce`` at N = 2 took about 30 % less
wall and CPU time (``bench/RESULTS.md``).

:func:`split_large_values` turns a pair whose value carries more than ``split_above`` bytes
of buffers into a head (the value pickled with protocol 5, its buffers out of band) and
chunks of those buffers; :func:`join_large_values` puts them back together on the reducing
side. Small values pass through untouched. Both ends are plain generator functions on
``(key, value)`` iterators, so they run and are tested without Spark. The pickles exist only
in flight, inside one Spark job, as PySpark's own shuffle records do; nothing here reads a
file.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np

CHUNK_BYTES = 256 << 10
SPLIT_ABOVE = 1 << 20


class ChunkedHead(NamedTuple):
    """The first record of a split value: its pickle without the buffers, their sizes."""

    value_id: tuple[int, int]
    pickled: bytes
    buffer_sizes: tuple[int, ...]


class Chunk(NamedTuple):
    """``data`` goes at byte ``offset`` of the value's buffers, laid end to end."""

    value_id: tuple[int, int]
    offset: int
    data: Any


def split_large_values(
    sender: int,
    pairs: Iterable[tuple[Any, Any]],
    chunk_bytes: int = CHUNK_BYTES,
    split_above: int = SPLIT_ABOVE,
) -> Iterator[tuple[Any, Any]]:
    """``pairs`` with every large value replaced by a :class:`ChunkedHead` and its
    :class:`Chunk` s, all under the value's key (so they reach the same partition).

    ``sender`` (the map task's partition) and a running count name each split value, so a
    reducer can tell apart values from different tasks. Chunks are ``PickleBuffer`` views
    of the value's own buffers: PySpark's pickling copies them once, as it would the value.
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    for number, (key, value) in enumerate(pairs):
        buffers: list[pickle.PickleBuffer] = []
        pickled = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        views = [buffer.raw() for buffer in buffers]
        if sum(view.nbytes for view in views) <= split_above:
            yield key, value
            continue
        value_id = (sender, number)
        yield key, ChunkedHead(value_id, pickled, tuple(view.nbytes for view in views))
        offset = 0
        for view in views:
            for start in range(0, view.nbytes, chunk_bytes):
                piece = view[start : start + chunk_bytes]
                yield key, Chunk(value_id, offset + start, pickle.PickleBuffer(piece))
            offset += view.nbytes


class _Assembly:
    """A split value being put back together from its head and chunks."""

    def __init__(self) -> None:
        self.head: ChunkedHead | None = None
        self.data: np.ndarray | None = None
        self.pending: list[Chunk] = []
        self.received = 0

    def add_head(self, head: ChunkedHead) -> None:
        self.head = head
        # Uninitialised: every byte is written by a chunk (bytearray would zero it first).
        self.data = np.empty(sum(head.buffer_sizes), dtype=np.uint8)
        for chunk in self.pending:
            self.add_chunk(chunk)
        self.pending = []

    def add_chunk(self, chunk: Chunk) -> None:
        if self.data is None:  # a chunk ahead of its head: keep it until the head comes
            self.pending.append(chunk)
            return
        data = np.frombuffer(chunk.data, dtype=np.uint8)
        self.data[chunk.offset : chunk.offset + data.size] = data
        self.received += data.size

    def complete(self) -> bool:
        return self.data is not None and self.received == self.data.size

    def value(self) -> Any:
        assert self.head is not None and self.data is not None
        whole = memoryview(self.data)  # the values' arrays are views of it, writable
        buffers, start = [], 0
        for size in self.head.buffer_sizes:
            buffers.append(whole[start : start + size])
            start += size
        return pickle.loads(self.head.pickled, buffers=buffers)


def join_large_values(pairs: Iterable[tuple[Any, Any]]) -> Iterator[tuple[Any, Any]]:
    """Undo :func:`split_large_values`: every pair as it was sent.

    Small values come through in arrival order; a split value comes out when its last
    piece arrives.

    Raises
    ------
    ValueError
        If the input ends with a split value incomplete (names the sending partition).
    """
    assemblies: dict[tuple[int, int], _Assembly] = {}
    for key, value in pairs:
        if isinstance(value, ChunkedHead):
            assembly = assemblies.setdefault(value.value_id, _Assembly())
            assembly.add_head(value)
        elif isinstance(value, Chunk):
            assembly = assemblies.setdefault(value.value_id, _Assembly())
            assembly.add_chunk(value)
        else:
            yield key, value
            continue
        if assembly.complete():
            del assemblies[assembly.head.value_id]
            yield key, assembly.value()
    if assemblies:
        senders = sorted({value_id[0] for value_id in assemblies})
        raise ValueError(
            f"shuffle: {len(assemblies)} split value(s) from partition(s) {senders} arrived "
            "incomplete"
        )
