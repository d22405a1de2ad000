"""Module: registration order, traversal, state dicts, modes, gradients, dtypes."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor
from bigdl_py.nn import Module, Parameter


class Block(Module):
    """A layer, a raw parameter registered after it, a buffer, and an activation."""

    def __init__(self, width: int):
        super().__init__()
        self.dense = nn.Linear(width, width)
        self.scale = Parameter(np.ones(width, np.float32))
        self.register_buffer("calls", Tensor(np.zeros((), np.int64)))
        self.activation = nn.Tanh()

    def forward(self, x):
        self.calls.data += 1
        return self.activation(self.dense(x)) * self.scale


class Net(Module):
    def __init__(self):
        super().__init__()
        self.first = Block(3)
        self.norm = nn.BatchNorm1d(3)
        self.second = Block(3)
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.second(self.norm(self.first(x))))


def batch(*shape, seed=0):
    return Tensor(np.random.default_rng(seed).standard_normal(shape), dtype=np.float32)


# --- registration and traversal ------------------------------------------------------------
def test_parameters_come_in_registration_order_own_before_children_as_in_pytorch():
    names = [name for name, _ in Net().named_parameters()]
    assert names == [
        "first.scale",
        "first.dense.weight",
        "first.dense.bias",
        "norm.weight",
        "norm.bias",
        "second.scale",
        "second.dense.weight",
        "second.dense.bias",
        "head.weight",
        "head.bias",
    ]


def test_named_modules_and_children_follow_the_same_order():
    net = Net()
    assert [name for name, _ in net.named_children()] == ["first", "norm", "second", "head"]
    assert [name for name, _ in net.named_modules()][:5] == [
        "",
        "first",
        "first.dense",
        "first.activation",
        "norm",
    ]


def test_reassigning_an_attribute_replaces_the_registration():
    block = Block(2)
    block.dense = nn.Identity()
    assert [name for name, _ in block.named_parameters()] == ["scale"]
    block.scale = 3.0  # a plain value now: no longer a parameter
    assert list(block.parameters()) == [] and block.scale == 3.0


def test_a_shared_module_and_its_parameters_are_listed_once():
    shared = nn.Linear(2, 2)
    container = nn.Sequential(shared, nn.ReLU(), shared)
    assert len(list(container.parameters())) == 2
    assert container.num_parameters() == 6
    assert sum(1 for module in container.modules() if module is shared) == 1


def test_assigning_before_base_init_explains_what_to_do():
    class Broken(Module):
        def __init__(self):
            self.weight = Parameter(np.ones(2))

    with pytest.raises(AttributeError, match=r"call super\(\).__init__\(\) first"):
        Broken()


def test_missing_attribute_error_names_the_class():
    with pytest.raises(AttributeError, match="'Linear' object has no attribute 'wieght'"):
        _ = nn.Linear(2, 2).wieght


def test_constructor_arguments_are_recorded_once_by_the_most_derived_class():
    net = Block(4)
    assert net._init_args == ((4,), {})
    assert nn.BatchNorm2d(3, eps=1e-3)._init_args == ((3,), {"eps": 1e-3})


def test_repr_nests_children():
    text = repr(Block(2))
    assert text.startswith("Block(\n  (dense): Linear(in_features=2, out_features=2, bias=True)")
    assert text.endswith("(activation): Tanh()\n)")


# --- state dicts -------------------------------------------------------------------------------
def test_state_dict_lists_parameters_then_buffers_of_each_module_as_copies():
    net = Net()
    state = net.state_dict()
    assert list(state)[:7] == [
        "first.scale",
        "first.calls",
        "first.dense.weight",
        "first.dense.bias",
        "norm.weight",
        "norm.bias",
        "norm.running_mean",
    ]
    state["head.bias"][...] = 99
    assert not np.any(net.head.bias.numpy() == 99)


def test_load_state_dict_copies_values_in_place():
    source, target = Net(), Net()
    source(batch(4, 3))  # changes running statistics and the call counters
    arrays = [parameter.data for parameter in target.parameters()]
    target.load_state_dict(source.state_dict())
    for name, value in source.state_dict().items():
        np.testing.assert_array_equal(target.state_dict()[name], value)
    assert all(p.data is a for p, a in zip(target.parameters(), arrays, strict=True))
    np.testing.assert_array_equal(target(batch(2, 3)).numpy(), source(batch(2, 3)).numpy())


def test_strict_load_lists_missing_unexpected_and_mismatched_keys():
    state = Net().state_dict()
    del state["head.bias"]
    state["head.extra"] = np.zeros(2)
    state["first.scale"] = np.zeros(5)
    with pytest.raises(ValueError) as caught:
        Net().load_state_dict(state)
    message = str(caught.value)
    assert "missing keys: ['head.bias']" in message
    assert "unexpected keys: ['head.extra']" in message
    assert "first.scale: checkpoint (5,) vs model (3,)" in message


def test_non_strict_load_reports_missing_and_unexpected_keys():
    state = Net().state_dict()
    del state["head.bias"]
    state["head.extra"] = np.zeros(2)
    net = Net()
    head_bias = net.head.bias.numpy().copy()
    missing, unexpected = net.load_state_dict(state, strict=False)
    assert missing == ["head.bias"] and unexpected == ["head.extra"]
    np.testing.assert_array_equal(net.head.bias.numpy(), head_bias)
    np.testing.assert_array_equal(net.head.weight.numpy(), state["head.weight"])


def test_a_shape_mismatch_fails_even_when_not_strict():
    state = Net().state_dict()
    state["head.weight"] = np.zeros((3, 3))
    with pytest.raises(ValueError, match=r"head.weight: checkpoint \(3, 3\) vs model \(2, 3\)"):
        Net().load_state_dict(state, strict=False)


# --- modes, gradients, dtypes ------------------------------------------------------------------
def test_train_and_eval_reach_every_sub_module():
    net = Net()
    assert net.eval() is net
    assert not any(module.training for module in net.modules())
    net.train()
    assert all(module.training for module in net.modules())


def test_zero_grad_zeroes_in_place_or_drops_gradients():
    net = Net()
    net(batch(4, 3)).sum().backward()
    gradient_arrays = [parameter.grad.data for parameter in net.parameters()]
    assert any(array.any() for array in gradient_arrays)
    net.zero_grad()
    for parameter, array in zip(net.parameters(), gradient_arrays, strict=True):
        assert parameter.grad.data is array and not array.any()
    net.zero_grad(set_to_none=True)
    assert all(parameter.grad is None for parameter in net.parameters())


def test_to_dtype_casts_float_parameters_and_buffers_but_not_counters():
    net = Net()
    net(batch(4, 3)).sum().backward()
    weight = net.head.weight
    assert net.to(dtype=np.float64) is net
    assert net.head.weight is weight  # the same Parameter object, new array
    assert all(parameter.dtype == np.float64 for parameter in net.parameters())
    assert all(parameter.grad is None for parameter in net.parameters())
    assert net.norm.running_var.dtype == np.float64
    assert net.norm.num_batches_tracked.dtype == np.int64
    assert net.first.calls.dtype == np.int64
    x = Tensor(np.ones((2, 3)), dtype=np.float64)
    assert net(x).dtype == np.float64
    assert net.float().head.bias.dtype == np.float32


def test_requires_grad_off_freezes_parameters():
    net = Net().requires_grad_(False)
    x = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    net(x).sum().backward()
    assert all(parameter.grad is None for parameter in net.parameters())
    assert x.grad is not None


def test_a_layer_without_its_own_init_records_empty_arguments():
    assert nn.ReLU()._init_args == ((), {})
    assert nn.Identity(7, flag=True)._init_args == ((7,), {"flag": True})
