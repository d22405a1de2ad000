"""How arrays travel through Spark's shuffle: raw buffers, optionally as float16 or bfloat16.

:func:`encode` wraps an array in a :class:`WireArray`: a tag, the original dtype and shape,
and one contiguous buffer. Pickled with protocol 5 (PySpark's), the buffer goes in-band
through a ``PickleBuffer`` — one copy, as NumPy's own pickling, without NumPy's per-object
reconstruction call. :func:`decode` gives back an array of the original dtype.

Compression (``wire_dtype``) halves the bytes of float32 data:

- ``"float16"``: IEEE half precision (NumPy's ``float16``); finite values beyond ±65504
  become ±inf.
- ``"bfloat16"``: the top 16 bits of the float32 pattern (NumPy has no bfloat16), rounded
  to nearest, ties to even, like ``torch.bfloat16``. Same range as float32, 8
  significant bits: relative error at most 2**-8 (float16: 11 bits, 2**-11).

The receiver widens back to the original dtype before it adds anything, so sums run in
float32 (or float64 for float64 data) whatever went over the wire.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from bigdl_py import backend

WIRE_DTYPES = ("float32", "float16", "bfloat16")

_RAW, _FLOAT16, _BFLOAT16 = "raw", "float16", "bfloat16"
_BFLOAT16_QUIET_NAN = np.uint16(0x7FC0)


def check_wire_dtype(wire_dtype: str | None) -> str | None:
    """Normalise ``wire_dtype``: None or ``"float32"`` mean uncompressed (returned as None).

    Raises
    ------
    ValueError
        If it is not one of None, ``"float32"``, ``"float16"``, ``"bfloat16"``.
    """
    if wire_dtype is None or wire_dtype == "float32":
        return None
    if wire_dtype in (_FLOAT16, _BFLOAT16):
        return wire_dtype
    raise ValueError(
        f"wire_dtype must be None, 'float32', 'float16' or 'bfloat16', got {wire_dtype!r}"
    )


def float32_to_bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """The bfloat16 bit patterns (uint16) nearest to float32 ``array``, ties to even.

    NaN stays NaN (a quiet NaN with the input's sign): the plain rounding formula would
    carry a NaN's low mantissa bits into the exponent and turn it into infinity.
    """
    values = np.ascontiguousarray(array, dtype=np.float32)
    bits = values.view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds half-way cases to the even neighbour.
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16
    halves = rounded.astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        signs = (bits[nan] >> 16).astype(np.uint16) & np.uint16(0x8000)
        halves[nan] = signs | _BFLOAT16_QUIET_NAN
    return halves


def bfloat16_bits_to_float32(halves: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (exact: bfloat16 is a float32 prefix)."""
    return (np.asarray(halves, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to_wire(array: np.ndarray, wire_dtype: str | None) -> np.ndarray:
    """``array`` as the receiver sees it after one trip over ``wire_dtype`` (for tests)."""
    return decode(encode(array, wire_dtype))


class WireArray:
    """One array on the wire: ``data`` holds the (possibly compressed) values, contiguous."""

    __slots__ = ("tag", "dtype", "shape", "data")

    def __init__(self, tag: str, dtype: str, shape: tuple[int, ...], data: np.ndarray):
        self.tag = tag
        self.dtype = dtype
        self.shape = shape
        self.data = data

    @property
    def nbytes(self) -> int:
        """Bytes of values carried (the header adds a few dozen)."""
        return int(self.data.nbytes)

    def __reduce_ex__(self, protocol: int):
        # Protocol 5 pickles the buffer in-band without an intermediate bytes object.
        buffer = pickle.PickleBuffer(self.data) if protocol >= 5 else self.data.tobytes()
        return _rebuild, (self.tag, self.dtype, self.shape, buffer)

    def __repr__(self) -> str:
        return f"WireArray({self.tag}, dtype={self.dtype}, shape={self.shape})"


def _rebuild(tag: str, dtype: str, shape: tuple[int, ...], buffer: Any) -> WireArray:
    stored = {_RAW: np.dtype(dtype), _FLOAT16: np.float16, _BFLOAT16: np.uint16}[tag]
    return WireArray(tag, dtype, shape, np.frombuffer(buffer, dtype=stored))


def encode(array: Any, wire_dtype: str | None = None) -> WireArray:
    """Wrap a NumPy or CuPy array for the wire, compressing floats to ``wire_dtype``.

    Raises
    ------
    ValueError
        If ``wire_dtype`` is unknown, or compression is asked for a non-float array.
    """
    wire_dtype = check_wire_dtype(wire_dtype)
    # np.ascontiguousarray would turn a 0-d array into a 1-d one; reshape(-1) copies only
    # non-contiguous input.
    host = np.asarray(backend.as_numpy(array))
    if wire_dtype is None:
        return WireArray(_RAW, host.dtype.str, host.shape, host.reshape(-1))
    if not np.issubdtype(host.dtype, np.floating):
        raise ValueError(
            f"wire_dtype={wire_dtype!r} compresses floating-point arrays only; "
            f"got an array of dtype {host.dtype}"
        )
    if wire_dtype == _FLOAT16:
        data = host.reshape(-1).astype(np.float16)
    else:
        data = float32_to_bfloat16_bits(host.reshape(-1))
    return WireArray(wire_dtype, host.dtype.str, host.shape, data)


def decode(payload: WireArray | np.ndarray) -> np.ndarray:
    """The array a WireArray carries, in its original dtype and shape (a plain ndarray
    passes through). Uncompressed data is a read-only view of the received buffer."""
    if isinstance(payload, np.ndarray):
        return payload
    if payload.tag == _RAW:
        values = payload.data
    elif payload.tag == _FLOAT16:
        values = payload.data.astype(payload.dtype)
    else:
        values = bfloat16_bits_to_float32(payload.data).astype(payload.dtype, copy=False)
    return values.reshape(payload.shape)
