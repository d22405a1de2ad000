"""2-d convolutions by cuDNN's kernels (CuPy arrays), where its library loads (``cudnn``).

Why: on the GPU our convolutions ran as im2col plus cuBLAS (CuPy 14 has no cuDNN binding),
several kernels and a scratch matrix per op, where PyTorch runs one cuDNN kernel; the
issue's ResNet-18 step took 5.4x PyTorch's at batch 256.

How: one :class:`_Plan` per direction and :class:`Geometry` (the three operands' shapes,
stride, padding, dilation, dtype, TF32 setting, pointer alignment, device), made once and
cached: cuDNN's backend API builds a graph of one convolution operation (forward, data
gradient or weight gradient), its heuristics rank the engines, engines that would break the
TF32 setting are skipped (:func:`usable_engine`), and the first engine that builds becomes
the plan. A call then only packs the three device pointers and a workspace from CuPy's
pool and executes the plan on CuPy's current stream: no host synchronisation, and once
the plan exists nothing that a CUDA-graph capture forbids (a gpu test captures one).
Groups are the shapes' (a weight of ``C/g`` input channels); Conv1d runs as a height-1
Conv2d (``functional_layers.conv1d``), and ConvTranspose2d as the adjoint directions
(``conv_transpose.py``), as with oneDNN.

The functions :func:`forward` and :func:`backward` take the arguments of
``conv_onednn``'s, so ``conv_routes.library_route`` hands either module to the ops.

When it is not used: NumPy arrays, mixed dtypes, empty batches, ``BIGDL_PY_CUDNN=0``, no
cuDNN 9 for CuPy's CUDA, and any geometry cuDNN has no engine for (its reason is kept in
:func:`declined`). Those take ``conv.py``'s im2col route.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from bigdl_py import backend, step_graph
from bigdl_py.autograd.ops import cuda_libraries, cudnn
from bigdl_py.autograd.ops.cudnn import BackendDescriptor, CudnnError

# Each operand's id in the graph, the same in every direction: "x" is the convolution's
# input (its gradient in the data-gradient graph), "y" its output (or that's gradient).
UNIQUE_IDS = {"x": 1, "weight": 2, "y": 3}

# direction -> (operation descriptor type, {operand: attribute}, (conv, alpha, beta) attributes)
_OPERATIONS = {
    "forward": (
        cudnn.CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        {
            "x": cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
            "weight": cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
            "y": cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
        },
        (
            cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
            cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
            cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
        ),
    ),
    "input_gradient": (
        cudnn.CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
        {
            "x": cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
            "weight": cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
            "y": cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
        },
        (
            cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
            cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
            cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
        ),
    ),
    "weight_gradient": (
        cudnn.CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
        {
            "x": cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
            "weight": cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
            "y": cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
        },
        (
            cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
            cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
            cudnn.CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
        ),
    ),
}
HEURISTIC_MODES = (cudnn.CUDNN_HEUR_MODE_A, cudnn.CUDNN_HEUR_MODE_FALLBACK)
MAX_ALIGNMENT = 16  # bytes: the most any engine asks of a pointer


@dataclass(frozen=True)
class Geometry:
    """One 2-d convolution as cuDNN's graph sees it, all operands C-contiguous NCHW:
    ``x (N, C, H, W)``, ``weight (O, C/g, KH, KW)``, ``y (N, O, OH, OW)``."""

    x_shape: tuple
    weight_shape: tuple
    y_shape: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    dtype: str
    tf32: bool
    alignment: int

    def operand_shapes(self) -> dict[str, tuple]:
        return {"x": self.x_shape, "weight": self.weight_shape, "y": self.y_shape}

    def convolution_attributes(self) -> list[tuple[int, int, list]]:
        """``(attribute, type, values)`` of the convolution descriptor: cross-correlation
        (PyTorch's "convolution") in the dtype's accumulation type, PyTorch's padding on
        both sides of each axis (the output's shape says where the floor cuts)."""
        return [
            (
                cudnn.CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
                cudnn.CUDNN_TYPE_DATA_TYPE,
                [cudnn.compute_type(self.dtype)],
            ),
            (
                cudnn.CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                cudnn.CUDNN_TYPE_CONVOLUTION_MODE,
                [cudnn.CUDNN_CROSS_CORRELATION],
            ),
            (cudnn.CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, cudnn.CUDNN_TYPE_INT64, [2]),
            (cudnn.CUDNN_ATTR_CONVOLUTION_DILATIONS, cudnn.CUDNN_TYPE_INT64, list(self.dilation)),
            (
                cudnn.CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
                cudnn.CUDNN_TYPE_INT64,
                list(self.stride),
            ),
            (cudnn.CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, cudnn.CUDNN_TYPE_INT64, list(self.padding)),
            (
                cudnn.CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
                cudnn.CUDNN_TYPE_INT64,
                list(self.padding),
            ),
        ]

    def scaling_type(self) -> int:
        """The type of the operation's alpha and beta: double for float64, else float."""
        if np.dtype(self.dtype) == np.float64:
            return cudnn.CUDNN_TYPE_DOUBLE
        return cudnn.CUDNN_TYPE_FLOAT


def make_geometry(x_shape, weight_shape, y_shape, stride, padding, dilation, dtype, pointers):
    """The :class:`Geometry` of operands at device addresses ``pointers`` (ints), with the
    TF32 setting in force for float32 (other dtypes ignore it, so they share plans)."""
    dtype = np.dtype(dtype)
    return Geometry(
        tuple(int(s) for s in x_shape),
        tuple(int(s) for s in weight_shape),
        tuple(int(s) for s in y_shape),
        tuple(stride),
        tuple(padding),
        tuple(dilation),
        dtype.str,
        dtype == np.float32 and cudnn.tf32_allowed(),
        alignment(pointers, dtype.itemsize),
    )


def alignment(pointers, itemsize: int) -> int:
    """The largest power of two, at most ``MAX_ALIGNMENT`` bytes, dividing every pointer
    (an engine may rely on the alignment a tensor's descriptor promises)."""
    value = MAX_ALIGNMENT
    while value > itemsize and any(p % value for p in pointers):
        value //= 2
    return value


def usable_engine(notes, dtype, tf32: bool) -> bool:
    """Whether an engine with these numerical notes keeps the precision asked for: never
    one that converts its inputs down, and for float32 without TF32 none on tensor cores
    (which for float32 means TF32). PyTorch's cuDNN convolutions filter the same way."""
    if cudnn.CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS in notes:
        return False
    if np.dtype(dtype) == np.float32 and not tf32:
        return cudnn.CUDNN_NUMERICAL_NOTE_TENSOR_CORE not in notes
    return True


class _Plan:
    """cuDNN's execution plan of one direction of one geometry, and the descriptors it
    was built from (kept alive with it)."""

    def __init__(self, library, direction: str, geometry: Geometry) -> None:
        self.library = library
        handle = library.handle()
        kind, operand_attributes, (conv_attribute, alpha, beta) = _OPERATIONS[direction]
        data_type = cudnn.DATA_TYPES[np.dtype(geometry.dtype)]
        self.tensors = {}
        for operand, shape in geometry.operand_shapes().items():
            tensor = BackendDescriptor(library, cudnn.CUDNN_BACKEND_TENSOR_DESCRIPTOR)
            tensor.set(cudnn.CUDNN_ATTR_TENSOR_DATA_TYPE, cudnn.CUDNN_TYPE_DATA_TYPE, [data_type])
            tensor.set(cudnn.CUDNN_ATTR_TENSOR_DIMENSIONS, cudnn.CUDNN_TYPE_INT64, list(shape))
            tensor.set(
                cudnn.CUDNN_ATTR_TENSOR_STRIDES,
                cudnn.CUDNN_TYPE_INT64,
                list(cudnn.contiguous_strides(shape)),
            )
            tensor.set(
                cudnn.CUDNN_ATTR_TENSOR_UNIQUE_ID, cudnn.CUDNN_TYPE_INT64, [UNIQUE_IDS[operand]]
            )
            tensor.set(
                cudnn.CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
                cudnn.CUDNN_TYPE_INT64,
                [geometry.alignment],
            )
            self.tensors[operand] = tensor.finalize()
        self.convolution = BackendDescriptor(library, cudnn.CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)
        for attribute, kind_of_value, values in geometry.convolution_attributes():
            self.convolution.set(attribute, kind_of_value, values)
        self.convolution.finalize()
        self.operation = BackendDescriptor(library, kind)
        for operand, attribute in operand_attributes.items():
            self.operation.set(
                attribute, cudnn.CUDNN_TYPE_BACKEND_DESCRIPTOR, [self.tensors[operand]]
            )
        self.operation.set(conv_attribute, cudnn.CUDNN_TYPE_BACKEND_DESCRIPTOR, [self.convolution])
        self.operation.set(alpha, geometry.scaling_type(), [1.0])
        self.operation.set(beta, geometry.scaling_type(), [0.0])
        self.operation.finalize()
        self.graph = BackendDescriptor(library, cudnn.CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)
        self.graph.set(cudnn.CUDNN_ATTR_OPERATIONGRAPH_HANDLE, cudnn.CUDNN_TYPE_HANDLE, [handle])
        self.graph.set(
            cudnn.CUDNN_ATTR_OPERATIONGRAPH_OPS,
            cudnn.CUDNN_TYPE_BACKEND_DESCRIPTOR,
            [self.operation],
        )
        self.graph.finalize()
        self.plan = self._first_engine_that_builds(handle, geometry)
        (self.workspace_bytes,) = self.plan.get(
            cudnn.CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, cudnn.CUDNN_TYPE_INT64, 1
        )

    def _first_engine_that_builds(self, handle, geometry: Geometry) -> BackendDescriptor:
        """The plan of the best-ranked engine that keeps the precision asked for and
        builds; heuristics mode A first, then cuDNN's fallback list."""
        reasons = []
        for mode in HEURISTIC_MODES:
            try:
                heuristics = BackendDescriptor(
                    self.library, cudnn.CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR
                )
                heuristics.set(
                    cudnn.CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                    cudnn.CUDNN_TYPE_BACKEND_DESCRIPTOR,
                    [self.graph],
                )
                heuristics.set(cudnn.CUDNN_ATTR_ENGINEHEUR_MODE, cudnn.CUDNN_TYPE_HEUR_MODE, [mode])
                heuristics.finalize()
                configurations = heuristics.get_descriptors(
                    cudnn.CUDNN_ATTR_ENGINEHEUR_RESULTS, cudnn.CUDNN_BACKEND_ENGINECFG_DESCRIPTOR
                )
            except CudnnError as error:
                reasons.append(f"heuristics {mode}: {error}")
                continue
            for configuration in configurations:
                try:
                    (engine,) = configuration.get_descriptors(
                        cudnn.CUDNN_ATTR_ENGINECFG_ENGINE,
                        cudnn.CUDNN_BACKEND_ENGINE_DESCRIPTOR,
                        count=1,
                    )
                    notes = engine.get(
                        cudnn.CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                        cudnn.CUDNN_TYPE_NUMERICAL_NOTE,
                        cudnn.CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
                    )
                    if not usable_engine(notes, geometry.dtype, geometry.tf32):
                        continue
                    plan = BackendDescriptor(
                        self.library, cudnn.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR
                    )
                    plan.set(
                        cudnn.CUDNN_ATTR_EXECUTION_PLAN_HANDLE, cudnn.CUDNN_TYPE_HANDLE, [handle]
                    )
                    plan.set(
                        cudnn.CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                        cudnn.CUDNN_TYPE_BACKEND_DESCRIPTOR,
                        [configuration],
                    )
                    return plan.finalize()
                except CudnnError as error:
                    reasons.append(str(error))
        raise CudnnError(
            "no cuDNN engine builds this convolution"
            + (f" ({reasons[-1]})" if reasons else " (heuristics found none)"),
            0,
        )

    def run(self, x, weight, y) -> None:
        """Execute on CuPy arrays ``x``, ``weight``, ``y`` (the operands' roles as in
        :data:`UNIQUE_IDS`), on the current stream."""
        library = self.library
        workspace = (
            cuda_libraries.device_buffer(self.workspace_bytes) if self.workspace_bytes else None
        )
        pack = BackendDescriptor(library, cudnn.CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
        pack.set(
            cudnn.CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
            cudnn.CUDNN_TYPE_INT64,
            [UNIQUE_IDS["x"], UNIQUE_IDS["weight"], UNIQUE_IDS["y"]],
        )
        pack.set(
            cudnn.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            cudnn.CUDNN_TYPE_VOID_PTR,
            [int(x.data.ptr), int(weight.data.ptr), int(y.data.ptr)],
        )
        pack.set(
            cudnn.CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
            cudnn.CUDNN_TYPE_VOID_PTR,
            [None if workspace is None else int(workspace.data.ptr)],
        )
        pack.finalize()
        library.call("cudnnBackendExecute", library.handle(), self.plan.pointer, pack.pointer)
        del workspace  # back to CuPy's pool, stream-ordered: later work only reuses it


# --- the cache of plans ----------------------------------------------------------------------

# Plans kept (most recently made last); beyond this the oldest are dropped. A model has a
# few per layer and direction (the last, smaller batch of an epoch; evaluation batches).
MAX_PLANS = 512
_plans: dict = {}
_declined: dict = {}
_plans_lock = threading.Lock()


def declined() -> dict:
    """``{(direction, geometry): reason}`` of every geometry cuDNN declined (for tests and
    for finding out why a layer runs on the im2col route)."""
    return dict(_declined)


def _plan(direction: str, geometry: Geometry) -> _Plan | None:
    """The cached plan of ``direction`` for ``geometry``, or None where cuDNN declines it."""
    key = (direction, geometry, cuda_libraries.current_device())
    found = _plans.get(key, False)
    if found is not False:
        step_graph.keep_alive(found)  # a captured graph uses its buffers after an eviction
        return found
    try:
        made = _Plan(cudnn.loaded(), direction, geometry)
    except CudnnError as error:
        made = None
        _declined[direction, geometry] = str(error)
    with _plans_lock:
        if len(_plans) >= MAX_PLANS:
            _plans.pop(next(iter(_plans)))
        _plans[key] = made
    step_graph.keep_alive(made)
    return made


def _run(direction, x, weight, y, stride, padding, dilation) -> bool:
    """Run ``direction`` on C-contiguous operands; False where cuDNN declines it."""
    pointers = (_address(x), _address(weight), _address(y))
    geometry = make_geometry(
        x.shape, weight.shape, y.shape, stride, padding, dilation, x.dtype, pointers
    )
    plan = _plan(direction, geometry)
    if plan is None:
        return False
    plan.run(x, weight, y)
    return True


def forward(x, weight, bias, stride, padding, dilation, groups, out_shape):
    """The convolution's output ``(N, O, OH, OW)`` with the bias added, or None when cuDNN
    does not take this geometry (``groups`` is the shapes'; kept for ``conv_onednn``'s
    signature)."""
    del groups
    if x.shape[0] == 0:
        return None  # an empty batch: im2col's route gives the empty output
    xp = backend.array_module(x)
    x, weight = xp.ascontiguousarray(x), xp.ascontiguousarray(weight)
    out = xp.empty(tuple(out_shape), dtype=x.dtype)
    if not _run("forward", x, weight, out, stride, padding, dilation):
        return None
    if bias is not None:
        out += bias.reshape(1, -1, 1, 1)
    return out


def backward(x, weight, grad, geometry, with_bias, needs, x_shape=None):
    """``(grad_x, grad_weight, grad_bias)`` of those ``needs`` asks for (input, weight,
    bias), or None when cuDNN does not take this geometry. For the input gradient alone
    ``x`` may be None with its shape in ``x_shape`` (a transposed convolution's forward)."""
    stride, padding, dilation, _groups = geometry
    x_shape = tuple(x.shape) if x is not None else tuple(x_shape)
    if x_shape[0] == 0:
        return None  # im2col's route gives the zero weight and bias gradients
    xp = backend.array_module(grad)
    weight, grad = xp.ascontiguousarray(weight), xp.ascontiguousarray(grad)
    grad_x = grad_weight = grad_bias = None
    if needs[0]:
        grad_x = xp.empty(x_shape, dtype=grad.dtype)
        if not _run("input_gradient", grad_x, weight, grad, stride, padding, dilation):
            return None
    if needs[1]:
        x = xp.ascontiguousarray(x)
        grad_weight = xp.empty(weight.shape, dtype=grad.dtype)
        if not _run("weight_gradient", x, grad_weight, grad, stride, padding, dilation):
            return None
    if with_bias and needs[2]:
        grad_bias = grad.sum(axis=(0, 2, 3))
    return grad_x, grad_weight, grad_bias


def _address(array) -> int:
    """A CuPy array's device address (the CPU tests hand in host arrays instead)."""
    return int(array.data.ptr)
