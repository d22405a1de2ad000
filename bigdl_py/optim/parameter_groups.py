"""Per-group hyperparameters on the flat vector: ``ParameterGroups`` and ``GroupedOptimMethod``.

A group is a set of contiguous ranges of the flat vector (the parameters a rule selected) with
hyperparameter overrides, e.g. no weight decay on biases. ``GroupedOptimMethod`` wraps one
OptimMethod (composition, as ChainerMN wraps optimizers) and steps every contiguous piece of a
slice with a copy of it that carries that piece's group's hyperparameters. Because every
update rule is element-wise, stepping piece by piece equals stepping each group as a whole,
with no gathering or copying of weights.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from bigdl_py.optim.flat_parameters import flat_layout, merge_ranges
from bigdl_py.optim.optim_method import OptimMethod

#: A rule: (group name, predicate(parameter_name, parameter) -> bool, hyperparameter overrides).
GroupRule = tuple[str, Callable[[str, Any], bool], Mapping[str, Any]]


class ParameterGroup(NamedTuple):
    """One group: its name, its ``[start, stop)`` ranges, overrides and parameter names."""

    name: str
    ranges: list[tuple[int, int]]
    overrides: dict[str, Any]
    parameter_names: list[str]

    @property
    def size(self) -> int:
        return sum(stop - start for start, stop in self.ranges)


class ParameterGroups:
    """A partition of ``[0, size)`` of the flat vector into named groups.

    Parameters
    ----------
    size : int
        Length of the flat vector.
    groups : sequence of ParameterGroup
        Disjoint groups whose ranges cover ``[0, size)`` exactly.

    Raises
    ------
    ValueError
        If names repeat, or the ranges overlap or leave a gap.
    """

    def __init__(self, size: int, groups: Sequence[ParameterGroup]):
        names = [group.name for group in groups]
        if len(set(names)) != len(names):
            raise ValueError(f"ParameterGroups: group names must be unique, got {names}")
        self.size = int(size)
        self.groups = list(groups)
        segments = sorted(
            (start, stop, index)
            for index, group in enumerate(self.groups)
            for start, stop in group.ranges
            if stop > start
        )
        position = 0
        for start, stop, index in segments:
            if start != position:
                problem = "overlap" if start < position else "gap"
                raise ValueError(
                    f"ParameterGroups: ranges must cover [0, {size}) without overlap; found a "
                    f"{problem} at offset {min(start, position)} (group {names[index]!r})"
                )
            position = stop
        if position != self.size:
            raise ValueError(
                f"ParameterGroups: ranges cover [0, {position}) but the vector has {size} elements"
            )
        self._segments = segments
        self._segment_starts = [start for start, _, _ in segments]

    @classmethod
    def from_module(
        cls, module: Any, rules: Sequence[GroupRule], default_name: str = "default"
    ) -> ParameterGroups:
        """Group a module's parameters by rules, in the flat layout of ``named_parameters()``.

        Each parameter joins the first rule whose predicate accepts it; the others form the
        group ``default_name`` with no overrides.

        Examples
        --------
        >>> ParameterGroups.from_module(model, [
        ...     ("no_decay", lambda name, p: name.endswith("bias") or p.ndim == 1,
        ...      {"weight_decay": 0.0}),
        ... ])
        """
        rule_names = [rule[0] for rule in rules]
        if default_name in rule_names:
            raise ValueError(
                f"ParameterGroups: rule name {default_name!r} is reserved for the parameters no "
                "rule selects; pick another name or pass default_name="
            )
        named = list(module.named_parameters())
        members: dict[str, list] = {name: [] for name in [*rule_names, default_name]}
        for entry, (_, parameter) in zip(flat_layout(named), named, strict=True):
            chosen = next(
                (rule_name for rule_name, accepts, _ in rules if accepts(entry.name, parameter)),
                default_name,
            )
            members[chosen].append(entry)
        overrides = {rule_name: dict(rule_overrides) for rule_name, _, rule_overrides in rules}
        groups = [
            ParameterGroup(
                name,
                merge_ranges((entry.offset, entry.stop) for entry in entries),
                overrides.get(name, {}),
                [entry.name for entry in entries],
            )
            for name, entries in members.items()
        ]
        size = sum(entry.size for entry in flat_layout(named))
        return cls(size, groups)

    def pieces(self, start: int, stop: int) -> list[tuple[int, int, ParameterGroup]]:
        """The contiguous single-group pieces of ``[start, stop)``, in order."""
        if not 0 <= start <= stop <= self.size:
            raise ValueError(
                f"ParameterGroups: slice [{start}, {stop}) is outside the vector [0, {self.size})"
            )
        first = max(bisect.bisect_right(self._segment_starts, start) - 1, 0)
        result = []
        for segment_start, segment_stop, index in self._segments[first:]:
            if segment_start >= stop:
                break
            piece_start, piece_stop = max(segment_start, start), min(segment_stop, stop)
            if piece_stop > piece_start:
                result.append((piece_start, piece_stop, self.groups[index]))
        return result

    def __repr__(self) -> str:
        summary = ", ".join(f"{group.name}: {group.size}" for group in self.groups)
        return f"ParameterGroups(size={self.size}, {{{summary}}})"


class GroupedOptimMethod:
    """An OptimMethod with per-group hyperparameters; serves the whole vector or one slice.

    ``method`` is a template: each group gets a copy with its overrides
    (``method.with_hyper_parameters(**overrides)``), and each contiguous piece of the served
    slice is stepped by its own copy of its group's method. The wrapper keeps its own copy of
    the template (``self.method``, never stepped), so the object passed in is left untouched.

    The state dict has the layout of a plain method's over the served slice (one array per
    state buffer, indexed by position in the slice), so shards concatenate and split with
    :mod:`bigdl_py.optim.sharding` exactly like plain ones. Where a group keeps no such buffer
    (say ``momentum=0`` for biases) its elements hold 0.

    Parameters
    ----------
    method : OptimMethod
        The update rule and the default hyperparameters.
    groups : ParameterGroups
        The groups and their overrides.
    """

    def __init__(self, method: OptimMethod, groups: ParameterGroups):
        self.method = method.with_hyper_parameters()
        self.groups = groups
        self.group_methods = {
            group.name: method.with_hyper_parameters(**group.overrides) for group in groups.groups
        }
        self._served: tuple[int, int] | None = None
        self._pieces: list[tuple[int, int, OptimMethod]] = []
        self._pending_state: dict | None = None

    # --- stepping -----------------------------------------------------------------------
    def step(self, weight: Any, gradient: Any, apply_if: Any = None) -> Any:
        """Step the whole flat vector (``len(weight) == groups.size``); ``apply_if`` as
        ``OptimMethod.step`` takes it (device arrays)."""
        if weight.shape != (self.groups.size,):
            raise ValueError(
                f"GroupedOptimMethod.step: weight shape {weight.shape} is not the whole vector "
                f"({self.groups.size},); use step_slice for a slice"
            )
        return self.step_slice(weight, gradient, 0, apply_if)

    def step_slice(
        self, weight_slice: Any, gradient_slice: Any, start: int, apply_if: Any = None
    ) -> Any:
        """Step the slice ``[start, start + len(weight_slice))`` of the flat vector in place.

        One instance serves one slice: later calls must pass the same ``start`` and length.
        """
        if getattr(weight_slice, "ndim", None) != 1 or gradient_slice.shape != weight_slice.shape:
            raise ValueError(
                "GroupedOptimMethod.step_slice: weight and gradient must be 1-D and of one "
                f"shape, got {getattr(weight_slice, 'shape', None)} and "
                f"{getattr(gradient_slice, 'shape', None)}"
            )
        bounds = (int(start), int(start) + weight_slice.shape[0])
        if self._served is None:
            self._build_pieces(*bounds)
        elif bounds != self._served:
            raise ValueError(
                f"GroupedOptimMethod.step_slice: this instance serves slice {self._served} but "
                f"was given {bounds}; use one instance per slice"
            )
        offset = bounds[0]
        for piece_start, piece_stop, piece_method in self._pieces:
            local = slice(piece_start - offset, piece_stop - offset)
            piece_method.step(weight_slice[local], gradient_slice[local], apply_if)
        return weight_slice

    def _build_pieces(self, start: int, stop: int) -> None:
        pieces = [
            (piece_start, piece_stop, self.group_methods[group.name].with_hyper_parameters())
            for piece_start, piece_stop, group in self.groups.pieces(start, stop)
        ]
        if not pieces:  # an empty slice still counts steps, so its state matches the others'
            pieces = [(start, start, self.method.with_hyper_parameters())]
        self._served, self._pieces = (start, stop), pieces
        if self._pending_state is not None:
            self._distribute(self._pending_state)
            self._pending_state = None

    # --- schedule and hyperparameters ---------------------------------------------------
    def _all_methods(self) -> list[OptimMethod]:
        # The template follows too, so its learning rate and state stay the reference.
        pieces = [method for _, _, method in self._pieces]
        return [self.method, *self.group_methods.values(), *pieces]

    def on_iteration_end(self, iteration: int | None = None) -> None:
        """Forwarded to every group's method (see :meth:`OptimMethod.on_iteration_end`)."""
        for method in self._all_methods():
            method.on_iteration_end(iteration)

    def on_epoch_end(self, epoch: int | None = None, validation_score: float | None = None) -> None:
        """Forwarded to every group's method (see :meth:`OptimMethod.on_epoch_end`)."""
        for method in self._all_methods():
            method.on_epoch_end(epoch, validation_score)

    def schedule_step(self, iteration=None, epoch=None, metric=None) -> None:
        """Forwarded to every group's method (see :meth:`OptimMethod.schedule_step`)."""
        for method in self._all_methods():
            method.schedule_step(iteration=iteration, epoch=epoch, metric=metric)

    @property
    def learning_rate(self) -> float:
        """The template's base learning rate (groups may override it)."""
        return self.method.learning_rate

    @property
    def schedule(self):
        return self.method.schedule

    def current_learning_rate(self) -> float:
        """The template's scheduled rate (``current_learning_rates`` gives every group's)."""
        return self.method.current_learning_rate()

    def current_learning_rates(self) -> dict[str, float]:
        """Group name -> the learning rate its next step uses."""
        return {name: method.current_learning_rate() for name, method in self.group_methods.items()}

    def hyper_parameters(self) -> dict[str, dict[str, Any]]:
        """Group name -> that group's hyperparameters."""
        return {name: method.hyper_parameters() for name, method in self.group_methods.items()}

    def config(self) -> dict[str, Any]:
        """The template's config and the groups, JSON-friendly (``optim_method_from_config``)."""
        return {
            "name": "GroupedOptimMethod",
            "method": self.method.config(),
            "size": self.groups.size,
            "groups": [
                {
                    "name": group.name,
                    "ranges": [list(bounds) for bounds in group.ranges],
                    "overrides": {
                        key: list(value) if isinstance(value, tuple) else value
                        for key, value in group.overrides.items()
                    },
                    "parameter_names": list(group.parameter_names),
                }
                for group in self.groups.groups
            ],
        }

    # --- state --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Counters and schedule state, plus one array per state buffer over the served slice."""
        if self._pending_state is not None:
            return dict(self._pending_state)
        if not self._pieces:
            return self.method.state_dict()
        start, stop = self._served
        piece_states = [method.state_dict() for _, _, method in self._pieces]
        whole: dict[str, Any] = {}
        for (piece_start, piece_stop, _), state in zip(self._pieces, piece_states, strict=True):
            for key, value in state.items():
                if isinstance(value, np.ndarray) and value.ndim == 1:
                    if key not in whole:
                        whole[key] = np.zeros(stop - start, dtype=value.dtype)
                    whole[key][piece_start - start : piece_stop - start] = value
                elif key not in whole:
                    whole[key] = value
                elif not np.array_equal(whole[key], value):
                    raise RuntimeError(
                        f"GroupedOptimMethod: groups disagree on {key!r} ({whole[key]!r} vs "
                        f"{value!r}); were they advanced separately?"
                    )
        return whole

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; arrays are cut among the pieces of the served slice
        (on the first step when no slice has been served yet)."""
        state = dict(state)
        shared = {
            key: value
            for key, value in state.items()
            if not (isinstance(value, np.ndarray) and value.ndim == 1)
        }
        for method in [self.method, *self.group_methods.values()]:
            method.load_state_dict(shared)
        if self._served is None:
            self._pending_state = state
        else:
            self._distribute(state)

    def _distribute(self, state: Mapping[str, Any]) -> None:
        start, stop = self._served
        for key, value in state.items():
            if isinstance(value, np.ndarray) and value.ndim == 1 and len(value) != stop - start:
                raise ValueError(
                    f"GroupedOptimMethod.load_state_dict: {key!r} has {len(value)} elements but "
                    f"this instance serves slice [{start}, {stop}) of {stop - start}"
                )
        for piece_start, piece_stop, method in self._pieces:
            wanted = set(method._state_names())
            piece_state = {}
            for key, value in state.items():
                if not (isinstance(value, np.ndarray) and value.ndim == 1):
                    piece_state[key] = value
                elif key in wanted:
                    piece_state[key] = value[piece_start - start : piece_stop - start]
            method.load_state_dict(piece_state)

    def __repr__(self) -> str:
        return f"GroupedOptimMethod({self.method!r}, {self.groups!r})"
