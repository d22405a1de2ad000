"""The fused ``Function``s behind ``bigdl_py.nn.loss``: forward and closed-form backward.

Each loss is one graph node: the gradient is written directly (``softmax - onehot`` for
cross-entropy, ``sigmoid - target`` for BCE with logits) instead of flowing back through a
chain of log/exp/gather nodes, and the forward uses PyTorch's numerically stable forms.
The modules in ``loss.py`` validate arguments and targets; these functions assume valid
inputs. Every function takes a ``reduction`` option (``'mean'``, ``'sum'`` or ``'none'``).
"""

from __future__ import annotations

import numpy as np

from bigdl_py import backend, kernels
from bigdl_py.autograd.function import Function
from bigdl_py.kernels import softmax as fused_softmax


def _reduce(losses, reduction: str, denominator):
    """The per-element ``losses`` themselves, their sum, or their sum over ``denominator``."""
    if reduction == "none":
        return losses
    total = losses.sum()
    return total / denominator if reduction == "mean" else total


def _per_element_gradient(grad, reduction: str, denominator):
    """d(reduced loss)/d(each element loss): ``grad`` itself, or a 0-d array that broadcasts."""
    if reduction == "none":
        return grad
    return grad / denominator if reduction == "mean" else grad


class DifferenceLoss(Function):
    """MSE, L1 and smooth L1, each a function of ``input - target``, in one graph node."""

    def forward(self, prediction, target, kind="mse", beta=1.0, reduction="mean"):
        xp = backend.array_module(prediction)
        difference = prediction - target
        if kind == "mse":
            losses, slope = difference * difference, 2 * difference
        elif kind == "l1" or beta == 0:
            losses, slope = xp.abs(difference), xp.sign(difference)
        else:
            size = xp.abs(difference)
            quadratic = size < beta
            losses = xp.where(quadratic, 0.5 * difference * difference / beta, size - 0.5 * beta)
            slope = xp.where(quadratic, difference / beta, xp.sign(difference))
        self.reduction, self.count = reduction, losses.size
        self.save_for_backward(slope)
        return _reduce(losses, reduction, losses.size)

    def backward(self, grad):
        (slope,) = self.saved
        grad_prediction = _per_element_gradient(grad, self.reduction, self.count) * slope
        grad_target = -grad_prediction if self.needs_input_grad[1] else None
        return grad_prediction, grad_target


def _target_positions(scores, target, class_weight, ignore_index):
    """Where each target class sits in ``scores.reshape(-1)``, and each sample's weight.

    ``scores`` is ``(N, C, d1, ...)`` and ``target`` ``(N, d1, ...)``. Ignored samples point
    at class 0 (any valid position) and get weight 0, so they add nothing anywhere.
    """
    xp = backend.array_module(scores)
    batch, classes = scores.shape[0], scores.shape[1]
    inner = int(np.prod(scores.shape[2:], dtype=np.int64))
    valid = target != ignore_index
    safe_target = xp.where(valid, target, 0).astype(np.int64, copy=False)
    # Element (n, t, j) of scores viewed as (N, C, inner) is at (n * C + t) * inner + j.
    rows = xp.arange(batch, dtype=np.int64).reshape(batch, 1) * classes
    columns = xp.arange(inner, dtype=np.int64).reshape(1, inner)
    positions = ((rows + safe_target.reshape(batch, inner)) * inner + columns).reshape(target.shape)
    if class_weight is None:
        sample_weight = valid.astype(scores.dtype)
    else:
        sample_weight = xp.where(valid, class_weight[safe_target], 0).astype(scores.dtype)
    return positions, valid, sample_weight


def _scatter(shape, positions, values, dtype):
    """A zero array of ``shape`` with ``values`` written at the flat ``positions``."""
    xp = backend.array_module(values)
    flat = xp.zeros(int(np.prod(shape, dtype=np.int64)), dtype=dtype)
    # Each sample has its own position, so plain assignment loses nothing (no repeats).
    flat[positions.reshape(-1)] = xp.broadcast_to(values, positions.shape).reshape(-1)
    return flat.reshape(shape)


class NegativeLogLikelihood(Function):
    """``-weight[t] * log_probabilities[n, t]`` with PyTorch's weighted mean."""

    differentiable_inputs = (0,)

    def forward(
        self, log_probabilities, target, class_weight=None, ignore_index=-100, reduction="mean"
    ):
        self.reduction, self.input_shape = reduction, log_probabilities.shape
        self.fused = log_probabilities.ndim == 2 and kernels.route(log_probabilities) is not None
        if self.fused:  # two kernels on a device: the rows' losses, then their reduction
            self.targets = fused_softmax.class_targets(
                log_probabilities, target, class_weight, ignore_index
            )
            loss, denominator = fused_softmax.nll(log_probabilities, self.targets, reduction)
            self.save_for_backward(denominator)
            return loss
        positions, _, sample_weight = _target_positions(
            log_probabilities, target, class_weight, ignore_index
        )
        losses = -log_probabilities.reshape(-1)[positions] * sample_weight
        denominator = sample_weight.sum()
        self.save_for_backward(positions, sample_weight, denominator)
        return _reduce(losses, reduction, denominator)

    def backward(self, grad):
        if self.fused:
            (denominator,) = self.saved
            return fused_softmax.nll_backward(
                self.input_shape, self.targets, grad, denominator, self.reduction
            ), None
        positions, sample_weight, denominator = self.saved
        upstream = _per_element_gradient(grad, self.reduction, denominator)
        return _scatter(self.input_shape, positions, -upstream * sample_weight, grad.dtype), None

    def _release_extra(self) -> None:
        self.targets = None


class SoftmaxCrossEntropy(Function):
    """Log-softmax over axis 1 and NLL in one node, with optional label smoothing.

    With smoothing ``eps`` the per-sample loss is PyTorch's
    ``(1 - eps) * nll + eps / C * sum_c(-weight[c] * log_softmax[c])`` and the gradient of
    the logits is ``softmax * sum(a) - a`` for the per-class coefficients ``a`` of that sum.
    """

    differentiable_inputs = (0,)

    def forward(
        self,
        logits,
        target,
        class_weight=None,
        ignore_index=-100,
        label_smoothing=0.0,
        reduction="mean",
    ):
        xp = backend.array_module(logits)
        classes = logits.shape[1]
        self.reduction, self.label_smoothing = reduction, label_smoothing
        self.fused = logits.ndim == 2 and kernels.route(logits) is not None
        if self.fused:  # two kernels on a device; the backward recomputes the softmax
            self.targets = fused_softmax.class_targets(logits, target, class_weight, ignore_index)
            loss, *kept = fused_softmax.cross_entropy(
                logits, self.targets, label_smoothing, reduction
            )
            self.save_for_backward(logits, *kept)
            return loss
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probabilities = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        positions, valid, sample_weight = _target_positions(
            log_probabilities, target, class_weight, ignore_index
        )
        losses = -log_probabilities.reshape(-1)[positions] * sample_weight
        if label_smoothing:
            weight_along_classes = (
                1 if class_weight is None else along_class_axis(class_weight, logits.ndim)
            )
            smooth = -(log_probabilities * weight_along_classes).sum(axis=1) * valid
            losses = (1 - label_smoothing) * losses + (label_smoothing / classes) * smooth
        denominator = sample_weight.sum()
        self.class_weight = class_weight
        self.save_for_backward(
            xp.exp(log_probabilities), positions, valid, sample_weight, denominator
        )
        return _reduce(losses, reduction, denominator)

    def backward(self, grad):
        if self.fused:
            logits, denominator, row_max, row_log_total = self.saved
            grad_logits = fused_softmax.cross_entropy_backward(
                logits,
                row_max,
                row_log_total,
                self.targets,
                self.label_smoothing,
                grad,
                denominator,
                self.reduction,
            )
            return grad_logits, None
        probabilities, positions, valid, sample_weight, denominator = self.saved
        upstream = _per_element_gradient(grad, self.reduction, denominator)
        upstream = upstream * valid  # per sample, 0 where ignored
        keep, smoothing = 1 - self.label_smoothing, self.label_smoothing
        classes, ndim = probabilities.shape[1], probabilities.ndim
        total_weight = classes if self.class_weight is None else self.class_weight.sum()
        coefficient_sum = keep * sample_weight + (smoothing / classes) * total_weight
        grad_logits = probabilities * _insert_class_axis(upstream * coefficient_sum)
        if smoothing:
            weight_along_classes = (
                1 if self.class_weight is None else along_class_axis(self.class_weight, ndim)
            )
            spread = (smoothing / classes) * _insert_class_axis(upstream)
            grad_logits -= spread * weight_along_classes
        target_part = _scatter(
            probabilities.shape, positions, keep * upstream * sample_weight, grad.dtype
        )
        return grad_logits - target_part, None

    def _release_extra(self) -> None:
        self.class_weight = None
        self.targets = None


def along_class_axis(vector, ndim: int):
    """A ``(C,)`` vector shaped ``(1, C, 1, ...)`` to broadcast along the class axis."""
    return vector.reshape((1, -1) + (1,) * (ndim - 2))


def _insert_class_axis(per_sample):
    """A ``(N, d1, ...)`` array shaped ``(N, 1, d1, ...)`` to broadcast over the classes."""
    xp = backend.array_module(per_sample)
    return xp.expand_dims(per_sample, 1) if per_sample.ndim else per_sample


def _clamped_log(values):
    """``log(values)`` clamped below at -100, PyTorch's BCE guard against ``log(0)``."""
    xp = backend.array_module(values)
    # Raising tiny values to exp(-100) first keeps log(0) from warning; the clamp then makes
    # the floor exactly -100 (exp(-100) is subnormal in float32, so its log is only close).
    floor = values.dtype.type(np.exp(-100.0))
    return xp.maximum(xp.log(xp.maximum(values, floor)), values.dtype.type(-100))


class BinaryCrossEntropy(Function):
    """``-weight * (t * log(p) + (1 - t) * log(1 - p))`` with PyTorch's guards."""

    def forward(self, probabilities, target, weight=None, reduction="mean"):
        log_p, log_not_p = _clamped_log(probabilities), _clamped_log(1 - probabilities)
        losses = -(target * log_p + (1 - target) * log_not_p)
        if weight is not None:
            losses = losses * weight
        self.reduction, self.count, self.weight = reduction, losses.size, weight
        self.save_for_backward(probabilities, target, log_p, log_not_p)
        return _reduce(losses, reduction, losses.size)

    def backward(self, grad):
        probabilities, target, log_p, log_not_p = self.saved
        xp = backend.array_module(probabilities)
        upstream = _per_element_gradient(grad, self.reduction, self.count)
        if self.weight is not None:
            upstream = upstream * self.weight
        # PyTorch's denominator floor: a probability of exactly 0 or 1 gives a large, finite
        # gradient instead of inf.
        variance = xp.maximum(probabilities * (1 - probabilities), probabilities.dtype.type(1e-12))
        grad_probabilities = upstream * (probabilities - target) / variance
        grad_target = upstream * (log_not_p - log_p) if self.needs_input_grad[1] else None
        return grad_probabilities, grad_target

    def _release_extra(self) -> None:
        self.weight = None


class BinaryCrossEntropyWithLogits(Function):
    """Sigmoid and binary cross-entropy in one stable node, with ``pos_weight``.

    ``loss = (1 - t) * x + (1 + (pos_weight - 1) * t) * softplus(-x)``, where
    ``softplus(-x) = -log(sigmoid(x))`` is computed as ``max(-x, 0) + log1p(exp(-|x|))``
    so no exponential overflows.
    """

    def forward(self, logits, target, weight=None, pos_weight=None, reduction="mean"):
        xp = backend.array_module(logits)
        softplus_negative = xp.maximum(-logits, 0) + xp.log1p(xp.exp(-xp.abs(logits)))
        if pos_weight is None:
            losses = (1 - target) * logits + softplus_negative
        else:
            losses = (1 - target) * logits + (1 + (pos_weight - 1) * target) * softplus_negative
        if weight is not None:
            losses = losses * weight
        self.reduction, self.count = reduction, losses.size
        self.weight, self.pos_weight = weight, pos_weight
        self.save_for_backward(logits, target, softplus_negative)
        return _reduce(losses, reduction, losses.size)

    def backward(self, grad):
        logits, target, softplus_negative = self.saved
        xp = backend.array_module(logits)
        upstream = _per_element_gradient(grad, self.reduction, self.count)
        if self.weight is not None:
            upstream = upstream * self.weight
        sigmoid = xp.exp(-softplus_negative)
        grad_target = None
        if self.pos_weight is None:
            grad_logits = upstream * (sigmoid - target)
            if self.needs_input_grad[1]:
                grad_target = -upstream * logits
        else:
            pos_weight = self.pos_weight
            positive_scale = 1 + (pos_weight - 1) * target
            grad_logits = upstream * (positive_scale * sigmoid - pos_weight * target)
            if self.needs_input_grad[1]:
                grad_target = upstream * ((pos_weight - 1) * softplus_negative - logits)
        return grad_logits, grad_target

    def _release_extra(self) -> None:
        self.weight = self.pos_weight = None
