"""Ops that move values without changing them: reshape, permute, indexing, concat, stack,
dtype casts and device moves."""

from __future__ import annotations

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.function import Function


class Reshape(Function):
    def forward(self, a, shape=()):
        self.input_shape = a.shape
        try:
            return backend.array_module(a).reshape(a, shape)
        except ValueError:
            raise ValueError(
                f"reshape: cannot reshape a tensor of shape {tuple(a.shape)} "
                f"({a.size} elements) into shape {tuple(shape)}"
            ) from None

    def backward(self, grad):
        return backend.array_module(grad).reshape(grad, self.input_shape)


class Permute(Function):
    """Transpose with an explicit axis order (``None`` reverses the axes)."""

    def forward(self, a, axes=None):
        if axes is not None:
            axes = tuple(int(x) % max(a.ndim, 1) for x in axes)
            if sorted(axes) != list(range(a.ndim)):
                raise ValueError(
                    f"permute: axes {axes} are not a permutation of the {a.ndim} axes of a "
                    f"tensor of shape {tuple(a.shape)}"
                )
        self.axes = axes
        return backend.array_module(a).transpose(a, axes)

    def backward(self, grad):
        xp = backend.array_module(grad)
        if self.axes is None:
            return xp.transpose(grad)
        return xp.transpose(grad, np.argsort(self.axes))


class GetItem(Function):
    """Basic and advanced indexing; the backward scatters (adding repeated indices)."""

    def forward(self, a, index=None):
        self.index = _index_to_device(index, a)
        self.input_shape = a.shape
        self.input_dtype = a.dtype
        try:
            return a[self.index]
        except IndexError as error:
            raise IndexError(f"getitem: {error} (tensor shape {tuple(a.shape)})") from None

    def backward(self, grad):
        xp = backend.array_module(grad)
        full = xp.zeros(self.input_shape, dtype=grad.dtype)
        if _is_basic_index(self.index):
            full[self.index] = grad  # views never repeat an element: assignment is enough
        else:
            backend.scatter_add(full, self.index, grad)  # repeated indices add up
        return full


def _is_basic_index(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return all(p is None or p is Ellipsis or isinstance(p, (int, slice)) for p in parts)


def _index_to_device(index, array):
    """Unwrap Tensors in an index and move index arrays to the array's device."""
    from bigdl_py.autograd.tensor import Tensor

    def convert(part):
        if isinstance(part, Tensor):
            part = part.data
        if isinstance(part, (list, np.ndarray)) or backend.is_device_array(part):
            return backend.to_device(
                np.asarray(part) if isinstance(part, list) else part, backend.device_of(array)
            )
        return part

    if isinstance(index, tuple):
        return tuple(convert(p) for p in index)
    return convert(index)


class Concatenate(Function):
    def forward(self, *arrays, axis=0):
        xp = backend.array_module(arrays[0])
        ndim = arrays[0].ndim
        axis = axis % max(ndim, 1)
        for position, array in enumerate(arrays):
            other = tuple(s for i, s in enumerate(array.shape) if i != axis)
            first = tuple(s for i, s in enumerate(arrays[0].shape) if i != axis)
            if array.ndim != ndim or other != first:
                raise ValueError(
                    f"concatenate: input {position} has shape {tuple(array.shape)}, which does "
                    f"not match input 0's shape {tuple(arrays[0].shape)} outside axis {axis}"
                )
        self.axis = axis
        self.sizes = [a.shape[axis] for a in arrays]
        return xp.concatenate(arrays, axis=axis)

    def backward(self, grad):
        # Basic slices (views), not xp.split: a two-way split of NCF's (1024, 64) gradient
        # took 5.8 us in np.split's bookkeeping, the slices 0.3 us.
        parts = []
        start = 0
        leading = (slice(None),) * self.axis
        for size in self.sizes:
            parts.append(grad[leading + (slice(start, start + size),)])
            start += size
        return tuple(parts)


class Stack(Function):
    def forward(self, *arrays, axis=0):
        xp = backend.array_module(arrays[0])
        for position, array in enumerate(arrays):
            if array.shape != arrays[0].shape:
                raise ValueError(
                    f"stack: input {position} has shape {tuple(array.shape)} but input 0 has "
                    f"shape {tuple(arrays[0].shape)}"
                )
        self.axis = axis % (arrays[0].ndim + 1)
        return xp.stack(arrays, axis=self.axis)

    def backward(self, grad):
        xp = backend.array_module(grad)
        count = grad.shape[self.axis]
        return tuple(xp.take(grad, i, axis=self.axis) for i in range(count))


class BroadcastTo(Function):
    def forward(self, a, shape=()):
        self.input_shape = a.shape
        try:
            return backend.array_module(a).broadcast_to(a, shape)
        except ValueError:
            raise ValueError(
                f"broadcast_to: cannot broadcast shape {tuple(a.shape)} to {tuple(shape)}"
            ) from None

    def backward(self, grad):
        return grad  # the engine's unbroadcast sums it back to the input's shape


class AsType(Function):
    def forward(self, a, dtype=None):
        self.input_dtype = a.dtype
        return a.astype(dtype)

    def backward(self, grad):
        return grad.astype(self.input_dtype)


class ToDevice(Function):
    def forward(self, a, target=None):
        self.source = backend.device_of(a)
        return backend.to_device(a, target)

    def backward(self, grad):
        return backend.to_device(grad, self.source)
