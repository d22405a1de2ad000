"""2-d convolutions by oneDNN's kernels (float32, CPU), where its library is installed.

Why: im2col plus OpenBLAS's GEMMs cannot reach PyTorch's convolution speed on the bench
machine. PyTorch runs its CPU convolutions through oneDNN, whose JIT-compiled direct
convolutions run at the core's peak: ~99 GFLOP/s a thread for the CIFAR CNN's second layer,
where our im2col tiles reached ~73. Forward plus both gradients of that layer, (64, 32, 32,
32) -> 32 channels, 3x3, at two threads: 20 ms here against 34.8 by im2col (2026-11-25, AMD
EPYC, 2 cores). The results equal PyTorch's to float32 rounding.

How (the library, its threads and scratch space: ``onednn``): one :class:`_Convolution` per
geometry (input and weight shapes, stride, padding, dilation, groups) holds the forward,
input-gradient and weight-gradient primitives. Nothing is kept from the forward for the
backward but the input and weight the autograd node keeps anyway. ``conv_tiles.for_each_tile``
shares the batch out among our threads, one tile of samples each; the tiles cost little:
that layer's forward took 7.4 ms in two tiles against 6.2 on a two-thread OpenMP team.

When it is not used: float64 and float16 (oneDNN's CPU convolutions are float32 and
low-precision only), CuPy arrays, empty batches, ``BIGDL_PY_ONEDNN=0`` in the environment,
no library, and any geometry whose primitive oneDNN declines to create. Those take
``conv.py``'s im2col route, the reference the tests compare this one with.
"""

from __future__ import annotations

import threading

import numpy as np

from bigdl_py.autograd.ops import onednn
from bigdl_py.autograd.ops.conv_tiles import (
    MIN_THREADED_MULTIPLY_ADDS,
    for_each_tile,
    worker_count,
)
from bigdl_py.autograd.ops.onednn import (
    ARG_BIAS,
    ARG_DIFF_BIAS,
    ARG_DIFF_DST,
    ARG_DIFF_SRC,
    ARG_DIFF_WEIGHTS,
    ARG_DST,
    ARG_SRC,
    ARG_WEIGHTS,
    QUERY_DIFF_DST,
    QUERY_DIFF_SRC,
    QUERY_DIFF_WEIGHTS,
    QUERY_DST,
    QUERY_SRC,
    QUERY_WEIGHTS,
    Dims,
    OneDNNError,
    loaded,
    one_openmp_thread,
)


class _Convolution(onednn.PrimitiveSet):
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
        super().__init__(library)
        self.x_shape = tuple(x_shape)
        self.with_bias = with_bias
        kernel_shape = tuple(weight_shape)
        if groups > 1:  # oneDNN's grouped weights: (G, O/G, C/G, KH, KW)
            kernel_shape = (groups, weight_shape[0] // groups) + tuple(weight_shape[1:])
        self.x_md = self.own(library.plain_md(tuple(x_shape)))
        self.weight_md = self.own(library.plain_md(kernel_shape))
        self.bias_md = self.own(library.plain_md((weight_shape[0],))) if with_bias else None
        self.y_md = self.own(library.plain_md(tuple(out_shape)))
        x_any = self.own(library.any_md(tuple(x_shape)))
        weight_any = self.own(library.any_md(kernel_shape))
        y_any = self.own(library.any_md(tuple(out_shape)))
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
            Dims(*stride),
            Dims(*(d - 1 for d in dilation)),
            Dims(*padding),
            Dims(*padding_after),
        )
        self.anys = (x_any, weight_any, y_any)
        forward = self.descriptor(
            "dnnl_convolution_forward_primitive_desc_create",
            onednn.FORWARD_TRAINING,
            onednn.CONVOLUTION_DIRECT,
            x_any,
            weight_any,
            self.bias_md,
            y_any,
            *self.settings,
            library.attributes,
        )
        self.forward_descriptor = forward
        self.forward_primitive = self.primitive(forward)
        self.forward_x = self.layout(forward, QUERY_SRC, self.x_md, True)
        self.forward_weight = self.layout(forward, QUERY_WEIGHTS, self.weight_md, True)
        self.forward_y = self.layout(forward, QUERY_DST, self.y_md, False)
        self._backward_lock = threading.Lock()
        self._backward_ready = False

    def make_backward(self) -> None:
        """Make the gradients' primitives (once; the first backward of any thread), on one
        OpenMP thread like every primitive here."""
        with self._backward_lock, one_openmp_thread(self.library):
            if self._backward_ready:
                return
            x_any, weight_any, y_any = self.anys
            data = self.descriptor(
                "dnnl_convolution_backward_data_primitive_desc_create",
                onednn.CONVOLUTION_DIRECT,
                x_any,
                weight_any,
                y_any,
                *self.settings,
                self.forward_descriptor,
                self.library.attributes,
            )
            weights = self.descriptor(
                "dnnl_convolution_backward_weights_primitive_desc_create",
                onednn.CONVOLUTION_DIRECT,
                x_any,
                weight_any,
                self.bias_md,
                y_any,
                *self.settings,
                self.forward_descriptor,
                self.library.attributes,
            )
            self.data_primitive = self.primitive(data)
            self.weights_primitive = self.primitive(weights)
            self.data_grad = self.layout(data, QUERY_DIFF_DST, self.y_md, True)
            self.data_weight = self.layout(data, QUERY_WEIGHTS, self.weight_md, True)
            self.data_x = self.layout(data, QUERY_DIFF_SRC, self.x_md, False)
            self.weights_x = self.layout(weights, QUERY_SRC, self.x_md, True)
            self.weights_grad = self.layout(weights, QUERY_DIFF_DST, self.y_md, True)
            self.weights_weight = self.layout(weights, QUERY_DIFF_WEIGHTS, self.weight_md, False)
            self.data_descriptor, self.weights_descriptor = data, weights
            self._backward_ready = True

    def forward(self, x, weight, bias, out) -> None:
        x_md, x_kernel = self.into(self.forward_x, x)
        weight_md, weight_kernel = self.into(self.forward_weight, weight)
        y_md, y_kernel = self.result(self.forward_y, out)
        arguments = [
            (ARG_SRC, x_md, x_kernel),
            (ARG_WEIGHTS, weight_md, weight_kernel),
            (ARG_DST, y_md, y_kernel),
        ]
        if self.with_bias:
            arguments.append((ARG_BIAS, self.bias_md, bias))
        self.run(self.forward_primitive, arguments)
        self.out_of(self.forward_y, y_kernel, out)

    def input_gradient(self, grad, weight, grad_x, grad_in_kernel=None) -> None:
        self.make_backward()
        grad_md, grad_kernel = grad_in_kernel or self.into(self.data_grad, grad)
        weight_md, weight_kernel = self.into(self.data_weight, weight)
        x_md, x_kernel = self.result(self.data_x, grad_x)
        self.run(
            self.data_primitive,
            [
                (ARG_DIFF_DST, grad_md, grad_kernel),
                (ARG_WEIGHTS, weight_md, weight_kernel),
                (ARG_DIFF_SRC, x_md, x_kernel),
            ],
        )
        self.out_of(self.data_x, x_kernel, grad_x)

    def weight_gradient(self, x, grad, grad_weight, grad_bias):
        """Writes the gradients of the weight and (with a bias) of the bias; returns the
        grad in the kernel's layout when the input gradient's kernel wants the same one."""
        self.make_backward()
        x_md, x_kernel = self.into(self.weights_x, x)
        grad_in_kernel = self.into(self.weights_grad, grad)
        weight_md, weight_kernel = self.result(self.weights_weight, grad_weight)
        arguments = [
            (ARG_SRC, x_md, x_kernel),
            (ARG_DIFF_DST, *grad_in_kernel),
            (ARG_DIFF_WEIGHTS, weight_md, weight_kernel),
        ]
        if self.with_bias:
            arguments.append((ARG_DIFF_BIAS, self.bias_md, grad_bias))
        self.run(self.weights_primitive, arguments)
        self.out_of(self.weights_weight, weight_kernel, grad_weight)
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
    library = loaded()
    # oneDNN's kernels fix how they share out the work (their team size) when the primitive
    # is made: one thread, whichever thread makes it.
    try:
        with one_openmp_thread(library):
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
    library = loaded()  # the tiles' threads hold their calls to one OpenMP thread

    def work(start, stop, _scratch):
        convolution = _tile_convolution(x.shape, weight.shape, geometry, out_shape, start, stop)
        with one_openmp_thread(library):
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
    library = loaded()
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
        with one_openmp_thread(library):
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
