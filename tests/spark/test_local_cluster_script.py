"""scripts/local_cluster.sh for real: start a standalone master and a worker, spark-submit a
job that ships bigdl_py as a --py-files zip (scripts/make_pyfiles_zip.sh), then stop."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from background_jobs import beside_the_suite

from bigdl_py.spark.session import LEAN_JVM_OPTIONS

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"

JOB = """
from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("local-cluster-script-test").getOrCreate()
sc = spark.sparkContext


def on_executor(values):
    import bigdl_py

    total = bigdl_py.tensor([float(value) for value in values]).sum().item()
    yield bigdl_py.__file__, total


results = sc.parallelize(range(1000), 2).mapPartitions(on_executor).collect()
print("PARTITIONS", len(results))
print("SUM", int(sum(total for _, total in results)))
for location, _ in results:
    print("BIGDL_PY_FROM", location)
spark.stop()
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(command, timeout, **options) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **options)


@pytest.mark.slow
@pytest.mark.spark
@beside_the_suite(timeout=600)
def test_start_submit_with_py_files_zip_and_stop(tmp_path):
    pyspark = pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java is not installed (no java on PATH, no JAVA_HOME): Spark needs it")
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    # Nothing Spark-specific from the caller's environment but the lean JVM options that
    # every JVM of the suite starts with (tests/conftest.py); the executors' Python is ours.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env["SPARK_SUBMIT_OPTS"] = LEAN_JVM_OPTIONS
    env["PYSPARK_PYTHON"] = sys.executable
    state = tmp_path / "cluster"
    port = _free_port()

    started = _run(
        [SCRIPTS / "local_cluster.sh", "start", "--workers", "1", "--cores", "2",
         "--memory", "1g", "--port", str(port), "--webui-port", "0", "--dir", state,
         "--daemon-java-opts", LEAN_JVM_OPTIONS],
        timeout=150, env=env,
    )  # fmt: skip
    pid_files = sorted((state / "pids").glob("*.pid"))
    pids = [int(path.read_text()) for path in pid_files]
    try:
        assert started.returncode == 0, started.stderr + started.stdout
        master_url = started.stdout.strip().splitlines()[-1]
        assert master_url == f"spark://127.0.0.1:{port}"
        assert [path.name for path in pid_files] == ["master.pid", "worker-1.pid"]
        status = _run([SCRIPTS / "local_cluster.sh", "status", "--dir", state], 30, env=env)
        assert "master: running" in status.stdout and "worker-1: running" in status.stdout

        zipped = _run([SCRIPTS / "make_pyfiles_zip.sh", tmp_path / "bigdl_py.zip"], 60, env=env)
        assert zipped.returncode == 0, zipped.stderr
        job = tmp_path / "job.py"
        job.write_text(JOB)
        submitted = _run(
            [spark_submit, "--master", master_url, "--conf", "spark.driver.host=127.0.0.1",
             "--conf", "spark.executor.memory=512m", "--conf", "spark.ui.enabled=false",
             "--conf", f"spark.executor.extraJavaOptions={LEAN_JVM_OPTIONS}",
             "--py-files", tmp_path / "bigdl_py.zip", job],
            timeout=240, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        lines = submitted.stdout.splitlines()
        assert "PARTITIONS 2" in lines and "SUM 499500" in lines, submitted.stdout
        locations = [line.split(" ", 1)[1] for line in lines if line.startswith("BIGDL_PY_FROM")]
        # The executors imported bigdl_py from the shipped zip, not from this checkout.
        assert len(locations) == 2
        assert all("bigdl_py.zip/bigdl_py/__init__.py" in where for where in locations)
    finally:
        stopped = _run([SCRIPTS / "local_cluster.sh", "stop", "--dir", state], 60, env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped master" in stopped.stdout and "stopped worker-1" in stopped.stdout
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), f"daemon {pid} still runs after stop"
    again = _run([SCRIPTS / "local_cluster.sh", "status", "--dir", state], 30, env=env)
    assert again.returncode == 1 and "no cluster running" in again.stdout
