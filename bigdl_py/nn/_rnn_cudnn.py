"""One LSTM or GRU layer by cuDNN's RNN API (CuPy arrays), where its library loads
(``bigdl_py.autograd.ops.cudnn``).

Why: on the GPU the layers' recurrence is a Python loop over time that issues ~9 kernels a
step forward and ~18 backward; the issue's BiLSTM step took 29x PyTorch's, which runs
cuDNN's RNN (a few fused kernels for the whole sequence). This is the GPU's twin of
``_lstm_onednn``.

How: one :class:`_Layer` per geometry (cell, steps, batch, features, hidden size,
directions, bias, layout, dtype, training or inference, TF32 setting, device) holds cuDNN's
descriptors: the RNN (one layer, both directions when bidirectional, PyTorch's two biases,
no dropout: ``nn.LSTM`` applies its between-layer dropout itself), the sequences'
(batch-major or time-major, every sequence full length), the states'. cuDNN keeps the
weights in one buffer of its own layout (the "weight space"); where each of PyTorch's gate
blocks lies in it is asked once per geometry (``cudnnGetRNNWeightParams``) and kept as
copy runs (``_rnn_weight_space``, which also says how cuDNN's gate order matches
PyTorch's), so each forward packs the parameters with a few copies and each backward
unpacks the gradients the same way.

Training forwards fill a reserve space (every step's gates) that the backward reads;
inference forwards (no gradient recorded) keep none. ``cudnnRNNBackwardData_v8`` must run
before ``cudnnRNNBackwardWeights_v8``, which adds into a zeroed gradient space.

The layer's output keeps ``_recurrent_functions``'s packed layout (the sequence, then the
final states as extra rows), so the layers above do not know which route ran.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import numpy as np

from bigdl_py import backend, step_graph
from bigdl_py.autograd.grad_mode import is_grad_enabled
from bigdl_py.autograd.ops import cuda_libraries, cudnn
from bigdl_py.autograd.ops.cudnn import CudnnError, LegacyDescriptor
from bigdl_py.nn._rnn_weight_space import GATES, copy_runs, pack, unpack

CELL_MODES = {"lstm": cudnn.CUDNN_LSTM, "gru": cudnn.CUDNN_GRU}


def layer_output(xp, sequence, final_states, batch_first: bool):
    """``_recurrent_functions``'s packed output: the sequence ``(N, T, D*H)`` (or ``(T, N,
    D*H)``), then one row per final state, each ``(D, N, H)`` laid out as ``(N, D*H)``."""
    steps = sequence.shape[1 if batch_first else 0]
    rows = steps + len(final_states)
    if batch_first:
        output = xp.empty((sequence.shape[0], rows, sequence.shape[2]), dtype=sequence.dtype)
        output[:, :steps] = sequence
    else:
        output = xp.empty((rows,) + sequence.shape[1:], dtype=sequence.dtype)
        output[:steps] = sequence
    for index, state in enumerate(final_states):
        row = xp.swapaxes(state, 0, 1).reshape(state.shape[1], -1)
        if batch_first:
            output[:, steps + index] = row
        else:
            output[steps + index] = row
    return output


def split_gradient(xp, grad, steps: int, directions: int, state_count: int, batch_first: bool):
    """The gradient of :func:`layer_output`'s result as cuDNN takes it: the sequence's,
    C-contiguous, and each final state's, ``(D, N, H)`` C-contiguous."""
    sequence = grad[:, :steps] if batch_first else grad[:steps]
    states = []
    for index in range(state_count):
        row = grad[:, steps + index] if batch_first else grad[steps + index]
        by_direction = row.reshape(row.shape[0], directions, -1)
        states.append(xp.ascontiguousarray(xp.swapaxes(by_direction, 0, 1)))
    return xp.ascontiguousarray(sequence), states


@dataclass(frozen=True)
class Geometry:
    """What one :class:`_Layer`'s descriptors are made for."""

    cell: str
    steps: int
    batch: int
    features: int
    size: int
    directions: int
    with_bias: bool
    batch_first: bool
    dtype: str
    training: bool
    tf32: bool

    def data_layout(self) -> int:
        if self.batch_first:
            return cudnn.CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED
        return cudnn.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED

    def math_precision(self) -> int:
        """cuDNN's compute type: float for float16 and float32, double for float64."""
        return cudnn.compute_type(self.dtype)

    def state_shape(self) -> tuple[int, int, int]:
        return (self.directions, self.batch, self.size)


class _Layer:
    """cuDNN's descriptors, sizes and weight layout for one :class:`Geometry`."""

    def __init__(self, library, geometry: Geometry) -> None:
        self.library = library
        self.geometry = geometry
        handle = library.handle()
        dtype = np.dtype(geometry.dtype)
        self.dtype = dtype
        data_type = cudnn.DATA_TYPES[dtype]
        self.dropout = LegacyDescriptor(library, "DropoutDescriptor")
        # No dropout: no random states are needed (PyTorch passes none either).
        library.call("cudnnSetDropoutDescriptor", self.dropout.pointer, handle, 0.0, None, 0, 0)
        self.rnn = LegacyDescriptor(library, "RNNDescriptor")
        library.call(
            "cudnnSetRNNDescriptor_v8",
            self.rnn.pointer,
            cudnn.CUDNN_RNN_ALGO_STANDARD,
            CELL_MODES[geometry.cell],
            cudnn.CUDNN_RNN_DOUBLE_BIAS if geometry.with_bias else cudnn.CUDNN_RNN_NO_BIAS,
            cudnn.CUDNN_BIDIRECTIONAL if geometry.directions == 2 else cudnn.CUDNN_UNIDIRECTIONAL,
            cudnn.CUDNN_LINEAR_INPUT,
            data_type,
            geometry.math_precision(),
            cudnn.rnn_math_type(dtype, geometry.tf32),
            geometry.features,
            geometry.size,
            geometry.size,  # a projection as wide as the hidden state: none
            1,
            self.dropout.pointer,
            cudnn.CUDNN_RNN_PADDED_IO_ENABLED,  # the unpacked layouts need it
        )
        self.x_data = self._sequence_descriptor(geometry.features)
        self.y_data = self._sequence_descriptor(geometry.directions * geometry.size)
        self.states = cudnn.tensor_descriptor(library, dtype, geometry.state_shape())
        self.mode = (
            cudnn.CUDNN_FWD_MODE_TRAINING if geometry.training else cudnn.CUDNN_FWD_MODE_INFERENCE
        )
        weight_bytes = ctypes.c_size_t()
        library.call(
            "cudnnGetRNNWeightSpaceSize", handle, self.rnn.pointer, ctypes.byref(weight_bytes)
        )
        work_bytes, reserve_bytes = ctypes.c_size_t(), ctypes.c_size_t()
        library.call(
            "cudnnGetRNNTempSpaceSizes",
            handle,
            self.rnn.pointer,
            self.mode,
            self.x_data.pointer,
            ctypes.byref(work_bytes),
            ctypes.byref(reserve_bytes),
        )
        self.weight_bytes = weight_bytes.value
        self.work_bytes = work_bytes.value
        self.reserve_bytes = reserve_bytes.value if geometry.training else 0
        self.runs = copy_runs(
            geometry.cell,
            geometry.directions,
            geometry.features,
            geometry.size,
            geometry.with_bias,
            self._weight_locator(handle),
        )
        covered = sum(run.length for run in self.runs) * dtype.itemsize
        # Gaps cuDNN leaves between blocks would otherwise hold whatever the pool had.
        self.space_needs_zeros = covered != self.weight_bytes
        xp = backend.cupy_module()
        # cuDNN reads the sequence lengths on the device, asynchronously.
        self.sequence_lengths = xp.full(geometry.batch, geometry.steps, dtype=xp.int32)

    def _sequence_descriptor(self, vector_size: int) -> LegacyDescriptor:
        geometry = self.geometry
        descriptor = LegacyDescriptor(self.library, "RNNDataDescriptor")
        lengths = (ctypes.c_int * geometry.batch)(*([geometry.steps] * geometry.batch))
        self.library.call(
            "cudnnSetRNNDataDescriptor",
            descriptor.pointer,
            cudnn.DATA_TYPES[np.dtype(geometry.dtype)],
            geometry.data_layout(),
            geometry.steps,
            geometry.batch,
            vector_size,
            lengths,
            None,  # no padding to fill: every sequence is full length
        )
        return descriptor

    def _weight_locator(self, handle):
        """``locate`` for :func:`copy_runs`: asks cuDNN where each block lies in a weight
        space (addresses only; nothing is read or written)."""
        library, itemsize = self.library, self.dtype.itemsize
        space = cuda_libraries.device_buffer(self.weight_bytes)
        base = int(space.data.ptr)
        matrix = cudnn.tensor_descriptor(library, self.dtype, (1, 1, 1))
        bias = cudnn.tensor_descriptor(library, self.dtype, (1, 1, 1))

        def elements(descriptor) -> int:
            data_type, count = ctypes.c_int(), ctypes.c_int()
            dims, strides = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()  # CUDNN_DIM_MAX
            library.call(
                "cudnnGetTensorNdDescriptor",
                descriptor.pointer,
                8,
                ctypes.byref(data_type),
                ctypes.byref(count),
                dims,
                strides,
            )
            return int(np.prod(dims[: count.value]))

        def locate(pseudo_layer: int, layer_id: int, is_bias: bool) -> tuple[int, int]:
            matrix_address, bias_address = ctypes.c_void_p(), ctypes.c_void_p()
            library.call(
                "cudnnGetRNNWeightParams",
                handle,
                self.rnn.pointer,
                pseudo_layer,
                self.weight_bytes,
                ctypes.c_void_p(base),
                layer_id,
                matrix.pointer,
                ctypes.byref(matrix_address),
                bias.pointer,
                ctypes.byref(bias_address),
            )
            address = bias_address.value if is_bias else matrix_address.value
            if not address:
                raise CudnnError(f"cuDNN has no {'bias' if is_bias else 'matrix'} {layer_id}", 0)
            return (address - base) // itemsize, elements(bias if is_bias else matrix)

        return locate

    # --- running -------------------------------------------------------------------------
    def weight_space(self, parameters):
        """A weight space holding PyTorch's ``parameters`` (C-contiguous CuPy arrays)."""
        xp = backend.array_module(parameters[0])
        count = self.weight_bytes // self.dtype.itemsize
        space = (xp.zeros if self.space_needs_zeros else xp.empty)(count, dtype=self.dtype)
        pack(space, parameters, self.runs)
        return space

    def forward(self, x, space, states):
        """``(sequence, final states, reserve space)`` of the layer on ``x`` from initial
        ``states`` (``(h0,)`` or ``(h0, c0)``, each ``(D, N, H)`` C-contiguous)."""
        xp = backend.array_module(x)
        geometry = self.geometry
        steps_and_batch = x.shape[:2]
        sequence = xp.empty(steps_and_batch + (geometry.directions * geometry.size,), dtype=x.dtype)
        finals = [xp.empty(geometry.state_shape(), dtype=x.dtype) for _ in states]
        work = cuda_libraries.device_buffer(self.work_bytes)
        reserve = cuda_libraries.device_buffer(self.reserve_bytes) if self.reserve_bytes else None
        cell_in, cell_out = (states[1], finals[1]) if len(states) == 2 else (None, None)
        library = self.library
        library.call(
            "cudnnRNNForward",
            library.handle(),
            self.rnn.pointer,
            self.mode,
            int(self.sequence_lengths.data.ptr),
            self.x_data.pointer,
            int(x.data.ptr),
            self.y_data.pointer,
            int(sequence.data.ptr),
            self.states.pointer,
            int(states[0].data.ptr),
            int(finals[0].data.ptr),
            self.states.pointer,
            _address(cell_in),
            _address(cell_out),
            self.weight_bytes,
            int(space.data.ptr),
            self.work_bytes,
            int(work.data.ptr),
            self.reserve_bytes,
            _address(reserve),
        )
        return sequence, finals, reserve

    def backward(self, saved, grad_sequence, grad_finals, weights_needed: bool):
        """``(grad_x, grad_states, grad_space or None)`` from the forward's ``saved``
        ``(x, space, sequence, reserve, *states)``."""
        x, space, sequence, reserve, *states = saved
        xp = backend.array_module(x)
        grad_x = xp.empty_like(x)
        grad_states = [xp.empty_like(state) for state in states]
        work = cuda_libraries.device_buffer(self.work_bytes)
        two = len(states) == 2
        library = self.library
        handle = library.handle()
        library.call(
            "cudnnRNNBackwardData_v8",
            handle,
            self.rnn.pointer,
            int(self.sequence_lengths.data.ptr),
            self.y_data.pointer,
            int(sequence.data.ptr),
            int(grad_sequence.data.ptr),
            self.x_data.pointer,
            int(grad_x.data.ptr),
            self.states.pointer,
            int(states[0].data.ptr),
            int(grad_finals[0].data.ptr),
            int(grad_states[0].data.ptr),
            self.states.pointer,
            _address(states[1] if two else None),
            _address(grad_finals[1] if two else None),
            _address(grad_states[1] if two else None),
            self.weight_bytes,
            int(space.data.ptr),
            self.work_bytes,
            int(work.data.ptr),
            self.reserve_bytes,
            _address(reserve),
        )
        grad_space = None
        if weights_needed:
            grad_space = xp.zeros_like(space)  # the call adds into it
            library.call(
                "cudnnRNNBackwardWeights_v8",
                handle,
                self.rnn.pointer,
                cudnn.CUDNN_WGRAD_MODE_ADD,
                int(self.sequence_lengths.data.ptr),
                self.x_data.pointer,
                int(x.data.ptr),
                self.states.pointer,
                int(states[0].data.ptr),
                self.y_data.pointer,
                int(sequence.data.ptr),
                self.weight_bytes,
                int(grad_space.data.ptr),
                self.work_bytes,
                int(work.data.ptr),
                self.reserve_bytes,
                _address(reserve),
            )
        return grad_x, grad_states, grad_space


def _address(array) -> int | None:
    return None if array is None else int(array.data.ptr)


# --- the cache of layers ---------------------------------------------------------------------

MAX_LAYERS = 64
_layers: dict = {}
_declined: dict = {}
_layers_lock = threading.Lock()


def declined() -> dict:
    """``{geometry: reason}`` of every geometry cuDNN declined."""
    return dict(_declined)


def _layer(geometry: Geometry) -> _Layer | None:
    key = (geometry, cuda_libraries.current_device())
    found = _layers.get(key, False)
    if found is not False:
        step_graph.keep_alive(found)  # a captured graph uses its buffers after an eviction
        return found
    try:
        made = _Layer(cudnn.loaded(), geometry)
    except CudnnError as error:
        made = None
        _declined[geometry] = str(error)
    with _layers_lock:
        if len(_layers) >= MAX_LAYERS:
            _layers.pop(next(iter(_layers)))
        _layers[key] = made
    step_graph.keep_alive(made)
    return made


def forward(cell, x, weight_ih, weight_hh, states, biases, batch_first):
    """Run one layer: ``(output, layer, saved)`` for the Function, or None where cuDNN
    declines (the CuPy recurrence runs). ``states`` are ``(h0,)`` or ``(h0, c0)`` and
    ``biases`` ``(bias_ih, bias_hh)`` (both None without bias), as
    ``_recurrent_functions``'s sequences take them."""
    directions, _, size = weight_hh.shape
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else x.shape[:2]
    if steps == 0 or batch == 0:
        return None
    with_bias = biases[0] is not None
    dtype = np.dtype(x.dtype)
    geometry = Geometry(
        cell,
        int(steps),
        int(batch),
        int(x.shape[2]),
        int(size),
        int(directions),
        with_bias,
        bool(batch_first),
        dtype.str,
        is_grad_enabled(),
        dtype == np.float32 and cudnn.tf32_allowed(),
    )
    layer = _layer(geometry)
    if layer is None:
        return None
    xp = backend.array_module(x)
    x = xp.ascontiguousarray(x)
    states = [xp.ascontiguousarray(state) for state in states]
    parameters = [weight_ih, weight_hh, *(biases if with_bias else ())]
    space = layer.weight_space([xp.ascontiguousarray(p) for p in parameters])
    sequence, finals, reserve = layer.forward(x, space, states)
    output = layer_output(xp, sequence, finals, batch_first)
    return output, layer, (x, space, sequence, reserve, *states)


def backward(layer: _Layer, saved, grad, needs_input_grad) -> tuple:
    """The gradients of every input of the Function that ran :func:`forward`, in its
    order: ``x, weight_ih, weight_hh``, the initial states, then ``bias_ih, bias_hh``
    (None where there is no bias)."""
    geometry = layer.geometry
    xp = backend.array_module(grad)
    state_count = len(saved) - 4
    grad_sequence, grad_finals = split_gradient(
        xp, grad, geometry.steps, geometry.directions, state_count, geometry.batch_first
    )
    weight_positions = [1, 2]
    if geometry.with_bias:
        weight_positions += [3 + state_count, 4 + state_count]
    weights_needed = any(needs_input_grad[p] for p in weight_positions if p < len(needs_input_grad))
    grad_x, grad_states, grad_space = layer.backward(
        saved, grad_sequence, grad_finals, weights_needed
    )
    weight_grads = [None] * 4
    if grad_space is not None:
        count = 4 if geometry.with_bias else 2
        shapes = _parameter_shapes(geometry)[:count]
        weight_grads[:count] = [xp.empty(shape, dtype=grad.dtype) for shape in shapes]
        unpack(grad_space, weight_grads[:count], layer.runs)
    return (
        grad_x,
        weight_grads[0],
        weight_grads[1],
        *grad_states,
        weight_grads[2],
        weight_grads[3],
    )


def _parameter_shapes(geometry: Geometry) -> list[tuple]:
    """PyTorch's parameter shapes, per direction stacked: ``weight_ih``, ``weight_hh``,
    ``bias_ih``, ``bias_hh``."""
    rows = GATES[geometry.cell] * geometry.size
    directions = geometry.directions
    return [
        (directions, rows, geometry.features),
        (directions, rows, geometry.size),
        (directions, rows),
        (directions, rows),
    ]
