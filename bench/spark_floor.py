"""Measure the fixed latency of a PySpark job in local mode, and which settings cut it.

Run by hand (each part takes minutes on a shared 2-core machine)::

    python bench/spark_floor.py floor [--rounds 2] [--configs defaults uds ...]
    python bench/spark_floor.py allreduce [--sizes-mb 1 4 16 64] [--partitions 2 4]
    python bench/spark_floor.py worker-cache [--jobs 50]
    python bench/spark_floor.py serialization
    python bench/spark_floor.py chain
    python bench/spark_floor.py overlap [--per-job 8] [--compute-ms 18]
    python bench/spark_floor.py barrier [--rounds 10]

``floor`` starts one child process (one SparkSession) per settings candidate and times four
kinds of job, interleaved so that load from other processes hits them alike: an empty
one-stage PySpark job, an empty two-stage job (a shuffle), a two-stage job moving 4 x 1 MB,
and a job without Python workers (a DataFrame ``count``). Candidates run in alternating
order over ``--rounds`` rounds; the table gives the median over all measured repetitions
after warm-up. Each child also turns on INFO logging for ``org.apache.spark.api.python``
and summarises the PythonRunner's ``Times: total, boot, init, finish`` lines, and it reads
the DAGScheduler's ``Job N finished ... took X ms`` lines so the wall time splits into the
JVM's share and the Python driver's share.

How to read PythonRunner's times: ``boot`` is when the worker began waiting for the task,
relative to the task's start, so it is *negative* for a reused worker (it has been waiting
since its previous task); ``init`` runs from that moment until the task's function was
unpickled, so for a reused worker it includes the idle wait, and ``boot + init`` is the real
set-up time. ``finish`` is the time from set-up to the last output.

``allreduce`` times ``bigdl_py.spark.collectives.all_reduce`` on float32 vectors of M MB per
rank for the two all-gather strategies and the float32/float16 wires. ``worker-cache``
measures how often a partition finds its state in the same Python worker over consecutive
jobs. ``serialization`` compares pickled NumPy arrays with the raw-bytes wire format in a
shuffle.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MASTER = "local[2]"

# Settings candidates for the floor, each on top of the pure pyspark defaults. The bench
# itself adds only a log4j file and turns off the console progress bar.
UDS = {"spark.python.unix.domain.socket.enabled": "true"}
CANDIDATES: dict[str, dict[str, str]] = {
    "defaults": {},
    "uds": UDS,
    "uds+no_reuse": {**UDS, "spark.python.worker.reuse": "false"},
    "uds+ui_off": {**UDS, "spark.ui.enabled": "false"},
    "uds+no_shuffle_compress": {
        **UDS,
        "spark.shuffle.compress": "false",
        "spark.shuffle.spill.compress": "false",
    },
    "uds+kryo": {**UDS, "spark.serializer": "org.apache.spark.serializer.KryoSerializer"},
    "uds+locality_0": {**UDS, "spark.locality.wait": "0"},
    "uds+fair": {**UDS, "spark.scheduler.mode": "FAIR"},
    "uds+faulthandler": {**UDS, "spark.python.worker.faulthandler.enabled": "true"},
    "uds+no_daemon": {**UDS, "spark.python.use.daemon": "false"},
    "uds+sort_shuffle": {**UDS, "spark.shuffle.sort.bypassMergeThreshold": "1"},
    "uds+parallelism_2": {
        **UDS,
        "spark.default.parallelism": "2",
        "spark.sql.shuffle.partitions": "2",
    },
    "uds+sql_no_aqe": {**UDS, "spark.sql.adaptive.enabled": "false"},
    "uds+one_blas_thread": {
        **UDS,
        "spark.executorEnv.OMP_NUM_THREADS": "1",
        "spark.executorEnv.OPENBLAS_NUM_THREADS": "1",
        "spark.executorEnv.MKL_NUM_THREADS": "1",
    },
    "recommended": {},  # filled from bigdl_py.spark.session.RECOMMENDED_CONF at run time
}

# A PythonRunner "boot" beyond this means a newly forked worker (fork + imports).
FRESH_WORKER_BOOT_MS = 100

JOB_KINDS = ("one_stage", "two_stage", "shuffle_4x1MB", "jvm_count")

LOG4J_TEMPLATE = """
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{HH:mm:ss.SSS}} %p %c{{1}}: %m%n%ex
logger.python.name = org.apache.spark.api.python.PythonRunner
logger.python.level = info
logger.dag.name = org.apache.spark.scheduler.DAGScheduler
logger.dag.level = info
"""

TIMES_LINE = re.compile(r"Times: total = (-?\d+), boot = (-?\d+), init = (-?\d+), finish = (-?\d+)")
JOB_LINE = re.compile(r"Job (\d+) finished: .* took ([\d.]+) ms")


def _recommended_conf() -> dict[str, str]:
    from bigdl_py.spark.session import RECOMMENDED_CONF

    return dict(RECOMMENDED_CONF)


def _median(values) -> float:
    return round(statistics.median(values), 1) if values else float("nan")


# --- the child: one SparkSession, one candidate --------------------------------------------


def _drain_count(iterator):
    """Consume the whole input: a Python task that leaves input unread loses its worker."""
    count = 0
    for _ in iterator:
        count += 1
    yield count


def _drain_bytes(iterator):
    total = 0
    for _, value in iterator:
        total += len(value)
    yield total


def _one_megabyte(index):
    import numpy as np

    return index, np.zeros(1 << 18, np.float32).tobytes()


def _make_jobs(spark):
    sc = spark.sparkContext
    source = sc.parallelize(range(2), 2)
    megabytes = sc.parallelize(range(4), 2).map(_one_megabyte)
    return {
        "one_stage": lambda: source.mapPartitions(_drain_count).collect(),
        "two_stage": lambda: (
            source.map(lambda x: (x, x)).partitionBy(2).mapPartitions(_drain_count).collect()
        ),
        "shuffle_4x1MB": lambda: megabytes.partitionBy(2).mapPartitions(_drain_bytes).collect(),
        "jvm_count": lambda: spark.range(10).count(),
    }


def _payload_jobs(spark):
    """One-stage jobs whose closure carries 1 MB, against the same 1 MB as a broadcast."""
    sc = spark.sparkContext
    source = sc.parallelize(range(2), 2)
    state = bytes(1 << 20)
    shared = sc.broadcast(state)

    def closure_job():
        return source.mapPartitions(lambda it: [len(state), *_drain_count(it)]).collect()

    def broadcast_job():
        return source.mapPartitions(lambda it: [len(shared.value), *_drain_count(it)]).collect()

    return {"closure_1MB": closure_job, "broadcast_1MB": broadcast_job}


def _run_child(name: str, settings: dict[str, str], repeats: int, warmup: int, out: str):
    from pyspark.sql import SparkSession

    log_dir = tempfile.mkdtemp(prefix="spark_floor_")
    log_path = os.path.join(log_dir, "spark.log")
    log4j_path = os.path.join(log_dir, "log4j2.properties")
    with open(log4j_path, "w") as handle:
        handle.write(LOG4J_TEMPLATE.format(path=log_path))
    builder = (
        SparkSession.builder.master(MASTER)
        .appName(f"spark_floor-{name}")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j.configurationFile=file:{log4j_path}")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    jobs = _make_jobs(spark)
    if name == "recommended":
        jobs.update(_payload_jobs(spark))
    wall = {kind: [] for kind in jobs}
    for repetition in range(warmup + repeats):
        for kind, job in jobs.items():
            sc.setJobGroup(f"{kind}:{repetition}", kind)
            start = time.perf_counter()
            job()
            if repetition >= warmup:
                wall[kind].append((time.perf_counter() - start) * 1e3)
    groups = {
        kind: [
            job_id
            for repetition in range(warmup, warmup + repeats)
            for job_id in sc.statusTracker().getJobIdsForGroup(f"{kind}:{repetition}")
        ]
        for kind in jobs
    }
    spark.stop()
    with open(log_path) as handle:
        log = handle.read()
    took = {int(job): float(ms) for job, ms in JOB_LINE.findall(log)}
    times = [tuple(int(v) for v in match) for match in TIMES_LINE.findall(log)]
    # boot > 0 alone does not mean a new worker: a reused worker released a moment before the
    # task started has not yet looped back to wait, so its boot is a few ms past the start.
    reused = [t for t in times if t[1] <= FRESH_WORKER_BOOT_MS]
    result = {
        "name": name,
        "wall_ms": wall,
        "jvm_ms": {kind: [took[j] for j in ids if j in took] for kind, ids in groups.items()},
        "python_tasks": len(times),
        "fresh_workers": len(times) - len(reused),
        "setup_ms": [t[1] + t[2] for t in reused],
        "finish_ms": [t[3] for t in times],
    }
    with open(out, "w") as handle:
        json.dump(result, handle)


# --- the parent: interleave candidates, aggregate ------------------------------------------


def _spawn(name, settings, repeats, warmup):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = handle.name
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "child",
        "--name",
        name,
        "--settings",
        json.dumps(settings),
        "--repeats",
        str(repeats),
        "--warmup",
        str(warmup),
        "--out",
        out,
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as handle:
        result = json.load(handle)
    os.unlink(out)
    return result


def run_floor(names, rounds, repeats, warmup, json_out=None):
    merged: dict[str, dict] = {}
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else list(reversed(names))
        for name in order:
            settings = _recommended_conf() if name == "recommended" else CANDIDATES[name]
            started = time.time()
            result = _spawn(name, settings, repeats, warmup)
            print(
                f"  round {round_index + 1}: {name} done in {time.time() - started:.0f} s",
                file=sys.stderr,
            )
            into = merged.setdefault(
                name,
                {
                    "wall_ms": {},
                    "jvm_ms": {},
                    "python_tasks": 0,
                    "fresh_workers": 0,
                    "setup_ms": [],
                    "finish_ms": [],
                },
            )
            for key in ("wall_ms", "jvm_ms"):
                for kind, values in result[key].items():
                    into[key].setdefault(kind, []).extend(values)
            for key in ("python_tasks", "fresh_workers"):
                into[key] += result[key]
            for key in ("setup_ms", "finish_ms"):
                into[key].extend(result[key])
    header = (
        "| settings | 1-stage ms | 2-stage ms | 4x1MB ms | DataFrame count ms "
        "| JVM share of 2-stage ms | worker set-up ms | finish ms | fresh workers |"
    )
    print(header)
    print("|---" * 9 + "|")
    for name in names:
        row = merged[name]
        cells = [_median(row["wall_ms"].get(kind, [])) for kind in JOB_KINDS]
        cells.append(_median(row["jvm_ms"].get("two_stage", [])))
        cells.append(_median(row["setup_ms"]))
        cells.append(_median(row["finish_ms"]))
        cells.append(f"{row['fresh_workers']}/{row['python_tasks']}")
        print(f"| {name} | " + " | ".join(str(cell) for cell in cells) + " |")
    extra = merged.get("recommended", {}).get("wall_ms", {})
    for kind in ("closure_1MB", "broadcast_1MB"):
        if kind in extra:
            print(f"recommended, one-stage job with {kind}: {_median(extra[kind])} ms")
    if json_out:
        with open(json_out, "w") as handle:
            json.dump(merged, handle)


# --- all-reduce, wire formats, worker cache, chained iterations (one session each) ---------


def _bench_session(extra=None):
    from bigdl_py.spark.session import get_spark

    settings = {"spark.ui.showConsoleProgress": "false", "spark.driver.memory": "4g"}
    settings.update(extra or {})
    spark = get_spark(MASTER, app_name="spark_floor-bench", conf=settings)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _time_ms(function, repeats, warmup=1):
    for _ in range(warmup):
        function()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append((time.perf_counter() - start) * 1e3)
    return _median(samples)


def _rank_arrays(sc, count, megabytes):
    """RDD of ``count`` float32 arrays of ``megabytes`` MB, made inside the tasks."""
    import numpy as np

    size = int(megabytes * (1 << 20)) // 4

    def make(rank):
        return np.full(size, rank + 1.0, dtype=np.float32)

    return sc.parallelize(range(count), count).map(make)


def _sizes(rdd):
    return rdd.map(lambda array: array.size).collect()


def _all_reduce_once(source, wire_dtype, via):
    from bigdl_py.spark import collectives

    result = collectives.all_reduce(source, "sum", wire_dtype, via=via)
    _sizes(result)
    collectives.release(result)


def run_allreduce(sizes_mb, partition_counts, repeats, spark=None):
    """all_reduce of N float32 arrays of M MB: both all-gather routes, both wire dtypes
    (``spark`` given: use that session and leave it running)."""
    own_session = spark is None
    if own_session:
        spark = _bench_session()
    sc = spark.sparkContext
    print(
        "| N | M (MB) | make arrays only ms | shuffle f32 ms | shuffle f16 ms "
        "| broadcast f32 ms | broadcast f16 ms |"
    )
    print("|---" * 7 + "|")
    for count in partition_counts:
        for megabytes in sizes_mb:
            source = _rank_arrays(sc, count, megabytes)
            cells = [_time_ms(functools.partial(_sizes, source), repeats)]
            for via in ("shuffle", "broadcast"):
                for wire_dtype in (None, "float16"):
                    once = functools.partial(_all_reduce_once, source, wire_dtype, via)
                    cells.append(_time_ms(once, repeats))
            row = " | ".join(str(cell) for cell in cells)
            print(f"| {count} | {megabytes:g} | {row} |", flush=True)
    if own_session:
        spark.stop()


def run_serialization(megabytes, count, repeats):
    """Shuffle N slices per rank as pickled NumPy, as WireArray, and as a bytes tuple."""
    import numpy as np

    from bigdl_py.spark import wire
    from bigdl_py.spark.collectives import owner_partition

    spark = _bench_session()
    sc = spark.sparkContext
    formats = {
        "numpy pickle": (lambda a: a, lambda p: p),
        "WireArray": (wire.encode, wire.decode),
        "bytes tuple": (
            lambda a: (a.dtype.str, a.shape, a.tobytes()),
            lambda p: np.frombuffer(p[2], p[0]).reshape(p[1]),
        ),
    }
    print(f"| format | {count} ranks x {megabytes} MB reduce-scatter ms |")
    print("|---|---|")
    source = _rank_arrays(sc, count, megabytes)
    for name, (encode, decode) in formats.items():

        def cut(array, encode=encode):
            size = array.size
            return [
                (j, encode(array[j * size // count : (j + 1) * size // count]))
                for j in range(count)
            ]

        def add(iterator, decode=decode):
            total = None
            for _, payload in iterator:
                piece = decode(payload)
                total = piece.copy() if total is None else total + piece
            yield total.size

        job = source.flatMap(cut).partitionBy(count, owner_partition).mapPartitions(add)
        print(f"| {name} | {_time_ms(job.collect, repeats)} |", flush=True)
    spark.stop()


def _cache_step(run_id, kind, partition, job):
    """Look up (kind, partition) at the previous job's version, store this job's; a hit?"""
    from bigdl_py.spark import worker

    hit = worker.lookup(run_id, (kind, partition), version=job - 1) is not None
    worker.store(run_id, (kind, partition), job, version=job)
    return hit, os.getpid()


def _one_stage_cache_job(sc, run_id, count, job):
    def task(partition, iterator):
        list(iterator)
        yield ("replica", *_cache_step(run_id, "replica", partition, job))

    return sc.parallelize(range(count), count).mapPartitionsWithIndex(task).collect()


def _two_stage_cache_job(sc, run_id, count, job):
    """DistriOptimizer's shape: replicas in the first stage, optimizer shards on the owners."""

    def replica_task(partition, iterator):
        list(iterator)
        outcome = ("replica", *_cache_step(run_id, "replica", partition, job))
        return ((owner, (partition, outcome)) for owner in range(count))

    def owner_task(owner, iterator):
        received = dict(pair for _, pair in iterator)
        yield received[owner]  # rank `owner`'s replica outcome, reported once
        yield ("shard", *_cache_step(run_id, "shard", owner, job))

    return (
        sc.parallelize(range(count), count)
        .mapPartitionsWithIndex(replica_task)
        .partitionBy(count, lambda key: key)
        .mapPartitionsWithIndex(owner_task)
        .collect()
    )


def run_worker_cache(jobs, partition_counts):
    """Hit rate of version-checked worker-cache lookups over consecutive jobs.

    A lookup hits when the Python worker that ran partition p in the previous job runs it
    again; the first job (nothing stored yet) is left out of the counts.
    """
    spark = _bench_session()
    sc = spark.sparkContext
    print("| N | job | state | hits / lookups | hit rate | Python workers seen |")
    print("|---|---|---|---|---|---|")
    for count in partition_counts:
        for name, job_function in (
            ("one stage", _one_stage_cache_job),
            ("two stages", _two_stage_cache_job),
        ):
            run_id = f"{name}-{count}-{time.time()}"
            outcomes = []
            for job in range(jobs):
                result = job_function(sc, run_id, count, job)
                if job > 0:
                    outcomes += result
            for kind in ("replica", "shard"):
                lookups = [(hit, pid) for k, hit, pid in outcomes if k == kind]
                if not lookups:
                    continue
                hits = sum(hit for hit, _ in lookups)
                workers = len({pid for _, pid in lookups})
                print(
                    f"| {count} | {name} | {kind} | {hits}/{len(lookups)} | "
                    f"{hits / len(lookups):.0%} | {workers} |",
                    flush=True,
                )
    spark.stop()


def _replica_from_worker_cache(run_id, megabytes):
    def task(partition, iterator):
        import numpy as np

        from bigdl_py.spark import worker

        list(iterator)
        size = int(megabytes * (1 << 20)) // 4
        replica = worker.fetch(run_id, "replica", lambda: np.zeros(size, np.float32))
        yield replica.size

    return task


def run_replica_rdd(sizes_mb, count, repeats):
    """A one-stage job that reads a cached RDD of replicas, against the worker cache."""
    import numpy as np

    spark = _bench_session()
    sc = spark.sparkContext
    print(
        "| replica MB | empty job ms | cached replica RDD ms | zip(data, replicas) ms "
        "| worker cache ms |"
    )
    print("|---|---|---|---|---|")
    for megabytes in sizes_mb:
        size = int(megabytes * (1 << 20)) // 4
        replicas = (
            sc.parallelize(range(count), count)
            .map(lambda _, size=size: np.zeros(size, np.float32))
            .cache()
        )
        data = sc.parallelize(range(count), count).map(lambda rank: rank).cache()
        replicas.count(), data.count()
        empty = sc.parallelize(range(count), count)
        run_id = f"replica-{megabytes}-{time.time()}"
        # Each RDD object is reused across repetitions, so its closure is pickled once.
        jobs = [
            empty.mapPartitions(_drain_count),
            replicas.map(lambda replica: replica.size),
            data.zip(replicas).map(lambda pair: pair[1].size),
            empty.mapPartitionsWithIndex(_replica_from_worker_cache(run_id, megabytes)),
        ]
        cells = [_time_ms(job.collect, repeats) for job in jobs]
        print(f"| {megabytes:g} | " + " | ".join(str(cell) for cell in cells) + " |", flush=True)
        replicas.unpersist()
        data.unpersist()
    spark.stop()


def _to_every_owner(count):
    def send(partition, iterator):
        list(iterator)
        return ((owner, partition) for owner in range(count))

    return send


def _chained_iterations(sc, count, iterations, shuffles_per_iteration=2):
    """One job: per iteration a reduce-scatter shuffle and an all-gather shuffle (tiny data),
    as the sharded update chains them; or one all-to-all shuffle, as the replicated one.

    In PySpark the reduce side of one shuffle and the map side of the next run in the same
    Python task, so each iteration adds one stage per shuffle and no driver round trip.
    """
    rdd = sc.parallelize(range(count), count)
    for _ in range(iterations):
        for _ in range(shuffles_per_iteration):
            rdd = rdd.mapPartitionsWithIndex(_to_every_owner(count)).partitionBy(
                count, lambda key: key
            )
    return rdd.mapPartitions(lambda it: [len(list(it))]).collect()


def run_chain(iteration_counts, count, repeats):
    """Time per iteration when k iterations share one job, against one job per iteration,
    with two shuffles per iteration (sharded update) and with one (replicated update)."""
    spark = _bench_session()
    sc = spark.sparkContext
    print("| iterations per job | 2 stages/iteration: ms per iteration | 1 stage/iteration |")
    print("|---|---|---|")
    for iterations in iteration_counts:
        cells = []
        for shuffles in (2, 1):
            job = functools.partial(_chained_iterations, sc, count, iterations, shuffles)
            cells.append(f"{_time_ms(job, repeats) / iterations:.1f}")
        print(f"| {iterations} | {cells[0]} | {cells[1]} |", flush=True)
    spark.stop()


def _busy_stage(step, compute_seconds, elements, count):
    """A replicated-chain-like stage: read everything, spin ``compute_seconds`` (the model),
    send a gradient of ``elements`` float32 to every partition and the weights to itself."""

    def stage(partition, iterator):
        import numpy as np

        list(iterator)
        started = time.perf_counter()
        while time.perf_counter() - started < compute_seconds:
            pass
        gradient = np.ones(elements, np.float32)
        for destination in range(count):
            yield (
                destination,
                (partition, step, gradient, gradient if destination == partition else None),
            )

    return stage


def _replicated_like_chain(sc, count, per_job, compute_seconds, elements):
    rdd = sc.parallelize(range(count), count)
    for step in range(per_job + 1):
        rdd = rdd.mapPartitionsWithIndex(_busy_stage(step, compute_seconds, elements, count))
        if step < per_job:
            rdd = rdd.partitionBy(count, lambda key: key)
    return rdd


def run_overlap(count, per_job, chains, rounds, compute_ms, elements):
    """Per-iteration time of back-to-back chained jobs, building each job's RDDs on the
    driver before submitting it, or in a thread while the previous job runs."""
    import threading

    spark = _bench_session()
    sc = spark.sparkContext
    build = functools.partial(
        _replicated_like_chain, sc, count, per_job, compute_ms / 1e3, elements
    )

    def serial():
        started = time.perf_counter()
        for _ in range(chains):
            build().collect()
        return (time.perf_counter() - started) * 1e3 / (chains * per_job)

    def overlapped():
        started = time.perf_counter()
        following = build()
        for index in range(chains):
            current, box, thread = following, {}, None
            if index < chains - 1:
                thread = threading.Thread(target=lambda box=box: box.setdefault("rdd", build()))
                thread.start()
            current.collect()
            if thread is not None:
                thread.join()
                following = box["rdd"]
        return (time.perf_counter() - started) * 1e3 / (chains * per_job)

    serial(), overlapped()  # warm-up
    results = {"serial": [], "overlapped": []}
    for _ in range(rounds):
        results["serial"].append(serial())
        results["overlapped"].append(overlapped())
    print("| build | ms per iteration (median) | rounds |")
    print("|---|---|---|")
    for name, values in results.items():
        rounded = ", ".join(f"{value:.1f}" for value in values)
        print(f"| {name} | {_median(values):.1f} | {rounded} |", flush=True)
    spark.stop()


def _exchange_rounds(rounds, elements):
    """A barrier task: ``rounds`` all-gathers of a base64 float32 gradient of ``elements``
    through ``BarrierTaskContext.allGather``, then ``rounds`` plain ``barrier()`` calls."""

    def task(iterator):
        import base64

        import numpy as np
        from pyspark import BarrierTaskContext

        list(iterator)
        context = BarrierTaskContext.get()
        message = base64.b64encode(np.ones(elements, np.float32).tobytes()).decode()
        context.barrier()  # start together
        started = time.perf_counter()
        for _ in range(rounds):
            received = context.allGather(message)
            sum(np.frombuffer(base64.b64decode(text), np.float32) for text in received)
        gathered = (time.perf_counter() - started) / rounds
        started = time.perf_counter()
        for _ in range(rounds):
            context.barrier()
        waited = (time.perf_counter() - started) / rounds
        yield context.partitionId(), gathered * 1e3, waited * 1e3

    return task


def run_barrier(count, rounds, elements):
    """Could gradients travel inside ONE barrier stage, several iterations per task, with
    Spark's own ``allGather``? Time one exchange round against a stage of a chain."""
    spark = _bench_session()
    sc = spark.sparkContext
    task = _exchange_rounds(rounds, elements)
    sc.parallelize(range(count), count).barrier().mapPartitions(task).collect()  # warm-up
    results = sc.parallelize(range(count), count).barrier().mapPartitions(task).collect()
    print("| partition | allGather of the gradient: ms per round | barrier(): ms per round |")
    print("|---|---|---|")
    for partition, gathered, waited in sorted(results):
        print(f"| {partition} | {gathered:.1f} | {waited:.1f} |", flush=True)
    spark.stop()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    floor = sub.add_parser("floor")
    floor.add_argument("--rounds", type=int, default=2)
    floor.add_argument("--repeats", type=int, default=20)
    floor.add_argument("--warmup", type=int, default=5)
    floor.add_argument("--configs", nargs="*", default=list(CANDIDATES))
    floor.add_argument("--json", default=None)
    child = sub.add_parser("child")
    child.add_argument("--name", required=True)
    child.add_argument("--settings", required=True)
    child.add_argument("--repeats", type=int, required=True)
    child.add_argument("--warmup", type=int, required=True)
    child.add_argument("--out", required=True)
    allreduce = sub.add_parser("allreduce")
    allreduce.add_argument("--sizes-mb", type=float, nargs="*", default=[1, 4, 16, 64])
    allreduce.add_argument("--partitions", type=int, nargs="*", default=[2, 4])
    allreduce.add_argument("--repeats", type=int, default=5)
    serialization = sub.add_parser("serialization")
    serialization.add_argument("--megabytes", type=float, default=16)
    serialization.add_argument("--partitions", type=int, default=2)
    serialization.add_argument("--repeats", type=int, default=7)
    cache = sub.add_parser("worker-cache")
    cache.add_argument("--jobs", type=int, default=50)
    cache.add_argument("--partitions", type=int, nargs="*", default=[2, 4])
    chain = sub.add_parser("chain")
    chain.add_argument("--iterations", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    chain.add_argument("--partitions", type=int, default=2)
    chain.add_argument("--repeats", type=int, default=9)
    overlap = sub.add_parser("overlap")
    overlap.add_argument("--partitions", type=int, default=2)
    overlap.add_argument("--per-job", type=int, default=8)
    overlap.add_argument("--chains", type=int, default=6)
    overlap.add_argument("--rounds", type=int, default=4)
    overlap.add_argument("--compute-ms", type=float, default=18.0)
    overlap.add_argument("--elements", type=int, default=61706)
    barrier = sub.add_parser("barrier")
    barrier.add_argument("--partitions", type=int, default=2)
    barrier.add_argument("--rounds", type=int, default=10)
    barrier.add_argument("--elements", type=int, default=22278)
    replica = sub.add_parser("replica-rdd")
    replica.add_argument("--sizes-mb", type=float, nargs="*", default=[0.25, 4, 16])
    replica.add_argument("--partitions", type=int, default=2)
    replica.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    if args.part == "overlap":
        run_overlap(
            args.partitions, args.per_job, args.chains, args.rounds, args.compute_ms, args.elements
        )
    elif args.part == "barrier":
        run_barrier(args.partitions, args.rounds, args.elements)
    elif args.part == "replica-rdd":
        run_replica_rdd(args.sizes_mb, args.partitions, args.repeats)
    elif args.part == "chain":
        run_chain(args.iterations, args.partitions, args.repeats)
    elif args.part == "allreduce":
        run_allreduce(args.sizes_mb, args.partitions, args.repeats)
    elif args.part == "serialization":
        run_serialization(args.megabytes, args.partitions, args.repeats)
    elif args.part == "worker-cache":
        run_worker_cache(args.jobs, args.partitions)
    elif args.part == "floor":
        run_floor(args.configs, args.rounds, args.repeats, args.warmup, args.json)
    elif args.part == "child":
        _run_child(args.name, json.loads(args.settings), args.repeats, args.warmup, args.out)


if __name__ == "__main__":
    main()
