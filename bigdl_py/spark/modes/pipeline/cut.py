"""Cutting a model into a pipeline's stages: the layers, their costs, the balanced cut.

A model is cut between *units*: the children of an ``nn.Sequential``, or the sub-models
between a graph ``Model``'s cut points (:func:`bigdl_py.nn.graph_chain.chain_segments`).
Stage ``k`` runs units ``bounds[k] .. bounds[k + 1] - 1`` as one ``nn.Sequential`` made of
the same layer objects, so its parameters are a contiguous slice of the model's flat
vector, in order.

Without ``split=`` the cut balances two costs per unit — its parameters' bytes (what a stage
must hold, times the optimizer's state) and a forward-backward time measured on a
micro-batch of the training data: the stages' largest share of either is made as small as
it can be (:func:`balanced_bounds`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.nn.containers import Sequential
from bigdl_py.nn.graph import Model
from bigdl_py.nn.graph_chain import chain_segments
from bigdl_py.nn.module import Module
from bigdl_py.train.rng import keyed_random_streams


class UnitCost(NamedTuple):
    """What one unit costs: its parameters' bytes and a micro-batch's forward-backward."""

    parameter_bytes: int
    seconds: float


def model_units(model: Module) -> list[Module]:
    """The units a pipeline may cut ``model`` between.

    Raises
    ------
    ValueError
        If ``model`` is neither an ``nn.Sequential`` nor a graph ``Model`` of one input and
        one output.
    """
    if isinstance(model, Sequential) and type(model).forward is Sequential.forward:
        return list(model.children())
    if isinstance(model, Model):
        return chain_segments(model)
    raise ValueError(
        "a Pipeline cuts an nn.Sequential or a graph Model into stages; got a "
        f"{type(model).__name__}, whose forward it cannot follow"
    )


def forbidden_cuts(units: Sequence[Module]) -> set[int]:
    """Positions ``b`` (between units ``b - 1`` and ``b``) where no cut may go: a parameter
    or a layer used on both sides."""
    seen_before: set[int] = set()
    owners = [_held(unit) for unit in units]
    forbidden = set()
    for position in range(1, len(units)):
        seen_before |= owners[position - 1]
        after = set().union(*owners[position:])
        if seen_before & after:
            forbidden.add(position)
    return forbidden


def _held(unit: Module) -> set[int]:
    return {id(module) for module in unit.modules()} | {id(p) for p in unit.parameters()}


def check_cut(units: Sequence[Module], stages: int, split: Sequence[int] | None) -> list[int]:
    """``split`` (the cut points: unit positions where stages 1 .. K-1 start) as stage
    bounds ``[0, *split, len(units)]``; with ``split`` None, only the checks.

    Raises
    ------
    ValueError
        Naming the problem: fewer units than stages, a split of the wrong length, not
        increasing or out of range, or cutting where a layer or parameter is shared.
    """
    count = len(units)
    if stages > count:
        raise ValueError(
            f"Pipeline(stages={stages}) needs at least {stages} layers to cut between; the "
            f"model has {count}"
        )
    forbidden = forbidden_cuts(units)
    if split is None:
        if count - 1 - len(forbidden) < stages - 1:
            raise ValueError(
                f"Pipeline(stages={stages}): the model can be cut at only "
                f"{count - 1 - len(forbidden)} places (layers or parameters are shared across "
                "the others)"
            )
        return []
    split = [int(point) for point in split]
    if len(split) != stages - 1:
        raise ValueError(
            f"Pipeline split= must name {stages - 1} cut points for {stages} stages, got {split}"
        )
    bounds = [0, *split, count]
    if any(a >= b for a, b in itertools.pairwise(bounds)):
        raise ValueError(
            f"Pipeline split={split} must be increasing unit positions between 1 and "
            f"{count - 1} (the model has {count} layers to cut between)"
        )
    shared = [point for point in split if point in forbidden]
    if shared:
        raise ValueError(
            f"Pipeline split={split}: cannot cut at {shared}, where a layer or parameter is "
            "used on both sides"
        )
    return bounds


def balanced_bounds(costs: Sequence[UnitCost], stages: int, forbidden: set[int]) -> list[int]:
    """Stage bounds that minimise the largest stage share of bytes or seconds.

    A stage's load is ``max(its bytes / all bytes, its seconds / all seconds)``. The cut
    makes the largest load as small as it can be and, among the cuts that do, the sum of
    the squared loads (so stages that the largest does not constrain are balanced too):
    two passes of dynamic programming over the contiguous cuts, ``O(K n^2)`` for ``n``
    units; among equal cuts the earliest.
    """
    count = len(costs)
    total_bytes = sum(cost.parameter_bytes for cost in costs) or 1
    total_seconds = sum(cost.seconds for cost in costs) or 1.0
    byte_sums = np.concatenate([[0], np.cumsum([c.parameter_bytes for c in costs])])
    second_sums = np.concatenate([[0.0], np.cumsum([c.seconds for c in costs])])

    def load(start: int, stop: int) -> float:
        return max(
            (byte_sums[stop] - byte_sums[start]) / total_bytes,
            (second_sums[stop] - second_sums[start]) / total_seconds,
        )

    def best_cut(combine, cap: float) -> tuple[float, list[int]]:
        # best[k][j]: the best value of units 0..j-1 cut into k stages of load <= cap.
        best = np.full((stages + 1, count + 1), np.inf)
        choice = np.zeros((stages + 1, count + 1), dtype=np.int64)
        best[0][0] = 0.0
        for k in range(1, stages + 1):
            for stop in range(k, count + 1):
                for start in range(k - 1, stop):
                    stage_load = load(start, stop)
                    if (start > 0 and start in forbidden) or stage_load > cap:
                        continue
                    value = combine(best[k - 1][start], stage_load)
                    if value < best[k][stop] - 1e-12:
                        best[k][stop], choice[k][stop] = value, start
        bounds = [count]
        for k in range(stages, 0, -1):
            bounds.append(int(choice[k][bounds[-1]]))
        return float(best[stages][count]), bounds[::-1]

    largest, _ = best_cut(max, np.inf)
    _, bounds = best_cut(lambda total, stage_load: total + stage_load**2, largest + 1e-9)
    return bounds


def measure_unit_costs(
    units: Sequence[Module], sample: np.ndarray, repeats: int = 3
) -> list[UnitCost]:
    """Each unit's parameter bytes and forward-backward seconds on ``sample`` (a
    micro-batch of the training features), the fastest of ``repeats`` after a warm-up.

    The units run in training mode on this process's CPU; their running statistics and
    random generators are put back and their gradients cleared, so the model trains as if
    never measured.
    """
    costs = []
    value = Tensor(np.asarray(sample))
    for position, unit in enumerate(units):
        saved = {name: np.array(backend.as_numpy(b.data)) for name, b in unit.named_buffers()}
        seconds = []
        with keyed_random_streams(enumerate(unit.modules()), (0, 0, position)):
            for _ in range(repeats + 1):
                started = time.perf_counter()
                unit_input = Tensor(value.data, requires_grad=True)
                output = unit(unit_input)
                output.backward(np.ones(output.shape, dtype=output.dtype))
                seconds.append(time.perf_counter() - started)
            value = Tensor(output.data)
        if saved:
            unit.load_state_dict(saved, strict=False)
        unit.zero_grad()  # in place: the driver's flat gradient vector stays attached
        parameter_bytes = sum(p.data.size * p.data.dtype.itemsize for p in unit.parameters())
        costs.append(UnitCost(int(parameter_bytes), float(min(seconds[1:]))))
    return costs


def stage_modules(units: Sequence[Module], bounds: Sequence[int]) -> list[Sequential]:
    """Stage ``k`` as an ``nn.Sequential`` of units ``bounds[k] .. bounds[k + 1] - 1``."""
    return [Sequential(*units[start:stop]) for start, stop in itertools.pairwise(bounds)]


def check_flat_order(model: Module, stages: Sequence[Module]) -> list[int]:
    """The flat offsets where each stage's parameters start (and the end), after checking
    that the stages' parameters, in order, are the model's.

    Raises
    ------
    ValueError
        When they are not (a parameter shared between stages, or registered out of order).
    """
    expected = [id(p) for p in model.parameters()]
    got = [id(p) for stage in stages for p in stage.parameters()]
    if got != expected:
        raise ValueError(
            "the pipeline's stages do not hold the model's parameters in its order (a "
            "parameter shared between stages?); pass split= to cut elsewhere"
        )
    offsets = [0]
    for stage in stages:
        offsets.append(offsets[-1] + sum(p.data.size for p in stage.parameters()))
    return offsets


def module_positions(model: Module, stage: Module) -> list[int | None]:
    """For each of ``stage.modules()``, its index in ``model.modules()`` (None for the
    containers the cut made): the position that keys its random stream."""
    positions = {id(module): index for index, module in enumerate(model.modules())}
    return [positions.get(id(module)) for module in stage.modules()]


def buffer_names(model: Module, stage: Module) -> dict[str, str]:
    """The stage's buffer names -> the model's names of the same buffers."""
    names = {id(buffer): name for name, buffer in model.named_buffers()}
    return {name: names[id(buffer)] for name, buffer in stage.named_buffers()}
