"""The package's one atomic writer: a reader sees the old file or the whole new one."""

from __future__ import annotations

import os

import pytest

from bigdl_py.nn.serialization import atomic_write


@pytest.mark.parametrize("durable", [True, False])
def test_a_write_replaces_the_file_whole(tmp_path, durable):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"old")
    atomic_write(path, lambda file: file.write(b"new content"), durable=durable)
    assert path.read_bytes() == b"new content"
    assert os.listdir(tmp_path) == ["weights.bin"]


@pytest.mark.parametrize("durable", [True, False])
def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, durable):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"old")

    def fail_halfway(file):
        file.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, fail_halfway, durable=durable)
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["weights.bin"]


def test_the_temporary_name_matches_no_pattern_of_the_final_names(tmp_path):
    """Readers that list ``optim-0-after-*.state`` must never pick up a file being written."""
    seen = []
    path = tmp_path / "optim-0-after-3.state"
    atomic_write(path, lambda file: seen.extend(sorted(tmp_path.glob("optim-*"))), durable=False)
    assert seen == []
    assert [entry.name for entry in tmp_path.glob("optim-*")] == ["optim-0-after-3.state"]
