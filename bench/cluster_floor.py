"""Spark's floor on the two-host cluster: what one chained stage costs with no model in it.

    python bench/cluster_floor.py [--rounds 2] [--variants base executor-c1 all-c1]
                                  [--iterations 16] [--jobs 6] [--warm-s 20]

Starts the cluster ``bench/time_to_accuracy.py --cluster`` measures on (two 1-core workers
on 127.0.0.2 and 127.0.0.3, no shared disk; ``scripts/local_cluster.py``), then, per round,
one fresh application per settings variant in turn (A/B/A/B): each runs chained jobs of
``--iterations`` one-stage iterations (``spark_floor.py chain``'s all-to-all shuffle of tiny
records, as the replicated update chains them) for ``--warm-s`` seconds to warm its JVMs,
then times ``--jobs`` of them. It prints each application's milliseconds per stage
(median of its jobs) and the median per variant over all rounds, with the load average and
the commit. The variants add JVM options to every contender's session:

* ``base`` — ``time_to_accuracy.cluster_session_conf``, bigdl_py's recommended settings;
* ``executor-c1`` — executors started with the C1 compiler only and the serial collector
  (``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC``): less JIT and GC work competing for the
  cores with the Python workers;
* ``all-c1`` — the driver too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, ROOT)
sys.path.insert(0, BENCH_DIR)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from local_cluster import TWO_HOSTS, LocalCluster  # noqa: E402

from bigdl_py.spark.session import LEAN_JVM_OPTIONS  # noqa: E402

VARIANTS = {
    "base": {},
    "executor-c1": {"spark.executor.extraJavaOptions": LEAN_JVM_OPTIONS},
    "all-c1": {
        "spark.executor.extraJavaOptions": LEAN_JVM_OPTIONS,
        "spark.driver.extraJavaOptions": LEAN_JVM_OPTIONS,
    },
}


def run_child(master: str, conf: dict, iterations: int, jobs: int, warm_seconds: float) -> None:
    """In a fresh application: ms per stage of ``jobs`` chained jobs, after the warm-up."""
    from spark_floor import _chained_iterations

    from bigdl_py.spark import get_spark

    spark = get_spark(master, app_name="cluster floor", conf=conf)
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    started = time.monotonic()
    while time.monotonic() - started < warm_seconds:
        _chained_iterations(sc, 2, iterations, 1)
    per_stage = []
    for _ in range(jobs):
        job_started = time.perf_counter()
        _chained_iterations(sc, 2, iterations, 1)
        per_stage.append((time.perf_counter() - job_started) / iterations * 1000)
    spark.stop()
    print("RESULT " + json.dumps(per_stage), flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--iterations", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--warm-s", type=float, default=20.0)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # master, conf
    arguments = parser.parse_args(argv)
    if arguments.child:
        master, conf = arguments.child
        run_child(master, json.loads(conf), arguments.iterations, arguments.jobs, arguments.warm_s)
        return

    from time_to_accuracy import cluster_session_conf, commit

    print(f"load average {os.getloadavg()}, commit {commit()}", flush=True)
    per_variant: dict[str, list[float]] = {name: [] for name in arguments.variants}
    with tempfile.TemporaryDirectory(prefix="bigdl_py-floor-") as directory:
        with LocalCluster(directory, TWO_HOSTS, memory="2g") as cluster:
            base = cluster_session_conf(cluster)
            for round_number in range(arguments.rounds):
                for name in arguments.variants:
                    conf = json.dumps({**base, **VARIANTS[name]})
                    command = [sys.executable, __file__, "--child", cluster.url, conf]
                    command += ["--iterations", str(arguments.iterations)]
                    command += ["--jobs", str(arguments.jobs), "--warm-s", str(arguments.warm_s)]
                    completed = subprocess.run(command, capture_output=True, text=True)
                    lines = [x for x in completed.stdout.splitlines() if x.startswith("RESULT ")]
                    if not lines:
                        print(f"{name}: failed\n{completed.stderr[-2000:]}", flush=True)
                        continue
                    times = json.loads(lines[-1][len("RESULT ") :])
                    per_variant[name] += times
                    print(
                        f"round {round_number + 1} {name}: {statistics.median(times):.1f} ms a "
                        f"stage (jobs: {', '.join(f'{t:.0f}' for t in times)}); load "
                        f"{os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
    for name, times in per_variant.items():
        if times:
            print(f"{name}: median {statistics.median(times):.1f} ms a stage")


if __name__ == "__main__":
    main()
