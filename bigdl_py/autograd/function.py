"""``Function``: one differentiable operation, its forward and backward on raw arrays.

A subclass implements ``forward(*arrays, **options) -> array`` and
``backward(grad_output) -> tuple of input gradients`` (``None`` for an input that needs
none). ``Function.apply`` runs the forward on the inputs' arrays, wraps the result in a
``Tensor`` and, only when grad mode is on and some input requires a gradient, keeps the
instance as the output's ``grad_fn`` so ``backward`` can walk back through it (tinygrad's
split: ops see arrays, ``Tensor`` only records the graph).

The graph links Functions, not Tensors: each recorded input is an :class:`InputEdge` to the
Function that produced it (or to the leaf Tensor itself), with the input's shape and dtype.
An input's array therefore stays alive only if some backward saved it
(``save_for_backward``): a ReLU or an addition that needs nothing of its inputs lets the
previous op's output go as soon as the forward pass moves on, as PyTorch does.

Gradients of broadcast operands are reduced back to the operand's shape by the backward
walk (``engine.py``), so a ``backward`` may return a gradient of the broadcast shape.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.grad_mode import is_grad_enabled


class InputEdge(NamedTuple):
    """Where an input's gradient goes: its producer, and the shape and dtype it must have."""

    node: Any  # the Function that produced the input, or the input itself if it is a leaf
    shape: tuple
    dtype: Any


class Function:
    """Base class of every differentiable op."""

    # Which positional inputs are differentiable. ``None`` means all of them; ops with integer
    # index inputs (embedding, gather) list the float ones.
    differentiable_inputs: tuple[int, ...] | None = None

    def __init__(self):
        # One InputEdge per input, None for an input that needs no gradient.
        self.inputs: tuple[InputEdge | None, ...] = ()
        self.needs_input_grad: tuple[bool, ...] = ()
        self.saved: tuple = ()
        self.released = False
        # A weak reference to the output Tensor when it asked to keep its gradient
        # (``Tensor.retain_grad``): weak, so the graph never keeps an activation alive.
        self.retained_output = None

    # --- to be implemented by subclasses -----------------------------------------------
    def forward(self, *arrays, **options):  # pragma: no cover - abstract
        raise NotImplementedError

    def backward(self, grad_output):  # pragma: no cover - abstract
        raise NotImplementedError

    # --- helpers for subclasses ---------------------------------------------------------
    def save_for_backward(self, *values) -> None:
        """Keep arrays the backward needs; they are freed after backward."""
        self.saved = values

    @property
    def name(self) -> str:
        return type(self).__name__

    def release(self) -> None:
        """Drop saved buffers so the graph's memory is freed (backward without retain_graph)."""
        # The edges go too: they hold the earlier Functions and their saved buffers, which
        # would otherwise live as long as the loss tensor.
        self.saved = ()
        self.inputs = ()
        self.released = True
        self._release_extra()

    def _release_extra(self) -> None:
        """Subclasses that keep buffers in other attributes drop them here."""

    # --- running an op ------------------------------------------------------------------
    @classmethod
    def apply(cls, *inputs, **options):
        """Run the op on Tensors (or constants) and record it when a gradient is needed.

        Every op of every step goes through here, so it is written for speed: one loop over
        the inputs makes the edges, and an edge is built with ``tuple.__new__`` (the
        NamedTuple's own ``__new__`` is Python code). 4.4 -> 2.6 us for a one-input op,
        8.5 -> 4.2 us with a Python number as second input, 16.2 -> 13.6 us for an
        embedding lookup (its indices are a constant); 24 two-input ops 123 -> 71 us
        (timeit, one thread).
        """
        tensor_class = _tensor_class or _import_tensor_class()
        tensors = inputs
        for value in inputs:
            if not isinstance(value, tensor_class):
                tensors = _as_tensors(inputs, cls.__name__)
                break
        _check_inputs(tensors, cls.__name__)
        function = cls()
        output_data = function.forward(*[t.data for t in tensors], **options)
        if not is_grad_enabled():
            return tensor_class(output_data, _copy=False)
        differentiable = cls.differentiable_inputs
        edges = []
        needs = []
        for position, tensor in enumerate(tensors):
            needed = tensor.requires_grad and (differentiable is None or position in differentiable)
            needs.append(needed)
            if needed:
                data = tensor.data
                node = tensor if tensor.grad_fn is None else tensor.grad_fn
                edges.append(_new_tuple(InputEdge, (node, data.shape, data.dtype)))
            else:
                edges.append(None)
        record = True in needs
        output = tensor_class(output_data, requires_grad=record, _copy=False)
        if record:
            function.inputs = tuple(edges)
            function.needs_input_grad = tuple(needs)
            output.grad_fn = function
        return output


_new_tuple = tuple.__new__
# The Tensor class, imported on first use: tensor.py imports this module.
_tensor_class = None


def _import_tensor_class():
    global _tensor_class
    from bigdl_py.autograd.tensor import Tensor

    _tensor_class = Tensor
    return Tensor


def _as_tensors(inputs: tuple, op_name: str) -> list:
    """Wrap constants (Python scalars, arrays) as Tensors matching the first Tensor's dtype.

    Called by ``apply`` only, which has set ``_tensor_class``."""
    Tensor = _tensor_class  # noqa: N806 - the class
    reference = None
    for value in inputs:
        if isinstance(value, Tensor):
            reference = value
            break
    return [
        value if isinstance(value, Tensor) else _constant(value, reference, op_name)
        for value in inputs
    ]


def _constant(value: Any, reference, op_name: str):
    """A constant input: Python scalars take the reference tensor's float dtype and device."""
    Tensor = _tensor_class  # noqa: N806 - the class, set by ``apply`` (via _as_tensors)
    if value is None:
        raise TypeError(f"{op_name}: got None where a tensor or number was expected")
    if reference is None:
        return Tensor(value, _copy=False)
    reference_data = reference.data
    if type(reference_data) is np.ndarray:
        # Host data or a Python number for a host op, as index arrays (embedding) and
        # scalar factors are: no device lookups.
        if type(value) is np.ndarray:
            if value.dtype.kind == "f" and reference_data.dtype.kind == "f":
                value = value.astype(reference_data.dtype, copy=False)
            return Tensor(value, _copy=False)
        if type(value) in (bool, int, float) and reference_data.dtype.kind == "f":
            return Tensor(np.asarray(value, dtype=reference_data.dtype), _copy=False)
    xp = reference.device.xp
    if isinstance(value, (bool, int, float)) and backend.is_floating(reference.dtype):
        # Filled on the device, not copied from the host: a CUDA graph can replay a fill.
        array = xp.full((), value, dtype=reference.dtype)
    else:
        array = backend.to_device(value, reference.device)
        if isinstance(value, (float, np.floating)) or (
            hasattr(array, "dtype")
            and backend.is_floating(array.dtype)
            and backend.is_floating(reference.dtype)
        ):
            array = array.astype(reference.dtype, copy=False)
    return Tensor(array, _copy=False)


def _check_inputs(tensors, op_name: str) -> None:
    """Raise when the inputs are on different devices or mix float dtypes.

    Host arrays are checked in one pass over the dtypes' kinds: the general checks below
    ask the backend for each input's device and ``np.issubdtype`` for each dtype, 3.0 us
    for two host inputs against 0.3 us here (timeit), and every op pays it.
    """
    float_dtype = None
    for tensor in tensors:
        data = tensor.data
        if type(data) is not np.ndarray:  # a device array, or a NumPy scalar
            from bigdl_py.autograd.tensor import check_same_device

            check_same_device(tensors, op_name)
            _check_same_float_dtype(tensors, op_name)
            return
        if data.dtype.kind == "f":
            if float_dtype is None:
                float_dtype = data.dtype
            elif data.dtype != float_dtype:
                _check_same_float_dtype(tensors, op_name)  # raises, naming both inputs


def _check_same_float_dtype(tensors, op_name: str) -> None:
    """Mixing float32 and float64 silently is a common bug; say which inputs differ."""
    first = None
    for position, tensor in enumerate(tensors):
        if not backend.is_floating(tensor.dtype):
            continue
        if first is None:
            first = (position, tensor.dtype)
        elif tensor.dtype != first[1]:
            raise TypeError(
                f"{op_name}: input {first[0]} has dtype {first[1]} but input {position} has "
                f"dtype {tensor.dtype}; convert one with .to(dtype=...)"
            )
