"""The AllReduce at real model sizes: ``collectives.all_reduce`` against gloo and memcpy.

Run by hand (minutes on a shared 2-core machine)::

    python bench/allreduce.py [run] [--sizes 1 4 16 64 256] [--n 2 4]
                              [--wire float32 bfloat16] [--rounds 3] [--repeats 2]
    python bench/allreduce.py breakdown [--sizes 16 64] [--n 2]
    python bench/allreduce.py compare --setting NAME:key=value,... [--setting ...]
                              [--sizes 16 64] [--n 2] [--rounds 3] [--repeats 2]
    python bench/allreduce.py algorithms [--sizes 1 4 16 64] [--n 2 4]
                              [--wire float32 bfloat16] [--repeats 6]
    python bench/allreduce.py floor [--sizes 1 16 64] [--n 2] [--repeats 7]
    python bench/allreduce.py arrow [--sizes 1 16 64] [--repeats 7]

``run`` starts one SparkSession (``local[2]``, ``get_spark``'s recommended settings; in
local mode the tasks run in the driver JVM, whose heap is ``spark.driver.memory`` of
``conf/spark-defaults.conf``) and warms its JVM for under a minute (``--warm-s``). For
every N it also starts N gloo processes (``torch.distributed`` on 127.0.0.1, one thread
each) that stay up for the whole run. For each N, size M (MB of float32 per rank) and wire
dtype, rounds alternate: bigdl_py's all_reduce, then gloo's ``all_reduce`` of arrays with
the same element count (bfloat16 tensors for the bfloat16 wire, if gloo takes them), then
``np.copyto`` of M MB. The table gives medians over all rounds.

bigdl_py's time is that of a job that makes the N arrays inside its tasks, all-reduces them
(sum) and counts the result's elements, minus the median of the same job without the
all_reduce (``make ms``: one task per rank filling its array, and the job's fixed latency).
Gloo's time is the collective alone, measured on rank 0 between barriers.

``breakdown`` follows the bytes of one all_reduce (N = 2, float32 wire): the Python-side
copies and conversions are timed in this process on arrays of the same size (wire encoding,
PySpark's pickling of a shuffle bucket, unpickling, decoding, the owner's sum, the
concatenation), and the JVM side by jobs that stop at successive points of the route
(Python writes its pickled buckets to the JVM; + the shuffle write and fetch, counted in the
JVM; + the socket back to Python and unpickling on the receiving side), with the shuffle
write and fetch-wait times that Spark's stage metrics report (REST API of the driver's UI).

``compare`` A/Bs Spark settings in ONE driver JVM: PySpark keeps its JVM when a SparkContext
stops, so sessions with each ``--setting`` (on top of the recommended settings; an empty one
is the recommended settings alone) take turns, round after round, with a warm JIT. A first
round (of the first setting only, with ``--warm-s`` of all-reduces) warms the JVM and is not
counted. It reports the wall time of the all_reduce (float32 wire, sum), Spark's
shuffle-write time, and the CPU time of the driver JVM and its Python workers together
(from /proc, Linux only): on a shared machine the CPU time moves much less with the load
than the wall time. Settings read when the JVM starts (``spark.driver.memory``, JVM
options) are those of the first session.

``algorithms`` A/Bs ``all_reduce``'s two algorithms (``reduce_scatter``, ``all_to_all``) in
one SparkContext after ``--warm-s`` of all-reduces: for each N, wire dtype and size, one
untimed job of each, then ``--repeats`` pairs alternating which goes first. It reports the
median wall time of the job (making the arrays, all_reduce, counting) and the CPU time of
the JVM and its Python workers; ``collectives.all_reduce_algorithm``'s rule comes from it.

``floor`` measures Spark's own shuffle of an all_reduce's bytes with no Python in it: a Spark
SQL job makes, inside the JVM, the rows an ``all_to_all`` at N ranks sends (binary payloads
of ``shuffle_records.CHUNK_BYTES``, M bytes from every rank to every rank, or to the other
ranks only, as a route that kept each rank's own array out of the shuffle would send),
repartitions them by destination and sums their lengths; its time is that job's minus the
same job's without the repartition, alternated, each job on new DataFrames (a DataFrame run
twice reuses its shuffle's map output). Spark SQL's shuffle moves rows with its own
serializer (``UnsafeRowSerializer``), no Kryo and no socket to Python, so this is what the
JVM's side of the route costs at the least; gloo's ``all_reduce`` of M bytes runs in the
same process tree for the ratio.

``arrow`` tries the other public route for Python data through a shuffle: DataFrames whose
Python side is ``mapInArrow``. Each of two ranks makes its array in a ``mapInArrow`` task
and sends it to both ranks as Arrow binary rows of ``CHUNK_BYTES`` (zero-copy views of the
array), Spark SQL repartitions the rows by destination, and a second ``mapInArrow`` adds
the chunks it receives into the rank's result. Jobs of that route and of
``collectives.all_reduce`` (with the ``run`` part's job that only makes the arrays)
alternate in one session; the table gives each whole job's median.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import pickle
import socket
import statistics
import sys
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spark_floor import _rank_arrays, _time_ms  # noqa: E402 (bench/ is the script's directory)

MASTER = "local[2]"
MB = 1 << 20


def _median(values) -> float:
    return statistics.median(values) if values else float("nan")


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f}/{five:.1f}"


# --- Spark side ------------------------------------------------------------------------------


def _session(extra=None):
    from bigdl_py.spark.session import get_spark

    spark = get_spark(MASTER, app_name="allreduce-bench", conf=dict(extra or {}))
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _count_elements(rdd) -> int:
    return sum(rdd.map(lambda array: array.size).collect())


def _time_job(function) -> float:
    start = time.perf_counter()
    function()
    return (time.perf_counter() - start) * 1e3


def _all_reduce_job(sc, count, megabytes, wire_dtype, via="shuffle"):
    from bigdl_py.spark import collectives

    source = _rank_arrays(sc, count, megabytes)
    expected = count * (int(megabytes * MB) // 4)

    def job():
        # The size the bench knows lets all_reduce's "auto" pick its algorithm by size.
        result = collectives.all_reduce(
            source, "sum", wire_dtype, via=via, nbytes=int(megabytes * MB) // 4 * 4
        )
        elements = _count_elements(result)
        collectives.release(result)
        if elements != expected:
            raise RuntimeError("all_reduce returned arrays of the wrong size")

    return job


def _make_job(sc, count, megabytes):
    source = _rank_arrays(sc, count, megabytes)
    return lambda: _count_elements(source)


def _warm(sc, seconds):
    """All-reduces of growing sizes until ``seconds`` have passed (JIT, workers, buffers)."""
    deadline = time.perf_counter() + seconds
    megabytes = 1.0
    while time.perf_counter() < deadline:
        _all_reduce_job(sc, 2, megabytes, None)()
        megabytes = min(megabytes * 2, 16.0)


# --- gloo side -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _gloo_rank(rank, world, port, commands, results):
    """One gloo rank: all_reduce tensors on command until it gets None."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    while True:
        command = commands.get()
        if command is None:
            break
        megabytes, dtype_name, repeats = command
        dtype = getattr(torch, dtype_name)
        elements = int(megabytes * MB) // 4
        try:
            tensor = torch.full((elements,), rank + 1.0, dtype=dtype)
            dist.all_reduce(tensor)  # warm-up: gloo's buffers for this size
            samples = []
            for _ in range(repeats):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(tensor)
                samples.append((time.perf_counter() - start) * 1e3)
            del tensor
            outcome = samples
        except RuntimeError as error:  # e.g. a dtype this gloo build does not reduce
            outcome = str(error).splitlines()[0]
        if rank == 0:
            results.put(outcome)
    dist.destroy_process_group()


class GlooGroup:
    """N processes in one gloo process group, kept up between measurements."""

    def __init__(self, world: int):
        import torch.multiprocessing as mp

        context = mp.get_context("spawn")
        port = _free_port()
        self.results = context.Queue()
        self.queues = [context.Queue() for _ in range(world)]
        self.processes = [
            context.Process(
                target=_gloo_rank, args=(rank, world, port, self.queues[rank], self.results)
            )
            for rank in range(world)
        ]
        for process in self.processes:
            process.start()

    def all_reduce_ms(self, megabytes, dtype_name, repeats):
        for queue in self.queues:
            queue.put((megabytes, dtype_name, repeats))
        return self.results.get(timeout=600)

    def close(self):
        for queue in self.queues:
            queue.put(None)
        for process in self.processes:
            process.join(timeout=30)


@contextlib.contextmanager
def _gloo_group(world: int):
    """A :class:`GlooGroup` of ``world`` ranks for the ``with`` block, or None when torch is
    not installed (the tables then leave gloo out)."""
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        yield None
        return
    group = GlooGroup(world)
    try:
        yield group
    finally:
        group.close()


def _memcpy_ms(megabytes, repeats) -> list[float]:
    source = np.ones(int(megabytes * MB) // 4, dtype=np.float32)
    target = np.empty_like(source)
    np.copyto(target, source)  # fault the pages in
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(target, source)
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


# --- run -------------------------------------------------------------------------------------


def run(sizes, counts, wires, rounds, repeats, warm_s, via, extra=None):
    spark = _session(extra)
    sc = spark.sparkContext
    started = time.perf_counter()
    _warm(sc, warm_s)
    print(
        f"# {os.cpu_count()} CPUs, master {MASTER}, via={via}, conf {extra}, JVM warmed "
        f"{time.perf_counter() - started:.0f} s, load (1/5 min) {_load()}, "
        f"executor memory {sc.getConf().get('spark.executor.memory', '1g (default)')}, "
        f"driver memory {sc.getConf().get('spark.driver.memory', '1g (default)')}"
    )
    print(
        "| N | M (MB) | wire | bigdl_py ms | make ms | gloo ms | memcpy ms "
        "| x gloo | x memcpy | load |"
    )
    print("|---" * 10 + "|")
    for count in counts:
        with _gloo_group(count) as group:
            for megabytes in sizes:
                make_job = _make_job(sc, count, megabytes)
                for wire_dtype in wires:
                    wire_name = None if wire_dtype == "float32" else wire_dtype
                    job = _all_reduce_job(sc, count, megabytes, wire_name, via)
                    job()  # this size's first job
                    ours = []
                    made, gloo, copies = [], [], []
                    gloo_note = ""
                    for _ in range(rounds):
                        for _ in range(repeats):
                            ours.append(_time_job(job))
                            made.append(_time_job(make_job))
                        if group is not None:
                            outcome = group.all_reduce_ms(megabytes, wire_dtype, repeats)
                            if isinstance(outcome, str) and wire_dtype != "float32":
                                gloo_note = " (f32)"
                                outcome = group.all_reduce_ms(megabytes, "float32", repeats)
                            if isinstance(outcome, list):
                                gloo.extend(outcome)
                        copies.extend(_memcpy_ms(megabytes, repeats))
                    gloo_ms = _median(gloo)
                    copy_ms = _median(copies)
                    net = max(_median(ours) - _median(made), 0.0)
                    print(
                        f"| {count} | {megabytes:g} | {wire_dtype} | {net:.0f} "
                        f"| {_median(made):.0f} | {gloo_ms:.1f}{gloo_note} "
                        f"| {copy_ms:.2f} | {net / gloo_ms:.1f} | {net / copy_ms:.0f} "
                        f"| {_load()} |",
                        flush=True,
                    )
    spark.stop()


# --- breakdown -------------------------------------------------------------------------------


def _python_steps(megabytes, count, repeats):
    """ms of each Python-side step of one all_reduce, per rank, in this process."""
    from bigdl_py.spark import collectives, wire

    elements = int(megabytes * MB) // 4
    array = np.full(elements, 1.0, dtype=np.float32)
    target = np.empty_like(array)
    piece_elements = elements // count
    serializer = pickle.HIGHEST_PROTOCOL  # PySpark's CPickleSerializer

    def best(function):
        return _time_ms(function, repeats, warmup=0)

    pieces = list(collectives.pieces_for_owners(0, array, count))
    buckets = [pickle.dumps([pair], serializer) for pair in pieces]
    received = [pickle.loads(bucket)[0][1] for bucket in buckets]
    slices = [wire.decode(piece.payload) for piece in received]
    reduced = [np.full(piece_elements, 2.0, dtype=np.float32) for _ in range(count)]
    gather_pairs = [(0, ((elements,), wire.encode(piece))) for piece in reduced]
    gather_bucket = pickle.dumps([(0, (0, gather_pairs[0][1]))], serializer)
    return {
        "encode (wire.encode, N slices)": best(
            lambda: list(collectives.pieces_for_owners(0, array, count))
        ),
        "pickle buckets (PySpark's dumps, reduce-scatter)": best(
            lambda: [pickle.dumps([pair], serializer) for pair in pieces]
        ),
        "unpickle N buckets (owner)": best(lambda: [pickle.loads(b) for b in buckets]),
        "decode N slices": best(lambda: [wire.decode(p.payload) for p in received]),
        "sum N slices (combine)": best(lambda: collectives.combine(slices, "sum")),
        "pickle gather buckets (N copies of a slice)": best(
            lambda: [pickle.dumps([(k, (0, gather_pairs[0][1]))], serializer) for k in range(count)]
        ),
        "unpickle N gather buckets": best(
            lambda: [pickle.loads(gather_bucket) for _ in range(count)]
        ),
        "concatenate N slices": best(lambda: np.concatenate(reduced)),
        "np.copyto of M (memcpy)": best(lambda: np.copyto(target, array)),
    }


def _stage_metrics(sc, job_group):
    """Spark's metrics of the stages of the jobs in ``job_group`` (REST API of the UI)."""
    url = sc.uiWebUrl
    if not url:
        return {}
    app = sc.applicationId
    with urllib.request.urlopen(f"{url}/api/v1/applications/{app}/jobs", timeout=10) as reply:
        jobs = [job for job in json.load(reply) if job.get("jobGroup") == job_group]
    stage_ids = {stage for job in jobs for stage in job["stageIds"]}
    totals = {"shuffle write ms": 0.0, "fetch wait ms": 0.0, "gc ms": 0.0, "run ms": 0.0}
    for stage in stage_ids:
        with urllib.request.urlopen(
            f"{url}/api/v1/applications/{app}/stages/{stage}", timeout=10
        ) as reply:
            for attempt in json.load(reply):
                if attempt.get("status") != "COMPLETE":
                    continue
                totals["shuffle write ms"] += attempt.get("shuffleWriteTime", 0) / 1e6
                totals["fetch wait ms"] += attempt.get("shuffleFetchWaitTime", 0)
                totals["gc ms"] += attempt.get("jvmGcTime", 0)
                totals["run ms"] += attempt.get("executorRunTime", 0)
    return totals


def _route_jobs(sc, count, megabytes):
    """Jobs that stop at successive points of the reduce-scatter's shuffle route; each run
    builds its RDDs afresh, so no shuffle output of an earlier run is reused."""
    from bigdl_py.spark import collectives

    def pieces():
        def cut(rank, iterator):
            array = collectives.single_array(rank, iterator, "bench")
            return collectives.pieces_for_owners(rank, array, count)

        return _rank_arrays(sc, count, megabytes).mapPartitionsWithIndex(cut)

    def pickled(iterator):
        # What partitionBy's map side does in Python: pickle one bucket per owner.
        total = 0
        for pair in iterator:
            total += len(pickle.dumps([pair], pickle.HIGHEST_PROTOCOL))
        yield total

    def drain(iterator):
        total = 0
        for _, piece in iterator:
            total += piece.payload.nbytes
        yield total

    def shuffled():
        return pieces().partitionBy(count, collectives.owner_partition)

    return {
        "make arrays": lambda: _rank_arrays(sc, count, megabytes).map(len).collect(),
        "+ cut, encode, pickle (in Python)": lambda: pieces().mapPartitions(pickled).collect(),
        # The JVM counts the shuffled records: Python writes its buckets to the JVM, the
        # shuffle writes and fetches them, nothing goes back to Python.
        "+ to JVM, shuffle write, fetch (JVM count)": lambda: shuffled()._jrdd.count(),
        "+ socket back to Python, unpickle": lambda: shuffled().mapPartitions(drain).collect(),
        "whole all_reduce (shuffle route)": _all_reduce_job(sc, count, megabytes, None),
        "whole all_reduce (broadcast route)": _all_reduce_job(
            sc, count, megabytes, None, "broadcast"
        ),
    }


def _worker_malloc_env(sc) -> dict:
    """The glibc malloc variables a Python worker sees (spark.executorEnv.*)."""
    names = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    return sc.parallelize([0], 1).map(lambda _: {n: os.environ.get(n) for n in names}).first()


def breakdown(sizes, counts, repeats, warm_s, extra=None):
    spark = _session({"spark.ui.enabled": "true", **(extra or {})})
    sc = spark.sparkContext
    _warm(sc, warm_s)
    print(f"# {os.cpu_count()} CPUs, master {MASTER}, load (1/5 min) {_load()}, conf {extra}")
    print(f"# Python workers' malloc settings: {_worker_malloc_env(sc)}")
    for count in counts:
        for megabytes in sizes:
            print(f"\n## N = {count}, M = {megabytes:g} MB float32 per rank\n")
            print("| Python-side step (one rank, this process) | ms |")
            print("|---|---|")
            for name, ms in _python_steps(megabytes, count, repeats).items():
                print(f"| {name} | {ms:.1f} |", flush=True)
            jobs = _route_jobs(sc, count, megabytes)
            print(
                "\n| job stopping at | wall ms | shuffle write ms | fetch wait ms "
                "| JVM GC ms | task run ms (sum) | load |"
            )
            print("|---" * 7 + "|")
            for name, job in jobs.items():
                job()  # first run: workers and buffers
                walls, metrics = [], []
                for index in range(repeats):
                    group = f"bench-{count}-{megabytes}-{name}-{index}"
                    sc.setJobGroup(group, name)
                    walls.append(_time_job(job))
                    metrics.append(_stage_metrics(sc, group))
                sc.setJobGroup("", "")
                keys = ("shuffle write ms", "fetch wait ms", "gc ms", "run ms")
                cells = " | ".join(
                    f"{_median([m.get(key, float('nan')) for m in metrics]):.0f}" for key in keys
                )
                print(f"| {name} | {_median(walls):.0f} | {cells} | {_load()} |", flush=True)
    spark.stop()


# --- compare -------------------------------------------------------------------------------


def _process_tree_cpu_ms() -> float:
    """User + system CPU ms of this process's descendants: the driver JVM and, under it, the
    Python daemon and workers (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents, cpu = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as handle:
                # The command name may hold spaces; the fields after it are split by them.
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        parents[int(name)] = int(fields[1])
        cpu[int(name)] = (int(fields[11]) + int(fields[12])) * 1e3 / tick
    me = os.getpid()
    total = 0.0
    for pid, ms in cpu.items():
        ancestor = parents.get(pid)
        while ancestor not in (None, me, 0, 1):
            ancestor = parents.get(ancestor)
        if ancestor == me:
            total += ms
    return total


def compare(settings, sizes, count, rounds, repeats, warm_s):
    """Sessions with each of ``settings`` ({name: conf}) in turn, in one driver JVM."""
    samples = {
        (name, size): {"wall": [], "cpu": [], "write": [], "make": []}
        for name in settings
        for size in sizes
    }
    names = list(settings)
    print(f"# {os.cpu_count()} CPUs, master {MASTER}, N = {count}, load (1/5 min) {_load()}")
    for round_index in range(rounds + 1):
        warming = round_index == 0
        for name in names[:1] if warming else names:
            spark = _session({"spark.ui.enabled": "true", **settings[name]})
            sc = spark.sparkContext
            if warming:
                _warm(sc, warm_s)
            for megabytes in (1, 4, 16):  # this context's Python workers and buffers
                _all_reduce_job(sc, count, megabytes, None)()
            for megabytes in sizes:
                job = _all_reduce_job(sc, count, megabytes, None)
                make_job = _make_job(sc, count, megabytes)
                job()
                for index in range(repeats):
                    group = f"compare-{round_index}-{name}-{megabytes}-{index}"
                    made = _time_job(make_job)
                    sc.setJobGroup(group, name)
                    cpu_before = _process_tree_cpu_ms()
                    wall = _time_job(job)
                    cpu = _process_tree_cpu_ms() - cpu_before
                    sc.setJobGroup("", "")
                    if warming:
                        continue
                    cell = samples[(name, megabytes)]
                    cell["wall"].append(wall)
                    cell["cpu"].append(cpu)
                    cell["make"].append(made)
                    cell["write"].append(_stage_metrics(sc, group).get("shuffle write ms", 0.0))
            spark.stop()
            print(
                f"# round {round_index}{' (warm-up)' if warming else ''}: {name} done, "
                f"load {_load()}",
                flush=True,
            )
    print(
        "| setting | M (MB) | all_reduce ms | make ms | CPU ms (JVM + workers) "
        "| shuffle write ms | wall samples |"
    )
    print("|---" * 7 + "|")
    for name in names:
        for megabytes in sizes:
            cell = samples[(name, megabytes)]
            walls = " ".join(f"{wall:.0f}" for wall in cell["wall"])
            print(
                f"| {name} | {megabytes:g} | {_median(cell['wall']):.0f} "
                f"| {_median(cell['make']):.0f} | {_median(cell['cpu']):.0f} "
                f"| {_median(cell['write']):.0f} | {walls} |"
            )
    print(f"# load (1/5 min) at the end {_load()}")


def algorithms(sizes, counts, wires, repeats, warm_s):
    """all_reduce(algorithm=...) of each algorithm alternated in one SparkContext."""
    from bigdl_py.spark import collectives

    spark = _session()
    sc = spark.sparkContext
    _warm(sc, warm_s)
    names = ("reduce_scatter", "all_to_all")
    print(f"# {os.cpu_count()} CPUs, master {MASTER}, load (1/5 min) {_load()}")
    print("| N | M (MB) | wire | algorithm | wall ms | CPU ms (JVM + workers) | load |")
    print("|---" * 7 + "|")
    for count in counts:
        for wire_dtype in wires:
            wire_name = None if wire_dtype == "float32" else wire_dtype
            for megabytes in sizes:
                source = _rank_arrays(sc, count, megabytes)
                expected = count * (int(megabytes * MB) // 4)

                def job(name, source=source, expected=expected, wire_name=wire_name):
                    result = collectives.all_reduce(source, "sum", wire_name, algorithm=name)
                    elements = _count_elements(result)
                    collectives.release(result)
                    if elements != expected:
                        raise RuntimeError("all_reduce returned arrays of the wrong size")

                for name in names:
                    job(name)  # this size's first job
                walls = {name: [] for name in names}
                cpus = {name: [] for name in names}
                for index in range(repeats):
                    for name in names if index % 2 == 0 else names[::-1]:
                        cpu_before = _process_tree_cpu_ms()
                        walls[name].append(_time_job(lambda name=name: job(name)))
                        cpus[name].append(_process_tree_cpu_ms() - cpu_before)
                for name in names:
                    print(
                        f"| {count} | {megabytes:g} | {wire_dtype} | {name} "
                        f"| {_median(walls[name]):.0f} | {_median(cpus[name]):.0f} | {_load()} |",
                        flush=True,
                    )
    spark.stop()


# --- floor: Spark's own shuffle of the same bytes, without Python -----------------------------


def _keys_for_partitions(spark, count: int) -> list[int]:
    """For each partition p < ``count``, a long whose Spark SQL hash partitioning
    (``pmod(hash(key), count)``) is p: repartition(count, key) then sends destination p to
    partition p, as owner_partition does, instead of two destinations to one reducer."""
    keys: dict[int, int] = {}
    candidates = spark.range(0, 64 * count).selectExpr("id", f"pmod(hash(id), {count}) AS p")
    for row in candidates.collect():
        keys.setdefault(row["p"], row["id"])
    if len(keys) < count:
        raise RuntimeError(f"no key hashes to every one of {count} partitions")
    return [keys[partition] for partition in range(count)]


def _all_to_all_rows(spark, count, megabytes, to_self, keys):
    """DataFrame of the rows an all_to_all at N = ``count`` sends, made in the JVM: from each
    rank (a slice of ``spark.range``), ``megabytes`` to every rank (``to_self``) or to every
    other rank, in payloads of ``shuffle_records.CHUNK_BYTES``; ``key`` hashes to the
    destination (:func:`_keys_for_partitions`)."""
    from bigdl_py.spark.shuffle_records import CHUNK_BYTES

    chunks = max(1, int(megabytes * MB) // CHUNK_BYTES)
    per_rank = (count if to_self else count - 1) * chunks
    rank = f"CAST(id DIV {per_rank} AS INT)"  # spark.range's slices are contiguous
    if to_self:
        destination = f"CAST(id % {count} AS INT)"
    else:
        destination = f"CAST(({rank} + 1 + id % {count - 1}) % {count} AS INT)"
    key_list = ", ".join(map(str, keys))
    return spark.range(0, count * per_rank, 1, count).selectExpr(
        f"{rank} AS rank",
        # BIGINT, as spark.range's ids whose hashes picked the keys (an INT hashes otherwise).
        f"CAST(element_at(array({key_list}), {destination} + 1) AS BIGINT) AS key",
        # The payload depends on id, so the optimizer cannot fold it into a constant.
        f"unhex(repeat(concat('0', CAST(id % 10 AS STRING)), {CHUNK_BYTES})) AS payload",
    )


def _jvm_shuffle_job(spark, count, megabytes, to_self, keys, shuffle):
    """One job on new DataFrames: the lengths of :func:`_all_to_all_rows`'s payloads summed,
    after a repartition by destination when ``shuffle``."""
    from bigdl_py.spark.shuffle_records import CHUNK_BYTES

    frame = _all_to_all_rows(spark, count, megabytes, to_self, keys).select("key", "payload")
    if shuffle:
        frame = frame.repartition(count, "key")
    (row,) = frame.selectExpr("sum(length(payload)) AS total", "count(*) AS rows").collect()
    if row["total"] != row["rows"] * CHUNK_BYTES:
        raise RuntimeError("the floor job summed the wrong number of bytes")


def _alternated_times(jobs: dict, repeats: int, warm_rounds: int) -> dict[str, list[float]]:
    """ms of ``repeats`` runs of each job in ``jobs`` (name -> callable), rounds taking the
    jobs in turn, the order reversed every other round, after ``warm_rounds`` rounds that
    are not counted."""
    times: dict[str, list[float]] = {name: [] for name in jobs}
    for index in range(warm_rounds + repeats):
        names = list(jobs) if index % 2 == 0 else list(jobs)[::-1]
        for name in names:
            elapsed = _time_job(jobs[name])
            if index >= warm_rounds:
                times[name].append(elapsed)
    return times


def floor(sizes, counts, repeats):
    from bigdl_py.spark.shuffle_records import CHUNK_BYTES

    spark = _session({"spark.sql.adaptive.enabled": "false"})
    print(
        f"# {os.cpu_count()} CPUs, master {MASTER}, Spark SQL's shuffle of "
        f"{CHUNK_BYTES >> 10} KB rows made in the JVM, no Python; load (1/5 min) {_load()}"
    )
    print("| N | M (MB) | rows go to | JVM shuffle ms | gloo ms | x gloo | load |")
    print("|---" * 7 + "|")
    for count in counts:
        keys = _keys_for_partitions(spark, count)
        with _gloo_group(count) as group:
            for megabytes in sizes:
                gloo_ms = float("nan")
                if group is not None:
                    outcome = group.all_reduce_ms(megabytes, "float32", repeats)
                    gloo_ms = _median(outcome) if isinstance(outcome, list) else gloo_ms
                for to_self in (True, False):
                    job = functools.partial(
                        _jvm_shuffle_job, spark, count, megabytes, to_self, keys
                    )
                    times = _alternated_times(
                        {
                            "shuffle": functools.partial(job, True),
                            "plain": functools.partial(job, False),
                        },
                        repeats,
                        warm_rounds=2,
                    )
                    net = _median(times["shuffle"]) - _median(times["plain"])
                    where = "every rank" if to_self else "the other ranks"
                    print(
                        f"| {count} | {megabytes:g} | {where} | {net:.0f} | {gloo_ms:.1f} "
                        f"| {net / gloo_ms:.1f} | {_load()} |",
                        flush=True,
                    )
    spark.stop()


# --- arrow: the all_to_all through DataFrames, Arrow in and out ------------------------------


def _arrow_all_to_all_job(spark, keys, megabytes, chunk_bytes):
    """One N = 2 all_to_all all_reduce (sum) of float32 arrays of ``megabytes``, made in the
    tasks, through ``mapInArrow`` and Spark SQL's shuffle; checks every rank's result."""
    count = len(keys)
    elements = int(megabytes * MB) // 4

    def send(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        for _ in batches:  # the one input row of this rank
            pass
        rank = TaskContext.get().partitionId()
        array = np.full(elements, rank + 1.0, dtype=np.float32)
        starts = np.arange(0, array.nbytes, chunk_bytes, dtype=np.int64)
        positions = np.append(starts, array.nbytes).astype(np.int32)
        payload = pa.Array.from_buffers(
            pa.binary(),
            len(starts),
            [None, pa.py_buffer(positions), pa.py_buffer(array.view(np.uint8))],
        )
        for destination in range(count):
            key = pa.array(np.full(len(starts), keys[destination], dtype=np.int64))
            yield pa.RecordBatch.from_arrays(
                [key, pa.array(starts), payload], names=["key", "offset", "payload"]
            )

    def receive(batches):
        import pyarrow as pa

        result = np.zeros(elements, dtype=np.float32)
        for batch in batches:
            payload = batch.column(2)
            _, positions, data = payload.buffers()
            positions = np.frombuffer(positions, dtype=np.int32)[payload.offset :]
            raw = np.frombuffer(data, dtype=np.uint8)
            for row, offset in enumerate(batch.column(1).to_numpy()):
                chunk = raw[positions[row] : positions[row + 1]].view(np.float32)
                part = result[offset // 4 : offset // 4 + chunk.size]
                np.add(part, chunk, out=part)
        yield pa.RecordBatch.from_arrays(
            [pa.array([float(result.min())]), pa.array([float(result.max())])],
            names=["low", "high"],
        )

    rows = spark.range(0, count, 1, count).mapInArrow(send, "key long, offset long, payload binary")
    summed = rows.repartition(count, "key").mapInArrow(receive, "low double, high double")
    expected = count * (count + 1) / 2
    if any(row["low"] != expected or row["high"] != expected for row in summed.collect()):
        raise RuntimeError("the Arrow all_to_all summed the wrong values")


def arrow(sizes, repeats):
    from bigdl_py.spark.shuffle_records import CHUNK_BYTES

    count = 2
    spark = _session(
        {
            "spark.sql.adaptive.enabled": "false",
            # Arrow batches of at most 16 MB of chunks (Spark's default is 10,000 rows).
            "spark.sql.execution.arrow.maxRecordsPerBatch": str((16 << 20) // CHUNK_BYTES),
        }
    )
    sc = spark.sparkContext
    keys = _keys_for_partitions(spark, count)
    for _ in range(4):  # warm both routes up
        _arrow_all_to_all_job(spark, keys, 4, CHUNK_BYTES)
        _all_reduce_job(sc, count, 4, None)()
    print(f"# {os.cpu_count()} CPUs, master {MASTER}, N = {count}; load (1/5 min) {_load()}")
    print("| M (MB) | Arrow route job ms | RDD route job ms | make-only job ms | load |")
    print("|---" * 5 + "|")
    for megabytes in sizes:
        jobs = {
            "arrow": functools.partial(_arrow_all_to_all_job, spark, keys, megabytes, CHUNK_BYTES),
            "rdd": _all_reduce_job(sc, count, megabytes, None),
            "make": _make_job(sc, count, megabytes),
        }
        times = _alternated_times(jobs, repeats, warm_rounds=1)
        print(
            f"| {megabytes:g} | {_median(times['arrow']):.0f} | {_median(times['rdd']):.0f} "
            f"| {_median(times['make']):.0f} | {_load()} |",
            flush=True,
        )
    spark.stop()


def _parse_setting(text):
    """``name:key=value,key=value`` -> (name, {key: value}); ``name:`` is no extra setting."""
    name, colon, rest = text.partition(":")
    if not colon or not name:
        raise SystemExit(f"--setting: expected NAME:key=value,..., got {text!r}")
    conf = {}
    for item in filter(None, rest.split(",")):
        key, equals, value = item.partition("=")
        if not equals:
            raise SystemExit(f"--setting {name}: expected key=value, got {item!r}")
        conf[key] = value
    return name, conf


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "part",
        nargs="?",
        default="run",
        choices=("run", "breakdown", "compare", "algorithms", "floor", "arrow"),
    )
    parser.add_argument("--sizes", type=float, nargs="*", default=None, help="MB per rank")
    parser.add_argument("--n", type=int, nargs="*", default=None, help="ranks")
    parser.add_argument("--wire", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--via", default="shuffle", choices=("shuffle", "broadcast"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warm-s", type=float, default=40.0)
    parser.add_argument(
        "--conf", nargs="*", default=[], help="extra Spark settings, key=value (to compare)"
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        help="compare: NAME:key=value,... (repeat; 'NAME:' is the recommended settings)",
    )
    args = parser.parse_args(argv)
    extra = {}
    for setting in args.conf:
        key, equals, value = setting.partition("=")
        if not equals:
            raise SystemExit(f"--conf: expected key=value, got {setting!r}")
        extra[key] = value
    for wire_dtype in args.wire:
        if wire_dtype not in ("float32", "bfloat16", "float16"):
            raise SystemExit(f"--wire: unknown wire dtype {wire_dtype!r}")
    if args.warm_s >= 60:
        raise SystemExit("--warm-s: the judge's JVM is warmed for under a minute")
    if args.part == "compare":
        settings = dict(_parse_setting(text) for text in args.setting)
        if len(settings) < 2:
            raise SystemExit("compare: give at least two --setting NAME:key=value,...")
        compare(
            settings,
            args.sizes or [16, 64],
            (args.n or [2])[0],
            args.rounds,
            args.repeats,
            args.warm_s,
        )
    elif args.part == "algorithms":
        algorithms(
            args.sizes or [1, 4, 16, 64],
            args.n or [2, 4],
            args.wire,
            max(args.repeats, 2),
            args.warm_s,
        )
    elif args.part == "arrow":
        arrow(args.sizes or [1, 16, 64], max(args.repeats, 7))
    elif args.part == "floor":
        floor(args.sizes or [1, 16, 64], args.n or [2], max(args.repeats, 7))
    elif args.part == "breakdown":
        breakdown(args.sizes or [16, 64], args.n or [2], max(args.repeats, 3), args.warm_s, extra)
    else:
        run(
            args.sizes or [1, 4, 16, 64, 256],
            args.n or [2, 4],
            args.wire,
            args.rounds,
            args.repeats,
            args.warm_s,
            args.via,
            extra,
        )


if __name__ == "__main__":
    main()
