"""oneDNN's C API through ``ctypes``: the library, its threads, and a set of primitives.

Why: where NumPy plus OpenBLAS cannot reach PyTorch's CPU speed, we run the same kernels
PyTorch runs, oneDNN's (formerly MKL-DNN, which BigDL's own ``mkldnn`` engine used too):
its JIT-compiled direct convolutions (``conv_onednn``) and its LSTM (``lstm_onednn``).
oneDNN 3.x; the ``onednn-cpu-gomp`` wheel, a dependency on Linux x86-64, puts
``libdnnl.so.3`` in ``<prefix>/lib``; ``BIGDL_PY_ONEDNN_LIBRARY`` names another file, and
``BIGDL_PY_ONEDNN=0`` turns the routes off (the NumPy routes are the references the tests
compare them with).

:class:`PrimitiveSet` owns the primitives of one geometry. oneDNN picks its own (blocked)
layouts for the kernels and we reorder our C-contiguous arrays into them and back, in
buffers NumPy allocates, so a step's traced peak memory counts them.

Threads: every primitive runs on ONE OpenMP thread, and our own threads share out the work
(``conv_tiles.for_each_tile``: a convolution's batch, an LSTM's directions; ctypes lets the
GIL go during each call). Why not oneDNN's own OpenMP team:
- an idle libgomp thread spins after each parallel region (~300,000 iterations by
  default) and on two cores takes the core from the threads of the ops that follow: the
  CIFAR CNN's step at two threads took 93 ms on a team against 68 with
  ``GOMP_SPINCOUNT=0``; the spin count is read from the environment once per process, and
  PyTorch ships a ``libgomp.so.1`` that libdnnl binds to when torch was imported first;
- libgomp is not fork-safe: a child forked from a process that ran a team hangs in its
  own first team (tried with this wheel), and one-task's replicas are forked children.
oneDNN's kernels fix their team size when a primitive is made, so primitives are made
under :func:`one_openmp_thread` too. The OpenMP setting of the calling thread is restored
after each call (the runtime may be PyTorch's). Each thread passes its own scratch space to
the primitives it runs (oneDNN's user scratchpad mode): with the library's own, a primitive
may run only in the thread that made it, and never twice at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import threading
import warnings

import numpy as np

SWITCH_VARIABLE = "BIGDL_PY_ONEDNN"
LIBRARY_VARIABLE = "BIGDL_PY_ONEDNN_LIBRARY"

# oneDNN 3.x C API constants (dnnl_types.h, dnnl_common_types.h).
CPU_ENGINE = 1
F32 = 3
FORMAT_ANY = 1
FORWARD_TRAINING, FORWARD_INFERENCE, BACKWARD = 64, 96, 128
CONVOLUTION_DIRECT = 1
UNIDIRECTIONAL_LEFT2RIGHT, UNIDIRECTIONAL_RIGHT2LEFT = 1, 2
RNN_DIFF_WEIGHTS_OVERWRITE = 1  # without it, an RNN's backward adds to its weight gradients
STREAM_IN_ORDER = 1
QUERY_IMPL_INFO = 8
QUERY_SRC, QUERY_DIFF_SRC, QUERY_WEIGHTS, QUERY_DIFF_WEIGHTS = 129, 130, 131, 132
QUERY_DST, QUERY_DIFF_DST = 133, 134
QUERY_WORKSPACE, QUERY_SCRATCHPAD = 135, 136
QUERY_EXEC_ARG = 255  # the memory descriptor of an execution argument (ARG_* as index)
SCRATCHPAD_MODE_USER = 1
ARG_SRC, ARG_DST, ARG_WEIGHTS, ARG_BIAS = 1, 17, 33, 41
ARG_DIFF_SRC, ARG_DIFF_DST, ARG_DIFF_WEIGHTS, ARG_DIFF_BIAS = 129, 145, 161, 169
ARG_FROM, ARG_TO = 1, 17
ARG_WORKSPACE, ARG_SCRATCHPAD = 64, 80
# An RNN's arguments: *_LAYER is the sequence, *_ITER a state (h), *_ITER_C the cell state.
ARG_SRC_LAYER, ARG_SRC_ITER, ARG_SRC_ITER_C = 1, 2, 3
ARG_DST_LAYER, ARG_DST_ITER, ARG_DST_ITER_C = 17, 18, 19
ARG_WEIGHTS_LAYER, ARG_WEIGHTS_ITER = 33, 34
_STATUS_NAMES = {
    1: "out of memory",
    2: "invalid arguments",
    3: "unimplemented",
    5: "runtime error",
    6: "not required",
}

Pointer = ctypes.c_void_p
Dims = ctypes.c_int64 * 12  # dnnl_dims_t: DNNL_MAX_NDIMS int64s


class ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", Pointer)]


class OneDNNError(RuntimeError):
    """A oneDNN call returned an error status."""


class _Library:
    """libdnnl and the libgomp it runs on, with the argument types of the calls we make."""

    def __init__(self, path: str) -> None:
        self.dnnl = ctypes.CDLL(path)
        # The OpenMP runtime libdnnl was linked with, already loaded by the line above.
        self.gomp = ctypes.CDLL("libgomp.so.1")
        signatures = {
            "dnnl_engine_create": [Pointer, ctypes.c_int, ctypes.c_size_t],
            "dnnl_stream_create": [Pointer, Pointer, ctypes.c_uint],
            "dnnl_stream_wait": [Pointer],
            "dnnl_memory_desc_create_with_string_tag": [
                Pointer,
                ctypes.c_int,
                Pointer,
                ctypes.c_int,
                ctypes.c_char_p,
            ],
            "dnnl_memory_desc_create_with_tag": [
                Pointer,
                ctypes.c_int,
                Pointer,
                ctypes.c_int,
                ctypes.c_int,
            ],
            "dnnl_memory_desc_destroy": [Pointer],
            "dnnl_memory_desc_equal": [Pointer, Pointer],
            "dnnl_memory_desc_get_size": [Pointer],
            "dnnl_memory_create": [Pointer, Pointer, Pointer, Pointer],
            "dnnl_memory_set_data_handle": [Pointer, Pointer],
            "dnnl_memory_destroy": [Pointer],
            "dnnl_convolution_forward_primitive_desc_create": [Pointer, Pointer]
            + [ctypes.c_int] * 2
            + [Pointer] * 9,
            "dnnl_convolution_backward_data_primitive_desc_create": [Pointer, Pointer]
            + [ctypes.c_int]
            + [Pointer] * 9,
            "dnnl_convolution_backward_weights_primitive_desc_create": [Pointer, Pointer]
            + [ctypes.c_int]
            + [Pointer] * 10,
            "dnnl_lstm_forward_primitive_desc_create": [Pointer, Pointer]
            + [ctypes.c_int] * 2
            + [Pointer] * 11
            + [ctypes.c_uint, Pointer],
            "dnnl_lstm_backward_primitive_desc_create": [Pointer, Pointer]
            + [ctypes.c_int] * 2
            + [Pointer] * 22
            + [ctypes.c_uint, Pointer, Pointer],
            "dnnl_reorder_primitive_desc_create": [Pointer] * 6,
            "dnnl_primitive_desc_query": [Pointer, ctypes.c_int, ctypes.c_int, Pointer],
            "dnnl_primitive_desc_query_md": [Pointer, ctypes.c_int, ctypes.c_int],
            "dnnl_primitive_desc_destroy": [Pointer],
            "dnnl_primitive_create": [Pointer, Pointer],
            "dnnl_primitive_execute": [Pointer, Pointer, ctypes.c_int, Pointer],
            "dnnl_primitive_destroy": [Pointer],
            "dnnl_primitive_attr_create": [Pointer],
            "dnnl_primitive_attr_set_scratchpad_mode": [Pointer, ctypes.c_int],
        }
        for name, argtypes in signatures.items():
            getattr(self.dnnl, name).argtypes = argtypes
        self.dnnl.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
        self.dnnl.dnnl_primitive_desc_query_md.restype = Pointer
        self.engine = Pointer()
        self.call("dnnl_engine_create", ctypes.byref(self.engine), CPU_ENGINE, 0)
        # Every primitive takes its scratch space from the caller: with the library's own
        # (the default), a primitive may run only in the thread that made it, one call at a
        # time, and our tiles run each primitive in whichever thread takes the tile (two
        # threads sharing one made the bias gradient wrong, 2026-11-25).
        self.attributes = Pointer()
        self.call("dnnl_primitive_attr_create", ctypes.byref(self.attributes))
        self.call("dnnl_primitive_attr_set_scratchpad_mode", self.attributes, SCRATCHPAD_MODE_USER)

    def call(self, name: str, *args) -> None:
        status = getattr(self.dnnl, name)(*args)
        if status != 0:
            meaning = _STATUS_NAMES.get(status, "unknown status")
            raise OneDNNError(f"oneDNN: {name} failed with status {status} ({meaning})")

    def plain_md(self, shape: tuple[int, ...], tag: str | None = None) -> Pointer:
        """A float32 memory descriptor of a C-contiguous array of ``shape``, or with
        ``tag`` (oneDNN's letters for the axes in memory order, ``"bac"``: axis 1 outermost)
        of a C-contiguous array whose axes are ``shape``'s in that order."""
        md = Pointer()
        tag = (tag or "abcdefghijkl"[: len(shape)]).encode()
        self.call(
            "dnnl_memory_desc_create_with_string_tag",
            ctypes.byref(md),
            len(shape),
            Dims(*shape),
            F32,
            tag,
        )
        return md

    def any_md(self, shape: tuple[int, ...]) -> Pointer:
        """A float32 memory descriptor whose layout the primitive chooses."""
        md = Pointer()
        self.call(
            "dnnl_memory_desc_create_with_tag",
            ctypes.byref(md),
            len(shape),
            Dims(*shape),
            F32,
            FORMAT_ANY,
        )
        return md

    def primitive(self, descriptor: Pointer) -> Pointer:
        primitive = Pointer()
        self.call("dnnl_primitive_create", ctypes.byref(primitive), descriptor)
        return primitive

    def reorder(self, source_md, destination_md) -> tuple[Pointer, Pointer]:
        """A reorder primitive (and its descriptor) from one layout to another."""
        descriptor = Pointer()
        self.call(
            "dnnl_reorder_primitive_desc_create",
            ctypes.byref(descriptor),
            source_md,
            self.engine,
            destination_md,
            self.engine,
            self.attributes,
        )
        return descriptor, self.primitive(descriptor)

    def implementation(self, descriptor: Pointer) -> str:
        """oneDNN's name of the kernel a primitive descriptor chose (``jit:avx512_core``)."""
        text = ctypes.c_char_p()
        self.call("dnnl_primitive_desc_query", descriptor, QUERY_IMPL_INFO, 0, ctypes.byref(text))
        return (text.value or b"").decode()


def _library_path() -> str | None:
    named = os.environ.get(LIBRARY_VARIABLE)
    if named:
        return named
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        path = os.path.join(prefix, "lib", "libdnnl.so.3")
        if os.path.exists(path):
            return path
    import ctypes.util

    return ctypes.util.find_library("dnnl")


@functools.cache
def loaded() -> _Library | None:
    """The library, loaded once; None where it is missing or does not load."""
    path = _library_path()
    if path is None:
        return None
    try:
        return _Library(path)
    except (OSError, AttributeError, OneDNNError) as error:  # no libgomp, not 3.x, no engine
        warnings.warn(
            f"bigdl_py: oneDNN's library at {path} does not load ({error}); float32 "
            f"convolutions and LSTMs take slower NumPy routes (Debian: apt-get install "
            f"libgomp1)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def available() -> bool:
    """Whether oneDNN's routes may run: the library loads and the switch is not 0."""
    if os.environ.get(SWITCH_VARIABLE, "1").strip() in ("0", "false", "no", "off"):
        return False
    return loaded() is not None


def applies_to(*arrays) -> bool:
    """Whether these operands take this route: all float32 NumPy arrays, and it is available."""
    for array in arrays:
        if array is not None and (type(array) is not np.ndarray or array.dtype != np.float32):
            return False
    return available()


# --- threads -----------------------------------------------------------------------------------

_local = threading.local()


@contextlib.contextmanager
def one_openmp_thread(library: _Library):
    """Hold this thread's oneDNN calls to one OpenMP thread inside the block, then restore
    its setting: our own threads share out the work instead (see the module),
    and the OpenMP runtime may be another library's too (PyTorch ships the ``libgomp.so.1``
    that libdnnl then binds to)."""
    previous = library.gomp.omp_get_max_threads()
    if previous != 1:
        library.gomp.omp_set_num_threads(1)
    try:
        yield
    finally:
        if previous != 1:
            library.gomp.omp_set_num_threads(previous)


def _stream(library: _Library) -> Pointer:
    """This thread's oneDNN stream (streams are not shared between threads)."""
    stream = getattr(_local, "stream", None)
    if stream is None:
        stream = Pointer()
        library.call("dnnl_stream_create", ctypes.byref(stream), library.engine, STREAM_IN_ORDER)
        _local.stream = stream
    return stream


# --- one geometry --------------------------------------------------------------------------------


def aligned_empty(nbytes: int) -> np.ndarray:
    """A float32 buffer of at least ``nbytes`` bytes starting on a 64-byte boundary."""
    raw = np.empty(nbytes // 4 + 16, dtype=np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip : skip + -(-nbytes // 4)]


class Layout:
    """How one operand reaches a kernel: as our C-contiguous array, or through a buffer in
    the kernel's own layout and a reorder into it (``into_kernel``) or out of it. ``query``
    and ``index`` name the operand (``QUERY_SRC, 0``; ``QUERY_EXEC_ARG, ARG_...``)."""

    def __init__(
        self, library: _Library, descriptor, query: int, plain_md, into_kernel: bool, index=0
    ):
        self.plain_md = plain_md
        self.kernel_md = library.dnnl.dnnl_primitive_desc_query_md(descriptor, query, index)
        self.reordered = not library.dnnl.dnnl_memory_desc_equal(self.kernel_md, plain_md)
        self.reorder = None
        if self.reordered:
            self.nbytes = library.dnnl.dnnl_memory_desc_get_size(self.kernel_md)
            pair = (plain_md, self.kernel_md) if into_kernel else (self.kernel_md, plain_md)
            self.reorder = library.reorder(*pair)

    def same_as(self, other: Layout, library: _Library) -> bool:
        return bool(library.dnnl.dnnl_memory_desc_equal(self.kernel_md, other.kernel_md))


class PrimitiveSet:
    """oneDNN objects made together (the primitives of one geometry), given back together
    when the set is dropped; runs them with each thread's own scratch space."""

    def __init__(self, library: _Library) -> None:
        self.library = library
        self._owned_mds: list[Pointer] = []
        self._descriptors: list[Pointer] = []
        self._primitives: list[Pointer] = []
        self._memories: dict = {}
        # primitive -> (scratchpad md, bytes); (thread, primitive) -> that thread's buffer
        self._scratchpads: dict = {}
        self._scratch_buffers: dict = {}

    # ownership, so that __del__ gives everything back to oneDNN
    def own(self, md):
        self._owned_mds.append(md)
        return md

    def descriptor(self, function: str, *args) -> Pointer:
        descriptor = Pointer()
        self.library.call(function, ctypes.byref(descriptor), self.library.engine, *args)
        self._descriptors.append(descriptor)
        return descriptor

    def primitive(self, descriptor) -> Pointer:
        primitive = self.library.primitive(descriptor)
        self._primitives.append(primitive)
        self._note_scratchpad(descriptor, primitive)
        return primitive

    def argument_md(self, descriptor, argument: int) -> Pointer:
        """The memory descriptor ``descriptor`` wants for execution argument ``argument``."""
        dnnl = self.library.dnnl
        return dnnl.dnnl_primitive_desc_query_md(descriptor, QUERY_EXEC_ARG, argument)

    def _note_scratchpad(self, descriptor, primitive) -> None:
        """Remember the scratch space ``primitive`` wants from its caller (may be none)."""
        dnnl = self.library.dnnl
        md = dnnl.dnnl_primitive_desc_query_md(descriptor, QUERY_SCRATCHPAD, 0)
        nbytes = dnnl.dnnl_memory_desc_get_size(md) if md else 0
        if nbytes:
            self._scratchpads[primitive.value] = (md, nbytes)

    def layout(self, descriptor, query, plain_md, into_kernel, index=0) -> Layout:
        layout = Layout(self.library, descriptor, query, plain_md, into_kernel, index)
        if layout.reorder is not None:
            self._descriptors.append(layout.reorder[0])
            self._primitives.append(layout.reorder[1])
            self._note_scratchpad(*layout.reorder)
        return layout

    def __del__(self):
        dnnl = self.library.dnnl
        for memory in self._memories.values():
            dnnl.dnnl_memory_destroy(memory)
        for primitive in self._primitives:
            dnnl.dnnl_primitive_destroy(primitive)
        for descriptor in self._descriptors:
            dnnl.dnnl_primitive_desc_destroy(descriptor)
        for md in self._owned_mds:
            dnnl.dnnl_memory_desc_destroy(md)

    # execution
    def run(self, primitive, arguments) -> None:
        """Execute ``primitive`` on ``(argument, memory descriptor, array)`` triples."""
        library = self.library
        ident = threading.get_ident()
        scratchpad = self._scratchpads.get(primitive.value)
        if scratchpad is not None:  # this thread's own buffer (see _Library)
            buffer = self._scratch_buffers.get((ident, primitive.value))
            if buffer is None:
                buffer = self._scratch_buffers[ident, primitive.value] = aligned_empty(
                    scratchpad[1]
                )
            arguments = [*arguments, (ARG_SCRATCHPAD, scratchpad[0], buffer)]
        pairs = (ExecArg * len(arguments))()
        for index, (argument, md, array) in enumerate(arguments):
            key = (ident, argument, md.value if isinstance(md, Pointer) else md)
            memory = self._memories.get(key)
            pointer = Pointer(array.ctypes.data)
            if memory is None:
                memory = Pointer()
                library.call(
                    "dnnl_memory_create", ctypes.byref(memory), md, library.engine, pointer
                )
                self._memories[key] = memory
            else:
                library.call("dnnl_memory_set_data_handle", memory, pointer)
            pairs[index].arg = argument
            pairs[index].memory = memory
        stream = _stream(library)
        library.call("dnnl_primitive_execute", primitive, stream, len(arguments), pairs)
        library.call("dnnl_stream_wait", stream)

    def into(self, layout: Layout, array: np.ndarray) -> tuple:
        """``(md, array)`` of ``array`` in the kernel's layout (reordered when it differs)."""
        if not layout.reordered:
            return layout.plain_md, array
        buffer = aligned_empty(layout.nbytes)
        self.run(
            layout.reorder[1],
            [(ARG_FROM, layout.plain_md, array), (ARG_TO, layout.kernel_md, buffer)],
        )
        return layout.kernel_md, buffer

    def result(self, layout: Layout, out: np.ndarray) -> tuple:
        """``(md, array)`` the kernel writes: ``out`` itself, or a buffer to reorder into it."""
        if not layout.reordered:
            return layout.plain_md, out
        return layout.kernel_md, aligned_empty(layout.nbytes)

    def out_of(self, layout: Layout, written: np.ndarray, out: np.ndarray) -> None:
        if layout.reordered:
            self.run(
                layout.reorder[1],
                [(ARG_FROM, layout.kernel_md, written), (ARG_TO, layout.plain_md, out)],
            )
