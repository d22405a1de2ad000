"""The recurrences of one LSTM, GRU or Elman RNN layer, both directions at once, as fused
``Function``s.

Each layer is a single graph node, so a sequence of any length adds no depth to the backward
walk. Inside, the recurrence runs in a Python loop over time on raw arrays; the backward is
back-propagation through time written out by hand, then the weights' gradients over all
steps, one GEMM each. The GRU and the RNN project the input of every time step with one GEMM
before their loop and share everything but their steps (``_ProjectedSequence``); the LSTM
works transposed, batch last, with the input projection inside each step's GEMM (see
``LSTMSequence``).

Both directions of a bidirectional layer share the work: at step ``s`` the forward
direction reads time ``s`` and the reverse one time ``T - 1 - s``. On one BLAS thread (and
on a GPU) they run in the same loop, each step one batched matmul and one array operation
per gate formula for both, instead of two of each (per-call overhead is much of a step's
cost at the sizes of text models). When BLAS may use more threads, each direction runs on
its own thread with BLAS held to one thread (``conv_tiles.for_each_tile``): a step's small
GEMMs (32 x 128 x 512 in the bench) gain nothing from splitting, and on a shared machine
each one's barrier between BLAS threads often waits for a descheduled thread (the
per-step matmuls of the bench's LSTM took 10-30x the one-thread wall time at two threads
under load). A one-direction layer with small steps runs with BLAS held to one thread.

Float32 NumPy LSTM layers run on oneDNN's LSTM primitive instead, where its library is
installed (``_lstm_onednn``: PyTorch's own CPU route, 1.2x faster than this recurrence on the
bench's layer), with the same threads, one direction each; this recurrence takes float64,
CuPy arrays, empty batches and ``BIGDL_PY_ONEDNN=0``, and is the reference the oneDNN
route's tests compare with. On the GPU both layers run on cuDNN's RNN where it loads
(``_rnn_cudnn``), this recurrence where it does not (``BIGDL_PY_CUDNN=0``, no cuDNN 9); its
products then run on the package's cuBLAS handle (``cublas.matmul``, which a CUDA graph
captures; CuPy's ``matmul`` cannot be captured), on the host on NumPy's ``matmul``.

The weights' gate layouts are PyTorch's: LSTM ``[i, f, g, o]``, GRU ``[r, z, n]``, stacked
along the first axis (the RNN has one gate). Inside, the GRU's and the RNN's arrays are ``(D,
T, N, ...)``: direction, step (in each direction's reading order), batch; the LSTM's put the
batch last. The layer-layout inputs and outputs are ``(N, T, ...)`` (``batch_first``) or
``(T, N, ...)``, with the directions side by side along the features.
"""

from __future__ import annotations

import threading

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.function import Function
from bigdl_py.autograd.grad_mode import is_grad_enabled
from bigdl_py.autograd.ops import conv_tiles, cublas, cudnn, onednn
from bigdl_py.nn import _lstm_onednn, _rnn_cudnn

# Multiply-adds of one step's hidden GEMM (batch x gates*H x H) below which a
# one-direction layer holds BLAS to one thread (2M in the bench's LSTM).
_SMALL_STEP_GEMM = 1 << 24


class _GateActivations:
    """Sigmoid and tanh gates of one gates row, as ``scale * tanh(scale * x) + shift``.

    ``sigmoid(x) = 0.5 * tanh(0.5 * x) + 0.5``, so with a per-column ``scale`` (0.5 for a
    sigmoid gate, 1 for a tanh gate) and ``shift`` (0.5 or 0), one tanh over the whole row
    activates every gate, and nothing can overflow. The inner scale is applied once to the
    weights and biases (exact: a power of two).
    """

    def __init__(self, xp, kinds: tuple[str, ...], size: int, dtype):
        self.scale = xp.concatenate(
            [xp.full(size, 0.5 if kind == "sigmoid" else 1.0, dtype=dtype) for kind in kinds]
        )
        self.shift = xp.concatenate(
            [xp.full(size, 0.5 if kind == "sigmoid" else 0.0, dtype=dtype) for kind in kinds]
        )

    def activate_(self, pre_scaled):
        """Activate gates already multiplied by ``scale``, in place."""
        xp = backend.array_module(pre_scaled)
        xp.tanh(pre_scaled, out=pre_scaled)
        pre_scaled *= self.scale
        pre_scaled += self.shift
        return pre_scaled

    def scaled_transposed(self, weight):
        """``(W * scale).T`` per direction, contiguous: ``(D, in, gates * H)``."""
        xp = backend.array_module(weight)
        return xp.ascontiguousarray(xp.swapaxes(weight * self.scale[:, None], 1, 2))


# Most bytes of host buffers kept between calls (the bench's BiLSTM layer uses ~55 MB a step).
_POOL_BYTES = 256 << 20


class _BufferPool:
    """Large host arrays of one call, kept for the next call of the same shapes.

    A new array of several MB comes from the OS zero-filled, page by page: the bench's BiLSTM
    step took ~4,400 minor page faults and 14-17 ms of system time (beside ~101-108 ms of
    user time) with every buffer new. Arrays saved for the backward come back when the
    Function is released (after a backward without ``retain_graph``), the backward's own at
    its end. Past ``limit_bytes`` the pool starts afresh (sequence lengths changed). GPU
    arrays are never kept: CuPy has its own memory pool.
    """

    def __init__(self, limit_bytes: int):
        self._free: dict = {}
        self._bytes = 0
        self._limit_bytes = limit_bytes
        self._lock = threading.Lock()

    def take(self, like, shape: tuple, dtype):
        """An uninitialised array of ``shape`` on ``like``'s device."""
        if not backend.is_device_array(like):
            with self._lock:
                stack = self._free.get((tuple(shape), np.dtype(dtype).str))
                if stack:
                    array = stack.pop()
                    self._bytes -= array.nbytes
                    return array
        return backend.array_module(like).empty(shape, dtype=dtype)

    def give(self, *arrays) -> None:
        """Keep host ``arrays`` (whole arrays no longer used) for later calls."""
        with self._lock:
            for array in arrays:
                if not isinstance(array, np.ndarray) or array.base is not None:
                    continue
                if self._bytes + array.nbytes > self._limit_bytes:
                    self._free.clear()
                    self._bytes = 0
                self._free.setdefault((array.shape, array.dtype.str), []).append(array)
                self._bytes += array.nbytes


_pool = _BufferPool(_POOL_BYTES)


class _PooledSequence(Function):
    """A sequence Function whose saved buffers (``pooled``) go back to the pool when it is
    released."""

    pooled: tuple = ()
    cudnn_layer = None  # the cuDNN route's layer when it ran the forward (``_rnn_cudnn``)

    def _forward_cudnn(self, cell, x, weight_ih, weight_hh, states, biases, batch_first):
        """The forward on cuDNN's RNN (CuPy operands, ``_rnn_cudnn``), or None where cuDNN
        is absent or declines the geometry (this module's recurrence runs)."""
        if not cudnn.applies_to(x, weight_ih, weight_hh, *states, *biases):
            return None
        ran = _rnn_cudnn.forward(cell, x, weight_ih, weight_hh, states, biases, batch_first)
        if ran is None:
            return None
        output, self.cudnn_layer, saved = ran
        self.save_for_backward(*saved)
        return output

    def _backward_cudnn(self, grad):
        return _rnn_cudnn.backward(self.cudnn_layer, self.saved, grad, self.needs_input_grad)

    def _release_extra(self) -> None:
        _pool.give(*self.pooled)
        self.pooled = ()


class LSTMSequence(_PooledSequence):
    """One LSTM layer over a sequence, in one or two directions.

    Inputs: the layer's input ``x`` (``(N, T, F)`` when ``batch_first``, else ``(T, N,
    F)``), ``weight_ih (D, 4H, F)``, ``weight_hh (D, 4H, H)``, ``h0 (D, N, H)``, ``c0 (D, N,
    H)`` and, optionally, ``bias_ih`` and ``bias_hh (D, 4H)``; ``D`` is the number of
    directions. The output packs everything because a ``Function`` has one output: ``(N, T +
    2, D * H)`` (or ``(T + 2, N, D * H)``); rows ``0..T-1`` are the hidden states at each
    time (the directions side by side), row ``T`` the final hidden state ``h_n`` and row
    ``T + 1`` the final cell state ``c_n`` of each direction (the reverse direction's final
    states are those at time 0).

    Inside, everything is transposed, batch last: a step's gates are ``W @ z_t`` with ``W =
    [W_ih | W_hh | b_ih + b_hh]`` and ``z_t = [x_t; h_{t-1}; 1]`` a column block ``(F + H +
    1, N)`` of one array that holds every step's input, hidden state and a row of ones
    (``_lstm_columns``). So a step is one GEMM that also does the input projection and the
    bias, each gate is a contiguous ``(H, N)`` block (row views of the bench's ``(32, 512)``
    gates took 4-6x as long per operation), and the weights' gradients are one GEMM over all
    steps, ``dW = dgates @ columns.T``, the bias's being the column of ones. Gates are kept
    in the order ``[g, i, f, o]`` (PyTorch's rows permuted): the sigmoid gates are one block
    and the cell's three inputs another, which saves operations per step.
    """

    def forward(
        self, x, weight_ih, weight_hh, h0, c0, bias_ih=None, bias_hh=None, batch_first=True
    ):
        self.batch_first, self.has_bias = batch_first, bias_ih is not None
        self.onednn_directions = None
        output = self._forward_cudnn(
            "lstm", x, weight_ih, weight_hh, (h0, c0), (bias_ih, bias_hh), batch_first
        )
        if output is not None:
            return output
        if onednn.applies_to(x, weight_ih, weight_hh, h0, c0, bias_ih, bias_hh):
            output = self._forward_onednn(x, weight_ih, weight_hh, h0, c0, bias_ih, bias_hh)
            if output is not None:
                return output
        xp = backend.array_module(x)
        directions, gate_width, size = weight_hh.shape
        features = weight_ih.shape[2]
        weights = _lstm_weights(weight_ih, weight_hh, bias_ih, bias_hh)
        # sigmoid(a) = 0.5 * tanh(0.5 * a) + 0.5: one tanh over every gate, nothing can
        # overflow; the inner 0.5 goes into the sigmoid gates' rows (exact: a power of two).
        scaled_weights = weights.copy()
        scaled_weights[:, size:] *= 0.5
        columns = _lstm_columns(x, directions, size, bias_ih is not None, batch_first)
        hidden_rows = slice(features, features + size)
        columns[:, hidden_rows, 0] = xp.swapaxes(h0, 1, 2)
        steps, batch = columns.shape[2] - 1, columns.shape[3]
        gates = _pool.take(x, (directions, steps, gate_width, batch), x.dtype)
        cells = _pool.take(x, (directions, steps + 1, size, batch), x.dtype)  # c_0 .. c_T
        cells[:, 0] = xp.swapaxes(c0, 1, 2)
        tanh_cells = _pool.take(x, (directions, steps, size, batch), x.dtype)
        hiddens = columns[:, hidden_rows]  # (D, H, T + 1, N)
        output = _empty_layer_layout(xp, directions, steps + 2, batch, size, x.dtype, batch_first)

        def run(part):
            _fill_input_columns(columns, x, part, batch_first)
            _lstm_steps(
                columns[part],
                scaled_weights[part],
                gates[part],
                cells[part],
                tanh_cells[part],
                features,
            )
            final_states = [hiddens[part, :, steps], cells[part, steps]]
            _fill_layer_layout(
                output,
                hiddens[part, :, 1:].transpose(0, 2, 3, 1),
                [xp.swapaxes(state, 1, 2) for state in final_states],
                part.start,
                batch_first,
            )

        _for_each_direction(x, directions, run, size * gate_width * batch)
        self.save_for_backward(columns, weights, gates, cells, tanh_cells)
        self.pooled = (columns, gates, cells, tanh_cells)
        return output

    def _forward_onednn(self, x, weight_ih, weight_hh, h0, c0, bias_ih, bias_hh):
        """The forward on oneDNN's LSTM, one primitive per direction (``_lstm_onednn``), or
        None where oneDNN does not take the geometry (the NumPy recurrence does)."""
        directions, gate_width, size = weight_hh.shape
        batch_first = self.batch_first
        steps, batch = (x.shape[1], x.shape[0]) if batch_first else x.shape[:2]
        if steps == 0 or batch == 0:
            return None
        training = is_grad_enabled()
        geometry = (steps, batch, x.shape[2], size)
        sets = [
            _lstm_onednn.direction(*geometry, reverse, batch_first, training)
            for reverse in (False, True)[:directions]
        ]
        if None in sets:
            return None
        x, weight_ih, weight_hh, h0, c0 = map(
            np.ascontiguousarray, (x, weight_ih, weight_hh, h0, c0)
        )
        if bias_ih is None:
            bias = np.zeros((directions, gate_width), dtype=np.float32)
        else:
            bias = bias_ih + bias_hh
        sequences = _pool.take(x, (directions, *x.shape[:2], size), np.float32)
        final_hidden = np.empty((directions, batch, size), dtype=np.float32)
        final_cell = np.empty_like(final_hidden)
        workspaces = [
            _lstm_onednn.empty_workspace(s, lambda shape: _pool.take(x, shape, np.float32))
            for s in sets
        ]
        output = _empty_layer_layout(np, directions, steps + 2, batch, size, x.dtype, batch_first)
        target = _time_major_blocks(output, directions, batch_first)  # (T + 2, N, D, H), a view
        arrays = (weight_ih, weight_hh, bias, h0, c0, sequences, final_hidden, final_cell)

        def run(part):
            for d in range(part.start, part.stop):
                workspace = None if workspaces[d] is None else workspaces[d][1]
                _lstm_onednn.run(sets[d].forward, x, *(a[d] for a in arrays), workspace)
                target[:steps, :, d] = _time_major_blocks(sequences[d], 1, batch_first)[:, :, 0]
                target[steps, :, d] = final_hidden[d]
                target[steps + 1, :, d] = final_cell[d]

        _for_each_direction(x, directions, run, size * gate_width * batch)
        self.onednn_directions = sets
        self.save_for_backward(x, *arrays, *(w[1] for w in workspaces if w is not None))
        self.pooled = (sequences, *(w[0] for w in workspaces if w is not None))
        return output

    def _backward_onednn(self, grad):
        """The backward of ``_forward_onednn``: one oneDNN backward per direction, which
        reads the workspace its forward filled."""
        sets = self.onednn_directions
        x, weight_ih, weight_hh, bias, h0, c0, sequences, final_hidden, final_cell = self.saved[:9]
        workspaces = self.saved[9:]
        directions, batch, size = final_hidden.shape
        steps = sequences.shape[2 if self.batch_first else 1]
        upstream = _time_major_blocks(grad, directions, self.batch_first)  # (T + 2, N, D, H)
        grad_sequences = _pool.take(x, sequences.shape, np.float32)
        grad_inputs = _pool.take(x, (directions, *x.shape), np.float32)
        grad_h0, grad_c0 = np.empty_like(h0), np.empty_like(c0)
        grad_weight_ih, grad_weight_hh = np.empty_like(weight_ih), np.empty_like(weight_hh)
        grad_bias = np.empty_like(bias)

        def run(part):
            for d in range(part.start, part.stop):
                time_major = _time_major_blocks(grad_sequences[d], 1, self.batch_first)
                time_major[:, :, 0] = upstream[:steps, :, d]
                saved = (x, weight_ih[d], weight_hh[d], bias[d], h0[d], c0[d], sequences[d])
                saved += (final_hidden[d], final_cell[d], workspaces[d])
                grads = (
                    grad_sequences[d],
                    np.ascontiguousarray(upstream[steps, :, d]),
                    np.ascontiguousarray(upstream[steps + 1, :, d]),
                )
                out = (grad_inputs[d], grad_h0[d], grad_c0[d], grad_weight_ih[d])
                out += (grad_weight_hh[d], grad_bias[d])
                _lstm_onednn.run(sets[d].backward, saved, grads, out)

        _for_each_direction(x, directions, run, size * weight_hh.shape[1] * batch)
        grad_x = None
        if self.needs_input_grad[0]:
            grad_x = grad_inputs[0] + grad_inputs[1] if directions == 2 else grad_inputs[0].copy()
        _pool.give(grad_sequences, grad_inputs)
        grad_bias = grad_bias if self.has_bias else None
        return grad_x, grad_weight_ih, grad_weight_hh, grad_h0, grad_c0, grad_bias, grad_bias

    def backward(self, grad):
        if self.cudnn_layer is not None:
            return self._backward_cudnn(grad)
        if self.onednn_directions is not None:
            return self._backward_onednn(grad)
        columns, weights, gates, cells, tanh_cells = self.saved
        xp = backend.array_module(gates)
        directions, steps, gate_width, batch = gates.shape
        size = gate_width // 4
        features = weights.shape[2] - size - self.has_bias
        upstream = _time_major_blocks(grad, directions, self.batch_first)  # (T + 2, N, D, H)
        # A classifier on the final states leaves the output sequence's gradient all zeros:
        # then no step adds one (a pass to check is cheaper than the transposed copy). On a
        # device the check would wait for it, so the zeros are added.
        grad_steps = None
        if backend.is_device_array(upstream) or upstream[:steps].any():
            grad_steps = _to_steps(xp.swapaxes(upstream[:steps], 1, 3))  # (D, T, H, N)
        grad_hidden = xp.ascontiguousarray(upstream[steps].transpose(1, 2, 0))  # (D, H, N)
        grad_cell = xp.ascontiguousarray(upstream[steps + 1].transpose(1, 2, 0))
        hidden_weights_t = xp.ascontiguousarray(
            xp.swapaxes(weights[:, :, features : features + size], 1, 2)
        )
        # Every step's gate gradients as one (4H, T * N) matrix per direction, for the GEMMs.
        grad_gates = _pool.take(gates, (directions, gate_width, steps, batch), gates.dtype)
        grad_weights = xp.empty_like(weights)
        needs_input = self.needs_input_grad[0]
        inputs_grad = (
            _pool.take(gates, (directions, steps, batch, features), gates.dtype)
            if needs_input
            else None
        )

        matmul = cublas.matmul_for(gates)

        def run(part):
            _lstm_steps_backward(
                None if grad_steps is None else grad_steps[part],
                grad_hidden[part],
                grad_cell[part],
                gates[part],
                cells[part],
                tanh_cells[part],
                hidden_weights_t[part],
                grad_gates[part],
            )
            count = part.stop - part.start
            flat_grad_gates = grad_gates[part].reshape(count, gate_width, steps * batch)
            flat_columns = columns[part, :, :steps].reshape(count, -1, steps * batch)  # a view
            matmul(flat_grad_gates, xp.swapaxes(flat_columns, 1, 2), out=grad_weights[part])
            if needs_input:
                matmul(
                    xp.swapaxes(flat_grad_gates, 1, 2),
                    weights[part, :, :features],
                    out=inputs_grad[part].reshape(count, steps * batch, features),
                )

        _for_each_direction(gates, directions, run, size * gate_width * batch)
        # Back to PyTorch's gate order and parameters.
        grad_weights = grad_weights[:, _lstm_rows_to_pytorch(size, xp)]
        grad_bias = grad_weights[:, :, features + size] if self.has_bias else None
        grad_x = _summed_input_gradient(inputs_grad, self.batch_first)
        _pool.give(grad_gates, inputs_grad, grad_steps)
        return (
            grad_x,
            grad_weights[:, :, :features],
            grad_weights[:, :, features : features + size],
            xp.ascontiguousarray(xp.swapaxes(grad_hidden, 1, 2)),
            xp.ascontiguousarray(xp.swapaxes(grad_cell, 1, 2)),
            grad_bias,  # bias_ih and bias_hh enter the gates alike
            grad_bias,
        )


def _lstm_rows_from_pytorch(size: int, xp):
    """Indices of PyTorch's gate rows ``[i, f, g, o]`` in our order ``[g, i, f, o]``."""
    return xp.concatenate(
        [xp.arange(2 * size, 3 * size), xp.arange(0, 2 * size), xp.arange(3 * size, 4 * size)]
    )


def _lstm_rows_to_pytorch(size: int, xp):
    """The inverse permutation of ``_lstm_rows_from_pytorch``."""
    return xp.concatenate(
        [xp.arange(size, 3 * size), xp.arange(0, size), xp.arange(3 * size, 4 * size)]
    )


def _lstm_weights(weight_ih, weight_hh, bias_ih, bias_hh):
    """``[W_ih | W_hh | b_ih + b_hh]`` per direction, rows in our gate order: ``(D, 4H, K)``."""
    xp = backend.array_module(weight_ih)
    parts = [weight_ih, weight_hh]
    if bias_ih is not None:
        parts.append((bias_ih + bias_hh)[:, :, None])
    rows = _lstm_rows_from_pytorch(weight_hh.shape[2], xp)
    return xp.concatenate(parts, axis=2)[:, rows]


def _lstm_columns(x, directions: int, size: int, with_bias: bool, batch_first: bool):
    """``(D, F + H [+ 1], T + 1, N)``: column block ``t`` of direction ``d`` will be ``[x_t;
    h_t; 1]`` with ``x`` in that direction's reading order; here only the ones and the ``x``
    rows of block ``T`` (zeros) are filled: ``_fill_input_columns`` writes the input and the
    recurrence the hidden states ``h_0`` .. ``h_T``."""
    steps = x.shape[1 if batch_first else 0]
    batch, features = x.shape[0 if batch_first else 1], x.shape[2]
    rows = features + size + (1 if with_bias else 0)
    columns = _pool.take(x, (directions, rows, steps + 1, batch), x.dtype)
    columns[:, :features, steps] = 0
    if with_bias:
        columns[:, features + size] = 1
    return columns


def _fill_input_columns(columns, x, part: slice, batch_first: bool) -> None:
    """The input rows of directions ``part`` of ``columns`` (see ``_lstm_columns``)."""
    xp = backend.array_module(x)
    # Time-major first (runs of F), then transposed: 0.6 ms against 1.6 ms for one copy
    # straight from the bench's batch-first (32, 128, 128) float32 input.
    time_major = xp.ascontiguousarray(_time_major_blocks(x, 1, batch_first)[:, :, 0])
    by_feature = xp.moveaxis(time_major, 2, 0)  # (F, T, N), a view
    features, steps = by_feature.shape[:2]
    for direction in range(part.start, part.stop):
        if direction == 1 and part.start == 0:
            # From the forward copy, in runs of N: 0.1 ms against 1.6 ms for a second
            # transpose (the bench's x, (32, 128, 128) float32).
            columns[1, :features, :steps] = columns[0, :features, steps - 1 :: -1]
        else:
            columns[direction, :features, :steps] = by_feature[:, ::-1] if direction else by_feature


def _lstm_steps(columns, scaled_weights, gates, cells, tanh_cells, features: int) -> None:
    """The LSTM recurrence of a block of directions, in place: fills ``gates`` (activated),
    ``cells[:, 1:]``, ``tanh_cells`` and the hidden rows of ``columns[:, :, 1:]``."""
    xp = backend.array_module(gates)
    directions, steps, gate_width, batch = gates.shape
    size = gate_width // 4
    hiddens = columns[:, features : features + size]
    # Each gate of every step, (D, T, H, N) views split once: a split per step cost ~1.5 us.
    candidates, input_gates, forget_gates, output_gates = _split(gates, 4, axis=2)
    sigmoid_gates = gates[:, :, size:]
    product = xp.empty((directions, size, batch), dtype=gates.dtype)
    # The GEMM writes to a contiguous array (a step of two directions is not one, and CuPy's
    # matmul is safest with a contiguous output); the tanh then moves it into place.
    pre_activation = xp.empty((directions, gate_width, batch), dtype=gates.dtype)
    matmul = cublas.matmul_for(gates)
    for t in range(steps):
        matmul(scaled_weights, columns[:, :, t], out=pre_activation)
        xp.tanh(pre_activation, out=gates[:, t])
        sigmoids = sigmoid_gates[:, t]
        sigmoids *= 0.5
        sigmoids += 0.5
        xp.multiply(forget_gates[:, t], cells[:, t], out=cells[:, t + 1])
        xp.multiply(input_gates[:, t], candidates[:, t], out=product)
        cells[:, t + 1] += product
        xp.tanh(cells[:, t + 1], out=tanh_cells[:, t])
        xp.multiply(output_gates[:, t], tanh_cells[:, t], out=hiddens[:, :, t + 1])


def _lstm_steps_backward(
    grad_steps, grad_hidden, grad_cell, gates, cells, tanh_cells, hidden_weights_t, grad_gates
) -> None:
    """Back-propagation through time of a block of directions: writes the pre-activation
    gates' gradients into ``grad_gates (D, 4H, T, N)``; ``grad_hidden`` and ``grad_cell``
    (``(D, H, N)``) hold the final states' gradients on entry and the initial states' on
    exit."""
    xp = backend.array_module(gates)
    directions, steps, gate_width, batch = gates.shape
    size = gate_width // 4
    step_grad = xp.empty((directions, gate_width, batch), dtype=gates.dtype)
    grad_candidate, _, grad_forget, grad_output = _split(step_grad, 4, axis=1)
    grad_sigmoids = step_grad[:, size:]
    # g and i multiply each other: their gradients' factors are [i, g], the pair [g, i]
    # reversed, one operation for both.
    grad_pair = step_grad[:, : 2 * size].reshape(directions, 2, size, batch)
    swapped_pairs = gates[:, :, : 2 * size].reshape(directions, steps, 2, size, batch)[:, :, ::-1]
    # g, i and f act through the cell: one block, scaled by the cell's gradient at once.
    grad_cell_inputs = step_grad[:, : 3 * size].reshape(directions, 3, size, batch)
    # Each gate of every step, (D, T, H, N) views split once (see ``_lstm_steps``).
    candidates, _, forget_gates, output_gates = _split(gates, 4, axis=2)
    sigmoid_gates = gates[:, :, size:]
    product = xp.empty((directions, size, batch), dtype=gates.dtype)
    matmul = cublas.matmul_for(gates)
    for t in reversed(range(steps)):
        if grad_steps is not None:
            grad_hidden += grad_steps[:, t]
        candidate, sigmoids, tanh_cell = candidates[:, t], sigmoid_gates[:, t], tanh_cells[:, t]
        # The activations' derivatives: 1 - g**2, and s * (1 - s) for the sigmoid gates.
        xp.multiply(candidate, candidate, out=grad_candidate)
        xp.subtract(1, grad_candidate, out=grad_candidate)
        xp.subtract(1, sigmoids, out=grad_sigmoids)
        grad_sigmoids *= sigmoids
        # What each gate multiplies: g with i, i with g, f with c_{t-1}, o with tanh(c_t).
        grad_pair *= swapped_pairs[:, t]
        grad_forget *= cells[:, t]
        grad_output *= tanh_cell
        # The cell's gradient through h_t = o * tanh(c_t). (o - h_t * tanh(c_t), one
        # operation less, was slower: h_t's rows in ``columns`` are strided.)
        xp.multiply(tanh_cell, tanh_cell, out=product)
        xp.subtract(1, product, out=product)
        product *= output_gates[:, t]
        product *= grad_hidden
        grad_cell += product
        grad_cell_inputs *= grad_cell[:, None]
        grad_output *= grad_hidden
        grad_cell *= forget_gates[:, t]
        grad_gates[:, :, t] = step_grad
        matmul(hidden_weights_t, step_grad, out=grad_hidden)


class _ProjectedSequence(_PooledSequence):
    """A GRU or Elman RNN layer over a sequence, in one or two directions: the recurrences
    that project the input of every time step with one GEMM before their loop and keep only
    hidden states between steps.

    Inputs: ``x`` (``(N, T, F)`` or ``(T, N, F)``), ``weight_ih (D, G, F)``, ``weight_hh
    (D, G, H)``, ``h0 (D, N, H)`` and, optionally, ``bias_ih`` and ``bias_hh (D, G)``, with
    ``G`` the number of gates times ``H``. Output ``(N, T + 1, D * H)`` (or ``(T + 1, N, D *
    H)``): rows ``0..T-1`` are the hidden states at each time, row ``T`` the final hidden
    state of each direction.

    A subclass is the cell: ``_prepare`` (the input projection's weights, and what its steps
    need), ``_steps`` and ``_steps_backward``. ``separate_hidden_gates`` says whether the
    hidden projection's gate gradients differ from the input projection's (the GRU's reset
    gate scales the hidden part of its candidate) or are the same array (the RNN's).
    """

    separate_hidden_gates = True
    # Arrays of the cell's own that its backward reads (from the pool: given back on release).
    cell_saved: tuple = ()
    # The cell's name in the cuDNN route (``_rnn_cudnn``); None: this recurrence only.
    cudnn_cell: str | None = None

    def forward(
        self, x, weight_ih, weight_hh, h0, bias_ih=None, bias_hh=None, batch_first=True, **cell
    ):
        if self.cudnn_cell is not None:
            output = self._forward_cudnn(
                self.cudnn_cell, x, weight_ih, weight_hh, (h0,), (bias_ih, bias_hh), batch_first
            )
            if output is not None:
                return output
        directions, _, size = weight_hh.shape
        inputs = _inputs_by_direction(x, directions, batch_first)
        gates = _empty_gates(inputs, weight_ih)
        steps, batch = inputs.shape[1:3]
        hiddens = _pool.take(x, (directions, steps + 1, batch, size), x.dtype)
        hiddens[:, 0] = h0
        projection, projection_bias = self._prepare(
            x, weight_ih, weight_hh, bias_ih, bias_hh, steps, batch, **cell
        )

        def run(part):
            _project(inputs[part], projection[part], _part(projection_bias, part), gates[part])
            self._steps(part, gates[part], hiddens[part])

        _for_each_direction(x, directions, run, weight_hh[0].size * batch)
        self.batch_first, self.has_bias = batch_first, bias_ih is not None
        self.save_for_backward(inputs, gates, hiddens, weight_ih, weight_hh)
        self.pooled = (inputs, gates, hiddens, *self.cell_saved)
        return _to_layer_layout(hiddens[:, 1:], [hiddens[:, steps]], batch_first)

    def backward(self, grad):
        if self.cudnn_layer is not None:
            return self._backward_cudnn(grad)
        inputs, gates, hiddens, weight_ih, weight_hh = self.saved
        directions, steps = gates.shape[:2]
        upstream = _time_major_blocks(grad, directions, self.batch_first)
        grad_steps = _to_steps(upstream[:steps])
        grad_hidden = _final_state(upstream[steps])
        grad_input_gates = _pool.take(gates, gates.shape, gates.dtype)
        hidden_gates_own = (
            (_pool.take(gates, gates.shape, gates.dtype),) if self.separate_hidden_gates else ()
        )
        grad_hidden_gates = hidden_gates_own[0] if hidden_gates_own else grad_input_gates
        gradients = _WeightGradients(inputs, weight_ih, weight_hh, self.needs_input_grad[0])

        def run(part):
            self._steps_backward(
                part,
                grad_steps[part],
                grad_hidden[part],
                gates[part],
                hiddens[part],
                weight_hh[part],
                grad_input_gates[part],
                grad_hidden_gates[part],
            )
            gradients.add(part, grad_input_gates[part], grad_hidden_gates[part], hiddens[part])

        _for_each_direction(gates, directions, run, weight_hh[0].size * gates.shape[2])
        grad_x = gradients.layer_input(self.batch_first)
        _pool.give(grad_steps, grad_input_gates, *hidden_gates_own, gradients.inputs_grad)
        return (
            grad_x,
            gradients.weight_ih,
            gradients.weight_hh,
            grad_hidden,
            gradients.bias_ih if self.has_bias else None,
            gradients.bias_hh if self.has_bias else None,
        )

    def _release_extra(self) -> None:
        super()._release_extra()
        self.cell_saved = ()

    def _prepare(self, x, weight_ih, weight_hh, bias_ih, bias_hh, steps: int, batch: int, **cell):
        """Set up the steps (``cell_saved`` among them); return the input projection's
        weight, ``(D, F, G)``, and bias, ``(D, G)`` or None."""
        raise NotImplementedError  # pragma: no cover - each cell has its own

    def _steps(self, part, gates, hiddens) -> None:
        """The recurrence of directions ``part``: ``gates`` hold the input projection of
        every step; fill ``hiddens[:, 1:]``."""
        raise NotImplementedError  # pragma: no cover - each cell has its own

    def _steps_backward(
        self,
        part,
        grad_steps,
        grad_hidden,
        gates,
        hiddens,
        weight_hh,
        grad_gates,
        grad_hidden_gates,
    ) -> None:
        """Back-propagation through time of directions ``part``: fill the gate gradients of
        the input projection (``grad_gates``) and of the hidden one; ``grad_hidden (D, N,
        H)`` holds the final state's gradient on entry and the initial state's on exit."""
        raise NotImplementedError  # pragma: no cover - each cell has its own


class GRUSequence(_ProjectedSequence):
    """One GRU layer over a sequence (``_ProjectedSequence`` with ``G = 3H``, gates ``[r, z,
    n]``).

    As in PyTorch, the reset gate scales the hidden part of the candidate *including* its
    bias: ``n = tanh(x_n + r * (h @ W_hn.T + b_hn))``.
    """

    gate_kinds = ("sigmoid", "sigmoid", "tanh")
    cudnn_cell = "gru"

    def _prepare(self, x, weight_ih, weight_hh, bias_ih, bias_hh, steps: int, batch: int):
        xp = backend.array_module(x)
        directions, _, size = weight_hh.shape
        activations = _GateActivations(xp, self.gate_kinds, size, x.dtype)
        # r and z add the input and hidden projections before activating, n does not
        # (r multiplies n's hidden part first); all three blocks get the inner scale.
        self.activations = activations
        self.scaled_weight_hh = activations.scaled_transposed(weight_hh)
        self.scaled_bias_hh = None if bias_hh is None else bias_hh * activations.scale
        # h @ W_hn.T + b_hn of every step
        self.cell_saved = (_pool.take(x, (directions, steps, batch, size), x.dtype),)
        scaled_bias_ih = None if bias_ih is None else bias_ih * activations.scale
        return activations.scaled_transposed(weight_ih), scaled_bias_ih

    def _steps(self, part, gates, hiddens) -> None:
        _gru_steps(
            gates,
            hiddens,
            self.cell_saved[0][part],
            self.scaled_weight_hh[part],
            _part(self.scaled_bias_hh, part),
            self.activations,
        )

    def _steps_backward(
        self,
        part,
        grad_steps,
        grad_hidden,
        gates,
        hiddens,
        weight_hh,
        grad_gates,
        grad_hidden_gates,
    ) -> None:
        _gru_steps_backward(
            grad_steps,
            grad_hidden,
            gates,
            hiddens,
            self.cell_saved[0][part],
            weight_hh,
            grad_gates,
            grad_hidden_gates,
        )


class RNNSequence(_ProjectedSequence):
    """One Elman RNN layer over a sequence (``_ProjectedSequence`` with ``G = H``)::

        h_t = nonlinearity(x_t @ W_ih.T + b_ih + h_{t-1} @ W_hh.T + b_hh)

    with ``nonlinearity`` ``"tanh"`` or ``"relu"``. Both derivatives are read from ``h_t``
    (``1 - h_t**2``; ``h_t > 0``, PyTorch's choice of 0 at 0), so nothing but the hidden
    states is kept for the backward; the input and hidden projections share their gate
    gradients.
    """

    separate_hidden_gates = False
    nonlinearities = ("tanh", "relu")

    def _prepare(self, x, weight_ih, weight_hh, bias_ih, bias_hh, steps, batch, nonlinearity):
        if nonlinearity not in self.nonlinearities:
            raise ValueError(
                f"RNNSequence: nonlinearity must be one of {self.nonlinearities}, "
                f"got {nonlinearity!r}"
            )
        xp = backend.array_module(x)
        self.nonlinearity = nonlinearity
        self.weight_hh_t = xp.ascontiguousarray(xp.swapaxes(weight_hh, 1, 2))
        # Both biases enter every step alike: added once, in the input projection.
        bias = None if bias_ih is None else bias_ih + bias_hh
        return xp.ascontiguousarray(xp.swapaxes(weight_ih, 1, 2)), bias

    def _steps(self, part, gates, hiddens) -> None:
        xp = backend.array_module(gates)
        weight_hh_t = self.weight_hh_t[part]
        pre_activation = xp.empty(hiddens.shape[:1] + hiddens.shape[2:], dtype=gates.dtype)
        matmul = cublas.matmul_for(gates)
        for t in range(gates.shape[1]):
            matmul(hiddens[:, t], weight_hh_t, out=pre_activation)
            pre_activation += gates[:, t]
            if self.nonlinearity == "tanh":
                xp.tanh(pre_activation, out=hiddens[:, t + 1])
            else:
                xp.maximum(pre_activation, 0, out=hiddens[:, t + 1])

    def _steps_backward(
        self,
        part,
        grad_steps,
        grad_hidden,
        gates,
        hiddens,
        weight_hh,
        grad_gates,
        grad_hidden_gates,
    ) -> None:
        xp = backend.array_module(gates)
        matmul = cublas.matmul_for(gates)
        for t in reversed(range(gates.shape[1])):
            grad_hidden += grad_steps[:, t]
            hidden, grad_step = hiddens[:, t + 1], grad_gates[:, t]
            if self.nonlinearity == "tanh":
                xp.multiply(hidden, hidden, out=grad_step)
                xp.subtract(1, grad_step, out=grad_step)
                grad_step *= grad_hidden
            else:
                xp.multiply(grad_hidden, hidden > 0, out=grad_step)
            matmul(grad_step, weight_hh, out=grad_hidden)


def _gru_steps(gates, hiddens, hidden_candidates, scaled_weight_hh, scaled_bias_hh, activations):
    """The GRU recurrence of a block of directions, in place (see ``_lstm_steps``);
    ``hidden_candidates`` receives ``h_{t-1} @ W_hn.T + b_hn`` of every step."""
    xp = backend.array_module(gates)
    directions, steps, batch, gate_width = gates.shape
    size = gate_width // 3
    hidden_part = xp.empty((directions, batch, gate_width), dtype=gates.dtype)
    input_candidate = xp.empty((directions, batch, size), dtype=gates.dtype)
    matmul = cublas.matmul_for(gates)
    for t in range(steps):
        matmul(hiddens[:, t], scaled_weight_hh, out=hidden_part)
        if scaled_bias_hh is not None:
            hidden_part += scaled_bias_hh[:, None, :]
        step_gates = gates[:, t]
        input_candidate[...] = step_gates[..., 2 * size :]
        hidden_candidates[:, t] = hidden_part[..., 2 * size :]
        step_gates += hidden_part
        activations.activate_(step_gates)  # r and z are right; n is redone below
        reset_gate, update_gate, candidate = _split(step_gates, 3)
        xp.multiply(reset_gate, hidden_candidates[:, t], out=hidden_part[..., :size])
        input_candidate += hidden_part[..., :size]
        xp.tanh(input_candidate, out=candidate)
        # h_t = (1 - z) * n + z * h_{t-1}, with one multiply.
        xp.subtract(hiddens[:, t], candidate, out=hiddens[:, t + 1])
        hiddens[:, t + 1] *= update_gate
        hiddens[:, t + 1] += candidate


def _gru_steps_backward(
    grad_steps,
    grad_hidden,
    gates,
    hiddens,
    hidden_candidates,
    weight_hh,
    grad_input_gates,
    grad_hidden_gates,
) -> None:
    """Back-propagation through time of a block of GRU directions (see
    ``_lstm_steps_backward``): the input and the hidden projections' gate gradients."""
    matmul = cublas.matmul_for(gates)
    for t in reversed(range(gates.shape[1])):
        grad_hidden += grad_steps[:, t]
        reset_gate, update_gate, candidate = _split(gates[:, t], 3)
        grad_reset, grad_update, grad_candidate = _split(grad_input_gates[:, t], 3)
        grad_candidate[...] = grad_hidden * (1 - update_gate) * (1 - candidate * candidate)
        grad_update[...] = grad_hidden * (hiddens[:, t] - candidate)
        grad_update *= update_gate * (1 - update_gate)
        grad_reset[...] = grad_candidate * hidden_candidates[:, t]
        grad_reset *= reset_gate * (1 - reset_gate)
        hidden_gates = grad_hidden_gates[:, t]
        hidden_gates[...] = grad_input_gates[:, t]
        _, _, grad_hidden_candidate = _split(hidden_gates, 3)
        grad_hidden_candidate *= reset_gate
        grad_hidden *= update_gate
        grad_hidden += matmul(hidden_gates, weight_hh)


# --- running the directions -----------------------------------------------------------------
def _for_each_direction(like, directions: int, work, step_size: int) -> None:
    """Call ``work(part)`` for slices ``part`` of the direction axis that cover it: one slice
    of all directions on the calling thread, or one direction per thread (BLAS held to one
    thread meanwhile) when BLAS may use several and there are two directions.

    One direction with BLAS on several threads runs with BLAS held to one thread when a
    step's GEMM (``step_size`` multiply-adds) is small, for the same reason.
    """
    on_gpu = backend.is_device_array(like)
    workers = 1 if on_gpu else conv_tiles.worker_count()
    if workers > 1 and directions == 1 and step_size < _SMALL_STEP_GEMM:
        with backend.blas_threads(1):
            work(slice(0, 1))
        return
    size = 1 if workers > 1 else directions
    conv_tiles.for_each_tile(
        directions, size, lambda first, last, _: work(slice(first, last)), on_gpu=on_gpu
    )


def _part(array, part):
    """``array[part]``, or None for None."""
    return None if array is None else array[part]


def _project(inputs, scaled_weight_t, scaled_bias, gates) -> None:
    """``gates = inputs @ W.T + b`` (scaled) for a block of directions, one GEMM each."""
    directions, steps, batch, features = inputs.shape
    flat_gates = gates.reshape(directions, steps * batch, gates.shape[-1])  # a view
    flat_inputs = inputs.reshape(directions, steps * batch, features)
    cublas.matmul_for(inputs)(flat_inputs, scaled_weight_t, out=flat_gates)
    if scaled_bias is not None:
        flat_gates += scaled_bias[:, None, :]


class _WeightGradients:
    """The gradients of ``W_ih``, ``W_hh``, the biases and the layer input, filled in one
    block of directions at a time (each block by the thread that ran its recurrence)."""

    def __init__(self, inputs, weight_ih, weight_hh, needs_input: bool):
        xp = backend.array_module(inputs)
        self.inputs = inputs
        self.weight_ih_value = weight_ih
        self.weight_ih = xp.empty_like(weight_ih)
        self.weight_hh = xp.empty_like(weight_hh)
        self.bias_ih = xp.empty(weight_ih.shape[:2], dtype=weight_ih.dtype)
        self.bias_hh = xp.empty_like(self.bias_ih)
        self.inputs_grad = _pool.take(inputs, inputs.shape, inputs.dtype) if needs_input else None

    def add(self, part, grad_input_gates, grad_hidden_gates, hiddens) -> None:
        """Fill in ``part``'s gradients from its gates' gradients (those of the input and
        of the hidden projection: the same array for an LSTM) and its hidden states."""
        xp = backend.array_module(grad_input_gates)
        directions, steps, batch, gate_width = grad_input_gates.shape
        flat_input_gates = grad_input_gates.reshape(directions, steps * batch, gate_width)
        flat_hidden_gates = grad_hidden_gates.reshape(directions, steps * batch, gate_width)
        inputs = self.inputs[part]
        flat_inputs = inputs.reshape(directions, steps * batch, inputs.shape[-1])
        previous_hiddens = hiddens[:, :steps].reshape(directions, steps * batch, -1)
        matmul = cublas.matmul_for(grad_input_gates)
        matmul(xp.swapaxes(flat_input_gates, 1, 2), flat_inputs, out=self.weight_ih[part])
        matmul(xp.swapaxes(flat_hidden_gates, 1, 2), previous_hiddens, out=self.weight_hh[part])
        flat_input_gates.sum(axis=1, out=self.bias_ih[part])
        flat_hidden_gates.sum(axis=1, out=self.bias_hh[part])
        if self.inputs_grad is not None:
            inputs_grad = self.inputs_grad[part].reshape(flat_inputs.shape)  # a view
            matmul(flat_input_gates, self.weight_ih_value[part], out=inputs_grad)

    def layer_input(self, batch_first: bool):
        """The layer input's gradient (None if not needed)."""
        return _summed_input_gradient(self.inputs_grad, batch_first)


def _summed_input_gradient(inputs_grad, batch_first: bool):
    """The layer input's gradient from each direction's part ``(D, T, N, F)`` (None for
    None): the parts summed, back in time order and the layer's layout."""
    if inputs_grad is None:
        return None
    if inputs_grad.shape[0] == 1:
        return _to_layer_layout(inputs_grad, [], batch_first)
    xp = backend.array_module(inputs_grad)
    _, steps, batch, features = inputs_grad.shape
    grad_x = _empty_layer_layout(xp, 1, steps, batch, features, inputs_grad.dtype, batch_first)
    # One pass writing the sum into the layout, rather than a copy and an addition.
    target = _time_major_blocks(grad_x, 1, batch_first)[:, :, 0]  # (T, N, F), a view
    xp.add(inputs_grad[0], inputs_grad[1, ::-1], out=target)
    return grad_x


# --- layout helpers -----------------------------------------------------------------------
def _split(array, parts: int, axis: int = -1) -> list:
    """Views of the ``parts`` equal blocks of ``axis`` (the gates)."""
    size = array.shape[axis] // parts
    index = [slice(None)] * array.ndim
    blocks = []
    for k in range(parts):
        index[axis] = slice(k * size, (k + 1) * size)
        blocks.append(array[tuple(index)])
    return blocks


def _time_major_blocks(array, directions: int, batch_first: bool):
    """A ``(T, N, D, K)`` view of a layer-layout array whose features are ``D`` blocks."""
    xp = backend.array_module(array)
    first, second, features = array.shape
    blocks = array.reshape(first, second, directions, features // directions)
    return xp.swapaxes(blocks, 0, 1) if batch_first else blocks


def _to_steps(time_major_blocks):
    """A new contiguous ``(D, T, N, K)`` array, each direction in its reading order (the
    reverse one back to front)."""
    steps, batch, directions, size = time_major_blocks.shape
    result = _pool.take(
        time_major_blocks, (directions, steps, batch, size), time_major_blocks.dtype
    )
    for direction in range(directions):
        source = time_major_blocks[:, :, direction]
        result[direction] = source[::-1] if direction else source
    return result


def _inputs_by_direction(x, directions: int, batch_first: bool):
    """The layer input as each direction reads it, ``(D, T, N, F)``, contiguous."""
    xp = backend.array_module(x)
    time_major = _time_major_blocks(x, 1, batch_first)  # (T, N, 1, F)
    return _to_steps(xp.broadcast_to(time_major, (*time_major.shape[:2], directions, x.shape[-1])))


def _empty_gates(inputs, weight_ih):
    """An uninitialised ``(D, T, N, gates * H)`` array for the gates."""
    return _pool.take(inputs, (*inputs.shape[:3], weight_ih.shape[1]), inputs.dtype)


def _final_state(time_major_row):
    """A new ``(D, N, H)`` array from one ``(N, D, H)`` row of a time-major view."""
    xp = backend.array_module(time_major_row)
    return xp.ascontiguousarray(xp.swapaxes(time_major_row, 0, 1))


def _to_layer_layout(steps_array, final_rows: list, batch_first: bool):
    """One new layer-layout array: ``steps_array (D, T, N, K)`` as rows ``0..T-1`` (back in
    time order), then one row per ``(D, N, K)`` array of ``final_rows``."""
    xp = backend.array_module(steps_array)
    directions, steps, batch, size = steps_array.shape
    result = _empty_layer_layout(
        xp, directions, steps + len(final_rows), batch, size, steps_array.dtype, batch_first
    )
    _fill_layer_layout(result, steps_array, final_rows, 0, batch_first)
    return result


def _empty_layer_layout(xp, directions, rows, batch, size, dtype, batch_first: bool):
    """An uninitialised layer-layout array of ``rows`` rows."""
    shape = (batch, rows, directions * size) if batch_first else (rows, batch, directions * size)
    return xp.empty(shape, dtype=dtype)


def _fill_layer_layout(result, steps_array, final_rows: list, first_direction, batch_first):
    """Write directions ``first_direction, ...`` of a layer-layout array (see
    ``_to_layer_layout``), one per entry of ``steps_array`` and of each ``final_rows`` array."""
    xp = backend.array_module(steps_array)
    count, steps, _, size = steps_array.shape
    target = _time_major_blocks(result, result.shape[-1] // size, batch_first)  # a view
    for offset in range(count):
        sequence = target[:steps, :, first_direction + offset]
        (sequence[::-1] if first_direction + offset else sequence)[...] = steps_array[offset]
    directions = slice(first_direction, first_direction + count)
    for row, final in enumerate(final_rows):
        target[steps + row, :, directions] = xp.swapaxes(final, 0, 1)
