"""Reading and checking the header of a safetensors file, before any tensor data is read.

A safetensors file is an 8-byte little-endian header length, a JSON object naming each
tensor's ``dtype``, ``shape`` and ``data_offsets`` (a byte range of the data that follows),
an optional ``"__metadata__"`` object of strings, and the raw data. Every rule of the format
that a damaged or crafted header can break is checked here, so the error is a ``ValueError``
naming the file and the tensor, not the ``safetensors`` library's own exception or a
``KeyError`` from deeper down.
"""

from __future__ import annotations

import json
import math
import os
import struct

import numpy as np

__all__ = ["FLOAT_DTYPES", "INTEGER_DTYPES", "is_safetensors_file", "read_header"]

# How torch.save files begin: a zip archive (PyTorch >= 1.6) or a bare pickle (older ones).
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTOCOL_OPCODE = 0x80
_HEADER_LENGTH_BYTES = 8
# The safetensors format caps its header at 100 MB; a larger length means another format.
_MAX_HEADER_BYTES = 100_000_000
METADATA_KEY = "__metadata__"

# safetensors dtype names -> NumPy dtypes; BF16 has no NumPy dtype and is widened by hand.
FLOAT_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "BF16": None}
INTEGER_DTYPES = {
    "I8": np.int8,
    "I16": np.int16,
    "I32": np.int32,
    "I64": np.int64,
    "U8": np.uint8,
    "U16": np.uint16,
    "U32": np.uint32,
    "U64": np.uint64,
}
# Bytes per element of the whole-byte dtypes, to check each tensor's byte range. (The
# format's sub-byte dtypes, F4 and F6_*, load into nothing here and are left to the
# library's own check.)
_ITEM_BYTES = {
    "BOOL": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "F8_E4M3FNUZ": 1,
    "F8_E5M2FNUZ": 1,
    "BF16": 2,
    **{name: np.dtype(dtype).itemsize for name, dtype in FLOAT_DTYPES.items() if dtype},
    **{name: np.dtype(dtype).itemsize for name, dtype in INTEGER_DTYPES.items()},
}

# Every dtype the format names (safetensors 0.8); the sub-byte ones have no size above.
_FORMAT_DTYPES = frozenset(_ITEM_BYTES) | {"F4", "F6_E2M3", "F6_E3M2", "C64"}

CONVERT_HINT = (
    "convert it once where PyTorch is installed: "
    "import torch, safetensors.torch; "
    "safetensors.torch.save_file(model.state_dict(), 'model.safetensors') "
    "(for a file holding a bare state_dict: "
    "safetensors.torch.save_file(torch.load(path, weights_only=True), 'model.safetensors'))"
)


def is_safetensors_file(path: str | os.PathLike) -> bool:
    """True when ``path`` begins as a safetensors file does: a header length that fits the
    file, then a JSON object. Reads 9 bytes; False for a file that cannot be read."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as file:
            start = file.read(_HEADER_LENGTH_BYTES + 1)
    except OSError:
        return False
    if len(start) <= _HEADER_LENGTH_BYTES:
        return False
    (length,) = struct.unpack("<Q", start[:_HEADER_LENGTH_BYTES])
    fits = 2 <= length <= min(_MAX_HEADER_BYTES, size - _HEADER_LENGTH_BYTES)
    return fits and start[_HEADER_LENGTH_BYTES:] == b"{"


def read_header(path: str) -> tuple[dict[str, dict], int]:
    """The checked tensor entries of a safetensors file and the offset where its data starts.

    Each entry is ``{"dtype": str, "shape": [int, ...], "data_offsets": [begin, end]}``;
    the metadata entry is checked and left out.

    Raises
    ------
    ValueError
        Naming the file (and the tensor where one is at fault): a ``torch.save`` zip or
        pickle, a file too short or truncated, a header that is not JSON or not an object,
        metadata that is not strings, an entry with a missing or mistyped field, a byte
        range that does not match its shape and dtype, or byte ranges that overlap or leave
        gaps.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as file:
        start = file.read(_HEADER_LENGTH_BYTES)
        if start.startswith(_ZIP_MAGIC) or (start[:1] and start[0] == _PICKLE_PROTOCOL_OPCODE):
            kind = "a zip archive" if start.startswith(_ZIP_MAGIC) else "a pickle"
            raise ValueError(
                f"load_safetensors: {path} is {kind}, as torch.save writes (a bigdl_py "
                "nn.save file is a zip too); bigdl_py never unpickles a file, since that can "
                f"run arbitrary code. If it holds PyTorch weights, {CONVERT_HINT}"
            )
        if len(start) < _HEADER_LENGTH_BYTES:
            raise ValueError(f"load_safetensors: {path} is too short to be a safetensors file")
        (length,) = struct.unpack("<Q", start)
        if length > min(_MAX_HEADER_BYTES, size - _HEADER_LENGTH_BYTES):
            raise ValueError(
                f"load_safetensors: {path} is not a safetensors file or is truncated "
                f"(header length {length} in a file of {size} bytes)"
            )
        text = file.read(length)
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        problem = "nested too deeply" if isinstance(error, RecursionError) else error
        raise ValueError(
            f"load_safetensors: {path} is not a safetensors file (bad header: {problem})"
        ) from None
    if not isinstance(header, dict):
        raise ValueError(
            f"load_safetensors: {path} is not a safetensors file (its header is a JSON "
            f"{type(header).__name__}, not an object of tensor entries)"
        )
    _check_metadata(path, header.get(METADATA_KEY))
    data_start = _HEADER_LENGTH_BYTES + length
    entries = {name: entry for name, entry in header.items() if name != METADATA_KEY}
    for name, entry in entries.items():
        _check_entry(path, name, entry, data_start, size)
    data_end = _check_byte_ranges_tile_the_data(path, entries)
    if data_start + data_end != size:
        raise ValueError(
            f"load_safetensors: {path}: bad header: its tensors end at byte "
            f"{data_start + data_end} but the file has {size} bytes"
        )
    return entries, data_start


def _check_metadata(path: str, metadata) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict) or not all(
        isinstance(value, str) for value in metadata.values()
    ):
        raise ValueError(
            f"load_safetensors: {path}: bad header: {METADATA_KEY!r} must map strings to "
            f"strings, got {metadata!r:.200}"
        )


def _is_count(value) -> bool:
    """A JSON non-negative integer (``true`` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_entry(path: str, name: str, entry, data_start: int, size: int) -> None:
    """One tensor's entry: its fields' types, its byte range's size and place."""
    where = f"load_safetensors: {path}: bad header entry for tensor {name!r}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected an object, got {entry!r:.200}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _FORMAT_DTYPES:
        raise ValueError(
            f"{where}: 'dtype' must be one of the format's dtypes "
            f"({', '.join(sorted(_FORMAT_DTYPES))}), got {dtype!r:.200}"
        )
    if not isinstance(shape, list) or not all(_is_count(extent) for extent in shape):
        raise ValueError(f"{where}: 'shape' must be a list of integers >= 0, got {shape!r:.200}")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(_is_count(offset) for offset in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise ValueError(
            f"{where}: 'data_offsets' must be [begin, end] with 0 <= begin <= end, got "
            f"{offsets!r:.200}"
        )
    begin, end = offsets
    item_bytes = _ITEM_BYTES.get(dtype)
    if item_bytes is not None and end - begin != math.prod(shape) * item_bytes:
        raise ValueError(
            f"{where}: its byte range [{begin}, {end}) holds {end - begin} bytes, but shape "
            f"{shape} of {dtype} needs {math.prod(shape) * item_bytes}"
        )
    if data_start + end > size:
        raise ValueError(
            f"load_safetensors: {path} is truncated ({name!r} needs bytes up to "
            f"{data_start + end}, the file has {size})"
        )


def _check_byte_ranges_tile_the_data(path: str, entries: dict[str, dict]) -> int:
    """The format lays tensors end to end from 0: no two ranges overlap, none leaves a gap.

    Returns where the last one ends."""
    position, previous = 0, None
    for name, entry in sorted(entries.items(), key=lambda item: tuple(item[1]["data_offsets"])):
        begin, end = entry["data_offsets"]
        if begin != position:
            problem = "overlaps" if begin < position else "leaves a gap after"
            after = f"tensor {previous!r}" if previous else "the start of the data"
            raise ValueError(
                f"load_safetensors: {path}: bad header: the byte range [{begin}, {end}) of "
                f"tensor {name!r} {problem} {after} (which ends at {position})"
            )
        position, previous = end, name
    return position
