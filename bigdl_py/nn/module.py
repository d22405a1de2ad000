"""``Module``: the base of every layer and model, and ``Parameter``.

Assigning a ``Parameter``, a ``Module`` or (through ``register_buffer``) a buffer to an
attribute registers it, so ``named_parameters()`` has one fixed order: registration order,
depth first. That order is the layout of the flat parameter vector used by the optimizers
and by distributed training, so it must never depend on dict iteration of anything else.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.nn import _build_budget


class Parameter(Tensor):
    """A Tensor that is a module's learnable weight (``requires_grad`` is on by default)."""

    def __init__(self, data: Any, requires_grad: bool = True):
        super().__init__(data, requires_grad=requires_grad, _copy=False)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


class GraphNodeBase:
    """Marker base of functional-graph placeholders (``bigdl_py.nn.graph.Node``).

    It lives here so ``Module.__call__`` can tell a graph-building call from a computing
    one with one ``isinstance`` test, without importing the graph module.
    """

    __slots__ = ()


def _holds_graph_node(inputs: tuple) -> bool:
    """True when a call's arguments (or a list/tuple among them) include a graph node."""
    for value in inputs:
        # One isinstance test settles the common case, a Tensor argument.
        if isinstance(value, (GraphNodeBase, list, tuple)) and (
            isinstance(value, GraphNodeBase) or any(isinstance(v, GraphNodeBase) for v in value)
        ):
            return True
    return False


class Module:
    """Base class for layers and models.

    Subclasses assign parameters and sub-modules as attributes in ``__init__`` and implement
    ``forward``. Calling the module calls ``forward``.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = _recording_init(cls.__dict__["__init__"])

    def __init__(self):
        # A class with no ``__init__`` of its own below Module (ReLU, Tanh, ...) takes no
        # arguments; record that, since no recording wrapper ran (see _recording_init).
        if "_init_args" not in self.__dict__:
            object.__setattr__(self, "_init_args", ((), {}))
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # --- registration -------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot assign {name!r} before Module.__init__() is called; call "
                "super().__init__() first in your module's __init__"
            )
        for registry in ("_parameters", "_buffers", "_modules"):
            self.__dict__[registry].pop(name, None)
        # State kept by a module is counted against nn.load's build budget (a no-op else).
        if isinstance(value, Parameter):
            _build_budget.count_array(value)
            self._parameters[name] = value
        elif isinstance(value, Module):
            _build_budget.count_module(value)
            self._modules[name] = value
        elif name in self.__dict__.get("_buffer_names", ()):
            _build_budget.count_array(value)
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: look in the registries.
        for registry in ("_parameters", "_buffers", "_modules"):
            entries = self.__dict__.get(registry)
            if entries is not None and name in entries:
                return entries[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for registry in ("_parameters", "_buffers", "_modules"):
            if name in self.__dict__[registry]:
                del self.__dict__[registry][name]
                return
        object.__delattr__(self, name)

    def register_buffer(self, name: str, value: Tensor | None) -> None:
        """Register state that is saved in ``state_dict`` but not trained (running stats)."""
        if "_buffer_names" not in self.__dict__:
            object.__setattr__(self, "_buffer_names", set())
        self.__dict__["_buffer_names"].add(name)
        self.__dict__.pop(name, None)
        _build_budget.count_array(value)
        self._buffers[name] = value

    def register_parameter(self, name: str, value: Parameter | None) -> None:
        if value is None:
            self._parameters[name] = None
        else:
            setattr(self, name, value)

    def add_module(self, name: str, module: Module | None) -> None:
        if module is None:
            self._modules[name] = None
        else:
            setattr(self, name, module)

    # --- traversal ----------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module and every sub-module, depth first, each once (shared ones too)."""
        seen = set()
        stack = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            children = [
                (f"{name}.{child_name}" if name else child_name, child)
                for child_name, child in module._modules.items()
                if child is not None
            ]
            stack.extend(reversed(children))

    def modules(self) -> Iterator[Module]:
        for _, module in self.named_modules():
            yield module

    def children(self) -> Iterator[Module]:
        for module in self._modules.values():
            if module is not None:
                yield module

    def named_children(self) -> Iterator[tuple[str, Module]]:
        for name, module in self._modules.items():
            if module is not None:
                yield name, module

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """(dotted name, parameter) pairs in registration order; a shared parameter once."""
        seen = set()
        for module_name, module in self.named_modules(prefix):
            for name, parameter in module._parameters.items():
                if parameter is None or id(parameter) in seen:
                    continue
                seen.add(id(parameter))
                yield (f"{module_name}.{name}" if module_name else name), parameter

    def parameters(self) -> Iterator[Parameter]:
        for _, parameter in self.named_parameters():
            yield parameter

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        seen = set()
        for module_name, module in self.named_modules(prefix):
            for name, buffer in module._buffers.items():
                if buffer is None or id(buffer) in seen:
                    continue
                seen.add(id(buffer))
                yield (f"{module_name}.{name}" if module_name else name), buffer

    def buffers(self) -> Iterator[Tensor]:
        for _, buffer in self.named_buffers():
            yield buffer

    # --- modes and gradients ------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero every parameter's gradient in place (keeps flat-gradient views intact)."""
        for parameter in self.parameters():
            if set_to_none:
                parameter.grad = None
            else:
                parameter.zero_grad()

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for parameter in self.parameters():
            parameter.requires_grad_(requires_grad)
        return self

    # --- state --------------------------------------------------------------------------
    def state_dict(self) -> OrderedDict:
        """Dotted name -> NumPy array copy, parameters then buffers of each module in order."""
        state = OrderedDict()
        for module_name, module in self.named_modules():
            for registry in (module._parameters, module._buffers):
                for name, value in registry.items():
                    if value is None:
                        continue
                    key = f"{module_name}.{name}" if module_name else name
                    state[key] = value.numpy().copy()
        return state

    def load_state_dict(self, state: dict, strict: bool = True) -> tuple[list, list]:
        """Copy arrays into parameters and buffers in place (views stay views).

        Raises
        ------
        KeyError / ValueError
            In strict mode, naming every missing key, unexpected key and shape mismatch.

        Returns
        -------
        (missing_keys, unexpected_keys)
        """
        targets = OrderedDict()
        for module_name, module in self.named_modules():
            for registry in (module._parameters, module._buffers):
                for name, value in registry.items():
                    if value is not None:
                        targets[f"{module_name}.{name}" if module_name else name] = value
        missing = [key for key in targets if key not in state]
        unexpected = [key for key in state if key not in targets]
        mismatched = [
            f"{key}: checkpoint {tuple(np.shape(state[key]))} vs model {targets[key].shape}"
            for key in targets
            if key in state and tuple(np.shape(state[key])) != targets[key].shape
        ]
        if mismatched or (strict and (missing or unexpected)):
            problems = []
            if missing:
                problems.append(f"missing keys: {missing}")
            if unexpected:
                problems.append(f"unexpected keys: {unexpected}")
            if mismatched:
                problems.append(f"shape mismatches: {mismatched}")
            raise ValueError(
                f"load_state_dict for {type(self).__name__} failed; " + "; ".join(problems)
            )
        for key, target in targets.items():
            if key not in state:
                continue
            value = state[key]
            value = value.data if isinstance(value, Tensor) else value
            value = backend.to_device(backend.as_numpy(value), target.device)
            target.data[...] = value.astype(target.dtype, copy=False)
        return missing, unexpected

    # --- devices and dtypes -------------------------------------------------------------
    def to(self, device: Any = None, dtype: Any = None) -> Module:
        """Move (and/or cast) every parameter and buffer in place; returns self."""
        target = backend.device(device) if device is not None else None
        for module in self.modules():
            for registry in (module._parameters, module._buffers):
                for value in registry.values():
                    if value is None:
                        continue
                    data = value.data
                    if dtype is not None and backend.is_floating(data.dtype):
                        data = data.astype(dtype)
                    if target is not None:
                        data = backend.to_device(data, target)
                    value.data = data
                    if value.grad is not None:
                        value.grad = None  # a stale gradient on the old device is useless
        return self

    def cpu(self) -> Module:
        return self.to("cpu")

    def cuda(self, index: int = 0) -> Module:
        return self.to(f"cuda:{index}")

    def double(self) -> Module:
        return self.to(dtype=np.float64)

    def float(self) -> Module:
        return self.to(dtype=np.float32)

    # --- calling ------------------------------------------------------------------------
    def forward(self, *inputs, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} does not implement forward()")

    def __call__(self, *inputs, **kwargs):
        if _holds_graph_node(inputs):
            # Called on placeholders of a functional graph, a module records a graph node
            # instead of computing (the Keras/BigDL style; see nn/graph.py).
            from bigdl_py.nn.graph import Node  # noqa: PLC0415 - graph.py imports this module

            return Node(self, inputs, kwargs)
        return self.forward(*inputs, **kwargs)

    # --- display ------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        children = list(self.named_children())
        if not children:
            return lines[0] + ")"
        for name, child in children:
            child_text = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {child_text}")
        return "\n".join(lines) + "\n)"

    def num_parameters(self) -> int:
        return sum(parameter.numel() for parameter in self.parameters())


def _recording_init(original_init):
    """Wrap a subclass ``__init__`` to remember the arguments the module was built with.

    Model save/load (``bigdl_py.train.serialization``) rebuilds the architecture from these
    arguments and a registry of known classes, so loading a model never runs stored code.
    Only the outermost (most derived) call records: ``super().__init__`` calls do not.
    """

    @functools.wraps(original_init)
    def init(self, *args, **kwargs):
        if "_init_args" not in self.__dict__:
            object.__setattr__(self, "_init_args", (args, dict(kwargs)))
        original_init(self, *args, **kwargs)

    return init
