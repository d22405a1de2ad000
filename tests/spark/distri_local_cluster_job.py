"""DistriOptimizer on ``local-cluster[2,1,2048]``, with one executor JVM killed mid-run.

Started by ``test_local_cluster.py`` in a subprocess (a second SparkContext cannot live
beside the test session), as ``distri_local_cluster_job.py UPDATE ITERATIONS_PER_JOB``.
Shortly after the job that runs iteration ``KILL_AFTER`` starts, it SIGKILLs one executor
JVM: Spark re-runs the lost tasks elsewhere, recomputes lost shuffle outputs (a chained
job's earlier stages) and cached partition handles from lineage, and the optimizer state
is picked up from the host-local state files. The final weights must equal an
uninterrupted run's: for the exact modes a LocalOptimizer on the same global batches, for
local SGD (``UPDATE`` = ``local-sgd:K``) the same DistriOptimizer run first without a kill.
Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import numpy as np
from blob_data import (  # beside this script, so on its sys.path
    blobs,
    classifier,
    flat,
    local_reference_weights,
)

from bigdl_py import nn
from bigdl_py.optim import SGD
from bigdl_py.spark.distri_optimizer import DistriOptimizer
from bigdl_py.spark.session import get_spark
from bigdl_py.train import MaxIteration

MASTER = "local-cluster[2,1,2048]"
ITERATIONS, KILL_AFTER = 30, 10


def executor_jvm(rows):
    """The process id of the executor JVM that runs this Python worker."""
    for _ in rows:
        pass
    daemon = os.getppid()  # workers are forked by the pyspark daemon the executor started
    with open(f"/proc/{daemon}/status") as status:
        yield next(int(line.split()[1]) for line in status if line.startswith("PPid:"))


def main(update: str = "sharded", iterations_per_job: int = 8) -> None:
    spark = get_spark(MASTER, app_name="bigdl_py-distri-local-cluster-test")
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    features, labels = blobs(samples=601)

    def distri_optimizer():
        return DistriOptimizer(
            classifier(),
            (features, labels),
            nn.NLLLoss(),
            SGD(lr=0.1, momentum=0.9),
            batch_size=64,
            end_trigger=MaxIteration(ITERATIONS),
            iterations_per_job=iterations_per_job,
            update=update,
            progress=False,
        )

    uninterrupted = None
    if update.startswith("local-sgd"):  # not LocalOptimizer's mathematics: its own run
        with distri_optimizer() as reference_run:
            uninterrupted = flat(reference_run.optimize())
    optimizer = distri_optimizer()
    jvms_before = sorted(set(sc.parallelize(range(8), 8).mapPartitions(executor_jvm).collect()))
    killed = []
    run_iterations = optimizer.runner.run_iterations

    running = {"job": False, "killed_while_running": False}

    def kill():
        # Once a task of the job runs (polled): a fixed delay raced the job's end as the
        # engine got faster (a LocalSGD job of 8 iterations took under 0.3 s).
        tracker = sc.statusTracker()
        deadline = time.perf_counter() + 30
        while time.perf_counter() < deadline:
            stages = [tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds()]
            if any(stage is not None and stage.numActiveTasks > 0 for stage in stages):
                break
            time.sleep(0.002)
        running["killed_while_running"] = running["job"]
        os.kill(jvms_before[-1], signal.SIGKILL)
        killed.append(jvms_before[-1])

    def run_and_kill(steps, stop_after_nonfinite):
        timer = None
        if not killed and steps[0].iteration < KILL_AFTER <= steps[-1].iteration + 1:
            timer = threading.Thread(target=kill)  # while the job runs (reported below)
            timer.start()
        running["job"] = True
        try:
            return run_iterations(steps, stop_after_nonfinite)
        finally:
            running["job"] = False
            if timer is not None:
                timer.join()

    optimizer.runner.run_iterations = run_and_kill  # the loop hands it every iteration
    started = time.perf_counter()
    with optimizer:
        distributed = flat(optimizer.optimize())
    seconds = time.perf_counter() - started
    jvms_after = sorted(set(sc.parallelize(range(8), 8).mapPartitions(executor_jvm).collect()))

    if uninterrupted is None:
        uninterrupted = local_reference_weights(optimizer, features, labels, ITERATIONS)
    local = uninterrupted
    report = {
        "master": sc.master,
        "update": update,
        "iterations_per_job": iterations_per_job,
        "partitions": optimizer.num_partitions,
        "iterations": optimizer.state.iteration,
        "executor_jvms_before": jvms_before,
        "executor_jvms_after": jvms_after,
        "killed": killed,
        "killed_while_running": running["killed_while_running"],
        "relative_error": float(np.abs(distributed - local).max() / np.abs(local).max()),
        "moved": float(np.abs(local - flat(classifier())).max()),
        "seconds": seconds,
    }
    print("RESULT " + json.dumps(report), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
