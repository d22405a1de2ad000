"""NVIDIA's shared libraries (cuDNN, cuBLAS) for the GPU routes: where they are found, and one
handle per device and thread, bound to CuPy's current stream.

Where a library is looked for, in order (:func:`candidate_paths`):

1. the file an environment variable names (``BIGDL_PY_CUDNN_LIBRARY``,
   ``BIGDL_PY_CUBLAS_LIBRARY``);
2. NVIDIA's wheels in this Python's site-packages: ``nvidia/cudnn/lib/libcudnn.so.9``
   (``nvidia-cudnn-cu12`` and ``nvidia-cudnn-cu13`` both put it there),
   ``nvidia/cublas/lib/libcublas.so.12`` (``nvidia-cublas-cu12``) and
   ``nvidia/cu13/lib/libcublas.so.13`` (``nvidia-cublas``, CUDA 13's layout);
3. the dynamic linker's own search by soname: ``LD_LIBRARY_PATH``, ldconfig's cache (a system
   CUDA install), or the copy CuPy already loaded.

The soname's major version is the CUDA runtime's that CuPy runs on (``libcublas.so.13`` under
CUDA 13): a library built for another CUDA would share device pointers and streams with CuPy
through the driver, but mixing two runtimes in one process is what NVIDIA's compatibility
rules leave undefined, so it is not loaded.

Handles (:class:`StreamHandles`): a cuDNN or cuBLAS handle belongs to the device current when
it was made and must not be used by two threads at once, so each thread keeps one per device.
A handle is bound to a stream (``cudnnSetStream``/``cublasSetStream``) only when CuPy's
current stream differs from the one it was last bound to, not on every call: CuPy's own
cuBLAS wrappers bind on every call, and ``cublasSetStream`` drops the handle's workspace
back to cuBLAS's pool, whose allocation breaks a CUDA-graph capture. Binding happens on the
warm-up run before a capture, so the captured calls bind nothing.

Nothing here imports CuPy: the module comes from ``backend.cupy_module()``, reached only
when the operands are CuPy arrays.
"""

from __future__ import annotations

import ctypes
import os
import site
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bigdl_py import backend


def cuda_runtime_major() -> int:
    """The major version of the CUDA runtime CuPy runs on (12 for CUDA 12.x)."""
    return int(backend.cupy_module().cuda.runtime.runtimeGetVersion()) // 1000


def site_directories() -> list[str]:
    """Directories that may hold NVIDIA's wheels: site-packages, user site, ``sys.path``."""
    directories = []
    try:
        directories += site.getsitepackages()
    except AttributeError:  # virtualenv's old site.py
        pass
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user_site:
        directories.append(user_site)
    directories += [entry for entry in sys.path if entry]
    return [entry for entry in dict.fromkeys(directories) if os.path.isdir(entry)]


def candidate_paths(
    variable: str, wheel_paths: tuple[str, ...], soname: str, directories: list[str]
) -> list[str]:
    """Where to try loading a library, in order (see the module): the file ``variable``
    names, each ``wheel_paths`` entry (relative to a site directory) that exists under one
    of ``directories``, then the bare ``soname`` for the dynamic linker's search."""
    named = os.environ.get(variable, "").strip()
    if named:
        return [named]
    found = [
        os.path.join(directory, relative)
        for relative in wheel_paths
        for directory in directories
        if os.path.exists(os.path.join(directory, relative))
    ]
    return [*dict.fromkeys(found), soname]


def load_first(paths: list[str], load: Callable[[str], Any]) -> tuple[Any, list[str]]:
    """``load(path)`` for each path until one succeeds: ``(library or None, failures)``,
    each failure ``"path: error"`` for the warning that names why a route is off."""
    failures = []
    for path in paths:
        try:
            return load(path), failures
        except (OSError, AttributeError, RuntimeError) as error:
            failures.append(f"{path}: {error}")
    return None, failures


def current_device() -> int:
    """The CUDA device current in this thread (CuPy's numbering)."""
    return int(backend.cupy_module().cuda.runtime.getDevice())


def current_stream() -> int:
    """The ``cudaStream_t`` of CuPy's current stream in this thread (0: the legacy default)."""
    return int(backend.cupy_module().cuda.get_current_stream().ptr)


def device_buffer(nbytes: int):
    """A device buffer of ``nbytes`` bytes from CuPy's memory pool (a uint8 CuPy array; its
    ``.data.ptr`` is the address). The pool is stream-ordered: a buffer dropped right after
    the calls that use it are queued is reused only by work queued after them."""
    cupy = backend.cupy_module()
    return cupy.empty(max(int(nbytes), 1), dtype=cupy.uint8)


def pointer(array) -> ctypes.c_void_p:
    """The device address of a CuPy array's first element."""
    return ctypes.c_void_p(int(array.data.ptr))


@dataclass
class BoundHandle:
    """One library handle of one device and thread, and what it was last bound to."""

    handle: ctypes.c_void_p
    stream: int | None = None
    # Buffers the handle was given (cuBLAS's workspace per stream): kept alive with it.
    buffers: dict = field(default_factory=dict)


class StreamHandles:
    """Per thread and device, one handle from ``create()``, bound to CuPy's current stream
    by ``bind(bound, stream)`` whenever that stream changes (see the module).

    Handles live as long as the process (as PyTorch's pool of them does): destroying one
    while a captured graph still refers to it would be unsafe, and there are a few per
    thread at most.
    """

    def __init__(
        self,
        create: Callable[[], ctypes.c_void_p],
        bind: Callable[[BoundHandle, int], None],
    ) -> None:
        self._create = create
        self._bind = bind
        self._local = threading.local()

    def current(self) -> BoundHandle:
        """This thread's handle for the current device, bound to the current stream."""
        handles = getattr(self._local, "handles", None)
        if handles is None:
            handles = self._local.handles = {}
        device = current_device()
        bound = handles.get(device)
        if bound is None:
            bound = handles[device] = BoundHandle(self._create())
        stream = current_stream()
        if bound.stream != stream:
            self._bind(bound, stream)
            bound.stream = stream
        return bound
