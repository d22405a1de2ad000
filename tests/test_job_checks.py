"""The jobs' argument and path checks, run as plain functions without Spark (issue 16, items
1, 2, 3, 4, 5, 20): each refuses, before any work, what would lose data or a run's result."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "jobs"))

import output_checks  # noqa: E402
import training_arguments  # noqa: E402

from bigdl_py.train.checkpoint import save_checkpoint  # noqa: E402


@pytest.fixture(autouse=True)
def _in_a_fresh_folder(tmp_path, monkeypatch):
    """Relative defaults (runs/lenet) land in the test's own folder, not in the checkout."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def data_dir(tmp_path):
    """A folder holding (empty) files under Fashion-MNIST's names: enough for the checks."""
    folder = tmp_path / "fashion"
    folder.mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        (folder / name).write_bytes(b"")
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (folder / name).write_bytes(b"")
    return str(folder)


def _lenet_arguments(*argv):
    train_lenet = pytest.importorskip("train_lenet")
    return train_lenet.parse_arguments(list(argv))


def _refused(capsys, *argv, job=_lenet_arguments):
    with pytest.raises(SystemExit) as exit_info:
        job(*argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def _checkpoint(directory, metadata):
    arrays = {"weights": np.zeros(2, dtype=np.float32)}
    return save_checkpoint(directory, 3, arrays, metadata)


# --- item 1: an output that is (inside) the input ---
@pytest.mark.parametrize(
    ("source", "target"), [("d", "d"), ("d", "d/"), ("d", "d/out"), ("d/inner", "d")]
)
def test_output_that_is_or_nests_with_the_input_is_refused(tmp_path, source, target):
    (tmp_path / "d" / "inner").mkdir(parents=True)
    problem = output_checks.locations_problem(
        [("--output", str(tmp_path / target))], [("--input", str(tmp_path / source))]
    )
    assert problem is not None and "--output" in problem and "--input" in problem


def test_separate_input_and_output_pass(tmp_path):
    outputs = [("--output", str(tmp_path / "ab"))]
    assert output_checks.locations_problem(outputs, [("--input", str(tmp_path / "a"))]) is None
    assert output_checks.locations_problem(outputs, [("--input", None)]) is None


def test_predict_refuses_its_own_input_before_reading_the_model(tmp_path):
    predict = pytest.importorskip("predict")
    (tmp_path / "data.parquet").mkdir()
    path = str(tmp_path / "data.parquet")
    arguments = predict.parse_arguments(
        ["missing.bigdl", "--input", path, "--output", path, "--overwrite"]
    )
    with pytest.raises(SystemExit, match="is --input .*: writing it would destroy --input"):
        predict.check_locations(arguments)
    assert os.path.isdir(path)


# --- issue 27 items 1-3: no output is, holds or lies inside an input ---
@pytest.fixture
def model_folder(tmp_path):
    """A folder holding a model file and the user's notes, and a Parquet dataset folder."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "model.bigdl").write_bytes(b"model")
    (folder / "notes.txt").write_text("mine")
    (tmp_path / "data.parquet").mkdir()
    (tmp_path / "data.parquet" / "part-0.parquet").write_bytes(b"rows")
    return folder


def _predict_check(*argv):
    predict = pytest.importorskip("predict")
    predict.check_locations(predict.parse_arguments(list(argv)))


def test_predict_refuses_an_output_holding_the_model(model_folder, tmp_path):
    model = str(model_folder / "model.bigdl")
    data = str(tmp_path / "data.parquet")
    with pytest.raises(SystemExit, match="--output .* holds the model .*model.bigdl"):
        _predict_check(model, "--input", data, "--output", str(model_folder), "--overwrite")
    # The same folder through a symlink: named with where it really is.
    (tmp_path / "link").symlink_to(model_folder)
    with pytest.raises(SystemExit, match=r"--output '.*link' \(really .*models\) holds the model"):
        _predict_check(model, "--input", data, "--output", str(tmp_path / "link"), "--overwrite")
    assert (model_folder / "model.bigdl").read_bytes() == b"model"


def test_predict_refuses_an_output_that_is_or_lies_inside_its_data(model_folder, tmp_path):
    model = str(model_folder / "model.bigdl")
    data = str(tmp_path / "data.parquet")
    with pytest.raises(SystemExit, match="--output .* is --data .*: writing it would destroy"):
        _predict_check(model, "--data", data, "--output", data, "--overwrite")
    with pytest.raises(SystemExit, match="--output .* lies inside --input .*data.parquet"):
        _predict_check(model, "--input", data, "--output", data + "/predictions")


def test_predict_replaces_only_a_parquet_dataset_and_only_with_overwrite(model_folder, tmp_path):
    model, data = str(model_folder / "model.bigdl"), str(tmp_path / "data.parquet")
    earlier = tmp_path / "predictions"
    earlier.mkdir()
    for name in ("part-00000-a.snappy.parquet", ".part-00000-a.snappy.parquet.crc", "_SUCCESS"):
        (earlier / name).write_bytes(b"")
    with pytest.raises(SystemExit, match="already exists.*pass --overwrite"):
        _predict_check(model, "--input", data, "--output", str(earlier))
    _predict_check(model, "--input", data, "--output", str(earlier), "--overwrite")
    (earlier / "report.docx").write_bytes(b"")
    with pytest.raises(SystemExit, match="holds report.docx, which this job does not write"):
        _predict_check(model, "--input", data, "--output", str(earlier), "--overwrite")


def test_evaluate_refuses_a_metrics_file_over_the_model_or_in_the_data(model_folder, tmp_path):
    evaluate = pytest.importorskip("evaluate")
    model, data = str(model_folder / "model.bigdl"), str(tmp_path / "data.parquet")
    for target, message in [
        (model, "--output-json .* is the model"),
        (data, "--output-json .* is --input"),
        (data + "/metrics.json", "--output-json .* lies inside --input"),
    ]:
        arguments = evaluate.parse_arguments([model, "--input", data, "--output-json", target])
        with pytest.raises(SystemExit, match=message):
            evaluate.check_locations(arguments)
    assert (model_folder / "model.bigdl").read_bytes() == b"model"
    fine = [model, "--input", data, "--output-json", str(tmp_path / "new" / "sub" / "m.json")]
    evaluate.check_locations(evaluate.parse_arguments(fine))
    remote = evaluate.parse_arguments([model, "--output-json", "s3a://bucket/m.json"])
    with pytest.raises(SystemExit, match="'s3a://bucket/m.json' is not a local path"):
        evaluate.check_locations(remote)


def test_uris_are_compared_as_written_and_never_meet_local_paths():
    outputs = [("--output", "hdfs://namenode/data/out/")]
    assert "is --input" in output_checks.locations_problem(
        outputs, [("--input", "hdfs://namenode/data/out")]
    )
    assert "lies inside --input" in output_checks.locations_problem(
        outputs, [("--input", "hdfs://namenode/data")]
    )
    assert output_checks.locations_problem(outputs, [("--input", "/data/out")]) is None
    assert output_checks.locations_problem(outputs, [("--input", "s3a://b/data/out")]) is None


def test_file_uris_are_local_paths(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    problem = output_checks.locations_problem(
        [("--output", f"file://{data}/out")], [("--input", str(data))]
    )
    assert "lies inside --input" in problem


def test_training_outputs_are_kept_apart_from_the_data_and_each_other(tmp_path, capsys, data_dir):
    error = _refused(capsys, "--data", data_dir, "--output", data_dir)
    assert "--output" in error and "is --data" in error
    beside = _lenet_arguments("--data", data_dir, "--output", str(tmp_path / "run"))
    assert beside.output == str(tmp_path / "run")  # beside the data is fine
    checkpoints = str(tmp_path / "run" / "checkpoints")
    error = _refused(
        capsys,
        "--data",
        data_dir,
        "--output",
        str(tmp_path / "run"),
        "--checkpoint-dir",
        checkpoints,
    )
    assert "holds --checkpoint-dir" in error and "its own folder" in error
    error = _refused(
        capsys,
        "--data",
        data_dir,
        "--output",
        str(tmp_path / "run"),
        "--summary-dir",
        str(tmp_path / "run" / "tensorboard"),
    )
    assert "holds --summary-dir" in error


def test_training_outputs_must_be_local(capsys, data_dir):
    error = _refused(capsys, "--data", data_dir, "--output", "hdfs://namenode/runs/lenet")
    assert "--output 'hdfs://namenode/runs/lenet' is not a local path" in error


def test_a_resumed_runs_checkpoints_are_an_input(tmp_path, capsys, data_dir):
    checkpoints = tmp_path / "run" / "checkpoints"
    _checkpoint(checkpoints, {"state": {}, "dataset": {}})
    error = _refused(
        capsys,
        "--data",
        data_dir,
        "--checkpoint-dir",
        str(checkpoints),
        "--resume",
        "--output",
        str(tmp_path / "run"),
    )
    assert "holds --checkpoint-dir" in error and "would delete --checkpoint-dir" in error


# --- issue 27 item 5: an earlier run's output is replaced only when asked ---
def _gan_arguments(*argv):
    train_gan = pytest.importorskip("train_gan")
    return train_gan.parse_arguments(list(argv))


def test_gan_refuses_an_earlier_runs_output_unless_asked_or_resuming(tmp_path, capsys, data_dir):
    earlier = tmp_path / "gan"
    earlier.mkdir()
    (earlier / "gan.bigdl").write_bytes(b"model")
    (earlier / "samples-epoch-7.png").write_bytes(b"png")
    error = _refused(capsys, "--data", data_dir, "--output", str(earlier), job=_gan_arguments)
    assert "already exists" in error and "gan.bigdl" in error and "pass --overwrite" in error
    assert _gan_arguments("--data", data_dir, "--output", str(earlier), "--overwrite").overwrite
    _checkpoint(tmp_path / "ckpt", {"trainer": {"size": 1}, "user": {}})
    resumed = ["--data", data_dir, "--output", str(earlier)]
    assert _gan_arguments(*resumed, "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume")
    (earlier / "notes.txt").write_text("mine")
    error = _refused(
        capsys, "--data", data_dir, "--output", str(earlier), "--overwrite", job=_gan_arguments
    )
    assert "holds notes.txt, which this job does not write" in error


# --- item 3: outputs that are files ---
def test_output_and_checkpoint_dir_that_are_files_are_refused(tmp_path, capsys, data_dir):
    existing = tmp_path / "taken"
    existing.write_text("not a directory")
    error = _refused(capsys, "--data", data_dir, "--output", str(existing))
    assert "--output" in error and "existing file" in error
    error = _refused(capsys, "--data", data_dir, "--checkpoint-dir", str(existing))
    assert "--checkpoint-dir" in error and "existing file" in error
    nested = str(existing / "below")
    assert "is a file" in output_checks.output_directory_problem(nested)


def test_evaluate_json_output_that_is_a_directory_is_named(tmp_path):
    problem = output_checks.output_file_problem(str(tmp_path), "--output-json")
    assert problem is not None and "is a directory" in problem
    assert output_checks.output_file_problem(str(tmp_path / "m.json"), "--output-json") is None


# --- item 2: another run's checkpoints ---
def test_fresh_run_into_another_runs_checkpoints_is_refused_naming_it(tmp_path, capsys, data_dir):
    _checkpoint(tmp_path / "ckpt", {"trainer": {"size": 1}, "user": {}})
    error = _refused(capsys, "--data", data_dir, "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert "DistriTrainer run's checkpoints" in error and "iteration 3" in error
    arguments = _lenet_arguments(
        "--data", data_dir, "--checkpoint-dir", str(tmp_path / "ckpt"), "--overwrite-checkpoints"
    )
    assert arguments.overwrite_checkpoints


def test_resume_needs_checkpoints_of_the_same_kind(tmp_path, capsys, data_dir):
    empty = tmp_path / "empty"
    error = _refused(capsys, "--data", data_dir, "--checkpoint-dir", str(empty), "--resume")
    assert "holds no checkpoint" in error
    _checkpoint(tmp_path / "gan", {"trainer": {"size": 1}, "user": {}})
    error = _refused(
        capsys, "--data", data_dir, "--checkpoint-dir", str(tmp_path / "gan"), "--resume"
    )
    assert "DistriTrainer run's" in error and "resumes Optimizer runs only" in error
    _checkpoint(tmp_path / "lenet", {"state": {}, "dataset": {}})
    arguments = _lenet_arguments(
        "--data", data_dir, "--checkpoint-dir", str(tmp_path / "lenet"), "--resume"
    )
    assert arguments.resume


def test_gan_job_refuses_a_lenet_checkpoint_directory(tmp_path, capsys, data_dir):
    train_gan = pytest.importorskip("train_gan")
    _checkpoint(tmp_path / "lenet", {"state": {}, "dataset": {}})
    error = _refused(
        capsys,
        "--data",
        data_dir,
        "--checkpoint-dir",
        str(tmp_path / "lenet"),
        job=lambda *argv: train_gan.parse_arguments(list(argv)),
    )
    assert "Optimizer run's checkpoints" in error


# --- items 4, 5, 20: values and settings checked before Spark ---
@pytest.mark.parametrize("limit", ["0", "-5"])
def test_non_positive_limit_is_refused(capsys, data_dir, limit):
    error = _refused(capsys, "--data", data_dir, "--limit", limit)
    assert "argument --limit: must be an integer >= 1" in error


def test_zero_learning_rate_is_a_value_not_the_default():
    assert training_arguments.default_if_none(0.0, 0.05) == 0.0
    assert training_arguments.default_if_none(None, 0.05) == 0.05


def test_missing_data_and_batch_below_partitions_are_refused_before_spark(tmp_path, capsys):
    error = _refused(capsys, "--data", str(tmp_path))
    assert "--data" in error and "Fashion-MNIST train files not found" in error
    error = _refused(capsys, "--data", str(tmp_path), "--batch-size", "4", "--partitions", "8")
    assert "--batch-size 4 is smaller than --partitions 8" in error


# --- item 21: --no-progress keeps each epoch's results ---
def test_no_progress_still_reports_epochs(caplog):
    train_lenet = pytest.importorskip("train_lenet")
    quiet = train_lenet.progress_reporting(no_progress=True)
    assert quiet.enabled and not quiet.uses_bar()
    with caplog.at_level("INFO", logger="bigdl_py"):
        quiet.message("validation: Top1Accuracy: 0.8800")
    assert "Top1Accuracy: 0.8800" in caplog.text


def test_inference_jobs_name_a_missing_input_before_spark(tmp_path):
    inference_inputs = pytest.importorskip("inference_inputs")
    predict = pytest.importorskip("predict")
    arguments = predict.parse_arguments(
        ["m.bigdl", "--input", str(tmp_path / "missing.parquet"), "--output", "o"]
    )
    with pytest.raises(SystemExit, match="missing.parquet' does not exist"):
        inference_inputs.check_input_location(arguments)
    arguments = predict.parse_arguments(["m.bigdl", "--data", str(tmp_path), "--output", "o"])
    with pytest.raises(SystemExit, match="--data: Fashion-MNIST test files not found"):
        inference_inputs.check_input_location(arguments)
