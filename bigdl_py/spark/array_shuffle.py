"""A shuffle to owners whose array bytes travel raw: ``partitionBy`` without pickling buffers.

PySpark's ``RDD.partitionBy`` pickles each bucket of ``(key, value)`` pairs into one bytes
object before writing it to the JVM and unpickles it after the fetch: every array byte is
copied into a pickle on the sending side and out of one on the receiving side, 14-21 ms per
16 MB slice on each side (bench/RESULTS.md, "The AllReduce's bytes").

:func:`shuffle_to_owners` does the same shuffle with :class:`OutOfBandPairSerializer` on
both Python sides. A value is pickled with protocol 5 and a ``buffer_callback``: NumPy arrays
and :class:`bigdl_py.spark.wire.WireArray` payloads leave their buffers out of the pickle,
which then holds only the header (tags, dtypes, shapes, ranks). The serializer writes the
header and then each buffer straight from the array's memory into the worker's socket, and
the receiver reads each buffer straight from the socket into a fresh array: no copy in
Python beyond the socket's own. One ``(key, value)`` pair is one shuffle record.

The JVM half is PySpark's own: the pairs of frames become ``(Long, byte[])`` records in
PySpark's ``PairwiseRDD`` and are partitioned by a ``PythonPartitioner`` keyed on
:func:`bigdl_py.spark.collectives.owner_partition`, exactly the calls ``RDD.partitionBy``
makes, so the result is co-partitioned with ``rdd.partitionBy(count, owner_partition)``.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from pyspark import RDD
from pyspark.core.rdd import Partitioner
from pyspark.serializers import FramedSerializer, SpecialLengths, pack_long, read_int, write_int

# A shuffle record is one JVM byte array, and Spark's frames carry a signed 32-bit length.
MAX_RECORD_BYTES = (1 << 31) - 1

_COUNT = struct.Struct("!I")
_SIZE = struct.Struct("!Q")


def _read_exactly(stream, count: int) -> bytes:
    data = stream.read(count)
    if len(data) < count:
        raise EOFError(f"shuffle record cut short: {len(data)} of {count} bytes")
    return data


def _read_into(stream, buffer: np.ndarray) -> None:
    """Fill ``buffer`` from ``stream`` (a socket may hand over less than asked per call)."""
    view = memoryview(buffer).cast("B")
    filled = 0
    while filled < len(view):
        got = stream.readinto(view[filled:])
        if not got:
            raise EOFError(f"shuffle record cut short: {filled} of {len(view)} buffer bytes")
        filled += got


class OutOfBandPairSerializer(FramedSerializer):
    """PySpark serializer of ``(key, value)`` pairs whose array buffers bypass pickle.

    Writing (map side) emits two frames per pair, as ``partitionBy`` does: the key as an
    8-byte long (the JVM partitions on it), then the record. Reading (reduce side) yields the
    ``(key, value)`` pairs back. A record is::

        u32 header length | header (pickle protocol 5 of (key, value), buffers left out)
        u32 buffer count  | u64 size of each buffer | the buffers' bytes, one after another
    """

    def dump_stream(self, iterator: Iterable[tuple[int, Any]], stream) -> None:
        for key, value in iterator:
            write_int(8, stream)
            stream.write(pack_long(key))
            buffers: list[pickle.PickleBuffer] = []
            header = pickle.dumps((key, value), protocol=5, buffer_callback=buffers.append)
            raws = [buffer.raw() for buffer in buffers]
            length = (
                _COUNT.size
                + len(header)
                + _COUNT.size
                + _SIZE.size * len(raws)
                + sum(raw.nbytes for raw in raws)
            )
            if length > MAX_RECORD_BYTES:
                raise ValueError(
                    f"a shuffle record for owner {key} holds {length} bytes, over Spark's "
                    f"{MAX_RECORD_BYTES}-byte limit per record; use more partitions"
                )
            write_int(length, stream)
            stream.write(_COUNT.pack(len(header)))
            stream.write(header)
            stream.write(_COUNT.pack(len(raws)))
            stream.write(b"".join(_SIZE.pack(raw.nbytes) for raw in raws))
            for raw in raws:
                stream.write(raw)

    def load_stream(self, stream) -> Iterator[tuple[int, Any]]:
        while True:
            try:
                length = read_int(stream)
            except EOFError:
                return
            if length == SpecialLengths.END_OF_DATA_SECTION:
                return
            yield self._read_record(stream)

    @staticmethod
    def _read_record(stream) -> tuple[int, Any]:
        (header_length,) = _COUNT.unpack(_read_exactly(stream, _COUNT.size))
        header = _read_exactly(stream, header_length)
        (count,) = _COUNT.unpack(_read_exactly(stream, _COUNT.size))
        size_block = _read_exactly(stream, _SIZE.size * count)
        sizes = [_SIZE.unpack_from(size_block, _SIZE.size * index)[0] for index in range(count)]
        buffers = []
        for size in sizes:
            # np.empty, not bytearray: no zero-filling of bytes about to be overwritten.
            buffer = np.empty(size, dtype=np.uint8)
            _read_into(stream, buffer)
            buffers.append(buffer)
        return pickle.loads(header, buffers=buffers)

    def dumps(self, obj):
        raise NotImplementedError("OutOfBandPairSerializer writes streams only")

    def loads(self, obj):
        raise NotImplementedError("OutOfBandPairSerializer reads streams only")

    def __eq__(self, other) -> bool:
        return isinstance(other, OutOfBandPairSerializer)

    def __hash__(self) -> int:
        return hash(OutOfBandPairSerializer)


def shuffle_to_owners(rdd: RDD, count: int) -> RDD:
    """``rdd.partitionBy(count, owner_partition)`` with array buffers moved raw.

    Parameters
    ----------
    rdd : pyspark.RDD
        ``(owner, value)`` pairs, ``owner`` an int in ``[0, count)``. Values are anything
        picklable; their NumPy arrays and WireArrays travel without being pickled.
    count : int
        Number of partitions of the result.

    Returns
    -------
    pyspark.RDD
        Lazy; partition j holds the pairs whose owner is j. ``rdd`` itself when it is
        already partitioned that way.

    Raises
    ------
    ValueError
        When evaluated, if an owner is not an int in ``[0, count)``.
    """
    from bigdl_py.spark.collectives import owner_partition

    partitioner = Partitioner(count, owner_partition)
    if rdd.partitioner == partitioner:
        return rdd

    def checked(pairs):
        for owner, value in pairs:
            if not isinstance(owner, (int, np.integer)) or not 0 <= owner < count:
                raise ValueError(
                    f"shuffle_to_owners: owner must be an int in [0, {count}), got {owner!r}"
                )
            yield int(owner), value

    serializer = OutOfBandPairSerializer()
    keyed = rdd.mapPartitions(checked, preservesPartitioning=True)
    # A PipelinedRDD writes its output with its _jrdd_deserializer: ours, instead of pickle.
    keyed._jrdd_deserializer = serializer
    jvm = rdd.ctx._jvm
    pairs = jvm.PairwiseRDD(keyed._jrdd.rdd()).asJavaPairRDD()
    java_partitioner = jvm.PythonPartitioner(count, id(owner_partition))
    values = jvm.PythonRDD.valueOfPair(pairs.partitionBy(java_partitioner))
    result = RDD(values, rdd.ctx, serializer)
    result.partitioner = partitioner
    return result
