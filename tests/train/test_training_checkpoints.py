"""Checkpoint files: round trip, atomic writes, checksums, fallback, and in-process resume."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from train_models import make_classifier

from bigdl_py import nn
from bigdl_py.autograd import ops
from bigdl_py.optim import SGD, Adam, Plateau
from bigdl_py.train import (
    CheckpointError,
    CheckpointWarning,
    EveryEpoch,
    LocalOptimizer,
    MaxEpoch,
    SeveralIteration,
    Top1Accuracy,
    list_checkpoints,
    load_checkpoint,
)
from bigdl_py.train import checkpoint as checkpoints
from bigdl_py.train.checkpoint import save_checkpoint
from bigdl_py.train.resume import pack_state_dicts, unpack_state_dicts


def write(directory, iteration, **options):
    arrays = {"weights": np.full(5, float(iteration), dtype=np.float32)}
    return save_checkpoint(directory, iteration, arrays, {"iteration": iteration}, **options)


def test_a_checkpoint_round_trips_and_latest_names_it(tmp_path):
    arrays = {"model/w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": np.asarray(4)}
    manifest = save_checkpoint(tmp_path, 12, arrays, {"note": "hello", "nested": [1, {"a": 2}]})
    assert (tmp_path / "latest").read_text() == os.path.basename(manifest)
    loaded = load_checkpoint(tmp_path)
    assert loaded.path == manifest and loaded.iteration == 12
    assert loaded.metadata == {"note": "hello", "nested": [1, {"a": 2}]}
    np.testing.assert_array_equal(loaded.arrays["model/w"], arrays["model/w"])
    assert loaded.arrays["model/w"].dtype == np.float32
    record = json.loads(open(manifest).read())
    assert len(record["arrays_sha256"]) == 64 and record["arrays_bytes"] > 0


def test_overwrite_keeps_the_two_newest_checkpoints(tmp_path):
    for iteration in (10, 20, 30):
        write(tmp_path, iteration)
    names = sorted(os.listdir(tmp_path))
    assert [n for n in names if n.endswith(".json")] == [
        "checkpoint-00000020.json",
        "checkpoint-00000030.json",
    ]
    assert len([n for n in names if n.endswith(".npz")]) == 2  # no orphaned arrays
    assert load_checkpoint(tmp_path).iteration == 30


def test_without_overwrite_every_checkpoint_is_kept_and_none_replaced(tmp_path):
    for iteration in (10, 20, 30):
        write(tmp_path, iteration, overwrite=False)
    assert len(list_checkpoints(tmp_path)) == 3
    with pytest.raises(FileExistsError, match="checkpoint-00000020.json exists"):
        write(tmp_path, 20, overwrite=False)


def test_rewriting_an_iteration_replaces_it(tmp_path):
    write(tmp_path, 10)
    save_checkpoint(tmp_path, 10, {"weights": np.zeros(2)}, {"second": True})
    loaded = load_checkpoint(tmp_path)
    assert loaded.metadata == {"second": True}
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".npz")]) == 1


def _arrays_file(manifest: str) -> str:
    record = json.loads(open(manifest).read())
    return os.path.join(os.path.dirname(manifest), record["arrays_file"])


@pytest.mark.parametrize("damage", ["flip_byte", "truncate"])
def test_damaged_arrays_are_refused_by_name_and_the_previous_checkpoint_is_used(tmp_path, damage):
    write(tmp_path, 10)
    newest = write(tmp_path, 20)
    arrays_path = _arrays_file(newest)
    data = bytearray(open(arrays_path, "rb").read())
    if damage == "flip_byte":
        data[len(data) // 2] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    open(arrays_path, "wb").write(bytes(data))

    with pytest.raises(CheckpointError, match=f"{arrays_path}.*corrupt or truncated.*SHA-256"):
        checkpoints.read_checkpoint(newest)
    with pytest.warns(CheckpointWarning, match=r"checkpoint-00000020-.*corrupt.*previous good one"):
        loaded = load_checkpoint(tmp_path)
    assert loaded.iteration == 10
    np.testing.assert_array_equal(loaded.arrays["weights"], np.full(5, 10.0, np.float32))


def test_a_truncated_manifest_is_named_and_skipped(tmp_path):
    write(tmp_path, 10)
    newest = write(tmp_path, 20)
    text = open(newest).read()
    open(newest, "w").write(text[: len(text) // 3])
    with pytest.raises(CheckpointError, match="00000020.json is unreadable or truncated"):
        load_checkpoint(newest)
    with pytest.warns(CheckpointWarning, match="checkpoint-00000020.json is unreadable"):
        assert load_checkpoint(tmp_path).iteration == 10


def test_no_good_checkpoint_is_an_error_listing_what_was_wrong(tmp_path):
    only = write(tmp_path, 10)
    os.remove(_arrays_file(only))
    with pytest.raises(CheckpointError, match="no usable checkpoint.*are missing"):
        load_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        load_checkpoint(tmp_path / "empty")


def test_the_array_file_itself_is_not_a_checkpoint_path(tmp_path):
    manifest = write(tmp_path, 10)
    with pytest.raises(CheckpointError, match="load its manifest"):
        load_checkpoint(_arrays_file(manifest))


def test_a_write_that_fails_midway_leaves_the_previous_checkpoint_current(tmp_path, monkeypatch):
    write(tmp_path, 10)
    before = sorted(os.listdir(tmp_path))

    def crash(file, arrays, extra_members=None):
        file.write(b"partial data")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoints, "write_npz", crash)
    with pytest.raises(OSError, match="disk full"):
        write(tmp_path, 20)
    assert sorted(os.listdir(tmp_path)) == before  # no temporary file left behind
    assert load_checkpoint(tmp_path).iteration == 10


def test_state_dicts_pack_into_typed_arrays_and_json(tmp_path):
    state = {
        "step": 3,
        "lr": 0.5,
        "best": math.inf,
        "flag": True,
        "mode": "max",
        "nothing": None,
        "m": np.arange(4, dtype=np.float32),
        "zero_d": np.asarray(2.5),
    }
    arrays, layout = pack_state_dicts("optim", state)
    save_checkpoint(tmp_path, 1, arrays, {"layout": layout})
    loaded = load_checkpoint(tmp_path)
    restored = unpack_state_dicts("optim", loaded.arrays, loaded.metadata["layout"])
    assert restored.keys() == state.keys()
    for key in ("step", "lr", "best", "flag", "mode", "nothing"):
        assert restored[key] == state[key] and type(restored[key]) is type(state[key])
    np.testing.assert_array_equal(restored["m"], state["m"])
    assert restored["m"].dtype == np.float32
    assert restored["zero_d"].shape == () and restored["zero_d"] == 2.5


def test_sharded_state_dicts_come_back_as_a_list():
    shards = [{"step": 1, "m": np.zeros(3)}, {"step": 1, "m": np.ones(2)}]
    arrays, layout = pack_state_dicts("optim", shards)
    restored = unpack_state_dicts("optim", arrays, layout)
    assert isinstance(restored, list) and len(restored) == 2
    np.testing.assert_array_equal(restored[1]["m"], np.ones(2))


# --- checkpoints written by the training loop -------------------------------------------------
def train(dataset, optim_method, end_trigger, seed=0, dropout=0.5, **checkpoint):
    nn.init.manual_seed(99)
    ops.manual_seed(1234)  # the dropout op's shared generator
    model = make_classifier(seed=seed, dropout=dropout)
    optimizer = LocalOptimizer(
        model,
        dataset,
        nn.NLLLoss(),
        optim_method,
        batch_size=32,
        end_trigger=end_trigger,
        progress=False,
    )
    if checkpoint:
        optimizer.set_checkpoint(checkpoint["path"], checkpoint["trigger"])
    if "resume" in checkpoint:
        optimizer.resume_from(checkpoint["resume"])
    optimizer.set_validation(EveryEpoch(), dataset, Top1Accuracy())
    optimizer.optimize()
    return optimizer


def test_the_loop_stores_weights_optimizer_state_and_progress(tmp_path, blob_dataset):
    optimizer = train(blob_dataset, Adam(lr=0.01), MaxEpoch(1), path=tmp_path, trigger=EveryEpoch())
    loaded = load_checkpoint(tmp_path)
    for name, value in optimizer.model.state_dict().items():
        np.testing.assert_array_equal(loaded.arrays[f"model/{name}"], value)
    optim_state = unpack_state_dicts("optim", loaded.arrays, loaded.metadata["optim_layout"])
    for key, value in optimizer.optim_method.state_dict().items():
        np.testing.assert_array_equal(optim_state[key], value)
    assert loaded.metadata["state"]["epoch"] == 1
    assert loaded.metadata["state"]["iteration"] == 8
    assert loaded.metadata["dataset"] == {
        "size": 240,
        "batch_size": 32,
        "seed": 7,
        "shuffle": True,
        "drop_last": False,
    }
    assert loaded.metadata["optim_method"]["name"] == "Adam"
    assert optimizer.last_checkpoint == loaded.path


@pytest.mark.parametrize("stop_after", [EveryEpoch(), SeveralIteration(11)])
def test_resuming_in_process_equals_training_straight_through(tmp_path, blob_dataset, stop_after):
    """With a Plateau schedule, dropout and validation: every piece of state must come back."""

    def sgd():
        return SGD(lr=0.1, momentum=0.9, schedule=Plateau(mode="max", patience=0, factor=0.5))

    straight = train(blob_dataset, sgd(), MaxEpoch(3))
    first = train(blob_dataset, sgd(), stop_after, path=tmp_path, trigger=stop_after)
    assert first.state.iteration in (8, 11)
    resumed = train(
        blob_dataset,
        sgd(),
        MaxEpoch(3),
        seed=5,
        path=tmp_path,
        trigger=EveryEpoch(),
        resume=tmp_path,
    )
    for name, value in straight.model.state_dict().items():
        np.testing.assert_array_equal(resumed.model.state_dict()[name], value, err_msg=name)
    assert resumed.state == straight.state
    rates = [run.optim_method.current_learning_rate() for run in (resumed, straight)]
    assert rates[0] == rates[1]


def test_resuming_with_another_training_set_is_refused(tmp_path, blob_dataset):
    every_3 = SeveralIteration(3)
    train(blob_dataset, SGD(lr=0.1), every_3, path=tmp_path, trigger=every_3)
    other = blob_dataset.with_options(seed=8)
    with pytest.raises(ValueError, match=r"training set differs.*'seed': \(7, 8\)"):
        train(other, SGD(lr=0.1), MaxEpoch(1), resume=tmp_path, path=tmp_path, trigger=EveryEpoch())
