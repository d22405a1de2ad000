"""The jobs' outputs replace an earlier output only once complete (issue 27, items 4, 5 and
21): a failed run leaves the earlier output as it was and no folder that blocks a rerun; a
replacement leaves nothing of the earlier run beside the new output. Without Spark."""

from __future__ import annotations

import argparse
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "jobs"))

import staged_output  # noqa: E402
import training_arguments  # noqa: E402


class Crash(Exception):
    """Stands for whatever stops a run: a NaN row, a missing device, Ctrl-C."""


def _earlier_output(folder):
    folder.mkdir(parents=True)
    (folder / "gan.bigdl").write_bytes(b"earlier model")
    (folder / "samples-epoch-7.png").write_bytes(b"earlier grid")
    return {"gan.bigdl": b"earlier model", "samples-epoch-7.png": b"earlier grid"}


def _contents(folder) -> dict:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


def test_a_new_output_appears_only_when_complete(tmp_path):
    output = tmp_path / "new" / "sub" / "run"
    with staged_output.staged_folder(str(output)) as partial:
        assert not output.exists() and partial == str(tmp_path / "new" / "sub" / ".run.partial")
        (tmp_path / "new" / "sub" / ".run.partial" / "gan.bigdl").write_bytes(b"model")
    assert _contents(output) == {"gan.bigdl": b"model"}
    assert os.listdir(tmp_path / "new" / "sub") == ["run"]


def test_a_replacement_leaves_nothing_of_the_earlier_run(tmp_path):
    output = tmp_path / "gan"
    _earlier_output(output)
    with staged_output.staged_folder(str(output)) as partial:
        with open(os.path.join(partial, "samples-epoch-1.png"), "wb") as file:
            file.write(b"new grid")
        assert (output / "samples-epoch-7.png").exists()  # the earlier output until the end
    assert _contents(output) == {"samples-epoch-1.png": b"new grid"}
    assert os.listdir(tmp_path) == ["gan"]  # no partial, no replaced folder left


def test_a_failed_run_leaves_the_earlier_output_and_nothing_else(tmp_path):
    output = tmp_path / "gan"
    earlier = _earlier_output(output)
    with pytest.raises(Crash), staged_output.staged_folder(str(output)) as partial:
        with open(os.path.join(partial, "gan.bigdl"), "wb") as file:
            file.write(b"half a mod")
        raise Crash
    assert _contents(output) == earlier
    assert os.listdir(tmp_path) == ["gan"]


def test_a_failed_first_run_leaves_no_folder_that_blocks_a_rerun(tmp_path):
    output = tmp_path / "runs" / "gan"
    with pytest.raises(Crash), staged_output.staged_folder(str(output)):
        raise Crash
    assert os.listdir(tmp_path) == []  # not even the parent it made
    with staged_output.staged_folder(str(output)):
        pass
    assert output.is_dir()


def test_a_writer_that_makes_its_own_folder_gets_a_free_path(tmp_path):
    output = tmp_path / "predictions"
    with staged_output.staged_folder(str(output), create=False) as partial:
        assert not os.path.exists(partial)
        os.mkdir(partial)  # as Spark's writer does
    assert output.is_dir()


def test_a_resumable_run_keeps_its_partial_output_for_resume_to_continue(tmp_path):
    output = tmp_path / "gan"
    earlier = _earlier_output(output)
    with (
        pytest.raises(Crash),
        staged_output.staged_folder(str(output), keep_on_failure=True) as partial,
    ):
        with open(os.path.join(partial, "samples-epoch-1.png"), "wb") as file:
            file.write(b"epoch 1")
        raise Crash
    assert _contents(output) == earlier
    with staged_output.staged_folder(str(output), continue_run=True) as partial:
        assert os.listdir(partial) == ["samples-epoch-1.png"]  # the failed attempt's epochs
        with open(os.path.join(partial, "samples-epoch-2.png"), "wb") as file:
            file.write(b"epoch 2")
    assert _contents(output) == {
        "samples-epoch-1.png": b"epoch 1",
        "samples-epoch-2.png": b"epoch 2",
    }


def test_a_fresh_run_discards_a_failed_runs_partial_output(tmp_path):
    output = tmp_path / "gan"
    with pytest.raises(Crash), staged_output.staged_folder(str(output), keep_on_failure=True):
        raise Crash
    assert os.path.isdir(tmp_path / ".gan.partial")
    with staged_output.staged_folder(str(output)) as partial:
        assert os.listdir(partial) == []
    assert os.listdir(tmp_path) == ["gan"]


def test_resuming_a_completed_run_continues_its_output(tmp_path):
    output = tmp_path / "gan"
    earlier = _earlier_output(output)
    with staged_output.staged_folder(str(output), continue_run=True) as partial:
        assert _contents(type(output)(partial)) == earlier
        with open(os.path.join(partial, "samples-epoch-8.png"), "wb") as file:
            file.write(b"epoch 8")
    assert _contents(output) == {**earlier, "samples-epoch-8.png": b"epoch 8"}


def test_an_output_left_aside_by_an_interrupted_replacement_is_put_back(tmp_path):
    output = tmp_path / "gan"
    earlier = _earlier_output(tmp_path / ".gan.replaced")  # a crash between the two renames
    with pytest.raises(Crash), staged_output.staged_folder(str(output)):
        assert _contents(output) == earlier
        raise Crash
    assert _contents(output) == earlier and os.listdir(tmp_path) == ["gan"]


def test_the_jobs_run_output_replaces_an_earlier_runs_sample_grids(tmp_path):
    """train_gan.py (and the other training jobs) write through run_output."""
    output = tmp_path / "gan"
    _earlier_output(output)
    arguments = argparse.Namespace(output=str(output), resume=False, checkpoint_dir=None)
    with training_arguments.run_output(arguments) as folder:
        with open(os.path.join(folder, "samples-epoch-1.png"), "wb") as file:
            file.write(b"new grid")
    assert os.listdir(output) == ["samples-epoch-1.png"]


# --- item 21: evaluate.py --output-json into new folders, and metrics never lost ---
def test_evaluate_writes_metrics_into_folders_it_makes(tmp_path):
    evaluate = pytest.importorskip("evaluate")
    path = tmp_path / "newdir" / "sub" / "m.json"
    evaluate.write_json(str(path), {"rows": 3})
    assert json.loads(path.read_text()) == {"rows": 3}


def test_evaluate_prints_the_metrics_when_they_cannot_be_written(tmp_path, capsys):
    evaluate = pytest.importorskip("evaluate")
    (tmp_path / "taken").write_text("a file where a folder should be")
    path = str(tmp_path / "taken" / "m.json")
    with pytest.raises(SystemExit, match="--output-json .*m.json' could not be written"):
        evaluate.write_json(path, {"rows": 3, "results": {"Loss": 0.25}})
    assert json.loads(capsys.readouterr().out) == {"rows": 3, "results": {"Loss": 0.25}}


class _RecordingFrame:
    """Stands in for a DataFrame: records what write_parquet asks of it, in order."""

    def __init__(self, calls: list):
        self.calls = calls
        self.write = self

    def persist(self, level):
        self.calls.append("persist")
        return self

    def count(self):
        self.calls.append("count")  # computing every row: a bad one fails here
        return 3

    def mode(self, mode):
        self.calls.append(f"mode {mode}")
        return self

    def parquet(self, path):
        self.calls.append(f"parquet {path}")

    def unpersist(self):
        self.calls.append("unpersist")


def test_a_uri_output_is_computed_before_spark_deletes_the_earlier_one():
    """No rename in PySpark's public API for hdfs:// or s3a://: the rows are computed and
    kept first, so a bad row fails before the overwrite starts."""
    pytest.importorskip("pyspark")
    calls: list = []
    staged_output.write_parquet(_RecordingFrame(calls), "hdfs://namenode/out", overwrite=True)
    assert calls == [
        "persist",
        "count",
        "mode overwrite",
        "parquet hdfs://namenode/out",
        "unpersist",
    ]
