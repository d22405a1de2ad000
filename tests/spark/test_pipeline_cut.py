"""Cutting a model into pipeline stages (``modes/pipeline/cut.py``): the units, the checks,
the balanced cut against every cut, and measuring that leaves the model as it was."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.optim import FlatParameters
from bigdl_py.spark.modes.pipeline.cut import (
    UnitCost,
    balanced_bounds,
    check_cut,
    check_flat_order,
    forbidden_cuts,
    measure_unit_costs,
    model_units,
    stage_modules,
)


def mlp():
    with nn.init.seeded(0):
        return nn.Sequential(
            nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4)
        )


def test_a_sequential_is_cut_between_its_children_and_keeps_the_flat_order():
    model = mlp()
    units = model_units(model)
    assert len(units) == 5
    stages = stage_modules(units, [0, 2, 5])
    offsets = check_flat_order(model, stages)
    assert offsets == [0, 8 * 32 + 32 + 64, FlatParameters(model).size]


def test_only_chains_are_cut():
    class Custom(nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(ValueError, match="nn.Sequential or a graph Model"):
        model_units(Custom())
    a, b = nn.Input(shape=(2,)), nn.Input(shape=(2,))
    with pytest.raises(ValueError, match="one input and one output"):
        model_units(nn.Model([a, b], nn.Add()(a, b)))
    x = nn.Input(shape=(4,))  # a skip from the input to the output: nowhere to cut
    skip = nn.Model(x, nn.Add()(x, nn.Linear(4, 4)(nn.Tanh()(x))))
    with pytest.raises(ValueError, match="needs at least 2 layers"):
        check_cut(model_units(skip), 2, None)


@pytest.mark.parametrize(
    "stages, split, message",
    [
        (6, None, "needs at least 6 layers to cut between; the model has 5"),
        (2, [1, 2], "must name 1 cut points"),
        (3, [3, 2], "must be increasing"),
        (2, [5], "must be increasing"),
    ],
)
def test_bad_cuts_are_named(stages, split, message):
    with pytest.raises(ValueError, match=message):
        check_cut(model_units(mlp()), stages, split)


def test_no_cut_where_a_layer_is_shared():
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.Tanh(), shared, nn.Linear(4, 2))
    units = model_units(model)
    assert forbidden_cuts(units) == {1, 2}
    with pytest.raises(ValueError, match="cannot cut at \\[2\\]"):
        check_cut(units, 2, [2])
    with pytest.raises(ValueError, match="can be cut at only 1 places"):
        check_cut(units, 3, None)
    assert check_cut(units, 2, [3]) == [0, 3, 4]


def brute_force(costs, stages, forbidden):
    """The smallest largest load over every cut (what balanced_bounds must find)."""
    total_bytes = sum(c.parameter_bytes for c in costs) or 1
    total_seconds = sum(c.seconds for c in costs) or 1.0
    best = None
    for points in itertools.combinations(range(1, len(costs)), stages - 1):
        if set(points) & forbidden:
            continue
        bounds = [0, *points, len(costs)]
        load = max(
            max(
                sum(c.parameter_bytes for c in costs[a:b]) / total_bytes,
                sum(c.seconds for c in costs[a:b]) / total_seconds,
            )
            for a, b in itertools.pairwise(bounds)
        )
        best = load if best is None else min(best, load)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_balanced_cut_is_the_best_cut(seed):
    generator = np.random.default_rng(seed)
    count = int(generator.integers(4, 9))
    costs = [
        UnitCost(int(generator.integers(0, 1000)), float(generator.uniform(0, 1)))
        for _ in range(count)
    ]
    forbidden = {int(generator.integers(1, count))} if seed % 2 else set()
    for stages in range(1, min(4, count - len(forbidden)) + 1):
        bounds = balanced_bounds(costs, stages, forbidden)
        assert bounds[0] == 0 and bounds[-1] == count and len(bounds) == stages + 1
        assert all(a < b for a, b in itertools.pairwise(bounds))
        assert not set(bounds[1:-1]) & forbidden
        total_bytes = sum(c.parameter_bytes for c in costs) or 1
        total_seconds = sum(c.seconds for c in costs)
        load = max(
            max(
                sum(c.parameter_bytes for c in costs[a:b]) / total_bytes,
                sum(c.seconds for c in costs[a:b]) / total_seconds,
            )
            for a, b in itertools.pairwise(bounds)
        )
        assert load == pytest.approx(brute_force(costs, stages, forbidden))


def test_measuring_leaves_statistics_generators_and_gradients_as_they_were():
    model = mlp()
    flat = FlatParameters(model)
    flat.gradients[...] = 0
    before = {name: np.array(value) for name, value in model.state_dict().items()}
    dropout = model[3]
    generator = dropout.generator
    costs = measure_unit_costs(model_units(model), np.ones((4, 8), dtype=np.float32), repeats=1)
    assert [cost.parameter_bytes for cost in costs] == [(8 * 32 + 32) * 4, 64 * 4, 0, 0, 132 * 4]
    assert all(cost.seconds > 0 for cost in costs)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(np.asarray(value), before[name], err_msg=name)
    assert dropout.generator is generator
    assert not flat.gradients.any() and flat.is_attached()


def test_stages_the_largest_does_not_constrain_are_balanced_too():
    """One layer holds most bytes: it is a stage of its own, and the rest split evenly
    (not one small layer a stage and the others in the last)."""
    costs = [UnitCost(64, 0.0)] + [UnitCost(1, 0.0)] * 4
    assert balanced_bounds(costs, 3, set()) == [0, 1, 3, 5]
