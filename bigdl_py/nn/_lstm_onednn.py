"""One direction of an LSTM layer by oneDNN's LSTM primitive (float32, CPU), where its
library is installed (``bigdl_py.autograd.ops.onednn``).

Why: the bench's bidirectional LSTM (batch 32, 128 steps, 128 features, 128 hidden) took
97 ms a step on our NumPy recurrence against PyTorch's 75-78 at one thread (1.26-1.29x),
and the NumPy route's GEMMs alone, at 45 GMAC/s, take ~71 ms of it. PyTorch runs its CPU
LSTM through oneDNN's primitive (``aten::mkldnn_rnn_layer``), which fuses each step's gate
arithmetic into its GEMM's output pass: one direction's forward took 12.5 ms and its
backward 25.0 here, ~75 ms for the layer's step (2026-11-25, AMD EPYC), with results equal
to PyTorch's bit for bit.

How: one :class:`_Direction` per geometry (steps, batch, features, hidden size, reading
order, layout, training or inference) holds the forward primitive and, made on first use,
the backward one. The layer's directions are separate unidirectional primitives (the
reverse one reads the sequence back to front itself) so that ``LSTMSequence`` can run
them on two threads, each primitive on one OpenMP thread as every oneDNN primitive here.
Weights go in in PyTorch's layout, ``(4H, F)`` per direction with gates ``[i, f, g, o]``
(oneDNN's order too), reordered into the kernel's; biases enter as ``b_ih + b_hh``.
Training forwards fill a workspace (~40 MB for the bench's direction: every step's gates
and states) that the backward reads; inference forwards (no gradient recorded) keep none.
The backward overwrites the weights' gradients (oneDNN would otherwise add to them).
"""

from __future__ import annotations

import threading

import numpy as np

from bigdl_py.autograd.ops import onednn
from bigdl_py.autograd.ops.onednn import (
    ARG_BIAS,
    ARG_DIFF_BIAS,
    ARG_DST_ITER,
    ARG_DST_ITER_C,
    ARG_DST_LAYER,
    ARG_SRC_ITER,
    ARG_SRC_ITER_C,
    ARG_SRC_LAYER,
    ARG_WEIGHTS_ITER,
    ARG_WEIGHTS_LAYER,
    ARG_WORKSPACE,
    QUERY_EXEC_ARG,
    QUERY_WORKSPACE,
    OneDNNError,
    loaded,
    one_openmp_thread,
)

# oneDNN's "diff" arguments are the plain ones plus 128.
_DIFF = 128
# Axes of a weight (layers, directions, inputs, gates, outputs) as PyTorch stores them:
# (4H, F) per direction, that is gates, outputs, inputs ("ldgoi").
_PYTORCH_WEIGHT_TAG = "abdec"


class _Direction(onednn.PrimitiveSet):
    """oneDNN's primitives for one direction of one LSTM geometry."""

    def __init__(self, library, steps, batch, features, size, reverse, batch_first, training):
        super().__init__(library)
        self.training = training
        self.shapes = (steps, batch, features, size)
        sequence_tag = "bac" if batch_first else "abc"  # (T, N, C) axes, batch outermost or not
        self.x_md = self.own(library.plain_md((steps, batch, features), sequence_tag))
        self.y_md = self.own(library.plain_md((steps, batch, size), sequence_tag))
        self.state_md = self.own(library.plain_md((1, 1, batch, size)))
        self.bias_md = self.own(library.plain_md((1, 1, 4, size)))
        self.weight_layer_md = self.own(
            library.plain_md((1, 1, features, 4, size), _PYTORCH_WEIGHT_TAG)
        )
        self.weight_iter_md = self.own(library.plain_md((1, 1, size, 4, size), _PYTORCH_WEIGHT_TAG))
        self.anys = (
            self.own(library.any_md((1, 1, features, 4, size))),
            self.own(library.any_md((1, 1, size, 4, size))),
        )
        self.direction = (
            onednn.UNIDIRECTIONAL_RIGHT2LEFT if reverse else onednn.UNIDIRECTIONAL_LEFT2RIGHT
        )
        state = self.state_md
        forward = self.descriptor(
            "dnnl_lstm_forward_primitive_desc_create",
            onednn.FORWARD_TRAINING if training else onednn.FORWARD_INFERENCE,
            self.direction,
            self.x_md,
            state,
            state,
            *self.anys,
            None,  # no peephole
            None,  # no projection
            self.bias_md,
            self.y_md,
            state,
            state,
            0,
            library.attributes,
        )
        self.forward_descriptor = forward
        self.forward_primitive = self.primitive(forward)
        self.forward_weights = self._weight_layouts(forward, 0, True)
        self.workspace_md = None
        self.workspace_bytes = 0
        if training:
            self.workspace_md = library.dnnl.dnnl_primitive_desc_query_md(
                forward, QUERY_WORKSPACE, 0
            )
            self.workspace_bytes = library.dnnl.dnnl_memory_desc_get_size(self.workspace_md)
        self._backward_lock = threading.Lock()
        self._backward_ready = False

    def _weight_layouts(self, descriptor, diff: int, into_kernel: bool):
        return tuple(
            self.layout(descriptor, QUERY_EXEC_ARG, plain, into_kernel, argument + diff)
            for plain, argument in (
                (self.weight_layer_md, ARG_WEIGHTS_LAYER),
                (self.weight_iter_md, ARG_WEIGHTS_ITER),
            )
        )

    def make_backward(self) -> None:
        """Make the backward primitive (once; the first backward of any thread)."""
        with self._backward_lock, one_openmp_thread(self.library):
            if self._backward_ready:
                return
            state = self.state_md
            plain = (self.x_md, state, state, *self.anys, None, None, self.bias_md)
            plain += (self.y_md, state, state)
            backward = self.descriptor(
                "dnnl_lstm_backward_primitive_desc_create",
                onednn.BACKWARD,
                self.direction,
                *plain,
                *plain,  # the gradients have the same descriptors
                onednn.RNN_DIFF_WEIGHTS_OVERWRITE,
                self.forward_descriptor,
                self.library.attributes,
            )
            self.backward_primitive = self.primitive(backward)
            self.backward_weights = self._weight_layouts(backward, 0, True)
            self.weight_gradients = self._weight_layouts(backward, _DIFF, False)
            self._backward_ready = True

    def _common_arguments(self, weights_md_and_arrays, x, bias, h0, c0, y, hn, cn, workspace):
        (layer_md, layer), (iter_md, iteration) = weights_md_and_arrays
        state = self.state_md
        arguments = [
            (ARG_SRC_LAYER, self.x_md, x),
            (ARG_SRC_ITER, state, h0),
            (ARG_SRC_ITER_C, state, c0),
            (ARG_WEIGHTS_LAYER, layer_md, layer),
            (ARG_WEIGHTS_ITER, iter_md, iteration),
            (ARG_BIAS, self.bias_md, bias),
            (ARG_DST_LAYER, self.y_md, y),
            (ARG_DST_ITER, state, hn),
            (ARG_DST_ITER_C, state, cn),
        ]
        if workspace is not None:
            arguments.append((ARG_WORKSPACE, self.workspace_md, workspace))
        return arguments

    def forward(self, x, weight_ih, weight_hh, bias, h0, c0, y, hn, cn, workspace) -> None:
        """Fills ``y`` (the sequence's hidden states), ``hn``, ``cn`` and, training, the
        workspace the backward reads."""
        weights = [
            self.into(layout, w)
            for layout, w in zip(self.forward_weights, (weight_ih, weight_hh), strict=True)
        ]
        arguments = self._common_arguments(weights, x, bias, h0, c0, y, hn, cn, workspace)
        self.run(self.forward_primitive, arguments)

    def backward(self, saved, grads, out) -> None:
        """``saved``: the forward's ``(x, weight_ih, weight_hh, bias, h0, c0, y, hn, cn,
        workspace)``; ``grads``: those of ``y``, ``hn`` and ``cn``; ``out``: arrays for the
        gradients of ``x``, ``h0``, ``c0``, ``weight_ih``, ``weight_hh`` and the bias."""
        self.make_backward()
        x, weight_ih, weight_hh, bias, h0, c0, y, hn, cn, workspace = saved
        grad_y, grad_hn, grad_cn = grads
        grad_x, grad_h0, grad_c0, grad_weight_ih, grad_weight_hh, grad_bias = out
        weights = [
            self.into(layout, w)
            for layout, w in zip(self.backward_weights, (weight_ih, weight_hh), strict=True)
        ]
        written = [
            self.result(layout, target)
            for layout, target in zip(
                self.weight_gradients, (grad_weight_ih, grad_weight_hh), strict=True
            )
        ]
        state = self.state_md
        arguments = self._common_arguments(weights, x, bias, h0, c0, y, hn, cn, workspace)
        arguments += [
            (ARG_SRC_LAYER + _DIFF, self.x_md, grad_x),
            (ARG_SRC_ITER + _DIFF, state, grad_h0),
            (ARG_SRC_ITER_C + _DIFF, state, grad_c0),
            (ARG_WEIGHTS_LAYER + _DIFF, *written[0]),
            (ARG_WEIGHTS_ITER + _DIFF, *written[1]),
            (ARG_DIFF_BIAS, self.bias_md, grad_bias),
            (ARG_DST_LAYER + _DIFF, self.y_md, grad_y),
            (ARG_DST_ITER + _DIFF, state, grad_hn),
            (ARG_DST_ITER_C + _DIFF, state, grad_cn),
        ]
        self.run(self.backward_primitive, arguments)
        for layout, (_, kernel), target in zip(
            self.weight_gradients, written, (grad_weight_ih, grad_weight_hh), strict=True
        ):
            self.out_of(layout, kernel, target)


# Geometries kept (most recently made last); beyond this the oldest are dropped.
MAX_GEOMETRIES = 64
_geometries: dict = {}
_geometries_lock = threading.Lock()


def direction(steps, batch, features, size, reverse, batch_first, training) -> _Direction | None:
    """The cached :class:`_Direction` of this geometry, or None if oneDNN declines it."""
    key = (steps, batch, features, size, reverse, batch_first, training)
    found = _geometries.get(key, False)
    if found is not False:
        return found
    library = loaded()
    try:
        with one_openmp_thread(library):
            made = _Direction(library, *key)
    except OneDNNError:
        made = None
    with _geometries_lock:
        if len(_geometries) >= MAX_GEOMETRIES:
            _geometries.pop(next(iter(_geometries)))
        _geometries[key] = made
    return made


def run(function, *args) -> None:
    """``function(*args)`` with this thread's oneDNN calls on one OpenMP thread."""
    with one_openmp_thread(loaded()):
        function(*args)


def empty_workspace(direction_set: _Direction, take) -> tuple[np.ndarray, np.ndarray] | None:
    """``(whole, aligned)``: a buffer from ``take(shape)`` and its 64-byte aligned view of the
    workspace's size, or None for an inference forward."""
    if not direction_set.workspace_bytes:
        return None
    whole = take((direction_set.workspace_bytes // 4 + 16,))
    skip = (-whole.ctypes.data % 64) // 4
    return whole, whole[skip : skip + -(-direction_set.workspace_bytes // 4)]
