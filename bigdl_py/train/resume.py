"""What a training checkpoint holds, and how a run is put back exactly where it was.

Arrays (in the checkpoint's ``.npz``):

* ``model/<dotted name>``: every parameter and buffer (``Module.state_dict`` names);
* ``optim/<shard>/<key>``: the optimizer state — one shard for local training, one per
  partition for sharded state — with its numbers stored as typed 0-d arrays.
* ``best_model/<dotted name>``: with ``EarlyStopping(restore_best=True)``, the weights of
  the best validation so far (its score and iteration are in the training state).

Metadata (JSON in the manifest): the :class:`TrainingState` (epoch, iteration, position in
the epoch, last loss and score...), a fingerprint of the training set (size, seed, shuffle,
batch size: what fixes every epoch's batches), the optimizer's configuration, the layout of
its state, the model's random-generator states, and the last validation results.

Storage (atomic writes, checksums, fallback) is :mod:`bigdl_py.train.checkpoint`'s job.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from bigdl_py.train.checkpoint import Checkpoint, CheckpointError
from bigdl_py.train.metrics import ValidationResult
from bigdl_py.train.runner import IterationRunner
from bigdl_py.train.triggers import TrainingState

_MODEL_PREFIX = "model/"
_OPTIM_PREFIX = "optim"
_BEST_PREFIX = "best_model/"


def dataset_fingerprint(training_set: Any, batch_size: int) -> dict:
    """What must match for a resumed run to see the same batches."""
    fingerprint = {"size": len(training_set), "batch_size": int(batch_size)}
    for key in ("seed", "shuffle", "drop_last"):
        if hasattr(training_set, key):
            fingerprint[key] = getattr(training_set, key)
    return fingerprint


def capture(
    runner: IterationRunner,
    state: TrainingState,
    fingerprint: dict,
    optim_method: Any,
    last_validation: list[ValidationResult],
) -> tuple[dict[str, Any], dict]:
    """``(arrays, metadata)`` of a checkpoint of the run as it stands."""
    arrays = {_MODEL_PREFIX + name: value for name, value in runner.model_state_dict().items()}
    optim_arrays, optim_layout = pack_state_dicts(_OPTIM_PREFIX, runner.optim_state_dict())
    arrays.update(optim_arrays)
    config = getattr(optim_method, "config", None)
    metadata = {
        "state": state.to_dict(),
        "dataset": fingerprint,
        "optim_method": config() if callable(config) else repr(optim_method),
        "optim_layout": optim_layout,
        "rng": runner.rng_state(),
        "last_validation": [
            {"name": result.name, "total": result.total, "count": result.count}
            for result in last_validation
        ],
    }
    return arrays, metadata


def pack_best_weights(weights: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """The checkpoint arrays of the best validation's weights (none when there are none)."""
    if not weights:
        return {}
    return {_BEST_PREFIX + name: value for name, value in weights.items()}


def unpack_best_weights(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """The best validation's weights stored by :func:`pack_best_weights`, or None."""
    weights = {
        name[len(_BEST_PREFIX) :]: value
        for name, value in arrays.items()
        if name.startswith(_BEST_PREFIX)
    }
    return weights or None


def restore(
    runner: IterationRunner, checkpoint: Checkpoint, fingerprint: dict
) -> tuple[TrainingState, list[ValidationResult]]:
    """Load a checkpoint into ``runner``; return the run's state and last validation results.

    Raises
    ------
    CheckpointError
        For a checkpoint another kind of run wrote (a ``DistriTrainer``'s, say).
    ValueError
        When the training set's fingerprint differs from the checkpoint's (the batches
        would differ), naming each setting.
    """
    metadata = checkpoint.metadata
    missing = [key for key in ("state", "dataset", "optim_layout", "rng") if key not in metadata]
    if missing:
        writer = "a DistriTrainer (e.g. train_gan.py)" if "trainer" in metadata else "another"
        raise CheckpointError(
            f"cannot resume from {checkpoint.path}: it was written by {writer} run, not an "
            f"Optimizer's (its metadata lacks {missing}); use that run's own checkpoint "
            "directory"
        )
    state = TrainingState.from_dict(metadata["state"])
    saved = metadata["dataset"]
    # A new batch size is fine at an epoch boundary; mid-epoch it would move the position.
    keys = [key for key in saved if key != "batch_size" or state.iteration_in_epoch]
    different = {
        key: (saved[key], fingerprint.get(key))
        for key in keys
        if saved[key] != fingerprint.get(key)
    }
    if different:
        raise ValueError(
            f"cannot resume from {checkpoint.path}: the training set differs from the one it "
            f"was written with (setting: (checkpoint, now)) {different}"
        )
    runner.load_model_state_dict(
        {
            name[len(_MODEL_PREFIX) :]: value
            for name, value in checkpoint.arrays.items()
            if name.startswith(_MODEL_PREFIX)
        }
    )
    runner.load_optim_state_dict(
        unpack_state_dicts(_OPTIM_PREFIX, checkpoint.arrays, metadata["optim_layout"])
    )
    runner.load_rng_state(metadata["rng"])
    last_validation = [
        ValidationResult(item["name"], item["total"], item["count"])
        for item in metadata.get("last_validation", [])
    ]
    return state, last_validation


def pack_state_dicts(
    prefix: str, state: dict[str, Any] | list[dict[str, Any]]
) -> tuple[dict[str, np.ndarray], dict]:
    """Split one state dict (or a list of per-shard ones) into arrays and a JSON layout.

    Arrays and numbers go to the array file (exact, typed); ``None``, strings and other JSON
    values stay in the layout. :func:`unpack_state_dicts` inverts it.
    """
    shards = state if isinstance(state, list) else [state]
    arrays: dict[str, np.ndarray] = {}
    layout: dict[str, Any] = {"sharded": isinstance(state, list), "shards": []}
    for index, shard in enumerate(shards):
        entries = []
        for key, value in shard.items():
            name = f"{prefix}/{index}/{key}"
            if isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__"):
                arrays[name] = value
                entries.append({"key": key, "kind": "array"})
            elif isinstance(value, (bool, int, float, np.number, np.bool_)):
                arrays[name] = np.asarray(value)
                entries.append({"key": key, "kind": "scalar"})
            else:
                json.dumps(value, allow_nan=False)  # raises for what JSON cannot hold
                entries.append({"key": key, "kind": "json", "value": value})
        layout["shards"].append(entries)
    return arrays, layout


def unpack_state_dicts(
    prefix: str, arrays: dict[str, np.ndarray], layout: dict
) -> dict[str, Any] | list[dict[str, Any]]:
    """Rebuild what :func:`pack_state_dicts` split."""
    shards = []
    for index, entries in enumerate(layout["shards"]):
        shard: dict[str, Any] = {}
        for entry in entries:
            name = f"{prefix}/{index}/{entry['key']}"
            if entry["kind"] == "array":
                shard[entry["key"]] = arrays[name]
            elif entry["kind"] == "scalar":
                shard[entry["key"]] = arrays[name].item()
            else:
                shard[entry["key"]] = entry["value"]
        shards.append(shard)
    return shards if layout["sharded"] else shards[0]
