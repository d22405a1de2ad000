"""2-d convolutions by oneDNN's kernels (float32, CPU), where its library is installed.

Why: im2col plus OpenBLAS's GEMMs cannot reach PyTorch's convolution speed on the bench
machine. PyTorch runs its CPU convolutions through oneDNN (formerly MKL-DNN, which BigDL's
own ``mkldnn`` engine used too), whose JIT-compiled direct convolutions run at the core's
peak: ~99 GFLOP/s a thread for the CIFAR CNN's second layer, where our im2col tiles reached
~73. Forward plus both gradients of that layer, (64, 32, 32, 32) -> 32 channels, 3x3, at
two threads: 20 ms here against 34.8 by im2col (2026-11-25, AMD EPYC, 2 cores). The results
equal PyTorch's to float32 rounding.

How: oneDNN's C API through ``ctypes`` (oneDNN 3.x; the ``onednn-cpu-gomp`` wheel, a
dependency on Linux x86-64, puts ``libdnnl.so.3`` in ``<prefix>/lib``;
``BIGDL_PY_ONEDNN_LIBRARY`` names another file). One :class:`_Convolution` per geometry
(input and weight shapes, stride, padding, dilation, groups) holds the forward,
input-gradient and weight-gradient primitives. oneDNN picks its own (blocked) layouts for
the kernels and we reorder our NCHW arrays into them and back, in buffers NumPy allocates,
so the step's traced peak memory counts them. Nothing is kept from the forward for the
backward but the input and weight the autograd node keeps anyway.

Threads: every primitive runs on ONE OpenMP thread, and ``conv_tiles.for_each_tile``
shares the batch out among our threads (one tile of samples each; ctypes lets the GIL go
during each call), as the im2col route does. Why not oneDNN's own OpenMP team:
- an idle libgomp thread spins after each parallel region (~300,000 iterations by
  default) and on two cores takes the core from the threads of the ops that follow: the
  CIFAR CNN's step at two threads took 93 ms on a team against 68 with
  ``GOMP_SPINCOUNT=0``; the spin count is read from the environment once per process, and
  PyTorch ships a ``libgomp.so.1`` that libdnnl binds to when torch was imported first;
- libgomp is not fork-safe: a child forked from a process that ran a team hangs in its
  own first team (tried with this wheel), and one-task's replicas are forked children.
The OpenMP setting of the calling thread is restored after each call (the runtime may be
PyTorch's). Each thread passes its own scratch space to the primitives it runs (oneDNN's
user scratchpad mode): with the library's own, a primitive may run only in the thread that
made it, and never twice at once. The tiles cost little: that layer's forward took 7.4 ms
in two tiles against 6.2 on a two-thread team.

When it is not used: float64 and float16 (oneDNN's CPU convolutions are float32 and
low-precision only), CuPy arrays, empty batches, ``BIGDL_PY_ONEDNN=0`` in the environment,
no library, and any geometry whose primitive oneDNN declines to create. Those take
``conv.py``'s im2col route, the reference the tests compare this one with.
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

from bigdl_py.autograd.ops.conv_tiles import (
    MIN_THREADED_MULTIPLY_ADDS,
    for_each_tile,
    worker_count,
)

SWITCH_VARIABLE = "BIGDL_PY_ONEDNN"
LIBRARY_VARIABLE = "BIGDL_PY_ONEDNN_LIBRARY"

# oneDNN 3.x C API constants (dnnl_types.h, dnnl_common_types.h).
_CPU_ENGINE = 1
_F32 = 3
_FORMAT_ANY = 1
_FORWARD_TRAINING = 64
_CONVOLUTION_DIRECT = 1
_STREAM_IN_ORDER = 1
_QUERY_IMPL_INFO = 8
_QUERY_SRC, _QUERY_DIFF_SRC, _QUERY_WEIGHTS, _QUERY_DIFF_WEIGHTS = 129, 130, 131, 132
_QUERY_DST, _QUERY_DIFF_DST = 133, 134
_QUERY_SCRATCHPAD = 136
_SCRATCHPAD_MODE_USER = 1
_ARG_SRC, _ARG_DST, _ARG_WEIGHTS, _ARG_BIAS = 1, 17, 33, 41
_ARG_DIFF_SRC, _ARG_DIFF_DST, _ARG_DIFF_WEIGHTS, _ARG_DIFF_BIAS = 129, 145, 161, 169
_ARG_FROM, _ARG_TO = 1, 17
_ARG_SCRATCHPAD = 80
_STATUS_NAMES = {
    1: "out of memory",
    2: "invalid arguments",
    3: "unimplemented",
    5: "runtime error",
    6: "not required",
}

_Pointer = ctypes.c_void_p
_Dims = ctypes.c_int64 * 12  # dnnl_dims_t: DNNL_MAX_NDIMS int64s


class _ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", _Pointer)]


class OneDNNError(RuntimeError):
    """A oneDNN call returned an error status."""


class _Library:
    """libdnnl and the libgomp it runs on, with the argument types of the calls we make."""

    def __init__(self, path: str) -> None:
        self.dnnl = ctypes.CDLL(path)
        # The OpenMP runtime libdnnl was linked with, already loaded by the line above.
        self.gomp = ctypes.CDLL("libgomp.so.1")
        signatures = {
            "dnnl_engine_create": [_Pointer, ctypes.c_int, ctypes.c_size_t],
            "dnnl_stream_create": [_Pointer, _Pointer, ctypes.c_uint],
            "dnnl_stream_wait": [_Pointer],
            "dnnl_memory_desc_create_with_string_tag": [
                _Pointer,
                ctypes.c_int,
                _Pointer,
                ctypes.c_int,
                ctypes.c_char_p,
            ],
            "dnnl_memory_desc_create_with_tag": [
                _Pointer,
                ctypes.c_int,
                _Pointer,
                ctypes.c_int,
                ctypes.c_int,
            ],
            "dnnl_memory_desc_destroy": [_Pointer],
            "dnnl_memory_desc_equal": [_Pointer, _Pointer],
            "dnnl_memory_desc_get_size": [_Pointer],
            "dnnl_memory_create": [_Pointer, _Pointer, _Pointer, _Pointer],
            "dnnl_memory_set_data_handle": [_Pointer, _Pointer],
            "dnnl_memory_destroy": [_Pointer],
            "dnnl_convolution_forward_primitive_desc_create": [_Pointer, _Pointer]
            + [ctypes.c_int] * 2
            + [_Pointer] * 9,
            "dnnl_convolution_backward_data_primitive_desc_create": [_Pointer, _Pointer]
            + [ctypes.c_int]
            + [_Pointer] * 9,
            "dnnl_convolution_backward_weights_primitive_desc_create": [_Pointer, _Pointer]
            + [ctypes.c_int]
            + [_Pointer] * 10,
            "dnnl_reorder_primitive_desc_create": [_Pointer] * 6,
            "dnnl_primitive_desc_query": [_Pointer, ctypes.c_int, ctypes.c_int, _Pointer],
            "dnnl_primitive_desc_query_md": [_Pointer, ctypes.c_int, ctypes.c_int],
            "dnnl_primitive_desc_destroy": [_Pointer],
            "dnnl_primitive_create": [_Pointer, _Pointer],
            "dnnl_primitive_execute": [_Pointer, _Pointer, ctypes.c_int, _Pointer],
            "dnnl_primitive_destroy": [_Pointer],
            "dnnl_primitive_attr_create": [_Pointer],
            "dnnl_primitive_attr_set_scratchpad_mode": [_Pointer, ctypes.c_int],
        }
        for name, argtypes in signatures.items():
            getattr(self.dnnl, name).argtypes = argtypes
        self.dnnl.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
        self.dnnl.dnnl_primitive_desc_query_md.restype = _Pointer
        self.engine = _Pointer()
        self.call("dnnl_engine_create", ctypes.byref(self.engine), _CPU_ENGINE, 0)
        # Every primitive takes its scratch space from the caller: with the library's own
        # (the default), a primitive may run only in the thread that made it, one call at a
        # time, and our tiles run each primitive in whichever thread takes the tile (two
        # threads sharing one made the bias gradient wrong, 2026-11-25).
        self.attributes = _Pointer()
        self.call("dnnl_primitive_attr_create", ctypes.byref(self.attributes))
        self.call("dnnl_primitive_attr_set_scratchpad_mode", self.attributes, _SCRATCHPAD_MODE_USER)

    def call(self, name: str, *args) -> None:
        status = getattr(self.dnnl, name)(*args)
        if status != 0:
            meaning = _STATUS_NAMES.get(status, "unknown status")
            raise OneDNNError(f"oneDNN: {name} failed with status {status} ({meaning})")

    def plain_md(self, shape: tuple[int, ...]) -> _Pointer:
        """A float32 memory descriptor of a C-contiguous array of ``shape``."""
        md = _Pointer()
        tag = "abcdefghijkl"[: len(shape)].encode()
        self.call(
            "dnnl_memory_desc_create_with_string_tag",
            ctypes.byref(md),
            len(shape),
            _Dims(*shape),
            _F32,
            tag,
        )
        return md

    def any_md(self, shape: tuple[int, ...]) -> _Pointer:
        """A float32 memory descriptor whose layout the primitive chooses."""
        md = _Pointer()
        self.call(
            "dnnl_memory_desc_create_with_tag",
            ctypes.byref(md),
            len(shape),
            _Dims(*shape),
            _F32,
            _FORMAT_ANY,
        )
        return md

    def primitive(self, descriptor: _Pointer) -> _Pointer:
        primitive = _Pointer()
        self.call("dnnl_primitive_create", ctypes.byref(primitive), descriptor)
        return primitive

    def reorder(self, source_md, destination_md) -> tuple[_Pointer, _Pointer]:
        """A reorder primitive (and its descriptor) from one layout to another."""
        descriptor = _Pointer()
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

    def implementation(self, descriptor: _Pointer) -> str:
        """oneDNN's name of the kernel a primitive descriptor chose (``jit:avx512_core``)."""
        text = ctypes.c_char_p()
        self.call("dnnl_primitive_desc_query", descriptor, _QUERY_IMPL_INFO, 0, ctypes.byref(text))
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
def _loaded() -> _Library | None:
    """The library, loaded once; None where it is missing or does not load."""
    path = _library_path()
    if path is None:
        return None
    try:
        return _Library(path)
    except (OSError, AttributeError, OneDNNError) as error:  # no libgomp, not 3.x, no engine
        warnings.warn(
            f"bigdl_py: oneDNN's library at {path} does not load ({error}); float32 "
            f"convolutions take the slower im2col route (Debian: apt-get install libgomp1)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def available() -> bool:
    """Whether convolutions may run on oneDNN: the library loads and the switch is not 0."""
    if os.environ.get(SWITCH_VARIABLE, "1").strip() in ("0", "false", "no", "off"):
        return False
    return _loaded() is not None


def applies_to(*arrays) -> bool:
    """Whether these operands take this route: all float32 NumPy arrays, and it is available."""
    for array in arrays:
        if array is not None and (type(array) is not np.ndarray or array.dtype != np.float32):
            return False
    return available()


# --- threads -----------------------------------------------------------------------------------

_local = threading.local()


@contextlib.contextmanager
def _one_openmp_thread(library: _Library):
    """Hold this thread's oneDNN calls to one OpenMP thread inside the block, then restore
    its setting: the batch is shared out by ``conv_tiles``' threads instead (see the module),
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


def _stream(library: _Library) -> _Pointer:
    """This thread's oneDNN stream (streams are not shared between threads)."""
    stream = getattr(_local, "stream", None)
    if stream is None:
        stream = _Pointer()
        library.call("dnnl_stream_create", ctypes.byref(stream), library.engine, _STREAM_IN_ORDER)
        _local.stream = stream
    return stream


# --- one geometry --------------------------------------------------------------------------------


def _aligned_empty(nbytes: int) -> np.ndarray:
    """A float32 buffer of at least ``nbytes`` bytes starting on a 64-byte boundary."""
    raw = np.empty(nbytes // 4 + 16, dtype=np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip : skip + -(-nbytes // 4)]


class _Layout:
    """How one operand reaches a kernel: as our C-contiguous array, or through a buffer in
    the kernel's own layout and a reorder into it (``into_kernel``) or out of it."""

    def __init__(self, library: _Library, descriptor, query: int, plain_md, into_kernel: bool):
        self.plain_md = plain_md
        self.kernel_md = library.dnnl.dnnl_primitive_desc_query_md(descriptor, query, 0)
        self.reordered = not library.dnnl.dnnl_memory_desc_equal(self.kernel_md, plain_md)
        self.reorder = None
        if self.reordered:
            self.nbytes = library.dnnl.dnnl_memory_desc_get_size(self.kernel_md)
            pair = (plain_md, self.kernel_md) if into_kernel else (self.kernel_md, plain_md)
            self.reorder = library.reorder(*pair)

    def same_as(self, other: _Layout, library: _Library) -> bool:
        return bool(library.dnnl.dnnl_memory_desc_equal(self.kernel_md, other.kernel_md))


class _Convolution:
    """oneDNN's primitives for one convolution geometry (the backward ones made on first use)."""

    def __init__(
        self,
        library,
        x_shape,
        weight_shape,
        with_bias,
        stride,
        padding,
        dilation,
        groups,
        out_shape,
    ):
        self.library = library
        self.x_shape = tuple(x_shape)
        self.with_bias = with_bias
        self._owned_mds: list[_Pointer] = []
        self._descriptors: list[_Pointer] = []
        self._primitives: list[_Pointer] = []
        self._memories: dict = {}
        # primitive -> (scratchpad md, bytes); (thread, primitive) -> that thread's buffer
        self._scratchpads: dict = {}
        self._scratch_buffers: dict = {}
        kernel_shape = tuple(weight_shape)
        if groups > 1:  # oneDNN's grouped weights: (G, O/G, C/G, KH, KW)
            kernel_shape = (groups, weight_shape[0] // groups) + tuple(weight_shape[1:])
        self.x_md = self._own(library.plain_md(tuple(x_shape)))
        self.weight_md = self._own(library.plain_md(kernel_shape))
        self.bias_md = self._own(library.plain_md((weight_shape[0],))) if with_bias else None
        self.y_md = self._own(library.plain_md(tuple(out_shape)))
        x_any = self._own(library.any_md(tuple(x_shape)))
        weight_any = self._own(library.any_md(kernel_shape))
        y_any = self._own(library.any_md(tuple(out_shape)))
        padding_after = [
            (out_shape[2 + axis] - 1) * stride[axis]
            + (weight_shape[2 + axis] - 1) * dilation[axis]
            + 1
            - x_shape[2 + axis]
            - padding[axis]
            for axis in (0, 1)
        ]
        # oneDNN counts dilation from 0 (no gaps) and takes the padding after each axis
        # explicitly: what PyTorch's floor leaves unread of the last window (may be < 0).
        self.settings = (
            _Dims(*stride),
            _Dims(*(d - 1 for d in dilation)),
            _Dims(*padding),
            _Dims(*padding_after),
        )
        self.anys = (x_any, weight_any, y_any)
        forward = self._descriptor(
            "dnnl_convolution_forward_primitive_desc_create",
            _FORWARD_TRAINING,
            _CONVOLUTION_DIRECT,
            x_any,
            weight_any,
            self.bias_md,
            y_any,
            *self.settings,
            library.attributes,
        )
        self.forward_descriptor = forward
        self.forward_primitive = self._primitive(forward)
        self.forward_x = self._layout(forward, _QUERY_SRC, self.x_md, True)
        self.forward_weight = self._layout(forward, _QUERY_WEIGHTS, self.weight_md, True)
        self.forward_y = self._layout(forward, _QUERY_DST, self.y_md, False)
        self._backward_lock = threading.Lock()
        self._backward_ready = False

    # ownership, so that __del__ gives everything back to oneDNN
    def _own(self, md):
        self._owned_mds.append(md)
        return md

    def _descriptor(self, function: str, *args) -> _Pointer:
        descriptor = _Pointer()
        self.library.call(function, ctypes.byref(descriptor), self.library.engine, *args)
        self._descriptors.append(descriptor)
        return descriptor

    def _primitive(self, descriptor) -> _Pointer:
        primitive = self.library.primitive(descriptor)
        self._primitives.append(primitive)
        self._note_scratchpad(descriptor, primitive)
        return primitive

    def _note_scratchpad(self, descriptor, primitive) -> None:
        """Remember the scratch space ``primitive`` wants from its caller (may be none)."""
        dnnl = self.library.dnnl
        md = dnnl.dnnl_primitive_desc_query_md(descriptor, _QUERY_SCRATCHPAD, 0)
        nbytes = dnnl.dnnl_memory_desc_get_size(md) if md else 0
        if nbytes:
            self._scratchpads[primitive.value] = (md, nbytes)

    def _layout(self, descriptor, query, plain_md, into_kernel) -> _Layout:
        layout = _Layout(self.library, descriptor, query, plain_md, into_kernel)
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

    def make_backward(self) -> None:
        """Make the gradients' primitives (once; the first backward of any thread), on one
        OpenMP thread like every primitive here."""
        with self._backward_lock, _one_openmp_thread(self.library):
            if self._backward_ready:
                return
            x_any, weight_any, y_any = self.anys
            data = self._descriptor(
                "dnnl_convolution_backward_data_primitive_desc_create",
                _CONVOLUTION_DIRECT,
                x_any,
                weight_any,
                y_any,
                *self.settings,
                self.forward_descriptor,
                self.library.attributes,
            )
            weights = self._descriptor(
                "dnnl_convolution_backward_weights_primitive_desc_create",
                _CONVOLUTION_DIRECT,
                x_any,
                weight_any,
                self.bias_md,
                y_any,
                *self.settings,
                self.forward_descriptor,
                self.library.attributes,
            )
            self.data_primitive = self._primitive(data)
            self.weights_primitive = self._primitive(weights)
            self.data_grad = self._layout(data, _QUERY_DIFF_DST, self.y_md, True)
            self.data_weight = self._layout(data, _QUERY_WEIGHTS, self.weight_md, True)
            self.data_x = self._layout(data, _QUERY_DIFF_SRC, self.x_md, False)
            self.weights_x = self._layout(weights, _QUERY_SRC, self.x_md, True)
            self.weights_grad = self._layout(weights, _QUERY_DIFF_DST, self.y_md, True)
            self.weights_weight = self._layout(weights, _QUERY_DIFF_WEIGHTS, self.weight_md, False)
            self.data_descriptor, self.weights_descriptor = data, weights
            self._backward_ready = True

    # execution
    def _run(self, primitive, arguments) -> None:
        """Execute ``primitive`` on ``(argument, memory descriptor, array)`` triples."""
        library = self.library
        ident = threading.get_ident()
        scratchpad = self._scratchpads.get(primitive.value)
        if scratchpad is not None:  # this thread's own buffer (see _Library)
            buffer = self._scratch_buffers.get((ident, primitive.value))
            if buffer is None:
                buffer = self._scratch_buffers[ident, primitive.value] = _aligned_empty(
                    scratchpad[1]
                )
            arguments = [*arguments, (_ARG_SCRATCHPAD, scratchpad[0], buffer)]
        pairs = (_ExecArg * len(arguments))()
        for index, (argument, md, array) in enumerate(arguments):
            key = (ident, argument, md.value if isinstance(md, _Pointer) else md)
            memory = self._memories.get(key)
            pointer = _Pointer(array.ctypes.data)
            if memory is None:
                memory = _Pointer()
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

    def _into(self, layout: _Layout, array: np.ndarray) -> tuple:
        """``(md, array)`` of ``array`` in the kernel's layout (reordered when it differs)."""
        if not layout.reordered:
            return layout.plain_md, array
        buffer = _aligned_empty(layout.nbytes)
        self._run(
            layout.reorder[1],
            [(_ARG_FROM, layout.plain_md, array), (_ARG_TO, layout.kernel_md, buffer)],
        )
        return layout.kernel_md, buffer

    def _result(self, layout: _Layout, out: np.ndarray) -> tuple:
        """``(md, array)`` the kernel writes: ``out`` itself, or a buffer to reorder into it."""
        if not layout.reordered:
            return layout.plain_md, out
        return layout.kernel_md, _aligned_empty(layout.nbytes)

    def _out_of(self, layout: _Layout, written: np.ndarray, out: np.ndarray) -> None:
        if layout.reordered:
            self._run(
                layout.reorder[1],
                [(_ARG_FROM, layout.kernel_md, written), (_ARG_TO, layout.plain_md, out)],
            )

    def forward(self, x, weight, bias, out) -> None:
        x_md, x_kernel = self._into(self.forward_x, x)
        weight_md, weight_kernel = self._into(self.forward_weight, weight)
        y_md, y_kernel = self._result(self.forward_y, out)
        arguments = [
            (_ARG_SRC, x_md, x_kernel),
            (_ARG_WEIGHTS, weight_md, weight_kernel),
            (_ARG_DST, y_md, y_kernel),
        ]
        if self.with_bias:
            arguments.append((_ARG_BIAS, self.bias_md, bias))
        self._run(self.forward_primitive, arguments)
        self._out_of(self.forward_y, y_kernel, out)

    def input_gradient(self, grad, weight, grad_x, grad_in_kernel=None) -> None:
        self.make_backward()
        grad_md, grad_kernel = grad_in_kernel or self._into(self.data_grad, grad)
        weight_md, weight_kernel = self._into(self.data_weight, weight)
        x_md, x_kernel = self._result(self.data_x, grad_x)
        self._run(
            self.data_primitive,
            [
                (_ARG_DIFF_DST, grad_md, grad_kernel),
                (_ARG_WEIGHTS, weight_md, weight_kernel),
                (_ARG_DIFF_SRC, x_md, x_kernel),
            ],
        )
        self._out_of(self.data_x, x_kernel, grad_x)

    def weight_gradient(self, x, grad, grad_weight, grad_bias):
        """Writes the gradients of the weight and (with a bias) of the bias; returns the
        grad in the kernel's layout when the input gradient's kernel wants the same one."""
        self.make_backward()
        x_md, x_kernel = self._into(self.weights_x, x)
        grad_in_kernel = self._into(self.weights_grad, grad)
        weight_md, weight_kernel = self._result(self.weights_weight, grad_weight)
        arguments = [
            (_ARG_SRC, x_md, x_kernel),
            (_ARG_DIFF_DST, *grad_in_kernel),
            (_ARG_DIFF_WEIGHTS, weight_md, weight_kernel),
        ]
        if self.with_bias:
            arguments.append((_ARG_DIFF_BIAS, self.bias_md, grad_bias))
        self._run(self.weights_primitive, arguments)
        self._out_of(self.weights_weight, weight_kernel, grad_weight)
        return grad_in_kernel if self.weights_grad.same_as(self.data_grad, self.library) else None


# --- the cache of geometries -------------------------------------------------------------------

# Geometries kept (most recently made last). A model has a few per layer (the last, smaller
# batch of an epoch, evaluation batches); beyond this the oldest are dropped.
MAX_GEOMETRIES = 256
_geometries: dict = {}
_geometries_lock = threading.Lock()


def _convolution(x_shape, weight_shape, with_bias, stride, padding, dilation, groups, out_shape):
    """The cached one-thread :class:`_Convolution` of this geometry, or None if oneDNN
    declines it."""
    key = (tuple(x_shape), tuple(weight_shape), with_bias, stride, padding, dilation, groups)
    found = _geometries.get(key, False)
    if found is not False:
        return found
    library = _loaded()
    # oneDNN's kernels fix how they share out the work (their team size) when the primitive
    # is made: one thread, whichever thread makes it.
    try:
        with _one_openmp_thread(library):
            made = _Convolution(library, *key, tuple(out_shape))
    except OneDNNError:
        made = None  # e.g. a geometry no kernel implements: im2col takes it
    with _geometries_lock:
        if len(_geometries) >= MAX_GEOMETRIES:
            _geometries.pop(next(iter(_geometries)))
        _geometries[key] = made
    return made


def _tile_shape(shape, start: int, stop: int) -> tuple[int, ...]:
    return (stop - start,) + tuple(shape[1:])


def _tile_convolution(x_shape, weight_shape, settings, out_shape, start, stop) -> _Convolution:
    """The geometry of tile ``[start, stop)``; its first tile's was taken, so oneDNN takes
    this one too (the batch size decides no kernel's availability)."""
    convolution = _convolution(
        _tile_shape(x_shape, start, stop),
        weight_shape,
        *settings,
        _tile_shape(out_shape, start, stop),
    )
    if convolution is None:
        raise OneDNNError(
            f"oneDNN declined a tile of {stop - start} samples of a convolution it took "
            f"for another batch size (input {tuple(x_shape)}, weight {tuple(weight_shape)})"
        )
    return convolution


def _tiles(batch: int, multiply_adds: int, workers: int) -> int:
    """Samples per tile: the batch in one tile per thread, or whole when it is too small
    to share (``conv_tiles.MIN_THREADED_MULTIPLY_ADDS``)."""
    if workers <= 1 or batch < 2 or multiply_adds < MIN_THREADED_MULTIPLY_ADDS:
        return batch
    return -(-batch // workers)


def forward(x, weight, bias, stride, padding, dilation, groups, out_shape):
    """The convolution's output, or None when oneDNN does not take this geometry."""
    batch = x.shape[0]
    if batch == 0:
        return None  # an empty batch: im2col's route gives the empty output
    multiply_adds = int(np.prod(out_shape)) * int(np.prod(weight.shape[1:]))
    size = _tiles(batch, multiply_adds, worker_count())
    geometry = (bias is not None, stride, padding, dilation, groups)
    first = _convolution(
        _tile_shape(x.shape, 0, size), weight.shape, *geometry, _tile_shape(out_shape, 0, size)
    )
    if first is None:
        return None
    x = np.ascontiguousarray(x)
    weight = np.ascontiguousarray(weight)
    bias = None if bias is None else np.ascontiguousarray(bias)
    out = np.empty(out_shape, dtype=np.float32)
    library = _loaded()  # the tiles' threads hold their calls to one OpenMP thread

    def work(start, stop, _scratch):
        convolution = _tile_convolution(x.shape, weight.shape, geometry, out_shape, start, stop)
        with _one_openmp_thread(library):
            convolution.forward(x[start:stop], weight, bias, out[start:stop])

    for_each_tile(batch, size, work)
    return out


def backward(x, weight, grad, geometry, with_bias, needs, x_shape=None):
    """``(grad_x, grad_weight, grad_bias)`` of those ``needs`` asks for (input, weight, bias),
    or None when oneDNN does not take this geometry. For the input gradient alone ``x`` may
    be None with its shape in ``x_shape`` (a transposed convolution's forward)."""
    stride, padding, dilation, groups = geometry
    x_shape = tuple(x.shape) if x is not None else tuple(x_shape)
    batch = x_shape[0]
    if batch == 0:
        return None  # im2col's route gives the zero weight and bias gradients
    multiply_adds = grad.size * int(np.prod(weight.shape[1:]))
    size = _tiles(batch, multiply_adds, worker_count())
    settings = (with_bias, stride, padding, dilation, groups)
    first = _convolution(
        _tile_shape(x_shape, 0, size), weight.shape, *settings, _tile_shape(grad.shape, 0, size)
    )
    if first is None:
        return None
    library = _loaded()
    try:
        first.make_backward()
    except OneDNNError:
        return None  # no gradient kernel for this geometry: im2col takes the backward
    if needs[1] or needs[2]:
        x = np.ascontiguousarray(x)
    weight = np.ascontiguousarray(weight)
    grad = np.ascontiguousarray(grad)
    grad_x = np.empty(x_shape, dtype=np.float32) if needs[0] else None

    def work(start, stop, scratch):
        convolution = _tile_convolution(x_shape, weight.shape, settings, grad.shape, start, stop)
        with _one_openmp_thread(library):
            tile_gradients(convolution, start, stop, scratch)

    def tile_gradients(convolution, start, stop, scratch):
        grad_in_kernel = None
        if needs[1] or needs[2]:
            # Each thread sums its tiles' weight gradients in its own buffers.
            tile_weight = np.empty(weight.shape, dtype=np.float32)
            tile_bias = np.empty(weight.shape[0], dtype=np.float32) if with_bias else None
            grad_in_kernel = convolution.weight_gradient(
                x[start:stop], grad[start:stop], tile_weight, tile_bias
            )
            if "weight" in scratch:
                scratch["weight"] += tile_weight
                if with_bias:
                    scratch["bias"] += tile_bias
            else:
                scratch["weight"], scratch["bias"] = tile_weight, tile_bias
        if needs[0]:
            convolution.input_gradient(grad[start:stop], weight, grad_x[start:stop], grad_in_kernel)

    scratches = [scratch for scratch in for_each_tile(batch, size, work) if scratch]
    grad_weight = grad_bias = None
    if scratches:
        grad_weight = scratches[0]["weight"]
        grad_bias = scratches[0]["bias"]
        for scratch in scratches[1:]:
            grad_weight += scratch["weight"]
            if with_bias:
                grad_bias += scratch["bias"]
    return (
        grad_x,
        grad_weight if needs[1] else None,
        grad_bias if with_bias and needs[2] else None,
    )


def implementations(
    x_shape, weight_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1
) -> dict[str, str]:
    """oneDNN's kernel names for a geometry's forward and gradients (for benchmarks' notes)."""
    from bigdl_py.autograd.ops.conv import output_shape

    out_shape = output_shape(x_shape, weight_shape, stride, padding, dilation)
    convolution = _convolution(
        x_shape, weight_shape, False, stride, padding, dilation, groups, out_shape
    )
    if convolution is None:
        return {}
    library = convolution.library
    convolution.make_backward()
    return {
        "forward": library.implementation(convolution.forward_descriptor),
        "input_gradient": library.implementation(convolution.data_descriptor),
        "weight_gradient": library.implementation(convolution.weights_descriptor),
    }
