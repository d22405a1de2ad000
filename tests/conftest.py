"""Shared fixtures: one local SparkSession for the whole run, seeded RNGs, optional torch."""

from __future__ import annotations

import os

import numpy as np
import pytest
from background_jobs import JobQueue

from bigdl_py.spark.session import LEAN_JVM_OPTIONS

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

# Every Spark driver JVM the suite starts (its session, the jobs, notebooks and benches it
# runs in subprocesses, which inherit this environment) runs with the C1 compiler only and
# the serial collector: they live seconds to minutes on a machine the suite keeps busy, where
# C2's compilations and G1's threads cost more CPU than they give back. On 2 cores
# tests/spark/test_distri_chains.py took 143-146 CPU-seconds instead of 178.
# (spark-submit's launcher puts SPARK_SUBMIT_OPTS on the driver's java command line.)
if LEAN_JVM_OPTIONS not in os.environ.get("SPARK_SUBMIT_OPTS", ""):  # a child pytest's has it
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(
        filter(None, [os.environ.get("SPARK_SUBMIT_OPTS"), LEAN_JVM_OPTIONS])
    )

# The longest checks run beside the suite (tests/background_jobs.py says why and how).
_BACKGROUND = JobQueue()


def pytest_collection_finish(session):
    """Queue the background jobs of the modules whose tests will run, in their order."""
    if session.config.option.collectonly:
        return
    jobs = []
    for item in session.items:
        jobs_of = getattr(getattr(item, "module", None), "background_jobs", None)
        if jobs_of is not None:
            jobs.extend(jobs_of(item))
        beside = getattr(getattr(item, "function", None), "background_job", None)
        if beside is not None:  # a test marked @beside_the_suite
            jobs.append(beside)
    _BACKGROUND.start(jobs)


def pytest_sessionfinish(session, exitstatus):
    _BACKGROUND.stop()  # nothing left running after an interrupted or failed session


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession shared by every test that needs Spark (starting one costs ~5 s)."""
    pyspark = pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    del pyspark
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("bigdl_py-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.unix.domain.socket.enabled", "true")
        .config("spark.driver.memory", "2g")
        .config("spark.ui.showConsoleProgress", "false")
    )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def sc(spark):
    return spark.sparkContext


@pytest.fixture(scope="session", autouse=True)
def exact_float32_on_gpus():
    """TF32 off for the suite: GPU tests hold float32 results to float32 tolerances against
    float64 references, and cuDNN's default TF32 (PyTorch's default too) rounds inputs to a
    10-bit mantissa on Ampere and later. Tests of TF32 itself set it for themselves."""
    from bigdl_py import backend

    before = dict(backend.tf32_settings())
    backend.allow_tf32(matmul=False, cudnn=False)
    yield
    backend.allow_tf32(**before)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def torch():
    """PyTorch as a test oracle; tests that use it skip when it is not installed."""
    module = pytest.importorskip("torch")
    module.set_num_threads(1)
    return module


@pytest.fixture(scope="session")
def fashion_mnist_dir():
    if not os.path.exists(os.path.join(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz")):
        pytest.skip(f"Fashion-MNIST not installed in {FASHION_MNIST_DIR}")
    return FASHION_MNIST_DIR
