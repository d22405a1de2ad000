"""Checkpoint manifests are checked, not trusted (issue 16, items 10 and 12)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bigdl_py.train import CheckpointError, CheckpointWarning, load_checkpoint
from bigdl_py.train.checkpoint import read_manifest, save_checkpoint
from bigdl_py.train.resume import restore


def _write(directory, iteration, metadata=None):
    arrays = {"weights": np.full(3, float(iteration), dtype=np.float32)}
    return save_checkpoint(directory, iteration, arrays, metadata or {"epoch": iteration})


def _edit(manifest_path, change):
    with open(manifest_path) as file:
        manifest = json.load(file)
    change(manifest)
    with open(manifest_path, "w") as file:
        json.dump(manifest, file)


def test_hand_edited_metadata_is_refused_and_the_previous_checkpoint_used(tmp_path):
    _write(tmp_path, 1)
    newest = _write(tmp_path, 2)
    _edit(newest, lambda manifest: manifest["metadata"].update(epoch=5))
    with pytest.raises(CheckpointError, match="changed after it was written"):
        read_manifest(newest)
    with pytest.warns(CheckpointWarning, match="changed after it was written"):
        loaded = load_checkpoint(tmp_path)
    assert loaded.iteration == 1 and loaded.metadata == {"epoch": 1}


@pytest.mark.parametrize(
    ("field", "value"), [("version", "1"), ("sequence", "2"), ("iteration", 2.5), ("metadata", [])]
)
def test_fields_of_the_wrong_type_fall_back_to_the_previous_checkpoint(tmp_path, field, value):
    _write(tmp_path, 1)
    newest = _write(tmp_path, 2)
    _edit(newest, lambda manifest: manifest.update({field: value}))
    with pytest.raises(CheckpointError, match=rf"field '{field}' is"):
        read_manifest(newest)
    with pytest.warns(CheckpointWarning, match=f"field '{field}'"):
        assert load_checkpoint(tmp_path).iteration == 1


def test_a_manifest_of_format_version_1_still_loads(tmp_path):
    path = _write(tmp_path, 3)

    def as_version_1(manifest):
        manifest["version"] = 1
        del manifest["manifest_sha256"]

    _edit(path, as_version_1)
    assert load_checkpoint(tmp_path).metadata == {"epoch": 3}


def test_another_kind_of_run_checkpoint_is_named_on_resume(tmp_path):
    _write(tmp_path, 4, {"trainer": {"size": 10}, "user": {"epoch": 1}})
    checkpoint = load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="written by a DistriTrainer"):
        restore(runner=None, checkpoint=checkpoint, fingerprint={})
