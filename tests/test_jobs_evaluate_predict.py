"""jobs/evaluate.py and jobs/predict.py, run as a user runs them, on a small Parquet file.

evaluate.py runs under plain ``python`` and predict.py under ``spark-submit``, so both entry
points are covered; their outputs are checked against the same model run locally.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from background_jobs import beside_the_suite

import bigdl_py.nn as nn
from bigdl_py.autograd import Tensor, no_grad
from bigdl_py.optim import Adam
from bigdl_py.train import LocalOptimizer, MaxIteration

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "jobs"))
ROWS, SIDE, CLASSES = 60, 3, 3


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A small CNN-free classifier trained a few steps, saved, and a Parquet file of
    ``ROWS`` rows: ``id``, flat ``pixels`` (``array<float>`` of SIDE*SIDE) and ``label``
    (double, as Spark ML writes labels)."""
    pytest.importorskip("pyspark")
    directory = tmp_path_factory.mktemp("jobs")
    rng = np.random.default_rng(11)
    labels = rng.integers(0, CLASSES, ROWS)
    images = rng.normal(size=(ROWS, 1, SIDE, SIDE)).astype(np.float32)
    images[np.arange(ROWS), 0, labels, :] += 2.0  # row `label` is bright: learnable
    model = nn.Sequential(nn.Flatten(), nn.Linear(SIDE * SIDE, CLASSES), nn.LogSoftmax(dim=1))
    LocalOptimizer(
        model,
        (images, labels),
        nn.NLLLoss(),
        Adam(lr=0.05),
        batch_size=20,
        end_trigger=MaxIteration(15),
        progress=False,
    ).optimize()
    model_path = str(directory / "model.bigdl")
    nn.save(model, model_path)
    flat = images.reshape(ROWS, -1)
    table = pa.table(
        {
            "id": pa.array(np.arange(ROWS, dtype=np.int64)),
            "pixels": pa.array(list(flat), type=pa.list_(pa.float32())),
            "label": pa.array(labels.astype(np.float64)),
        }
    )
    data_path = str(directory / "data.parquet")
    pq.write_table(table, data_path)
    with no_grad():
        log_probabilities = model(Tensor(images)).numpy()
    return {
        "directory": directory,
        "model": model_path,
        "data": data_path,
        "labels": labels,
        "log_probabilities": log_probabilities,
    }


def _run(command: list[str], cwd) -> subprocess.CompletedProcess:
    environment = dict(
        os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable
    )
    result = subprocess.run(
        command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr[-4000:]}"
    return result


def _data_arguments(saved) -> list[str]:
    return [
        saved["model"],
        "--input",
        saved["data"],
        "--features-col",
        "pixels",
        "--feature-shape",
        f"1,{SIDE},{SIDE}",
        "--batch-size",
        "16",
        "--master",
        "local[2]",
    ]


@beside_the_suite(timeout=600)
def test_evaluate_job_reports_accuracy_and_loss_of_the_saved_model(saved):
    metrics_path = str(saved["directory"] / "metrics.json")
    result = _run(
        [sys.executable, os.path.join(REPO, "jobs", "evaluate.py"), *_data_arguments(saved)]
        + ["--criterion", "nll", "--output-json", metrics_path],
        saved["directory"],
    )
    with open(metrics_path) as file:
        metrics = json.load(file)
    log_probabilities, labels = saved["log_probabilities"], saved["labels"]
    accuracy = float(np.mean(log_probabilities.argmax(axis=1) == labels))
    loss = float(-log_probabilities[np.arange(ROWS), labels].mean())
    assert metrics["rows"] == ROWS
    assert metrics["results"]["Top1Accuracy"]["value"] == pytest.approx(accuracy)
    assert metrics["results"]["Loss"]["value"] == pytest.approx(loss, rel=1e-5)
    assert accuracy > 1.5 / CLASSES  # the model did learn: the job is checked on real output
    assert "Top1Accuracy" in result.stdout and "Loss" in result.stdout


@beside_the_suite(timeout=600)
def test_predict_job_under_spark_submit_writes_predictions_to_parquet(saved):
    spark_submit = shutil.which("spark-submit")
    if spark_submit is None:
        pytest.skip("spark-submit is not on PATH (pyspark installs it)")
    output = str(saved["directory"] / "predictions.parquet")
    result = _run(
        [spark_submit, "--master", "local[2]", os.path.join(REPO, "jobs", "predict.py")]
        + [*_data_arguments(saved), "--output", output],
        saved["directory"],
    )
    table = pq.read_table(output).sort_by("id")
    assert table.column_names == ["id", "label", "prediction"]  # the features are dropped
    assert table.column("id").to_pylist() == list(range(ROWS))
    expected = saved["log_probabilities"].argmax(axis=1).astype(np.float64)
    np.testing.assert_array_equal(table.column("prediction").to_numpy(), expected)
    assert f"Wrote {ROWS} predictions" in result.stdout

    # Writing again refuses to replace the output unless asked to (before Spark starts).
    probabilities = [*_data_arguments(saved), "--output", output, "--prediction", "probabilities"]
    refused = subprocess.run(
        [sys.executable, os.path.join(REPO, "jobs", "predict.py"), *probabilities],
        cwd=saved["directory"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode != 0 and "already exists" in refused.stderr


def _parquet_folder(folder, table: pa.Table) -> dict:
    """``table`` as a one-part Parquet dataset in ``folder``; its files' bytes."""
    folder.mkdir()
    pq.write_table(table, str(folder / "part-00000.parquet"))
    return {name: (folder / name).read_bytes() for name in os.listdir(folder)}


def test_a_failed_overwrite_keeps_the_earlier_predictions(saved, tmp_path, spark):
    """Issue 27 item 4: a NaN row (or a missing device) in an --overwrite run emptied the
    earlier output, and failed runs left an empty folder behind. In this process, with the
    tests' shared session, as predict.py's main runs under spark-submit; then a run that
    succeeds replaces the output (and counts its null predictions apart from the classes)."""
    import predict

    rows = pq.read_table(saved["data"])
    pixels = np.stack(rows.column("pixels").to_numpy(zero_copy_only=False)).astype(np.float32)
    pixels[5, 2] = np.nan
    bad = rows.set_column(1, "pixels", pa.array(list(pixels), type=pa.list_(pa.float32())))
    pq.write_table(bad, str(tmp_path / "bad.parquet"))
    output = tmp_path / "predictions"
    earlier = _parquet_folder(output, pa.table({"id": [1, 2], "prediction": [0.0, 1.0]}))
    arguments = [*_data_arguments(saved), "--output", str(output), "--overwrite"]
    arguments[arguments.index(saved["data"])] = str(tmp_path / "bad.parquet")
    # One failure in a Spark task stands for all (a missing device fails the same way):
    # whatever stops the run, the partial output is dropped (tests/test_job_staged_output.py).
    with pytest.raises(Exception, match="has NaN or Inf features"):
        predict.main(arguments)
    assert {name: (output / name).read_bytes() for name in os.listdir(output)} == earlier
    assert sorted(os.listdir(tmp_path)) == ["bad.parquet", "predictions"]
    summary = predict.main([*arguments, "--nan-rows", "null"])
    assert summary["rows"] == ROWS and summary["null_predictions"] == 1
    table = pq.read_table(str(output)).sort_by("id")
    assert table.column("prediction").null_count == 1 and table.column("id")[5].as_py() == 5
    assert sorted(os.listdir(tmp_path)) == ["bad.parquet", "predictions"]


def test_partitions_are_honoured_for_parquet_input(saved, spark):
    """Issue 27 item 12: --partitions applied only to Fashion-MNIST, silently."""
    import evaluate
    from inference_inputs import InputData

    arguments = evaluate.parse_arguments([*_data_arguments(saved), "--partitions", "3"])
    assert InputData(spark, arguments, needs_labels=True).df.rdd.getNumPartitions() == 3
