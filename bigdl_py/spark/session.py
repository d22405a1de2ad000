"""The driver side of Spark: one SparkSession with our recommended settings, its task slots,
and the job descriptions the Spark UI shows.

The recommended settings live in :data:`RECOMMENDED_CONF`; ``conf/spark-defaults.conf`` ships
the same values for ``spark-submit --properties-file`` (a test keeps the two equal). Why each
setting is there is measured by ``bench/spark_floor.py`` and written up in
``bench/RESULTS.md``.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pyspark is imported lazily so that `import bigdl_py.spark` stays cheap
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

DEFAULT_APP_NAME = "bigdl_py"
DEFAULT_MASTER = "local[*]"

# Keep in step with conf/spark-defaults.conf (tests/spark/test_session.py checks it).
RECOMMENDED_CONF: dict[str, str] = {
    # Python workers talk to the JVM over a Unix domain socket instead of loopback TCP. On
    # loopback TCP the last small write of each task waits for a delayed ACK (~40 ms of the
    # PythonRunner's "finish" time); on a Unix socket that wait is gone.
    "spark.python.unix.domain.socket.enabled": "true",
    # Reused workers keep their imports and our worker-resident caches between tasks (this is
    # Spark's default; it is written down because everything here depends on it).
    "spark.python.worker.reuse": "true",
    # Gradient and weight slices are random-looking floats: lz4 does not shrink them and costs
    # CPU on both ends of every shuffle.
    "spark.shuffle.compress": "false",
    "spark.shuffle.spill.compress": "false",
    # Nor do broadcast weights (the all-gather's broadcast route, model shipping). This line,
    # the two malloc lines below and spark.shuffle.file.buffer=1m together: all_reduce of
    # 64 MB, N = 2, 1.8 s -> 1.4 s (shuffle route), 1.7 s -> 1.2 s (broadcast route), 16 MB
    # 0.89 s -> 0.71 s (bench/allreduce.py breakdown, local[2], load ~8 on 2 cores, A/B/A/B
    # medians). The file buffer alone showed nothing beyond the noise, and the bypass shuffle
    # writer holds one buffer per reduce partition (200 x 1 MB per task for a SQL shuffle),
    # so it is not set.
    "spark.broadcast.compress": "false",
    # Every shuffle of a PySpark RDD (partitionBy: the collectives, the training modes) moves
    # a task's pickled buckets as (Long, byte[]) records, of a few MB each (values above
    # 1 MB cross in 256 KB chunks: bigdl_py/spark/shuffle_records.py). Below 200 reduce
    # partitions Spark's default is the bypass-merge writer (a file per reduce partition,
    # then concatenated), whose shuffle write took 1.1-1.4 s of a 64 MB all_reduce (whole
    # records). Spark's serialized ("unsafe") writer applies when the serializer can
    # relocate serialized records (Kryo can, Java serialization cannot) and bypass is off
    # (threshold 1: any shuffle of 2 or more partitions without map-side combine, which
    # PySpark never asks the JVM for). Together: shuffle write 1341 -> 225 ms, all_reduce
    # N = 2 64 MB 1881 -> 1355 ms, 16 MB 540 -> 471 ms (medians of 9, sessions alternated in
    # one driver JVM, load 5-7 on 2 cores), 256 MB 6.8 -> 4.0 s (one each, load 7-8). The
    # threshold alone (Java serialization, sort writer): 64 MB about the same as with Kryo,
    # but 256 MB 7.9 s. Kryo with the bypass writer was slower (64 MB 1.5-2.2 s -> 3.3-3.8 s,
    # load 11-17).
    "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
    "spark.shuffle.sort.bypassMergeThreshold": "1",
    # The serialized writer copies a task's records into memory pages before it writes
    # them, so a task holds its bucket twice (the record from Python and its page; by
    # reading Spark's UnsafeShuffleWriter): 256 MB per rank at N = 2 ran out of the default
    # 1g heap of local mode, and completed in 2g. In local mode the driver JVM runs the
    # tasks; it takes heap only as it needs it.
    # Clusters size executors in conf/spark-cluster.conf (spark.executor.memory 4g).
    "spark.driver.memory": "4g",
    # Tried and not set: spark.shuffle.checksum.enabled=false stayed within the noise (64 MB
    # 1.4-3.4 s against 1.5-2.2 s); spark.buffer.size (the socket buffer between Python
    # workers and the JVM) 1 or 4 MB instead of 64 KB: within the noise (64 MB 1.6 s
    # against 1.7 s, and with the sort writer 1.24 s against 0.97 s).
    # A Python worker's pickled slices and received buffers are tens of MB; glibc maps each
    # fresh (mmap, page faults, munmap) above its 32 MB ceiling. From the heap, and with up
    # to 256 MB of freed heap kept, pickling 32 MB took 2-14 ms instead of 26-86 and
    # unpickling 2-7 instead of 25-163 (one process, load 8-12 on 2 cores). Workers keep up
    # to 256 MB of freed memory.
    "spark.executorEnv.MALLOC_MMAP_THRESHOLD_": "1073741824",
    "spark.executorEnv.MALLOC_TRIM_THRESHOLD_": "268435456",
    # A fresh Python worker must not start one BLAS thread per core: tasks set their own
    # count with configure_worker_threads(), and one thread per task is the safe start.
    "spark.executorEnv.OMP_NUM_THREADS": "1",
    "spark.executorEnv.OPENBLAS_NUM_THREADS": "1",
    "spark.executorEnv.MKL_NUM_THREADS": "1",
    # Training runs a job every few iterations: Spark's console stage bar would redraw over
    # our own progress bar dozens of times per epoch.
    "spark.ui.showConsoleProgress": "false",
    # Spark deletes a job's shuffle files and broadcasts only once the driver JVM
    # garbage-collects its RDDs, and that heap, mostly idle, can go 30 minutes (Spark's
    # default) without a collection: over 1,000 training iterations the files kept growing
    # (bench/RESULTS.md). DistriOptimizer now deletes its own shuffles after each job; this
    # bounds everything else (inference, user jobs, collectives never released).
    "spark.cleaner.periodicGC.interval": "1min",
}

# JVM options for short-lived JVMs on small machines: the C1 compiler only, and the serial
# collector. A young JVM's C2 compiler and G1's concurrent threads take CPU from the Python
# workers beside it; on 2 cores, C1 alone made LeNet iterations 15-28 % faster in the first
# minutes, but a Spark SQL aggregation 3.3 times slower (bench/RESULTS.md), so it is not a
# default. The test suite starts every Spark JVM with it (tests/conftest.py says what it
# saved), as do the cluster benches and tests; docs/deploy.md says how a job opts in.
LEAN_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

_PROPERTY_LINE = re.compile(r"^\s*([^\s=:]+)\s*[=:\s]\s*(.*?)\s*$")
_LOCAL_MASTER = re.compile(r"^local(?:\[(\*|\d+)(?:\s*,\s*\d+)?\])?$")
_LOCAL_CLUSTER_MASTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]$")


def parse_spark_defaults(text: str) -> dict[str, str]:
    """Parse the text of a ``spark-defaults.conf`` file into a dict.

    Lines are ``key value`` (whitespace, ``=`` or ``:`` between them); blank lines and lines
    starting with ``#`` or ``!`` are comments, as in Java properties files.

    Raises
    ------
    ValueError
        If a non-comment line has no value.
    """
    settings = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        match = _PROPERTY_LINE.match(stripped)
        if match is None or not match.group(2):
            raise ValueError(f"spark-defaults line {number} has no value: {line!r}")
        settings[match.group(1)] = match.group(2)
    return settings


def _user_defaults_file() -> dict[str, str]:
    """Settings from the spark-defaults.conf that spark-submit itself would read, if any."""
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if conf_dir is None and os.environ.get("SPARK_HOME"):
        conf_dir = os.path.join(os.environ["SPARK_HOME"], "conf")
    path = os.path.join(conf_dir, "spark-defaults.conf") if conf_dir else None
    if path is None or not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        return parse_spark_defaults(handle.read())


def _launcher_settings() -> dict[str, str]:
    """Settings the user already chose outside Python, which our defaults must not override.

    Under ``spark-submit`` (or the ``pyspark`` shell) the driver JVM is running before Python
    starts and holds the ``--conf`` values; PySpark's builder would override them silently,
    so we read them first. SparkContext has no public way to attach to that JVM without
    creating a context, hence the one private call, guarded.
    """
    settings = _user_defaults_file()
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return settings
    from pyspark import SparkConf, SparkContext

    try:
        SparkContext._ensure_initialized()  # attaches to the running JVM; launches nothing
    except Exception:  # a PySpark without this hook: fall back to the file's settings
        return settings
    settings.update(dict(SparkConf().getAll()))
    return settings


def get_spark(
    master: str | None = None,
    app_name: str = DEFAULT_APP_NAME,
    conf: Mapping[str, str] | None = None,
    *,
    recommended: bool = True,
) -> SparkSession:
    """Return the active SparkSession, or start one with bigdl_py's recommended settings.

    Parameters
    ----------
    master : str, optional
        Spark master URL. Defaults to the one given to ``spark-submit`` or, in a plain Python
        process, ``"local[*]"``. For an active session it must match the session's master.
    app_name : str
        Application name shown in the Spark UI (ignored for an active session).
    conf : mapping of str to str, optional
        Extra settings; they win over :data:`RECOMMENDED_CONF`.
    recommended : bool
        Apply :data:`RECOMMENDED_CONF` to the settings neither ``conf`` nor the launcher
        (``spark-submit --conf``, ``$SPARK_CONF_DIR/spark-defaults.conf``) chose.

    Returns
    -------
    pyspark.sql.SparkSession

    Raises
    ------
    ValueError
        If a session is active with a different master than ``master``.

    Notes
    -----
    Most settings are read when the SparkContext starts. When a session is already active it
    is returned as is, with a warning naming the requested settings it does not have.
    """
    from pyspark.sql import SparkSession

    requested = {key: str(value) for key, value in (conf or {}).items()}
    active = SparkSession.getActiveSession()
    if active is not None:
        active_conf = active.sparkContext.getConf()
        if master is not None and master != active_conf.get("spark.master"):
            raise ValueError(
                f"get_spark: a SparkSession with master {active_conf.get('spark.master')!r} "
                f"is active; cannot switch to master {master!r} (stop it first)"
            )
        differing = sorted(key for key, value in requested.items() if active_conf.get(key) != value)
        if differing:
            warnings.warn(
                f"get_spark: returning the active SparkSession, which does not have the "
                f"requested settings {differing}; they apply only to a new session",
                stacklevel=2,
            )
        return active

    launcher = _launcher_settings()
    settings = {}
    if recommended:
        settings.update(
            {key: value for key, value in RECOMMENDED_CONF.items() if key not in launcher}
        )
    settings.update(requested)
    check_master_reachable(master or settings.get("spark.master") or launcher.get("spark.master"))
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif "spark.master" not in launcher and "spark.master" not in settings:
        builder = builder.master(DEFAULT_MASTER)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def check_master_reachable(master: str | None, timeout: float = 5.0) -> None:
    """Refuse a standalone master (``spark://host:port[,host:port]``) nobody answers at.

    Without this check Spark retries for over a minute, prints pages of Java and ends with
    "Cannot call methods on a stopped SparkContext". Other masters (local, yarn, k8s) are
    left to Spark.

    Raises
    ------
    ConnectionError
        Naming the master and why each of its addresses failed.
    """
    import socket

    if not master or not master.startswith("spark://"):
        return
    failures = []
    for address in master[len("spark://") :].split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return
        except (OSError, ValueError) as error:
            failures.append(f"{address}: {error}")
    raise ConnectionError(
        f"could not reach the Spark master at {master} ({'; '.join(failures)}); is the master "
        "running, and is the address right (--master / spark.master)?"
    )


def partition_count(sc: SparkContext, num_partitions: int | None) -> int:
    """``num_partitions`` checked, or the cluster's :func:`task_slots` when it is None."""
    if num_partitions is None:
        return task_slots(sc)
    if isinstance(num_partitions, bool) or int(num_partitions) < 1:
        raise ValueError(f"num_partitions must be a positive integer, got {num_partitions!r}")
    return int(num_partitions)


def task_slots(sc: SparkContext) -> int:
    """How many tasks the cluster runs at once: the default number of partitions to use.

    ``local[n]`` gives ``n // spark.task.cpus``; ``local-cluster[e, c, m]`` gives
    ``e * (c // spark.task.cpus)``; other masters use ``spark.executor.instances`` and
    ``spark.executor.cores`` when both are set, and otherwise ``sc.defaultParallelism``, which
    is the total number of executor cores once the executors have registered (with dynamic
    allocation it is only what is running now).

    Parameters
    ----------
    sc : pyspark.SparkContext

    Returns
    -------
    int
        At least 1.
    """
    conf = sc.getConf()
    cpus_per_task = max(1, int(conf.get("spark.task.cpus", "1")))
    master = sc.master
    local = _LOCAL_MASTER.match(master)
    if local is not None:
        cores_text = local.group(1) or "1"
        if cores_text == "*":
            explicit = conf.get("spark.default.parallelism")
            cores = (os.cpu_count() or 1) if explicit else sc.defaultParallelism
        else:
            cores = int(cores_text)
        return max(1, cores // cpus_per_task)
    cluster = _LOCAL_CLUSTER_MASTER.match(master)
    if cluster is not None:
        executors, cores = int(cluster.group(1)), int(cluster.group(2))
        return max(1, executors * (cores // cpus_per_task))
    instances, cores = conf.get("spark.executor.instances"), conf.get("spark.executor.cores")
    if instances and cores:
        return max(1, int(instances) * (int(cores) // cpus_per_task))
    return max(1, sc.defaultParallelism // cpus_per_task)


def executor_layout(sc: SparkContext) -> tuple[int, int]:
    """``(executors, cores of each)`` of the executors registered so far: in local mode one
    executor of :func:`task_slots` cores; elsewhere ``spark.executor.cores`` when set, else
    the cluster's cores (``sc.defaultParallelism``) shared out evenly."""
    if is_local_mode(sc):
        return 1, task_slots(sc) * max(1, int(sc.getConf().get("spark.task.cpus", "1")))
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()  # the driver's entry included
    driver = sc.getConf().get("spark.driver.host")
    executors = max(1, sum(1 for info in infos if info.host() != driver) or len(infos))
    cores = sc.getConf().get("spark.executor.cores")
    return executors, int(cores) if cores else max(1, sc.defaultParallelism // executors)


def task_profile(cpus: int):
    """A ResourceProfile whose tasks take ``cpus`` CPUs each (stage-level scheduling, task
    resources only: standalone, YARN and Kubernetes run it without dynamic allocation)."""
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    return ResourceProfileBuilder().require(TaskResourceRequests().cpus(int(cpus))).build


def is_local_mode(sc: SparkContext) -> bool:
    """Whether Spark runs in this one process (``local``, ``local[n]``, ``local[*]``):
    every partition on one machine, in one executor."""
    return _LOCAL_MASTER.match(sc.master) is not None


def executors_share_a_disk(sc: SparkContext) -> bool:
    """Whether every executor can read the files another one wrote on its local disk.

    True in local and local-cluster mode, when ``BIGDL_PY_STATE_DIR`` names a directory
    (meant to be shared), and when every executor registered so far runs on one host (a
    standalone cluster on one machine). Spark places a task that reads a shuffle on any
    executor; bigdl_py's per-host files then must be reachable from all of them.
    """
    if _LOCAL_MASTER.match(sc.master) or _LOCAL_CLUSTER_MASTER.match(sc.master):
        return True
    if os.environ.get("BIGDL_PY_STATE_DIR"):
        return True
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()  # the driver's entry included
    hosts = {info.host() for info in infos}
    return len(hosts) <= 1


def set_job_description(sc: SparkContext, description: str | None) -> None:
    """Label the jobs this thread starts from now on in the Spark UI (``None`` clears it)."""
    sc.setLocalProperty("spark.job.description", description)  # type: ignore[arg-type]


@contextlib.contextmanager
def job_description(sc: SparkContext, description: str) -> Iterator[None]:
    """Label the jobs started inside the ``with`` block, then restore the previous label.

    Examples
    --------
    >>> with job_description(sc, "iteration 42: forward-backward + update"):  # doctest: +SKIP
    ...     rdd.count()
    """
    previous = sc.getLocalProperty("spark.job.description")
    set_job_description(sc, description)
    try:
        yield
    finally:
        set_job_description(sc, previous)


@contextlib.contextmanager
def job_group(
    sc: SparkContext, group_id: str, description: str, interrupt_on_cancel: bool = False
) -> Iterator[None]:
    """Put the jobs started inside the block in one group (``sc.cancelJobGroup`` stops them).

    The previous group and description of this thread are restored on exit.
    """
    keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
    previous = {key: sc.getLocalProperty(key) for key in keys}
    sc.setJobGroup(group_id, description, interrupt_on_cancel)
    try:
        yield
    finally:
        for key, value in previous.items():
            sc.setLocalProperty(key, value)  # type: ignore[arg-type]


# --- Spark Connect -----------------------------------------------------------------------------


class SparkConnectNotSupportedError(RuntimeError):
    """A Spark Connect session or DataFrame was given to something that needs the RDD API."""


def is_spark_connect(obj: object) -> bool:
    """Whether ``obj`` (a SparkSession or a DataFrame) belongs to a Spark Connect client.

    Recognised by the class's module, so neither pyspark's Connect modules (which need
    grpcio) nor a server are imported or reached.
    """
    return any(cls.__module__.startswith("pyspark.sql.connect") for cls in type(obj).__mro__)


def require_classic_spark(obj: object, what: str, instead: str) -> None:
    """Refuse a Spark Connect session or DataFrame up front, before any work.

    Parameters
    ----------
    obj : SparkSession or DataFrame (anything else passes)
    what : str
        What needs the RDD API, for the message (e.g. ``"DistriOptimizer"``).
    instead : str
        What the user can do instead, for the message.

    Raises
    ------
    SparkConnectNotSupportedError
        When ``obj`` comes from a Spark Connect session.
    """
    if obj is not None and is_spark_connect(obj):
        raise SparkConnectNotSupportedError(
            f"{what} needs Spark's RDD API (SparkContext, broadcast variables, RDD "
            "partitions), which a Spark Connect session (SparkSession.builder.remote(...)) "
            f"does not offer. {instead}"
        )


#: What a Connect user can do instead of training through Spark (for the messages).
CONNECT_TRAINING_ALTERNATIVE = (
    "Run the training where a classic session can start (spark-submit the job to the "
    "cluster, or SparkSession.builder.master(...) / bigdl_py.spark.get_spark() in a "
    "notebook on the cluster), or train in this process with LocalOptimizer on arrays "
    "collected with df.toArrow() / toPandas()."
)

#: What a Connect user can do instead of predict / evaluate / predict_udf (for the messages).
CONNECT_INFERENCE_ALTERNATIVE = (
    "From a Spark Connect client, save the model with bigdl_py.nn.save to storage the "
    "executors can read and build pyspark.ml.functions.predict_batch_udf with a "
    "make_predict_fn that calls bigdl_py.nn.load(path); or run in a classic session "
    "(SparkSession.builder.master(...), bigdl_py.spark.get_spark())."
)
