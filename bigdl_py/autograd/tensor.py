"""``Tensor``: an array plus what autograd needs (requires_grad, grad, grad_fn).

The Tensor only wraps an array and records the graph; every computation lives in an op
(``bigdl_py.autograd.ops``), which sees raw NumPy or CuPy arrays.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.engine import RowGradient, run_backward


class Tensor:
    """An n-dimensional array on a device that can take part in automatic differentiation.

    Parameters
    ----------
    data : array-like, Tensor, numpy or cupy array
        The values. Python floats default to float32, Python ints to int64.
    requires_grad : bool
        Whether operations on this tensor are recorded so ``backward`` can reach it.
    dtype : dtype, optional
        Cast ``data`` to this dtype.
    device : str or Device, optional
        ``'cpu'`` (default for host data) or ``'cuda:<n>'``.
    """

    __array_priority__ = 1000  # make ``ndarray + Tensor`` call Tensor.__radd__

    def __init__(
        self,
        data: Any,
        requires_grad: bool = False,
        dtype: Any = None,
        device: Any = None,
        _copy: bool = True,
    ):
        if type(data) is np.ndarray and not _copy and dtype is None:
            array = data  # what every op's output takes: skip the conversions below
        else:
            if isinstance(data, Tensor):
                data = data.data
            array = _to_array(data, dtype, copy=_copy)
        if device is not None:
            array = backend.to_device(array, device)
        if requires_grad and array.dtype.kind != "f":
            raise TypeError(
                f"only floating-point tensors can require gradients, got dtype {array.dtype}"
            )
        self.data = array
        self.requires_grad = bool(requires_grad)
        self.grad: Tensor | None = None
        self.grad_fn = None

    # --- basic properties ---------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def device(self) -> backend.Device:
        return backend.device_of(self.data)

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    def numel(self) -> int:
        return int(self.data.size)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        extras = []
        if self.device.type != "cpu":
            extras.append(f"device='{self.device}'")
        if self.grad_fn is not None:
            extras.append(f"grad_fn=<{self.grad_fn.name}>")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        body = np.array2string(backend.as_numpy(self.data), separator=", ", prefix="tensor(")
        suffix = "".join(", " + e for e in extras)
        return f"tensor({body}, dtype={self.dtype}{suffix})"

    # --- conversion ---------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The values as a NumPy array (copied from the GPU when needed; no grad tracking)."""
        return backend.as_numpy(self.data)

    def item(self):
        if self.data.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.data.reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def detach(self) -> Tensor:
        """A tensor sharing this one's values, cut from the graph."""
        return Tensor(self.data, _copy=False)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if requires_grad and not backend.is_floating(self.dtype):
            raise TypeError(f"only floating-point tensors can require gradients, got {self.dtype}")
        if self.grad_fn is not None and not requires_grad:
            raise RuntimeError("requires_grad can only be turned off on a leaf tensor")
        self.requires_grad = requires_grad
        return self

    def to(self, device: Any = None, dtype: Any = None) -> Tensor:
        """A copy on ``device`` and/or with ``dtype`` (gradients flow back through the copy)."""
        result = self
        if dtype is not None and np.dtype(dtype) != self.dtype:
            result = _ops().astype(result, dtype)
        if device is not None and backend.device(device) != self.device:
            result = _ops().to_device(result, device)
        return result

    def cpu(self) -> Tensor:
        return self.to("cpu")

    def cuda(self, index: int = 0) -> Tensor:
        return self.to(f"cuda:{index}")

    def float(self) -> Tensor:
        return self.to(dtype=np.float32)

    def double(self) -> Tensor:
        return self.to(dtype=np.float64)

    # --- autograd -----------------------------------------------------------------------
    def backward(self, gradient: Any = None, retain_graph: bool = False) -> None:
        """Accumulate the gradient of this tensor into the ``.grad`` of every leaf it uses.

        Parameters
        ----------
        gradient : array-like or Tensor, optional
            d(objective)/d(self). Required unless this tensor holds a single value.
        retain_graph : bool
            Keep the graph's saved buffers so backward can run through it again.
        """
        if not self.requires_grad:
            raise RuntimeError(
                "backward() on a tensor that does not require grad: no input of the "
                "computation had requires_grad=True (or it ran under no_grad())"
            )
        if gradient is None:
            if self.data.size != 1:
                raise RuntimeError(
                    f"backward() without a gradient needs a single-value tensor, got shape "
                    f"{self.shape}; pass gradient= with that shape"
                )
            seed = self.device.xp.ones(self.shape, dtype=self.dtype)
        else:
            seed = gradient.data if isinstance(gradient, Tensor) else gradient
            seed = backend.to_device(seed, self.device).astype(self.dtype, copy=False)
            if tuple(seed.shape) != self.shape:
                raise ValueError(
                    f"backward(): gradient shape {tuple(seed.shape)} does not match the "
                    f"tensor's shape {self.shape}"
                )
        run_backward(self, seed, retain_graph=retain_graph)

    def retain_grad(self) -> Tensor:
        """Keep ``.grad`` on this non-leaf tensor during backward."""
        if self.grad_fn is not None:
            # The graph reaches this tensor only through its Function, which must not keep
            # it (or its array) alive: a weak reference, as the user holds the tensor.
            self.grad_fn.retained_output = weakref.ref(self)
        return self

    def _accumulate_grad(self, gradient) -> None:
        # In place when a gradient exists: flat-parameter training makes .grad a view into one
        # flat gradient vector, and that view must stay the one that holds the sum.
        if type(gradient) is RowGradient:
            if self.grad is None:
                self.grad = Tensor(gradient.dense(), _copy=False)
            else:
                gradient.add_to(self.grad.data)
        elif self.grad is None:
            self.grad = Tensor(gradient, _copy=True)
        else:
            self.grad.data += gradient

    def zero_grad(self) -> None:
        if self.grad is not None:
            self.grad.data.fill(0)

    # --- operators (the math is in bigdl_py.autograd.ops) -------------------------------
    def __add__(self, other):
        return _ops().add(self, other)

    def __radd__(self, other):
        return _ops().add(other, self)

    def __sub__(self, other):
        return _ops().sub(self, other)

    def __rsub__(self, other):
        return _ops().sub(other, self)

    def __mul__(self, other):
        return _ops().mul(self, other)

    def __rmul__(self, other):
        return _ops().mul(other, self)

    def __truediv__(self, other):
        return _ops().div(self, other)

    def __rtruediv__(self, other):
        return _ops().div(other, self)

    def __neg__(self):
        return _ops().neg(self)

    def __pos__(self):
        return self

    def __pow__(self, exponent):
        return _ops().pow(self, exponent)

    def __rpow__(self, base):
        return _ops().pow(base, self)

    def __matmul__(self, other):
        return _ops().matmul(self, other)

    def __rmatmul__(self, other):
        return _ops().matmul(other, self)

    def __abs__(self):
        return _ops().abs(self)

    def __getitem__(self, index):
        return _ops().getitem(self, index)

    # Comparisons give boolean tensors and record nothing (they have no gradient).
    def _compare(self, other, name):
        other_data = other.data if isinstance(other, Tensor) else other
        return Tensor(getattr(self.data, name)(other_data), _copy=False)

    def __eq__(self, other):  # noqa: D105
        return self._compare(other, "__eq__")

    def __ne__(self, other):
        return self._compare(other, "__ne__")

    def __lt__(self, other):
        return self._compare(other, "__lt__")

    def __le__(self, other):
        return self._compare(other, "__le__")

    def __gt__(self, other):
        return self._compare(other, "__gt__")

    def __ge__(self, other):
        return self._compare(other, "__ge__")

    __hash__ = object.__hash__

    def __bool__(self):
        if self.data.size != 1:
            raise ValueError(
                f"the truth value of a tensor with {self.data.size} elements is ambiguous"
            )
        return bool(self.data)

    # --- methods that mirror the functional ops -----------------------------------------
    def sum(self, axis=None, keepdims=False):
        return _ops().sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return _ops().mean(self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return _ops().max(self, axis, keepdims)

    def min(self, axis=None, keepdims=False):
        return _ops().min(self, axis, keepdims)

    def var(self, axis=None, keepdims=False, unbiased=False):
        return _ops().var(self, axis, keepdims, unbiased)

    def argmax(self, axis=None):
        return Tensor(self.data.argmax(axis=axis), _copy=False)

    def argmin(self, axis=None):
        return Tensor(self.data.argmin(axis=axis), _copy=False)

    def reshape(self, *shape):
        return _ops().reshape(self, _shape_arg(shape))

    view = reshape

    def flatten(self, start_dim: int = 0):
        start = start_dim % max(self.ndim, 1)
        return _ops().reshape(self, self.shape[:start] + (-1,))

    def transpose(self, *axes):
        if len(axes) == 2 and all(isinstance(a, int) for a in axes) and self.ndim != 2:
            order = list(range(self.ndim))
            first, second = axes[0] % self.ndim, axes[1] % self.ndim
            order[first], order[second] = order[second], order[first]
            return _ops().permute(self, tuple(order))
        return _ops().permute(self, _shape_arg(axes) if axes else None)

    def permute(self, *axes):
        return _ops().permute(self, _shape_arg(axes))

    @property
    def T(self):  # noqa: N802
        return _ops().permute(self, None)

    def unsqueeze(self, dim: int):
        dim = dim % (self.ndim + 1)
        return _ops().reshape(self, self.shape[:dim] + (1,) + self.shape[dim:])

    def squeeze(self, dim: int | None = None):
        if dim is None:
            return _ops().reshape(self, tuple(s for s in self.shape if s != 1))
        dim = dim % self.ndim
        if self.shape[dim] != 1:
            return self
        return _ops().reshape(self, self.shape[:dim] + self.shape[dim + 1 :])

    def exp(self):
        return _ops().exp(self)

    def log(self):
        return _ops().log(self)

    def sqrt(self):
        return _ops().sqrt(self)

    def abs(self):
        return _ops().abs(self)

    def tanh(self):
        return _ops().tanh(self)

    def sigmoid(self):
        return _ops().sigmoid(self)

    def relu(self):
        return _ops().relu(self)

    def clip(self, min_value=None, max_value=None):
        return _ops().clip(self, min_value, max_value)

    clamp = clip

    def softmax(self, axis: int = -1):
        return _ops().softmax(self, axis)

    def log_softmax(self, axis: int = -1):
        return _ops().log_softmax(self, axis)


_ops_module = None


def _ops():
    """The functional ops namespace, imported on first use because ops import Tensor (an
    import statement per operator call cost ~0.6 us)."""
    global _ops_module
    if _ops_module is None:
        from bigdl_py.autograd import ops

        _ops_module = ops
    return _ops_module


def _shape_arg(args: tuple) -> tuple:
    """Accept both ``t.reshape(2, 3)`` and ``t.reshape((2, 3))``."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return tuple(args)


def _to_array(data: Any, dtype: Any, copy: bool):
    """Convert user data to a NumPy/CuPy array with our dtype defaults."""
    if backend.is_device_array(data):
        array = data if dtype is None else data.astype(dtype, copy=False)
        return array.copy() if copy and array is data else array
    if isinstance(data, np.ndarray) or np.isscalar(data) and hasattr(data, "dtype"):
        array = np.array(data, dtype=dtype, copy=copy) if copy else np.asarray(data, dtype=dtype)
        return array
    # Python scalars and (nested) lists: floats become float32, like torch.tensor.
    array = np.asarray(data)
    if dtype is not None:
        return array.astype(dtype, copy=False)
    if array.dtype == np.float64:
        return array.astype(backend.DEFAULT_DTYPE)
    if array.dtype.kind in "iu":
        return array.astype(np.int64, copy=False)
    return array


def check_same_device(tensors, op_name: str) -> None:
    """Raise when an op's inputs live on different devices, naming the op and both."""
    if len(tensors) < 2:
        return
    first = tensors[0].device
    for position, tensor in enumerate(tensors[1:], start=1):
        if tensor.device != first:
            raise RuntimeError(
                f"{op_name}: input 0 is on {first} but input {position} is on {tensor.device}; "
                "move them to one device with .to(device)"
            )


def tensor(data: Any, requires_grad: bool = False, dtype: Any = None, device: Any = None):
    """Make a new Tensor (copies ``data``), like ``torch.tensor``."""
    return Tensor(data, requires_grad=requires_grad, dtype=dtype, device=device)


def zeros(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    target = backend.device(device)
    data = target.xp.zeros(_shape_arg(shape), dtype=backend.resolve_dtype(dtype))
    return Tensor(data, requires_grad=requires_grad, _copy=False)


def ones(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    target = backend.device(device)
    data = target.xp.ones(_shape_arg(shape), dtype=backend.resolve_dtype(dtype))
    return Tensor(data, requires_grad=requires_grad, _copy=False)
