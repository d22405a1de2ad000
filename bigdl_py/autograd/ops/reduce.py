"""Reductions over axes: sum, mean, max, min (with keepdims)."""

from __future__ import annotations

from bigdl_py import backend
from bigdl_py.autograd.function import Function


def normalize_axes(axis, ndim: int, op_name: str) -> tuple:
    """Turn ``None``, an int or a sequence into a sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    result = []
    for a in axes:
        if not -ndim <= a < max(ndim, 1):
            raise ValueError(f"{op_name}: axis {a} is out of range for a {ndim}-d tensor")
        result.append(a % max(ndim, 1))
    return tuple(sorted(set(result)))


def _expand_back(grad, input_shape, axes, keepdims):
    """Reshape a reduced gradient so it broadcasts against the input."""
    if keepdims:
        return grad
    xp = backend.array_module(grad)
    kept_shape = tuple(1 if i in axes else s for i, s in enumerate(input_shape))
    return xp.reshape(grad, kept_shape)


class Sum(Function):
    def forward(self, a, axis=None, keepdims=False):
        self.axes = normalize_axes(axis, a.ndim, "sum")
        self.keepdims = keepdims
        self.input_shape = a.shape
        return a.sum(axis=self.axes, keepdims=keepdims)

    def backward(self, grad):
        xp = backend.array_module(grad)
        grad = _expand_back(grad, self.input_shape, self.axes, self.keepdims)
        return xp.broadcast_to(grad, self.input_shape)


class Mean(Function):
    def forward(self, a, axis=None, keepdims=False):
        self.axes = normalize_axes(axis, a.ndim, "mean")
        self.keepdims = keepdims
        self.input_shape = a.shape
        count = 1
        for ax in self.axes:
            count *= a.shape[ax]
        self.count = count
        return a.mean(axis=self.axes, keepdims=keepdims)

    def backward(self, grad):
        xp = backend.array_module(grad)
        grad = _expand_back(grad, self.input_shape, self.axes, self.keepdims)
        return xp.broadcast_to(grad / self.count, self.input_shape)


class _Extremum(Function):
    """max/min: the gradient is shared equally among tied extreme elements."""

    reducer = "max"

    def forward(self, a, axis=None, keepdims=False):
        if a.size == 0:
            raise ValueError(f"{self.reducer}: cannot reduce an empty tensor of shape {a.shape}")
        self.axes = normalize_axes(axis, a.ndim, self.reducer)
        self.keepdims = keepdims
        out = getattr(a, self.reducer)(axis=self.axes, keepdims=True)
        self.save_for_backward(a, out)
        if keepdims:
            return out
        return backend.array_module(a).reshape(
            out, tuple(s for i, s in enumerate(a.shape) if i not in self.axes)
        )

    def backward(self, grad):
        a, out = self.saved
        grad = _expand_back(grad, a.shape, self.axes, self.keepdims)
        mask = a == out
        # The tie count is an integer array: cast it, or the division would upcast to float64.
        count = mask.sum(axis=self.axes, keepdims=True).astype(grad.dtype)
        return grad * mask / count


class Max(_Extremum):
    reducer = "max"


class Min(_Extremum):
    reducer = "min"
