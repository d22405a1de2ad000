"""Every training mode on a standalone cluster whose two workers act as separate hosts.

Started by ``test_separate_hosts.py`` in a subprocess. It starts a Spark master on 127.0.0.1
and two workers bound to 127.0.0.2 and 127.0.0.3, each with its own temporary, work and
local directories (``TMPDIR``, ``--work-dir``, ``SPARK_LOCAL_DIRS``): no file one host writes
is visible to the other, as on two machines. DistriOptimizer sees two hosts, so it chains
nothing and the optimizer state travels with the jobs instead of lying in host-local files.
Each mode trains uninterrupted; then the sharded update trains again and one host (its
worker and executor JVMs) is SIGKILLed mid-run: the weights must equal the uninterrupted
run's. Prints one ``RESULT {json}`` line; stops every process it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
from blob_data import blobs, classifier, flat  # beside this script, so on its sys.path

HOSTS = ("127.0.0.2", "127.0.0.3")
ITERATIONS, KILL_AFTER = 16, 6
MODES = ("sharded", "replicated", "local-sgd:4", "auto")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_line(path: str, text: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return
        time.sleep(0.5)
    raise RuntimeError(f"{path} did not say {text!r} within {timeout} s")


class Cluster:
    """A master and one worker per host, each a ``spark-class`` process group of its own."""

    def __init__(self, root: str):
        import pyspark

        self.root = root
        self.spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
        self.processes: dict[str, subprocess.Popen] = {}
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, host: str, arguments: list[str], extra_env: dict) -> str:
        log = os.path.join(self.root, f"{name}.log")
        environment = {**os.environ, "SPARK_LOCAL_IP": host, **extra_env}
        environment["SPARK_HOME"] = os.path.dirname(os.path.dirname(self.spark_class))
        with open(log, "w") as output:
            self.processes[name] = subprocess.Popen(
                [self.spark_class, *arguments],
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environment,
                start_new_session=True,  # its own process group: the executors it starts too
            )
        return log

    def start(self) -> None:
        log = self._start(
            "master",
            "127.0.0.1",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                "0",
            ],
            {},
        )
        wait_for_line(log, "Starting Spark master at")
        logs = []
        for host in HOSTS:
            directories = {
                kind: os.path.join(self.root, host, kind) for kind in ("tmp", "work", "local")
            }
            for path in directories.values():
                os.makedirs(path)
            logs.append(
                self._start(
                    f"worker-{host}",
                    host,
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        host,
                        "--port",
                        "0",
                        "--webui-port",
                        "0",
                        "--cores",
                        "1",
                        "--memory",
                        "1g",
                        "--work-dir",
                        directories["work"],
                        self.url,
                    ],
                    # Executors inherit their worker's environment: their Python workers put
                    # bigdl_py's host-local files under this host's TMPDIR.
                    {"TMPDIR": directories["tmp"], "SPARK_LOCAL_DIRS": directories["local"]},
                )
            )
        for worker_log in logs:
            wait_for_line(worker_log, "Successfully registered with master")

    def kill_host(self, host: str) -> None:
        """SIGKILL the worker of ``host`` and the executor JVM it started (its group)."""
        os.killpg(self.processes[f"worker-{host}"].pid, signal.SIGKILL)

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=30)


def executor_hosts(sc) -> list[str]:
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    driver = sc.getConf().get("spark.driver.host")
    return sorted(info.host() for info in infos if info.host() != driver)


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
    from bigdl_py.train import LocalOptimizer, MaxIteration

    spark = get_spark(
        cluster.url,
        app_name="bigdl_py-separate-hosts-test",
        conf={
            "spark.driver.host": "127.0.0.1",
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
        },
    )
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    deadline = time.monotonic() + 120
    while len(executor_hosts(sc)) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    report["executor_hosts"] = executor_hosts(sc)
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

    weights, errors, per_job = {}, {}, {}
    for update in MODES:
        with optimizer(update) as run_once:
            weights[update] = flat(run_once.optimize())
            per_job[update] = run_once.runner.iterations_per_call
            if update != "local-sgd:4":  # exact: LocalOptimizer on the same global batches
                local = LocalOptimizer(
                    classifier(),
                    run_once.local_reference_dataset(features, labels),
                    nn.NLLLoss(),
                    SGD(lr=0.1, momentum=0.9),
                    batch_size=64,
                    end_trigger=MaxIteration(ITERATIONS),
                    progress=False,
                ).optimize()
                expected = flat(local)
                errors[update] = float(np.abs(weights[update] - expected).max())
    report["iterations_per_call"] = per_job
    report["max_abs_error_against_local"] = errors
    report["local_sgd_moved"] = float(np.abs(weights["local-sgd:4"] - flat(classifier())).max())

    killed = []
    killing = optimizer("sharded")
    run_iterations = killing.runner.run_iterations

    def run_and_kill(steps, stop_after_nonfinite):
        if not killed and steps[0].iteration + 1 == KILL_AFTER:
            timer = threading.Timer(0.05, lambda: (cluster.kill_host(HOSTS[1]), killed.append(1)))
            timer.start()
            try:
                return run_iterations(steps, stop_after_nonfinite)
            finally:
                timer.join()
        return run_iterations(steps, stop_after_nonfinite)

    killing.runner.run_iterations = run_and_kill
    with killing:
        survived = flat(killing.optimize())
    report["killed"] = bool(killed)
    report["hosts_after"] = executor_hosts(sc)
    report["killed_run_max_abs_difference"] = float(np.abs(survived - weights["sharded"]).max())
    report["iterations"] = killing.state.iteration
    spark.stop()


if __name__ == "__main__":
    sys.exit(main())
