"""Checks of the jobs' input and output locations, run before Spark starts or data is read.

Every one of them guards against losing data or losing a run's result: an output that is,
holds or lies inside one of the run's inputs (its model, data, resumed checkpoints) or
another of its outputs, an existing output the run would replace unasked or that holds
files the job does not write, an output path that is a file (the run would train for hours
and then fail to save), a checkpoint directory holding another run's checkpoints. Each
returns an error message (``None`` when all is well), so that a job can report it as a usage
error and a test can call it without starting anything.
"""

from __future__ import annotations

import datetime
import fnmatch
import os
from collections.abc import Callable, Sequence

# Kinds of run a checkpoint directory can hold, told apart by the metadata their writers
# store (bigdl_py.train.resume for Optimizers, DistriTrainer.save_checkpoint for the GAN).
OPTIMIZER_RUN = "Optimizer"
TRAINER_RUN = "DistriTrainer"


def _without_file_scheme(path: str) -> str:
    if path.startswith("file:"):
        path = path[len("file:") :]
        while path.startswith("//"):
            path = path[1:]
    return path


def local_path(path: str) -> str | None:
    """A local path's absolute form with every symlink resolved; None for a URI (hdfs://,
    s3a://...). ``file:`` URIs are local paths."""
    if "://" in path and not path.startswith("file:"):
        return None
    return os.path.realpath(os.path.abspath(_without_file_scheme(path)))


def _nearest_existing(path: str) -> str:
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _relation(path: str, other: str) -> str | None:
    """How ``path`` stands to ``other``: ``"is"``, ``"holds"``, ``"lies inside"`` or None.

    Local paths are compared resolved (symlinks, ``..``, ``file:``), and two existing ones
    that are the same file by device and inode (a bind mount) are the same. URIs are compared
    as written, less trailing slashes: two spellings of one HDFS location
    (``hdfs:///a`` and ``hdfs://namenode/a``) are not recognised. A URI never meets a local
    path.
    """
    mine, theirs = local_path(path), local_path(other)
    if (mine is None) != (theirs is None):
        return None
    if mine is None:
        mine, theirs, separator = path.rstrip("/"), other.rstrip("/"), "/"
    else:
        separator = os.sep
        if os.path.exists(mine) and os.path.exists(theirs) and os.path.samefile(mine, theirs):
            return "is"
    if mine == theirs:
        return "is"
    if theirs.startswith(mine.rstrip(separator) + separator):
        return "holds"
    if mine.startswith(theirs.rstrip(separator) + separator):
        return "lies inside"
    return None


def _named(option: str, path: str) -> str:
    """``--output 'runs/x'``, and where it really is when a symlink or ``..`` leads elsewhere."""
    resolved = local_path(path)
    if resolved is None or resolved == os.path.abspath(_without_file_scheme(path)):
        return f"{option} {path!r}"
    return f"{option} {path!r} (really {resolved})"


def locations_problem(
    outputs: Sequence[tuple[str, str | None]], inputs: Sequence[tuple[str, str | None]] = ()
) -> str | None:
    """Refuse an output that is, holds or lies inside an input, or another output.

    ``outputs`` and ``inputs`` are ``(option, path)`` pairs as the user gave them (a None
    path is skipped); an option on both lists (``--checkpoint-dir`` of a resumed run, which
    the run reads and writes) is not compared with itself. An output replacing an input
    would delete it (Spark removes an output it overwrites before it reads its input, and
    the jobs replace an output folder as a whole); one inside an input would change it (a
    stray file inside a Parquet dataset breaks reading it). Two nested outputs would have
    the outer one's replacement delete the inner one.
    """
    given = [(option, path) for option, path in outputs if path is not None]
    for option, path in given:
        for source_option, source in inputs:
            if source is None or source_option == option:
                continue
            relation = _relation(path, source)
            if relation is not None:
                consequence = {
                    "is": f"writing it would destroy {source_option}",
                    "holds": f"replacing {option} would delete {source_option}",
                    "lies inside": f"writing it would change {source_option}",
                }[relation]
                return (
                    f"{_named(option, path)} {relation} {_named(source_option, source)}: "
                    f"{consequence}; write {option} elsewhere"
                )
    for index, (option, path) in enumerate(given):
        for other_option, other in given[index + 1 :]:
            relation = _relation(path, other)
            if relation is not None:
                return (
                    f"{_named(option, path)} {relation} {_named(other_option, other)}: an "
                    "output folder is replaced as a whole when the run completes, so give "
                    "each output its own folder"
                )
    return None


def output_directory_problem(path: str, option: str = "--output") -> str | None:
    """A directory the job will create or write into: not a file, and creatable/writable."""
    local = local_path(path)
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
    local = local_path(path)
    if local is None:
        return None
    if os.path.isdir(local):
        return f"{option} {path!r} is a directory; give a file name"
    return output_directory_problem(os.path.dirname(local) or ".", f"{option}'s folder")


def _some(names: Sequence[str], shown: int = 4) -> str:
    listed = ", ".join(names[:shown])
    return listed if len(names) <= shown else f"{listed} and {len(names) - shown} more"


def existing_output_problem(
    path: str, option: str, *, overwrite: bool, own_entry: Callable[[str, bool], bool]
) -> str | None:
    """Refuse to replace an existing, non-empty output folder unless asked to, and always
    when it holds anything the job does not write.

    ``own_entry(name, is_directory)`` says whether an entry of the folder is something this
    job writes. The job replaces the folder as a whole once its new output is complete, so
    anything else there would be deleted: those entries are named, and ``--overwrite`` does
    not help. An empty folder is free to use. A URI is not looked at (Spark's writer refuses
    an existing one without ``--overwrite``).
    """
    local = local_path(path)
    if local is None or not os.path.isdir(local):
        return None
    entries = sorted(os.listdir(local))
    foreign = [
        name for name in entries if not own_entry(name, os.path.isdir(os.path.join(local, name)))
    ]
    if foreign:
        return (
            f"{option} {path!r} holds {_some(foreign)}, which this job does not write: "
            f"replacing {option} would delete them; give another {option}"
        )
    if entries and not overwrite:
        return (
            f"{option} {path!r} already exists, holding an earlier run's output "
            f"({_some(entries)}); pass --overwrite to replace it once this run's output is "
            f"complete, or give another {option}"
        )
    return None


def parquet_entry(name: str, is_directory: bool) -> bool:
    """An entry Spark (or pyarrow) writes into a Parquet dataset folder: part files and
    ``*.parquet`` files, Hadoop's ``_SUCCESS`` and other ``_`` files, hidden files (``.crc``
    checksums) and ``key=value`` partition folders."""
    if is_directory:
        return "=" in name and not name.startswith((".", "_"))
    return name.startswith(("part-", "_", ".")) or name.endswith(".parquet")


def named_entries(*patterns: str) -> Callable[[str, bool], bool]:
    """``own_entry`` for a job that writes entries of these names (``fnmatch`` patterns)."""

    def own(name: str, is_directory: bool) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)

    return own


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
