"""One ``local-cluster[2,1,2048]`` application for the tests of ``test_local_cluster.py``.

Started in a subprocess (a second SparkContext cannot live in the test process beside the
session fixture), as ``local_cluster_job.py ITERATIONS_PER_JOB UPDATE [UPDATE ...]``.
local-cluster starts a standalone master, two workers and two executor JVMs from the
pip-installed pyspark, so this also checks that the package needs nothing beyond
``pip install pyspark`` and Java. Starting it takes 20-70 s on 2 cores, so one application
serves every check, one after another:

1. The collectives across the two executor JVMs, against NumPy.
2. For each ``UPDATE``, DistriOptimizer with one executor JVM killed mid-run: while the job
   that runs iteration ``KILL_AFTER`` runs, it SIGKILLs one executor JVM (a task of that
   executor holds inside the job until it is killed: see :class:`HoldUntilKilled`). Spark
   re-runs the lost tasks elsewhere, recomputes lost shuffle outputs (a chained job's
   earlier stages) and cached partition handles from lineage, and the optimizer state is
   picked up from the host-local state files. The final weights must equal an uninterrupted
   run's: for the exact modes a LocalOptimizer on the same global batches, for local SGD
   (``local-sgd:K``) the same DistriOptimizer run first without a kill. The worker starts a
   new executor JVM for the one killed; the next update waits for it. A pipeline
   (``pipeline:K:M``) holds in whichever of its two stages the killed JVM runs.
3. A pipeline of more stages than the cluster's two task slots is refused, by name.

Prints one ``RESULT {json}`` line: ``{"collectives": {...}, "modes": {UPDATE: {...}},
"pipeline_refused": message}``.
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
from blob_data import (  # beside this script, so on its sys.path
    blobs,
    classifier,
    flat,
    local_reference_weights,
)

from bigdl_py import nn
from bigdl_py.optim import SGD
from bigdl_py.spark import Pipeline, collectives
from bigdl_py.spark.distri_optimizer import DistriOptimizer
from bigdl_py.spark.session import LEAN_JVM_OPTIONS, RECOMMENDED_CONF, get_spark, task_slots
from bigdl_py.train import MaxIteration

MASTER = "local-cluster[2,1,2048]"
ITERATIONS, KILL_AFTER = 24, 10  # the kill lands in the second of three chained jobs
# How long the worker may take to start a new executor JVM for a killed one.
REPLACEMENT_SECONDS = 180


def this_executor_jvm() -> int:
    """The process id of the executor JVM that runs this Python worker."""
    daemon = os.getppid()  # workers are forked by the pyspark daemon the executor started
    with open(f"/proc/{daemon}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("PPid:"))


def executor_jvm(rows):
    for _ in rows:
        pass
    yield this_executor_jvm()


def _executor_of_this_worker(iterator):
    """The process id of the executor JVM running this Python worker, and its main class."""
    jvm = next(executor_jvm(iterator))
    with open(f"/proc/{jvm}/cmdline", "rb") as cmdline:
        command = cmdline.read().replace(b"\0", b" ").decode()
    yield jvm, "CoarseGrainedExecutorBackend" in command


def collectives_report(sc) -> dict:
    """What the collectives did on the executors: results against NumPy's, a barrier's."""
    report = {
        "master": sc.master,
        "task_slots": task_slots(sc),
        "recommended_applied": all(
            sc.getConf().get(key) == value for key, value in RECOMMENDED_CONF.items()
        ),
    }
    executors = sc.parallelize(range(8), 8).mapPartitions(_executor_of_this_worker).collect()
    report["executor_jvms"] = sorted({jvm for jvm, _ in executors})
    report["all_executor_backends"] = all(is_executor for _, is_executor in executors)

    rng = np.random.default_rng(0)
    errors = {}
    for count in (2, 4):
        arrays = [rng.standard_normal(1001).astype(np.float32) for _ in range(count)]
        expected = np.sum(arrays, axis=0)
        rdd = collectives.scatter(sc, arrays)
        for via in collectives.ALL_GATHER_ROUTES:
            result_rdd = collectives.all_reduce(rdd, "sum", via=via)
            results = result_rdd.collect()
            collectives.release(result_rdd)
            errors[f"all_reduce N={count} via={via}"] = max(
                float(np.max(np.abs(result - expected))) for result in results
            )
        gathered = collectives.all_gather(rdd, concatenate=True).collect()
        errors[f"all_gather N={count}"] = max(
            float(np.max(np.abs(result - np.concatenate(arrays)))) for result in gathered
        )
    pair = collectives.scatter(sc, [np.zeros(2), np.ones(2)])
    messages = collectives.barrier(
        pair, lambda array, context: sorted(context.allGather(str(context.partitionId())))
    ).collect()
    report["barrier_messages"] = messages
    report["max_abs_errors"] = errors
    return report


class HoldUntilKilled(nn.Module):
    """Identity, except once: after the driver creates ``armed``, the first forward pass in
    the executor JVM ``target`` creates ``holding`` and waits there until that JVM is killed.

    So the kill lands inside a running task, however fast the job or however late Spark's
    status tracker reports it (a poll of the tracker raced the job's end under load). It has
    no parameters: the model's weights and arithmetic are the classifier's.
    """

    def __init__(self, directory: str, target: int):
        super().__init__()
        self.armed = os.path.join(directory, "armed")
        self.holding = os.path.join(directory, "holding")
        self.target = target

    def forward(self, x):
        if os.path.exists(self.armed) and not os.path.exists(self.holding):
            if this_executor_jvm() == self.target:
                open(self.holding, "x").close()
                deadline = time.monotonic() + 120
                daemon = os.getppid()
                while time.monotonic() < deadline and os.getppid() == daemon:
                    time.sleep(0.05)  # the kill ends this process's daemon, then this loop
        return x


def executor_jvms(sc) -> list[int]:
    return sorted(set(sc.parallelize(range(8), 8).mapPartitions(executor_jvm).collect()))


def wait_for_two_executors(sc) -> list[int]:
    """The two executor JVMs, once the worker has replaced one killed before."""
    deadline = time.monotonic() + REPLACEMENT_SECONDS
    jvms = executor_jvms(sc)
    while len(jvms) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        jvms = executor_jvms(sc)
    return jvms


def survive_a_killed_executor(sc, update: str, iterations_per_job: int) -> dict:
    """Train ``update`` while one executor JVM is killed mid-run; what happened."""
    features, labels = blobs(samples=601)

    def distri_optimizer(model):
        mode = update
        if update.startswith("pipeline"):  # a hold in each stage: the split keeps them apart
            stages, micro_batches = (int(n) for n in update.split(":")[1:3])
            mode = Pipeline(stages, micro_batches, split=[3])
        return DistriOptimizer(
            model,
            (features, labels),
            nn.NLLLoss(),
            SGD(lr=0.1, momentum=0.9),
            batch_size=64,
            end_trigger=MaxIteration(ITERATIONS),
            iterations_per_job=iterations_per_job,
            update=mode,
            progress=False,
        )

    uninterrupted = None
    if update.startswith("local-sgd"):  # not LocalOptimizer's mathematics: its own run
        with distri_optimizer(classifier()) as reference_run:
            uninterrupted = flat(reference_run.optimize())
    jvms_before = wait_for_two_executors(sc)
    signals = tempfile.mkdtemp(prefix="bigdl_py-kill-")
    hold = HoldUntilKilled(signals, jvms_before[-1])
    if update.startswith("pipeline"):
        first, tanh, second, log_softmax = classifier().children()
        stage_hold = HoldUntilKilled(signals, jvms_before[-1])  # the same files: holds once
        model = nn.Sequential(hold, first, tanh, stage_hold, second, log_softmax)
    else:
        model = nn.Sequential(hold, classifier())
    optimizer = distri_optimizer(model)
    killed = []
    run_iterations = optimizer.runner.run_iterations

    running = {"job": False, "killed_while_running": False}

    def kill():
        # Once a task of the job holds in the JVM to kill; if the job ends first (the other
        # executor ran every forward pass), the next job tries again.
        while running["job"] and not os.path.exists(hold.holding):
            time.sleep(0.002)
        if os.path.exists(hold.holding):
            running["killed_while_running"] = running["job"]
            os.kill(jvms_before[-1], signal.SIGKILL)
            killed.append(jvms_before[-1])

    def run_and_kill(steps, stop_after_nonfinite):
        timer = None
        running["job"] = True
        if not killed and KILL_AFTER <= steps[-1].iteration + 1:
            open(hold.armed, "a").close()
            timer = threading.Thread(target=kill)  # while the job runs (reported below)
            timer.start()
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
    jvms_after = executor_jvms(sc)

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
    shutil.rmtree(signals, ignore_errors=True)
    return report


def refuse_more_stages_than_slots() -> str:
    """The error of a pipeline of three stages on two task slots (none is trained)."""
    features, labels = blobs()
    optimizer = DistriOptimizer(
        nn.Sequential(*classifier().children()),
        (features, labels),
        nn.NLLLoss(),
        SGD(lr=0.1),
        batch_size=30,
        end_trigger=MaxIteration(1),
        update=Pipeline(stages=3),
        progress=False,
    )
    with optimizer:
        try:
            optimizer.optimize()
        except ValueError as error:
            return str(error)
    return "not refused"


def main(iterations_per_job: int, updates: list[str]) -> None:
    # The executor JVMs start as lean as the driver (tests/conftest.py says why).
    spark = get_spark(
        MASTER,
        app_name="bigdl_py-local-cluster-test",
        conf={"spark.executor.extraJavaOptions": LEAN_JVM_OPTIONS},
    )
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    report = {"collectives": collectives_report(sc), "modes": {}}
    for update in updates:
        report["modes"][update] = survive_a_killed_executor(sc, update, iterations_per_job)
    report["pipeline_refused"] = refuse_more_stages_than_slots()
    spark.stop()
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
