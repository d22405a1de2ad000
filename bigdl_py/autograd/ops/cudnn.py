"""cuDNN 9 through ``ctypes``: the library, its handles, and the descriptors our routes build.

Why: CuPy 14 dropped its cuDNN binding, so our GPU convolutions ran as im2col plus cuBLAS
and our LSTM as a Python loop of per-step kernels, where PyTorch runs cuDNN's kernels. This
module is the GPU's twin of ``onednn.py``: it finds and loads the library, declares the
calls we make, and says whether the routes may run (``conv_cudnn`` for convolutions,
``nn._rnn_cudnn`` for LSTM and GRU layers); what cuDNN is absent for, or declines, runs on
the CuPy routes, the references the GPU tests compare these with.

Which API, and why ``ctypes`` to ``libcudnn`` rather than the ``nvidia-cudnn-frontend``
package:

- The RNN API (``cudnnRNNForward``, ``cudnnRNNBackwardData_v8``/``Weights_v8``) is only in
  libcudnn's C API: the frontend has no LSTM or GRU. So libcudnn is loaded through ctypes
  in any case, and with one library there is one handle per device and thread, one stream
  binding and one error path for both routes.
- Convolutions use cuDNN's backend ("graph") API, the descriptors and execution plans that
  the frontend itself is a header-only wrapper of: a tensor per operand, a convolution, one
  operation, heuristics, a plan, and per call a variant pack of device pointers. Not the
  legacy ``cudnnConvolutionForward`` family: cuDNN 9's headers mark it deprecated ("use
  graph API instead"), and the plans give what the route needs: TF32 decided per engine
  (numerical notes), workspace sizes known up front, calls that a CUDA graph can capture.
- The frontend's Python package is a compiled extension with its own copy of the C++
  wrapper, its own loading of libcudnn and an API that has changed across its 1.x
  releases; every declaration here is instead checked against the installed headers by the
  CPU test suite (``tests/autograd/ops/test_cuda_declarations.py``).

Where the library comes from (``cuda_libraries``): ``BIGDL_PY_CUDNN_LIBRARY``, then the
``nvidia-cudnn-cu12``/``-cu13`` wheels (``nvidia/cudnn/lib/libcudnn.so.9``), then the system.
It must be cuDNN 9 built for the CUDA major version CuPy runs on. ``BIGDL_PY_CUDNN=0`` turns
the routes off. Workspaces come from CuPy's memory pool; calls run on CuPy's current stream.
"""

from __future__ import annotations

import ctypes
import functools
import os
import warnings

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.ops import cuda_libraries

SWITCH_VARIABLE = "BIGDL_PY_CUDNN"
LIBRARY_VARIABLE = "BIGDL_PY_CUDNN_LIBRARY"
WHEEL_PATHS = ("nvidia/cudnn/lib/libcudnn.so.9", "nvidia/cu13/lib/libcudnn.so.9")
SONAME = "libcudnn.so.9"
MINIMUM_VERSION = 90000  # cudnnGetVersion(): major * 10000 + minor * 100 + patch

# --- constants, named as in cuDNN 9's headers (the CPU tests check each against them) -------
CUDNN_STATUS_SUCCESS = 0
CUDNN_DATA_FLOAT = 0
CUDNN_DATA_DOUBLE = 1
CUDNN_DATA_HALF = 2
CUDNN_DEFAULT_MATH = 0
CUDNN_TENSOR_OP_MATH = 1
CUDNN_FMA_MATH = 3
CUDNN_CROSS_CORRELATION = 1
# backend descriptor types
CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR = 1
CUDNN_BACKEND_ENGINE_DESCRIPTOR = 2
CUDNN_BACKEND_ENGINECFG_DESCRIPTOR = 3
CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR = 4
CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR = 5
CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR = 10
CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR = 11
CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR = 12
CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR = 15
CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR = 16
CUDNN_BACKEND_TENSOR_DESCRIPTOR = 17
# attribute value types
CUDNN_TYPE_HANDLE = 0
CUDNN_TYPE_DATA_TYPE = 1
CUDNN_TYPE_INT64 = 3
CUDNN_TYPE_FLOAT = 4
CUDNN_TYPE_DOUBLE = 5
CUDNN_TYPE_VOID_PTR = 6
CUDNN_TYPE_CONVOLUTION_MODE = 7
CUDNN_TYPE_HEUR_MODE = 8
CUDNN_TYPE_NUMERICAL_NOTE = 11
CUDNN_TYPE_BACKEND_DESCRIPTOR = 15
# attribute names
CUDNN_ATTR_CONVOLUTION_COMP_TYPE = 100
CUDNN_ATTR_CONVOLUTION_CONV_MODE = 101
CUDNN_ATTR_CONVOLUTION_DILATIONS = 102
CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES = 103
CUDNN_ATTR_CONVOLUTION_POST_PADDINGS = 104
CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS = 105
CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS = 106
CUDNN_ATTR_ENGINEHEUR_MODE = 200
CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH = 201
CUDNN_ATTR_ENGINEHEUR_RESULTS = 202
CUDNN_ATTR_ENGINECFG_ENGINE = 300
# The plan's and graph's handle attributes are deprecated in favour of the device
# properties added in 9.8, which older cuDNN 9 releases do not have; every 9.x takes them.
CUDNN_ATTR_EXECUTION_PLAN_HANDLE = 400
CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 401
CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE = 402
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA = 700
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA = 701
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC = 702
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W = 703
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X = 704
CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y = 705
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA = 706
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA = 707
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC = 708
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W = 709
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX = 710
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY = 711
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA = 712
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA = 713
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC = 714
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW = 715
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X = 716
CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY = 717
CUDNN_ATTR_OPERATIONGRAPH_HANDLE = 800
CUDNN_ATTR_OPERATIONGRAPH_OPS = 801
CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT = 900
CUDNN_ATTR_TENSOR_DATA_TYPE = 901
CUDNN_ATTR_TENSOR_DIMENSIONS = 902
CUDNN_ATTR_TENSOR_STRIDES = 903
CUDNN_ATTR_TENSOR_UNIQUE_ID = 906
CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS = 1000
CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS = 1001
CUDNN_ATTR_VARIANT_PACK_WORKSPACE = 1003
CUDNN_ATTR_ENGINE_NUMERICAL_NOTE = 1303
CUDNN_HEUR_MODE_FALLBACK = 2
CUDNN_HEUR_MODE_A = 3
CUDNN_NUMERICAL_NOTE_TENSOR_CORE = 0
CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS = 1
CUDNN_NUMERICAL_NOTE_TYPE_COUNT = 10
# the RNN API
CUDNN_RNN_ALGO_STANDARD = 0
CUDNN_FWD_MODE_INFERENCE = 0
CUDNN_FWD_MODE_TRAINING = 1
CUDNN_LSTM = 2
CUDNN_GRU = 3
CUDNN_RNN_NO_BIAS = 0
CUDNN_RNN_DOUBLE_BIAS = 2
CUDNN_UNIDIRECTIONAL = 0
CUDNN_BIDIRECTIONAL = 1
CUDNN_LINEAR_INPUT = 0
CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED = 0
CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED = 2
CUDNN_RNN_PADDED_IO_ENABLED = 1
CUDNN_WGRAD_MODE_ADD = 0

Pointer = ctypes.c_void_p
_int = ctypes.c_int
_size = ctypes.c_size_t

# name -> (result type, argument types); the CPU tests check each against the headers.
SIGNATURES: dict[str, tuple] = {
    "cudnnGetVersion": (_size, []),
    "cudnnGetCudartVersion": (_size, []),
    "cudnnGetErrorString": (ctypes.c_char_p, [_int]),
    "cudnnCreate": (_int, [Pointer]),
    "cudnnSetStream": (_int, [Pointer, Pointer]),
    "cudnnBackendCreateDescriptor": (_int, [_int, Pointer]),
    "cudnnBackendDestroyDescriptor": (_int, [Pointer]),
    "cudnnBackendFinalize": (_int, [Pointer]),
    "cudnnBackendSetAttribute": (_int, [Pointer, _int, _int, ctypes.c_int64, Pointer]),
    "cudnnBackendGetAttribute": (_int, [Pointer, _int, _int, ctypes.c_int64, Pointer, Pointer]),
    "cudnnBackendExecute": (_int, [Pointer, Pointer, Pointer]),
    "cudnnCreateTensorDescriptor": (_int, [Pointer]),
    "cudnnSetTensorNdDescriptor": (_int, [Pointer, _int, _int, Pointer, Pointer]),
    "cudnnGetTensorNdDescriptor": (_int, [Pointer, _int, Pointer, Pointer, Pointer, Pointer]),
    "cudnnDestroyTensorDescriptor": (_int, [Pointer]),
    "cudnnCreateDropoutDescriptor": (_int, [Pointer]),
    "cudnnSetDropoutDescriptor": (
        _int,
        [Pointer, Pointer, ctypes.c_float, Pointer, _size, ctypes.c_ulonglong],
    ),
    "cudnnDestroyDropoutDescriptor": (_int, [Pointer]),
    "cudnnCreateRNNDescriptor": (_int, [Pointer]),
    "cudnnDestroyRNNDescriptor": (_int, [Pointer]),
    "cudnnSetRNNDescriptor_v8": (
        _int,
        [Pointer] + [_int] * 8 + [ctypes.c_int32] * 4 + [Pointer, ctypes.c_uint32],
    ),
    "cudnnGetRNNWeightSpaceSize": (_int, [Pointer, Pointer, Pointer]),
    "cudnnGetRNNTempSpaceSizes": (_int, [Pointer, Pointer, _int, Pointer, Pointer, Pointer]),
    "cudnnGetRNNWeightParams": (
        _int,
        [Pointer, Pointer, ctypes.c_int32, _size, Pointer, ctypes.c_int32] + [Pointer] * 4,
    ),
    "cudnnCreateRNNDataDescriptor": (_int, [Pointer]),
    "cudnnDestroyRNNDataDescriptor": (_int, [Pointer]),
    "cudnnSetRNNDataDescriptor": (_int, [Pointer] + [_int] * 5 + [Pointer, Pointer]),
    "cudnnRNNForward": (
        _int,
        [Pointer, Pointer, _int] + [Pointer] * 11 + [_size, Pointer] * 3,
    ),
    "cudnnRNNBackwardData_v8": (_int, [Pointer] * 16 + [_size, Pointer] * 3),
    "cudnnRNNBackwardWeights_v8": (
        _int,
        [Pointer, Pointer, _int] + [Pointer] * 7 + [_size, Pointer] * 3,
    ),
}

# The ctypes type of one element of a backend attribute, by attribute type.
_ELEMENT_TYPES = {
    CUDNN_TYPE_HANDLE: Pointer,
    CUDNN_TYPE_DATA_TYPE: _int,
    CUDNN_TYPE_INT64: ctypes.c_int64,
    CUDNN_TYPE_FLOAT: ctypes.c_float,
    CUDNN_TYPE_DOUBLE: ctypes.c_double,
    CUDNN_TYPE_VOID_PTR: Pointer,
    CUDNN_TYPE_CONVOLUTION_MODE: _int,
    CUDNN_TYPE_HEUR_MODE: _int,
    CUDNN_TYPE_NUMERICAL_NOTE: _int,
    CUDNN_TYPE_BACKEND_DESCRIPTOR: Pointer,
}

DATA_TYPES = {
    np.dtype(np.float16): CUDNN_DATA_HALF,
    np.dtype(np.float32): CUDNN_DATA_FLOAT,
    np.dtype(np.float64): CUDNN_DATA_DOUBLE,
}


class CudnnError(RuntimeError):
    """A cuDNN call returned an error status (``status`` holds it)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _Library:
    """libcudnn with the argument types of the calls we make; cuDNN 9 or it refuses."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.cudnn = ctypes.CDLL(path)
        for name, (result, arguments) in SIGNATURES.items():
            function = getattr(self.cudnn, name)  # AttributeError: not this library's
            function.restype = result
            function.argtypes = arguments
        self.version = int(self.cudnn.cudnnGetVersion())
        self.cuda_major = int(self.cudnn.cudnnGetCudartVersion()) // 1000
        if self.version < MINIMUM_VERSION:
            raise RuntimeError(f"cuDNN {self.version} is older than 9")
        self.handles = cuda_libraries.StreamHandles(self._create_handle, self._bind)

    def call(self, name: str, *args) -> None:
        status = getattr(self.cudnn, name)(*args)
        if status != CUDNN_STATUS_SUCCESS:
            meaning = self.cudnn.cudnnGetErrorString(status) or b"unknown status"
            raise CudnnError(f"cuDNN: {name} failed: {meaning.decode()} ({status})", status)

    def _create_handle(self) -> Pointer:
        handle = Pointer()
        self.call("cudnnCreate", ctypes.byref(handle))
        return handle

    def _bind(self, bound: cuda_libraries.BoundHandle, stream: int) -> None:
        self.call("cudnnSetStream", bound.handle, Pointer(stream))

    def handle(self) -> Pointer:
        """This thread's handle for the current device, on CuPy's current stream."""
        return self.handles.current().handle


@functools.cache
def loaded() -> _Library | None:
    """The library, loaded once; None where it is missing, not cuDNN 9, or built for
    another CUDA than CuPy's (a warning names the reason)."""
    paths = cuda_libraries.candidate_paths(
        LIBRARY_VARIABLE, WHEEL_PATHS, SONAME, cuda_libraries.site_directories()
    )
    library, failures = cuda_libraries.load_first(paths, _Library)
    if library is not None:
        try:
            runtime = cuda_libraries.cuda_runtime_major()
        except RuntimeError:  # no CuPy: nothing for the routes to run on
            return None
        if library.cuda_major == runtime:
            return library
        failures.append(
            f"{library.path}: built for CUDA {library.cuda_major}, CuPy runs CUDA {runtime}"
        )
    if library is not None or len(failures) > 1 or os.environ.get(LIBRARY_VARIABLE):
        # Only a library that is there and fails is worth a warning: an install without
        # cuDNN finds nothing (only the bare soname was tried), and the CuPy routes work.
        warnings.warn(
            "bigdl_py: cuDNN 9 does not load (" + "; ".join(failures) + "); convolutions and "
            "LSTM/GRU layers on the GPU take the slower CuPy routes (install the 'gpu' extra "
            "for CUDA 12 or 'gpu-cuda13' for CUDA 13)",
            RuntimeWarning,
            stacklevel=2,
        )
    return None


def switched_on() -> bool:
    """Whether ``BIGDL_PY_CUDNN`` leaves the cuDNN routes on (the default)."""
    return os.environ.get(SWITCH_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


def available() -> bool:
    """Whether the cuDNN routes may run: the switch is on and the library loads."""
    return switched_on() and loaded() is not None


def applies_to(*arrays) -> bool:
    """Whether these operands take a cuDNN route: CuPy arrays of one float dtype (float16,
    float32 or float64; None entries are absent operands), and cuDNN is available."""
    dtype = None
    for array in arrays:
        if array is None:
            continue
        if not backend.is_cupy_array(array) or array.dtype not in DATA_TYPES:
            return False
        if dtype is None:
            dtype = array.dtype
        elif array.dtype != dtype:
            return False
    return dtype is not None and available()


def tf32_allowed() -> bool:
    """Whether float32 convolutions and RNNs may use TF32 (``backend.allow_tf32``)."""
    return backend.tf32_settings()["cudnn"]


def compute_type(dtype) -> int:
    """cuDNN's accumulation type for operands of ``dtype``: float for float16 and float32
    (as PyTorch's convolutions), double for float64."""
    return CUDNN_DATA_DOUBLE if np.dtype(dtype) == np.float64 else CUDNN_DATA_FLOAT


def rnn_math_type(dtype, tf32: bool) -> int:
    """The RNN API's math type, as PyTorch chooses it: tensor cores for float16, FMA only
    for float32 without TF32, cuDNN's default otherwise."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return CUDNN_TENSOR_OP_MATH
    if dtype == np.float32 and not tf32:
        return CUDNN_FMA_MATH
    return CUDNN_DEFAULT_MATH


def contiguous_strides(shape) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


class BackendDescriptor:
    """One backend-API descriptor, destroyed with this object."""

    def __init__(self, library: _Library, kind: int) -> None:
        self.library = library
        self.pointer = Pointer()
        library.call("cudnnBackendCreateDescriptor", kind, ctypes.byref(self.pointer))

    def set(self, name: int, kind: int, values) -> BackendDescriptor:
        """Set attribute ``name`` to ``values`` (a list) of attribute type ``kind``;
        descriptors are given as :class:`BackendDescriptor` objects."""
        values = [v.pointer.value if isinstance(v, BackendDescriptor) else v for v in values]
        array = (_ELEMENT_TYPES[kind] * len(values))(*values)
        self.library.call("cudnnBackendSetAttribute", self.pointer, name, kind, len(values), array)
        return self

    def finalize(self) -> BackendDescriptor:
        self.library.call("cudnnBackendFinalize", self.pointer)
        return self

    def get(self, name: int, kind: int, count: int) -> list:
        """Up to ``count`` elements of attribute ``name`` (of type ``kind``)."""
        array = (_ELEMENT_TYPES[kind] * max(count, 1))()
        returned = ctypes.c_int64()
        self.library.call(
            "cudnnBackendGetAttribute",
            self.pointer,
            name,
            kind,
            count,
            ctypes.byref(returned),
            array,
        )
        return list(array[: returned.value])

    def get_descriptors(self, name: int, kind: int, count: int | None = None) -> list:
        """The descriptors attribute ``name`` holds, each copied into a new descriptor of
        type ``kind`` (the backend API fills descriptors the caller made). Without
        ``count`` the attribute is asked how many it holds first."""
        returned = ctypes.c_int64()
        if count is None:
            self.library.call(
                "cudnnBackendGetAttribute",
                self.pointer,
                name,
                CUDNN_TYPE_BACKEND_DESCRIPTOR,
                0,
                ctypes.byref(returned),
                None,
            )
            count = returned.value
        made = [BackendDescriptor(self.library, kind) for _ in range(count)]
        if made:
            array = (Pointer * len(made))(*[d.pointer.value for d in made])
            self.library.call(
                "cudnnBackendGetAttribute",
                self.pointer,
                name,
                CUDNN_TYPE_BACKEND_DESCRIPTOR,
                len(made),
                ctypes.byref(returned),
                array,
            )
        return made[: returned.value]

    def __del__(self):
        if self.pointer:
            self.library.cudnn.cudnnBackendDestroyDescriptor(self.pointer)


class LegacyDescriptor:
    """A descriptor of the non-graph API (tensor, dropout, RNN, RNN data): made by
    ``cudnnCreate<kind>``, destroyed by ``cudnnDestroy<kind>`` with this object."""

    def __init__(self, library: _Library, kind: str) -> None:
        self.library = library
        self.kind = kind
        self.pointer = Pointer()
        library.call(f"cudnnCreate{kind}", ctypes.byref(self.pointer))

    def __del__(self):
        if self.pointer:
            getattr(self.library.cudnn, f"cudnnDestroy{self.kind}")(self.pointer)


def tensor_descriptor(library: _Library, dtype, shape) -> LegacyDescriptor:
    """A legacy tensor descriptor of a C-contiguous array (the RNN API's states)."""
    descriptor = LegacyDescriptor(library, "TensorDescriptor")
    dims = (ctypes.c_int * len(shape))(*shape)
    strides = (ctypes.c_int * len(shape))(*contiguous_strides(shape))
    library.call(
        "cudnnSetTensorNdDescriptor",
        descriptor.pointer,
        DATA_TYPES[np.dtype(dtype)],
        len(shape),
        dims,
        strides,
    )
    return descriptor
