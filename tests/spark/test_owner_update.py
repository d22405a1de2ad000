"""The owners' state store: its file format and its writes in the background."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bigdl_py.spark import owner_update
from bigdl_py.spark.owner_update import ShardStateStore


def adam_like_state(rng):
    return {
        "step": 7,
        "lr": 0.125,
        "amsgrad": False,
        "name": "adam",
        "exp_avg": rng.standard_normal(1000).astype(np.float32),
        "exp_avg_sq": rng.standard_normal((10, 3)),
        "counts": np.arange(5, dtype=np.int16),
        "empty": np.zeros(0, dtype=np.float32),
    }


def test_a_state_comes_back_with_its_values_dtypes_and_shapes(tmp_path, rng):
    store = ShardStateStore(str(tmp_path), "shard-3")
    state = adam_like_state(rng)
    store.save(4, state)

    loaded = store.load(4)

    assert loaded.keys() == state.keys()
    for key, value in state.items():
        if isinstance(value, np.ndarray):
            assert loaded[key].dtype == value.dtype and loaded[key].shape == value.shape
            np.testing.assert_array_equal(loaded[key], value)
        else:
            assert loaded[key] == value and type(loaded[key]) is type(value)
    assert store.load(3) is None


def test_a_state_holding_python_objects_is_refused(tmp_path):
    store = ShardStateStore(str(tmp_path), 0)
    with pytest.raises(ValueError, match="'history' holds Python objects"):
        store.save(0, {"history": [1, None]})
    assert os.listdir(tmp_path) == []


def test_a_cut_file_is_an_error_not_a_short_state(tmp_path, rng):
    store = ShardStateStore(str(tmp_path), 0)
    store.save(0, adam_like_state(rng))
    with open(store.path(0), "r+b") as handle:
        handle.truncate(os.path.getsize(store.path(0)) - 8)
    with pytest.raises(RuntimeError, match="cut short"):
        store.load(0)


def test_a_task_ends_only_after_its_background_writes(tmp_path, rng):
    store = ShardStateStore(str(tmp_path), 0)
    state = adam_like_state(rng)

    def task(partition, rows):
        owner_update._save_in_background(store, partition, state, None)
        yield from rows

    rows = list(owner_update.finishing_state_writes(task)(5, iter(["a", "b"])))

    assert rows == ["a", "b"]
    np.testing.assert_array_equal(store.load(5)["exp_avg"], state["exp_avg"])


def test_a_failed_background_write_fails_the_task(tmp_path):
    store = ShardStateStore(str(tmp_path / "missing-directory"), 0)

    def task(partition, rows):
        owner_update._save_in_background(store, partition, {"step": 1}, None)
        yield from rows

    with pytest.raises(FileNotFoundError):
        list(owner_update.finishing_state_writes(task)(0, iter([1])))
