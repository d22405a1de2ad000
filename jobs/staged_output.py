"""Output folders that replace an earlier output only once the new one is complete.

A job writes its new output into ``.<name>.partial``, a sibling of the output folder
``<name>`` (the same parent, so that the final rename stays on one file system), and renames
it to ``<name>`` only when everything is written. An earlier output is first renamed aside to
``.<name>.replaced`` and deleted once the new one is in place. So a run that fails (a bad
input row, a device that is not there, a crash, Ctrl-C) leaves the earlier output as it was
and no empty or half-written ``<name>`` that would block a rerun; its partial folder is
removed, or kept for ``--resume`` to continue when the run keeps checkpoints.

The two renames of a replacement are not one atomic step: a crash between them leaves the
earlier output as ``.<name>.replaced``, and the next run into ``<name>`` puts it back first.
Non-local outputs (``hdfs://``, ``s3a://``): see :func:`write_parquet`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator

from output_checks import local_path

from bigdl_py.nn.serialization import fsync_directory


def partial_path(output: str) -> str:
    """Where a run writes the new ``output`` (a local path) until it is complete."""
    parent, name = os.path.split(local_path(output))
    return os.path.join(parent, f".{name}.partial")


def _replaced_path(target: str) -> str:
    parent, name = os.path.split(target)
    return os.path.join(parent, f".{name}.replaced")


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _make_folder(folder: str) -> list[str]:
    """Create ``folder`` and its missing parents; those created, innermost first."""
    created = []
    while not os.path.isdir(folder):
        created.append(folder)
        folder = os.path.dirname(folder)
    if created:
        os.makedirs(created[0])
    return created


def _remove_empty(folders: list[str]) -> None:
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:
            return


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _swap_in(partial: str, target: str) -> None:
    """Rename the complete ``partial`` to ``target``, replacing what was there."""
    if not os.path.lexists(target):
        os.rename(partial, target)
    else:
        replaced = _replaced_path(target)
        _remove(replaced)
        os.rename(target, replaced)
        try:
            os.rename(partial, target)
        except BaseException:
            os.rename(replaced, target)
            raise
        try:
            _remove(replaced)
        except OSError as error:  # the new output is in place: say so, do not fail the run
            _log(f"the earlier output, moved to {replaced}, could not be deleted: {error}")
    fsync_directory(os.path.dirname(target))


def _recover_interrupted_replacement(target: str) -> None:
    """Put back an earlier output that a crash left renamed aside mid-replacement."""
    replaced = _replaced_path(target)
    if os.path.lexists(replaced) and not os.path.lexists(target):
        os.rename(replaced, target)
        _log(f"put back {target}, left aside by a run that stopped while replacing it")


@contextlib.contextmanager
def staged_folder(
    output: str, *, create: bool = True, continue_run: bool = False, keep_on_failure: bool = False
) -> Iterator[str]:
    """Yield the folder to write the new ``output`` (a local path) into; on success it
    replaces ``output``, on an error ``output`` is left as it was.

    Parameters
    ----------
    output : str
        The output folder, local (a plain path or ``file:``).
    create : bool
        Create the partial folder; False yields a path that does not exist, for a writer
        that creates its folder itself and refuses an existing one (Spark's).
    continue_run : bool
        A resumed run carries on with what its run wrote so far (sample grids, summaries
        of the epochs before): the partial folder of a failed attempt kept by
        ``keep_on_failure``, else a copy of the existing ``output``.
    keep_on_failure : bool
        Keep the partial folder after an error, for a later ``continue_run``; a later run
        that does not continue deletes it.
    """
    target = local_path(output)
    partial = partial_path(output)
    created = _make_folder(os.path.dirname(target))
    _recover_interrupted_replacement(target)
    if continue_run and not os.path.lexists(partial) and os.path.isdir(target):
        shutil.copytree(target, partial, symlinks=True)
    elif not continue_run:
        _remove(partial)  # a failed run's leftover, never anyone's finished output
    if create:
        os.makedirs(partial, exist_ok=True)
    try:
        yield partial
    except BaseException:
        if not keep_on_failure:
            _remove(partial)
            _remove_empty(created)
        raise
    _swap_in(partial, target)


def write_parquet(df, output: str, overwrite: bool) -> None:
    """Write the DataFrame ``df`` to ``output`` as Parquet, replacing an existing output only
    when ``overwrite`` and only once the new one is complete.

    A local output is written into its partial folder by Spark and renamed into place
    (:func:`staged_folder`). For a non-local URI, PySpark's public API has no rename, so the
    new output cannot be written beside the old one: the rows are computed first
    (persisted, memory then disk) and only then written, with Spark's ``overwrite`` mode
    when asked. Everything that can go wrong in computing them (a NaN row, a missing
    device, a model error) then fails before Spark deletes the old output; a failure
    during the write itself can still lose it, and can leave an empty output behind.
    """
    if local_path(output) is not None:
        with staged_folder(output, create=False) as partial:
            # A file: URI, since the folder is renamed locally: a plain path would go to the
            # cluster's default file system where that is not the local one.
            df.write.mode("errorifexists").parquet("file://" + partial)
        return
    from pyspark import StorageLevel

    computed = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        computed.count()
        computed.write.mode("overwrite" if overwrite else "errorifexists").parquet(output)
    finally:
        computed.unpersist()
