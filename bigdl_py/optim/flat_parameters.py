"""One contiguous weight vector and one gradient vector, with every parameter a view into them.

This is the layout BigDL trains on (and JAX's ``ravel_pytree``, ChainerMN's packed buffer):
the module's parameters, in ``named_parameters()`` order, laid end to end. An OptimMethod
updates the weight vector (or one slice of it) in place, and the module sees the new values
at once because its parameters are views; ``loss.backward()`` accumulates straight into the
gradient vector because each parameter's ``.grad`` is a view too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from bigdl_py import backend
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.optim.sharding import slice_bounds


class FlatEntry(NamedTuple):
    """Where one parameter lives in the flat vector."""

    name: str
    offset: int
    shape: tuple

    @property
    def size(self) -> int:
        count = 1
        for extent in self.shape:
            count *= extent
        return count

    @property
    def stop(self) -> int:
        return self.offset + self.size


def flat_layout(named_parameters) -> list[FlatEntry]:
    """The flat-vector layout of ``(name, parameter)`` pairs: each one's offset and shape."""
    entries = []
    offset = 0
    for name, parameter in named_parameters:
        entry = FlatEntry(name, offset, tuple(parameter.shape))
        entries.append(entry)
        offset = entry.stop
    return entries


def merge_ranges(ranges) -> list[tuple[int, int]]:
    """Sort ``[start, stop)`` ranges and join the ones that touch or overlap; drop empty ones."""
    merged: list[list[int]] = []
    for start, stop in sorted(r for r in ranges if r[1] > r[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return [(start, stop) for start, stop in merged]


class FlatParameters:
    """Flatten a module's parameters into one weight vector and one gradient vector.

    After construction every parameter's ``.data`` is a view of :attr:`weights` and its
    ``.grad`` is a Tensor viewing :attr:`gradients` (zeroed), so updating the vectors in place
    updates the module and ``backward`` fills the gradient vector without any copy.

    Flattening a module a second time is allowed: the new vectors take the current values and
    the parameters are re-pointed to them; the older ``FlatParameters`` is then detached
    (:meth:`is_attached` is False and :meth:`load` refuses it).

    Parameters
    ----------
    module : Module
        Whose parameters to flatten. All must share one floating dtype and one device.

    Raises
    ------
    ValueError
        If the module has no parameters, or they mix dtypes or devices, or one is not float.

    Examples
    --------
    >>> flat = FlatParameters(model)
    >>> loss = criterion(model(x), y); loss.backward()   # fills flat.gradients
    >>> SGD(lr=0.1).step(flat.weights, flat.gradients)  # updates the model in place
    """

    def __init__(self, module: Any):
        named = list(module.named_parameters())
        if not named:
            raise ValueError(f"FlatParameters: {type(module).__name__} has no parameters")
        first_name, first = named[0]
        if not backend.is_floating(first.dtype):
            raise ValueError(
                f"FlatParameters: parameter {first_name!r} has dtype {first.dtype}; only "
                "floating-point parameters can be trained"
            )
        for name, parameter in named[1:]:
            if parameter.dtype != first.dtype:
                raise ValueError(
                    f"FlatParameters: parameters must share one dtype, but {first_name!r} is "
                    f"{first.dtype} and {name!r} is {parameter.dtype}; cast the module first, "
                    "e.g. module.to(dtype='float32')"
                )
            if parameter.device != first.device:
                raise ValueError(
                    f"FlatParameters: parameters must share one device, but {first_name!r} is "
                    f"on {first.device} and {name!r} on {parameter.device}; move the module "
                    "first, e.g. module.to('cpu')"
                )
        self.entries: list[FlatEntry] = flat_layout(named)
        self.size: int = self.entries[-1].stop
        self.dtype = first.dtype
        self.device = first.device
        xp = self.device.xp
        with self.device.activate():
            self.weights = xp.empty(self.size, dtype=self.dtype)
            self.gradients = xp.zeros(self.size, dtype=self.dtype)
        self._parameters = [parameter for _, parameter in named]
        self._weight_views = []
        self._gradient_views = []
        for entry, parameter in zip(self.entries, self._parameters, strict=True):
            weight_view = self.weights[entry.offset : entry.stop].reshape(entry.shape)
            gradient_view = self.gradients[entry.offset : entry.stop].reshape(entry.shape)
            weight_view[...] = parameter.data
            parameter.data = weight_view
            parameter.grad = Tensor(gradient_view, _copy=False)
            self._weight_views.append(weight_view)
            self._gradient_views.append(gradient_view)

    # --- slices -------------------------------------------------------------------------
    def slice_bounds(self, index: int, count: int) -> tuple[int, int]:
        """``[start, stop)`` of slice ``index`` of ``count`` balanced contiguous slices.

        See :func:`bigdl_py.optim.sharding.slice_bounds`: sizes differ by at most one, and
        ``count > size`` gives empty slices.
        """
        return slice_bounds(self.size, index, count)

    def slice(self, index: int, count: int) -> tuple[Any, Any]:
        """Views ``(weights[start:stop], gradients[start:stop])`` of slice ``index``."""
        start, stop = self.slice_bounds(index, count)
        return self.weights[start:stop], self.gradients[start:stop]

    # --- whole-vector operations --------------------------------------------------------
    def load(self, vector: Any) -> None:
        """Copy ``vector`` (NumPy or CuPy, shape ``(size,)``, same dtype) into the weights."""
        self._check_attached("load")
        if tuple(getattr(vector, "shape", ())) != (self.size,):
            raise ValueError(
                f"FlatParameters.load: expected a vector of shape ({self.size},), got "
                f"{tuple(getattr(vector, 'shape', ()))}"
            )
        if vector.dtype != self.dtype:
            raise ValueError(
                f"FlatParameters.load: vector has dtype {vector.dtype} but the parameters are "
                f"{self.dtype}; cast it first (vector.astype('{self.dtype}'))"
            )
        self.weights[...] = backend.to_device(vector, self.device)

    def zero_grad(self) -> None:
        """Set the whole gradient vector to zero in place."""
        self.gradients.fill(0)

    def unravel(self, vector: Any) -> dict[str, Any]:
        """Name -> view of ``vector`` shaped like that parameter (any vector of this layout)."""
        if tuple(vector.shape) != (self.size,):
            raise ValueError(
                f"FlatParameters.unravel: expected shape ({self.size},), got {tuple(vector.shape)}"
            )
        return {
            entry.name: vector[entry.offset : entry.stop].reshape(entry.shape)
            for entry in self.entries
        }

    def named_views(self) -> Iterator[tuple[str, Any, Any]]:
        """``(name, weight_view, gradient_view)`` for each parameter, in layout order."""
        for entry, weight_view, gradient_view in zip(
            self.entries, self._weight_views, self._gradient_views, strict=True
        ):
            yield entry.name, weight_view, gradient_view

    # --- parameter groups ---------------------------------------------------------------
    def ranges_where(self, predicate: Callable[[str, Any], bool]) -> list[tuple[int, int]]:
        """Merged ``[start, stop)`` ranges of the parameters for which ``predicate(name, p)``."""
        return merge_ranges(
            (entry.offset, entry.stop)
            for entry, parameter in zip(self.entries, self._parameters, strict=True)
            if predicate(entry.name, parameter)
        )

    def group_mask(self, predicate: Callable[[str, Any], bool]) -> Any:
        """Boolean vector, True on the elements of parameters for which ``predicate(name, p)``."""
        xp = self.device.xp
        mask = xp.zeros(self.size, dtype=bool)
        for start, stop in self.ranges_where(predicate):
            mask[start:stop] = True
        return mask

    # --- integrity ----------------------------------------------------------------------
    def is_attached(self) -> bool:
        """True while every parameter's data and grad are still this object's views.

        It turns False when something re-pointed a parameter: ``module.to(...)``,
        ``module.zero_grad(set_to_none=True)``, assigning ``.data``, or flattening again.
        """
        return all(
            parameter.data is weight_view
            and parameter.grad is not None
            and parameter.grad.data is gradient_view
            for parameter, weight_view, gradient_view in zip(
                self._parameters, self._weight_views, self._gradient_views, strict=True
            )
        )

    def _check_attached(self, operation: str) -> None:
        if not self.is_attached():
            raise RuntimeError(
                f"FlatParameters.{operation}: the module's parameters no longer view this flat "
                "vector (it was flattened again, moved with .to(), or its grads were set to "
                "None); build a new FlatParameters(module)"
            )

    def __repr__(self) -> str:
        return (
            f"FlatParameters(size={self.size}, parameters={len(self.entries)}, "
            f"dtype={self.dtype}, device='{self.device}')"
        )


def flatten_parameters(module: Any) -> FlatParameters:
    """Flatten ``module``'s parameters in place; see :class:`FlatParameters`."""
    return FlatParameters(module)
