"""Session helpers: recommended settings, task slots, job descriptions and groups."""

from __future__ import annotations

import os

import pytest

from bigdl_py.spark import session
from bigdl_py.spark.session import (
    RECOMMENDED_CONF,
    get_spark,
    job_description,
    job_group,
    parse_spark_defaults,
    set_job_description,
    task_slots,
)

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_shipped_spark_defaults_equal_the_recommended_settings():
    with open(os.path.join(REPOSITORY, "conf", "spark-defaults.conf"), encoding="utf-8") as f:
        assert parse_spark_defaults(f.read()) == RECOMMENDED_CONF


def test_parse_spark_defaults_reads_the_properties_syntax():
    text = "# comment\n! also a comment\n\nspark.a   1\nspark.b=two words\n  spark.c : x\n"
    assert parse_spark_defaults(text) == {"spark.a": "1", "spark.b": "two words", "spark.c": "x"}


def test_parse_spark_defaults_names_a_line_without_value():
    with pytest.raises(ValueError, match="line 2 has no value"):
        parse_spark_defaults("spark.a 1\nspark.b\n")


def test_user_defaults_file_is_read_from_spark_conf_dir(tmp_path, monkeypatch):
    (tmp_path / "spark-defaults.conf").write_text("spark.shuffle.compress true\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert session._user_defaults_file() == {"spark.shuffle.compress": "true"}


@pytest.mark.spark
def test_get_spark_returns_the_active_session(spark):
    assert get_spark() is spark
    assert get_spark(master=spark.sparkContext.master) is spark


@pytest.mark.spark
def test_get_spark_refuses_to_switch_master(spark):
    with pytest.raises(ValueError, match="is active; cannot switch to master 'local\\[3\\]'"):
        get_spark(master="local[3]")


@pytest.mark.spark
def test_get_spark_warns_about_settings_the_active_session_lacks(spark):
    with pytest.warns(UserWarning, match="spark.bigdl_py.test.unset"):
        assert get_spark(conf={"spark.bigdl_py.test.unset": "1"}) is spark


@pytest.mark.spark
def test_task_slots_of_local_two_is_two(sc):
    assert sc.master == "local[2]"
    assert task_slots(sc) == 2


class _FakeContext:
    """The parts of a SparkContext that task_slots reads."""

    def __init__(self, master, settings=None, default_parallelism=8):
        self.master = master
        self.defaultParallelism = default_parallelism
        self._settings = settings or {}

    def getConf(self):
        return self

    def get(self, key, default=None):
        return self._settings.get(key, default)


@pytest.mark.parametrize(
    ("master", "settings", "expected"),
    [
        ("local", {}, 1),
        ("local[4]", {}, 4),
        ("local[4]", {"spark.task.cpus": "2"}, 2),
        ("local[4, 3]", {}, 4),
        ("local[*]", {}, 8),
        ("local-cluster[2, 3, 1024]", {}, 6),
        ("local-cluster[2,3,1024]", {"spark.task.cpus": "3"}, 2),
        ("yarn", {"spark.executor.instances": "5", "spark.executor.cores": "4"}, 20),
        ("spark://host:7077", {}, 8),
        ("spark://host:7077", {"spark.task.cpus": "4"}, 2),
    ],
)
def test_task_slots_by_master(master, settings, expected):
    assert task_slots(_FakeContext(master, settings)) == expected


class _FakeExecutors:
    """``sc._jsc.sc().statusTracker().getExecutorInfos()`` of a cluster on ``hosts``."""

    class _Info:
        def __init__(self, host):
            self._host = host

        def host(self):
            return self._host

    def __init__(self, master, hosts):
        self.master = master
        self._hosts = hosts

    @property
    def _jsc(self):
        return self

    def sc(self):
        return self

    def statusTracker(self):
        return self

    def getExecutorInfos(self):
        return [self._Info(host) for host in self._hosts]


@pytest.mark.parametrize(
    ("master", "hosts", "state_dir", "expected"),
    [
        ("local[2]", ["a", "b"], None, True),
        ("local-cluster[2,1,1024]", ["a", "b"], None, True),
        ("spark://a:7077", ["a", "a", "a"], None, True),
        ("yarn", ["driver", "b", "c"], None, False),
        ("yarn", ["driver", "b", "c"], "/shared/state", True),
    ],
)
def test_executors_share_a_disk(monkeypatch, master, hosts, state_dir, expected):
    monkeypatch.delenv("BIGDL_PY_STATE_DIR", raising=False)
    if state_dir:
        monkeypatch.setenv("BIGDL_PY_STATE_DIR", state_dir)
    assert session.executors_share_a_disk(_FakeExecutors(master, hosts)) is expected


def test_executors_share_a_disk_reads_the_real_status_tracker(sc):
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    assert {info.host() for info in infos}  # the API the check relies on answers
    assert session.executors_share_a_disk(sc)


def test_task_slots_of_local_star_ignores_a_set_default_parallelism():
    context = _FakeContext("local[*]", {"spark.default.parallelism": "100"})
    assert task_slots(context) == (os.cpu_count() or 1)


@pytest.mark.spark
def test_job_description_labels_jobs_and_restores_the_previous_label(sc):
    set_job_description(sc, "outer")
    try:
        with job_description(sc, "iteration 42: forward-backward + update"):
            assert sc.getLocalProperty("spark.job.description") == (
                "iteration 42: forward-backward + update"
            )
            assert sc.parallelize([1, 2], 2).count() == 2
        assert sc.getLocalProperty("spark.job.description") == "outer"
    finally:
        set_job_description(sc, None)
    assert sc.getLocalProperty("spark.job.description") is None


@pytest.mark.spark
def test_job_group_tags_jobs_and_restores_the_previous_group(sc):
    with job_group(sc, "bigdl_py-test-group", "a grouped job"):
        sc.parallelize([1], 1).count()
        assert sc.getLocalProperty("spark.jobGroup.id") == "bigdl_py-test-group"
    assert sc.getLocalProperty("spark.jobGroup.id") is None
    assert len(sc.statusTracker().getJobIdsForGroup("bigdl_py-test-group")) == 1
