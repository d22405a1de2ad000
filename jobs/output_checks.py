"""Checks of the jobs' input and output locations, run before Spark starts or data is read.

Every one of them guards against losing data or losing a run's result: an output that would
replace the job's own input, an output path that is a file (the run would train for hours
and then fail to save), a checkpoint directory holding another run's checkpoints. Each
returns an error message (``None`` when all is well), so that a job can report it as a usage
error and a test can call it without starting anything.
"""

from __future__ import annotations

import datetime
import os

# Kinds of run a checkpoint directory can hold, told apart by the metadata their writers
# store (bigdl_py.train.resume for Optimizers, DistriTrainer.save_checkpoint for the GAN).
OPTIMIZER_RUN = "Optimizer"
TRAINER_RUN = "DistriTrainer"


def _local(path: str) -> str | None:
    """A local path's absolute, resolved form; None for a URI (hdfs://, s3a://...)."""
    if path.startswith("file:"):
        path = path[len("file:") :]
        while path.startswith("//"):
            path = path[1:]
    elif "://" in path:
        return None
    return os.path.realpath(os.path.abspath(path))


def _nearest_existing(path: str) -> str:
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def input_output_clash(input_path: str | None, output_path: str) -> str | None:
    """Refuse an output that is the input, or a folder inside it, or one holding it.

    Spark removes an output path it overwrites before it reads the input, so the job would
    delete its own input.
    """
    if input_path is None:
        return None
    source, target = _local(input_path), _local(output_path)
    if source is None or target is None:
        same = input_path.rstrip("/") == output_path.rstrip("/")
        return f"--output {output_path!r} is the --input; write elsewhere" if same else None
    if source == target:
        return f"--output {output_path!r} is the --input; writing it would delete the input"
    if os.path.commonpath([source, target]) in (source, target):
        inner, outer = (target, source) if target.startswith(source) else (source, target)
        return (
            f"--output {output_path!r} and --input {input_path!r} are nested ({inner} lies "
            f"inside {outer}); overwriting one would delete data of the other"
        )
    return None


def output_directory_problem(path: str, option: str = "--output") -> str | None:
    """A directory the job will create or write into: not a file, and creatable/writable."""
    local = _local(path)
    if local is None:
        return None
    if os.path.exists(local) and not os.path.isdir(local):
        return f"{option} {path!r} is an existing file, not a directory; nothing could be saved"
    existing = _nearest_existing(local)
    if not os.path.isdir(existing):
        return f"{option} {path!r} cannot be created: {existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{option} {path!r} cannot be written: {existing} is not writable"
    return None


def output_file_problem(path: str, option: str) -> str | None:
    """A file the job will write: not a directory, and its folder creatable/writable."""
    local = _local(path)
    if local is None:
        return None
    if os.path.isdir(local):
        return f"{option} {path!r} is a directory; give a file name"
    return output_directory_problem(os.path.dirname(local) or ".", f"{option}'s folder")


def run_kind(metadata: dict) -> str:
    """What kind of run wrote a checkpoint, from its metadata."""
    if "trainer" in metadata:
        return TRAINER_RUN
    if "state" in metadata:
        return OPTIMIZER_RUN
    return "unknown"


def describe_checkpoints(directory: str) -> tuple[str, str] | None:
    """``(kind, description)`` of the newest checkpoint in ``directory``; None if none."""
    from bigdl_py.train.checkpoint import CheckpointError, list_checkpoints, read_manifest

    for manifest_path in list_checkpoints(directory):
        try:
            manifest = read_manifest(manifest_path)
        except CheckpointError:
            continue
        kind = run_kind(manifest["metadata"])
        written = datetime.datetime.fromtimestamp(
            manifest.get("created", 0), tz=datetime.timezone.utc
        ).strftime("%Y-%m-%d %H:%M UTC")
        return kind, (
            f"a {kind} run's checkpoints (newest: iteration {manifest['iteration']}, "
            f"{os.path.basename(manifest_path)}, written {written})"
        )
    return None


def checkpoint_directory_problem(
    directory: str | None, resume: bool, overwrite: bool, kind: str
) -> str | None:
    """``--checkpoint-dir`` for a run of ``kind``: a directory, and this run's own.

    A fresh run refuses a directory holding checkpoints (they would be replaced) unless
    ``overwrite``; ``resume`` needs checkpoints there, written by the same kind of run.
    """
    if directory is None:
        return None
    problem = output_directory_problem(directory, "--checkpoint-dir")
    if problem:
        return problem
    found = describe_checkpoints(directory) if os.path.isdir(directory) else None
    if resume:
        if found is None:
            return f"--resume: --checkpoint-dir {directory!r} holds no checkpoint to resume from"
        if found[0] != kind:
            return (
                f"--resume: --checkpoint-dir {directory!r} holds {found[1]}; this job "
                f"resumes {kind} runs only: give its own checkpoint directory"
            )
        return None
    if found is not None and not overwrite:
        return (
            f"--checkpoint-dir {directory!r} holds {found[1]}; a new run would replace them. "
            "Pass --resume to continue that run, another --checkpoint-dir, or "
            "--overwrite-checkpoints to replace them"
        )
    return None
