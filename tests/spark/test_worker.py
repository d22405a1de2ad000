"""Executor-side helpers: BLAS threads per worker, and the worker-resident cache."""

from __future__ import annotations

import os

import pytest

from bigdl_py import backend
from bigdl_py.spark import worker


@pytest.fixture(autouse=True)
def empty_cache():
    worker.clear()
    yield
    worker.clear()


@pytest.fixture
def restore_threads():
    before = backend.blas_thread_count()
    yield
    backend.set_blas_threads(before)
    worker._configured_threads = None


def test_configure_worker_threads_sets_blas_threads(restore_threads, monkeypatch):
    monkeypatch.delenv(worker.THREADS_ENV_VAR, raising=False)
    assert worker.configure_worker_threads(1) == 1
    assert backend.blas_thread_count() == 1


def test_configure_worker_threads_reads_the_environment(restore_threads, monkeypatch):
    monkeypatch.setenv(worker.THREADS_ENV_VAR, "1")
    assert worker.configure_worker_threads() == 1


def test_configure_worker_threads_outside_spark_defaults_to_one(restore_threads, monkeypatch):
    monkeypatch.delenv(worker.THREADS_ENV_VAR, raising=False)
    assert worker.configure_worker_threads() == 1


@pytest.mark.parametrize(("text", "message"), [("two", "not an integer"), ("0", ">= 1")])
def test_configure_worker_threads_rejects_a_bad_environment(monkeypatch, text, message):
    monkeypatch.setenv(worker.THREADS_ENV_VAR, text)
    with pytest.raises(ValueError, match=message):
        worker.configure_worker_threads()


def test_fetch_builds_once_then_hits():
    builds = []

    def build():
        builds.append(1)
        return {"replica": len(builds)}

    first = worker.fetch("run", 0, build)
    second = worker.fetch("run", 0, build)
    assert first is second and len(builds) == 1
    stats = worker.stats()
    assert (stats.hits, stats.misses, stats.entries) == (1, 1, 1)
    assert stats.hit_rate == 0.5


def test_a_different_version_is_a_miss():
    worker.store("run", 3, "state after 7", version=7)
    assert worker.lookup("run", 3, version=7) == "state after 7"
    assert worker.lookup("run", 3, version=8) is None
    assert worker.fetch("run", 3, lambda: "rebuilt", version=8) == "rebuilt"
    assert worker.lookup("run", 3, version=8) == "rebuilt"
    assert (worker.stats().hits, worker.stats().misses) == (2, 2)


def test_runs_and_partitions_do_not_see_each_other():
    worker.store("a", 0, "a0")
    worker.store("b", 0, "b0")
    assert worker.lookup("a", 0) == "a0"
    assert worker.lookup("b", 0) == "b0"
    assert worker.lookup("a", 1) is None


def test_release_run_drops_its_entries_only():
    worker.store("a", 0, 1)
    worker.store("a", 1, 2)
    worker.store("b", 0, 3)
    assert worker.release_run("a") == 2
    assert worker.release_run("a") == 0
    assert worker.stats().entries == 1


def test_forget_drops_one_entry_only():
    worker.store("run-a", 0, "state 0", version=3)
    worker.store("run-a", 1, "state 1", version=3)
    worker.forget("run-a", 0)
    worker.forget("run-a", 7)  # nothing there: nothing to do
    worker.forget("run-b", 0)
    assert worker.lookup("run-a", 0, version=3) is None
    assert worker.lookup("run-a", 1, version=3) == "state 1"


def test_least_recently_used_runs_are_evicted_beyond_the_limit():
    for run in range(worker.MAX_RUNS):
        worker.store(run, 0, run)
    worker.lookup(0, 0)  # run 0 is now the most recently used
    worker.store("new", 0, "new")
    assert worker.lookup(1, 0) is None  # the least recently used run went
    assert worker.lookup(0, 0) == 0
    assert worker.stats().entries == worker.MAX_RUNS


def test_storing_none_is_an_error():
    with pytest.raises(ValueError, match="cannot store None"):
        worker.store("run", 0, None)


def test_reset_stats_keeps_entries():
    worker.fetch("run", 0, lambda: 1)
    worker.reset_stats()
    assert (worker.stats().hits, worker.stats().misses, worker.stats().entries) == (0, 0, 1)


def _visit(run_id):
    """A task: look up the partition's state from the previous job, store this job's, and say
    which process ran it and what that process had stored before (its visits, in order)."""

    def task(partition, iterator):
        from bigdl_py.spark import worker as task_worker

        (job,) = list(iterator)
        hit = task_worker.lookup(run_id, partition, version=job - 1) is not None
        task_worker.store(run_id, partition, f"state of {partition} after job {job}", job)
        earlier = task_worker.lookup(run_id, "visits") or ()
        task_worker.store(run_id, "visits", (*earlier, (job, partition)))
        yield partition, hit, task_worker.configure_worker_threads(), os.getpid(), earlier

    return task


@pytest.mark.spark
def test_cache_lives_in_python_workers_across_jobs(sc):
    """Partition state stored by one job is found by later jobs on the same worker.

    Spark does not pin a partition to a worker, nor a task to the worker that ran the same
    partition last (PySpark hands out its idle workers first in, first out, and how many
    there are depends on the tests before), so whether a given task hits is not fixed. What
    is: a task hits exactly when its own worker process stored that partition's state in the
    job before, and a worker runs tasks of several jobs (bench/spark_floor.py worker-cache
    measures the hit rate).
    """
    run_id = "test_cache_lives_in_python_workers_across_jobs"
    outcomes = []
    for job in range(6):
        for partition, hit, threads, pid, earlier in (
            sc.parallelize([job, job], 2).mapPartitionsWithIndex(_visit(run_id)).collect()
        ):
            outcomes.append((job, partition, hit, threads, pid, earlier))
    assert sorted({partition for _, partition, *_ in outcomes}) == [0, 1]
    for job, partition, hit, _, pid, earlier in outcomes:
        last_of_partition = max((j for j, p in earlier if p == partition), default=None)
        assert hit == (last_of_partition == job - 1), (job, partition, pid, earlier)
    assert not any(hit for job, _, hit, *_ in outcomes if job == 0)  # nothing to find yet
    # Worker reuse: some process ran tasks of two jobs and found its own earlier visits.
    assert any({j for j, _ in earlier} - {job} for job, *_, earlier in outcomes)
    # spark.task.cpus is 1 in the test session: one BLAS thread per task.
    assert {threads for _, _, _, threads, _, _ in outcomes} == {1}


def test_task_partition_id_names_the_tasks_partition():
    assert worker.task_partition_id() is None  # on the driver


@pytest.mark.spark
def test_task_partition_id_inside_tasks(sc):
    seen = sc.parallelize(range(6), 3).mapPartitions(
        lambda rows: [(list(rows), worker.task_partition_id())]
    )
    assert seen.collect() == [([0, 1], 0), ([2, 3], 1), ([4, 5], 2)]
