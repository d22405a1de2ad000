"""An unreachable standalone master is named at once (issue 16, item 14); no JVM starts."""

from __future__ import annotations

import socket
import time

import pytest

from bigdl_py.spark.session import check_master_reachable


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_master_is_named_quickly():
    master = f"spark://127.0.0.1:{_closed_port()}"
    started = time.perf_counter()
    with pytest.raises(ConnectionError, match=f"could not reach the Spark master at {master}"):
        check_master_reachable(master)
    assert time.perf_counter() - started < 5


def test_a_listening_master_and_other_masters_pass():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        check_master_reachable(f"spark://127.0.0.1:{_closed_port()},127.0.0.1:{port}")
    for master in (None, "local[2]", "yarn", "k8s://https://host:443"):
        check_master_reachable(master)


def test_get_spark_checks_before_starting_a_jvm():
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    from bigdl_py.spark import session

    if SparkSession.getActiveSession() is not None:
        pytest.skip("a session is active; get_spark would return it")
    started = time.perf_counter()
    with pytest.raises(ConnectionError, match="could not reach the Spark master"):
        session.get_spark(f"spark://127.0.0.1:{_closed_port()}")
    assert time.perf_counter() - started < 5
