"""Activations and the (log-)softmax, with numerically stable forms.

On a GPU each runs as one fused kernel a direction (``bigdl_py.kernels.activations`` and
``kernels.softmax``); on the host as the array operations below.
"""

from __future__ import annotations

import math

import numpy as np

from bigdl_py import backend, kernels
from bigdl_py.autograd.function import Function
from bigdl_py.autograd.ops.conv_tiles import for_each_part
from bigdl_py.kernels import activations as fused_activations
from bigdl_py.kernels import softmax as fused_softmax


def _leading(array, start, stop):
    """``array[start:stop]``, or the 0-d array itself (``for_each_part`` gives it (0, 1))."""
    return array[start:stop] if array.ndim else array


class Tanh(Function):
    # Both directions split large arrays over the batch, one part per BLAS thread
    # (``conv_tiles.for_each_part``); the backward's three passes write one array.
    def forward(self, a):
        xp = backend.array_module(a)
        self.fused = _fused(a)
        if self.fused:
            out = fused_activations.forward(fused_activations.TANH, a)
        elif backend.is_floating(a.dtype):
            out = xp.empty(a.shape, dtype=a.dtype)
            for_each_part(
                a,
                lambda start, stop: xp.tanh(
                    _leading(a, start, stop), out=_leading(out, start, stop)
                ),
            )
        else:
            out = xp.tanh(a)  # integers give floats
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        (out,) = self.saved
        if self.fused:
            return fused_activations.backward(fused_activations.TANH, grad, out)
        xp = backend.array_module(grad)
        grad_input = xp.empty(grad.shape, dtype=xp.result_type(grad, out))

        def work(start, stop):
            part = _leading(grad_input, start, stop)
            values = _leading(out, start, stop)
            xp.multiply(values, values, out=part)
            xp.subtract(1, part, out=part)
            part *= _leading(grad, start, stop)

        for_each_part(grad, work)
        return grad_input


class Sigmoid(Function):
    def forward(self, a):
        backend.check_floating(a.dtype, "sigmoid")  # an int result would hold only 0 and 1
        xp = backend.array_module(a)
        self.fused = _fused(a)
        if self.fused:
            out = fused_activations.forward(fused_activations.SIGMOID, a)
            self.save_for_backward(out)
            return out
        # exp of a negative number only: no overflow for large |a|.
        positive = a >= 0
        exp_neg_abs = xp.exp(-xp.abs(a))
        out = xp.where(positive, 1 / (1 + exp_neg_abs), exp_neg_abs / (1 + exp_neg_abs))
        out = out.astype(a.dtype, copy=False)
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        (out,) = self.saved
        if self.fused:
            return fused_activations.backward(fused_activations.SIGMOID, grad, out)
        return grad * out * (1 - out)


# NumPy (2.4) has no SIMD loop for ``maximum`` with a scalar operand, only for two arrays:
# max(x, 0) over 32,768 float32 took 12.9 us against a scalar, 4.7 against an array of
# zeros, 1,048,576 of them 388 against 169 (one thread, timeit). So the ReLU compares its
# input with a read-only row of zeros, piece by piece: 64K elements (256 KB, kept in cache)
# ran within 15 % of a zero array as large as the input, which would cost that much memory.
_ZERO_PIECE_SIZE = 1 << 16
_ZERO_PIECES = {
    np.dtype(dtype): np.zeros(_ZERO_PIECE_SIZE, dtype=dtype) for dtype in (np.float32, np.float64)
}
for _zeros in _ZERO_PIECES.values():
    _zeros.flags.writeable = False


def _rectify_in_pieces(flat_input, flat_output) -> None:
    """``flat_output = max(flat_input, 0)`` for 1-d NumPy arrays of a dtype in _ZERO_PIECES."""
    zeros = _ZERO_PIECES[flat_input.dtype]
    size = flat_input.size
    for start in range(0, size, _ZERO_PIECE_SIZE):
        stop = min(size, start + _ZERO_PIECE_SIZE)
        np.maximum(flat_input[start:stop], zeros[: stop - start], out=flat_output[start:stop])


class ReLU(Function):
    # The backward reads the output (positive exactly where the input was), not a mask of its
    # own: the op after a ReLU is usually a convolution or a Linear, which saves that same
    # array, so the ReLU keeps nothing extra (ResNet-18's step: 368 -> 334 MB; a ReLU before
    # a max-pool keeps 4 bytes a value instead of 1: the CIFAR CNN 38.8 -> 41.8 MB).
    # Large arrays are split over the batch like Tanh's.
    def forward(self, a):
        xp = backend.array_module(a)
        self.fused = _fused(a)
        if self.fused:
            output = fused_activations.forward(fused_activations.RELU, a)
            self.save_for_backward(output)
            return output
        output = xp.empty(a.shape, dtype=a.dtype)
        if xp is np and a.dtype in _ZERO_PIECES and a.flags.c_contiguous:
            flat_input, flat_output = a.reshape(-1), output.reshape(-1)
            for_each_part(
                flat_input,
                lambda start, stop: _rectify_in_pieces(
                    flat_input[start:stop], flat_output[start:stop]
                ),
            )
        else:
            for_each_part(
                a,
                lambda start, stop: xp.maximum(
                    _leading(a, start, stop), 0, out=_leading(output, start, stop)
                ),
            )
        self.save_for_backward(output)
        return output

    def backward(self, grad):
        (output,) = self.saved
        if self.fused:  # one kernel: no mask array
            return fused_activations.backward(fused_activations.RELU, grad, output)
        xp = backend.array_module(grad)
        grad_input = xp.empty(grad.shape, dtype=grad.dtype)

        def work(start, stop):
            positive = _leading(output, start, stop) > 0
            xp.multiply(
                _leading(grad, start, stop), positive, out=_leading(grad_input, start, stop)
            )

        for_each_part(grad, work)
        return grad_input


class LeakyReLU(Function):
    def forward(self, a, negative_slope=0.01):
        backend.check_floating(a.dtype, "leaky_relu")  # int(0.01) would zero the negatives
        xp = backend.array_module(a)
        self.fused, self.negative_slope = _fused(a), negative_slope
        if self.fused:  # keeps the input (alive anyway) instead of a scale array
            self.save_for_backward(a)
            return fused_activations.forward(fused_activations.LEAKY_RELU, a, negative_slope)
        scale = xp.where(a > 0, a.dtype.type(1), a.dtype.type(negative_slope))
        self.save_for_backward(scale)
        return a * scale

    def backward(self, grad):
        if self.fused:
            (a,) = self.saved
            kind = fused_activations.LEAKY_RELU
            return fused_activations.backward(kind, grad, a, self.negative_slope)
        (scale,) = self.saved
        return grad * scale


class GELU(Function):
    """Exact GELU, x * Phi(x), or its tanh approximation (``approximate='tanh'``).

    The forward keeps Phi(x) (or the tanh) for the backward instead of recomputing it: one
    array more held, about a dozen array passes fewer.
    """

    def forward(self, a, approximate="none"):
        backend.check_floating(a.dtype, "gelu")  # an int result would truncate x * Phi(x)
        xp = backend.array_module(a)
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate
        self.fused = _fused(a)
        if self.fused:  # keeps only the input: the backward recomputes Phi (or the tanh)
            self.kind = (
                fused_activations.GELU_TANH if approximate == "tanh" else fused_activations.GELU
            )
            self.save_for_backward(a)
            return fused_activations.forward(self.kind, a)
        if approximate == "tanh":
            inner = math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)
            t = xp.tanh(inner).astype(a.dtype, copy=False)
            self.save_for_backward(a, t)
            return (0.5 * a * (1 + t)).astype(a.dtype, copy=False)
        cdf = _normal_cdf(xp, a).astype(a.dtype, copy=False)
        self.save_for_backward(a, cdf)
        return a * cdf

    def backward(self, grad):
        if self.fused:
            (a,) = self.saved
            return fused_activations.backward(self.kind, grad, a)
        a, kept = self.saved
        xp = backend.array_module(a)
        if self.approximate == "tanh":
            t = kept
            d_inner = math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * a * a)
            return grad * (0.5 * (1 + t) + 0.5 * a * (1 - t * t) * d_inner)
        pdf = xp.exp(-0.5 * a * a) / math.sqrt(2 * math.pi)
        return grad * (kept + a * pdf)


def _normal_cdf(xp, x):
    """Phi(x) = erfc(-x / sqrt(2)) / 2, vectorised for NumPy and CuPy alike.

    erfc is Numerical Recipes' Chebyshev fit (``erfcc``): relative error below 1.2e-7 for
    every x, the far tails included, so Phi keeps its relative accuracy where it is tiny.
    That is float32 precision; NumPy has no erf of its own and SciPy is not a dependency.
    """
    # In place on three arrays: each temporary of the plain expression cost a pass and an
    # allocation (GELU's forward and backward of 2M float32 values, 1 thread: 39 -> 31 ms).
    z = xp.abs(x) * (1 / math.sqrt(2))
    t = z * 0.5
    t += 1
    xp.reciprocal(t, out=t)
    polynomial = t * 0.17087277
    polynomial += -0.82215223
    for coefficient in (
        1.48851587,
        -1.13520398,
        0.27886807,
        -0.18628806,
        0.09678418,
        0.37409196,
        1.00002368,
        -1.26551223,
    ):
        polynomial *= t
        polynomial += coefficient
    z *= z
    polynomial -= z
    half_erfc = xp.exp(polynomial, out=polynomial)
    half_erfc *= t
    half_erfc *= 0.5  # erfc(|x| / sqrt(2)) / 2
    return xp.where(x >= 0, 1 - half_erfc, half_erfc)


def _fused(a) -> bool:
    """Whether an activation of ``a`` takes its fused kernels (a device, contiguous)."""
    return kernels.route(a) is not None and fused_activations.applies(a)


def _fused_softmax(a, axis) -> bool:
    """Whether a (log-)softmax takes the fused row kernels (a device, the last axis)."""
    return kernels.route(a) is not None and fused_softmax.applies(a, axis)


class Softmax(Function):
    def forward(self, a, axis=-1):
        xp = backend.array_module(a)
        self.axis = axis
        if a.shape[axis] == 0:  # nothing to normalise (attention over no keys): empty, as PyTorch
            self.fused = False
            self.save_for_backward(a)
            return a.copy()
        self.fused = _fused_softmax(a, axis)
        if self.fused:
            out = fused_softmax.row_softmax(a, log=False)
            self.save_for_backward(out)
            return out
        shifted = a - a.max(axis=axis, keepdims=True)
        exps = xp.exp(shifted)
        out = exps / exps.sum(axis=axis, keepdims=True)
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        (out,) = self.saved
        if self.fused:
            return fused_softmax.row_softmax_backward(grad, out, log=False)
        return out * (grad - (grad * out).sum(axis=self.axis, keepdims=True))


class LogSoftmax(Function):
    def forward(self, a, axis=-1):
        xp = backend.array_module(a)
        self.axis = axis
        if a.shape[axis] == 0:  # an empty axis: an empty result, as PyTorch
            self.fused = False
            self.save_for_backward(a)
            return a.copy()
        self.fused = _fused_softmax(a, axis)
        if self.fused:
            out = fused_softmax.row_softmax(a, log=True)
            self.save_for_backward(out)
            return out
        shifted = a - a.max(axis=axis, keepdims=True)
        out = shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        (out,) = self.saved
        if self.fused:
            return fused_softmax.row_softmax_backward(grad, out, log=True)
        xp = backend.array_module(out)
        return grad - xp.exp(out) * grad.sum(axis=self.axis, keepdims=True)
