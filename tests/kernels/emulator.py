"""The kernels' CUDA sources compiled for the host (``emulate.h``) and called with NumPy
arrays, so the CPU tests check what the kernel code itself computes, not only its NumPy
reference. Needs a C++ compiler (``g++``); tests skip without one.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile

import numpy as np

from bigdl_py.kernels import compiler

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "emulate.h")
COMPILER = shutil.which("g++")

_C_TYPES = {
    "index": ctypes.c_longlong,
    "long long": ctypes.c_longlong,
    "int": ctypes.c_int,
    "unsigned long long": ctypes.c_ulonglong,
    "double": ctypes.c_double,
}


def _c_name(kind: str, real: str) -> str:
    return {"index": "index_t"}.get(kind, kind.replace("real", real))


def _wrapper(kernel: compiler.Kernel, real: str) -> str:
    """``emulate_<name>(blocks, threads, ...)``: a C entry point that launches the kernel."""
    names = [f"a{i}" for i in range(len(kernel.parameters))]
    declared = ", ".join(
        f"{_c_name(kind, real)} {name}" for kind, name in zip(kernel.parameters, names, strict=True)
    )
    call = f"{kernel.name}({', '.join(names)});"
    return (
        f'extern "C" void emulate_{kernel.name}(unsigned blocks, unsigned threads, {declared}) '
        f"{{ emulator::launch(blocks, threads, [=]() {{ {call} }}); }}\n"
    )


@functools.cache
def _library(kernels: tuple[compiler.Kernel, ...], dtype_str: str) -> ctypes.CDLL:
    real = compiler.REAL_TYPES[np.dtype(dtype_str)]
    family = kernels[0].family
    text = f'#include "{HEADER}"\n' + compiler.source(family)
    text += "".join(_wrapper(kernel, real) for kernel in kernels)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = os.path.join(tempfile.gettempdir(), "bigdl_py_kernel_emulation")
    os.makedirs(folder, exist_ok=True)
    library = os.path.join(folder, f"{family}-{real}-{digest}.so")
    if not os.path.exists(library):
        source = library[:-3] + ".cpp"
        with open(source, "w") as handle:
            handle.write(text)
        partial = f"{library}.{os.getpid()}"
        subprocess.run(
            [COMPILER, "-O1", "-shared", "-fPIC", f"-DREAL={real}", "-o", partial, source],
            check=True,
            capture_output=True,
            text=True,
        )
        os.replace(partial, library)
    return ctypes.CDLL(library)


def emulate(kernel: compiler.Kernel, blocks: int, dtype, *arguments, threads: int = 0) -> None:
    """Run ``kernel`` on the host over NumPy ``arguments`` (arrays are written in place).

    ``threads`` defaults to the package's launch width (``compiler.THREADS``).
    """
    dtype = np.dtype(dtype)
    family_kernels = tuple(
        value
        for value in _registered(kernel.family)
        if isinstance(value, compiler.Kernel) and value.family == kernel.family
    )
    function = getattr(_library(family_kernels, dtype.str), f"emulate_{kernel.name}")
    passed = [ctypes.c_uint(max(int(blocks), 1)), ctypes.c_uint(threads or compiler.THREADS)]
    for kind, value in zip(kernel.parameters, arguments, strict=True):
        if kind.endswith("*"):
            if not (isinstance(value, np.ndarray) and value.flags.c_contiguous):
                raise TypeError(f"{kernel.name}: {kind} needs a C-contiguous NumPy array")
            passed.append(ctypes.c_void_p(value.ctypes.data))
        elif kind == "real":
            passed.append((ctypes.c_float if dtype == np.float32 else ctypes.c_double)(value))
        else:
            passed.append(_C_TYPES[kind](value))
    function.restype = None
    function(*passed)


_FAMILY_MODULES: dict[str, list] = {}


def register(*kernels: compiler.Kernel) -> None:
    """Make ``kernels`` part of their family's emulated library (every kernel a test of
    that family may call must be registered before the first call compiles it)."""
    for kernel in kernels:
        family = _FAMILY_MODULES.setdefault(kernel.family, [])
        if kernel not in family:
            family.append(kernel)


def _registered(family: str) -> list:
    return _FAMILY_MODULES.get(family, [])
