"""Large values cross the shuffle in chunks: split and join without Spark, then through it."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from bigdl_py.spark import collectives, shuffle_records, wire
from bigdl_py.spark.shuffle_records import ChunkedHead


def _through_pickle(pairs):
    # What PySpark does to every pair between the two ends (protocol 5, buffers in band).
    return [pickle.loads(pickle.dumps(pair, protocol=5)) for pair in pairs]


def test_small_values_pass_through_untouched():
    pairs = [(0, np.arange(4.0)), (1, "text"), (0, {"a": 1})]
    out = list(shuffle_records.split_large_values(3, pairs, chunk_bytes=8, split_above=64))
    assert [key for key, _ in out] == [0, 1, 0]
    assert all(sent is given for (_, sent), (_, given) in zip(out, pairs, strict=True))


def test_a_large_value_is_cut_into_chunks_no_larger_than_asked():
    array = np.arange(1000, dtype=np.float32)  # 4000 bytes
    out = list(
        shuffle_records.split_large_values(2, [(1, array)], chunk_bytes=512, split_above=100)
    )
    assert [key for key, _ in out] == [1] * len(out)
    head, chunks = out[0][1], [value for _, value in out[1:]]
    assert isinstance(head, ChunkedHead) and head.value_id == (2, 0)
    assert head.buffer_sizes == (4000,)
    assert len(chunks) == 8
    assert all(memoryview(chunk.data).nbytes <= 512 for chunk in chunks)
    assert [chunk.offset for chunk in chunks] == list(range(0, 4000, 512))


@pytest.mark.parametrize("chunk_bytes", [1, 100, 4096, 1 << 20])
def test_split_then_join_gives_back_every_value(rng, chunk_bytes):
    values = [
        wire.encode(rng.standard_normal(3000).astype(np.float32)),
        ("tuple", rng.standard_normal((20, 30)), [rng.integers(0, 9, 500)]),
        np.float64(3.5),
        wire.encode(rng.standard_normal(2000), "bfloat16"),
    ]
    pairs = [(index % 2, value) for index, value in enumerate(values)]
    sent = _through_pickle(
        shuffle_records.split_large_values(5, pairs, chunk_bytes=chunk_bytes, split_above=1000)
    )
    received = list(shuffle_records.join_large_values(sent))
    assert sorted(key for key, _ in received) == sorted(key for key, _ in pairs)
    by_type = {type(value).__name__: value for _, value in received}
    np.testing.assert_array_equal(wire.decode(received[0][1]), wire.decode(values[0]))
    kind, matrix, (integers,) = by_type["tuple"]
    assert kind == "tuple"
    np.testing.assert_array_equal(matrix, values[1][1])
    np.testing.assert_array_equal(integers, values[1][2][0])
    assert by_type["float64"] == 3.5
    np.testing.assert_array_equal(wire.decode(received[-1][1]), wire.decode(values[3]))


def test_join_accepts_pieces_from_several_senders_in_any_order(rng):
    arrays = {sender: rng.standard_normal(700) for sender in range(3)}
    sent = []
    for sender, array in arrays.items():
        sent += _through_pickle(
            shuffle_records.split_large_values(
                sender, [(0, array)], chunk_bytes=256, split_above=10
            )
        )
    order = rng.permutation(len(sent))
    received = list(shuffle_records.join_large_values([sent[i] for i in order]))
    assert len(received) == 3
    got = sorted((value for _, value in received), key=lambda array: array[0])
    expected = sorted(arrays.values(), key=lambda array: array[0])
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.flags.writeable


def test_an_incomplete_value_is_an_error_naming_its_sender():
    array = np.zeros(1000)
    sent = list(
        shuffle_records.split_large_values(7, [(0, array)], chunk_bytes=1000, split_above=10)
    )
    with pytest.raises(ValueError, match=r"partition\(s\) \[7\] arrived incomplete"):
        list(shuffle_records.join_large_values(sent[:-1]))


def test_chunk_size_must_be_positive():
    with pytest.raises(ValueError, match="chunk_bytes must be positive, got 0"):
        list(shuffle_records.split_large_values(0, [(0, np.zeros(3))], chunk_bytes=0))


@pytest.mark.parametrize("algorithm", ["reduce_scatter", "all_to_all"])
def test_all_reduce_of_arrays_split_into_chunks_is_exact(sc, rng, monkeypatch, algorithm):
    # Chunks of 4 KB above 16 KB: each rank's 120 KB array (all_to_all) or 40 KB slice
    # (reduce_scatter, both shuffles) crosses in 10-30 records.
    monkeypatch.setattr(shuffle_records, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(shuffle_records, "SPLIT_ABOVE", 16384)
    arrays = [rng.standard_normal(30_000).astype(np.float32) for _ in range(3)]
    result = collectives.all_reduce(collectives.scatter(sc, arrays), algorithm=algorithm).collect()
    expected = (arrays[0] + arrays[1]) + arrays[2]
    for array in result:
        np.testing.assert_array_equal(array, expected)
