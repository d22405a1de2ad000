"""Run the collectives on ``local-cluster[2,1,1024]`` and print what happened as JSON.

Started by ``test_local_cluster.py`` in a subprocess: a second SparkContext cannot live in
the test process beside the session fixture. local-cluster starts a standalone master, two
workers and two executor JVMs from the pip-installed pyspark, so this also checks that the
package needs nothing beyond ``pip install pyspark`` and Java.
"""

from __future__ import annotations

import json
import os

import numpy as np

from bigdl_py.spark import collectives
from bigdl_py.spark.session import RECOMMENDED_CONF, get_spark, task_slots

MASTER = "local-cluster[2,1,1024]"


def _executor_of_this_worker(iterator):
    """The process id of the executor JVM running this Python worker, and its main class."""
    for _ in iterator:
        pass
    # A Python worker is forked by the pyspark daemon, which the executor JVM started.
    daemon = os.getppid()
    with open(f"/proc/{daemon}/status") as status:
        jvm = next(int(line.split()[1]) for line in status if line.startswith("PPid:"))
    with open(f"/proc/{jvm}/cmdline", "rb") as cmdline:
        command = cmdline.read().replace(b"\0", b" ").decode()
    yield jvm, "CoarseGrainedExecutorBackend" in command


def main() -> None:
    spark = get_spark(MASTER, app_name="bigdl_py-local-cluster-test")
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
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
    spark.stop()
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
