"""The one place that chooses NumPy or CuPy.

Every other module asks this one for the array module of an array (`array_module`) or of a
device (`Device.xp`). CuPy is imported lazily, on first use of a CUDA device, so the whole
package works on a machine without it.

Besides ``cpu`` and ``cuda:<n>`` there is a ``strict`` device, for tests: host memory
posing as a GPU (``bigdl_py.strict_device``). Code asks :func:`is_device_array` (not "is it
CuPy?") when it picks the GPU route, so the strict device takes that route too, and its
arrays refuse every read back to the host inside a training step.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
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
            f"({_cupy_import_error!r}); install a GPU extra: pip install 'bigdl_py[gpu]' for "
            "CUDA 12, 'bigdl_py[gpu-cuda13]' for CUDA 13"
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
        """The array module for this device (numpy, cupy, or the strict device's)."""
        if self.type == "cpu":
            return np
        if self.type == STRICT_TYPE:
            return _strict_device().numpy
        return cupy_module()

    @contextlib.contextmanager
    def activate(self):
        """Make this device current for array creation (a no-op on CPU)."""
        if self.type in ("cpu", STRICT_TYPE):
            yield
        else:
            with cupy_module().cuda.Device(self.index or 0):
                yield


CPU = Device("cpu")
# The test device that poses as a GPU (see the module docstring).
STRICT_TYPE = "strict"
STRICT = Device(STRICT_TYPE)
_STRICT_MODULE = "bigdl_py.strict_device"


def _strict_device():
    """The strict device's module, imported on first use (it imports ``device_waits``)."""
    from bigdl_py import strict_device

    return strict_device


def device(spec: str | Device | None = None) -> Device:
    """Parse ``'cpu'``, ``'cuda'``, ``'cuda:1'``, ``'gpu'``, ``'strict'`` or a Device."""
    if spec is None:
        return CPU
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"device must be a string like 'cpu' or 'cuda:0', got {spec!r}")
    text = spec.strip().lower()
    if text == "cpu":
        return CPU
    if text == STRICT_TYPE:
        return STRICT
    kind, _, index_text = text.partition(":")
    if kind in ("cuda", "gpu"):
        if index_text and not index_text.isdigit():
            raise ValueError(f"bad device index in {spec!r}: expected 'cuda:<n>' with n >= 0")
        return Device("cuda", int(index_text) if index_text else 0)
    raise ValueError(
        f"unknown device {spec!r}: expected 'cpu', 'cuda', 'cuda:<n>' or 'strict' (tests)"
    )


def is_cupy_array(array: Any) -> bool:
    """True for a CuPy ndarray, checked without importing CuPy."""
    return type(array).__module__.startswith("cupy")


def is_device_array(array: Any) -> bool:
    """True for an array on a GPU (CuPy) or on the strict test device posing as one: what
    code asks when it picks the GPU route."""
    module = type(array).__module__
    return module.startswith("cupy") or module == _STRICT_MODULE


def array_module(array: Any):
    """numpy for host arrays and scalars, cupy for device arrays (Chainer's get_array_module)."""
    module = type(array).__module__
    if module.startswith("cupy"):
        return cupy_module()
    if module == _STRICT_MODULE:
        return _strict_device().numpy
    return np


def device_of(array: Any) -> Device:
    """The Device holding ``array``."""
    if is_cupy_array(array):
        return Device("cuda", int(array.device.id))
    if type(array).__module__ == _STRICT_MODULE:
        return STRICT
    return CPU


@functools.cache
def memory_bytes(where: Device) -> int | None:
    """The total memory of ``where`` (the host's physical memory, or the GPU's), or None
    where the system does not say. An array larger than this can never be allocated there:
    ops refuse such outputs up front instead of failing after minutes of paging or being
    killed. Cached: it does not change, and asking a GPU is a driver call."""
    if where.type == "cuda":
        with where.activate():
            return int(cupy_module().cuda.runtime.memGetInfo()[1])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or no such name
        return None


def to_device(array: Any, target: Device | str) -> Any:
    """Move an array to ``target``; returns the same array when it is already there.

    Inside a step being captured in a CUDA graph (:func:`active_capture`) host data cannot
    go to the device: a captured copy would read the same host memory again at every
    replay. That raises :class:`NotCapturable` (the step then runs eagerly).
    """
    target = device(target)
    if target.type == "cpu":
        if is_device_array(array):
            return array.get()
        return np.asarray(array)
    if not is_device_array(array):
        refuse_in_capture("copying host data to the device")
    if target.type == STRICT_TYPE:
        if is_cupy_array(array):
            raise ValueError("cannot move a CUDA array to the strict test device")
        return _strict_device().to_strict(array)
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
    scatter_reduce(target, index, values, "add")


_CUPYX_SCATTERS = {"add": "scatter_add", "maximum": "scatter_max", "minimum": "scatter_min"}


def scatter_reduce(target: Any, index: Any, values: Any, how: str) -> None:
    """``target[index] = how(target[index], values)`` in place over every repeated index.

    ``how`` is ``"add"``, ``"maximum"`` or ``"minimum"`` (NumPy's ``ufunc.at``; on the GPU
    ``cupyx.scatter_add``/``scatter_max``/``scatter_min``).
    """
    if is_cupy_array(target):
        import cupyx  # noqa: PLC0415 - reached only with CuPy arrays, after cupy imported

        getattr(cupyx, _CUPYX_SCATTERS[how])(target, index, values)
    elif is_device_array(target):
        # The strict device wraps indices out of range around, as CuPy's indexing does.
        xp = array_module(target)
        if not isinstance(index, tuple):
            index = index % target.shape[0]
        getattr(xp, how).at(target, index, values)
    else:
        getattr(np, how).at(target, index, values)


def check_floating(dtype: Any, who: str) -> None:
    """Raise ``TypeError`` naming ``who`` (an op or a layer) unless ``dtype`` is floating point:
    integer input would fail deep inside NumPy, or be silently truncated."""
    if not is_floating(dtype):
        raise TypeError(f"{who}: input must be floating point, got dtype {np.dtype(dtype)}")


def as_numpy(array: Any) -> np.ndarray:
    """A host (NumPy) copy or view of ``array`` (a device array is copied: a device wait)."""
    return array.get() if is_device_array(array) else np.asarray(array)


class HostCopy:
    """A copy of a device array to the host, queued without waiting for the device.

    :meth:`wait` gives the host array; it waits only for the work queued before the copy.
    The training loop waits for a step's loss one step later, when the device has (nearly)
    run that step while the next one is queued behind it: the device never idles for it.
    """

    __slots__ = ("_host", "_event", "_step")

    def __init__(self, array: Any):
        self._event = None
        self._step = None
        if is_device_array(array):
            # Captured, the copy would be replayed into this buffer and its event be one the
            # host cannot wait on: copies of a captured step's results are taken after it.
            refuse_in_capture("a copy to the host (HostCopy)")
        if is_cupy_array(array):
            import cupyx  # noqa: PLC0415 - reached only with CuPy arrays, after cupy imported

            self._host = cupyx.empty_pinned(array.shape, array.dtype)
            array.get(out=self._host, blocking=False)  # queued on the current stream
            self._event = cupy_module().cuda.Event(block=False, disable_timing=True)
            self._event.record()
        elif type(array).__module__ == _STRICT_MODULE:
            from bigdl_py import device_waits

            self._host = array._host.copy()
            self._step = device_waits.step_number()  # the step that queued the copy
        else:
            self._host = np.asarray(array)

    def ready(self) -> bool:
        """Whether :meth:`wait` would return without waiting."""
        return self._event is None or self._event.done

    def wait(self) -> np.ndarray:
        """The host array, once the device has written it.

        On the strict device, waiting inside a step for a copy the same step queued raises
        ``DeviceSyncError``: on a GPU that wait would stall the step.
        """
        if self._event is not None:
            self._event.synchronize()
        elif self._step is not None:
            from bigdl_py import device_waits

            if device_waits.step_number() == self._step:
                device_waits.check_read("waiting for a host copy queued by the same step")
        return self._host


def resolve_dtype(dtype: Any = None) -> np.dtype:
    """Normalise a dtype argument; ``None`` gives the default float32."""
    return DEFAULT_DTYPE if dtype is None else np.dtype(dtype)


def is_floating(dtype: Any) -> bool:
    return np.issubdtype(np.dtype(dtype), np.floating)


# --- CUDA graphs: the CuPy calls of bigdl_py.step_graph ---------------------------------------
# A step captured in a CUDA graph is queued on a stream of its own and replayed from there;
# the capture allocates from a memory pool that the graph keeps. ``step_graph`` holds the
# rules; the CuPy calls are here. The capture in progress (one per thread) is kept here too,
# so that the lowest layers (``to_device``, ``HostCopy``, the strict device) can refuse what
# a graph cannot replay.

_capture_state = threading.local()


class NotCapturable(RuntimeError):
    """Something a training step does cannot be replayed from a CUDA graph; the step runs
    eagerly instead (``bigdl_py.step_graph``)."""


def active_capture() -> Any:
    """The capture in progress in this thread (a ``step_graph`` capture), or None."""
    return getattr(_capture_state, "capture", None)


@contextlib.contextmanager
def capture_scope(capture: Any):
    """Make ``capture`` this thread's capture in progress inside the block."""
    previous = active_capture()
    _capture_state.capture = capture
    try:
        yield
    finally:
        _capture_state.capture = previous


def refuse_in_capture(what: str) -> None:
    """Raise :class:`NotCapturable` naming ``what`` while a step is being captured."""
    if active_capture() is not None:
        raise NotCapturable(f"{what} cannot be replayed from a CUDA graph")


def new_stream(where: Device) -> Any:
    """A CUDA stream of ``where`` that does not wait for the legacy default stream (CuPy's
    ``Stream(non_blocking=True)``): graphs are captured and replayed on one."""
    with where.activate():
        return cupy_module().cuda.Stream(non_blocking=True)


class StreamJoin:
    """Queue work on ``stream`` in order with the current stream's (:meth:`scope`).

    Entering, ``stream`` waits for what the current stream has queued (the batch's copy,
    a user's writes to the weights); leaving, the current stream waits for what ``stream``
    queued, so anything the caller queues after (a copy of the loss, validation) runs
    after the step. Waits between streams are queued on the device; the host never waits.
    """

    def __init__(self, stream: Any):
        cupy = cupy_module()
        self.stream = stream
        self._entered = cupy.cuda.Event(block=False, disable_timing=True)
        self._left = cupy.cuda.Event(block=False, disable_timing=True)

    @contextlib.contextmanager
    def scope(self):
        caller = cupy_module().cuda.get_current_stream()
        self.stream.wait_event(caller.record(self._entered))
        try:
            with self.stream:
                yield
        finally:
            caller.wait_event(self.stream.record(self._left))


def begin_capture(stream: Any) -> None:
    """Start capturing what is queued on ``stream`` (relaxed mode: the memory pool may still
    ask the driver for memory during the capture)."""
    stream.begin_capture()


def end_capture(stream: Any) -> Any:
    """End the capture on ``stream``; the instantiated graph (``Graph.launch(stream)``)."""
    return stream.end_capture()


def abandon_capture(stream: Any) -> None:
    """End a capture that failed, dropping what it recorded (nothing ran), so the stream
    takes work again."""
    try:
        capturing = stream.is_capturing()
    except RuntimeError:  # CuPy raises for a capture an error invalidated: still to be ended
        capturing = True
    if capturing:
        with contextlib.suppress(Exception):  # an invalidated capture raises on ending
            stream.end_capture()


def new_memory_pool() -> Any:
    """A CuPy memory pool of its own, for one graph's allocations."""
    return cupy_module().cuda.MemoryPool()


@contextlib.contextmanager
def allocating_from(pool: Any):
    """CuPy allocates from ``pool`` in this thread inside the block."""
    with cupy_module().cuda.using_allocator(pool.malloc):
        yield


class PinnedUpload:
    """Copies host arrays into device arrays, queued on the current stream without waiting.

    On a GPU each copy goes through a pinned host buffer (an asynchronous DMA): a buffer is
    taken again only once its last copy has run (its event; queried, never waited for),
    otherwise another is made. On the strict device the memory is written at once.
    """

    def __init__(self):
        self._buffers: list[_PinnedBuffer] = []

    def copy(self, host: np.ndarray, out: Any) -> None:
        """``out[...] = host`` (same shape; ``host`` is cast to ``out``'s dtype)."""
        host = np.asarray(host)
        if tuple(host.shape) != tuple(out.shape):
            raise ValueError(f"cannot copy a {host.shape} array into a {tuple(out.shape)} one")
        if not is_cupy_array(out):
            _strict_device().device_memory(out)[...] = host
            return
        cupy = cupy_module()
        free = (b for b in self._buffers if b.nbytes >= out.nbytes and b.last_copy.done)
        buffer = next(free, None)
        if buffer is None:
            buffer = _PinnedBuffer(cupy, out.nbytes)
            self._buffers.append(buffer)
        staged = np.frombuffer(buffer.memory, dtype=out.dtype, count=out.size)
        np.copyto(staged.reshape(out.shape), host, casting="unsafe")
        stream = cupy.cuda.get_current_stream()
        out.set(staged.reshape(out.shape), stream=stream)
        stream.record(buffer.last_copy)


class _PinnedBuffer:
    """Page-locked host memory and the event of the last copy out of it."""

    def __init__(self, cupy: Any, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self.memory = cupy.cuda.alloc_pinned_memory(self.nbytes)
        self.last_copy = cupy.cuda.Event(block=False, disable_timing=True)  # done: never used


# --- TF32 on NVIDIA GPUs --------------------------------------------------------------------
# Ampere and later GPUs can run float32 products and convolutions on tensor cores in TF32
# (inputs rounded to a 10-bit mantissa, float32 sums): several times faster, ~1e-3 relative
# error. The defaults are PyTorch's (checked on 2.13): float32 products exact
# (``torch.backends.cuda.matmul.allow_tf32 = False``, its default since 1.12), cuDNN's
# convolutions and RNNs in TF32 (``torch.backends.cudnn.allow_tf32 = True``; in 2.13's
# newer names ``torch.backends.cudnn.conv.fp32_precision`` and ``...rnn.fp32_precision``
# are ``"tf32"``). NVIDIA's ``NVIDIA_TF32_OVERRIDE=0`` still turns TF32 off everywhere.
TF32_VARIABLES = {"matmul": "BIGDL_PY_TF32_MATMUL", "cudnn": "BIGDL_PY_TF32_CUDNN"}
TF32_DEFAULTS = {"matmul": False, "cudnn": True}
_tf32: dict[str, bool] = {}


def _flag_from_environment(variable: str, default: bool) -> bool:
    text = os.environ.get(variable, "").strip().lower()
    if not text:
        return default
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{variable}={text!r}: expected 1/true/yes/on or 0/false/no/off")


def allow_tf32(matmul: bool | None = None, cudnn: bool | None = None) -> dict[str, bool]:
    """Allow (or forbid) TF32 tensor-core math for float32 on NVIDIA GPUs.

    Parameters
    ----------
    matmul : bool, optional
        float32 matrix products through cuBLAS (``matmul``, ``Linear``, attention). Default
        False, as PyTorch's ``torch.backends.cuda.matmul.allow_tf32``; the environment
        variable ``BIGDL_PY_TF32_MATMUL=1`` sets it at start-up.
    cudnn : bool, optional
        float32 convolutions and LSTM/GRU layers through cuDNN. Default True, as PyTorch's
        ``torch.backends.cudnn.allow_tf32``; ``BIGDL_PY_TF32_CUDNN=0`` sets it at start-up.

    Returns
    -------
    dict
        The settings now in force, ``{"matmul": ..., "cudnn": ...}``. Called with no
        arguments it only reports them. A change applies to the next product or layer run
        (cached cuDNN plans are per setting).

    Raises
    ------
    TypeError
        When a setting is not a bool.
    ValueError
        When an environment variable holds something other than 1/0, true/false, yes/no
        or on/off.
    """
    settings = tf32_settings()
    for name, value in (("matmul", matmul), ("cudnn", cudnn)):
        if value is None:
            continue
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"allow_tf32: {name} must be True or False, got {value!r}")
        settings[name] = bool(value)
    return dict(settings)


def tf32_settings() -> dict[str, bool]:
    """The TF32 settings (read from the environment on first use; see :func:`allow_tf32`)."""
    if not _tf32:
        _tf32.update(
            {
                name: _flag_from_environment(variable, TF32_DEFAULTS[name])
                for name, variable in TF32_VARIABLES.items()
            }
        )
    return _tf32


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


# --- the C allocator ----------------------------------------------------------------------
# A training step allocates and frees the same multi-MB arrays every step. glibc serves
# each one above its mmap threshold (128 KB, raised only to the size of the largest one
# freed so far) with a fresh mmap and returns it with munmap, and trims freed memory at the
# top of its heap: the next step faults the pages in again (zeroed by the kernel), and with
# two threads every munmap also interrupts the other CPU to flush its TLB. The CIFAR CNN's
# step at batch 64 took 1000 minor faults at one thread and 1500 at two; with the
# thresholds below, none, the same peak RSS (206-209 MB), and the step's CPU time went
# 172.6 / 170.9 -> 167.5 / 164.7 ms at one thread and 197.5 / 204.6 -> 185.0 / 181.6 ms at
# two (medians of 60-170 steps, separate processes run A B A B, load 4-5); in a quiet
# window, two threads: 185.5 / 178.2 -> 180.5 / 177.6 ms CPU, 102.2 / 95.2 -> 97.5 / 95.2
# ms wall.
MMAP_THRESHOLD_BYTES = 64 << 20  # arrays below this come from the heap and go back to it
TRIM_THRESHOLD_BYTES = 256 << 20  # freed memory kept at the heap's top before returning it


@functools.cache
def keep_freed_memory() -> bool:
    """Let glibc keep freed memory for reuse instead of returning it to the OS at once.

    Opt-in, for the whole process (every library in it allocates through glibc): call it,
    or set ``BIGDL_PY_KEEP_FREED_MEMORY=1`` to have it applied when ``bigdl_py`` is imported.
    Not the default because it is process-wide: ``bench/engine.py`` runs PyTorch in the same
    process, and PyTorch's CIFAR CNN step gained far more from it than ours: three bench
    runs each way, alternated, load < 1, medians of 15 steps: PyTorch at one thread
    154.0 / 166.1 / 154.6 -> 125.7 / 123.2 / 122.9 ms, at two 76.6 / 79.5 / 83.7 -> 67.9 /
    69.8 / 64.8; ours 171.3 / 172.3 / 166.7 -> 179.6 / 173.6 / 171.1 and 100.2 / 100.5 /
    95.8 -> 99.2 / 102.2 / 94.4. Small models gain most: LeNet-5's step (batch 128) took
    832 minor faults, in its Tanh's and max-pool gradient's 2.4 MB arrays, and 11.2-11.5 ms
    at one thread, 11.4-12.6 at two; with this, none, and 9.2-9.3 and 8.4-8.9 ms (separate
    processes run A B A B, 50 steps each, load < 1, 2026-11-25). The cost: up to
    ``TRIM_THRESHOLD_BYTES`` of freed memory stays mapped. Returns whether the settings are
    applied (False where the C library is not glibc); later calls return the first answer.
    """
    applied = False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows): leave it
        mallopt = None
    if mallopt is not None:
        m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
        # Setting either stops glibc adjusting both, so both are set.
        applied = bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD_BYTES)) and bool(
            mallopt(m_trim_threshold, TRIM_THRESHOLD_BYTES)
        )
    return applied


if os.environ.get("BIGDL_PY_KEEP_FREED_MEMORY") == "1":
    keep_freed_memory()
