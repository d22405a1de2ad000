"""Collectives: compressed wires, barrier mode, and the errors users will meet."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.spark import collectives

pytestmark = pytest.mark.spark

UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
FLOAT32_EPSILON = 2.0**-23


@pytest.fixture(scope="module")
def normal_arrays():
    rng = np.random.default_rng(7)
    return [rng.standard_normal(1000).astype(np.float32) for _ in range(4)]


def compressed_sum_bound(arrays, wire_dtype, roundings):
    """Bound on |compressed sum - exact sum|: each input rounded once to the wire dtype,
    float32 additions, and ``roundings - 1`` more roundings of the result."""
    unit = UNIT_ROUNDOFF[wire_dtype]
    magnitude = np.sum(np.abs(np.stack(arrays).astype(np.float64)), axis=0)
    tiny = 2.0**-25 if wire_dtype == "float16" else 0.0  # float16's subnormal spacing
    per_input = unit + len(arrays) * FLOAT32_EPSILON
    return magnitude * (per_input + (roundings - 1) * unit * 1.01) + len(arrays) * tiny


@pytest.mark.parametrize("wire_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    ("via", "algorithm"),
    [("shuffle", "reduce_scatter"), ("broadcast", "reduce_scatter"), ("shuffle", "all_to_all")],
)
def test_all_reduce_on_a_compressed_wire_stays_within_the_rounding_bound(
    sc, normal_arrays, wire_dtype, via, algorithm
):
    result_rdd = collectives.all_reduce(
        collectives.scatter(sc, normal_arrays),
        "sum",
        wire_dtype=wire_dtype,
        via=via,
        algorithm=algorithm,
    )
    results = result_rdd.collect()
    collectives.release(result_rdd)
    exact = np.sum(np.stack(normal_arrays).astype(np.float64), axis=0)
    bound = compressed_sum_bound(normal_arrays, wire_dtype, roundings=2)
    for result in results:
        assert result.dtype == np.float32
        assert np.all(np.abs(result - exact) <= bound)
    # The bound is not vacuous: compression does change the sum.
    assert np.any(results[0] != np.sum(normal_arrays, axis=0))


@pytest.mark.parametrize("wire_dtype", ["float16", "bfloat16"])
def test_reduce_scatter_on_a_compressed_wire_rounds_once(sc, normal_arrays, wire_dtype):
    slices = collectives.reduce_scatter(
        collectives.scatter(sc, normal_arrays), "sum", wire_dtype=wire_dtype
    ).collect()
    result = np.concatenate(slices)
    exact = np.sum(np.stack(normal_arrays).astype(np.float64), axis=0)
    assert np.all(np.abs(result - exact) <= compressed_sum_bound(normal_arrays, wire_dtype, 1))


def test_all_gather_on_a_compressed_wire_rounds_each_array_once(sc, normal_arrays):
    from bigdl_py.spark import wire

    gathered = collectives.all_gather(
        collectives.scatter(sc, normal_arrays), wire_dtype="bfloat16"
    ).first()
    for received, sent in zip(gathered, normal_arrays, strict=True):
        np.testing.assert_array_equal(received, wire.round_to_wire(sent, "bfloat16"))


def test_barrier_runs_every_partition_at_once(sc):
    arrays = [np.full(3, rank, dtype=np.float32) for rank in range(2)]

    def exchange(array, context):
        # allGather returns only when every task of the stage has called it.
        messages = context.allGather(f"partition {context.partitionId()}")
        return array * 2, sorted(messages)

    results = collectives.barrier(collectives.scatter(sc, arrays), exchange).collect()
    for rank, (doubled, messages) in enumerate(results):
        np.testing.assert_array_equal(doubled, arrays[rank] * 2)
        assert messages == ["partition 0", "partition 1"]


def test_barrier_without_fn_passes_arrays_through(sc):
    arrays = [np.arange(4), np.arange(2)]
    results = collectives.barrier(collectives.scatter(sc, arrays)).collect()
    for result, array in zip(results, arrays, strict=True):
        np.testing.assert_array_equal(result, array)


def test_barrier_needs_a_task_slot_per_partition(sc):
    rdd = collectives.scatter(sc, [np.zeros(1)] * 3)
    with pytest.raises(ValueError, match="3 partitions need 3 concurrent task slots.* has 2"):
        collectives.barrier(rdd)


# --- errors ------------------------------------------------------------------------------------


def _python_exception():
    from pyspark.errors import PythonException

    return PythonException


def test_a_partition_with_two_arrays_is_named(sc):
    rdd = sc.parallelize([np.zeros(2), np.zeros(2), np.zeros(2)], 2)
    with pytest.raises(_python_exception(), match="partition 1 holds 2 elements"):
        collectives.reduce(rdd, "sum")


def test_an_empty_partition_is_named(sc):
    rdd = sc.parallelize([np.zeros(2)], 2)
    with pytest.raises(_python_exception(), match="all_gather: partition 0 holds 0 elements"):
        collectives.all_gather(rdd).collect()


def test_a_partition_holding_something_else_is_named(sc):
    rdd = sc.parallelize([np.zeros(2), [1.0, 2.0]], 2)
    with pytest.raises(_python_exception(), match="partition 1 holds a list, not an array"):
        collectives.gather(rdd)


@pytest.mark.parametrize("algorithm", ["reduce_scatter", "all_to_all"])
def test_ranks_of_different_sizes_cannot_be_reduced(sc, algorithm):
    rdd = collectives.scatter(sc, [np.zeros(3, np.float32), np.zeros(4, np.float32)])
    with pytest.raises(
        _python_exception(),
        match=r"all_reduce: .* partition 0 holds shape \(3,\) float32 but partition 1 "
        r"holds shape \(4,\) float32",
    ):
        collectives.all_reduce(rdd, algorithm=algorithm).collect()


def test_ranks_of_different_dtypes_cannot_be_reduced(sc):
    rdd = collectives.scatter(sc, [np.zeros(3, np.float32), np.zeros(3, np.float64)])
    with pytest.raises(_python_exception(), match="same size and dtype"):
        collectives.reduce_scatter(rdd).collect()


def test_concatenating_arrays_of_different_dtypes_is_named(sc):
    rdd = collectives.scatter(sc, [np.zeros(2, np.float32), np.zeros(3, np.int64)])
    with pytest.raises(_python_exception(), match="partition 1 holds int64"):
        collectives.all_gather(rdd, concatenate=True).collect()
    with pytest.raises(ValueError, match="partition 0 holds float32 but partition 1 holds int64"):
        collectives.all_gather(rdd, concatenate=True, via="broadcast")


def test_compressing_integer_ranks_is_named(sc):
    rdd = collectives.scatter(sc, [np.arange(3), np.arange(3)])
    with pytest.raises(_python_exception(), match="floating-point arrays only; got .* int64"):
        collectives.reduce(rdd, "sum", wire_dtype="float16")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda rdd: collectives.all_reduce(rdd, "prod"), "all_reduce: op must be one of"),
        (lambda rdd: collectives.reduce_scatter(rdd, "avg"), "reduce_scatter: op must be"),
        (lambda rdd: collectives.all_reduce(rdd, via="ring"), "all_reduce: via must be"),
        (lambda rdd: collectives.all_gather(rdd, via="tree"), "all_gather: via must be"),
        (lambda rdd: collectives.all_reduce(rdd, wire_dtype="int8"), "wire_dtype must be"),
        (
            lambda rdd: collectives.all_reduce(rdd, wire_dtype="int8", algorithm="all_to_all"),
            "wire_dtype must be",
        ),
        (
            lambda rdd: collectives.all_reduce(rdd, "prod", algorithm="all_to_all"),
            "all_reduce: op must be one of",
        ),
        (lambda rdd: collectives.all_reduce(rdd, algorithm="ring"), "algorithm must be one of"),
        (
            lambda rdd: collectives.all_reduce(rdd, via="broadcast", algorithm="all_to_all"),
            'algorithm="all_to_all" needs via="shuffle"',
        ),
    ],
)
def test_bad_arguments_fail_on_the_driver_before_any_job(sc, call, message):
    rdd = collectives.scatter(sc, [np.zeros(2), np.zeros(2)])
    with pytest.raises(ValueError, match=message):
        call(rdd)


def test_scatter_checks_its_arguments(sc):
    with pytest.raises(ValueError, match="empty sequence"):
        collectives.scatter(sc, [])
    with pytest.raises(ValueError, match="count=3 but 2 arrays"):
        collectives.scatter(sc, [np.zeros(1), np.zeros(1)], 3)
    with pytest.raises(ValueError, match="partition count must be >= 1, got 0"):
        collectives.scatter(sc, np.zeros(4), 0)


@pytest.mark.parametrize(("algorithm", "shuffles"), [("reduce_scatter", 2), ("all_to_all", 1)])
def test_release_deletes_the_shuffle_files_behind_a_result(sc, normal_arrays, algorithm, shuffles):
    from blob_data import shuffle_files, wait_until_deleted

    before = shuffle_files(sc)
    result_rdd = collectives.all_reduce(
        collectives.scatter(sc, normal_arrays), "sum", algorithm=algorithm
    )
    result_rdd.collect()
    written = shuffle_files(sc) - before
    # reduce_scatter: two shuffles (reduce-scatter, all-gather), all_to_all: one; each of
    # 4 map tasks writes a data file at least
    assert len({path for path in written if path.endswith(".data")}) >= 4 * shuffles
    collectives.release(result_rdd)
    assert wait_until_deleted(written) == set()
