"""Validation methods (BigDL's ``ValidationMethod``): Top1Accuracy, Top5Accuracy, Loss, MAE.

A method turns one batch's model output and target into a *partial* :class:`ValidationResult`
— a sum and a count — and partial results merge by adding both. So a validation set can be
evaluated batch by batch, or partition by partition on Spark executors, and merged on the
driver into exactly the result of one pass over all of it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from bigdl_py import backend, device_waits
from bigdl_py.autograd.tensor import Tensor


class ValidationResult:
    """A mergeable metric: ``value = total / count``.

    Parameters
    ----------
    name : str
        The method that produced it, e.g. ``"Top1Accuracy"``.
    total : float
        Sum over the samples seen (correct predictions, summed loss, summed absolute error).
    count : int
        Number of samples (or elements, for MAE) the total covers.

    Examples
    --------
    >>> merged = ValidationResult("Top1Accuracy", 90, 100) + ValidationResult("Top1Accuracy", 8, 10)
    >>> merged.value
    0.8909090909090909
    """

    __slots__ = ("name", "total", "count")

    def __init__(self, name: str, total: float = 0.0, count: int = 0):
        self.name = str(name)
        # A device total (a 0-d array) stays there while batches add up; on_host() reads it.
        self.total = total if backend.is_device_array(total) else float(total)
        self.count = int(count)

    def on_host(self) -> ValidationResult:
        """This result with its total read back from the device (itself when on the host)."""
        if not backend.is_device_array(self.total):
            return self
        return ValidationResult(self.name, float(self.total), self.count)

    @property
    def value(self) -> float:
        """``total / count``; NaN when nothing was counted."""
        return float(self.total) / self.count if self.count else math.nan

    def __add__(self, other: ValidationResult) -> ValidationResult:
        if not isinstance(other, ValidationResult):
            return NotImplemented
        if other.name != self.name:
            raise ValueError(f"cannot merge a {self.name} result with a {other.name} result")
        return ValidationResult(self.name, self.total + other.total, self.count + other.count)

    @staticmethod
    def merge(results: Iterable[ValidationResult]) -> ValidationResult:
        """Sum partial results of one method (e.g. one per partition)."""
        results = list(results)
        if not results:
            raise ValueError("ValidationResult.merge needs at least one result")
        merged = results[0]
        for result in results[1:]:
            merged = merged + result
        return merged

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ValidationResult):
            return NotImplemented
        return (self.name, self.total, self.count) == (other.name, other.total, other.count)

    def to_dict(self) -> dict:
        total = float(self.total)
        return {"name": self.name, "total": total, "count": self.count, "value": self.value}

    def __repr__(self) -> str:
        total = float(self.total)
        total = f"{total:.0f}" if total.is_integer() else f"{total:.6g}"
        return f"{self.name}: {self.value:.4f} ({total} / {self.count})"


class ValidationMethod:
    """Base class: ``batch_result(output, target)`` gives a partial :class:`ValidationResult`.

    Attributes
    ----------
    higher_is_better : bool or None
        The metric's direction of improvement, declared by each method class (accuracies:
        True; losses and errors: False). ``EarlyStopping`` and the ``Plateau`` schedule take
        their mode from it (:func:`watching_mode`). None (the base class's value) means
        undeclared: a method of your own should set it, or those watching it need an
        explicit ``mode``.
    """

    higher_is_better: bool | None = None

    @property
    def name(self) -> str:
        return type(self).__name__

    def batch_result(self, output: Any, target: Any) -> ValidationResult:
        raise NotImplementedError(f"{self.name} does not implement batch_result()")

    def empty_result(self) -> ValidationResult:
        """The neutral element of merging: nothing counted yet."""
        return ValidationResult(self.name)

    def with_default_criterion(self, criterion: Any) -> ValidationMethod:
        """This method, or a copy bound to ``criterion`` where it needs one (:class:`Loss`)."""
        return self

    def __call__(self, output: Any, target: Any) -> ValidationResult:
        return self.batch_result(output, target)

    def __repr__(self) -> str:
        return f"{self.name}()"


def _total(value: Any) -> Any:
    """A batch's total: a float on the host; on a device a 0-d float64 array, read once
    at the end of the evaluation (``ValidationResult.on_host``), not per batch."""
    if backend.is_device_array(value):
        return value.reshape(()).astype(np.float64)
    return float(value)


def _array(value: Any) -> Any:
    """The raw array of a Tensor (or of the first output of a multi-output model)."""
    if isinstance(value, (tuple, list)):
        value = value[0]
    return value.data if isinstance(value, Tensor) else value


def _whole_numbers(values: Any, method: str) -> Any:
    """Class labels as int64 (same shape): whole-number floats (Spark ML's doubles) are
    indices; a fractional or NaN label raises instead of being truncated."""
    if values.dtype.kind == "f":
        xp = backend.array_module(values)
        bad = ~xp.isfinite(values) | (values != xp.floor(xp.nan_to_num(values)))

        def error() -> ValueError:
            position = int(xp.argmax(bad.reshape(-1)))
            return ValueError(
                f"{method}: target {values.reshape(-1)[position].item()!r} at index {position} "
                f"is not a class index ({int(xp.sum(bad))} such target(s) in the batch)"
            )

        device_waits.check(xp.any(bad), error)
    elif values.dtype.kind not in "iub":
        raise ValueError(f"{method}: targets must be class indices, got dtype {values.dtype}")
    return values.astype(np.int64, copy=False)


def _class_targets(target: Any, like: Any, method: str, num_classes: int | None = None) -> Any:
    """Targets as a 1-D integer array on ``like``'s device, checked as training checks them:
    an out-of-range label raises instead of being scored as a miss."""
    target = backend.to_device(_array(target), backend.device_of(like))
    if target.ndim == 2 and target.shape[1] == 1:
        target = target[:, 0]
    if target.ndim != 1:
        raise ValueError(
            f"{method}: targets must be class indices of shape (n,), got shape {target.shape}"
        )
    labels = _whole_numbers(target, method)
    if num_classes is not None:
        xp = backend.array_module(labels)
        outside = (labels < 0) | (labels >= num_classes)

        def error() -> ValueError:
            position = int(xp.argmax(outside))
            return ValueError(
                f"{method}: target {labels[position].item()} at index {position} is outside "
                f"the {num_classes} classes [0, {num_classes}) of the output "
                f"({int(xp.sum(outside))} such target(s) in the batch)"
            )

        device_waits.check(xp.any(outside), error)
    return labels


class TopKAccuracy(ValidationMethod):
    """Share of samples whose target class is among the ``k`` highest scores.

    Parameters
    ----------
    k : int
        How many of the top-scoring classes count as a hit.

    Notes
    -----
    Outputs are ``(n, classes)`` scores (log-probabilities, probabilities or logits: only
    their order matters) and targets are 0-based class indices. A one-column output (or a
    1-D one) is a binary probability: the prediction is ``output >= 0.5``.
    """

    higher_is_better = True

    def __init__(self, k: int):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"TopKAccuracy: k must be an integer >= 1, got {k!r}")
        self.k = int(k)

    @property
    def name(self) -> str:
        return f"Top{self.k}Accuracy"

    def batch_result(self, output: Any, target: Any) -> ValidationResult:
        scores = _array(output)
        xp = backend.array_module(scores)
        binary = scores.ndim == 1 or (scores.ndim == 2 and scores.shape[1] == 1)
        classes = 2 if binary else (scores.shape[1] if scores.ndim == 2 else None)
        labels = _class_targets(target, scores, self.name, classes)
        if binary:
            predicted = (scores.reshape(-1) >= 0.5).astype(np.int64)
            correct = xp.sum(predicted == labels)
        elif scores.ndim == 2:
            if scores.shape[0] != labels.shape[0]:
                raise ValueError(
                    f"{self.name}: {scores.shape[0]} outputs but {labels.shape[0]} targets"
                )
            if self.k >= scores.shape[1]:
                correct = labels.shape[0]
            elif self.k == 1:
                correct = xp.sum(xp.argmax(scores, axis=1) == labels)
            else:
                top = xp.argpartition(-scores, self.k - 1, axis=1)[:, : self.k]
                correct = xp.sum(xp.any(top == labels[:, None], axis=1))
        else:
            raise ValueError(
                f"{self.name}: expects outputs of shape (n, classes), got shape {scores.shape}"
            )
        return ValidationResult(self.name, _total(correct), int(labels.shape[0]))

    def __repr__(self) -> str:
        return f"TopKAccuracy({self.k})" if self.k not in (1, 5) else f"{self.name}()"


class Top1Accuracy(TopKAccuracy):
    """Share of samples whose highest-scoring class is the target (BigDL's Top1Accuracy)."""

    def __init__(self):
        super().__init__(1)


class Top5Accuracy(TopKAccuracy):
    """Share of samples whose target is among the five highest scores (BigDL's Top5Accuracy)."""

    def __init__(self):
        super().__init__(5)


class Loss(ValidationMethod):
    """The mean of a criterion over the validation set (BigDL's ``Loss``).

    Parameters
    ----------
    criterion : Module, optional
        A loss that returns the *mean* over its batch (the default reduction of every
        bigdl_py loss); a criterion with ``reduction == "sum"`` is also understood. ``None``
        means the training criterion when used through an optimizer's ``set_validation``.
    """

    higher_is_better = False

    def __init__(self, criterion: Any = None):
        if getattr(criterion, "reduction", "mean") not in ("mean", "sum"):
            raise ValueError(
                f"Loss needs a criterion that reduces its batch to one number ('mean' or 'sum'), "
                f"got reduction={criterion.reduction!r}"
            )
        self.criterion = criterion

    def with_default_criterion(self, criterion: Any) -> ValidationMethod:
        return self if self.criterion is not None else Loss(criterion)

    def batch_result(self, output: Any, target: Any) -> ValidationResult:
        if self.criterion is None:
            raise ValueError(
                "Loss() has no criterion: pass one (Loss(nn.NLLLoss())), or use it through an "
                "optimizer's set_validation, which supplies the training criterion"
            )
        from bigdl_py.nn.loss import _ClassLoss

        values = _array(target)
        values = values if hasattr(values, "dtype") else np.asarray(values)
        # Float class indices (not CrossEntropyLoss's soft labels, shaped as the output):
        # the one rule of class labels; the criterion itself checks their range.
        indices = getattr(values, "shape", None) != getattr(_array(output), "shape", None)
        if isinstance(self.criterion, _ClassLoss) and indices and values.dtype.kind == "f":
            target = _whole_numbers(values, self.name)
        if not isinstance(target, Tensor):
            target = Tensor(target, _copy=False)
        value = _total(_array(self.criterion(output, target)))
        count = int(_array(output).shape[0])
        reduction = getattr(self.criterion, "reduction", "mean")
        total = value if reduction == "sum" else value * count
        return ValidationResult(self.name, total, count)

    def __repr__(self) -> str:
        return f"Loss({self.criterion!r})" if self.criterion is not None else "Loss()"


class MAE(ValidationMethod):
    """Mean absolute error over every output element (BigDL's ``MAE``)."""

    higher_is_better = False

    def batch_result(self, output: Any, target: Any) -> ValidationResult:
        predicted = _array(output)
        xp = backend.array_module(predicted)
        expected = backend.to_device(_array(target), backend.device_of(predicted))
        if expected.size != predicted.size:
            raise ValueError(
                f"MAE: output shape {tuple(predicted.shape)} and target shape "
                f"{tuple(expected.shape)} hold different numbers of elements"
            )
        difference = predicted.astype(np.float64) - expected.reshape(predicted.shape)
        return ValidationResult(self.name, _total(xp.sum(xp.abs(difference))), predicted.size)


_TOP_K_NAME = re.compile(r"Top[1-9][0-9]*Accuracy")


def own_method_class(name: str) -> type[ValidationMethod] | None:
    """The class of bigdl_py's own validation method whose results are named ``name``
    (``"Top1Accuracy"``, ``"Loss"``, ...), or None for any other name."""
    if _TOP_K_NAME.fullmatch(name):
        return TopKAccuracy
    return {"Loss": Loss, "MAE": MAE}.get(name)


def watching_mode(
    watcher: str, mode: str | None, metric: str, higher_is_better: bool | None, source: str
) -> str:
    """The mode (``"min"`` or ``"max"``) in which ``watcher`` must watch ``metric``.

    One rule for every watcher of a validation metric (``EarlyStopping``, ``Plateau``): the
    mode is the metric's declared direction, a mode given that contradicts it is refused,
    and a metric that declares none needs a mode given.

    Parameters
    ----------
    watcher : str
        Who watches, for the message (``"EarlyStopping"``).
    mode : {"min", "max"} or None
        The mode the user gave (None: follow the metric).
    metric : str
        The metric's name.
    higher_is_better : bool or None
        The direction its validation method declares (None: undeclared).
    source : str
        Where the direction comes from, for the message (``"Top1Accuracy() (Top1Accuracy)"``).

    Raises
    ------
    ValueError
        When ``mode`` contradicts the declared direction, or neither says which way is better.
    """
    if higher_is_better is None:
        if mode is None:
            raise ValueError(
                f"{watcher}: the validation method {source} declares no direction (its "
                "higher_is_better is None): pass mode='max' if higher values are better or "
                "mode='min' if lower ones are, or set higher_is_better on the class"
            )
        return mode
    direction = "max" if higher_is_better else "min"
    if mode is not None and mode != direction:
        better = "higher" if higher_is_better else "lower"
        raise ValueError(
            f"{watcher}: mode={mode!r} contradicts the metric {metric!r}: {source} is better "
            f"when {better} (mode={direction!r}); leave mode out to follow the metric"
        )
    return direction


def describe_method(method: ValidationMethod) -> str:
    """``method`` and its class, for messages: ``"Top1Accuracy() (Top1Accuracy)"``."""
    return f"{method!r} ({type(method).__qualname__})"


def check_methods(methods: Any) -> list[ValidationMethod]:
    """A list of validation methods from one method or a sequence; a clear error otherwise."""
    if isinstance(methods, ValidationMethod):
        methods = [methods]
    methods = list(methods)
    if not methods:
        raise ValueError("set_validation needs at least one validation method, e.g. Top1Accuracy()")
    for method in methods:
        if not isinstance(method, ValidationMethod):
            raise TypeError(
                "validation methods must be ValidationMethod instances (Top1Accuracy(), "
                f"Top5Accuracy(), Loss(), MAE()), got {type(method).__name__}: {method!r}"
            )
    return methods
