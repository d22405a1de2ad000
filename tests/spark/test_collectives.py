"""Collectives over RDD partitions, against NumPy, for N = 1..8 partitions.

Every hypothesis example runs Spark jobs (about 0.1-0.5 s each in local[2]), so the example
counts are small; the strategies aim them at the edges: one partition, more partitions than
elements, lengths not divisible by N, uneven sizes where the collective allows them.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bigdl_py.optim.sharding import all_slice_bounds
from bigdl_py.spark import collectives

pytestmark = pytest.mark.spark

SPARK_SETTINGS = settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64]


@st.composite
def rank_arrays(draw, equal_sizes=True, max_partitions=8):
    """N arrays of small integers (exact in every dtype, so reductions compare exactly)."""
    count = draw(st.integers(1, max_partitions))
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    if equal_sizes:
        shape = draw(st.sampled_from([(0,), (1,), (7,), (13,), (3, 5), (2, 3, 4), (37,)]))
        shapes = [shape] * count
    else:
        shapes = [(draw(st.integers(0, 12)),) for _ in range(count)]
    return [rng.integers(-100, 100, size=shape).astype(dtype) for shape in shapes]


def numpy_reduce(arrays, op):
    """NumPy's answer, with the collectives' dtype rules (float16 accumulates in float32)."""
    dtype = arrays[0].dtype
    stack = np.stack([a.astype(np.float32) if dtype == np.float16 else a for a in arrays])
    if op == "sum":
        return stack.sum(axis=0).astype(dtype)
    if op == "mean":
        return stack.mean(axis=0).astype(dtype if np.issubdtype(dtype, np.inexact) else np.float64)
    return (stack.max(axis=0) if op == "max" else stack.min(axis=0)).astype(dtype)


def assert_same(actual, expected):
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    if np.issubdtype(expected.dtype, np.floating):
        tolerance = 1e-3 if expected.dtype == np.float16 else 1e-6
        np.testing.assert_allclose(actual, expected, rtol=tolerance)
    else:
        np.testing.assert_array_equal(actual, expected)


@SPARK_SETTINGS
@given(
    rank_arrays(),
    st.sampled_from(collectives.REDUCE_OPS),
    st.sampled_from(collectives.ALL_GATHER_ROUTES),
)
def test_all_reduce_gives_every_partition_the_reduction(sc, arrays, op, via):
    assert_every_partition_gets_the_reduction(sc, arrays, op, via=via)


@SPARK_SETTINGS
@given(
    rank_arrays(max_partitions=4),
    st.sampled_from(collectives.REDUCE_OPS),
    st.sampled_from(["reduce_scatter", "all_to_all"]),
)
def test_both_all_reduce_algorithms_give_every_partition_the_reduction(sc, arrays, op, algorithm):
    assert_every_partition_gets_the_reduction(sc, arrays, op, algorithm=algorithm)


def assert_every_partition_gets_the_reduction(sc, arrays, op, **options):
    result_rdd = collectives.all_reduce(collectives.scatter(sc, arrays), op, **options)
    results = result_rdd.collect()
    collectives.release(result_rdd)
    assert len(results) == len(arrays)
    expected = numpy_reduce(arrays, op)
    for result in results:
        assert_same(result, expected)


@SPARK_SETTINGS
@given(
    st.integers(1, 4),
    st.sampled_from([(1,), (7,), (13,), (3, 5), (1001,)]),
    st.sampled_from([np.float32, np.float64]),
    st.sampled_from([None, "float32", "float16", "bfloat16"]),
    st.sampled_from(["sum", "mean"]),
    st.integers(0, 2**31 - 1),
)
def test_all_reduce_algorithms_are_bit_identical(sc, count, shape, dtype, wire_dtype, op, seed):
    """Both add in rank order and round the result through the wire dtype once more, so
    "auto" may pick either without changing a bit (here with scales far apart, where the
    order of float additions shows)."""
    rng = np.random.default_rng(seed)
    scales = 10.0 ** rng.integers(-4, 4, size=count)
    arrays = [(rng.standard_normal(shape) * scale).astype(dtype) for scale in scales]
    rdd = collectives.scatter(sc, arrays)
    owners = collectives.all_reduce(rdd, op, wire_dtype, algorithm="reduce_scatter").collect()
    everyone = collectives.all_reduce(rdd, op, wire_dtype, algorithm="all_to_all").collect()
    for left, right in zip(owners, everyone, strict=True):
        assert left.dtype == right.dtype == dtype and left.shape == right.shape == shape
        np.testing.assert_array_equal(left, right)
        np.testing.assert_array_equal(left, owners[0])


def test_auto_sends_whole_arrays_to_everyone_only_for_few_ranks_and_small_arrays():
    choose = collectives.all_reduce_algorithm
    mib = 1 << 20
    assert choose(1) == choose(2) == "all_to_all"  # size unknown
    assert choose(2, nbytes=64 * mib) == "all_to_all"
    assert choose(2, nbytes=64 * mib + 1) == "reduce_scatter"
    assert choose(3) == choose(4) == "reduce_scatter"
    assert choose(4, nbytes=4 * mib) == "all_to_all"
    assert choose(4, nbytes=16 * mib) == "reduce_scatter"
    assert choose(5, nbytes=1) == "reduce_scatter"
    assert choose(2, via="broadcast") == "reduce_scatter"
    # compressed wires: only at N <= 2 and for known sizes up to 16 MiB
    assert choose(2, wire_dtype="float32") == "all_to_all"  # float32 is uncompressed
    assert choose(2, wire_dtype="bfloat16") == "reduce_scatter"
    assert choose(2, nbytes=16 * mib, wire_dtype="float16") == "all_to_all"
    assert choose(2, nbytes=16 * mib + 1, wire_dtype="bfloat16") == "reduce_scatter"
    assert choose(4, nbytes=1, wire_dtype="bfloat16") == "reduce_scatter"


def test_auto_with_a_size_hint_gives_the_reduction(sc, rng):
    arrays = [rng.standard_normal(10).astype(np.float32) for _ in range(3)]
    rdd = collectives.scatter(sc, arrays)
    small = collectives.all_reduce(rdd, nbytes=arrays[0].nbytes).collect()
    expected = collectives.all_reduce(rdd, algorithm="reduce_scatter").first()
    for result in small:
        np.testing.assert_array_equal(result, expected)


@SPARK_SETTINGS
@given(rank_arrays(), st.sampled_from(collectives.REDUCE_OPS))
def test_reduce_scatter_leaves_balanced_slice_j_on_partition_j(sc, arrays, op):
    rdd = collectives.reduce_scatter(collectives.scatter(sc, arrays), op)
    slices = rdd.glom().collect()
    expected = numpy_reduce(arrays, op).reshape(-1)
    bounds = all_slice_bounds(expected.size, len(arrays))
    assert [len(partition) for partition in slices] == [1] * len(arrays)
    for (piece,), (start, stop) in zip(slices, bounds, strict=True):
        assert_same(piece, expected[start:stop])
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1


@SPARK_SETTINGS
@given(rank_arrays(), st.sampled_from(collectives.REDUCE_OPS))
def test_reduce_returns_the_reduction_to_the_driver(sc, arrays, op):
    assert_same(collectives.reduce(collectives.scatter(sc, arrays), op), numpy_reduce(arrays, op))


@SPARK_SETTINGS
@given(
    rank_arrays(equal_sizes=False), st.sampled_from(collectives.ALL_GATHER_ROUTES), st.booleans()
)
def test_all_gather_allows_uneven_sizes(sc, arrays, via, concatenate):
    result_rdd = collectives.all_gather(collectives.scatter(sc, arrays), concatenate, via=via)
    partitions = result_rdd.glom().collect()
    collectives.release(result_rdd)
    assert len(partitions) == len(arrays)
    for (gathered,) in partitions:
        if concatenate:
            np.testing.assert_array_equal(gathered, np.concatenate(arrays))
            assert gathered.dtype == arrays[0].dtype
        else:
            assert len(gathered) == len(arrays)
            for received, sent in zip(gathered, arrays, strict=True):
                assert received.dtype == sent.dtype and received.shape == sent.shape
                np.testing.assert_array_equal(received, sent)


@SPARK_SETTINGS
@given(rank_arrays(equal_sizes=False))
def test_scatter_then_gather_is_the_identity(sc, arrays):
    gathered = collectives.gather(collectives.scatter(sc, arrays))
    assert len(gathered) == len(arrays)
    for received, sent in zip(gathered, arrays, strict=True):
        assert received.dtype == sent.dtype
        np.testing.assert_array_equal(received, sent)


@SPARK_SETTINGS
@given(st.integers(0, 30), st.integers(1, 8))
def test_scatter_of_one_array_cuts_balanced_contiguous_slices(sc, length, count):
    array = np.arange(length, dtype=np.float32)
    partitions = collectives.scatter(sc, array, count).glom().collect()
    assert len(partitions) == count
    for (piece,), (start, stop) in zip(partitions, all_slice_bounds(length, count), strict=True):
        np.testing.assert_array_equal(piece, array[start:stop])


@SPARK_SETTINGS
@given(st.integers(1, 8), st.sampled_from([(), (5,), (2, 3)]))
def test_broadcast_gives_every_partition_a_read_only_copy(sc, count, shape):
    array = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    result_rdd = collectives.broadcast(sc, array, count)
    partitions = (
        result_rdd.mapPartitions(lambda it: [(a, a.flags.writeable) for a in it]).glom().collect()
    )
    collectives.release(result_rdd)
    assert len(partitions) == count
    for ((received, writeable),) in partitions:
        np.testing.assert_array_equal(received, array)
        assert not writeable


def test_broadcast_takes_the_partition_count_from_an_rdd(sc):
    source = collectives.scatter(sc, [np.zeros(1)] * 3)
    result_rdd = collectives.broadcast(source, np.ones(2))
    assert result_rdd.getNumPartitions() == 3
    assert len(collectives.broadcasts_of(result_rdd)) == 1
    collectives.release(result_rdd)
    assert collectives.broadcasts_of(result_rdd) == []


def test_float_sums_of_non_integers_match_numpy(sc, rng):
    arrays = [rng.standard_normal(1001).astype(np.float32) for _ in range(5)]
    result = collectives.all_reduce(collectives.scatter(sc, arrays), "sum").first()
    np.testing.assert_allclose(result, np.sum(arrays, axis=0), rtol=1e-5, atol=1e-6)


def test_nan_propagates_through_max_like_numpy(sc):
    arrays = [np.array([1.0, np.nan, 3.0]), np.array([np.nan, 2.0, 1.0])]
    result = collectives.reduce(collectives.scatter(sc, arrays), "max")
    np.testing.assert_array_equal(result, np.max(np.stack(arrays), axis=0))


@pytest.mark.parametrize("algorithm", ["reduce_scatter", "all_to_all"])
def test_owners_add_in_rank_order_whatever_the_arrival_order(sc, rng, algorithm):
    """Float addition is not associative: owners sort what they receive by rank, so the
    result is bit-identical to a sequential sum in rank order on every run."""
    scales = 10.0 ** rng.integers(-4, 4, size=6)
    arrays = [(rng.standard_normal(257) * scale).astype(np.float32) for scale in scales]
    sequential = arrays[0].copy()
    for array in arrays[1:]:
        sequential += array
    rdd = collectives.scatter(sc, arrays)
    for _ in range(2):
        np.testing.assert_array_equal(collectives.reduce(rdd, "sum"), sequential)
        for result in collectives.all_reduce(rdd, "sum", algorithm=algorithm).collect():
            np.testing.assert_array_equal(result, sequential)
