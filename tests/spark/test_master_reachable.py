"""An unreachable standalone master is named at once (issue 16, item 14); no JVM starts."""

from __future__ import annotations

import re
import socket

import pytest

from bigdl_py.spark.session import check_master_reachable


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _recorded_connections(monkeypatch) -> list:
    """Record every ``socket.create_connection`` (address, timeout), still connecting."""
    calls = []
    connect = socket.create_connection

    def recording(address, timeout=None, *args, **kwargs):
        calls.append((address, timeout))
        return connect(address, timeout, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", recording)
    return calls


def test_an_unreachable_master_is_named_after_one_bounded_try_per_address(monkeypatch):
    # "Quickly" as a property of the code, not a wall-clock bound (a busy machine breaks
    # those): one connection attempt per address, each with a timeout of a few seconds,
    # where Spark itself retries for over a minute.
    ports = [_closed_port(), _closed_port()]
    master = f"spark://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"
    calls = _recorded_connections(monkeypatch)
    with pytest.raises(
        ConnectionError, match=re.escape(f"could not reach the Spark master at {master}")
    ):
        check_master_reachable(master)
    assert [address for address, _ in calls] == [("127.0.0.1", port) for port in ports]
    assert all(0 < timeout <= 5 for _, timeout in calls)


def test_a_listening_master_and_other_masters_pass():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        check_master_reachable(f"spark://127.0.0.1:{_closed_port()},127.0.0.1:{port}")
    for master in (None, "local[2]", "yarn", "k8s://https://host:443"):
        check_master_reachable(master)


def test_get_spark_checks_before_starting_a_jvm(monkeypatch):
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    from bigdl_py.spark import session

    if SparkSession.getActiveSession() is not None:
        pytest.skip("a session is active; get_spark would return it")

    def no_jvm(builder):
        raise AssertionError("get_spark started a SparkContext before checking the master")

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", no_jvm)
    calls = _recorded_connections(monkeypatch)
    with pytest.raises(ConnectionError, match="could not reach the Spark master"):
        session.get_spark(f"spark://127.0.0.1:{_closed_port()}")
    assert len(calls) == 1
