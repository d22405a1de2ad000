"""The recurrences of one LSTM or GRU layer over a whole sequence, as fused ``Function``s.

The input projection ``x @ W_ih.T + b_ih`` of every time step is one GEMM done before the
recurrence (by ``ops.linear`` in ``recurrent.py``); what is left, ``h_{t-1} @ W_hh.T`` and
the gate arithmetic, runs here in a Python loop over time on raw arrays. The backward is
back-propagation through time written out by hand: one loop back over the steps that
keeps the pre-activation gradients of every step, then ``W_hh``'s gradient from all steps
in one GEMM. Compared with recording each step's ops in the graph this is a single graph
node per layer, so a sequence of any length adds no depth to the backward walk, and it
avoids allocating a full-sequence gradient for every per-step slice.

Gate layouts are PyTorch's: LSTM ``[i, f, g, o]``, GRU ``[r, z, n]``, stacked along the
first axis of the weights. Arrays are time-major inside; ``batch_first`` inputs and outputs
are ``(N, T, ...)`` and are transposed on the way in and out.

Per-operation overhead and operations on strided gate blocks are much of a step's cost, so
the forward adds the hidden projection's bias for all steps at once and activates a step's
gates with three whole-row operations (see ``_GateActivations``).
"""

from __future__ import annotations

from bigdl_py import backend
from bigdl_py.autograd.function import Function


class _GateActivations:
    """Sigmoid and tanh gates of one gates row, as ``scale * tanh(scale * x) + shift``.

    ``sigmoid(x) = 0.5 * tanh(0.5 * x) + 0.5``, so with a per-column ``scale`` (0.5 for a
    sigmoid gate, 1 for a tanh gate) and ``shift`` (0.5 or 0), one tanh over the whole row
    activates every gate, and nothing can overflow. The inner scale is applied once to the
    inputs and the recurrent weight (exact: a power of two).
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


class LSTMSequence(Function):
    """One LSTM layer over a sequence.

    Inputs: ``input_gates`` (the input projection of every step, ``(T, N, 4H)`` or
    ``(N, T, 4H)``), ``weight_hh (4H, H)``, ``h0 (N, H)``, ``c0 (N, H)`` and, optionally,
    ``bias_hh (4H,)``. The output packs the hidden states of every step and the last cell
    state, because a ``Function`` has one output: ``(T + 1, N, H)`` (or ``(N, T + 1, H)``),
    rows ``0..T-1`` are ``h_1..h_T`` and row ``T`` is ``c_T``.
    """

    gate_kinds = ("sigmoid", "sigmoid", "tanh", "sigmoid")

    def forward(self, input_gates, weight_hh, h0, c0, bias_hh=None, batch_first=True):
        xp = backend.array_module(input_gates)
        steps, batch, gate_width = _time_major(input_gates, batch_first).shape
        size, dtype = gate_width // 4, input_gates.dtype
        activations = _GateActivations(xp, self.gate_kinds, size, dtype)
        # Every step's gates, pre-activation at first: the input projection with bias_hh
        # added and the activation's inner scale applied, for all steps at once; each step
        # then adds h_{t-1} @ W_hh.T and activates in place.
        gates = _time_major_copy(input_gates, batch_first, bias_hh)
        gates *= activations.scale
        scaled_weight_hh = weight_hh * activations.scale[:, None]
        hiddens = xp.empty((steps + 1, batch, size), dtype=dtype)  # h_0 .. h_T
        cells = xp.empty((steps + 1, batch, size), dtype=dtype)  # c_0 .. c_T
        tanh_cells = xp.empty((steps, batch, size), dtype=dtype)
        hiddens[0], cells[0] = h0, c0
        for t in range(steps):
            step_gates = gates[t]
            step_gates += hiddens[t] @ scaled_weight_hh.T
            activations.activate_(step_gates)
            input_gate, forget_gate, cell_candidate, output_gate = _split(step_gates, 4)
            xp.multiply(forget_gate, cells[t], out=cells[t + 1])
            cells[t + 1] += input_gate * cell_candidate
            xp.tanh(cells[t + 1], out=tanh_cells[t])
            xp.multiply(output_gate, tanh_cells[t], out=hiddens[t + 1])
        self.batch_first, self.has_bias = batch_first, bias_hh is not None
        self.save_for_backward(gates, hiddens, cells, tanh_cells, weight_hh)
        return _pack([hiddens[1:], cells[steps:]], batch_first)

    def backward(self, grad):
        gates, hiddens, cells, tanh_cells, weight_hh = self.saved
        xp = backend.array_module(gates)
        upstream = _time_major(grad, self.batch_first)
        steps = gates.shape[0]
        # Per step, in cache: multiplying in the activation derivatives of all steps at
        # once measured slower on sequences of realistic size.
        grad_gates = xp.empty_like(gates)  # gradients of the gates before activation
        grad_hidden = xp.zeros_like(hiddens[0])
        grad_cell = upstream[steps].copy()
        for t in reversed(range(steps)):
            grad_hidden += upstream[t]
            input_gate, forget_gate, cell_candidate, output_gate = _split(gates[t], 4)
            grad_input, grad_forget, grad_candidate, grad_output = _split(grad_gates[t], 4)
            tanh_cell = tanh_cells[t]
            grad_cell += grad_hidden * output_gate * (1 - tanh_cell * tanh_cell)
            grad_input[...] = grad_cell * cell_candidate * input_gate * (1 - input_gate)
            grad_forget[...] = grad_cell * cells[t] * forget_gate * (1 - forget_gate)
            grad_candidate[...] = grad_cell * input_gate * (1 - cell_candidate * cell_candidate)
            grad_output[...] = grad_hidden * tanh_cell * output_gate * (1 - output_gate)
            grad_cell *= forget_gate
            grad_hidden = grad_gates[t] @ weight_hh
        return (
            _layer_layout(grad_gates, self.batch_first),
            _weight_gradient(grad_gates, hiddens),
            grad_hidden,
            grad_cell,
            grad_gates.sum(axis=(0, 1)) if self.has_bias else None,
        )


class GRUSequence(Function):
    """One GRU layer over a sequence.

    Inputs: ``input_gates`` (``(T, N, 3H)`` or ``(N, T, 3H)``), ``weight_hh (3H, H)``,
    ``h0 (N, H)`` and, optionally, ``bias_hh (3H,)``. Output: the hidden state of every step,
    ``(T, N, H)`` or ``(N, T, H)``. As in PyTorch, the reset gate scales the hidden part of
    the candidate *including* its bias: ``n = tanh(x_n + r * (h @ W_hn.T + b_hn))``.
    """

    gate_kinds = ("sigmoid", "sigmoid", "tanh")

    def forward(self, input_gates, weight_hh, h0, bias_hh=None, batch_first=True):
        xp = backend.array_module(input_gates)
        steps, batch, gate_width = _time_major(input_gates, batch_first).shape
        size, dtype = gate_width // 3, input_gates.dtype
        activations = _GateActivations(xp, self.gate_kinds, size, dtype)
        # r and z add the input and hidden projections before activating, n does not
        # (r multiplies n's hidden part first); all three blocks get the inner scale.
        gates = _time_major_copy(input_gates, batch_first)
        gates *= activations.scale
        scaled_weight_hh = weight_hh * activations.scale[:, None]
        scaled_bias_hh = None if bias_hh is None else bias_hh * activations.scale
        hiddens = xp.empty((steps + 1, batch, size), dtype=dtype)
        hidden_candidates = xp.empty((steps, batch, size), dtype=dtype)  # h @ W_hn.T + b_hn
        hiddens[0] = h0
        for t in range(steps):
            hidden_part = hiddens[t] @ scaled_weight_hh.T
            if scaled_bias_hh is not None:
                hidden_part += scaled_bias_hh
            step_gates = gates[t]
            input_candidate = step_gates[:, 2 * size :].copy()
            hidden_candidates[t] = hidden_part[:, 2 * size :]
            step_gates += hidden_part
            activations.activate_(step_gates)  # r and z are right; n is redone below
            reset_gate, update_gate, candidate = _split(step_gates, 3)
            input_candidate += reset_gate * hidden_candidates[t]
            xp.tanh(input_candidate, out=candidate)
            # h_t = (1 - z) * n + z * h_{t-1}, with one multiply.
            xp.subtract(hiddens[t], candidate, out=hiddens[t + 1])
            hiddens[t + 1] *= update_gate
            hiddens[t + 1] += candidate
        self.batch_first, self.has_bias = batch_first, bias_hh is not None
        self.save_for_backward(gates, hiddens, hidden_candidates, weight_hh)
        return _pack([hiddens[1:]], batch_first)

    def backward(self, grad):
        gates, hiddens, hidden_candidates, weight_hh = self.saved
        xp = backend.array_module(gates)
        upstream = _time_major(grad, self.batch_first)
        steps = gates.shape[0]
        # The input and hidden projections share the r and z gradients; only n's differ
        # (the hidden part of n is scaled by r).
        grad_input_gates = xp.empty_like(gates)
        grad_hidden_gates = xp.empty_like(gates)
        grad_hidden = xp.zeros_like(hiddens[0])
        for t in reversed(range(steps)):
            grad_hidden += upstream[t]
            reset_gate, update_gate, candidate = _split(gates[t], 3)
            grad_reset, grad_update, grad_candidate = _split(grad_input_gates[t], 3)
            grad_candidate[...] = grad_hidden * (1 - update_gate) * (1 - candidate * candidate)
            grad_update[...] = grad_hidden * (hiddens[t] - candidate)
            grad_update *= update_gate * (1 - update_gate)
            grad_reset[...] = grad_candidate * hidden_candidates[t] * reset_gate * (1 - reset_gate)
            hidden_gates = grad_hidden_gates[t]
            hidden_gates[...] = grad_input_gates[t]
            _, _, grad_hidden_candidate = _split(hidden_gates, 3)
            grad_hidden_candidate *= reset_gate
            grad_hidden *= update_gate
            grad_hidden += hidden_gates @ weight_hh
        return (
            _layer_layout(grad_input_gates, self.batch_first),
            _weight_gradient(grad_hidden_gates, hiddens),
            grad_hidden,
            grad_hidden_gates.sum(axis=(0, 1)) if self.has_bias else None,
        )


# --- layout helpers -----------------------------------------------------------------------
def _split(array, parts: int) -> list:
    """Views of the ``parts`` equal blocks of the last axis (the gates)."""
    size = array.shape[-1] // parts
    return [array[..., k * size : (k + 1) * size] for k in range(parts)]


def _time_major(array, batch_first: bool):
    """A ``(T, N, ...)`` view of a sequence array given in the layer's layout."""
    return backend.array_module(array).swapaxes(array, 0, 1) if batch_first else array


def _time_major_copy(sequence, batch_first: bool, bias=None):
    """A new C-contiguous time-major array of a sequence, plus ``bias`` if given."""
    xp = backend.array_module(sequence)
    copy = xp.array(_time_major(sequence, batch_first), order="C", copy=True)
    if bias is not None:
        copy += bias
    return copy


def _pack(time_major_parts: list, batch_first: bool):
    """Time-major arrays joined along time into one new array in the layer's layout."""
    xp = backend.array_module(time_major_parts[0])
    steps = sum(part.shape[0] for part in time_major_parts)
    batch, size = time_major_parts[0].shape[1:]
    shape = (batch, steps, size) if batch_first else (steps, batch, size)
    packed = xp.empty(shape, dtype=time_major_parts[0].dtype)
    target, start = _time_major(packed, batch_first), 0
    for part in time_major_parts:
        target[start : start + part.shape[0]] = part
        start += part.shape[0]
    return packed


def _layer_layout(time_major_array, batch_first: bool):
    """A contiguous array in the layer's layout from a time-major one."""
    xp = backend.array_module(time_major_array)
    if not batch_first:
        return time_major_array
    return xp.ascontiguousarray(xp.swapaxes(time_major_array, 0, 1))


def _weight_gradient(grad_gates, hiddens):
    """``sum_t grad_gates[t].T @ h_{t-1}``: ``W_hh``'s gradient over all steps in one GEMM."""
    gate_width, size = grad_gates.shape[-1], hiddens.shape[-1]
    return grad_gates.reshape(-1, gate_width).T @ hiddens[:-1].reshape(-1, size)
