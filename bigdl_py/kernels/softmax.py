"""Softmax, log-softmax, NLL and softmax cross-entropy in one or two kernels each
(``cuda/softmax.cu``).

The ``*_reference`` functions are the kernels in NumPy, with the kernels' parameters; the
others are what the ops call on a device. Rows are the last axis of a C-contiguous array
(the class axis of an ``(N, C)`` loss input). A reduced loss is two launches (the rows'
losses and weights, then ``loss_reduce``), its gradient one.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from bigdl_py import backend
from bigdl_py.kernels.compiler import Kernel, elementwise_blocks, row_blocks, row_threads, run

_ROWS = ("index", "index")
SOFTMAX_FORWARD = Kernel("softmax", "softmax_forward", _ROWS + ("const real*", "real*"))
SOFTMAX_BACKWARD = Kernel(
    "softmax", "softmax_backward", _ROWS + ("const real*", "const real*", "real*")
)
LOG_SOFTMAX_FORWARD = Kernel("softmax", "log_softmax_forward", _ROWS + ("const real*", "real*"))
LOG_SOFTMAX_BACKWARD = Kernel(
    "softmax", "log_softmax_backward", _ROWS + ("const real*", "const real*", "real*")
)
_TARGETS = ("const long long*", "const real*", "int", "long long")  # target, weight, has, ignore
NLL_FORWARD = Kernel(
    "softmax", "nll_forward", _ROWS + ("const real*",) + _TARGETS + ("real*", "real*")
)
_UPSTREAM = ("const real*", "const real*", "int")  # grad, denominator, reduction
NLL_BACKWARD = Kernel("softmax", "nll_backward", _ROWS + _TARGETS + _UPSTREAM + ("real*",))
CROSS_ENTROPY_FORWARD = Kernel(
    "softmax",
    "softmax_cross_entropy_forward",
    _ROWS + ("const real*",) + _TARGETS + ("real", "real") + ("real*",) * 4,
)
CROSS_ENTROPY_BACKWARD = Kernel(
    "softmax",
    "softmax_cross_entropy_backward",
    _ROWS
    + ("const real*", "const real*", "const real*")
    + ("const long long*", "const real*", "int", "const real*", "long long")
    + ("real", "real", "real")
    + _UPSTREAM
    + ("real*",),
)
LOSS_REDUCE = Kernel(
    "softmax", "loss_reduce", ("index", "const real*", "const real*", "int", "real*")
)
REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}


# --- the references --------------------------------------------------------------------------


def _rows(array, rows, width):
    return array.reshape(rows, width)


def _shifted(x, rows, width):
    """``x - max`` per row (``fmax``: a NaN does not win the max, as in the kernel)."""
    values = _rows(x, rows, width)
    largest = np.fmax.reduce(values, axis=1, keepdims=True)
    return values - largest, largest


def softmax_forward_reference(rows, width, x, y):
    shifted, _ = _shifted(x, rows, width)
    total = np.exp(shifted).sum(axis=1, keepdims=True)
    _rows(y, rows, width)[...] = np.exp(shifted) / total


def softmax_backward_reference(rows, width, grad, y, grad_x):
    g, out = _rows(grad, rows, width), _rows(y, rows, width)
    dot = (g * out).sum(axis=1, keepdims=True)
    _rows(grad_x, rows, width)[...] = out * (g - dot)


def log_softmax_forward_reference(rows, width, x, y):
    shifted, _ = _shifted(x, rows, width)
    log_total = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    _rows(y, rows, width)[...] = shifted - log_total


def log_softmax_backward_reference(rows, width, grad, y, grad_x):
    g = _rows(grad, rows, width)
    total = g.sum(axis=1, keepdims=True)
    _rows(grad_x, rows, width)[...] = g - np.exp(_rows(y, rows, width)) * total


def _targets(target, classes, class_weight, has_weight, ignore_index, dtype):
    """Per row: the (clamped) class read, and its weight (0 where ignored)."""
    valid = target != ignore_index
    clamped = np.where(valid, np.clip(target, 0, classes - 1), 0)
    weight = class_weight[clamped] if has_weight else np.ones(target.shape, dtype)
    return clamped, valid, np.where(valid, weight, dtype.type(0)).astype(dtype)


def nll_forward_reference(
    rows, classes, log_probabilities, target, class_weight, has_weight, ignore_index, losses,
    weights,
):  # fmt: skip
    dtype = log_probabilities.dtype
    t, _, weight = _targets(target, classes, class_weight, has_weight, ignore_index, dtype)
    picked = _rows(log_probabilities, rows, classes)[np.arange(rows), t]
    losses[...] = -picked * weight
    weights[...] = weight


def _upstream(grad, denominator, reduction, rows):
    if reduction == 0:
        return grad.reshape(rows)
    value = grad.reshape(()) / denominator[0] if reduction == 2 else grad.reshape(())
    return np.full(rows, value, dtype=grad.dtype)


def nll_backward_reference(
    total, classes, target, class_weight, has_weight, ignore_index, grad, denominator,
    reduction, grad_x,
):  # fmt: skip
    rows = total // classes
    t, _, weight = _targets(target, classes, class_weight, has_weight, ignore_index, grad.dtype)
    out = _rows(grad_x, rows, classes)
    out[...] = 0
    out[np.arange(rows), t] = -_upstream(grad, denominator, reduction, rows) * weight


def cross_entropy_forward_reference(
    rows, classes, logits, target, class_weight, has_weight, ignore_index, keep, spread, losses,
    weights, row_max, row_log_total,
):  # fmt: skip
    dtype = logits.dtype
    keep, spread = dtype.type(keep), dtype.type(spread)
    shifted, largest = _shifted(logits, rows, classes)
    log_total = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    log_probabilities = shifted - log_total
    t, valid, weight = _targets(target, classes, class_weight, has_weight, ignore_index, dtype)
    loss = -log_probabilities[np.arange(rows), t] * weight
    if spread != 0:
        along = class_weight if has_weight else dtype.type(1)
        smooth = -(log_probabilities * along).sum(axis=1) * valid
        loss = keep * loss + spread * smooth
    losses[...] = loss
    weights[...] = weight
    row_max[...] = largest.reshape(rows)
    row_log_total[...] = log_total.reshape(rows)


def cross_entropy_backward_reference(
    total, classes, logits, row_max, row_log_total, target, class_weight, has_weight,
    total_weight, ignore_index, keep, spread, spread_total, grad, denominator, reduction, grad_x,
):  # fmt: skip
    dtype = logits.dtype
    keep, spread, spread_total = (dtype.type(value) for value in (keep, spread, spread_total))
    rows = total // classes
    t, valid, weight = _targets(target, classes, class_weight, has_weight, ignore_index, dtype)
    upstream = _upstream(grad, denominator, reduction, rows) * valid
    coefficient_sum = keep * weight + (spread * total_weight[0] if has_weight else spread_total)
    probabilities = np.exp(
        (_rows(logits, rows, classes) - row_max[:, None]) - row_log_total[:, None]
    )
    value = probabilities * (upstream * coefficient_sum)[:, None]
    if spread != 0:
        value -= (spread * upstream)[:, None] * (class_weight if has_weight else dtype.type(1))
    value[np.arange(rows), t] -= keep * upstream * weight
    _rows(grad_x, rows, classes)[...] = value


def loss_reduce_reference(rows, losses, weights, mean, out):
    loss_total, weight_total = losses.sum(), weights.sum()
    out[0] = loss_total / weight_total if mean else loss_total
    out[1] = weight_total


REFERENCES = {
    SOFTMAX_FORWARD: softmax_forward_reference,
    SOFTMAX_BACKWARD: softmax_backward_reference,
    LOG_SOFTMAX_FORWARD: log_softmax_forward_reference,
    LOG_SOFTMAX_BACKWARD: log_softmax_backward_reference,
    NLL_FORWARD: nll_forward_reference,
    NLL_BACKWARD: nll_backward_reference,
    CROSS_ENTROPY_FORWARD: cross_entropy_forward_reference,
    CROSS_ENTROPY_BACKWARD: cross_entropy_backward_reference,
    LOSS_REDUCE: loss_reduce_reference,
}


# --- what the ops call -------------------------------------------------------------------------


def _row_kernel(kernel: Kernel, width: int, rows: int, dtype, *arguments) -> None:
    run(
        kernel,
        REFERENCES[kernel],
        row_blocks(rows),
        dtype,
        rows,
        width,
        *arguments,
        threads=row_threads(width),
    )


def applies(x: Any, axis: int) -> bool:
    """Whether a (log-)softmax of ``x`` over ``axis`` takes the kernels: the last axis of a
    C-contiguous array of one or more rows."""
    return (
        x.ndim >= 1
        and axis in (-1, x.ndim - 1)
        and x.flags.c_contiguous
        and x.size > 0
        and x.shape[-1] > 0
    )


def row_softmax(x: Any, log: bool, out: Any = None) -> Any:
    """Softmax (or log-softmax) of each row of ``x``'s last axis (into ``out``, which may
    be ``x`` itself: each row is read before it is written)."""
    xp = backend.array_module(x)
    y = xp.empty_like(x) if out is None else out
    kernel = LOG_SOFTMAX_FORWARD if log else SOFTMAX_FORWARD
    _row_kernel(kernel, x.shape[-1], x.size // x.shape[-1], x.dtype, x, y)
    return y


def row_softmax_backward(grad: Any, y: Any, log: bool) -> Any:
    """The input's gradient of ``row_softmax`` from its output ``y``."""
    xp = backend.array_module(grad)
    grad = xp.ascontiguousarray(grad)
    grad_x = xp.empty_like(y)
    kernel = LOG_SOFTMAX_BACKWARD if log else SOFTMAX_BACKWARD
    _row_kernel(kernel, y.shape[-1], y.size // y.shape[-1], y.dtype, grad, y, grad_x)
    return grad_x


class ClassTargets(NamedTuple):
    """A loss's class-index targets as the kernels take them."""

    target: Any  # (N,) int64
    class_weight: Any  # (C,) or a stand-in (not read)
    has_weight: int
    ignore_index: int


def class_targets(scores: Any, target: Any, class_weight: Any, ignore_index: int) -> ClassTargets:
    xp = backend.array_module(scores)
    target = xp.ascontiguousarray(target.reshape(-1).astype(np.int64, copy=False))
    if class_weight is None:
        return ClassTargets(target, scores, 0, int(ignore_index))
    weight = xp.ascontiguousarray(class_weight.astype(scores.dtype, copy=False))
    return ClassTargets(target, weight, 1, int(ignore_index))


def _reduced(losses: Any, weights: Any, reduction: str) -> tuple[Any, Any]:
    """The loss as ``reduction`` asks, and the mean's denominator (a 0-d array each)."""
    xp = backend.array_module(losses)
    if reduction == "none":
        return losses, xp.zeros(1, dtype=losses.dtype)
    out = xp.empty(2, dtype=losses.dtype)
    run(
        LOSS_REDUCE,
        loss_reduce_reference,
        1,
        losses.dtype,
        losses.size,
        losses,
        weights,
        int(reduction == "mean"),
        out,
        threads=row_threads(losses.size),
    )
    return out[0], out[1:2]


def nll(log_probabilities: Any, targets: ClassTargets, reduction: str) -> tuple[Any, Any]:
    """NLL of ``(N, C)`` log-probabilities: the loss and the mean's denominator."""
    xp = backend.array_module(log_probabilities)
    rows, classes = log_probabilities.shape
    losses = xp.empty(rows, dtype=log_probabilities.dtype)
    weights = xp.empty(rows, dtype=log_probabilities.dtype)
    run(
        NLL_FORWARD,
        nll_forward_reference,
        elementwise_blocks(rows),
        log_probabilities.dtype,
        rows,
        classes,
        xp.ascontiguousarray(log_probabilities),
        *targets,
        losses,
        weights,
    )
    return _reduced(losses, weights, reduction)


def nll_backward(
    shape: tuple, targets: ClassTargets, grad: Any, denominator: Any, reduction: str
) -> Any:
    xp = backend.array_module(grad)
    grad_x = xp.empty(shape, dtype=grad.dtype)
    run(
        NLL_BACKWARD,
        nll_backward_reference,
        elementwise_blocks(grad_x.size),
        grad.dtype,
        grad_x.size,
        shape[1],
        *targets,
        xp.ascontiguousarray(grad),
        denominator,
        REDUCTIONS[reduction],
        grad_x,
    )
    return grad_x


def cross_entropy(
    logits: Any, targets: ClassTargets, label_smoothing: float, reduction: str
) -> tuple[Any, Any, Any, Any]:
    """Softmax cross-entropy of ``(N, C)`` logits: the loss, the mean's denominator, and the
    rows' max and log-sum-exp (what the backward needs instead of the probabilities)."""
    xp = backend.array_module(logits)
    rows, classes = logits.shape
    dtype = logits.dtype
    losses, weights, row_max, row_log_total = (xp.empty(rows, dtype=dtype) for _ in range(4))
    _row_kernel(
        CROSS_ENTROPY_FORWARD,
        classes,
        rows,
        dtype,
        xp.ascontiguousarray(logits),
        *targets,
        1 - label_smoothing,
        label_smoothing / classes,
        losses,
        weights,
        row_max,
        row_log_total,
    )
    loss, denominator = _reduced(losses, weights, reduction)
    return loss, denominator, row_max, row_log_total


def cross_entropy_backward(
    logits: Any,
    row_max: Any,
    row_log_total: Any,
    targets: ClassTargets,
    label_smoothing: float,
    grad: Any,
    denominator: Any,
    reduction: str,
) -> Any:
    xp = backend.array_module(logits)
    classes = logits.shape[1]
    total_weight = targets.class_weight.sum(keepdims=True) if targets.has_weight else logits
    grad_x = xp.empty(logits.shape, dtype=logits.dtype)
    target, class_weight, has_weight, ignore_index = targets
    spread = label_smoothing / classes
    run(
        CROSS_ENTROPY_BACKWARD,
        cross_entropy_backward_reference,
        elementwise_blocks(grad_x.size),
        logits.dtype,
        grad_x.size,
        classes,
        xp.ascontiguousarray(logits),
        row_max,
        row_log_total,
        target,
        class_weight,
        has_weight,
        total_weight,
        ignore_index,
        1 - label_smoothing,
        spread,
        spread * classes,
        xp.ascontiguousarray(grad),
        denominator,
        REDUCTIONS[reduction],
        grad_x,
    )
    return grad_x
