"""How the suite reads a test that ran, whole, in a child pytest (tests/background_jobs.py):
the child's outcome becomes the test's, with its reason or its output."""

from __future__ import annotations

import subprocess

import pytest
from background_jobs import BackgroundJob, report_child_run


def finished_job(returncode: int, stdout: str) -> BackgroundJob:
    """A job whose child pytest has already ended so."""
    job = BackgroundJob("tests/test_x.py::test_y", "-m", ["pytest"], 1.0)
    assert job.claim()
    job._completed = subprocess.CompletedProcess(["pytest"], returncode, stdout, "")
    job._done.set()
    return job


def test_a_passed_child_run_passes():
    report_child_run(finished_job(0, ".                [100%]\n1 passed in 2.00s\n"))


def test_a_skipped_child_run_skips_with_its_reason():
    output = "s\nSKIPPED [1] tests/test_x.py:12: Fashion-MNIST not installed\n1 skipped in 1s\n"
    with pytest.raises(pytest.skip.Exception, match="Fashion-MNIST not installed"):
        report_child_run(finished_job(0, output))


@pytest.mark.parametrize(
    "returncode, output",
    [
        (1, "F\nE   AssertionError: the model was not written\n1 failed in 3s\n"),
        (5, "no tests ran in 0.1s\n"),  # the test was not found: never a pass
        (0, "no tests ran in 0.1s\n"),
    ],
)
def test_a_failed_or_empty_child_run_fails_with_its_output(returncode, output):
    with pytest.raises(pytest.fail.Exception, match=f"exited with {returncode}") as failure:
        report_child_run(finished_job(returncode, output))
    assert output.strip() in str(failure.value)
