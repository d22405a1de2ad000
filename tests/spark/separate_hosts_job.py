"""Every training mode on a standalone cluster whose two workers act as separate hosts,
and every mode surviving the loss of one host mid-run.

Started by ``test_local_cluster.py`` in a subprocess. It starts (``scripts/local_cluster.sh
--hosts 127.0.0.2,127.0.0.3 --separate-disks``) a Spark master on 127.0.0.1 and two workers
bound to 127.0.0.2 and 127.0.0.3, each with its own temporary, work and local directories
(``TMPDIR``, ``--work-dir``, ``SPARK_LOCAL_DIRS``): no file one host writes is visible to the
other, as on two machines. DistriOptimizer sees two hosts that share no disk: it chains
iterations all the same, and the optimizer state and the partitions' rows travel with the
chain's records (and with the jobs, through the driver) instead of lying in host-local files.

For each mode: train uninterrupted (the exact modes are checked against LocalOptimizer);
train again and SIGKILL one host (its worker, executor JVM and Python workers) in the
middle of the chained job that runs iteration ``KILL_AT``, once ``KILL_AFTER_STAGES`` of its
stages have finished: Spark recomputes what the lost host held, and the weights must equal
the uninterrupted run's. Then the host comes back as a replaced machine would: a new worker
on the same address with fresh, empty directories, and the next mode waits for its
executor. The killed host alternates between modes, so each host is lost twice. Prints one
``RESULT {json}`` line; stops every process it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
from blob_data import (  # beside this script, so on its sys.path
    blobs,
    classifier,
    flat,
    local_reference_weights,
)
from local_cluster import TWO_HOSTS, LocalCluster  # noqa: E402

from bigdl_py.spark.session import LEAN_JVM_OPTIONS  # noqa: E402

HOSTS = TWO_HOSTS
# KILL_AT is 1-based: the job that runs it is killed (local SGD: inside its second round).
ITERATIONS, KILL_AT = 12, 6
MODES = ("sharded", "replicated", "local-sgd:4", "auto")
# Of the killed job's stages, this many finish first (fewer in a job of fewer stages: local
# SGD's two rounds and their average are three); a chain of 8 exact iterations has 9-16.
KILL_AFTER_STAGES = 3
# Every JVM here (master, workers, executors) lives a minute or less and runs little code:
# C2 compilation and the parallel collector's threads cost more than they give back on 2
# busy cores. With LEAN_JVM_OPTIONS the test took 217 s instead of 324 (load 15-17), worker
# restarts 12-15 s instead of 26-28. (The driver's come from tests/conftest.py.)


class Cluster(LocalCluster):
    """The two-host cluster (``scripts/local_cluster.py``), whose hosts this test kills."""

    def __init__(self, root: str):
        super().__init__(os.path.join(root, "cluster"), HOSTS, daemon_java_opts=LEAN_JVM_OPTIONS)

    def kill_host(self, host: str) -> None:
        """SIGKILL everything ``host`` runs: its worker and the executor JVM it started (one
        process group), the executor's PySpark daemon and its Python workers (another)."""
        worker = self.worker_pid(host)
        groups = set()
        for pid in process_tree(worker):
            try:
                groups.add(os.getpgid(pid))
            except ProcessLookupError:
                pass
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{worker}") and time.monotonic() < deadline:
            time.sleep(0.1)

    def replace_host(self, host: str) -> None:
        """A new, empty machine on ``host``'s address: a fresh worker with fresh directories."""
        self.replace_worker(host)


def process_tree(root: int) -> list[int]:
    """``root`` and every process descended from it, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    tree, pending = [], [root]
    while pending:
        tree.append(pending.pop())
        pending.extend(children.get(tree[-1], []))
    return tree


def executor_hosts(sc) -> list[str]:
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    driver = sc.getConf().get("spark.driver.host")
    return sorted(info.host() for info in infos if info.host() != driver)


def wait_for_executors(sc, count: int, timeout: float = 120.0) -> list[str]:
    """The executors' hosts once ``count`` executors have registered (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while len(executor_hosts(sc)) < count and time.monotonic() < deadline:
        time.sleep(0.5)
    return executor_hosts(sc)


class HostKiller:
    """Kills ``host`` in the middle of the chained job that runs iteration ``KILL_AT``.

    Wraps the runner's ``run_iterations`` (the loop hands it every iteration). While that
    job runs, a thread watches Spark's status tracker and kills the host once
    ``KILL_AFTER_STAGES`` of the job's stages have finished (a chain of several iterations
    has more stages than that: the host is lost mid-chain, with stages done on it that
    Spark must recompute). Should the job end first, nothing is killed and the next job
    tries again, so the host is lost while a job runs, never between two.
    """

    def __init__(self, cluster: Cluster, host: str, runner, sc):
        self.cluster, self.host, self.sc = cluster, host, sc
        self.run_iterations = runner.run_iterations
        self.lock = threading.Lock()
        self.running = False
        self.killed_at: int | None = None  # the 1-based first iteration of the killed job
        self.job_stages: int | None = None  # how many stages the killed job had
        self.stages_done: int | None = None  # and how many of them had finished
        runner.run_iterations = self

    def _finished_stages(self) -> tuple[int, int] | None:
        """(finished, all) stages of the running job, or None while none runs."""
        tracker = self.sc.statusTracker()
        for job in tracker.getActiveJobsIds():
            info = tracker.getJobInfo(job)
            if info is None:
                continue
            stages = [tracker.getStageInfo(stage) for stage in info.stageIds]
            finished = sum(
                1 for stage in stages if stage and stage.numCompletedTasks >= stage.numTasks
            )
            return finished, len(info.stageIds)
        return None

    def _watch(self, first: int) -> None:
        while True:
            with self.lock:
                if not self.running:
                    return
                progress = self._finished_stages()
                # Mid-chain: some stages done, at least one to come (local SGD's job of two
                # rounds has three stages).
                if (
                    progress is not None
                    and min(KILL_AFTER_STAGES, progress[1] - 2) <= progress[0] < progress[1]
                ):
                    self.cluster.kill_host(self.host)
                    self.killed_at, (self.stages_done, self.job_stages) = first + 1, progress
                    return
            time.sleep(0.01)

    def __call__(self, steps, stop_after_nonfinite):
        watcher = None
        with self.lock:
            self.running = True
        if self.killed_at is None and steps[-1].iteration + 1 >= KILL_AT:
            watcher = threading.Thread(target=self._watch, args=(steps[0].iteration,))
            watcher.start()
        try:
            return self.run_iterations(steps, stop_after_nonfinite)
        finally:
            with self.lock:
                self.running = False
            if watcher is not None:
                watcher.join()


def main() -> None:
    root = tempfile.mkdtemp(prefix="bigdl_py-hosts-")
    cluster = Cluster(root)
    report: dict = {}
    try:
        cluster.start()
        run(cluster, report)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print("RESULT " + json.dumps(report), flush=True)


def run(cluster: Cluster, report: dict) -> None:
    from bigdl_py import nn
    from bigdl_py.optim import SGD
    from bigdl_py.spark import DistriOptimizer, get_spark
    from bigdl_py.spark.session import executors_share_a_disk
    from bigdl_py.train import MaxIteration

    spark = get_spark(
        cluster.url,
        app_name="bigdl_py-separate-hosts-test",
        conf={
            **cluster.session_conf(),
            "spark.executor.memory": "512m",
            "spark.executor.extraJavaOptions": LEAN_JVM_OPTIONS,
        },
    )
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    report["executor_hosts"] = wait_for_executors(sc, 2)
    report["share_a_disk"] = executors_share_a_disk(sc)
    features, labels = blobs(samples=401)

    def optimizer(update):
        return DistriOptimizer(
            classifier(),
            (features, labels),
            nn.NLLLoss(),
            SGD(lr=0.1, momentum=0.9),
            batch_size=64,
            end_trigger=MaxIteration(ITERATIONS),
            num_partitions=2,
            update=update,
            progress=False,
        )

    def local_weights(distributed):
        return local_reference_weights(distributed, features, labels, ITERATIONS)

    report["modes"] = {}
    for number, update in enumerate(MODES):
        entry = report["modes"][update] = {"hosts_before": executor_hosts(sc)}
        started = time.perf_counter()
        with optimizer(update) as uninterrupted_run:
            uninterrupted = flat(uninterrupted_run.optimize())
            entry["iterations_per_call"] = uninterrupted_run.runner.iterations_per_call
            if update == "local-sgd:4":  # not LocalOptimizer's mathematics: it must move
                entry["moved"] = float(np.abs(uninterrupted - flat(classifier())).max())
            else:
                local = local_weights(uninterrupted_run)
                entry["max_abs_error_against_local"] = float(np.abs(uninterrupted - local).max())
        entry["uninterrupted_seconds"] = time.perf_counter() - started

        lost = HOSTS[(number + 1) % 2]
        started = time.perf_counter()
        killed = lose_a_host_while_training(cluster, optimizer(update), lost, uninterrupted, sc)
        entry.update(killed)
        entry["hosts_after"] = executor_hosts(sc)
        entry["killed_run_seconds"] = time.perf_counter() - started
        if number < len(MODES) - 1 and entry["killed"]:  # a new machine for the next mode
            started = time.perf_counter()
            cluster.replace_host(lost)
            wait_for_executors(sc, 2)
            entry["replace_seconds"] = time.perf_counter() - started
    spark.stop()


def lose_a_host_while_training(cluster: Cluster, optimizer, host: str, expected, sc) -> dict:
    """Train with ``optimizer`` while ``host`` is killed; how it went against ``expected``."""
    killer = HostKiller(cluster, host, optimizer.runner, sc)
    with optimizer:
        survived = flat(optimizer.optimize())
    return {
        "killed": host if killer.killed_at is not None else None,
        "killed_in_job_from_iteration": killer.killed_at,
        "killed_job_stages": killer.job_stages,
        "killed_after_stages": killer.stages_done,
        "iterations": optimizer.state.iteration,
        "killed_run_max_abs_difference": float(np.abs(survived - expected).max()),
    }


if __name__ == "__main__":
    sys.exit(main())
