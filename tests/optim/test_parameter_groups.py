"""Parameter groups: per-group hyperparameters on ranges of the flat vector, whole or sharded."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.optim import (
    SGD,
    AdamW,
    FlatParameters,
    GroupedOptimMethod,
    ParameterGroup,
    ParameterGroups,
    Step,
    all_slice_bounds,
    concatenate_state_dicts,
    split_state_dict,
)

NO_DECAY = [("no_decay", lambda name, p: name.endswith("bias") or p.ndim == 1, {"weight_decay": 0})]


def test_groups_from_module_follow_the_flat_layout(make_mlp):
    model = make_mlp(0)
    flat = FlatParameters(model)
    groups = ParameterGroups.from_module(model, NO_DECAY)
    no_decay, default = groups.groups
    assert (no_decay.name, default.name) == ("no_decay", "default")
    assert no_decay.parameter_names == ["hidden.bias", "output.bias"]
    assert no_decay.ranges == flat.ranges_where(lambda name, p: name.endswith("bias"))
    assert default.ranges == flat.ranges_where(lambda name, p: name.endswith("weight"))
    assert no_decay.overrides == {"weight_decay": 0} and default.overrides == {}
    assert no_decay.size + default.size == groups.size == flat.size
    # A slice through the middle is cut where the groups change.
    assert [(lo, hi, group.name) for lo, hi, group in groups.pieces(10, 20)] == [
        (10, 12, "default"),
        (12, 15, "no_decay"),
        (15, 20, "default"),
    ]


def test_grouped_adamw_matches_torch_param_groups(make_mlp, torch, rng):
    model = make_mlp(1)
    flat = FlatParameters(model)
    groups = ParameterGroups.from_module(model, NO_DECAY)
    method = GroupedOptimMethod(AdamW(lr=0.05, weight_decay=0.3), groups)
    tensors = {
        name: torch.nn.Parameter(torch.tensor(p.numpy().copy()))
        for name, p in model.named_parameters()
    }
    torch_method = torch.optim.AdamW(
        [
            {"params": [t for n, t in tensors.items() if n.endswith("weight")]},
            {"params": [t for n, t in tensors.items() if n.endswith("bias")], "weight_decay": 0},
        ],
        lr=0.05,
        weight_decay=0.3,
    )
    for _ in range(10):
        gradient = rng.standard_normal(flat.size)
        flat.gradients[...] = gradient
        method.step(flat.weights, flat.gradients)
        for name, view in flat.unravel(gradient).items():
            tensors[name].grad = torch.tensor(view.copy())
        torch_method.step()
    for name, parameter in model.named_parameters():
        np.testing.assert_allclose(parameter.numpy(), tensors[name].detach().numpy(), rtol=1e-6)


def _run(method_factory, groups, start, gradients, count):
    """Step ``count`` grouped instances, one per balanced slice; return weights and instances."""
    weight = start.copy()
    bounds = all_slice_bounds(len(start), count)
    shards = [GroupedOptimMethod(method_factory(), groups) for _ in bounds]
    for gradient in gradients:
        for shard, (lo, hi) in zip(shards, bounds, strict=True):
            shard.step_slice(weight[lo:hi], gradient[lo:hi], lo)
        for shard in shards:
            shard.on_iteration_end()
    return weight, shards


@pytest.mark.parametrize(
    "method_factory",
    [
        lambda: AdamW(lr=0.05, weight_decay=0.2, amsgrad=True),
        lambda: SGD(lr=0.1, momentum=0.9, weight_decay=0.1, schedule=Step(2, 0.5)),
    ],
    ids=["AdamW", "SGD"],
)
def test_sharded_grouped_method_equals_the_whole(method_factory, make_mlp, rng):
    model = make_mlp(2)
    groups = ParameterGroups.from_module(
        model, [("biases", lambda name, p: p.ndim == 1, {"weight_decay": 0.0, "lr": 0.01})]
    )
    start = np.concatenate([p.numpy().ravel() for p in model.parameters()])
    gradients = [rng.standard_normal(len(start)) for _ in range(6)]
    whole, (whole_method,) = _run(method_factory, groups, start, gradients, 1)
    for count in (2, 3, 4, 5, 30):
        sharded, shards = _run(method_factory, groups, start, gradients, count)
        np.testing.assert_array_equal(sharded, whole, err_msg=f"{count} slices")
        joined = concatenate_state_dicts([shard.state_dict() for shard in shards])
        expected = whole_method.state_dict()
        assert joined.keys() == expected.keys()
        for key in expected:
            np.testing.assert_array_equal(joined[key], expected[key], err_msg=key)


def test_resume_with_another_slice_count_is_bit_exact(make_mlp, rng):
    model = make_mlp(3)
    groups = ParameterGroups.from_module(model, NO_DECAY)
    size = groups.size
    gradients = [rng.standard_normal(size) for _ in range(8)]
    weight = rng.standard_normal(size)
    whole = GroupedOptimMethod(AdamW(lr=0.02), groups)
    for gradient in gradients[:4]:
        whole.step(weight, gradient)
    checkpoint = whole.state_dict()
    bounds = all_slice_bounds(size, 3)
    shards = [GroupedOptimMethod(AdamW(lr=0.02), groups) for _ in bounds]
    for shard, state in zip(shards, split_state_dict(checkpoint, bounds), strict=True):
        shard.load_state_dict(state)  # before the first step: kept until the slice is known
    assert shards[0].state_dict()["step"] == 4
    resumed = weight.copy()
    for gradient in gradients[4:]:
        whole.step(weight, gradient)
        for shard, (lo, hi) in zip(shards, bounds, strict=True):
            shard.step_slice(resumed[lo:hi], gradient[lo:hi], lo)
    np.testing.assert_array_equal(resumed, weight)


def test_group_without_a_state_buffer_round_trips(make_mlp, rng):
    model = make_mlp(4)
    groups = ParameterGroups.from_module(
        model, [("plain", lambda n, p: p.ndim == 1, {"momentum": 0.0})]
    )
    method = GroupedOptimMethod(SGD(lr=0.1, momentum=0.9), groups)
    weight = rng.standard_normal(groups.size)
    method.step(weight, rng.standard_normal(groups.size))
    state = method.state_dict()
    plain = groups.groups[0]
    for lo, hi in plain.ranges:
        assert not state["momentum_buffer"][lo:hi].any()  # no buffer there: zeros by convention
    copy, resumed = weight.copy(), GroupedOptimMethod(SGD(lr=0.1, momentum=0.9), groups)
    resumed.step(copy, np.zeros(groups.size))  # serve the slice first, then load
    resumed.load_state_dict(state)
    gradient = rng.standard_normal(groups.size)
    method.step(weight, gradient)
    resumed.step(copy, gradient)
    np.testing.assert_array_equal(copy, weight)


def test_schedules_and_rates_per_group(make_mlp):
    groups = ParameterGroups.from_module(
        make_mlp(5), [("slow", lambda n, p: p.ndim == 1, {"lr": 0.01})]
    )
    method = GroupedOptimMethod(SGD(lr=0.1, schedule=Step(1, 0.5)), groups)
    method.on_iteration_end(2)
    assert method.current_learning_rates() == {"slow": 0.0025, "default": 0.025}
    assert method.current_learning_rate() == 0.025 and method.learning_rate == 0.1
    assert method.hyper_parameters()["slow"]["lr"] == 0.01


def test_grouped_method_errors(make_mlp):
    model = make_mlp(6)
    groups = ParameterGroups.from_module(model, NO_DECAY)
    with pytest.raises(ValueError, match=r"SGD has no hyperparameters \['betas'\]"):
        GroupedOptimMethod(
            SGD(lr=0.1),
            ParameterGroups.from_module(model, [("x", lambda n, p: True, {"betas": (0.9, 0.9)})]),
        )
    method = GroupedOptimMethod(SGD(lr=0.1), groups)
    method.step_slice(np.zeros(5), np.zeros(5), 3)
    with pytest.raises(ValueError, match=r"serves slice \(3, 8\) but was given \(0, 5\)"):
        method.step_slice(np.zeros(5), np.zeros(5), 0)
    with pytest.raises(ValueError, match="is not the whole vector"):
        GroupedOptimMethod(SGD(lr=0.1), groups).step(np.zeros(5), np.zeros(5))
    with pytest.raises(ValueError, match="outside the vector"):
        groups.pieces(0, groups.size + 1)
    with pytest.raises(ValueError, match="reserved"):
        ParameterGroups.from_module(model, [("default", lambda n, p: True, {})])


def test_parameter_groups_must_partition_the_vector():
    with pytest.raises(ValueError, match="gap at offset 2"):
        ParameterGroups(6, [ParameterGroup("a", [(0, 2), (3, 6)], {}, [])])
    with pytest.raises(ValueError, match="overlap at offset 2"):
        ParameterGroups(
            6, [ParameterGroup("a", [(0, 4)], {}, []), ParameterGroup("b", [(2, 6)], {}, [])]
        )
    with pytest.raises(ValueError, match=r"cover \[0, 4\) but the vector has 6"):
        ParameterGroups(6, [ParameterGroup("a", [(0, 4)], {}, [])])
    with pytest.raises(ValueError, match="names must be unique"):
        ParameterGroups(
            2, [ParameterGroup("a", [(0, 1)], {}, []), ParameterGroup("a", [(1, 2)], {}, [])]
        )


def test_grouped_config_survives_json(make_mlp):
    import json

    from bigdl_py.optim import Adam, optim_method_from_config

    groups = ParameterGroups.from_module(
        make_mlp(7), [("biases", lambda n, p: p.ndim == 1, {"betas": (0.5, 0.6), "lr": 0.2})]
    )
    method = GroupedOptimMethod(Adam(lr=0.01, schedule=Step(3)), groups)
    rebuilt = optim_method_from_config(json.loads(json.dumps(method.config())))
    assert isinstance(rebuilt, GroupedOptimMethod)
    assert rebuilt.hyper_parameters() == method.hyper_parameters()
    assert [group.ranges for group in rebuilt.groups.groups] == [
        group.ranges for group in groups.groups
    ]
