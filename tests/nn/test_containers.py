"""Sequential, ModuleList, ModuleDict: order, indexing, editing, recorded arguments."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor


def batch(*shape, dtype=np.float32, seed=0):
    return Tensor(np.random.default_rng(seed).standard_normal(shape), dtype=dtype)


def rebuild(container):
    """Construct a container again from its recorded constructor arguments."""
    args, kwargs = container._init_args
    return type(container)(*args, **kwargs)


# --- Sequential ------------------------------------------------------------------------------
def test_sequential_runs_its_modules_in_order():
    first, second = nn.Linear(4, 3), nn.Linear(3, 2)
    model = nn.Sequential(first, nn.Tanh(), second)
    x = batch(5, 4)
    np.testing.assert_allclose(model(x).numpy(), second(first(x).tanh()).numpy())


def test_sequential_names_children_by_position_like_pytorch(torch):
    model = nn.Sequential(nn.Linear(4, 3, dtype=np.float64), nn.ReLU(), nn.Linear(3, 2, dtype="f8"))
    assert [name for name, _ in model.named_parameters()] == [
        "0.weight",
        "0.bias",
        "2.weight",
        "2.bias",
    ]
    theirs = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    state = {name: torch.from_numpy(value) for name, value in model.state_dict().items()}
    theirs.double().load_state_dict(state, strict=True)
    x = np.random.default_rng(0).standard_normal((5, 4))
    np.testing.assert_allclose(
        model(Tensor(x, dtype=np.float64)).numpy(),
        theirs(torch.from_numpy(x)).detach().numpy(),
        rtol=1e-10,
    )


def test_sequential_from_an_ordered_dict_uses_its_names():
    model = nn.Sequential(OrderedDict([("hidden", nn.Linear(2, 2)), ("act", nn.ReLU())]))
    assert [name for name, _ in model.named_children()] == ["hidden", "act"]
    assert model["hidden"] is model[0] and model.hidden is model[0]


def test_sequential_indexing_length_iteration_and_slicing():
    layers = [nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2), nn.Tanh()]
    model = nn.Sequential(*layers)
    assert len(model) == 4 and list(model) == layers
    assert model[-1] is layers[3] and model[1] is layers[1]
    head = model[1:3]
    assert isinstance(head, nn.Sequential) and list(head) == layers[1:3]
    assert [name for name, _ in head.named_children()] == ["0", "1"]
    with pytest.raises(IndexError, match="index 4 is out of range for Sequential of length 4"):
        model[4]
    with pytest.raises(TypeError, match="indices must be ints or slices"):
        model[1.0]


def test_bigdl_style_add_chains_and_appends():
    model = nn.Sequential().add(nn.Linear(3, 4)).add(nn.ReLU()).add(nn.Linear(4, 1))
    assert len(model) == 3 and model(batch(2, 3)).shape == (2, 1)
    assert model.append(nn.Sigmoid()) is model and isinstance(model[3], nn.Sigmoid)


def test_editing_renumbers_positional_children():
    a, b, c, d = nn.ReLU(), nn.Tanh(), nn.Sigmoid(), nn.Identity()
    model = nn.Sequential(a, b, c)
    del model[0]
    assert list(model) == [b, c] and list(model._modules) == ["0", "1"]
    model.insert(1, a)
    assert list(model) == [b, a, c] and list(model._modules) == ["0", "1", "2"]
    model.insert(-1, d)
    assert list(model) == [b, a, d, c]
    model[0] = c
    assert model[0] is c
    del model[1:3]
    assert list(model) == [c, c]


def test_editing_keeps_given_names():
    model = nn.Sequential(OrderedDict([("hidden", nn.Linear(2, 2)), ("act", nn.ReLU())]))
    model.append(nn.Linear(2, 1))
    assert list(model._modules) == ["hidden", "act", "2"]
    del model[0]
    assert list(model._modules) == ["act", "2"]


def test_only_modules_are_accepted():
    with pytest.raises(TypeError, match="Sequential holds Modules, got ufunc"):
        nn.Sequential(nn.ReLU(), np.tanh)
    with pytest.raises(TypeError, match="ModuleList holds Modules"):
        nn.ModuleList([nn.ReLU()]).append(3)


@pytest.mark.parametrize(
    "build",
    [
        lambda: nn.Sequential(nn.Linear(2, 3), nn.ReLU()),
        lambda: nn.Sequential().add(nn.Linear(2, 3)).add(nn.ReLU()),
        lambda: nn.Sequential(OrderedDict(a=nn.Linear(2, 3), b=nn.ReLU())).add(nn.Tanh()),
        lambda: nn.ModuleList([nn.Linear(2, 3)]).extend([nn.ReLU(), nn.Tanh()]),
        lambda: nn.ModuleDict({"a": nn.Linear(2, 3), "b": nn.ReLU()}),
    ],
    ids=["positional", "built_by_add", "named_then_added", "module_list", "module_dict"],
)
def test_recorded_arguments_follow_the_content(build):
    # Model save/load rebuilds containers from these arguments, so edits must show in them.
    container = build()
    rebuilt = rebuild(container)
    assert type(rebuilt) is type(container)
    assert list(rebuilt._modules.items()) == list(container._modules.items())


def test_a_subclass_keeps_its_own_constructor_arguments():
    class MLP(nn.Sequential):
        def __init__(self, width: int):
            super().__init__(nn.Linear(width, width), nn.ReLU())

    mlp = MLP(5)
    assert mlp._init_args == ((5,), {})
    assert rebuild(mlp)[0].in_features == 5


# --- ModuleList and ModuleDict ---------------------------------------------------------------
def test_module_list_registers_its_modules_in_order():
    class Tower(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(3, 3) for _ in range(3))

        def forward(self, x):
            for block in self.blocks:
                x = block(x).relu()
            return x

    tower = Tower()
    assert [name for name, _ in tower.named_parameters()][:3] == [
        "blocks.0.weight",
        "blocks.0.bias",
        "blocks.1.weight",
    ]
    assert tower(batch(2, 3)).shape == (2, 3)
    assert isinstance(tower.blocks[1:], nn.ModuleList) and len(tower.blocks[1:]) == 2
    with pytest.raises(NotImplementedError, match="iterate over it"):
        tower.blocks(batch(2, 3))


def test_module_dict_maps_names_to_modules_in_insertion_order():
    heads = nn.ModuleDict({"class": nn.Linear(4, 3), "box": nn.Linear(4, 2)})
    heads["extra"] = nn.ReLU()
    assert list(heads) == ["class", "box", "extra"] and len(heads) == 3
    assert "box" in heads and heads["box"].out_features == 2
    assert [name for name, _ in heads.named_parameters()] == [
        "class.weight",
        "class.bias",
        "box.weight",
        "box.bias",
    ]
    del heads["extra"]
    assert list(heads.keys()) == ["class", "box"]
    with pytest.raises(KeyError, match="without '.'"):
        heads["a.b"] = nn.ReLU()


def test_inserting_among_named_children_never_reuses_a_taken_name():
    a, b, c, d = nn.ReLU(), nn.Tanh(), nn.Sigmoid(), nn.Identity()
    model = nn.Sequential(OrderedDict([("a", a), ("x", b), ("2", c)]))
    model.insert(2, d)
    assert list(model._modules.items()) == [("a", a), ("x", b), ("3", d), ("2", c)]
