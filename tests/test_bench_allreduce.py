"""The helpers of ``bench/allreduce.py`` (``compare``, ``floor``) that decide what its numbers
mean."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


@pytest.fixture(scope="module")
def allreduce_bench():
    # bench/ is not a package: its scripts import each other from their own directory.
    sys.path.insert(0, BENCH)
    try:
        spec = importlib.util.spec_from_file_location(
            "allreduce_bench", os.path.join(BENCH, "allreduce.py")
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(BENCH)


def test_a_setting_names_its_spark_conf(allreduce_bench):
    assert allreduce_bench._parse_setting("before:a.b=1,c.d=x=y") == (
        "before",
        {"a.b": "1", "c.d": "x=y"},
    )
    assert allreduce_bench._parse_setting("shipped:") == ("shipped", {})


@pytest.mark.parametrize("text", ["no-colon", ":a=1", "name:a"])
def test_a_malformed_setting_is_refused(allreduce_bench, text):
    with pytest.raises(SystemExit, match="--setting"):
        allreduce_bench._parse_setting(text)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads Linux's /proc")
def test_cpu_of_descendants_counts_a_grandchild(allreduce_bench):
    # A child starts a grandchild that burns 0.3 s of CPU and then waits: the count, taken
    # while both are alive, must include the grandchild (Python workers are the JVM's).
    burner = (
        "import sys, time\n"
        "while time.process_time() < 0.3: pass\n"
        "print('ready', flush=True); sys.stdin.readline()\n"
    )
    parent = (
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {burner!r}], stdin=sys.stdin)\n"
        "child.wait()\n"
    )
    before = allreduce_bench._process_tree_cpu_ms()
    process = subprocess.Popen(
        [sys.executable, "-c", parent], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline().strip() == "ready"
        used = allreduce_bench._process_tree_cpu_ms() - before
    finally:
        process.communicate("\n", timeout=30)
    assert used >= 250


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("to_self", [True, False])
def test_the_floor_sends_each_rank_its_share_to_the_right_partitions(
    allreduce_bench, spark, count, to_self
):
    # What ``floor`` reports is the JVM's cost of an all_to_all's bytes: every rank must send
    # the same bytes to each destination, to itself only when asked, and a repartition by
    # key must deliver each destination's rows to that partition.
    from bigdl_py.spark.shuffle_records import CHUNK_BYTES

    keys = allreduce_bench._keys_for_partitions(spark, count)
    rows = allreduce_bench._all_to_all_rows(spark, count, 0.5, to_self, keys)
    delivered = (
        rows.repartition(count, "key")
        .selectExpr("rank", "spark_partition_id() AS destination", "length(payload) AS bytes")
        .groupBy("rank", "destination")
        .sum("bytes")
        .collect()
    )
    sent = {(row["rank"], row["destination"]): row["sum(bytes)"] for row in delivered}
    expected = {
        (rank, destination): 2 * CHUNK_BYTES
        for rank in range(count)
        for destination in range(count)
        if to_self or destination != rank
    }
    assert sent == expected
    allreduce_bench._jvm_shuffle_job(spark, count, 0.5, to_self, keys, shuffle=True)


def test_the_arrow_route_sums_every_ranks_chunks(allreduce_bench, spark):
    # ``arrow`` times this job against collectives.all_reduce: it must compute the same sum.
    pytest.importorskip("pyarrow")
    keys = allreduce_bench._keys_for_partitions(spark, 2)
    allreduce_bench._arrow_all_to_all_job(spark, keys, 0.5, 64 << 10)
