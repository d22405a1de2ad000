"""Containers: ``Sequential`` (BigDL's ``Sequential``), ``ModuleList`` and ``ModuleDict``.

Children are registered under their keys (``"0"``, ``"1"``, ... unless named), so their
parameters appear in ``named_parameters()`` in container order, e.g. ``"0.weight"``.

Model save/load rebuilds a module from the arguments it was constructed with
(``Module._init_args``). A container's content changes after construction (``append``,
``insert``, ``extend``, item assignment), so each container keeps its recorded arguments
in step with its content: they always read as the call that would build it as it is now.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from bigdl_py.nn.module import Module

__all__ = ["ModuleDict", "ModuleList", "Sequential"]


def _check_module(value: Any, container: str) -> Module:
    if not isinstance(value, Module):
        raise TypeError(f"{container} holds Modules, got {type(value).__name__}: {value!r}")
    return value


class _IndexedModules(Module):
    """Children in order: indexing, slicing, ``len``, iteration, append, insert, delete.

    Children added by position get the next free number as their name; when every name is
    a number, deleting or inserting renumbers them ``"0"``, ``"1"``, ... again.
    """

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def _position(self, index: int) -> int:
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"{type(self).__name__} indices must be ints or slices, got {index!r}")
        if not -len(self) <= index < len(self):
            raise IndexError(
                f"index {index} is out of range for {type(self).__name__} of length {len(self)}"
            )
        return index % len(self)

    def __getitem__(self, index: int | slice):
        if isinstance(index, slice):
            return self._from_entries(list(self._modules.items())[index])
        return list(self._modules.values())[self._position(index)]

    def __setitem__(self, index: int, module: Module) -> None:
        name = list(self._modules)[self._position(index)]
        self._modules[name] = _check_module(module, type(self).__name__)
        self._record_content()

    def __delitem__(self, index: int | slice) -> None:
        entries = list(self._modules.items())
        if isinstance(index, slice):
            del entries[index]
        else:
            del entries[self._position(index)]
        self._set_children(entries)

    def append(self, module: Module):
        """Add ``module`` at the end; returns ``self`` so calls chain."""
        self.add_module(self._free_name(), _check_module(module, type(self).__name__))
        self._record_content()
        return self

    def extend(self, modules: Iterable[Module]):
        """Append each of ``modules``; returns ``self``."""
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        """Put ``module`` before position ``index`` (``len(self)`` appends)."""
        entries = list(self._modules.items())
        if not -len(entries) <= index <= len(entries):
            raise IndexError(
                f"insert index {index} is out of range for {type(self).__name__} of length "
                f"{len(entries)}"
            )
        position = index + len(entries) if index < 0 else index
        entries.insert(position, (None, _check_module(module, type(self).__name__)))
        self._set_children(entries)

    def _free_name(self) -> str:
        number = len(self._modules)
        while str(number) in self._modules:
            number += 1
        return str(number)

    def _set_children(self, entries: list) -> None:
        """Replace the children by ``(name or None, module)`` entries, renumbering if numeric."""
        renumber = all(name is None or name.isdigit() for name, _ in entries)
        taken = {name for name, _ in entries if name is not None}
        self._modules.clear()
        for position, (name, module) in enumerate(entries):
            if renumber:
                name = str(position)
            elif name is None:  # a number no other child has, now or later in the loop
                number = position
                while str(number) in taken:
                    number += 1
                name = str(number)
                taken.add(name)
            self.add_module(name, module)
        self._record_content()

    def _is_numbered(self) -> bool:
        return list(self._modules) == [str(i) for i in range(len(self._modules))]

    def _from_entries(self, entries: list):  # pragma: no cover - abstract
        raise NotImplementedError

    def _record_content(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class Sequential(_IndexedModules):
    """Run modules one after another, each on the previous one's output.

    Parameters
    ----------
    *modules : Module, or one mapping of name -> Module
        Children in order. Positional children are named ``"0"``, ``"1"``, ...

    Examples
    --------
    >>> model = Sequential(Linear(784, 100), ReLU(), Linear(100, 10))
    >>> model = Sequential().add(Linear(784, 100)).add(ReLU())  # BigDL's chaining style
    >>> model = Sequential(OrderedDict(hidden=Linear(4, 8), act=Tanh()))
    """

    def __init__(self, *modules: Module | Mapping[str, Module]):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], Mapping):
            entries = [(str(name), module) for name, module in modules[0].items()]
        else:
            entries = [(str(position), module) for position, module in enumerate(modules)]
        for name, module in entries:
            self.add_module(name, _check_module(module, "Sequential"))
        self._record_content()

    def add(self, module: Module) -> Sequential:
        """BigDL's name for :meth:`append`; returns ``self`` so calls chain."""
        return self.append(module)

    def __getitem__(self, index: int | slice | str):
        if isinstance(index, str):
            return self._modules[index]
        return super().__getitem__(index)

    def _from_entries(self, entries: list) -> Sequential:
        if all(name.isdigit() for name, _ in entries):
            return Sequential(*(module for _, module in entries))
        return Sequential(OrderedDict(entries))

    def _record_content(self) -> None:
        if type(self) is not Sequential:
            return  # a subclass's own constructor arguments describe it
        if self._is_numbered():
            arguments = tuple(self._modules.values())
        else:
            arguments = (OrderedDict(self._modules),)
        object.__setattr__(self, "_init_args", (arguments, {}))

    def forward(self, x):
        for module in self._modules.values():
            x = module(x)
        return x


class ModuleList(_IndexedModules):
    """A list of sub-modules, registered so their parameters belong to the owner.

    Parameters
    ----------
    modules : iterable of Module, optional
    """

    def __init__(self, modules: Iterable[Module] | None = None):
        super().__init__()
        for module in modules or ():
            self.add_module(self._free_name(), _check_module(module, "ModuleList"))
        self._record_content()

    def _from_entries(self, entries: list) -> ModuleList:
        return ModuleList(module for _, module in entries)

    def _record_content(self) -> None:
        if type(self) is ModuleList:  # a subclass's own constructor arguments describe it
            object.__setattr__(self, "_init_args", ((list(self._modules.values()),), {}))

    def forward(self, *inputs):
        raise NotImplementedError(
            "ModuleList has no forward(); iterate over it in the owner's forward()"
        )


class ModuleDict(Module):
    """A dict of named sub-modules, in insertion order.

    Parameters
    ----------
    modules : mapping of str -> Module, optional
    """

    def __init__(self, modules: Mapping[str, Module] | None = None):
        super().__init__()
        for name, module in (modules or {}).items():
            self[name] = module

    def __getitem__(self, name: str) -> Module:
        return self._modules[name]

    def __setitem__(self, name: str, module: Module) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"ModuleDict keys are non-empty strings without '.', got {name!r}")
        self.add_module(name, _check_module(module, "ModuleDict"))
        self._record_content()

    def __delitem__(self, name: str) -> None:
        del self._modules[name]
        self._record_content()

    def _record_content(self) -> None:
        if type(self) is ModuleDict:  # a subclass's own constructor arguments describe it
            object.__setattr__(self, "_init_args", ((OrderedDict(self._modules),), {}))

    def __contains__(self, name: str) -> bool:
        return name in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def forward(self, *inputs):
        raise NotImplementedError(
            "ModuleDict has no forward(); look modules up in the owner's forward()"
        )
