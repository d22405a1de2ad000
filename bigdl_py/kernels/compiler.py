"""The kernels' CUDA sources, their compilation by CuPy and their launches.

A :class:`Kernel` names its source family, its ``extern "C"`` function and the C types of
its parameters. The types say how to pass each argument (a CuPy launch needs NumPy scalars
of the exact width) and let the tests build a host emulation of the same source.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from bigdl_py import backend

SOURCE_DIRECTORY = Path(__file__).parent / "cuda"
# Fused multiply-adds off: each operation rounds as NumPy's does, so a kernel computes what
# its NumPy reference computes (IEEE division and square root are CUDA's defaults).
COMPILE_OPTIONS = ("--fmad=false", "--std=c++14")
REAL_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
# Threads per block: a power of two (the block reductions of prelude.cuh need one).
THREADS = 256
# Blocks of an element-wise launch at most; each thread then strides over the rest.
MAX_BLOCKS = 4096

_SCALARS = {
    "index": np.int64,
    "long long": np.int64,
    "int": np.int32,
    "unsigned long long": np.uint64,
    "double": np.float64,
}


def source(family: str) -> str:
    """The full text of a family's source: the prelude, then ``cuda/<family>.cu``."""
    prelude = (SOURCE_DIRECTORY / "prelude.cuh").read_text()
    return prelude + "\n" + (SOURCE_DIRECTORY / f"{family}.cu").read_text()


def families() -> list[str]:
    """Every kernel family with a source in ``cuda/``."""
    return sorted(path.stem for path in SOURCE_DIRECTORY.glob("*.cu"))


class Kernel(NamedTuple):
    """One ``extern "C" __global__`` function of ``cuda/<family>.cu``.

    ``parameters`` are its C parameter types in order: ``index`` (``long long``), ``int``,
    ``double``, ``unsigned long long``, ``real`` (the dtype's scalar) or a pointer to one
    of those or to ``bool``, spelled as in the source (``const real*``).
    """

    family: str
    name: str
    parameters: tuple[str, ...]

    def launch(self, blocks: int, dtype: Any, *arguments: Any, threads: int = THREADS) -> None:
        """Run on the current CUDA device with ``blocks`` x ``threads`` threads; ``dtype``
        picks the compiled variant (and the width of ``real`` arguments)."""
        dtype = np.dtype(dtype)
        if len(arguments) != len(self.parameters):
            raise TypeError(
                f"{self.name} takes {len(self.parameters)} arguments, got {len(arguments)}"
            )
        passed = [
            _argument(self.name, kind, value, dtype)
            for kind, value in zip(self.parameters, arguments, strict=True)
        ]
        function = _compiled(self.family, dtype.str, _current_device()).get_function(self.name)
        function((max(int(blocks), 1),), (threads,), tuple(passed))


def run(
    kernel: Kernel, reference: Any, blocks: int, dtype: Any, *arguments: Any, threads: int = THREADS
) -> None:
    """Run ``kernel`` on CuPy arrays, or its NumPy ``reference`` on the strict device.

    The reference takes the kernel's arguments in the kernel's order, with the strict
    device's arrays as the host arrays behind them: it stands for the device running the
    kernel, which reads its own memory (no host wait), so it may branch on device values
    as the kernel does.
    """
    on_cuda = any(backend.is_cupy_array(value) for value in arguments)
    if on_cuda:
        kernel.launch(blocks, dtype, *arguments, threads=threads)
        return
    from bigdl_py.strict_device import run_on_device

    run_on_device(reference, *arguments)


def row_threads(width: int) -> int:
    """Threads of a block that reduces one row of ``width`` values: a power of two from
    32 to ``THREADS``, no wider than the row needs."""
    threads = 32
    while threads < width and threads < THREADS:
        threads *= 2
    return threads


def row_blocks(rows: int) -> int:
    """Blocks of a row-wise launch (each block strides over rows past the first)."""
    return max(1, min(int(rows), 65535))


def elementwise_blocks(count: int) -> int:
    """Blocks for ``count`` elements, one per thread (grid-stride loops take the rest)."""
    return max(1, min(-(-int(count) // THREADS), MAX_BLOCKS))


def _argument(kernel: str, kind: str, value: Any, dtype: np.dtype) -> Any:
    """``value`` as a launch needs it for a parameter of C type ``kind``."""
    if kind.endswith("*"):
        if not backend.is_cupy_array(value) or not value.flags.c_contiguous:
            raise TypeError(
                f"{kernel}: a {kind} argument must be a C-contiguous CuPy array, got "
                f"{type(value).__name__}"
            )
        pointee = kind.replace("const ", "").rstrip("*").strip()
        expected = dtype if pointee == "real" else np.dtype(_POINTEES[pointee])
        if value.dtype != expected:
            raise TypeError(f"{kernel}: a {kind} argument must be {expected}, got {value.dtype}")
        return value
    if kind == "real":
        return dtype.type(value)
    return _SCALARS[kind](value)


_POINTEES = {
    "bool": np.bool_,
    "long long": np.int64,
    "unsigned long long": np.uint64,
    "int": np.int32,
    "double": np.float64,
}


def _current_device() -> int:
    return int(backend.cupy_module().cuda.runtime.getDevice())


_lock = threading.Lock()


@functools.cache
def _compiled(family: str, dtype_str: str, device: int):
    """The family's module for one dtype on one device, compiled on first use."""
    del device  # part of the cache key: a module is loaded per device
    cupy = backend.cupy_module()
    real = REAL_TYPES[np.dtype(dtype_str)]
    with _lock:
        return cupy.RawModule(code=source(family), options=(f"-DREAL={real}", *COMPILE_OPTIONS))
