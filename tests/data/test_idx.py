"""IDX files: byte layout, gzip detection, malformed files, and load_mnist."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from bigdl_py.data import IDXFormatError, load_mnist, read_idx, write_idx


def idx_bytes(array: np.ndarray, code: int, big_endian_dtype: str) -> bytes:
    """An IDX file built by hand from the format description (independent of write_idx)."""
    header = struct.pack(">BBBB", 0, 0, code, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(big_endian_dtype).tobytes()


@pytest.mark.parametrize(
    "code, dtype",
    [(0x08, ">u1"), (0x09, ">i1"), (0x0B, ">i2"), (0x0C, ">i4"), (0x0D, ">f4"), (0x0E, ">f8")],
)
@pytest.mark.parametrize("compressed", [False, True])
def test_read_idx_decodes_every_dtype_raw_and_gzipped(tmp_path, rng, code, dtype, compressed):
    array = (rng.random((3, 4, 5)) * 100 - 50).astype(np.dtype(dtype).newbyteorder("="))
    if np.dtype(dtype).kind == "u":
        array = np.abs(array)
    payload = idx_bytes(array, code, dtype)
    path = tmp_path / "data.idx"  # no .gz suffix: gzip is detected from the magic bytes
    path.write_bytes(gzip.compress(payload) if compressed else payload)
    result = read_idx(path)
    np.testing.assert_array_equal(result, array)
    assert result.dtype == array.dtype and result.dtype.isnative
    assert result.flags.writeable


@pytest.mark.parametrize("name", ["values.idx", "values.idx.gz"])
def test_write_idx_round_trips_and_compresses_by_name(tmp_path, rng, name):
    array = rng.standard_normal((2, 3)).astype(np.float32)
    path = tmp_path / name
    write_idx(path, array)
    assert path.read_bytes()[:2] == (b"\x1f\x8b" if name.endswith(".gz") else b"\x00\x00")
    np.testing.assert_array_equal(read_idx(path), array)


def test_write_idx_refuses_dtypes_the_format_cannot_hold(tmp_path):
    with pytest.raises(TypeError, match="IDX cannot store dtype int64"):
        write_idx(tmp_path / "x.idx", np.zeros(3, np.int64))


def test_wrong_magic_number_reports_expected_and_got(tmp_path):
    path = tmp_path / "bad.idx"
    path.write_bytes(b"\x01\x02\x08\x01" + struct.pack(">I", 1) + b"\x00")
    with pytest.raises(IDXFormatError, match=r"expected 0x0000<dtype code><ndim>, got 0x01020801"):
        read_idx(path)
    good = tmp_path / "labels.idx"
    write_idx(good, np.zeros(4, np.uint8))
    with pytest.raises(IDXFormatError, match=r"expected 0x00000803, got 0x00000801"):
        read_idx(good, dtype_code=0x08, ndim=3)


def test_unsupported_dtype_code_is_named(tmp_path):
    path = tmp_path / "bad.idx"
    path.write_bytes(b"\x00\x00\x0a\x01" + struct.pack(">I", 1) + b"\x00")
    with pytest.raises(IDXFormatError, match=r"unsupported IDX dtype code 0x0A; supported: 0x08"):
        read_idx(path)


def test_truncated_data_reports_expected_and_got_bytes(tmp_path):
    payload = idx_bytes(np.zeros((10, 4), np.int32), 0x0C, ">i4")
    path = tmp_path / "short.idx.gz"
    path.write_bytes(gzip.compress(payload[:-7]))
    with pytest.raises(
        IDXFormatError, match=r"dimensions \(10, 4\) of int32 need 160 data bytes, got 153"
    ):
        read_idx(path)


def test_truncated_header_and_tiny_files(tmp_path):
    header_only = tmp_path / "header.idx"
    header_only.write_bytes(b"\x00\x00\x08\x03" + struct.pack(">I", 5))
    with pytest.raises(IDXFormatError, match="3 dimensions need 16 bytes, got 8"):
        read_idx(header_only)
    tiny = tmp_path / "tiny.idx"
    tiny.write_bytes(b"\x00\x00")
    with pytest.raises(IDXFormatError, match="expected at least 4 header bytes, got 2"):
        read_idx(tiny)


def test_bytes_beyond_the_header_dimensions_are_a_dimension_mismatch(tmp_path):
    path = tmp_path / "long.idx"
    path.write_bytes(idx_bytes(np.zeros((2, 3), np.uint8), 0x08, ">u1") + b"\x00" * 4)
    with pytest.raises(
        IDXFormatError, match=r"dimension mismatch.*\(2, 3\).*6 data bytes.*holds 10"
    ):
        read_idx(path)


def test_a_cut_gzip_stream_is_reported(tmp_path):
    path = tmp_path / "cut.idx.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros(1000, np.uint8), 0x08, ">u1"))[:-20])
    with pytest.raises(IDXFormatError, match="gzip stream is truncated or corrupt"):
        read_idx(path)


def write_mnist_split(directory, prefix, images, labels, suffix=".gz"):
    write_idx(directory / f"{prefix}-images-idx3-ubyte{suffix}", images)
    write_idx(directory / f"{prefix}-labels-idx1-ubyte{suffix}", labels)


@pytest.mark.parametrize("suffix", [".gz", ""])
def test_load_mnist_reads_both_splits(tmp_path, rng, suffix):
    train_images = rng.integers(0, 256, (7, 28, 28), dtype=np.uint8)
    train_labels = rng.integers(0, 10, 7).astype(np.uint8)
    test_images = rng.integers(0, 256, (3, 28, 28), dtype=np.uint8)
    test_labels = rng.integers(0, 10, 3).astype(np.uint8)
    write_mnist_split(tmp_path, "train", train_images, train_labels, suffix)
    write_mnist_split(tmp_path, "t10k", test_images, test_labels, suffix)
    images, labels = load_mnist(tmp_path, "train")
    assert images.dtype == np.uint8 and labels.dtype == np.int64
    np.testing.assert_array_equal(images, train_images)
    np.testing.assert_array_equal(labels, train_labels)
    images, labels = load_mnist(tmp_path, split="test")
    np.testing.assert_array_equal(images, test_images)
    np.testing.assert_array_equal(labels, test_labels)


def test_load_mnist_errors(tmp_path):
    with pytest.raises(
        FileNotFoundError, match="no MNIST train images.*train-images-idx3-ubyte.gz"
    ):
        load_mnist(tmp_path, "train")
    with pytest.raises(ValueError, match="split must be 'train' or 'test', got 'valid'"):
        load_mnist(tmp_path, "valid")
    write_mnist_split(tmp_path, "train", np.zeros((4, 28, 28), np.uint8), np.zeros(5, np.uint8))
    with pytest.raises(IDXFormatError, match="holds 4 images but .* holds 5 labels"):
        load_mnist(tmp_path, "train")
    write_mnist_split(tmp_path, "t10k", np.zeros((2, 28, 27), np.uint8), np.zeros(2, np.uint8))
    with pytest.raises(IDXFormatError, match=r"must be 28x28, got shape \(2, 28, 27\)"):
        load_mnist(tmp_path, "test")
