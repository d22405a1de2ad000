"""Losses (BigDL's criteria) with PyTorch's names, arguments and arithmetic.

Every loss is a ``Module`` called as ``loss(input, target)``. The arithmetic is one fused
``Function`` per loss (``_loss_functions.py``): one graph node, a gradient written in closed
form and the numerically stable forms PyTorch uses. Targets are checked before any arithmetic,
so a wrong label dtype, a label outside the classes or a shape mismatch is reported with
the loss's name, the bad value and where it is, instead of surfacing as NaN or an obscure
indexing error later. Host targets (what the training loop passes) are checked on the host
before they are copied to the input's device; targets already on a device are checked
there, and inside a training step the answer is read at the next sync point
(``bigdl_py.device_waits``), so the step never waits for the device.

``docs/bigdl_mapping.md`` lists the BigDL criterion behind each class.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bigdl_py import backend, device_waits
from bigdl_py.autograd import ops
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.nn import _loss_functions as functions
from bigdl_py.nn.layers._arguments import check_probability, check_real
from bigdl_py.nn.module import Module

__all__ = [
    "BCELoss",
    "BCEWithLogitsLoss",
    "CrossEntropyLoss",
    "L1Loss",
    "MSELoss",
    "NLLLoss",
    "SmoothL1Loss",
]

REDUCTIONS = ("mean", "sum", "none")


def _target_array(target: Any):
    """The array of a target given as a Tensor, a device array or host data."""
    if isinstance(target, Tensor):
        return target.data
    return target if backend.is_device_array(target) else np.asarray(target)


class _Loss(Module):
    """Base of the losses: holds and validates ``reduction``."""

    #: Host targets are checked on the host and copied to the input's device here, so the
    #: training loop hands them over as host arrays (``train.batches.criterion_target``).
    checks_host_targets = True

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(
                f"{type(self).__name__}: reduction must be one of {REDUCTIONS}, got {reduction!r}"
            )
        self.reduction = reduction

    def _input(self, value: Any) -> Tensor:
        """The prediction as a floating-point Tensor."""
        tensor = value if isinstance(value, Tensor) else Tensor(value, _copy=False)
        if not backend.is_floating(tensor.dtype):
            raise TypeError(
                f"{type(self).__name__}: input must be floating point, got dtype {tensor.dtype}"
            )
        return tensor

    def _float_target(self, target: Any, prediction: Tensor) -> Tensor:
        """A target of the prediction's shape, dtype and device.

        A constant target (labels, arrays) is cast to the prediction's dtype, so float64
        NumPy labels work with a float32 model; a target that needs a gradient is kept.
        """
        if isinstance(target, Tensor) and target.requires_grad:
            result = target
        else:
            data = _target_array(target)
            data = backend.to_device(data, prediction.device).astype(prediction.dtype, copy=False)
            result = Tensor(data, _copy=False)
        if result.shape != prediction.shape:
            raise ValueError(
                f"{type(self).__name__}: input shape {prediction.shape} and target shape "
                f"{result.shape} differ; they must be equal (a loss never broadcasts its "
                "target: (N, 1) against (N,) is usually a bug)"
            )
        return result

    def _buffer_array(self, name: str, like: Tensor):
        """Buffer ``name`` as an array of ``like``'s dtype on its device, or None."""
        buffer = self._buffers.get(name)
        if buffer is None:
            return None
        data = backend.to_device(buffer.data, like.device)
        return data.astype(like.dtype, copy=False)

    def _register_weight(self, name: str, values: Any) -> None:
        """Keep a fixed weight vector as a buffer (moved by ``.to()``, saved in state_dict)."""
        if values is None:
            self.register_buffer(name, None)
            return
        data = values.numpy() if isinstance(values, Tensor) else np.asarray(values)
        if not np.issubdtype(data.dtype, np.number) or data.dtype.kind == "c":
            raise TypeError(
                f"{type(self).__name__}: {name} must hold real numbers, got dtype {data.dtype}"
            )
        if not np.isfinite(data).all():  # a NaN weight would make every loss NaN
            raise ValueError(
                f"{type(self).__name__}: {name} must be finite, got {data.tolist()!r:.200}"
            )
        self.register_buffer(name, Tensor(data.astype(np.float64), _copy=True))

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


# --- element-wise regression losses --------------------------------------------------------
class _ElementwiseLoss(_Loss):
    """Shared forward of the losses of ``input - target``; subclasses name the kind."""

    _kind = "mse"
    beta = 1.0

    def forward(self, input, target):  # noqa: A002 - PyTorch's argument name
        prediction = self._input(input)
        target = self._float_target(target, prediction)
        return functions.DifferenceLoss.apply(
            prediction, target, kind=self._kind, beta=self.beta, reduction=self.reduction
        )


class MSELoss(_ElementwiseLoss):
    """Mean squared error, ``(input - target) ** 2`` (BigDL's ``MSECriterion``).

    Parameters
    ----------
    reduction : {'mean', 'sum', 'none'}
        Average over every element, sum, or return the element losses.

    Notes
    -----
    ``input`` and ``target`` must have the same shape; a constant target is cast to the
    input's dtype. A target with ``requires_grad`` gets its gradient too.
    """

    _kind = "mse"

    def __init__(self, reduction: str = "mean"):
        super().__init__(reduction)


class L1Loss(_ElementwiseLoss):
    """Mean absolute error, ``|input - target|`` (BigDL's ``AbsCriterion``).

    Parameters and shapes as :class:`MSELoss`. The gradient at a difference of 0 is 0.
    """

    _kind = "l1"

    def __init__(self, reduction: str = "mean"):
        super().__init__(reduction)


class SmoothL1Loss(_ElementwiseLoss):
    """Huber-like loss (BigDL's ``SmoothL1Criterion``): quadratic near 0, linear beyond.

    ``0.5 * d**2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 * beta``, with
    ``d = input - target``. Shapes as :class:`MSELoss`.

    Parameters
    ----------
    reduction : {'mean', 'sum', 'none'}
    beta : float
        Where the quadratic part ends; ``beta=0`` is the L1 loss. Must be >= 0.
    """

    _kind = "smooth_l1"

    def __init__(self, reduction: str = "mean", beta: float = 1.0):
        super().__init__(reduction)
        self.beta = check_real(beta, "beta", "SmoothL1Loss", at_least=0)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, beta={self.beta}"


# --- classification: class-index targets ---------------------------------------------------
class _ClassLoss(_Loss):
    """Shared checks of losses whose targets are class indices along axis 1 of the input."""

    # CrossEntropyLoss also takes class probabilities; its label-dtype error says so.
    _accepts_probabilities = False

    def __init__(self, weight: Any = None, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__(reduction)
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
            raise TypeError(
                f"{type(self).__name__}: ignore_index must be an int, got {ignore_index!r}"
            )
        self.ignore_index = int(ignore_index)
        self._register_weight("weight", weight)
        if self.weight is not None and self.weight.ndim != 1:
            raise ValueError(
                f"{type(self).__name__}: weight must be 1-d, one entry per class; got shape "
                f"{self.weight.shape}"
            )

    def _check_scores(self, scores: Tensor) -> None:
        name = type(self).__name__
        if scores.ndim < 2:
            raise ValueError(
                f"{name}: input must be (N, C) or (N, C, d1, ...) scores, got shape {scores.shape}"
            )
        if self.weight is not None and self.weight.shape[0] != scores.shape[1]:
            raise ValueError(
                f"{name}: weight has {self.weight.shape[0]} entries but the input of shape "
                f"{scores.shape} has {scores.shape[1]} classes (axis 1)"
            )

    def _class_target(self, target: Any, scores: Tensor) -> Tensor:
        """Integer class indices of the right shape and range, on the input's device."""
        name = type(self).__name__
        data = _target_array(target)
        if data.dtype.kind not in "iu":
            alternative = ""
            if self._accepts_probabilities:
                alternative = f", or pass class probabilities of the input's shape {scores.shape}"
            raise TypeError(
                f"{name}: target must hold integer class indices, got dtype {data.dtype} "
                f"(shape {tuple(data.shape)}); convert the labels with labels.astype(int)"
                f"{alternative}"
            )
        expected = (scores.shape[0],) + scores.shape[2:]
        if scores.ndim == 2 and tuple(data.shape) == (scores.shape[0], 1):
            # Samples that carry their label as a 1-element array (BigDL's habit) stack
            # into (N, 1) labels; that layout is unambiguous, so take it.
            data = data.reshape(-1)
        if tuple(data.shape) != expected:
            hint = ""
            if tuple(data.shape) == scores.shape:
                hint = " (one-hot targets? pass their argmax over axis 1)"
            raise ValueError(
                f"{name}: input shape {scores.shape} needs a target of shape {expected}, one "
                f"class index per sample, got target shape {tuple(data.shape)}{hint}"
            )
        # Host labels are checked before they are copied; labels already on a device are
        # checked there, the answer read at the next sync point inside a training step.
        self._check_class_range(data, scores.shape[1])
        return Tensor(backend.to_device(data, scores.device), _copy=False)

    def _check_class_range(self, labels, classes: int) -> None:
        outside = ((labels < 0) | (labels >= classes)) & (labels != self.ignore_index)
        device_waits.check(
            outside.any(),
            lambda labels, outside: self._class_range_error(labels, outside, classes),
            labels,
            outside,
        )

    def _class_range_error(self, labels, outside, classes: int) -> IndexError:
        """The error for the first label outside the classes (reads device labels)."""
        host_labels = backend.as_numpy(labels)
        position = tuple(int(i) for i in np.argwhere(backend.as_numpy(outside))[0])
        value = int(host_labels[position])
        hint = ""
        if int(host_labels.max()) == classes and int(host_labels.min()) >= 1:
            hint = " Labels are 0-based; BigDL's 1-based labels need labels - 1."
        return IndexError(
            f"{type(self).__name__}: target[{', '.join(map(str, position))}] = {value} is "
            f"not a class index for {classes} classes (valid: 0 to {classes - 1}, or "
            f"ignore_index={self.ignore_index}).{hint}"
        )

    def extra_repr(self) -> str:
        weighted = "" if self.weight is None else ", weight=..."
        return f"reduction={self.reduction!r}, ignore_index={self.ignore_index}{weighted}"


class NLLLoss(_ClassLoss):
    """Negative log-likelihood of class indices (BigDL's ``ClassNLLCriterion``).

    The per-sample loss is ``-weight[t] * input[n, t]`` for target class ``t``; pair it with
    ``LogSoftmax`` (or use :class:`CrossEntropyLoss` on the logits).

    Parameters
    ----------
    weight : sequence of float, optional
        One rescaling weight per class (default: all 1). Kept as the buffer ``weight``.
    ignore_index : int
        Samples with this target add nothing to the loss or the gradient (default -100).
    reduction : {'mean', 'sum', 'none'}
        ``'mean'`` is PyTorch's weighted mean: the sum divided by the sum of the target
        classes' weights (the number of non-ignored samples when unweighted).

    Notes
    -----
    ``input`` is ``(N, C)`` or ``(N, C, d1, ...)`` log-probabilities; ``target`` is
    ``(N,)`` or ``(N, d1, ...)`` **0-based** integer class indices (a Tensor, a NumPy array
    or a list; ``(N, 1)`` labels of an ``(N, C)`` input are taken as ``(N,)``). Float labels
    are refused rather than silently truncated.

    Raises
    ------
    TypeError
        For non-integer targets.
    ValueError
        For a target shape that does not match the input's.
    IndexError
        For a label outside ``[0, C)`` that is not ``ignore_index``, naming its value and
        position.
    """

    def __init__(self, weight: Any = None, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__(weight, ignore_index, reduction)

    def forward(self, input, target):  # noqa: A002 - PyTorch's argument name
        log_probabilities = self._input(input)
        self._check_scores(log_probabilities)
        target = self._class_target(target, log_probabilities)
        return functions.NegativeLogLikelihood.apply(
            log_probabilities,
            target,
            class_weight=self._buffer_array("weight", log_probabilities),
            ignore_index=self.ignore_index,
            reduction=self.reduction,
        )


class CrossEntropyLoss(_ClassLoss):
    """Cross-entropy of raw scores (logits) and classes (BigDL's ``CrossEntropyCriterion``).

    ``LogSoftmax`` over axis 1 followed by :class:`NLLLoss`, fused into one stable node whose
    gradient is ``softmax - onehot``.

    Parameters
    ----------
    weight : sequence of float, optional
        One rescaling weight per class (buffer ``weight``).
    ignore_index : int
        Class-index targets equal to it are ignored (default -100).
    reduction : {'mean', 'sum', 'none'}
        ``'mean'`` for class-index targets is the weighted mean of :class:`NLLLoss`; for
        probability targets it divides by the number of samples.
    label_smoothing : float
        In ``[0, 1]``: the target becomes ``(1 - label_smoothing) * onehot +
        label_smoothing / C``, as in PyTorch.

    Notes
    -----
    ``input`` is ``(N, C)`` or ``(N, C, d1, ...)`` logits. ``target`` is either 0-based
    integer class indices of shape ``(N,)`` / ``(N, d1, ...)`` (checked as in
    :class:`NLLLoss`), or class probabilities of the input's own shape (float; for soft
    labels, mixup or distillation; ``ignore_index`` does not apply to them).
    """

    _accepts_probabilities = True

    def __init__(
        self,
        weight: Any = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ):
        super().__init__(weight, ignore_index, reduction)
        self.label_smoothing = check_probability(
            label_smoothing, "label_smoothing", "CrossEntropyLoss"
        )

    def forward(self, input, target):  # noqa: A002 - PyTorch's argument name
        logits = self._input(input)
        self._check_scores(logits)
        target_data = _target_array(target)
        if backend.is_floating(target_data.dtype) and tuple(target_data.shape) == logits.shape:
            return self._probability_target_loss(logits, self._float_target(target, logits))
        target = self._class_target(target, logits)
        return functions.SoftmaxCrossEntropy.apply(
            logits,
            target,
            class_weight=self._buffer_array("weight", logits),
            ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
            reduction=self.reduction,
        )

    def _probability_target_loss(self, logits: Tensor, probabilities: Tensor) -> Tensor:
        """``-sum_c weight[c] * p[c] * log_softmax[c]``, composed (rare path, any gradient)."""
        classes = logits.shape[1]
        coefficients = probabilities
        if self.label_smoothing:
            coefficients = coefficients * (1 - self.label_smoothing) + (
                self.label_smoothing / classes
            )
        class_weight = self._buffer_array("weight", logits)
        if class_weight is not None:
            coefficients = coefficients * functions.along_class_axis(class_weight, logits.ndim)
        losses = -ops.sum(coefficients * ops.log_softmax(logits, axis=1), axis=1)
        if self.reduction == "none":
            return losses
        return ops.mean(losses) if self.reduction == "mean" else ops.sum(losses)

    def extra_repr(self) -> str:
        smoothing = f", label_smoothing={self.label_smoothing}" if self.label_smoothing else ""
        return super().extra_repr() + smoothing


# --- binary classification ----------------------------------------------------------------
class _BinaryLoss(_Loss):
    """Shared checks of the binary cross-entropies: element weights that fit the input."""

    def _fitting_weight(self, name: str, prediction: Tensor):
        """Buffer ``name`` for this input; it must broadcast to the input's shape."""
        values = self._buffer_array(name, prediction)
        if values is None:
            return None
        try:
            fits = np.broadcast_shapes(values.shape, prediction.shape) == prediction.shape
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(
                f"{type(self).__name__}: {name} of shape {tuple(values.shape)} does not "
                f"broadcast to the input's shape {prediction.shape}"
            )
        return values

    def extra_repr(self) -> str:
        weighted = "" if self.weight is None else ", weight=..."
        return f"reduction={self.reduction!r}{weighted}"


class BCELoss(_BinaryLoss):
    """Binary cross-entropy of probabilities (BigDL's ``BCECriterion``).

    ``-weight * (target * log(input) + (1 - target) * log(1 - input))``, with each log
    clamped at -100 as in PyTorch, so probabilities of exactly 0 or 1 give finite values.

    Parameters
    ----------
    weight : array-like, optional
        Rescaling weight of each element; must broadcast to the input's shape (buffer
        ``weight``).
    reduction : {'mean', 'sum', 'none'}
        ``'mean'`` divides by the number of elements.

    Notes
    -----
    ``input`` holds probabilities in ``[0, 1]`` (after ``Sigmoid``); ``target`` has the
    input's shape, usually 0/1 (integer labels are cast). For logits use
    :class:`BCEWithLogitsLoss`, which is more stable.

    Raises
    ------
    ValueError
        When the input holds values outside ``[0, 1]``, or shapes do not match.
    """

    def __init__(self, weight: Any = None, reduction: str = "mean"):
        super().__init__(reduction)
        self._register_weight("weight", weight)

    def forward(self, input, target):  # noqa: A002 - PyTorch's argument name
        probabilities = self._input(input)
        # On a device only the extremes are kept until a sync point reads the answer.
        low, high = probabilities.data.min(), probabilities.data.max()
        device_waits.check(
            (low < 0) | (high > 1),
            lambda low, high: _not_probabilities(float(low), float(high)),
            low,
            high,
        )
        target = self._float_target(target, probabilities)
        return functions.BinaryCrossEntropy.apply(
            probabilities,
            target,
            weight=self._fitting_weight("weight", probabilities),
            reduction=self.reduction,
        )


def _not_probabilities(low: float, high: float) -> ValueError:
    return ValueError(
        f"BCELoss: input must be probabilities in [0, 1], got values from {low:.6g} to "
        f"{high:.6g}; apply Sigmoid first, or use BCEWithLogitsLoss on the logits"
    )


class BCEWithLogitsLoss(_BinaryLoss):
    """Sigmoid plus binary cross-entropy in one numerically stable step.

    ``-weight * (pos_weight * target * log(sigmoid(x)) + (1 - target) * log(1 - sigmoid(x)))``,
    computed without overflow for logits of any size.

    Parameters
    ----------
    weight : array-like, optional
        Rescaling weight of each element; must broadcast to the input's shape.
    reduction : {'mean', 'sum', 'none'}
        ``'mean'`` divides by the number of elements.
    pos_weight : array-like, optional
        Weight of the positive term, one per class (broadcast along the last axis); above 1
        raises recall, below 1 precision.

    Notes
    -----
    ``input`` holds logits; ``target`` has the input's shape, with values in ``[0, 1]``.
    """

    def __init__(self, weight: Any = None, reduction: str = "mean", pos_weight: Any = None):
        super().__init__(reduction)
        self._register_weight("weight", weight)
        self._register_weight("pos_weight", pos_weight)

    def forward(self, input, target):  # noqa: A002 - PyTorch's argument name
        logits = self._input(input)
        target = self._float_target(target, logits)
        return functions.BinaryCrossEntropyWithLogits.apply(
            logits,
            target,
            weight=self._fitting_weight("weight", logits),
            pos_weight=self._fitting_weight("pos_weight", logits),
            reduction=self.reduction,
        )

    def extra_repr(self) -> str:
        weighted = "" if self.pos_weight is None else ", pos_weight=..."
        return super().extra_repr() + weighted
