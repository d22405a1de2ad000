"""Every number a job takes is checked as its command line is read (issue 27, items 12 and
22): a usage error naming the argument and the allowed range, before Spark starts, before
data is read and before any folder is made. Called as plain functions, without Spark."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "jobs"))

import argument_types  # noqa: E402

from bigdl_py.train.checkpoint import save_checkpoint  # noqa: E402


@pytest.fixture(autouse=True)
def _in_a_fresh_folder(tmp_path, monkeypatch):
    """Relative defaults (runs/gan) land in the test's own folder, not in the checkout."""
    monkeypatch.chdir(tmp_path)


def _parse(job: str, argv: list[str]):
    return pytest.importorskip(job).parse_arguments(argv)


@pytest.mark.parametrize(
    ("job", "argv", "message"),
    [
        ("train_ncf", ["--hidden", "33,16"], "--hidden: must be comma-separated widths >= 1 "),
        ("train_ncf", ["--hidden", "0,16"], "--hidden: must be comma-separated widths >= 1 "),
        ("train_ncf", ["--weight-decay", "-1"], "--weight-decay: must be a finite number in [0"),
        ("train_ncf", ["--lr", "nan"], "--lr: must be a finite number in [0, inf), got 'nan'"),
        ("train_ncf", ["--embedding-dim", "0"], "--embedding-dim: must be an integer >= 1"),
        ("train_ncf", ["--negatives", "0"], "--negatives: must be an integer >= 1"),
        (
            "train_ncf",
            ["--test-fraction", "1"],
            "--test-fraction: must be a finite number in (0, 1)",
        ),
        ("train_gan", ["--noise-size", "0"], "--noise-size: must be an integer >= 1, got '0'"),
        ("train_gan", ["--beta1", "1.5"], "--beta1: must be a finite number in [0, 1), got '1.5'"),
        ("train_gan", ["--lr", "inf"], "--lr: must be a finite number in [0, inf)"),
        ("train_gan", ["--hidden", "0"], "--hidden: must be an integer >= 1"),
        ("train_gan", ["--log-every", "0"], "--log-every: must be an integer >= 1"),
        ("train_lenet", ["--momentum", "-0.5"], "--momentum: must be a finite number in [0"),
        ("train_lenet", ["--lr", "-1"], "--lr: must be a finite number in [0"),
        (
            "train_lenet",
            ["--iterations-per-job", "33"],
            "--iterations-per-job: must be an integer from 1",
        ),
        ("train_lenet", ["--period", "0"], "--period: must be an integer >= 1"),
        ("train_lenet", ["--stages", "0"], "--stages: must be an integer >= 1"),
        ("train_lenet", ["--micro-batches", "0"], "--micro-batches: must be an integer >= 1"),
        ("train_lenet", ["--replicas", "x"], "--replicas: must be an integer >= 1"),
        ("train_lenet", ["--seed", "-1"], "--seed: must be an integer >= 0"),
        ("train_lenet", ["--epochs", "0"], "--epochs: must be an integer >= 1"),
        ("train_lenet", ["--batch-size", "x"], "--batch-size: must be an integer >= 1, got 'x'"),
        ("train_lenet", ["--partitions", "0"], "--partitions: must be an integer >= 1"),
        ("predict", ["m", "--output", "o", "--batch-size", "0"], "--batch-size: must be an"),
        ("predict", ["m", "--output", "o", "--feature-shape", "1,0"], "--feature-shape: must be"),
        ("predict", ["m", "--output", "o", "--device", "tpu"], "--device: unknown device 'tpu'"),
        ("evaluate", ["m", "--batch-size", "0"], "--batch-size: must be an integer >= 1"),
        ("evaluate", ["m", "--partitions", "0"], "--partitions: must be an integer >= 1"),
        ("evaluate", ["m", "--device", "cuda:x"], "--device: bad device index in 'cuda:x'"),
        ("evaluate", ["m", "--features-col", " , "], "--features-col: names no column"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_argument_and_the_range(
    capsys, tmp_path, job, argv, message
):
    with pytest.raises(SystemExit) as exit_info:
        _parse(job, argv)
    assert exit_info.value.code == 2
    assert f"error: argument {message}" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []  # no output folder left behind (train_gan --beta1 1.5)


def test_zero_partitions_is_refused_not_replaced_by_the_default(capsys):
    """evaluate.py --partitions 0 used to mean "the task slots"; None is the default."""
    assert _parse("evaluate", ["m"]).partitions is None
    assert _parse("evaluate", ["m", "--partitions", "3"]).partitions == 3


def test_good_values_are_read_as_numbers():
    ncf = _parse("train_ncf", ["--hidden", "64,32,16", "--lr", "0", "--weight-decay", "0"])
    assert ncf.hidden == [64, 32, 16] and ncf.lr == 0.0 and ncf.weight_decay == 0.0
    assert _parse("train_ncf", []).hidden == [32, 16]  # the default goes through the check
    gan = _parse("train_gan", ["--beta1", "0", "--noise-size", "1"])
    assert gan.beta1 == 0.0 and gan.noise_size == 1
    shown = _parse("predict", ["m", "--output", "o", "--feature-shape", "1,28,28"])
    assert shown.feature_shape == (1, 28, 28) and shown.batch_size == 512
    assert _parse("predict", ["m", "--output", "o", "--features-col", "a, b"]).features_col == [
        "a",
        "b",
    ]
    assert _parse("evaluate", ["m", "--device", "CUDA:1"]).device == "cuda:1"


def test_number_types_state_the_interval_they_accept():
    fraction = argument_types.real_number(0, 1, low_open=True, high_open=True)
    assert fraction("0.5") == 0.5
    for text in ("0", "1", "nan", "-inf", "half"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"in \(0, 1\)"):
            fraction(text)
    bounded = argument_types.whole_number(1, 32)
    assert bounded("32") == 32
    with pytest.raises(argparse.ArgumentTypeError, match="from 1 to 32, got '2.5'"):
        bounded("2.5")


# --- item 12: train_ncf --overwrite-checkpoints works, and is checked before Spark ---
def test_ncf_checks_another_runs_checkpoints_before_spark(tmp_path, capsys):
    folder = str(tmp_path / "checkpoints")
    save_checkpoint(folder, 3, {"weights": np.zeros(2, np.float32)}, {"state": {}, "dataset": {}})
    with pytest.raises(SystemExit):
        _parse("train_ncf", ["--checkpoint-dir", folder])
    error = capsys.readouterr().err
    assert "Optimizer run's checkpoints" in error and "--overwrite-checkpoints" in error
    assert "set_checkpoint" not in error  # an API the job's user cannot call
    arguments = _parse("train_ncf", ["--checkpoint-dir", folder, "--overwrite-checkpoints"])
    assert arguments.overwrite_checkpoints


def test_lenet_trains_a_pipeline_of_the_stages_asked_for():
    train_lenet = pytest.importorskip("train_lenet")
    arguments = argparse.Namespace(
        update="pipeline", stages=3, micro_batches=8, replicas=2, recompute=True, period=8
    )
    mode = train_lenet.training_mode(arguments)
    assert (mode.stages, mode.micro_batches, mode.replicas, mode.recompute) == (3, 8, 2, True)
    assert mode.partitions == 6
    assert train_lenet.training_mode(argparse.Namespace(update="sharded")) == "sharded"
