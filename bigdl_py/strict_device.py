"""The ``strict`` device: a GPU stand-in on the host, for tests that must run without one.

Its arrays (:class:`StrictArray`) keep their values in host memory but behave as CuPy's do
where it matters to the code that runs on a GPU:

* the GPU route is taken: ``backend.is_device_array`` is true for them, so every op takes
  the branch it takes on CuPy (and the fused kernels run as their NumPy references);
* a full reduction gives a 0-d array, not a host scalar, and indexing one element too;
* implicit conversion to NumPy (``np.asarray(x)``) raises ``TypeError``, as CuPy's does,
  and so does mixing them with NumPy arrays of one or more dimensions in one ufunc
  (arithmetic, comparisons, ``exp``...);
* reading values back (``bool``, ``int``, ``float``, ``item``, ``tolist``, ``get``,
  printing, boolean-mask indexing, ``nonzero`` and the other functions whose output size
  depends on the data) raises ``device_waits.DeviceSyncError`` inside a training step
  (``device_waits.no_device_waits``): on a GPU each of these makes the host wait.

So a test that trains on ``device="strict"`` fails on any device wait a step would make on
a GPU, today's or one written later. Outside a step every read works (``.get()`` copies),
so tests compare results freely. Nothing here is fast; it is a checker, not a device.

CUDA graphs are emulated (``bigdl_py.step_graph``): while a step is captured
(``backend.active_capture()``), every operation on these arrays runs and is also
*recorded* with the memory it read and wrote; a replay runs the recorded operations again
on that same memory, with the scalars they were given, exactly as a CUDA graph replays its
kernels. So a step that keeps a host value in a kernel argument, or rebinds state to a new
array instead of writing it in place, trains differently when replayed, and a test that
compares replayed training with eager training catches it. What a graph cannot replay is
refused during the capture (``backend.NotCapturable``): host data copied to the device
(``asarray`` of host values, assigning a NumPy array), draws of ``xp.random``, and the
products CuPy runs on its own cuBLAS handle (``matmul`` and ``@``, ``dot``, ``vdot``,
``inner``, ``tensordot``, ``einsum`` of floating-point arrays), which CuPy refuses to call
while a stream is captured: a step's products are captured only through the package's
route, ``autograd.ops.cublas.matmul``, whose model of the cuBLAS call runs here as a kernel.
"""

from __future__ import annotations

import numbers
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from bigdl_py import backend, device_waits

# Functions whose output's size (or Python result) depends on the values: CuPy must read
# them back to size the output, so each is a device wait.
_DATA_SIZED_FUNCTIONS = frozenset(
    {
        "allclose",
        "argwhere",
        "array_equal",
        "array_equiv",
        "bincount",
        "compress",
        "extract",
        "flatnonzero",
        "histogram",
        "nonzero",
        "unique",
        "unique_counts",
        "unique_inverse",
        "unique_values",
    }
)
# Products CuPy runs on its own cuBLAS handle, whose stream binding raises
# NotImplementedError while a stream is captured (integer operands take kernels of CuPy's
# own, which a graph captures).
_CUPY_CUBLAS_FUNCTIONS = frozenset({"matmul", "dot", "vdot", "inner", "tensordot", "einsum"})
# Creation functions may take host data (they copy it to the device, as CuPy's do).
_CREATION_FUNCTIONS = frozenset(
    {"array", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray", "copy"}
)


class StrictArray:
    """A host array posing as a device array; see the module docstring."""

    __slots__ = ("_host", "__weakref__")
    __array_priority__ = 1000  # ``ndarray + StrictArray`` comes here (and is refused)
    __hash__ = None  # arrays are not hashable

    def __init__(self, host: np.ndarray):
        self._host = host

    # --- what stays on the device --------------------------------------------------------
    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    ndim = property(lambda self: self._host.ndim)
    size = property(lambda self: self._host.size)
    itemsize = property(lambda self: self._host.itemsize)
    nbytes = property(lambda self: self._host.nbytes)
    strides = property(lambda self: self._host.strides)
    flags = property(lambda self: self._host.flags)
    T = property(lambda self: StrictArray(self._host.T))  # noqa: N802 - ndarray's name
    base = property(lambda self: None if self._host.base is None else _wrap(self._host.base))

    def __len__(self) -> int:
        return len(self._host)

    def __iter__(self):
        for index in range(len(self._host)):
            yield self[index]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            # ``__array_interface__``, ``__array_struct__``, ``__dlpack__``: host views that
            # NumPy would convert through, silently.
            raise AttributeError(name)
        value = getattr(self._host, name)
        if callable(value):
            return _on_device(value, name)
        return _wrap(value)

    def __getitem__(self, key: Any) -> StrictArray:
        key = _unwrap_index(key, "indexing with a boolean mask")
        host = self._host
        return _recorded(lambda: host[key])

    def __setitem__(self, key: Any, value: Any) -> None:
        key = _unwrap_index(key, "assigning through a boolean mask")
        if isinstance(value, (np.ndarray, list)):
            backend.refuse_in_capture("assigning host data to a device array")
        host, host_value = self._host, _unwrap(value, allow_host=True)
        _recorded(lambda: host.__setitem__(key, host_value))

    def __array_ufunc__(self, ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        _refuse_cupy_cublas_in_capture(ufunc.__name__, inputs)  # matmul and ``@``
        host_inputs = tuple(_unwrap(value, allow_host=False) for value in inputs)
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_unwrap(value, allow_host=False) for value in out)
        result = _recorded(lambda: getattr(ufunc, method)(*host_inputs, **kwargs))
        if out is not None:
            return out[0] if len(out) == 1 else out
        return result

    def __array_function__(self, func, types_, args, kwargs) -> Any:
        return _call(func, func.__name__, args, kwargs)

    def __array__(self, dtype=None, copy=None):
        raise TypeError(
            "Implicit conversion of a strict-device array to a NumPy array is not allowed "
            "(CuPy refuses it too): use backend.as_numpy(x) or x.get()"
        )

    # --- reads back to the host: each one a device wait ------------------------------------
    def get(self, *args: Any, **kwargs: Any) -> np.ndarray:
        """A host copy (CuPy's ``get``)."""
        device_waits.check_read("get()")
        return self._host.copy()

    def item(self, *args: Any) -> Any:
        device_waits.check_read("item()")
        return self._host.item(*args)

    def tolist(self) -> Any:
        device_waits.check_read("tolist()")
        return self._host.tolist()

    def __bool__(self) -> bool:
        device_waits.check_read("bool()")
        return bool(self._host)

    def __float__(self) -> float:
        device_waits.check_read("float()")
        return float(self._host)

    def __int__(self) -> int:
        device_waits.check_read("int()")
        return int(self._host)

    def __index__(self) -> int:
        device_waits.check_read("using an array as an index (__index__)")
        return self._host.__index__()

    def __complex__(self) -> complex:
        device_waits.check_read("complex()")
        return complex(self._host)

    def __repr__(self) -> str:
        device_waits.check_read("repr()")
        return f"strict({self._host!r})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        device_waits.check_read("format()")
        return format(self._host, spec)

    def __contains__(self, value: Any) -> bool:
        device_waits.check_read("the 'in' operator")
        return value in self._host

    def nonzero(self) -> tuple:
        device_waits.check_read("nonzero()")
        return tuple(StrictArray(part) for part in self._host.nonzero())

    # --- copies ------------------------------------------------------------------------------
    def __copy__(self) -> StrictArray:
        host = self._host
        return _recorded(host.copy)

    def __deepcopy__(self, memo: dict) -> StrictArray:
        return self.__copy__()

    def __reduce__(self):
        raise TypeError("strict-device arrays are not pickled; copy them to the host first")


def _binary(ufunc, reflected: bool = False):
    if reflected:
        return lambda self, other: ufunc(other, self)
    return lambda self, other: ufunc(self, other)


def _in_place(ufunc):
    def apply(self, other):
        ufunc(self, other, out=(self,))
        return self

    return apply


for _name, _ufunc in {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "truediv": np.true_divide,
    "floordiv": np.floor_divide,
    "mod": np.remainder,
    "pow": np.power,
    "matmul": np.matmul,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
    "lshift": np.left_shift,
    "rshift": np.right_shift,
}.items():
    setattr(StrictArray, f"__{_name}__", _binary(_ufunc))
    setattr(StrictArray, f"__r{_name}__", _binary(_ufunc, reflected=True))
    setattr(StrictArray, f"__i{_name}__", _in_place(_ufunc))
for _name, _ufunc in {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}.items():
    setattr(StrictArray, f"__{_name}__", _binary(_ufunc))
StrictArray.__neg__ = lambda self: np.negative(self)
StrictArray.__pos__ = lambda self: np.positive(self)
StrictArray.__abs__ = lambda self: np.absolute(self)
StrictArray.__invert__ = lambda self: np.invert(self)


def _recorded(operation: Callable[[], Any], wrap: Callable[[Any], Any] | None = None) -> Any:
    """Run ``operation`` on host memory and wrap its result (``_wrap``, or ``wrap``); during
    a capture, record it with the arrays it returned, for replays to write again."""
    result = (wrap or _wrap)(operation())
    capture = backend.active_capture()
    if capture is not None:
        capture.record(operation, result)
    return result


def replay(operation: Callable[[], Any], result: Any) -> None:
    """Run a recorded ``operation`` again, writing what it returns into the memory of the
    ``result`` it returned when recorded (a replayed kernel writes the same buffers)."""
    _write_into(result, operation())


def _write_into(target: Any, value: Any) -> None:
    if type(target) is StrictArray:
        if value is not target._host:
            np.copyto(target._host, value)
    elif isinstance(target, (tuple, list)):
        for part, part_value in zip(target, value, strict=True):
            _write_into(part, part_value)


def run_on_device(function: Callable[..., Any], *arguments: Any) -> None:
    """Run ``function`` (a kernel's NumPy reference: it writes its arrays in place) on the
    memory behind strict arrays, as the device runs a kernel on its own memory; recorded
    during a capture like any operation."""
    host_arguments = tuple(device_memory(value) for value in arguments)
    _recorded(lambda: function(*host_arguments))


def _wrap(value: Any) -> Any:
    """Host results as device ones: arrays and NumPy scalars become StrictArrays."""
    if isinstance(value, np.ndarray):
        return StrictArray(value)
    if isinstance(value, np.generic):
        return StrictArray(np.asarray(value))
    if isinstance(value, tuple):
        return tuple(_wrap(item) for item in value)
    if isinstance(value, list):
        return [_wrap(item) for item in value]
    return value


def _unwrap(value: Any, allow_host: bool) -> Any:
    """The host array behind ``value``; NumPy arrays of 1+ dims are refused unless
    ``allow_host`` (CuPy refuses to mix host and device arrays in an operation)."""
    if type(value) is StrictArray:
        return value._host
    if isinstance(value, np.ndarray) and value.ndim and not allow_host:
        raise TypeError(
            f"a NumPy array of shape {value.shape} met a strict-device array in one operation "
            "(CuPy refuses to mix host and device arrays): move it with backend.to_device"
        )
    if isinstance(value, (tuple, list)):
        return type(value)(_unwrap(item, allow_host) for item in value)
    return value


def _unwrap_index(key: Any, what: str) -> Any:
    """An indexing key with its device arrays unwrapped; a boolean mask is a device wait
    (CuPy counts the mask's true entries on the host to size the result)."""
    parts = key if isinstance(key, tuple) else (key,)
    for part in parts:
        if isinstance(part, (StrictArray, np.ndarray)) and part.dtype == np.bool_ and part.ndim:
            device_waits.check_read(what)
    return _unwrap(key, allow_host=True)


def _call(function, name: str, args: tuple, kwargs: dict) -> Any:
    """Run a NumPy function on unwrapped arguments and wrap what it returns."""
    if name in _DATA_SIZED_FUNCTIONS:
        device_waits.check_read(f"{name}()")
    if name == "where" and len(args) == 1 and not kwargs:
        device_waits.check_read("where() with one argument")
    _refuse_cupy_cublas_in_capture(name, args)
    # Host arrays pass: here they are often settings (axes, shapes, index lists) that
    # CuPy takes too. Ufuncs, whose inputs are all operands, refuse them.
    host_args = tuple(_unwrap(value, allow_host=True) for value in args)
    host_kwargs = {key: _unwrap(value, allow_host=True) for key, value in kwargs.items()}
    if name == "take" and "mode" not in host_kwargs:
        host_kwargs["mode"] = "wrap"  # CuPy wraps indices out of range instead of raising
    if name in _CREATION_FUNCTIONS:
        if args and _holds_host_data(args[0]):
            backend.refuse_in_capture(f"{name}() of host data (a copy to the device)")
        # A copy, as a transfer to a device makes one: the host array may change later.
        return _recorded(lambda: function(*host_args, **host_kwargs), _copied)
    if name in _UNINITIALISED:
        return _wrap(function(*host_args, **host_kwargs))  # a graph replays no allocation
    return _recorded(lambda: function(*host_args, **host_kwargs))


def on_cupys_cublas(name: str, operands: tuple) -> bool:
    """Whether CuPy runs the function ``name`` of ``operands`` on its own cuBLAS handle:
    one of its products (``matmul``, ``dot``, ``vdot``, ``inner``, ``tensordot``,
    ``einsum``) with a floating-point or complex device operand."""
    return name in _CUPY_CUBLAS_FUNCTIONS and any(
        type(value) is StrictArray and value.dtype.kind in "fc" for value in operands
    )


def _refuse_cupy_cublas_in_capture(name: str, operands: tuple) -> None:
    """Refuse, during a capture, a product CuPy would run on its own cuBLAS handle."""
    if backend.active_capture() is not None and on_cupys_cublas(name, operands):
        backend.refuse_in_capture(
            f"{name}() on CuPy's own cuBLAS handle (which CuPy refuses to call while a stream "
            "is captured: products go through bigdl_py.autograd.ops.cublas.matmul)"
        )


# Allocations without contents: a replay has nothing to write into them.
_UNINITIALISED = frozenset({"empty", "empty_like"})


def _copied(value: Any) -> StrictArray:
    return StrictArray(np.array(value))


def _holds_host_data(value: Any) -> bool:
    """Whether ``value`` (the data of a creation function) has any part on the host."""
    if type(value) is StrictArray:
        return False
    if isinstance(value, (tuple, list)):
        return any(_holds_host_data(item) for item in value)
    return True


def _on_device(function, name: str):
    """A method or function of NumPy made to take and give device arrays."""

    def run(*args: Any, **kwargs: Any) -> Any:
        return _call(function, name, args, kwargs)

    run.__name__ = name
    return run


class _Random:
    """``xp.random`` of the strict device: CuPy's signatures (a ``dtype`` argument)."""

    def __init__(self):
        self._generator = np.random.default_rng()

    def seed(self, seed: int | None = None) -> None:
        self._generator = np.random.default_rng(seed)

    def random(self, size=None, dtype=np.float64) -> StrictArray:
        _refuse_random_in_capture()
        return StrictArray(np.asarray(self._generator.random(size, dtype=dtype)))

    def standard_normal(self, size=None, dtype=np.float64) -> StrictArray:
        _refuse_random_in_capture()
        return StrictArray(np.asarray(self._generator.standard_normal(size, dtype=dtype)))


def _refuse_random_in_capture() -> None:
    # CuPy's generator keeps its position on the host: a replayed draw repeats itself.
    backend.refuse_in_capture("a draw of xp.random (cuRAND)")


class _UFunc:
    """A NumPy ufunc whose results are device arrays even from scalar inputs (CuPy's
    ``cupy.sqrt(2.0)`` is a 0-d device array); array inputs dispatch to
    ``StrictArray.__array_ufunc__``."""

    def __init__(self, ufunc: np.ufunc):
        self._ufunc = ufunc

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _unwrap(args, allow_host=False)  # refuses host arrays, as CuPy's ufuncs do
        out = kwargs.get("out")
        operands = (*args, *kwargs.values(), *(out if isinstance(out, tuple) else ()))
        if any(type(value) is StrictArray for value in operands):
            # Dispatched to StrictArray.__array_ufunc__, which records it.
            return _wrap(self._ufunc(*args, **kwargs))
        return _recorded(lambda: self._ufunc(*args, **kwargs))  # scalars: a 0-d result

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._ufunc, name)
        if callable(value):
            return lambda *args, **kwargs: _wrap(value(*args, **kwargs))
        return value


class _Namespace(types.SimpleNamespace):
    """NumPy's namespace (or one of its submodules) working on device arrays: what
    ``Device('strict').xp`` and ``backend.array_module`` give for strict arrays."""

    def __init__(self, module: types.ModuleType):
        super().__init__()
        object.__setattr__(self, "_module", module)

    def __getattr__(self, name: str) -> Any:
        if name == "ndarray":
            return StrictArray
        if name == "random" and self._module is np:
            return random
        value = getattr(self._module, name)
        if isinstance(value, types.ModuleType):
            return _Namespace(value)
        if isinstance(value, type) or not callable(value):
            return value  # dtypes, classes (errstate, finfo), constants
        if isinstance(value, np.ufunc):
            return _UFunc(value)
        return _on_device(value, name)

    def __repr__(self) -> str:
        return f"<strict-device namespace of {self._module.__name__}>"


random = _Random()
numpy = _Namespace(np)


def device_memory(value: Any) -> Any:
    """The host array behind a strict-device array (other values as they are), for code
    that stands for the device itself, as a kernel's NumPy reference does: the device
    reading its own memory is no wait for the host."""
    return value._host if type(value) is StrictArray else value


def to_strict(array: Any) -> StrictArray:
    """A copy of host data (or the same array, when already on the strict device)."""
    if type(array) is StrictArray:
        return array
    if isinstance(array, (numbers.Number, np.generic, list, tuple, np.ndarray)):
        return StrictArray(np.array(array))
    raise TypeError(f"cannot move {type(array).__name__} to the strict device")
