"""torch.distributed's collectives over the partitions of an RDD, from Spark's own primitives.

Rank ``i`` is partition ``i`` of an RDD whose partitions hold ONE NumPy array each (the rank's
tensor); :func:`scatter` makes such an RDD from driver arrays. The collectives:

============================  =====================================================  =======
call                          result                                                 jobs
============================  =====================================================  =======
``broadcast(sc_or_rdd, a)``   RDD: every partition holds ``a`` (read-only)           0
``scatter(sc, arrays)``       RDD: partition i holds ``arrays[i]``                   0
``reduce_scatter(rdd, op)``   RDD: partition j holds slice j of the reduction (1-D)  lazy
``all_gather(rdd)``           RDD: every partition holds every rank's array          lazy*
``all_reduce(rdd, op)``       RDD: every partition holds the reduction               lazy*
``reduce(rdd, op)``           the reduction, on the driver                           1
``gather(rdd)``               every rank's array, on the driver, in rank order       1
``barrier(rdd, fn)``          RDD: ``fn(array, context)`` run by all ranks at once   lazy
============================  =====================================================  =======

(*) With ``via="broadcast"`` the all-gather collects the N slices to the driver (one job,
M bytes), concatenates them and broadcasts the result; the default ``via="shuffle"`` stays
lazy: a second shuffle addressed to every partition.

How reduction works — BigDL's AllReduceParameter in Spark's vocabulary: every rank cuts its
flattened array into N balanced contiguous slices (``bigdl_py.optim.sharding.slice_bounds``:
sizes differ by at most one, any length works) and sends slice j to partition j through one
shuffle whose partitioner maps key j to partition j (:func:`owner_partition`). Owner j
combines the N slices it receives in rank order, so results do not depend on the order in
which shuffle blocks arrive. The driver never adds anything. ``all_reduce`` is that
reduce-scatter followed by an all-gather of the reduced slices or, for few ranks and small
arrays, one shuffle of every whole array to every rank (see :func:`all_reduce_algorithm`).

Operations ``op``: ``"sum"``, ``"mean"``, ``"max"``, ``"min"``. Results keep the input dtype
(``mean`` of integers is float64, as in NumPy); float16 inputs are summed in float32.
``wire_dtype="float16"`` or ``"bfloat16"`` compresses float slices on the wire (see
``bigdl_py.spark.wire``); receivers widen them before combining. In ``all_reduce`` both
shuffles use the wire dtype, so the result carries two roundings.

Results built from a driver broadcast hold it until :func:`release` is called on them; the
driver keeps a temporary file of the broadcast value until then.

The per-rank building blocks of the reduce-scatter, :func:`pieces_for_owners` and
:func:`combine_owned_pieces`, are public so that a trainer can fuse them with its own
stages in one Spark job.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from bigdl_py import backend
from bigdl_py.optim.sharding import slice_bounds
from bigdl_py.spark import shuffle_records, wire
from bigdl_py.spark.session import task_slots

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext
    from pyspark.core.broadcast import Broadcast

REDUCE_OPS = ("sum", "mean", "max", "min")
ALL_GATHER_ROUTES = ("shuffle", "broadcast")
ALL_REDUCE_ALGORITHMS = ("auto", "reduce_scatter", "all_to_all")
# all_reduce(algorithm="auto") sends every whole array to every rank at N <= 2 up to
# this many bytes per rank (unknown sizes count as small), and at N = 3..4 only for
# known sizes up to ALL_TO_ALL_MAX_BYTES_4 (all_reduce_algorithm's measurements).
ALL_TO_ALL_MAX_BYTES_2 = 64 << 20
ALL_TO_ALL_MAX_BYTES_4 = 4 << 20
# On a float16 or bfloat16 wire: at N <= 2 and known sizes only.
ALL_TO_ALL_MAX_BYTES_COMPRESSED = 16 << 20

# Attribute of an RDD that keeps the driver broadcasts its partitions read.
_BROADCASTS_ATTRIBUTE = "_bigdl_py_broadcasts"


class Piece(NamedTuple):
    """What rank ``rank`` sends one owner: a slice of its array, and what it was cut from."""

    rank: int
    shape: tuple[int, ...]
    dtype: str
    payload: wire.WireArray


def shuffle_to_owners(rdd: RDD, count: int, task_profile: Any = None) -> RDD:
    """``(owner, value)`` pairs to partition ``owner``: ``rdd.partitionBy(count, owner_partition)``.

    The one shuffle every collective and training mode uses. PySpark pickles each bucket on
    the way in and out. Values of more than ``shuffle_records.SPLIT_ABOVE`` bytes cross in
    records of ``shuffle_records.CHUNK_BYTES`` and are put back together before the next
    stage sees them (:mod:`bigdl_py.spark.shuffle_records` says why and what it saves).
    A serializer that moved array buffers unpickled was built and measured: no gain
    (``bench/RESULTS.md``), and it needed PySpark's private JVM classes (``PairwiseRDD``,
    ``PythonPartitioner``). We keep to the public API.

    The JVM side is tuned by settings too: with bigdl_py's recommended ones (Kryo,
    ``spark.shuffle.sort.bypassMergeThreshold=1``) Spark writes the records with its
    serialized shuffle writer, 4-6x less shuffle-write time than the bypass-merge writer
    it picks by default (``bigdl_py.spark.session.RECOMMENDED_CONF``).

    ``task_profile`` (a ``pyspark.resource.ResourceProfile``), when given, is the reading
    stage's: it is set on the shuffle's output RDD, the first of that stage, where it does
    not stop PySpark from pipelining the stage's Python functions into one.
    """
    partitioner = rdd.partitioner
    if (
        partitioner is not None
        and partitioner.numPartitions == count
        and partitioner.partitionFunc is owner_partition
    ):
        return rdd  # already where partitionBy would put it: no shuffle, nothing to split
    split = functools.partial(
        shuffle_records.split_large_values,
        chunk_bytes=shuffle_records.CHUNK_BYTES,
        split_above=shuffle_records.SPLIT_ABOVE,
    )
    partitioned = rdd.mapPartitionsWithIndex(split).partitionBy(count, owner_partition)
    if task_profile is not None:
        partitioned = partitioned.withResources(task_profile)
    return partitioned.mapPartitions(shuffle_records.join_large_values, preservesPartitioning=True)


def owner_partition(key: int) -> int:
    """The shuffle's partition function: key ``j`` goes to partition ``j``.

    One module-level function (not a lambda) so that Spark sees two RDDs partitioned by it
    as co-partitioned and skips a second shuffle.
    """
    return key


def _check_op(op: str, operation: str) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"{operation}: op must be one of {REDUCE_OPS}, got {op!r}")


def _check_route(via: str, operation: str) -> None:
    if via not in ALL_GATHER_ROUTES:
        raise ValueError(f"{operation}: via must be one of {ALL_GATHER_ROUTES}, got {via!r}")


def single_array(partition: int, iterator: Iterable[Any], operation: str) -> np.ndarray:
    """The one array of a partition; reads the whole iterator (a PySpark task that leaves
    input unread loses its Python worker).

    Raises
    ------
    ValueError
        If the partition holds no element, more than one, or something that is not an array.
    """
    items = list(iterator)
    if len(items) != 1:
        raise ValueError(
            f"{operation}: partition {partition} holds {len(items)} elements; the "
            f"collectives need exactly one array per partition (see scatter())"
        )
    array = items[0]
    if not hasattr(array, "dtype") or not hasattr(array, "shape"):
        raise ValueError(
            f"{operation}: partition {partition} holds a {type(array).__name__}, not an array"
        )
    return backend.as_numpy(array)


# --- reduce-scatter: the building blocks ------------------------------------------------------


def pieces_for_owners(
    rank: int, array: Any, count: int, wire_dtype: str | None = None
) -> Iterator[tuple[int, Piece]]:
    """``(owner j, Piece)`` for j in ``range(count)``: slice j of the flattened ``array``
    (BigDL's *putGradients*)."""
    host = np.asarray(backend.as_numpy(array))
    flat = host.reshape(-1)
    for owner in range(count):
        start, stop = slice_bounds(flat.size, owner, count)
        payload = wire.encode(flat[start:stop], wire_dtype)
        yield owner, Piece(rank, host.shape, host.dtype.str, payload)


def whole_piece(rank: int, array: Any, wire_dtype: str | None = None) -> Piece:
    """The whole flattened ``array`` as one Piece, for an all-to-all in which every rank
    sends its array to every rank (each receiver combines them with
    :func:`combine_owned_pieces`)."""
    host = np.asarray(backend.as_numpy(array))
    return Piece(rank, host.shape, host.dtype.str, wire.encode(host.reshape(-1), wire_dtype))


def _accumulator_dtype(dtype: np.dtype) -> np.dtype:
    # float16 sums in float32 (its 11-bit mantissa loses small addends fast).
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def combine(arrays: Sequence[np.ndarray], op: str) -> np.ndarray:
    """Combine same-shaped arrays element-wise with ``op``, in the order given.

    ``sum`` and ``mean`` accumulate in the input dtype (float32 for float16 inputs); ``mean``
    of integers is float64. The result is a new array; the inputs are not modified.
    """
    _check_op(op, "combine")
    dtype = np.asarray(arrays[0]).dtype
    if op in ("max", "min"):
        function = np.maximum if op == "max" else np.minimum
        result = np.array(arrays[0], copy=True)
        for array in arrays[1:]:
            function(result, array, out=result)
        return result
    accumulator = _accumulator_dtype(dtype)
    if len(arrays) == 1:
        total = np.array(arrays[0], dtype=accumulator, copy=True)
    else:
        # The first addition allocates the result: one pass less than copying arrays[0].
        total = np.add(arrays[0], arrays[1], dtype=accumulator, casting="unsafe")
    for array in arrays[2:]:
        np.add(total, array, out=total, casting="unsafe")
    if op == "mean":
        out_dtype = np.float64 if not np.issubdtype(dtype, np.inexact) else dtype
        return (total / len(arrays)).astype(out_dtype, copy=False)
    return total.astype(dtype, copy=False)


def combine_owned_pieces(
    owner: int, pieces: Iterable[Piece], count: int, op: str, operation: str = "reduce_scatter"
) -> tuple[tuple[int, ...], np.ndarray]:
    """Owner ``owner``'s reduced slice from the pieces of all ``count`` ranks.

    Returns the shape of the arrays the slices were cut from, and the reduced slice.

    Raises
    ------
    ValueError
        If a rank's piece is missing or repeated, or ranks hold arrays of different sizes
        or dtypes (the message names the partitions).
    """
    by_rank = sorted(pieces, key=lambda piece: piece.rank)
    ranks = [piece.rank for piece in by_rank]
    if ranks != list(range(count)):
        raise ValueError(
            f"{operation}: owner {owner} received slices from ranks {ranks}, expected one "
            f"from each of the {count} ranks"
        )
    first = by_rank[0]
    for piece in by_rank[1:]:
        if int(np.prod(piece.shape)) != int(np.prod(first.shape)) or piece.dtype != first.dtype:
            raise ValueError(
                f"{operation}: every partition must hold an array of the same size and "
                f"dtype; partition {first.rank} holds shape {first.shape} {np.dtype(first.dtype)}"
                f" but partition {piece.rank} holds shape {piece.shape} {np.dtype(piece.dtype)}"
            )
    slices = [wire.decode(piece.payload) for piece in by_rank]
    return first.shape, combine(slices, op)


def _reduce_scatter_with_shapes(rdd: RDD, op: str, wire_dtype: str | None, operation: str):
    """RDD whose partition j holds ``(shape, reduced slice j)``."""
    _check_op(op, operation)
    wire.check_wire_dtype(wire_dtype)
    count = rdd.getNumPartitions()

    def cut(rank, iterator):
        array = single_array(rank, iterator, operation)
        return pieces_for_owners(rank, array, count, wire_dtype)

    def reduce_owned(owner, iterator):
        yield combine_owned_pieces(owner, (piece for _, piece in iterator), count, op, operation)

    return shuffle_to_owners(rdd.mapPartitionsWithIndex(cut), count).mapPartitionsWithIndex(
        reduce_owned, preservesPartitioning=True
    )


def reduce_scatter(rdd: RDD, op: str = "sum", wire_dtype: str | None = None) -> RDD:
    """Reduce every rank's array with ``op`` and leave slice j of the result on partition j.

    Parameters
    ----------
    rdd : pyspark.RDD
        N partitions, one array each; all of the same size and dtype (shapes may differ
        as long as the sizes agree: the arrays are flattened).
    op : {"sum", "mean", "max", "min"}
    wire_dtype : {None, "float32", "float16", "bfloat16"}
        Compression of the slices on the wire.

    Returns
    -------
    pyspark.RDD
        N partitions; partition j holds the 1-D slice ``slice_bounds(size, j, N)`` of the
        flattened reduction (balanced contiguous slices, sizes differ by at most one; empty
        when N exceeds the size). Lazy: one shuffle when evaluated.
    """
    reduced = _reduce_scatter_with_shapes(rdd, op, wire_dtype, "reduce_scatter")
    return reduced.map(lambda shape_and_slice: shape_and_slice[1], preservesPartitioning=True)


# --- all-gather ------------------------------------------------------------------------------


def payload_for_everyone(rank: int, payload: Any, count: int) -> Iterator[tuple[int, tuple]]:
    """``(partition k, (rank, payload))`` for k in ``range(count)``: the sending half of an
    all-gather, to fuse with a trainer's own stage (BigDL's *sendWeightPartition*)."""
    return ((owner, (rank, payload)) for owner in range(count))


def payloads_by_rank(owner: int, iterator, count: int, operation: str = "all_gather") -> list:
    """The receiving half of an all-gather: the payloads partition ``owner`` received, one
    per rank, in rank order.

    Raises
    ------
    ValueError
        If a rank's payload is missing or repeated (the message names the ranks).
    """
    by_rank = sorted((pair for _, pair in iterator), key=lambda pair: pair[0])
    ranks = [rank for rank, _ in by_rank]
    if ranks != list(range(count)):
        raise ValueError(
            f"{operation}: partition {owner} received arrays from ranks {ranks}, expected "
            f"one from each of the {count} ranks"
        )
    return [payload for _, payload in by_rank]


def _shuffle_to_everyone(rdd: RDD, encode_rank: Callable, operation: str) -> RDD:
    """RDD whose partition k holds the list of every rank's payload, in rank order.

    ``encode_rank(rank, iterator)`` makes rank's payload from its partition; it is pickled
    once per receiving partition (the all-gather moves N copies of every payload).
    """
    count = rdd.getNumPartitions()

    def send(rank, iterator):
        return payload_for_everyone(rank, encode_rank(rank, iterator), count)

    def receive(owner, iterator):
        yield payloads_by_rank(owner, iterator, count, operation)

    return shuffle_to_owners(rdd.mapPartitionsWithIndex(send), count).mapPartitionsWithIndex(
        receive, preservesPartitioning=True
    )


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


def _broadcast_rdd(sc: SparkContext, value: Any, count: int, make_result: Callable) -> RDD:
    """RDD of ``count`` partitions, each ``make_result(broadcast value)``; keeps the broadcast."""
    shared = sc.broadcast(value)

    def read(iterator):
        for _ in iterator:  # drain the (tiny) parallelized input
            pass
        yield make_result(shared.value)

    result = sc.parallelize(range(count), count).mapPartitions(read)
    setattr(result, _BROADCASTS_ATTRIBUTE, [shared])
    return result


def release(rdd: RDD) -> None:
    """Destroy the driver broadcasts a collective's result RDD reads and delete the shuffle
    files behind it (see :func:`delete_shuffle_files`).

    Call it once the result has been used; the RDD cannot be evaluated afterwards.
    """
    for shared in getattr(rdd, _BROADCASTS_ATTRIBUTE, []):
        shared.destroy()
    setattr(rdd, _BROADCASTS_ATTRIBUTE, [])
    delete_shuffle_files(rdd)


def delete_shuffle_files(rdd: RDD) -> None:
    """Ask Spark to delete, now, the shuffles ``rdd`` was computed from (back to its first
    cached ancestors), through the JVM's ``RDD.cleanShuffleDependencies``.

    Otherwise the files stay until the driver JVM's garbage collector lets Spark's
    ContextCleaner see that the RDDs are gone, which takes up to
    ``spark.cleaner.periodicGC.interval``: a trainer running several shuffles a second
    piles up thousands of files meanwhile (``bench/RESULTS.md``, long runs). The deletion
    runs in the background on the executors. Evaluating ``rdd`` again afterwards fails.
    """
    rdd._jrdd.rdd().cleanShuffleDependencies(False)


def _finish_gather(arrays: list[np.ndarray], concatenate: bool):
    if not concatenate:
        return arrays
    for rank, array in enumerate(arrays[1:], start=1):
        if array.dtype != arrays[0].dtype:
            raise ValueError(
                f"all_gather(concatenate=True): partition 0 holds {arrays[0].dtype} but "
                f"partition {rank} holds {array.dtype}; concatenate arrays of one dtype only"
            )
    return np.concatenate([array.reshape(-1) for array in arrays])


def all_gather(
    rdd: RDD,
    concatenate: bool = False,
    wire_dtype: str | None = None,
    via: str = "shuffle",
) -> RDD:
    """Give every partition every rank's array.

    Parameters
    ----------
    rdd : pyspark.RDD
        N partitions, one array each; sizes, shapes and dtypes may differ between ranks.
    concatenate : bool
        False: each partition holds the list of the N arrays in rank order. True: the
        concatenation of the flattened arrays (they must share a dtype).
    wire_dtype : {None, "float32", "float16", "bfloat16"}
    via : {"shuffle", "broadcast"}
        "shuffle" (lazy): every rank sends its array to every partition through a shuffle.
        "broadcast": one job collects the arrays to the driver, which broadcasts them; call
        :func:`release` on the result when done.

    Returns
    -------
    pyspark.RDD
        N partitions.
    """
    _check_route(via, "all_gather")
    wire.check_wire_dtype(wire_dtype)
    count = rdd.getNumPartitions()
    if via == "shuffle":

        def encode_rank(rank, iterator):
            return wire.encode(single_array(rank, iterator, "all_gather"), wire_dtype)

        def finish(payloads):
            return _finish_gather([wire.decode(payload) for payload in payloads], concatenate)

        gathered = _shuffle_to_everyone(rdd, encode_rank, "all_gather")
        return gathered.map(finish, preservesPartitioning=True)
    payloads = rdd.mapPartitionsWithIndex(
        lambda rank, iterator: [wire.encode(single_array(rank, iterator, "all_gather"), wire_dtype)]
    ).collect()
    arrays = [wire.decode(payload) for payload in payloads]
    value = _finish_gather(arrays, concatenate)

    def read_only_copy(shared):
        if isinstance(shared, list):
            return [_read_only(array) for array in shared]
        return _read_only(shared)

    return _broadcast_rdd(rdd.context, value, count, read_only_copy)


# --- all-reduce and reduce ----------------------------------------------------------------


def all_reduce(
    rdd: RDD,
    op: str = "sum",
    wire_dtype: str | None = None,
    via: str = "shuffle",
    algorithm: str = "auto",
    nbytes: int | None = None,
) -> RDD:
    """Reduce every rank's array with ``op``; every partition gets the result.

    Two algorithms (``algorithm``):

    - ``"reduce_scatter"``: a :func:`reduce_scatter` followed by an all-gather of the
      reduced slices (see :func:`all_gather` for ``via``). Every rank sends 2 M bytes in
      two shuffles, whatever N.
    - ``"all_to_all"``: one shuffle in which every rank sends its whole array to every
      partition, and each partition combines the N arrays itself. Every rank sends N M
      bytes: at N = 2 the same bytes as ``"reduce_scatter"``, in one stage, with one
      round trip through the Python workers fewer. ``via="shuffle"`` only.
    - ``"auto"`` (default): :func:`all_reduce_algorithm` picks one by N, ``via``,
      ``nbytes`` and ``wire_dtype``.

    Both combine the N arrays element-wise in rank order and round the result through the
    wire dtype as the all-gather does, so they give bit-identical results and the choice
    of ``"auto"`` never changes a result.

    Parameters
    ----------
    rdd : pyspark.RDD
        N partitions, one array each, all of the same size and dtype.
    op : {"sum", "mean", "max", "min"}
    wire_dtype : {None, "float32", "float16", "bfloat16"}
        Compression on the wire, for both shuffles (the result carries two roundings).
    via : {"shuffle", "broadcast"}
    algorithm : {"auto", "reduce_scatter", "all_to_all"}
    nbytes : int, optional
        Bytes of one rank's array, when the caller knows them: lets ``"auto"`` choose by
        size (the driver does not see the arrays of a lazy RDD).

    Returns
    -------
    pyspark.RDD
        N partitions, each holding the reduced array with the shape of partition 0's array.
    """
    _check_route(via, "all_reduce")
    if algorithm not in ALL_REDUCE_ALGORITHMS:
        raise ValueError(
            f"all_reduce: algorithm must be one of {ALL_REDUCE_ALGORITHMS}, got {algorithm!r}"
        )
    count = rdd.getNumPartitions()
    if algorithm == "auto":
        algorithm = all_reduce_algorithm(count, via, nbytes, wire_dtype)
    if algorithm == "all_to_all":
        if via != "shuffle":
            raise ValueError('all_reduce: algorithm="all_to_all" needs via="shuffle"')
        return _all_to_all_reduce(rdd, op, wire_dtype)
    reduced = _reduce_scatter_with_shapes(rdd, op, wire_dtype, "all_reduce")

    def assemble(slices, shape):
        return np.concatenate([piece.reshape(-1) for piece in slices]).reshape(shape)

    if via == "shuffle":

        def encode_slice(rank, iterator):
            ((shape, piece),) = list(iterator)
            return shape, wire.encode(piece, wire_dtype)

        def finish(shapes_and_payloads):
            shape = shapes_and_payloads[0][0]
            return assemble([wire.decode(payload) for _, payload in shapes_and_payloads], shape)

        gathered = _shuffle_to_everyone(reduced, encode_slice, "all_reduce")
        return gathered.map(finish, preservesPartitioning=True)
    pairs = reduced.map(lambda pair: (pair[0], wire.encode(pair[1], wire_dtype))).collect()
    value = assemble([wire.decode(payload) for _, payload in pairs], pairs[0][0])
    return _broadcast_rdd(rdd.context, value, count, _read_only)


def all_reduce_algorithm(
    count: int, via: str = "shuffle", nbytes: int | None = None, wire_dtype: str | None = None
) -> str:
    """The algorithm ``all_reduce(algorithm="auto")`` uses for N = ``count`` ranks of
    ``nbytes`` bytes each (None: unknown) on ``wire_dtype``.

    Uncompressed wire: ``"all_to_all"`` at N <= 2 unless the arrays are known to exceed
    64 MiB, and at N = 3..4 only for arrays known to be at most 4 MiB. Compressed wire
    (float16, bfloat16): ``"all_to_all"`` only at N <= 2 for arrays known to be at most
    16 MiB. ``"reduce_scatter"`` otherwise and with ``via="broadcast"``.

    Measured with both algorithms alternated in one warm JVM (``bench/RESULTS.md``, "the
    AllReduce in one shuffle for few ranks", which has the table).

    Small arrays gain a stage and a Python round trip; at N = 4 every rank sends 4 M
    bytes instead of 2 M, which costs more than the stage from 16 MB on; large arrays
    lose even at N = 2 (same bytes; each receiver holds N whole arrays at once, which
    we take to be the cause, not measured). An unknown size at N <= 2 counts as small:
    sizes up to 64 MB win or tie. N = 3 was not measured and takes N = 4's rule; N > 4
    keeps ``"reduce_scatter"``. On a compressed wire ("bf16" rows, 4 runs) every receiver
    widens N whole arrays and rounds the whole result again, where the owners of
    ``"reduce_scatter"`` widen and add slices of M / N: twice the conversion and addition
    work at N = 2, which outweighs the stage from 64 MB on.
    """
    if via != "shuffle":
        return "reduce_scatter"
    if wire.check_wire_dtype(wire_dtype) is not None:
        known_small = nbytes is not None and nbytes <= ALL_TO_ALL_MAX_BYTES_COMPRESSED
        return "all_to_all" if count <= 2 and known_small else "reduce_scatter"
    if count <= 2 and (nbytes is None or nbytes <= ALL_TO_ALL_MAX_BYTES_2):
        return "all_to_all"
    if count <= 4 and nbytes is not None and nbytes <= ALL_TO_ALL_MAX_BYTES_4:
        return "all_to_all"
    return "reduce_scatter"


def _all_to_all_reduce(rdd: RDD, op: str, wire_dtype: str | None) -> RDD:
    """all_reduce in one shuffle: partition k receives every rank's whole array."""
    _check_op(op, "all_reduce")
    wire_dtype = wire.check_wire_dtype(wire_dtype)
    count = rdd.getNumPartitions()

    def send(rank, iterator):
        # Encoded once; PySpark pickles the same Piece into each partition's bucket.
        piece = whole_piece(rank, single_array(rank, iterator, "all_reduce"), wire_dtype)
        return ((owner, piece) for owner in range(count))

    def receive(owner, iterator):
        pieces = (piece for _, piece in iterator)
        shape, total = combine_owned_pieces(owner, pieces, count, op, "all_reduce")
        if wire_dtype is not None:
            # The reduce_scatter route sends the reduced slices over the wire once more;
            # the same rounding here keeps the two algorithms bit-identical.
            total = wire.round_to_wire(total, wire_dtype)
        yield total.reshape(shape)

    return shuffle_to_owners(rdd.mapPartitionsWithIndex(send), count).mapPartitionsWithIndex(
        receive, preservesPartitioning=True
    )


def reduce(rdd: RDD, op: str = "sum", wire_dtype: str | None = None) -> np.ndarray:
    """Reduce every rank's array with ``op`` and return the result to the driver.

    The owners reduce their slices (a reduce-scatter); the driver only concatenates the N
    reduced slices it collects (M bytes).

    Returns
    -------
    numpy.ndarray
        The reduction, with the shape of partition 0's array.
    """
    reduced = _reduce_scatter_with_shapes(rdd, op, wire_dtype, "reduce")
    pairs = reduced.collect()
    return np.concatenate([piece.reshape(-1) for _, piece in pairs]).reshape(pairs[0][0])


# --- driver <-> ranks ---------------------------------------------------------------------


def broadcast(sc_or_rdd: SparkContext | RDD, array: Any, count: int | None = None) -> RDD:
    """RDD of N partitions, each holding (a read-only view of) ``array``, sent by broadcast.

    Parameters
    ----------
    sc_or_rdd : SparkContext or RDD
        With an RDD, N is its number of partitions.
    array : array
    count : int, optional
        N when a SparkContext is given; defaults to :func:`task_slots`.

    Call :func:`release` on the result when done with it.
    """
    if hasattr(sc_or_rdd, "getNumPartitions"):
        sc, count = sc_or_rdd.context, sc_or_rdd.getNumPartitions()
    else:
        sc = sc_or_rdd
        count = task_slots(sc) if count is None else count
    if count < 1:
        raise ValueError(f"broadcast: partition count must be >= 1, got {count}")
    return _broadcast_rdd(sc, backend.as_numpy(array), count, _read_only)


def scatter(sc: SparkContext, arrays: Sequence[Any] | np.ndarray, count: int | None = None) -> RDD:
    """RDD whose partition i holds rank i's array.

    Parameters
    ----------
    sc : SparkContext
    arrays : sequence of arrays, or one array
        A sequence gives one array per partition (N = its length). One array is flattened
        and cut into ``count`` balanced contiguous slices (the layout of
        :func:`reduce_scatter`).
    count : int, optional
        N for a single array; defaults to :func:`task_slots`. Must match the sequence's
        length when given with a sequence.
    """
    if isinstance(arrays, np.ndarray) or backend.is_cupy_array(arrays):
        flat = backend.as_numpy(arrays).reshape(-1)
        count = task_slots(sc) if count is None else count
        if count < 1:
            raise ValueError(f"scatter: partition count must be >= 1, got {count}")
        parts = [flat[slice(*slice_bounds(flat.size, i, count))].copy() for i in range(count)]
    else:
        parts = [backend.as_numpy(array) for array in arrays]
        if not parts:
            raise ValueError("scatter: got an empty sequence of arrays")
        if count is not None and count != len(parts):
            raise ValueError(f"scatter: count={count} but {len(parts)} arrays were given")
    return sc.parallelize(parts, len(parts))


def gather(rdd: RDD) -> list[np.ndarray]:
    """Every rank's array on the driver, in rank order (one job)."""
    payloads = rdd.mapPartitionsWithIndex(
        lambda rank, iterator: [wire.encode(single_array(rank, iterator, "gather"))]
    ).collect()
    return [wire.decode(payload) for payload in payloads]


def barrier(rdd: RDD, fn: Callable[[np.ndarray, Any], Any] | None = None) -> RDD:
    """Run all ranks at once in a Spark barrier stage and synchronise them before ``fn``.

    Parameters
    ----------
    rdd : pyspark.RDD
        N partitions, one array each. N must not exceed the cluster's task slots.
    fn : callable, optional
        ``fn(array, context)`` runs in every partition after all partitions reached the
        barrier; ``context`` is the ``pyspark.BarrierTaskContext`` (``context.barrier()``,
        ``context.allGather(message)``, ``context.partitionId()``). Its return value is the
        partition's new element. Without ``fn`` the array passes through.

    Returns
    -------
    pyspark.RDD
        Lazy; evaluating it runs the barrier stage (all tasks launch together or not at all).

    Raises
    ------
    ValueError
        If N exceeds the task slots of the cluster.
    """
    count = rdd.getNumPartitions()
    slots = task_slots(rdd.context)
    if count > slots:
        raise ValueError(
            f"barrier: {count} partitions need {count} concurrent task slots but the cluster "
            f"has {slots} (master {rdd.context.master!r}, spark.task.cpus="
            f"{rdd.context.getConf().get('spark.task.cpus', '1')}); use at most {slots} "
            f"partitions or more cores"
        )

    def run(iterator):
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        array = single_array(context.partitionId(), iterator, "barrier")
        context.barrier()
        yield array if fn is None else fn(array, context)

    return rdd.barrier().mapPartitions(run)


def broadcasts_of(rdd: RDD) -> list[Broadcast]:
    """The driver broadcasts a collective's result RDD holds (empty for lazy results)."""
    return list(getattr(rdd, _BROADCASTS_ATTRIBUTE, []))
