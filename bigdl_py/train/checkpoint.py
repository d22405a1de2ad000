"""Training checkpoints on disk: safe format, atomic writes, checksums, fallback on corruption.

A checkpoint directory holds, per checkpoint,

* ``checkpoint-<iteration>-<token>.npz``: the arrays (NumPy's zip layout, pickle refused);
* ``checkpoint-<iteration>.json``: the manifest — the array file's name, size and SHA-256,
  a write sequence number, and the training metadata (plain JSON values);

and one ``latest`` file naming the newest manifest. A write goes arrays -> manifest ->
``latest``, each file complete on disk (temporary file, fsync, rename) before the next, and
old checkpoints are pruned only after that. So a crash at any point leaves ``latest``
naming a complete, verified checkpoint, and the previous good one is still there.

Loading verifies the manifest and the checksum. A corrupt or truncated ``latest`` checkpoint
gets a warning naming the file, and the newest good one is used instead; asking for one
specific manifest that is damaged raises :class:`CheckpointError` naming it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from bigdl_py.nn.serialization import atomic_write, read_npz, write_npz

FORMAT = "bigdl_py.checkpoint"
# Version 2 adds "manifest_sha256": the manifest's own checksum, so a hand-edited epoch or
# iteration is refused like a damaged array file (version 1 manifests carry none).
FORMAT_VERSION = 2
LATEST = "latest"
_MANIFEST = re.compile(r"^checkpoint-(\d+)\.json$")
_ARRAYS = re.compile(r"^checkpoint-(\d+)-[0-9a-f]+\.npz$")

logger = logging.getLogger("bigdl_py.train")


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, truncated or not a bigdl_py checkpoint."""


class CheckpointWarning(UserWarning):
    """The latest checkpoint was unusable and an older good one is used instead."""


@dataclass
class Checkpoint:
    """A verified checkpoint read from disk.

    Attributes
    ----------
    path : str
        Its manifest file.
    iteration : int
    metadata : dict
        The training metadata stored with it.
    arrays : dict of str -> numpy.ndarray
    run_id : str or None
        The run that wrote it (None for checkpoints written without one).
    """

    path: str
    iteration: int
    metadata: dict
    arrays: dict[str, np.ndarray]
    run_id: str | None = None


# --- writing --------------------------------------------------------------------------------
def save_checkpoint(
    directory: str | os.PathLike,
    iteration: int,
    arrays: dict[str, Any],
    metadata: dict,
    overwrite: bool = True,
    keep: int = 2,
    run_id: str | None = None,
) -> str:
    """Write one checkpoint into ``directory``; return its manifest path.

    Parameters
    ----------
    directory : str or PathLike
        Created if missing.
    iteration : int
        Iterations completed; names the checkpoint.
    arrays : dict of str -> array
        Stored in the ``.npz`` file (host copies of device arrays).
    metadata : dict
        JSON values stored in the manifest.
    overwrite : bool
        True: replace a checkpoint of the same iteration and keep only the ``keep`` newest.
        False: keep every checkpoint and refuse to replace one.
    keep : int
        With ``overwrite``, how many of the newest checkpoints to keep (at least 2, so the
        previous good one survives until the next one is complete).
    run_id : str, optional
        The run writing it, stored in the manifest (see :func:`other_run_checkpoints`).

    Raises
    ------
    FileExistsError
        With ``overwrite=False``, when a checkpoint of this iteration exists.
    """
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    manifest_name = f"checkpoint-{iteration:08d}.json"
    manifest_path = os.path.join(directory, manifest_name)
    if not overwrite and os.path.exists(manifest_path):
        raise FileExistsError(
            f"checkpoint {manifest_path} exists and set_checkpoint(overwrite=False) keeps every "
            "checkpoint; use another directory or overwrite=True"
        )
    existing = _read_manifests(directory)
    sequence = 1 + max((manifest["sequence"] for manifest in existing.values()), default=0)
    # A fresh name per write: the manifest that 'latest' names keeps matching its arrays
    # until the new manifest replaces it.
    arrays_name = f"checkpoint-{iteration:08d}-{secrets.token_hex(4)}.npz"
    arrays_path = os.path.join(directory, arrays_name)
    atomic_write(arrays_path, lambda file: write_npz(file, arrays))
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "iteration": int(iteration),
        "sequence": sequence,
        "created": time.time(),
        "arrays_file": arrays_name,
        "arrays_bytes": os.path.getsize(arrays_path),
        "arrays_sha256": _sha256(arrays_path),
        "metadata": metadata,
    }
    if run_id is not None:
        manifest["run_id"] = str(run_id)
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    text = json.dumps(manifest, indent=1, allow_nan=False).encode("utf-8")
    atomic_write(manifest_path, lambda file: file.write(text))
    atomic_write(os.path.join(directory, LATEST), lambda file: file.write(manifest_name.encode()))
    if overwrite:
        _prune(directory, keep=max(2, int(keep)))
    _remove_orphan_arrays(directory)
    return manifest_path


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _manifest_digest(manifest: dict) -> str:
    """SHA-256 of the manifest's content (its own checksum left out), key order fixed."""
    content = {key: value for key, value in manifest.items() if key != "manifest_sha256"}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _read_manifests(directory: str) -> dict[str, dict]:
    """Manifest name -> parsed manifest, for every manifest that parses."""
    manifests = {}
    for name in os.listdir(directory):
        if _MANIFEST.match(name):
            try:
                manifests[name] = _parse_manifest(os.path.join(directory, name))
            except CheckpointError:
                continue
    return manifests


def _prune(directory: str, keep: int) -> None:
    """Delete all but the ``keep`` most recently written checkpoints (by write sequence)."""
    manifests = _read_manifests(directory)
    newest_first = sorted(manifests, key=lambda name: manifests[name]["sequence"], reverse=True)
    kept = set(newest_first[:keep])
    for name in os.listdir(directory):
        if _MANIFEST.match(name) and name not in kept:
            _remove(os.path.join(directory, name))


def _remove_orphan_arrays(directory: str) -> None:
    """Delete array files no manifest refers to (older writes, crashed writes)."""
    referenced = {manifest["arrays_file"] for manifest in _read_manifests(directory).values()}
    for name in os.listdir(directory):
        if _ARRAYS.match(name) and name not in referenced:
            _remove(os.path.join(directory, name))


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


# --- reading --------------------------------------------------------------------------------
def _parse_manifest(path: str) -> dict:
    try:
        with open(path, "rb") as file:
            manifest = json.loads(file.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(
            f"checkpoint manifest {path} is unreadable or truncated: {error}"
        ) from None
    required = ("format", "version", "iteration", "sequence", "arrays_file", "arrays_sha256")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a bigdl_py checkpoint manifest")
    missing = [key for key in required if key not in manifest]
    if missing:
        raise CheckpointError(f"checkpoint manifest {path} lacks {missing}")
    # Types are checked, never coerced: a bad field makes the checkpoint unusable (and the
    # directory's previous good one is used), not a TypeError in the middle of a resume.
    for key, kind in _FIELD_TYPES.items():
        value = manifest.get(key)
        if key in manifest and (isinstance(value, bool) or not isinstance(value, kind)):
            raise CheckpointError(
                f"checkpoint manifest {path}: field {key!r} is {value!r} "
                f"({type(value).__name__}); expected {_type_names(kind)}"
            )
    if manifest["version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {manifest['version']}; this bigdl_py reads "
            f"up to {FORMAT_VERSION}"
        )
    if manifest["iteration"] < 0 or manifest["sequence"] < 0:
        raise CheckpointError(f"checkpoint manifest {path}: negative iteration or sequence")
    if manifest["version"] >= 2:
        recorded = manifest.get("manifest_sha256")
        if recorded != _manifest_digest(manifest):
            raise CheckpointError(
                f"checkpoint manifest {path} was changed after it was written (its SHA-256 "
                f"does not match the recorded {recorded!r}); checkpoints are not edited by hand"
            )
    return manifest


_FIELD_TYPES = {
    "version": int,
    "iteration": int,
    "sequence": int,
    "arrays_file": str,
    "arrays_sha256": str,
    "arrays_bytes": int,
    "created": (int, float),
    "metadata": dict,
    "manifest_sha256": str,
    "run_id": str,
}


def _type_names(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def read_manifest(manifest_path: str | os.PathLike) -> dict:
    """One checkpoint's manifest, checked (types, checksum), without reading its arrays.

    Its ``"metadata"`` says what wrote it, e.g. for refusing another run's directory.

    Raises
    ------
    CheckpointError
        Naming the file, when it is unreadable, not a bigdl_py manifest, or altered.
    """
    return _parse_manifest(os.fspath(manifest_path))


def read_checkpoint(manifest_path: str | os.PathLike) -> Checkpoint:
    """Read and verify one checkpoint given its manifest (``checkpoint-<n>.json``).

    Raises
    ------
    CheckpointError
        Naming the file, when the manifest or the array file is missing, truncated or
        fails its SHA-256 check.
    """
    manifest_path = os.fspath(manifest_path)
    manifest = _parse_manifest(manifest_path)
    arrays_path = os.path.join(os.path.dirname(manifest_path), manifest["arrays_file"])
    if not os.path.exists(arrays_path):
        raise CheckpointError(
            f"checkpoint arrays {arrays_path} (named by {manifest_path}) are missing"
        )
    actual = _sha256(arrays_path)
    if actual != manifest["arrays_sha256"]:
        raise CheckpointError(
            f"checkpoint arrays {arrays_path} are corrupt or truncated: SHA-256 {actual} does "
            f"not match {manifest['arrays_sha256']} recorded in {manifest_path} "
            f"({os.path.getsize(arrays_path)} bytes on disk, {manifest.get('arrays_bytes')} "
            "written)"
        )
    try:
        arrays, _ = read_npz(arrays_path)
    except ValueError as error:
        raise CheckpointError(str(error)) from None
    return Checkpoint(
        manifest_path,
        int(manifest["iteration"]),
        manifest["metadata"],
        arrays,
        manifest.get("run_id"),
    )


def other_run_checkpoints(directory: str | os.PathLike, run_id: str) -> str | None:
    """Why run ``run_id`` must not write into ``directory`` (None when it may).

    A directory that is a file cannot hold checkpoints; one holding checkpoints another run
    wrote (or checkpoints written without a run id) would have them replaced and pruned.
    """
    directory = os.fspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        return (
            f"checkpoint path {directory} is a file, not a directory; no checkpoint could be saved"
        )
    if not os.path.isdir(directory):
        return None
    manifests = _read_manifests(directory)
    foreign = [name for name, manifest in manifests.items() if manifest.get("run_id") != run_id]
    if not foreign:
        return None
    newest = max(foreign, key=lambda name: manifests[name]["sequence"])
    manifest = manifests[newest]
    writer = manifest.get("run_id", "a run that recorded no id")
    written = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(manifest.get("created", 0)))
    return (
        f"checkpoint directory {directory} holds {len(foreign)} checkpoint(s) of another run "
        f"({writer}; newest: iteration {manifest['iteration']}, {newest}, written {written}); "
        "a new run would replace them. Resume that run (resume_from), use another directory, "
        "or set_checkpoint(..., replace_other_runs=True)"
    )


def list_checkpoints(directory: str | os.PathLike) -> list[str]:
    """Manifest paths of the checkpoints in ``directory`` that parse, newest write first."""
    directory = os.fspath(directory)
    manifests = _read_manifests(directory)
    names = sorted(manifests, key=lambda name: manifests[name]["sequence"], reverse=True)
    return [os.path.join(directory, name) for name in names]


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Load a checkpoint: a directory's latest good one, or one manifest file.

    Parameters
    ----------
    path : str or PathLike
        A checkpoint directory (``set_checkpoint``'s path): its ``latest`` checkpoint, or,
        when that is damaged, the newest good one, with a :class:`CheckpointWarning` naming
        the damaged file. Or a manifest file ``checkpoint-<n>.json``: exactly that one.

    Raises
    ------
    CheckpointError
        When no good checkpoint is found, naming every file tried and what was wrong.
    FileNotFoundError
        When ``path`` does not exist.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    if not os.path.isdir(path):
        if path.endswith(".npz"):
            raise CheckpointError(
                f"{path} is a checkpoint's array file; load its manifest "
                "(checkpoint-<iteration>.json) or the checkpoint directory"
            )
        return read_checkpoint(path)
    problems = []
    latest = _latest_manifest(path, problems)
    candidates = [latest] if latest else []
    candidates += [manifest for manifest in list_checkpoints(path) if manifest != latest]
    for manifest in candidates:
        try:
            checkpoint = read_checkpoint(manifest)
        except CheckpointError as error:
            problems.append(str(error))
            continue
        if problems:
            message = (
                f"the latest checkpoint in {path} is unusable ({'; '.join(problems)}); "
                f"resuming from the previous good one, {checkpoint.path}"
            )
            warnings.warn(message, CheckpointWarning, stacklevel=2)
            logger.warning(message)
        return checkpoint
    detail = "; ".join(problems) if problems else "the directory holds no checkpoint"
    raise CheckpointError(f"no usable checkpoint in {path}: {detail}")


def _latest_manifest(directory: str, problems: list[str]) -> str | None:
    pointer = os.path.join(directory, LATEST)
    try:
        with open(pointer, encoding="utf-8") as file:
            name = file.read().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        problems.append(f"{pointer} is unreadable: {error}")
        return None
    if not _MANIFEST.match(name):
        problems.append(f"{pointer} names {name!r}, which is not a checkpoint manifest")
        return None
    return os.path.join(directory, name)
