"""Collectives across real executor JVMs: ``local-cluster[2,1,1024]`` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "local_cluster_job.py")
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(JOB)))

# Starting a standalone master, two workers and two executor JVMs takes 20-70 s on 2 cores.
TIMEOUT_SECONDS = 400


@pytest.mark.slow
@pytest.mark.spark
def test_collectives_run_on_separate_executor_jvms():
    pytest.importorskip("pyspark")
    # Nothing Spark-specific in the environment: the pip-installed pyspark must be enough.
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SPARK_", "PYSPARK_"))
    }
    # Only so that executors' Python workers import this checkout of bigdl_py.
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [REPOSITORY, os.environ.get("PYTHONPATH")])
    )
    completed = subprocess.run(
        [sys.executable, JOB],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        env=environment,
        cwd=REPOSITORY,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert completed.returncode == 0 and lines, completed.stderr[-3000:]
    report = json.loads(lines[-1][len("RESULT ") :])

    assert report["master"] == "local-cluster[2,1,1024]"
    assert report["task_slots"] == 2
    assert report["recommended_applied"]
    assert len(report["executor_jvms"]) == 2, report["executor_jvms"]
    assert report["all_executor_backends"]
    for name, error in report["max_abs_errors"].items():
        assert error <= 1e-5, name
    assert report["barrier_messages"] == [["0", "1"], ["0", "1"]]


DISTRI_JOB = os.path.join(os.path.dirname(JOB), "distri_local_cluster_job.py")


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("update", ["sharded", "replicated", "local-sgd:4"])
def test_distri_optimizer_survives_a_killed_executor(update):
    """Separate executor JVMs; one is SIGKILLed while the chained job of iterations 10-17
    of 30 runs, and the final weights still equal LocalOptimizer's on the same global
    batches."""
    pytest.importorskip("pyspark")
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SPARK_", "PYSPARK_"))
    }
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [REPOSITORY, os.environ.get("PYTHONPATH")])
    )
    completed = subprocess.run(
        [sys.executable, DISTRI_JOB, update, "8"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        env=environment,
        cwd=REPOSITORY,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert completed.returncode == 0 and lines, completed.stderr[-3000:]
    report = json.loads(lines[-1][len("RESULT ") :])
    assert report["master"] == "local-cluster[2,1,2048]"
    assert report["partitions"] == 2
    assert report["iterations"] == 30
    assert len(report["executor_jvms_before"]) == 2
    assert report["killed"] and report["killed"][0] not in report["executor_jvms_after"]
    assert report["killed_while_running"]
    assert report["update"] == update
    assert report["relative_error"] <= 1e-5
    assert report["moved"] > 1e-2


SEPARATE_HOSTS_JOB = os.path.join(os.path.dirname(JOB), "separate_hosts_job.py")


@pytest.mark.slow
@pytest.mark.spark
def test_every_mode_trains_on_separate_hosts_and_survives_losing_one():
    """Two workers on 127.0.0.2 and 127.0.0.3 with their own temporary, work and local
    directories (no shared disk); one is killed while the sharded update runs."""
    pytest.importorskip("pyspark")
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SPARK_", "PYSPARK_"))
    }
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [REPOSITORY, os.path.dirname(JOB), os.environ.get("PYTHONPATH")])
    )
    environment["PYSPARK_PYTHON"] = sys.executable
    completed = subprocess.run(
        [sys.executable, SEPARATE_HOSTS_JOB],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        env=environment,
        cwd=REPOSITORY,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert completed.returncode == 0 and lines, completed.stderr[-3000:]
    report = json.loads(lines[-1][len("RESULT ") :])
    assert report["executor_hosts"] == ["127.0.0.2", "127.0.0.3"]
    assert not report["share_a_disk"]
    # No shared disk: nothing chains (local SGD: one round of 4 iterations per job).
    assert report["iterations_per_call"] == {
        "sharded": 1,
        "replicated": 1,
        "local-sgd:4": 4,
        "auto": 1,
    }
    for update, error in report["max_abs_error_against_local"].items():
        assert error <= 1e-5, update
    assert report["local_sgd_moved"] > 1e-2
    assert report["killed"] and report["hosts_after"] == ["127.0.0.2"]
    assert report["iterations"] == 16
    assert report["killed_run_max_abs_difference"] <= 1e-6
