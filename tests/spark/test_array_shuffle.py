"""The shuffle to owners whose array buffers travel unpickled."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from bigdl_py.spark import array_shuffle, collectives, wire


def values_as_the_jvm_passes_them(written: bytes) -> io.BytesIO:
    """Keep every second frame of what the map side wrote: the JVM partitions on the key
    frames and hands the reducer the record frames only (PySpark's ``valueOfPair``)."""
    kept, position, index = io.BytesIO(), 0, 0
    while position < len(written):
        (length,) = struct.unpack_from("!i", written, position)
        if index % 2 == 1:
            kept.write(written[position : position + 4 + length])
        position += 4 + length
        index += 1
    kept.seek(0)
    return kept


def header_length(written: bytes) -> int:
    """Length of the first record's pickled header (after the key frame and its length)."""
    return struct.unpack_from("!I", written, 4 + 8 + 4)[0]


def test_pairs_survive_the_round_trip_with_their_arrays_outside_the_pickle():
    serializer = array_shuffle.OutOfBandPairSerializer()
    big = np.arange(1 << 18, dtype=np.float32)
    compressed = wire.encode(big[:1000], "bfloat16")
    pairs = [
        (1, collectives.Piece(0, big.shape, big.dtype.str, wire.encode(big))),
        (0, {"weights": big[::-1].copy(), "scalar": 3.5, "compressed": compressed}),
        (1, "no arrays at all"),
    ]
    written = io.BytesIO()
    serializer.dump_stream(iter(pairs), written)

    assert header_length(written.getvalue()) < 1024  # the 1 MB array is not in the pickle
    received = list(serializer.load_stream(values_as_the_jvm_passes_them(written.getvalue())))

    assert [key for key, _ in received] == [1, 0, 1]
    np.testing.assert_array_equal(wire.decode(received[0][1].payload), big)
    np.testing.assert_array_equal(received[1][1]["weights"], big[::-1])
    np.testing.assert_array_equal(
        wire.decode(received[1][1]["compressed"]), wire.decode(compressed)
    )
    assert received[1][1]["scalar"] == 3.5
    assert received[2][1] == "no arrays at all"


def test_a_record_over_sparks_limit_is_refused_with_the_owner(monkeypatch):
    monkeypatch.setattr(array_shuffle, "MAX_RECORD_BYTES", 1000)
    serializer = array_shuffle.OutOfBandPairSerializer()
    with pytest.raises(ValueError, match="owner 2 holds .* use more partitions"):
        serializer.dump_stream(iter([(2, np.zeros(1000))]), io.BytesIO())


def test_a_cut_stream_is_an_error_not_a_short_array():
    serializer = array_shuffle.OutOfBandPairSerializer()
    written = io.BytesIO()
    serializer.dump_stream(iter([(0, np.ones(100))]), written)
    cut = values_as_the_jvm_passes_them(written.getvalue()).getvalue()[:-10]
    with pytest.raises(EOFError, match="cut short"):
        list(serializer.load_stream(io.BytesIO(cut)))


@pytest.mark.spark
def test_shuffle_to_owners_partitions_as_partition_by_does(sc):
    rows = [(owner, np.full(3, 10.0 * rank + owner)) for rank in range(3) for owner in range(2)]
    source = sc.parallelize(rows, 3)

    ours = collectives.shuffle_to_owners(source, 2).glom().collect()
    pysparks = source.partitionBy(2, collectives.owner_partition).glom().collect()

    def by_value(partition):
        return sorted((owner, array.tolist()) for owner, array in partition)

    assert [by_value(part) for part in ours] == [by_value(part) for part in pysparks]
    assert all(owner == partition for partition, part in enumerate(ours) for owner, _ in part)


@pytest.mark.spark
def test_an_rdd_already_partitioned_by_owner_is_not_shuffled_again(sc):
    shuffled = collectives.shuffle_to_owners(sc.parallelize([(0, 1), (1, 2)], 2), 2)
    assert collectives.shuffle_to_owners(shuffled, 2) is shuffled
    pickled = sc.parallelize([(0, 1)], 1).partitionBy(2, collectives.owner_partition)
    assert collectives.shuffle_to_owners(pickled, 2) is pickled


@pytest.mark.spark
def test_an_owner_outside_the_partitions_is_named(sc):
    bad = collectives.shuffle_to_owners(sc.parallelize([(5, np.zeros(2))], 1), 2)
    with pytest.raises(Exception, match=r"owner must be an int in \[0, 2\), got 5"):
        bad.collect()
