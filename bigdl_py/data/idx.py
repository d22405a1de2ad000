"""The IDX file format of MNIST and Fashion-MNIST: reading, writing, and ``load_mnist``.

An IDX file is a 4-byte magic number (two zero bytes, a dtype code, the number of
dimensions), one big-endian uint32 per dimension, then the values in C order, big-endian.
Files may be gzip-compressed; compression is detected from the gzip magic bytes, not from
the file name.
"""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

from bigdl_py.nn.serialization import atomic_write

GZIP_MAGIC = b"\x1f\x8b"

# IDX dtype code -> big-endian NumPy dtype.
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES_BY_KIND = {dtype.newbyteorder("=").str: code for code, dtype in IDX_DTYPES.items()}

_HEADER_BYTES = 4


class IDXFormatError(ValueError):
    """An IDX file whose bytes do not follow the format."""


def _supported_codes_text() -> str:
    return ", ".join(f"0x{code:02X} ({dtype.name})" for code, dtype in IDX_DTYPES.items())


def _read_file_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes, gunzipped when it starts with the gzip magic."""
    with open(path, "rb") as stream:
        data = stream.read()
    if data[:2] != GZIP_MAGIC:
        return data
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as error:
        raise IDXFormatError(f"{path}: gzip stream is truncated or corrupt ({error})") from error


def read_idx(
    path: str | os.PathLike, *, dtype_code: int | None = None, ndim: int | None = None
) -> np.ndarray:
    """Read an IDX file (raw or gzip) into a native-byte-order NumPy array.

    Parameters
    ----------
    path : str or path-like
    dtype_code, ndim : int, optional
        When given, the magic number must announce this dtype code and number of
        dimensions (``0x08`` and 3 for MNIST images, ``0x08`` and 1 for labels).

    Returns
    -------
    numpy.ndarray
        Writable array of the shape stored in the header.

    Raises
    ------
    IDXFormatError
        Wrong magic number (expected vs got), unsupported dtype code, a file shorter than
        its header promises (expected vs got bytes), or data that does not match the
        header's dimensions.
    """
    data = _read_file_bytes(path)
    if len(data) < _HEADER_BYTES:
        raise IDXFormatError(
            f"{path}: truncated IDX file: expected at least {_HEADER_BYTES} header bytes, "
            f"got {len(data)}"
        )
    got_magic = int.from_bytes(data[:4], "big")
    if (
        data[:2] != b"\x00\x00"
        or (dtype_code is not None and data[2] != dtype_code)
        or (ndim is not None and data[3] != ndim)
    ):
        expected = (
            "0x0000"
            + ("<dtype code>" if dtype_code is None else f"{dtype_code:02X}")
            + ("<ndim>" if ndim is None else f"{ndim:02X}")
        )
        raise IDXFormatError(
            f"{path}: wrong IDX magic number: expected {expected}, got 0x{got_magic:08X}"
        )
    code, dimensions = data[2], data[3]
    if code not in IDX_DTYPES:
        raise IDXFormatError(
            f"{path}: unsupported IDX dtype code 0x{code:02X}; supported: {_supported_codes_text()}"
        )
    header_end = _HEADER_BYTES + 4 * dimensions
    if len(data) < header_end:
        raise IDXFormatError(
            f"{path}: truncated IDX header: {dimensions} dimensions need {header_end} bytes, "
            f"got {len(data)}"
        )
    shape = tuple(int(size) for size in np.frombuffer(data, ">u4", dimensions, _HEADER_BYTES))
    dtype = IDX_DTYPES[code]
    expected_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    got_bytes = len(data) - header_end
    if got_bytes < expected_bytes:
        raise IDXFormatError(
            f"{path}: truncated IDX file: dimensions {shape} of {dtype.name} need "
            f"{expected_bytes} data bytes, got {got_bytes}"
        )
    if got_bytes > expected_bytes:
        raise IDXFormatError(
            f"{path}: IDX dimension mismatch: the header's dimensions {shape} of {dtype.name} "
            f"account for {expected_bytes} data bytes, but the file holds {got_bytes}"
        )
    values = np.frombuffer(data, dtype, count=expected_bytes // dtype.itemsize, offset=header_end)
    # astype copies into native byte order and gives a writable array (frombuffer on bytes
    # is read-only).
    return values.astype(dtype.newbyteorder("="), copy=True).reshape(shape)


def write_idx(path: str | os.PathLike, array: np.ndarray, compress: bool | None = None) -> None:
    """Write ``array`` as an IDX file (gzip-compressed when ``compress``, by default when the
    name ends in ``.gz``).

    Raises
    ------
    TypeError
        For a dtype the format cannot hold (see ``IDX_DTYPES``).
    """
    array = np.asarray(array)
    code = _CODES_BY_KIND.get(array.dtype.newbyteorder("=").str)
    if code is None:
        raise TypeError(
            f"IDX cannot store dtype {array.dtype}; supported: {_supported_codes_text()}"
        )
    if array.ndim > 255:
        raise ValueError(f"IDX stores at most 255 dimensions, got {array.ndim}")
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    payload = header + np.ascontiguousarray(array, IDX_DTYPES[code]).tobytes()
    compress = str(path).endswith(".gz") if compress is None else compress
    data = gzip.compress(payload, compresslevel=6) if compress else payload
    atomic_write(path, lambda stream: stream.write(data))


_SPLIT_PREFIXES = {"train": "train", "test": "t10k"}


def mnist_file(directory: str | os.PathLike, split: str, kind: str) -> str | None:
    """Path of the ``kind`` (``'images'`` or ``'labels'``) file of ``split`` in
    ``directory``, or None when absent. Accepts ``.gz`` or raw files and the
    ``train-images.idx3-ubyte`` spelling."""
    prefix = _SPLIT_PREFIXES[_check_split(split)]
    rank = 3 if kind == "images" else 1
    for separator in ("-", "."):
        for suffix in (".gz", ""):
            candidate = os.path.join(
                os.fspath(directory), f"{prefix}-{kind}{separator}idx{rank}-ubyte{suffix}"
            )
            if os.path.isfile(candidate):
                return candidate
    return None


def _check_split(split: str) -> str:
    if split not in _SPLIT_PREFIXES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return split


def load_mnist(directory: str | os.PathLike, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Load an MNIST-format split (MNIST, Fashion-MNIST) from ``directory``.

    Parameters
    ----------
    directory : str or path-like
        Holds ``train-images-idx3-ubyte[.gz]``, ``train-labels-idx1-ubyte[.gz]``,
        ``t10k-images-idx3-ubyte[.gz]`` and ``t10k-labels-idx1-ubyte[.gz]``.
    split : {'train', 'test'}

    Returns
    -------
    images : numpy.ndarray
        uint8, shape ``(N, 28, 28)``.
    labels : numpy.ndarray
        int64, shape ``(N,)``.

    Raises
    ------
    FileNotFoundError
        When a file is missing (naming it).
    IDXFormatError
        For malformed files, or images and labels that disagree on the sample count.
    """
    paths = {}
    for kind in ("images", "labels"):
        path = mnist_file(directory, split, kind)
        if path is None:
            prefix = _SPLIT_PREFIXES[split]
            rank = 3 if kind == "images" else 1
            raise FileNotFoundError(
                f"no MNIST {split} {kind} in {os.fspath(directory)!r}: expected "
                f"{prefix}-{kind}-idx{rank}-ubyte.gz (or without .gz)"
            )
        paths[kind] = path
    images = read_idx(paths["images"], dtype_code=0x08, ndim=3)
    labels = read_idx(paths["labels"], dtype_code=0x08, ndim=1)
    if images.shape[1:] != (28, 28):
        raise IDXFormatError(
            f"{paths['images']}: MNIST images must be 28x28, got shape {images.shape}"
        )
    if len(images) != len(labels):
        raise IDXFormatError(
            f"IDX dimension mismatch: {paths['images']} holds {len(images)} images but "
            f"{paths['labels']} holds {len(labels)} labels"
        )
    return images, labels.astype(np.int64)
