"""The one place that chooses NumPy or CuPy.

Every other module asks this one for the array module of an array (`array_module`) or of a
device (`Device.xp`). CuPy is imported lazily, on first use of a CUDA device, so the whole
package works on a machine without it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_DTYPE = np.dtype(np.float32)
FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

_cupy_module = None
_cupy_import_error: Exception | None = None


def _import_cupy():
    """Import CuPy once; remember a failure so we do not retry on every call."""
    global _cupy_module, _cupy_import_error
    if _cupy_module is None and _cupy_import_error is None:
        try:
            import cupy  # noqa: PLC0415 - the only cupy import in the package

            _cupy_module = cupy
        except Exception as error:  # ImportError, or a CUDA driver error on import
            _cupy_import_error = error
    return _cupy_module


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    cupy = _import_cupy()
    if cupy is None:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def cupy_module():
    """Return the CuPy module, or raise a clear error saying why it is unavailable."""
    cupy = _import_cupy()
    if cupy is None:
        raise RuntimeError(
            "a CUDA device was requested but CuPy is not available "
            f"({_cupy_import_error!r}); install the 'gpu' extra: pip install 'bigdl_py[gpu]'"
        )
    return cupy


@dataclass(frozen=True)
class Device:
    """Where a tensor's array lives: ``cpu`` or ``cuda:<index>``."""

    type: str
    index: int | None = None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        return f"device('{self}')"

    @property
    def xp(self):
        """The array module for this device (numpy or cupy)."""
        return np if self.type == "cpu" else cupy_module()

    @contextlib.contextmanager
    def activate(self):
        """Make this device current for array creation (a no-op on CPU)."""
        if self.type == "cpu":
            yield
        else:
            with cupy_module().cuda.Device(self.index or 0):
                yield


CPU = Device("cpu")


def device(spec: str | Device | None = None) -> Device:
    """Parse ``'cpu'``, ``'cuda'``, ``'cuda:1'``, ``'gpu'`` or a Device into a Device."""
    if spec is None:
        return CPU
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"device must be a string like 'cpu' or 'cuda:0', got {spec!r}")
    text = spec.strip().lower()
    if text == "cpu":
        return CPU
    kind, _, index_text = text.partition(":")
    if kind in ("cuda", "gpu"):
        if index_text and not index_text.isdigit():
            raise ValueError(f"bad device index in {spec!r}: expected 'cuda:<n>' with n >= 0")
        return Device("cuda", int(index_text) if index_text else 0)
    raise ValueError(f"unknown device {spec!r}: expected 'cpu', 'cuda' or 'cuda:<n>'")


def is_cupy_array(array: Any) -> bool:
    """True for a CuPy ndarray, checked without importing CuPy."""
    return type(array).__module__.startswith("cupy")


def array_module(array: Any):
    """numpy for host arrays and scalars, cupy for device arrays (Chainer's get_array_module)."""
    return cupy_module() if is_cupy_array(array) else np


def device_of(array: Any) -> Device:
    """The Device holding ``array``."""
    if is_cupy_array(array):
        return Device("cuda", int(array.device.id))
    return CPU


def to_device(array: Any, target: Device | str) -> Any:
    """Move an array to ``target``; returns the same array when it is already there."""
    target = device(target)
    if target.type == "cpu":
        return array.get() if is_cupy_array(array) else np.asarray(array)
    cupy = cupy_module()
    if is_cupy_array(array) and int(array.device.id) == (target.index or 0):
        return array
    with cupy.cuda.Device(target.index or 0):
        return cupy.asarray(array)


def scatter_add(target: Any, index: Any, values: Any) -> None:
    """``target[index] += values`` in place, adding every repeated index (``np.add.at``).

    Plain ``target[index] += values`` keeps only one contribution per repeated index; the
    gradients of indexing and embedding need all of them.
    """
    if is_cupy_array(target):
        import cupyx  # noqa: PLC0415 - reached only with CuPy arrays, after cupy imported

        cupyx.scatter_add(target, index, values)
    else:
        np.add.at(target, index, values)


def as_numpy(array: Any) -> np.ndarray:
    """A host (NumPy) copy or view of ``array``."""
    return array.get() if is_cupy_array(array) else np.asarray(array)


def resolve_dtype(dtype: Any = None) -> np.dtype:
    """Normalise a dtype argument; ``None`` gives the default float32."""
    return DEFAULT_DTYPE if dtype is None else np.dtype(dtype)


def is_floating(dtype: Any) -> bool:
    return np.issubdtype(np.dtype(dtype), np.floating)


# --- BLAS threads -------------------------------------------------------------------------
# Executors run one task per core or one task per executor; either way the number of BLAS
# threads must be set explicitly, or every task's OpenBLAS/MKL spawns one thread per core and
# they fight. threadpoolctl changes the limit at run time, after NumPy is loaded.


def set_blas_threads(count: int) -> None:
    """Limit the BLAS thread pools of this process to ``count`` threads."""
    if count < 1:
        raise ValueError(f"BLAS thread count must be >= 1, got {count}")
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=count, user_api="blas")


@contextlib.contextmanager
def blas_threads(count: int):
    """Context manager form of :func:`set_blas_threads`; restores the old limits on exit."""
    if count < 1:
        raise ValueError(f"BLAS thread count must be >= 1, got {count}")
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=count, user_api="blas"):
        yield


def blas_thread_count() -> int:
    """The largest current BLAS thread limit in this process (1 when no BLAS is loaded)."""
    from threadpoolctl import threadpool_info

    counts = [info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"]
    return max(counts) if counts else 1


def cpu_count() -> int:
    """CPUs this process may use (respects affinity masks set by YARN/Kubernetes)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
