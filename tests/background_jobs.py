"""The suite's longest checks, each a script in a subprocess, started early and run one at a
time beside the rest of the suite.

A handful of tests start whole Spark applications of their own (a local cluster, a
standalone cluster of two hosts, a bench's dry run): 1-2 minutes each, most of it JVMs
starting and waiting on one another rather than using both cores. Run in the test's own
turn, the suite waits for all of it. So a test module declares such a job as a module-level
``BackgroundJob`` and a function ``background_jobs(item)`` naming the jobs a test reads;
once pytest has collected the tests that will run, ``tests/conftest.py`` queues their jobs
in the tests' order, and one thread runs the queue while the suite goes on. The test then
reads the job's result (waiting if it is still running). A job whose test comes before its
turn in the queue runs at once, in the test's thread.

A test that is itself such a check (it runs a job script or a cluster script in
subprocesses) can instead be marked ``@beside_the_suite``: the whole test then runs in a
child pytest, queued the same way, and the suite's test reports that run's outcome (passed,
skipped with its reason, or failed with its output).

At most one queued job runs at a time, so the machine carries the suite and one job;
timeouts are the jobs' own, as when they ran in their tests' turns.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field

import pytest

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(eq=False)
class BackgroundJob:
    """``python script *arguments`` in ``REPOSITORY``, whose last ``RESULT {json}`` line
    on standard output is its result."""

    name: str
    script: str
    arguments: list[str]
    timeout: float
    environment: dict | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _claimed: bool = False
    _done: threading.Event = field(default_factory=threading.Event, repr=False)
    _completed: subprocess.CompletedProcess | None = None
    _error: BaseException | None = None
    _process: subprocess.Popen | None = None

    def claim(self) -> bool:
        """True for the one caller that is to run this job (the queue or a test)."""
        with self._lock:
            if self._claimed:
                return False
            self._claimed = True
            return True

    def run(self) -> None:
        """Run the job to its end (or its timeout), keeping what it printed."""
        try:
            with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
                self._process = subprocess.Popen(
                    [sys.executable, self.script, *self.arguments],
                    stdout=out,
                    stderr=err,
                    text=True,
                    env=self.environment,
                    cwd=REPOSITORY,
                )
                try:
                    self._process.wait(timeout=self.timeout)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
                    raise
                out.seek(0)
                err.seek(0)
                self._completed = subprocess.CompletedProcess(
                    self._process.args, self._process.returncode, out.read(), err.read()
                )
        except BaseException as error:  # handed to the test that reads the result
            self._error = error
        finally:
            self._done.set()

    def finished(self) -> subprocess.CompletedProcess:
        """The finished job, whatever its exit status (running it now if nothing has started
        it); a job that could not run or ran past its timeout fails the test that reads it."""
        if self.claim():
            self.run()
        self._done.wait()
        if self._error is not None:
            raise AssertionError(f"{self.name}: {self._error!r}") from self._error
        return self._completed

    def completed(self) -> subprocess.CompletedProcess:
        """The finished job; a job that failed fails the test that reads it, with the end of
        its standard error."""
        completed = self.finished()
        assert completed.returncode == 0, (
            f"{self.name} exited with {completed.returncode}:\n{completed.stderr[-3000:]}"
        )
        return completed

    def result(self) -> dict:
        """The job's last ``RESULT {json}`` line, read."""
        completed = self.completed()
        lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, f"{self.name} printed no RESULT line:\n{completed.stderr[-3000:]}"
        return json.loads(lines[-1][len("RESULT ") :])

    def stop(self) -> None:
        """Kill the job if it still runs (the session is ending early)."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()


class JobQueue:
    """One thread running queued jobs in order, skipping those a test already took."""

    def __init__(self):
        self.jobs: list[BackgroundJob] = []
        self._thread: threading.Thread | None = None

    def start(self, jobs: list[BackgroundJob]) -> None:
        self.jobs = list(dict.fromkeys(jobs))  # in order, each once
        if self.jobs:
            self._thread = threading.Thread(target=self._run, name="background jobs", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        for job in self.jobs:
            if job.claim():
                job.run()

    def stop(self) -> None:
        for job in self.jobs:
            job.stop()


def spark_installed() -> bool:
    """Whether pyspark can be imported (jobs that need it are queued only then)."""
    return importlib.util.find_spec("pyspark") is not None


def job_environment(*paths: str) -> dict:
    """This environment without Spark settings (the pip-installed pyspark must be enough)
    but the drivers' JVM options (tests/conftest.py), with ``paths`` first on PYTHONPATH so
    that executors' Python workers import them."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if key == "SPARK_SUBMIT_OPTS" or not key.startswith(("SPARK_", "PYSPARK_"))
    }
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [*paths, os.environ.get("PYTHONPATH")])
    )
    return environment


# Set in the child pytest of a test marked @beside_the_suite: there the test runs itself.
CHILD_RUN = "BIGDL_PY_TEST_BESIDE_THE_SUITE"


def beside_the_suite(timeout: float):
    """Mark a test to run, whole, in a child pytest beside the rest of the suite.

    In the suite the test becomes a reader of that run (queued by ``tests/conftest.py``
    through its ``background_job`` attribute); in the child run it is the test itself. Its
    fixtures are only made in the child. ``timeout`` bounds the child run.
    """

    def mark(test):
        if os.environ.get(CHILD_RUN):
            return test
        path = os.path.relpath(sys.modules[test.__module__].__file__, REPOSITORY)
        job = BackgroundJob(
            f"{path}::{test.__name__}",
            "-m",  # python -m pytest
            ["pytest", "-q", "-rs", "-p", "no:cacheprovider", f"{path}::{test.__name__}"],
            timeout,
            {**os.environ, CHILD_RUN: "1"},
        )

        def read_the_child_run():
            report_child_run(job)

        read_the_child_run.__name__ = test.__name__
        read_the_child_run.__doc__ = test.__doc__
        read_the_child_run.__module__ = test.__module__
        read_the_child_run.pytestmark = list(getattr(test, "pytestmark", []))
        read_the_child_run.background_job = job
        return read_the_child_run

    return mark


def report_child_run(job: BackgroundJob) -> None:
    """The child pytest's outcome as this test's: passed, skipped (why) or failed (how)."""
    completed = job.finished()
    output = completed.stdout
    if completed.returncode == 0 and re.search(r"\b1 passed\b", output):
        return
    skipped = re.search(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", output, re.MULTILINE)
    if completed.returncode == 0 and skipped:
        pytest.skip(skipped.group(1))
    pytest.fail(
        f"{job.name} in a child pytest exited with {completed.returncode}:\n"
        f"{output[-6000:]}\n{completed.stderr[-2000:]}",
        pytrace=False,
    )
